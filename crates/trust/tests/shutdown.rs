//! Shutdown: fibers unwound, unexecuted requests dropped, properties dropped once.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Drops, message, runtime, wait_until, within};

#[test]
fn dropping_the_runtime_unwinds_unfinished_fibers() {
    let drops = Drops::default();
    let started = Arc::new(AtomicBool::new(false));
    let rt = runtime(2);
    let mut handles = Vec::new();
    for w in 0..2 {
        let (guard, started) = (drops.track(()), started.clone());
        handles.push(rt.spawn_on(w, move || {
            let _guard = guard;
            started.store(true, Ordering::SeqCst);
            loop {
                trust::yield_now();
            }
        }));
    }
    wait_until("the fibers to start", || started.load(Ordering::SeqCst));
    within("the runtime's shutdown", move || drop(rt));
    assert_eq!(drops.count(), 2, "each fiber's locals were dropped");
    for h in handles {
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h.join())).unwrap_err();
        assert!(message(err).contains("shut down"));
    }
}

#[test]
fn requests_that_never_ran_are_dropped_once() {
    let drops = Drops::default();
    let rt = runtime(2);
    let blocker = rt.trustee(1).entrust(());
    let stop = Arc::new(AtomicBool::new(false));
    // Keep trustee 1 busy inside one request so later requests queue up behind it.
    let s = stop.clone();
    let b = blocker.clone();
    rt.spawn_on(0, move || {
        b.apply_then(
            move |_| {
                while !s.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                }
            },
            |()| {},
        )
    });
    let pending = drops.clone();
    let b = blocker.clone();
    rt.spawn_on(0, move || {
        for _ in 0..100 {
            let token = pending.track(());
            b.apply_then(move |_| drop(token), |()| {});
        }
    })
    .join();
    std::thread::sleep(Duration::from_millis(20));
    stop.store(true, Ordering::SeqCst);
    within("the runtime's shutdown", move || drop(rt));
    assert_eq!(
        drops.count(),
        100,
        "every request's closure was dropped exactly once, run or not"
    );
    drop(blocker);
}

#[test]
fn trusts_outliving_the_runtime_drop_their_property_and_refuse_work() {
    let drops = Drops::default();
    let rt = runtime(2);
    let t = rt.entrust(drops.track(5));
    let t2 = t.clone();
    within("the runtime's shutdown", move || drop(rt));
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.apply(|v| v.value)))
        .unwrap_err();
    assert!(message(err).contains("shut down"));
    drop(t);
    assert_eq!(drops.count(), 0);
    drop(t2);
    assert_eq!(drops.count(), 1);
}

#[test]
fn properties_still_entrusted_at_shutdown_are_dropped_by_their_last_trust() {
    let drops = Drops::default();
    let rt = runtime(2);
    let trusts: Vec<_> = (0..50).map(|i| rt.entrust(drops.track(i))).collect();
    let moved: Vec<_> = trusts.to_vec();
    // Fibers that hold trusts when the runtime goes away drop them while unwinding.
    rt.spawn(move || {
        let _held = moved;
        loop {
            trust::yield_now();
        }
    });
    std::thread::sleep(Duration::from_millis(10));
    within("the runtime's shutdown", move || drop(rt));
    assert_eq!(drops.count(), 0);
    drop(trusts);
    assert_eq!(drops.count(), 50);
}

#[test]
fn fibers_waiting_in_apply_with_borrowed_stacks_shut_down_cleanly() {
    let rt = runtime(2);
    let busy = rt.trustee(1).entrust(0u64);
    let release = Arc::new(AtomicBool::new(false));
    let r = release.clone();
    let b = busy.clone();
    rt.spawn_on(0, move || {
        b.apply_then(
            move |_| {
                while !r.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                }
            },
            |()| {},
        )
    });
    for _ in 0..8 {
        let b = busy.clone();
        rt.spawn_on(0, move || {
            let local = vec![1u64; 64]; // lives on this fiber's stack frame
            loop {
                // The closure borrows `local`: the stack must outlive the request, whether the
                // request runs or is dropped at shutdown.
                b.apply(|n| *n += local.iter().sum::<u64>());
            }
        });
    }
    std::thread::sleep(Duration::from_millis(20));
    release.store(true, Ordering::SeqCst);
    within("the runtime's shutdown", move || drop(rt));
    // The trust outlives the runtime; dropping it frees the property on this thread.
    drop(busy);
}

/// A request sent through `apply_async` from outside the runtime travels in its trustee's
/// injector. One still queued there when the runtime shuts down is dropped once and its future
/// fails with the shut-down error; one that ran answers; none leaves its future waiting. A
/// future first polled after shutdown fails at once.
#[test]
fn apply_async_requests_across_shutdown_answer_or_fail_but_never_hang() {
    use std::future::Future;
    use std::task::{Context, Waker};

    let drops = Drops::default();
    let rt = runtime(2);
    let counter = rt.trustee(1).entrust(0u64);
    let after = counter.apply_async(|c| *c);
    // Keep trustee 1 busy inside one request, so the submissions below queue behind it.
    let (started, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (s, t, c) = (started.clone(), stop.clone(), counter.clone());
    rt.spawn_on(0, move || {
        c.apply_then(
            move |_| {
                s.store(true, Ordering::SeqCst);
                while !t.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                }
            },
            |()| {},
        )
    });
    wait_until("trustee 1 to run the blocking request", || {
        started.load(Ordering::SeqCst)
    });
    let mut queued: Vec<_> = (0..100)
        .map(|_| {
            let token = drops.track(());
            counter.apply_async(move |c| {
                drop(token);
                *c += 1;
                *c
            })
        })
        .collect();
    let mut cx = Context::from_waker(Waker::noop());
    for future in &mut queued {
        // The first poll sends the request; its answer cannot be in yet.
        assert!(std::pin::Pin::new(future).poll(&mut cx).is_pending());
    }
    let shutdown = std::thread::spawn(move || drop(rt));
    std::thread::sleep(Duration::from_millis(20));
    stop.store(true, Ordering::SeqCst);
    within("the runtime's shutdown", move || shutdown.join().unwrap());
    let outcomes = within("every queued future to end", move || {
        queued
            .into_iter()
            .map(|f| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| trust::block_on(f)))
                    .map_err(message)
            })
            .collect::<Vec<_>>()
    });
    let mut answered = 0;
    for outcome in outcomes {
        match outcome {
            Ok(n) => {
                answered += 1;
                assert_eq!(n, answered, "the requests that ran, ran in order");
            }
            Err(m) => assert!(m.contains("shut down before the request ran"), "{m}"),
        }
    }
    assert_eq!(
        drops.count(),
        100,
        "every closure was dropped once, run or not"
    );
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| trust::block_on(after)))
        .map_err(message)
        .unwrap_err();
    assert!(err.contains("shut down"), "{err}");
    drop(counter);
}

/// A `launch` whose fiber is still suspended when the runtime shuts down fails with the
/// shut-down error instead of leaving its caller waiting (it waited forever before).
#[test]
fn a_launch_cut_short_by_shutdown_fails_instead_of_waiting() {
    let rt = runtime(2);
    let latched = rt.trustee(1).entrust(trust::Latch::new(0u64));
    let started = Arc::new(AtomicBool::new(false));
    let (l, s) = (latched.clone(), started.clone());
    let waiter = std::thread::spawn(move || {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            l.launch(move |v| {
                s.store(true, Ordering::SeqCst);
                trust::sleep(Duration::from_secs(3600));
                *v += 1;
            })
        }))
        .map_err(message)
    });
    wait_until("the launched fiber to start", || {
        started.load(Ordering::SeqCst)
    });
    within("the runtime's shutdown", move || drop(rt));
    let outcome = within("the launch to return", move || waiter.join().unwrap());
    let err = outcome.expect_err("the launch cannot have finished");
    assert!(err.contains("shut down"), "{err}");
    drop(latched);
}
