//! Fibers: spawn, join, yield, panics, and blocking rules.

mod common;

use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::rc::Rc;

use common::{message, runtime, scaled, within};

#[test]
fn spawn_join_and_results() {
    let rt = runtime(2);
    let sum: u64 = rt.block_on(|| {
        let handles: Vec<_> = (0..scaled(1000) as u64)
            .map(|i| trust::spawn(move || i * 2))
            .collect();
        handles.into_iter().map(|h| h.join()).sum()
    });
    let n = scaled(1000) as u64;
    assert_eq!(sum, n * (n - 1));
}

#[test]
fn join_from_another_worker_and_from_a_plain_thread() {
    let rt = runtime(2);
    let slow = rt.spawn_on(1, || {
        for _ in 0..100 {
            trust::yield_now();
        }
        "slow"
    });
    assert_eq!(rt.spawn_on(0, move || slow.join()).join(), "slow");
    let h = rt.spawn_on(1, || 5);
    assert_eq!(
        within("a plain thread's join of a fiber", move || h.join()),
        5
    );
}

#[test]
fn yield_now_interleaves_fibers_on_one_worker() {
    let rt = runtime(1);
    let log = rt.block_on(|| {
        let log = Rc::new(RefCell::new(Vec::new()));
        // Fibers on one worker share non-Send state only through the worker: use a trust.
        let shared = trust::local_trustee().entrust(Vec::new());
        let handles: Vec<_> = (0..2)
            .map(|id| {
                let shared = shared.clone();
                trust::spawn(move || {
                    for step in 0..3 {
                        shared.apply(|l| l.push((id, step)));
                        trust::yield_now();
                    }
                })
            })
            .collect();
        handles.into_iter().for_each(|h| h.join());
        log.borrow_mut().extend(shared.apply(|l| l.clone()));
        log.take()
    });
    assert_eq!(log, vec![(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]);
}

#[test]
fn a_fibers_panic_is_carried_to_join() {
    let rt = runtime(2);
    let h = rt.spawn(|| -> u8 { panic!("fiber boom") });
    let err = catch_unwind(AssertUnwindSafe(|| h.join())).unwrap_err();
    assert_eq!(message(err), "fiber boom");
    // The worker survives.
    assert_eq!(rt.spawn(|| 1).join(), 1);
    let err = catch_unwind(AssertUnwindSafe(|| rt.block_on(|| panic!("root boom")))).unwrap_err();
    assert_eq!(message(err), "root boom");
}

#[test]
fn join_handles_are_futures() {
    let rt = runtime(2);
    let h = rt.spawn(|| 9);
    let tokio_rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    assert_eq!(tokio_rt.block_on(h), 9);
}

#[test]
fn joining_in_delegated_context_panics() {
    let rt = runtime(2);
    let ct = rt.trustee(1).entrust(());
    let h = rt.spawn_on(0, || ());
    let msg = message(catch_unwind(AssertUnwindSafe(|| ct.apply(move |_| h.join()))).unwrap_err());
    assert!(
        msg.contains("apply_then") && msg.contains("launch"),
        "{msg}"
    );
}

#[test]
fn block_on_inside_a_worker_is_refused() {
    let rt = std::sync::Arc::new(runtime(1));
    let r = rt.clone();
    let msg = message(
        rt.spawn(move || catch_unwind(AssertUnwindSafe(|| r.block_on(|| ()))).unwrap_err())
            .join(),
    );
    assert!(msg.contains("block_on"), "{msg}");
}

#[test]
fn deep_recursion_fits_the_configured_stack() {
    let rt = trust::Runtime::builder()
        .workers(1)
        .stack_size(1 << 20)
        .build()
        .unwrap();
    fn depth(n: u32) -> u32 {
        let pad = std::hint::black_box([0u8; 512]);
        if n == 0 {
            pad[0] as u32
        } else {
            depth(n - 1) + 1
        }
    }
    assert_eq!(rt.block_on(|| depth(400)), 400); // ~0.5 MiB even in debug builds
}

/// A stack overflow in a fiber aborts with a message that names the fix. Runs the overflow in
/// a child process (this test binary, re-run with an environment variable).
#[test]
fn a_stack_overflow_is_reported_clearly() {
    if std::env::var_os("GOSSAMER_OVERFLOW_CHILD").is_some() {
        let rt = trust::Runtime::builder()
            .workers(1)
            .stack_size(32 * 1024)
            .build()
            .unwrap();
        fn recurse(n: u64) -> u64 {
            let pad = std::hint::black_box([n; 64]);
            if n == 0 { 0 } else { recurse(n - 1) + pad[3] }
        }
        rt.block_on(|| recurse(1_000_000));
        unreachable!("the fiber should have overflowed its stack");
    }
    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "--exact",
            "a_stack_overflow_is_reported_clearly",
            "--nocapture",
        ])
        .env("GOSSAMER_OVERFLOW_CHILD", "1");
    let out = within("the child process whose fiber overflows", move || {
        child.output().unwrap()
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("a fiber overflowed its stack"),
        "stderr: {stderr}"
    );
    assert!(stderr.contains("stack_size"), "stderr: {stderr}");
}

#[test]
fn sleep_suspends_only_the_fiber_and_lasts_at_least_its_duration() {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    let rt = runtime(1);
    let order = within("two fibers, one sleeping, on one worker", move || {
        rt.block_on(|| {
            let order: Arc<Mutex<Vec<(&str, Duration)>>> = Arc::default();
            let started = Instant::now();
            let (a, b) = (order.clone(), order.clone());
            let sleeper = trust::spawn(move || {
                trust::sleep(Duration::from_millis(300));
                a.lock().unwrap().push(("sleeper woke", started.elapsed()));
            });
            // Ready while the sleeper sleeps: it runs first unless the sleep holds the worker.
            let other = trust::spawn(move || b.lock().unwrap().push(("other ran", Duration::ZERO)));
            sleeper.join();
            other.join();
            order.lock().unwrap().clone()
        })
    });
    let names: Vec<&str> = order.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        ["other ran", "sleeper woke"],
        "the sleep held the worker"
    );
    assert!(
        order[1].1 >= Duration::from_millis(300),
        "woke early: {order:?}"
    );
}

#[test]
fn sleep_on_a_plain_thread_sleeps_the_thread_and_in_delegated_context_panics() {
    use std::time::{Duration, Instant};
    let started = Instant::now();
    trust::sleep(Duration::from_millis(20));
    assert!(started.elapsed() >= Duration::from_millis(20));
    let rt = runtime(1);
    let ct = rt.trustee(0).entrust(());
    let msg = message(
        catch_unwind(AssertUnwindSafe(|| {
            ct.apply(|_| trust::sleep(Duration::from_millis(1)))
        }))
        .unwrap_err(),
    );
    assert!(msg.contains("apply_then"), "{msg}");
}
