//! `instructions`: instructions per operation, client side and trustee side, counted by callgrind.
//!
//! Timings on shared machines swing between runs and CPU models; instruction counts do not. Each
//! operation runs as a *scenario* in a child process (this same executable, re-run with the hidden
//! `--scenario NAME --ops N` arguments) under `valgrind --tool=callgrind --separate-threads=yes`,
//! which writes one count per thread. Idle waiting is left out by toggling collection off inside
//! the runtime's two waiting functions, `Worker::wait_for_work` (an idle worker) and
//! `wait_for_answer` (a plain thread waiting for its answer). Fixed costs (process start, runtime
//! start and shutdown, spawning) are removed by running each scenario at two sizes and dividing the
//! difference in counts by the difference in operations.
//!
//! Threads are told apart by two marker functions that each scenario calls once: the client calls
//! [`mark_client`], and a request from the client runs [`mark_trustee`] on the trustee; the thread
//! whose callgrind file contains the marker is that role. Scenarios on the runtime use
//! `workers(2).dedicated_trustees(1)`: worker 0 is the client, worker 1 the dedicated trustee.

use std::cell::Cell;
use std::fs;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Poll, Waker};

use anyhow::{Context as _, bail, ensure};
use trust::{Runtime, Trust};

use crate::figure::{Table, sig};
use crate::harness::Ctx;

/// Times each scenario is measured (at both sizes); the table gives the median and the spread.
/// The smoke run (`--quick`) measures once: it checks that every scenario runs, not its spread.
const REPEATS: usize = 2;
/// Fibers issuing `apply` in the fiber scenario.
const FIBERS: u64 = 64;
/// `apply_then` requests issued between yields (a full batch or more).
const PACE: u64 = 64;
/// Unanswered `apply_then` requests at most before the issuing fiber blocks, kept well below the
/// runtime's own backpressure limit so that its yield loop never runs (it would count as work).
const MAX_OUTSTANDING: u64 = 256;
/// Spread between repeats above which the table flags a row as unstable.
const STABLE_SPREAD: f64 = 0.05;

/// One measured operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// One fiber issues `apply_then`; the callback counts completions.
    ApplyThen,
    /// The same from C, through the C library (`crates/trust-c/c/counter_table.c`,
    /// `instructions` mode): `trust_apply_then` of a C function, a C callback counting.
    CApplyThen,
    /// 64 fibers each call `apply` in a loop.
    FiberApply,
    /// 64 fibers each call `apply_deferred` in a loop; the closure sends its reply at once.
    FiberApplyDeferred,
    /// A plain OS thread calls `apply` in a loop.
    ThreadApply,
    /// `parking_lot::Mutex` lock, increment, unlock on one thread.
    ParkingLot,
    /// `std::sync::Mutex` lock, increment, unlock on one thread.
    StdMutex,
    /// `AtomicU64::fetch_add` on one thread.
    FetchAdd,
    /// Rank 0 of a two-rank rack issues `apply_then_with` to a counter on rank 1, over TCP.
    RemoteApplyThen,
    /// Rank 0 calls `apply_with` on the counter of rank 1 through shared memory, one call at a
    /// time from one fiber: the round trip of `bench rack`'s E1, whole processes.
    RemoteApplyShm,
    /// As `RemoteApplyThen`, calling the function `bench.add` by name with
    /// `apply_then_named`.
    RemoteNamed,
    /// As `RemoteApplyThen`, with `Durable::call_then_without_dedup` of `bench.add` on a
    /// `Durable<u64>` under `GSM_DURABILITY=os`: logged, no exactly-once record.
    RemoteDurableNoDedup,
    /// As `RemoteDurableNoDedup`, with `Durable::call_then`: exactly once.
    RemoteDurable,
}

impl Scenario {
    /// Every scenario, in table order.
    pub const ALL: [Scenario; 13] = [
        Scenario::ApplyThen,
        Scenario::CApplyThen,
        Scenario::RemoteApplyThen,
        Scenario::RemoteNamed,
        Scenario::RemoteApplyShm,
        Scenario::RemoteDurableNoDedup,
        Scenario::RemoteDurable,
        Scenario::FiberApply,
        Scenario::FiberApplyDeferred,
        Scenario::ThreadApply,
        Scenario::ParkingLot,
        Scenario::StdMutex,
        Scenario::FetchAdd,
    ];

    /// Name on the command line of the child process.
    pub fn id(self) -> &'static str {
        match self {
            Scenario::ApplyThen => "apply-then",
            Scenario::CApplyThen => "c-apply-then",
            Scenario::FiberApply => "fiber-apply",
            Scenario::FiberApplyDeferred => "fiber-apply-deferred",
            Scenario::ThreadApply => "thread-apply",
            Scenario::ParkingLot => "parking-lot",
            Scenario::StdMutex => "std-mutex",
            Scenario::FetchAdd => "fetch-add",
            Scenario::RemoteApplyThen => "remote-apply-then",
            Scenario::RemoteNamed => "remote-named",
            Scenario::RemoteApplyShm => "remote-apply-shm",
            Scenario::RemoteDurableNoDedup => "remote-durable-no-dedup",
            Scenario::RemoteDurable => "remote-durable",
        }
    }

    /// Row name in the table.
    pub fn label(self) -> &'static str {
        match self {
            Scenario::ApplyThen => "apply_then (full batches, incl. callback)",
            Scenario::CApplyThen => "C trust_apply_then (full batches, incl. callback)",
            Scenario::FiberApply => "apply from a fiber (64 fibers, incl. both switches)",
            Scenario::FiberApplyDeferred => {
                "apply_deferred answered at once, from a fiber (64 fibers, incl. both switches)"
            }
            Scenario::ThreadApply => "apply from a plain thread",
            Scenario::ParkingLot => "parking_lot Mutex lock+increment+unlock",
            Scenario::StdMutex => "std Mutex lock+increment+unlock",
            Scenario::FetchAdd => "AtomicU64::fetch_add",
            Scenario::RemoteApplyThen => {
                "remote apply_then_with over TCP (full batches, incl. callback; whole processes)"
            }
            Scenario::RemoteNamed => {
                "remote apply_then_named over TCP (the same call by name; whole processes)"
            }
            Scenario::RemoteApplyShm => {
                "remote apply_with through shared memory, one call at a time (whole processes)"
            }
            Scenario::RemoteDurableNoDedup => {
                "durable call_then over TCP, logged without dedup (os; whole processes)"
            }
            Scenario::RemoteDurable => {
                "durable call_then over TCP, exactly-once (os; whole processes)"
            }
        }
    }

    fn from_id(id: &str) -> anyhow::Result<Scenario> {
        Scenario::ALL
            .into_iter()
            .find(|s| s.id() == id)
            .with_context(|| format!("unknown instructions scenario `{id}`"))
    }

    /// Whether the operation has a trustee side.
    fn delegated(self) -> bool {
        matches!(
            self,
            Scenario::ApplyThen
                | Scenario::CApplyThen
                | Scenario::FiberApply
                | Scenario::FiberApplyDeferred
                | Scenario::ThreadApply
                | Scenario::RemoteApplyThen
                | Scenario::RemoteNamed
                | Scenario::RemoteApplyShm
                | Scenario::RemoteDurableNoDedup
                | Scenario::RemoteDurable
        )
    }

    /// Whether client and trustee are two processes (two ranks) rather than two threads of one.
    fn remote(self) -> bool {
        matches!(
            self,
            Scenario::RemoteApplyThen
                | Scenario::RemoteNamed
                | Scenario::RemoteApplyShm
                | Scenario::RemoteDurableNoDedup
                | Scenario::RemoteDurable
        )
    }

    /// Whether the scenario keeps durable state (in a directory of its own).
    fn durable(self) -> bool {
        matches!(
            self,
            Scenario::RemoteDurableNoDedup | Scenario::RemoteDurable
        )
    }

    /// The two operation counts (N1 < N2) whose difference is measured. A plain thread waits for
    /// every answer, and under valgrind each wait costs a thread switch, so it gets fewer.
    fn sizes(self, quick: bool) -> (u64, u64) {
        let (n1, n2) = match self {
            Scenario::ApplyThen
            | Scenario::CApplyThen
            | Scenario::FiberApply
            | Scenario::FiberApplyDeferred => (200_000, 1_000_000),
            Scenario::ThreadApply => (1_000, 5_000),
            Scenario::RemoteApplyThen | Scenario::RemoteNamed => (20_000, 100_000),
            Scenario::RemoteApplyShm => (4_000, 20_000),
            Scenario::RemoteDurableNoDedup | Scenario::RemoteDurable => (10_000, 50_000),
            Scenario::ParkingLot | Scenario::StdMutex | Scenario::FetchAdd => (200_000, 1_000_000),
        };
        // Durable calls cost ten times a plain one under callgrind: the smoke run takes fewer.
        let quick_by = if self.durable() { 20 } else { 10 };
        if quick {
            (n1 / quick_by, n2 / quick_by)
        } else {
            (n1, n2)
        }
    }

    /// The issue's goals for this operation: (client, trustee) instructions per operation.
    fn goal(self) -> (Option<f64>, Option<f64>) {
        match self {
            Scenario::ApplyThen => (Some(40.0), Some(25.0)),
            Scenario::FiberApply => (Some(90.0), None),
            _ => (None, None),
        }
    }

    /// A goal relative to another row of the same run.
    fn relative_goal(self) -> Option<(Scenario, Relative)> {
        match self {
            Scenario::FiberApplyDeferred => Some((Scenario::FiberApply, Relative::TotalTimes(1.1))),
            // The C API issue: the C path within 1.2× of the Rust one.
            Scenario::CApplyThen => Some((Scenario::ApplyThen, Relative::TotalTimes(1.2))),
            // The code-packages issue: naming the function costs the receiver ≤ 40 more.
            Scenario::RemoteNamed => Some((Scenario::RemoteApplyThen, Relative::TrusteePlus(40.0))),
            // RIFL's margin: exactly-once costs about 4% over the durable write.
            Scenario::RemoteDurable => {
                Some((Scenario::RemoteDurableNoDedup, Relative::TotalTimes(1.04)))
            }
            _ => None,
        }
    }
}

/// A bound relative to another row's count.
#[derive(Debug, Clone, Copy)]
enum Relative {
    /// Total instructions ≤ this factor × the other row's total.
    TotalTimes(f64),
    /// Trustee instructions ≤ the other row's trustee count + this many.
    TrusteePlus(f64),
}

impl Relative {
    /// The bound on this row's count, and which of its counts it bounds, given the other
    /// row's (total, trustee) counts.
    fn bound(self, (total, trustee): RowCounts) -> Option<(&'static str, f64)> {
        match self {
            Relative::TotalTimes(factor) => Some(("total", factor * total)),
            Relative::TrusteePlus(extra) => trustee.map(|t| ("trustee", t + extra)),
        }
    }

    fn describe(self, of: Scenario) -> String {
        match self {
            Relative::TotalTimes(factor) => format!("total ≤ {factor} × {}", of.id()),
            Relative::TrusteePlus(extra) => format!("trustee ≤ {} + {extra}", of.id()),
        }
    }
}

// ----- the child process: one scenario -----

/// Marks the calling thread as the client in the callgrind files (called once per scenario).
#[inline(never)]
pub fn mark_client() {
    black_box("instructions: client");
}

/// Marks the calling thread as the trustee in the callgrind files (runs once, delegated).
#[inline(never)]
pub fn mark_trustee(property: &mut u64) {
    black_box(property);
    black_box("instructions: trustee");
}

/// Runs `scenario` with `ops` operations and checks its result (the child side of the experiment;
/// fails if the counter does not end at `ops`).
pub fn run_scenario(id: &str, ops: u64) -> anyhow::Result<()> {
    let scenario = Scenario::from_id(id)?;
    ensure!(ops > 0, "--ops must be positive");
    let total = match scenario {
        Scenario::CApplyThen => bail!("the C scenario runs the C program, not this executable"),
        Scenario::ApplyThen
        | Scenario::FiberApply
        | Scenario::FiberApplyDeferred
        | Scenario::ThreadApply => delegated(scenario, ops)?,
        Scenario::RemoteApplyThen
        | Scenario::RemoteNamed
        | Scenario::RemoteApplyShm
        | Scenario::RemoteDurableNoDedup
        | Scenario::RemoteDurable => {
            match remote(scenario, ops)? {
                Some(total) => total,
                // Rank 1 only serves; rank 0 checks the count.
                None => return Ok(()),
            }
        }
        Scenario::ParkingLot => {
            let m = parking_lot::Mutex::new(0u64);
            mark_client();
            for _ in 0..ops {
                *black_box(&m).lock() += 1;
            }
            m.into_inner()
        }
        Scenario::StdMutex => {
            let m = std::sync::Mutex::new(0u64);
            mark_client();
            for _ in 0..ops {
                *black_box(&m).lock().unwrap_or_else(|e| e.into_inner()) += 1;
            }
            m.into_inner().unwrap_or_else(|e| e.into_inner())
        }
        Scenario::FetchAdd => {
            let a = AtomicU64::new(0);
            mark_client();
            for _ in 0..ops {
                black_box(&a).fetch_add(1, Ordering::Relaxed);
            }
            a.into_inner()
        }
    };
    ensure!(
        total == ops,
        "{}: the counter ends at {total} after {ops} increments",
        scenario.label()
    );
    Ok(())
}

/// Marks this thread as the client and the counter's trustee as the trustee.
fn start_client(counter: &Trust<u64>) {
    mark_client();
    counter.apply(mark_trustee);
}

/// Runs a delegated scenario on a runtime with one client worker and one dedicated trustee;
/// returns the counter's final value.
fn delegated(scenario: Scenario, ops: u64) -> anyhow::Result<u64> {
    let rt = Runtime::builder()
        .workers(2)
        .dedicated_trustees(1)
        .build()
        .context("starting the runtime")?;
    let trustee = rt.handle().workers() - 1;
    let counter = rt.handle().trustee(trustee).entrust(0u64);
    let c = counter.clone();
    let completed = match scenario {
        Scenario::ApplyThen => rt.spawn_on(0, move || apply_then_loop(&c, ops)).join(),
        Scenario::FiberApply => rt
            .spawn_on(0, move || {
                in_fibers(&c, ops, |c| {
                    c.apply(|n| *n += 1);
                })
            })
            .join(),
        Scenario::FiberApplyDeferred => rt
            .spawn_on(0, move || {
                in_fibers(&c, ops, |c| {
                    c.apply_deferred(|n, reply: trust::Reply<()>| {
                        *n += 1;
                        let _ = reply.send(());
                    })
                })
            })
            .join(),
        Scenario::ThreadApply => std::thread::spawn(move || {
            start_client(&c);
            for _ in 0..ops {
                c.apply(|n| *n += 1);
            }
            ops
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the client thread panicked"))?,
        _ => unreachable!("not a delegated scenario"),
    };
    ensure!(
        completed == ops,
        "{}: {completed} of {ops} callbacks ran",
        scenario.label()
    );
    let total = counter.apply(|n| *n);
    drop(counter);
    drop(rt);
    Ok(total)
}

/// Marks the client, then runs `ops` calls of `call` spread over `FIBERS` fibers; returns
/// `ops`.
fn in_fibers(counter: &Trust<u64>, ops: u64, call: fn(&Trust<u64>)) -> u64 {
    start_client(counter);
    let fibers: Vec<_> = (0..FIBERS)
        .map(|i| {
            let c = counter.clone();
            let mine = ops / FIBERS + u64::from(i < ops % FIBERS);
            trust::spawn(move || {
                for _ in 0..mine {
                    call(&c);
                }
            })
        })
        .collect();
    fibers.into_iter().for_each(|f| f.join());
    ops
}

thread_local! {
    /// `apply_then` callbacks run on this worker.
    static DONE: Cell<u64> = const { Cell::new(0) };
    /// The count of `DONE` at which the issuing fiber is to be woken (`u64::MAX`: none).
    static WAKE_AT: Cell<u64> = const { Cell::new(u64::MAX) };
    /// The issuing fiber's waker while it waits.
    static WAITER: Cell<Option<Waker>> = const { Cell::new(None) };
}

/// The `apply_then` callback: counts one completion, wakes the issuing fiber at its target.
/// Inlined into each trampoline, as a closure written at the call would be: called from two
/// scenarios, the compiler would otherwise keep it out of line and count a call per request.
#[inline(always)]
fn completed() {
    let done = DONE.get() + 1;
    DONE.set(done);
    if done == WAKE_AT.get() {
        WAKE_AT.set(u64::MAX);
        if let Some(waker) = WAITER.take() {
            waker.wake();
        }
    }
}

/// Blocks the fiber until `DONE` reaches `target`, so that the worker waits in the runtime's
/// idle path (not counted) rather than in a counted polling loop. (`trust::Group` does this for
/// applications; here the callback is kept as lean as a callback can be, so that the counts
/// are the runtime's: tracking a callback in a `Group` adds about 40 instructions.)
fn wait_for_completions(target: u64) {
    trust::block_on(std::future::poll_fn(|cx| {
        if DONE.get() >= target {
            return Poll::Ready(());
        }
        WAKE_AT.set(target);
        WAITER.set(Some(cx.waker().clone()));
        Poll::Pending
    }));
}

/// Issues `ops` requests with `issue`, yielding after every [`PACE`] so the worker publishes
/// them and blocking while more than [`MAX_OUTSTANDING`] are unanswered; returns the callbacks
/// that ran, once all have. Inlined, so that each scenario's loop is as if written there.
#[inline(always)]
fn paced(ops: u64, mut issue: impl FnMut()) -> u64 {
    DONE.set(0);
    // `1..ops + 1` rather than `1..=ops`: an inclusive range costs the loop about 6 more
    // instructions per iteration, which are the harness's, not the runtime's.
    for issued in 1..ops + 1 {
        issue();
        if issued.is_multiple_of(PACE) {
            trust::yield_now();
            if issued - DONE.get() > MAX_OUTSTANDING {
                wait_for_completions(issued - MAX_OUTSTANDING / 2);
            }
        }
    }
    wait_for_completions(ops);
    DONE.get()
}

/// Issues `ops` increments with `apply_then`; returns the callbacks that ran.
fn apply_then_loop(counter: &Trust<u64>, ops: u64) -> u64 {
    start_client(counter);
    paced(ops, || counter.apply_then(|n| *n += 1, |()| completed()))
}

/// Runs this process as one rank of the two-rank rack its `GSM_*` variables describe. Rank 0
/// issues `ops` remote `apply_then_with` calls and returns the counter's final value; rank 1
/// holds the counter, serves, and returns `None`.
fn remote(scenario: Scenario, ops: u64) -> anyhow::Result<Option<u64>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let code = gossamer::Rack::from_env()
        .try_run(move || {
            // Rank 0 only; the receiver is still alive.
            let _ = tx.send(match scenario {
                Scenario::RemoteApplyThen => remote_apply_then_loop(ops),
                Scenario::RemoteNamed => remote_named_loop(ops),
                Scenario::RemoteApplyShm => remote_apply_loop(ops),
                _ => remote_durable_loop(ops, scenario == Scenario::RemoteDurable),
            });
        })
        .map_err(|e| anyhow::anyhow!("gossamer: {e}"))?;
    ensure!(code == 0, "the rack ended with status {code}");
    match rx.try_recv() {
        Ok(total) => total.map(Some),
        Err(_) => Ok(None),
    }
}

/// Rank 1 of the two-rank rack a remote scenario runs on, which holds its counter.
fn callee() -> anyhow::Result<gossamer::Node> {
    let last = gossamer::nodes().last().context("a rack has nodes")?;
    ensure!(
        last.rank() == 1,
        "the remote scenario runs on a rack of two ranks, not {}",
        last.rank() + 1
    );
    Ok(last)
}

/// Rank 0: issues `ops` remote `apply_then_with` increments to a counter on rank 1 the way
/// [`apply_then_loop`] does locally; returns the counter's final value.
fn remote_apply_then_loop(ops: u64) -> anyhow::Result<u64> {
    let last = callee()?;
    let counter = last.entrust(0u64);
    mark_client();
    counter.apply_with(|c, ()| mark_trustee(c), ());
    let done = paced(ops, || {
        counter.apply_then_with(
            |c, x: u64| {
                *c += x;
                *c
            },
            1,
            |_| completed(),
        )
    });
    ensure!(done == ops, "{done} of {ops} callbacks ran");
    Ok(counter.apply(|c| *c))
}

/// Rank 0: calls `apply_with` on a counter on rank 1 `ops` times, each call waiting for its
/// answer; returns the counter's final value.
fn remote_apply_loop(ops: u64) -> anyhow::Result<u64> {
    let last = callee()?;
    let counter = last.entrust(0u64);
    mark_client();
    counter.apply_with(|c, ()| mark_trustee(c), ());
    for _ in 0..ops {
        counter.apply_with(
            |c, x: u64| {
                *c += x;
                *c
            },
            1,
        );
    }
    Ok(counter.apply(|c| *c))
}

/// The function [`remote_named_loop`] calls by name.
#[gossamer::function("bench.add")]
fn add(c: &mut u64, x: u64) -> u64 {
    *c += x;
    *c
}

/// Rank 0: as [`remote_apply_then_loop`], calling the function `bench.add` by name.
fn remote_named_loop(ops: u64) -> anyhow::Result<u64> {
    let last = callee()?;
    let counter = last.entrust(0u64);
    let add = gossamer::named::<u64, u64, u64>("bench.add")?;
    mark_client();
    counter.apply_with(|c, ()| mark_trustee(c), ());
    let done = paced(ops, || {
        counter.apply_then_named(&add, 1, |r| {
            r.expect("bench.add is registered");
            completed()
        })
    });
    ensure!(done == ops, "{done} of {ops} callbacks ran");
    Ok(counter.apply(|c| *c))
}

/// Rank 0: issues `ops` durable `call_then`s (exactly once, or logged without dedup) of
/// `bench.add` to a `Durable<u64>` on rank 1, paced as [`remote_apply_then_loop`]; returns
/// the counter's final value.
fn remote_durable_loop(ops: u64, exactly_once: bool) -> anyhow::Result<u64> {
    use crate::durable::Add;
    let last = callee()?;
    // Fresh for each run: the state directory is the scenario's own.
    let counter = last.durable("instructions", || 0u64)?;
    mark_client();
    last.entrust(0u64).apply_with(|c, ()| mark_trustee(c), ());
    let done = paced(ops, || {
        if exactly_once {
            counter.call_then(Add(1), |_| completed());
        } else {
            counter.call_then_without_dedup(Add(1), |_| completed());
        }
    });
    ensure!(done == ops, "{done} of {ops} callbacks ran");
    Ok(counter.read(|c: &u64| *c)?)
}

// ----- the parent process: running callgrind and reading its files -----

/// Instructions one callgrind run counted, per role.
#[derive(Debug, Clone, Copy)]
struct Counts {
    client: u64,
    trustee: Option<u64>,
}

/// Fails with an installation hint unless valgrind runs.
fn check_valgrind() -> anyhow::Result<()> {
    match Command::new("valgrind").arg("--version").output() {
        Ok(out) if out.status.success() => Ok(()),
        _ => bail!(
            "`instructions` counts instructions with valgrind's callgrind, and valgrind \
             was not found or does not run: install it (e.g. `sudo apt-get install valgrind`; \
             scripts/test.sh installs it)"
        ),
    }
}

/// The runtime's waiting functions, inside which counting stops: an idle worker, and a plain
/// thread waiting for its answer.
const WAITS: [&str; 2] = ["wait_for_work", "wait_for_answer"];

/// The executables the scenarios run: this one, and the C program (built when a C scenario
/// is selected).
struct Exes {
    me: PathBuf,
    c_program: Option<PathBuf>,
}

impl Exes {
    /// The program and arguments of `scenario` with `ops` operations.
    fn command(&self, scenario: Scenario, ops: u64) -> anyhow::Result<(&Path, Vec<String>)> {
        let ops = ops.to_string();
        Ok(if scenario == Scenario::CApplyThen {
            let c = self
                .c_program
                .as_deref()
                .context("the C program was not built")?;
            (c, vec!["instructions".into(), ops])
        } else {
            let args = ["--scenario", scenario.id(), "--ops", &ops];
            (&self.me, args.map(String::from).to_vec())
        })
    }
}

/// One callgrind file: the process it came from and its text.
struct ThreadFile {
    pid: String,
    text: String,
}

/// Runs `scenario` with `ops` operations under callgrind with its files in `dir` (removed after),
/// counting everything or, with `skip_waits`, everything outside [`WAITS`]; returns each
/// thread's file. A remote scenario runs as two processes, ranks 0 and 1 of a rack on loopback.
fn callgrind(
    exes: &Exes,
    scenario: Scenario,
    ops: u64,
    dir: &Path,
    skip_waits: bool,
) -> anyhow::Result<Vec<ThreadFile>> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let (program, args) = exes.command(scenario, ops)?;
    let command = |env: Vec<(String, String)>| {
        let mut cmd = Command::new("valgrind");
        cmd.args([
            "--tool=callgrind",
            "--fair-sched=yes",
            "--separate-threads=yes",
        ]);
        if skip_waits {
            for wait in WAITS {
                cmd.arg(format!("--toggle-collect=*{wait}*"));
            }
        }
        cmd
            // After the toggles, which imply `--collect-atstart=no`.
            .arg("--collect-atstart=yes")
            // Full function names in every per-thread file, for the role markers.
            .arg("--compress-strings=no")
            .arg(format!("--callgrind-out-file={}/cg.%p", dir.display()))
            .arg(program)
            .args(&args)
            .envs(env)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    };
    // Beside the callgrind files, not among them.
    let state = dir.with_extension("state");
    let ranks = if scenario.remote() {
        let coord = crate::kvs::free_addr()?;
        let secret = format!("{:032x}", rand::random::<u128>());
        (0..2)
            .map(|rank| {
                let transport = if scenario == Scenario::RemoteApplyShm {
                    "shm"
                } else {
                    "tcp"
                };
                let mut env = crate::rack::rack_env(rank, 2, coord, &secret, transport);
                if scenario.durable() {
                    env.extend(
                        [
                            ("GSM_STATE_DIR", state.display().to_string()),
                            ("GSM_JOB_NAME", "instructions".to_string()),
                            ("GSM_DURABILITY", "os".to_string()),
                        ]
                        .map(|(k, v)| (k.to_string(), v)),
                    );
                }
                env
            })
            .collect()
    } else {
        vec![Vec::new()]
    };
    let children = ranks
        .into_iter()
        .map(|env| command(env).spawn().context("running valgrind"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for child in children {
        let out = child.wait_with_output().context("waiting for valgrind")?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
            bail!(
                "{} with {ops} operations failed under callgrind ({}):\n{}",
                scenario.label(),
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        // The process-wide file stays empty when threads are counted separately.
        if !text.is_empty() {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            // `cg.PID-THREAD`
            let pid = name
                .trim_start_matches("cg.")
                .split('-')
                .next()
                .unwrap_or_default();
            files.push(ThreadFile {
                pid: pid.to_owned(),
                text,
            });
        }
    }
    fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    if scenario.durable() {
        fs::remove_dir_all(&state).with_context(|| format!("removing {}", state.display()))?;
    }
    Ok(files)
}

/// Checks that the runtime's waiting functions exist as functions in this build (were not
/// inlined), so that the toggles leave idle time out: counts a short plain-thread scenario,
/// which runs both, without them.
fn check_waits_are_functions(exes: &Exes, dir: &Path) -> anyhow::Result<()> {
    let files = callgrind(exes, Scenario::ThreadApply, 64, dir, false)?;
    for wait in WAITS {
        ensure!(
            files.iter().any(|f| defines(&f.text, wait)),
            "no function named `{wait}` ran in the plain-thread scenario: the runtime no longer \
             waits in a function of that name (renamed or inlined), so idle waiting would be \
             counted; keep it `#[inline(never)]` or update `WAITS`"
        );
    }
    Ok(())
}

/// Runs `scenario` with `ops` operations under callgrind and returns the counts of the client
/// and trustee, found by their markers: the marked threads, or for a remote scenario every
/// thread of the marked processes (a rank's reader, writer and helper threads are its cost too).
fn count(exes: &Exes, scenario: Scenario, ops: u64, dir: &Path) -> anyhow::Result<Counts> {
    let files = callgrind(exes, scenario, ops, dir, true)?;
    let role = |marker: &str, role: &str| -> anyhow::Result<u64> {
        let marked: Vec<&ThreadFile> = files.iter().filter(|f| defines(&f.text, marker)).collect();
        let [one] = marked.as_slice() else {
            bail!(
                "{} with {ops} operations: expected one thread marked as the {role}, found {}",
                scenario.label(),
                marked.len()
            );
        };
        files
            .iter()
            .filter(|f| {
                if scenario.remote() {
                    f.pid == one.pid
                } else {
                    std::ptr::eq(*f, *one)
                }
            })
            .map(|f| total_of(&f.text).context("a callgrind file without totals"))
            .sum()
    };
    Ok(Counts {
        client: role("mark_client", "client")?,
        trustee: if scenario.delegated() {
            Some(role("mark_trustee", "trustee")?)
        } else {
            None
        },
    })
}

/// The instruction total of one callgrind file (`totals:`, or `summary:` in older formats).
fn total_of(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("totals:"))
        .or_else(|| text.lines().find_map(|l| l.strip_prefix("summary:")))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// Whether the callgrind file has cost lines for a function named `name` (C) or whose path
/// ends in `::name` (Rust), that is, whether this thread ran it.
fn defines(text: &str, name: &str) -> bool {
    let suffix = format!("::{name}");
    text.lines()
        .filter_map(|l| l.strip_prefix("fn="))
        .map(str::trim_end)
        .any(|l| l == name || l.ends_with(&suffix))
}

/// Per-operation counts of one scenario, one sample per repeat.
#[derive(Debug, Default)]
struct PerOp {
    client: Vec<f64>,
    trustee: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// (max − min) / median of the samples.
fn spread(v: &[f64]) -> f64 {
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    (max - min) / median(v)
}

/// Measures every selected scenario and returns the table.
pub fn run(ctx: &mut Ctx) -> anyhow::Result<Table> {
    check_valgrind()?;
    let me = ctx.self_exe.clone().context(
        "`instructions` re-runs its own executable: run it as `cargo run --release -p bench -- instructions`",
    )?;
    let scratch = std::env::temp_dir().join(format!("gsm-instructions-{}", std::process::id()));
    let c_program = if Scenario::ALL
        .into_iter()
        .any(|s| s == Scenario::CApplyThen && ctx.selected(s.label()))
    {
        Some(crate::capi::build_program(&me, &scratch.join("c"))?)
    } else {
        None
    };
    let exes = &Exes { me, c_program };
    let scenarios: Vec<Scenario> = Scenario::ALL
        .into_iter()
        .filter(|s| ctx.selected(s.label()))
        .collect();
    ensure!(!scenarios.is_empty(), "--only selected no operation");
    check_waits_are_functions(exes, &scratch.join("waits"))?;
    let mut rows = Vec::new();
    let mut totals = Vec::new();
    let repeats = if ctx.quick { 1 } else { REPEATS };
    for scenario in scenarios {
        let (n1, n2) = scenario.sizes(ctx.quick);
        let mut per_op = PerOp::default();
        for repeat in 0..repeats {
            let started = std::time::Instant::now();
            let dir = |n: u64| scratch.join(format!("{}-{n}-{repeat}", scenario.id()));
            // Two valgrind processes at once: each runs its threads one at a time.
            let (small, large) = std::thread::scope(|s| {
                let small = s.spawn(|| count(exes, scenario, n1, &dir(n1)));
                let large = count(exes, scenario, n2, &dir(n2));
                (small.join().expect("count does not panic"), large)
            });
            let (small, large) = (small?, large?);
            let per = |a: u64, b: u64| (b as f64 - a as f64) / (n2 - n1) as f64;
            per_op.client.push(per(small.client, large.client));
            if let (Some(a), Some(b)) = (small.trustee, large.trustee) {
                per_op.trustee.push(per(a, b));
            }
            eprintln!(
                "   {}: N = {n1} and {n2}, run {}/{repeats}: client {} instr/op{} ({:.0} s)",
                scenario.label(),
                repeat + 1,
                sig(*per_op.client.last().expect("pushed")),
                per_op
                    .trustee
                    .last()
                    .map_or(String::new(), |t| format!(", trustee {}", sig(*t))),
                started.elapsed().as_secs_f64()
            );
        }
        let reference = scenario.relative_goal().map(|(of, relative)| {
            let counts = totals.iter().find(|(s, _)| *s == of).map(|&(_, c)| c);
            (of, relative, counts)
        });
        let (row, counts) = row(scenario, (n1, n2), &per_op, reference)?;
        totals.push((scenario, counts));
        rows.push(row);
    }
    let _ = fs::remove_dir_all(&scratch);
    Ok(Table {
        name: "instructions".into(),
        title: "Instructions per operation, client and trustee side (callgrind)".into(),
        notes: notes(repeats),
        columns: [
            "operation",
            "client instr/op",
            "trustee instr/op",
            "total instr/op",
            "goal",
            "meets goal",
            "spread",
            "N1",
            "N2",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    })
}

/// A row's (total, trustee) instructions per operation, for relative goals.
type RowCounts = (f64, Option<f64>);

/// One table row and its (total, trustee) instructions per operation; fails if a role
/// counted no instructions per operation (a broken measurement). `reference` is a relative
/// goal: the row it is relative to, the bound, and that row's counts if this run measured it.
fn row(
    scenario: Scenario,
    (n1, n2): (u64, u64),
    per_op: &PerOp,
    reference: Option<(Scenario, Relative, Option<RowCounts>)>,
) -> anyhow::Result<(Vec<String>, RowCounts)> {
    let client = median(&per_op.client);
    let trustee = (!per_op.trustee.is_empty()).then(|| median(&per_op.trustee));
    ensure!(
        client > 0.0 && trustee.is_none_or(|t| t > 0.0),
        "{}: a role counted no instructions per operation (client {client}, trustee {trustee:?})",
        scenario.label()
    );
    let (client_goal, trustee_goal) = scenario.goal();
    let mut goals = Vec::new();
    let mut missed = Vec::new();
    if let Some(g) = client_goal {
        goals.push(format!("client ≤ {g}"));
        if client > g {
            missed.push("client");
        }
    }
    if let (Some(g), Some(t)) = (trustee_goal, trustee) {
        goals.push(format!("trustee ≤ {g}"));
        if t > g {
            missed.push("trustee");
        }
    }
    let total = client + trustee.unwrap_or(0.0);
    if let Some((of, relative, of_counts)) = reference {
        match of_counts.and_then(|c| relative.bound(c)) {
            Some((what, bound)) => {
                goals.push(format!("{} ({bound:.1})", relative.describe(of)));
                let count = if what == "total" {
                    total
                } else {
                    trustee.unwrap_or(f64::INFINITY)
                };
                if count > bound {
                    missed.push(what);
                }
            }
            None => goals.push(format!("{} (not measured)", relative.describe(of))),
        }
    }
    let meets = match (goals.is_empty(), missed.is_empty()) {
        (true, _) => "–".to_owned(),
        (false, true) => "yes".to_owned(),
        (false, false) => format!("no ({})", missed.join(", ")),
    };
    let worst = spread(&per_op.client).max(if per_op.trustee.is_empty() {
        0.0
    } else {
        spread(&per_op.trustee)
    });
    let unstable = if worst > STABLE_SPREAD {
        " (unstable)"
    } else {
        ""
    };
    let row = vec![
        scenario.label().to_owned(),
        format!("{client:.1}"),
        trustee.map_or("–".to_owned(), |t| format!("{t:.1}")),
        format!("{total:.1}"),
        if goals.is_empty() {
            "–".to_owned()
        } else {
            goals.join(", ")
        },
        meets,
        format!("{:.1}%{unstable}", worst * 100.0),
        n1.to_string(),
        n2.to_string(),
    ];
    Ok((row, (total, trustee)))
}

fn notes(repeats: usize) -> Vec<String> {
    vec![
        format!(
            "Each operation runs in a child process under `valgrind --tool=callgrind \
             --fair-sched=yes --separate-threads=yes --toggle-collect='*wait_for_work*' \
             --toggle-collect='*wait_for_answer*' --collect-atstart=yes --compress-strings=no`, \
             which counts executed instructions per thread and leaves out the runtime's idle waiting \
             (an idle worker in `Worker::wait_for_work`, a plain thread waiting for its answer \
             in `wait_for_answer`). Every operation is run with N1 and N2 operations; a cell is \
             (count at N2 − count at N1) / (N2 − N1), which removes start-up, shutdown and other \
             fixed costs. Each cell is the median of {repeats} such measurements; *spread* is the \
             largest (max − min) / median of a row's roles."
        ),
        "Delegation runs on `Runtime::builder().workers(2).dedicated_trustees(1)`: worker 0 is \
         the client, worker 1 the dedicated trustee holding a `u64` counter, and the critical \
         section only increments it. *apply_then*: one fiber issues N requests, yielding after \
         every 64 and blocking while more than 256 are unanswered, so the runtime sends full \
         batches; the callback counts completions in a thread-local. *apply_deferred answered at \
         once*: as *apply from a fiber*, each closure sending its `Reply` before it returns \
         (goal: at most 1.1 × the total of *apply from a fiber* in the same run). *apply from a fiber*: 64 \
         fibers each issue N/64 `apply` calls, so batches are full too. *apply from a plain \
         thread*: an OS thread issues N `apply` calls, one request per batch. The client column \
         is the client worker's (or thread's) whole count, scheduler rounds, fiber switches and \
         callbacks included; the trustee column the trustee worker's. valgrind runs one thread \
         at a time, so client and trustee never overlap as on two cores: a plain-thread client \
         parks for every answer, and its trustee pays a wake-up each time."
            .to_owned(),
        "The locks and the atomic run in a plain loop on one thread with no contention \
         (`*black_box(&mutex).lock() += 1`, `black_box(&atomic).fetch_add(1, Relaxed)`); their \
         cost is in the client column. Roles are found by two marker functions (`mark_client`, \
         and `mark_trustee` run once as a request), not by thread order; each scenario checks \
         that the counter ends at N."
        .to_owned(),
        "*durable call_then*: as *remote apply_then_with*, with a `Durable<u64>` on rank 1 \
         under `GSM_DURABILITY=os` in a fresh state directory, each call `bench.add` of 1 \
         (`gossamer::durable::Op`), logged by rank 1 and answered once its record is written; \
         *exactly-once* by `Durable::call_then` (a thread's client id and seq, the completion \
         record kept until acknowledged), *without dedup* by the benchmark's \
         `call_then_without_dedup`. The goal of the exactly-once row is RIFL's margin: at most \
         4% over the durable write without dedup, in the same run. Both include a snapshot \
         every 8192 records; the check reads the property back with `Durable::read`."
            .to_owned(),
        "*remote apply_then_with*: rank 0 of a two-rank rack on loopback (`GSM_WORKERS=1`, \
         each rank its own valgrind process) issues `apply_then_with(|c, x: u64| { *c += x; *c }, \
         1, callback)` to a counter on rank 1, paced as *apply_then* is, so frames are full. Its \
         columns are whole processes (every thread: the worker with its reader and writer \
         fibers, and any helper thread), user-space instructions only: the caller's rank as \
         client, the callee's as trustee. Goal: at most twice the local `apply_then` plus the \
         encoding of argument and result. *remote apply_then_named*: the same call to the \
         function `bench.add` (`#[gossamer::function]`) by name; its goal, from the code \
         packages issue, is that naming the function costs the receiver at most 40 \
         instructions more than the closure's descriptor. *remote apply_with through shared \
         memory*: the same ranks with `GSM_TRANSPORT=shm`, rank 0 calling `apply_with(|c, x: \
         u64| { *c += x; *c }, 1)` from one fiber, one call at a time: what one round trip of \
         `bench rack`'s E1 costs, every frame carrying one call and every call waiting for its \
         answer (the ranks' idle spins, in `wait_for_work`, are not counted)."
            .to_owned(),
        "Goals: trustee side ≤ 25 instructions per request in a full batch; client side of \
         `apply_then` ≤ 40 including its callback; `apply` from a fiber ≤ 90 including both \
         fiber switches (counted on the client side, where the switches happen)."
            .to_owned(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn every_scenario_runs_and_checks_itself() {
        // The remote scenarios need two ranks and the C one the C program (trust-c's tests
        // build and run it); the benchmark smoke run (`--quick all`) runs them.
        let in_process = |s: &Scenario| !s.remote() && *s != Scenario::CApplyThen;
        for scenario in Scenario::ALL.into_iter().filter(in_process) {
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || tx.send(run_scenario(scenario.id(), 1_000)));
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(result) => result.unwrap(),
                Err(_) => panic!("scenario `{}` did not finish within 60 s", scenario.id()),
            }
        }
        assert!(run_scenario("no-such-scenario", 10).is_err());
        assert!(run_scenario(Scenario::CApplyThen.id(), 10).is_err());
        assert!(run_scenario(Scenario::FetchAdd.id(), 0).is_err());
    }

    #[test]
    fn reads_callgrind_files() {
        let text = "events: Ir\nsummary: 120\nfn=(3) bench::instructions::mark_client\n\
                    fn=trust::worker::Worker::serve\n5 100\ntotals: 123\n";
        assert_eq!(total_of(text), Some(123));
        assert_eq!(total_of("summary: 7\n"), Some(7));
        assert_eq!(total_of("events: Ir\n"), None);
        assert!(defines(text, "mark_client"));
        assert!(defines(text, "serve"));
        assert!(!defines(text, "mark_trustee"));
        assert!(!defines(
            "cfn=bench::instructions::mark_trustee\n",
            "mark_trustee"
        ));
        // A C function is named alone; a longer name ending in it is another function.
        assert!(defines("fn=mark_client\n", "mark_client"));
        assert!(!defines("fn=unmark_client\n", "mark_client"));
    }

    #[test]
    fn rows_compare_with_the_goals() {
        let per_op = PerOp {
            client: vec![30.0, 50.0],
            trustee: vec![20.0, 20.0],
        };
        let (row, counts) = super::row(Scenario::ApplyThen, (10, 20), &per_op, None).unwrap();
        assert_eq!(counts, (60.0, Some(20.0)));
        assert_eq!(
            row[1..7],
            [
                "40.0",
                "20.0",
                "60.0",
                "client ≤ 40, trustee ≤ 25",
                "yes",
                "50.0% (unstable)"
            ]
        );
        let per_op = PerOp {
            client: vec![41.0],
            trustee: vec![26.0],
        };
        let (row, _) = super::row(Scenario::ApplyThen, (10, 20), &per_op, None).unwrap();
        assert_eq!(row[5], "no (client, trustee)");
        let per_op = PerOp {
            client: vec![5.0],
            trustee: vec![],
        };
        let (row, _) = super::row(Scenario::FetchAdd, (10, 20), &per_op, None).unwrap();
        assert_eq!(row[2..6], ["–", "5.0", "–", "–"]);
        let zero = PerOp {
            client: vec![0.0],
            trustee: vec![],
        };
        assert!(super::row(Scenario::FetchAdd, (10, 20), &zero, None).is_err());
        let deferred = PerOp {
            client: vec![300.0],
            trustee: vec![30.0],
        };
        let times = Relative::TotalTimes(1.1);
        let relative = Some((Scenario::FiberApply, times, Some((300.0, None))));
        let (row, _) =
            super::row(Scenario::FiberApplyDeferred, (10, 20), &deferred, relative).unwrap();
        assert_eq!(row[4..6], ["total ≤ 1.1 × fiber-apply (330.0)", "yes"]);
        let relative = Some((Scenario::FiberApply, times, Some((299.0, None))));
        let (row, _) =
            super::row(Scenario::FiberApplyDeferred, (10, 20), &deferred, relative).unwrap();
        assert_eq!(row[5], "no (total)");
        // A bound on the trustee's count over another row's.
        let plus = Relative::TrusteePlus(40.0);
        let named = PerOp {
            client: vec![900.0],
            trustee: vec![1030.0],
        };
        let relative = Some((
            Scenario::RemoteApplyThen,
            plus,
            Some((1900.0, Some(1000.0))),
        ));
        let (row, _) = super::row(Scenario::RemoteNamed, (10, 20), &named, relative).unwrap();
        assert_eq!(
            row[4..6],
            ["trustee ≤ remote-apply-then + 40 (1040.0)", "yes"]
        );
        let relative = Some((Scenario::RemoteApplyThen, plus, Some((1900.0, Some(980.0)))));
        let (row, _) = super::row(Scenario::RemoteNamed, (10, 20), &named, relative).unwrap();
        assert_eq!(row[5], "no (trustee)");
    }
}
