//! Rebalancing: an opt-in thread that moves hot properties off overloaded trustees, using the
//! counters (`stats`). See [`Rebalance`].
//!
//! Each period the thread reads every trustee's busy time (exact: the time it was not idle;
//! scaled by the share of its runnable time the thread was on a CPU, see below) and its
//! hottest properties (from sampled batches: see [`Stats::hottest`](crate::Stats::hottest)),
//! and plans moves greedily: from the busiest trustee to the least busy, the hottest property
//! whose share of the busiest one's time (its share of the requests) is at most half the gap
//! between the two, until no property worth a move fits. The threshold starts a round (the
//! gap must exceed it for two periods of smoothed counts); once started, a round evens the
//! load out as far as it can, not just below the threshold: beside other busy processes
//! every trustee's measured load shrinks with its share of a core, and rounds that stopped
//! below the threshold left `bench migrate`'s badly placed load at 0.70–0.76× of the well
//! placed one. A property carrying under a quarter of the threshold is not worth a move. A move never brings the two past each other, and a property that moved stays
//! put for `settle` periods, so one property does not go back and forth.
//!
//! Rounds of moves (the moves of one period, up to four or one per trustee) are rationed: a
//! burst of [`BURST`] rounds, then one per `spacing` (a minute by default) as the burst
//! refills. A badly placed start evens out within the burst; after that, what looks like an
//! imbalance is mostly noise in the counters — on a machine with other work beside it a
//! trustee's measured load swings by more than the threshold between periods — and a move on
//! noise only trades one placement for another as good. A real shift in the load is followed
//! at once while rounds are left, and within a `spacing` when they are spent.
//!
//! Busy time is wall-clock time, and beside other busy processes it includes the time a
//! worker was preempted while busy, which varies from one period to the next by more than the
//! threshold: a rebalancer that read it as load went on moving properties once the load was
//! even (24 moves in 24 s of `bench migrate` beside a busy loop per core). So each trustee's
//! busy time is scaled by the share of its runnable time it spent on a CPU, from the
//! scheduler's own accounting of its thread (`/proc/thread-self/schedstat`: time on a CPU,
//! time waiting for one), which takes most of that out (6 moves in 48 s); where there is no
//! such file, busy time stands as it is.
//!
//! The move itself runs on the property's trustee, in its loop: only a property that still
//! holds a hot slot there is moved, which means it is alive and lives there
//! (`WorkerCounters::forget`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use crate::home::{Header, MigrateError};
use crate::inject::Injected;
use crate::registry::Registry;
use crate::spin::SchedStat;
use crate::worker;

/// The rebalancing policy of [`Builder::rebalance`](crate::Builder::rebalance): greedy by
/// load, with hysteresis.
///
/// ```
/// use std::time::Duration;
/// let rt = trust::Runtime::builder()
///     .workers(2)
///     .rebalance(trust::Rebalance::default().every(Duration::from_millis(50)))
///     .build()
///     .unwrap();
/// # drop(rt);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Rebalance {
    every: Duration,
    threshold: f64,
    settle: u32,
    spacing: Duration,
}

impl Default for Rebalance {
    /// Every 200 ms; act on a gap of 15% of a core between the busiest and the least busy
    /// trustee; a moved property stays for 10 periods; after the first rounds of moves, one
    /// round a minute.
    fn default() -> Self {
        Rebalance {
            every: Duration::from_millis(200),
            threshold: 0.15,
            settle: 10,
            spacing: Duration::from_secs(60),
        }
    }
}

impl Rebalance {
    /// How often the load is looked at (at least 1 ms).
    pub fn every(mut self, period: Duration) -> Self {
        self.every = period.max(Duration::from_millis(1));
        self
    }

    /// The gap in busy time, as a share of the period (0.1 = 10% of a core), between the
    /// busiest and the least busy trustee over which a round of moves starts (two periods in
    /// a row); the round then moves properties until none worth a move (a quarter of this)
    /// fits in half the gap.
    pub fn threshold(mut self, gap: f64) -> Self {
        self.threshold = gap.clamp(0.0, 1.0);
        self
    }

    /// Periods a moved property stays where it went before it may move again.
    pub fn settle(mut self, periods: u32) -> Self {
        self.settle = periods;
        self
    }

    /// Once the first rounds of moves are made (a burst of two), at most one round per
    /// `spacing` (at least one period), as the burst comes back: what keeps the counters'
    /// noise from moving properties for good. `Duration::ZERO`'s one period lifts the limit.
    pub fn spacing(mut self, spacing: Duration) -> Self {
        self.spacing = spacing;
        self
    }

    /// Parses `GSM_REBALANCE`-style text: `on` (the defaults), `off`, or a period in
    /// milliseconds.
    ///
    /// ```
    /// use trust::Rebalance;
    /// assert_eq!(Rebalance::parse("on").unwrap(), Some(Rebalance::default()));
    /// assert_eq!(Rebalance::parse("off").unwrap(), None);
    /// assert!(Rebalance::parse("250").unwrap().is_some());
    /// assert!(Rebalance::parse("soon").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<Option<Rebalance>, String> {
        match text.trim() {
            "on" | "1" | "yes" => Ok(Some(Rebalance::default())),
            "off" | "0" | "no" | "" => Ok(None),
            ms => match ms.parse::<u64>() {
                Ok(ms) => Ok(Some(Rebalance::default().every(Duration::from_millis(ms)))),
                Err(_) => Err(format!(
                    "rebalancing {ms:?}: expected on, off or a period in milliseconds"
                )),
            },
        }
    }
}

/// One worker's load in a period.
#[derive(Clone, Debug, PartialEq)]
struct Load {
    worker: usize,
    /// CPU time spent not idle (neither spinning for work nor asleep), as a share of the
    /// period: the wall-clock time not idle (counted exactly, where the time spent serving
    /// would be an estimate from samples) times the share of its runnable time the thread
    /// was on a CPU (see `on_cpu_share`).
    busy: f64,
    /// Requests served.
    requests: u64,
}

/// A hot property's requests in a period.
#[derive(Clone, Debug, PartialEq)]
struct Hot {
    id: usize,
    worker: usize,
    requests: u64,
}

/// A planned move.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Move {
    pub(crate) id: usize,
    pub(crate) from: usize,
    pub(crate) to: usize,
}

/// The planning state kept between periods.
struct Planner {
    policy: Rebalance,
    period: u64,
    /// Properties moved, by id, with the period they moved in.
    moved: HashMap<usize, u64>,
    /// Each trustee's busy share, smoothed over the periods since the last moves.
    smoothed: HashMap<usize, f64>,
    /// Periods in a row whose smoothed gap was over the threshold.
    over: u32,
    /// Rounds of moves that may be made now (up to [`BURST`]; one comes back per spacing).
    rounds: f64,
}

/// Periods in a row the gap must stay over the threshold before anything moves: one
/// period's counts (sampled) are noisy, and right after moves they are not settled.
const PERSIST: u32 = 2;

/// The smallest share of a period worth a move, as a part of the threshold: moving the
/// properties that carry almost nothing only shuffles them.
const MIN_SHARE: f64 = 0.25;

/// Moves planned per period at most, or one per trustee where there are more: enough to even
/// out a badly placed start in a round or two, few enough that each decision rests on fresh
/// counts.
const MOVES_PER_PERIOD: usize = 4;

/// Rounds of moves that may follow one another as soon as the load calls for them, before
/// they are rationed to one per spacing.
pub(crate) const BURST: f64 = 2.0;

impl Planner {
    fn new(policy: Rebalance) -> Planner {
        Planner {
            policy,
            period: 0,
            moved: HashMap::new(),
            smoothed: HashMap::new(),
            over: 0,
            rounds: BURST,
        }
    }

    fn plan(&mut self, mut loads: Vec<Load>, hot: &[Hot]) -> Vec<Move> {
        self.period += 1;
        let periods_per_round = self.policy.spacing.as_secs_f64() / self.policy.every.as_secs_f64();
        self.rounds = (self.rounds + 1.0 / periods_per_round.max(1.0)).min(BURST);
        let (period, settle) = (self.period, u64::from(self.policy.settle));
        self.moved.retain(|_, at| period - *at <= settle);
        for l in &mut loads {
            let s = self.smoothed.entry(l.worker).or_insert(l.busy);
            *s = (*s + l.busy) / 2.0;
            l.busy = *s;
        }
        let (most, least) = loads.iter().fold((0.0f64, f64::MAX), |(most, least), l| {
            (most.max(l.busy), least.min(l.busy))
        });
        if loads.len() < 2 || most - least < self.policy.threshold {
            self.over = 0;
            return Vec::new();
        }
        self.over += 1;
        // Out of rounds, the gap waits on (still measured) for the next one.
        if self.over < PERSIST || self.rounds < 1.0 {
            return Vec::new();
        }
        let min_share = self.policy.threshold * MIN_SHARE;
        let mut moves = Vec::new();
        let most_moves = MOVES_PER_PERIOD.max(loads.len());
        while moves.len() < most_moves && loads.len() >= 2 {
            loads.sort_by(|a, b| b.busy.total_cmp(&a.busy));
            let (busiest, idlest) = (&loads[0], &loads[loads.len() - 1]);
            let gap = busiest.busy - idlest.busy;
            // Nothing worth a move fits in half a gap this small.
            if gap < 2.0 * min_share || busiest.requests == 0 {
                break;
            }
            let share = |h: &Hot| h.requests as f64 / busiest.requests as f64 * busiest.busy;
            let candidate = hot
                .iter()
                .filter(|h| h.worker == busiest.worker && !self.moved.contains_key(&h.id))
                .filter(|h| share(h) >= min_share && share(h) <= gap / 2.0)
                .max_by(|a, b| share(a).total_cmp(&share(b)));
            let Some(h) = candidate else { break };
            let s = share(h);
            moves.push(Move {
                id: h.id,
                from: busiest.worker,
                to: idlest.worker,
            });
            self.moved.insert(h.id, period);
            let last = loads.len() - 1;
            loads[0].busy -= s;
            loads[0].requests = loads[0].requests.saturating_sub(h.requests);
            loads[last].busy += s;
        }
        if !moves.is_empty() {
            self.rounds -= 1.0;
            // The next periods measure the new placement afresh.
            self.smoothed.clear();
            self.over = 0;
        }
        moves
    }
}

/// The rebalancing thread's body: plans each period until `stop` is dropped.
pub(crate) fn run(registry: Arc<Registry>, policy: Rebalance, stop: Receiver<()>) {
    let every = policy.every;
    let mut planner = Planner::new(policy);
    let snapshot = |r: &Registry| crate::stats::snapshot(&r.counters, &r.trustees, r.started);
    let sched_stats = |r: &Registry| -> Vec<Option<SchedStat>> {
        r.trustees
            .iter()
            .map(|&t| r.counters[t].sched_stat())
            .collect()
    };
    let (mut before, mut sched_before) = (snapshot(&registry), sched_stats(&registry));
    loop {
        match stop.recv_timeout(every) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let (now, sched_now) = (snapshot(&registry), sched_stats(&registry));
        let delta = now.since(&before);
        let seconds = delta.uptime.as_secs_f64().max(1e-9);
        let loads = registry
            .trustees
            .iter()
            .enumerate()
            .map(|(i, &t)| Load {
                worker: t,
                busy: delta.workers[t].busy(delta.uptime).as_secs_f64() / seconds
                    * on_cpu_share(sched_before[i], sched_now[i]),
                requests: delta.workers[t].requests,
            })
            .collect();
        let hot: Vec<Hot> = delta
            .hottest
            .iter()
            .map(|p| Hot {
                id: p.id,
                worker: p.worker,
                requests: p.requests,
            })
            .collect();
        (before, sched_before) = (now, sched_now);
        for m in planner.plan(loads, &hot) {
            // Refused (freed, moved or pinned since): the next periods plan again.
            registry.inject(m.from, Injected::Run(Box::new(move || drop(move_hot(m)))));
        }
    }
}

/// The share of its runnable time a thread spent on a CPU between two readings of its
/// schedstat, the rest being time it waited while other threads ran (1 where unknown).
fn on_cpu_share(before: Option<SchedStat>, now: Option<SchedStat>) -> f64 {
    let (Some(before), Some(now)) = (before, now) else {
        return 1.0;
    };
    let ran = now.on_cpu.saturating_sub(before.on_cpu).as_secs_f64();
    let waited = now.run_delay.saturating_sub(before.run_delay).as_secs_f64();
    if ran + waited > 0.0 {
        ran / (ran + waited)
    } else {
        1.0
    }
}

/// Makes a planned move, on the worker it moves from, if the property is still there.
pub(crate) fn move_hot(m: Move) -> Result<(), MigrateError> {
    let w = worker::current().expect("injected work outside a worker");
    if !w.counters().is_hot(m.id) {
        // Freed or moved since; or, asked by hand, an id that never named a hot property.
        return Err(MigrateError::NotHot {
            id: m.id,
            worker: w.index,
        });
    }
    if m.to == w.index {
        return Ok(()); // where it is (a move by hand may ask for this)
    }
    let property = m.id as *const ();
    // SAFETY: a property with a hot slot on this worker is alive and lives here (`forget`).
    let header = unsafe { Header::of(property) };
    header.move_to(w.index, m.to, w.registry.workers)?;
    w.gave_away(property, m.to);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planner() -> Planner {
        Planner::new(Rebalance::default())
    }

    fn load(worker: usize, busy: f64, requests: u64) -> Load {
        Load {
            worker,
            busy,
            requests,
        }
    }

    fn hot(worker: usize, list: &[(usize, u64)]) -> Vec<Hot> {
        list.iter()
            .map(|&(id, requests)| Hot {
                id,
                worker,
                requests,
            })
            .collect()
    }

    #[test]
    fn hot_properties_move_from_the_busiest_to_the_idlest_without_overshooting() {
        let mut p = planner();
        // Worker 0 serves everything (95% of the period): four properties of 40, 30, 20 and
        // 5% of the period.
        let hot = hot(0, &[(1, 400), (2, 300), (3, 200), (4, 50)]);
        let loads = vec![load(0, 0.95, 950), load(1, 0.0, 0)];
        assert!(
            p.plan(loads.clone(), &hot).is_empty(),
            "one period is not enough"
        );
        let moves = p.plan(loads, &hot);
        // The gap is 0.95: the 40% one moves (the largest within half the gap); then the gap
        // is 0.15 and only the 5% one fits in half of it; a gap of 0.05 remains.
        let ids: Vec<usize> = moves.iter().map(|m| m.id).collect();
        assert_eq!(ids, vec![1, 4]);
        assert!(moves.iter().all(|m| m.from == 0 && m.to == 1));
    }

    #[test]
    fn a_round_evens_out_past_the_threshold() {
        // Beside other busy processes loads read smaller (each worker gets half a core): the
        // same start as above at half the load. After the two hottest the gap (0.125) is
        // below the threshold, but the third still fits in half of it and is worth a move.
        let mut p = planner();
        let hot = hot(0, &[(1, 250), (2, 125), (3, 83), (4, 62)]);
        let loads = vec![load(0, 0.5, 1000), load(1, 0.0, 0)];
        assert!(p.plan(loads.clone(), &hot).is_empty());
        let ids: Vec<usize> = p.plan(loads, &hot).iter().map(|m| m.id).collect();
        assert_eq!(ids, vec![1, 2, 3]);
    }

    #[test]
    fn a_small_gap_a_property_too_big_or_too_small_leaves_everything() {
        let one = hot(0, &[(1, 100)]);
        let mut p = planner();
        for _ in 0..5 {
            assert!(
                p.plan(vec![load(0, 0.55, 100), load(1, 0.5, 100)], &one)
                    .is_empty()
            );
        }
        // One property carries all of worker 0's load: moving it would only swap the two.
        let mut p = planner();
        for _ in 0..5 {
            assert!(
                p.plan(vec![load(0, 0.9, 100), load(1, 0.1, 10)], &one)
                    .is_empty()
            );
        }
        // A property carrying a sliver of the load is not worth a move.
        let sliver = hot(0, &[(1, 99_000), (2, 1_000)]);
        let mut p = planner();
        for _ in 0..5 {
            assert!(
                p.plan(vec![load(0, 0.9, 100_000), load(1, 0.1, 10)], &sliver)
                    .is_empty()
            );
        }
    }

    #[test]
    fn busy_time_counts_only_the_share_of_runnable_time_on_a_cpu() {
        let ms = Duration::from_millis;
        let stat = |on_cpu, run_delay| {
            Some(SchedStat {
                on_cpu: ms(on_cpu),
                run_delay: ms(run_delay),
            })
        };
        // 100 ms on a CPU and 100 ms waiting for one since the last reading: half.
        assert_eq!(on_cpu_share(stat(50, 20), stat(150, 120)), 0.5);
        assert_eq!(on_cpu_share(stat(50, 20), stat(250, 20)), 1.0);
        // Asleep throughout, or nothing to read: the busy time stands as it is.
        assert_eq!(on_cpu_share(stat(50, 20), stat(50, 20)), 1.0);
        assert_eq!(on_cpu_share(None, stat(50, 20)), 1.0);
        assert_eq!(on_cpu_share(stat(50, 20), None), 1.0);
    }

    #[test]
    fn a_worker_reads_its_own_schedstat() {
        let rt = crate::Runtime::builder()
            .workers(1)
            .build()
            .expect("a runtime");
        let ran = rt.block_on(|| {
            let w = worker::current().expect("on a worker");
            w.counters().sched_stat()
        });
        if std::path::Path::new("/proc/thread-self/schedstat").exists() {
            assert!(ran.is_some(), "a worker's schedstat could not be read");
        }
    }

    #[test]
    fn a_moved_property_settles_before_it_moves_again() {
        let mut p = planner();
        let loads = |busy| vec![load(busy, 0.8, 400), load(1 - busy, 0.2, 0)];
        assert!(p.plan(loads(0), &hot(0, &[(7, 100)])).is_empty());
        assert_eq!(p.plan(loads(0), &hot(0, &[(7, 100)])).len(), 1);
        // The next periods see it as the hot one on worker 1, now the busier: it stays for
        // the settle periods (10 from its move).
        for _ in 0..10 {
            assert!(p.plan(loads(1), &hot(1, &[(7, 100)])).is_empty());
        }
        assert_eq!(p.plan(loads(1), &hot(1, &[(7, 100)])).len(), 1);
    }

    #[test]
    fn after_a_burst_of_rounds_one_round_per_spacing() {
        // Properties enough for every round, each a tenth of the load, and a gap that never
        // closes (the counters' noise, as beside other busy processes).
        let ids: Vec<(usize, u64)> = (0..64).map(|id| (id, 100)).collect();
        let mut p = Planner::new(Rebalance::default().settle(0));
        let rounds_in = |p: &mut Planner, periods: usize| {
            (0..periods)
                .filter(|_| {
                    let loads = vec![load(0, 0.6, 1000), load(1, 0.3, 500)];
                    !p.plan(loads, &hot(0, &ids)).is_empty()
                })
                .count()
        };
        // 200 ms periods: the burst at once, then nothing until a round has come back (a
        // minute after the first), then one round a minute.
        assert_eq!(rounds_in(&mut p, 290), BURST as usize);
        for minute in 1..4 {
            assert_eq!(rounds_in(&mut p, 300), 1, "minute {minute}");
        }
        // Without a limit, a round every other period (the gap must persist for two).
        let mut p = Planner::new(Rebalance::default().settle(0).spacing(Duration::ZERO));
        assert_eq!(rounds_in(&mut p, 300), 150);
    }
}
