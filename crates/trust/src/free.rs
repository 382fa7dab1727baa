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
//! * **Counting requests.** Each channel has a `staged` count, written only by its client (a
//!   plain load and store), increased for every request staged on it, before the request's
//!   batch is published. Each trustee counts, per client, the requests it has `executed`.
//! * **The last drop** stages a *free request* to the trustee (from a worker) or injects the
//!   dead property into the trustee's queue (from any other thread). Either way the trustee
//!   receives it after an acquire (the channel's sequence number, or the queue's lock) that
//!   synchronizes with the dropping thread.
//! * **The trustee**, on receiving it, reads every channel's `staged` count (`Relaxed`) as a
//!   *watermark* and frees the property once, for every client, `executed` has reached it.
//!
//! Why the watermark covers every request: a request for the property was staged by a thread
//! holding a trust, before that thread dropped or handed on its trust. The staging (its
//! `staged` store) therefore happens before the last drop (through the count's release/acquire
//! pair, or through whatever moved the trust between threads), which happens before the
//! trustee's read of the watermark. By coherence the trustee reads that store or a later one.
//! Requests run in staging order per channel, so once `executed` reaches the watermark, every
//! request staged before the death has run. Requests staged after it cannot exist: nobody
//! holds a trust any more.
//!
//! The watermark may also count requests for other properties staged meanwhile; waiting for
//! them too only delays the free. The model `loom_tests::a_request_on_its_way_is_run_before_the_free`
//! checks the case that needs all of this: a request still in flight on one channel while the
//! last trust dies on another.

/// A property whose last trust is gone, with the function that drops and frees it.
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
    /// Returns it back if `executed` has already reached the watermark.
    pub(crate) fn add(&mut self, item: P, watermark: Box<[u64]>, executed: &[u64]) -> Option<P> {
        if reached(&watermark, executed) {
            return Some(item);
        }
        self.waiting.push((watermark, item));
        None
    }

    /// Removes and returns the items whose watermark `executed` has reached.
    pub(crate) fn ready(&mut self, executed: &[u64]) -> Vec<P> {
        let mut ready = Vec::new();
        let mut i = 0;
        while i < self.waiting.len() {
            if reached(&self.waiting[i].0, executed) {
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
    use loom::sync::Arc;

    const USE: u64 = 1;
    const FREE: u64 = 2;

    /// Client A holds one trust and sends a request for the property on its channel; client B
    /// holds the other trust. Each then drops its trust; whoever drops the last one sends the
    /// free on its own channel. The trustee serves B's channel first (so the free can come
    /// before A's request), twice while the clients run and twice after, applying the
    /// watermark rule. The request must run before the free, in every interleaving, and the
    /// property must be freed exactly once.
    #[test]
    fn a_request_on_its_way_is_run_before_the_free() {
        loom::model(|| {
            let refs = Arc::new(AtomicUsize::new(2));
            let channels = Arc::new([Channel::new(), Channel::new()]);

            // Drops one trust; the last one out publishes FREE right after `first`, if any.
            let client = |me: usize, first: Option<u64>| {
                let (refs, channels) = (refs.clone(), channels.clone());
                loom::thread::spawn(move || {
                    let ch = &channels[me];
                    let mut batch = Vec::new();
                    if let Some(word) = first {
                        ch.add_staged(1);
                        batch.push(word);
                    }
                    if refs.fetch_sub(1, Ordering::Release) == 1 {
                        fence(Ordering::Acquire);
                        ch.add_staged(1);
                        batch.push(FREE);
                    }
                    if !batch.is_empty() {
                        // SAFETY: this thread is the channel's only client; nothing is in flight.
                        unsafe { ch.publish(batch.as_ptr(), batch.len()) };
                    }
                })
            };
            let a = client(0, Some(USE));
            let b = client(1, None);

            let mut executed = [0u64; 2];
            let mut pending = PendingFrees::new();
            let (mut used, mut freed) = (false, 0);
            let mut pass = || {
                for (c, ch) in channels.iter().enumerate().rev() {
                    let mut free_seen = false;
                    // SAFETY: this thread is the only trustee.
                    unsafe {
                        ch.serve(|words, len, out| {
                            for i in 0..len {
                                match words.add(i).read() {
                                    USE => {
                                        assert_eq!(freed, 0, "request ran after the free");
                                        used = true;
                                    }
                                    _ => free_seen = true,
                                }
                                executed[c] += 1;
                                out.write(());
                            }
                        })
                    };
                    if free_seen {
                        let watermark = channels.iter().map(|ch| ch.staged()).collect();
                        if pending.add((), watermark, &executed).is_some() {
                            freed += 1;
                        }
                    }
                }
                freed += pending.ready(&executed).len();
            };
            pass();
            pass();
            a.join().unwrap();
            b.join().unwrap();
            // Everything is published now; the first pass serves it, the second finds nothing.
            pass();
            pass();
            assert!(used && freed == 1 && pending.is_empty());
        });
    }
}
