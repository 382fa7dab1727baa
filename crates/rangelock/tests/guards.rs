//! Guards and errors on one node: `split_at` against a model of what each half holds, sharding
//! at the edges of `u64`, `requests()` counting lock calls, and bad ranges refused alike by
//! every lock call.
//!
//! One test: a process runs one rack at a time, so every check runs inside one. A watchdog
//! ends the process, naming the check it was in, if the rack does not finish in time.

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use rangelock::{Guard, LockError, Mode, RangeError, RangeLock};

/// The check running now, for the watchdog's message.
static CHECK: Mutex<&str> = Mutex::new("starting the rack");

fn enter(check: &'static str) {
    *CHECK.lock().unwrap() = check;
}

/// How long a whole run may take, even on a loaded machine.
const WATCHDOG: Duration = Duration::from_secs(300);

#[test]
fn guards_and_errors_on_one_node() {
    static DONE: AtomicBool = AtomicBool::new(false);
    std::thread::spawn(|| {
        let until = Instant::now() + WATCHDOG;
        while Instant::now() < until {
            if DONE.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "guards test: still in `{}` after {WATCHDOG:?}",
            CHECK.lock().unwrap()
        );
        std::process::exit(1);
    });
    let code = gossamer::Rack::from_env().workers(2).run(|| {
        enter("split_at of adjacent ranges from lock_all");
        split_adjacent_ranges();
        enter("sharded at the edges of u64");
        sharded_edges();
        enter("requests() counts lock calls");
        requests_count_lock_calls();
        enter("bad ranges refused by every lock call");
        bad_ranges_are_errors();
        enter("split_at against its model");
        split_matches_the_model();
    });
    DONE.store(true, Ordering::Release);
    assert_eq!(code, std::process::ExitCode::SUCCESS, "the rack's checks");
}

/// Returns once every unlock this fiber sent has arrived: `requests()` asks every shard
/// after them, on the same lanes; also checks how many requests are left.
fn settle(lock: &RangeLock, expected: usize) {
    assert_eq!(lock.requests(), expected, "requests left in the lock");
}

/// The case: `lock_all` of 600..608 and 608..616 for writing, which `ranges()`
/// reports as one range, split inside its second range and inside its first.
fn split_adjacent_ranges() {
    let lock = RangeLock::entrust_on(gossamer::this_node(), 1024);
    let both = [(600..608, Mode::Write), (608..616, Mode::Write)];
    let mut lower = lock.lock_all(&both).unwrap();
    assert_eq!(lower.ranges(), vec![(600..616, Mode::Write)]);
    let upper = lower.split_at(12).unwrap();
    assert_eq!(lower.ranges(), vec![(600..612, Mode::Write)]);
    assert_eq!(upper.ranges(), vec![(612..616, Mode::Write)]);
    drop(upper);
    settle(&lock, 1);
    assert!(
        lock.try_write(612..616).is_ok(),
        "612..616 is free once the upper guard is dropped"
    );
    assert_eq!(
        lock.try_write(611..612).unwrap_err(),
        LockError::WouldBlock,
        "611 stays locked by the lower guard"
    );
    drop(lower);
    settle(&lock, 0);

    let mut lower = lock.lock_all(&both).unwrap();
    let upper = lower.split_at(4).unwrap(); // inside the first range
    assert_eq!(lower.ranges(), vec![(600..604, Mode::Write)]);
    assert_eq!(upper.ranges(), vec![(604..616, Mode::Write)]);
    drop(lower);
    settle(&lock, 1);
    assert!(lock.try_write(600..604).is_ok(), "the lower part is free");
    assert!(lock.try_read(604..605).is_err(), "the upper part is held");
    drop(upper);
    settle(&lock, 0);
}

/// `sharded` for `units` near `u64::MAX` and for `k` up to `units`: every shard serves
/// units, the top of the lock locks, and shard counts no units can fill are refused.
fn sharded_edges() {
    let soon = || Instant::now() + Duration::from_secs(30);
    for k in [1, 2, 3, 4, 7] {
        let lock = RangeLock::sharded(u64::MAX, k).unwrap();
        let top = lock
            .write_until(u64::MAX - 8..u64::MAX, soon())
            .unwrap_or_else(|e| panic!("sharded(u64::MAX, {k}): the top 8 units: {e}"));
        let all = lock
            .read_until(0..u64::MAX - 8, soon())
            .unwrap_or_else(|e| panic!("sharded(u64::MAX, {k}): every other unit: {e}"));
        assert_eq!(top.ranges(), vec![(u64::MAX - 8..u64::MAX, Mode::Write)]);
        assert_eq!(all.ranges(), vec![(0..u64::MAX - 8, Mode::Read)]);
        drop((top, all));
        settle(&lock, 0);
    }
    // k close to units: with 10 units in 6 shards every shard serves 1 or 2 units, and each
    // unit locks on its own.
    for (units, k) in [(10, 6), (10, 10), (7, 4), (1, 1)] {
        let lock = RangeLock::sharded(units, k).unwrap();
        let guards: Vec<Guard> = (0..units)
            .map(|u| {
                lock.try_write(u..u + 1)
                    .unwrap_or_else(|e| panic!("sharded({units}, {k}): unit {u}: {e}"))
            })
            .collect();
        assert!(lock.try_read(0..units).is_err(), "every unit is held");
        drop(guards);
        settle(&lock, 0);
        let whole = lock.try_write(0..units).unwrap();
        assert_eq!(whole.ranges(), vec![(0..units, Mode::Write)]);
    }
    for (units, k) in [(3, 4), (5, 0), (0, 1), (u64::MAX, 0)] {
        assert_eq!(
            RangeLock::sharded(units, k).unwrap_err(),
            RangeError::Shards { shards: k, units },
            "sharded({units}, {k})"
        );
    }
    let message = RangeLock::sharded(3, 4).unwrap_err().to_string();
    assert!(
        message.contains("ask for 1 to 3 shards"),
        "the error says what to ask for: {message}"
    );
}

/// One lock call is one request however many shards it reaches; a split makes two.
fn requests_count_lock_calls() {
    let lock = RangeLock::sharded(64, 4).unwrap();
    let mut w = lock.write(10..40).unwrap(); // shards 0, 1 and 2
    settle(&lock, 1);
    let both = lock
        .lock_all(&[(0..2, Mode::Read), (60..64, Mode::Write)])
        .unwrap(); // shards 0 and 3
    settle(&lock, 2);
    let upper = w.split_at(22).unwrap(); // at 32, a shard boundary: no piece splits
    settle(&lock, 3);
    let mut upper = upper;
    let top = upper.split_at(4).unwrap(); // at 36, inside shard 2
    settle(&lock, 4);
    drop((w, both, upper, top));
    settle(&lock, 0);
}

/// Every lock call refuses an empty or out-of-range argument with the same error, and
/// locks nothing.
fn bad_ranges_are_errors() {
    let lock = RangeLock::sharded(64, 2).unwrap();
    let soon = || Instant::now() + Duration::from_secs(30);
    #[allow(clippy::reversed_empty_ranges)]
    let bad: [(Range<u64>, RangeError); 3] = [
        (5..5, RangeError::Empty(5..5)),
        (9..3, RangeError::Empty(9..3)),
        (
            60..65,
            RangeError::OutOfBounds {
                range: 60..65,
                units: 64,
            },
        ),
    ];
    for (range, error) in bad {
        for mode in [Mode::Read, Mode::Write] {
            let r = || range.clone();
            assert_eq!(lock.lock(r(), mode).unwrap_err(), error);
            assert_eq!(lock.try_lock(r(), mode).unwrap_err(), error.clone().into());
            assert_eq!(
                lock.lock_until(r(), mode, soon()).unwrap_err(),
                LockError::Range(error.clone())
            );
            assert_eq!(lock.lock_then(r(), mode, |_: Guard| {}).unwrap_err(), error);
            assert_eq!(lock.lock_all(&[(r(), mode)]).unwrap_err(), error);
        }
    }
    assert_eq!(lock.lock_all(&[]).unwrap_err(), RangeError::NoRanges);
    settle(&lock, 0);
    let mut g = lock.write(10..20).unwrap();
    for mid in [0, 10, 11, u64::MAX] {
        assert_eq!(
            g.split_at(mid).unwrap_err(),
            RangeError::SplitOutside { mid, held: 10..20 }
        );
    }
    assert_eq!(g.ranges(), vec![(10..20, Mode::Write)], "a refused split");
    drop(g);
    settle(&lock, 0);
}

/// Units of the model's locks.
const UNITS: u64 = 48;

/// A `lock_all` set: ranges one after another, each `gap` units after the last (often 0,
/// so adjacent ranges of one mode or of both are common).
fn ranges() -> impl Strategy<Value = Vec<(Range<u64>, Mode)>> {
    let range = (
        prop_oneof![3 => Just(0u64), 1 => 1..5u64],
        1..9u64,
        any::<bool>(),
    );
    (0..6u64, prop::collection::vec(range, 1..7)).prop_map(|(first, list)| {
        let mut at = first;
        let mut out = Vec::new();
        for (gap, len, write) in list {
            let start = at + gap;
            let end = (start + len).min(UNITS);
            if start >= end {
                break;
            }
            let mode = if write { Mode::Write } else { Mode::Read };
            out.push((start..end, mode));
            at = end;
        }
        out
    })
}

/// Each unit's mode under `ranges`, `None` where free.
type Units = Vec<Option<Mode>>;

fn units_of(ranges: &[(Range<u64>, Mode)]) -> Units {
    let mut units = vec![None; UNITS as usize];
    for (r, mode) in ranges {
        for u in r.clone() {
            units[u as usize] = Some(*mode);
        }
    }
    units
}

/// `units` as `Guard::ranges` reports them: ascending, adjacent ranges of one mode joined.
fn joined(units: &Units) -> Vec<(Range<u64>, Mode)> {
    let mut out: Vec<(Range<u64>, Mode)> = Vec::new();
    for (u, mode) in units.iter().enumerate() {
        let (Some(mode), u) = (*mode, u as u64) else {
            continue;
        };
        match out.last_mut() {
            Some((r, m)) if r.end == u && *m == mode => r.end = u + 1,
            _ => out.push((u..u + 1, mode)),
        }
    }
    out
}

/// Probes every unit with a fresh request: a unit held for writing refuses a reader, one
/// held for reading admits a reader and refuses a writer, a free one admits a writer.
fn probe(lock: &RangeLock, expected: &Units, when: &str) -> Result<(), TestCaseError> {
    for (u, mode) in expected.iter().enumerate() {
        let unit = u as u64..u as u64 + 1;
        // Each probe's guard is dropped at once; its unlock runs before the next probe, which
        // takes the same lanes.
        let reads = lock.try_read(unit.clone()).is_ok();
        let writes = lock.try_write(unit).is_ok();
        let seen = match (reads, writes) {
            (false, false) => "held for writing",
            (true, false) => "held for reading",
            (true, true) => "free",
            (false, true) => "refusing a reader but admitting a writer",
        };
        let wanted = match mode {
            Some(Mode::Write) => "held for writing",
            Some(Mode::Read) => "held for reading",
            None => "free",
        };
        prop_assert_eq!(seen, wanted, "unit {} {}", u, when);
    }
    Ok(())
}

/// `split_at` on arbitrary `lock_all` sets over 1 to 4 shards, at every kind of point
/// (inside a range, between adjacent ranges, in a gap, at a shard boundary, outside): the
/// halves report and hold exactly the units below and above the point, and dropping each
/// frees exactly its units; a refused split changes nothing.
fn split_matches_the_model() {
    let mut runner = TestRunner::new(Config {
        cases: 512,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (1..=4usize, ranges(), 0..UNITS + 2, any::<bool>());
    let result = runner.run(&strategy, |(k, ranges, mid, lower_first)| {
        let lock = RangeLock::sharded(UNITS, k).unwrap();
        let mut lower = lock.lock_all(&ranges).unwrap();
        let held = units_of(&ranges);
        prop_assert_eq!(lower.ranges(), joined(&held));
        let first = ranges[0].0.start;
        let end = ranges.last().unwrap().0.end;
        let upper = match lower.split_at(mid) {
            Err(e) => {
                prop_assert!(mid == 0 || mid >= end - first, "split_at({}) refused", mid);
                prop_assert_eq!(
                    e,
                    RangeError::SplitOutside {
                        mid,
                        held: first..end
                    }
                );
                prop_assert_eq!(lower.ranges(), joined(&held), "a refused split");
                probe(&lock, &held, "after a refused split")?;
                drop(lower);
                prop_assert_eq!(lock.requests(), 0);
                probe(&lock, &units_of(&[]), "after the drop")?;
                return Ok(());
            }
            Ok(upper) => upper,
        };
        prop_assert!(mid >= 1 && mid < end - first, "split_at({}) accepted", mid);
        let at = (first + mid) as usize;
        let mut below = held.clone();
        below[at..].fill(None);
        let mut above = held.clone();
        above[..at].fill(None);
        prop_assert_eq!(lower.ranges(), joined(&below));
        prop_assert_eq!(upper.ranges(), joined(&above));
        prop_assert_eq!(lock.requests(), 2, "two guards, two requests");
        probe(&lock, &held, "after the split")?;
        let (gone, kept, left) = if lower_first {
            drop(lower);
            ("lower", upper, above)
        } else {
            drop(upper);
            ("upper", lower, below)
        };
        prop_assert_eq!(lock.requests(), 1, "after dropping the {} guard", gone);
        probe(&lock, &left, &format!("after dropping the {gone} guard"))?;
        drop(kept);
        prop_assert_eq!(lock.requests(), 0);
        probe(&lock, &units_of(&[]), "after dropping both")?;
        Ok(())
    });
    if let Err(e) = result {
        panic!("split_at against its model: {e}");
    }
}
