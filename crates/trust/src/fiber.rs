//! Fibers as the application sees them: `spawn`, `JoinHandle`, `yield_now`, and [`wait`], the
//! one way the runtime blocks on a future — by suspending the current fiber on a worker, or
//! by parking the thread anywhere else.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

use crate::inject::{FiberId, Injected};
use crate::registry::Registry;
use crate::request::Panic;
use crate::worker::{self, BLOCKING_IN_DELEGATED, Running};

/// Starts a fiber on the current worker.
///
/// # Panics
/// When called from a thread that is not a runtime worker (use [`Handle::spawn`](crate::Handle::spawn)).
///
/// ```
/// let rt = trust::Runtime::builder().workers(1).build().unwrap();
/// let n = rt.block_on(|| trust::spawn(|| 2 + 2).join());
/// assert_eq!(n, 4);
/// ```
///
/// A fiber may be woken from any thread, so what it captures must be `Send`:
///
/// ```compile_fail
/// let rt = trust::Runtime::builder().workers(1).build().unwrap();
/// let rc = std::rc::Rc::new(1);
/// rt.spawn(move || drop(rc));
/// ```
#[track_caller]
pub fn spawn<F, R>(f: F) -> JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let w =
        worker::current().expect("trust::spawn called outside a runtime worker; use Handle::spawn");
    let (handle, body) = task(f);
    w.spawn_local(body);
    handle
}

/// Suspends the calling fiber for `duration`: the other fibers of its worker, and its
/// trustee duties, run meanwhile. On a plain thread (not a runtime worker) it sleeps the
/// thread. The fiber wakes at the first round of its worker after `duration` has passed:
/// never sooner, and later when the worker is busy.
///
/// ```
/// use std::time::{Duration, Instant};
/// let rt = trust::Runtime::builder().workers(1).build().unwrap();
/// let counter = rt.entrust(0u32);
/// rt.block_on(|| {
///     let start = Instant::now();
///     let c = counter.clone();
///     let sleeper = trust::spawn(|| trust::sleep(Duration::from_millis(20)));
///     // The worker is free while the other fiber sleeps:
///     let ticker = trust::spawn(move || c.apply(|n| *n += 1));
///     ticker.join();
///     sleeper.join();
///     assert!(start.elapsed() >= Duration::from_millis(20));
/// });
/// assert_eq!(counter.apply(|n| *n), 1);
/// ```
///
/// # Panics
/// In delegated context, where blocking is not allowed.
#[track_caller]
pub fn sleep(duration: std::time::Duration) {
    let Some(w) = worker::current() else {
        return thread::sleep(duration);
    };
    let at = std::time::Instant::now() + duration;
    wait(std::future::poll_fn(|cx| {
        if std::time::Instant::now() >= at {
            return Poll::Ready(());
        }
        w.wake_at(at, cx.waker().clone());
        Poll::Pending
    }));
}

/// Lets the other ready fibers of this worker run. Outside a fiber, yields the thread.
///
/// ```
/// let rt = trust::Runtime::builder().workers(1).build().unwrap();
/// rt.block_on(|| trust::yield_now());
/// ```
#[track_caller]
pub fn yield_now() {
    match worker::current() {
        Some(w) if w.running() == Running::Fiber => w.yield_now(),
        Some(_) => panic!("{BLOCKING_IN_DELEGATED}"),
        None => thread::yield_now(),
    }
}

/// Yields to the rest of this worker's round when it has anything to do — another fiber
/// ready, work handed to the worker, answers or requests waiting — and returns at once when
/// the worker is otherwise idle: unlike [`yield_now`], it does not pay for a round in which
/// nothing would happen. For a fiber that gathers what the round produces before acting on
/// it (a writer batching a round's messages into one write). On a thread that is no
/// runtime's worker, it returns at once.
///
/// ```
/// let rt = trust::Runtime::builder().workers(1).build().unwrap();
/// rt.block_on(|| {
///     let other = trust::spawn(|| 7);
///     trust::yield_if_busy(); // `other` is ready: it runs first
///     assert!(other.is_finished());
///     trust::yield_if_busy(); // nothing to do: returns at once
/// });
/// ```
///
/// # Panics
/// In delegated context (inside a delegated closure or an `apply_then` callback), as
/// [`yield_now`] does: the trustee's round cannot be left from there.
#[track_caller]
pub fn yield_if_busy() {
    match worker::current() {
        Some(w) if w.running() != Running::Fiber => panic!("{BLOCKING_IN_DELEGATED}"),
        Some(w) if w.has_work() => w.yield_now(),
        _ => {}
    }
}

/// Builds the shared result cell of a fiber and the body that fills it.
pub(crate) fn task<F, R>(f: F) -> (JoinHandle<R>, Box<dyn FnOnce() + Send>)
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let cell = Oneshot::new();
    let guard = CompleteOnDrop {
        cell: cell.clone(),
        result: None,
    };
    let body = Box::new(move || {
        let mut guard = guard;
        guard.result = Some(catch_user(f));
    });
    (JoinHandle { cell }, body)
}

/// Runs user code in a fiber, catching its panic. When the worker is unwinding its fibers at
/// shutdown, the unwind is let through instead, so the fiber's stack unwinds completely.
pub(crate) fn catch_user<R>(f: impl FnOnce() -> R) -> Result<R, Panic> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|unwind| {
        if worker::current().is_some_and(|w| w.tearing_down()) {
            resume_unwind(unwind);
        }
        unwind
    })
}

/// Publishes a fiber's result, or its loss when the fiber is dropped unfinished.
struct CompleteOnDrop<R> {
    cell: Arc<Oneshot<R>>,
    result: Option<Result<R, Panic>>,
}

impl<R> Drop for CompleteOnDrop<R> {
    fn drop(&mut self) {
        let lost = || Box::new("the runtime shut down before the fiber finished") as Panic;
        self.cell
            .complete(self.result.take().unwrap_or_else(|| Err(lost())));
    }
}

/// Waits for a fiber to finish. Also a `Future`, so it can be awaited from any executor.
///
/// ```
/// let rt = trust::Runtime::builder().workers(2).build().unwrap();
/// let h = rt.spawn(|| "done");
/// assert_eq!(h.join(), "done"); // from a plain thread: blocks it
/// ```
pub struct JoinHandle<R> {
    cell: Arc<Oneshot<R>>,
}

impl<R> std::fmt::Debug for JoinHandle<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinHandle")
            .field("finished", &self.is_finished())
            .finish()
    }
}

impl<R> JoinHandle<R> {
    /// Waits for the fiber and returns its result. In a fiber this suspends only the fiber;
    /// on a plain thread it blocks the thread.
    ///
    /// # Panics
    /// Re-raises the fiber's panic. Panics if called in delegated context, or if the runtime
    /// shut down before the fiber finished.
    #[track_caller]
    pub fn join(self) -> R {
        wait(self)
    }

    /// Whether the fiber has finished.
    pub fn is_finished(&self) -> bool {
        self.cell.is_complete()
    }
}

impl<R> Future for JoinHandle<R> {
    type Output = R;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<R> {
        self.cell.poll_result(cx)
    }
}

/// Blocks on `future`: suspends the current fiber, or parks the current plain thread, between
/// polls.
///
/// # Panics
/// In delegated context or an `apply_then` callback, where blocking is not allowed.
#[track_caller]
pub(crate) fn wait<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match worker::current() {
        Some(w) => {
            if w.running() != Running::Fiber {
                panic!("{BLOCKING_IN_DELEGATED}");
            }
            let waker = fiber_waker(w);
            let mut cx = Context::from_waker(&waker);
            loop {
                if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
                    return out;
                }
                w.block();
            }
        }
        None => {
            let waker = Waker::from(Arc::new(ThreadWaker(thread::current())));
            let mut cx = Context::from_waker(&waker);
            loop {
                if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
                    return out;
                }
                thread::park();
            }
        }
    }
}

/// The waker of the running fiber of `w`: made at the fiber's first wait, then a clone of
/// that one (a count, not an allocation, per wait).
fn fiber_waker(w: &worker::Worker) -> Waker {
    let fiber = w.current_fiber();
    let mut wakers = w.fiber_wakers.borrow_mut();
    let slot = fiber.index as usize;
    if wakers.len() <= slot {
        wakers.resize(slot + 1, None);
    }
    match &wakers[slot] {
        // A waker of an earlier fiber of the slot would name that fiber, which its worker
        // ignores: only the same generation is this fiber's.
        Some((generation, waker)) if *generation == fiber.generation => waker.clone(),
        _ => {
            let waker = Waker::from(Arc::new(FiberWaker {
                registry: w.registry.clone(),
                worker: w.index,
                fiber,
            }));
            wakers[slot] = Some((fiber.generation, waker.clone()));
            waker
        }
    }
}

/// Wakes a fiber: directly when woken on its own worker, through the worker's injector
/// otherwise.
struct FiberWaker {
    registry: Arc<Registry>,
    worker: usize,
    fiber: FiberId,
}

impl Wake for FiberWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        match worker::current_on(&self.registry) {
            Some(w) if w.index == self.worker => w.wake(self.fiber),
            _ => self
                .registry
                .inject(self.worker, Injected::Wake(self.fiber)),
        }
    }
}

struct ThreadWaker(Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// A one-shot result cell, completed from any thread: the future side of `JoinHandle`,
/// `apply_async` and `launch`.
pub(crate) struct Oneshot<R> {
    state: Mutex<OneshotState<R>>,
    /// Set (under the lock) when the result is in, so that a poll that spins can check it
    /// without the lock.
    done: AtomicBool,
}

struct OneshotState<R> {
    result: Option<Result<R, Panic>>,
    waker: Option<Waker>,
}

/// A cell its holder must answer: dropped unanswered — the fiber holding it unwound at
/// shutdown, or the request carrying it was dropped unrun — it answers with the shut-down
/// error, so nobody waits for an answer that cannot come.
pub(crate) struct Promise<R>(Option<Arc<Oneshot<R>>>);

impl<R> Promise<R> {
    pub(crate) fn new(cell: Arc<Oneshot<R>>) -> Self {
        Promise(Some(cell))
    }

    pub(crate) fn answer(mut self, result: Result<R, Panic>) {
        if let Some(cell) = self.0.take() {
            cell.complete(result);
        }
    }
}

impl<R> Drop for Promise<R> {
    fn drop(&mut self) {
        if let Some(cell) = self.0.take() {
            cell.complete(Err(Box::new(
                "the runtime shut down before the request finished",
            )));
        }
    }
}

impl<R> Oneshot<R> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Oneshot::unset())
    }

    /// A cell with no result yet, for embedding in a request (see `async_call`).
    pub(crate) fn unset() -> Self {
        Oneshot {
            state: Mutex::new(OneshotState {
                result: None,
                waker: None,
            }),
            done: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OneshotState<R>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn complete(&self, result: Result<R, Panic>) {
        let mut state = self.lock();
        state.result = Some(result);
        self.done.store(true, Ordering::Release);
        let waker = state.waker.take();
        drop(state);
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Whether the result is in (also after it was taken).
    pub(crate) fn is_complete(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Polls for the result; re-raises a carried panic.
    pub(crate) fn poll_result(&self, cx: &mut Context<'_>) -> Poll<R> {
        self.poll_take(cx)
            .map(|result| result.unwrap_or_else(|panic| resume_unwind(panic)))
    }

    /// Polls for the result, a carried panic included.
    pub(crate) fn poll_take(&self, cx: &mut Context<'_>) -> Poll<Result<R, Panic>> {
        let mut state = self.lock();
        match state.result.take() {
            Some(result) => Poll::Ready(result),
            None => {
                state.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
