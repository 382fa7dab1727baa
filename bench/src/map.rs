//! `map-size` and `map-writes`: an in-process key-value map (seed §2.5.3, Figs. 7 and 8).
//!
//! Keys are 8 bytes (`u64`), values 16 bytes (`[u64; 2]`). Every table is pre-filled with keys
//! `0..n` before the clock starts; reads are `get` of a present key, writes replace the value of a
//! present key, so the key set never changes. A value is `[stamp, mix(key ^ stamp)]`: every read checks
//! that the value it got belongs to its key (no torn or misplaced values), every write checks that it
//! replaced a valid value, and after the runs the whole table is scanned — it must hold exactly the keys
//! `0..n`, each with a valid value. Any failure fails the benchmark.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use anyhow::Context as _;

use crate::delegation;
use crate::figure::{Figure, Panel, XFormat};
use crate::harness::{Ctx, Gate, pin_to_core, run_window};
use crate::locks::Padded;
use crate::map_workload::{OpChecks, Table, Value, shard_of, value_for, verify_contents};
use crate::workload::{Dist, Stream};

/// A concurrent map under test.
pub trait KvMap: Send + Sync + Sized {
    /// Name in plots and tables.
    const NAME: &'static str;
    /// A map holding keys `0..n`, each with `value_for(key, 0)`.
    fn prefilled(n: usize) -> Self;
    /// The value of `key`.
    fn get(&self, key: u64) -> Option<Value>;
    /// Stores `value` under `key`, returning the previous value.
    fn put(&self, key: u64, value: Value) -> Option<Value>;
    /// Calls `f` on every entry (no concurrent writers); returns the number of entries.
    fn scan(&self, f: &mut dyn FnMut(u64, &Value)) -> usize;
}

fn prefill_std(n: usize, shards: usize) -> Vec<HashMap<u64, Value>> {
    let mut maps: Vec<HashMap<u64, Value>> = (0..shards)
        .map(|_| HashMap::with_capacity(n / shards + n / shards / 8 + 1))
        .collect();
    for k in 0..n as u64 {
        maps[shard_of(k, shards)].insert(k, value_for(k, 0));
    }
    maps
}

/// Number of shards of the lock-sharded maps.
pub const LOCK_SHARDS: usize = 512;

/// A `std` lock around one shard of the lock-sharded maps.
pub trait ShardLock: Send + Sync + Sized + 'static {
    /// The map's name in tables and plots.
    const NAME: &'static str;
    /// Wraps a shard.
    fn new(table: Table) -> Self;
    /// Runs `f` with shared access to the shard.
    fn read<R>(&self, f: impl FnOnce(&Table) -> R) -> R;
    /// Runs `f` with exclusive access to the shard.
    fn write<R>(&self, f: impl FnOnce(&mut Table) -> R) -> R;
}

impl ShardLock for Mutex<Table> {
    const NAME: &'static str = "Mutex<HashMap> ×512";
    fn new(table: Table) -> Self {
        Mutex::new(table)
    }
    fn read<R>(&self, f: impl FnOnce(&Table) -> R) -> R {
        f(&self.lock().unwrap_or_else(|e| e.into_inner()))
    }
    fn write<R>(&self, f: impl FnOnce(&mut Table) -> R) -> R {
        f(&mut self.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl ShardLock for RwLock<Table> {
    const NAME: &'static str = "RwLock<HashMap> ×512";
    fn new(table: Table) -> Self {
        RwLock::new(table)
    }
    fn read<R>(&self, f: impl FnOnce(&Table) -> R) -> R {
        f(&self.read().unwrap_or_else(|e| e.into_inner()))
    }
    fn write<R>(&self, f: impl FnOnce(&mut Table) -> R) -> R {
        f(&mut self.write().unwrap_or_else(|e| e.into_inner()))
    }
}

/// 512 shards of `std::collections::HashMap`, each behind its own padded lock `L`.
#[derive(Debug)]
pub struct LockShards<L>(Box<[Padded<L>]>);

/// 512 `std::sync::Mutex<HashMap>` shards.
pub type MutexShards = LockShards<Mutex<Table>>;
/// 512 `std::sync::RwLock<HashMap>` shards.
pub type RwLockShards = LockShards<RwLock<Table>>;

impl<L: ShardLock> KvMap for LockShards<L> {
    const NAME: &'static str = L::NAME;
    fn prefilled(n: usize) -> Self {
        LockShards(
            prefill_std(n, LOCK_SHARDS)
                .into_iter()
                .map(|m| Padded(L::new(m)))
                .collect(),
        )
    }
    #[inline]
    fn get(&self, key: u64) -> Option<Value> {
        self.0[shard_of(key, LOCK_SHARDS)]
            .0
            .read(|t| t.get(&key).copied())
    }
    #[inline]
    fn put(&self, key: u64, value: Value) -> Option<Value> {
        self.0[shard_of(key, LOCK_SHARDS)]
            .0
            .write(|t| t.insert(key, value))
    }
    fn scan(&self, f: &mut dyn FnMut(u64, &Value)) -> usize {
        let mut n = 0;
        for shard in self.0.iter() {
            shard.0.read(|t| {
                for (k, v) in t {
                    f(*k, v);
                    n += 1;
                }
            });
        }
        n
    }
}

/// `dashmap::DashMap` 6 with its default shard count.
#[derive(Debug)]
pub struct Dash(dashmap::DashMap<u64, Value>);

impl KvMap for Dash {
    const NAME: &'static str = "dashmap 6";
    fn prefilled(n: usize) -> Self {
        let m = dashmap::DashMap::with_capacity(n);
        for k in 0..n as u64 {
            m.insert(k, value_for(k, 0));
        }
        Dash(m)
    }
    #[inline]
    fn get(&self, key: u64) -> Option<Value> {
        self.0.get(&key).map(|r| *r)
    }
    #[inline]
    fn put(&self, key: u64, value: Value) -> Option<Value> {
        self.0.insert(key, value)
    }
    fn scan(&self, f: &mut dyn FnMut(u64, &Value)) -> usize {
        let mut n = 0;
        for r in self.0.iter() {
            f(*r.key(), r.value());
            n += 1;
        }
        n
    }
}

/// `scc::HashMap` 3.
#[derive(Debug)]
pub struct Scc(scc::HashMap<u64, Value>);

impl KvMap for Scc {
    const NAME: &'static str = "scc HashMap";
    fn prefilled(n: usize) -> Self {
        let m = scc::HashMap::with_capacity(n);
        for k in 0..n as u64 {
            let _ = m.insert_sync(k, value_for(k, 0));
        }
        Scc(m)
    }
    #[inline]
    fn get(&self, key: u64) -> Option<Value> {
        self.0.read_sync(&key, |_, v| *v)
    }
    #[inline]
    fn put(&self, key: u64, value: Value) -> Option<Value> {
        self.0.upsert_sync(key, value)
    }
    fn scan(&self, f: &mut dyn FnMut(u64, &Value)) -> usize {
        let mut n = 0;
        self.0.iter_sync(|k, v| {
            f(*k, v);
            n += 1;
            true
        });
        n
    }
}

/// `papaya::HashMap` (lock-free reads), pinned per operation.
#[derive(Debug)]
pub struct Papaya(papaya::HashMap<u64, Value>);

impl KvMap for Papaya {
    const NAME: &'static str = "papaya";
    fn prefilled(n: usize) -> Self {
        let m = papaya::HashMap::with_capacity(n);
        {
            let pinned = m.pin();
            for k in 0..n as u64 {
                pinned.insert(k, value_for(k, 0));
            }
        }
        Papaya(m)
    }
    #[inline]
    fn get(&self, key: u64) -> Option<Value> {
        self.0.pin().get(&key).copied()
    }
    #[inline]
    fn put(&self, key: u64, value: Value) -> Option<Value> {
        self.0.pin().insert(key, value).copied()
    }
    fn scan(&self, f: &mut dyn FnMut(u64, &Value)) -> usize {
        let mut n = 0;
        for (k, v) in self.0.pin().iter() {
            f(*k, v);
            n += 1;
        }
        n
    }
}

/// The lock-based and lock-free maps, for iteration; dispatch with the `with_map!` macro.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapKind {
    /// [`Dash`].
    Dash,
    /// [`Scc`].
    Scc,
    /// [`Papaya`].
    Papaya,
    /// [`MutexShards`].
    Mutex,
    /// [`RwLockShards`].
    RwLock,
}

impl MapKind {
    /// All kinds.
    pub const ALL: [MapKind; 5] = [
        MapKind::Dash,
        MapKind::Scc,
        MapKind::Papaya,
        MapKind::Mutex,
        MapKind::RwLock,
    ];
}

/// Runs `$body` with the type alias `$t` bound to the [`KvMap`] type of `$kind`.
macro_rules! with_map {
    ($kind:expr, $t:ident => $body:expr) => {
        match $kind {
            MapKind::Dash => {
                type $t = Dash;
                $body
            }
            MapKind::Scc => {
                type $t = Scc;
                $body
            }
            MapKind::Papaya => {
                type $t = Papaya;
                $body
            }
            MapKind::Mutex => {
                type $t = MutexShards;
                $body
            }
            MapKind::RwLock => {
                type $t = RwLockShards;
                $body
            }
        }
    };
}

/// Operations per stop-flag check.
const BATCH: u64 = 8;

/// One measurement window on an existing map with one client thread per core; returns Mops/s.
pub fn run_window_on<M: KvMap>(
    map: &M,
    threads: usize,
    stream: &Stream,
    write_percent: u32,
    window: Duration,
    seed: u64,
) -> anyhow::Result<f64> {
    let gate = Gate::new();
    let (results, elapsed) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let mut cursor = stream.cursor(t + seed as usize * 64);
                let gate = &gate;
                s.spawn(move || {
                    pin_to_core(t);
                    let mut checks = OpChecks::default();
                    let mut stamp = (((seed << 8) | (t as u64 + 1)) << 40) | 1;
                    gate.arrive_and_wait();
                    loop {
                        for _ in 0..BATCH {
                            let key = cursor.next_index() as u64;
                            if cursor.is_write(write_percent) {
                                stamp += 1;
                                checks.wrote(key, map.put(key, value_for(key, stamp)));
                            } else {
                                checks.read(key, map.get(key));
                            }
                        }
                        if gate.stopped() {
                            break;
                        }
                    }
                    checks
                })
            })
            .collect();
        let t0 = gate.open_when(threads);
        run_window(&gate, window);
        let results: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        (results, t0.elapsed())
    });
    let mut checks = OpChecks::default();
    for r in results {
        checks.merge(&r.map_err(|_| anyhow::anyhow!("{}: a client thread panicked", M::NAME))?);
    }
    checks.ensure_clean(M::NAME)?;
    Ok((checks.reads + checks.writes) as f64 / elapsed.as_secs_f64() / 1e6)
}

/// Builds `M` with `n` keys, measures `runs` windows at every write share, verifies the table, and
/// returns the samples per write share.
pub fn measure_map<M: KvMap>(
    ctx: &Ctx,
    n: usize,
    stream: &Stream,
    write_shares: &[u32],
) -> anyhow::Result<Vec<Vec<f64>>> {
    ctx.status(format!(
        "{} prefill {}",
        M::NAME,
        crate::figure::count(n as f64)
    ));
    let map = M::prefilled(n);
    let mut out = Vec::new();
    for &w in write_shares {
        let mut samples = Vec::new();
        for rep in 0..ctx.runs {
            ctx.status(format!(
                "{} n={} writes={w}% run {}",
                M::NAME,
                crate::figure::count(n as f64),
                rep + 1
            ));
            samples.push(run_window_on(
                &map, ctx.cores, stream, w, ctx.window, rep as u64,
            )?);
            ctx.tick();
        }
        out.push(samples);
    }
    ctx.status(format!("{} verify", M::NAME));
    verify_contents(M::NAME, n, |f| map.scan(f))?;
    Ok(out)
}

/// One system of the map experiments.
#[derive(Debug, Clone, Copy)]
pub enum System {
    /// A lock-based or lock-free map with one client thread per core.
    Map(MapKind),
    /// Trustee-sharded `HashMap`.
    Trust(delegation::MapConfig),
}

impl System {
    /// Name in plots and tables.
    pub fn name(self) -> String {
        match self {
            System::Map(kind) => with_map!(kind, M => M::NAME.to_owned()),
            System::Trust(cfg) => cfg.name(),
        }
    }

    fn measure(
        self,
        ctx: &Ctx,
        n: usize,
        stream: &Stream,
        writes: &[u32],
    ) -> anyhow::Result<Vec<Vec<f64>>> {
        match self {
            System::Map(kind) => with_map!(kind, M => measure_map::<M>(ctx, n, stream, writes)),
            System::Trust(cfg) => delegation::measure_map(cfg, ctx, n, stream, writes),
        }
    }
}

/// All systems, delegation first.
pub fn systems(cores: usize) -> Vec<System> {
    let mut v: Vec<System> = delegation::map_configs(cores)
        .into_iter()
        .map(System::Trust)
        .collect();
    v.extend(MapKind::ALL.map(System::Map));
    v
}

fn new_figure(name: &str, title: &str, cores: usize) -> Figure {
    Figure {
        name: name.into(),
        title: title.into(),
        notes: vec![
            format!(
                "In-process map with 8-byte keys and 16-byte values, pre-filled with every key before the clock \
                 starts. Lock-based and lock-free maps run one client thread per core ({cores}); all maps use \
                 the default `RandomState` hasher, the sharded ones pick a shard with a multiplicative hash."
            ),
            crate::harness::pinning_note(),
            delegation::MAP_NOTE.to_owned(),
            "Every run checks itself: each read must find its key with a value written for that key, each \
             write must replace such a value, and afterwards the table must hold exactly the pre-filled keys, \
             each with a valid value."
                .to_owned(),
        ],
        panels: Vec::new(),
        columns: 2,
        extra_markdown: String::new(),
    }
}

fn baseline() -> Option<String> {
    Some(Dash::NAME.to_owned())
}

/// `map-size`: throughput against table size at 5% writes, uniform and Zipf.
pub fn run_size(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let sizes: Vec<usize> = if ctx.quick {
        vec![10, 1_000, 100_000]
    } else {
        vec![10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000]
    };
    let dists = [Dist::Uniform, Dist::Zipf];
    let systems: Vec<System> = systems(ctx.cores)
        .into_iter()
        .filter(|s| ctx.selected(&s.name()))
        .collect();
    let mut fig = new_figure(
        "map-size",
        "Key-value map throughput against table size, 5% writes",
        ctx.cores,
    );
    for dist in dists {
        let mut p = Panel::new(dist.name(), format!("{}, 5% writes", dist.label()));
        p.x_label = "keys in the table (log)".into();
        p.y_label = "throughput, Mops/s (log)".into();
        p.log_y = true;
        p.baseline = baseline();
        fig.panels.push(p);
    }
    ctx.begin(
        "map-size",
        (dists.len() * sizes.len() * systems.len() * ctx.runs) as u64,
    );
    for dist in dists {
        for &n in &sizes {
            let stream = Stream::new(dist, n, 0x3A9);
            for &sys in &systems {
                let samples = sys
                    .measure(ctx, n, &stream, &[5])
                    .with_context(|| format!("map-size {dist} keys={n} system={}", sys.name()))?;
                for v in &samples[0] {
                    fig.panel_mut(dist.name()).add(&sys.name(), n as f64, *v);
                }
            }
        }
    }
    ctx.finish();
    Ok(fig)
}

/// `map-writes`: throughput against write share, 1000 keys uniform and 10^7 keys Zipf.
pub fn run_writes(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let (shares, scenarios): (Vec<u32>, Vec<(usize, Dist)>) = if ctx.quick {
        (
            vec![0, 50, 100],
            vec![(1_000, Dist::Uniform), (100_000, Dist::Zipf)],
        )
    } else {
        (
            vec![0, 5, 10, 25, 50, 75, 100],
            vec![(1_000, Dist::Uniform), (10_000_000, Dist::Zipf)],
        )
    };
    let systems: Vec<System> = systems(ctx.cores)
        .into_iter()
        .filter(|s| ctx.selected(&s.name()))
        .collect();
    let mut fig = new_figure(
        "map-writes",
        "Key-value map throughput against write share",
        ctx.cores,
    );
    for &(n, dist) in &scenarios {
        let id = format!("{}-{}", crate::figure::count(n as f64), dist.name());
        let mut p = Panel::new(
            id,
            format!("{} keys, {}", crate::figure::count(n as f64), dist.label()),
        );
        p.x_label = "writes, % of operations".into();
        p.x_format = XFormat::Percent;
        p.log_x = false;
        p.y_label = "throughput, Mops/s".into();
        p.baseline = baseline();
        fig.panels.push(p);
    }
    ctx.begin(
        "map-writes",
        (scenarios.len() * shares.len() * systems.len() * ctx.runs) as u64,
    );
    for &(n, dist) in &scenarios {
        let id = format!("{}-{}", crate::figure::count(n as f64), dist.name());
        let stream = Stream::new(dist, n, 0x3A9);
        for &sys in &systems {
            let samples = sys
                .measure(ctx, n, &stream, &shares)
                .with_context(|| format!("map-writes {id} system={}", sys.name()))?;
            for (w, vs) in shares.iter().zip(samples) {
                for v in vs {
                    fig.panel_mut(&id).add(&sys.name(), f64::from(*w), v);
                }
            }
        }
    }
    ctx.finish();
    Ok(fig)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map_workload::valid;

    fn roundtrip<M: KvMap>() {
        let m = M::prefilled(100);
        assert!(valid(7, &m.get(7).unwrap()));
        assert!(m.get(100).is_none());
        let old = m.put(7, value_for(7, 42)).unwrap();
        assert!(valid(7, &old));
        assert_eq!(m.get(7), Some(value_for(7, 42)));
        verify_contents(M::NAME, 100, |f| m.scan(f)).unwrap();
        m.put(1000, value_for(1000, 1));
        assert!(verify_contents(M::NAME, 100, |f| m.scan(f)).is_err());
    }

    #[test]
    fn maps_behave() {
        for k in MapKind::ALL {
            with_map!(k, M => roundtrip::<M>());
        }
    }

    #[test]
    fn a_window_runs_clean() {
        let s = Stream::new(Dist::Zipf, 1000, 1);
        let m = MutexShards::prefilled(1000);
        let mops = run_window_on(&m, 2, &s, 50, Duration::from_millis(10), 0).unwrap();
        assert!(mops > 0.0);
        verify_contents("m", 1000, |f| m.scan(f)).unwrap();
    }
}
