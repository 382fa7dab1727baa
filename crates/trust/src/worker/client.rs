//! The client side of a worker: staging requests into the lane of each trustee of its own
//! runtime, publishing one batch per trustee at a time, taking the answers and running the
//! completions; the callbacks of `apply_then` requests that ran inline; and the answers
//! awaited from trustees of other runtimes (see `lane`).

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::task::Context;

use super::lane::{ForeignLane, PendingAnswer, SPARE_BATCHES};
use super::{Callback, INLINE_BUDGET, Running, Worker, current};
use crate::home::Lanes;
use crate::record::{self, RecordBuf};
use crate::registry::Registry;
use crate::request::{BATCH_WORDS, Batch, CompleteFn, RunFn};

/// Full batches (each up to `BATCH_WORDS` words: about 85 small requests) that may wait for
/// one trustee before a fiber staging for it waits (`Worker::wait_for_backlog`). With the
/// batch in flight and the open one, a lane holds at most ten batches: some 850 small
/// requests, a window wide enough that a trustee always has the next batch ready.
pub(crate) const MAX_BACKLOG: usize = 8;

/// Answers a worker may await from one trustee of another runtime before a fiber asking for
/// more waits (`Worker::wait_for_foreign_room`): each is a request in the other runtime's
/// injector and a callback here.
const MAX_FOREIGN: usize = 1024;

impl Worker {
    /// Stages a request for `trustee`: closure `f` for `run` on `property`, answered as an
    /// `R`, with completion `complete` taking `done` once it is answered (see `request`).
    /// When the request closed a full batch, returns how many full batches wait for that
    /// trustee (for backpressure; the backlog grows at no other time), otherwise 0.
    ///
    /// # Safety
    /// `trustee` is a worker of this worker's runtime; `run` and `complete` are the
    /// trampolines of `F`, `R` and `D`, as `request` requires.
    #[inline(always)]
    pub(crate) unsafe fn stage<F, R, D>(
        &self,
        trustee: usize,
        run: RunFn,
        property: *const (),
        complete: CompleteFn,
        f: F,
        done: D,
    ) -> usize {
        if self.tearing_down.get() {
            // Only destructors run at shutdown get here; nothing will be published again.
            let mut batch = Batch::new();
            // SAFETY: per the caller, into an empty open batch.
            unsafe { batch.push::<F, R, D>(run, property, complete, f, done) };
            batch.discard();
            return 0;
        }
        debug_assert!(trustee < self.lanes.len());
        // SAFETY: per the caller, `trustee` is a worker of this runtime, and there is a lane
        // for each.
        let lane = unsafe { self.lanes.get_unchecked(trustee) };
        lane.with(|lane| {
            let mut backlog = 0;
            // One comparison covers both rare cases: an empty batch (to be counted) and a
            // full one (to be closed, the only time the backlog grows).
            if lane.open.len().wrapping_sub(1) >= BATCH_WORDS - 1 {
                backlog = lane.open_batch();
            }
            // SAFETY: per the caller; the open batch is below `BATCH_WORDS` now.
            unsafe { lane.open.push::<F, R, D>(run, property, complete, f, done) };
            backlog
        })
    }

    /// Backpressure: makes the running fiber wait while `MAX_BACKLOG` full batches or more
    /// wait for the channel to `trustee`; it blocks (its worker goes on publishing, serving
    /// and, with nothing to do, sleeping) until `publish` shrinks the backlog. Elsewhere —
    /// delegated context, `then` callbacks — nothing may wait, and the backlog is not limited.
    ///
    /// The fiber blocks rather than yields: a fiber that yielded in a loop kept its worker
    /// busy without pause while the trustee worked off the backlog, which on a machine with
    /// other work beside it took the trustee's core time (2 workers, a fiber on each issuing
    /// 2×10⁵ `apply_then` into 16 sharded maps, one busy loop per core beside them: 3.7–5.8 s
    /// yielding against 0.03–0.11 s with a `Group` window of 256; blocking, the two are alike).
    #[cold]
    pub(crate) fn wait_for_backlog(&self, trustee: usize) {
        if self.running.get() != Running::Fiber {
            return;
        }
        let id = self.current_fiber();
        while self.lanes[trustee].with(|lane| {
            let full = lane.full.len() >= MAX_BACKLOG;
            if full {
                lane.held.push(id);
            }
            full
        }) {
            self.block();
        }
    }

    /// Whether a request for this worker's own trustee may run inline, right now, in the
    /// caller: nothing from this worker is staged or in flight to its trustee (so it cannot
    /// overtake an earlier one), and the inline budget is not spent. The budget makes every
    /// `INLINE_BUDGET`-th request take the channel, so a fiber that delegates in a loop still
    /// lets its worker serve other clients.
    pub(crate) fn may_run_inline(&self) -> bool {
        if !self.nothing_queued_for_self() {
            return false;
        }
        let left = self.inline_budget.get();
        if left == 0 {
            self.inline_budget.set(INLINE_BUDGET);
            return false;
        }
        self.inline_budget.set(left - 1);
        self.ran_inline();
        true
    }

    /// Whether nothing from this worker is staged or in flight to its own trustee: a request
    /// run inline now overtakes none of its own.
    pub(crate) fn nothing_queued_for_self(&self) -> bool {
        self.lanes[self.index].with(|lane| lane.inflight.is_none() && !lane.has_staged())
    }

    /// Queues `callback` to run in this worker's next round (for an `apply_then` whose
    /// closure ran inline).
    pub(crate) fn defer_callback<C: FnOnce()>(&self, callback: C) {
        unsafe fn run<C: FnOnce()>(payload: *mut u64, run: bool) {
            // SAFETY: pushed with a `C` payload by `defer_callback`.
            let callback = unsafe { record::take::<C>(payload) };
            if run {
                let w = current().expect("callback outside its worker");
                if let Err(panic) = catch_unwind(AssertUnwindSafe(callback)) {
                    w.registry.unhandled_panic(panic);
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
        for &t in &self.registry.trustees {
            progress |= self.take_answers(t);
            progress |= self.publish(t);
        }
        progress
    }

    pub(super) fn take_answers(&self, trustee: usize) -> bool {
        let channel = self.registry.channel(self.index, trustee);
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
        // SAFETY: the batch is answered and was in flight, so it is completed once.
        // Completions may run `then` callbacks, which may stage more requests: no lane is
        // borrowed while they run.
        unsafe { batch.complete(true) };
        let waiters = self.lanes[trustee].with(|lane| {
            if lane.spare.len() < SPARE_BATCHES {
                lane.spare.push(batch);
            }
            // Rare (fibers waiting after a move, see `home`): no work when there are none.
            (!lane.answer_waiters.is_empty()).then(|| std::mem::take(&mut lane.answer_waiters))
        });
        if let Some(waiters) = waiters {
            self.wake_answer_waiters(waiters);
        }
        true
    }

    #[cold]
    fn wake_answer_waiters(&self, waiters: Vec<crate::inject::FiberId>) {
        for id in waiters {
            self.wake(id);
        }
    }

    fn publish(&self, trustee: usize) -> bool {
        let mut held = Vec::new();
        let published = self.lanes[trustee].with(|lane| {
            if lane.inflight.is_some() {
                return false;
            }
            if lane.full.is_empty() {
                if lane.open.is_empty() {
                    return false;
                }
                lane.close_batch();
            }
            let batch = lane.full.pop_front().expect("a full batch");
            // SAFETY: the channel is idle: nothing is in flight, so the last batch was answered
            // and completed. The lane keeps the batch, untouched, until it is answered.
            unsafe { lane.channel().publish(batch.words(), batch.len()) };
            lane.inflight = Some(batch);
            if lane.full.len() < MAX_BACKLOG {
                // Fibers held by the backlog re-check it (see `wait_for_backlog`).
                held = std::mem::take(&mut lane.held);
            }
            true
        });
        if published {
            self.registry.parkers[trustee].wake();
        }
        for id in held {
            self.wake(id);
        }
        published
    }
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
        full.into_iter().for_each(Batch::discard);
        open.discard();
        if let Some(mut batch) = inflight {
            // SAFETY: the published batch was answered or cancelled (shutdown's first phase).
            unsafe { batch.complete(false) };
        }
    }
}

impl Worker {
    /// Queues `answer`, awaited from `trustee` of the other runtime `runtime`, behind that
    /// trustee's earlier ones. It is delivered later, in this worker's loop, never here.
    pub(crate) fn await_foreign(
        &self,
        runtime: &Arc<Registry>,
        trustee: usize,
        answer: PendingAnswer,
    ) {
        let mut foreign = self.foreign.borrow_mut();
        match foreign.position(runtime, trustee) {
            Some(l) => foreign.lanes[l].pending.push_back(answer),
            None => {
                foreign.lanes.push(ForeignLane {
                    runtime: runtime.clone(),
                    trustee,
                    pending: VecDeque::from([answer]),
                    held: Vec::new(),
                });
                // The new front must hold the waker: a delivery pass polls it (and may find
                // it answered already).
                foreign.waker.wake_by_ref();
            }
        }
    }

    /// Delivers, lane by lane, every awaited foreign answer that has arrived and has no
    /// undelivered one before it; the first one still missing in a lane holds the waker.
    pub(super) fn deliver_foreign(&self) {
        let waker = self.foreign.borrow().waker.clone();
        let mut cx = Context::from_waker(&waker);
        let mut l = 0;
        loop {
            // No borrow is held while an answer is delivered: its `then` may await more.
            let mut front = {
                let mut foreign = self.foreign.borrow_mut();
                let Some(lane) = foreign.lanes.get_mut(l) else {
                    return;
                };
                match lane.pending.pop_front() {
                    Some(front) => front,
                    None => {
                        // Every answer is delivered: fibers held by this lane go on.
                        let lane = foreign.lanes.swap_remove(l);
                        for id in lane.held {
                            self.wake(id);
                        }
                        continue;
                    }
                }
            };
            if front(&mut cx).is_pending() {
                // Not answered yet (and nothing ran): it stays first.
                let held = {
                    let mut foreign = self.foreign.borrow_mut();
                    let lane = &mut foreign.lanes[l];
                    lane.pending.push_front(front);
                    if lane.pending.len() < MAX_FOREIGN {
                        std::mem::take(&mut lane.held)
                    } else {
                        Vec::new()
                    }
                };
                for id in held {
                    self.wake(id);
                }
                l += 1;
            }
        }
    }

    /// Backpressure towards a trustee of another runtime, as `wait_for_backlog` towards one
    /// of this runtime: the running fiber waits while `MAX_FOREIGN` answers or more are
    /// awaited from `trustee` of `runtime`.
    #[cold]
    pub(crate) fn wait_for_foreign_room(&self, runtime: &Arc<Registry>, trustee: usize) {
        if self.running.get() != Running::Fiber {
            return;
        }
        let id = self.current_fiber();
        while {
            let mut foreign = self.foreign.borrow_mut();
            match foreign.position(runtime, trustee) {
                Some(l) if foreign.lanes[l].pending.len() >= MAX_FOREIGN => {
                    foreign.lanes[l].held.push(id);
                    true
                }
                _ => false,
            }
        } {
            self.block();
        }
    }

    /// Shutdown: drops the awaited foreign answers without delivering them.
    pub(super) fn discard_foreign(&self) {
        let lanes = std::mem::take(&mut self.foreign.borrow_mut().lanes);
        drop(lanes);
    }
}

/// A moved property's routing (`home`) asks a worker's lanes where its requests stand.
impl Lanes for Worker {
    fn next_batch(&self, trustee: usize) -> u32 {
        self.lanes[trustee].with(|lane| {
            let started = lane.channel().staged() as u32;
            // An empty or full open batch means the next request starts a new one.
            if lane.open.is_empty() || lane.open.len() >= BATCH_WORDS {
                started.wrapping_add(1)
            } else {
                started
            }
        })
    }

    fn answered_up_to(&self, trustee: usize, batch: u32) -> bool {
        let channel = self.registry.channel(self.index, trustee);
        // A batch never started (`next_batch` of a request that ran inline) counts as the
        // last one started.
        channel.answered_up_to(channel.started_up_to(Some(batch)))
    }

    fn wait_answered(&self, trustee: usize, batch: u32) -> bool {
        if self.running.get() != Running::Fiber || self.tearing_down.get() {
            return false;
        }
        let id = self.current_fiber();
        while !self.answered_up_to(trustee, batch) {
            // Woken by `take_answers` of this lane; meanwhile the worker publishes the batch
            // (if it is still open), serves and takes answers as usual.
            self.lanes[trustee].with(|lane| lane.answer_waiters.push(id));
            self.block();
        }
        true
    }
}
