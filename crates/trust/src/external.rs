//! Plain OS threads as clients (seed 000, Figure 2).
//!
//! A thread that is not a worker claims a client id of its own the first time it uses a
//! runtime, and keeps it until it exits; its calls are synchronous, one request per batch, so
//! it owns its channel between calls. When every id is taken, threads take turns on one
//! shared channel under a lock. While waiting for an answer the thread spins as long as its
//! spin policy allows (`spin`, one per thread), then parks on its parker; the trustee wakes it
//! after answering.

use std::cell::{Cell, RefCell};
use std::panic::resume_unwind;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use crate::channel::Channel;
use crate::registry::Registry;
use crate::request::{self, Batch, CompleteFn, Panic, RunFn};
use crate::spin::{self, PLAIN_THREAD_SPIN, SpinPolicy, SpinSetting};

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
    /// The thread's batch buffer, kept between calls.
    static SPARE: Cell<Option<Batch>> = const { Cell::new(None) };
    /// The thread's spin policy, learnt over its waits for answers.
    static SPIN: Cell<Option<SpinPolicy>> = const { Cell::new(None) };
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

/// Runs one request from a plain thread and waits for its answer: closure `f` for `run` on
/// `property`, answered as an `R`.
#[track_caller]
pub(crate) fn apply<F, R>(
    registry: &Arc<Registry>,
    trustee: usize,
    run: RunFn,
    property: *const (),
    f: F,
) -> R {
    if registry.closed.load(Ordering::Acquire) || registry.stopping.load(Ordering::Acquire) {
        panic!("the runtime that owns this trust has shut down");
    }
    let call = |id| {
        // SAFETY: `run` consumes an `F` and writes an `R` (the caller's trampoline).
        unsafe { call::<F, R>(registry, id, trustee, run, property, f) }
    };
    let answer = match claimed_id(registry) {
        Some(id) => call(id),
        None => {
            let _turn = registry
                .shared_external
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            registry.shared_external_busy.store(true, Ordering::Release);
            let answer = call(registry.shared_external_id());
            registry
                .shared_external_busy
                .store(false, Ordering::Release);
            answer
        }
    };
    match answer {
        Some(answer) => answer.unwrap_or_else(|panic| resume_unwind(panic)),
        None => panic!("the runtime shut down before the request ran"),
    }
}

/// Where a plain thread's answer goes: the complete trampoline of its one-request batch.
unsafe fn complete_into<F, R>(record: *mut u64, _run: bool) {
    // SAFETY: staged by `call` with an `F` closure, an `R` answer and a
    // `*mut Option<Result<R, Panic>>` payload; the target lives on the waiting caller's stack.
    unsafe {
        let target = request::take_done::<F, R, *mut Option<Result<R, Panic>>>(record);
        *target = request::take_answer::<F, R>(record);
    }
}

/// One synchronous call on client id `id`'s channel: `None` if the runtime stopped first.
///
/// # Safety
/// `run` consumes an `F` and writes an `R`.
unsafe fn call<F, R>(
    registry: &Registry,
    id: usize,
    trustee: usize,
    run: RunFn,
    property: *const (),
    f: F,
) -> Option<Result<R, Panic>> {
    let channel = registry.channel(id, trustee);
    let mut answer: Option<Result<R, Panic>> = None;
    let target: *mut Option<Result<R, Panic>> = &mut answer;
    let mut batch = SPARE
        .try_with(Cell::take)
        .ok()
        .flatten()
        .unwrap_or_else(Batch::new);
    let complete: CompleteFn = complete_into::<F, R>;
    // SAFETY: per the caller; `complete_into::<F, R>` takes this payload, an `R` and an `F`.
    unsafe { batch.push::<F, R, _>(run, property, complete, f, target) };
    channel.add_staged();
    // SAFETY: this thread alone uses client id `id` (claimed, or under the shared lock), and
    // each call waits for its answer, so the channel is idle; the batch stays here, untouched,
    // until it is answered.
    unsafe { channel.publish(batch.words(), batch.len()) };
    registry.parkers[trustee].wake();
    wait_for_answer(registry, id, channel);
    // SAFETY: answered (or cancelled), completed once.
    unsafe { batch.complete(true) };
    // During the thread's exit the buffer is freed instead.
    let _ = SPARE.try_with(|spare| spare.set(Some(batch)));
    answer
}

/// Waits until `channel` is answered: spins for as long as the thread's spin policy allows,
/// then parks; tells the policy how the wait went.
fn wait_for_answer(registry: &Registry, id: usize, channel: &Channel) {
    let setting = SpinSetting::new(registry.spin, PLAIN_THREAD_SPIN);
    // During the thread's exit its policy is gone: a fresh one serves.
    let mut policy = SPIN
        .try_with(Cell::get)
        .ok()
        .flatten()
        .unwrap_or_else(|| SpinPolicy::new(setting));
    policy.follow(setting);
    spin::wait(
        &mut policy,
        |_| channel.answered(),
        || park_for_answer(registry, id, channel),
    );
    let _ = SPIN.try_with(|spin| spin.set(Some(policy)));
}

/// Parks until `channel` is answered, or cancels its request if the runtime's workers have
/// exited.
fn park_for_answer(registry: &Registry, id: usize, channel: &Channel) {
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
            unsafe { channel.cancel() };
            return;
        }
        parker.park();
    }
}
