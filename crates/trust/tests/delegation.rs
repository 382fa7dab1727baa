//! Delegation: every row of the API, its error paths, and stress with exact counts.

mod common;

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::{Drops, message, runtime, scaled, wait_until, within};
use rand::{Rng, SeedableRng};
use trust::{Latch, Runtime, Trust};

#[test]
fn apply_returns_results_and_borrows_the_callers_stack() {
    let rt = runtime(2);
    let v = rt.entrust(Vec::<String>::new());
    rt.block_on(|| {
        let word = String::from("borrowed");
        let mut seen = 0;
        v.apply(|v| {
            v.push(word.clone());
            seen = v.len(); // writes the caller's local through a borrow
        });
        assert_eq!(seen, 1);
        assert_eq!(v.apply(|v| v[0].clone()), "borrowed");
    });
}

#[test]
fn entrust_through_pool_local_trustee_and_trustee_ref() {
    let rt = runtime(3);
    let pooled: Vec<_> = (0..6).map(|i| rt.entrust(i)).collect();
    let mut trustees: Vec<_> = pooled.iter().map(Trust::trustee).collect();
    trustees.sort();
    assert_eq!(
        trustees,
        vec![0, 0, 1, 1, 2, 2],
        "the pool places round-robin"
    );
    assert_eq!(rt.trustee(2).entrust(()).trustee(), 2);
    let (local, worker) = rt
        .spawn_on(1, || {
            (
                trust::local_trustee().entrust(5).trustee(),
                trust::current_worker(),
            )
        })
        .join();
    assert_eq!(Some(local), worker);
    let inside = rt.spawn_on(2, || trust::entrust(1u8).trustee()).join();
    assert!(inside < 3);
}

#[test]
fn closures_run_on_the_trustee() {
    let rt = runtime(2);
    for w in 0..2 {
        let t = rt.trustee(w).entrust(());
        assert_eq!(t.apply(|_| trust::current_worker()), Some(w));
        assert!(t.apply(|_| trust::in_delegated_context()));
        let from_fiber = rt
            .spawn_on(1 - w, move || t.apply(|_| trust::current_worker()))
            .join();
        assert_eq!(from_fiber, Some(w));
    }
}

#[test]
fn apply_then_runs_in_order_and_calls_back_on_the_callers_worker() {
    let rt = runtime(2);
    let log = rt.trustee(1).entrust(Vec::new());
    let (order, callback_workers) = rt
        .spawn_on(0, move || {
            let answers = Rc::new(Cell::new(0));
            let workers = Rc::new(Cell::new(true));
            for i in 0..1000 {
                let (answers, workers) = (answers.clone(), workers.clone());
                log.apply_then(
                    move |l| {
                        l.push(i);
                        l.len()
                    },
                    move |len| {
                        assert_eq!(len, i + 1, "answers arrive in request order");
                        answers.set(answers.get() + 1);
                        workers.set(workers.get() && trust::current_worker() == Some(0));
                    },
                );
            }
            wait_until("1000 apply_then callbacks", || answers.get() == 1000);
            (log.apply(|l| l.clone()), workers.get())
        })
        .join();
    assert_eq!(order, (0..1000).collect::<Vec<_>>());
    assert!(callback_workers);
}

#[test]
fn apply_then_is_allowed_in_delegated_context() {
    let rt = runtime(2);
    let a = rt.trustee(0).entrust(0);
    let b = rt.trustee(1).entrust(0);
    let b2 = b.clone();
    a.apply(move |_| {
        // Cloning and delegating from inside a delegated closure are both non-blocking.
        let b3 = b2.clone();
        b2.apply_then(|b| *b += 1, move |_| drop(b3));
    });
    wait_until("the apply_then issued in a delegated closure", || {
        b.apply(|b| *b) != 0
    });
    assert_eq!(b.apply(|b| *b), 1);
}

/// `try_apply_inline` runs at once only on the trustee's own worker, outside delegated context,
/// and never ahead of a request that worker sent its trustee earlier.
#[test]
fn try_apply_inline_never_overtakes_the_workers_own_requests() {
    let rt = runtime(2);
    let (a, b) = (rt.trustee(1).entrust(0u64), rt.trustee(1).entrust(()));
    let seen = rt
        .spawn_on(1, move || {
            assert_eq!(
                a.try_apply_inline(|n| *n + 1).ok(),
                Some(1),
                "idle: runs here"
            );
            let a2 = a.clone();
            // In delegated context a request for this worker's own trustee is staged, not run.
            b.apply(move |_| a2.apply_then(|n| *n += 10, |()| {}));
            let refused = a.try_apply_inline(|n| *n).is_err();
            // Once the staged request has run, the next one runs here and sees it.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            let mut after = None;
            while after.is_none() && std::time::Instant::now() < deadline {
                trust::yield_now();
                after = a.try_apply_inline(|n| *n).ok();
            }
            (refused, after)
        })
        .join();
    assert_eq!(
        seen,
        (true, Some(10)),
        "(refused while staged, value after)"
    );
    let elsewhere = {
        let a = rt.trustee(1).entrust(5u64);
        rt.spawn_on(0, move || a.try_apply_inline(|n| *n).is_err())
            .join()
    };
    assert!(elsewhere, "worker 0 is not the trustee");
    let inside = {
        let (a, b) = (rt.trustee(1).entrust(1u64), rt.trustee(1).entrust(()));
        rt.spawn_on(1, move || {
            let mut f = move |_: &mut u64| {
                let given_back = b.try_apply_inline(|_| ()).is_err();
                (given_back, trust::in_delegated_context())
            };
            // What the earlier fibers of this worker sent it (the releases of the handles
            // they dropped) may still wait: until it has run, `f` is given back.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            loop {
                match a.try_apply_inline(f) {
                    Ok(ran) => break Some(ran),
                    Err(back) if std::time::Instant::now() < deadline => {
                        f = back;
                        trust::yield_now();
                    }
                    Err(_) => break None,
                }
            }
        })
        .join()
    };
    assert_eq!(
        inside,
        Some((true, true)),
        "runs in delegated context, where it gives a closure back"
    );
}

#[test]
fn apply_with_passes_its_argument() {
    let rt = runtime(1);
    let table = rt.entrust(std::collections::HashMap::new());
    let old = table.apply_with(
        |t, (k, v): (String, Vec<u8>)| t.insert(k, v),
        ("k".into(), vec![1, 2, 3]),
    );
    assert_eq!(old, None);
    assert_eq!(table.apply(|t| t["k"].len()), 3);
}

#[test]
fn apply_async_from_tokio_and_from_fibers() {
    let rt = runtime(2);
    let ct = rt.entrust(40);
    let tokio_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let futures: Vec<_> = (0..100).map(|_| ct.apply_async(|c| *c += 1)).collect();
    tokio_rt.block_on(async {
        for f in futures {
            f.await;
        }
    });
    assert_eq!(ct.apply(|c| *c), 140);
    let ct2 = ct.clone();
    let v = rt
        .spawn_on(0, move || trust::block_on(ct2.apply_async(|c| *c * 2)))
        .join();
    assert_eq!(v, 280);
    // A panic travels to whoever polls the future.
    let failing = ct.apply_async(|_| -> u8 { panic!("async boom") });
    let err = catch_unwind(AssertUnwindSafe(|| trust::block_on(failing))).unwrap_err();
    assert_eq!(message(err), "async boom");
}

/// Many tasks of one tokio thread await at once, and single awaits follow each other (the
/// futures spin then, see `ApplyFuture`): every request runs once, in order per task, also with
/// spinning turned off and when the answers panic.
#[test]
fn apply_async_from_many_tokio_tasks_and_one_at_a_time() {
    for spin in [trust::DEFAULT_SPIN, std::time::Duration::ZERO] {
        within("tokio tasks awaiting apply_async", move || {
            let rt = Runtime::builder().workers(2).spin(spin).build().unwrap();
            let log = rt.trustee(1).entrust(Vec::<(u32, u32)>::new());
            let tokio_rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let (tasks, each) = (50, scaled(200) as u32);
            tokio_rt.block_on(async {
                let handles: Vec<_> = (0..tasks)
                    .map(|task| {
                        let log = log.clone();
                        tokio::spawn(async move {
                            for i in 0..each {
                                log.apply_async(move |l| l.push((task, i))).await;
                            }
                        })
                    })
                    .collect();
                for h in handles {
                    h.await.unwrap();
                }
                for i in 0..each {
                    let len = log.apply_async(|l| l.len()).await;
                    assert_eq!(len, (tasks * each) as usize, "await {i} alone");
                }
                let failing = log.apply_async(|_| -> u8 { panic!("async boom") });
                let err = tokio::spawn(failing).await.unwrap_err();
                assert_eq!(message(err.into_panic()), "async boom");
            });
            let log = log.apply(std::mem::take);
            for task in 0..tasks {
                let mine: Vec<u32> = log.iter().filter(|e| e.0 == task).map(|e| e.1).collect();
                assert_eq!(
                    mine,
                    (0..each).collect::<Vec<_>>(),
                    "task {task}'s requests"
                );
            }
        });
    }
}

#[test]
fn apply_then_outside_the_workers_panics_naming_apply_and_apply_async() {
    let rt = runtime(2);
    let ct = rt.entrust(17);
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    // A plain thread: before, this waited and ran `then` here.
    let err = catch_unwind(AssertUnwindSafe(|| {
        ct.apply_then(
            move |c| {
                r.fetch_add(1, Ordering::Relaxed);
                *c
            },
            |_| {},
        )
    }))
    .unwrap_err();
    let text = message(err);
    assert!(
        text.contains("use apply to wait") && text.contains("apply_async"),
        "{text}"
    );
    // A tokio task: the same, instead of blocking the executor's thread.
    let tokio_rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let ct2 = ct.clone();
    let err = tokio_rt
        .block_on(async { tokio::spawn(async move { ct2.apply_then(|c| *c, |_| {}) }).await })
        .unwrap_err();
    assert!(message(err.into_panic()).contains("apply_async"));
    // Nothing was sent, and the trust still works.
    assert_eq!(ran.load(Ordering::Relaxed), 0);
    assert_eq!(ct.apply(|c| *c), 17);
    // `launch_then` likewise, naming `launch`.
    let latched = rt.entrust(Latch::new(1));
    let err = catch_unwind(AssertUnwindSafe(|| latched.launch_then(|v| *v, |_| {}))).unwrap_err();
    assert!(message(err).contains("use launch to wait"));
    assert_eq!(latched.launch(|v| *v), 1);
}

#[test]
fn launch_may_block_and_holds_the_latch() {
    let rt = runtime(2);
    let other = rt.trustee(0).entrust(10);
    let latched = rt.trustee(1).entrust(Latch::new(Vec::new()));
    // Two launches that suspend while holding the latch must not interleave.
    let handles: Vec<_> = (0..2)
        .map(|id| {
            let (latched, other) = (latched.clone(), other.clone());
            rt.spawn_on(0, move || {
                latched.launch(move |v| {
                    v.push((id, "start"));
                    for _ in 0..20 {
                        other.apply(|o| *o += 1); // nested blocking delegation
                        trust::yield_now();
                    }
                    v.push((id, "end"));
                })
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join());
    let log = latched.apply(|l| l.try_lock().expect("no launch holds the latch now").clone());
    assert_eq!(log.len(), 4);
    assert_eq!(
        log[0].0, log[1].0,
        "a launched closure runs to its end before the next starts"
    );
    assert_eq!(log[2].0, log[3].0);
    assert_eq!(other.apply(|o| *o), 50);
}

#[test]
fn launch_then_delivers_on_the_callers_worker() {
    let rt = runtime(2);
    let latched = rt.trustee(1).entrust(Latch::new(1));
    let got = rt
        .spawn_on(0, move || {
            let out = Rc::new(Cell::new(None));
            let o = out.clone();
            latched.launch_then(
                |v| *v + 1,
                move |r| o.set(Some((r, trust::current_worker()))),
            );
            wait_until("the launch_then callback", || out.get().is_some());
            out.get().unwrap()
        })
        .join();
    assert_eq!(got, (2, Some(0)));
}

#[test]
fn blocking_in_delegated_context_panics_naming_the_alternatives() {
    let rt = runtime(2);
    let a = rt.trustee(0).entrust(0);
    let b = rt.trustee(1).entrust(0);
    for caller in [None, Some(0), Some(1)] {
        let (a, b) = (a.clone(), b.clone());
        let attempt = move || {
            catch_unwind(AssertUnwindSafe(|| a.apply(|_| b.apply(|b| *b)))).map_err(message)
        };
        let result = match caller {
            None => attempt(),
            Some(w) => rt.spawn_on(w, attempt).join(),
        };
        let msg = result.unwrap_err();
        assert!(msg.contains("delegated context"), "{msg}");
        assert!(
            msg.contains("apply_then") && msg.contains("launch"),
            "{msg}"
        );
    }
    // The trustee still serves afterwards.
    assert_eq!(a.apply(|a| *a + 1), 1);
}

#[test]
fn a_panicking_closure_is_reraised_and_the_trustee_keeps_serving() {
    let rt = runtime(2);
    for w in 0..2 {
        let ct = rt.trustee(w).entrust(0);
        let c2 = ct.clone();
        let from_fiber = rt
            .spawn_on(0, move || {
                catch_unwind(AssertUnwindSafe(|| {
                    c2.apply(|c| {
                        *c += 1;
                        panic!("boom {}", *c)
                    })
                }))
                .map_err(message)
            })
            .join();
        assert_eq!(from_fiber.unwrap_err(), "boom 1");
        let from_thread = catch_unwind(AssertUnwindSafe(|| {
            ct.apply(|_| -> () { panic!("thread boom") })
        }));
        assert_eq!(message(from_thread.unwrap_err()), "thread boom");
        // The property keeps the changes made before the panic.
        assert_eq!(ct.apply(|c| *c), 1);
    }
}

#[test]
fn panics_without_a_caller_go_to_the_panic_handler() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let rt = Runtime::builder()
        .workers(2)
        .panic_handler(move |p| s.lock().unwrap().push(message(p)))
        .build()
        .unwrap();
    let ct = rt.trustee(1).entrust(0);
    rt.spawn_on(0, move || {
        ct.apply_then(|_| -> () { panic!("in delegated closure") }, |_| {});
        ct.apply_then(|c| *c, |_| panic!("in callback"));
        ct.apply(|_| ()); // same channel, so both earlier answers are in by now
    })
    .join();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(seen, vec!["in callback", "in delegated closure"]);
}

#[test]
fn properties_drop_on_their_trustee_after_the_last_trust() {
    let rt = runtime(2);
    let dropped_on = Arc::new(Mutex::new(None));
    struct Probe(Arc<Mutex<Option<Option<usize>>>>);
    impl Drop for Probe {
        fn drop(&mut self) {
            *self.0.lock().unwrap() = Some(trust::current_worker());
        }
    }
    let t = rt.trustee(1).entrust(Probe(dropped_on.clone()));
    let clones: Vec<_> = (0..10).map(|_| t.clone()).collect();
    drop(t);
    rt.spawn_on(0, move || drop(clones)).join();
    wait_until("the property's drop", || {
        dropped_on.lock().unwrap().is_some()
    });
    assert_eq!(*dropped_on.lock().unwrap(), Some(Some(1)));
}

#[test]
fn large_closures_and_large_or_overaligned_results() {
    // Debug builds keep several copies of the 4.8 KB result per frame: use the default stack.
    let rt = Runtime::builder().workers(2).build().unwrap();
    let ct = rt.trustee(1).entrust(3u64);
    let big = [7u8; 1000]; // captured by value: boxed into the slot
    let (sum, echoed, wide) = rt
        .spawn_on(0, move || {
            let sum = ct.apply(move |c| big.iter().map(|&b| b as u64).sum::<u64>() + *c);
            let echoed = ct.apply(|c| [*c; 600]); // 4800-byte result: boxed answer
            let wide = ct.apply(|c| *c as u128 * u64::MAX as u128); // 16-aligned result
            (sum, echoed, wide)
        })
        .join();
    assert_eq!(sum, 7003);
    assert!(echoed.iter().all(|&x| x == 3));
    assert_eq!(wide, 3 * u64::MAX as u128);
}

#[test]
fn many_plain_threads_share_the_external_channels() {
    let rt = Runtime::builder()
        .workers(2)
        .external_clients(2)
        .build()
        .unwrap();
    let ct = rt.entrust(0u64);
    let threads = 8;
    let per = scaled(2000);
    let count = within("8 plain threads' applies", move || {
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| (0..per).for_each(|_| ct.apply(|c| *c += 1)));
            }
        });
        ct.apply(|c| *c)
    });
    assert_eq!(count, (threads * per) as u64);
}

#[test]
fn builder_rejects_bad_configurations() {
    let err = |b: trust::Builder| b.build().unwrap_err().to_string();
    assert!(err(Runtime::builder().workers(0)).contains("at least one worker"));
    assert!(
        err(Runtime::builder().workers(2).dedicated_trustees(2)).contains("dedicated_trustees(2)")
    );
    assert!(err(Runtime::builder().workers(1).stack_size(1024)).contains("16 KiB"));
}

#[test]
fn dedicated_trustees_serve_the_pool() {
    let rt = Runtime::builder()
        .workers(3)
        .dedicated_trustees(1)
        .build()
        .unwrap();
    assert_eq!(rt.client_workers(), 2);
    let counters: Vec<_> = (0..4).map(|_| rt.entrust(0u32)).collect();
    assert!(counters.iter().all(|c| c.trustee() == 2));
    let handles: Vec<_> = (0..20)
        .map(|_| {
            let cs = counters.clone();
            rt.spawn(move || cs.iter().for_each(|c| c.apply(|n| *n += 1)))
        })
        .collect();
    handles.into_iter().for_each(|h| h.join());
    assert!(counters.iter().all(|c| c.apply(|n| *n) == 20));
    let msg = message(
        rt.spawn_on(0, || catch_unwind(trust::local_trustee).map(|_| ()))
            .join()
            .unwrap_err(),
    );
    assert!(msg.contains("not a trustee"), "{msg}");
}

#[test]
fn stress_thousands_of_fibers_with_exact_counts() {
    let rt = runtime(2);
    let counters: Vec<_> = (0..10).map(|_| rt.entrust(0u64)).collect();
    let fibers = scaled(4000);
    let per = 25;
    let handles: Vec<_> = (0..fibers)
        .map(|i| {
            let cs = counters.clone();
            rt.spawn(move || {
                for k in 0..per {
                    let c = &cs[(i + k) % cs.len()];
                    if k % 3 == 0 {
                        c.apply_then(|n| *n += 1, |()| {});
                    } else {
                        c.apply(|n| *n += 1);
                    }
                }
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join());
    // apply_then requests may still be in flight after a fiber ends; an apply from the same
    // worker to the same trustee comes after them. Wait from every worker.
    for w in 0..2 {
        let cs = counters.clone();
        rt.spawn_on(w, move || cs.iter().for_each(|c| c.apply(|_| ())))
            .join();
    }
    let total: u64 = counters.iter().map(|c| c.apply(|n| *n)).sum();
    assert_eq!(total, (fibers * per) as u64);
}

#[test]
fn random_clone_and_drop_drops_every_property_exactly_once() {
    let drops = Drops::default();
    let properties = scaled(300);
    {
        let rt = runtime(2);
        let trusts: Vec<_> = (0..properties)
            .map(|i| rt.entrust(drops.track(i)))
            .collect();
        let handles: Vec<_> = (0..8)
            .map(|seed| {
                let mut mine: Vec<Trust<common::Tracked<usize>>> =
                    trusts.iter().map(Trust::clone).collect();
                rt.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                    for _ in 0..2000 {
                        let i = rng.random_range(0..mine.len());
                        match rng.random_range(0..4) {
                            0 => mine.push(mine[i].clone()),
                            1 if mine.len() > 1 => drop(mine.swap_remove(i)),
                            2 => {
                                let t = mine[i].clone();
                                mine[i].apply_then(move |v| v.value, move |_| drop(t));
                            }
                            _ => mine[i].apply(|v| assert!(v.value < usize::MAX)),
                        }
                    }
                })
            })
            .collect();
        // Plain threads clone and drop too.
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let copies: Vec<_> = trusts.iter().map(Trust::clone).collect();
                    copies
                        .iter()
                        .for_each(|t| assert!(t.apply(|v| v.value) < properties));
                });
            }
        });
        handles.into_iter().for_each(|h| h.join());
        assert!(
            drops.count() < properties,
            "properties with live trusts were dropped"
        );
        drop(trusts);
    }
    assert_eq!(drops.count(), properties);
}

#[test]
fn apply_from_the_trustees_own_fibers_stays_ordered_with_apply_then() {
    let rt = runtime(1);
    let log = rt.trustee(0).entrust(Vec::new());
    let result = rt
        .spawn_on(0, move || {
            log.apply_then(|l| l.push(1), |()| {});
            log.apply(|l| l.push(2)); // must not overtake the staged apply_then
            log.apply(|l| l.clone())
        })
        .join();
    assert_eq!(result, vec![1, 2]);
}

#[test]
fn fibers_of_one_runtime_can_use_another_runtimes_trusts() {
    let a = runtime(1);
    let b = runtime(1);
    let counter = b.entrust(0);
    let c = counter.clone();
    a.spawn_on(0, move || (0..100).for_each(|_| c.apply(|n| *n += 1)))
        .join();
    assert_eq!(counter.apply(|n| *n), 100);
    let count = AtomicUsize::new(0);
    a.block_on(|| count.fetch_add(1, Ordering::SeqCst));
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[test]
fn apply_then_on_the_own_trustee_keeps_order_and_defers_the_callback() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let rt = Runtime::builder()
        .workers(2)
        .panic_handler(move |p| s.lock().unwrap().push(message(p)))
        .build()
        .unwrap();
    let log = rt.trustee(0).entrust(Vec::new());
    let remote = rt.trustee(1).entrust(0);
    let (order, callbacks) = rt
        .spawn_on(0, move || {
            let calls = Rc::new(Cell::new(0));
            for i in 0..100 {
                let counted = calls.clone();
                log.apply_then(
                    move |l| {
                        l.push(i);
                        l.len()
                    },
                    move |len| {
                        assert_eq!(len, i + 1);
                        assert_eq!(counted.get(), i, "callbacks run in request order");
                        counted.set(i + 1);
                    },
                );
                assert!(calls.get() <= i, "a callback never runs inside apply_then");
            }
            log.apply_then(|_| -> () { panic!("inline boom") }, |_| {});
            // A request from a delegated closure on the same trustee is staged, not run inline.
            let l2 = log.clone();
            remote.apply(move |_| l2.apply_then(|l| l.push(100), |()| {}));
            wait_until("100 apply_then callbacks", || calls.get() == 100);
            (log.apply(|l| l.clone()), calls.get())
        })
        .join();
    assert_eq!(callbacks, 100);
    assert_eq!(&order[..100], &(0..100).collect::<Vec<_>>()[..]);
    assert_eq!(seen.lock().unwrap().as_slice(), ["inline boom"]);
}

#[test]
fn fibers_delegating_inline_in_a_loop_do_not_starve_other_clients() {
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};
    let rt = runtime(2);
    let counter = rt.trustee(0).entrust(0u64);
    let done = Arc::new(AtomicBool::new(false));
    // Fibers on the trustee's own worker run their applies inline, in a tight loop.
    let loopers: Vec<_> = (0..4)
        .map(|_| {
            let (c, done) = (counter.clone(), done.clone());
            rt.spawn_on(0, move || {
                let began = Instant::now();
                while !done.load(Ordering::SeqCst) && began.elapsed() < Duration::from_secs(30) {
                    c.apply(|n| *n += 1);
                }
            })
        })
        .collect();
    // A fiber on the other worker needs the trustee to serve its channel. Starved, it would
    // wait until the loopers give up (30 s); served, it takes milliseconds, or seconds on a
    // machine busy with other tests or under valgrind.
    let c = counter.clone();
    let requests = scaled(200);
    let began = Instant::now();
    rt.spawn_on(1, move || (0..requests).for_each(|_| c.apply(|n| *n += 1)))
        .join();
    let waited = began.elapsed();
    done.store(true, Ordering::SeqCst);
    loopers.into_iter().for_each(|h| h.join());
    assert!(
        waited < Duration::from_secs(20),
        "the remote client waited {waited:?}"
    );
}

#[test]
fn apply_then_from_a_fiber_that_never_yields_is_held_back() {
    let rt = runtime(2);
    let counter = rt.trustee(1).entrust(0u64);
    let c = counter.clone();
    let n = scaled(200_000) as u64;
    // Without backpressure this fiber would stage all requests before any was sent.
    let answered = rt
        .spawn_on(0, move || {
            let answered = Rc::new(Cell::new(0u64));
            for _ in 0..n {
                let a = answered.clone();
                c.apply_then(|v| *v += 1, move |()| a.set(a.get() + 1));
            }
            let during = answered.get();
            wait_until("every apply_then callback", || answered.get() == n);
            during
        })
        .join();
    assert!(
        answered > 0,
        "answers arrived while the fiber was still issuing"
    );
    assert_eq!(counter.apply(|v| *v), n);
}

#[test]
fn pinned_runtimes_start_and_run() {
    let rt = Runtime::builder().workers(3).pin(true).build().unwrap();
    let ct = rt.entrust(1);
    assert_eq!(rt.spawn(move || ct.apply(|c| *c + 1)).join(), 2);
}
