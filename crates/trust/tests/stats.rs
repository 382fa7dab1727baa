//! The counters behind `Handle::stats`: exact per worker, sampled per type and property.

mod common;

use std::time::Duration;

use trust::Stats;
use trust::stats::SAMPLE_EVERY;

/// The runtime's stats once `done` holds: a worker publishes its counts every few rounds and
/// before it waits for work.
fn settled(rt: &trust::Runtime, done: impl Fn(&Stats) -> bool) -> Stats {
    let mut stats = rt.stats();
    common::wait_until("the workers' counts", || {
        stats = rt.stats();
        done(&stats)
    });
    stats
}

#[test]
fn a_trustee_counts_requests_batches_and_properties() {
    let rt = trust::Runtime::builder().workers(2).build().unwrap();
    let counter = rt.trustee(1).entrust(0u64);
    for _ in 0..100 {
        counter.apply(|c| *c += 1);
    }
    let w = settled(&rt, |s| s.workers[1].requests == 100);
    let w = w.workers[1].clone();
    assert_eq!((w.worker, w.trustee), (1, true));
    assert_eq!(w.requests, 100);
    assert_eq!(w.inline, 0, "a plain thread's requests go through batches");
    assert_eq!(w.batches, 100, "a plain thread waits for each answer");
    assert_eq!(w.properties, 1);
    assert_eq!(rt.stats().workers[0].requests, 0);

    drop(counter);
    common::wait_until("the dropped property's free", || {
        rt.stats().workers[1].properties == 0
    });
}

#[test]
fn a_fiber_batches_and_its_own_trustee_runs_inline() {
    let rt = trust::Runtime::builder().workers(2).build().unwrap();
    let far = rt.trustee(1).entrust(0u64);
    let near = rt.trustee(0).entrust(0u64);
    let before = rt.stats();
    let (far, near) = (far.clone(), near.clone()); // their last trusts' frees come later
    rt.spawn_on(0, move || {
        let group = trust::Group::new();
        for _ in 0..10_000 {
            far.apply_then(|c| *c += 1, group.track(|()| {}));
            group.wait_until_pending_at_most(1024);
        }
        group.wait();
        near.apply(|c| *c += 1);
    })
    .join();
    let delta = settled(&rt, |s| {
        s.workers[0].requests >= 1 && s.workers[1].requests >= 10_000
    })
    .since(&before);
    let (w0, w1) = (&delta.workers[0], &delta.workers[1]);
    assert_eq!(w1.requests, 10_000);
    assert!(
        w1.batches < 10_000 / 4,
        "apply_then from a fiber fills batches: {} batches",
        w1.batches
    );
    assert!(w1.mean_batch() > 4.0, "mean batch {}", w1.mean_batch());
    assert_eq!(
        (w0.requests, w0.inline),
        (1, 1),
        "run inline on its own trustee"
    );
}

struct Hot(u64);
struct Cold(#[allow(dead_code)] u64);

#[test]
fn sampled_batches_name_types_and_the_hottest_property() {
    let rt = trust::Runtime::builder().workers(2).build().unwrap();
    let hot = rt.trustee(1).entrust(Hot(0));
    let cold: Vec<_> = (0..8).map(|i| rt.trustee(1).entrust(Cold(i))).collect();
    // Each apply from a plain thread is a batch of its own: enough batches for 8 samples,
    // nine in ten of them to the hot property.
    let batches = SAMPLE_EVERY * 8;
    for i in 0..batches {
        if i % 10 == 9 {
            cold[(i / 10) as usize % cold.len()].apply(|c| c.0 += 1);
        } else {
            hot.apply(|h| h.0 += 1);
        }
    }
    let stats = settled(&rt, |s| s.workers[1].batches == batches);
    let estimated: u64 = stats.types.iter().map(|t| t.requests).sum();
    assert!(
        estimated.abs_diff(batches) <= 1,
        "the worker's requests, shared out by type: {estimated}"
    );
    let hot_share = stats.types[0].requests as f64 / batches as f64;
    assert!((0.8..=1.0).contains(&hot_share), "{hot_share}");
    let busiest = &stats.types[0];
    assert!(busiest.type_name.ends_with("::Hot"), "{:?}", stats.types);
    assert!(busiest.time > Duration::ZERO);
    let hottest = &stats.hottest[0];
    assert_eq!(
        (hottest.id, hottest.worker),
        (hot.id(), 1),
        "{:?}",
        stats.hottest
    );
    assert!(hottest.type_name.ends_with("::Hot"));
}

#[test]
fn an_idle_worker_counts_its_wait() {
    let rt = trust::Runtime::builder().workers(1).build().unwrap();
    let c = rt.entrust(0u8);
    c.apply(|c| *c += 1);
    // On a loaded machine the worker may get its core late: wait for the wait to show.
    common::wait_until("10 ms of the idle worker's wait counted", || {
        let w = &rt.stats().workers[0];
        w.spinning + w.sleeping >= Duration::from_millis(10)
    });
    let stats = rt.stats();
    assert!(stats.workers[0].busy(stats.uptime) <= stats.uptime);
}

#[test]
fn fibers_are_counted_by_their_worker() {
    let rt = trust::Runtime::builder().workers(1).build().unwrap();
    let latch = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let blocked: Vec<_> = (0..3)
        .map(|_| {
            let latch = latch.clone();
            rt.spawn(move || {
                common::wait_until("the test's release", || {
                    latch.load(std::sync::atomic::Ordering::Relaxed)
                })
            })
        })
        .collect();
    common::wait_until("three fibers counted", || rt.stats().workers[0].fibers >= 3);
    latch.store(true, std::sync::atomic::Ordering::Relaxed);
    blocked.into_iter().for_each(|f| f.join());
}
