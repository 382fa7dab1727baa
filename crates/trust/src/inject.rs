//! Work that other threads hand to a worker: spawns, wake-ups of its fibers, short functions
//! to run in its loop, properties to free, and late answers. A lock-protected queue with a flag the worker
//! checks without the lock; all of it is off the delegation hot path.

use std::sync::{Arc, Mutex};

use crate::free::DeadProperty;
use crate::late::LateRef;
use crate::loom::sync::atomic::{AtomicBool, Ordering};

/// Names a fiber of one worker, for the wake-ups other threads send it; the generation makes
/// stale wake-ups harmless. The worker's scheduler (`worker/fibers`) hands these out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FiberId {
    /// The fiber's slot in its worker's scheduler.
    pub(crate) index: u32,
    /// How many fibers the slot held before this one.
    pub(crate) generation: u32,
}

/// Work other threads hand to a worker.
pub(crate) enum Injected {
    /// Start a fiber.
    Spawn(Box<dyn FnOnce() + Send>),
    /// Make a blocked fiber ready.
    Wake(FiberId),
    /// Run a short non-blocking function in the worker's loop.
    Run(Box<dyn FnOnce() + Send>),
    /// Run a request made from outside the runtime.
    Call(Submission),
    /// Drop a property whose last trust was dropped outside the runtime.
    Free(DeadProperty),
    /// Deliver the answers that arrived from trustees of other runtimes (see `worker/lane`).
    ForeignAnswers,
    /// A late answer to one of the worker's deferred requests (see `late`).
    Late(LateRef),
}

impl Injected {
    /// Disposes of an item that can no longer run because the runtime has closed.
    pub(crate) fn discard(self) {
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

    /// Queues `item` and returns true (the caller then wakes the worker), unless `closed` is
    /// set: then the item is disposed of here (a free runs at once, a spawn is dropped). The
    /// flag is read under the lock, so an item is either queued before shutdown takes the
    /// queue, or sees the runtime closed.
    pub(crate) fn push(&self, item: Injected, closed: &AtomicBool) -> bool {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if closed.load(Ordering::Acquire) {
            drop(queue);
            item.discard();
            return false;
        }
        queue.push(item);
        self.pending.store(true, Ordering::Release);
        true
    }

    pub(crate) fn pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// Exchanges the queue with `empty` (the caller's spare list, kept with its capacity): the
    /// caller gets what was queued, and producers push into the spare's capacity. Takes the
    /// lock: the caller checks `pending` first.
    pub(crate) fn swap(&self, empty: &mut Vec<Injected>) {
        debug_assert!(empty.is_empty());
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        self.pending.store(false, Ordering::Relaxed);
        std::mem::swap(&mut *queue, empty);
    }

    pub(crate) fn take(&self) -> Vec<Injected> {
        let mut items = Vec::new();
        if self.pending() {
            self.swap(&mut items);
        }
        items
    }
}

/// A request made outside the runtime, as its trustee's injector carries it (see
/// `Trust::apply_async`).
pub(crate) trait Submitted: Send + Sync {
    /// Runs the request on its trustee's worker, in the worker's loop.
    fn run(self: Arc<Self>);
    /// The runtime closed before the request ran: its cell gets the shut-down error.
    fn cancel(&self);
}

/// A request in a trustee's injector; dropped unrun (the runtime closed), it is cancelled.
pub(crate) struct Submission(Option<Arc<dyn Submitted>>);

impl Submission {
    pub(crate) fn new(request: Arc<dyn Submitted>) -> Self {
        Submission(Some(request))
    }

    pub(crate) fn run(mut self) {
        if let Some(request) = self.0.take() {
            request.run();
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

/// A queue between workers that shutdown does not close: forwarded groups and their way back
/// (see `home`), which shutdown itself still moves. A lock, off the hot path, with a flag the
/// worker checks without it.
pub(crate) struct Mailbox<T> {
    queue: Mutex<Vec<T>>,
    pending: AtomicBool,
}

impl<T> Mailbox<T> {
    pub(crate) fn new() -> Self {
        Mailbox {
            queue: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
        }
    }

    /// Queues `item`; the caller wakes the receiving worker.
    pub(crate) fn push(&self, item: T) {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        queue.push(item);
        self.pending.store(true, Ordering::Release);
    }

    pub(crate) fn pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// Everything queued, in order.
    pub(crate) fn take(&self) -> Vec<T> {
        if !self.pending() {
            return Vec::new();
        }
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        self.pending.store(false, Ordering::Relaxed);
        std::mem::take(&mut *queue)
    }
}
