//! Workers: one OS thread each, running one loop:
//!
//! 1. run the fibers that are ready, each until it blocks or yields;
//! 2. as a client: take the answers of finished batches (waking fibers, running `then`
//!    callbacks) and publish the requests its fibers staged since, one batch per trustee;
//! 3. as a trustee: serve every channel that holds a new batch;
//! 4. take work injected by other threads (spawns, wake-ups, frees);
//! 5. with nothing to do, spin briefly, then yield the core a while, then park until a client
//!    or trustee wakes it.
//!
//! A worker owns its fibers, their stacks and its client-side lanes; none of these ever leave
//! its thread. Everything that crosses threads goes through a [`Channel`] or an [`Injector`].

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use corosensei::stack::{DefaultStack, Stack};
use corosensei::{Coroutine, CoroutineResult, Yielder};

use crate::channel::{Channel, REQUEST_WORDS, RESPONSE_WORDS, ResponseReader, ResponseWriter};
use crate::record::{self, RecordBuf};
use crate::runtime::Shared;

/// Checks for work an idle worker spins for before it starts yielding its core.
const SPIN_ROUNDS: u32 = 100;
/// Checks for work an idle worker yields its core (`sched_yield`) between before it parks.
const YIELD_ROUNDS: u32 = 50;
/// Fibers a trustee worker runs between two serving passes.
const SERVE_EVERY: usize = 8;
/// Requests a worker runs inline for its own trustee before one takes the channel.
const INLINE_BUDGET: u32 = 64;
/// Loop rounds (or idle checks) between two non-blocking polls of the worker's I/O reactor.
#[cfg(feature = "net")]
const REACTOR_ROUNDS: u32 = 16;
/// Fiber stacks kept for reuse per worker.
const STACK_POOL: usize = 256;

/// Message shown when a blocking call happens where blocking is not allowed.
pub(crate) const BLOCKING_IN_DELEGATED: &str = "blocking call (apply, join, launch or Latch wait) in delegated context \
     (inside a delegated closure or an apply_then callback): a trustee must never block; \
     use apply_then to delegate without waiting, or launch to run blocking code in a trustee-side fiber";

/// Runs a request with a response writer, or (with `None`) drops it unexecuted.
pub(crate) type RunFn =
    unsafe fn(payload: *mut u8, property: *const (), out: Option<&mut ResponseWriter>);
/// Consumes a request's answer; with `run == false` it only drops what it owns.
pub(crate) type CompleteFn = unsafe fn(payload: *mut u8, answers: &mut ResponseReader, run: bool);

/// Header of a request record.
#[derive(Clone, Copy)]
pub(crate) struct Request {
    pub(crate) run: RunFn,
    pub(crate) property: *const (),
    pub(crate) response_words: u32,
}

/// Header of a completion record.
#[derive(Clone, Copy)]
pub(crate) struct Completion {
    pub(crate) complete: CompleteFn,
}

/// Header of a deferred callback record.
#[derive(Clone, Copy)]
struct Callback {
    run: unsafe fn(payload: *mut u8, run: bool),
}

/// A property whose last trust is gone, with the function that drops and frees it.
pub(crate) struct DeadProperty {
    pub(crate) ptr: *const (),
    pub(crate) free: unsafe fn(*const ()),
}

// SAFETY: the property's type is `Send` (required by `entrust`), and a dead property has no
// other owner, so it may be freed on any thread.
unsafe impl Send for DeadProperty {}

impl DeadProperty {
    /// Drops and frees the property now.
    ///
    /// # Safety
    /// No request that uses the property runs or will run.
    pub(crate) unsafe fn free(self) {
        // SAFETY: per the caller.
        unsafe { (self.free)(self.ptr) }
    }
}

/// Work other threads hand to a worker.
pub(crate) enum Injected {
    /// Start a fiber.
    Spawn(Box<dyn FnOnce() + Send>),
    /// Make a blocked fiber ready.
    Wake(FiberId),
    /// Run a short non-blocking function in the worker's loop.
    Run(Box<dyn FnOnce() + Send>),
    /// Drop a property whose last trust was dropped outside the runtime.
    Free(DeadProperty),
}

impl Injected {
    /// Disposes of an item that can no longer run because the runtime has closed.
    fn discard(self) {
        if let Injected::Free(p) = self {
            // SAFETY: the runtime is closed: no request runs any more.
            unsafe { p.free() }
        }
    }
}

/// A worker's queue of injected work (a lock, since it is off the hot path).
pub(crate) struct Injector {
    queue: Mutex<Vec<Injected>>,
    pending: AtomicBool,
}

impl Injector {
    pub(crate) fn new() -> Self {
        Injector {
            queue: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
        }
    }

    /// Hands `item` to worker `worker` and wakes it. Once the runtime has closed, the item is
    /// disposed of here instead (a free runs at once, a spawn is dropped).
    pub(crate) fn push(&self, shared: &Shared, worker: usize, item: Injected) {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if shared.closed.load(Ordering::Acquire) {
            drop(queue);
            item.discard();
            return;
        }
        queue.push(item);
        self.pending.store(true, Ordering::Release);
        drop(queue);
        shared.parkers[worker].wake();
    }

    fn pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    fn take(&self) -> Vec<Injected> {
        if !self.pending() {
            return Vec::new();
        }
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        self.pending.store(false, Ordering::Relaxed);
        std::mem::take(&mut *queue)
    }
}

/// What the code running on a worker thread is allowed to do.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Context {
    /// The worker loop itself, including `then` callbacks: must not block.
    Scheduler,
    /// A fiber: may block (the fiber suspends).
    Fiber,
    /// A delegated closure on a trustee: must not block.
    Delegated,
}

/// Identifies a fiber on its worker; the generation makes stale wake-ups harmless.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FiberId {
    index: u32,
    generation: u32,
}

type Fiber = Coroutine<(), (), (), DefaultStack>;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FiberState {
    Free,
    Ready,
    Running,
    /// Running, and woken before it blocked: its next `block` returns at once.
    Notified,
    Blocked,
}

struct FiberSlot {
    fiber: Option<Fiber>,
    /// The guard page below the fiber's stack, for the overflow report.
    guard: (usize, usize),
    yielder: *const Yielder<(), ()>,
    generation: u32,
    state: FiberState,
}

#[derive(Default)]
struct Scheduler {
    ready: VecDeque<FiberId>,
    fibers: Vec<FiberSlot>,
    free_slots: Vec<u32>,
    stacks: Vec<DefaultStack>,
}

/// Requests staged for one trustee that together fit one slot, with their completions in the
/// same order.
struct Batch {
    requests: RecordBuf<Request>,
    completions: RecordBuf<Completion>,
    response_words: usize,
}

impl Batch {
    fn new() -> Self {
        Batch {
            requests: RecordBuf::with_capacity(REQUEST_WORDS),
            completions: RecordBuf::with_capacity(REQUEST_WORDS),
            response_words: 0,
        }
    }

    fn fits(&self, words: usize, answer_words: usize) -> bool {
        self.requests.word_len() + words <= REQUEST_WORDS
            && self.response_words + answer_words <= RESPONSE_WORDS
    }
}

/// A client's state towards one trustee.
struct Lane {
    /// The channel to this trustee (it lives in `Shared`, which outlives the worker).
    channel: *const Channel,
    /// The batch new requests go into.
    open: Batch,
    /// Full batches waiting for the channel, oldest first (all older than `open`).
    full: VecDeque<Batch>,
    /// The published batch (its requests moved to the slot; its completions wait here).
    inflight: Option<Batch>,
    /// Drained batches kept for their buffers' capacity.
    spare: Vec<Batch>,
}

impl Lane {
    fn channel(&self) -> &Channel {
        // SAFETY: the channel lives in `Shared`, which the worker keeps alive.
        unsafe { &*self.channel }
    }

    fn has_staged(&self) -> bool {
        !self.full.is_empty() || !self.open.requests.is_empty()
    }
}

/// Drained batches a lane keeps for reuse.
const SPARE_BATCHES: usize = 4;

struct Deferred {
    /// Requests staged by each client when the property died.
    staged: Box<[u64]>,
    property: DeadProperty,
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

/// The worker running on this thread, if it belongs to `shared`'s runtime.
#[inline]
pub(crate) fn current_on(shared: &Shared) -> Option<&'static Worker> {
    current().filter(|w| ptr::eq(&*w.shared, shared))
}

pub(crate) fn current_shared() -> Option<Arc<Shared>> {
    current().map(|w| w.shared.clone())
}

pub(crate) fn on_any_worker() -> bool {
    current().is_some()
}

/// One worker's thread-local state.
pub(crate) struct Worker {
    pub(crate) index: usize,
    pub(crate) shared: Arc<Shared>,
    is_trustee: bool,
    context: Cell<Context>,
    sched: RefCell<Scheduler>,
    current: Cell<Option<FiberId>>,
    yielder: Cell<*const Yielder<(), ()>>,
    /// Indexed by trustee worker.
    lanes: Box<[RefCell<Lane>]>,
    /// Requests served so far, per client.
    executed: Box<[Cell<u64>]>,
    deferred: RefCell<Vec<Deferred>>,
    /// Inline runs left before a request must take the channel (see `may_run_inline`).
    inline_budget: Cell<u32>,
    /// Callbacks of `apply_then` requests that ran inline, for the next round.
    callbacks: RefCell<RecordBuf<Callback>>,
    /// Scratch list of clients answered in one serving round.
    answered: RefCell<Vec<usize>>,
    tearing_down: Cell<bool>,
    #[cfg(feature = "net")]
    reactor: crate::net::Reactor,
}

/// Restores the previous context when dropped.
pub(crate) struct ContextGuard<'a> {
    worker: &'a Worker,
    previous: Context,
}

impl Drop for ContextGuard<'_> {
    fn drop(&mut self) {
        self.worker.context.set(self.previous);
    }
}

/// Aborts if runtime code (not user code, whose panics are caught) unwinds through the loop.
struct AbortOnPanic;

impl Drop for AbortOnPanic {
    fn drop(&mut self) {
        eprintln!("gossamer: internal error: a worker loop panicked; aborting");
        std::process::abort();
    }
}

/// Body of a worker thread.
pub(crate) fn run(shared: Arc<Shared>, index: usize) {
    let clients = shared.clients;
    let lanes = (0..shared.workers)
        .map(|trustee| {
            RefCell::new(Lane {
                channel: shared.channel(index, trustee),
                open: Batch::new(),
                full: VecDeque::new(),
                inflight: None,
                spare: Vec::new(),
            })
        })
        .collect();
    let worker = Worker {
        index,
        is_trustee: shared.trustees.contains(&index),
        shared,
        context: Cell::new(Context::Scheduler),
        sched: RefCell::new(Scheduler::default()),
        current: Cell::new(None),
        yielder: Cell::new(ptr::null()),
        lanes,
        executed: (0..clients).map(|_| Cell::new(0)).collect(),
        deferred: RefCell::new(Vec::new()),
        inline_budget: Cell::new(INLINE_BUDGET),
        callbacks: RefCell::new(RecordBuf::new()),
        answered: RefCell::new(Vec::new()),
        tearing_down: Cell::new(false),
        #[cfg(feature = "net")]
        reactor: crate::net::Reactor::new().expect("gossamer: cannot create a worker's reactor"),
    };
    #[cfg(feature = "net")]
    let _ = worker.shared.parkers[index]
        .unparker
        .set(worker.reactor.unparker());
    #[cfg(feature = "net")]
    let _entered = crate::net::enter(&worker.reactor);
    CURRENT.with(|c| c.set(&worker));
    let guard = AbortOnPanic;
    worker.main_loop();
    worker.shutdown();
    std::mem::forget(guard);
    CURRENT.with(|c| c.set(ptr::null()));
}

impl Worker {
    pub(crate) fn context(&self) -> Context {
        self.context.get()
    }

    /// Switches the context until the guard drops.
    pub(crate) fn enter(&self, context: Context) -> ContextGuard<'_> {
        ContextGuard {
            worker: self,
            previous: self.context.replace(context),
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
            if self.shared.stopping.load(Ordering::Relaxed) {
                return;
            }
            if !progress {
                self.wait_for_work();
            }
        }
    }

    /// One pass over every source of work; returns whether anything was done.
    fn round(&self) -> bool {
        let mut progress = self.run_ready();
        progress |= self.exchange();
        if self.is_trustee {
            progress |= self.serve();
        }
        progress |= self.drain_injected();
        progress
    }

    /// Waits until some source of work has something: spins on the cheap checks of
    /// [`Worker::has_work`], then yields the core a while, then parks. Kept out of line so
    /// that instruction counts (`gsm bench instructions`) can leave idle time out.
    #[inline(never)]
    fn wait_for_work(&self) {
        for spin in 0..SPIN_ROUNDS + YIELD_ROUNDS {
            #[cfg(feature = "net")]
            if spin.is_multiple_of(REACTOR_ROUNDS) && self.poll_reactor() {
                return;
            }
            if self.has_work() {
                return;
            }
            if spin < SPIN_ROUNDS {
                std::hint::spin_loop();
            } else {
                // Let a thread that shares this core run: when workers outnumber free cores,
                // the answer we wait for may come from it.
                std::thread::yield_now();
            }
        }
        self.sleep();
    }

    /// Wakes the fibers whose sockets are ready, without waiting; returns whether any were.
    #[cfg(feature = "net")]
    fn poll_reactor(&self) -> bool {
        self.reactor.has_registrations()
            && self
                .reactor
                .poll(Some(std::time::Duration::ZERO))
                .unwrap_or(false)
    }

    // ----- fibers -----

    /// Starts a fiber on this worker.
    pub(crate) fn spawn_local(&self, body: Box<dyn FnOnce() + 'static>) {
        let stack = self.sched.borrow_mut().stacks.pop();
        let stack = match stack {
            Some(stack) => stack,
            None => DefaultStack::new(self.shared.stack_size)
                .unwrap_or_else(|e| panic!("gossamer: cannot allocate a fiber stack: {e}")),
        };
        let mut sched = self.sched.borrow_mut();
        let index = match sched.free_slots.pop() {
            Some(i) => i,
            None => {
                sched.fibers.push(FiberSlot {
                    fiber: None,
                    guard: (0, 0),
                    yielder: ptr::null(),
                    generation: 0,
                    state: FiberState::Free,
                });
                (sched.fibers.len() - 1) as u32
            }
        };
        let guard = crate::overflow::guard_page(stack.limit().get());
        let fiber = Fiber::with_stack(stack, move |yielder: &Yielder<(), ()>, ()| {
            let w = current().expect("fiber resumed outside its worker");
            w.yielder.set(yielder);
            w.sched.borrow_mut().fibers[index as usize].yielder = yielder;
            body();
        });
        let slot = &mut sched.fibers[index as usize];
        slot.fiber = Some(fiber);
        slot.guard = guard;
        slot.state = FiberState::Ready;
        let id = FiberId {
            index,
            generation: slot.generation,
        };
        sched.ready.push_back(id);
    }

    fn run_ready(&self) -> bool {
        let n = self.sched.borrow().ready.len();
        for ran in 0..n {
            if self.is_trustee && ran > 0 && ran % SERVE_EVERY == 0 {
                // Other clients' requests should not wait for every local fiber to run.
                self.serve();
            }
            let (id, mut fiber, yielder) = {
                let mut sched = self.sched.borrow_mut();
                let Some(id) = sched.ready.pop_front() else {
                    break;
                };
                let slot = &mut sched.fibers[id.index as usize];
                if slot.generation != id.generation || slot.state != FiberState::Ready {
                    continue;
                }
                slot.state = FiberState::Running;
                crate::overflow::set_running(Some(slot.guard));
                (
                    id,
                    slot.fiber.take().expect("ready fiber without a coroutine"),
                    slot.yielder,
                )
            };
            self.current.set(Some(id));
            self.yielder.set(yielder);
            let result = {
                let _fiber = self.enter(Context::Fiber);
                fiber.resume(())
            };
            crate::overflow::set_running(None);
            self.current.set(None);
            let mut sched = self.sched.borrow_mut();
            match result {
                CoroutineResult::Yield(()) => sched.fibers[id.index as usize].fiber = Some(fiber),
                CoroutineResult::Return(()) => {
                    let slot = &mut sched.fibers[id.index as usize];
                    slot.state = FiberState::Free;
                    slot.generation = slot.generation.wrapping_add(1);
                    slot.yielder = ptr::null();
                    sched.free_slots.push(id.index);
                    if sched.stacks.len() < STACK_POOL {
                        sched.stacks.push(fiber.into_stack());
                    }
                }
            }
        }
        n > 0
    }

    /// The fiber running now.
    ///
    /// # Panics
    /// Outside a fiber.
    pub(crate) fn current_fiber(&self) -> FiberId {
        self.current.get().expect("not inside a fiber")
    }

    fn suspend(&self) {
        let yielder = self.yielder.get();
        debug_assert!(!yielder.is_null());
        // SAFETY: `yielder` belongs to the running fiber (set by `run_ready` before resuming
        // it, or by the fiber itself on its first run) and lives on that fiber's stack.
        unsafe { (*yielder).suspend(()) };
    }

    /// Suspends the current fiber until [`Worker::wake`]. May return early; callers re-check
    /// their condition in a loop.
    pub(crate) fn block(&self) {
        debug_assert_eq!(self.context.get(), Context::Fiber);
        let id = self.current_fiber();
        {
            let mut sched = self.sched.borrow_mut();
            let slot = &mut sched.fibers[id.index as usize];
            if slot.state == FiberState::Notified {
                slot.state = FiberState::Running;
                return;
            }
            slot.state = FiberState::Blocked;
        }
        self.suspend();
    }

    /// Lets the other ready fibers run.
    pub(crate) fn yield_now(&self) {
        let id = self.current_fiber();
        {
            let mut sched = self.sched.borrow_mut();
            sched.fibers[id.index as usize].state = FiberState::Ready;
            sched.ready.push_back(id);
        }
        self.suspend();
    }

    /// Makes fiber `id` of this worker ready if it is blocked.
    pub(crate) fn wake(&self, id: FiberId) {
        let mut sched = self.sched.borrow_mut();
        let Some(slot) = sched.fibers.get_mut(id.index as usize) else {
            return;
        };
        if slot.generation != id.generation {
            return;
        }
        match slot.state {
            FiberState::Blocked => {
                slot.state = FiberState::Ready;
                sched.ready.push_back(id);
            }
            FiberState::Running => slot.state = FiberState::Notified,
            FiberState::Ready | FiberState::Notified | FiberState::Free => {}
        }
    }

    // ----- client side -----

    /// Stages request `f` for `trustee`, with completion `done` run when it is answered.
    pub(crate) fn stage<F, D>(
        &self,
        trustee: usize,
        request: Request,
        f: F,
        completion: Completion,
        done: D,
    ) {
        const { assert!(record::record_words::<Request, [u8; record::MAX_INLINE]>() <= REQUEST_WORDS) };
        if self.tearing_down.get() {
            // Only destructors run at shutdown get here; nothing will be published again.
            let mut batch = Batch::new();
            batch.requests.push(request, f);
            batch.completions.push(completion, done);
            discard(batch);
            return;
        }
        let words = record::record_words::<Request, F>();
        let answer_words = request.response_words as usize;
        let mut lane = self.lanes[trustee].borrow_mut();
        let lane = &mut *lane;
        if !lane.open.fits(words, answer_words) {
            let fresh = lane.spare.pop().unwrap_or_else(Batch::new);
            lane.full
                .push_back(std::mem::replace(&mut lane.open, fresh));
        }
        lane.open.requests.push(request, f);
        lane.open.completions.push(completion, done);
        lane.open.response_words += answer_words;
        lane.channel().add_staged(1);
    }

    /// Full batches waiting for the channel to `trustee`.
    pub(crate) fn backlog(&self, trustee: usize) -> usize {
        self.lanes[trustee].borrow().full.len()
    }

    /// Whether a request for this worker's own trustee may run inline, right now, in the
    /// caller: nothing from this worker is staged or in flight to its trustee (so it cannot
    /// overtake an earlier one), and the inline budget is not spent. The budget makes every
    /// `INLINE_BUDGET`-th request take the channel, so a fiber that delegates in a loop still
    /// lets its worker serve other clients.
    pub(crate) fn may_run_inline(&self) -> bool {
        let lane = self.lanes[self.index].borrow();
        if lane.inflight.is_some() || lane.has_staged() {
            return false;
        }
        let left = self.inline_budget.get();
        if left == 0 {
            self.inline_budget.set(INLINE_BUDGET);
            return false;
        }
        self.inline_budget.set(left - 1);
        true
    }

    /// Queues `callback` to run in this worker's next round (for an `apply_then` whose
    /// closure ran inline).
    pub(crate) fn defer_callback<C: FnOnce()>(&self, callback: C) {
        unsafe fn run<C: FnOnce()>(payload: *mut u8, run: bool) {
            // SAFETY: pushed with a `C` payload by `defer_callback`.
            let callback = unsafe { record::take::<C>(payload) };
            if run {
                let w = current().expect("callback outside its worker");
                if let Err(panic) = catch_unwind(AssertUnwindSafe(callback)) {
                    w.shared.unhandled_panic(panic);
                }
            }
        }
        self.callbacks
            .borrow_mut()
            .push(Callback { run: run::<C> }, callback);
    }

    /// Runs the deferred callbacks (`run == false`: drops them).
    fn run_callbacks(&self, run: bool) -> bool {
        if self.callbacks.borrow().is_empty() {
            return false;
        }
        let mut callbacks = std::mem::replace(&mut *self.callbacks.borrow_mut(), RecordBuf::new());
        while let Some((callback, payload, total)) = callbacks.front() {
            // SAFETY: each record was pushed by `defer_callback` with a payload `run` consumes.
            unsafe { (callback.run)(payload, run) };
            callbacks.pop_consumed(total);
        }
        let mut slot = self.callbacks.borrow_mut();
        if slot.is_empty() {
            *slot = callbacks; // keep the capacity
        }
        true
    }

    /// Takes finished answers and publishes staged requests, for every trustee.
    fn exchange(&self) -> bool {
        let mut progress = self.run_callbacks(true);
        for &t in &self.shared.trustees {
            progress |= self.take_answers(t);
            progress |= self.publish(t);
        }
        progress
    }

    fn take_answers(&self, trustee: usize) -> bool {
        let channel = self.shared.channel(self.index, trustee);
        let mut batch = {
            let mut lane = self.lanes[trustee].borrow_mut();
            if lane.inflight.is_none() || !channel.answered() {
                return false;
            }
            lane.inflight.take().expect("checked above")
        };
        // SAFETY: the batch is answered and was in flight, so its answers are taken once.
        // Completions may run `then` callbacks, which may stage more requests: no lane is
        // borrowed while they run.
        unsafe {
            channel.take_answers(|answers| drain_completions(&mut batch.completions, answers, true))
        };
        let mut lane = self.lanes[trustee].borrow_mut();
        if lane.spare.len() < SPARE_BATCHES {
            batch.response_words = 0;
            lane.spare.push(batch);
        }
        true
    }

    fn publish(&self, trustee: usize) -> bool {
        let mut lane = self.lanes[trustee].borrow_mut();
        let lane = &mut *lane;
        if lane.inflight.is_some() {
            return false;
        }
        let mut batch = match lane.full.pop_front() {
            Some(batch) => batch,
            None if !lane.open.requests.is_empty() => {
                let fresh = lane.spare.pop().unwrap_or_else(Batch::new);
                std::mem::replace(&mut lane.open, fresh)
            }
            None => return false,
        };
        // SAFETY: the channel is idle: nothing is in flight, so the last batch was answered and
        // its answers taken. The batch fits a slot (see `stage`); its payloads move to the
        // channel, so the buffer forgets them.
        unsafe {
            lane.channel()
                .publish(batch.requests.as_words(), batch.requests.word_len())
        };
        batch.requests.forget_all();
        lane.inflight = Some(batch);
        self.shared.parkers[trustee].wake();
        true
    }

    // ----- trustee side -----

    fn serve(&self) -> bool {
        let mut answered = self.answered.borrow_mut();
        answered.clear();
        for client in self.shared.active_clients() {
            let channel = self.shared.channel(client, self.index);
            let executed = &self.executed[client];
            // SAFETY: this worker is the only trustee of `channel`; every record's payload is
            // consumed by its run trampoline, which catches panics of the closure it runs.
            let served = unsafe {
                channel.serve(|words, len, out| {
                    let _delegated = self.enter(Context::Delegated);
                    record::for_each_raw::<Request>(words, len, |request, payload| {
                        executed.set(executed.get() + 1);
                        (request.run)(payload, request.property, Some(out))
                    });
                })
            };
            if served {
                answered.push(client);
            }
        }
        for &client in answered.iter() {
            self.shared.parkers[client].wake();
        }
        drop(answered);
        if !self.deferred.borrow().is_empty() {
            self.free_deferred();
        }
        !self.answered.borrow().is_empty()
    }

    /// Frees a property whose last trust is gone, once every request staged for it has run.
    ///
    /// A request can still be on its way: staged by one worker with `apply_then` before its
    /// trust moved to another worker and dropped there. Every such request was counted in its
    /// channel's `staged` before the drop that led here (happens-before through the trust's
    /// count and the channel hand-over), so waiting until each client's `executed` count
    /// reaches its `staged` count at this moment is enough.
    pub(crate) fn free_later(&self, property: DeadProperty) {
        let caught_up = (0..self.shared.clients)
            .all(|c| self.shared.channel(c, self.index).staged() <= self.executed[c].get());
        if caught_up {
            self.free_now(property);
        } else {
            let staged = (0..self.shared.clients)
                .map(|c| self.shared.channel(c, self.index).staged())
                .collect();
            self.deferred
                .borrow_mut()
                .push(Deferred { staged, property });
        }
    }

    fn free_deferred(&self) {
        let ready: Vec<DeadProperty> = {
            let mut deferred = self.deferred.borrow_mut();
            let mut ready = Vec::new();
            let mut i = 0;
            while i < deferred.len() {
                if deferred[i]
                    .staged
                    .iter()
                    .zip(self.executed.iter())
                    .all(|(s, e)| *s <= e.get())
                {
                    ready.push(deferred.swap_remove(i).property);
                } else {
                    i += 1;
                }
            }
            ready
        };
        for property in ready {
            self.free_now(property);
        }
    }

    fn free_now(&self, property: DeadProperty) {
        let _delegated = self.enter(Context::Delegated);
        // SAFETY: every request staged for the property has run (see `free_later`), or the
        // runtime is closed.
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| unsafe { property.free() })) {
            self.shared.unhandled_panic(panic);
        }
    }

    // ----- injected work and sleep -----

    fn drain_injected(&self) -> bool {
        let items = self.shared.injected[self.index].take();
        if items.is_empty() {
            return false;
        }
        for item in items {
            match item {
                Injected::Spawn(body) => self.spawn_local(body),
                Injected::Wake(id) => self.wake(id),
                Injected::Run(f) => f(),
                Injected::Free(property) => self.free_later(property),
            }
        }
        true
    }

    fn sleep(&self) {
        let parker = &self.shared.parkers[self.index];
        parker.prepare();
        if self.has_work() {
            parker.cancel();
            return;
        }
        #[cfg(feature = "net")]
        if self.reactor.has_registrations() {
            // Returns on I/O readiness (waking fibers) or on `Parker::wake`'s unpark.
            let _ = self.reactor.poll(None);
            parker.cancel();
            return;
        }
        parker.park();
    }

    /// Whether any source of work has something (checked after `Parker::prepare`).
    fn has_work(&self) -> bool {
        let shared = &self.shared;
        if shared.stopping.load(Ordering::Relaxed)
            || !self.sched.borrow().ready.is_empty()
            || !self.callbacks.borrow().is_empty()
            || shared.injected[self.index].pending()
        {
            return true;
        }
        for &t in &shared.trustees {
            let lane = self.lanes[t].borrow();
            let waiting = match lane.inflight {
                Some(_) => lane.channel().answered(),
                None => lane.has_staged(),
            };
            if waiting {
                return true;
            }
        }
        self.is_trustee
            && shared
                .active_clients()
                .any(|c| shared.channel(c, self.index).has_request())
    }

    // ----- shutdown -----

    /// Runs after every worker left its loop. Three phases, separated by barriers so that no
    /// channel is touched by both sides at once:
    /// 1. trustees drop the requests of unanswered batches and answer them as cancelled, and
    ///    free the properties they were waiting to free;
    /// 2. clients drop staged requests and all completions without running callbacks, and
    ///    dispose of injected work;
    /// 3. every worker unwinds its fibers (running their destructors) on its own thread.
    fn shutdown(&self) {
        let shared = &self.shared;
        // From here on nothing staged would ever be published: `stage` drops at once.
        self.tearing_down.set(true);
        shared.barrier.wait();
        if self.index == 0 {
            shared.closed.store(true, Ordering::SeqCst);
        }
        shared.barrier.wait();
        if self.is_trustee {
            for client in 0..shared.clients {
                // SAFETY: every worker has left its loop, so no client publishes and no other
                // trustee serves this channel; the records are requests.
                unsafe {
                    shared
                        .channel(client, self.index)
                        .cancel(|words, len| drop_raw_requests(words, len))
                };
            }
            for deferred in self.deferred.take() {
                self.free_now(deferred.property);
            }
        }
        shared.barrier.wait();
        for parker in shared.parkers.iter().skip(shared.workers) {
            parker.wake();
        }
        for &t in &shared.trustees {
            let (open, full, inflight) = {
                let mut lane = self.lanes[t].borrow_mut();
                (
                    std::mem::replace(&mut lane.open, Batch::new()),
                    std::mem::take(&mut lane.full),
                    lane.inflight.take(),
                )
            };
            full.into_iter().for_each(discard);
            discard(open);
            if let Some(mut batch) = inflight {
                // SAFETY: phase 1 answered or cancelled every batch.
                unsafe {
                    shared
                        .channel(self.index, t)
                        .take_answers(|a| drain_completions(&mut batch.completions, a, false))
                };
            }
        }
        self.run_callbacks(false);
        for item in shared.injected[self.index].take() {
            item.discard();
        }
        shared.barrier.wait();
        let fibers: Vec<Fiber> = {
            let mut sched = self.sched.borrow_mut();
            sched.ready.clear();
            sched
                .fibers
                .iter_mut()
                .filter_map(|slot| slot.fiber.take())
                .collect()
        };
        // Dropping a suspended coroutine unwinds its stack on this thread.
        drop(fibers);
    }

    /// Whether this worker has left its loop for good; its fibers are then being unwound, and
    /// fiber bodies let the unwind pass instead of catching it.
    pub(crate) fn tearing_down(&self) -> bool {
        self.tearing_down.get()
    }
}

/// Runs the completions of a batch in order against its answers.
pub(crate) fn drain_completions(
    done: &mut RecordBuf<Completion>,
    answers: &mut ResponseReader,
    run: bool,
) {
    while let Some((completion, payload, total)) = done.front() {
        // SAFETY: each completion record was pushed with a payload its function consumes, and
        // the answers are those of the requests staged alongside, in order.
        unsafe { (completion.complete)(payload, answers, run) };
        done.pop_consumed(total);
    }
}

/// Drops a staged batch without running it: its requests, then its completions.
fn discard(mut batch: Batch) {
    while let Some((request, payload, total)) = batch.requests.front() {
        // SAFETY: each record was pushed as a request whose trampoline consumes its payload.
        unsafe { (request.run)(payload, request.property, None) };
        batch.requests.pop_consumed(total);
    }
    drain_completions(
        &mut batch.completions,
        &mut ResponseReader::cancelled(),
        false,
    );
}

/// Drops the requests of a batch in a slot without running them.
///
/// # Safety
/// `words` holds `len` words of request records whose payloads the caller owns.
pub(crate) unsafe fn drop_raw_requests(words: *mut u64, len: usize) {
    // SAFETY: per the caller; each trampoline consumes its payload in drop mode.
    unsafe { record::for_each_raw::<Request>(words, len, |r, p| (r.run)(p, r.property, None)) }
}
