//! `Group`: waiting for `apply_then` callbacks.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use trust::{Group, Runtime};

#[test]
fn wait_returns_once_every_tracked_callback_ran() {
    let rt = Runtime::builder().workers(2).build().unwrap();
    let counter = rt.trustee(1).entrust(0u64);
    let ran = rt
        .spawn_on(0, move || {
            let group = Group::new();
            let ran = Rc::new(Cell::new(0));
            for _ in 0..5000 {
                let ran = ran.clone();
                counter.apply_then(|c| *c += 1, group.track(move |()| ran.set(ran.get() + 1)));
            }
            assert!(group.pending() > 0, "nothing has been answered yet");
            group.wait();
            assert_eq!(group.pending(), 0);
            ran.get()
        })
        .join();
    assert_eq!(ran, 5000);
}

#[test]
fn wait_until_pending_at_most_bounds_the_requests_in_flight() {
    let rt = Runtime::builder().workers(2).build().unwrap();
    let counter = rt.trustee(1).entrust(0u64);
    let c = counter.clone();
    let most = rt
        .spawn_on(0, move || {
            let group = Group::new();
            let mut most = 0;
            for _ in 0..5000 {
                c.apply_then(|c| *c += 1, group.track(|()| {}));
                most = most.max(group.pending());
                group.wait_until_pending_at_most(100);
                assert!(group.pending() <= 100);
            }
            group.wait();
            most
        })
        .join();
    assert!(
        most <= 101,
        "at most 100 pending before each new request, saw {most}"
    );
    assert_eq!(counter.apply(|c| *c), 5000);
}

#[test]
fn a_panicking_or_dropped_callback_counts_as_done() {
    let panics = Arc::new(Mutex::new(0));
    let p = panics.clone();
    let rt = Runtime::builder()
        .workers(1)
        .panic_handler(move |_| *p.lock().unwrap() += 1)
        .build()
        .unwrap();
    let counter = rt.entrust(0u64);
    rt.block_on(|| {
        let group = Group::new();
        counter.apply_then(|c| *c, group.track(|_| panic!("callback panics")));
        group.wait();
        let unrun = group.track(|()| unreachable!());
        assert_eq!(group.pending(), 1);
        drop(unrun);
        assert_eq!(group.pending(), 0);
    });
    assert_eq!(*panics.lock().unwrap(), 1);
}

#[test]
#[should_panic(expected = "delegated context")]
fn waiting_in_delegated_context_panics() {
    let rt = Runtime::builder().workers(1).build().unwrap();
    let counter = rt.entrust(0u64);
    let other = rt.entrust(0u64);
    counter.apply(move |_| {
        let group = Group::new();
        other.apply_then(|c| *c, group.track(|_| {}));
        group.wait();
    });
}
