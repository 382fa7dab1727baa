//! `regions` — one-sided operations on another process's memory: gossamer's regions against
//! Open MPI's one-sided communication (MPI-3 RMA), through shared memory and over TCP.
//!
//! From rank 0 of two, on memory of rank 1: `fetch_add` on one word, one at a time (latency)
//! and 64 at a time (rate); `put` until it has landed and `get`, from 8 bytes to 64 KiB.
//! gossamer: `region.fetch_add(i, 1)`, `region.put(0, words)` then `gossamer::fence(node)`,
//! `region.get(0, n)`, on a rack of two ranks (`node.rs`, commands `rfaa`, `rput`, `rget`).
//! Open MPI: `mpi_regions.c`, built here with `mpicc`: `MPI_Fetch_and_op`, `MPI_Put`,
//! `MPI_Get` in a passive-target epoch (`MPI_Win_lock_all`), each completed by
//! `MPI_Win_flush`. The systems take turns run by run, the racks stopped (`SIGSTOP`) while
//! Open MPI runs.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};

use crate::figure::{Figure, Panel, XFormat};
use crate::harness::Ctx;
use crate::rack::child::Child;
use crate::rack::load::Measured;
use crate::rack::{PATIENCE, goal_row, ratio, start_rack};

const GOSSAMER_SHM: &str = "gossamer (shm)";
const GOSSAMER_TCP: &str = "gossamer (tcp)";
pub(crate) const MPI_SM: &str = "Open MPI (osc sm)";
pub(crate) const MPI_TCP: &str = "Open MPI (osc pt2pt, tcp)";

/// The Open MPI components of each MPI system, passed to `mpirun`. Open MPI picks `osc sm`
/// for a window whose processes share a node whatever the BTL, so `--mca btl self,tcp` alone
/// would measure shared memory again; `osc rdma` refuses the TCP BTL (it has no RDMA) and
/// `osc ucx` brings UCX's own shared memory: its TCP path is `osc pt2pt` over `ob1` and the
/// TCP BTL.
pub(crate) fn mca(system: &str) -> &'static [&'static str] {
    if system == MPI_SM {
        &[
            "--mca",
            "pml",
            "ob1",
            "--mca",
            "btl",
            "self,vader",
            "--mca",
            "osc",
            "sm",
        ]
    } else {
        &[
            "--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "osc", "pt2pt",
        ]
    }
}

/// Runs the experiment.
pub fn run(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let me = ctx
        .self_exe
        .clone()
        .context("`regions` starts its ranks by running this executable again: run it as `cargo run --release -p bench -- regions`")?;
    let window = ctx.window;
    let sizes: &[usize] = if ctx.quick {
        &[8, 4096]
    } else {
        &[8, 64, 512, 4096, 65536]
    };
    let mpi = crate::programs::build_mpi_program("mpi_regions", include_str!("mpi_regions.c"))
        .context(
            "building the Open MPI side (Debian: apt-get install libopenmpi-dev openmpi-bin)",
        )?;

    let mut fig = Figure {
        name: "regions".into(),
        title: "Regions: one-sided operations on another process, against Open MPI".into(),
        notes: Vec::new(),
        panels: Vec::new(),
        columns: 2,
        extra_markdown: String::new(),
    };
    let mut faa_lat = Panel::new("fetch-add-latency", "fetch_add, one at a time");
    faa_lat.x_label = "percentile".into();
    faa_lat.x_format = XFormat::Percent;
    faa_lat.y_label = "latency (µs)".into();
    faa_lat.log_x = false;
    faa_lat.log_y = true;
    let mut faa_rate = Panel::new("fetch-add-rate", "fetch_add rate by operations in flight");
    faa_rate.x_label = "operations in flight".into();
    faa_rate.y_label = "rate (Mops/s)".into();
    faa_rate.log_y = true;
    let mut put = Panel::new("put-latency", "put until landed: p50 latency by size");
    put.x_label = "bytes".into();
    put.y_label = "p50 latency (µs)".into();
    put.log_y = true;
    let mut get = Panel::new("get-latency", "get: p50 latency by size");
    get.x_label = "bytes".into();
    get.y_label = "p50 latency (µs)".into();
    get.log_y = true;

    let systems: Vec<&str> = [GOSSAMER_SHM, GOSSAMER_TCP, MPI_SM, MPI_TCP]
        .into_iter()
        .filter(|s| ctx.selected(s))
        .collect();
    ctx.begin("regions", (ctx.runs * systems.len()) as u64);
    let mut racks: Vec<(&str, Vec<Child>)> = Vec::new();
    for &s in &systems {
        if s == GOSSAMER_SHM || s == GOSSAMER_TCP {
            ctx.status(format!("starting {s}"));
            let mut ranks = start_rack(&me, 2, if s == GOSSAMER_SHM { "shm" } else { "tcp" })?;
            ranks.iter_mut().try_for_each(Child::pause)?;
            racks.push((s, ranks));
        }
    }
    let mut mpi_components = Vec::new();
    for run in 0..ctx.runs {
        for &s in &systems {
            ctx.status(format!("{s} run {}", run + 1));
            let lines = match racks.iter_mut().find(|(name, _)| *name == s) {
                Some((_, ranks)) => gossamer_run(ranks, window, sizes)?,
                None => {
                    let (lines, components) = mpi_run(&mpi, s, window, sizes)?;
                    if run == 0 {
                        mpi_components.push(format!("{s}: {components}"));
                    }
                    lines
                }
            };
            for (op, x, m) in lines {
                match op.as_str() {
                    "fetch_add" if x == 1 => {
                        faa_lat.add(s, 50.0, m.p50_us);
                        faa_lat.add(s, 99.0, m.p99_us);
                        faa_rate.add(s, 1.0, m.rate() / 1e6);
                    }
                    "fetch_add" => faa_rate.add(s, x as f64, m.rate() / 1e6),
                    "put" => put.add(s, x as f64, m.p50_us),
                    _ => get.add(s, x as f64, m.p50_us),
                }
            }
            ctx.tick();
        }
    }
    for (_, mut ranks) in racks {
        ranks.iter_mut().try_for_each(Child::resume)?;
        for r in ranks {
            r.finish(PATIENCE)?;
        }
    }
    ctx.finish();

    fig.notes = notes(ctx, window, &mpi_components);
    fig.extra_markdown = goals(&faa_lat, &faa_rate, &put, &get);
    fig.panels = vec![faa_lat, faa_rate, put, get];
    Ok(fig)
}

/// The measurements of one run, as `(operation, x, result)`.
type Lines = Vec<(String, usize, Measured)>;

/// One run of a gossamer rack: every measurement.
fn gossamer_run(ranks: &mut [Child], window: Duration, sizes: &[usize]) -> anyhow::Result<Lines> {
    ranks.iter_mut().try_for_each(Child::resume)?;
    let result = (|| {
        let ms = window.as_millis();
        let mut out = Vec::new();
        let mut measure = |command: &str, op: &str, x: usize| -> anyhow::Result<()> {
            // A warm-up of a quarter window, then the measured one.
            ranks[0].call(
                &format!("{command} {x} {}", (ms / 4).max(5)),
                window + PATIENCE,
            )?;
            let words = ranks[0].call(&format!("{command} {x} {ms}"), window + PATIENCE)?;
            out.push((op.to_string(), x, Measured::parse(&words)?));
            Ok(())
        };
        for depth in [1, 64] {
            measure("rfaa", "fetch_add", depth)?;
        }
        for &bytes in sizes {
            measure("rput", "put", bytes)?;
            measure("rget", "get", bytes)?;
        }
        ranks[0].call("rcheck", PATIENCE)?;
        Ok(out)
    })();
    ranks.iter_mut().try_for_each(Child::pause)?;
    result
}

/// One run of the Open MPI program: every measurement, and the components it ran with.
fn mpi_run(
    program: &Path,
    system: &str,
    window: Duration,
    sizes: &[usize],
) -> anyhow::Result<(Lines, String)> {
    let mut cmd = Command::new("mpirun");
    // CI runs as root; Open MPI refuses that unless told.
    cmd.args(["-n", "2", "--allow-run-as-root"])
        .args(mca(system))
        .arg(program)
        .arg(window.as_millis().to_string())
        .args(sizes.iter().map(|s| s.to_string()));
    let mut lines = Vec::new();
    for w in crate::programs::ok_lines(&mut cmd, system, window * 40 + PATIENCE)? {
        let [op, x, calls, secs, p50, p99] = &w[..] else {
            bail!("{system} printed `{}`", w.join(" "));
        };
        let calls: u64 = calls.parse()?;
        lines.push((
            op.to_string(),
            x.parse()?,
            Measured {
                ops: calls,
                secs: secs.parse()?,
                p50_us: p50.parse()?,
                p99_us: p99.parse()?,
                offered: 0,
                calls,
            },
        ));
    }
    let components = mca(system)
        .chunks(3)
        .map(|c| format!("{} {}", c[1], c[2]))
        .collect::<Vec<_>>()
        .join(", ");
    Ok((lines, components))
}

fn notes(ctx: &Ctx, window: Duration, components: &[String]) -> Vec<String> {
    vec![
        "The operations, from rank 0 of two processes on memory of rank 1: `fetch_add` of 1 \
         on one 64-bit word, one at a time (latency) and 64 at a time (rate: 64 issued, then \
         all completed); `put` of 8 B to 64 KiB until it has landed; `get` of as many. \
         gossamer: a region of 8193 words on rank 1 (`node.region`), `fetch_add(i, 1)` (64 at \
         a time: each chained with `then` into a `Group`, then `group.wait()`), `put(0, \
         words)` then `gossamer::fence(node)`, `get(0, n)`; `gossamer (shm)` through the \
         shared-memory transport (atomic instructions on rank 1's heap, mapped by rank 0), \
         `gossamer (tcp)` over loopback TCP (requests run by rank 1's worker 0); both ranks \
         one worker (`GSM_WORKERS=1`), bound to one CPU each. Open MPI 4.1: `mpi_regions.c`, \
         `MPI_Win_allocate`, a passive-target epoch (`MPI_Win_lock_all`), `MPI_Fetch_and_op` \
         (`MPI_SUM`), `MPI_Put`, `MPI_Get`, each (or each batch of 64) completed by \
         `MPI_Win_flush`; `mpirun -n 2` binds each rank to a core."
            .to_string(),
        format!(
            "Open MPI's components, as passed to mpirun: {}. Open MPI picks `osc sm` for a \
             window whose processes share a node whatever the BTL, so the TCP system names \
             `osc pt2pt` (over `pml ob1` and the TCP BTL): `osc rdma` refuses the TCP BTL, \
             which has no RDMA, and `osc ucx` uses UCX's own shared memory.",
            components.join("; ")
        ),
        format!(
            "Method: each run measures every point for {} ms after a warm-up (gossamer: a \
             quarter window per point; Open MPI: none, one `mpirun` per run and system); the \
             systems take turns run by run, the gossamer racks stopped with SIGSTOP while the \
             others run; {} runs per point, median with min–max. Latency is timed around each \
             operation (each batch of 64) with the monotonic clock on both sides. Every run \
             checks itself: the counter must hold every add made.",
            window.as_millis(),
            ctx.runs
        ),
    ]
}

/// The goals, reported and not asserted.
fn goals(faa_lat: &Panel, faa_rate: &Panel, put: &Panel, get: &Panel) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## Goals (reported, not asserted)\n");
    let _ = writeln!(out, "| goal | measured | met |\n| --- | ---: | --- |");
    let mut goal = |name: &str, ratio: Option<f64>, ok: &dyn Fn(f64) -> bool| {
        goal_row(&mut out, name, ratio, ok)
    };
    goal(
        "shm: fetch_add p50 ≤ 0.5× Open MPI's (osc sm)",
        ratio(faa_lat, GOSSAMER_SHM, MPI_SM, 50.0),
        &|r| r <= 0.5,
    );
    goal(
        "shm: fetch_add rate at 64 in flight ≥ 2× Open MPI's (osc sm)",
        ratio(faa_rate, GOSSAMER_SHM, MPI_SM, 64.0),
        &|r| r >= 2.0,
    );
    goal(
        "tcp: fetch_add p50 ≤ 1.0× Open MPI's (tcp)",
        ratio(faa_lat, GOSSAMER_TCP, MPI_TCP, 50.0),
        &|r| r <= 1.0,
    );
    for (panel, op) in [(put, "put"), (get, "get")] {
        goal(
            &format!("shm: {op} 4 KiB p50 ≤ 0.7× Open MPI's (osc sm)"),
            ratio(panel, GOSSAMER_SHM, MPI_SM, 4096.0),
            &|r| r <= 0.7,
        );
        goal(
            &format!("tcp: {op} 4 KiB p50 ≤ 0.7× Open MPI's (tcp)"),
            ratio(panel, GOSSAMER_TCP, MPI_TCP, 4096.0),
            &|r| r <= 0.7,
        );
    }
    out.push('\n');
    out
}
