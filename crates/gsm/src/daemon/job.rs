//! One job's ranks on this host, for the client that started them.
//!
//! The conversation: the client's [`Request::Start`]; [`Reply::NeedProgram`] and the
//! program's pieces if this host lacks it; [`Reply::Started`] (or [`Reply::Refused`] naming
//! why not); then, both ways, until the ranks have ended: the ranks' output lines and exits
//! to the client, signals and kills from it, and heartbeats both ways. When every rank has
//! ended the client sends [`Request::Finish`]: the daemon kills what is left in the ranks'
//! process groups, sends the last of their output and answers [`Reply::Finished`].
//!
//! If the client falls silent for the job's peer timeout, or the connection fails, the
//! daemon kills the job's ranks here: a job never outlives the `gsm run` that started it.
//! That is also what fences this host's ranks when it is cut off from a job that recovers
//! lost ranks: gsm takes the host for lost after the same silence, and starts its ranks
//! elsewhere only a fencing margin later (see `run::hosts`).
//!
//! In a job that recovers lost ranks ([`Start::recover`]) the conversation also carries
//! restarts ([`Request::Restart`]: one more life of a rank, started here, answered with its
//! pid) and fences ([`Request::Fence`]: kill that life if it still runs); rank 0's requests for
//! fences, written on the pipe named by its `GSM_SUPERVISOR`, go to the client as
//! [`Reply::Fence`]. A spare host starts with no ranks and waits for restarts. With
//! [`Start::shared_state`] the daemon leaves a mark of its host in the job's state
//! directory, `<GSM_STATE_DIR>/<job name>/.gsm-hosts/<job id>-<host>`; a restart of a rank
//! that moves here from host `h` is refused, naming why, unless `h`'s mark is found: the
//! state the rank wrote there is not reachable from here. A job that ends normally here
//! removes the marks of all its hosts; one that lost its client keeps this host's mark, which
//! a host taking over its ranks looks for.

use std::ffi::OsString;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use gossamer::cluster::{FrameReader, FrameWriter, JobInfo, Reply, Request, Start, hex};
use gossamer::env;

use super::{Daemon, log};
use crate::cluster::now_secs;
use crate::run::guardian::Guardian;
use crate::run::{
    POLL, each_line, fence_pipe, give_fence_pipe, kill_and_drain, read_fences, signal_group,
};

/// How long the client may take to send each piece of a program.
const PIECE_LIMIT: Duration = Duration::from_secs(10);
/// The most ranks one job may start on one host.
const MAX_RANKS_HERE: usize = 1024;
/// The longest peer timeout a client may ask for.
const MAX_PEER_TIMEOUT: Duration = Duration::from_secs(3600);
/// How long a rank's exit waits for the end of its output, so that its lines come first.
const OUTPUT_FIRST: Duration = Duration::from_millis(200);

type Writer = Arc<Mutex<FrameWriter<TcpStream>>>;

/// Serves one job, from its start request to its end.
pub(crate) fn run(
    daemon: &Daemon,
    start: Start,
    mut from: FrameReader<TcpStream>,
    mut to: FrameWriter<TcpStream>,
    local: SocketAddr,
) {
    let peer = from
        .get_ref()
        .peer_addr()
        .map_or_else(|_| "a client".into(), |a| a.to_string());
    let job = start.job;
    let refuse = |to: &mut FrameWriter<TcpStream>, why: String| {
        log(&format!("refused job {job:016x} from {peer}: {why}"));
        let _ = to.send(&Reply::Refused(why));
    };
    if let Err(why) = check(&start, daemon) {
        return refuse(&mut to, why);
    }
    let (program, stored) = match locate(daemon, &start, &mut from, &mut to, &peer) {
        Ok(found) => found,
        Err(why) => return refuse(&mut to, why),
    };
    let heartbeat = Duration::from_millis(start.heartbeat_ms);
    let peer_timeout = Duration::from_millis(start.peer_timeout_ms);
    let coordinator = if start.coordinator {
        match TcpListener::bind((local.ip(), 0)).and_then(|l| l.local_addr()) {
            // Free a moment ago; rank 0 says so if another process takes it first.
            Ok(addr) => Some(addr),
            Err(e) => return refuse(&mut to, format!("cannot find a port for rank 0: {e}")),
        }
    } else {
        None
    };
    let mark = match start.shared_state.then(|| leave_mark(&start)).transpose() {
        Ok(mark) => mark,
        Err(why) => return refuse(&mut to, why),
    };
    let fences = if start.recover && start.ranks.contains(&0) {
        match fence_pipe() {
            Ok((read, write)) => Some((write, read_fences(read))),
            Err(e) => return refuse(&mut to, format!("cannot make rank 0's fence pipe: {e}")),
        }
    } else {
        None
    };
    let mut guardian = match Guardian::start() {
        Ok(guardian) => guardian,
        Err(e) => return refuse(&mut to, format!("cannot start the ranks' guardian: {e}")),
    };
    let to: Writer = Arc::new(Mutex::new(to));
    let mut here = Here {
        start: &start,
        program: &program,
        coordinator,
        guardian: &mut guardian,
        to: to.clone(),
        fences,
        mark,
    };
    // Held until `Started` is sent: the ranks' output waits for it, as the client expects.
    let mut sending = to.lock().expect("writer lock");
    let mut ranks = Vec::with_capacity(start.ranks.len());
    for &rank in &start.ranks {
        match here.spawn(rank, 0, None) {
            Ok(started) => ranks.push(started),
            Err(e) => {
                for r in &mut ranks {
                    signal_group(r.pid, libc::SIGKILL);
                    let _ = r.child.wait();
                }
                here.remove_marks();
                drop(here);
                guardian.end();
                return refuse(&mut sending, format!("cannot start rank {rank}: {e}"));
            }
        }
    }
    let pids: Vec<(u32, u32)> = ranks.iter().map(|r| (r.rank, r.pid)).collect();
    daemon.jobs.lock().expect("jobs lock").insert(
        job,
        JobInfo {
            job,
            program: program.display().to_string(),
            ranks: pids.clone(),
            client: peer.clone(),
            started: now_secs(),
        },
    );
    log(&format!(
        "job {job:016x} from {peer}: started ranks {:?} of {}{}",
        start.ranks,
        program.display(),
        if stored { " (stored copy)" } else { "" }
    ));
    let started = Reply::Started {
        coordinator_port: coordinator.map(|a| a.port()),
        pids,
    };
    let sent = from
        .get_ref()
        .set_read_timeout(Some(peer_timeout))
        .and_then(|()| from.get_ref().set_write_timeout(Some(peer_timeout)));
    let sent = sent.is_ok() && sending.send(&started).is_ok();
    drop(sending);
    let done = Arc::new(AtomicBool::new(false));
    let beating = heartbeats(to.clone(), heartbeat, done.clone());
    let events = listen(from);
    let lost = supervise(&mut here, &mut ranks, &events, !sent, &peer, daemon);
    // Every rank has ended: `gsm ps` no longer lists the job.
    daemon.jobs.lock().expect("jobs lock").remove(&job);
    // Whatever is left in the ranks' groups (a background process holding a pipe) goes now.
    let pids: Vec<u32> = ranks.iter().map(|r| r.pid).collect();
    kill_and_drain(
        &pids,
        ranks.iter_mut().flat_map(|r| r.pipes.drain(..)).collect(),
    );
    if lost {
        // gsm may be moving this host's ranks to hosts that look for this mark.
        here.mark = None;
    } else {
        // The job ended: the marks of every host of it go (those of lost hosts too).
        here.remove_marks();
    }
    done.store(true, Ordering::Release);
    if !lost {
        let _ = to.lock().expect("writer lock").send(&Reply::Finished);
    }
    let _ = beating.join();
    guardian.end();
    log(&format!("job {job:016x} from {peer}: ended"));
}

/// What starting a rank of this job here takes.
struct Here<'a> {
    start: &'a Start,
    program: &'a Path,
    coordinator: Option<SocketAddr>,
    guardian: &'a mut Guardian,
    to: Writer,
    /// With recovery, when rank 0 runs here: the write end of the pipe it asks for fences
    /// on, and the requests read from it.
    fences: Option<(OwnedFd, Receiver<(usize, u32)>)>,
    /// With a shared state directory: this host's mark in it.
    mark: Option<PathBuf>,
}

/// The directory of the job's state as its ranks here see it (their environment and working
/// directory), for the marks of [`Start::shared_state`].
fn job_state_dir(start: &Start) -> Result<PathBuf, String> {
    let get = |name: &str| {
        if name.starts_with("GSM_") {
            start
                .env
                .iter()
                .find(|(n, _)| &n[..] == name.as_bytes())
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        } else {
            std::env::var(name).ok()
        }
    };
    let dir = env::job_state_dir(get).map_err(|e| e.to_string())?;
    Ok(rank_cwd(start).join(dir))
}

/// The ranks' working directory: the client's where it exists here, else `/`.
fn rank_cwd(start: &Start) -> PathBuf {
    let cwd = PathBuf::from(OsString::from_vec(start.cwd.clone()));
    if cwd.is_dir() {
        cwd
    } else {
        PathBuf::from("/")
    }
}

/// The mark of `host` for this job in the job's state directory `dir`.
fn mark_of(dir: &Path, job: u64, host: u32) -> PathBuf {
    mark_of_dir(&dir.join(".gsm-hosts"), job, host)
}

/// The mark of `host` for this job in the directory of marks.
fn mark_of_dir(marks: &Path, job: u64, host: u32) -> PathBuf {
    marks.join(format!("{job:016x}-{host}"))
}

/// Whether the state a rank wrote on the job's host `from` is reachable here, where this
/// host's mark is `mark` (none: the job's state is not shared): `from`'s mark must be beside it.
fn state_reachable(mark: Option<&Path>, job: u64, from: u32) -> Result<(), String> {
    let Some(mark) = mark else {
        return Err(format!(
            "its state was written on another host (the job's host {from}), and the job's \
             state is not shared (gsm run --shared-state)"
        ));
    };
    let dir = mark.parent().unwrap_or(Path::new("."));
    if mark_of_dir(dir, job, from).exists() {
        return Ok(());
    }
    Err(format!(
        "its state, written on the job's host {from}, is not reachable here: {} has no mark of \
         that host, so GSM_STATE_DIR is not on storage both hosts share",
        dir.display()
    ))
}

/// Leaves this host's mark in the job's state directory (made if need be).
fn leave_mark(start: &Start) -> Result<PathBuf, String> {
    let dir = job_state_dir(start)?;
    let mark = mark_of(&dir, start.job, start.host);
    let made = mark
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&mark, b""));
    made.map_err(|e| format!("cannot leave this host's mark {}: {e}", mark.display()))?;
    Ok(mark)
}

impl Here<'_> {
    /// Starts `incarnation` of `rank`, its output forwarded to the client; `local_size`, for
    /// a restart, says how many of the job's ranks run here with it (`GSM_LOCAL_SIZE`).
    fn spawn(
        &mut self,
        rank: u32,
        incarnation: u32,
        local_size: Option<usize>,
    ) -> std::io::Result<Rank> {
        let start = self.start;
        let mut command = Command::new(self.program);
        command.args(start.args.iter().map(|a| OsString::from_vec(a.to_vec())));
        // The job's settings come from the client alone, none from the daemon's environment.
        for (name, _) in std::env::vars_os() {
            if name.as_bytes().starts_with(b"GSM_") {
                command.env_remove(name);
            }
        }
        for var in env::LAUNCHER_VARS {
            command.env_remove(var);
        }
        for (name, value) in &start.env {
            command.env(
                OsString::from_vec(name.to_vec()),
                OsString::from_vec(value.to_vec()),
            );
        }
        command.env(env::RANK, rank.to_string());
        if let Some(local) = local_size {
            command.env(env::LOCAL_SIZE, local.to_string());
        }
        if let Some(addr) = self.coordinator {
            command.env(env::COORD, addr.to_string());
        }
        if start.recover {
            command
                .env(env::RECOVER, "1")
                .env(env::INCARNATION, incarnation.to_string());
        }
        command
            .current_dir(rank_cwd(start))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.guardian.alive()?;
        self.guardian.guard(&mut command);
        if let Some((write, _)) = self.fences.as_ref().filter(|_| rank == 0) {
            give_fence_pipe(&mut command, write);
        }
        let mut child = command.spawn()?;
        let mut pipes = Vec::with_capacity(2);
        if let Some(out) = child.stdout.take() {
            let to = self.to.clone();
            pipes.push(thread::spawn(move || forward(rank, out, false, &to)));
        }
        if let Some(err) = child.stderr.take() {
            let to = self.to.clone();
            pipes.push(thread::spawn(move || forward(rank, err, true, &to)));
        }
        Ok(Rank {
            rank,
            incarnation,
            pid: child.id(),
            child,
            ended: false,
            pipes,
        })
    }

    /// Starts `incarnation` of `rank` for a [`Request::Restart`], after killing an older life
    /// of it still here and checking that the rank's state is reachable.
    fn restart(
        &mut self,
        ranks: &mut Vec<Rank>,
        rank: u32,
        incarnation: u32,
        state_from: Option<u32>,
    ) -> Result<u32, String> {
        if !self.start.recover {
            return Err("the job does not recover lost ranks".into());
        }
        // Lives that ended do not count: a long job restarts ranks many times.
        if ranks.iter().filter(|r| !r.ended).count() >= MAX_RANKS_HERE {
            return Err(format!(
                "{MAX_RANKS_HERE} ranks of the job run here already"
            ));
        }
        if let Some(newer) = ranks
            .iter()
            .find(|r| r.rank == rank && r.incarnation >= incarnation)
        {
            return Err(format!(
                "incarnation {} of rank {rank} ran here already",
                newer.incarnation
            ));
        }
        if let Some(from) = state_from.filter(|&h| h != self.start.host) {
            state_reachable(self.mark.as_deref(), self.start.job, from)?;
        }
        for old in ranks.iter().filter(|r| r.rank == rank && !r.ended) {
            signal_group(old.pid, libc::SIGKILL);
        }
        let others = ranks.iter().filter(|r| r.rank != rank && !r.ended).count();
        let started = self
            .spawn(rank, incarnation, Some(others + 1))
            .map_err(|e| format!("cannot start it: {e}"))?;
        let pid = started.pid;
        ranks.push(started);
        Ok(pid)
    }

    /// Removes the marks of every host of the job, if this one left one.
    fn remove_marks(&mut self) {
        let Some(mark) = self.mark.take() else {
            return;
        };
        let Some(dir) = mark.parent() else {
            return;
        };
        let prefix = format!("{:016x}-", self.start.job);
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        // The directory goes with the last job's marks.
        let _ = std::fs::remove_dir(dir);
    }
}

/// What the client sent during the job, or that it is gone.
enum Event {
    /// A request the job takes: a signal, a kill, `Finish`, a restart or a fence.
    Asked(Request),
    Lost(String),
}

/// One rank started here.
struct Rank {
    rank: u32,
    incarnation: u32,
    pid: u32,
    child: Child,
    ended: bool,
    pipes: Vec<JoinHandle<()>>,
}

/// Refuses a start request that makes no sense here.
fn check(start: &Start, daemon: &Daemon) -> Result<(), String> {
    let fewest = if start.recover { 0 } else { 1 };
    if start.ranks.len() < fewest || start.ranks.len() > MAX_RANKS_HERE {
        return Err(format!(
            "{} ranks asked for; a host takes {fewest} to {MAX_RANKS_HERE}",
            start.ranks.len()
        ));
    }
    let mut ranks = start.ranks.clone();
    ranks.sort_unstable();
    if ranks.windows(2).any(|w| w[0] == w[1]) {
        return Err("a rank is named twice".into());
    }
    let (heartbeat, timeout) = (start.heartbeat_ms, start.peer_timeout_ms);
    if heartbeat == 0 || timeout <= heartbeat || timeout > MAX_PEER_TIMEOUT.as_millis() as u64 {
        return Err(format!(
            "heartbeat {heartbeat} ms and peer timeout {timeout} ms: the timeout must be longer \
             than the heartbeat and at most {MAX_PEER_TIMEOUT:?}"
        ));
    }
    if daemon
        .jobs
        .lock()
        .expect("jobs lock")
        .contains_key(&start.job)
    {
        return Err(format!("job {:016x} already runs here", start.job));
    }
    Ok(())
}

/// The program to run: the file at its path if it has the hash, else a stored copy, else one
/// received from the client now and stored. Also whether it is a stored copy.
fn locate(
    daemon: &Daemon,
    start: &Start,
    from: &mut FrameReader<TcpStream>,
    to: &mut FrameWriter<TcpStream>,
    peer: &str,
) -> Result<(PathBuf, bool), String> {
    let path = PathBuf::from(OsString::from_vec(start.program.clone()));
    // Only a regular file of the right length is hashed (never a device that reads forever).
    let same_file = path.is_absolute()
        && path
            .metadata()
            .is_ok_and(|m| m.is_file() && m.len() == start.len)
        && daemon.store.hash_of(&path).ok() == Some(start.hash);
    if same_file {
        return Ok((path, false));
    }
    if let Some(stored) = daemon.store.find(&start.hash) {
        return Ok((stored, true));
    }
    if start.len > daemon.max_program {
        return Err(format!(
            "{} is not here and its {} bytes are over this daemon's --max-program-mib",
            path.display(),
            start.len
        ));
    }
    let mut incoming = daemon
        .store
        .receive(&start.hash)
        .map_err(|e| format!("cannot make a file in the program store: {e}"))?;
    to.send(&Reply::NeedProgram).map_err(|e| e.to_string())?;
    from.get_ref()
        .set_read_timeout(Some(PIECE_LIMIT))
        .map_err(|e| e.to_string())?;
    loop {
        match from.recv::<Request>() {
            Ok(Request::Program(piece)) if piece.is_empty() => break,
            Ok(Request::Program(piece)) => {
                if incoming.written() + piece.len() as u64 > start.len {
                    return Err(format!(
                        "more than the {} bytes announced were sent",
                        start.len
                    ));
                }
                incoming
                    .write(&piece)
                    .map_err(|e| format!("cannot write the program: {e}"))?;
            }
            Ok(other) => return Err(format!("a piece of the program expected, not {other:?}")),
            Err(e) => return Err(format!("while receiving the program: {e}")),
        }
    }
    if incoming.written() != start.len {
        return Err(format!(
            "{} bytes of the program received, {} announced",
            incoming.written(),
            start.len
        ));
    }
    let stored = daemon
        .store
        .keep(incoming, &start.hash)
        .map_err(|e| format!("{e:#}"))?;
    log(&format!(
        "stored {} ({} bytes, sha256 {}) from {peer}",
        path.display(),
        start.len,
        hex(&start.hash)
    ));
    Ok((stored, true))
}

/// Sends a rank's output to the client, line by line; once the client is gone, reads on and
/// drops it, so the rank never blocks on a full pipe.
fn forward(rank: u32, pipe: impl std::io::Read, stderr: bool, to: &Writer) {
    let mut open = true;
    each_line(pipe, b"", |line| {
        if open {
            let reply = Reply::Output {
                rank,
                stderr,
                line: line.to_vec(),
            };
            open = to.lock().expect("writer lock").send(&reply).is_ok();
        }
    });
}

/// Sends a heartbeat every `period` until `done`.
fn heartbeats(to: Writer, period: Duration, done: Arc<AtomicBool>) -> JoinHandle<()> {
    thread::spawn(move || {
        while !done.load(Ordering::Acquire) {
            thread::sleep(period);
            if to
                .lock()
                .expect("writer lock")
                .send(&Reply::Heartbeat)
                .is_err()
            {
                return;
            }
        }
    })
}

/// Reads the client's requests on a thread of its own.
fn listen(mut from: FrameReader<TcpStream>) -> Receiver<Event> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        loop {
            let event = match from.recv::<Request>() {
                Ok(Request::Heartbeat) => continue,
                Ok(
                    asked @ (Request::Signal(_)
                    | Request::Kill
                    | Request::Finish
                    | Request::Restart { .. }
                    | Request::Fence { .. }),
                ) => Event::Asked(asked),
                Ok(other) => Event::Lost(format!("it sent {other:?} during the job")),
                Err(e) => Event::Lost(e.to_string()),
            };
            let end = matches!(event, Event::Lost(_));
            if tx.send(event).is_err() || end {
                return;
            }
        }
    });
    rx
}

/// Waits for the ranks, reporting each exit, until every one has ended and the client has
/// said `Finish`, or the client is lost and its ranks are gone. Returns whether it was lost.
fn supervise(
    here: &mut Here<'_>,
    ranks: &mut Vec<Rank>,
    events: &Receiver<Event>,
    mut lost: bool,
    peer: &str,
    daemon: &Daemon,
) -> bool {
    let job = here.start.job;
    let to = &here.to.clone();
    let mut finish = false;
    let mut killed = false;
    loop {
        let event = match events.recv_timeout(POLL) {
            Ok(event) => Some(event),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Event::Lost("its reader ended".into())),
        };
        let kill = |ranks: &[Rank], sig| {
            for r in ranks.iter().filter(|r| !r.ended) {
                signal_group(r.pid, sig);
            }
        };
        match event {
            Some(Event::Asked(Request::Signal(sig))) => kill(ranks, sig),
            Some(Event::Asked(Request::Kill)) => kill(ranks, libc::SIGKILL),
            Some(Event::Asked(Request::Finish)) => finish = true,
            Some(Event::Asked(Request::Restart {
                rank,
                incarnation,
                state_from,
            })) if !lost => {
                let reply = match here.restart(ranks, rank, incarnation, state_from) {
                    Ok(pid) => {
                        log(&format!(
                            "job {job:016x}: started incarnation {incarnation} of rank {rank} \
                             (pid {pid})"
                        ));
                        if let Some(info) = daemon.jobs.lock().expect("jobs lock").get_mut(&job) {
                            info.ranks.push((rank, pid));
                        }
                        Reply::Restarted {
                            rank,
                            incarnation,
                            pid,
                        }
                    }
                    Err(why) => {
                        log(&format!(
                            "job {job:016x}: refused incarnation {incarnation} of rank {rank}: \
                             {why}"
                        ));
                        Reply::RestartRefused { rank, why }
                    }
                };
                lost |= to.lock().expect("writer lock").send(&reply).is_err();
            }
            Some(Event::Asked(Request::Fence { rank, incarnation })) => {
                for r in ranks
                    .iter()
                    .filter(|r| r.rank == rank && r.incarnation == incarnation && !r.ended)
                {
                    log(&format!(
                        "job {job:016x}: fencing incarnation {incarnation} of rank {rank} (pid \
                         {})",
                        r.pid
                    ));
                    signal_group(r.pid, libc::SIGKILL);
                }
            }
            // A restart asked after the client was lost; `listen` sends nothing else.
            Some(Event::Asked(_)) => {}
            Some(Event::Lost(why)) if !lost => {
                log(&format!(
                    "job {job:016x}: lost {peer} ({why}); killing the job's ranks here"
                ));
                lost = true;
            }
            Some(Event::Lost(_)) | None => {}
        }
        if lost && !killed {
            kill(ranks, libc::SIGKILL);
            killed = true;
        }
        // Rank 0's requests for fences go to the client, which knows where each life runs.
        for (rank, incarnation) in here.fences.iter().flat_map(|(_, asked)| asked.try_iter()) {
            let fence = Reply::Fence {
                rank: rank as u32,
                incarnation,
            };
            if !lost {
                lost = to.lock().expect("writer lock").send(&fence).is_err();
            }
        }
        for r in ranks.iter_mut().filter(|r| !r.ended) {
            let status = match r.child.try_wait() {
                Ok(None) => continue,
                Ok(Some(status)) => status.into_raw(),
                // Cannot happen for a child of ours; report it as killed.
                Err(_) => libc::SIGKILL,
            };
            r.ended = true;
            // Its last lines first, unless something it started still holds the pipes.
            let deadline = Instant::now() + OUTPUT_FIRST;
            while r.pipes.iter().any(|p| !p.is_finished()) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(1));
            }
            if let Some(info) = daemon.jobs.lock().expect("jobs lock").get_mut(&job) {
                info.ranks.retain(|&(rank, _)| rank != r.rank);
            }
            let exited = Reply::Exited {
                rank: r.rank,
                pid: r.pid,
                status,
            };
            if !lost && let Err(e) = to.lock().expect("writer lock").send(&exited) {
                log(&format!(
                    "job {job:016x}: lost {peer} (cannot tell it rank {}'s end: {e})",
                    r.rank
                ));
                lost = true;
            }
        }
        if ranks.iter().all(|r| r.ended) && (finish || lost) {
            return lost;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::store::Store;
    use std::collections::HashMap;

    fn start() -> Start {
        Start {
            job: 7,
            program: b"/bin/true".to_vec(),
            hash: [0; 32],
            len: 0,
            args: Vec::new(),
            env: Vec::new(),
            cwd: b"/".to_vec(),
            ranks: vec![0, 3],
            coordinator: true,
            heartbeat_ms: 250,
            peer_timeout_ms: 3000,
            recover: false,
            host: 0,
            shared_state: false,
        }
    }

    #[test]
    fn a_start_that_makes_no_sense_here_is_refused_naming_why() {
        let dir = std::env::temp_dir().join(format!("gsm-check-{}", std::process::id()));
        let daemon = Daemon {
            store: Store::open(&dir).expect("a store"),
            max_program: 1 << 20,
            jobs: Mutex::new(HashMap::new()),
        };
        assert_eq!(check(&start(), &daemon), Ok(()));
        let refused = |change: fn(&mut Start)| {
            let mut s = start();
            change(&mut s);
            check(&s, &daemon).unwrap_err()
        };
        assert!(refused(|s| s.ranks.clear()).contains("0 ranks asked for"));
        // A spare host of a job that recovers starts with none.
        let mut spare = start();
        (spare.ranks, spare.recover, spare.coordinator) = (Vec::new(), true, false);
        assert_eq!(check(&spare, &daemon), Ok(()));
        assert!(refused(|s| s.ranks = vec![1, 1]).contains("named twice"));
        assert!(refused(|s| s.heartbeat_ms = 0).contains("heartbeat 0 ms"));
        assert!(refused(|s| s.peer_timeout_ms = 250).contains("longer than the heartbeat"));
        assert!(refused(|s| s.peer_timeout_ms = 1 << 40).contains("at most"));
        daemon.jobs.lock().unwrap().insert(
            7,
            JobInfo {
                job: 7,
                program: "p".into(),
                ranks: Vec::new(),
                client: "c".into(),
                started: 0,
            },
        );
        assert!(
            check(&start(), &daemon)
                .unwrap_err()
                .contains("already runs here")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A rank moves here only if the mark of the host its state was written on is beside
    /// this host's.
    #[test]
    fn a_moved_rank_needs_its_old_hosts_mark() {
        let dir = std::env::temp_dir().join(format!("gsm-marks-{}", std::process::id()));
        let mut start = start();
        (start.shared_state, start.host, start.job) = (true, 2, 0xab);
        start.env = vec![(
            serde_bytes::ByteBuf::from(&b"GSM_STATE_DIR"[..]),
            serde_bytes::ByteBuf::from(dir.as_os_str().as_bytes()),
        )];
        start.env.push((
            serde_bytes::ByteBuf::from(&b"GSM_JOB_NAME"[..]),
            serde_bytes::ByteBuf::from(&b"ledger"[..]),
        ));
        let mine = leave_mark(&start).expect("a mark");
        assert_eq!(mine, dir.join("ledger/.gsm-hosts/00000000000000ab-2"));
        let why = state_reachable(Some(&mine), 0xab, 1).unwrap_err();
        assert!(
            why.contains("written on the job's host 1, is not reachable here"),
            "{why}"
        );
        let why = state_reachable(None, 0xab, 1).unwrap_err();
        assert!(why.contains("--shared-state"), "{why}");
        start.host = 1;
        leave_mark(&start).expect("host 1's mark");
        assert_eq!(state_reachable(Some(&mine), 0xab, 1), Ok(()));
        // Another job's mark of host 1 is not this job's.
        assert!(state_reachable(Some(&mine), 0xac, 1).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
