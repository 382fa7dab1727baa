//! The delegation systems, built on the `trust` runtime.
//!
//! *Shared* mode: every worker runs client fibers and is a trustee; objects are entrusted
//! round-robin. *Dedicated* mode: `dedicated_trustees(1)`, so on a two-core machine one worker only
//! serves as trustee (holding every object) and the other runs the clients.
//!
//! Two client styles: *apply + fibers* runs many fibers per client worker, each calling blocking
//! `apply` in a loop (only the fiber waits; the worker batches the requests of all its fibers);
//! *apply_then* runs one fiber per client worker that issues `apply_then` requests without waiting,
//! yielding every [`THEN_BATCH`] requests so the worker can publish them and run the `then`
//! callbacks, and blocking while more than [`MAX_OUTSTANDING`] are unanswered. The callbacks count
//! completions in worker-local cells, so they capture nothing.

use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, ensure};
use trust::{Group, JoinHandle, Runtime, Trust};

use crate::harness::{Ctx, Gate, run_window};
use crate::locks::Section;
use crate::map_workload::{OpChecks, Table, shard_of, valid, value_for};
use crate::open_loop::{ClientResult, LatRun, Schedule, summarize};
use crate::workload::Stream;

/// Whether the delegation systems are built in.
pub const AVAILABLE: bool = true;

/// Client fibers per worker in the *apply + fibers* style.
pub const FIBERS_PER_WORKER: usize = 32;
/// `apply_then` requests issued between yields.
pub const THEN_BATCH: u64 = 64;
/// Most unanswered `apply_then` requests per client fiber.
pub const MAX_OUTSTANDING: usize = 1024;

/// How trustees are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every worker is both client and trustee.
    Shared,
    /// One worker serves only as trustee.
    Dedicated,
}

/// How clients issue requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Many fibers per worker, each calling blocking `apply`.
    Fibers,
    /// One fiber per worker issuing `apply_then`.
    Then,
}

/// Name in plots and tables.
pub fn name(mode: Mode, style: Style) -> String {
    let mode = match mode {
        Mode::Shared => "shared",
        Mode::Dedicated => "dedicated",
    };
    let style = match style {
        Style::Fibers => "apply+fibers",
        Style::Then => "apply_then",
    };
    format!("trust {mode}, {style}")
}

/// Method note for the `faa` report.
pub const FAA_NOTE: &str = "Delegation (`trust`): *shared* — every worker runs clients and is a trustee, \
    objects entrusted round-robin; *dedicated* — `dedicated_trustees(1)`: one worker only serves as \
    trustee and holds every object, the other runs the clients. *apply+fibers*: 32 fibers per client \
    worker, each calling blocking `apply` in a loop; *apply_then*: one fiber per client worker issuing \
    `apply_then` (yielding every 64 requests, at most 1024 unanswered) whose `then` counts completions. \
    Each counter is its own `Trust<u64>`.";

/// Method note for the `latency` report.
pub const LATENCY_NOTE: &str = "Delegation (`trust`, shared and dedicated as in `faa`): 32 client fibers \
    per client worker, each with its own schedule, calling blocking `apply`; a fiber waiting for its next \
    scheduled time yields to the others.";

/// Method note for the map reports.
pub const MAP_NOTE: &str = "Trustee-sharded map (`trust`): one `std::collections::HashMap` per trustee, \
    the key's shard chosen by hash. *shared ×2*: both workers run clients and are trustees; *shared ×1*: \
    both run clients, the whole table on worker 0's trustee; *dedicated ×1*: one worker serves only as \
    trustee, the other runs the clients. One client fiber per client worker issues `apply_then` requests \
    (yielding every 64, at most 1024 unanswered); the `then` callbacks check the answers.";

/// The modes that fit `cores` cores: dedicated trustees need a second worker to run clients.
pub fn modes(cores: usize) -> Vec<Mode> {
    if cores > 1 {
        vec![Mode::Shared, Mode::Dedicated]
    } else {
        vec![Mode::Shared]
    }
}

fn runtime(mode: Mode, cores: usize) -> anyhow::Result<Runtime> {
    let builder = Runtime::builder()
        .workers(cores)
        .pin(crate::harness::pinning());
    let builder = match mode {
        Mode::Shared => builder,
        Mode::Dedicated => builder.dedicated_trustees(1),
    };
    builder
        .build()
        .map_err(|e| anyhow!("building the trust runtime: {e}"))
}

/// Joins fibers, turning a panic into an error.
fn join_all<R>(handles: Vec<JoinHandle<R>>) -> anyhow::Result<Vec<R>> {
    handles
        .into_iter()
        .map(|h| {
            catch_unwind(AssertUnwindSafe(|| h.join()))
                .map_err(|_| anyhow!("a benchmark fiber panicked"))
        })
        .collect()
}

/// Counts one `apply_then` completion on this worker.
fn count_done() {
    DONE.set(DONE.get() + 1);
}

/// After issuing a batch of requests: lets the worker publish them, then blocks while more
/// than [`MAX_OUTSTANDING`] are unanswered. Blocking (rather than polling with `yield_now`) lets
/// an idle worker give its core to a thread that shares it.
fn pace(group: &Group) {
    trust::yield_now();
    group.wait_until_pending_at_most(MAX_OUTSTANDING);
}

/// Counts the critical sections that ran on every object, reading them with `apply_then` from a
/// fiber (one round trip per object would take seconds for a million objects); `None` if any
/// object is in an impossible state.
fn sum_counters<T: Section>(
    rt: &Runtime,
    objs: &Arc<Vec<Trust<T>>>,
) -> anyhow::Result<Option<u64>> {
    let objs = Arc::clone(objs);
    let h = rt.spawn_on(0, move || {
        let sum = Rc::new(Cell::new(Some(0u64)));
        let group = Group::new();
        for (i, o) in (1u64..).zip(objs.iter()) {
            let s = Rc::clone(&sum);
            o.apply_then(
                |c| c.count(),
                group.track(move |v| s.set(s.get().zip(v).map(|(a, b)| a + b))),
            );
            if i % THEN_BATCH == 0 {
                pace(&group);
            }
        }
        group.wait();
        sum.get()
    });
    Ok(join_all(vec![h])?[0])
}

thread_local! {
    /// `apply_then` completions on this worker.
    static DONE: Cell<u64> = const { Cell::new(0) };
    /// Completions that returned an impossible value.
    static BAD: Cell<u64> = const { Cell::new(0) };
    /// Map answers checked on this worker.
    static CHECKS: RefCell<OpChecks> = RefCell::new(OpChecks::default());
}

/// Delegated throughput of `T`'s critical section for one window, Mops/s (after verifying the
/// objects).
pub fn faa<T: Section>(
    mode: Mode,
    style: Style,
    cores: usize,
    stream: &Stream,
    window: Duration,
) -> anyhow::Result<f64> {
    let rt = runtime(mode, cores)?;
    let objs: Arc<Vec<Trust<T>>> = Arc::new(
        (0..stream.objects())
            .map(|_| rt.entrust(T::default()))
            .collect(),
    );
    let gate = Arc::new(Gate::new());
    let clients = rt.client_workers();
    let mut handles = Vec::new();
    let mut who = 0;
    for w in 0..clients {
        let fibers = if style == Style::Fibers {
            FIBERS_PER_WORKER
        } else {
            1
        };
        for _ in 0..fibers {
            let (objs, gate, stream) = (Arc::clone(&objs), Arc::clone(&gate), stream.clone());
            handles.push(rt.spawn_on(w, move || {
                let mut cursor = stream.cursor(who);
                gate.arrive_and_wait_with(trust::yield_now);
                match style {
                    Style::Fibers => {
                        let (mut ops, mut zero) = (0u64, 0u64);
                        loop {
                            for _ in 0..8 {
                                zero += u64::from(objs[cursor.next_index()].apply(T::enter) == 0);
                            }
                            ops += 8;
                            if gate.stopped() {
                                break;
                            }
                        }
                        (ops, ops, zero)
                    }
                    Style::Then => {
                        DONE.set(0);
                        BAD.set(0);
                        let group = Group::new();
                        let mut issued = 0u64;
                        loop {
                            for _ in 0..THEN_BATCH {
                                objs[cursor.next_index()].apply_then(
                                    T::enter,
                                    group.track(|v| {
                                        if v == 0 {
                                            BAD.set(BAD.get() + 1);
                                        }
                                        count_done();
                                    }),
                                );
                            }
                            issued += THEN_BATCH;
                            pace(&group);
                            if gate.stopped() {
                                break;
                            }
                        }
                        group.wait();
                        (issued, DONE.get(), BAD.get())
                    }
                }
            }));
            who += 1;
        }
    }
    let t0 = gate.open_when(handles.len());
    run_window(&gate, window);
    let results = join_all(handles)?;
    let elapsed = t0.elapsed();
    let label = name(mode, style);
    let mut ops = 0;
    for (issued, completed, bad) in results {
        ensure!(
            issued == completed,
            "{label}: {issued} requests issued but {completed} completions ran"
        );
        ensure!(
            bad == 0,
            "{label}: {bad} fetch-and-adds returned 0 after an increment"
        );
        ops += completed;
    }
    let total = sum_counters(&rt, &objs)?;
    ensure!(
        total == Some(ops),
        "{label}: objects count {total:?} critical sections but {ops} completed (lost, torn or phantom updates)"
    );
    drop(objs);
    drop(rt);
    Ok(ops as f64 / elapsed.as_secs_f64() / 1e6)
}

/// Delegated fetch-and-add latency at one offered load (open loop, fibers calling `apply`).
pub fn latency(
    mode: Mode,
    cores: usize,
    stream: &Stream,
    offered_mops: f64,
    window: Duration,
) -> anyhow::Result<LatRun> {
    let rt = runtime(mode, cores)?;
    let objs: Arc<Vec<Trust<u64>>> =
        Arc::new((0..stream.objects()).map(|_| rt.entrust(0u64)).collect());
    let clients = rt.client_workers();
    let schedules = Schedule::split(clients * FIBERS_PER_WORKER, offered_mops, window);
    let gate = Arc::new(Gate::new());
    let handles: Vec<_> = schedules
        .into_iter()
        .enumerate()
        .map(|(i, sched)| {
            let (objs, stream, gate) = (Arc::clone(&objs), stream.clone(), Arc::clone(&gate));
            rt.spawn_on(i % clients, move || {
                let mut cursor = stream.cursor(i);
                ClientResult::drive(
                    &sched,
                    &gate,
                    || {
                        objs[cursor.next_index()].apply(u64::enter);
                    },
                    trust::yield_now,
                )
            })
        })
        .collect();
    gate.open_when(handles.len());
    let results = join_all(handles)?;
    let (run, completed) = summarize(results, offered_mops)?;
    let total = sum_counters(&rt, &objs)?;
    ensure!(
        total == Some(completed),
        "{}: counters sum to {total:?} but {completed} requests completed (lost or phantom updates)",
        name(mode, Style::Fibers)
    );
    drop(objs);
    drop(rt);
    Ok(run)
}

/// A trustee-sharded map configuration.
#[derive(Debug, Clone, Copy)]
pub struct MapConfig {
    /// Trustee placement.
    pub mode: Mode,
    /// Number of trustees holding shards (one shard each).
    pub trustees: usize,
}

impl MapConfig {
    /// Name in plots and tables.
    pub fn name(self) -> String {
        match self.mode {
            Mode::Shared => format!("trust shared ×{}", self.trustees),
            Mode::Dedicated => format!("trust dedicated ×{}", self.trustees),
        }
    }
}

/// The trustee-sharded map configurations measured on a machine with `cores` cores.
pub fn map_configs(cores: usize) -> Vec<MapConfig> {
    let mut v = vec![MapConfig {
        mode: Mode::Shared,
        trustees: cores,
    }];
    if cores > 1 {
        v.push(MapConfig {
            mode: Mode::Shared,
            trustees: 1,
        });
        v.push(MapConfig {
            mode: Mode::Dedicated,
            trustees: (cores / 4).max(1),
        });
    }
    v
}

/// Builds the trustee-sharded map with `n` keys, measures `ctx.runs` windows at each write share,
/// verifies the table, and returns the samples (Mops/s) per write share.
pub fn measure_map(
    cfg: MapConfig,
    ctx: &Ctx,
    n: usize,
    stream: &Stream,
    write_shares: &[u32],
) -> anyhow::Result<Vec<Vec<f64>>> {
    let label = cfg.name();
    let dedicated = if cfg.mode == Mode::Dedicated {
        cfg.trustees
    } else {
        0
    };
    let rt = Runtime::builder()
        .workers(ctx.cores)
        .pin(crate::harness::pinning())
        .dedicated_trustees(dedicated)
        .build()
        .map_err(|e| anyhow!("building the trust runtime: {e}"))?;
    ctx.status(format!(
        "{label} prefill {}",
        crate::figure::count(n as f64)
    ));
    let trustees = rt.trustees();
    ensure!(
        trustees.len() >= cfg.trustees,
        "{label}: runtime has only {} trustees",
        trustees.len()
    );
    let mut tables: Vec<Table> = (0..cfg.trustees)
        .map(|_| Table::with_capacity(n / cfg.trustees + 1))
        .collect();
    for k in 0..n as u64 {
        tables[shard_of(k, cfg.trustees)].insert(k, value_for(k, 0));
    }
    let shards: Arc<Vec<Trust<Table>>> = Arc::new(
        tables
            .into_iter()
            .zip(&trustees)
            .map(|(t, trustee)| trustee.entrust(t))
            .collect(),
    );
    let mut out = Vec::new();
    for &w in write_shares {
        let mut samples = Vec::new();
        for rep in 0..ctx.runs {
            ctx.status(format!(
                "{label} n={} writes={w}% run {}",
                crate::figure::count(n as f64),
                rep + 1
            ));
            samples.push(map_window(
                &rt, &shards, stream, w, ctx.window, rep as u64, &label,
            )?);
            ctx.tick();
        }
        out.push(samples);
    }
    ctx.status(format!("{label} verify"));
    let (mut len, mut bad, mut out_of_range) = (0, 0, 0);
    for shard in shards.iter() {
        let (l, b, o) = shard.apply(|m| {
            let bad = m.iter().filter(|(k, v)| !valid(**k, v)).count();
            let out = m.keys().filter(|k| **k >= n as u64).count();
            (m.len(), bad, out)
        });
        (len, bad, out_of_range) = (len + l, bad + b, out_of_range + o);
    }
    ensure!(
        len == n,
        "{label}: table holds {len} entries after the run, expected {n}"
    );
    ensure!(
        out_of_range == 0,
        "{label}: {out_of_range} keys outside 0..{n} after the run"
    );
    ensure!(
        bad == 0,
        "{label}: {bad} entries hold a value that was never written for their key"
    );
    drop(shards);
    drop(rt);
    Ok(out)
}

fn map_window(
    rt: &Runtime,
    shards: &Arc<Vec<Trust<Table>>>,
    stream: &Stream,
    write_percent: u32,
    window: Duration,
    seed: u64,
    label: &str,
) -> anyhow::Result<f64> {
    let gate = Arc::new(Gate::new());
    let handles: Vec<_> = (0..rt.client_workers())
        .map(|w| {
            let (shards, gate, stream) = (Arc::clone(shards), Arc::clone(&gate), stream.clone());
            rt.spawn_on(w, move || {
                let mut cursor = stream.cursor(w + seed as usize * 64);
                let mut stamp = (((seed << 8) | (w as u64 + 101)) << 40) | 1;
                CHECKS.with_borrow_mut(|c| *c = OpChecks::default());
                let group = Group::new();
                let n = shards.len();
                gate.arrive_and_wait_with(trust::yield_now);
                let mut issued = 0u64;
                loop {
                    for _ in 0..THEN_BATCH {
                        let key = cursor.next_index() as u64;
                        let shard = &shards[shard_of(key, n)];
                        if cursor.is_write(write_percent) {
                            stamp += 1;
                            let value = value_for(key, stamp);
                            shard.apply_then(
                                move |m| m.insert(key, value),
                                group.track(move |old| {
                                    CHECKS.with_borrow_mut(|c| c.wrote(key, old));
                                }),
                            );
                        } else {
                            shard.apply_then(
                                move |m| m.get(&key).copied(),
                                group.track(move |got| {
                                    CHECKS.with_borrow_mut(|c| c.read(key, got));
                                }),
                            );
                        }
                    }
                    issued += THEN_BATCH;
                    pace(&group);
                    if gate.stopped() {
                        break;
                    }
                }
                group.wait();
                (issued, CHECKS.with_borrow(|c| *c))
            })
        })
        .collect();
    let t0 = gate.open_when(handles.len());
    run_window(&gate, window);
    let results = join_all(handles)?;
    let elapsed = t0.elapsed();
    let mut checks = OpChecks::default();
    let mut issued = 0;
    for (i, c) in results {
        issued += i;
        checks.merge(&c);
    }
    ensure!(
        checks.reads + checks.writes == issued,
        "{label}: {issued} requests issued but {} answers checked",
        checks.reads + checks.writes
    );
    checks.ensure_clean(label)?;
    Ok(issued as f64 / elapsed.as_secs_f64() / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::locks::Block;
    use crate::workload::Dist;

    #[test]
    fn delegated_faa_counts_every_increment() {
        let stream = Stream::new(Dist::Zipf, 100, 7);
        for mode in modes(2) {
            for style in [Style::Fibers, Style::Then] {
                // faa checks every count itself. Whether any increment fits in the 10 ms
                // window depends on the machine's load, so the rate is not asserted.
                let window = Duration::from_millis(10);
                if let Err(e) = faa::<u64>(mode, style, 2, &stream, window) {
                    panic!("{}: {e:#}", name(mode, style));
                }
                if let Err(e) = faa::<Block>(mode, style, 2, &stream, window) {
                    panic!("{} on blocks: {e:#}", name(mode, style));
                }
            }
        }
    }

    #[test]
    fn delegated_latency_runs_clean() {
        let stream = Stream::new(Dist::Uniform, 64, 7);
        let r = latency(Mode::Shared, 2, &stream, 0.1, Duration::from_millis(10)).unwrap();
        assert!(r.mean_us > 0.0 && r.p999_us >= r.mean_us * 0.5);
    }

    #[test]
    fn trustee_sharded_map_checks_out() {
        let ctx = Ctx::new(true, 1, Duration::from_millis(10));
        let stream = Stream::new(Dist::Zipf, 1000, 7);
        for cfg in map_configs(2) {
            let samples = measure_map(cfg, &ctx, 1000, &stream, &[0, 50, 100]).unwrap();
            assert_eq!(samples.len(), 3, "{}", cfg.name());
        }
    }
}
