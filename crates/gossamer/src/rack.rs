//! The rack as a whole: starting a node ([`Rack`]) and the normal end of its job.
//!
//! # The end of a job
//! When `main` returns on rank 0, rank 0 sends `Exit` with its status to every rank over the
//! coordinator connections and waits (at most `GSM_PEER_TIMEOUT`) for each to answer `Done`.
//! Each rank then drops the properties it still holds, stops its runtime and exits with that
//! status.
//!
//! When a peer is lost instead, the job ends as `fate` describes, unless it recovers lost
//! ranks (`recovery`).

use std::net::TcpStream;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::bootstrap::{self, Boot};
use crate::env::{self, EnvError, Launcher, Settings};
use crate::error::{EXIT_PANIC, EXIT_SETUP, RackError};
use crate::fate::{self, lost};
use crate::function::{Function, Functions};
use crate::link;
use crate::recovery;
use crate::state::{Current, RackState};
use crate::stats::MetricsServer;

/// A node of a rack program, ready to start: settings come from the environment (see
/// [`env`](crate::env)) and may be overridden by the builder methods.
///
/// With no launcher variables set this is a one-node rack: no sockets, no configuration. The
/// first rack of such a process prints one line on stderr saying so and how to start several
/// nodes (`gsm run -n N -- <program>`); `GSM_RANK=0 GSM_SIZE=1` runs one node without it.
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
    functions: Vec<Function>,
    package_keys: Vec<[u8; 32]>,
}

impl Rack {
    /// Reads the settings from the environment; errors surface when the rack runs.
    pub fn from_env() -> Rack {
        Rack {
            settings: Settings::from_env(),
            workers: None,
            functions: Vec::new(),
            package_keys: Vec::new(),
        }
    }

    /// Uses these settings instead of the environment.
    pub fn with_settings(settings: Settings) -> Rack {
        Rack {
            settings: Ok(settings),
            workers: None,
            functions: Vec::new(),
            package_keys: Vec::new(),
        }
    }

    /// Runtime workers of this node (overrides `GSM_WORKERS`).
    pub fn workers(mut self, n: usize) -> Rack {
        self.workers = Some(n.max(1));
        self
    }

    /// Registers a function by name on this node, beside those `#[gossamer::function]`
    /// registered at link time: for a name chosen at run time, or a closure. Two functions
    /// of one name stop the node at start, naming both.
    ///
    /// ```
    /// use gossamer::{Function, Rack};
    ///
    /// let code = Rack::from_env()
    ///     .function(Function::free("math.double", |x: u64| 2 * x))
    ///     .run(|| {
    ///         let double = gossamer::named_fn::<u64, u64>("math.double").unwrap();
    ///         let here = gossamer::this_node();
    ///         assert_eq!(here.spawn_named(&double, 21).join(), Ok(42));
    ///     });
    /// assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// ```
    pub fn function(mut self, function: Function) -> Rack {
        self.functions.push(function);
        self
    }

    /// Lets this node load code packages signed by `public_key` (beside those of
    /// `GSM_TRUSTED_KEYS`); see [`package`](crate::package).
    pub fn trust_package_key(mut self, public_key: [u8; 32]) -> Rack {
        self.package_keys.push(public_key);
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
    ///
    /// A process is one node: a second rack started while one runs is refused
    /// ([`RackError::Config`]), as its regions and properties would share the first one's
    /// process-wide state.
    pub fn try_run<F: FnOnce() + Send + 'static>(self, main: F) -> Result<u8, RackError> {
        let _one = OneRack::enter()?;
        let mut settings = self.settings?;
        if settings.launcher == Launcher::None {
            say_no_launcher();
        }
        let added: Vec<Function> = crate::named::builtins()
            .into_iter()
            .chain(crate::package::builtins())
            .chain(self.functions)
            .collect();
        let functions = Functions::new(&added).map_err(|why| RackError::Config { why })?;
        if let Some(w) = self.workers {
            settings.workers = w;
        }
        settings.trusted_keys.extend(self.package_keys);
        let workers = settings.workers.max(1);
        let mut runtime = trust::Runtime::builder().workers(workers);
        if let Some(spin) = settings.spin {
            runtime = runtime.spin(spin);
        }
        if let Some(policy) = settings.rebalance.clone() {
            runtime = runtime.rebalance(policy);
        }
        let runtime = runtime.build().map_err(RackError::Runtime)?;
        if settings.size == 1 {
            let heap = bootstrap::file_heap(&settings)?;
            let state = RackState::new(
                settings,
                bootstrap::new_run_id()?,
                vec![workers as u32],
                runtime.handle().clone(),
                heap,
                functions,
            );
            let _metrics = serve_metrics(&state)?;
            let _current = Current::set(state.clone());
            let code = run_main(&runtime, main);
            leave_last_stats(&state);
            crate::durable::close();
            return Ok(code);
        }
        let mut connected = bootstrap::connect(&settings, workers as u32)?;
        let heap = connected.heap.clone();
        let state = RackState::new(
            settings,
            connected.run,
            connected.workers,
            runtime.handle().clone(),
            heap,
            functions,
        );
        for link in connected.links.iter_mut().flatten() {
            if let Some(peer_heap) = link.peer_heap.take() {
                state
                    .regions
                    .add_peer(link.peer.0, link.incarnation, peer_heap);
            }
            // A restarted rank learns its peers' lives from their handshakes.
            state.peers[link.peer.0 as usize]
                .incarnation
                .store(link.incarnation, Ordering::Release);
        }
        let _metrics = serve_metrics(&state)?;
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
        let workers = installs.len();
        installs.into_iter().for_each(|h| h.join());
        // Only once every worker is installed: a link reading earlier could run a request that
        // hands a property to a worker with no links yet (see `link::install`).
        let starts: Vec<_> = (0..workers)
            .map(|w| runtime.spawn_on(w, link::start))
            .collect();
        starts.into_iter().for_each(|h| h.join());
        fate::start_watchdog(state.clone(), recovery::lose);
        let mut coordination = connected.coordination;
        *state.lock_coordination() = coordination
            .iter()
            .filter_map(|(r, s)| Some((*r, s.try_clone().ok()?)))
            .collect();
        if let Some(late) = connected.late {
            recovery::serve_late_links(state.clone(), late.links);
            if let Some((registrations, table)) = late.registrations {
                recovery::serve_rejoins(state.clone(), registrations, table, monitor);
            }
        }
        let code = if state.rank == 0 {
            for (rank, stream) in coordination {
                monitor(state.clone(), rank, 0, stream);
            }
            let code = run_main(&runtime, main);
            state.ending.store(true, Ordering::SeqCst);
            end_job(&state, code);
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
        leave_last_stats(&state);
        crate::durable::close();
        drop(runtime);
        Ok(code)
    }
}

/// Starts serving the node's counters where `GSM_METRICS` says, if it does, and says where
/// on stderr (the port may be the system's choice).
fn serve_metrics(state: &Arc<RackState>) -> Result<Option<MetricsServer>, RackError> {
    let Some(addr) = state.settings.metrics else {
        return Ok(None);
    };
    let server = MetricsServer::start(addr, state.clone()).map_err(|e| RackError::Config {
        why: format!("GSM_METRICS: cannot listen on {addr}: {e}"),
    })?;
    match &state.settings.stats_dir {
        // Started by gsm run: the address goes where `gsm top` looks for it.
        Some(dir) => write_stats_file(dir, state.rank, "addr", &server.addr().to_string()),
        None => eprintln!(
            "gossamer: rank {} serves its counters on http://{}/metrics",
            state.rank,
            server.addr()
        ),
    }
    Ok(Some(server))
}

/// Leaves this rank's last counters where `gsm run --stats` reads them, if gsm started it.
fn leave_last_stats(state: &RackState) {
    if let Some(dir) = &state.settings.stats_dir {
        let text = crate::stats::snapshot(state).prometheus();
        write_stats_file(dir, state.rank, "prom", &text);
    }
}

/// Writes `rank-<rank>.<kind>` in `dir` whole (a reader never sees half of it). The counters
/// are a diagnostic: a failure is said on stderr and changes nothing else.
fn write_stats_file(dir: &std::path::Path, rank: u32, kind: &str, text: &str) {
    let path = dir.join(format!("rank-{rank}.{kind}"));
    let partial = dir.join(format!(".rank-{rank}.{kind}.{}", std::process::id()));
    let written = std::fs::write(&partial, text).and_then(|()| std::fs::rename(&partial, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        eprintln!(
            "gossamer: cannot write {} (GSM_STATS_DIR): {e}",
            path.display()
        );
    }
}

/// Says once per process, in one line on stderr, that no launcher was found: a program meant
/// for several nodes would otherwise run alone without a word, and fail later (`nodes()[2]`).
fn say_no_launcher() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let rank_vars: Vec<&str> = [
            Launcher::Gsm,
            Launcher::Slurm,
            Launcher::OpenMpi,
            Launcher::Pmi,
        ]
        .into_iter()
        .filter_map(|l| l.rank_vars().map(|(rank, _)| rank))
        .collect();
        eprintln!(
            "gossamer: no launcher found ({} unset): running as a one-node rack; start N nodes \
             with `gsm run -n N -- <program>` (or set {}=0 {}=1 to run one node without this \
             line)",
            rank_vars.join(", "),
            env::RANK,
            env::SIZE
        )
    });
}

/// Held while this process runs a rack.
struct OneRack;

static RUNNING: AtomicBool = AtomicBool::new(false);

impl OneRack {
    fn enter() -> Result<OneRack, RackError> {
        if RUNNING.swap(true, Ordering::SeqCst) {
            return Err(RackError::Config {
                why: "a rack already runs in this process (a process is one node: run one \
                      Rack at a time)"
                    .into(),
            });
        }
        Ok(OneRack)
    }
}

impl Drop for OneRack {
    fn drop(&mut self) {
        RUNNING.store(false, Ordering::SeqCst);
    }
}

fn run_main<F: FnOnce() + Send + 'static>(runtime: &trust::Runtime, main: F) -> u8 {
    match catch_unwind(AssertUnwindSafe(|| runtime.block_on(main))) {
        Ok(()) => 0,
        Err(_) => EXIT_PANIC,
    }
}

/// Rank 0: watches the coordinator connection of `incarnation` of rank `from`, on a thread of
/// its own. One that closes before the end loses that rank, and so does a rank that another
/// names as lost.
fn monitor(state: Arc<RackState>, from: u32, incarnation: u32, mut stream: TcpStream) {
    std::thread::Builder::new()
        .name(format!("gossamer-rank-{from}"))
        .spawn(move || {
            let size = state.size();
            loop {
                let read = bootstrap::receive(&mut stream);
                let Some(Lost { rank, life, why }) = judge(from, incarnation, size, read) else {
                    return;
                };
                if state.ending.load(Ordering::SeqCst) {
                    return;
                }
                recovery::lose(&state, rank, life, &why);
                if rank == from {
                    return;
                }
            }
        })
        .expect("start a monitor thread");
}

/// A rank the job lost, as rank 0 judges it.
#[derive(Debug, PartialEq)]
struct Lost {
    rank: u32,
    /// Which life of the rank.
    life: u32,
    why: String,
}

/// Rank 0: what the coordinator connection of rank `from` (`incarnation` of it) carried,
/// judged: `None` for its `Done`, else the rank the job lost and why. A rank that lost a peer
/// says which, and that peer is the one to name, not the rank that told.
fn judge(from: u32, incarnation: u32, size: u32, read: std::io::Result<Boot>) -> Option<Lost> {
    let (rank, life, why) = match read {
        Ok(Boot::Done) => return None,
        Ok(Boot::Lost {
            rank,
            incarnation: life,
            why,
        }) if rank != 0 && rank != from && rank < size => {
            (rank, life, format!("{why} (seen by rank {from})"))
        }
        Ok(Boot::Lost { rank: 0, why, .. }) => {
            (from, incarnation, format!("it lost this rank: {why}"))
        }
        Ok(other) => (
            from,
            incarnation,
            format!("sent {other:?} to the coordinator"),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            (from, incarnation, "its process ended".into())
        }
        Err(e) => (from, incarnation, e.to_string()),
    };
    Some(Lost { rank, life, why })
}

/// Rank 0: tells every rank the job is over and waits for them to stop serving.
fn end_job(state: &RackState, code: u8) {
    let mut coordination: Vec<(u32, TcpStream)> = state
        .lock_coordination()
        .iter()
        .filter_map(|(r, s)| Some((*r, s.try_clone().ok()?)))
        .collect();
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
        Ok(Boot::Lost { rank, why, .. }) => lost(state, rank, &why),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn eof() -> std::io::Result<Boot> {
        Err(std::io::ErrorKind::UnexpectedEof.into())
    }

    #[test]
    fn a_rank_that_lost_a_peer_has_rank_0_name_that_peer() {
        let told = Boot::Lost {
            rank: 2,
            incarnation: 4,
            why: "silent for 1000 ms (GSM_PEER_TIMEOUT)".into(),
        };
        assert_eq!(
            judge(1, 0, 3, Ok(told)),
            Some(Lost {
                rank: 2,
                life: 4,
                why: "silent for 1000 ms (GSM_PEER_TIMEOUT) (seen by rank 1)".to_string()
            })
        );
    }

    #[test]
    fn a_second_rack_in_one_process_is_refused() {
        let one_node = || Settings::from_vars(|_| None).expect("no variables: one node");
        let code = Rack::with_settings(one_node()).workers(1).run(move || {
            let inner = Rack::with_settings(one_node()).try_run(|| {});
            match inner {
                Err(RackError::Config { why }) => assert!(why.contains("already runs"), "{why}"),
                other => panic!("a second rack: {other:?}"),
            }
        });
        assert_eq!(code, ExitCode::SUCCESS);
    }

    #[test]
    fn a_rank_that_ends_without_a_word_is_the_one_lost() {
        let lost = Lost {
            rank: 1,
            life: 2,
            why: "its process ended".into(),
        };
        assert_eq!(judge(1, 2, 3, eof()), Some(lost));
        assert_eq!(judge(1, 2, 3, Ok(Boot::Done)), None);
    }

    #[test]
    fn a_rank_that_lost_rank_0_or_names_no_peer_is_the_one_lost() {
        let Lost { rank, why, .. } = judge(
            2,
            0,
            3,
            Ok(Boot::Lost {
                rank: 0,
                incarnation: 0,
                why: "silent".into(),
            }),
        )
        .unwrap();
        assert_eq!((rank, why.as_str()), (2, "it lost this rank: silent"));
        for bad in [2, 3, 99] {
            let Lost { rank, why, .. } = judge(
                2,
                0,
                3,
                Ok(Boot::Lost {
                    rank: bad,
                    incarnation: 0,
                    why: "x".into(),
                }),
            )
            .unwrap();
            assert_eq!(rank, 2, "rank 2 naming rank {bad}");
            assert!(why.starts_with("sent Lost"), "{why}");
        }
        let Lost { rank, why, .. } = judge(1, 0, 3, Ok(Boot::Exit { code: 0 })).unwrap();
        assert_eq!(rank, 1);
        assert!(why.contains("Exit"), "{why}");
    }
}
