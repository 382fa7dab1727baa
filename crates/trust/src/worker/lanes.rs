//! The client side of a worker: a *lane* per trustee, in which its fibers stage requests into
//! slot-sized batches; publishing one batch per trustee at a time, taking the answers and
//! running the completions; and the callbacks of `apply_then` requests that ran inline.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::{Worker, current};
use crate::channel::{Channel, REQUEST_WORDS, RESPONSE_WORDS, ResponseReader};
use crate::record::{self, RecordBuf};
use crate::request::{Completion, Request, drain_completions};

/// Requests a worker runs inline for its own trustee before one takes the channel.
pub(super) const INLINE_BUDGET: u32 = 64;

/// Header of a deferred callback record.
#[derive(Clone, Copy)]
pub(super) struct Callback {
    run: unsafe fn(payload: *mut u8, run: bool),
}

/// Requests staged for one trustee that together fit one slot, with their completions in the
/// same order.
pub(super) struct Batch {
    requests: RecordBuf<Request>,
    completions: RecordBuf<Completion>,
    response_words: usize,
}

impl Batch {
    pub(super) fn new() -> Self {
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
pub(super) struct Lane {
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
    pub(super) fn new(channel: *const Channel) -> Self {
        Lane {
            channel,
            open: Batch::new(),
            full: VecDeque::new(),
            inflight: None,
            spare: Vec::new(),
        }
    }

    fn channel(&self) -> &Channel {
        // SAFETY: the channel lives in `Shared`, which the worker keeps alive.
        unsafe { &*self.channel }
    }

    fn has_staged(&self) -> bool {
        !self.full.is_empty() || !self.open.requests.is_empty()
    }

    /// Closes the open batch (it joins the full ones) and opens a fresh one.
    fn start_batch(&mut self) {
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
const SPARE_BATCHES: usize = 4;

impl Worker {
    /// Stages request `f` for `trustee`, whose answer takes `answer_words` words, with
    /// completion `done` run when it is answered. Returns how many full batches wait for that
    /// trustee (for backpressure).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn stage<F, D>(
        &self,
        trustee: usize,
        request: Request,
        answer_words: usize,
        f: F,
        completion: Completion,
        done: D,
    ) -> usize {
        const { assert!(record::record_words::<Request, [u8; record::MAX_INLINE]>() <= REQUEST_WORDS) };
        if self.tearing_down.get() {
            // Only destructors run at shutdown get here; nothing will be published again.
            let mut batch = Batch::new();
            batch.requests.push(request, f);
            batch.completions.push(completion, done);
            discard(batch);
            return 0;
        }
        let words = record::record_words::<Request, F>();
        self.lanes[trustee].with(|lane| {
            if !lane.open.fits(words, answer_words) {
                lane.start_batch();
            }
            lane.open.requests.push(request, f);
            lane.open.completions.push(completion, done);
            lane.open.response_words += answer_words;
            lane.channel().add_staged(1);
            lane.full.len()
        })
    }

    /// Full batches waiting for the channel to `trustee`.
    pub(crate) fn backlog(&self, trustee: usize) -> usize {
        self.lanes[trustee].with(|lane| lane.full.len())
    }

    /// Whether a request for this worker's own trustee may run inline, right now, in the
    /// caller: nothing from this worker is staged or in flight to its trustee (so it cannot
    /// overtake an earlier one), and the inline budget is not spent. The budget makes every
    /// `INLINE_BUDGET`-th request take the channel, so a fiber that delegates in a loop still
    /// lets its worker serve other clients.
    pub(crate) fn may_run_inline(&self) -> bool {
        if self.lanes[self.index].with(|lane| lane.inflight.is_some() || lane.has_staged()) {
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
    pub(super) fn run_callbacks(&self, run: bool) -> bool {
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
    pub(super) fn exchange(&self) -> bool {
        let mut progress = self.run_callbacks(true);
        for &t in &self.shared.trustees {
            progress |= self.take_answers(t);
            progress |= self.publish(t);
        }
        progress
    }

    fn take_answers(&self, trustee: usize) -> bool {
        let channel = self.shared.channel(self.index, trustee);
        let answered = self.lanes[trustee].with(|lane| {
            if lane.inflight.is_some() && channel.answered() {
                lane.inflight.take()
            } else {
                None
            }
        });
        let Some(mut batch) = answered else {
            return false;
        };
        // SAFETY: the batch is answered and was in flight, so its answers are taken once.
        // Completions may run `then` callbacks, which may stage more requests: no lane is
        // borrowed while they run.
        unsafe {
            channel.take_answers(|answers| drain_completions(&mut batch.completions, answers, true))
        };
        batch.response_words = 0;
        self.lanes[trustee].with(|lane| {
            if lane.spare.len() < SPARE_BATCHES {
                lane.spare.push(batch);
            }
        });
        true
    }

    fn publish(&self, trustee: usize) -> bool {
        let published = self.lanes[trustee].with(|lane| {
            if lane.inflight.is_some() {
                return false;
            }
            if lane.full.is_empty() {
                if lane.open.requests.is_empty() {
                    return false;
                }
                lane.start_batch();
            }
            let mut batch = lane.full.pop_front().expect("a full batch");
            // SAFETY: the channel is idle: nothing is in flight, so the last batch was answered
            // and its answers taken. The batch fits a slot (see `stage`); its payloads move to
            // the channel, so the buffer forgets them.
            unsafe {
                lane.channel()
                    .publish(batch.requests.as_words(), batch.requests.word_len())
            };
            batch.requests.forget_all();
            lane.inflight = Some(batch);
            true
        });
        if published {
            self.shared.parkers[trustee].wake();
        }
        published
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

impl Worker {
    /// Shutdown: drops the lane's staged requests and every completion without running
    /// callbacks. The trustees have answered or cancelled every published batch by now.
    pub(super) fn discard_lane(&self, trustee: usize) {
        let (open, full, inflight) = self.lanes[trustee].with(|lane| {
            (
                std::mem::replace(&mut lane.open, Batch::new()),
                std::mem::take(&mut lane.full),
                lane.inflight.take(),
            )
        });
        full.into_iter().for_each(discard);
        discard(open);
        if let Some(mut batch) = inflight {
            // SAFETY: the published batch was answered or cancelled (shutdown's first phase).
            unsafe {
                self.shared
                    .channel(self.index, trustee)
                    .take_answers(|a| drain_completions(&mut batch.completions, a, false))
            };
        }
    }
}
