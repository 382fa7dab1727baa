//! The ranks' side of `bench rangelock`: rank 0 holds one system's lock and answers the
//! parent's commands; the client ranks run the client fibers.
//!
//! Commands (answers follow `ok`):
//! - `rl-setup SYSTEM`: makes the system's lock on this rank (and a shadow region for the
//!   checker);
//! - `rl-m WRITES HOLD_US CLIENTS WINDOW_MS SEED CHECK`: workload M;
//! - `rl-o WINDOW_MS SEED CHECK`: workload O;
//!   both answer `OPS SECS P50_US P99_US TRIPS FAIRNESS SPUN_NS` (`SPUN_NS`: how long this
//!   rank's workers spun idle meanwhile) after checking that the lock ended idle (and, with
//!   `CHECK` = 1, that no holder saw a conflicting one);
//! - `rl-l COUNT`: workload L, answers the p50 and p99 (µs) of an RPC, a one-sided read and a
//!   one-sided atomic from rank 1 to this rank.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use gossamer::{Node, Region};
use rangelock::{FlagSpacing, Guard, Mode, Notify, RangeLock};
use serde::{Deserialize, Serialize};

use super::citron::{Citron, CitronHeld, Leaves};
use super::launch::{Launch, LaunchHeld};
use super::segments::{Segments, SegmentsHeld};
use super::tree::{TreeHeld, TreeServer};
use crate::rack::Rng;

/// The lock's units (the seed's 2¹⁶).
const UNITS: u64 = 1 << 16;
/// Longest range (the seed's 2¹¹).
const LONGEST: u64 = 1 << 11;
/// Latency samples kept per client rank and run.
const SAMPLES: usize = 20_000;
/// Workload O: units per file (the seed's 2¹⁶ in 9 files).
const FILE: u64 = 7_281;
const DATA_FILES: u64 = 8;
/// Workload O: clients, and which are the log writer and the writers (the rest read).
pub(crate) const O_CLIENTS: u64 = 49;
const O_WRITERS: u64 = 9;
/// A shadow word's bit for a writer (the low bits count readers, or name the writer).
const WRITER: u64 = 1 << 63;

/// One system's lock, as the clients use it.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) enum Lock {
    Trustee(RangeLock),
    Launch(Launch),
    Tree(TreeServer),
    Segments(Segments),
    Citron(Citron),
}

enum Held {
    Guard(Guard),
    Launch(LaunchHeld),
    Tree(TreeHeld),
    Segments(SegmentsHeld),
    Citron(CitronHeld),
}

impl Lock {
    /// The lock of the system `word` names, on this node.
    fn make(word: &str) -> anyhow::Result<Lock> {
        let node = gossamer::this_node();
        let trustee = |notify| Lock::Trustee(RangeLock::entrust_on(node, UNITS).notify(notify));
        Ok(match word {
            "deferred" => trustee(Notify::Deferred),
            "poll-rpc" => trustee(Notify::PollRpc),
            "poll-byte" => trustee(Notify::PollFlag(FlagSpacing::Byte)),
            "poll-line" => trustee(Notify::PollFlag(FlagSpacing::Line)),
            "launch" => Lock::Launch(Launch::new(node, UNITS)?),
            "tree-1" => Lock::Tree(TreeServer::new(node, 1)?),
            "tree-2" => Lock::Tree(TreeServer::new(node, 2)?),
            "segments" => Lock::Segments(Segments::new(node, UNITS)?),
            "citron" => Lock::Citron(Citron::new(node, UNITS, Leaves::Bitmaps)?),
            "citron-internal" => Lock::Citron(Citron::new(node, UNITS, Leaves::AllInternal)?),
            other => bail!("unknown range-lock system {other}"),
        })
    }

    fn lock(&self, client: u64, range: Range<u64>, mode: Mode, trips: &mut u64) -> Held {
        match self {
            // Counted by the lock itself (`rangelock::round_trips`).
            Lock::Trustee(l) => Held::Guard(
                l.lock(range, mode)
                    .unwrap_or_else(|e| panic!("a workload's range: {e}")),
            ),
            Lock::Launch(l) => Held::Launch(l.lock(range, mode, trips)),
            Lock::Tree(l) => Held::Tree(l.lock(client, range, mode, trips)),
            Lock::Segments(l) => Held::Segments(l.lock(range, mode, trips)),
            Lock::Citron(l) => Held::Citron(l.lock(range, mode, trips)),
        }
    }

    fn unlock(&self, held: Held, trips: &mut u64) {
        match (self, held) {
            (Lock::Trustee(_), Held::Guard(g)) => drop(g),
            (Lock::Launch(l), Held::Launch(h)) => l.unlock(h),
            (Lock::Tree(l), Held::Tree(h)) => l.unlock(h),
            (Lock::Segments(l), Held::Segments(h)) => l.unlock(h, trips),
            (Lock::Citron(l), Held::Citron(h)) => l.unlock(h, trips),
            _ => unreachable!("a lock releases what it granted"),
        }
    }

    /// Waits (bounded) until every release has landed and the lock is idle.
    fn wait_idle(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let idle = match self {
                Lock::Trustee(l) => (l.requests() == 0)
                    .then_some(())
                    .context("the lock's table is not empty"),
                Lock::Launch(l) => l.check_idle(),
                Lock::Tree(l) => l.check_idle(),
                Lock::Segments(l) => l.check_idle(),
                Lock::Citron(l) => l.check_idle(),
            };
            match idle {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(e.context("the lock never became idle after its clients ended"));
                }
                Err(_) => gossamer::yield_now(),
            }
        }
    }
}

/// What the clients do.
#[derive(Clone, Copy, Serialize, Deserialize)]
enum Workload {
    /// §5.2.2: uniform ranges of 1..2¹¹ units, `writes` percent writes, held `hold_us`.
    M { writes: u64, hold_us: u64 },
    /// §5.2.3: the OLTP-like mix of readers, writers and a log writer.
    O,
}

/// A client's role in workload O (M has only readers-or-writers, one role).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Any,
    Reader,
    Writer(u64),
    LogWriter,
}

impl Role {
    /// The role's name in results: writers are one role whichever file they start at.
    fn name(self) -> &'static str {
        match self {
            Role::Any => "any",
            Role::Reader => "reader",
            Role::Writer(_) => "writer",
            Role::LogWriter => "log writer",
        }
    }
}

fn role_of(workload: Workload, client: u64) -> Role {
    match workload {
        Workload::M { .. } => Role::Any,
        Workload::O if client == 0 => Role::LogWriter,
        Workload::O if client <= O_WRITERS => Role::Writer(client - 1),
        Workload::O => Role::Reader,
    }
}

/// One client rank's share of a run.
#[derive(Clone, Serialize, Deserialize)]
struct Job {
    lock: Lock,
    workload: Workload,
    /// This rank's clients (numbers across the run).
    clients: Vec<u64>,
    window_ms: u64,
    seed: u64,
    /// The checker's words, one per unit, when checking.
    shadow: Option<Region>,
}

/// What a client rank returns.
#[derive(Serialize, Deserialize)]
struct RankResult {
    /// (client, role as text, locks).
    counts: Vec<(u64, String, u64)>,
    /// Lock call → grant, ns.
    samples: Vec<u32>,
    trips: u64,
    secs: f64,
    violations: Vec<String>,
}

/// Rank 0's state: the system's lock, once made.
#[derive(Default)]
pub(crate) struct Server {
    lock: Option<(Lock, Region)>,
}

impl Server {
    /// Answers one `rl-*` command.
    pub(crate) fn command(&mut self, words: &[&str]) -> anyhow::Result<String> {
        match words {
            ["rl-setup", system] => {
                ensure!(self.lock.is_none(), "this rank already holds a lock");
                let shadow = gossamer::this_node()
                    .region(UNITS as usize)
                    .context("the checker's region")?;
                self.lock = Some((Lock::make(system)?, shadow));
                Ok("set".into())
            }
            ["rl-m", writes, hold, clients, window, seed, check] => {
                let workload = Workload::M {
                    writes: writes.parse()?,
                    hold_us: hold.parse()?,
                };
                self.run(
                    workload,
                    clients.parse()?,
                    window.parse()?,
                    seed.parse()?,
                    check,
                )
            }
            ["rl-o", window, seed, check] => self.run(
                Workload::O,
                O_CLIENTS,
                window.parse()?,
                seed.parse()?,
                check,
            ),
            ["rl-l", count] => latencies(count.parse()?),
            _ => bail!("unknown range-lock command {words:?}"),
        }
    }

    fn run(
        &mut self,
        workload: Workload,
        clients: u64,
        window_ms: u64,
        seed: u64,
        check: &str,
    ) -> anyhow::Result<String> {
        let (lock, shadow) = self.lock.as_ref().context("rl-setup first")?;
        let check = check == "1";
        let spun_before = spin_time().context("rank 0's commands run on a worker")?;
        let ranks: Vec<Node> = gossamer::nodes().filter(|n| n.rank() != 0).collect();
        ensure!(!ranks.is_empty(), "rangelock needs client ranks");
        // Client c runs on client rank c mod ranks: both ranks get every role.
        let runs: Vec<_> = ranks
            .iter()
            .enumerate()
            .filter_map(|(i, &n)| {
                let mine: Vec<u64> = (0..clients)
                    .filter(|c| *c as usize % ranks.len() == i)
                    .collect();
                (!mine.is_empty()).then(|| {
                    let job = Job {
                        lock: lock.clone(),
                        workload,
                        clients: mine,
                        window_ms,
                        seed: seed * 16 + i as u64,
                        shadow: check.then(|| shadow.clone()),
                    };
                    gossamer::spawn_on(n, client_rank, job)
                })
            })
            .collect();
        let (mut counts, mut samples, mut trips, mut secs) = (Vec::new(), Vec::new(), 0, 0f64);
        let mut violations = Vec::new();
        for r in runs {
            let done = r.join();
            counts.extend(done.counts);
            samples.extend(done.samples);
            trips += done.trips;
            secs = secs.max(done.secs);
            violations.extend(done.violations);
        }
        ensure!(
            violations.is_empty(),
            "the checker saw {} conflicting holds, first: {}",
            violations.len(),
            violations[0]
        );
        lock.wait_idle()?;
        if check {
            let words = shadow.get(0, UNITS as usize).wait()?;
            if let Some(u) = words.iter().position(|&w| w != 0) {
                bail!("the checker's unit {u} is still stamped {:#x}", words[u]);
            }
        }
        let ops: u64 = counts.iter().map(|c| c.2).sum();
        ensure!(ops > 0, "no lock was granted in the window");
        let mut hist = hdrhistogram::Histogram::<u64>::new(3)?;
        for s in &samples {
            hist.record(u64::from(*s).max(1))?;
        }
        let spun = spin_time().context("on a worker")? - spun_before;
        Ok(format!(
            "{ops} {secs} {} {} {trips} {} {}",
            hist.value_at_quantile(0.5) as f64 / 1e3,
            hist.value_at_quantile(0.99) as f64 / 1e3,
            fairness(&counts),
            spun.as_nanos(),
        ))
    }
}

/// The least locks of one client over its role's mean, worst role (the log writer, alone in
/// its role, is 1 by definition).
fn fairness(counts: &[(u64, String, u64)]) -> f64 {
    let mut roles: Vec<&str> = counts.iter().map(|c| c.1.as_str()).collect();
    roles.sort_unstable();
    roles.dedup();
    roles
        .iter()
        .map(|role| {
            let mine: Vec<u64> = counts
                .iter()
                .filter(|c| c.1 == *role)
                .map(|c| c.2)
                .collect();
            let mean = mine.iter().sum::<u64>() as f64 / mine.len() as f64;
            *mine.iter().min().expect("a role has clients") as f64 / mean.max(1e-9)
        })
        .fold(f64::INFINITY, f64::min)
}

/// A client rank: its clients as fibers for the window.
fn client_rank(job: Job) -> RankResult {
    let started = Instant::now();
    let trips_before = rangelock::round_trips();
    let readers = job
        .clients
        .iter()
        .filter(|&&c| role_of(job.workload, c) == Role::Reader)
        .count() as u64;
    let reads = Arc::new(AtomicU64::new(0));
    let per_fiber = SAMPLES / job.clients.len() + 1;
    let fibers: Vec<_> = job
        .clients
        .iter()
        .map(|&c| {
            let job = job.clone();
            let reads = reads.clone();
            gossamer::spawn(move || client(&job, c, started, &reads, readers, per_fiber))
        })
        .collect();
    let mut done = RankResult {
        counts: Vec::new(),
        samples: Vec::new(),
        trips: 0,
        secs: 0.0,
        violations: Vec::new(),
    };
    for (f, &c) in fibers.into_iter().zip(&job.clients) {
        let (count, samples, trips, violations) = f.join();
        done.counts
            .push((c, role_of(job.workload, c).name().to_string(), count));
        done.samples.extend(samples);
        done.trips += trips;
        done.violations.extend(violations);
    }
    done.trips += rangelock::round_trips() - trips_before;
    done.secs = started.elapsed().as_secs_f64();
    done
}

/// One client: (locks, latency samples, round trips, checker violations).
fn client(
    job: &Job,
    me: u64,
    started: Instant,
    reads: &AtomicU64,
    readers: u64,
    keep: usize,
) -> (u64, Vec<u32>, u64, Vec<String>) {
    let end = started + Duration::from_millis(job.window_ms);
    let role = role_of(job.workload, me);
    let mut rng = Rng::new(job.seed * 1024 + me + 1);
    let (mut count, mut samples, mut trips, mut violations) = (0u64, Vec::new(), 0u64, Vec::new());
    while Instant::now() < end {
        let Some((range, mode, hold)) = next(job.workload, role, count, &mut rng, reads, readers)
        else {
            // Paced: wait for the readers.
            gossamer::yield_now();
            continue;
        };
        let asked = Instant::now();
        let held = job.lock.lock(me, range.clone(), mode, &mut trips);
        if samples.len() < keep {
            samples.push(asked.elapsed().as_nanos().min(u128::from(u32::MAX)) as u32);
        }
        if let Some(shadow) = &job.shadow {
            stamp(shadow, &range, mode, me, Stamp::Grant, &mut violations);
        }
        let until = Instant::now() + hold;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        if let Some(shadow) = &job.shadow {
            stamp(shadow, &range, mode, me, Stamp::Release, &mut violations);
        }
        job.lock.unlock(held, &mut trips);
        count += 1;
        if role == Role::Reader {
            reads.fetch_add(1, Ordering::Relaxed);
        }
        // Clients are independent: one whose locks never wait (one-sided atomics on shared
        // memory complete at once) must not keep its worker from the others.
        gossamer::yield_now();
    }
    (count, samples, trips, violations)
}

/// The client's next request, or `None` while its pace holds it back.
fn next(
    workload: Workload,
    role: Role,
    done: u64,
    rng: &mut Rng,
    reads: &AtomicU64,
    readers: u64,
) -> Option<(Range<u64>, Mode, Duration)> {
    let within = |file: u64, len: u64, rng: &mut Rng| {
        let start = file * FILE + rng.below(FILE - len + 1);
        start..start + len
    };
    // This rank's reads per reader, and all readers' reads as this rank's share suggests.
    let per_reader = reads.load(Ordering::Relaxed) / readers.max(1);
    Some(match (workload, role) {
        (Workload::M { writes, hold_us }, _) => {
            let len = 1 + rng.below(LONGEST);
            let start = rng.below(UNITS - len + 1);
            let mode = if rng.below(100) < writes {
                Mode::Write
            } else {
                Mode::Read
            };
            (start..start + len, mode, Duration::from_micros(hold_us))
        }
        (Workload::O, Role::Reader) => (
            within(rng.below(DATA_FILES), 1 << 6, rng),
            Mode::Read,
            Duration::ZERO,
        ),
        // 100 writes per 1,000 reads of each reader; the files in turn.
        (Workload::O, Role::Writer(w)) => {
            if done * 10 > per_reader {
                return None;
            }
            let file = (w + done) % DATA_FILES;
            (within(file, 1 << 6, rng), Mode::Write, Duration::ZERO)
        }
        // One lock per 3,200 reads of all readers.
        (Workload::O, _) => {
            let all_reads = per_reader * (O_CLIENTS - 1 - O_WRITERS);
            if done * 3_200 > all_reads {
                return None;
            }
            (
                within(DATA_FILES, LONGEST, rng),
                Mode::Write,
                Duration::ZERO,
            )
        }
    })
}

/// When the checker looks at a hold.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stamp {
    /// At the grant: a write stamps each unit with its client (every unit must have been
    /// free), a read counts itself in (no unit may be under a write).
    Grant,
    /// Before the release: the stamps must still be this client's; they are taken off.
    Release,
}

/// A checker's operation on one unit, in flight.
enum Pending {
    Swap(gossamer::Done<Result<u64, u64>>),
    Add(gossamer::Done<u64>),
}

/// The checker: stamps or unstamps `range` in the shadow region, noting every conflict.
fn stamp(
    shadow: &Region,
    range: &Range<u64>,
    mode: Mode,
    me: u64,
    when: Stamp,
    violations: &mut Vec<String>,
) {
    let mine = WRITER | me;
    let done: Vec<_> = range
        .clone()
        .map(|u| u as usize)
        .map(|u| {
            let op = match (mode, when) {
                (Mode::Write, Stamp::Grant) => Pending::Swap(shadow.compare_exchange(u, 0, mine)),
                (Mode::Write, Stamp::Release) => Pending::Swap(shadow.compare_exchange(u, mine, 0)),
                // A read adds 1, then takes it off (adds 2⁶⁴ − 1); the word it saw tells.
                (Mode::Read, Stamp::Grant) => Pending::Add(shadow.fetch_add(u, 1)),
                (Mode::Read, Stamp::Release) => Pending::Add(shadow.fetch_add(u, u64::MAX)),
            };
            (u, op)
        })
        .collect();
    for (u, op) in done {
        let bad = match op {
            // A write's compare-and-swap fails on a word that is not what it expects.
            Pending::Swap(d) => d.wait().expect("checker region").err(),
            // A read must see no writer, and at its release at least itself.
            Pending::Add(d) => {
                let word = d.wait().expect("checker region");
                (word & WRITER != 0 || (when == Stamp::Release && word == 0)).then_some(word)
            }
        };
        if let Some(word) = bad {
            let what = if mode == Mode::Write { "write" } else { "read" };
            violations.push(match when {
                Stamp::Grant => format!(
                    "client {me} was granted a {what} of unit {u}, held {}",
                    holder(word)
                ),
                Stamp::Release => format!(
                    "client {me}'s {what} of unit {u} was overrun: {}",
                    holder(word)
                ),
            });
        }
    }
}

fn holder(word: u64) -> String {
    if word & WRITER != 0 {
        format!("by a write of client {}", word & !WRITER)
    } else {
        format!("by {word} reads")
    }
}

/// Workload L (the seed's Table 5): from rank 1, `count` each of an RPC (a call to a property
/// on this rank, 8 bytes there and back), a one-sided read of one word and a one-sided
/// fetch-add, one at a time. Answers p50 and p99 of each, µs.
fn latencies(count: u64) -> anyhow::Result<String> {
    let here = gossamer::this_node();
    let target = (here.entrust(0u64), here.region(1)?);
    let client = gossamer::nodes()
        .find(|n| n.rank() == 1)
        .context("rank 1")?;
    let hists = gossamer::spawn_on(
        client,
        |(count, (probe, word)): (u64, (gossamer::Trust<u64>, Region))| {
            let mut out = Vec::new();
            for op in 0..3 {
                let mut hist = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
                for i in 0..count + count / 10 {
                    let t = Instant::now();
                    match op {
                        0 => {
                            probe.apply_with(|p: &mut u64, x: u64| *p ^ x, i);
                        }
                        1 => {
                            word.get(0, 1).wait().expect("read");
                        }
                        _ => {
                            word.fetch_add(0, 1).wait().expect("atomic");
                        }
                    }
                    // The first tenth warms up.
                    if i >= count / 10 {
                        let _ = hist.record(t.elapsed().as_nanos() as u64);
                    }
                }
                out.push(hist.value_at_quantile(0.5) as f64 / 1e3);
                out.push(hist.value_at_quantile(0.99) as f64 / 1e3);
            }
            out
        },
        (count, target),
    )
    .join();
    Ok(hists
        .iter()
        .map(f64::to_string)
        .collect::<Vec<_>>()
        .join(" "))
}

/// How long the workers of the caller's runtime have spun idle, summed; `None` off a worker.
fn spin_time() -> Option<std::time::Duration> {
    let stats = trust::Handle::current()?.stats();
    Some(stats.workers.iter().map(|w| w.spinning).sum())
}
