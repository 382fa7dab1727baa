//! Range locks across the ranks of a rack, on both transports: many fibers on every rank
//! lock random ranges and stamp a shadow region while they hold them, and crosswise holds
//! are resolved by a deadline.
//!
//! Its own driver (`harness = false`), as the rack's tests: run without `RACK_SCENARIO` it
//! starts itself once per rank.

use std::time::{Duration, Instant};

use gossamer::{Rack, Region};
use rangelock::{FlagSpacing, Mode, Notify, RangeLock};

#[path = "../../gossamer/tests/common/mod.rs"]
mod common;
/// The README's example, run as written.
#[path = "../examples/ranges.rs"]
mod example;

use common::job::{finish, start};

/// Units of the stress test's lock.
const UNITS: u64 = 1024;
/// Fibers per rank, and locks each takes.
const FIBERS: u64 = 64;
const LOCKS: u64 = 12;
/// A writer's stamp carries this bit; a unit under readers holds their count.
const WRITER: u64 = 1 << 63;

fn main() -> std::process::ExitCode {
    if let Ok(scenario) = std::env::var("RACK_SCENARIO") {
        if scenario == "example" {
            return example::main();
        }
        return Rack::from_env().run(move || match scenario.as_str() {
            "stress" => stress(single()),
            // 8 shards over the 4 ranks' trustees: ranges cross shards, and shards nodes.
            "stress-sharded" => stress(RangeLock::sharded(UNITS, 8).unwrap()),
            // The seed's polling designs, kept as baselines, on the same checks.
            "stress-poll-rpc" => stress(single().notify(Notify::PollRpc)),
            "stress-poll-flag" => stress(
                RangeLock::sharded(UNITS, 2)
                    .unwrap()
                    .notify(Notify::PollFlag(FlagSpacing::Byte)),
            ),
            "stress-poll-line" => stress(single().notify(Notify::PollFlag(FlagSpacing::Line))),
            "sharded-guards" => sharded_guards(),
            "crosswise" => crosswise(),
            other => panic!("unknown scenario {other}"),
        });
    }
    let tests: &[(&str, fn())] = &[
        ("stress_on_4_ranks", || run(4, "stress", "stress ok")),
        ("stress_on_4_ranks_sharded", || {
            run(4, "stress-sharded", "stress ok")
        }),
        ("stress_polling_by_rpc", || {
            run(4, "stress-poll-rpc", "stress ok")
        }),
        ("stress_polling_byte_flags_sharded", || {
            run(4, "stress-poll-flag", "stress ok")
        }),
        ("stress_polling_line_flags", || {
            run(4, "stress-poll-line", "stress ok")
        }),
        ("guards_across_shards", || {
            run(3, "sharded-guards", "sharded guards ok")
        }),
        ("crosswise_holds_end_by_a_deadline", || {
            run(2, "crosswise", "crosswise ok")
        }),
        ("the_readme_example_runs_on_3_ranks", || {
            run(3, "example", "range locks served by rank 2")
        }),
    ];
    let result = common::job::on_each_transport(tests);
    common::conclude_after("rangelock rack", result, &[])
}

/// Runs `scenario` on `size` ranks; every rank must exit 0 and rank 0 print `ok`.
fn run(size: usize, scenario: &str, ok: &str) {
    let results = finish(start(size, scenario, &[]), Duration::from_secs(120));
    let all: String = results.iter().map(|r| format!("{}{}", r.1, r.2)).collect();
    for (rank, (status, _, _)) in results.iter().enumerate() {
        assert!(
            status.success(),
            "rank {rank} failed: {status}; output:\n{all}"
        );
    }
    let line = results[0].1.lines().find(|l| l.contains(ok));
    println!(
        "  {}",
        line.unwrap_or_else(|| panic!("rank 0 did not finish:\n{all}"))
    );
}

/// One table of `UNITS` units on rank 0.
fn single() -> RangeLock {
    RangeLock::entrust_on(gossamer::this_node(), UNITS)
}

/// The shadow lives on rank 0 (and the lock too, unless sharded); 64 fibers on every rank lock random ranges in
/// random modes, a quarter of them with a short deadline, and stamp the shadow while they
/// hold: a writer finds every unit empty and leaves it empty, a reader finds no writer.
fn stress(lock: RangeLock) {
    let home = gossamer::this_node();
    let shadow = home.region(UNITS as usize).expect("a shadow region");
    let runs: Vec<_> = gossamer::nodes()
        .map(|n| {
            gossamer::spawn_on(
                n,
                |(lock, shadow): (RangeLock, Region)| lock_and_stamp(&lock, &shadow),
                (lock.clone(), shadow.clone()),
            )
        })
        .collect();
    let (mut granted, mut timed_out) = (0, 0);
    for run in runs {
        let (g, t) = run.join();
        granted += g;
        timed_out += t;
    }
    let ranks = gossamer::nodes().count() as u64;
    assert_eq!(
        granted + timed_out,
        ranks * FIBERS * LOCKS,
        "every lock ended once"
    );
    // Unlocks are not awaited: they arrive soon after.
    let deadline = Instant::now() + Duration::from_secs(30);
    while lock.requests() != 0 {
        assert!(Instant::now() < deadline, "the lock's table never emptied");
        gossamer::yield_now();
    }
    let left = shadow.get(0, UNITS as usize).wait().unwrap();
    assert!(left.iter().all(|&w| w == 0), "a stamp outlived its guard");
    println!("stress ok: {granted} granted, {timed_out} timed out");
}

/// One rank's part of `stress`: (locks granted, locks timed out).
fn lock_and_stamp(lock: &RangeLock, shadow: &Region) -> (u64, u64) {
    let rank = gossamer::this_node().rank() as u64;
    let fibers: Vec<_> = (0..FIBERS)
        .map(|f| {
            let (lock, shadow) = (lock.clone(), shadow.clone());
            gossamer::spawn(move || {
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (rank << 32 | f);
                let mut next = move |n: u64| {
                    // splitmix64
                    rng = rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let mut z = rng;
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    (z ^ (z >> 31)) % n
                };
                let (mut granted, mut timed_out) = (0, 0);
                for i in 0..LOCKS {
                    let start = next(UNITS - 16);
                    let range = start..start + 1 + next(16);
                    let mode = if next(3) == 0 {
                        Mode::Write
                    } else {
                        Mode::Read
                    };
                    let guard = if next(5) == 0 {
                        // Without waiting: the guard comes to a callback.
                        let got = std::rc::Rc::new(std::cell::RefCell::new(None));
                        let (g, group) = (got.clone(), gossamer::Group::new());
                        let then = group.track(move |guard| *g.borrow_mut() = Some(guard));
                        lock.lock_then(range.clone(), mode, then).unwrap();
                        group.wait();
                        got.take().expect("lock_then ran its callback")
                    } else if next(4) == 0 {
                        let wait = Duration::from_micros(next(2000));
                        match lock.lock_until(range.clone(), mode, Instant::now() + wait) {
                            Ok(g) => g,
                            Err(_) => {
                                timed_out += 1;
                                continue;
                            }
                        }
                    } else {
                        lock.lock(range.clone(), mode).unwrap()
                    };
                    granted += 1;
                    let stamp = WRITER | ((rank << 40 | f << 20 | i) + 1);
                    stamp_units(&shadow, range.clone(), mode, stamp, true);
                    for _ in 0..next(4) {
                        gossamer::yield_now();
                    }
                    stamp_units(&shadow, range, mode, stamp, false);
                    drop(guard);
                }
                (granted, timed_out)
            })
        })
        .collect();
    fibers
        .into_iter()
        .map(|f| f.join())
        .fold((0, 0), |(g, t), (a, b)| (g + a, t + b))
}

/// Stamps (`on`) or clears the units of `range`, checking what was there.
fn stamp_units(shadow: &Region, range: std::ops::Range<u64>, mode: Mode, stamp: u64, on: bool) {
    let units: Vec<usize> = range.map(|u| u as usize).collect();
    match mode {
        Mode::Write => {
            let (from, to) = if on { (0, stamp) } else { (stamp, 0) };
            let done: Vec<_> = units
                .iter()
                .map(|&u| shadow.compare_exchange(u, from, to))
                .collect();
            for (u, d) in units.iter().zip(done) {
                let found = d.wait().unwrap();
                assert_eq!(
                    found,
                    Ok(from),
                    "unit {u}: {:#x} under a write (stamp {stamp:#x}, {})",
                    found.unwrap_or_else(|v| v),
                    if on { "granted" } else { "releasing" }
                );
            }
        }
        Mode::Read => {
            let delta = if on { 1 } else { u64::MAX };
            let done: Vec<_> = units.iter().map(|&u| shadow.fetch_add(u, delta)).collect();
            for (u, d) in units.iter().zip(done) {
                let before = d.wait().unwrap();
                assert_eq!(
                    before & WRITER,
                    0,
                    "unit {u}: a writer's stamp under a read"
                );
                assert!(on || before >= 1, "unit {u}: a reader left twice");
            }
        }
    }
}

/// Rank 0 holds 0..10 and then wants 20..30 for 100 ms; rank 1 holds 20..30 and then wants
/// 0..10 for a minute. Rank 0's request times out, it lets 0..10 go, and rank 1 gets it.
fn crosswise() {
    let lock = RangeLock::entrust_on(gossamer::this_node(), 64);
    let first = lock.write(0..10).unwrap();
    let other = gossamer::nodes().last().unwrap();
    let second = gossamer::spawn_on(
        other,
        |lock: RangeLock| {
            let held = lock.write(20..30).unwrap();
            let got = lock.write_until(0..10, Instant::now() + Duration::from_secs(60));
            drop(held);
            got.is_ok()
        },
        lock.clone(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while lock.requests() != 3 {
        assert!(
            Instant::now() < deadline,
            "rank 1 never held 20..30 and waited for 0..10"
        );
        gossamer::yield_now();
    }
    let mine = lock.write_until(20..30, Instant::now() + Duration::from_millis(100));
    assert!(mine.is_err(), "rank 1 holds 20..30 until it gets 0..10");
    drop(first);
    assert!(second.join(), "rank 1 got 0..10 once rank 0 let it go");
    let deadline = Instant::now() + Duration::from_secs(30);
    while lock.requests() != 0 {
        assert!(Instant::now() < deadline, "the table never emptied");
        gossamer::yield_now();
    }
    println!("crosswise ok");
}

/// A lock of 64 units in 4 shards (16 units each) on 3 ranks: guards that cross shards lock,
/// split inside a shard and at a shard boundary, downgrade, and unlock piece by piece.
fn sharded_guards() {
    let lock = RangeLock::sharded(64, 4).unwrap();
    let mut w = lock.write(10..40).unwrap(); // shards 0, 1 and 2
    assert_eq!(w.ranges(), vec![(10..40, Mode::Write)]);
    assert!(lock.try_read(20..21).is_err());
    let upper = w.split_at(10).unwrap(); // at 20, inside shard 1
    assert_eq!(w.ranges(), vec![(10..20, Mode::Write)]);
    assert_eq!(upper.ranges(), vec![(20..40, Mode::Write)]);
    drop(upper);
    assert!(lock.try_write(20..40).is_ok(), "the upper part is free");
    let mut whole = lock.write(24..48).unwrap(); // shards 1 and 2
    let top = whole.split_at(8).unwrap(); // at 32: a shard boundary
    assert_eq!(top.ranges(), vec![(32..48, Mode::Write)]);
    let r = top.downgrade();
    assert!(
        lock.try_read(32..48).is_ok(),
        "readers pass a downgraded writer"
    );
    assert!(lock.try_write(32..33).is_err());
    let all = lock
        .lock_all(&[(0..2, Mode::Write), (60..64, Mode::Read)])
        .unwrap();
    assert_eq!(all.ranges().len(), 2);
    let deadline = Instant::now() + Duration::from_millis(20);
    assert!(
        lock.write_until(0..64, deadline).is_err(),
        "held pieces time it out"
    );
    drop((w, whole, r, all));
    let deadline = Instant::now() + Duration::from_secs(30);
    while lock.requests() != 0 {
        assert!(
            Instant::now() < deadline,
            "the shards' tables never emptied"
        );
        gossamer::yield_now();
    }
    let group = gossamer::Group::new();
    lock.lock_then(
        0..64,
        Mode::Write,
        group.track(|g: rangelock::Guard| {
            assert_eq!(g.ranges(), vec![(0..64, Mode::Write)]);
        }),
    )
    .unwrap();
    group.wait();
    println!("sharded guards ok");
}
