//! Trusts used from the workers of another runtime.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use trust::Runtime;

mod common;
use common::wait_until;

fn runtime(workers: usize) -> Runtime {
    Runtime::builder().workers(workers).build().unwrap()
}

#[test]
fn apply_then_on_another_runtimes_trust_blocks_neither_fiber_nor_worker() {
    let a = runtime(1);
    let b = runtime(1);
    let slow = b.entrust(41u64);
    let log = a
        .spawn_on(0, move || {
            let log = Arc::new(Mutex::new(Vec::new()));
            let l = log.clone();
            slow.apply_then(
                |v| {
                    // Long enough that a blocking call would show up in the order below.
                    std::thread::sleep(Duration::from_millis(100));
                    *v + 1
                },
                move |v| {
                    assert_eq!(trust::current_worker(), Some(0));
                    l.lock().unwrap().push(format!("then {v}"));
                },
            );
            log.lock().unwrap().push("returned".to_string());
            let l = log.clone();
            trust::spawn(move || l.lock().unwrap().push("other fiber".to_string())).join();
            wait_until("the apply_then callback", || log.lock().unwrap().len() == 3);
            log.lock().unwrap().clone()
        })
        .join();
    assert_eq!(log, ["returned", "other fiber", "then 42"]);
}

#[test]
fn apply_then_on_another_runtimes_trust_works_in_delegated_context() {
    let a = runtime(2);
    let b = runtime(1);
    let remote = b.entrust(Vec::new());
    let local = a.trustee(1).entrust(0u64);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (r, s, waiting) = (remote.clone(), seen.clone(), seen.clone());
    a.spawn_on(0, move || {
        local.apply(move |n| {
            assert!(trust::in_delegated_context());
            *n += 1;
            for i in 0..10 {
                let s = s.clone();
                // On a trustee of runtime `a`, where blocking would panic.
                r.apply_then(
                    move |v| {
                        v.push(i);
                        v.len()
                    },
                    move |len| s.lock().unwrap().push((trust::current_worker(), len)),
                );
            }
        });
        wait_until("ten callbacks", || waiting.lock().unwrap().len() == 10);
    })
    .join();
    let expected: Vec<_> = (1..=10).map(|len| (Some(1), len)).collect();
    assert_eq!(
        *seen.lock().unwrap(),
        expected,
        "callbacks run on the calling worker, in order"
    );
    assert_eq!(remote.apply(|v| v.clone()), (0..10).collect::<Vec<_>>());
}

#[test]
fn a_panic_on_another_runtimes_trustee_goes_to_the_callers_handler() {
    let panics = Arc::new(Mutex::new(Vec::new()));
    let p = panics.clone();
    let a = Runtime::builder()
        .workers(1)
        .panic_handler(move |panic| {
            let text = panic.downcast_ref::<&str>().map(|s| s.to_string());
            p.lock().unwrap().push(text.unwrap_or_default());
        })
        .build()
        .unwrap();
    let b = runtime(1);
    let remote = b.entrust(0u64);
    let r = remote.clone();
    let waiting = panics.clone();
    a.spawn_on(0, move || {
        r.apply_then(|_| -> u64 { panic!("boom on b") }, |_| unreachable!());
        wait_until("the panic", || !waiting.lock().unwrap().is_empty());
    })
    .join();
    assert_eq!(*panics.lock().unwrap(), ["boom on b"]);
    assert_eq!(remote.apply(|v| *v), 0, "b's trustee goes on serving");
}
