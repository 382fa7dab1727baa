//! Requests answered into a cell rather than a record: [`Trust::apply_async`]'s future, and
//! `apply_then` from a worker of another runtime. One allocation carries each request.
//!
//! An [`AsyncApply`] is an `Arc` holding the trust, the closure until it runs, and the answer
//! cell. The future polls that `Arc`, and the same `Arc` is what the trustee's injector carries
//! when the request comes from outside the runtime, so sending allocates nothing more. The
//! trustee drops its reference as soon as it has answered, so the caller's thread, which
//! allocated the request, usually frees it too: memory freed on another thread than the one
//! that allocated it sends glibc's allocator down its slow paths on both.
//!
//! Measured with callgrind (instructions per call, `valgrind --tool=callgrind
//! --separate-threads=yes` on `cargo run --release -p trust --example cross_thread -- 1
//! "joined, current_thread: apply_async"`): the previous shape — a shared cell, a boxed
//! submission and a boxed injected closure, two of them freed by the trustee — cost the
//! executor's thread 1,367 instructions per call, 480 of them in `malloc` and `free`, and the
//! trustee 523; this one 1,071 and 345. The same example's times on the 2-vCPU machine, old
//! and new in one session: joined on a current-thread runtime 296–338 → 246–250 ns per call,
//! on a 2-worker one 314–332 → 272–282 ns.
//!
//! A request that ran answers its cell even when shutdown drops the deferred delivery unrun
//! ([`Deliver`]), and one still in an injector at shutdown is cancelled ([`Submission`]): a
//! future never waits for a request that is gone.
//!
//! [`Trust::apply_async`]: crate::Trust::apply_async

use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::fiber::Oneshot;
use crate::inject::Injected;
use crate::loom::sync::atomic::Ordering;
use crate::poll_spin::PollSpin;
use crate::registry::Registry;
use crate::request::{self, Panic};
use crate::trust::{Trust, shut_down_panic};
use crate::worker::{self, Running, Worker};

/// A request as its future sees it: the answer cell, and how to send the request.
pub(crate) trait Call<R>: Send + Sync {
    fn cell(&self) -> &Oneshot<R>;
    /// Sends the request (called once); returns whether its answer may come back soon: sent
    /// from outside the runtime to a trustee that was awake (see `poll_spin`).
    fn send(self: Arc<Self>) -> bool;
}

/// A request as its trustee's injector carries it.
pub(crate) trait Submitted: Send + Sync {
    /// Runs the request on `w`, its trustee's worker, in the worker's loop.
    fn run(self: Arc<Self>, w: &Worker);
    /// The runtime closed before the request ran: its cell gets the shut-down error.
    fn cancel(&self);
}

/// A request in a trustee's injector; dropped unrun (the runtime closed), it is cancelled.
pub(crate) struct Submission(Option<Arc<dyn Submitted>>);

impl Submission {
    pub(crate) fn run(mut self, w: &Worker) {
        if let Some(request) = self.0.take() {
            request.run(w);
        }
    }
}

impl Drop for Submission {
    fn drop(&mut self) {
        if let Some(request) = self.0.take() {
            request.cancel();
        }
    }
}

/// "Apply `f` to the property of `trust`", answered into `cell`.
pub(crate) struct AsyncApply<T: Send + 'static, F, R> {
    trust: Trust<T>,
    /// Taken by whoever runs the request, or cancels it.
    f: Mutex<Option<F>>,
    cell: Oneshot<R>,
}

impl<T, F, R> AsyncApply<T, F, R>
where
    T: Send + 'static,
    F: FnOnce(&mut T) -> R + Send + 'static,
    R: Send + 'static,
{
    pub(crate) fn new(trust: Trust<T>, f: F) -> Arc<Self> {
        Arc::new(AsyncApply {
            trust,
            f: Mutex::new(Some(f)),
            cell: Oneshot::unset(),
        })
    }

    fn take(&self) -> Option<F> {
        self.f.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl<T, F, R> Call<R> for AsyncApply<T, F, R>
where
    T: Send + 'static,
    F: FnOnce(&mut T) -> R + Send + 'static,
    R: Send + 'static,
{
    fn cell(&self) -> &Oneshot<R> {
        &self.cell
    }

    fn send(self: Arc<Self>) -> bool {
        let registry = self.trust.registry_arc();
        match worker::current_on(registry) {
            Some(w) => {
                let f = self.take().expect("a request is sent once");
                // SAFETY: `w` is of this runtime; `complete_async::<T, F, R>` takes an `F`, an
                // `R` and an `Arc<AsyncApply<T, F, R>>`.
                unsafe {
                    self.trust
                        .stage(w, f, complete_async::<T, F, R>, self.clone())
                };
                false
            }
            None if registry.closed.load(Ordering::Acquire) => {
                self.cancel();
                false
            }
            None => {
                let trustee = self.trust.trustee();
                let awake = registry.parkers[trustee].is_awake();
                // Hand the request to the trustee's own worker, which runs it at once. `self`
                // holds the trust, which keeps the registry alive until `inject` returns.
                let submission = Submission(Some(self.clone()));
                registry.inject(trustee, Injected::Call(submission));
                awake
            }
        }
    }
}

impl<T, F, R> Submitted for AsyncApply<T, F, R>
where
    T: Send + 'static,
    F: FnOnce(&mut T) -> R + Send + 'static,
    R: Send + 'static,
{
    fn run(self: Arc<Self>, w: &Worker) {
        debug_assert!(w.index == self.trust.trustee() && w.running() == Running::Scheduler);
        let f = self.take().expect("a submission runs once");
        let result = {
            let _delegated = w.enter(Running::Delegated);
            // SAFETY: on the trustee's worker, in its loop: no closure runs on its properties.
            let value = unsafe { self.trust.property_mut() };
            catch_unwind(AssertUnwindSafe(|| f(value)))
        };
        // Completed after the rest of the injected work has run too: the waiting executor is
        // woken once for all of them, and finds them all answered.
        let answer = Deliver {
            call: self,
            result: Some(result),
        };
        w.defer_callback(move || drop(answer));
    }

    fn cancel(&self) {
        if self.take().is_some() {
            self.cell.complete(Err(shut_down_panic()));
        }
    }
}

/// An answer on its way to its cell, delivered when dropped: a deferred callback that
/// shutdown drops unrun still answers its future.
struct Deliver<T: Send + 'static, F, R> {
    call: Arc<AsyncApply<T, F, R>>,
    result: Option<Result<R, Panic>>,
}

impl<T: Send + 'static, F, R> Drop for Deliver<T, F, R> {
    fn drop(&mut self) {
        if let Some(result) = self.result.take() {
            self.call.cell.complete(result);
        }
    }
}

/// Completes a staged [`AsyncApply`] (the record layout is in `request`).
unsafe fn complete_async<T, F, R>(record: *mut u64, _run: bool)
where
    T: Send + 'static,
    F: FnOnce(&mut T) -> R + Send + 'static,
    R: Send + 'static,
{
    // SAFETY: staged with an `F`, an `R` and an `Arc<AsyncApply<T, F, R>>` payload by
    // `AsyncApply::send`.
    let (call, answer) = unsafe {
        (
            request::take_done::<F, R, Arc<AsyncApply<T, F, R>>>(record),
            request::take_answer::<F, R>(record),
        )
    };
    call.cell
        .complete(answer.unwrap_or_else(|| Err(shut_down_panic())));
}

/// A request sent by a closure, answered into a cell the closure holds too
/// ([`Trust::apply_deferred_async`](crate::Trust::apply_deferred_async)).
pub(crate) struct SendLater<R> {
    cell: Arc<Oneshot<R>>,
    send: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl<R: Send> SendLater<R> {
    pub(crate) fn new(cell: Arc<Oneshot<R>>, send: Box<dyn FnOnce() + Send>) -> Arc<Self> {
        Arc::new(SendLater {
            cell,
            send: Mutex::new(Some(send)),
        })
    }
}

impl<R: Send> Call<R> for SendLater<R> {
    fn cell(&self) -> &Oneshot<R> {
        &self.cell
    }

    /// Its answer may come at any time later: no spinning for it.
    fn send(self: Arc<Self>) -> bool {
        let send = self.send.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(send) = send {
            send();
        }
        false
    }
}

/// The future returned by [`Trust::apply_async`](crate::Trust::apply_async).
///
/// Polled outside the runtime (by another executor, or on a plain thread), a future whose
/// answer is not back yet asks to be polled again at once — its executor runs its other ready
/// tasks in between — for up to 20 µs after it sent the request (less if
/// [`Builder::spin`](crate::Builder::spin) fixes a shorter spin), and then waits to be woken. One future per
/// thread spins at a time, and a thread whose spins go unanswered stops spinning for a while
/// (see the `poll_spin` module). An answer within the spin costs the executor no sleep and the
/// trustee no wake-up; `Builder::spin(Duration::ZERO)` turns spinning off.
#[must_use = "the request is only sent when the future is polled"]
pub struct ApplyFuture<R> {
    call: Arc<dyn Call<R>>,
    sent: bool,
    spin: Duration,
    spinning: PollSpin,
}

impl<R> ApplyFuture<R> {
    /// A future of `call`'s answer; the request is sent on the first poll.
    pub(crate) fn new(registry: &Registry, call: Arc<dyn Call<R>>) -> Self {
        ApplyFuture {
            call,
            sent: false,
            // Unset, the future spins up to its own ceiling and backs off by its own rule.
            spin: registry.spin.unwrap_or(crate::poll_spin::MAX_SPIN),
            spinning: PollSpin::default(),
        }
    }
}

impl<R> fmt::Debug for ApplyFuture<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApplyFuture")
            .field("sent", &self.sent)
            .finish()
    }
}

impl<R> Future for ApplyFuture<R> {
    type Output = R;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<R> {
        if !self.sent {
            self.sent = true;
            let soon = self.call.clone().send();
            // In the runtime, fibers wait by suspending; a worker spins in its own loop.
            if worker::current().is_none() {
                let spin = if soon { self.spin } else { Duration::ZERO };
                self.spinning.start(spin);
            }
        }
        if !self.call.cell().is_complete() && self.spinning.again() {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let poll = self.call.cell().poll_result(cx);
        if poll.is_ready() {
            self.spinning.answered();
        }
        poll
    }
}
