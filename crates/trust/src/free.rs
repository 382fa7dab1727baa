//! Freeing a property: it is dropped on its trustee once its last trust is gone *and* every
//! request ever staged for it has run.
//!
//! # Protocol
//!
//! * **Counting trusts.** A property's header holds an atomic count of its trusts. `clone`
//!   adds one (`Relaxed`, as `Arc` does: a clone is made from a live trust). `drop` subtracts
//!   one with `Release`; the thread that takes it to zero issues an `Acquire` fence, so every
//!   earlier drop — and everything its thread did before, including staging requests — happens
//!   before what follows.
//! * **Counting batches.** Each channel has a `staged` count, written only by its client (a
//!   plain load and store), increased when a batch receives its first request — before that
//!   request is written, and so before every request of the batch. Each trustee counts, per
//!   client, the batches it has `executed` (run to the end). Counting batches, not requests,
//!   keeps the count off the per-request path.
//! * **The last drop** stages a *free request* to the trustee (from a worker) or injects the
//!   dead property into the trustee's queue (from any other thread). Either way the trustee
//!   receives it after an acquire (the channel's sequence number, or the queue's lock) that
//!   synchronizes with the dropping thread.
//! * **The trustee**, on receiving it, reads every channel's `staged` count (`Relaxed`) as a
//!   *watermark* and frees the property once, for every client, `executed` has reached it.
//!
//! Why the watermark covers every request: a request for the property was staged by a thread
//! holding a trust, before that thread dropped or handed on its trust, into a batch whose
//! `staged` store came before it. That store therefore happens before the last drop (through
//! the count's release/acquire pair, or through whatever moved the trust between threads),
//! which happens before the trustee's read of the watermark. By coherence the trustee reads
//! that store or a later one. Batches run whole and in order per channel, so once `executed`
//! reaches the watermark, the request's batch has run. Requests staged after the death cannot
//! exist: nobody holds a trust any more. A counted batch always holds a request, so its worker
//! publishes it in a later round; the free waits for that round at most.
//!
//! The watermark may also count batches of requests for other properties; waiting for them
//! too only delays the free. When the free request itself travels in a batch, that batch is
//! counted and not yet executed while it runs, so the free waits for its own batch's end. The model `loom_tests::a_request_on_its_way_is_run_before_the_free`
//! checks the case that needs all of this: a request still in flight on one channel while the
//! last trust dies on another.

/// A property whose last trust is gone, with the function that drops and frees it.
///
/// A property that has moved (`home`) may still have requests on trustees it left, in the
/// lanes of workers whose route to it is not its home yet; its free waits for those lanes
/// too, until each has answered every batch started before the free (`Dying`).
pub(crate) struct DeadProperty {
    pub(crate) ptr: *const (),
    pub(crate) free: unsafe fn(*const ()),
}

// SAFETY: the property's type is `Send` (required by `entrust`), and a dead property has no
// other owner, so it may be freed on any thread.
unsafe impl Send for DeadProperty {}

impl DeadProperty {
    /// Drops and frees the property now.
    ///
    /// # Safety
    /// No request that uses the property runs or will run.
    pub(crate) unsafe fn free(self) {
        // SAFETY: per the caller.
        unsafe { (self.free)(self.ptr) }
    }
}

/// A trustee's dead items waiting for their watermarks (see the module docs).
#[derive(Debug)]
pub(crate) struct PendingFrees<P> {
    waiting: Vec<(Box<[u64]>, P)>,
}

impl<P> PendingFrees<P> {
    pub(crate) fn new() -> Self {
        PendingFrees {
            waiting: Vec::new(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Takes in a dead item with its watermark (each client's `staged` count, read now).
    /// Returns it back if `executed` has already reached the watermark and `done` says the
    /// item waits for nothing else.
    pub(crate) fn add(
        &mut self,
        item: P,
        watermark: Box<[u64]>,
        executed: &[u64],
        done: impl Fn(&P) -> bool,
    ) -> Option<P> {
        if reached(&watermark, executed) && done(&item) {
            return Some(item);
        }
        self.waiting.push((watermark, item));
        None
    }

    /// Removes and returns the items whose watermark `executed` has reached and that `done`
    /// says wait for nothing else.
    pub(crate) fn ready(&mut self, executed: &[u64], done: impl Fn(&P) -> bool) -> Vec<P> {
        let mut ready = Vec::new();
        let mut i = 0;
        while i < self.waiting.len() {
            if reached(&self.waiting[i].0, executed) && done(&self.waiting[i].1) {
                ready.push(self.waiting.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
        ready
    }

    /// Every waiting item, for shutdown (when no request runs any more).
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = P> + '_ {
        self.waiting.drain(..).map(|(_, item)| item)
    }
}

fn reached(watermark: &[u64], executed: &[u64]) -> bool {
    watermark.iter().zip(executed).all(|(w, e)| w <= e)
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::channel::Channel;
    use crate::loom::sync::atomic::{AtomicUsize, Ordering, fence};
    use crate::record::take;
    use crate::request::{Batch, CLOSURE_AT, CompleteFn, RunFn, property, run_all, take_answer};
    use loom::sync::Arc;
    use std::cell::RefCell;

    const USE: u64 = 1;
    const FREE: u64 = 2;

    /// The trustee's record of what ran, reached through the records' property address.
    type Log = RefCell<Vec<u64>>;

    /// A client's batch on its way back to the main thread, which completes it.
    struct SentBatch(Batch);
    // SAFETY: the batch holds `u64` closures and `()` payloads, which may move between threads;
    // the client thread no longer touches it.
    unsafe impl Send for SentBatch {}

    /// Runs a request whose closure is a tag: appends it to the trustee's log.
    unsafe fn run_tag(record: *mut u64) {
        // SAFETY: pushed as `push::<u64, (), ()>` with the log's address as the property; the
        // log lives on the trustee's (the model's main) thread for the whole model.
        unsafe {
            let tag: u64 = take(record.add(CLOSURE_AT));
            (*property(record).cast::<Log>()).borrow_mut().push(tag);
        }
    }

    unsafe fn complete_unit(record: *mut u64, _run: bool) {
        // SAFETY: a `u64` closure and a `()` answer per record.
        let _ = unsafe { take_answer::<u64, ()>(record) };
    }

    /// Client A holds one trust and sends a request for the property on its channel; client B
    /// holds the other trust. Each then drops its trust; whoever drops the last one sends the
    /// free on its own channel, in the same batch as A's request if that is A. The trustee
    /// serves B's channel first (so the free can come before A's request), twice while the
    /// clients run and twice after, applying the watermark rule per batch. The request must run
    /// before the free, in every interleaving, and the property must be freed exactly once.
    #[test]
    fn a_request_on_its_way_is_run_before_the_free() {
        loom::model(|| {
            let refs = Arc::new(AtomicUsize::new(2));
            let channels = Arc::new([Channel::new(), Channel::new()]);
            let log: Log = RefCell::new(Vec::new());
            let log_address = &log as *const Log as usize;

            // Drops one trust; the last one out stages FREE right after `first`, if any.
            // Returns the published batch, for the main thread to complete once answered.
            let client = |me: usize, first: Option<u64>| {
                let (refs, channels) = (refs.clone(), channels.clone());
                loom::thread::spawn(move || {
                    let ch = &channels[me];
                    let mut batch = Batch::new();
                    let run: RunFn = run_tag;
                    let complete: CompleteFn = complete_unit;
                    let stage = |batch: &mut Batch, tag: u64| {
                        if batch.is_empty() {
                            ch.add_staged();
                        }
                        // SAFETY: the trampolines above consume a `u64` closure and a `()`.
                        unsafe {
                            batch.push::<u64, (), ()>(
                                run,
                                log_address as *const (),
                                complete,
                                tag,
                                (),
                            )
                        };
                    };
                    if let Some(tag) = first {
                        stage(&mut batch, tag);
                    }
                    if refs.fetch_sub(1, Ordering::Release) == 1 {
                        fence(Ordering::Acquire);
                        stage(&mut batch, FREE);
                    }
                    if !batch.is_empty() {
                        // SAFETY: this thread is the channel's only client; nothing is in
                        // flight; the batch is left alone until the main thread completes it.
                        unsafe { ch.publish(batch.words(), batch.len()) };
                    }
                    SentBatch(batch)
                })
            };
            let a = client(0, Some(USE));
            let b = client(1, None);

            let mut executed = [0u64; 2];
            let mut pending = PendingFrees::new();
            let mut freed = 0;
            let mut pass = |freed: &mut usize| {
                for (c, ch) in channels.iter().enumerate().rev() {
                    let before = log.borrow().len();
                    // SAFETY: this thread is the only trustee.
                    let served = unsafe {
                        ch.serve(|words, len| {
                            run_all(words, len);
                            true
                        })
                    };
                    if !served {
                        continue;
                    }
                    let ran: Vec<u64> = log.borrow()[before..].to_vec();
                    // The free is taken in while its batch runs, before the batch counts.
                    if ran.contains(&FREE) {
                        let watermark = channels.iter().map(|ch| ch.staged()).collect();
                        if pending.add((), watermark, &executed, |_| true).is_some() {
                            *freed += 1;
                        }
                    }
                    executed[c] += 1;
                    if ran.contains(&USE) {
                        assert_eq!(*freed, 0, "request ran after the free");
                    }
                }
                *freed += pending.ready(&executed, |_| true).len();
            };
            pass(&mut freed);
            pass(&mut freed);
            let batches = [a.join().unwrap(), b.join().unwrap()];
            // Everything is published now; the first pass serves it, the second finds nothing.
            pass(&mut freed);
            pass(&mut freed);
            for SentBatch(mut batch) in batches {
                // SAFETY: every published batch was answered by the passes above; completed once.
                unsafe { batch.complete(true) };
            }
            let log = log.borrow();
            assert!(
                log.contains(&USE) && freed == 1 && pending.is_empty(),
                "{log:?} freed {freed}"
            );
        });
    }
}
