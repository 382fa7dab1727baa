//! The delegation channel between one client and one trustee: a request slot written only by the
//! client and a response slot written only by the trustee.
//!
//! # Protocol
//!
//! Each side has a sequence number, `request.seq` (stored only by the client) and
//! `response.seq` (stored only by the trustee). Every other byte of the channel — the request
//! words, the response words, the panic list and the `cancelled` flag — is owned by turn:
//!
//! * **Idle** (`request.seq == response.seq`): the client owns everything. It fills the request
//!   words with a batch of records (see `record`), then publishes with a *release* store of
//!   `request.seq + 1`.
//! * **Requested** (`request.seq != response.seq`): the trustee owns everything. It sees the new
//!   batch with an *acquire* load of `request.seq`, which makes the client's writes of the batch
//!   visible; it runs each record in order, writes the answers, and hands the channel back with a
//!   *release* store of `response.seq = request.seq`.
//! * The client sees the answer with an *acquire* load of `response.seq`, which makes the
//!   trustee's writes visible; it reads the answers, and the channel is idle again.
//!
//! Each sequence number has one writer, so no read-modify-write instruction is needed; a release
//! store and an acquire load are plain moves on x86. Only one batch per channel is in flight at a
//! time; the client keeps staging new requests locally meanwhile.
//!
//! # Shutdown
//!
//! When the runtime stops, every worker first leaves its loop (no side touches a channel any
//! more), then each trustee drops the records of unanswered batches with their drop trampolines,
//! marks them `cancelled` and answers, so the client drops its completions without reading. The
//! module `loom_tests` below model-checks the hand-over.

use std::any::Any;
use std::mem::size_of;
use std::ptr;

use crate::loom::cell::UnsafeCell;
use crate::loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use crate::record::{MAX_INLINE, WORD, words_for};

/// Capacity of a request slot, in words (2 KiB).
pub(crate) const REQUEST_WORDS: usize = 256;
/// Capacity of a response slot, in words (2 KiB).
pub(crate) const RESPONSE_WORDS: usize = 256;

/// A panic carried from a delegated closure back to its caller.
pub(crate) type Panic = Box<dyn Any + Send + 'static>;

/// Words the answer of type `R` takes in a response slot.
pub(crate) const fn response_words<R>() -> usize {
    if inline_response::<R>() {
        words_for(size_of::<R>())
    } else {
        1
    }
}

const fn inline_response<R>() -> bool {
    size_of::<R>() <= MAX_INLINE && std::mem::align_of::<R>() <= WORD
}

#[repr(align(128))]
struct RequestSide {
    seq: AtomicU32,
    len_words: UnsafeCell<u32>,
    words: UnsafeCell<[u64; REQUEST_WORDS]>,
}

#[repr(align(128))]
struct ResponseSide {
    seq: AtomicU32,
    cancelled: UnsafeCell<bool>,
    panics: UnsafeCell<Vec<(u32, Panic)>>,
    words: UnsafeCell<[u64; RESPONSE_WORDS]>,
}

/// One (client, trustee) channel.
pub(crate) struct Channel {
    request: RequestSide,
    /// Requests the client has staged for this trustee so far (written only by the client).
    /// The trustee reads it when a property dies, to wait for requests still on their way.
    staged: AtomicU64,
    response: ResponseSide,
}

// SAFETY: the cells are owned by turn, as the module docs describe: a side touches them only
// after an acquire load showed the channel is its turn, and hands them over with a release store.
unsafe impl Sync for Channel {}
// SAFETY: the channel owns the records in it, whose payloads are `Send` closures.
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
                len_words: UnsafeCell::new(0),
                words: UnsafeCell::new([0; REQUEST_WORDS]),
            },
            staged: AtomicU64::new(0),
            response: ResponseSide {
                seq: AtomicU32::new(0),
                cancelled: UnsafeCell::new(false),
                panics: UnsafeCell::new(Vec::new()),
                words: UnsafeCell::new([0; RESPONSE_WORDS]),
            },
        }
    }

    // ----- client side -----

    /// Counts `n` more staged requests. Only the client calls this, so a load and a store
    /// suffice; readers order themselves through the requests' own publication.
    pub(crate) fn add_staged(&self, n: u64) {
        let v = self.staged.load(Ordering::Relaxed);
        self.staged.store(v + n, Ordering::Relaxed);
    }

    /// Client side: whether the last published batch has been answered (true before any).
    pub(crate) fn answered(&self) -> bool {
        // The client is the only writer of `request.seq`, so a relaxed load reads its own store.
        self.response.seq.load(Ordering::Acquire) == self.request.seq.load(Ordering::Relaxed)
    }

    /// Publishes a batch: copies `len_words` words of records from `src` and hands the channel
    /// to the trustee.
    ///
    /// # Safety
    /// Client only, while the channel is idle (`answered()` returned true and the answers were
    /// taken); `src` holds `len_words` words of complete request records whose payloads now
    /// belong to the channel.
    pub(crate) unsafe fn publish(&self, src: *const u64, len_words: usize) {
        debug_assert!(len_words <= REQUEST_WORDS);
        self.request.words.with_mut(|w| {
            // SAFETY: the client owns the request words while idle (module protocol).
            unsafe { ptr::copy_nonoverlapping(src, w.cast::<u64>(), len_words) }
        });
        // SAFETY: as above.
        self.request
            .len_words
            .with_mut(|l| unsafe { *l = len_words as u32 });
        let next = self.request.seq.load(Ordering::Relaxed).wrapping_add(1);
        self.request.seq.store(next, Ordering::Release);
    }

    /// Reads the answers of the last batch.
    ///
    /// # Safety
    /// Client only, after `answered()` returned true for the last published batch, and
    /// at most once per batch.
    pub(crate) unsafe fn take_answers<T>(&self, f: impl FnOnce(&mut ResponseReader) -> T) -> T {
        self.response.words.with(|w| {
            self.response.cancelled.with_mut(|c| {
                self.response.panics.with_mut(|p| {
                    // SAFETY: the client owns the response side once answered (module protocol).
                    let (cancelled, panics) =
                        unsafe { (std::mem::take(&mut *c), std::mem::take(&mut *p)) };
                    let mut reader = ResponseReader {
                        words: w.cast::<u64>(),
                        at: 0,
                        index: 0,
                        cancelled,
                        panics,
                    };
                    f(&mut reader)
                })
            })
        })
    }

    // ----- trustee side -----

    /// Trustee side: whether a batch waits to be served.
    pub(crate) fn has_request(&self) -> bool {
        self.request.seq.load(Ordering::Acquire) != self.response.seq.load(Ordering::Relaxed)
    }

    /// Requests staged by the client so far (see [`Channel::add_staged`]).
    pub(crate) fn staged(&self) -> u64 {
        self.staged.load(Ordering::Relaxed)
    }

    /// If a batch is waiting, runs `serve` on its records and answers. Returns whether there
    /// was one. `serve` receives the request words, their length and the response writer.
    ///
    /// # Safety
    /// Trustee only; `serve` must consume every record's payload exactly once.
    pub(crate) unsafe fn serve(
        &self,
        serve: impl FnOnce(*mut u64, usize, &mut ResponseWriter),
    ) -> bool {
        let answered = self.response.seq.load(Ordering::Relaxed);
        let requested = self.request.seq.load(Ordering::Acquire);
        if requested == answered {
            return false;
        }
        self.request.words.with_mut(|rw| {
            self.request.len_words.with(|len| {
                self.response.words.with_mut(|ww| {
                    let mut writer = ResponseWriter {
                        words: ww.cast::<u64>(),
                        at: 0,
                        index: 0,
                        panics: Vec::new(),
                    };
                    // SAFETY: the trustee owns both sides while a batch is requested.
                    serve(rw.cast::<u64>(), unsafe { *len } as usize, &mut writer);
                    // SAFETY: as above.
                    self.response
                        .panics
                        .with_mut(|p| unsafe { *p = writer.panics });
                })
            })
        });
        self.response.seq.store(requested, Ordering::Release);
        true
    }

    /// Shutdown only: drops the records of an unanswered batch with `drop_records` and answers it
    /// as cancelled.
    ///
    /// # Safety
    /// No trustee serves the channel any more (every worker has left its loop), and the client
    /// is not publishing: called by the trustee's worker at shutdown, or by an external client
    /// for its own batch once the workers have exited.
    pub(crate) unsafe fn cancel(&self, drop_records: impl FnOnce(*mut u64, usize)) {
        let answered = self.response.seq.load(Ordering::Relaxed);
        let requested = self.request.seq.load(Ordering::Acquire);
        if requested == answered {
            return;
        }
        self.request.words.with_mut(|rw| {
            // SAFETY: a requested batch belongs to the trustee; nobody else runs any more.
            self.request
                .len_words
                .with(|len| drop_records(rw.cast::<u64>(), unsafe { *len } as usize))
        });
        // SAFETY: as above.
        self.response.cancelled.with_mut(|c| unsafe { *c = true });
        self.response.seq.store(requested, Ordering::Release);
    }
}

/// Writes answers into a response slot in request order (trustee side).
#[derive(Debug)]
pub(crate) struct ResponseWriter {
    words: *mut u64,
    at: usize,
    index: u32,
    panics: Vec<(u32, Panic)>,
}

impl ResponseWriter {
    /// Writes the answer to the current request and moves to the next.
    pub(crate) fn write<R>(&mut self, value: R) {
        // SAFETY: the client reserved `response_words::<R>()` words for this request when it
        // staged it, and the slot's words are 8-aligned; `R`'s alignment is at most 8 when inline.
        unsafe {
            let at = self.words.add(self.at);
            if inline_response::<R>() {
                at.cast::<R>().write(value);
            } else {
                at.cast::<*mut R>().write(Box::into_raw(Box::new(value)));
            }
        }
        self.at += response_words::<R>();
        self.index += 1;
    }

    /// Records that the current request panicked and moves to the next.
    pub(crate) fn panicked<R>(&mut self, panic: Panic) {
        self.panics.push((self.index, panic));
        self.at += response_words::<R>();
        self.index += 1;
    }
}

/// How one request ended, as seen by its completion.
pub(crate) enum Outcome {
    /// The answer is the next value in the reader.
    Value,
    /// The delegated closure panicked.
    Panicked(Panic),
    /// The runtime stopped before the request ran.
    Cancelled,
}

/// Reads answers from a response slot in request order (client side).
pub(crate) struct ResponseReader {
    words: *const u64,
    at: usize,
    index: u32,
    cancelled: bool,
    panics: Vec<(u32, Panic)>,
}

impl ResponseReader {
    /// A reader for a batch that was never published (shutdown): every request is cancelled.
    pub(crate) fn cancelled() -> Self {
        ResponseReader {
            words: ptr::null(),
            at: 0,
            index: 0,
            cancelled: true,
            panics: Vec::new(),
        }
    }

    /// How the current request ended. Must be followed by [`ResponseReader::read`] when it says
    /// `Value`, or by [`ResponseReader::skip`] otherwise.
    #[inline]
    pub(crate) fn outcome(&mut self) -> Outcome {
        if self.panics.is_empty() && !self.cancelled {
            return Outcome::Value;
        }
        self.unusual_outcome()
    }

    #[cold]
    fn unusual_outcome(&mut self) -> Outcome {
        if self.cancelled {
            return Outcome::Cancelled;
        }
        match self.panics.iter().position(|(i, _)| *i == self.index) {
            Some(p) => Outcome::Panicked(self.panics.swap_remove(p).1),
            None => Outcome::Value,
        }
    }

    /// Takes the current request's answer, which the trustee wrote as an `R`.
    ///
    /// # Safety
    /// The current request's outcome is `Value` and its answer type is `R`.
    pub(crate) unsafe fn read<R>(&mut self) -> R {
        // SAFETY: the caller guarantees the trustee wrote an `R` here (see `ResponseWriter::write`).
        let value = unsafe {
            let at = self.words.add(self.at);
            if inline_response::<R>() {
                at.cast::<R>().read()
            } else {
                *Box::from_raw(at.cast::<*mut R>().read())
            }
        };
        self.at += response_words::<R>();
        self.index += 1;
        value
    }

    /// Moves past a request that has no answer to read (panicked or cancelled).
    pub(crate) fn skip<R>(&mut self) {
        self.at += response_words::<R>();
        self.index += 1;
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::park::Parker;
    use loom::sync::Arc;

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
                        if unsafe { ch.serve(|req, _, out| out.write(req.read() + 1)) } {
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
            // SAFETY: this thread is the only client and nothing was published yet.
            unsafe { ch.publish(&41, 1) };
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
            // SAFETY: answered; taken once.
            let got = unsafe {
                ch.take_answers(|r| {
                    assert!(matches!(r.outcome(), Outcome::Value));
                    r.read::<u64>()
                })
            };
            assert_eq!(got, 42);
            trustee.join().unwrap();
        });
    }

    /// A client publishes two batches in turn; the trustee answers each. Loom checks every
    /// interleaving for data races on the slot words and for lost or torn answers.
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
                        let did = unsafe {
                            ch.serve(|req, len, out| {
                                assert_eq!(len, 1);
                                out.write(req.read() * 10);
                            })
                        };
                        if did {
                            served += 1;
                        } else {
                            loom::thread::yield_now();
                        }
                    }
                })
            };
            for round in 1..=2u64 {
                // SAFETY: this thread is the only client; the channel is idle (first round, or
                // the previous answer was taken below).
                unsafe { ch.publish(&round, 1) };
                while !ch.answered() {
                    loom::thread::yield_now();
                }
                // SAFETY: answered; taken once.
                let got = unsafe {
                    ch.take_answers(|r| {
                        assert!(matches!(r.outcome(), Outcome::Value));
                        r.read::<u64>()
                    })
                };
                assert_eq!(got, round * 10);
            }
            trustee.join().unwrap();
        });
    }
}
