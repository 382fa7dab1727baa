//! Moving properties between trustees (`Trust::migrate_to`): requests are neither lost, run
//! twice nor reordered per client while a property moves under load; frees, pins, errors and
//! shutdown during moves.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};

use common::{scaled, wait_until, within};
use trust::{Latch, MigrateError, Runtime};

/// What a property saw: the last sequence number of each client, and every break of order.
#[derive(Default)]
struct Seen {
    last: HashMap<u64, u64>,
    runs: u64,
    broken: Vec<String>,
    /// Requests that ran on a trustee other than the property's home of that moment.
    wrong_home: u64,
    /// The worker the last request ran on, and how often that changed.
    ran_on: Option<usize>,
    changes: u64,
}

impl Seen {
    fn check(&mut self, client: u64, seq: u64) {
        let here = trust::current_worker();
        if here != self.ran_on {
            self.ran_on = here;
            self.changes += 1;
        }
        let last = self.last.entry(client).or_insert(0);
        if seq != *last + 1 && self.broken.len() < 10 {
            self.broken
                .push(format!("client {client}: request {seq} ran after {last}"));
        }
        *last = seq;
        self.runs += 1;
    }
}

/// Clients of every kind make numbered requests to one property while a thread moves it
/// between the trustees again and again: each client's requests run once each, in order.
#[test]
fn requests_keep_their_order_while_the_property_moves() {
    within("the clients and the mover", || {
        let workers = 3;
        let rt = Runtime::builder().workers(workers).build().unwrap();
        let property = rt.trustee(0).entrust(Seen::default());
        let moves_wanted = scaled(10_000);
        let done = Arc::new(AtomicBool::new(false));

        // The mover: round robin over the trustees, while the clients go on.
        let mover = {
            let (p, done) = (property.clone(), done.clone());
            std::thread::spawn(move || {
                for i in 0..moves_wanted {
                    let to = (i + 1) % workers;
                    p.migrate_to(to).expect("an unpinned property moves");
                    assert_eq!(p.trustee(), to, "the move is done when the call returns");
                }
                done.store(true, Ordering::Relaxed);
            })
        };

        // Each client makes numbered requests until the mover is done, and says how many.
        let mut fibers = Vec::new();
        for w in 0..workers {
            // Fibers that pipeline `apply_then` (ids 0..6).
            for k in 0..2u64 {
                let (p, done) = (property.clone(), done.clone());
                let id = w as u64 * 2 + k;
                fibers.push(rt.spawn_on(w, move || {
                    let mut seq = 0;
                    while !done.load(Ordering::Relaxed) {
                        for _ in 0..16 {
                            seq += 1;
                            p.apply_then(move |s: &mut Seen| s.check(id, seq), |()| {});
                        }
                        trust::yield_now();
                    }
                    // Runs after all of this worker's earlier requests to the property.
                    p.apply(|_| ());
                    seq
                }));
            }
            // A fiber that waits for each answer (ids 10..13).
            let (p, done) = (property.clone(), done.clone());
            let id = 10 + w as u64;
            fibers.push(rt.spawn_on(w, move || {
                let mut seq = 0;
                while !done.load(Ordering::Relaxed) {
                    seq += 1;
                    p.apply(|s: &mut Seen| {
                        s.check(id, seq);
                        // Runs on the property's home, as it is at this moment.
                        if trust::current_worker() != Some(p.trustee()) {
                            s.wrong_home += 1;
                        }
                    });
                }
                seq
            }));
        }
        // A plain thread that waits for each answer, and one that awaits futures.
        let threads: Vec<_> = [20u64, 21]
            .into_iter()
            .map(|id| {
                let (p, done) = (property.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut seq = 0;
                    while !done.load(Ordering::Relaxed) {
                        seq += 1;
                        let f = move |s: &mut Seen| s.check(id, seq);
                        if id == 20 {
                            p.apply(f);
                        } else {
                            trust::block_on(p.apply_async(f));
                        }
                    }
                    seq
                })
            })
            .collect();
        let mut expected = 0;
        for f in fibers {
            expected += f.join();
        }
        for t in threads {
            expected += t.join().unwrap();
        }
        mover.join().unwrap();

        let (runs, broken, last, wrong_home, changes) = property.apply(|s| {
            let last = s.last.clone();
            (s.runs, s.broken.clone(), last, s.wrong_home, s.changes)
        });
        assert!(broken.is_empty(), "order broken: {broken:?}");
        assert_eq!(
            wrong_home, 0,
            "requests ran on a trustee that was not the home"
        );
        assert_eq!(
            runs, expected,
            "every request runs once (last seen: {last:?})"
        );
        eprintln!(
            "{runs} requests in order across {moves_wanted} moves; their trustee changed \
             {changes} times"
        );
    });
}

/// Counts its drops.
struct Tracked(Arc<AtomicUsize>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Properties that move while requests to them are on their way, and whose last trusts then
/// go (on workers and on plain threads): each is dropped once, after its last request.
#[test]
fn properties_that_moved_are_freed_once_after_their_requests() {
    within("the frees of moved properties", || {
        let rt = Runtime::builder().workers(3).build().unwrap();
        let drops = Arc::new(AtomicUsize::new(0));
        let rounds = scaled(300);
        let ran = Arc::new(AtomicUsize::new(0));
        for round in 0..rounds {
            let p = rt
                .trustee(round % 3)
                .entrust((Tracked(drops.clone()), 0u64));
            // Worker 1 pipelines requests, then drops its trust while they may still be on
            // their way; the mover moves the property twice meanwhile.
            let (q, r) = (p.clone(), ran.clone());
            let client = rt.spawn_on(1, move || {
                for _ in 0..32 {
                    let r = r.clone();
                    q.apply_then(
                        move |(_, n)| *n += 1,
                        move |()| {
                            r.fetch_add(1, Ordering::Relaxed);
                        },
                    );
                }
                drop(q);
            });
            p.migrate_to((round + 1) % 3).unwrap();
            p.migrate_to((round + 2) % 3).unwrap();
            client.join();
            if round % 2 == 0 {
                drop(p); // the last trust goes on a plain thread...
            } else {
                rt.spawn_on(round % 3, move || drop(p)).join(); // ... or on a worker
            }
        }
        common::wait_until("every property freed", || {
            drops.load(Ordering::Relaxed) == rounds
        });
        common::wait_until("every callback", || {
            ran.load(Ordering::Relaxed) == rounds * 32
        });
        drop(rt);
        assert_eq!(
            drops.load(Ordering::Relaxed),
            rounds,
            "each property dropped once"
        );
    });
}

/// A launched fiber and a deferred request waiting for its reply pin a property to its
/// trustee: moving it fails, naming why, until they end.
#[test]
fn pinned_properties_stay_until_released() {
    within("the pinned property", || {
        let rt = Runtime::builder().workers(2).build().unwrap();
        let latched = rt.trustee(0).entrust(Latch::new(0u64));
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let go_rx = Arc::new(std::sync::Mutex::new(go_rx));
        let (started_tx, started_rx) = mpsc::channel::<()>();
        let l = latched.clone();
        let launched = std::thread::spawn(move || {
            l.launch(move |v| {
                started_tx.send(()).unwrap();
                // Holds the latch (and the pin) until told.
                while go_rx.lock().unwrap().try_recv().is_err() {
                    trust::sleep(std::time::Duration::from_millis(1));
                }
                *v += 1;
            })
        });
        started_rx.recv().unwrap();
        assert_eq!(latched.migrate_to(1), Err(MigrateError::Pinned { pins: 1 }));
        assert_eq!(latched.trustee(), 0);
        go_tx.send(()).unwrap();
        launched.join().unwrap();
        common::wait_until("the launched fiber to end", || {
            latched.migrate_to(1).is_ok()
        });
        assert_eq!(latched.trustee(), 1);

        // A deferred request whose reply is kept in the property.
        let mailbox = rt.trustee(0).entrust(Vec::<trust::Reply<u64>>::new());
        let m = mailbox.clone();
        let taker = std::thread::spawn(move || m.apply_deferred(|m, reply| m.push(reply)));
        common::wait_until("the taker to wait", || mailbox.apply(|m| m.len()) == 1);
        let err = mailbox.migrate_to(1).unwrap_err();
        assert_eq!(err, MigrateError::Pinned { pins: 1 });
        assert!(err.to_string().contains("pinned"), "{err}");
        mailbox.apply(|m| m.pop().unwrap().send(7).unwrap());
        assert_eq!(taker.join().unwrap(), 7);
        mailbox.migrate_to(1).unwrap();
        assert_eq!(mailbox.apply(|m| m.len()), 0);
    });
}

#[test]
fn a_move_to_a_worker_that_is_not_a_trustee_is_refused() {
    let rt = Runtime::builder()
        .workers(3)
        .dedicated_trustees(1)
        .build()
        .unwrap();
    let p = rt.entrust(1u8);
    let err = p.migrate_to(0).unwrap_err();
    assert_eq!(
        err,
        MigrateError::NotATrustee {
            worker: 0,
            trustees: vec![2]
        }
    );
    assert!(err.to_string().contains("not a trustee"), "{err}");
    assert!(p.migrate_to(9).is_err());
    assert_eq!(
        p.migrate_to(2),
        Ok(()),
        "a move to where it is is done at once"
    );
    assert_eq!(p.apply(|v| *v), 1);
}

/// A worker from which a property has just moved parks at once in its next idle wait, even
/// with a fixed spin that would otherwise hold its core for an hour: the property's clients
/// now call the new home, which needs the core.
#[test]
fn a_worker_that_gave_a_property_away_parks_without_spinning() {
    let rt = Runtime::builder()
        .workers(2)
        .spin(std::time::Duration::from_secs(3600))
        .build()
        .unwrap();
    let p = rt.trustee(0).entrust(0u64);
    p.apply(|v| *v += 1);
    p.migrate_to(1).unwrap();
    let asleep = |stats: &trust::Stats| stats.workers[0].sleeping;
    let before = asleep(&rt.stats());
    wait_until(
        "worker 0 to fall asleep after its property moved away, rather than spin",
        || asleep(&rt.stats()) > before,
    );
    assert_eq!(p.apply(|v| *v), 1);
}

/// `Handle::move_hot`, the move by hand `gsm top` asks for: by the id the counters list,
/// only while the property is among its trustee's hottest.
#[test]
fn a_move_by_hand_takes_only_a_listed_hot_property() {
    let rt = Runtime::builder().workers(2).build().unwrap();
    let hot = rt.trustee(0).entrust(0u64);
    let outcome = |id, from, to| {
        let (tx, rx) = mpsc::channel();
        rt.handle()
            .move_hot(id, from, to, move |moved| tx.send(moved).unwrap())
            .map(|()| {
                rx.recv_timeout(std::time::Duration::from_secs(60))
                    .expect("no outcome of a move by hand within 60 s")
            })
    };
    // Not yet hot (nothing sampled), or an id that names nothing: nothing moves, and nothing
    // is read at the address.
    assert!(matches!(
        outcome(hot.id(), 0, 1),
        Ok(Err(MigrateError::NotHot { worker: 0, .. }))
    ));
    assert!(matches!(
        outcome(8, 0, 1),
        Ok(Err(MigrateError::NotHot { .. }))
    ));
    // A worker that is not a trustee is refused at once.
    assert!(matches!(
        outcome(hot.id(), 0, 5),
        Err(MigrateError::NotATrustee { worker: 5, .. })
    ));
    let started = std::time::Instant::now();
    while !rt.stats().hottest.iter().any(|p| p.id == hot.id()) {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the property never showed among the hottest within 60 s"
        );
        (0..1024).for_each(|_| hot.apply(|n| *n += 1));
    }
    // To where it is: done, and it stays.
    assert_eq!(outcome(hot.id(), 0, 0), Ok(Ok(())));
    assert_eq!(hot.trustee(), 0);
    assert_eq!(outcome(hot.id(), 0, 1), Ok(Ok(())));
    assert_eq!(hot.trustee(), 1);
    let calls = hot.apply(|n| *n);
    assert!(calls >= 1024, "{calls}");
}

#[test]
fn a_move_in_delegated_context_panics_naming_the_alternative() {
    let rt = Runtime::builder().workers(2).build().unwrap();
    let a = rt.trustee(0).entrust(0u8);
    let b = rt.trustee(1).entrust(0u8);
    let message = a.apply(move |_| {
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = b.migrate_to(0);
        }));
        common::message(caught.unwrap_err())
    });
    assert!(message.contains("delegated context"), "{message}");
}

/// A worker of another runtime pipelines `apply_then` to a property that moves: its callbacks
/// see its requests run once each, in order.
#[test]
fn requests_from_another_runtime_keep_their_order_across_moves() {
    within("the other runtime's requests", || {
        let rt = Runtime::builder().workers(2).build().unwrap();
        let other = Runtime::builder().workers(1).build().unwrap();
        let property = rt.trustee(0).entrust(Seen::default());
        let done = Arc::new(AtomicBool::new(false));
        let mover = {
            let (p, done) = (property.clone(), done.clone());
            std::thread::spawn(move || {
                for i in 0..scaled(2_000) {
                    p.migrate_to((i + 1) % 2).unwrap();
                }
                done.store(true, Ordering::Relaxed);
            })
        };
        let p = property.clone();
        let sent = other
            .spawn_on(0, move || {
                let answered = std::rc::Rc::new(std::cell::Cell::new(0));
                let mut seq = 0;
                while !done.load(Ordering::Relaxed) {
                    for _ in 0..8 {
                        seq += 1;
                        let a = answered.clone();
                        p.apply_then(
                            move |s: &mut Seen| s.check(30, seq),
                            move |()| a.set(a.get() + 1),
                        );
                    }
                    trust::yield_now();
                }
                common::wait_until("the callbacks", || answered.get() == seq);
                seq
            })
            .join();
        mover.join().unwrap();
        let (runs, broken) = property.apply(|s| (s.runs, s.broken.clone()));
        assert!(broken.is_empty(), "order broken: {broken:?}");
        assert_eq!(runs, sent);
    });
}

/// The runtime shuts down while requests are forwarded between trustees: every closure and
/// callback is dropped once, and nothing waits forever.
#[test]
fn shutdown_during_moves_drops_everything_once() {
    within("the shutdown", || {
        for _ in 0..scaled(20) {
            let rt = Runtime::builder().workers(3).build().unwrap();
            let made = Arc::new(AtomicUsize::new(0));
            let dropped = Arc::new(AtomicUsize::new(0));
            let property = rt.trustee(0).entrust(Tracked(dropped.clone()));
            made.fetch_add(1, Ordering::Relaxed);
            for w in 0..3 {
                let (p, made, dropped) = (property.clone(), made.clone(), dropped.clone());
                rt.spawn_on(w, move || {
                    loop {
                        for _ in 0..16 {
                            made.fetch_add(2, Ordering::Relaxed);
                            let closure = Tracked(dropped.clone());
                            let callback = Tracked(dropped.clone());
                            p.apply_then(move |_| drop(closure), move |()| drop(callback));
                        }
                        trust::yield_now();
                    }
                });
            }
            let p = property.clone();
            let mover = std::thread::spawn(move || {
                for i in 0..1_000 {
                    // The runtime stops under the mover: its last move may panic.
                    let moved = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        p.migrate_to((i + 1) % 3)
                    }));
                    if moved.is_err() {
                        break;
                    }
                }
                drop(p);
            });
            std::thread::sleep(std::time::Duration::from_millis(20));
            drop(property);
            drop(rt);
            mover.join().unwrap();
            assert_eq!(
                dropped.load(Ordering::Relaxed),
                made.load(Ordering::Relaxed),
                "every closure, callback and the property dropped once"
            );
        }
    });
}

/// With rebalancing on, properties placed all on one trustee under load spread to the other,
/// and every request still runs once.
#[test]
fn rebalancing_spreads_a_badly_placed_load() {
    within("the rebalancer", || {
        let rt = Runtime::builder()
            .workers(2)
            .rebalance(trust::Rebalance::default().every(std::time::Duration::from_millis(20)))
            .build()
            .unwrap();
        let properties: Vec<_> = (0..8).map(|_| rt.trustee(0).entrust(0u64)).collect();
        let done = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..2)
            .map(|w| {
                let (ps, done) = (properties.clone(), done.clone());
                rt.spawn_on(w, move || {
                    let mut sent = 0u64;
                    let group = trust::Group::new();
                    while !done.load(Ordering::Relaxed) {
                        for (i, p) in ps.iter().enumerate() {
                            // Some work per request, more for the first properties.
                            let spins = 50 * (8 - i as u64);
                            p.apply_then(
                                move |n| {
                                    for _ in 0..spins {
                                        *n = std::hint::black_box(*n);
                                    }
                                    *n += 1;
                                },
                                group.track(|()| {}),
                            );
                            sent += 1;
                        }
                        group.wait_until_pending_at_most(256);
                    }
                    group.wait();
                    sent
                })
            })
            .collect();
        common::wait_until("a property to move to worker 1", || {
            properties.iter().any(|p| p.trustee() == 1)
        });
        done.store(true, Ordering::Relaxed);
        let sent: u64 = clients.into_iter().map(|c| c.join()).sum();
        let ran: u64 = properties.iter().map(|p| p.apply(|n| *n)).sum();
        assert_eq!(ran, sent, "every request ran once");
    });
}
