//! `faa`: fetch-and-add throughput against object count (seed §2.5.1, Fig. 5).
//!
//! Threads (or fibers) repeatedly pick a counter (uniform or Zipf), increment it inside a critical
//! section that also executes one `spin_loop()` pause, and read the new value. Each run lasts one
//! window; throughput is increments completed divided by the time from start until the last thread
//! stopped. After each run the counters must sum to the increments issued, or the run fails.

use std::time::Duration;

use anyhow::{Context as _, ensure};

use crate::delegation::{self, Mode, Style};
use crate::harness::{Ctx, Gate, pin_to_core, run_window};
use crate::locks::{Counters, LockKind, with_counters};
use crate::report::{Figure, Panel, XFormat};
use crate::workload::{Dist, Stream};

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
    /// A lock (or the atomic) with `per_core` threads per core.
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
}

impl System {
    /// Name in plots and tables (the same lock has the same name in both thread-count panels).
    pub fn name(self) -> String {
        match self {
            System::Lock { kind, .. } => kind.name().to_owned(),
            System::Trust { mode, style } => delegation::name(mode, style),
        }
    }

    /// Measures one run; returns throughput in Mops/s.
    pub fn run(self, cores: usize, stream: &Stream, window: Duration) -> anyhow::Result<f64> {
        match self {
            System::Lock { kind, per_core } => {
                with_counters!(kind, C => run_lock::<C>(cores * per_core, stream, window))
            }
            System::Trust { mode, style } => delegation::faa(mode, style, cores, stream, window),
        }
    }
}

/// All systems for a machine with `cores` cores, delegation first.
pub fn systems(cores: usize) -> Vec<System> {
    let mut v = Vec::new();
    if delegation::AVAILABLE {
        for mode in delegation::modes(cores) {
            for style in [Style::Fibers, Style::Then] {
                v.push(System::Trust { mode, style });
            }
        }
    }
    for per_core in [1, 4] {
        for kind in LockKind::LOCKS {
            v.push(System::Lock { kind, per_core });
        }
    }
    v.push(System::Lock {
        kind: LockKind::Atomic,
        per_core: 1,
    });
    v
}

/// Increments issued per stop-flag check.
const BATCH: u64 = 8;

/// `threads` OS threads hammer `C`'s counters for one window; returns Mops/s after verifying.
pub fn run_lock<C: Counters>(
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
                    while !gate.stopped() {
                        for _ in 0..BATCH {
                            let v = counters.fetch_add(&mut local, cursor.next_index());
                            zero += u64::from(v == 0);
                        }
                        ops += BATCH;
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
            "{}: fetch-and-add returned 0 after an increment {zero} times",
            C::NAME
        );
        ops += n;
    }
    let total = counters.total();
    ensure!(
        total == ops,
        "{}: counters sum to {total} but {ops} increments were issued (lost or phantom updates)",
        C::NAME
    );
    Ok(ops as f64 / elapsed.as_secs_f64() / 1e6)
}

fn panel_id(dist: Dist, per_core: usize) -> String {
    format!("{}/{}-thread-per-core", dist.name(), per_core)
}

/// Runs the experiment and returns its figure.
pub fn run(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let counts = counts(ctx.quick);
    let dists = [Dist::Uniform, Dist::Zipf];
    let systems: Vec<System> = systems(ctx.cores)
        .into_iter()
        .filter(|s| ctx.selected(&s.name()))
        .collect();
    let cores = ctx.cores;
    let mut fig = Figure {
        name: "faa".into(),
        title: "Fetch-and-add throughput against object count".into(),
        notes: vec![
            format!(
                "Each operation picks a counter, increments it inside a critical section that also runs one \
                 `std::hint::spin_loop()` and returns the new value. Locks run {cores} threads (one per core) in \
                 the first panel of each row and {} threads (four per core) in the second; delegation runs on \
                 a {cores}-worker runtime in both. Counters are padded to a cache line. `atomic fetch_add` has no \
                 critical section and no pause: it is the hardware ceiling, not a competitor.",
                4 * cores
            ),
            delegation::FAA_NOTE.to_owned(),
            crate::harness::pinning_note(),
            "Every run checks itself: the counters must sum to the increments issued, else the run fails.".to_owned(),
        ],
        panels: Vec::new(),
        columns: 2,
        extra_markdown: String::new(),
    };
    for dist in dists {
        for per_core in [1, 4] {
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
    let total = (dists.len() * counts.len() * ctx.runs * systems.len()) as u64;
    ctx.begin("faa", total);
    for dist in dists {
        for &n in &counts {
            let stream = Stream::new(dist, n, 0xFAA);
            for rep in 0..ctx.runs {
                for &sys in &systems {
                    ctx.status(format!("{dist} n={n} run {} {}", rep + 1, sys.name()));
                    let mops = sys
                        .run(cores, &stream, ctx.window)
                        .with_context(|| format!("faa {dist} objects={n} system={}", sys.name()))?;
                    let panels: &[usize] = match sys {
                        System::Lock {
                            kind: LockKind::Atomic,
                            ..
                        }
                        | System::Trust { .. } => &[1, 4],
                        System::Lock { per_core: 1, .. } => &[1],
                        System::Lock { .. } => &[4],
                    };
                    for &pc in panels {
                        fig.panel_mut(&panel_id(dist, pc))
                            .add(&sys.name(), n as f64, mops);
                    }
                    ctx.tick();
                }
            }
        }
    }
    ctx.finish();
    Ok(fig)
}
