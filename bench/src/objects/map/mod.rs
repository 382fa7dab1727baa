//! `objects-map` — O4: the seed's key-value store, `objects::DMap` (one-sided: lock-free gets,
//! updates under a lock), against its delegated twin `objects::ShardMap` (every operation a
//! call to the key's shard), on 2 processes through shared memory and over TCP.
//!
//! The seed's workloads (§6.2): a 10 MB keyspace (16 bytes a key) filled to 80% with 8-byte
//! keys and values; read-only, 50% updates and update-only; keys uniform or Zipf (α = 0.99);
//! windows of 3 and 128 operations in flight per process (fibers, each doing one operation
//! at a time). Each design runs on a rack of its own (`members.rs`, commands `obj-map...`),
//! filled once; the racks take turns run by run, stopped (`SIGSTOP`) while the others run.

pub(crate) mod members;

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};

use crate::figure::{Figure, Panel, XFormat, sig};
use crate::harness::Ctx;
use crate::rack::child::Child;
use crate::rack::{PATIENCE, goal_row, median, ratio, start_rack_with};

/// Slots of the map: a 10 MB keyspace at 16 bytes a key (the quick run: 64 KiB).
const SLOTS: u64 = 10 * 1024 * 1024 / 16;
const QUICK_SLOTS: u64 = 64 * 1024 / 16;

/// The Zipf exponent of the seed's workloads.
const ALPHA: f64 = 0.99;

/// Processes of each rack.
const PROCESSES: usize = 2;

/// Operations in flight per process.
const WINDOWS: [u64; 2] = [3, 128];

/// Update shares, percent.
const WRITES: [u32; 3] = [0, 50, 100];

const DESIGNS: [(&str, &str); 2] = [("dmap", "DMap"), ("shardmap", "ShardMap")];

fn system(design: &str, transport: &str, window: u64) -> String {
    format!("{design} ({transport}), window {window}")
}

/// Runs the experiment.
pub(crate) fn run(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let me = ctx
        .self_exe
        .clone()
        .context("`objects-map` starts its ranks by running this executable again: run it as `cargo run --release -p bench -- objects-map`")?;
    let window = ctx.window;
    let slots = if ctx.quick { QUICK_SLOTS } else { SLOTS };
    let keys = slots * 4 / 5;
    let mut panels: Vec<Panel> = Vec::new();
    for transport in ["shm", "tcp"] {
        for dist in ["uniform", "zipf"] {
            let label = if dist == "zipf" {
                format!("Zipf α = {ALPHA}")
            } else {
                dist.to_owned()
            };
            let mut p = Panel::new(
                format!("{transport}-{dist}"),
                format!("O4 ({transport}, {label} keys): operations/s against the update share"),
            );
            p.x_label = "updates, % of operations".into();
            p.x_format = XFormat::Whole;
            p.log_x = false;
            p.y_label = "thousand operations/s".into();
            p.log_y = true;
            p.baseline = Some(system("ShardMap", transport, WINDOWS[1]));
            panels.push(p);
        }
    }
    let panel = |transport: &str, dist: &str| -> usize {
        usize::from(transport == "tcp") * 2 + usize::from(dist == "zipf")
    };

    // A rack per design and transport, its map filled once.
    let mut racks: Vec<(&str, &str, String, Vec<Child>)> = Vec::new();
    let mut fills = Vec::new();
    for transport in ["shm", "tcp"] {
        for (design, title) in DESIGNS {
            if !WINDOWS
                .iter()
                .any(|&w| ctx.selected(&system(title, transport, w)))
            {
                continue;
            }
            ctx.status(format!(
                "starting {title} on {PROCESSES} ranks ({transport}) and filling it"
            ));
            let env = [("GSM_REGION_HEAP".to_owned(), format!("{}", 256 << 20))];
            let mut ranks = start_rack_with(
                &me,
                &format!("objects-map {title} ({transport})"),
                PROCESSES,
                transport,
                &env,
            )?;
            let words = ranks[0].call(
                &format!("obj-map-open {design} {slots} {keys}"),
                Duration::from_secs(600),
            )?;
            let [name, secs] = &words[..] else {
                bail!("obj-map-open answered {words:?}");
            };
            let secs: f64 = secs.parse()?;
            fills.push(format!(
                "{title} ({transport}): {keys} keys in {secs:.1} s ({} thousand inserts/s)",
                sig(keys as f64 / secs / 1e3)
            ));
            ranks.iter_mut().try_for_each(Child::pause)?;
            racks.push((transport, title, name.clone(), ranks));
        }
    }

    let points = WINDOWS.len() * WRITES.len() * 2;
    ctx.begin("objects-map", (ctx.runs * racks.len() * points) as u64);
    let ms = window.as_millis();
    for run in 0..ctx.runs {
        for (transport, title, name, ranks) in racks.iter_mut() {
            Child::resumed(ranks, |ranks| {
                for dist in ["uniform", "zipf"] {
                    for writes in WRITES {
                        for w in WINDOWS {
                            let s = system(title, transport, w);
                            ctx.status(format!("{s}, {dist}, {writes}% updates, run {}", run + 1));
                            let words = ranks[0].call(
                                &format!("obj-map {name} {dist} {ALPHA} {writes} {w} {ms}"),
                                window * 4 + PATIENCE,
                            )?;
                            let rate = rate(&words).with_context(|| s.clone())?;
                            panels[panel(transport, dist)].add(&s, f64::from(writes), rate / 1e3);
                            ctx.tick();
                        }
                    }
                }
                Ok(())
            })?;
        }
    }
    for (_, _, name, mut ranks) in racks {
        Child::resumed(&mut ranks, |ranks| {
            ranks[0].call(&format!("obj-map-close {name}"), PATIENCE)
        })?;
        Child::finish_all(ranks, PATIENCE)?;
    }
    ctx.finish();

    let extra = goals(&panels);
    Ok(Figure {
        name: "objects-map".into(),
        title: "Objects: the one-sided DMap against its delegated twin ShardMap (O4)".into(),
        notes: notes(ctx, window, slots, keys, &fills),
        panels,
        columns: 2,
        extra_markdown: extra,
    })
}

/// Parses `OPERATIONS SECONDS` into operations per second.
fn rate(words: &[String]) -> anyhow::Result<f64> {
    let [n, secs] = words else {
        bail!("expected `OPERATIONS SECONDS`, got {words:?}");
    };
    let (n, secs): (u64, f64) = (n.parse()?, secs.parse()?);
    ensure!(n > 0 && secs > 0.0, "nothing measured: {words:?}");
    Ok(n as f64 / secs)
}

fn notes(ctx: &Ctx, window: Duration, slots: u64, keys: u64, fills: &[String]) -> Vec<String> {
    vec![
        format!(
            "The map: {slots} slots ({} MB of 16-byte keys and values), {keys} keys (80%), keys \
             1..={keys} with 8-byte values; filled once per rack, each process inserting its \
             share (key k by process k mod 2) from {} fibers: {}. Operations: a get, or an \
             update (insert of an existing key), of a key drawn uniformly or Zipf (α = \
             {ALPHA}, rank 1 the most popular key) from a stream drawn before the clock \
             starts; 0%, 50% or 100% updates. Checked: every get and update found its key with \
             a value written for that key.",
            slots * 16 / 1_000_000,
            members::FILL_FIBERS,
            fills.join("; ")
        ),
        "DMap (the seed's design, §6.2): every process keeps an index of where each key's \
         value is; a get reads the value's slot with one one-sided get, taking no lock (a \
         checksum and a counter tell a whole, current value); an update takes the key's lock \
         (a `LockArray` of 1,024 locks per process), puts the value, and releases (the \
         release fences). ShardMap: one shard per process entrusted to its worker; every \
         operation is one delegated call (`apply_with`) to the key's shard. The window: the \
         operations in flight per process, as fibers each doing one operation at a time (the \
         seed's window: each operation started and completed on its own)."
            .to_string(),
        format!(
            "Systems: racks of this executable, {PROCESSES} ranks of one worker each, bound to \
             CPUs round-robin, links through shared memory (shm) or loopback TCP; one rack per \
             design and transport. Method: window {} ms per point after a quarter window of \
             warm-up; the racks take turns run by run, stopped with SIGSTOP while the others \
             run; {} runs per point, median with min–max. Ratios are to ShardMap with window \
             128 on the same transport.",
            window.as_millis(),
            ctx.runs
        ),
    ]
}

/// The designs side by side per cell, and the goal (window 128 ≥ 4× window 3),
/// reported and not asserted.
fn goals(panels: &[Panel]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## DMap and ShardMap, per cell\n");
    let _ = writeln!(
        out,
        "Medians, thousand operations per second, {PROCESSES} processes; *faster* names the \
         design with the higher rate at the same window.\n"
    );
    let _ = writeln!(
        out,
        "| transport | keys | updates | window | DMap | ShardMap | faster |\n\
         | --- | --- | ---: | ---: | ---: | ---: | --- |"
    );
    let f = |v: Option<f64>| v.map_or("n/a".to_owned(), sig);
    for (i, p) in panels.iter().enumerate() {
        let transport = if i >= 2 { "tcp" } else { "shm" };
        let dist = if i % 2 == 1 { "Zipf" } else { "uniform" };
        for writes in WRITES {
            for w in WINDOWS {
                let x = f64::from(writes);
                let d = median(p, &system("DMap", transport, w), x);
                let s = median(p, &system("ShardMap", transport, w), x);
                let faster = match (d, s) {
                    (Some(d), Some(s)) if d > s => format!("DMap (×{})", sig(d / s)),
                    (Some(d), Some(s)) => format!("ShardMap (×{})", sig(s / d)),
                    _ => "n/a".to_owned(),
                };
                let _ = writeln!(
                    out,
                    "| {transport} | {dist} | {writes}% | {w} | {} | {} | {faster} |",
                    f(d),
                    f(s)
                );
            }
        }
    }
    let _ = writeln!(out, "\n## Goals (reported, not asserted)\n");
    let _ = writeln!(out, "| goal | measured | met |\n| --- | ---: | --- |");
    for (i, p) in panels.iter().enumerate() {
        let transport = if i >= 2 { "tcp" } else { "shm" };
        let dist = if i % 2 == 1 { "Zipf" } else { "uniform" };
        for writes in WRITES {
            let x = f64::from(writes);
            goal_row(
                &mut out,
                &format!(
                    "{transport}, {dist}, {writes}% updates: DMap at window 128 ≥ 4× window 3"
                ),
                ratio(
                    p,
                    &system("DMap", transport, WINDOWS[1]),
                    &system("DMap", transport, WINDOWS[0]),
                    x,
                ),
                &|r| r >= 4.0,
            );
        }
    }
    out.push('\n');
    out
}
