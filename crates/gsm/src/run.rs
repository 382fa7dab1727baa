//! `gsm run -n N -- prog args...`: start a rack of N ranks of one program on this machine.
//! With `--hosts` the hosts' daemons start them instead (see [`hosts`]); what follows is the
//! one-machine case, whose output, signals and fate sharing that one keeps.
//!
//! gsm picks the coordinator's address (a free loopback port), a random job id and a random
//! secret, and starts N children with `GSM_RANK`, `GSM_SIZE`, `GSM_COORD`, `GSM_JOB`,
//! `GSM_SECRET` and `GSM_LOCAL_SIZE` (and `GSM_WORKERS` with `--workers`) set; the rest of the
//! environment is inherited, less the rank variables of other launchers
//! ([`gossamer::env::LAUNCHER_VARS`]), which inside an allocation describe gsm, not its ranks.
//! Every child's stdin is `/dev/null`. gsm also makes the job's directory (see
//! [`jobs`](crate::jobs)) and gives it to every rank as `GSM_STATS_DIR`: each rank serves its
//! counters on loopback and says where there, for `gsm top`, and leaves its last counters
//! there when it ends, which `--stats` prints as a table after the job.
//!
//! Output: each line a rank writes to stdout or stderr is written whole, with the prefix
//! `[rank] `, to gsm's stdout or stderr, by one thread per pipe; a last line without a newline
//! gets one. A line longer than [`MAX_LINE`] is cut into lines of that length.
//!
//! Each child is the leader of its own process group, so that signals and the final kill
//! reach whatever it started too. Because of that the terminal's Ctrl-C reaches only gsm,
//! which forwards SIGINT and SIGTERM to every rank's group. If gsm itself dies, even by
//! SIGKILL, its [`guardian`] kills every rank's group.
//!
//! Fate sharing: once a rank fails (non-zero exit or killed by a signal), or gsm forwarded a
//! signal, the other ranks get `GSM_PEER_TIMEOUT` + 2 s to stop on their own (the rack stops
//! them within `GSM_PEER_TIMEOUT` + 1 s); then gsm kills the rest with SIGKILL. When all ranks
//! have ended, gsm kills whatever is left in their groups. Every abnormal end is reported on
//! stderr in one line.
//!
//! Recovery (`--recover`): every rank gets `GSM_RECOVER=1`, and a rank other than 0 that fails
//! while rank 0 runs is started again at once as the same rank, with `GSM_INCARNATION` one
//! more, up to `--max-restarts` times per rank; it rejoins the running job (see
//! `gossamer::durable`). Only a failure of rank 0, a rank that used up its restarts or a
//! forwarded signal ends the job as above. A restarted rank that has not rejoined when rank 0
//! ends the job with success is stopped after the grace period, and does not fail the job.
//!
//! Exit status: 0 if every rank exited with 0. Otherwise the status of the rank that caused
//! the failure (128 + the signal number if it was killed), chosen by construction rather than
//! by which exit gsm happened to see first (see [`Cause`] for the ranking): a rank that
//! failed on its own outranks one that only repeated rank 0's status (a gossamer rack ends
//! every rank with rank 0's status, so when rank 0's `main` panics every rank exits with
//! [`gossamer::EXIT_PANIC`]), which outranks one that exited with
//! [`gossamer::EXIT_BAD_FRAME`], which outranks one that exited with
//! [`gossamer::EXIT_PEER_LOST`] (both say that another rank ended the job), which outranks
//! one that ended after gsm forwarded a signal, which outranks one that exited with
//! [`gossamer::EXIT_PEER_LOST`] after it (a peer died of the signal before it reached this
//! rank), which outranks one that gsm killed as a straggler; among equals the first seen wins. When several ranks failed, a last line names
//! the rank whose status gsm exits with, and says `stopped by SIGTERM` (or `SIGINT`) when the
//! job ended because gsm forwarded that signal.
//!
//! Not guaranteed: a rank other than 0 that failed on its own with exactly the status rank 0
//! failed with on its own is taken for a copy of rank 0's, and rank 0 is named.

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::Context;
use gossamer::env;

use crate::jobs::JobDir;
use crate::metrics::{RankSnapshot, RankView};

pub(crate) mod guardian;
mod hosts;
use guardian::Guardian;

/// Options of `gsm run`.
#[derive(clap::Args, Debug)]
pub(crate) struct Options {
    /// Ranks (nodes) to start.
    #[arg(
        short = 'n',
        long = "ranks",
        value_name = "N",
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    ranks: u16,
    /// Worker threads per rank (sets GSM_WORKERS); default: cores ÷ ranks.
    #[arg(long, value_name = "W", value_parser = clap::value_parser!(u32).range(1..))]
    workers: Option<u32>,
    /// Start the ranks through the daemons (`gsm daemon`) of these hosts, comma-separated
    /// (`name`, `address`, either with `:port`), instead of on this machine.
    #[arg(long, value_name = "HOSTS")]
    hosts: Option<String>,
    /// With --hosts: K ranks per host in blocks (ranks 0..K on the first) instead of
    /// round-robin.
    #[arg(long, value_name = "K", requires = "hosts", value_parser = clap::value_parser!(u16).range(1..))]
    per_host: Option<u16>,
    /// With --hosts: the cluster key [default: ~/.gossamer/cluster.key].
    #[arg(long, value_name = "FILE", requires = "hosts")]
    key: Option<std::path::PathBuf>,
    /// Restart a failed rank other than 0 as the same rank (its next incarnation) instead of
    /// ending the job; durable properties and sessions carry on (sets GSM_RECOVER=1). With
    /// --hosts: on its own host while that host's daemon runs, else (with --shared-state) on
    /// a spare host or another host of the job.
    #[arg(long)]
    recover: bool,
    /// With --hosts --recover: hosts that start no rank and take over the ranks of a lost
    /// host first.
    #[arg(long, value_name = "HOSTS", requires_all = ["hosts", "recover"])]
    spare_hosts: Option<String>,
    /// With --hosts --recover: the job's GSM_STATE_DIR is on storage every host shares, so a
    /// rank of a lost host may restart on another (the daemons check); without it a rank
    /// restarts only on its own host.
    #[arg(long, requires_all = ["hosts", "recover"])]
    shared_state: bool,
    /// With --recover: how many times each rank may be restarted before its failure ends
    /// the job.
    #[arg(long, value_name = "N", default_value_t = 100, requires = "recover")]
    max_restarts: u32,
    /// Print a table of the ranks' counters when the job ends: per worker its busy share,
    /// requests, batches and properties; the busiest property types; link traffic.
    #[arg(long, conflicts_with = "hosts")]
    stats: bool,
    /// The program every rank runs, and its arguments.
    #[arg(value_name = "PROGRAM", required = true, trailing_var_arg = true, num_args = 1..)]
    command: Vec<OsString>,
}

/// Why `gsm run` did not start or supervise the ranks.
#[derive(Debug)]
pub(crate) enum Error {
    /// A mistake on the command line or in the `GSM_*` settings: reported like clap's own
    /// errors, with status 2.
    Usage(String),
    /// Anything else.
    Other(anyhow::Error),
}

impl From<anyhow::Error> for Error {
    fn from(e: anyhow::Error) -> Error {
        Error::Other(e)
    }
}

/// How much longer than `GSM_PEER_TIMEOUT` the other ranks get once one failed: the rack
/// itself stops every rank within `GSM_PEER_TIMEOUT` + 1 s.
pub(crate) const STRAGGLER_GRACE: Duration = Duration::from_secs(2);
/// How often the supervisor looks at the children and at pending signals.
pub(crate) const POLL: Duration = Duration::from_millis(10);
/// How long output threads may take to drain once every rank's group is gone.
pub(crate) const DRAIN: Duration = Duration::from_secs(2);
/// The longest line forwarded whole; longer ones are cut, so memory stays bounded.
const MAX_LINE: usize = 1 << 20;

/// Runs `gsm run`: starts the ranks and returns the job's exit status.
pub(crate) fn run(options: &Options) -> Result<ExitCode, Error> {
    if let Some(list) = &options.hosts {
        return hosts::run(options, list);
    }
    let peer_timeout = env::peer_timeout(|name| std::env::var(name).ok())
        .map_err(|e| Error::Usage(e.to_string()))?;
    let Some((program, args)) = options.command.split_first() else {
        return Err(Error::Usage("no program to run given".into()));
    };
    let size = usize::from(options.ranks);
    let port = free_port().context("cannot find a free loopback port for the coordinator")?;
    let job = env::random_job_id().context("cannot make a job id")?;
    let secret = env::Secret::random().context("cannot make a job secret")?;
    catch_signals().context("cannot install the SIGINT and SIGTERM handlers")?;
    // The job runs without its directory if it cannot be made: only `gsm top` and `--stats`
    // need it.
    let job_dir = JobDir::create(job, &program.to_string_lossy(), size)
        .and_then(|dir| {
            dir.keep_control(secret.control_token().as_bytes())?;
            Ok(dir)
        })
        .inspect_err(|e| {
            eprintln!("gsm run: the job runs without gsm top and --stats: {e:#}");
        })
        .ok();
    let mut guardian = Guardian::start().context("cannot start the guardian of the ranks")?;

    let (fences, fence_requests) = if options.recover {
        let (read, write) = fence_pipe().context("cannot make the pipe for fences")?;
        (Some(write), Some(read_fences(read)))
    } else {
        (None, None)
    };
    let launch = Launch {
        fences,
        program: program.clone(),
        args: args.to_vec(),
        size,
        port,
        job,
        secret: String::from_utf8_lossy(secret.as_bytes()).into_owned(),
        workers: options.workers,
        recover: options.recover.then_some(options.max_restarts),
        stats_dir: job_dir.as_ref().map(|d| d.path().to_path_buf()),
    };
    let mut ranks: Vec<Rank> = Vec::with_capacity(size);
    for rank in 0..size {
        match launch.start(rank, 0, &mut guardian) {
            Ok(started) => ranks.push(started),
            Err(e) => {
                abandon(&mut ranks);
                guardian.end();
                let name = program.to_string_lossy();
                return Err(match e.kind() {
                    io::ErrorKind::NotFound if rank == 0 => Error::Usage(format!(
                        "program '{name}' not found: give a path to it or a program on PATH"
                    )),
                    io::ErrorKind::PermissionDenied if rank == 0 => Error::Usage(format!(
                        "program '{name}' cannot be run: {e}; is it executable?"
                    )),
                    _ => Error::Other(anyhow::anyhow!("cannot start rank {rank} ('{name}'): {e}")),
                });
            }
        }
    }
    let grace = peer_timeout + STRAGGLER_GRACE;
    let code = supervise(&mut ranks, grace, &mut guardian, &launch, fence_requests);
    guardian.end();
    if let Some(job_dir) = job_dir.as_ref().filter(|_| options.stats) {
        print_last_stats(job_dir, &program.to_string_lossy(), size);
    }
    Ok(code)
}

/// Prints the table of the counters the ranks left when they ended (`--stats`): the rates
/// are over each rank's whole life.
fn print_last_stats(job_dir: &JobDir, program: &str, size: usize) {
    let mut views = Vec::new();
    let mut silent = Vec::new();
    let left: Vec<(u32, String)> = (0..size as u32)
        .map(|r| {
            let file = job_dir.path().join(format!("rank-{r}.prom"));
            (r, std::fs::read_to_string(file).unwrap_or_default())
        })
        .collect();
    for (rank, text) in left {
        match RankSnapshot::from_text(&text) {
            Ok(snap) if !text.is_empty() => views.push(RankView::between(None, &snap)),
            Ok(_) => silent.push((
                format!("rank {rank}"),
                "left no counters (it failed)".into(),
            )),
            Err(e) => silent.push((
                format!("rank {rank}"),
                format!("left unreadable counters: {e}"),
            )),
        }
    }
    let screen = crate::top::Screen {
        title: format!("gsm run --stats · {program} · {size} ranks · rates over each rank's life"),
        views,
        silent,
    };
    print!("{}", screen.text(120));
}

/// How every rank is started, for the first time and, with `--recover`, again.
struct Launch {
    /// With `--recover`: the pipe rank 0 asks for fences on (`GSM_SUPERVISOR`), its write end.
    fences: Option<std::os::fd::OwnedFd>,
    program: OsString,
    args: Vec<OsString>,
    size: usize,
    port: u16,
    job: u64,
    secret: String,
    workers: Option<u32>,
    /// With `--recover`: the restarts each rank may have.
    recover: Option<u32>,
    /// The job's directory, where the ranks leave their counters (`GSM_STATS_DIR`).
    stats_dir: Option<std::path::PathBuf>,
}

impl Launch {
    /// Starts `incarnation` of rank `rank`.
    fn start(&self, rank: usize, incarnation: u32, guardian: &mut Guardian) -> io::Result<Rank> {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        for var in env::LAUNCHER_VARS {
            command.env_remove(var);
        }
        command
            .env(env::RANK, rank.to_string())
            .env(env::SIZE, self.size.to_string())
            .env(env::COORD, format!("{}:{}", Ipv4Addr::LOCALHOST, self.port))
            .env(env::JOB, format!("{:016x}", self.job))
            .env(env::SECRET, &self.secret)
            .env(env::LOCAL_SIZE, self.size.to_string());
        match &self.stats_dir {
            Some(dir) => command.env(env::STATS_DIR, dir),
            None => command.env_remove(env::STATS_DIR),
        };
        if let Some(workers) = self.workers {
            command.env(env::WORKERS, workers.to_string());
        }
        if self.recover.is_some() {
            command
                .env(env::RECOVER, "1")
                .env(env::INCARNATION, incarnation.to_string());
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        guardian.alive()?;
        guardian.guard(&mut command);
        if let Some(fences) = self.fences.as_ref().filter(|_| rank == 0) {
            give_fence_pipe(&mut command, fences);
        }
        let child = command.spawn()?;
        Ok(Rank::start(rank, incarnation, child))
    }
}

/// Gives rank 0's `command` the write end of the pipe it asks for fences on, named in
/// `GSM_SUPERVISOR` and kept open across its exec.
pub(crate) fn give_fence_pipe(command: &mut Command, fences: &std::os::fd::OwnedFd) {
    let fd = fences.as_raw_fd();
    command.env(env::SUPERVISOR, fd.to_string());
    // SAFETY: runs between fork and exec and calls only fcntl(2), which is
    // async-signal-safe; it lets rank 0 keep the fence pipe's write end across exec.
    unsafe {
        command.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The pipe rank 0 asks for fences on: (read end, write end), both closed on exec (rank 0's
/// copy of the write end is kept open by [`give_fence_pipe`]).
pub(crate) fn fence_pipe() -> io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2(2) writes two descriptors into a live array of two c_ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just opened by pipe2 and are owned by nothing else.
    Ok(unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    })
}

/// Reads rank 0's fence requests, lines `fence <rank> <incarnation>`, on a thread of its own.
pub(crate) fn read_fences(read: std::os::fd::OwnedFd) -> Receiver<(usize, u32)> {
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(std::fs::File::from(read)).lines() {
            let Ok(line) = line else { return };
            let mut words = line.split(' ');
            let request = match (words.next(), words.next(), words.next()) {
                (Some("fence"), Some(rank), Some(life)) => rank.parse().ok().zip(life.parse().ok()),
                _ => None,
            };
            match request {
                Some(request) => {
                    if tx.send(request).is_err() {
                        return;
                    }
                }
                None => report(&format!("ignoring a request from rank 0: {line:?}")),
            }
        }
    });
    rx
}

/// A port that was free a moment ago. Another process may take it before rank 0 binds it;
/// rank 0 then fails to listen and says so.
fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

/// One started rank.
struct Rank {
    rank: usize,
    /// Which life of the rank it is (0, then one more per restart under `--recover`).
    incarnation: u32,
    /// The child's pid, which is also its process group id.
    pid: u32,
    child: Child,
    ended: bool,
    /// Whether the guardian may still have to kill its group: until the group is gone.
    guarded: bool,
    /// The threads forwarding its stdout and stderr.
    pipes: Vec<JoinHandle<()>>,
}

impl Rank {
    fn start(rank: usize, incarnation: u32, mut child: Child) -> Rank {
        let mut pipes = Vec::with_capacity(2);
        if let Some(out) = child.stdout.take() {
            pipes.push(thread::spawn(move || forward(rank, out, Stream::Out)));
        }
        if let Some(err) = child.stderr.take() {
            pipes.push(thread::spawn(move || forward(rank, err, Stream::Err)));
        }
        Rank {
            rank,
            incarnation,
            pid: child.id(),
            child,
            ended: false,
            guarded: true,
            pipes,
        }
    }
}

/// Why a rank failed, as far as the job's status goes: a rank that failed on its own
/// outranks one that repeated rank 0's status, which outranks one whose host was lost, one
/// that saw a bad frame, one that only lost a peer, one that ended after gsm forwarded a
/// signal, one that only lost a peer after that, and last one gsm killed as a straggler. The order of the variants is that ranking.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Cause {
    /// A non-zero status of its own, or a signal gsm did not send.
    Own,
    /// A rank other than 0 that ended with the status rank 0 failed with on its own: a rack
    /// ends every rank with rank 0's status (set by [`job_status`], once every rank ended, so
    /// the order gsm saw the exits in does not matter).
    Repeated,
    /// Its host was lost: its daemon fell silent (`gsm run --hosts`).
    HostLost,
    /// It exited with [`gossamer::EXIT_BAD_FRAME`]: a peer sent it a bad frame.
    BadFrame,
    /// It exited with [`gossamer::EXIT_PEER_LOST`]: it ended because another rank did.
    PeerLost,
    /// It ended after gsm forwarded this signal to the job.
    Stopped(libc::c_int),
    /// It exited with [`gossamer::EXIT_PEER_LOST`] after gsm forwarded this signal: a peer
    /// died of the signal before the signal reached this rank, which only followed.
    Followed(libc::c_int),
    /// gsm killed it after the grace period.
    Straggler,
}

/// A failed rank, for the job's status.
pub(crate) struct Failure {
    pub(crate) cause: Cause,
    pub(crate) rank: usize,
    pub(crate) code: u8,
    /// "rank 1 (pid 4242) killed by SIGKILL".
    pub(crate) what: String,
}

/// Waits for every rank, forwarding signals and killing stragglers; returns gsm's status:
/// that of the failure whose [`Cause`] ranks first, the first seen among equals.
fn supervise(
    ranks: &mut Vec<Rank>,
    grace: Duration,
    guardian: &mut Guardian,
    launch: &Launch,
    fences: Option<Receiver<(usize, u32)>>,
) -> ExitCode {
    let mut failures: Vec<Failure> = Vec::new();
    // Ranks replaced by their next incarnation, kept for their output pipes and groups.
    let mut replaced: Vec<Rank> = Vec::new();
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    // The first signal gsm forwarded: the reason of every end that follows.
    let mut stopped_by: Option<libc::c_int> = None;
    let mut rank_0_ended = false;
    // When rank 0 ended the job with success: a restarted rank still joining then is stopped
    // after the grace period, and its end is not the job's failure (the job ended without it).
    let mut job_done: Option<Instant> = None;
    loop {
        for sig in caught_signals() {
            for r in ranks.iter().filter(|r| !r.ended) {
                signal_group(r.pid, sig);
            }
            stopped_by.get_or_insert(sig);
            kill_at.get_or_insert(Instant::now() + grace);
        }
        for r in ranks.iter_mut().filter(|r| !r.ended) {
            let failure = match r.child.try_wait() {
                Ok(None) => continue,
                Ok(Some(status)) => failure_code(status).map(|code| Failure {
                    cause: cause(status, killed, stopped_by),
                    rank: r.rank,
                    code,
                    what: format!("rank {} (pid {}) {}", r.rank, r.pid, describe(status)),
                }),
                Err(e) => Some(Failure {
                    cause: Cause::Own,
                    rank: r.rank,
                    code: 1,
                    what: format!("cannot wait for rank {} (pid {}): {e}", r.rank, r.pid),
                }),
            };
            r.ended = true;
            let Some(failure) = failure else {
                if r.rank == 0 {
                    job_done = Some(Instant::now() + grace);
                }
                continue;
            };
            if job_done.is_some() && r.incarnation > 0 {
                report(&format!(
                    "{}: incarnation {} had not rejoined when the job ended",
                    failure.what, r.incarnation
                ));
                continue;
            }
            let restart = launch.recover.filter(|&most| {
                r.rank != 0 && r.incarnation < most && kill_at.is_none() && !rank_0_ended
            });
            if restart.is_some() {
                let next = r.incarnation + 1;
                report(&format!(
                    "{}; restarting it as incarnation {next} (--recover)",
                    failure.what
                ));
                match launch.start(r.rank, next, guardian) {
                    Ok(again) => {
                        replaced.push(std::mem::replace(r, again));
                        continue;
                    }
                    Err(e) => report(&format!("cannot restart rank {}: {e}", r.rank)),
                }
            } else if launch.recover.is_some() && r.rank != 0 && !rank_0_ended {
                report(&format!(
                    "rank {} used up its {} restarts (--max-restarts)",
                    r.rank, r.incarnation
                ));
            }
            report(&failure.what);
            failures.push(failure);
            kill_at.get_or_insert(Instant::now() + grace);
        }
        // Rank 0 lost a rank whose process may still run (silent, stopped): kill that life
        // (after the exits above, so that one already ended is not fenced).
        for (rank, incarnation) in fences.iter().flat_map(|f| f.try_iter()) {
            // A process that ended meanwhile is not fenced (std keeps its status for later).
            let fenced = ranks.iter_mut().position(|r| {
                r.rank == rank
                    && r.incarnation == incarnation
                    && !r.ended
                    && matches!(r.child.try_wait(), Ok(None))
            });
            if let Some(r) = fenced.map(|i| &ranks[i]) {
                report(&format!(
                    "fencing rank {rank} (pid {}, incarnation {incarnation}): rank 0 lost it",
                    r.pid
                ));
                signal_group(r.pid, libc::SIGKILL);
            }
        }
        rank_0_ended = ranks[0].ended;
        if job_done.is_some_and(|at| Instant::now() >= at) {
            for r in ranks.iter().filter(|r| !r.ended && r.incarnation > 0) {
                signal_group(r.pid, libc::SIGKILL);
            }
        }
        for r in ranks
            .iter_mut()
            .chain(replaced.iter_mut())
            .filter(|r| r.ended && r.guarded)
        {
            if group_gone(r.pid) {
                guardian.forget(r.pid);
                r.guarded = false;
            }
        }
        if ranks.iter().all(|r| r.ended) {
            break;
        }
        if !killed && kill_at.is_some_and(|at| Instant::now() >= at) {
            for r in ranks.iter().filter(|r| !r.ended) {
                signal_group(r.pid, libc::SIGKILL);
            }
            killed = true;
        }
        thread::sleep(POLL);
    }
    ranks.append(&mut replaced);
    finish(ranks);
    job_status(&failures)
}

/// gsm's status: that of the failure whose [`Cause`] ranks first, the first seen among
/// equals; success without failures. Called once every rank has ended.
pub(crate) fn job_status(failures: &[Failure]) -> ExitCode {
    let rank_0_own = failures
        .iter()
        .find(|f| f.rank == 0 && f.cause == Cause::Own)
        .map(|f| f.code);
    let ranked = |f: &Failure| match f.cause {
        Cause::Own if f.rank != 0 && Some(f.code) == rank_0_own => Cause::Repeated,
        cause => cause,
    };
    // `min_by_key` keeps the first of equals: the first seen of the highest cause.
    let Some(first) = failures.iter().min_by_key(|f| ranked(f)) else {
        return ExitCode::SUCCESS;
    };
    if failures.len() > 1 {
        let why = match ranked(first) {
            Cause::Own | Cause::Repeated => "the first to fail on its own".to_string(),
            Cause::HostLost => "the first to fail (its host was lost)".to_string(),
            Cause::BadFrame => "the first to fail (it received a bad frame)".to_string(),
            Cause::PeerLost => "the first to fail (it lost a peer)".to_string(),
            Cause::Stopped(sig) | Cause::Followed(sig) => {
                format!("stopped by {} (forwarded by gsm)", signal_name(sig))
            }
            Cause::Straggler => "the first to fail (killed by gsm)".to_string(),
        };
        report(&format!(
            "status {} from rank {}, {why}",
            first.code, first.rank
        ));
    }
    ExitCode::from(first.code)
}

/// How a failed rank's end ranks (see [`Cause`]); `killed` says whether gsm has killed the
/// stragglers by now, `stopped_by` which signal gsm forwarded to the job, if any.
pub(crate) fn cause(status: ExitStatus, killed: bool, stopped_by: Option<libc::c_int>) -> Cause {
    match (status.code(), status.signal(), stopped_by) {
        (None, Some(libc::SIGKILL), _) if killed => Cause::Straggler,
        (Some(code), _, Some(sig)) if code == i32::from(gossamer::EXIT_PEER_LOST) => {
            Cause::Followed(sig)
        }
        (_, _, Some(sig)) => Cause::Stopped(sig),
        (Some(code), _, _) if code == i32::from(gossamer::EXIT_BAD_FRAME) => Cause::BadFrame,
        (Some(code), _, _) if code == i32::from(gossamer::EXIT_PEER_LOST) => Cause::PeerLost,
        _ => Cause::Own,
    }
}

/// Kills what is left in the ranks' groups (a background process a rank started holds its
/// output pipes open) and lets the output threads drain.
fn finish(ranks: &mut [Rank]) {
    let pids: Vec<u32> = ranks.iter().map(|r| r.pid).collect();
    kill_and_drain(
        &pids,
        ranks.iter_mut().flat_map(|r| r.pipes.drain(..)).collect(),
    );
}

/// Kills the process groups led by `pids` and waits, at most [`DRAIN`], for the threads
/// forwarding their output to end. A thread still running then reads from a process that left
/// its group (setsid); it ends with gsm.
pub(crate) fn kill_and_drain(pids: &[u32], mut pipes: Vec<JoinHandle<()>>) {
    for &pid in pids {
        signal_group(pid, libc::SIGKILL);
    }
    let deadline = Instant::now() + DRAIN;
    while !pipes.is_empty() && Instant::now() < deadline {
        pipes.retain(|p| !p.is_finished());
        thread::sleep(POLL);
    }
}

/// Kills and reaps ranks already started when a later one could not be.
fn abandon(ranks: &mut Vec<Rank>) {
    for r in ranks.iter_mut() {
        signal_group(r.pid, libc::SIGKILL);
        let _ = r.child.wait();
        r.ended = true;
    }
    finish(ranks);
    ranks.clear();
}

/// The exit status gsm takes from a rank that ended like this, `None` for success.
pub(crate) fn failure_code(status: ExitStatus) -> Option<u8> {
    match (status.code(), status.signal()) {
        (Some(0), _) => None,
        (Some(code), _) => Some(u8::try_from(code).unwrap_or(1)),
        (None, Some(sig)) => Some(u8::try_from(128 + sig).unwrap_or(u8::MAX)),
        (None, None) => Some(1),
    }
}

/// "exited with status 3", "killed by SIGSEGV (core dumped)".
pub(crate) fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => {
            let core = if status.core_dumped() {
                " (core dumped)"
            } else {
                ""
            };
            format!("killed by {}{core}", signal_name(sig))
        }
        (None, None) => format!("ended with {status}"),
    }
}

fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.to_owned()
}

/// Writes one `gsm run: ...` line to stderr.
pub(crate) fn report(message: &str) {
    let line = format!("gsm run: {message}\n");
    // Nothing more can be done if stderr is gone.
    let _ = io::stderr().lock().write_all(line.as_bytes());
}

/// Whether no process is left in the group led by `pid` (its leader has been reaped).
pub(crate) fn group_gone(pid: u32) -> bool {
    let Ok(pgid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    // SAFETY: signal 0 only checks that the group exists; it touches no memory of ours.
    let found = unsafe { libc::kill(-pgid, 0) } == 0;
    !found && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Sends `sig` to the process group led by `pid`. A group that is already gone is fine.
pub(crate) fn signal_group(pid: u32, sig: libc::c_int) {
    let Ok(pgid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) only sends a signal; it touches no memory of ours.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// Signals received and not yet forwarded, one bit per signal number.
static PENDING: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // An atomic read-modify-write is async-signal-safe; the supervisor polls PENDING.
    if let Ok(bit) = u32::try_from(sig)
        && bit < 64
    {
        PENDING.fetch_or(1 << bit, Ordering::Relaxed);
    }
}

/// The signals caught (SIGINT, SIGTERM) since the last call, to forward.
pub(crate) fn caught_signals() -> impl Iterator<Item = libc::c_int> {
    let pending = PENDING.swap(0, Ordering::Relaxed);
    [libc::SIGINT, libc::SIGTERM]
        .into_iter()
        .filter(move |&sig| pending & (1 << sig) != 0)
}

/// Catches SIGINT and SIGTERM for forwarding. Children get the default handlers back when
/// they exec.
pub(crate) fn catch_signals() -> io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: all-zero is a valid `sigaction` (no flags, empty mask); the fields that
        // matter are set below.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        // SAFETY: `action.sa_mask` is a valid, writable sigset_t.
        unsafe {
            libc::sigemptyset(&mut action.sa_mask);
        }
        // SAFETY: `action` is initialized and its handler is async-signal-safe.
        if unsafe { libc::sigaction(sig, &action, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
pub(crate) enum Stream {
    Out,
    Err,
}

/// Copies a rank's pipe to gsm's stream, line by line, each line prefixed and written whole.
fn forward(rank: usize, pipe: impl Read, stream: Stream) {
    // Once gsm's stream is gone (a closed pipe), the rank's output is still read and dropped,
    // so the rank never blocks on a full pipe.
    let mut open = true;
    each_line(pipe, format!("[{rank}] ").as_bytes(), |line| {
        if open {
            open = write_line(stream, line).is_ok();
        }
    });
}

/// Reads `pipe` to its end and hands `each` every line, after `prefix` and with its newline
/// (a last line without one gets one); a line longer than [`MAX_LINE`] is cut into lines of
/// that length, so memory stays bounded.
pub(crate) fn each_line(pipe: impl Read, prefix: &[u8], mut each: impl FnMut(&[u8])) {
    let mut reader = BufReader::with_capacity(64 << 10, pipe);
    let mut line = prefix.to_vec();
    let mut emit = |line: &mut Vec<u8>| {
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        each(line);
        line.truncate(prefix.len());
    };
    loop {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if buf.is_empty() {
            break;
        }
        let room = MAX_LINE + prefix.len() - line.len();
        let (take, end_of_line) = match buf.iter().take(room).position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len().min(room), buf.len() >= room),
        };
        line.extend_from_slice(&buf[..take]);
        reader.consume(take);
        if end_of_line {
            emit(&mut line);
        }
    }
    if line.len() > prefix.len() {
        emit(&mut line);
    }
}

/// Writes one whole line under the stream's lock, so lines of different ranks never mix.
pub(crate) fn write_line(stream: Stream, line: &[u8]) -> io::Result<()> {
    match stream {
        Stream::Out => {
            let mut out = io::stdout().lock();
            out.write_all(line)?;
            out.flush()
        }
        Stream::Err => io::stderr().lock().write_all(line),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn failure(status: ExitStatus, rank: usize) -> Failure {
        Failure {
            cause: cause(status, false, Some(libc::SIGTERM)),
            rank,
            code: failure_code(status).expect("a failure"),
            what: format!("rank {rank}"),
        }
    }

    /// After gsm forwarded SIGTERM, a rank that died of it (or ended in its own handler)
    /// names the job's status, even when gsm first saw a rank that only lost that peer.
    #[test]
    fn a_rank_that_only_followed_a_stopped_peer_does_not_name_the_status() {
        let peer_lost = ExitStatus::from_raw(i32::from(gossamer::EXIT_PEER_LOST) << 8);
        let died = ExitStatus::from_raw(libc::SIGTERM);
        let handled = ExitStatus::from_raw(9 << 8);
        let seen = [failure(peer_lost, 2), failure(died, 0)];
        assert_eq!(job_status(&seen), ExitCode::from(143));
        let seen = [failure(peer_lost, 2), failure(handled, 0)];
        assert_eq!(job_status(&seen), ExitCode::from(9));
    }
}
