//! The delegation channel between one client and one trustee: the client hands over a batch
//! (see `request`) by its address, and the trustee hands it back with the answers written into
//! it.
//!
//! # Protocol
//!
//! Each side has a sequence number, `request.seq` (stored only by the client) and
//! `response.seq` (stored only by the trustee). Everything else — the published batch's
//! address, length and words — is owned by turn:
//!
//! * **Idle** (`request.seq == response.seq`): the client owns everything. It writes the
//!   address and length of a batch of records, then publishes with a *release* store of
//!   `request.seq + 1`. It keeps staging new requests into other batches meanwhile.
//! * **Requested** (`request.seq != response.seq`): the trustee owns everything, the batch's
//!   words included. It sees the batch with an *acquire* load of `request.seq`, which makes the
//!   client's writes of the records visible; it runs each record in order, writes the answers
//!   (or panics) into the records, and hands the channel back with a *release* store of
//!   `response.seq = request.seq`.
//! * The client sees the answer with an *acquire* load of `response.seq`, which makes the
//!   trustee's writes visible; it runs the completions, and the channel is idle again.
//!
//! Each sequence number has one writer, so no read-modify-write instruction is needed; a release
//! store and an acquire load are plain moves on x86. Only one batch per channel is in flight at a
//! time; nothing is copied either way.
//!
//! # Shutdown
//!
//! When the runtime stops, every worker first leaves its loop (no side touches a channel any
//! more), then each trustee flags the records of unanswered batches cancelled and answers
//! them, so the client's completions drop the closures that never ran and read no answers. The module `loom_tests` below model-checks the hand-over.

use std::ptr;

use crate::loom::cell::UnsafeCell;
use crate::loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use crate::request::{BatchWords, cancel_all};

#[repr(align(128))]
struct RequestSide {
    seq: AtomicU32,
    /// The published batch and its length in words.
    batch: UnsafeCell<(*const BatchWords, usize)>,
}

#[repr(align(128))]
struct ResponseSide {
    seq: AtomicU32,
}

/// One (client, trustee) channel.
pub(crate) struct Channel {
    request: RequestSide,
    /// Batches the client has started for this trustee so far (written only by the client;
    /// see `free`). The trustee reads it when a property dies, to wait for requests still on
    /// their way.
    staged: AtomicU64,
    response: ResponseSide,
}

// SAFETY: the cells are owned by turn, as the module docs describe: a side touches them only
// after an acquire load showed the channel is its turn, and hands them over with a release store.
unsafe impl Sync for Channel {}
// SAFETY: the channel holds only the address of a batch, whose payloads are `Send` closures.
unsafe impl Send for Channel {}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel").finish_non_exhaustive()
    }
}

impl Channel {
    pub(crate) fn new() -> Self {
        Channel {
            request: RequestSide {
                seq: AtomicU32::new(0),
                batch: UnsafeCell::new((ptr::null(), 0)),
            },
            staged: AtomicU64::new(0),
            response: ResponseSide {
                seq: AtomicU32::new(0),
            },
        }
    }

    // ----- client side -----

    /// Counts one more batch started. Only the client calls this, so a load and a store
    /// suffice; readers order themselves through the requests' own publication (see `free`).
    pub(crate) fn add_staged(&self) {
        let v = self.staged.load(Ordering::Relaxed);
        self.staged.store(v + 1, Ordering::Relaxed);
    }

    /// Client side: whether the last published batch has been answered (true before any).
    pub(crate) fn answered(&self) -> bool {
        // The client is the only writer of `request.seq`, so a relaxed load reads its own store.
        self.response.seq.load(Ordering::Acquire) == self.request.seq.load(Ordering::Relaxed)
    }

    /// Publishes the batch at `words`, `len` words of records, and hands it to the trustee.
    ///
    /// # Safety
    /// Client only, while the channel is idle (`answered()` returned true and the answers were
    /// taken); `words` holds `len` words of complete records, and stays alive and untouched by
    /// the client until the batch is answered and completed.
    pub(crate) unsafe fn publish(&self, words: *const BatchWords, len: usize) {
        // SAFETY: the client owns the request side while idle (module protocol).
        self.request
            .batch
            .with_mut(|b| unsafe { *b = (words, len) });
        let next = self.request.seq.load(Ordering::Relaxed).wrapping_add(1);
        self.request.seq.store(next, Ordering::Release);
    }

    // ----- trustee side -----

    /// Trustee side: whether a batch waits to be served.
    pub(crate) fn has_request(&self) -> bool {
        self.request.seq.load(Ordering::Acquire) != self.response.seq.load(Ordering::Relaxed)
    }

    /// The number of batch `batch` of this channel (a `staged` count) if the client has
    /// started it, else the number of the last batch it started; with `None`, the latter.
    /// Any thread (see `home`: where a moved property's requests may still wait).
    pub(crate) fn started_up_to(&self, batch: Option<u32>) -> u64 {
        let started = self.staged();
        match batch {
            // The counts differ by a few batches at most: compared as wrapping `u32`s.
            Some(b) if (started as u32).wrapping_sub(b) as i32 >= 0 => u64::from(b),
            _ => started,
        }
    }

    /// Batches started by the client so far (see [`Channel::add_staged`]).
    pub(crate) fn staged(&self) -> u64 {
        self.staged.load(Ordering::Relaxed)
    }

    /// If a batch is waiting, runs `serve` on it and answers, unless `serve` returns false:
    /// then the batch stays the trustee's, *parked*, until [`Channel::answer`]. Returns
    /// whether there was a batch. `serve` receives the batch's words and their length.
    ///
    /// # Safety
    /// Trustee only, and not while a batch of this channel is parked; `serve` must run every
    /// record of the batch exactly once, now or (parked) before the answer.
    pub(crate) unsafe fn serve(&self, serve: impl FnOnce(&BatchWords, usize) -> bool) -> bool {
        let answered = self.response.seq.load(Ordering::Relaxed);
        let requested = self.request.seq.load(Ordering::Acquire);
        if requested == answered {
            return false;
        }
        let answer = self.request.batch.with(|b| {
            // SAFETY: the trustee owns the request side and the batch while it is requested;
            // the client keeps the batch alive until it is answered.
            // SAFETY: as above.
            let (words, len) = unsafe { *b };
            // SAFETY: as above.
            serve(unsafe { &*words }, len)
        });
        if answer {
            self.response.seq.store(requested, Ordering::Release);
        }
        true
    }

    /// Trustee side: answers the parked batch (see [`Channel::serve`]).
    ///
    /// # Safety
    /// Trustee only; a batch of this channel is parked and every record of it has run.
    pub(crate) unsafe fn answer(&self) {
        let requested = self.request.seq.load(Ordering::Relaxed);
        self.response.seq.store(requested, Ordering::Release);
    }

    /// Any thread: whether the channel has answered the first `batches` batches its client
    /// started (`staged` counts them; see `free`). Acquire: what the trustee did before
    /// answering them happens before what the caller does next.
    pub(crate) fn answered_up_to(&self, batches: u64) -> bool {
        let answered = self.response.seq.load(Ordering::Acquire);
        // The counts differ by a few batches at most, far less than half the range.
        answered.wrapping_sub(batches as u32) as i32 >= 0
    }

    /// Shutdown only: flags the records of an unanswered batch cancelled (see `request`) and
    /// answers it.
    ///
    /// # Safety
    /// No trustee serves the channel any more (every worker has left its loop), and the client
    /// is not publishing: called by the trustee's worker at shutdown, or by an external client
    /// for its own batch once the workers have exited.
    pub(crate) unsafe fn cancel(&self) {
        let answered = self.response.seq.load(Ordering::Relaxed);
        let requested = self.request.seq.load(Ordering::Acquire);
        if requested == answered {
            return;
        }
        self.request.batch.with(|b| {
            // SAFETY: a requested batch belongs to the trustee; nobody else runs any more.
            unsafe {
                let (words, len) = *b;
                cancel_all(&*words, len);
            }
        });
        self.response.seq.store(requested, Ordering::Release);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::park::Parker;
    use crate::record::{store, take};
    use crate::request::{Batch, CLOSURE_AT, RunFn, run_all, take_answer, take_done};
    use loom::sync::Arc;

    /// A run trampoline for the models: the closure is a number, the answer that number plus
    /// one; the property address is unused.
    unsafe fn run_plus_one(record: *mut u64) {
        // SAFETY: pushed as `push::<u64, u64, _>`: the closure and the answer are `u64`s.
        unsafe {
            let n: u64 = take(record.add(CLOSURE_AT));
            store(record.add(CLOSURE_AT), n + 1);
        }
    }

    /// A complete trampoline for the models: writes the answer where the payload points.
    unsafe fn complete_into(record: *mut u64, run: bool) {
        // SAFETY: pushed as `push::<u64, u64, *mut Option<u64>>` by the model.
        unsafe {
            let target = take_done::<u64, u64, *mut Option<u64>>(record);
            let answer = take_answer::<u64, u64>(record);
            if run {
                *target = answer.map(|a| a.unwrap_or_else(|_| panic!("no panic in the model")));
            }
        }
    }

    /// Stages one request for `n` whose answer goes to `target`.
    fn push_plus_one(batch: &mut Batch, n: u64, target: *mut Option<u64>) {
        let run: RunFn = run_plus_one;
        // SAFETY: the trampolines above consume exactly these types.
        unsafe {
            batch.push::<u64, u64, *mut Option<u64>>(run, ptr::null(), complete_into, n, target)
        };
    }

    /// The whole hand-over as workers run it: the trustee parks until a batch arrives, the
    /// client parks until it is answered, and each wakes the other after publishing. A lost
    /// wake-up would leave a thread parked forever, which loom reports as a deadlock.
    #[test]
    fn both_sides_park_and_wake_each_other() {
        loom::model(|| {
            let ch = Arc::new(Channel::new());
            let client_parker = Arc::new(Parker::new());
            let trustee_parker = Arc::new(Parker::new());
            let trustee = {
                let (ch, client_parker, trustee_parker) =
                    (ch.clone(), client_parker.clone(), trustee_parker.clone());
                loom::thread::spawn(move || {
                    loop {
                        // SAFETY: this thread is the only trustee of `ch`.
                        if unsafe {
                            ch.serve(|words, len| {
                                run_all(words, len);
                                true
                            })
                        } {
                            client_parker.wake();
                            return;
                        }
                        trustee_parker.prepare();
                        if ch.has_request() {
                            trustee_parker.cancel();
                        } else {
                            trustee_parker.park();
                        }
                    }
                })
            };
            let mut got = None;
            let mut batch = Batch::new();
            push_plus_one(&mut batch, 41, &mut got);
            // SAFETY: this thread is the only client and nothing was published yet; the batch
            // lives until it is completed below.
            unsafe { ch.publish(batch.words(), batch.len()) };
            trustee_parker.wake();
            loop {
                if ch.answered() {
                    break;
                }
                client_parker.prepare();
                if ch.answered() {
                    client_parker.cancel();
                    break;
                }
                client_parker.park();
            }
            // SAFETY: answered; completed once.
            unsafe { batch.complete(true) };
            assert_eq!(got, Some(42));
            trustee.join().unwrap();
        });
    }

    /// The client stages its second batch in a second buffer while the first is in flight,
    /// then publishes it once the first is answered: loom checks every interleaving for data
    /// races on the batches' words (the trustee writes answers into them in place) and for
    /// lost or torn answers.
    #[test]
    fn batches_hand_over_without_races() {
        loom::model(|| {
            let ch = Arc::new(Channel::new());
            let trustee = {
                let ch = ch.clone();
                loom::thread::spawn(move || {
                    let mut served = 0;
                    while served < 2 {
                        // SAFETY: this thread is the only trustee of `ch`.
                        if unsafe {
                            ch.serve(|words, len| {
                                run_all(words, len);
                                true
                            })
                        } {
                            served += 1;
                        } else {
                            loom::thread::yield_now();
                        }
                    }
                })
            };
            let mut got = [None, None, None];
            let (mut first, mut second) = (Batch::new(), Batch::new());
            push_plus_one(&mut first, 10, &mut got[0]);
            // SAFETY: this thread is the only client; the channel is idle; `first` lives and
            // is left alone until it is completed.
            unsafe { ch.publish(first.words(), first.len()) };
            push_plus_one(&mut second, 20, &mut got[1]);
            push_plus_one(&mut second, 30, &mut got[2]);
            while !ch.answered() {
                loom::thread::yield_now();
            }
            // SAFETY: answered; completed once. Then the channel is idle for `second`.
            unsafe {
                first.complete(true);
                ch.publish(second.words(), second.len());
            }
            while !ch.answered() {
                loom::thread::yield_now();
            }
            // SAFETY: answered; completed once.
            unsafe { second.complete(true) };
            assert_eq!(got, [Some(11), Some(21), Some(31)]);
            trustee.join().unwrap();
        });
    }

    /// At shutdown the trustee cancels a published batch it never ran: the closure is dropped
    /// and the completion sees the request as cancelled.
    #[test]
    fn a_cancelled_batch_completes_without_answers() {
        loom::model(|| {
            let ch = Arc::new(Channel::new());
            let mut got = Some(0);
            let mut batch = Batch::new();
            push_plus_one(&mut batch, 1, &mut got);
            // SAFETY: the only client; idle; the batch lives until completed.
            unsafe { ch.publish(batch.words(), batch.len()) };
            let trustee = {
                let ch = ch.clone();
                // SAFETY: nobody serves the channel; this thread cancels as the trustee.
                loom::thread::spawn(move || unsafe { ch.cancel() })
            };
            trustee.join().unwrap();
            assert!(ch.answered());
            // SAFETY: answered (cancelled); completed once.
            unsafe { batch.complete(true) };
            assert_eq!(got, None);
        });
    }
}
