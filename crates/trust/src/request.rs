//! The request format: one record per request, written in place into a *batch* buffer that
//! the client hands to the trustee whole, and that comes back with the answers in it.
//!
//! A record holds both halves of a request — what the trustee runs and what the client does
//! with the answer — so staging one is a handful of stores and a length bump:
//!
//! ```text
//! word 0      header: the record's length in words; flags for how it   both
//!             ended (answered, panicked, cancelled)
//! word 1      complete trampoline                                      client's
//! word 2      run trampoline                                           trustee's
//! word 3      property address (null, or a `Property` of `trust.rs`)   trustee's
//! word 4 ..   the closure, which the trustee replaces with its answer  trustee's
//!             (the area is as large as the larger of the two)
//! then        the completion's payload: a `then` callback, a waiting   client's
//!             fiber's slot, a future's cell
//! ```
//!
//! The trustee runs the records in order: each run trampoline moves its closure out, runs it
//! and writes the answer where the closure was; a closure that panics leaves its panic in
//! words 2–3 instead, and a flag in the header. When the batch is back, the client runs each
//! complete trampoline, which reads the outcome from the header and the answer in place. A
//! batch carries no other bookkeeping: no separate completion list, no answer slots, no panic
//! list. The trampolines are monomorphized in `trust.rs`, so each knows the types it moves
//! (rayon-core's `JobRef` is the same idea); both sides walk a batch by the headers.
//!
//! Ownership: the client owns the whole buffer while the batch is open and again after the
//! answer; the trustee owns it while it is published (the hand-over is in `channel`). Within
//! a record, the trustee touches only its own words and the header's flags. Payloads move
//! bitwise, and each is consumed exactly once: the closure by the run trampoline — or, if the
//! request never ran (flagged cancelled at shutdown), by the complete trampoline, which knows
//! its type too — and the answer and the completion's payload by the complete trampoline
//! (with `run == false` it only drops them).
//!
//! Payloads larger than [`MAX_INLINE`] bytes, or aligned to more than 8, are boxed.

use crate::loom::cell::UnsafeCell;
use crate::record::{MAX_INLINE, store, stored_size, take, words_for};
use std::any::Any;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

/// A panic carried from a delegated closure back to its caller.
pub(crate) type Panic = Box<dyn Any + Send + 'static>;

/// Runs a request: moves the closure out of the record, runs it on the property and writes the
/// answer (or the panic) into the record.
pub(crate) type RunFn = unsafe fn(record: *mut u64);
/// Consumes a record's completion payload, answer and, if it never ran, closure
/// (`run == false`: only drops them).
pub(crate) type CompleteFn = unsafe fn(record: *mut u64, run: bool);

/// Where the closure, then the answer, lies in a record.
pub(crate) const CLOSURE_AT: usize = 4;

/// Header flag: the closure panicked; its panic is in words 2–3.
const PANICKED: u64 = 1 << 62;
/// Header flag: the request never ran (the runtime stopped); its closure is still in place.
const CANCELLED: u64 = 1 << 63;
/// Header flag, with `CANCELLED`: the request never ran because its property was withdrawn
/// from the runtime (see `home`); its completion raises that as the closure's panic.
const REFUSED: u64 = 1 << 61;

/// A batch closes once its records reach this many words (4 KiB: about 85 small requests
/// with their completions, as many as the previous format carried per batch).
pub(crate) const BATCH_WORDS: usize = 512;

/// The largest record: the head, a closure or answer and a completion payload of up to
/// `MAX_INLINE` bytes each (larger ones are boxed).
const MAX_RECORD_WORDS: usize = CLOSURE_AT + 2 * words_for(MAX_INLINE);

/// A batch buffer's capacity: a record is only started below `BATCH_WORDS`, so it always fits.
const BATCH_CAPACITY: usize = BATCH_WORDS + MAX_RECORD_WORDS;

/// The words of one batch.
pub(crate) type BatchWords = UnsafeCell<[MaybeUninit<u64>; BATCH_CAPACITY]>;

/// Words a payload of type `P` takes in a record (inline, or its box).
const fn stored_words<P>() -> usize {
    words_for(stored_size::<P>())
}

/// Where, in a record with closure `F` and answer `R`, the completion's payload lies.
const fn done_at<F, R>() -> usize {
    let (f, r) = (stored_words::<F>(), stored_words::<R>());
    CLOSURE_AT + if f > r { f } else { r }
}

/// Words of a record with closure `F`, answer `R` and completion payload `D`.
const fn record_words<F, R, D>() -> usize {
    done_at::<F, R>() + stored_words::<D>()
}

/// Writes a record at `record`: closure `f` for `run` on `property`, answer `R`, completion
/// `complete` with payload `done`. Returns its length in words.
///
/// # Safety
/// `record` has room for the record; `run` and `complete` consume an `F`, an `R` and a `D` at
/// this layout.
#[inline(always)]
unsafe fn write_record<F, R, D>(
    record: *mut u64,
    run: RunFn,
    property: *const (),
    complete: CompleteFn,
    f: F,
    done: D,
) -> usize {
    const { assert!(record_words::<F, R, D>() <= MAX_RECORD_WORDS) };
    let total = record_words::<F, R, D>();
    // SAFETY: per the caller; each part lies at its own word offset inside the record.
    unsafe {
        record.write(total as u64);
        record.add(1).cast::<CompleteFn>().write(complete);
        record.add(2).cast::<RunFn>().write(run);
        record.add(3).cast::<*const ()>().write(property);
        store(record.add(CLOSURE_AT), f);
        store(record.add(done_at::<F, R>()), done);
    }
    total
}

/// A record's length in words, from its header.
///
/// # Safety
/// `record` is the start of a record written by `write_record`.
#[inline(always)]
pub(crate) unsafe fn length(record: *const u64) -> usize {
    // SAFETY: per the caller. The flags live in the high half.
    unsafe { record.read() as u32 as usize }
}

/// Flags the record at `record` with `flag`.
///
/// # Safety
/// `record` is the start of a record, owned by the caller.
#[inline(always)]
unsafe fn flag(record: *mut u64, flag: u64) {
    // SAFETY: per the caller.
    unsafe { record.write(record.read() | flag) }
}

/// The property address of the record at `record` (for run trampolines).
///
/// # Safety
/// `record` is the start of a record, owned by the caller, whose run has not finished.
#[inline(always)]
pub(crate) unsafe fn property(record: *const u64) -> *const () {
    // SAFETY: per the caller.
    unsafe { record.add(3).cast::<*const ()>().read() }
}

/// A batch buffer on the heap with the records staged in it so far.
///
/// The buffer is held by a raw pointer, not a `Box`, because the trustee writes into it while
/// the batch is published and the client keeps the batch meanwhile.
pub(crate) struct Batch {
    words: NonNull<BatchWords>,
    len: usize,
}

impl Batch {
    pub(crate) fn new() -> Self {
        let words = Box::new(UnsafeCell::new([MaybeUninit::uninit(); BATCH_CAPACITY]));
        Batch {
            words: NonNull::from(Box::leak(words)),
            len: 0,
        }
    }

    /// Words of records staged so far.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer, for publishing.
    pub(crate) fn words(&self) -> *const BatchWords {
        self.words.as_ptr()
    }

    /// Appends a record (see [`write_record`]).
    ///
    /// # Safety
    /// The batch is open (the client owns it) and shorter than `BATCH_WORDS`; the trampolines
    /// match the types as `write_record` requires.
    #[inline(always)]
    pub(crate) unsafe fn push<F, R, D>(
        &mut self,
        run: RunFn,
        property: *const (),
        complete: CompleteFn,
        f: F,
        done: D,
    ) {
        debug_assert!(self.len < BATCH_WORDS);
        let at = self.len;
        // SAFETY: the client owns the buffer; a record started below `BATCH_WORDS` fits.
        let total = unsafe {
            (*self.words.as_ptr()).with_mut(|w| {
                write_record::<F, R, D>(w.cast::<u64>().add(at), run, property, complete, f, done)
            })
        };
        self.len = at + total;
    }

    /// Runs the completions of an answered batch in order and empties it.
    ///
    /// # Safety
    /// The batch was published and answered (or cancelled), and is completed once.
    pub(crate) unsafe fn complete(&mut self, run: bool) {
        // SAFETY: per the caller, the client owns the buffer again and every record in it
        // holds its completion payload and its outcome.
        unsafe { complete_all(&*self.words.as_ptr(), self.len, run) };
        self.len = 0;
    }

    /// Drops a batch that was never published: each completion drops its closure and payload.
    pub(crate) fn discard(mut self) {
        // SAFETY: the client owns an unpublished batch, none of whose requests ran; each is
        // flagged cancelled, then completed once.
        unsafe {
            cancel_all(&*self.words.as_ptr(), self.len);
            self.complete(false);
        }
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // Payloads are owned values of unknown type: whoever owns the batch must run or
        // discard its records first. Leaking them is the only safe fallback.
        debug_assert!(
            self.len == 0 || std::thread::panicking(),
            "a batch dropped with {} words of records",
            self.len
        );
        // SAFETY: allocated by `Batch::new` with `Box`; no other side holds it any more.
        drop(unsafe { Box::from_raw(self.words.as_ptr()) });
    }
}

/// Calls `f` with each record of a batch, in order.
///
/// # Safety
/// The caller owns the batch: `words` holds `len` words of records. `f` may consume a record's
/// payloads but must leave its length (the header's low half) alone.
#[inline(always)]
pub(crate) unsafe fn for_each_record(words: &BatchWords, len: usize, mut f: impl FnMut(*mut u64)) {
    words.with_mut(|w| {
        let w = w.cast::<u64>();
        let mut at = 0;
        while at < len {
            // SAFETY: per the caller; `at` walks the records' boundaries.
            unsafe {
                let record = w.add(at);
                at += length(record);
                f(record);
            }
        }
    });
}

/// Runs the records of a batch in order, writing the answers in place; returns how many
/// there were (the loop's own count: one increment per record, the only per-request cost of
/// the counters in `stats`).
///
/// # Safety
/// The caller owns the batch as its trustee: `words` holds `len` words of records that have
/// not run.
pub(crate) unsafe fn run_all(words: &BatchWords, len: usize) -> u64 {
    let mut records = 0;
    // SAFETY: per the caller; a run trampoline consumes its record's closure.
    unsafe {
        for_each_record(words, len, |record| {
            records += 1;
            record.add(2).cast::<RunFn>().read()(record);
        })
    }
    records
}

/// As [`run_all`], telling `ran` each record's property address (read before it runs) and
/// how long it ran: the sampled path of `stats`.
///
/// # Safety
/// As [`run_all`]'s.
#[cold]
pub(crate) unsafe fn run_all_timed(
    words: &BatchWords,
    len: usize,
    mut ran: impl FnMut(*const (), std::time::Duration),
) -> u64 {
    let mut records = 0;
    let mut last = std::time::Instant::now();
    // SAFETY: per the caller, as in `run_all`; the property is read before the run consumes
    // the record's trustee words.
    unsafe {
        for_each_record(words, len, |record| {
            records += 1;
            let property = property(record);
            record.add(2).cast::<RunFn>().read()(record);
            // One clock read per record: each record's time runs from the previous one's end.
            let now = std::time::Instant::now();
            ran(property, now - last);
            last = now;
        })
    }
    records
}

/// Runs the record at `record`: its run trampoline consumes the closure and leaves the answer.
///
/// # Safety
/// The caller owns the record, which has not run, as the trustee of its property's home.
#[inline(always)]
pub(crate) unsafe fn run(record: *mut u64) {
    // SAFETY: per the caller.
    unsafe { record.add(2).cast::<RunFn>().read()(record) }
}

/// Flags the record at `record` cancelled without running it (shutdown), as `cancel_all`.
///
/// # Safety
/// The caller owns the record, which has not run.
pub(crate) unsafe fn cancel(record: *mut u64) {
    // SAFETY: per the caller; the flag leaves the length alone.
    unsafe { flag(record, CANCELLED) }
}

/// Flags the record at `record` refused without running it: its property was withdrawn.
///
/// # Safety
/// The caller owns the record, which has not run.
#[cold]
pub(crate) unsafe fn refuse(record: *mut u64) {
    // SAFETY: per the caller; the flags leave the length alone.
    unsafe { flag(record, CANCELLED | REFUSED) }
}

/// Leaves `panic` in the record (its run trampoline and property are consumed) and flags it.
///
/// # Safety
/// Called by the record's run trampoline, whose closure has just panicked.
#[cold]
pub(crate) unsafe fn panicked(record: *mut u64, panic: Panic) {
    // SAFETY: words 2–3 are the trustee's and no longer needed; a `Panic` is two words.
    unsafe {
        record.add(2).cast::<Panic>().write(panic);
        flag(record, PANICKED);
    }
}

/// Flags every record of a batch cancelled, without running it (shutdown, or a batch never
/// published). The closures stay for the complete trampolines to drop.
///
/// # Safety
/// The caller owns the batch: `words` holds `len` words of records that have not run.
pub(crate) unsafe fn cancel_all(words: &BatchWords, len: usize) {
    // SAFETY: per the caller; flags leave the length alone.
    unsafe { for_each_record(words, len, |record| flag(record, CANCELLED)) }
}

/// Runs the complete trampolines of a batch in order.
///
/// # Safety
/// The client owns the answered (or cancelled) batch: `words` holds `len` words of records
/// whose completions have not run.
unsafe fn complete_all(words: &BatchWords, len: usize, run: bool) {
    // SAFETY: per the caller; a complete trampoline consumes its record's payloads.
    unsafe {
        for_each_record(words, len, |record| {
            record.add(1).cast::<CompleteFn>().read()(record, run);
        })
    }
}

/// Takes the outcome of the record at `record`, with closure `F` and answer `R`: the answer,
/// the closure's panic (or a refusal's, for a withdrawn property), or `None` if the request
/// never ran because the runtime stopped (the closure is dropped either way).
///
/// # Safety
/// Called once per record, by its complete trampoline, after the batch came back.
#[inline(always)]
pub(crate) unsafe fn take_answer<F, R>(record: *mut u64) -> Option<Result<R, Panic>> {
    // SAFETY: per the caller.
    let word = unsafe { record.read() };
    if word & (PANICKED | CANCELLED) == 0 {
        // SAFETY: the run trampoline wrote an `R` over the closure (same monomorphization).
        return Some(Ok(unsafe { take::<R>(record.add(CLOSURE_AT)) }));
    }
    // SAFETY: as above.
    unsafe { unusual_outcome::<F, R>(record, word) }
}

/// # Safety
/// As [`take_answer`]'s, for a flagged record.
#[cold]
unsafe fn unusual_outcome<F, R>(record: *mut u64, word: u64) -> Option<Result<R, Panic>> {
    if word & CANCELLED != 0 {
        // SAFETY: a cancelled record's closure never ran and is still in place.
        drop(unsafe { take::<F>(record.add(CLOSURE_AT)) });
        if word & REFUSED != 0 {
            return Some(Err(refusal()));
        }
        return None;
    }
    // SAFETY: `panicked` left the panic in words 2–3.
    Some(Err(unsafe { record.add(2).cast::<Panic>().read() }))
}

/// The panic a refused record raises. Out of line, so that the allocation stays out of every
/// completion (inlined there, it cost each one a stack frame: 4 instructions).
#[cold]
#[inline(never)]
fn refusal() -> Panic {
    Box::new(crate::home::WITHDRAWN_MESSAGE)
}

/// Takes the completion payload (a `D`) of the record at `record`, with closure `F` and
/// answer `R`.
///
/// # Safety
/// Called once per record, by its complete trampoline.
#[inline(always)]
pub(crate) unsafe fn take_done<F, R, D>(record: *mut u64) -> D {
    // SAFETY: per the caller; `write_record` stored a `D` after the closure's area.
    unsafe { take::<D>(record.add(done_at::<F, R>())) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_fit_their_batches() {
        assert_eq!(record_words::<(), (), ()>(), 4);
        assert_eq!(record_words::<u64, (), ()>(), 5);
        assert_eq!(record_words::<(), [u64; 3], u64>(), 8);
        assert_eq!(
            record_words::<[u8; 300], u8, ()>(),
            5,
            "a large closure is boxed"
        );
        const { assert!(MAX_RECORD_WORDS + BATCH_WORDS - 1 < BATCH_CAPACITY) };
    }
}
