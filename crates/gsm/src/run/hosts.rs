//! `gsm run --hosts a,b,c -n N -- prog args...`: the ranks started by the hosts' daemons.
//!
//! gsm places the ranks (round-robin, or `--per-host K` in blocks), connects to the daemon
//! of every host that gets one (proving the cluster key, see [`gossamer::cluster`]), and asks
//! the host of rank 0 to start its ranks first: that daemon picks the coordinator's port, and
//! `GSM_COORD` for the others is that host's address with it. Each daemon runs the program
//! from its path if the file there is the same (by SHA-256), else from its store, else asks
//! gsm for it and stores it (gsm says `sent ... to HOST` when it does).
//!
//! The ranks get what they get on one host (`GSM_RANK`, `GSM_SIZE`, `GSM_COORD`, `GSM_JOB`,
//! a fresh `GSM_SECRET`, `GSM_LOCAL_SIZE` = the ranks on their host, `GSM_WORKERS` with
//! `--workers`) and every other `GSM_*` setting of gsm's environment, none of the daemon's;
//! gsm's `UCX_*` settings (UCX's configuration, for `GSM_TRANSPORT=ucx`) too, over the
//! daemon's; the rest of their environment is the daemon's. Their working directory is gsm's if it
//! exists on their host, else `/`.
//!
//! Output arrives line by line and is printed with the prefix `[rank] `, as on one host.
//! SIGINT and SIGTERM are forwarded to every rank. Fate sharing as on one host: once a rank
//! fails, the others get `GSM_PEER_TIMEOUT` + 2 s, then gsm has them killed. gsm and each
//! daemon send each other a heartbeat every `GSM_HEARTBEAT`; a daemon silent for
//! `GSM_PEER_TIMEOUT` is a lost host, which fails its ranks (named with it) and ends the job;
//! a daemon that hears nothing from gsm that long kills the job's ranks on its host, so a job
//! never outlives its `gsm run`.
//!
//! Recovery (`--recover`), as on one host: a rank other than 0 that fails is started again as
//! the same rank with `GSM_INCARNATION` one more, up to `--max-restarts` times, and rejoins
//! the job; rank 0's failure, or the loss of its host, ends the job. Where the next life runs:
//! - a rank that exited or was killed while its host's daemon runs: on that host, at once;
//! - the ranks of a lost host (its daemon died, or fell silent for `GSM_PEER_TIMEOUT`): on
//!   another host, only with `--shared-state` (the job's `GSM_STATE_DIR` is on storage every
//!   host shares, which the daemons check: each leaves a mark of its host in the job's state
//!   directory, and the host taking over a rank must find the lost host's mark, else it
//!   refuses naming why and the next candidate is asked). Candidates: the `--spare-hosts`
//!   first, then the job's live hosts, fewest running ranks first. Without `--shared-state`
//!   a rank's state is pinned to its host, and its host's loss ends the job naming why.
//!   A lost host takes no part in the job again, even if its daemon comes back.
//!
//! Fencing: the old life of a moved rank must not act once the new one runs. A lost host's
//! daemon kills the job's ranks there when it has heard nothing from gsm for
//! `GSM_PEER_TIMEOUT` (or at once when its connection fails, or by its guardian when the daemon
//! dies); gsm takes a silent host for lost after the same silence, and the two silences start
//! at most one heartbeat apart (the last heartbeat each side received), so gsm waits one
//! `GSM_HEARTBEAT` plus [`FENCE_SLACK`] (for the daemon to notice and kill) before it starts
//! the next life elsewhere. A host whose connection failed instead (its daemon died, and its
//! guardian killed the ranks; or the daemon lost the connection, and killed them at once)
//! waits half of [`FENCE_SLACK`]. The margins rest on the lost host's daemon running and
//! being scheduled within them (a stopped daemon kills nothing). What does not rest on timing:
//! inside the job the lost life is fenced by incarnation (the ranks refuse its links once
//! they lose it, and rank 0 tells it it is out, or it ends itself when it finds rank 0
//! silent), and a rank's state directory is locked (`flock`) by the process using it, which
//! holds across hosts only where the shared file system honours `flock`. Rank 0's requests to
//! fence a life it lost (a stopped process) reach gsm through rank 0's daemon and go to the
//! daemon of the host where that life runs.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use gossamer::cluster::{
    ClusterError, FrameReader, FrameWriter, PROGRAM_PIECE, Reply, Request, Start, file_hash,
};
use gossamer::env;
use serde_bytes::ByteBuf;

use super::{
    Cause, DRAIN, Error, Failure, Options, POLL, STRAGGLER_GRACE, Stream, catch_signals,
    caught_signals, cause, describe, failure_code, job_status, report, write_line,
};
use crate::cluster::{Host, connect_all, load_key, parse_hosts};

/// How long a daemon may take to start its ranks, hashing the program and storing it.
const START_LIMIT: Duration = Duration::from_secs(120);

/// The variables gsm sets for each job itself; the rest of its `GSM_*` are passed on.
/// How long a host asked to take over a rank may take to answer before the next is asked.
const MOVE_LIMIT: Duration = Duration::from_secs(30);

/// What the fencing margin adds to one heartbeat: time for a lost host's daemon to notice
/// gsm's silence and kill the job's ranks (see the module docs).
const FENCE_SLACK: Duration = Duration::from_secs(1);

const SET_BY_GSM: [&str; 10] = [
    env::RANK,
    env::SIZE,
    env::COORD,
    env::JOB,
    env::SECRET,
    env::LOCAL_SIZE,
    env::HOST,
    env::SUPERVISOR,
    env::RECOVER,
    env::INCARNATION,
];

type Writer = Arc<Mutex<FrameWriter<TcpStream>>>;
/// `(rank, pid)` of the ranks a daemon started.
type Pids = Vec<(u32, u32)>;

/// Runs a job on the daemons of `list`.
pub(super) fn run(options: &Options, list: &str) -> Result<ExitCode, Error> {
    let get = |name: &str| std::env::var(name).ok();
    let (heartbeat, peer_timeout) =
        env::heartbeat_and_peer_timeout(&get).map_err(|e| Error::Usage(e.to_string()))?;
    let hosts = parse_hosts(list).map_err(Error::Usage)?;
    let placement = place(usize::from(options.ranks), hosts.len(), options.per_host)?;
    let spares = match &options.spare_hosts {
        Some(list) => parse_hosts(list).map_err(Error::Usage)?,
        None => Vec::new(),
    };
    if let Some(twice) = spares
        .iter()
        .find(|s| hosts.iter().any(|h| h.addr == s.addr))
    {
        return Err(Error::Usage(format!(
            "host {} is in both --hosts and --spare-hosts",
            twice.name
        )));
    }
    let Some((program, args)) = options.command.split_first() else {
        return Err(Error::Usage("no program to run given".into()));
    };
    let path = resolve(program)?;
    // Hashed while the daemons are reached.
    let hashing = thread::spawn({
        let path = path.clone();
        move || file_hash(&path).with_context(|| format!("cannot read {}", path.display()))
    });
    let len = path
        .metadata()
        .context("cannot read the program's size")?
        .len();
    let key = load_key(options.key.as_ref())?;
    let job = env::random_job_id().context("cannot make a job id")?;
    let secret = env::Secret::random().context("cannot make a job secret")?;
    catch_signals().context("cannot install the SIGINT and SIGTERM handlers")?;

    let mut used: Vec<(Host, Vec<u32>)> = hosts
        .into_iter()
        .zip(placement)
        .filter(|(_, ranks)| !ranks.is_empty())
        .collect();
    let spare_from = used.len();
    used.extend(spares.into_iter().map(|h| (h, Vec::new())));
    let names: Vec<Host> = used.iter().map(|(h, _)| h.clone()).collect();
    let mut conversations = connect_all(&names, &key)?;
    let hash = hashing.join().expect("the hashing thread panicked")?;
    report(&format!(
        "job {job:016x}: {} ranks on {} hosts{}",
        options.ranks,
        spare_from,
        match used.len() - spare_from {
            0 => String::new(),
            n => format!(", {n} spare"),
        }
    ));

    let mut common: Vec<(ByteBuf, ByteBuf)> = std::env::vars_os()
        .filter(|(name, _)| {
            let name = name.as_bytes();
            (name.starts_with(b"GSM_") && !SET_BY_GSM.iter().any(|v| name == v.as_bytes()))
                || name.starts_with(b"UCX_")
        })
        .map(|(name, value)| bytes(&name, &value))
        .collect();
    common.push(bytes(env::SIZE, options.ranks.to_string()));
    common.push(bytes(env::JOB, format!("{job:016x}")));
    common.push(bytes(env::SECRET, OsStr::from_bytes(secret.as_bytes())));
    if let Some(workers) = options.workers {
        common.retain(|(name, _)| &name[..] != env::WORKERS.as_bytes());
        common.push(bytes(env::WORKERS, workers.to_string()));
    }
    // A restarted rank must find its state under the same job name wherever it runs, also
    // from a daemon's stored copy of the program (whose file name is not the program's).
    if options.recover
        && !common
            .iter()
            .any(|(n, _)| &n[..] == env::JOB_NAME.as_bytes())
    {
        common.push(bytes(env::JOB_NAME, env::default_job_name(&path)));
    }
    let cwd = std::env::current_dir().unwrap_or_default();
    let start_for = |ranks: &[u32], coord: Option<SocketAddr>, host: usize| {
        let mut env = common.clone();
        env.push(bytes(env::LOCAL_SIZE, ranks.len().to_string()));
        if let Some(coord) = coord {
            env.push(bytes(env::COORD, coord.to_string()));
        }
        Start {
            job,
            program: path.as_os_str().as_bytes().to_vec(),
            hash,
            len,
            args: args.iter().map(|a| ByteBuf::from(a.as_bytes())).collect(),
            env,
            cwd: cwd.as_os_str().as_bytes().to_vec(),
            ranks: ranks.to_vec(),
            coordinator: coord.is_none(),
            heartbeat_ms: millis(heartbeat),
            peer_timeout_ms: millis(peer_timeout),
            recover: options.recover,
            host: host as u32,
            shared_state: options.shared_state,
        }
    };

    // Rank 0's host first: its daemon picks the coordinator's port.
    let (first, others) = conversations.split_at_mut(1);
    let (port, first_pids) = begin(
        &mut first[0],
        &start_for(&used[0].1, None, 0),
        &path,
        &used[0].0,
    )?;
    let port = port.ok_or_else(|| anyhow!("host {} gave no port for rank 0", used[0].0.name))?;
    let coord = SocketAddr::new(used[0].0.addr.ip(), port);
    let mut pids = thread::scope(|scope| {
        let starts: Vec<_> = others
            .iter_mut()
            .zip(&used[1..])
            .enumerate()
            .map(|(i, (conversation, (host, ranks)))| {
                let start = start_for(ranks, Some(coord), i + 1);
                let path = &path;
                scope.spawn(move || begin(conversation, &start, path, host))
            })
            .collect();
        starts
            .into_iter()
            .map(|s| s.join().expect("a start thread panicked").map(|(_, p)| p))
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    pids.insert(0, first_pids);

    let ranks: Vec<Remote> = pids
        .iter()
        .enumerate()
        .flat_map(|(h, pids)| {
            pids.iter().map(move |&(rank, pid)| Remote {
                rank,
                host: h,
                pid,
                incarnation: 0,
                ended: false,
            })
        })
        .collect();
    let job = Job {
        hosts: names,
        spare_from,
        live: vec![true; used.len()],
        finished: vec![false; used.len()],
        ranks,
        failures: Vec::new(),
        grace: peer_timeout + STRAGGLER_GRACE,
        kill_at: None,
        killed: false,
        stopped_by: None,
        recover: options.recover.then_some(options.max_restarts),
        shared_state: options.shared_state,
        margins: (heartbeat + FENCE_SLACK, FENCE_SLACK / 2),
        moves: Vec::new(),
        job_done: None,
        writers: Vec::new(),
    };
    Ok(job.supervise(conversations, heartbeat, peer_timeout))
}

fn bytes(name: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> (ByteBuf, ByteBuf) {
    (
        ByteBuf::from(name.as_ref().as_bytes()),
        ByteBuf::from(value.as_ref().as_bytes()),
    )
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Which ranks each host runs: round-robin, or blocks of `per_host`.
fn place(ranks: usize, hosts: usize, per_host: Option<u16>) -> Result<Vec<Vec<u32>>, Error> {
    let mut placement = vec![Vec::new(); hosts];
    for rank in 0..ranks {
        let host = match per_host {
            None => rank % hosts,
            Some(k) => rank / usize::from(k),
        };
        let Some(on) = placement.get_mut(host) else {
            let k = per_host.unwrap_or(1);
            return Err(Error::Usage(format!(
                "{ranks} ranks at --per-host {k} need {} hosts; {hosts} given",
                ranks.div_ceil(usize::from(k))
            )));
        };
        on.push(rank as u32);
    }
    Ok(placement)
}

/// The program's absolute path: as given when it names a directory, else found on `PATH`.
fn resolve(program: &OsStr) -> Result<PathBuf, Error> {
    let name = program.to_string_lossy();
    let given = Path::new(program);
    let found = if program.as_bytes().contains(&b'/') {
        std::path::absolute(given).ok().filter(|p| p.is_file())
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(given))
                .find(|p| {
                    p.metadata()
                        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                })
                .and_then(|p| std::path::absolute(p).ok())
        })
    };
    found.ok_or_else(|| {
        Error::Usage(format!(
            "program '{name}' not found: give a path to it or a program on PATH"
        ))
    })
}

/// Asks one daemon to start its ranks, sending the program if it asks; the coordinator's port
/// if it runs rank 0, and `(rank, pid)` of each rank.
fn begin(
    (from, to): &mut (FrameReader<TcpStream>, FrameWriter<TcpStream>),
    start: &Start,
    path: &Path,
    host: &Host,
) -> anyhow::Result<(Option<u16>, Pids)> {
    let on = |e: ClusterError| anyhow!("host {}: {e}", host.name);
    from.get_ref().set_read_timeout(Some(START_LIMIT))?;
    to.send(&Request::Start(start.clone())).map_err(on)?;
    loop {
        match from.recv::<Reply>().map_err(on)? {
            Reply::NeedProgram => send_program(to, path, start.len, host)?,
            Reply::Started {
                coordinator_port,
                pids,
            } => return Ok((coordinator_port, pids)),
            Reply::Refused(why) => {
                return Err(anyhow!("host {} refused the job: {why}", host.name));
            }
            Reply::Heartbeat => {}
            other => {
                return Err(anyhow!(
                    "host {} answered a start with {other:?}",
                    host.name
                ));
            }
        }
    }
}

/// Sends the program in pieces, then an empty piece.
fn send_program(
    to: &mut FrameWriter<TcpStream>,
    path: &Path,
    len: u64,
    host: &Host,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut piece = vec![0u8; PROGRAM_PIECE];
    let mut sent = 0u64;
    loop {
        let n = match file.read(&mut piece) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        to.send(&Request::Program(piece[..n].to_vec()))
            .map_err(|e| anyhow!("host {}: {e}", host.name))?;
        if n == 0 {
            break;
        }
        sent += n as u64;
    }
    if sent != len {
        return Err(anyhow!(
            "{} changed while it was being sent",
            path.display()
        ));
    }
    report(&format!(
        "sent {} ({sent} bytes) to {} in {:.2} s",
        path.display(),
        host.name,
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// One rank: its current life, on its host.
struct Remote {
    rank: u32,
    host: usize,
    /// 0 while a restart waits for its pid.
    pid: u32,
    incarnation: u32,
    ended: bool,
}

/// A rank of a lost host waiting to be started elsewhere: once `due` (the fencing margin),
/// on the first candidate host not `tried` yet.
struct Move {
    rank: u32,
    /// The host its state was written on: whose mark the new host must find.
    from: usize,
    due: Instant,
    tried: Vec<usize>,
}

/// What a host's reader thread hands the supervisor.
type Event = (usize, Result<Reply, ClusterError>);

/// A job's supervision across the hosts, as `run::supervise` does on one.
struct Job {
    hosts: Vec<Host>,
    /// Hosts from this index on are spares (`--spare-hosts`).
    spare_from: usize,
    live: Vec<bool>,
    /// Hosts that answered `Finished`.
    finished: Vec<bool>,
    ranks: Vec<Remote>,
    failures: Vec<Failure>,
    grace: Duration,
    kill_at: Option<Instant>,
    killed: bool,
    /// The first signal gsm forwarded: the reason of every end that follows.
    stopped_by: Option<libc::c_int>,
    /// With `--recover`: the restarts each rank may have.
    recover: Option<u32>,
    shared_state: bool,
    /// The fencing margins before a lost host's rank starts elsewhere: (host silent, its
    /// connection failed).
    margins: (Duration, Duration),
    moves: Vec<Move>,
    /// When rank 0 ended the job with success, plus the grace period: a restarted life still
    /// joining then is fenced, and its end (from rank 0's success on) fails nothing.
    job_done: Option<Instant>,
    writers: Vec<Writer>,
}

impl Job {
    /// Waits for every rank over the daemons' connections; returns gsm's status.
    fn supervise(
        mut self,
        conversations: Vec<(FrameReader<TcpStream>, FrameWriter<TcpStream>)>,
        heartbeat: Duration,
        peer_timeout: Duration,
    ) -> ExitCode {
        let (tx, events) = mpsc::channel::<Event>();
        for (h, (mut from, to)) in conversations.into_iter().enumerate() {
            // A host silent this long is lost; a send that long blocked, too.
            let timeouts = from
                .get_ref()
                .set_read_timeout(Some(peer_timeout))
                .and_then(|()| to.get_ref().set_write_timeout(Some(peer_timeout)));
            let tx = tx.clone();
            thread::spawn(move || {
                if let Err(e) = timeouts {
                    let _ = tx.send((
                        h,
                        Err(ClusterError::Io {
                            peer: None,
                            source: e,
                        }),
                    ));
                    return;
                }
                loop {
                    let reply = from.recv::<Reply>();
                    let end = reply.is_err();
                    if tx.send((h, reply)).is_err() || end {
                        return;
                    }
                }
            });
            self.writers.push(Arc::new(Mutex::new(to)));
        }
        drop(tx);
        let done = Arc::new(AtomicBool::new(false));
        let beating = {
            let (writers, done) = (self.writers.clone(), done.clone());
            thread::spawn(move || {
                // A host whose send failed gets no more (its reader reports it lost), so that
                // one host's full socket cannot hold up the heartbeats of the others.
                let mut failed = vec![false; writers.len()];
                while !done.load(Ordering::Acquire) {
                    thread::sleep(heartbeat);
                    for (w, failed) in writers.iter().zip(&mut failed).filter(|(_, f)| !**f) {
                        *failed = w
                            .lock()
                            .expect("writer lock")
                            .send(&Request::Heartbeat)
                            .is_err();
                    }
                }
            })
        };
        let mut finish_by: Option<Instant> = None;
        let mut late_fenced = false;
        loop {
            for sig in caught_signals() {
                self.tell_all(&Request::Signal(sig));
                self.stopped_by.get_or_insert(sig);
                self.fail_later();
            }
            match next(&events) {
                Some((_, Ok(Reply::Output { rank, stderr, line }))) => {
                    let mut prefixed = format!("[{rank}] ").into_bytes();
                    prefixed.extend_from_slice(&line);
                    let stream = if stderr { Stream::Err } else { Stream::Out };
                    let _ = write_line(stream, &prefixed);
                }
                Some((h, Ok(Reply::Exited { rank, pid, status }))) => {
                    self.exited(h, rank, pid, ExitStatus::from_raw(status));
                }
                Some((
                    h,
                    Ok(Reply::Restarted {
                        rank,
                        incarnation,
                        pid,
                    }),
                )) => {
                    if let Some(r) = self.ranks.iter_mut().find(|r| {
                        r.rank == rank && r.host == h && r.incarnation == incarnation && !r.ended
                    }) {
                        r.pid = pid;
                    }
                }
                Some((h, Ok(Reply::RestartRefused { rank, why }))) => self.refused(h, rank, &why),
                Some((_, Ok(Reply::Fence { rank, incarnation }))) => self.fence(rank, incarnation),
                Some((h, Ok(Reply::Finished))) => self.finished[h] = true,
                Some((_, Ok(Reply::Heartbeat))) | None => {}
                Some((h, Ok(other))) => self.lose(h, &format!("it sent {other:?}"), false),
                Some((h, Err(e))) if self.live[h] => {
                    let silent = matches!(e, ClusterError::Silent { .. });
                    let why = if silent {
                        format!("no word from its daemon in {peer_timeout:?}")
                    } else {
                        e.to_string()
                    };
                    if self.finished[h] {
                        self.live[h] = false;
                    } else {
                        self.lose(h, &why, silent);
                    }
                }
                Some((_, Err(_))) => {}
            }
            self.start_moves();
            if self.ranks.iter().all(|r| r.ended) {
                let by = *finish_by.get_or_insert_with(|| {
                    self.tell_all(&Request::Finish);
                    Instant::now() + DRAIN + peer_timeout
                });
                let all_finished = self
                    .live
                    .iter()
                    .zip(&self.finished)
                    .all(|(live, done)| !live || *done);
                if all_finished || Instant::now() >= by {
                    break;
                }
            } else if !late_fenced && self.job_done.is_some_and(|at| Instant::now() >= at) {
                // Rank 0 ended the job a grace period ago: restarted lives still joining are
                // stopped (and their ends, after `job_done`, fail nothing).
                late_fenced = true;
                for r in self.ranks.iter().filter(|r| !r.ended && r.incarnation > 0) {
                    let fence = Request::Fence {
                        rank: r.rank,
                        incarnation: r.incarnation,
                    };
                    self.tell(r.host, &fence);
                }
            } else if !self.killed && self.kill_at.is_some_and(|at| Instant::now() >= at) {
                self.tell_all(&Request::Kill);
                self.killed = true;
            }
        }
        done.store(true, Ordering::Release);
        let _ = beating.join();
        job_status(&self.failures)
    }

    /// Sends `request` to every live host.
    fn tell_all(&self, request: &Request) {
        for (w, _) in self
            .writers
            .iter()
            .zip(&self.live)
            .filter(|(_, live)| **live)
        {
            let _ = w.lock().expect("writer lock").send(request);
        }
    }

    /// Sends `request` to host `h`; a failure is found by its reader.
    fn tell(&self, h: usize, request: &Request) {
        let _ = self.writers[h].lock().expect("writer lock").send(request);
    }

    /// The other ranks get the grace period, then gsm kills them.
    fn fail_later(&mut self) {
        self.kill_at.get_or_insert(Instant::now() + self.grace);
    }

    fn fail(&mut self, failure: Failure) {
        report(&failure.what);
        self.failures.push(failure);
        self.fail_later();
    }

    /// Whether rank `rank` at `incarnation` may get another life.
    fn may_restart(&self, rank: u32, incarnation: u32) -> bool {
        let rank_0_ended = self.ranks.iter().any(|r| r.rank == 0 && r.ended);
        self.recover.is_some_and(|most| {
            rank != 0 && incarnation < most && self.kill_at.is_none() && !rank_0_ended
        })
    }

    /// The life of `rank` with process `pid` on host `h` ended with `status`.
    fn exited(&mut self, h: usize, rank: u32, pid: u32, status: ExitStatus) {
        let Some(i) = self
            .ranks
            .iter()
            .position(|r| r.rank == rank && r.host == h && r.pid == pid && !r.ended)
        else {
            return;
        };
        self.ranks[i].ended = true;
        let Some(code) = failure_code(status) else {
            if rank == 0 {
                self.job_done = Some(Instant::now() + self.grace);
            }
            return;
        };
        let incarnation = self.ranks[i].incarnation;
        let what = format!(
            "rank {rank} (pid {pid}) on host {} {}",
            self.hosts[h].name,
            describe(status)
        );
        if self.job_done.is_some() && incarnation > 0 {
            report(&format!(
                "{what}: incarnation {incarnation} had not rejoined when the job ended"
            ));
            return;
        }
        if self.may_restart(rank, incarnation) {
            let next = incarnation + 1;
            report(&format!(
                "{what}; restarting it as incarnation {next} (--recover)"
            ));
            let r = &mut self.ranks[i];
            (r.ended, r.pid, r.incarnation) = (false, 0, next);
            self.tell(
                h,
                &Request::Restart {
                    rank,
                    incarnation: next,
                    state_from: None,
                },
            );
            return;
        }
        if self.recover.is_some() && rank != 0 && self.kill_at.is_none() {
            report(&format!(
                "rank {rank} used up its {incarnation} restarts (--max-restarts)"
            ));
        }
        let cause = cause(status, self.killed, self.stopped_by);
        self.fail(Failure {
            cause,
            rank: rank as usize,
            code,
            what,
        });
    }

    /// Host `h` refused to restart `rank`: the next candidate is asked, if the rank was moving;
    /// else the rank fails.
    fn refused(&mut self, h: usize, rank: u32, why: &str) {
        let Some(i) = self
            .ranks
            .iter()
            .position(|r| r.rank == rank && r.host == h && r.pid == 0 && !r.ended)
        else {
            return;
        };
        report(&format!(
            "host {} refused incarnation {} of rank {rank}: {why}",
            self.hosts[h].name, self.ranks[i].incarnation
        ));
        if let Some(m) = self.moves.iter_mut().find(|m| m.rank == rank) {
            m.tried.push(h);
            m.due = Instant::now();
            return;
        }
        self.ranks[i].ended = true;
        self.fail(Failure {
            cause: Cause::Own,
            rank: rank as usize,
            code: 1,
            what: format!("rank {rank} could not be restarted"),
        });
    }

    /// Rank 0 asks that `incarnation` of `rank` be killed: its host's daemon does it.
    fn fence(&self, rank: u32, incarnation: u32) {
        let Some(r) = self
            .ranks
            .iter()
            .find(|r| r.rank == rank && r.incarnation == incarnation && !r.ended)
        else {
            return;
        };
        if self.live[r.host] {
            report(&format!(
                "fencing rank {rank} (pid {}, incarnation {incarnation}) on host {}: rank 0 lost it",
                r.pid, self.hosts[r.host].name
            ));
            self.tell(r.host, &Request::Fence { rank, incarnation });
        }
    }

    /// Host `h` is lost for `why` (`silent`: it fell silent, rather than its connection
    /// failing): its ranks still running move to other hosts where they may, else fail with
    /// it, in one report naming them.
    fn lose(&mut self, h: usize, why: &str, silent: bool) {
        self.live[h] = false;
        let margin = if silent {
            self.margins.0
        } else {
            self.margins.1
        };
        let mut failed = Vec::new();
        let mut moving = Vec::new();
        for i in 0..self.ranks.len() {
            let r = &self.ranks[i];
            if r.host != h || r.ended {
                continue;
            }
            let (rank, incarnation) = (r.rank, r.incarnation);
            // A move under way from this host is fenced by its margin already.
            self.moves.retain(|m| m.rank != rank);
            if self.may_restart(rank, incarnation) && self.shared_state {
                let r = &mut self.ranks[i];
                (r.pid, r.incarnation) = (0, incarnation + 1);
                moving.push(rank);
                self.moves.push(Move {
                    rank,
                    from: h,
                    due: Instant::now() + margin,
                    tried: vec![h],
                });
            } else {
                self.ranks[i].ended = true;
                failed.push(rank);
            }
        }
        let list = |ranks: &[u32]| {
            let names: Vec<String> = ranks.iter().map(u32::to_string).collect();
            format!(
                "rank{} {}",
                if ranks.len() > 1 { "s" } else { "" },
                names.join(", ")
            )
        };
        let name = self.hosts[h].name.clone();
        if !moving.is_empty() {
            report(&format!(
                "host {name} lost ({why}): {} will restart on another host in {} ms, once \
                 their old lives are fenced (--recover)",
                list(&moving),
                margin.as_millis()
            ));
        }
        let Some(&first) = failed.first() else {
            return;
        };
        let mut what = format!("host {name} lost ({why}): {} ended with it", list(&failed));
        if self.recover.is_some() && !self.shared_state && failed.iter().any(|&r| r != 0) {
            what.push_str(
                "; a rank's state is pinned to its host without --shared-state, so it \
                 cannot restart elsewhere",
            );
        }
        self.fail(Failure {
            cause: Cause::HostLost,
            rank: first as usize,
            code: gossamer::EXIT_PEER_LOST,
            what,
        });
    }

    /// Starts the moves whose margin has passed, each on its best candidate host.
    fn start_moves(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.moves.len() {
            if self.moves[i].due > now || self.kill_at.is_some() {
                i += 1;
                continue;
            }
            let m = &self.moves[i];
            let running = |h: usize| {
                self.ranks
                    .iter()
                    .filter(|r| r.host == h && !r.ended)
                    .count()
            };
            // Spares first, then the fewest running ranks.
            let target = (0..self.hosts.len())
                .filter(|&h| self.live[h] && !m.tried.contains(&h))
                .min_by_key(|&h| (h < self.spare_from, running(h)));
            let (rank, from) = (m.rank, m.from);
            let Some(target) = target else {
                let m = self.moves.remove(i);
                if let Some(r) = self.ranks.iter_mut().find(|r| r.rank == rank && !r.ended) {
                    r.ended = true;
                }
                let tried: Vec<&str> = m
                    .tried
                    .iter()
                    .map(|&h| self.hosts[h].name.as_str())
                    .collect();
                self.fail(Failure {
                    cause: Cause::HostLost,
                    rank: rank as usize,
                    code: gossamer::EXIT_PEER_LOST,
                    what: format!(
                        "rank {rank} has no host left to restart on (tried {})",
                        tried.join(", ")
                    ),
                });
                continue;
            };
            self.moves[i].tried.push(target);
            self.moves[i].due = Instant::now() + MOVE_LIMIT;
            let Some(r) = self.ranks.iter_mut().find(|r| r.rank == rank && !r.ended) else {
                self.moves.remove(i);
                continue;
            };
            r.host = target;
            let incarnation = r.incarnation;
            report(&format!(
                "restarting rank {rank} as incarnation {incarnation} on host {} (--recover)",
                self.hosts[target].name
            ));
            self.tell(
                target,
                &Request::Restart {
                    rank,
                    incarnation,
                    state_from: Some(from as u32),
                },
            );
            i += 1;
        }
        // A move is done once its life runs.
        let ranks = &self.ranks;
        self.moves.retain(|m| {
            !ranks
                .iter()
                .any(|r| r.rank == m.rank && r.pid != 0 && !r.ended)
        });
    }
}

/// The next event, or `None` after a poll interval without one.
fn next(events: &Receiver<Event>) -> Option<Event> {
    match events.recv_timeout(POLL) {
        Ok(event) => Some(event),
        Err(RecvTimeoutError::Timeout) => None,
        // Every host's reader has ended: nothing more will come, but the deadlines run on.
        Err(RecvTimeoutError::Disconnected) => {
            thread::sleep(POLL);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_go_round_robin_or_in_blocks() {
        let round = place(8, 3, None).unwrap();
        assert_eq!(round, vec![vec![0, 3, 6], vec![1, 4, 7], vec![2, 5]]);
        let blocks = place(5, 3, Some(2)).unwrap();
        assert_eq!(blocks, vec![vec![0, 1], vec![2, 3], vec![4]]);
        let Err(Error::Usage(why)) = place(8, 3, Some(2)) else {
            panic!("8 ranks at 2 per host fit on 4 hosts, not 3");
        };
        assert!(why.contains("need 4 hosts; 3 given"), "{why}");
    }

    #[test]
    fn a_program_is_found_by_path_or_on_path() {
        let sh = resolve(OsStr::new("sh")).unwrap_or_else(|_| panic!("sh is on PATH"));
        assert!(sh.is_absolute(), "{}", sh.display());
        let Err(Error::Usage(why)) = resolve(OsStr::new("./no-such-program")) else {
            panic!("a missing program is a usage error");
        };
        assert!(why.contains("not found"), "{why}");
    }
}
