//! A worker's client-side state towards each trustee, as plain data on the worker's thread
//! (what the worker does with it is in `client`):
//!
//! * towards a trustee of its own runtime, a [`Lane`]: the batches of staged requests and the
//!   one in flight on their channel;
//! * towards a trustee of another runtime, which has no channel from this worker, a
//!   [`ForeignLane`]: the answers awaited from it, in request order. Such a request goes
//!   through the trustee's injector, and the answer completes a cell from the other runtime's
//!   thread, at any time; the worker delivers the answers strictly from the front of the
//!   queue, so an answer that arrives early waits for every one before it. Only the front
//!   cell holds the worker's waker, whose wake-up makes the worker deliver (through its own
//!   injector, in its loop, where `then` callbacks run everywhere else too).

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use crate::channel::Channel;
use crate::inject::{FiberId, Injected};
use crate::registry::Registry;
use crate::request::Batch;

/// A client's state towards one trustee.
pub(super) struct Lane {
    /// The channel to this trustee (it lives in `Registry`, which outlives the worker).
    pub(super) channel: *const Channel,
    /// The batch new requests go into (counted in the channel's `staged` once it holds one).
    pub(super) open: Batch,
    /// Full batches waiting for the channel, oldest first (all older than `open`).
    pub(super) full: VecDeque<Batch>,
    /// The published batch: the trustee's until answered, then its completions run.
    pub(super) inflight: Option<Batch>,
    /// Drained batches kept for their buffers' capacity.
    pub(super) spare: Vec<Batch>,
    /// Fibers waiting for the backlog of full batches to shrink (see `Worker::wait_for_backlog`).
    pub(super) held: Vec<FiberId>,
    /// Fibers waiting for a batch of this lane to be answered (see `Lanes::wait_answered`).
    pub(super) answer_waiters: Vec<FiberId>,
}

impl Lane {
    pub(super) fn new(channel: *const Channel) -> Self {
        Lane {
            channel,
            open: Batch::new(),
            full: VecDeque::new(),
            inflight: None,
            spare: Vec::new(),
            held: Vec::new(),
            answer_waiters: Vec::new(),
        }
    }

    pub(super) fn channel(&self) -> &Channel {
        // SAFETY: the channel lives in `Registry`, which the worker keeps alive.
        unsafe { &*self.channel }
    }

    pub(super) fn has_staged(&self) -> bool {
        !self.full.is_empty() || !self.open.is_empty()
    }

    /// Makes room in the open batch before staging into it: closes it if it is full, and
    /// counts a batch that receives its first request (see `free`). Returns how many full
    /// batches wait. Kept out of line: it runs once per batch.
    #[cold]
    pub(super) fn open_batch(&mut self) -> usize {
        if !self.open.is_empty() {
            self.close_batch();
        }
        self.channel().add_staged();
        self.full.len()
    }

    /// Closes the open batch (it joins the full ones) and opens a fresh one.
    pub(super) fn close_batch(&mut self) {
        let fresh = self.spare.pop().unwrap_or_else(Batch::new);
        self.full
            .push_back(std::mem::replace(&mut self.open, fresh));
    }

    /// Whether the lane has something to do: an answer to take, or requests to publish.
    pub(super) fn has_work(&self) -> bool {
        match self.inflight {
            Some(_) => self.channel().answered(),
            None => self.has_staged(),
        }
    }
}

/// Drained batches a lane keeps for reuse.
pub(super) const SPARE_BATCHES: usize = 4;

/// An awaited answer from a trustee of another runtime: polled with the worker's waker, it
/// delivers the answer (runs `then`) and returns `Ready` once the answer has arrived.
pub(crate) type PendingAnswer = Box<dyn FnMut(&mut Context<'_>) -> Poll<()>>;

/// A worker's state towards one trustee of another runtime: the answers it awaits, oldest
/// first.
pub(super) struct ForeignLane {
    /// The trustee's runtime, kept alive so that its address stays unique.
    pub(super) runtime: Arc<Registry>,
    pub(super) trustee: usize,
    pub(super) pending: VecDeque<PendingAnswer>,
    /// Fibers waiting for `pending` to shrink (see `Worker::wait_for_foreign_room`).
    pub(super) held: Vec<FiberId>,
}

/// A worker's lanes to trustees of other runtimes, and the waker their front answers hold.
pub(super) struct ForeignLanes {
    pub(super) lanes: Vec<ForeignLane>,
    pub(super) waker: Waker,
}

impl ForeignLanes {
    /// The foreign lanes of worker `worker` of `registry`'s runtime.
    pub(super) fn new(registry: Arc<Registry>, worker: usize) -> Self {
        ForeignLanes {
            lanes: Vec::new(),
            waker: Waker::from(Arc::new(ForeignWaker { registry, worker })),
        }
    }

    /// The lane to `trustee` of `runtime`, if answers are awaited from it.
    pub(super) fn position(&self, runtime: &Arc<Registry>, trustee: usize) -> Option<usize> {
        self.lanes
            .iter()
            .position(|l| l.trustee == trustee && Arc::ptr_eq(&l.runtime, runtime))
    }
}

/// Tells its worker, from any thread, that an awaited foreign answer has arrived.
struct ForeignWaker {
    registry: Arc<Registry>,
    worker: usize,
}

impl Wake for ForeignWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.registry.inject(self.worker, Injected::ForeignAnswers);
    }
}
