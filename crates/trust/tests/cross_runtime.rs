//! Trusts used from the workers of another runtime.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use trust::Runtime;

mod common;
use common::{scaled, wait_until};

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

/// Where the requests of [`callbacks_keep_request_order`] are made.
#[derive(Clone, Copy, Debug)]
enum Caller {
    /// A fiber of worker 0 of runtime `a`.
    Fiber,
    /// A delegated closure on worker 1 of runtime `a` (a trustee, where blocking would panic).
    Delegated,
}

/// Makes many `apply_then` calls from one worker of runtime `a` to the two trustees of runtime
/// `b`, in a scrambled pattern, with closures of varied length. The calls are spread over many
/// rounds of the calling worker (a fiber yields after each; in delegated context they come in
/// small groups), so that answers keep arriving while the worker still waits for earlier
/// ones. Each trustee's callbacks must run on the calling worker in the order its requests
/// were made. The check is on the order alone: no pass depends on timing.
fn callbacks_keep_request_order(caller: Caller) {
    const GROUP: usize = 32;
    let a = runtime(2);
    let b = runtime(2);
    let calls = scaled(2000).next_multiple_of(GROUP);
    for round in 0..scaled(5) {
        let remotes: Vec<_> = (0..2).map(|w| b.trustee(w).entrust(Vec::new())).collect();
        let local = a.trustee(1).entrust(());
        let seen = Arc::new(Mutex::new([Vec::new(), Vec::new()]));
        let (rs, s, waiting) = (remotes.clone(), seen.clone(), seen.clone());
        let call = Arc::new(move |i: usize| {
            // A scrambled choice of trustee, and closures of varied length.
            let t = (i.wrapping_mul(2_654_435_761) >> 7) % 2;
            let work = (i * 7919) % 200;
            let s = s.clone();
            rs[t].apply_then(
                move |v| {
                    for k in 0..work {
                        std::hint::black_box(k);
                    }
                    v.push(i);
                    i
                },
                move |i| s.lock().unwrap()[t].push((trust::current_worker(), i)),
            );
        });
        let worker = match caller {
            Caller::Fiber => 0,
            Caller::Delegated => 1,
        };
        a.spawn_on(0, move || {
            for first in (0..calls).step_by(GROUP) {
                let group = first..first + GROUP;
                match caller {
                    Caller::Fiber => group.for_each(|i| {
                        call(i);
                        trust::yield_now();
                    }),
                    Caller::Delegated => {
                        let call = call.clone();
                        local.apply(move |()| {
                            assert!(trust::in_delegated_context());
                            group.for_each(|i| call(i));
                        })
                    }
                }
            }
            wait_until("every callback", || {
                waiting.lock().unwrap().iter().map(Vec::len).sum::<usize>() == calls
            });
        })
        .join();
        for (t, remote) in remotes.iter().enumerate() {
            let requested = remote.apply(|v| v.clone());
            let expected: Vec<_> = requested.iter().map(|&i| (Some(worker), i)).collect();
            assert_eq!(
                seen.lock().unwrap()[t],
                expected,
                "{caller:?}, round {round}: the callbacks for trustee {t} ran on worker {worker} in request order"
            );
            assert!(
                requested.is_sorted(),
                "trustee {t} ran the requests in order"
            );
        }
    }
}

#[test]
fn apply_then_on_another_runtimes_trust_keeps_request_order_from_a_fiber() {
    callbacks_keep_request_order(Caller::Fiber);
}

#[test]
fn apply_then_on_another_runtimes_trust_keeps_request_order_in_delegated_context() {
    callbacks_keep_request_order(Caller::Delegated);
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
