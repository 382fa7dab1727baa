//! `objects` — the distributed objects of the `objects` crate against Open MPI's collectives,
//! on 2 and 3 processes, through shared memory and over TCP.
//!
//! - O1: a barrier, `Barrier::wait_unfenced` (MPI_Barrier's meaning) and `Barrier::wait`
//!   (every node fenced too) against `MPI_Barrier`: time per barrier, from a loop of barriers.
//! - O2: the seed's broadcast: rank 0 sends 64-byte messages with k in flight, the other ranks
//!   receive each and acknowledge it. `objects::Ring` of capacity k messages (a reader's
//!   acknowledgement is the position it sends back, which returns the message's space) against
//!   `MPI_Ibcast` with k outstanding on every rank: messages per second.
//!
//! The gossamer side runs on racks of this executable (`members.rs`, commands `obj-...` of
//! `crate::rack::node`); the Open MPI side is `mpi_objects.c`, built here with `mpicc`. The
//! systems take turns run by run, the racks stopped (`SIGSTOP`) while the others run.

pub(crate) mod locks;
pub(crate) mod map;
pub(crate) mod members;
pub(crate) mod parts;

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};

use crate::figure::{Figure, Panel, XFormat, sig};
use crate::harness::Ctx;
use crate::programs::{components_chosen, mpirun, ok_lines};
use crate::rack::child::Child;
use crate::rack::{PATIENCE, goal_row, median, ratio, start_rack};

const OURS_SHM: &str = "objects (shm)";
const OURS_SHM_FENCED: &str = "objects (shm), fenced wait";
const OURS_TCP: &str = "objects (tcp)";
const OURS_TCP_FENCED: &str = "objects (tcp), fenced wait";
const RAW_SHM: &str = "raw regions (shm)";
const RAW_SHM_FENCED: &str = "raw regions (shm), fenced";
const RAW_TCP: &str = "raw regions (tcp)";
const RAW_TCP_FENCED: &str = "raw regions (tcp), fenced";
const OURS_UCX_SM: &str = "objects (ucx sm)";
const OURS_UCX_SM_FENCED: &str = "objects (ucx sm), fenced wait";
const OURS_UCX_TCP: &str = "objects (ucx tcp)";
const OURS_UCX_TCP_FENCED: &str = "objects (ucx tcp), fenced wait";
const MPI_SM: &str = "Open MPI (ob1, vader)";
const MPI_TCP: &str = "Open MPI (ob1, tcp)";
const MPI_DEFAULT: &str = "Open MPI (default)";

/// The process counts measured.
pub(crate) const SIZES: [usize; 2] = [2, 3];

/// The Open MPI components of each MPI system, passed to `mpirun`.
fn mca(system: &str) -> &'static [&'static str] {
    match system {
        MPI_SM => &["--mca", "pml", "ob1", "--mca", "btl", "self,vader"],
        MPI_TCP => &["--mca", "pml", "ob1", "--mca", "btl", "self,tcp"],
        _ => &[],
    }
}

/// Whether `system` is one of ours, and its transport.
fn transport(system: &str) -> Option<&'static str> {
    match system {
        OURS_SHM => Some("shm"),
        OURS_TCP => Some("tcp"),
        OURS_UCX_SM => Some("ucx/sm"),
        OURS_UCX_TCP => Some("ucx/tcp"),
        _ => None,
    }
}

/// The rows of our `system`'s other barriers: the fenced wait, and (on the rack's own
/// transports) the same algorithm on raw regions, unfenced and fenced.
fn variants(system: &str) -> (&'static str, Option<(&'static str, &'static str)>) {
    match system {
        OURS_SHM => (OURS_SHM_FENCED, Some((RAW_SHM, RAW_SHM_FENCED))),
        OURS_TCP => (OURS_TCP_FENCED, Some((RAW_TCP, RAW_TCP_FENCED))),
        OURS_UCX_SM => (OURS_UCX_SM_FENCED, None),
        _ => (OURS_UCX_TCP_FENCED, None),
    }
}

/// The panels of one transport: O1 against ranks, O2 against k for each rank count.
struct Panels {
    barrier: Panel,
    broadcast: Vec<Panel>,
}

impl Panels {
    fn new(transport: &str, baseline: &str) -> Panels {
        let mut barrier = Panel::new(
            format!("barrier-{transport}"),
            format!("O1 ({transport}): time per barrier"),
        );
        barrier.x_label = "processes".into();
        barrier.x_format = XFormat::Whole;
        barrier.log_x = false;
        barrier.y_label = "µs per barrier".into();
        barrier.log_y = true;
        barrier.baseline = Some(baseline.into());
        let broadcast = SIZES
            .iter()
            .map(|n| {
                let mut p = Panel::new(
                    format!("broadcast-{transport}-{n}-ranks"),
                    format!("O2 ({transport}, {n} processes): 64-byte broadcasts, k in flight"),
                );
                p.x_label = "k, messages in flight".into();
                p.y_label = "thousand messages/s".into();
                p.log_y = true;
                p.baseline = Some(baseline.into());
                p
            })
            .collect();
        Panels { barrier, broadcast }
    }

    fn broadcast(&mut self, size: usize) -> &mut Panel {
        let i = SIZES
            .iter()
            .position(|&s| s == size)
            .expect("a size measured");
        &mut self.broadcast[i]
    }
}

/// Runs the experiment.
pub fn run(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let me = ctx
        .self_exe
        .clone()
        .context("`objects` starts its ranks by running this executable again: run it as `cargo run --release -p bench -- objects`")?;
    let window = ctx.window;
    let ks: &[u64] = if ctx.quick {
        &[1, 128]
    } else {
        &[1, 16, 128, 1024]
    };
    let mpi = crate::programs::build_mpi_program("mpi_objects", include_str!("mpi_objects.c"))
        .context(
            "building the Open MPI side (Debian: apt-get install libopenmpi-dev openmpi-bin)",
        )?;

    let mut shm = Panels::new("shm", MPI_SM);
    let mut tcp = Panels::new("tcp", MPI_TCP);
    // UCX's rows, where the bench is built with its `ucx` feature.
    let ucx: &[&str] = if cfg!(feature = "ucx") {
        &[OURS_UCX_SM, OURS_UCX_TCP]
    } else {
        &[]
    };
    let systems: Vec<&str> = [OURS_SHM, OURS_TCP, MPI_SM, MPI_TCP, MPI_DEFAULT]
        .into_iter()
        .chain(ucx.iter().copied())
        .filter(|s| ctx.selected(s))
        .collect();
    ctx.begin("objects", (ctx.runs * systems.len() * SIZES.len()) as u64);
    let mut racks: Vec<(&str, usize, Vec<Child>)> = Vec::new();
    for &s in &systems {
        if let Some(t) = transport(s) {
            for size in SIZES {
                ctx.status(format!("starting {s} on {size} ranks"));
                let mut ranks = start_rack(&me, size, t)?;
                ranks.iter_mut().try_for_each(Child::pause)?;
                racks.push((s, size, ranks));
            }
        }
    }
    let chosen = if systems.contains(&MPI_DEFAULT) {
        defaults_chosen(ctx, &mpi, &["1", "1"])?
    } else {
        Vec::new()
    };
    for run in 0..ctx.runs {
        for size in SIZES {
            for &s in &systems {
                ctx.status(format!("{s}, {size} ranks, run {}", run + 1));
                let panels = if matches!(s, OURS_TCP | MPI_TCP | OURS_UCX_TCP) {
                    &mut tcp
                } else {
                    &mut shm
                };
                let x = size as f64;
                let turn = match racks.iter_mut().find(|(n, r, _)| *n == s && *r == size) {
                    Some((_, _, ranks)) => gossamer_run(ranks, window, ks)?,
                    None => mpi_run(&mpi, s, size, window, ks)?,
                };
                panels.barrier.add(s, x, turn.barrier_us);
                if let Some([f, r, rf]) = turn.ours_us {
                    let (fenced, raw) = variants(s);
                    panels.barrier.add(fenced, x, f);
                    if let Some((raw, raw_fenced)) = raw {
                        panels.barrier.add(raw, x, r);
                        panels.barrier.add(raw_fenced, x, rf);
                    }
                }
                for (k, rate) in turn.rates {
                    panels.broadcast(size).add(s, k as f64, rate / 1e3);
                }
                ctx.tick();
            }
        }
    }
    for (_, _, ranks) in racks {
        Child::finish_all(ranks, PATIENCE)?;
    }
    ctx.finish();

    let extra = goals(&shm, &tcp, ks);
    let mut panels = vec![shm.barrier, tcp.barrier];
    panels.extend(shm.broadcast);
    panels.extend(tcp.broadcast);
    Ok(Figure {
        name: "objects".into(),
        title: "Objects: the objects crate's barrier and ring against Open MPI's collectives"
            .into(),
        notes: notes(ctx, window, ks, &chosen),
        panels,
        columns: 2,
        extra_markdown: extra,
    })
}

/// One system's turn: every point measured once.
#[derive(Debug, Default)]
struct Turn {
    /// O1: µs per barrier (ours: `wait_unfenced`; Open MPI: `MPI_Barrier`).
    barrier_us: f64,
    /// O1, ours only: µs per fenced barrier (`Barrier::wait`), and per barrier of the same
    /// algorithm on raw regions, unfenced and fenced.
    ours_us: Option<[f64; 3]>,
    /// O2: `(k, messages/s)`.
    rates: Vec<(u64, f64)>,
}

/// Parses `ITERATIONS SECONDS` (or `MESSAGES SECONDS`).
fn count_and_secs(words: &[String]) -> anyhow::Result<(u64, f64)> {
    let [n, secs] = words else {
        bail!("expected `COUNT SECONDS`, got {words:?}");
    };
    let (n, secs): (u64, f64) = (n.parse()?, secs.parse()?);
    ensure!(n > 0 && secs > 0.0, "nothing measured: {words:?}");
    Ok((n, secs))
}

/// One turn of a gossamer rack.
fn gossamer_run(ranks: &mut [Child], window: Duration, ks: &[u64]) -> anyhow::Result<Turn> {
    Child::resumed(ranks, |ranks| {
        let ms = window.as_millis();
        // Each command warms up for a quarter window, then measures one; 3-rank barriers on 2
        // cores are slow, so the calibration's first 64 may take longer.
        let patience = window * 4 + PATIENCE;
        let mut turn = Turn::default();
        let mut us = [0.0; 4];
        for (mode, us) in ["unfenced", "fenced", "raw-unfenced", "raw-fenced"]
            .into_iter()
            .zip(&mut us)
        {
            let words = ranks[0].call(&format!("obj-barrier {mode} {ms}"), patience)?;
            let (n, secs) = count_and_secs(&words)?;
            *us = secs / n as f64 * 1e6;
        }
        turn.barrier_us = us[0];
        turn.ours_us = Some([us[1], us[2], us[3]]);
        for &k in ks {
            let words = ranks[0].call(&format!("obj-ring {k} {ms}"), patience)?;
            let (n, secs) = count_and_secs(&words)?;
            turn.rates.push((k, n as f64 / secs));
        }
        Ok(turn)
    })
}

/// One turn of the Open MPI program.
fn mpi_run(
    program: &Path,
    system: &str,
    size: usize,
    window: Duration,
    ks: &[u64],
) -> anyhow::Result<Turn> {
    let mut cmd = mpirun(size);
    cmd.args(mca(system))
        .arg(program)
        .arg(window.as_millis().to_string())
        .args(ks.iter().map(|k| k.to_string()));
    let what = format!("{system} on {size} processes");
    let lines = ok_lines(&mut cmd, &what, window * 40 + PATIENCE)?;
    let mut turn = Turn::default();
    let mut barrier = false;
    for w in &lines {
        match w.first().map(String::as_str) {
            Some("barrier") => {
                let (n, secs) = count_and_secs(&w[1..])?;
                turn.barrier_us = secs / n as f64 * 1e6;
                barrier = true;
            }
            Some("ibcast") if w.len() == 4 => {
                let (n, secs) = count_and_secs(&w[2..])?;
                turn.rates.push((w[1].parse()?, n as f64 / secs));
            }
            _ => bail!("{what} printed `{}`", w.join(" ")),
        }
    }
    ensure!(
        barrier && turn.rates.len() == ks.len(),
        "{what} printed too little: {lines:?}"
    );
    Ok(turn)
}

/// What Open MPI's default picks on each process count for `program` run with `args`, one
/// line per count (see [`components_chosen`]).
pub(crate) fn defaults_chosen(
    ctx: &mut Ctx,
    program: &Path,
    args: &[&str],
) -> anyhow::Result<Vec<String>> {
    SIZES
        .iter()
        .map(|&size| {
            ctx.status(format!(
                "asking {MPI_DEFAULT} what it picks on {size} ranks"
            ));
            Ok(format!(
                "{size} processes: {}",
                components_chosen(program, size, &[], args)?
            ))
        })
        .collect()
}

fn notes(ctx: &Ctx, window: Duration, ks: &[u64], chosen: &[String]) -> Vec<String> {
    let ks: Vec<String> = ks.iter().map(u64::to_string).collect();
    vec![
        "O1: every process runs barriers in a loop; the time per barrier is process 0's time \
         for the loop divided by its length, timed from a barrier before it. A warm-up doubles \
         the loop's length from 64 until it takes a quarter of the window, and the measured \
         loop is as long as fits the window at the warm-up's pace (process 0 decides and tells \
         the others, so every process runs as many). objects: a `Barrier` opened by every rank \
         of the rack, `wait_unfenced` (every member arrived: MPI_Barrier's meaning) and `wait` \
         (also fences every node first, so every put issued before it has landed); raw \
         regions: the same algorithm written on gossamer's regions without the objects crate \
         (a region of one word per member on each member; fence every node when fenced, bump \
         the count, put it to every other member, wait for every count), what composing the \
         barrier from objects costs; Open MPI: `MPI_Barrier` on `MPI_COMM_WORLD`."
            .to_string(),
        format!(
            "O2: process 0 broadcasts 64-byte messages with k in flight (k = {}), every other \
             process receives each one and acknowledges it; the rate is process 0's count of \
             messages completed per second over one window, after a quarter window of warm-up \
             (the pipeline full). objects: a `Ring` written by rank 0 with room for exactly k \
             messages (9 k words: a length word and 8 words of bytes each); a reader's \
             acknowledgement is the ring's own: after each message it puts its new position to \
             the writer (`tails`, a `SharedArray` the writer reads), which returns the \
             message's space, and `send` waits while the slowest reader has k unreturned. A \
             message is sent and in flight until every reader returned it. Every reader checks \
             every message's 64 bytes and their order, and that it received every message \
             sent (an 8-byte end marker ends the run). Open MPI: `MPI_Ibcast` of 64 bytes, k \
             outstanding on every process: process 0 posts the next broadcast whenever one \
             completes (`MPI_Waitany`), every other process checks each broadcast it \
             completes (its acknowledgement) and posts the next; every process checks that \
             it completed every broadcast once, with the right bytes. Open MPI's root \
             completes a small broadcast once its sends are done, not once the others \
             received it, so its k bounds less than ours does.",
            ks.join(", ")
        ),
        format!(
            "Systems: objects on racks of this executable, 2 or 3 ranks of one worker each \
             (`GSM_WORKERS=1`), bound to CPUs round-robin (on 2 cores, ranks 0 and 2 of 3 \
             share one), links through shared memory (`GSM_TRANSPORT=shm`) or loopback TCP \
             (`tcp`); Open MPI 4.1 (`mpi_objects.c`, `mpicc -O2`), `mpirun -n N \
             --allow-run-as-root` (and `--oversubscribe` for more processes than cores, where \
             Open MPI binds no process and yields when idle) with `--mca pml ob1 --mca btl \
             self,vader`, `--mca pml ob1 --mca btl self,tcp`, or nothing (default). Open MPI's \
             default picked, by its own verbose output (`--mca pml_base_verbose 10 --mca \
             btl_base_verbose 100`): {}. Collective components are Open MPI's choice in every \
             system.",
            if chosen.is_empty() {
                "not asked (the default was not measured)".to_owned()
            } else {
                chosen.join("; ")
            }
        ),
        format!(
            "Method: window {} ms per point after a quarter window of warm-up; each turn \
             measures every point of one system on one process count (Open MPI: one `mpirun` \
             per turn); the systems take turns run by run, the racks stopped with SIGSTOP \
             while the others run; {} runs per point, median with min–max. Ratios are to the \
             Open MPI system on the same transport (shared memory: ob1 with vader; TCP: ob1 \
             with tcp).",
            window.as_millis(),
            ctx.runs
        ),
    ]
}

/// The ours / Open MPI table and the goals, reported and not asserted.
fn goals(shm: &Panels, tcp: &Panels, ks: &[u64]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## objects / Open MPI, per cell\n");
    let _ = writeln!(
        out,
        "Medians; the ratio is ours over Open MPI's on the same transport (O1: time, lower is \
         better; O2: rate, higher is better).\n"
    );
    let _ = writeln!(
        out,
        "| measurement | processes | shm: objects | shm: Open MPI (ob1, vader) | shm: ratio | \
         tcp: objects | tcp: Open MPI (ob1, tcp) | tcp: ratio |"
    );
    let _ = writeln!(
        out,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    let cell = |p: &Panel, ours: &str, mpi: &str, x: f64| -> [String; 3] {
        let a = median(p, ours, x);
        let b = median(p, mpi, x);
        let f = |v: Option<f64>| v.map_or("n/a".to_owned(), sig);
        [
            f(a),
            f(b),
            ratio(p, ours, mpi, x).map_or("n/a".to_owned(), |r| format!("×{}", sig(r))),
        ]
    };
    let row = |out: &mut String, what: &str, n: usize, s: [String; 3], t: [String; 3]| {
        let _ = writeln!(
            out,
            "| {what} | {n} | {} | {} | {} | {} | {} | {} |",
            s[0], s[1], s[2], t[0], t[1], t[2]
        );
    };
    let barriers = [
        ("`wait_unfenced`", OURS_SHM, OURS_TCP),
        ("`wait` (fenced)", OURS_SHM_FENCED, OURS_TCP_FENCED),
        ("raw regions, unfenced", RAW_SHM, RAW_TCP),
        ("raw regions, fenced", RAW_SHM_FENCED, RAW_TCP_FENCED),
    ];
    for n in SIZES {
        let x = n as f64;
        for (what, on_shm, on_tcp) in barriers {
            row(
                &mut out,
                &format!("O1 µs per barrier, {what}"),
                n,
                cell(&shm.barrier, on_shm, MPI_SM, x),
                cell(&tcp.barrier, on_tcp, MPI_TCP, x),
            );
        }
    }
    for (i, n) in SIZES.into_iter().enumerate() {
        for &k in ks {
            row(
                &mut out,
                &format!("O2 thousand messages/s, k = {k}"),
                n,
                cell(&shm.broadcast[i], OURS_SHM, MPI_SM, k as f64),
                cell(&tcp.broadcast[i], OURS_TCP, MPI_TCP, k as f64),
            );
        }
    }
    let _ = writeln!(out, "\n## Goals (reported, not asserted)\n");
    let _ = writeln!(out, "| goal | measured | met |\n| --- | ---: | --- |");
    for (t, p, [ours, fenced, raw, raw_fenced]) in [
        (
            "shm",
            shm,
            [OURS_SHM, OURS_SHM_FENCED, RAW_SHM, RAW_SHM_FENCED],
        ),
        (
            "tcp",
            tcp,
            [OURS_TCP, OURS_TCP_FENCED, RAW_TCP, RAW_TCP_FENCED],
        ),
    ] {
        for n in SIZES {
            for (what, composed, raw) in [("unfenced", ours, raw), ("fenced", fenced, raw_fenced)] {
                goal_row(
                    &mut out,
                    &format!(
                        "{t}, {n} processes: the composed Barrier ({what}) within 1.1× of the \
                         same algorithm on raw regions"
                    ),
                    ratio(&p.barrier, composed, raw, n as f64),
                    &|r| r <= 1.1,
                );
            }
        }
    }
    let pairs = [
        ("shm", shm, OURS_SHM, OURS_SHM_FENCED, MPI_SM),
        ("tcp", tcp, OURS_TCP, OURS_TCP_FENCED, MPI_TCP),
    ];
    for (t, p, ours, fenced, mpi) in pairs {
        for (n, limit) in [(2, 0.8), (3, 1.0)] {
            goal_row(
                &mut out,
                &format!("{t}, {n} processes: O1 `wait_unfenced` ≤ {limit}× {mpi}'s MPI_Barrier"),
                ratio(&p.barrier, ours, mpi, n as f64),
                &|r| r <= limit,
            );
        }
        for n in SIZES {
            goal_row(
                &mut out,
                &format!("{t}, {n} processes: O1 `wait` (fenced) ≤ 1.2× {mpi}'s MPI_Barrier"),
                ratio(&p.barrier, fenced, mpi, n as f64),
                &|r| r <= 1.2,
            );
        }
        for (i, n) in SIZES.into_iter().enumerate() {
            for &k in ks {
                let limit = if k >= 128 {
                    3.0
                } else if k == 1 {
                    1.0
                } else {
                    continue;
                };
                goal_row(
                    &mut out,
                    &format!(
                        "{t}, {n} processes: O2 messages/s at k = {k} ≥ {limit}× {mpi}'s MPI_Ibcast"
                    ),
                    ratio(&p.broadcast[i], ours, mpi, k as f64),
                    &|r| r >= limit,
                );
            }
        }
    }
    if shm.barrier.series.iter().any(|x| x.system == OURS_UCX_SM) {
        let _ = writeln!(out, "\n## Over UCX, beside the rack's own transports\n");
        let _ = writeln!(
            out,
            "Medians; the ratio is UCX's over the rack's own transport (O1: time, lower is \
             better; O2: rate, higher is better).\n"
        );
        let _ = writeln!(
            out,
            "| measurement | processes | ucx sm | shm | ratio | ucx tcp | tcp | ratio |"
        );
        let _ = writeln!(
            out,
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for n in SIZES {
            let x = n as f64;
            for (what, sm, own_sm, tc, own_tc) in [
                (
                    "`wait_unfenced`",
                    OURS_UCX_SM,
                    OURS_SHM,
                    OURS_UCX_TCP,
                    OURS_TCP,
                ),
                (
                    "`wait` (fenced)",
                    OURS_UCX_SM_FENCED,
                    OURS_SHM_FENCED,
                    OURS_UCX_TCP_FENCED,
                    OURS_TCP_FENCED,
                ),
            ] {
                row(
                    &mut out,
                    &format!("O1 µs per barrier, {what}"),
                    n,
                    cell(&shm.barrier, sm, own_sm, x),
                    cell(&tcp.barrier, tc, own_tc, x),
                );
            }
        }
        for (i, n) in SIZES.into_iter().enumerate() {
            for &k in ks {
                row(
                    &mut out,
                    &format!("O2 thousand messages/s, k = {k}"),
                    n,
                    cell(&shm.broadcast[i], OURS_UCX_SM, OURS_SHM, k as f64),
                    cell(&tcp.broadcast[i], OURS_UCX_TCP, OURS_TCP, k as f64),
                );
            }
        }
    }
    out.push('\n');
    out
}
