//! The request format: what a client stages for a trustee and what it keeps to receive the
//! answer (rayon-core keeps its `JobRef` the same way).
//!
//! A request is a record (see `record`) with a [`Request`] header — the monomorphized *run
//! trampoline*, the property's address and the words its answer takes — and the closure as
//! payload. Its [`Completion`] record stays with the client: a *complete trampoline* and what
//! the answer goes to (a waiting fiber's slot, a `then` callback, a future's cell). Both
//! trampolines come from the API (`trust.rs`); the trustee runs requests in order and writes
//! answers in order, so the client pairs the n-th completion with the n-th answer.
//!
//! Each trampoline consumes its payload exactly once: the run trampoline runs the closure (or,
//! without a response writer, drops it unexecuted at shutdown); the complete trampoline takes
//! the answer (or, with `run == false`, only drops what it owns).

use crate::channel::{ResponseReader, ResponseWriter};
use crate::record::{self, RecordBuf};

/// Runs a request with a response writer, or (with `None`) drops it unexecuted.
pub(crate) type RunFn =
    unsafe fn(payload: *mut u8, property: *const (), out: Option<&mut ResponseWriter>);
/// Consumes a request's answer; with `run == false` it only drops what it owns.
pub(crate) type CompleteFn = unsafe fn(payload: *mut u8, answers: &mut ResponseReader, run: bool);

/// Header of a request record.
#[derive(Clone, Copy)]
pub(crate) struct Request {
    pub(crate) run: RunFn,
    pub(crate) property: *const (),
}

/// Header of a completion record.
#[derive(Clone, Copy)]
pub(crate) struct Completion {
    pub(crate) complete: CompleteFn,
}

/// Runs the completions of a batch in order against its answers.
pub(crate) fn drain_completions(
    done: &mut RecordBuf<Completion>,
    answers: &mut ResponseReader,
    run: bool,
) {
    while let Some((completion, payload, total)) = done.front() {
        // SAFETY: each completion record was pushed with a payload its function consumes, and
        // the answers are those of the requests staged alongside, in order.
        unsafe { (completion.complete)(payload, answers, run) };
        done.pop_consumed(total);
    }
}

/// Drops the requests of a batch in a slot without running them.
///
/// # Safety
/// `words` holds `len` words of request records whose payloads the caller owns.
pub(crate) unsafe fn drop_raw_requests(words: *mut u64, len: usize) {
    // SAFETY: per the caller; each trampoline consumes its payload in drop mode.
    unsafe { record::for_each_raw::<Request>(words, len, |r, p| (r.run)(p, r.property, None)) }
}
