//! The future of a request answered into a cell ([`ApplyFuture`]), and what it polls: a
//! request that sends itself on the first poll ([`Call`]). `Trust::apply_async`'s requests
//! are `AsyncApply`s (in `trust`), `apply_deferred_async`'s are [`SendLater`]s.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::fiber::Oneshot;
use crate::poll_spin::PollSpin;
use crate::registry::Registry;
use crate::worker;

/// A request as its future sees it: the answer cell, and how to send the request.
pub(crate) trait Call<R>: Send + Sync {
    fn cell(&self) -> &Oneshot<R>;
    /// Sends the request (called once); returns whether its answer may come back soon: sent
    /// from outside the runtime to a trustee that was awake (see `poll_spin`).
    fn send(self: Arc<Self>) -> bool;
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
