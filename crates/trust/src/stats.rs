//! Counters of what the workers do, always on, and their snapshot ([`Stats`]).
//!
//! A worker counts per *batch*, never per request: serving a batch adds its record count
//! (counted by the loop that runs the records anyway) and one to its batches, in cells of its
//! own. Every 16 rounds of its loop, and before it waits for work, it publishes them to the
//! atomics [`Handle::stats`] reads, so a snapshot of a busy worker may lag by those rounds.
//! Its idle time is counted per wait. What each property *type* costs, and which properties
//! are hottest, are sampled: one batch in [`SAMPLE_EVERY`] a trustee serves is run with a clock
//! read after each record, and its records are tallied by type and by property in a table
//! of fixed size under a lock that only that worker and [`Handle::stats`] take. The hottest
//! properties are kept by the *space-saving* scheme (Metwally, Agrawal and El Abbadi, 2005):
//! [`HOT_SLOTS`] slots; a property without a slot takes the least counted one's slot and
//! count, so a property with more than 1/[`HOT_SLOTS`] of a worker's sampled requests always
//! holds a slot (its count overestimated by at most its slot's `error`), and no workload
//! grows the table.
//!
//! The counters are statistics, not part of any protocol: plain atomics, also under loom.
//!
//! [`Handle::stats`]: crate::Handle::stats

use std::cell::Cell;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::spin::SchedStat;

/// One batch in this many that a trustee serves is sampled (per type, per property).
pub const SAMPLE_EVERY: u64 = 1024;

/// Properties each worker tracks for [`Stats::hottest`].
pub const HOT_SLOTS: usize = 32;

/// A snapshot of a runtime's counters, from [`Handle::stats`](crate::Handle::stats).
///
/// Counts and times run from the runtime's start; take two snapshots and subtract
/// ([`Stats::since`]) for rates. A worker publishes its request and batch counts and its
/// fibers every 16 rounds of its loop and before it waits for work, so a snapshot may lag a
/// busy worker by those rounds; once it has gone idle its counts are exact.
///
/// ```
/// let rt = trust::Runtime::builder().workers(2).build().unwrap();
/// let counter = rt.trustee(1).entrust(0u64);
/// for _ in 0..1000 {
///     counter.apply(|c| *c += 1);
/// }
/// // Worker 1 publishes its counts before it waits for more work.
/// let stats = loop {
///     let stats = rt.stats();
///     if stats.workers[1].requests == 1000 {
///         break stats;
///     }
///     std::thread::yield_now();
/// };
/// let w = &stats.workers[1];
/// assert!(w.batches >= 1 && w.batches <= 1000);
/// assert_eq!(w.properties, 1);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Stats {
    /// Time since the runtime started.
    pub uptime: Duration,
    /// One entry per worker, in worker order.
    pub workers: Vec<WorkerStats>,
    /// Per property type, busiest first. Estimated: each worker's `requests` shared out in
    /// the proportions its sampled batches (one in [`SAMPLE_EVERY`]) show, so requests run
    /// without a batch count as if they were mixed like the batched ones.
    pub types: Vec<TypeStats>,
    /// The properties with the most requests in sampled batches, busiest first (at most
    /// [`HOT_SLOTS`] per worker).
    pub hottest: Vec<PropertyStats>,
}

/// What one worker did since the runtime started.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkerStats {
    /// The worker's index.
    pub worker: usize,
    /// Whether it serves as a trustee.
    pub trustee: bool,
    /// Requests it ran as a trustee: in batches, and inline for a fiber of its own.
    pub requests: u64,
    /// Of `requests`, those it ran without a batch: inline for a fiber of its own, or
    /// handed over by an async caller or another runtime.
    pub inline: u64,
    /// Batches it served as a trustee.
    pub batches: u64,
    /// Time it spent idle, spinning for work before it slept (CPU time that served nothing).
    pub spinning: Duration,
    /// Time it spent asleep, waiting for work.
    pub sleeping: Duration,
    /// Fibers ready to run, as of its last count (every 16 rounds of its loop, and before it
    /// waits for work).
    pub runnable_fibers: u64,
    /// Fibers alive on it (ready, running or blocked), counted likewise.
    pub fibers: u64,
    /// Properties its trustee holds now.
    pub properties: u64,
    /// Properties its trustee moved to another one ([`Trust::migrate_to`](crate::Trust::migrate_to),
    /// rebalancing).
    pub moved_away: u64,
}

impl WorkerStats {
    /// Mean requests per batch (0 before the first batch).
    pub fn mean_batch(&self) -> f64 {
        if self.batches == 0 {
            0.0
        } else {
            // Saturating: a snapshot may read the two counts from different publications.
            self.requests.saturating_sub(self.inline) as f64 / self.batches as f64
        }
    }

    /// Time it was not idle: `uptime` less spinning and sleeping.
    pub fn busy(&self, uptime: Duration) -> Duration {
        uptime.saturating_sub(self.spinning + self.sleeping)
    }
}

/// Requests to, and time spent in, the properties of one type.
#[derive(Clone, Debug, PartialEq)]
pub struct TypeStats {
    /// The property type, as `std::any::type_name` spells it.
    pub type_name: &'static str,
    /// Requests to its properties (estimated: see [`Stats::types`]).
    pub requests: u64,
    /// Time its requests ran (estimated likewise).
    pub time: Duration,
}

/// One of the hottest properties.
#[derive(Clone, Debug, PartialEq)]
pub struct PropertyStats {
    /// The property's type, as `std::any::type_name` spells it.
    pub type_name: &'static str,
    /// The worker whose trustee holds it.
    pub worker: usize,
    /// Names the property while it lives (its address; a later property may reuse it).
    pub id: usize,
    /// Requests to it (estimated: see [`Stats::types`]). An overestimate by at most `error`.
    pub requests: u64,
    /// How much of `requests` may belong to properties that held its slot before it.
    pub error: u64,
}

impl Stats {
    /// What happened between `earlier` and `self` (two snapshots of one runtime): counts and
    /// times are differences; fibers and properties are `self`'s.
    ///
    /// ```
    /// let rt = trust::Runtime::builder().workers(1).build().unwrap();
    /// let c = rt.entrust(0u32);
    /// let before = rt.stats();
    /// c.apply(|c| *c += 1);
    /// std::thread::sleep(std::time::Duration::from_millis(10));
    /// let delta = rt.stats().since(&before);
    /// assert!(delta.uptime >= std::time::Duration::from_millis(10));
    /// assert!(delta.workers[0].requests <= 1);
    /// ```
    pub fn since(&self, earlier: &Stats) -> Stats {
        let workers = self
            .workers
            .iter()
            .map(
                |w| match earlier.workers.iter().find(|e| e.worker == w.worker) {
                    Some(e) => WorkerStats {
                        requests: w.requests.saturating_sub(e.requests),
                        inline: w.inline.saturating_sub(e.inline),
                        batches: w.batches.saturating_sub(e.batches),
                        spinning: w.spinning.saturating_sub(e.spinning),
                        sleeping: w.sleeping.saturating_sub(e.sleeping),
                        moved_away: w.moved_away.saturating_sub(e.moved_away),
                        ..w.clone()
                    },
                    None => w.clone(),
                },
            )
            .collect();
        let mut types: Vec<TypeStats> = self
            .types
            .iter()
            .map(|t| {
                let e = earlier.types.iter().find(|e| e.type_name == t.type_name);
                TypeStats {
                    type_name: t.type_name,
                    requests: t.requests.saturating_sub(e.map_or(0, |e| e.requests)),
                    time: t.time.saturating_sub(e.map_or(Duration::ZERO, |e| e.time)),
                }
            })
            .filter(|t| t.requests > 0)
            .collect();
        types.sort_by_key(|t| std::cmp::Reverse(t.requests));
        let mut hottest: Vec<PropertyStats> = self
            .hottest
            .iter()
            .map(|p| {
                let e = earlier
                    .hottest
                    .iter()
                    .find(|e| e.id == p.id && e.worker == p.worker);
                PropertyStats {
                    requests: p.requests.saturating_sub(e.map_or(0, |e| e.requests)),
                    ..p.clone()
                }
            })
            .filter(|p| p.requests > 0)
            .collect();
        hottest.sort_by_key(|p| std::cmp::Reverse(p.requests));
        Stats {
            uptime: self.uptime.saturating_sub(earlier.uptime),
            workers,
            types,
            hottest,
        }
    }
}

/// A record of a sampled batch: its property's type name, the property, how long it ran.
pub(crate) type SampledRecord = (fn() -> &'static str, usize, Duration);

/// A worker's counters. Only the worker writes the first cache line; properties are entrusted
/// to it from any thread, so their count has a line of its own.
#[derive(Default)]
pub(crate) struct WorkerCounters {
    own: OwnCounters,
    entrusted: Entrusted,
    sampled: Mutex<Sampled>,
    /// The worker thread's schedstat file (see `started`), for the CPU time it got.
    schedstat: OnceLock<Option<File>>,
}

#[derive(Default)]
#[repr(align(128))]
struct OwnCounters {
    requests: AtomicU64,
    inline: AtomicU64,
    batches: AtomicU64,
    spinning_ns: AtomicU64,
    sleeping_ns: AtomicU64,
    runnable: AtomicU64,
    fibers: AtomicU64,
    freed: AtomicU64,
    moved_away: AtomicU64,
    /// When its current sleep began, in nanoseconds since the runtime started, plus one; 0
    /// while it is awake. Lets a snapshot count a sleep still going on.
    asleep_since: AtomicU64,
}

#[derive(Default)]
#[repr(align(128))]
struct Entrusted(AtomicU64);

/// A worker's running totals, kept in its own cells between publications.
#[derive(Default)]
pub(crate) struct Totals {
    /// Requests run in batches, and batches.
    pub(crate) batched: Cell<u64>,
    pub(crate) batches: Cell<u64>,
    /// Requests run without a batch.
    pub(crate) inline: Cell<u64>,
}

/// Adds `n` to a counter only its owner writes: a load and a store, no read-modify-write.
#[inline(always)]
fn bump(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

impl WorkerCounters {
    /// Publishes the worker's running totals, which it keeps in its own cells and hands
    /// over here every few rounds and before it waits (see `Worker::publish_counts`).
    /// Worker only.
    pub(crate) fn publish(&self, totals: &Totals, runnable: usize, fibers: usize) {
        let own = &self.own;
        let (batched, inline) = (totals.batched.get(), totals.inline.get());
        own.requests.store(batched + inline, Ordering::Relaxed);
        own.inline.store(inline, Ordering::Relaxed);
        own.batches.store(totals.batches.get(), Ordering::Relaxed);
        own.runnable.store(runnable as u64, Ordering::Relaxed);
        own.fibers.store(fibers as u64, Ordering::Relaxed);
    }

    /// The worker's thread started. Worker only.
    pub(crate) fn started(&self) {
        let _ = self.schedstat.set(SchedStat::open_own());
    }

    /// The scheduler's totals for the worker's thread (how long it ran, how long it waited
    /// for a CPU), where they can be read.
    pub(crate) fn sched_stat(&self) -> Option<SchedStat> {
        SchedStat::read(self.schedstat.get()?.as_ref()?)
    }

    /// The worker goes to sleep now, `since_start` after the runtime started. Worker only.
    pub(crate) fn falls_asleep(&self, since_start: Duration) {
        let ns = since_start.as_nanos() as u64 + 1;
        self.own.asleep_since.store(ns, Ordering::Relaxed);
    }

    /// An idle wait ended. Worker only.
    pub(crate) fn waited(&self, spinning: Duration, sleeping: Duration) {
        // Cleared first: a snapshot in between misses this sleep rather than counting it twice.
        self.own.asleep_since.store(0, Ordering::Relaxed);
        bump(&self.own.spinning_ns, spinning.as_nanos() as u64);
        bump(&self.own.sleeping_ns, sleeping.as_nanos() as u64);
    }

    /// A property entrusted to this worker's trustee, or moved to it (any thread).
    pub(crate) fn entrusted(&self) {
        self.entrusted.0.fetch_add(1, Ordering::Relaxed);
    }

    /// A property freed by this worker's trustee. Worker only.
    pub(crate) fn freed(&self) {
        bump(&self.own.freed, 1);
    }

    /// A property moved away from this worker's trustee. Worker only.
    pub(crate) fn moved_away(&self) {
        bump(&self.own.moved_away, 1);
    }

    /// Tallies the records of a sampled batch: `(type name, property, time)` each.
    /// The property at `property` has left this worker (freed, or moved away): its hot slot
    /// goes, so that every property in the table is alive and lives here (`rebalance` relies
    /// on it). Worker only.
    pub(crate) fn forget(&self, property: usize) {
        let mut sampled = self.sampled.lock().unwrap_or_else(|e| e.into_inner());
        sampled.hot.retain(|s| s.property != property);
    }

    /// Whether the property at `property` holds a hot slot here. On this worker, a yes means
    /// it is alive and lives here (see `forget`).
    pub(crate) fn is_hot(&self, property: usize) -> bool {
        let sampled = self.sampled.lock().unwrap_or_else(|e| e.into_inner());
        sampled.hot.iter().any(|s| s.property == property)
    }

    pub(crate) fn sample(&self, records: &[SampledRecord]) {
        let mut sampled = self.sampled.lock().unwrap_or_else(|e| e.into_inner());
        for &(name, property, time) in records {
            sampled.add(name, property, time);
        }
    }

    fn snapshot(&self, worker: usize, trustee: bool, uptime: Duration) -> WorkerStats {
        let own = &self.own;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        // A sleep still going on counts up to now (its end adds it for good).
        let asleep = match load(&own.asleep_since) {
            0 => Duration::ZERO,
            since => uptime.saturating_sub(Duration::from_nanos(since - 1)),
        };
        WorkerStats {
            worker,
            trustee,
            requests: load(&own.requests),
            inline: load(&own.inline),
            batches: load(&own.batches),
            spinning: Duration::from_nanos(load(&own.spinning_ns)),
            sleeping: Duration::from_nanos(load(&own.sleeping_ns)) + asleep,
            runnable_fibers: load(&own.runnable),
            fibers: load(&own.fibers),
            properties: load(&self.entrusted.0)
                .saturating_sub(load(&own.freed) + load(&own.moved_away)),
            moved_away: load(&own.moved_away),
        }
    }
}

/// A worker's sampled tallies.
#[derive(Default)]
struct Sampled {
    /// By the type's `type_name` function (one type may have several copies of it; the
    /// snapshot merges them by name). Programs have few property types: a list suffices.
    types: Vec<TypeTally>,
    hot: Vec<HotSlot>,
}

struct TypeTally {
    name: fn() -> &'static str,
    requests: u64,
    time: Duration,
}

struct HotSlot {
    property: usize,
    name: fn() -> &'static str,
    count: u64,
    error: u64,
}

impl Sampled {
    fn add(&mut self, name: fn() -> &'static str, property: usize, time: Duration) {
        let tally = match self
            .types
            .iter()
            .position(|t| std::ptr::fn_addr_eq(t.name, name))
        {
            Some(i) => &mut self.types[i],
            None => {
                self.types.push(TypeTally {
                    name,
                    requests: 0,
                    time: Duration::ZERO,
                });
                self.types.last_mut().expect("just pushed")
            }
        };
        tally.requests += 1;
        tally.time += time;
        if let Some(slot) = self.hot.iter_mut().find(|s| s.property == property) {
            slot.count += 1;
        } else if self.hot.len() < HOT_SLOTS {
            self.hot.push(HotSlot {
                property,
                name,
                count: 1,
                error: 0,
            });
        } else if let Some(least) = self.hot.iter_mut().min_by_key(|s| s.count) {
            *least = HotSlot {
                property,
                name,
                count: least.count + 1,
                error: least.count,
            };
        }
    }
}

/// The snapshot of every worker's counters.
pub(crate) fn snapshot(counters: &[WorkerCounters], trustees: &[usize], started: Instant) -> Stats {
    let uptime = started.elapsed();
    let workers: Vec<WorkerStats> = counters
        .iter()
        .enumerate()
        .map(|(i, c)| c.snapshot(i, trustees.contains(&i), uptime))
        .collect();
    let mut types: Vec<TypeStats> = Vec::new();
    let mut hottest = Vec::new();
    for (worker, c) in counters.iter().enumerate() {
        let sampled = c.sampled.lock().unwrap_or_else(|e| e.into_inner());
        let in_samples: u64 = sampled.types.iter().map(|t| t.requests).sum();
        if in_samples == 0 {
            continue;
        }
        // The worker's requests, shared out in the proportions of its samples.
        let requests = workers[worker].requests;
        let scale = |n: u128| (n * u128::from(requests) / u128::from(in_samples)) as u64;
        for tally in &sampled.types {
            let type_name = (tally.name)();
            let requests = scale(u128::from(tally.requests));
            let time = Duration::from_nanos(scale(tally.time.as_nanos()));
            match types.iter_mut().find(|t| t.type_name == type_name) {
                Some(t) => {
                    t.requests += requests;
                    t.time += time;
                }
                None => types.push(TypeStats {
                    type_name,
                    requests,
                    time,
                }),
            }
        }
        hottest.extend(sampled.hot.iter().map(|s| PropertyStats {
            type_name: (s.name)(),
            worker,
            id: s.property,
            requests: scale(u128::from(s.count)),
            error: scale(u128::from(s.error)),
        }));
    }
    types.sort_by_key(|t| std::cmp::Reverse(t.requests));
    hottest.sort_by_key(|p| std::cmp::Reverse(p.requests));
    Stats {
        uptime,
        workers,
        types,
        hottest,
    }
}
