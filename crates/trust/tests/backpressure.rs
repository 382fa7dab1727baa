//! Backpressure by default: a fiber that issues `apply_then` without a window cannot build an
//! unbounded backlog; past its lane's budget it waits until answers come back.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};

use trust::{Group, Runtime, Trust};

/// The process's heap in use, and its peak since the last `reset_peak`.
struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to `System`, only counting the bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: per `GlobalAlloc`, passed on unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = IN_USE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: per `GlobalAlloc`, passed on unchanged.
        unsafe { System.dealloc(ptr, layout) };
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Requests issued without a window in the first test: enough that an unbounded backlog of
/// them (each carries 64 bytes) would hold over 64 MB. The others issue a quarter as many.
const REQUESTS: u64 = 1_000_000;

/// Growth of the heap allowed while the requests are issued: the lanes' batches, the fibers'
/// stacks and the runtime's own structures, far below what the requests would hold at once.
const HEAP_GROWTH: usize = 8 << 20;

/// Issues `requests` `apply_then`s from one fiber on worker 0 into `shards` (round-robin, each
/// carrying 64 bytes) without a window, and returns the most requests ever unanswered and the
/// heap's growth at its peak.
fn unwindowed(rt: &Runtime, shards: Vec<Trust<[u64; 8]>>, requests: u64) -> (u64, usize) {
    let before = IN_USE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let most = rt
        .spawn_on(0, move || {
            let issued = Rc::new(Cell::new(0u64));
            let answered = Rc::new(Cell::new(0u64));
            let most = Rc::new(Cell::new(0u64));
            let group = Group::new();
            for i in 0..requests {
                let payload = [i; 8];
                let shard = &shards[i as usize % shards.len()];
                let (answered, most_seen, issued_now) =
                    (answered.clone(), most.clone(), issued.clone());
                shard.apply_then(
                    move |sum| {
                        for (s, p) in sum.iter_mut().zip(payload) {
                            *s = s.wrapping_add(p);
                        }
                    },
                    group.track(move |()| {
                        let unanswered = issued_now.get() - answered.get();
                        most_seen.set(most_seen.get().max(unanswered));
                        answered.set(answered.get() + 1);
                    }),
                );
                issued.set(issued.get() + 1);
            }
            group.wait();
            assert_eq!(answered.get(), requests, "every callback ran once");
            most.get()
        })
        .join();
    (most, PEAK.load(Ordering::Relaxed).saturating_sub(before))
}

fn assert_bounded(what: &str, requests: u64, (most, growth): (u64, usize)) {
    eprintln!("{what}: at most {most} unanswered, heap grew {growth} bytes");
    assert!(
        most < 10_000,
        "{what}: {most} requests were unanswered at once, of {requests} issued without a window"
    );
    assert!(
        growth < HEAP_GROWTH,
        "{what}: the heap grew by {growth} bytes while {requests} requests were issued"
    );
}

#[test]
fn an_unwindowed_loop_into_another_workers_trustee_stays_bounded() {
    let rt = Runtime::builder().workers(2).build().unwrap();
    let shard = rt.trustee(1).entrust([0u64; 8]);
    assert_bounded(
        "one trust on the other worker",
        REQUESTS,
        unwindowed(&rt, vec![shard.clone()], REQUESTS),
    );
    let sum = shard.apply(|s| s[0]);
    assert_eq!(sum, (0..REQUESTS).sum::<u64>(), "every request ran once");
}

#[test]
fn an_unwindowed_loop_into_its_own_trustee_stays_bounded() {
    let rt = Runtime::builder().workers(2).build().unwrap();
    let shard = rt.trustee(0).entrust([0u64; 8]);
    let requests = REQUESTS / 4;
    assert_bounded(
        "one trust on the fiber's own worker",
        requests,
        unwindowed(&rt, vec![shard], requests),
    );
}

#[test]
fn an_unwindowed_loop_into_sharded_trusts_stays_bounded() {
    let rt = Runtime::builder().workers(2).build().unwrap();
    let shards: Vec<_> = (0..16).map(|_| rt.entrust([0u64; 8])).collect();
    let requests = REQUESTS / 4;
    assert_bounded(
        "16 trusts on both workers",
        requests,
        unwindowed(&rt, shards.clone(), requests),
    );
    let sum: u64 = shards.iter().map(|s| s.apply(|s| s[7])).sum();
    assert_eq!(sum, (0..requests).sum::<u64>(), "every request ran once");
}

#[test]
fn an_unwindowed_loop_into_another_runtimes_trustee_stays_bounded() {
    let rt = Runtime::builder().workers(1).build().unwrap();
    let other = Runtime::builder().workers(1).build().unwrap();
    let shard = other.entrust([0u64; 8]);
    let requests = REQUESTS / 10;
    assert_bounded(
        "one trust of another runtime",
        requests,
        unwindowed(&rt, vec![shard.clone()], requests),
    );
    let sum = shard.apply(|s| s[3]);
    assert_eq!(sum, (0..requests).sum::<u64>(), "every request ran once");
}
