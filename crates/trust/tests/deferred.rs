//! Deferred requests: answered now or later, abandoned, timed out, at shutdown, from every
//! kind of caller, and under load.

mod common;

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{message, runtime, scaled, wait_until, within};
use trust::{Reply, ReplyId, TimedOut, Trust};

/// Requests waiting for a value, answered by `answer`.
#[derive(Default)]
struct Waiters {
    replies: VecDeque<Reply<u64>>,
}

fn forget(w: &mut Waiters, id: ReplyId) {
    w.replies.retain(|r| r.id() != id);
}

fn waiting(w: &Trust<Waiters>) -> usize {
    w.apply(|w| w.replies.len())
}

/// Sends `value` to the oldest waiter; whether it took it.
fn answer(w: &Trust<Waiters>, value: u64) -> bool {
    w.apply(move |w| w.replies.pop_front().is_some_and(|r| r.send(value).is_ok()))
}

#[test]
fn a_request_answered_at_once_returns_its_answer() {
    let rt = runtime(2);
    let t = rt.trustee(1).entrust(40u64);
    let got = rt.block_on(|| {
        t.apply_deferred(|v, reply: Reply<u64>| {
            *v += 2;
            reply.send(*v).unwrap();
        })
    });
    assert_eq!(got, 42);
    // The same from the trustee's own worker.
    assert_eq!(
        rt.spawn_on(1, move || t
            .apply_deferred(|v, r: Reply<u64>| r.send(*v).unwrap()))
            .join(),
        42
    );
}

#[test]
fn a_request_answered_later_waits_for_its_answer() {
    let rt = runtime(2);
    let w = rt.trustee(1).entrust(Waiters::default());
    let callers: Vec<_> = (0..3)
        .map(|_| {
            let w = w.clone();
            rt.spawn_on(0, move || w.apply_deferred(|w, r| w.replies.push_back(r)))
        })
        .collect();
    rt.block_on(|| {
        wait_until("three waiting requests", || waiting(&w) == 3);
        for v in [7, 8, 9] {
            assert!(answer(&w, v));
        }
    });
    let mut got: Vec<u64> = callers.into_iter().map(|c| c.join()).collect();
    got.sort();
    assert_eq!(got, [7, 8, 9]);
}

#[test]
fn a_dropped_reply_abandons_its_request() {
    let rt = runtime(2);
    let t = rt.trustee(1).entrust(Waiters::default());
    let at_once = rt.block_on(|| {
        catch_unwind(AssertUnwindSafe(|| {
            t.apply_deferred(|_, r: Reply<u64>| drop(r))
        }))
    });
    assert!(message(at_once.unwrap_err()).contains("request abandoned"));

    let caller = {
        let t = t.clone();
        rt.spawn_on(0, move || {
            catch_unwind(AssertUnwindSafe(|| {
                t.apply_deferred(|w, r| w.replies.push_back(r))
            }))
        })
    };
    rt.block_on(|| {
        wait_until("the request to wait", || waiting(&t) == 1);
        t.apply(|w| w.replies.clear());
    });
    let later = within("the abandoned caller", move || caller.join());
    assert!(
        message(later.unwrap_err()).contains("request abandoned: its Reply was dropped unanswered")
    );
}

#[test]
fn dropping_the_property_abandons_its_waiting_requests() {
    let rt = runtime(2);
    let t = rt.trustee(1).entrust(Waiters::default());
    // Futures hold no trust once sent, so the property is dropped while they wait.
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let future = t.apply_deferred_async(|w, r| w.replies.push_back(r));
            std::thread::spawn(move || catch_unwind(AssertUnwindSafe(|| trust::block_on(future))))
        })
        .collect();
    wait_until("four waiting requests", || waiting(&t) == 4);
    drop(t);
    for c in callers {
        let outcome = within("an abandoned caller", move || c.join().unwrap());
        assert!(message(outcome.unwrap_err()).contains("request abandoned"));
    }
}

/// Replies parked where any thread can take them.
type Parked = Arc<Mutex<Vec<Reply<u64>>>>;

/// A request whose closure parks its reply in a `Mutex` that this thread shares: the reply
/// leaves its trustee. Returns the parking place and the caller (which catches its panic).
fn park_a_reply(rt: &trust::Runtime) -> (Parked, trust::JoinHandle<std::thread::Result<u64>>) {
    let parked: Parked = Arc::default();
    let t = rt.trustee(1).entrust(parked.clone());
    let caller = rt.spawn_on(0, move || {
        catch_unwind(AssertUnwindSafe(|| {
            t.apply_deferred(|p, r| p.lock().unwrap().push(r))
        }))
    });
    wait_until("the reply to leave its trustee", || {
        !parked.lock().unwrap().is_empty()
    });
    (parked, caller)
}

#[test]
fn a_reply_dropped_on_another_thread_abandons_its_request() {
    let rt = runtime(2);
    let (parked, caller) = park_a_reply(&rt);
    // Dropped on this plain thread, not on the trustee.
    parked.lock().unwrap().clear();
    let outcome = within("the abandoned caller", move || caller.join());
    assert!(message(outcome.unwrap_err()).contains("request abandoned"));
}

#[test]
fn sending_a_reply_off_its_trustee_panics_and_abandons() {
    let rt = runtime(2);
    let (parked, caller) = park_a_reply(&rt);
    let reply = parked.lock().unwrap().pop().unwrap();
    let sent = catch_unwind(AssertUnwindSafe(|| reply.send(1)));
    assert!(message(sent.unwrap_err()).contains("off its trustee"));
    let outcome = within("the abandoned caller", move || caller.join());
    assert!(message(outcome.unwrap_err()).contains("request abandoned"));
}

#[test]
fn a_deadline_times_out_once_and_later_sends_fail() {
    let rt = runtime(2);
    let w = rt.trustee(1).entrust(Waiters::default());
    let kept: Trust<Vec<Reply<u64>>> = rt.trustee(1).entrust(Vec::new());
    let k = kept.clone();
    let outcome = rt.block_on(move || {
        let short = Instant::now() + Duration::from_millis(20);
        let timed_out = w.apply_deferred_until(|w, r| w.replies.push_back(r), short, forget);
        // on_expire forgot the reply: nothing waits any more.
        assert_eq!(waiting(&w), 0);
        // A reply kept elsewhere (not forgotten by on_expire) can no longer be sent.
        let late = k.apply_deferred_until(
            |k, r| k.push(r),
            Instant::now() + Duration::from_millis(20),
            |_, _| {},
        );
        assert_eq!(late, Err(TimedOut));
        let refused = k.apply(|k| k.pop().map(|r| r.send(5)));
        assert_eq!(refused, Some(Err(5)));
        timed_out
    });
    assert_eq!(outcome, Err(TimedOut));
}

#[test]
fn a_request_answered_before_its_deadline_is_not_timed_out() {
    let rt = runtime(2);
    let w = rt.trustee(1).entrust(Waiters::default());
    let caller = {
        let w = w.clone();
        rt.spawn_on(0, move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            w.apply_deferred_until(|w, r| w.replies.push_back(r), deadline, forget)
        })
    };
    rt.block_on(|| {
        wait_until("the request to wait", || waiting(&w) == 1);
        assert!(answer(&w, 11));
    });
    assert_eq!(within("the answered caller", move || caller.join()), Ok(11));
}

#[test]
fn an_expiring_request_wakes_a_sleeping_trustee() {
    // Nothing else happens on the runtime: only the deadline can end the wait.
    let rt = runtime(1);
    let w = rt.entrust(Waiters::default());
    let started = Instant::now();
    let outcome = within("the time-out", move || {
        w.apply_deferred_until(
            |w, r| w.replies.push_back(r),
            Instant::now() + Duration::from_millis(50),
            forget,
        )
    });
    assert_eq!(outcome, Err(TimedOut));
    assert!(started.elapsed() >= Duration::from_millis(50));
}

#[test]
fn a_panicking_closure_raises_in_the_caller_and_its_kept_reply_is_stale() {
    let rt = runtime(2);
    let w = rt.trustee(1).entrust(Waiters::default());
    rt.block_on(|| {
        let p = catch_unwind(AssertUnwindSafe(|| {
            w.apply_deferred(|w, r| {
                w.replies.push_back(r);
                panic!("boom");
            })
        }));
        assert!(message(p.unwrap_err()).contains("boom"));
        let sent = w.apply(|w| w.replies.pop_front().map(|r| r.send(1)));
        assert_eq!(sent, Some(Err(1)), "the request has ended");
    });
}

#[test]
fn a_closure_that_answers_then_panics_delivers_the_answer() {
    let panics = Arc::new(AtomicUsize::new(0));
    let p = panics.clone();
    let rt = trust::Runtime::builder()
        .workers(2)
        .panic_handler(move |_| {
            p.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .unwrap();
    let t = rt.trustee(1).entrust(0u64);
    let got = rt.block_on(|| {
        t.apply_deferred(|_, r: Reply<u64>| {
            r.send(3).unwrap();
            panic!("after the answer");
        })
    });
    assert_eq!(got, 3);
    wait_until("the panic to reach the handler", || {
        panics.load(Ordering::SeqCst) == 1
    });
}

#[test]
fn thens_run_in_the_order_answers_are_sent() {
    let rt = runtime(2);
    let w = rt.trustee(1).entrust(Waiters::default());
    let n = 50;
    let order = rt.block_on(|| {
        let seen = Rc::new(RefCell::new(Vec::new()));
        let group = trust::Group::new();
        for _ in 0..n {
            let seen = seen.clone();
            w.apply_deferred_then(
                |w, r| w.replies.push_back(r),
                group.track(move |v: u64| seen.borrow_mut().push(v)),
            );
        }
        wait_until("every request to wait", || waiting(&w) == n);
        // Answer the newest first, one request per answer, and a batch of them at once.
        w.apply(move |w| {
            let mut value = 0;
            while let Some(r) = w.replies.pop_back() {
                r.send(value).unwrap();
                value += 1;
            }
        });
        group.wait();
        seen.take()
    });
    assert_eq!(order, (0..n as u64).collect::<Vec<_>>());
}

#[test]
fn deferred_requests_work_from_plain_threads_and_futures() {
    let rt = runtime(2);
    let w = rt.trustee(1).entrust(Waiters::default());
    let thread = {
        let w = w.clone();
        std::thread::spawn(move || w.apply_deferred(|w, r| w.replies.push_back(r)))
    };
    let future = w.apply_deferred_async(|w, r| w.replies.push_back(r));
    let waiter = std::thread::spawn(move || trust::block_on(future));
    let then_thread = {
        let w = w.clone();
        std::thread::spawn(move || {
            let got = Rc::new(RefCell::new(0));
            let g = got.clone();
            w.apply_deferred_then(|w, r| w.replies.push_back(r), move |v| *g.borrow_mut() = v);
            got.take()
        })
    };
    wait_until("three waiting requests", || waiting(&w) == 3);
    for v in [1, 2, 3] {
        assert!(answer(&w, v));
    }
    let mut got = vec![
        within("the plain thread", move || thread.join().unwrap()),
        within("the future", move || waiter.join().unwrap()),
        within("the then thread", move || then_thread.join().unwrap()),
    ];
    got.sort();
    assert_eq!(got, [1, 2, 3]);

    let timed = w.apply_deferred_until(
        |w, r| w.replies.push_back(r),
        Instant::now() + Duration::from_millis(10),
        forget,
    );
    assert_eq!(timed, Err(TimedOut));
}

#[test]
fn deferred_requests_work_from_another_runtime() {
    let home = runtime(1);
    let w = home.entrust(Waiters::default());
    let other = runtime(1);
    let w2 = w.clone();
    let caller = other.spawn(move || {
        let got = Rc::new(RefCell::new(None));
        let g = got.clone();
        let group = trust::Group::new();
        w2.apply_deferred_then(
            |w, r| w.replies.push_back(r),
            group.track(move |v| *g.borrow_mut() = Some(v)),
        );
        let direct = w2.apply_deferred(|w, r| w.replies.push_back(r));
        group.wait();
        (got.take(), direct)
    });
    // Both requests reach the trustee in the order they were made.
    wait_until("two waiting requests", || waiting(&w) == 2);
    assert!(answer(&w, 5));
    assert!(answer(&w, 6));
    assert_eq!(
        within("the other runtime's fiber", move || caller.join()),
        (Some(5), 6)
    );
}

#[test]
fn shutdown_ends_waiting_requests() {
    let rt = runtime(2);
    let w = rt.trustee(1).entrust(Waiters::default());
    let thread = {
        let w = w.clone();
        std::thread::spawn(move || {
            catch_unwind(AssertUnwindSafe(|| {
                w.apply_deferred(|w, r| w.replies.push_back(r))
            }))
        })
    };
    let fiber = {
        let w = w.clone();
        rt.spawn_on(0, move || w.apply_deferred(|w, r| w.replies.push_back(r)))
    };
    let until = {
        let w = w.clone();
        rt.spawn_on(0, move || {
            w.apply_deferred_until(
                |w, r| w.replies.push_back(r),
                Instant::now() + Duration::from_secs(600),
                forget,
            )
        })
    };
    wait_until("three waiting requests", || waiting(&w) == 3);
    within("the runtime's shutdown", move || drop(rt));
    let outcome = within("the plain thread", move || thread.join().unwrap());
    assert!(message(outcome.unwrap_err()).contains("shut down"));
    let e = catch_unwind(AssertUnwindSafe(|| fiber.join())).unwrap_err();
    assert!(message(e).contains("shut down"));
    let e = catch_unwind(AssertUnwindSafe(|| until.join())).unwrap_err();
    assert!(message(e).contains("shut down"));
    // The property outlives the runtime in `w`; its replies drop with it, harmlessly.
    drop(w);
}

/// Many fibers on both workers wait with random deadlines while other fibers answer random
/// waiters; each request ends exactly once, a send that returned `Ok` reached its caller and
/// one that returned `Err` belonged to a request that had timed out.
#[test]
fn under_load_every_request_ends_exactly_once() {
    #[derive(Default)]
    struct Pool {
        waiting: HashMap<ReplyId, Reply<u64>>,
    }
    fn drop_waiter(p: &mut Pool, id: ReplyId) {
        p.waiting.remove(&id);
    }
    let rt = runtime(2);
    let pool = rt.trustee(1).entrust(Pool::default());
    let rounds = scaled(400);
    let fibers = 16;
    let sent_ok = Arc::new(Mutex::new(Vec::new()));
    let received = Arc::new(Mutex::new(Vec::new()));
    let timed_out = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    for f in 0..fibers {
        let (pool, received, timed_out, done) = (
            pool.clone(),
            received.clone(),
            timed_out.clone(),
            done.clone(),
        );
        rt.spawn_on(f % 2, move || {
            for i in 0..rounds {
                let deadline =
                    Instant::now() + Duration::from_micros(((i * 7 + f) % 13) as u64 * 50);
                match pool.apply_deferred_until(
                    |p, r| {
                        p.waiting.insert(r.id(), r);
                    },
                    deadline,
                    drop_waiter,
                ) {
                    Ok(v) => received.lock().unwrap().push(v),
                    Err(TimedOut) => {
                        timed_out.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            done.fetch_add(1, Ordering::SeqCst);
        });
    }
    let answerer = {
        let (pool, sent_ok, done) = (pool.clone(), sent_ok.clone(), done.clone());
        rt.spawn_on(0, move || {
            let mut next = 0u64;
            while done.load(Ordering::SeqCst) < fibers {
                let value = next;
                let sent = pool.apply(move |p| {
                    let id = *p.waiting.keys().next()?;
                    let r = p.waiting.remove(&id).unwrap();
                    Some(r.send(value).is_ok())
                });
                if sent == Some(true) {
                    sent_ok.lock().unwrap().push(value);
                    next += 1;
                } else {
                    trust::yield_now();
                }
            }
        })
    };
    within("the load", move || answerer.join());
    let mut sent = sent_ok.lock().unwrap().clone();
    let mut got = received.lock().unwrap().clone();
    sent.sort();
    got.sort();
    println!(
        "{} answered, {} timed out",
        got.len(),
        timed_out.load(Ordering::Relaxed)
    );
    assert_eq!(got, sent, "every sent answer reached its caller, once");
    assert_eq!(
        got.len() + timed_out.load(Ordering::Relaxed),
        fibers * rounds,
        "every request ended once"
    );
    assert_eq!(pool.apply(|p| p.waiting.len()), 0);
}
