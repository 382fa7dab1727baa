//! `faa` and `faa-struct`: throughput of a short critical section against object count (seed §2.5.1,
//! Fig. 5).
//!
//! Threads (or fibers) repeatedly pick an object (uniform or Zipf) and run a critical section on it
//! that also executes one `spin_loop()` pause: `faa` increments a counter and reads the new value,
//! `faa-struct` adds 1 to every word of a four-cache-line [`Block`]. Each run lasts one window;
//! throughput is critical sections completed divided by the time from start until the last thread
//! stopped. After each run the objects must count exactly the sections issued, or the run fails.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};

use crate::delegation::{self, Mode, Style};
use crate::figure::{Figure, Panel, XFormat, count, sig};
use crate::harness::{Ctx, Gate, pin_to_core, run_window};
use crate::locks::{Atomic, Block, Counters, LockKind, Padded, Section, with_counters};
use crate::workload::{Dist, Stream};

/// What each critical section updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data {
    /// One `u64` counter per object (`faa`).
    Counter,
    /// One [`Block`] of four cache lines per object (`faa-struct`).
    Block,
}

/// Object counts measured: half decades from 1 to 10^6.
fn counts(quick: bool) -> Vec<usize> {
    if quick {
        vec![1, 100, 10_000]
    } else {
        vec![
            1, 3, 10, 32, 100, 316, 1_000, 3_162, 10_000, 31_623, 100_000, 316_228, 1_000_000,
        ]
    }
}

/// One system of the experiment.
#[derive(Debug, Clone, Copy)]
pub enum System {
    /// A lock with `per_core` threads per core.
    Lock {
        /// Which lock.
        kind: LockKind,
        /// Threads per core (1, or 4 for the oversubscribed panel).
        per_core: usize,
    },
    /// Delegation to trustees.
    Trust {
        /// Shared or dedicated trustees.
        mode: Mode,
        /// Blocking `apply` from many fibers, or non-blocking `apply_then`.
        style: Style,
    },
    /// One thread running the critical section in a plain loop with no lock: the ceiling for any
    /// scheme that serializes the sections on one object.
    Ceiling,
    /// `AtomicU64::fetch_add` from one thread per core (counters only): the hardware ceiling.
    Atomic,
}

/// Name of the single-thread ceiling in plots and tables.
pub const CEILING: &str = "1 thread, no lock (ceiling)";

impl System {
    /// Name in plots and tables (the same lock has the same name in both thread-count panels).
    pub fn name(self) -> String {
        match self {
            System::Lock { kind, .. } => kind.name().to_owned(),
            System::Trust { mode, style } => delegation::name(mode, style),
            System::Ceiling => CEILING.to_owned(),
            System::Atomic => <Atomic as Counters<u64>>::NAME.to_owned(),
        }
    }

    /// Measures one run on `data` objects; returns throughput in Mops/s.
    pub fn run(
        self,
        data: Data,
        cores: usize,
        stream: &Stream,
        window: Duration,
    ) -> anyhow::Result<f64> {
        match (self, data) {
            (System::Lock { kind, per_core }, Data::Counter) => {
                with_counters!(kind, u64, C => run_lock::<u64, C>(cores * per_core, stream, window))
            }
            (System::Lock { kind, per_core }, Data::Block) => {
                with_counters!(kind, Block, C => run_lock::<Block, C>(cores * per_core, stream, window))
            }
            (System::Trust { mode, style }, Data::Counter) => {
                delegation::faa::<u64>(mode, style, cores, stream, window)
            }
            (System::Trust { mode, style }, Data::Block) => {
                delegation::faa::<Block>(mode, style, cores, stream, window)
            }
            (System::Ceiling, Data::Counter) => run_ceiling::<u64>(stream, window),
            (System::Ceiling, Data::Block) => run_ceiling::<Block>(stream, window),
            (System::Atomic, Data::Counter) => run_lock::<u64, Atomic>(cores, stream, window),
            (System::Atomic, Data::Block) => bail!("the atomic has no block version"),
        }
    }

    /// Thread-count panels (threads per core) the system's line appears in.
    fn panels(self, per_core: &[usize]) -> Vec<usize> {
        match self {
            System::Lock { per_core: pc, .. } => vec![pc],
            _ => per_core.to_vec(),
        }
    }
}

/// All systems for `data` on a machine with `cores` cores, delegation first, with locks at each of
/// `per_core` threads per core.
pub fn systems(cores: usize, data: Data, per_core: &[usize]) -> Vec<System> {
    let mut v = Vec::new();
    if delegation::AVAILABLE {
        for mode in delegation::modes(cores) {
            for style in [Style::Fibers, Style::Then] {
                v.push(System::Trust { mode, style });
            }
        }
    }
    for &per_core in per_core {
        for kind in LockKind::LOCKS {
            v.push(System::Lock { kind, per_core });
        }
    }
    v.push(System::Ceiling);
    if data == Data::Counter {
        v.push(System::Atomic);
    }
    v
}

/// Critical sections issued per stop-flag check.
const BATCH: u64 = 8;

/// `threads` OS threads run critical sections on `C`'s objects for one window; returns Mops/s
/// after verifying.
pub fn run_lock<T: Section, C: Counters<T>>(
    threads: usize,
    stream: &Stream,
    window: Duration,
) -> anyhow::Result<f64> {
    let counters = C::new(stream.objects());
    let gate = Gate::new();
    let (results, elapsed) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let mut cursor = stream.cursor(t);
                let (gate, counters) = (&gate, &counters);
                s.spawn(move || {
                    pin_to_core(t);
                    let mut local = C::Local::default();
                    gate.arrive_and_wait();
                    let (mut ops, mut zero) = (0u64, 0u64);
                    loop {
                        for _ in 0..BATCH {
                            let v = counters.enter(&mut local, cursor.next_index());
                            zero += u64::from(v == 0);
                        }
                        ops += BATCH;
                        if gate.stopped() {
                            break;
                        }
                    }
                    (ops, zero)
                })
            })
            .collect();
        let t0 = gate.open_when(threads);
        run_window(&gate, window);
        let results: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        (results, t0.elapsed())
    });
    let mut ops = 0;
    for r in results {
        let (n, zero) =
            r.map_err(|_| anyhow::anyhow!("{}: a benchmark thread panicked", C::NAME))?;
        ensure!(
            zero == 0,
            "{}: a critical section returned 0 after it ran, {zero} times",
            C::NAME
        );
        ops += n;
    }
    let total = counters.total();
    ensure!(
        total == Some(ops),
        "{}: objects count {total:?} critical sections but {ops} were issued (lost, torn or phantom updates)",
        C::NAME
    );
    Ok(ops as f64 / elapsed.as_secs_f64() / 1e6)
}

/// One thread runs the critical section on the stream's objects (padded like the locks' ones) with
/// no lock for one window; returns Mops/s after verifying.
pub fn run_ceiling<T: Section>(stream: &Stream, window: Duration) -> anyhow::Result<f64> {
    let mut objects: Vec<Padded<T>> = (0..stream.objects()).map(|_| Padded::default()).collect();
    let gate = Gate::new();
    let (result, elapsed) = std::thread::scope(|s| {
        let mut cursor = stream.cursor(0);
        let (gate, objects) = (&gate, &mut objects);
        let h = s.spawn(move || {
            pin_to_core(0);
            gate.arrive_and_wait();
            let (mut ops, mut zero) = (0u64, 0u64);
            loop {
                for _ in 0..BATCH {
                    zero += u64::from(objects[cursor.next_index()].0.enter() == 0);
                }
                ops += BATCH;
                if gate.stopped() {
                    break;
                }
            }
            (ops, zero)
        });
        let t0 = gate.open_when(1);
        run_window(gate, window);
        let r = h.join();
        (r, t0.elapsed())
    });
    let (ops, zero) = result.map_err(|_| anyhow::anyhow!("{CEILING}: the thread panicked"))?;
    ensure!(
        zero == 0,
        "{CEILING}: a critical section returned 0 after it ran, {zero} times"
    );
    let total: Option<u64> = objects.iter().map(|o| o.0.count()).sum();
    ensure!(
        total == Some(ops),
        "{CEILING}: objects count {total:?} critical sections but {ops} were issued"
    );
    Ok(ops as f64 / elapsed.as_secs_f64() / 1e6)
}

fn panel_id(dist: Dist, per_core: usize) -> String {
    format!("{}/{}-thread-per-core", dist.name(), per_core)
}

/// What distinguishes the two figures.
struct Spec {
    name: &'static str,
    title: &'static str,
    data: Data,
    /// Lock threads per core, one panel each.
    per_core: &'static [usize],
    counts: Vec<usize>,
    /// What the critical section does, for the notes.
    section: &'static str,
}

/// Runs `faa` (counters) and returns its figure.
pub fn run(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let spec = Spec {
        name: "faa",
        title: "Fetch-and-add throughput against object count",
        data: Data::Counter,
        per_core: &[1, 4],
        counts: counts(ctx.quick),
        section: "Each operation picks a counter, increments it inside a critical section that also runs \
                  one `std::hint::spin_loop()` and returns the new value. Counters are padded to a cache line.",
    };
    let mut fig = measure(ctx, &spec)?;
    fig.notes.insert(
        1,
        "`atomic fetch_add` has no critical section and no pause: it is the hardware ceiling, not a \
         competitor."
            .to_owned(),
    );
    crate::handover::append(ctx, &mut fig)?;
    Ok(fig)
}

/// Runs `faa-struct` (four-cache-line blocks) and returns its figure.
pub fn run_struct(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let spec = Spec {
        name: "faa-struct",
        title: "Updating a 4-cache-line struct in place against object count",
        data: Data::Block,
        per_core: &[1],
        counts: if ctx.quick {
            vec![1, 100, 10_000]
        } else {
            counts(false)
        },
        section: "Each operation picks an object, a `[u64; 32]` aligned to a cache line (four lines), and \
                  inside its critical section adds 1 to every word, runs one `std::hint::spin_loop()` and \
                  returns the last word. The data is the point: a lock moves the four lines to whichever \
                  core takes it, a trustee keeps them in its own cache.",
    };
    measure(ctx, &spec)
}

/// Measures every system of `spec` at every point and builds the figure.
fn measure(ctx: &mut Ctx, spec: &Spec) -> anyhow::Result<Figure> {
    let dists = [Dist::Uniform, Dist::Zipf];
    let cores = ctx.cores;
    let systems: Vec<System> = systems(cores, spec.data, spec.per_core)
        .into_iter()
        .filter(|s| ctx.selected(&s.name()))
        .collect();
    let locks_note = if spec.per_core.len() > 1 {
        format!(
            "Locks run {cores} threads (one per core) in the first panel of each row and {} threads \
             (four per core) in the second; delegation runs on a {cores}-worker runtime in both.",
            4 * cores
        )
    } else {
        format!(
            "Locks run {cores} threads (one per core); delegation runs on a {cores}-worker runtime."
        )
    };
    let mut fig = Figure {
        name: spec.name.into(),
        title: spec.title.into(),
        notes: vec![
            format!("{} {locks_note}", spec.section),
            format!(
                "`{CEILING}`: one thread runs the same critical section on the same objects (padded \
                 the same way, same access stream) in a plain loop, with no lock and nothing else: the \
                 most any scheme that runs one object's sections one at a time can reach on one \
                 object. With many objects, {cores} threads can exceed it."
            ),
            delegation::FAA_NOTE.to_owned(),
            crate::harness::pinning_note(),
            "Every run checks itself: the objects must count exactly the critical sections issued \
             (and a block's words must agree), else the run fails."
                .to_owned(),
        ],
        panels: Vec::new(),
        columns: 2,
        extra_markdown: String::new(),
    };
    for dist in dists {
        for &per_core in spec.per_core {
            let mut p = Panel::new(
                panel_id(dist, per_core),
                format!(
                    "{}, locks at {} thread{} per core",
                    dist.label(),
                    per_core,
                    if per_core == 1 { "" } else { "s" }
                ),
            );
            p.x_label = "objects (log)".into();
            p.x_format = XFormat::Count;
            p.y_label = "throughput, Mops/s (log)".into();
            p.log_y = true;
            p.baseline = Some(LockKind::Std.name().to_owned());
            fig.panels.push(p);
        }
    }
    let total = (dists.len() * spec.counts.len() * ctx.runs * systems.len()) as u64;
    ctx.begin(spec.name, total);
    for dist in dists {
        for &n in &spec.counts {
            let stream = Stream::new(dist, n, 0xFAA);
            for rep in 0..ctx.runs {
                for &sys in &systems {
                    ctx.status(format!("{dist} n={n} run {} {}", rep + 1, sys.name()));
                    let mops = sys
                        .run(spec.data, cores, &stream, ctx.window)
                        .with_context(|| {
                            format!("{} {dist} objects={n} system={}", spec.name, sys.name())
                        })?;
                    for pc in sys.panels(spec.per_core) {
                        fig.panel_mut(&panel_id(dist, pc))
                            .add(&sys.name(), n as f64, mops);
                    }
                    ctx.tick();
                }
            }
        }
    }
    ctx.finish();
    fig.extra_markdown = goals(&fig, spec.per_core);
    Ok(fig)
}

/// The yardsticks as a table per distribution: every delegation system's median against the
/// single-thread ceiling and against the best lock (over all thread counts) at each object count.
fn goals(fig: &Figure, per_core: &[usize]) -> String {
    let mut out = String::from(
        "## Delegation against the ceiling and the best lock\n\n\
         Medians in Mops/s; **c** is the ratio to `1 thread, no lock (ceiling)`, **L** the ratio to the \
         best lock at that object count (the lock with the highest median at any thread count, named \
         in its column).\n\n",
    );
    for dist in [Dist::Uniform, Dist::Zipf] {
        let panels: Vec<&Panel> = per_core
            .iter()
            .filter_map(|&pc| fig.panels.iter().find(|p| p.id == panel_id(dist, pc)))
            .collect();
        let Some(first) = panels.first() else {
            continue;
        };
        let median = |p: &Panel, sys: &str, x: f64| {
            p.series
                .iter()
                .find(|s| s.system == sys)
                .and_then(|s| s.at(x))
                .map(|pt| pt.median())
        };
        let trusts: Vec<String> = first
            .series
            .iter()
            .map(|s| s.system.clone())
            .filter(|s| s.starts_with("trust"))
            .collect();
        let xs = first.xs();
        let _ = writeln!(out, "### {}\n", dist.label());
        let _ = write!(out, "| objects | ceiling | best lock |");
        for t in &trusts {
            let _ = write!(out, " {t} |");
        }
        let _ = write!(out, "\n| ---: | ---: | ---: |");
        for _ in &trusts {
            out.push_str(" ---: |");
        }
        out.push('\n');
        for x in xs {
            let ceiling = median(first, CEILING, x);
            let best = LockKind::LOCKS
                .iter()
                .flat_map(|k| {
                    panels
                        .iter()
                        .filter_map(move |p| median(p, k.name(), x).map(|m| (m, k.name())))
                })
                .max_by(|a, b| a.0.total_cmp(&b.0));
            let _ = write!(
                out,
                "| {} | {} | {} |",
                count(x),
                ceiling.map_or("–".into(), sig),
                best.map_or("–".into(), |(m, k)| format!("{} ({k})", sig(m)))
            );
            for t in &trusts {
                let cell = match median(first, t, x) {
                    None => "–".to_owned(),
                    Some(m) => {
                        let c = ceiling.map_or("–".into(), |c| sig(m / c));
                        let l = best.map_or("–".into(), |(b, _)| sig(m / b));
                        format!("{} (c ×{c}, L ×{l})", sig(m))
                    }
                };
                let _ = write!(out, " {cell} |");
            }
            out.push('\n');
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_counts_every_section() {
        for dist in [Dist::Uniform, Dist::Zipf] {
            let stream = Stream::new(dist, 100, 3);
            assert!(run_ceiling::<u64>(&stream, Duration::from_millis(5)).unwrap() > 0.0);
            assert!(run_ceiling::<Block>(&stream, Duration::from_millis(5)).unwrap() > 0.0);
        }
    }

    #[test]
    fn every_system_runs_on_blocks() {
        let stream = Stream::new(Dist::Zipf, 10, 3);
        for sys in systems(2, Data::Block, &[1]) {
            let mops = sys
                .run(Data::Block, 2, &stream, Duration::from_millis(5))
                .unwrap();
            assert!(mops > 0.0, "{}", sys.name());
        }
    }
}
