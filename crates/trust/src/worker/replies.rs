//! Deferred answers on a worker (the cell between the two sides is in `late`):
//!
//! * as a trustee: the deferred request whose closure runs right now (`answering_*`: a reply
//!   sent while its own closure runs goes straight into the request's record, with no cell),
//!   the requests that wait for a late answer, by reply id, and their deadlines;
//! * as a client: what to do with each late answer it awaits, until the answer arrives.
//!
//! Everything here belongs to the worker's thread. A `Reply` used on another thread reaches
//! it through the worker's injector (`reply`). No borrow is held while user code runs: an
//! `on_expire` function, a delivery, or a value's drop may use replies again.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use super::{Running, Worker};
use crate::inject::Injected;
use crate::late::{Failure, LateRef, Waiting};

/// Runs a request's `on_expire` on its property (the box keeps the property alive).
pub(crate) type Expire = Box<dyn FnOnce(u64)>;

/// What a client does with a late answer: called with the client's reference to the cell,
/// and whether to deliver (false at shutdown: only drop).
pub(crate) type Deliver = Box<dyn FnOnce(LateRef, bool)>;

/// What became of the running request's reply while its closure ran.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum AnswerState {
    Open,
    Answered,
    Dropped,
}

/// Where a reply's request stands, for the reply that is sent or dropped.
pub(crate) enum Claim {
    /// Its closure runs now: the answer goes into the record at this address.
    Running(*mut u64),
    /// It waits: the trustee's reference to its cell.
    Waiting(LateRef),
    /// It has ended (timed out, or its closure panicked): nothing to answer.
    Gone,
}

/// A request waiting for its late answer.
struct Waiter {
    late: LateRef,
    deadline: Option<(Instant, Expire)>,
    /// The property it pins to this trustee (see `home`), until the request ends or the
    /// property is freed (`unpin_all`).
    pinned: Option<*const ()>,
}

impl Waiter {
    /// Ends the wait: releases the pin and gives back the cell and the expiry.
    fn end(self) -> (LateRef, Option<(Instant, Expire)>) {
        if let Some(property) = self.pinned {
            // SAFETY: a pinned property is alive: its free clears `pinned` first.
            unsafe { crate::home::Header::of(property).unpin() };
        }
        (self.late, self.deadline)
    }
}

/// A worker's deferred-answer state, both sides.
pub(super) struct Replies {
    next_id: Cell<u64>,
    /// The client whose batch the trustee serves now (the one a new cell answers).
    client: Cell<usize>,
    /// The deferred request whose closure runs now (closures do not nest: a closure on a
    /// trustee never runs another request inline): its reply's id while the reply is open —
    /// `ANSWERED` once sent, `DROPPED` once dropped, 0 outside a closure — and where an answer
    /// sent during the closure goes (the record's answer area).
    answering_id: Cell<u64>,
    answering_slot: Cell<*mut u64>,
    waiting: RefCell<HashMap<u64, Waiter, BuildHasherDefault<IdHasher>>>,
    deadlines: RefCell<BTreeSet<(Instant, u64)>>,
    /// The client side: deliveries by index, and the free indices.
    awaiting: RefCell<(Vec<Awaited>, Vec<usize>)>,
}

/// `answering_id` once the running request's reply was sent, or dropped (ids start at 1 and
/// count up, so they never reach these).
const ANSWERED: u64 = u64::MAX;
const DROPPED: u64 = u64::MAX - 1;

/// A client's awaited late answer (`None`: a free index).
type Awaited = Option<(LateRef, Deliver)>;

impl Replies {
    pub(super) fn new() -> Self {
        Replies {
            next_id: Cell::new(1),
            client: Cell::new(0),
            answering_id: Cell::new(0),
            answering_slot: Cell::new(std::ptr::null_mut()),
            waiting: RefCell::default(),
            deadlines: RefCell::default(),
            awaiting: RefCell::default(),
        }
    }
}

/// Reply ids are a counter: a multiply spreads them over a table's buckets.
#[derive(Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, id: u64) {
        self.0 = id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

impl Worker {
    /// Notes the client whose batch this trustee serves next.
    pub(super) fn serving(&self, client: usize) {
        self.replies.client.set(client);
    }

    /// Trustee: a deferred request's closure is about to run, answering into `slot`.
    /// Returns its reply id.
    #[inline]
    pub(crate) fn begin_answering(&self, slot: *mut u64) -> u64 {
        let replies = &self.replies;
        debug_assert_eq!(
            replies.answering_id.get(),
            0,
            "deferred closures do not nest"
        );
        let id = replies.next_id.get();
        replies.next_id.set(id + 1);
        replies.answering_id.set(id);
        replies.answering_slot.set(slot);
        id
    }

    /// Trustee: the closure has returned (or panicked); what became of its reply.
    #[inline]
    pub(crate) fn end_answering(&self) -> AnswerState {
        match self.replies.answering_id.replace(0) {
            ANSWERED => AnswerState::Answered,
            DROPPED => AnswerState::Dropped,
            _ => AnswerState::Open,
        }
    }

    /// The client of the batch being served (a new cell's client).
    pub(crate) fn served_client(&self) -> usize {
        self.replies.client.get()
    }

    /// Trustee: a reply is being sent (`dropping == false`) or dropped; where its request
    /// stands. A waiting request leaves the table here.
    #[inline]
    pub(crate) fn claim_reply(&self, id: u64, dropping: bool) -> Claim {
        let replies = &self.replies;
        if replies.answering_id.get() == id {
            replies
                .answering_id
                .set(if dropping { DROPPED } else { ANSWERED });
            return Claim::Running(replies.answering_slot.get());
        }
        self.claim_waiting(id)
    }

    #[cold]
    fn claim_waiting(&self, id: u64) -> Claim {
        let Some(waiter) = self.replies.waiting.borrow_mut().remove(&id) else {
            return Claim::Gone;
        };
        let (late, deadline) = waiter.end();
        if let Some((at, expire)) = deadline {
            self.replies.deadlines.borrow_mut().remove(&(at, id));
            // Drops the request's hold on its property, outside any borrow.
            drop(expire);
        }
        Claim::Waiting(late)
    }

    /// Trustee: the request `id` on `property` waits for a late answer through the cell
    /// `late` (the trustee's reference); with a deadline, `expire` runs when it passes first.
    /// It pins the property meanwhile.
    ///
    /// # Safety
    /// `property` is a live property whose home is this worker.
    pub(crate) unsafe fn await_reply(
        &self,
        id: u64,
        late: LateRef,
        deadline: Option<(Instant, Expire)>,
        property: *const (),
    ) {
        if let Some((at, _)) = &deadline {
            self.replies.deadlines.borrow_mut().insert((*at, id));
        }
        // SAFETY: per the caller.
        unsafe { crate::home::Header::of(property).pin() };
        let waiter = Waiter {
            late,
            deadline,
            pinned: Some(property),
        };
        self.replies.waiting.borrow_mut().insert(id, waiter);
    }

    /// Trustee: `property` is about to be freed while requests that pin it still wait (their
    /// replies are kept elsewhere): they no longer pin anything.
    pub(super) fn unpin_all(&self, property: *const ()) {
        for waiter in self.replies.waiting.borrow_mut().values_mut() {
            if waiter.pinned == Some(property) {
                waiter.pinned = None;
            }
        }
    }

    /// Trustee: hands a finished cell (the trustee's reference) to its client.
    pub(crate) fn send_late(&self, late: LateRef) {
        self.registry.inject(late.client(), Injected::Late(late));
    }

    /// Trustee: times out the waiting requests whose deadline has passed; returns whether
    /// there were any.
    pub(super) fn expire_due(&self) -> bool {
        if self.replies.deadlines.borrow().is_empty() {
            return false;
        }
        let now = Instant::now();
        let mut expired = false;
        loop {
            let due = {
                let mut deadlines = self.replies.deadlines.borrow_mut();
                match deadlines.first() {
                    Some(&(at, id)) if at <= now => {
                        deadlines.pop_first();
                        id
                    }
                    _ => break,
                }
            };
            let Some(waiter) = self.replies.waiting.borrow_mut().remove(&due) else {
                continue;
            };
            // No move runs before the expiry: both run on this worker.
            let (late, deadline) = waiter.end();
            let (_, expire) = deadline.expect("a request with a deadline has one");
            let outcome = {
                let _delegated = self.enter(Running::Delegated);
                catch_unwind(AssertUnwindSafe(|| expire(due)))
            };
            if let Err(panic) = outcome {
                self.registry.unhandled_panic(panic);
            }
            // SAFETY: the waiter left the table, so this is its cell's one outcome, written
            // with the trustee's reference.
            unsafe { late.fail(Failure::TimedOut) };
            self.send_late(late);
            expired = true;
        }
        expired
    }

    /// Trustee: the earliest deadline of a waiting request.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.replies.deadlines.borrow().first().map(|&(at, _)| at)
    }

    /// Trustee, at shutdown: ends every waiting request as cancelled.
    pub(super) fn cancel_waiting(&self) {
        self.replies.deadlines.borrow_mut().clear();
        let waiters: Vec<Waiter> = self
            .replies
            .waiting
            .borrow_mut()
            .drain()
            .map(|(_, w)| w)
            .collect();
        for waiter in waiters {
            let (late, deadline) = waiter.end();
            // SAFETY: the waiter left the table: its cell's one outcome.
            unsafe { late.fail(Failure::Cancelled) };
            self.send_late(late);
            // Its expiry, if any, drops here: the property may be freed, and its replies
            // find nothing left to answer.
            drop(deadline);
        }
    }

    /// Client: a deferred request came back without its answer; `deliver` runs once the
    /// answer arrives (at once if it already has). `late` is the client's reference.
    pub(crate) fn await_late(&self, late: LateRef, deliver: Deliver) {
        // SAFETY: on the client's thread.
        match unsafe { late.waiting() } {
            Waiting::Arrived => deliver(late, true),
            Waiting::Unclaimed => {
                let mut awaiting = self.replies.awaiting.borrow_mut();
                let (entries, free) = &mut *awaiting;
                let at = free.pop().unwrap_or_else(|| {
                    entries.push(None);
                    entries.len() - 1
                });
                // SAFETY: on the client's thread.
                unsafe { late.set_waiting(Waiting::At(at)) };
                entries[at] = Some((late, deliver));
            }
            Waiting::At(_) => unreachable!("a late answer is claimed once"),
        }
    }

    /// Client: the trustee's reference to a finished cell arrived (from the injector).
    pub(super) fn late_arrived(&self, arrived: LateRef) {
        // SAFETY: on the client's thread.
        let mut waiting = unsafe { arrived.waiting() };
        if waiting == Waiting::Unclaimed {
            // Its batch has most likely come back, unseen yet: taking it first claims the
            // cell, so late answers are delivered in the order they were sent.
            self.take_answers(arrived.trustee());
            // SAFETY: as above.
            waiting = unsafe { arrived.waiting() };
        }
        match waiting {
            Waiting::At(at) => {
                let (late, deliver) = {
                    let mut awaiting = self.replies.awaiting.borrow_mut();
                    awaiting.1.push(at);
                    awaiting.0[at].take().expect("a claimed late answer waits")
                };
                drop(arrived);
                deliver(late, true);
            }
            // SAFETY: on the client's thread.
            Waiting::Unclaimed => unsafe { arrived.set_waiting(Waiting::Arrived) },
            Waiting::Arrived => unreachable!("a late answer arrives once"),
        }
    }

    /// Client, at shutdown: drops every awaited delivery without running it.
    pub(super) fn discard_awaiting(&self) {
        let entries = std::mem::take(&mut self.replies.awaiting.borrow_mut().0);
        for (late, deliver) in entries.into_iter().flatten() {
            deliver(late, false);
        }
    }
}
