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
const GOSSAMER_UCX_SM: &str = "gossamer (ucx sm)";
const GOSSAMER_UCX_TCP: &str = "gossamer (ucx tcp)";
const UCX_SM: &str = "ucx_perftest (sm)";
const UCX_TCP: &str = "ucx_perftest (tcp)";
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

    // UCX's rows, where the bench is built with its `ucx` feature.
    let ucx: &[&str] = if cfg!(feature = "ucx") {
        &[GOSSAMER_UCX_SM, GOSSAMER_UCX_TCP, UCX_SM, UCX_TCP]
    } else {
        &[]
    };
    let systems: Vec<&str> = [GOSSAMER_SHM, GOSSAMER_TCP, MPI_SM, MPI_TCP]
        .into_iter()
        .chain(ucx.iter().copied())
        .filter(|s| ctx.selected(s))
        .collect();
    ctx.begin("regions", (ctx.runs * systems.len()) as u64);
    let mut racks: Vec<(&str, Vec<Child>)> = Vec::new();
    for &s in &systems {
        let transport = match s {
            GOSSAMER_SHM => "shm",
            GOSSAMER_TCP => "tcp",
            GOSSAMER_UCX_SM => "ucx/sm",
            GOSSAMER_UCX_TCP => "ucx/tcp",
            _ => continue,
        };
        ctx.status(format!("starting {s}"));
        let mut ranks = start_rack(&me, 2, transport)?;
        ranks.iter_mut().try_for_each(Child::pause)?;
        racks.push((s, ranks));
    }
    let mut mpi_components = Vec::new();
    for run in 0..ctx.runs {
        for &s in &systems {
            ctx.status(format!("{s} run {}", run + 1));
            let lines = match racks.iter_mut().find(|(name, _)| *name == s) {
                Some((_, ranks)) => gossamer_run(ranks, window, sizes)?,
                None if s == UCX_SM || s == UCX_TCP => {
                    perftest_run(if s == UCX_SM { "sm" } else { "tcp" }, window, sizes)?
                }
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
                        if m.ops > 0 {
                            faa_rate.add(s, 1.0, m.rate() / 1e6);
                        }
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

/// One run of `ucx_perftest` over `UCX_TLS=tls`: `ucp_fadd` (p50 and p99), `ucp_put_lat` and
/// `ucp_get` at every size (p50), each a pair of processes of its own. Latencies as it prints
/// them: a fetch-add's or a get's whole time, and half of `ucp_put_lat`'s ping-pong (one put
/// seen by the other side). No rate: `ops` is 0.
#[cfg(feature = "ucx")]
fn perftest_run(tls: &str, window: Duration, sizes: &[usize]) -> anyhow::Result<Lines> {
    // About the window's worth of iterations at the rates it runs at here.
    let per_sec = if tls == "sm" { 2_000_000.0 } else { 50_000.0 };
    let n = (window.as_secs_f64() * per_sec).max(500.0) as u64;
    let measured = |p50_us: f64, p99_us: f64| Measured {
        ops: 0,
        secs: 0.0,
        p50_us,
        p99_us,
        offered: 0,
        calls: n,
    };
    let latency = crate::ucx_perftest::latency;
    let mut out = vec![(
        "fetch_add".to_string(),
        1,
        measured(
            latency("ucp_fadd", tls, 8, n, 50.0)?,
            latency("ucp_fadd", tls, 8, n, 99.0)?,
        ),
    )];
    for &bytes in sizes {
        let put = latency("ucp_put_lat", tls, bytes, n, 50.0)?;
        out.push(("put".to_string(), bytes, measured(put, put)));
        // Over TCP a get waits for the server's UCX to notice it, which its idle server
        // does only on UCX's own timer: fewer iterations, or one run takes minutes.
        let gets = if tls == "sm" { n } else { (n / 20).max(100) };
        let get = latency("ucp_get", tls, bytes, gets, 50.0)?;
        out.push(("get".to_string(), bytes, measured(get, get)));
    }
    Ok(out)
}

#[cfg(not(feature = "ucx"))]
fn perftest_run(_: &str, _: Duration, _: &[usize]) -> anyhow::Result<Lines> {
    bail!("ucx_perftest rows need the bench's `ucx` feature")
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
    let mut notes = vec![
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
    ];
    if cfg!(feature = "ucx") {
        notes.push(
            "UCX rows (the bench built with its `ucx` feature): `gossamer (ucx sm)` and \
             `gossamer (ucx tcp)` are the same rack with its links on UCX (`GSM_TRANSPORT=ucx`, \
             `UCX_TLS=sm` or `tcp`), whose region heaps are memory UCX allocated. Over UCX's \
             TCP the operations are UCX's one-sided `ucp_put_nbx`, `ucp_get_nbx` and \
             `ucp_atomic_op_nbx` on rank 1's heap (which UCX over TCP applies on rank 1 when \
             its worker progresses; atomics are the target CPU's, UCX's `ATOMIC_MODE=cpu`), \
             each after a `ucp_worker_fence`, and the fence `ucp_ep_flush_nbx`. Over UCX's \
             shared memory, UCX maps rank 1's heap into rank 0 (`ucp_rkey_ptr`), and rank 0 \
             reaches it as it does a shared-memory peer's: loads, stores and atomic \
             instructions. Beside them UCX's own `ucx_perftest` over the same `UCX_TLS`, a \
             pair of processes per point, pinned as the ranks are: `-t ucp_fadd -s 8` (p50 and \
             p99), `-t ucp_put_lat` and `-t ucp_get` at each size (p50), as it prints them: a \
             fetch-add's and a get's whole time, and for `ucp_put_lat` half its ping-pong, one \
             put seen by the other side (gossamer's put row is a put and a fence, which over \
             TCP is a round trip). Over TCP, `ucx_perftest`'s idle target handles gets only \
             when UCX's own timer wakes it (about a millisecond a get), so its TCP get row is \
             no bound to reach."
                .to_string(),
        );
    }
    notes
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
    if faa_lat.series.iter().any(|x| x.system == GOSSAMER_UCX_SM) {
        for (ours, theirs) in [(GOSSAMER_UCX_SM, UCX_SM), (GOSSAMER_UCX_TCP, UCX_TCP)] {
            goal(
                &format!("{ours}: fetch_add p50 ≤ 1.5× {theirs}'s `ucp_fadd`"),
                ratio(faa_lat, ours, theirs, 50.0),
                &|r| r <= 1.5,
            );
            for (panel, op, test) in [(put, "put", "ucp_put_lat"), (get, "get", "ucp_get")] {
                goal(
                    &format!("{ours}: {op} 4 KiB p50 ≤ 1.5× {theirs}'s `{test}`"),
                    ratio(panel, ours, theirs, 4096.0),
                    &|r| r <= 1.5,
                );
            }
        }
    }
    out.push('\n');
    out
}
