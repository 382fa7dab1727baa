//! [`Reply<R>`]: the one-shot answer of a deferred request ([`Trust::apply_deferred`]), which
//! the trustee may send while the request's closure runs or keep in the property and send
//! from a later closure.
//!
//! A reply sent while its own closure runs writes the answer into the request's record, as
//! `apply` does; only a request left unanswered gets a cell (`late`) and an entry in its
//! trustee's table (`worker/replies`), which the later `send`, a drop or the deadline ends.
//! A reply names its request by its trustee's worker (the runtime's serial number and the
//! worker's index: `Worker::place`) and an id, and holds no pointer, so a reply that outlives
//! its runtime is harmless.
//!
//! [`Trust::apply_deferred`]: crate::Trust::apply_deferred

use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;

use crate::inject::Injected;
use crate::late::{Failure, LateRef};
use crate::record;
use crate::registry;
use crate::request::Panic;
use crate::worker::{self, Claim, Worker};

/// The answer to a deferred request: the caller's `apply_deferred` (or its `then`, or its
/// future) gets the value given to [`Reply::send`].
///
/// A reply is one-shot and not `Clone`. It may be kept in the property and sent by a later
/// closure on the same trustee; it must be sent on that trustee's worker. Dropping it unsent
/// gives the caller a panic ("request abandoned: its Reply was dropped unanswered"), so a
/// forgotten reply never leaves a caller waiting forever.
///
/// ```
/// use std::collections::VecDeque;
/// use trust::Reply;
///
/// /// A queue whose `take` waits until something is put.
/// #[derive(Default)]
/// struct Mailbox { items: VecDeque<u32>, takers: VecDeque<Reply<u32>> }
///
/// let rt = trust::Runtime::builder().workers(2).build().unwrap();
/// let mailbox = rt.entrust(Mailbox::default());
/// let taker = {
///     let mailbox = mailbox.clone();
///     rt.spawn(move || {
///         mailbox.apply_deferred(|m: &mut Mailbox, reply| match m.items.pop_front() {
///             Some(item) => { let _ = reply.send(item); }
///             None => m.takers.push_back(reply), // answered by a later `put`
///         })
///     })
/// };
/// rt.block_on(|| {
///     while mailbox.apply(|m| m.takers.is_empty()) {
///         trust::yield_now(); // until the taker waits
///     }
///     mailbox.apply(|m| match m.takers.pop_front() {
///         Some(reply) => { let _ = reply.send(42); }
///         None => m.items.push_back(42),
///     });
/// });
/// assert_eq!(taker.join(), 42);
/// ```
#[must_use = "a reply dropped unsent abandons its request: its caller panics"]
pub struct Reply<R> {
    id: u64,
    /// The trustee's worker (`Worker::place`).
    place: u64,
    _answer: PhantomData<fn(R)>,
}

/// Names a deferred request among those of its trustee: what [`Reply::id`] returns and what
/// an `on_expire` function (see [`Trust::apply_deferred_until`]) receives, so that the
/// property can forget the reply it keeps for that request.
///
/// [`Trust::apply_deferred_until`]: crate::Trust::apply_deferred_until
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ReplyId(pub(crate) u64);

/// The deadline of [`Trust::apply_deferred_until`] passed before the request was answered.
///
/// [`Trust::apply_deferred_until`]: crate::Trust::apply_deferred_until
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TimedOut;

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the deadline passed before the request was answered")
    }
}

impl std::error::Error for TimedOut {}

/// What a deferred request's record holds in place of its answer.
pub(crate) enum Deferred<R> {
    /// Answered while its closure ran.
    Now(R),
    /// Answered later, through this cell (the client's reference).
    Later(LateRef),
}

/// The panic a caller gets when its request's reply was dropped unsent.
pub(crate) fn abandoned() -> Panic {
    Box::new("request abandoned: its Reply was dropped unanswered")
}

impl<R> Reply<R> {
    pub(crate) fn new(id: u64, w: &Worker) -> Self {
        Reply {
            id,
            place: w.place,
            _answer: PhantomData,
        }
    }

    /// This reply's request, as an `on_expire` function will name it.
    pub fn id(&self) -> ReplyId {
        ReplyId(self.id)
    }

    /// The trustee's worker, if this thread runs it.
    #[inline]
    fn own_worker(&self) -> Option<&'static Worker> {
        worker::current().filter(|w| w.place == self.place)
    }

    /// The trustee's worker index.
    fn worker(&self) -> usize {
        (self.place & u64::from(u32::MAX)) as usize
    }

    /// Answers the request. `Err(answer)` if it has already ended without an answer — its
    /// deadline passed, or its closure panicked — so the caller never sees `answer` and the
    /// property may take back whatever it was going to hand over.
    ///
    /// # Panics
    /// Off the trustee's worker: a reply is sent by a closure running on its trustee.
    #[inline]
    #[track_caller]
    pub fn send(self, answer: R) -> Result<(), R> {
        let Some(w) = self.own_worker() else {
            let worker = self.worker();
            drop(self); // abandons the request, so its caller does not wait forever
            panic!(
                "Reply::send called off its trustee (worker {}): send a reply from a closure \
                 running on the trustee whose request made it",
                worker
            );
        };
        let this = ManuallyDrop::new(self);
        match w.claim_reply(this.id, false) {
            Claim::Running(slot) => {
                // SAFETY: the request's closure runs now on this thread; its record's answer
                // area (`slot`) holds no value (the closure was moved out of it) and was laid
                // out for a `Deferred<R>` (`Trust::stage_deferred`).
                unsafe { record::store::<Deferred<R>>(slot, Deferred::Now(answer)) };
            }
            Claim::Waiting(late) => {
                // SAFETY: the request left its trustee's table here, so this is its cell's one
                // outcome, written with the trustee's reference; the cell holds an `R`.
                unsafe { late.answer(answer) };
                w.send_late(late);
            }
            Claim::Gone => return Err(answer),
        }
        Ok(())
    }
}

impl<R> fmt::Debug for Reply<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reply")
            .field("id", &self.id)
            .field("worker", &self.worker())
            .finish()
    }
}

impl<R> Drop for Reply<R> {
    fn drop(&mut self) {
        if let Some(w) = self.own_worker() {
            return abandon(w, self.id);
        }
        // Dropped elsewhere: the trustee abandons the request in its own loop (after the
        // closure that may still be running there). A runtime that is gone has ended it.
        if let Some(registry) = registry::find(self.place >> 32) {
            let id = self.id;
            registry.inject(
                self.worker(),
                Injected::Run(Box::new(move || {
                    if let Some(w) = worker::current() {
                        abandon(w, id);
                    }
                })),
            );
        }
    }
}

/// Ends request `id` of `w`'s trustee as abandoned, if it has not ended yet.
fn abandon(w: &Worker, id: u64) {
    match w.claim_reply(id, true) {
        // The closure still runs: the trampoline reports the abandonment when it returns.
        Claim::Running(_) | Claim::Gone => {}
        Claim::Waiting(late) => {
            // SAFETY: the request left the table here: its cell's one outcome.
            unsafe { late.fail(Failure::Panicked(abandoned())) };
            w.send_late(late);
        }
    }
}
