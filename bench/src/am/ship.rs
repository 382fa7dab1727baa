//! `am-ship`: seed 003's Figures 7 and 8 redrawn for packages. There, an *injected function*
//! carries its code in every message and a *local function* is already at the receiver. Here
//! the package travels instead of the function's code: *shipped every call* sends the whole
//! package before each Indirect Put (`Node::load_package`, then the call; the receiver has the
//! package and only checks the bytes against its id), *by id* is the ordinary call, which
//! names the package the first call left there. Latency one call at a time and the rate of
//! several fibers each making one call at a time, against the payload, over TCP and shared
//! memory.

use std::time::Duration;

use anyhow::Context as _;
use gossamer::env;
use gossamer::package::SecretKey;

use super::{Rack, demo_library};
use crate::figure::{Figure, Panel, sig};
use crate::harness::Ctx;

/// The series: the call by id and the call that ships the package first.
const KINDS: [(&str, &str); 2] = [("package", "by id"), ("shipped", "shipped every call")];
/// Fibers of the rate panel.
const FIBERS: u64 = 8;

/// Runs the experiment (see the module docs).
pub(crate) fn run(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let me = ctx.self_exe.clone().context(
        "`am-ship` starts its ranks by running this executable again: run it as `cargo run --release -p bench -- am-ship`",
    )?;
    let window = ctx.window;
    let warmup = (window / 4).max(Duration::from_millis(5));
    let sizes: &[usize] = if ctx.quick {
        &[8, 64 << 10]
    } else {
        &[8, 256, 4 << 10, 64 << 10, 1 << 20]
    };
    let transports = ["tcp", "shm"];

    let scratch = std::env::temp_dir().join(format!("gsm-bench-am-ship-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    let key = SecretKey::generate()?;
    let package = gossamer::package::build(demo_library(&me)?, &key)?;
    let package_path = scratch.join("demo.gpkg");
    let package_bytes = package.to_bytes().len();
    std::fs::write(&package_path, package.to_bytes())?;

    let kib = package_bytes >> 10;
    let mut latency = Panel::new(
        "ship-latency",
        format!("Indirect Put one call at a time, p50 (package of {kib} KiB)"),
    );
    latency.x_label = "payload (bytes)".into();
    latency.y_label = "p50 latency (µs)".into();
    let mut rate = Panel::new(
        "ship-rate",
        format!("Indirect Put from {FIBERS} fibers, one call at a time each"),
    );
    rate.x_label = "payload (bytes)".into();
    rate.y_label = "throughput (k calls/s)".into();

    ctx.begin(
        "am-ship",
        (transports.len() + ctx.runs * transports.len() * KINDS.len() * 2 * sizes.len()) as u64,
    );
    let default_window = (env::DEFAULT_AM_BANKS, env::DEFAULT_AM_SLOTS);
    let mut racks = Vec::new();
    for t in transports {
        ctx.status(format!("starting the rack ({t})"));
        let rack = Rack::start(&me, t, &package_path, &key, default_window)?;
        racks.push((t, rack));
        ctx.tick();
    }
    let measured = (|| -> anyhow::Result<()> {
        for &bytes in sizes {
            for run in 0..ctx.runs {
                for (t, rack) in racks.iter_mut() {
                    for (kind, label) in KINDS {
                        let system = format!("{label} ({t})");
                        ctx.status(format!("{bytes} B {system}, run {}", run + 1));
                        let m = rack.turn(warmup, window * 2, &|w| {
                            format!("am-lat {kind} put {bytes} {}", w.as_millis())
                        })?;
                        latency.add(&system, bytes as f64, m.p50_us);
                        ctx.tick();
                        let m = rack.turn(warmup, window, &|w| {
                            format!("am-fibers {kind} put {bytes} {} {FIBERS}", w.as_millis())
                        })?;
                        rate.add(&system, bytes as f64, m.rate() / 1e3);
                        ctx.tick();
                    }
                }
            }
        }
        Ok(())
    })();
    for (_, rack) in racks {
        rack.finish()?;
    }
    let _ = std::fs::remove_dir_all(&scratch);
    measured?;
    ctx.finish();
    let extra = summary(&latency, &rate, sizes);
    Ok(Figure {
        name: "am-ship".into(),
        title: "A package by id vs. shipped with every call (seed 003, Figures 7 and 8)".into(),
        notes: vec![format!(
            "Two ranks of one worker each (`GSM_WORKERS=1`), over loopback TCP or shared \
             memory; rank 0 calls the demo package's `indirect_put` (key hashed to one of 16 \
             slots, the payload copied there) on a state on rank 1. *by id*: `PkgTrust::call`, \
             which names the package rank 1 loaded at the first call; *shipped every call*: \
             `Node::load_package` first, which sends the whole signed package ({package_bytes} \
             bytes: a shared library, where the seed's injected Indirect Put carried 1,408 \
             bytes of code) and waits until rank 1 has checked it against its id, then the \
             same call. {} runs per point, taking turns (the racks not measured are stopped \
             with SIGSTOP), median with min–max; windows of {} ms (latency: twice that) after \
             {} ms unmeasured.",
            ctx.runs,
            window.as_millis(),
            warmup.as_millis()
        )],
        panels: vec![latency, rate],
        columns: 2,
        extra_markdown: extra,
    })
}

/// What shipping costs at each payload: shipped over by id, latency and rate.
fn summary(latency: &Panel, rate: &Panel, sizes: &[usize]) -> String {
    let mut out = String::from(
        "\n## Shipped every call over by id (this run)\n\n| transport | payload | p50 latency | rate |\n| --- | --- | --- | --- |\n",
    );
    let med = |p: &Panel, s: &str, x: f64| crate::rack::median(p, s, x);
    for t in ["tcp", "shm"] {
        for &bytes in sizes {
            let x = bytes as f64;
            let ratio = |p: &Panel| {
                let shipped = med(p, &format!("shipped every call ({t})"), x)?;
                let by_id = med(p, &format!("by id ({t})"), x)?;
                Some(format!(
                    "{} vs {} (×{})",
                    sig(shipped),
                    sig(by_id),
                    sig(shipped / by_id)
                ))
            };
            if let (Some(l), Some(r)) = (ratio(latency), ratio(rate)) {
                out += &format!("| {t} | {bytes} B | {l} µs | {r} k/s |\n");
            }
        }
    }
    out
}
