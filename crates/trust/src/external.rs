//! Plain OS threads as clients (seed 000, Figure 2).
//!
//! A thread that is not a worker claims a client id of its own the first time it uses a
//! runtime, and keeps it until it exits; its calls are synchronous, one request per batch, so
//! it owns its channel between calls. When every id is taken, threads take turns on one
//! shared channel under a lock. While waiting for an answer the thread spins briefly, then
//! parks on its parker; the trustee wakes it after answering.

use std::cell::RefCell;
use std::panic::resume_unwind;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use crate::channel::{Channel, Outcome, Panic};
use crate::record::RecordBuf;
use crate::registry::Registry;
use crate::request::{Request, drop_raw_requests};

/// Answer checks before an external client parks.
const SPINS: u32 = 20_000;

struct Claim {
    registry: Weak<Registry>,
    id: usize,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(registry) = self.registry.upgrade() {
            registry
                .free_external
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(self.id);
        }
    }
}

thread_local! {
    static CLAIMS: RefCell<Vec<Claim>> = const { RefCell::new(Vec::new()) };
}

fn claimed_id(registry: &Arc<Registry>) -> Option<usize> {
    CLAIMS
        .try_with(|claims| {
            let mut claims = claims.borrow_mut();
            claims.retain(|c| c.registry.strong_count() > 0);
            if let Some(c) = claims
                .iter()
                .find(|c| std::ptr::eq(c.registry.as_ptr(), Arc::as_ptr(registry)))
            {
                return Some(c.id);
            }
            let id = registry
                .free_external
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop()?;
            registry.external_high.fetch_max(id + 1, Ordering::Release);
            claims.push(Claim {
                registry: Arc::downgrade(registry),
                id,
            });
            Some(id)
        })
        .ok()
        .flatten()
}

/// Runs one request from a plain thread and waits for its answer.
pub(crate) fn apply<F, R>(registry: &Arc<Registry>, trustee: usize, request: Request, f: F) -> R {
    if registry.closed.load(Ordering::Acquire) || registry.stopping.load(Ordering::Acquire) {
        panic!("the runtime that owns this trust has shut down");
    }
    let answer = match claimed_id(registry) {
        Some(id) => call::<F, R>(registry, id, trustee, request, f),
        None => {
            let _turn = registry
                .shared_external
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            registry.shared_external_busy.store(true, Ordering::Release);
            let answer = call::<F, R>(registry, registry.shared_external_id(), trustee, request, f);
            registry
                .shared_external_busy
                .store(false, Ordering::Release);
            answer
        }
    };
    answer.unwrap_or_else(|panic| resume_unwind(panic))
}

fn call<F, R>(
    registry: &Registry,
    id: usize,
    trustee: usize,
    request: Request,
    f: F,
) -> Result<R, Panic> {
    let channel = registry.channel(id, trustee);
    let mut records = RecordBuf::new();
    records.push(request, f);
    channel.add_staged(1);
    // SAFETY: this thread alone uses client id `id` (claimed, or under the shared lock), and
    // each call waits for its answer, so the channel is idle. The payload moves to the channel.
    unsafe { channel.publish(records.as_words(), records.word_len()) };
    records.forget_all();
    registry.parkers[trustee].wake();
    wait_for_answer(registry, id, channel);
    // SAFETY: answered (or cancelled), taken once.
    unsafe {
        channel.take_answers(|answers| match answers.outcome() {
            Outcome::Value => Ok(answers.read::<R>()),
            Outcome::Panicked(panic) => Err(panic),
            Outcome::Cancelled => {
                Err(Box::new("the runtime shut down before the request ran") as Panic)
            }
        })
    }
}

fn wait_for_answer(registry: &Registry, id: usize, channel: &Channel) {
    for _ in 0..SPINS {
        if channel.answered() {
            return;
        }
        std::hint::spin_loop();
    }
    let parker = &registry.parkers[id];
    loop {
        parker.prepare();
        if channel.answered() {
            parker.cancel();
            return;
        }
        if registry.torn_down.load(Ordering::Acquire) {
            parker.cancel();
            // The workers exited after this request was published: nobody will run it.
            // SAFETY: no trustee serves any more and this thread is the channel's client.
            unsafe { channel.cancel(|words, len| drop_raw_requests(words, len)) };
            return;
        }
        parker.park();
    }
}
