//! The cell of a late answer: what a deferred request (`Trust::apply_deferred`) leaves in its
//! record when its closure returns without answering, and what its answer, sent later by
//! another closure on the trustee, travels through.
//!
//! # Protocol
//!
//! The trustee makes the cell when the closure returns unanswered, with two references: the
//! trustee's, kept with the waiting request in the trustee's table (`worker/replies`), and the
//! client's, written into the request's record where the answer would have been. Then:
//!
//! * The trustee writes the *outcome* once — the answer, a panic (the reply was dropped
//!   unanswered), a time-out, or cancellation at shutdown — then hands its reference to the
//!   client worker through that worker's injector (`Injected::Late`). The injector's lock
//!   orders the outcome before everything the client does after taking the item.
//! * The client learns of the cell twice, in either order, both times on its own thread: when
//!   the batch with the record comes back (it *claims* the cell, registering what to do with
//!   the answer) and when the injected reference arrives. Whichever comes second delivers.
//!   The client's bookkeeping (`Waiting`) lives in the cell but only the client thread
//!   touches it.
//! * Each reference is dropped once; the last drop frees the cell (a release decrement and an
//!   acquire fence, as `Arc` does). A reference may be dropped on any thread: an injected one
//!   that arrives after shutdown is dropped by the injector.
//!
//! The outcome is read only after the injected reference was taken, so its one write
//! happens before its one read; the loom tests below check the hand-over in both orders and
//! the count.

use std::ptr::NonNull;

use crate::loom::cell::UnsafeCell;
use crate::loom::sync::atomic::{AtomicUsize, Ordering, fence};
use crate::request::Panic;

/// How a deferred request ended, as its caller learns it.
pub(crate) enum Finished<R> {
    /// The reply was sent.
    Answer(R),
    /// The closure panicked, or its reply was dropped unanswered.
    Panicked(Panic),
    /// The request's deadline passed first.
    TimedOut,
    /// The runtime shut down first.
    Cancelled,
}

/// An outcome without an answer, written by code that does not know the answer's type.
pub(crate) enum Failure {
    Panicked(Panic),
    TimedOut,
    Cancelled,
}

/// The client's bookkeeping of one cell (client thread only).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Waiting {
    /// Neither claimed nor arrived yet.
    Unclaimed,
    /// The trustee's reference arrived before the client claimed the cell.
    Arrived,
    /// Claimed: the delivery waits at this index of the client's table.
    At(usize),
}

/// The part of a cell that does not depend on the answer's type; a cell is `#[repr(C)]` with
/// this first, so a pointer to either is a pointer to both.
struct Head {
    refs: AtomicUsize,
    /// The worker that made the request.
    client: usize,
    /// The worker whose trustee runs it.
    trustee: usize,
    waiting: UnsafeCell<Waiting>,
    fail: unsafe fn(NonNull<Head>, Failure),
    free: unsafe fn(NonNull<Head>),
}

#[repr(C)]
struct Cell<R> {
    head: Head,
    outcome: UnsafeCell<Option<Finished<R>>>,
}

/// One counted reference to a late-answer cell. See the module docs for who holds which.
pub(crate) struct LateRef(NonNull<Head>);

// SAFETY: the count is atomic; the outcome is written once before the injector hand-over
// and read once after it; `waiting` is touched only by the
// client's thread (module docs). The answer type is `Send` (required by `Cell::make`).
unsafe impl Send for LateRef {}

impl LateRef {
    /// A new cell for a request of worker `client` to the trustee on worker `trustee`:
    /// (the trustee's reference, the client's reference).
    pub(crate) fn make<R: Send>(client: usize, trustee: usize) -> (LateRef, LateRef) {
        let cell = Box::new(Cell::<R> {
            head: Head {
                refs: AtomicUsize::new(2),
                client,
                trustee,
                waiting: UnsafeCell::new(Waiting::Unclaimed),
                fail: fail::<R>,
                free: free::<R>,
            },
            outcome: UnsafeCell::new(None),
        });
        let head = NonNull::from(Box::leak(cell)).cast::<Head>();
        (LateRef(head), LateRef(head))
    }

    fn head(&self) -> &Head {
        // SAFETY: the cell lives while a reference does.
        unsafe { self.0.as_ref() }
    }

    pub(crate) fn client(&self) -> usize {
        self.head().client
    }

    pub(crate) fn trustee(&self) -> usize {
        self.head().trustee
    }

    /// Trustee: finishes the request with its answer.
    ///
    /// # Safety
    /// Called once per cell, with the trustee's reference, and `R` is the cell's answer type.
    pub(crate) unsafe fn answer<R>(&self, answer: R) {
        // SAFETY: per the caller.
        unsafe { finish(self.0, Finished::Answer(answer)) }
    }

    /// Trustee: finishes the request without an answer.
    ///
    /// # Safety
    /// Called once per cell, with the trustee's reference.
    pub(crate) unsafe fn fail(&self, failure: Failure) {
        // SAFETY: per the caller; `fail` was monomorphized for the cell's answer type.
        unsafe { (self.head().fail)(self.0, failure) }
    }

    /// Client: takes the outcome.
    ///
    /// # Safety
    /// Called once per cell, on the client's thread, after the trustee's reference was taken
    /// from the injector; `R` is the answer type.
    pub(crate) unsafe fn take<R>(&self) -> Finished<R> {
        // SAFETY: per the caller the outcome was written and nobody else reads it; the cell
        // was made as a `Cell<R>`.
        unsafe {
            self.0
                .cast::<Cell<R>>()
                .as_ref()
                .outcome
                .with_mut(|o| (*o).take())
                .expect("a late answer is taken once, after it was written")
        }
    }

    /// Client: its bookkeeping of the cell.
    ///
    /// # Safety
    /// Called on the client's thread.
    pub(crate) unsafe fn waiting(&self) -> Waiting {
        // SAFETY: only the client's thread touches `waiting`.
        self.head().waiting.with(|w| unsafe { *w })
    }

    /// Client: updates its bookkeeping.
    ///
    /// # Safety
    /// Called on the client's thread.
    pub(crate) unsafe fn set_waiting(&self, waiting: Waiting) {
        // SAFETY: only the client's thread touches `waiting`.
        self.head().waiting.with_mut(|w| unsafe { *w = waiting })
    }
}

impl Drop for LateRef {
    fn drop(&mut self) {
        if self.head().refs.fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        // Every other reference's uses happen before this free.
        fence(Ordering::Acquire);
        // SAFETY: this was the last reference; `free` matches the cell's type.
        unsafe { (self.head().free)(self.0) }
    }
}

/// # Safety
/// As [`LateRef::answer`].
unsafe fn finish<R>(head: NonNull<Head>, outcome: Finished<R>) {
    // SAFETY: per the caller the cell is a `Cell<R>`, and nobody reads the outcome before the
    // trustee's reference is handed over, after this write.
    unsafe {
        head.cast::<Cell<R>>().as_ref().outcome.with_mut(|o| {
            debug_assert!((*o).is_none(), "a late answer is written once");
            *o = Some(outcome);
        });
    }
}

unsafe fn fail<R>(head: NonNull<Head>, failure: Failure) {
    let outcome = match failure {
        Failure::Panicked(p) => Finished::<R>::Panicked(p),
        Failure::TimedOut => Finished::TimedOut,
        Failure::Cancelled => Finished::Cancelled,
    };
    // SAFETY: per `LateRef::fail`'s caller.
    unsafe { finish(head, outcome) }
}

unsafe fn free<R>(head: NonNull<Head>) {
    // SAFETY: made by `LateRef::make` as a boxed `Cell<R>`; no reference is left.
    drop(unsafe { Box::from_raw(head.cast::<Cell<R>>().as_ptr()) });
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::{Arc, Mutex};

    /// The trustee finishes the cell and hands its reference over through a locked queue (the
    /// injector), while the client claims the cell from its record; in every interleaving the
    /// client delivers exactly once, reads the answer the trustee wrote, and the cell is freed
    /// once (loom reports a leak or a double free).
    #[test]
    fn the_answer_is_delivered_once_whichever_side_comes_second() {
        loom::model(|| {
            let (trustee, client) = LateRef::make::<u64>(0, 1);
            let queue = Arc::new(Mutex::new(Vec::<LateRef>::new()));
            let sender = {
                let queue = queue.clone();
                loom::thread::spawn(move || {
                    // SAFETY: once, with the trustee's reference, as a `u64` cell.
                    unsafe { trustee.answer(7u64) };
                    queue.lock().unwrap().push(trustee);
                })
            };
            let mut delivered = Vec::new();
            let mut claimed = None;
            let mut deliver = |r: &LateRef| {
                // SAFETY: on the client thread, after the hand-over (see below).
                match unsafe { r.take::<u64>() } {
                    Finished::Answer(v) => delivered.push(v),
                    _ => panic!("wrong outcome"),
                }
            };
            // The client claims (its batch came back) and takes injected items, in turn.
            for step in 0..2 {
                if step == 0 {
                    // SAFETY: the client's thread.
                    match unsafe { client.waiting() } {
                        Waiting::Arrived => deliver(&client),
                        _ => unsafe { client.set_waiting(Waiting::At(0)) },
                    }
                    claimed = Some(());
                }
                let arrived: Vec<LateRef> = std::mem::take(&mut *queue.lock().unwrap());
                for r in arrived {
                    // SAFETY: the client's thread; taken from the queue, so written.
                    match unsafe { r.waiting() } {
                        Waiting::At(_) => deliver(&r),
                        _ => unsafe { r.set_waiting(Waiting::Arrived) },
                    }
                }
            }
            sender.join().unwrap();
            let arrived: Vec<LateRef> = std::mem::take(&mut *queue.lock().unwrap());
            for r in arrived {
                // SAFETY: as above.
                if unsafe { r.waiting() } == Waiting::At(0) {
                    deliver(&r);
                }
            }
            assert!(claimed.is_some());
            assert_eq!(delivered, vec![7], "one delivery, of the answer written");
            drop(client);
        });
    }

    /// The two references are dropped on different threads, in either order, after a
    /// failure outcome was written: the cell and its outcome are freed once.
    #[test]
    fn the_last_reference_frees_the_cell() {
        loom::model(|| {
            let (trustee, client) = LateRef::make::<Box<u64>>(0, 1);
            let sender = loom::thread::spawn(move || {
                // SAFETY: once, with the trustee's reference.
                unsafe { trustee.answer(Box::new(5u64)) };
                drop(trustee);
            });
            drop(client);
            sender.join().unwrap();
        });
    }
}
