//! The rack as a whole: starting a node ([`Rack`]), what every worker shares about the job
//! ([`RackState`]), and the end of the job — normal or not.
//!
//! # The end of a job
//! When `main` returns on rank 0, rank 0 sends `Exit` with its status to every rank over the
//! coordinator connections and waits (at most `GSM_PEER_TIMEOUT`) for each to answer `Done`.
//! Each rank then drops the properties it still holds, stops its runtime and exits with that
//! status.
//!
//! # Fate sharing
//! A rank that dies, goes silent for `GSM_PEER_TIMEOUT` (links send a heartbeat every
//! `GSM_HEARTBEAT` when idle, from a watchdog thread, so a worker busy in user code for longer
//! still looks alive, and still hears its peers), or sends a bad frame ends the job: each rank that notices
//! prints one line naming the rank and why, and exits at once with [`EXIT_PEER_LOST`] or
//! [`EXIT_BAD_FRAME`]. Before it exits, a rank that lost a peer tells rank 0 which (rank 0
//! tells every other rank), so that the others name that peer, not the rank that noticed
//! first. Links close in any order at the end of a job, so a closed link only counts as a loss
//! if the job is not ending a moment later.

use std::fmt;
use std::net::{SocketAddr, TcpStream};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use crate::bootstrap::{self, Boot};
use crate::env::{EnvError, Settings};
use crate::export::ExportTable;
use crate::link::{self, Health};
use crate::wire;

/// The exit status of a rank that lost a peer (it died, went silent or closed its links).
pub const EXIT_PEER_LOST: u8 = 69;
/// The exit status of a rank that received a bad frame from a peer after its handshake.
pub const EXIT_BAD_FRAME: u8 = 76;
/// The exit status of a rank that could not join the job (see [`RackError`]).
pub const EXIT_SETUP: u8 = 78;
/// The exit status of a job whose `main` panicked.
pub const EXIT_PANIC: u8 = 101;

/// Why a node could not start or join its job.
#[derive(Debug)]
#[non_exhaustive]
pub enum RackError {
    /// A `GSM_*` setting or launcher variable is wrong.
    Env(EnvError),
    /// The settings do not make a job.
    Config {
        /// What is wrong.
        why: String,
    },
    /// A peer could not be reached before `GSM_CONNECT_TIMEOUT`.
    Unreachable {
        /// The rank that was dialed.
        rank: u32,
        /// Where.
        addr: SocketAddr,
        /// For how long.
        waited: Duration,
        /// The last error.
        why: String,
    },
    /// Ranks that did not show up before `GSM_CONNECT_TIMEOUT`.
    MissingRanks {
        /// Their numbers.
        ranks: Vec<u32>,
        /// For how long they were awaited.
        waited: Duration,
    },
    /// A peer failed the handshake (the message names the peer and the fix).
    Handshake(String),
    /// A peer broke the bootstrap protocol.
    Protocol {
        /// The peer's address.
        peer: String,
        /// What it did.
        why: String,
    },
    /// A system call failed.
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The runtime could not start.
    Runtime(trust::BuildError),
}

impl RackError {
    pub(crate) fn io(what: &str, source: std::io::Error) -> RackError {
        RackError::Io {
            what: what.into(),
            source,
        }
    }
}

impl fmt::Display for RackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RackError::Env(e) => write!(f, "{e}"),
            RackError::Config { why } => write!(f, "{why}"),
            RackError::Unreachable {
                rank,
                addr,
                waited,
                why,
            } => write!(
                f,
                "cannot reach rank {rank} at {addr} for {} s: {why}",
                waited.as_secs()
            ),
            RackError::MissingRanks { ranks, waited } => {
                let list: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
                write!(
                    f,
                    "rank{} {} did not join within {} s (GSM_CONNECT_TIMEOUT): did they start, \
                     with the same GSM_COORD and secret?",
                    if ranks.len() == 1 { "" } else { "s" },
                    list.join(", "),
                    waited.as_secs()
                )
            }
            RackError::Handshake(e) => write!(f, "{e}"),
            RackError::Protocol { peer, why } => write!(f, "peer {peer}: {why}"),
            RackError::Io { what, source } => write!(f, "{what}: {source}"),
            RackError::Runtime(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for RackError {}

impl From<EnvError> for RackError {
    fn from(e: EnvError) -> Self {
        RackError::Env(e)
    }
}

/// A node of a rack program, ready to start: settings come from the environment (see
/// [`env`](crate::env)) and may be overridden by the builder methods.
///
/// ```
/// // With no launcher variables set this is a one-node rack: no sockets, no configuration.
/// let code = gossamer::Rack::from_env().workers(2).run(|| {
///     let counter = gossamer::entrust(0u64);
///     counter.apply_with(|c, x: u64| *c += x, 5);
///     assert_eq!(counter.apply(|c| *c), 5);
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
#[derive(Debug)]
pub struct Rack {
    settings: Result<Settings, EnvError>,
    workers: Option<usize>,
}

impl Rack {
    /// Reads the settings from the environment; errors surface when the rack runs.
    pub fn from_env() -> Rack {
        Rack {
            settings: Settings::from_env(),
            workers: None,
        }
    }

    /// Uses these settings instead of the environment.
    pub fn with_settings(settings: Settings) -> Rack {
        Rack {
            settings: Ok(settings),
            workers: None,
        }
    }

    /// Runtime workers of this node (overrides `GSM_WORKERS`).
    pub fn workers(mut self, n: usize) -> Rack {
        self.workers = Some(n.max(1));
        self
    }

    /// Runs the job: `main` runs once, in a fiber on rank 0; every other rank serves until it
    /// returns. Returns the job's exit status (rank 0's: success, or [`EXIT_PANIC`] if `main`
    /// panicked), the same on every rank. A failure to start prints the error and returns
    /// [`EXIT_SETUP`].
    pub fn run<F: FnOnce() + Send + 'static>(self, main: F) -> ExitCode {
        match self.try_run(main) {
            Ok(code) => ExitCode::from(code),
            Err(e) => {
                eprintln!("gossamer: {e}");
                ExitCode::from(EXIT_SETUP)
            }
        }
    }

    /// Like [`Rack::run`], returning why the node could not start or join its job, and the
    /// job's status as a number otherwise.
    pub fn try_run<F: FnOnce() + Send + 'static>(self, main: F) -> Result<u8, RackError> {
        let mut settings = self.settings?;
        if let Some(w) = self.workers {
            settings.workers = w;
        }
        let workers = settings.workers.max(1);
        let runtime = trust::Runtime::builder()
            .workers(workers)
            .build()
            .map_err(RackError::Runtime)?;
        if settings.size == 1 {
            let state = RackState::new(settings, vec![workers as u32], runtime.handle().clone());
            let _current = Current::set(state);
            return Ok(run_main(&runtime, main));
        }
        let connected = bootstrap::connect(&settings, workers as u32)?;
        let state = RackState::new(settings, connected.workers, runtime.handle().clone());
        let _current = Current::set(state.clone());
        let installs: Vec<_> = connected
            .links
            .into_iter()
            .enumerate()
            .map(|(w, links)| {
                let state = state.clone();
                runtime.spawn_on(w, move || link::install(state, w, links))
            })
            .collect();
        installs.into_iter().for_each(|h| h.join());
        start_watchdog(state.clone());
        let mut coordination = connected.coordination;
        *state.lock_coordination() = coordination
            .iter()
            .filter_map(|(_, s)| s.try_clone().ok())
            .collect();
        let code = if state.rank == 0 {
            monitor_ranks(&state, &coordination);
            let code = run_main(&runtime, main);
            state.ending.store(true, Ordering::SeqCst);
            end_job(&state, &mut coordination, code);
            code
        } else {
            let (_, stream) = coordination.pop().expect("the connection to rank 0");
            await_exit(&state, stream)
        };
        // Drop what other nodes held, on each property's trustee.
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let state = state.clone();
                runtime.spawn_on(w, move || {
                    let exports = state.exports(w).drain();
                    drop(exports);
                    link::uninstall();
                })
            })
            .collect();
        handles.into_iter().for_each(|h| h.join());
        drop(runtime);
        Ok(code)
    }
}

fn run_main<F: FnOnce() + Send + 'static>(runtime: &trust::Runtime, main: F) -> u8 {
    match catch_unwind(AssertUnwindSafe(|| runtime.block_on(main))) {
        Ok(()) => 0,
        Err(_) => EXIT_PANIC,
    }
}

/// Rank 0: watches each coordinator connection; one that closes before the end loses its rank.
fn monitor_ranks(state: &Arc<RackState>, coordination: &[(u32, TcpStream)]) {
    for (rank, stream) in coordination {
        let (rank, mut stream) = (*rank, stream.try_clone().expect("clone a socket"));
        let state = state.clone();
        std::thread::Builder::new()
            .name(format!("gossamer-rank-{rank}"))
            .spawn(move || {
                let size = state.size();
                let Some((rank, why)) = judge(rank, size, bootstrap::receive(&mut stream)) else {
                    return;
                };
                if !state.ending.load(Ordering::SeqCst) {
                    lost(&state, rank, &why);
                }
            })
            .expect("start a monitor thread");
    }
}

/// Rank 0: what the coordinator connection of rank `from` carried, judged: `None` for its
/// `Done`, else the rank the job lost and why. A rank that lost a peer says which before it
/// exits, and that peer is the one to name, not the rank that told.
fn judge(from: u32, size: u32, read: std::io::Result<Boot>) -> Option<(u32, String)> {
    Some(match read {
        Ok(Boot::Done) => return None,
        Ok(Boot::Lost { rank, why }) if rank != 0 && rank != from && rank < size => {
            (rank, format!("{why} (seen by rank {from})"))
        }
        Ok(Boot::Lost { rank: 0, why }) => (from, format!("it lost this rank: {why}")),
        Ok(other) => (from, format!("sent {other:?} to the coordinator")),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            (from, "its process ended".into())
        }
        Err(e) => (from, e.to_string()),
    })
}

/// Rank 0: tells every rank the job is over and waits for them to stop serving.
fn end_job(state: &RackState, coordination: &mut [(u32, TcpStream)], code: u8) {
    for (rank, stream) in coordination.iter_mut() {
        if let Err(e) = bootstrap::send(stream, &Boot::Exit { code }) {
            eprintln!("gossamer: rank 0: could not tell rank {rank} to exit: {e}");
        }
    }
    // The monitor threads see each `Done` (or the close that follows it); wait for the close.
    let deadline = Instant::now() + state.settings.peer_timeout;
    for (_, stream) in coordination.iter_mut() {
        let left = deadline.saturating_duration_since(Instant::now());
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .ok();
        let mut byte = [0u8; 1];
        while matches!(std::io::Read::read(stream, &mut byte), Ok(n) if n > 0) {}
    }
}

/// Other ranks: serves until rank 0 says the job is over; returns its status.
fn await_exit(state: &Arc<RackState>, mut stream: TcpStream) -> u8 {
    match bootstrap::receive(&mut stream) {
        Ok(Boot::Lost { rank, why }) => lost(state, rank, &why),
        Ok(Boot::Exit { code }) => {
            state.ending.store(true, Ordering::SeqCst);
            bootstrap::send(&mut stream, &Boot::Done).ok();
            code
        }
        Ok(other) => lost(
            state,
            0,
            &format!("sent {other:?} instead of the end of the job"),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            lost(state, 0, "its process ended")
        }
        Err(e) => lost(state, 0, &e.to_string()),
    }
}

/// Ends this process because a peer is gone. It first tells the other end of its coordinator
/// connections which one: rank 0 tells every other rank, another rank tells rank 0 (which
/// tells the rest). Ranks notice a silent peer at about the same time, and each exits as soon
/// as it does; told first, the others name the rank that was lost rather than the one that
/// noticed first and closed its connections by exiting.
pub(crate) fn lost(state: &RackState, rank: u32, why: &str) -> ! {
    let line = if rank == state.rank {
        format!("the job lost this rank, which {why}")
    } else {
        format!("lost rank {rank}: {why}")
    };
    end_for(Some(state), rank, why, &line, EXIT_PEER_LOST)
}

/// Prints this rank's one line about the end, tells the coordinator which rank ended the job
/// and why (so that rank 0 names the right one), and exits with `code`.
fn end_for(state: Option<&RackState>, rank: u32, why: &str, line: &str, code: u8) -> ! {
    end_once();
    let me = state.map_or(0, |s| s.rank);
    eprintln!("gossamer: rank {me}: {line}; ending the job");
    if let Some(state) = state {
        for stream in state.lock_coordination().iter_mut() {
            stream
                .set_write_timeout(Some(Duration::from_millis(200)))
                .ok();
            let why = why.to_string();
            bootstrap::send(stream, &Boot::Lost { rank, why }).ok();
        }
    }
    std::process::exit(code.into())
}

/// Lets one thread end the process: the watchdog, the coordinator connections and the links
/// may each notice the end at once, and the process prints one line about it and exits once.
/// Any later caller waits for that exit.
fn end_once() {
    static ENDING: AtomicBool = AtomicBool::new(false);
    if ENDING.swap(true, Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
}

/// Ends this process because a peer sent a bad frame.
pub(crate) fn bad_frame(peer: (u32, u32), why: &str) -> ! {
    let line = format!("bad frame from rank {} (worker {}): {why}", peer.0, peer.1);
    let why = format!("sent a bad frame (worker {}): {why}", peer.1);
    end_for(current().as_deref(), peer.0, &why, &line, EXIT_BAD_FRAME)
}

/// Every link's health, checked every half heartbeat, from a thread of its own so that a
/// worker busy in user code changes nothing: the watchdog writes idle links' heartbeats itself,
/// and a peer counts as heard from when the link's reader read from it or when bytes from it
/// wait unread (see `sock`).
fn start_watchdog(state: Arc<RackState>) {
    std::thread::Builder::new()
        .name("gossamer-watchdog".into())
        .spawn(move || {
            let heartbeat = state.settings.heartbeat;
            let heartbeat_ms = heartbeat.as_millis() as u64;
            let timeout = state.settings.peer_timeout.as_millis() as u64;
            let mut ended_since: Vec<Option<Instant>> = vec![None; state.health.len()];
            loop {
                std::thread::sleep(heartbeat / 2);
                if state.ending.load(Ordering::SeqCst) {
                    return;
                }
                let now = now_ms();
                for (i, health) in state.health.iter().enumerate() {
                    let Some(health) = health else { continue };
                    let ended = health
                        .ended
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone();
                    if let Some(why) = ended {
                        // At the end of a job peers close their links as they go: a close
                        // is a loss only if no `Exit` follows within a heartbeat or two.
                        let since = *ended_since[i].get_or_insert_with(Instant::now);
                        if since.elapsed() > 2 * heartbeat {
                            lost(&state, health.peer.0, &why);
                        }
                        continue;
                    }
                    // Bytes waiting unread: the worker is busy, not the peer silent.
                    let waiting = health.fd.unread() == Some(true);
                    let heard = health.last_read.load(Ordering::Relaxed);
                    if !waiting && now.saturating_sub(heard) > timeout {
                        lost(
                            &state,
                            health.peer.0,
                            &format!("silent for {} ms (GSM_PEER_TIMEOUT)", timeout),
                        );
                    }
                    let quiet = now.saturating_sub(health.last_write.load(Ordering::Relaxed));
                    if quiet >= heartbeat_ms
                        && health.fd.heartbeat(health.seq.load(Ordering::Relaxed))
                    {
                        health.last_write.store(now, Ordering::Relaxed);
                    }
                }
            }
        })
        .expect("start the watchdog");
}

/// Milliseconds since the first call, for link liveness.
pub(crate) fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// What every worker of this node shares about the job.
#[derive(Debug)]
pub(crate) struct RackState {
    pub(crate) rank: u32,
    pub(crate) settings: Settings,
    /// Workers of each node.
    pub(crate) workers: Vec<u32>,
    /// `route(node, worker)` = `base[node] + worker`.
    base: Vec<usize>,
    /// Per local worker and route: the link's health (`None` for this node's own workers).
    health: Vec<Option<Arc<Health>>>,
    /// Per local worker and route: requests sent on that link.
    sent: Vec<Arc<AtomicU64>>,
    /// Round-robin placement per node.
    next_trustee: Vec<AtomicUsize>,
    /// Each local worker's export table.
    pub(crate) exports: Vec<Mutex<ExportTable>>,
    /// Tickets minted by this node: `rank << 48 | count`.
    tickets: AtomicU64,
    /// Rank 0: the coordinator connection of every other rank; others: the one to rank 0.
    coordination: Mutex<Vec<TcpStream>>,
    pub(crate) ending: AtomicBool,
    pub(crate) handle: trust::Handle,
}

impl RackState {
    fn new(settings: Settings, workers: Vec<u32>, handle: trust::Handle) -> Arc<RackState> {
        let rank = settings.rank as u32;
        let mut base = Vec::with_capacity(workers.len());
        let mut total = 0;
        for &w in &workers {
            base.push(total);
            total += w as usize;
        }
        let local = workers[rank as usize] as usize;
        let mut health = Vec::with_capacity(local * total);
        for _ in 0..local {
            for (node, &w) in workers.iter().enumerate() {
                for worker in 0..w {
                    health.push(
                        (node as u32 != rank)
                            .then(|| Arc::new(Health::new((node as u32, worker), now_ms()))),
                    );
                }
            }
        }
        now_ms();
        Arc::new(RackState {
            rank,
            sent: (0..local * total).map(|_| Arc::default()).collect(),
            next_trustee: workers.iter().map(|_| AtomicUsize::new(0)).collect(),
            settings,
            workers,
            base,
            health,
            exports: (0..local).map(|_| Mutex::default()).collect(),
            tickets: AtomicU64::new(u64::from(rank) << 48),
            coordination: Mutex::default(),
            ending: AtomicBool::new(false),
            handle,
        })
    }

    fn lock_coordination(&self) -> std::sync::MutexGuard<'_, Vec<TcpStream>> {
        self.coordination.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A ticket no other handle of the job carries.
    pub(crate) fn mint(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::Relaxed)
    }

    /// Worker `worker`'s export table.
    pub(crate) fn exports(&self, worker: usize) -> std::sync::MutexGuard<'_, ExportTable> {
        self.exports[worker]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// How many properties of this node other nodes hold handles to.
    pub(crate) fn live_exports(&self) -> usize {
        (0..self.exports.len())
            .map(|w| self.exports(w).live())
            .sum()
    }

    pub(crate) fn size(&self) -> u32 {
        self.workers.len() as u32
    }

    pub(crate) fn route(&self, node: u32, worker: u32) -> usize {
        self.base[node as usize] + worker as usize
    }

    pub(crate) fn route_len(&self) -> usize {
        self.workers.iter().map(|&w| w as usize).sum()
    }

    pub(crate) fn health(&self, local: usize, peer: (u32, u32)) -> Arc<Health> {
        self.health[local * self.route_len() + self.route(peer.0, peer.1)]
            .clone()
            .expect("a link to another node")
    }

    pub(crate) fn sent_counter(&self, local: usize, peer: (u32, u32)) -> Arc<AtomicU64> {
        self.sent[local * self.route_len() + self.route(peer.0, peer.1)].clone()
    }

    /// How many requests each local worker has sent to `(node, worker)`.
    pub(crate) fn sent_to(&self, node: u32, worker: u32) -> Vec<u64> {
        let local = self.workers[self.rank as usize] as usize;
        (0..local)
            .map(|l| {
                self.sent[l * self.route_len() + self.route(node, worker)].load(Ordering::Acquire)
            })
            .collect()
    }

    pub(crate) fn limits(&self) -> wire::Limits {
        wire::Limits {
            frame: self.settings.frame,
            max_message: self.settings.max_message,
        }
    }

    /// The worker of `node` that gets the next property placed there without a choice.
    pub(crate) fn next_trustee(&self, node: u32) -> u32 {
        let n = self.next_trustee[node as usize].fetch_add(1, Ordering::Relaxed);
        (n % self.workers[node as usize] as usize) as u32
    }
}

static CURRENT: RwLock<Option<Arc<RackState>>> = RwLock::new(None);

/// The running rack of this process.
pub(crate) fn current() -> Option<Arc<RackState>> {
    CURRENT.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Makes a rack current for as long as the guard lives.
struct Current;

impl Current {
    fn set(state: Arc<RackState>) -> Current {
        *CURRENT.write().unwrap_or_else(|p| p.into_inner()) = Some(state);
        Current
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        *CURRENT.write().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eof() -> std::io::Result<Boot> {
        Err(std::io::ErrorKind::UnexpectedEof.into())
    }

    #[test]
    fn only_the_first_caller_goes_on_to_end_the_process() {
        end_once();
        let (tx, rx) = std::sync::mpsc::channel();
        // Parks for good: the process would be exiting.
        std::thread::spawn(move || {
            end_once();
            tx.send(()).ok();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "a second caller went on to end the process too"
        );
    }

    #[test]
    fn a_rank_that_lost_a_peer_has_rank_0_name_that_peer() {
        let told = Boot::Lost {
            rank: 2,
            why: "silent for 1000 ms (GSM_PEER_TIMEOUT)".into(),
        };
        assert_eq!(
            judge(1, 3, Ok(told)),
            Some((
                2,
                "silent for 1000 ms (GSM_PEER_TIMEOUT) (seen by rank 1)".to_string()
            ))
        );
    }

    #[test]
    fn a_rank_that_ends_without_a_word_is_the_one_lost() {
        assert_eq!(judge(1, 3, eof()), Some((1, "its process ended".into())));
        assert_eq!(judge(1, 3, Ok(Boot::Done)), None);
    }

    #[test]
    fn a_rank_that_lost_rank_0_or_names_no_peer_is_the_one_lost() {
        let (rank, why) = judge(
            2,
            3,
            Ok(Boot::Lost {
                rank: 0,
                why: "silent".into(),
            }),
        )
        .unwrap();
        assert_eq!((rank, why.as_str()), (2, "it lost this rank: silent"));
        for bad in [2, 3, 99] {
            let (rank, why) = judge(
                2,
                3,
                Ok(Boot::Lost {
                    rank: bad,
                    why: "x".into(),
                }),
            )
            .unwrap();
            assert_eq!(rank, 2, "rank 2 naming rank {bad}");
            assert!(why.starts_with("sent Lost"), "{why}");
        }
        let (rank, why) = judge(1, 3, Ok(Boot::Exit { code: 0 })).unwrap();
        assert_eq!(rank, 1);
        assert!(why.contains("Exit"), "{why}");
    }
}
