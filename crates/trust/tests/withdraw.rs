//! Taking a property out of its runtime (`Trust::withdraw`) while every kind of client uses
//! it and it moves between trustees: each request runs once, in order, or is refused with a
//! panic; none is lost, every closure is dropped once, and the value is the caller's.

mod common;

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};

use common::{scaled, wait_until, within};
use trust::{Latch, MigrateError, Runtime};

/// Counts its drops.
struct Tracked(Arc<AtomicUsize>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// What the property saw: each client's requests that ran, and every break of their order.
struct Seen {
    ran: HashMap<u64, u64>,
    broken: Vec<String>,
    _value: Tracked,
}

impl Seen {
    fn check(&mut self, client: u64, seq: u64) {
        let last = self.ran.entry(client).or_insert(0);
        if seq != *last + 1 && self.broken.len() < 10 {
            self.broken
                .push(format!("client {client}: request {seq} ran after {last}"));
        }
        *last = seq;
    }
}

/// Whether `panic` is a withdrawn property's refusal.
fn is_refusal(panic: &(dyn std::any::Any + Send)) -> bool {
    let text = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str));
    text.is_some_and(|t| t.contains("withdrawn from its runtime"))
}

/// A runtime whose panic handler counts refusals (of `apply_then` requests) and fails the
/// test on any other panic.
fn runtime(workers: usize, refused: &Arc<AtomicU64>) -> Runtime {
    let refused = refused.clone();
    Runtime::builder()
        .workers(workers)
        .panic_handler(move |panic| {
            assert!(is_refusal(&*panic), "a panic that is not a refusal");
            refused.fetch_add(1, Ordering::Relaxed);
        })
        .build()
        .unwrap()
}

#[test]
fn every_request_runs_once_in_order_or_is_refused() {
    within("the clients and the withdrawal", || {
        let workers = 3;
        let refused = Arc::new(AtomicU64::new(0));
        let rt = runtime(workers, &refused);
        let other = runtime(1, &refused);
        let value_drops = Arc::new(AtomicUsize::new(0));
        let closure_drops = Arc::new(AtomicUsize::new(0));
        let property = rt.trustee(0).entrust(Seen {
            ran: HashMap::new(),
            broken: Vec::new(),
            _value: Tracked(value_drops.clone()),
        });
        // Set once the value is out; clients that pipeline make a few requests more.
        let withdrawn = Arc::new(AtomicBool::new(false));
        // Per client: requests made and answered (refusals are counted apart).
        let made: Arc<Vec<AtomicU64>> = Arc::new((0..32).map(|_| AtomicU64::new(0)).collect());
        let answered: Arc<Vec<AtomicU64>> = Arc::new((0..32).map(|_| AtomicU64::new(0)).collect());

        // Pipelining fibers on every worker (clients 0..3) and on another runtime's (3).
        let pipeline = |id: u64| {
            let (p, withdrawn) = (property.clone(), withdrawn.clone());
            let (made, answered, drops) = (made.clone(), answered.clone(), closure_drops.clone());
            move || {
                let mut seq = 0;
                let mut after = 0;
                while after < 32 {
                    if withdrawn.load(Ordering::Relaxed) {
                        after += 1;
                    }
                    seq += 1;
                    let guard = Tracked(drops.clone());
                    let answered = answered.clone();
                    made[id as usize].fetch_add(1, Ordering::Relaxed);
                    // Refused where it is made once the trust knows (a worker of the
                    // property's runtime), otherwise where its answer arrives.
                    let call = catch_unwind(AssertUnwindSafe(|| {
                        p.apply_then(
                            move |s: &mut Seen| {
                                let _guard = guard;
                                s.check(id, seq)
                            },
                            move |()| {
                                answered[id as usize].fetch_add(1, Ordering::Relaxed);
                            },
                        )
                    }));
                    match call {
                        Ok(()) => {}
                        Err(panic) if is_refusal(&*panic) => return 1,
                        Err(panic) => std::panic::resume_unwind(panic),
                    }
                    if seq % 8 == 0 {
                        trust::yield_now();
                    }
                }
                0
            }
        };
        let mut fibers: Vec<_> = (0..workers)
            .map(|w| rt.spawn_on(w, pipeline(w as u64)))
            .collect();
        fibers.push(other.spawn_on(0, pipeline(3)));

        // Clients that wait for each answer, until one is refused: fibers (10..13), a plain
        // thread (20) and a thread that awaits futures (21).
        let waiting = |id: u64| {
            let p = property.clone();
            let (made, answered, drops) = (made.clone(), answered.clone(), closure_drops.clone());
            move || {
                let mut seq = 0;
                loop {
                    seq += 1;
                    made[id as usize].fetch_add(1, Ordering::Relaxed);
                    let guard = Tracked(drops.clone());
                    let f = move |s: &mut Seen| {
                        let _guard = guard;
                        s.check(id, seq)
                    };
                    let outcome = catch_unwind(AssertUnwindSafe(|| {
                        if id == 21 {
                            trust::block_on(p.apply_async(f))
                        } else {
                            p.apply(f)
                        }
                    }));
                    match outcome {
                        Ok(()) => answered[id as usize].fetch_add(1, Ordering::Relaxed),
                        Err(panic) if is_refusal(&*panic) => return,
                        Err(panic) => std::panic::resume_unwind(panic),
                    };
                }
            }
        };
        let waiting_fibers: Vec<_> = (0..workers)
            .map(|w| rt.spawn_on(w, waiting(10 + w as u64)))
            .collect();
        let threads: Vec<_> = [20, 21]
            .map(|id| std::thread::spawn(waiting(id)))
            .into_iter()
            .collect();

        // The property moves among the trustees while the clients go on, then leaves.
        for i in 0..scaled(300) {
            property.migrate_to((i + 1) % workers).unwrap();
        }
        let seen = property.withdraw().expect("nothing pins the property");
        withdrawn.store(true, Ordering::Relaxed);

        // Requests refused where they were made (the waiting clients' last ones too).
        let mut at_call = 5;
        for f in fibers {
            at_call += f.join();
        }
        for f in waiting_fibers {
            f.join();
        }
        for t in threads {
            t.join().unwrap();
        }
        let total = |counts: &[AtomicU64]| -> u64 {
            counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
        };
        wait_until("every pipelined request to be answered or refused", || {
            total(&answered) + refused.load(Ordering::Relaxed) + at_call == total(&made)
        });

        assert!(seen.broken.is_empty(), "order broken: {:?}", seen.broken);
        for (id, count) in answered.iter().enumerate() {
            let ran = seen.ran.get(&(id as u64)).copied().unwrap_or(0);
            assert_eq!(
                ran,
                count.load(Ordering::Relaxed),
                "client {id}: what ran is what was answered"
            );
        }
        let refusals = refused.load(Ordering::Relaxed) + at_call;
        assert!(
            refusals >= 32 + 8,
            "at least the requests made after the withdrawal were refused: {refusals}"
        );
        drop((rt, other));
        assert_eq!(
            closure_drops.load(Ordering::Relaxed) as u64,
            total(&made),
            "every closure, run or refused, is dropped once"
        );
        assert_eq!(value_drops.load(Ordering::Relaxed), 0, "the value is ours");
        drop(seen);
        drop(property);
        assert_eq!(value_drops.load(Ordering::Relaxed), 1);
        eprintln!("{} requests ran, {refusals} were refused", total(&answered));
    });
}

#[test]
fn a_pinned_fixed_or_withdrawn_property_stays() {
    within("the withdrawals", || {
        let rt = Runtime::builder().workers(2).build().unwrap();
        let latched = rt.trustee(1).entrust(Latch::new(5u64));
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (started_tx, started_rx) = mpsc::channel::<()>();
        let l = latched.clone();
        let launched = std::thread::spawn(move || {
            l.launch(move |v| {
                started_tx.send(()).unwrap();
                while go_rx.try_recv().is_err() {
                    trust::sleep(std::time::Duration::from_millis(1));
                }
                *v += 1;
            })
        });
        started_rx.recv().unwrap();
        assert_eq!(
            latched.withdraw().unwrap_err(),
            MigrateError::Pinned { pins: 1 }
        );
        go_tx.send(()).unwrap();
        launched.join().unwrap();
        let mut out = None;
        wait_until("the launched fiber to end", || {
            out = latched.withdraw().ok();
            out.is_some()
        });
        assert_eq!(out.unwrap().into_inner(), 6);
        assert_eq!(latched.withdraw().unwrap_err(), MigrateError::Withdrawn);
        let moved = latched.migrate_to(0).unwrap_err();
        assert_eq!(moved, MigrateError::Withdrawn);
        assert!(moved.to_string().contains("withdrawn"), "{moved}");
        assert_eq!(latched.trustee(), 1, "it was taken out on worker 1");

        let fixed = rt.trustee(0).entrust(1u8);
        fixed.fix_home();
        assert_eq!(fixed.withdraw(), Err(MigrateError::Fixed));
        assert_eq!(
            fixed.apply(|v| *v),
            1,
            "a refused withdrawal changes nothing"
        );

        // From a fiber, and through a trust made inside a request afterwards.
        let p = rt.trustee(0).entrust(String::from("kept"));
        let q = p.clone();
        let (taken, refused) = rt
            .spawn_on(1, move || {
                let taken = q.withdraw().unwrap();
                let refused = catch_unwind(AssertUnwindSafe(|| q.apply(|s| s.len())));
                (taken, refused.is_err_and(|e| is_refusal(&*e)))
            })
            .join();
        assert_eq!(taken, "kept");
        assert!(refused, "a request after the withdrawal panics, naming why");
        let deferred = catch_unwind(AssertUnwindSafe(|| {
            p.apply_deferred(|s: &mut String, reply: trust::Reply<usize>| {
                reply.send(s.len()).unwrap()
            })
        }));
        assert!(deferred.is_err_and(|e| is_refusal(&*e)));
    });
}
