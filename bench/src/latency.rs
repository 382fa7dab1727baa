//! `latency`: mean and p99.9 latency of a fetch-and-add against offered load (seed §2.5.2, Fig. 6).
//!
//! Open-loop load ([`crate::open_loop`]): every client has a fixed schedule of request times (its
//! share of the offered load, evenly spaced, phases staggered between clients), and a request's
//! latency runs from its scheduled time, so queueing counts. A system is not measured at higher
//! loads once its median run saturated (completed less than 90% of the offered load).

use std::fmt::Write as _;
use std::hint::spin_loop;
use std::time::Duration;

use anyhow::{Context as _, ensure};

use crate::delegation::{self, Mode};
use crate::figure::{Figure, Panel, XFormat, sig, tick};
use crate::harness::{Ctx, Gate, pin_to_core};
use crate::locks::{Counters, LockKind, with_counters};
use crate::open_loop::{ClientResult, LatRun, Schedule, summarize};
use crate::workload::{Dist, Stream};

/// One lock-based run: one client thread per core.
pub fn run_lock<C: Counters<u64>>(
    threads: usize,
    stream: &Stream,
    offered_mops: f64,
    window: Duration,
) -> anyhow::Result<LatRun> {
    let counters = C::new(stream.objects());
    let schedules = Schedule::split(threads, offered_mops, window);
    let gate = Gate::new();
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = schedules
            .iter()
            .enumerate()
            .map(|(t, sched)| {
                let mut cursor = stream.cursor(t);
                let (counters, gate) = (&counters, &gate);
                s.spawn(move || {
                    pin_to_core(t);
                    let mut local = C::Local::default();
                    ClientResult::drive(
                        sched,
                        gate,
                        || {
                            counters.enter(&mut local, cursor.next_index());
                        },
                        spin_loop,
                    )
                })
            })
            .collect();
        gate.open_when(threads);
        handles
            .into_iter()
            .map(|h| h.join())
            .collect::<Result<Vec<_>, _>>()
    });
    let results = results.map_err(|_| anyhow::anyhow!("{}: a client thread panicked", C::NAME))?;
    let (run, completed) = summarize(results, offered_mops)?;
    let total = counters.total();
    ensure!(
        total == Some(completed),
        "{}: counters sum to {total:?} but {completed} requests completed (lost or phantom updates)",
        C::NAME
    );
    Ok(run)
}

/// One system of the experiment.
#[derive(Debug, Clone, Copy)]
pub enum System {
    /// Delegation with fibers issuing `apply`.
    Trust(Mode),
    /// A lock with one client thread per core.
    Lock(LockKind),
}

impl System {
    /// Name in plots and tables.
    pub fn name(self) -> String {
        match self {
            System::Trust(mode) => delegation::name(mode, delegation::Style::Fibers),
            System::Lock(kind) => kind.name().to_owned(),
        }
    }

    fn run(
        self,
        cores: usize,
        stream: &Stream,
        offered: f64,
        window: Duration,
    ) -> anyhow::Result<LatRun> {
        match self {
            System::Trust(mode) => delegation::latency(mode, cores, stream, offered, window),
            System::Lock(kind) => {
                with_counters!(kind, u64, C => run_lock::<C>(cores, stream, offered, window))
            }
        }
    }
}

/// All systems for a machine with `cores` cores, delegation first.
pub fn systems(cores: usize) -> Vec<System> {
    let mut v = Vec::new();
    if delegation::AVAILABLE {
        v.extend(
            delegation::modes(cores)
                .into_iter()
                .rev()
                .map(System::Trust),
        );
    }
    v.extend(LockKind::LOCKS.map(System::Lock));
    v
}

/// Offered loads in Mops/s (total over all clients).
fn loads(quick: bool) -> Vec<f64> {
    if quick {
        vec![0.25, 1.0, 64.0]
    } else {
        vec![0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    }
}

/// Runs the experiment and returns its figure.
pub fn run(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let scenarios = [(64usize, Dist::Uniform), (1_000_000, Dist::Zipf)];
    let loads = loads(ctx.quick);
    let systems: Vec<System> = systems(ctx.cores)
        .into_iter()
        .filter(|s| ctx.selected(&s.name()))
        .collect();
    let cores = ctx.cores;
    let mut fig = Figure {
        name: "latency".into(),
        title: "Fetch-and-add latency against offered load".into(),
        notes: vec![
            format!(
                "Open-loop load: each client has a fixed schedule of request times, its share of the offered \
                 load; latency runs from the scheduled time to completion, so queueing counts. Locks run one \
                 client thread per core ({cores}); the critical section is the `faa` one (increment, one \
                 `spin_loop()`). Latencies are recorded in an HDR histogram (3 significant digits). The generator reads \
                 the clock twice per request, which caps what one client can offer: where the completed load of every \
                 system flattens together, the curves show the generator's limit, not the systems'."
            ),
            crate::harness::pinning_note(),
            delegation::LATENCY_NOTE.to_owned(),
            "A run is saturated († in the tables) when it completed less than 90% of the offered load; a \
             system is not measured at higher loads once its median run saturated, so each curve ends where \
             that system saturates. Every run checks that the counters sum to the requests completed."
                .to_owned(),
        ],
        panels: Vec::new(),
        columns: 3,
        extra_markdown: String::new(),
    };
    for &(n, dist) in &scenarios {
        for (metric, label, log_y) in [
            ("mean", "mean latency, µs (log)", true),
            ("p999", "p99.9 latency, µs (log)", true),
            ("achieved", "completed load, Mops/s", false),
        ] {
            let what = match metric {
                "mean" => "mean latency",
                "p999" => "p99.9 latency",
                _ => "completed load",
            };
            let mut p = Panel::new(
                format!(
                    "{}-{}/{metric}",
                    crate::figure::count(n as f64),
                    dist.name()
                ),
                format!(
                    "{} objects, {}: {what}",
                    crate::figure::count(n as f64),
                    dist.label()
                ),
            );
            p.x_label = "offered load, Mops/s (log)".into();
            p.x_format = XFormat::Rate;
            p.y_label = label.into();
            p.log_y = log_y;
            p.baseline = Some(LockKind::Std.name().to_owned());
            fig.panels.push(p);
        }
    }
    let total = (scenarios.len() * loads.len() * ctx.runs * systems.len()) as u64;
    ctx.begin("latency", total);
    let mut saturation = String::new();
    let _ = writeln!(saturation, "## Where each system saturates\n");
    let _ = writeln!(
        saturation,
        "Highest offered load (Mops/s) each system sustained (median run completed ≥ 90% of it), and the \
         first load it could not; ratios are to `std Mutex`.\n"
    );
    let _ = write!(saturation, "| system |");
    for &(n, dist) in &scenarios {
        let _ = write!(
            saturation,
            " {} {}: sustained | first saturated |",
            crate::figure::count(n as f64),
            dist
        );
    }
    let _ = writeln!(
        saturation,
        "\n| --- |{}",
        " ---: | ---: |".repeat(scenarios.len())
    );
    let mut table: Vec<Vec<(Option<f64>, Option<f64>)>> = vec![Vec::new(); systems.len()];
    for &(n, dist) in &scenarios {
        let stream = Stream::new(dist, n, 0x1A7);
        let prefix = format!("{}-{}", crate::figure::count(n as f64), dist.name());
        let mut active: Vec<bool> = vec![true; systems.len()];
        let mut sustained: Vec<Option<f64>> = vec![None; systems.len()];
        let mut first_sat: Vec<Option<f64>> = vec![None; systems.len()];
        for &load in &loads {
            let mut runs: Vec<Vec<LatRun>> = vec![Vec::new(); systems.len()];
            for rep in 0..ctx.runs {
                for (i, &sys) in systems.iter().enumerate() {
                    if !active[i] {
                        continue;
                    }
                    ctx.status(format!(
                        "{prefix} {load} Mops/s run {} {}",
                        rep + 1,
                        sys.name()
                    ));
                    let r = sys.run(cores, &stream, load, ctx.window).with_context(|| {
                        format!("latency {prefix} load={load} system={}", sys.name())
                    })?;
                    runs[i].push(r);
                    ctx.tick();
                }
            }
            for (i, &sys) in systems.iter().enumerate() {
                if !active[i] {
                    ctx.skip(ctx.runs as u64);
                    continue;
                }
                let name = sys.name();
                for r in &runs[i] {
                    fig.panel_mut(&format!("{prefix}/mean"))
                        .add(&name, load, r.mean_us);
                    fig.panel_mut(&format!("{prefix}/p999"))
                        .add(&name, load, r.p999_us);
                    fig.panel_mut(&format!("{prefix}/achieved"))
                        .add(&name, load, r.achieved_mops);
                }
                let saturated = runs[i].iter().filter(|r| r.saturated).count() * 2 > runs[i].len();
                if saturated {
                    for m in ["mean", "p999", "achieved"] {
                        fig.panel_mut(&format!("{prefix}/{m}")).flag(
                            &name,
                            load,
                            "saturated: completed < 90% of offered load",
                        );
                    }
                    active[i] = false;
                    first_sat[i] = Some(load);
                } else {
                    sustained[i] = Some(load);
                }
            }
        }
        for i in 0..systems.len() {
            table[i].push((sustained[i], first_sat[i]));
        }
    }
    ctx.finish();
    let base = systems
        .iter()
        .position(|s| matches!(s, System::Lock(LockKind::Std)));
    for (i, sys) in systems.iter().enumerate() {
        let _ = write!(saturation, "| {} |", sys.name());
        for (j, &(sus, sat)) in table[i].iter().enumerate() {
            let ratio = match (sus, base.and_then(|b| table[b][j].0)) {
                (Some(a), Some(b)) => format!(" **×{}**", sig(a / b)),
                _ => String::new(),
            };
            let sus = sus.map_or("below lowest load".to_owned(), |v| {
                format!("{}{ratio}", tick(v))
            });
            let sat = sat.map_or("not reached".to_owned(), tick);
            let _ = write!(saturation, " {sus} | {sat} |");
        }
        saturation.push('\n');
    }
    saturation.push('\n');
    fig.extra_markdown = saturation;
    Ok(fig)
}
