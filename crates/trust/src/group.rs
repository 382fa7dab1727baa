//! [`Group`]: waiting for many `apply_then` callbacks.

use std::cell::Cell;
use std::fmt;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};

use crate::fiber;

/// Counts `apply_then` callbacks that have not run yet, so that a fiber can wait for them.
///
/// [`Group::track`] wraps a callback and counts it as pending until it has run (or was
/// dropped without running, when the runtime shuts down). [`Group::wait`] suspends the calling
/// fiber until none is pending; [`Group::wait_until_pending_at_most`] until at most `n` are,
/// which keeps a bounded number of requests in flight. Only the fiber waits: its worker goes
/// on running other fibers and the callbacks.
///
/// A group belongs to one worker (it is neither `Send` nor `Sync`), like the callbacks it
/// tracks, which run on the worker that made the request. It costs no atomic instructions.
///
/// ```
/// let rt = trust::Runtime::builder().workers(2).build().unwrap();
/// let counters: Vec<_> = (0..2).map(|w| rt.trustee(w).entrust(0u64)).collect();
/// let total = rt.block_on(|| {
///     let group = trust::Group::new();
///     let sum = std::rc::Rc::new(std::cell::Cell::new(0));
///     for i in 0..1000u64 {
///         let sum = sum.clone();
///         counters[(i % 2) as usize].apply_then(
///             move |c| { *c += i; *c },
///             group.track(move |_| sum.set(sum.get() + 1)),
///         );
///         group.wait_until_pending_at_most(256); // at most 256 requests in flight
///     }
///     group.wait();
///     sum.get()
/// });
/// assert_eq!(total, 1000);
/// ```
///
/// A group cannot leave its worker:
///
/// ```compile_fail
/// let group = trust::Group::new();
/// std::thread::spawn(move || group.wait());
/// ```
pub struct Group {
    state: Rc<State>,
}

struct State {
    pending: Cell<usize>,
    /// The waiting fiber is woken once `pending` is at most this.
    wake_at: Cell<usize>,
    waiter: Cell<Option<Waker>>,
}

impl Group {
    /// An empty group.
    pub fn new() -> Self {
        Group {
            state: Rc::new(State {
                pending: Cell::new(0),
                wake_at: Cell::new(0),
                waiter: Cell::new(None),
            }),
        }
    }

    /// Wraps `then` so that the group counts it as pending until it has run; pass the result
    /// to [`Trust::apply_then`](crate::Trust::apply_then) (or `launch_then`).
    pub fn track<R, Then: FnOnce(R) + 'static>(&self, then: Then) -> impl FnOnce(R) + 'static {
        self.state.pending.set(self.state.pending.get() + 1);
        let done = Done(self.state.clone());
        move |result| {
            then(result);
            drop(done);
        }
    }

    /// Tracked callbacks that have not run yet.
    pub fn pending(&self) -> usize {
        self.state.pending.get()
    }

    /// Suspends the calling fiber until every tracked callback has run.
    ///
    /// # Panics
    /// In delegated context, where blocking is not allowed.
    #[track_caller]
    pub fn wait(&self) {
        self.wait_until_pending_at_most(0);
    }

    /// Suspends the calling fiber until at most `n` tracked callbacks have not run.
    ///
    /// # Panics
    /// In delegated context, where blocking is not allowed.
    #[track_caller]
    pub fn wait_until_pending_at_most(&self, n: usize) {
        if self.state.pending.get() <= n {
            return;
        }
        fiber::wait(poll_fn(|cx| {
            if self.state.pending.get() <= n {
                self.state.waiter.set(None);
                return Poll::Ready(());
            }
            self.state.wake_at.set(n);
            self.state.waiter.set(Some(cx.waker().clone()));
            Poll::Pending
        }));
    }
}

impl Default for Group {
    fn default() -> Self {
        Group::new()
    }
}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group")
            .field("pending", &self.pending())
            .finish()
    }
}

/// Counts a tracked callback as done when dropped: after it ran, or unrun.
struct Done(Rc<State>);

impl Drop for Done {
    fn drop(&mut self) {
        let state = &self.0;
        let pending = state.pending.get() - 1;
        state.pending.set(pending);
        if pending <= state.wake_at.get()
            && let Some(waker) = state.waiter.take()
        {
            waker.wake();
        }
    }
}
