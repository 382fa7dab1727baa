//! Workers: one OS thread each, running one loop:
//!
//! 1. run the fibers that are ready, each until it blocks or yields;
//! 2. as a client: take the answers of finished batches (waking fibers, running `then`
//!    callbacks) and publish the requests its fibers staged since, one batch per trustee;
//! 3. as a trustee: serve every channel that holds a new batch;
//! 4. take work injected by other threads (spawns, wake-ups, frees, answers from other
//!    runtimes);
//! 5. with nothing to do, spin for as long as its spin policy (`spin`) allows, checking its
//!    sockets and watched memory (`net::watch`), then park until a client, a trustee or a
//!    socket wakes it.
//!
//! A worker owns its fibers, their stacks and its client-side lanes; none of these ever leave
//! its thread. Everything that crosses threads goes through a channel (`channel`) or an
//! injector (`inject`).
//!
//! The parts: the state a worker holds is plain data in files of its own — `scheduler` (the
//! fiber table and its state machine), `lane` (the client side's lanes to each trustee, and
//! the awaited answers of trustees of other runtimes), `local` (borrow-free access to both);
//! what the worker does with it is in `impl Worker` blocks, one file per concern — `fibers`
//! (running fibers), `client` (staging, publishing, completions, foreign answers), `serve`
//! (the trustee side: serving channels, freeing properties) and `shutdown`. The data files
//! import nothing of the worker, so the parts form no import circle. The request format
//! itself is in `request`.

mod client;
mod fibers;
mod forward;
mod lane;
mod local;
mod replies;
mod scheduler;
mod serve;
mod shutdown;
mod timers;

use std::cell::{Cell, RefCell};
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use corosensei::Yielder;

pub(crate) use client::MAX_BACKLOG;
pub(crate) use lane::PendingAnswer;
use lane::{ForeignLanes, Lane};
use local::Local;
use replies::Replies;
pub(crate) use replies::{AnswerState, Claim, Expire};
use scheduler::Scheduler;
use timers::Timers;

use crate::free::PendingFrees;
use crate::inject::{FiberId, Injected};
use crate::record::RecordBuf;
use crate::registry::Registry;
use crate::spin::{self, DEFAULT_SPIN, SpinPolicy, SpinSetting};
use crate::stats::{SampledRecord, WorkerCounters};

/// Loop rounds between two non-blocking polls of the worker's I/O reactor while it is busy.
#[cfg(feature = "net")]
const REACTOR_ROUNDS: u32 = 16;
/// Time between two non-blocking polls of the reactor while an idle worker spins. Each poll
/// is a system call: polling every round of the spin took a remote call with one outstanding
/// from 13 to 31 system calls (both ends), and every 5 µs instead of 2 µs added 4 µs to its
/// median (`bench rack`, E1; see bench/README, "The spin before blocking").
#[cfg(feature = "net")]
const SPIN_POLL_INTERVAL: Duration = Duration::from_micros(2);

/// Loop rounds between two publications of a worker's totals to `stats` (and one before
/// each wait).
const PUBLISH_ROUNDS: u32 = 16;

/// How soon a worker with dead properties waiting to be freed looks at them again while it
/// has nothing else to do.
const FREE_RECHECK: std::time::Duration = std::time::Duration::from_millis(1);

/// Requests a worker runs inline for its own trustee before one takes the channel.
const INLINE_BUDGET: u32 = 64;

/// Header of a deferred callback record (see `Worker::defer_callback`).
#[derive(Clone, Copy)]
struct Callback {
    run: unsafe fn(payload: *mut u64, run: bool),
}

/// Message shown when a blocking call happens where blocking is not allowed.
pub(crate) const BLOCKING_IN_DELEGATED: &str = "blocking call (apply, join, launch or Latch wait) in delegated context \
     (inside a delegated closure or an apply_then callback): a trustee must never block; \
     use apply_then to delegate without waiting, or launch to run blocking code in a trustee-side fiber";

/// What a worker thread is running now, which decides whether it may block.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Running {
    /// The worker loop itself, including `then` callbacks: must not block.
    Scheduler,
    /// A fiber: may block (the fiber suspends).
    Fiber,
    /// A delegated closure on a trustee: must not block.
    Delegated,
}

thread_local! {
    static CURRENT: Cell<*const Worker> = const { Cell::new(ptr::null()) };
}

/// The worker running on this thread, if any.
#[inline]
pub(crate) fn current() -> Option<&'static Worker> {
    let w = CURRENT.with(Cell::get);
    // SAFETY: `CURRENT` is set by `run` to a worker that lives on this thread's stack until
    // `run` clears it again; callers only use the reference within that time (they are called
    // from code the worker runs).
    unsafe { w.as_ref() }
}

/// The worker running on this thread, if it belongs to `registry`'s runtime.
#[inline]
pub(crate) fn current_on(registry: &Registry) -> Option<&'static Worker> {
    current().filter(|w| ptr::eq(&*w.registry, registry))
}

pub(crate) fn current_registry() -> Option<Arc<Registry>> {
    current().map(|w| w.registry.clone())
}

pub(crate) fn on_any_worker() -> bool {
    current().is_some()
}

/// One worker's thread-local state.
pub(crate) struct Worker {
    pub(crate) index: usize,
    /// This worker among every worker of the process, ever: the runtime's serial number in
    /// the high half, the index in the low half (what a `Reply` names its trustee by).
    pub(crate) place: u64,
    pub(crate) registry: Arc<Registry>,
    is_trustee: bool,
    running: Cell<Running>,
    sched: Local<Scheduler>,
    current: Cell<Option<FiberId>>,
    yielder: Cell<*const Yielder<(), ()>>,
    /// Indexed by trustee worker.
    lanes: Box<[Local<Lane>]>,
    /// Batches served so far, per client (see `free`).
    executed: RefCell<Box<[u64]>>,
    /// Batches parked for moved properties, and their records away (see `forward`).
    forwarding: forward::Forwarding,
    /// Dead properties waiting for requests still on their way (see `free`).
    pending_frees: RefCell<PendingFrees<serve::Dying>>,
    /// Its running totals for `stats`, published every `PUBLISH_ROUNDS`.
    totals: crate::stats::Totals,
    /// Whether the next batch served is sampled (see `stats`).
    sample_next: Cell<bool>,
    /// Scratch list of a sampled batch's records: type name, property, time.
    sampled: Cell<Vec<SampledRecord>>,
    /// Inline runs left before a request must take the channel (see `may_run_inline`).
    inline_budget: Cell<u32>,
    /// Callbacks of `apply_then` requests that ran inline, for the next round.
    callbacks: RefCell<RecordBuf<Callback>>,
    /// Answers awaited from trustees of other runtimes (see `lane`).
    foreign: RefCell<ForeignLanes>,
    /// Scratch list of clients answered in one serving round.
    answered: RefCell<Vec<usize>>,
    /// The injected work being run, swapped with the injector's queue so that neither list
    /// is allocated anew for each round (see `drain_injected`).
    injected: Cell<Vec<Injected>>,
    /// Deferred answers, as trustee and as client (see `replies`).
    replies: Replies,
    /// Its sleeping fibers' deadlines (see `timers`).
    timers: Timers,
    /// How long its idle spins may last (see `spin`).
    spin: Cell<SpinPolicy>,
    /// Set when a property moved away from this worker: its next idle wait parks without
    /// spinning (see `wait_for_work`).
    gave_work_away: Cell<bool>,
    tearing_down: Cell<bool>,
    /// The waker of each fiber slot's fiber, with its generation: made at the fiber's first
    /// wait and reused by the others (see `fiber::wait`).
    pub(crate) fiber_wakers: RefCell<Vec<Option<(u32, std::task::Waker)>>>,
    #[cfg(feature = "net")]
    reactor: crate::net::reactor::Reactor,
    /// Memory this worker checks for its fibers (`net::watch`).
    #[cfg(feature = "net")]
    pub(crate) watches: crate::net::watch::Watches,
}

/// Restores what the worker ran before when dropped.
pub(crate) struct RunningGuard<'a> {
    worker: &'a Worker,
    previous: Running,
}

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.worker.running.set(self.previous);
    }
}

/// Aborts if runtime code (not user code, whose panics are caught) unwinds through the loop.
struct AbortOnPanic;

impl Drop for AbortOnPanic {
    fn drop(&mut self) {
        eprintln!("trust: internal error: a worker loop panicked; aborting");
        std::process::abort();
    }
}

/// Body of a worker thread.
pub(crate) fn run(registry: Arc<Registry>, index: usize) {
    let clients = registry.clients;
    let lanes = (0..registry.workers)
        .map(|t| Local::new(Lane::new(registry.channel(index, t))))
        .collect();
    let worker = Worker {
        index,
        place: registry.serial << 32 | index as u64,
        is_trustee: registry.trustees.contains(&index),
        running: Cell::new(Running::Scheduler),
        sched: Local::new(Scheduler::default()),
        current: Cell::new(None),
        yielder: Cell::new(ptr::null()),
        lanes,
        executed: RefCell::new(vec![0; clients].into_boxed_slice()),
        forwarding: forward::Forwarding::new(clients),
        pending_frees: RefCell::new(PendingFrees::new()),
        totals: Default::default(),
        sample_next: Cell::new(false),
        sampled: Cell::new(Vec::new()),
        inline_budget: Cell::new(INLINE_BUDGET),
        callbacks: RefCell::new(RecordBuf::new()),
        foreign: RefCell::new(ForeignLanes::new(registry.clone(), index)),
        answered: RefCell::new(Vec::new()),
        injected: Cell::new(Vec::new()),
        replies: Replies::new(),
        timers: Timers::default(),
        spin: Cell::new(SpinPolicy::new(SpinSetting::new(
            registry.spin,
            DEFAULT_SPIN,
        ))),
        gave_work_away: Cell::new(false),
        tearing_down: Cell::new(false),
        fiber_wakers: RefCell::default(),
        registry,
        #[cfg(feature = "net")]
        reactor: crate::net::reactor::Reactor::new()
            .expect("trust: cannot create a worker's reactor"),
        #[cfg(feature = "net")]
        watches: Default::default(),
    };
    #[cfg(feature = "net")]
    {
        let unparker = worker.reactor.unparker();
        worker.registry.parkers[index].set_wake_hook(Box::new(move || unparker.unpark()));
    }
    #[cfg(feature = "net")]
    let _entered = crate::net::reactor::enter(&worker.reactor);
    CURRENT.with(|c| c.set(&worker));
    worker.counters().started();
    let guard = AbortOnPanic;
    worker.main_loop();
    worker.shutdown();
    std::mem::forget(guard);
    CURRENT.with(|c| c.set(ptr::null()));
}

impl Worker {
    pub(crate) fn running(&self) -> Running {
        self.running.get()
    }

    /// Switches what the worker runs until the guard drops.
    pub(crate) fn enter(&self, running: Running) -> RunningGuard<'_> {
        RunningGuard {
            worker: self,
            previous: self.running.replace(running),
        }
    }

    fn main_loop(&self) {
        let mut rounds = 0u32;
        loop {
            rounds = rounds.wrapping_add(1);
            #[allow(unused_mut)]
            let mut progress = self.round();
            // Readiness costs a system call: check it every few rounds, even when busy.
            #[cfg(feature = "net")]
            if rounds.is_multiple_of(REACTOR_ROUNDS) {
                progress |= self.poll_reactor();
            }
            if rounds.is_multiple_of(PUBLISH_ROUNDS) {
                self.publish_counts();
            }
            if self.registry.stopping.load(Ordering::Relaxed) {
                return;
            }
            if !progress {
                self.wait_for_work();
            }
        }
    }

    /// One pass over every source of work; returns whether anything was done.
    fn round(&self) -> bool {
        let mut progress = self.wake_due_timers();
        progress |= self.run_ready();
        #[cfg(feature = "net")]
        {
            progress |= self.watches.poll();
        }
        progress |= self.exchange();
        if self.is_trustee {
            progress |= self.serve();
            // Groups of moved properties' requests, rare: one load each when there are none.
            if self.registry.forwards[self.index].pending() {
                progress |= self.serve_groups();
            }
            if self.registry.returns[self.index].pending() {
                progress |= self.take_groups();
            }
            progress |= self.expire_due();
        }
        progress |= self.drain_injected();
        progress
    }

    /// Waits until some source of work has something: for as long as its spin policy allows
    /// (`spin`; fixed by `Builder::spin`) it checks [`Worker::has_work`] and polls its sockets
    /// without blocking, then parks (or blocks in the reactor), and tells the policy how the
    /// wait went. Kept out of line so that instruction counts (the `instructions` benchmark)
    /// can leave idle time out.
    ///
    /// The spin is bounded by time, not by rounds, so that its cost does not depend on the
    /// CPU, and it polls the sockets every `SPIN_POLL_INTERVAL`: a remote answer is a socket
    /// event, and one that arrives during the spin is taken without a wake-up. The clock read
    /// of each turn also measures the largest gap between turns, the policy's sign of a core
    /// shared with another thread.
    ///
    /// There is no phase of `sched_yield` between spinning and parking: a yield hands the
    /// core to a thread that computes without pause for its whole time slice (milliseconds),
    /// and a worker of a busy machine then notices its answers only between such slices (a
    /// rack test of 4 ranks ran 20 times slower beside one busy loop per core). A parked
    /// worker is woken by the answer itself, and the scheduler runs a thread that wakes
    /// promptly.
    #[inline(never)]
    fn wait_for_work(&self) {
        self.publish_counts();
        // The first poll comes one interval into the spin, not at its start: the worker has
        // just finished a round, so an answer is rarely back already, and a poll then is a
        // system call spent for nothing.
        #[cfg(feature = "net")]
        let mut polled = None;
        // Without `net` there is nothing to poll on the clock.
        #[cfg_attr(not(feature = "net"), allow(unused_variables))]
        let ready = |now: Instant| {
            #[cfg(feature = "net")]
            {
                let since = *polled.get_or_insert(now);
                if now - since >= SPIN_POLL_INTERVAL {
                    polled = Some(now);
                    if self.poll_reactor() {
                        return true;
                    }
                }
                if self.watches.poll() {
                    return true;
                }
            }
            self.has_work()
        };
        if self.gave_work_away.replace(false) {
            // A property just moved away from here: its clients now call the new home, which
            // was likely asleep and needs a core. A spin here would hold one while the new
            // home, its clients and this worker contend for them (on 2 cores, the calls
            // during frequent moves slowed tenfold at p99). The policy learns nothing here.
            let parked = Instant::now();
            self.sleep();
            self.counters().waited(Duration::ZERO, parked.elapsed());
            return;
        }
        let mut policy = self.spin.get();
        let (spun, slept) = spin::wait(&mut policy, ready, || self.sleep());
        self.spin.set(policy);
        self.counters().waited(spun, slept);
    }

    /// Publishes this worker's running totals (see `stats`).
    fn publish_counts(&self) {
        let (ready, alive) = self.sched.with(|s| (s.ready_len(), s.alive()));
        self.counters().publish(&self.totals, ready, alive);
    }

    /// Counts a request run without a batch.
    pub(crate) fn ran_inline(&self) {
        let inline = &self.totals.inline;
        inline.set(inline.get() + 1);
    }

    /// This worker's counters (see `stats`).
    #[inline(always)]
    pub(crate) fn counters(&self) -> &WorkerCounters {
        &self.registry.counters[self.index]
    }

    /// Wakes the fibers whose sockets are ready, without waiting; returns whether any were.
    #[cfg(feature = "net")]
    fn poll_reactor(&self) -> bool {
        self.reactor.has_registrations() && self.reactor.poll(Some(Duration::ZERO)).unwrap_or(false)
    }

    fn drain_injected(&self) -> bool {
        let injector = self.registry.injector(self.index);
        if !injector.pending() {
            return false;
        }
        let mut items = self.injected.take();
        injector.swap(&mut items);
        let ran = !items.is_empty();
        for item in items.drain(..) {
            match item {
                Injected::Spawn(body) => self.spawn_local(body),
                Injected::Wake(id) => self.wake(id),
                Injected::Run(f) => f(),
                Injected::Call(request) => request.run(),
                Injected::Free(property) => self.free_later(property),
                Injected::ForeignAnswers => self.deliver_foreign(),
                Injected::Late(late) => self.late_arrived(late),
            }
        }
        self.injected.set(items);
        ran
    }

    fn sleep(&self) {
        let parker = &self.registry.parkers[self.index];
        parker.prepare();
        if self.has_work() {
            parker.cancel();
            return;
        }
        // A watch that saw its memory change has woken a fiber instead of arming its socket.
        #[cfg(feature = "net")]
        if self.watches.before_sleep() {
            parker.cancel();
            return;
        }
        let now = Instant::now();
        self.counters()
            .falls_asleep(now.saturating_duration_since(self.registry.started));
        // A waiting deferred request's deadline, or a sleeping fiber's, ends the sleep.
        let timeout = self
            .next_wakeup()
            .map(|at| at.saturating_duration_since(now));
        #[cfg(feature = "net")]
        if self.reactor.has_registrations() {
            // Returns on I/O readiness (waking fibers) or on `Parker::wake`'s unpark.
            let _ = self.reactor.poll(timeout);
            parker.cancel();
            return;
        }
        match timeout {
            Some(timeout) => parker.park_timeout(timeout),
            None => parker.park(),
        }
    }

    /// The earliest time something is due: a deferred request's deadline or a fiber's wake-up.
    fn next_wakeup(&self) -> Option<Instant> {
        let due = match (self.next_deadline(), self.next_timer()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if self.pending_frees.borrow().is_empty() {
            return due;
        }
        // A dead property that has moved may wait for lanes to other trustees, whose answers
        // wake their clients, not this worker: look again soon (see `free`).
        let recheck = Instant::now() + FREE_RECHECK;
        Some(due.map_or(recheck, |due| due.min(recheck)))
    }

    /// Whether any source of work has something: checked after `Parker::prepare`, and by
    /// `fiber::yield_if_busy`.
    pub(crate) fn has_work(&self) -> bool {
        let registry = &self.registry;
        if registry.stopping.load(Ordering::Relaxed)
            || self.sched.with(|s| s.has_ready())
            || !self.callbacks.borrow().is_empty()
            || registry.injector(self.index).pending()
            || self.next_wakeup().is_some_and(|at| at <= Instant::now())
        {
            return true;
        }
        if registry
            .trustees
            .iter()
            .any(|&t| self.lanes[t].with(|lane| lane.has_work()))
        {
            return true;
        }
        self.is_trustee
            && (registry.forwards[self.index].pending()
                || registry.returns[self.index].pending()
                || registry.active_clients().any(|c| {
                    registry.channel(c, self.index).has_request() && !self.forwarding.is_parked(c)
                }))
    }

    /// Whether this worker has left its loop for good; its fibers are then being unwound, and
    /// fiber bodies let the unwind pass instead of catching it.
    pub(crate) fn tearing_down(&self) -> bool {
        self.tearing_down.get()
    }
}
