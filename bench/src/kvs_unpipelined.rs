//! `kvs-unpipelined`: `kvs` against memcached for ordinary clients, which keep one request in
//! flight per connection, at 1 to 256 concurrent connections.
//!
//! Two generators drive the same pair of servers (started as in [`crate::kvs`], same options,
//! only the measured one running, turns alternating run by run):
//!
//! - this crate's own ([`crate::memcache`]) with one OS thread and `depth` 1: throughput and the
//!   p50/p99 latency of every request, each answer checked;
//! - `memcaslap` from libmemcached (Debian's `libmemcached-tools`), an independent referee: one
//!   thread (`-T 1`), `-c` concurrent connections with one request outstanding each, 9:1
//!   `get`:`set` from its own key space, 16-byte keys and values, a share of the `get`s verified
//!   (`-v`). It runs against fresh servers, since it writes keys of its own.
//!
//! Each connection count is measured idle and then loaded, beside one busy loop per core
//! ([`crate::busy`]); every panel exists once per condition, its id led by the condition.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, ensure};

use crate::busy::Condition;
use crate::figure::{Figure, Panel, count, sig};
use crate::harness::Ctx;
use crate::kvs::{
    KVS_ONE_TRUSTEE, Kind, MEMORY_MB, Sut, in_path, kvs_binary, memcached_binary, shown, systems,
    version,
};
use crate::memcache::{Client, Load};
use crate::workload::{Dist, Stream};

/// kvs whose idle workers block at once instead of polling first.
const KVS_NO_SPIN: &str = "kvs --spin-us 0";

/// Concurrent connections measured (one request in flight each).
const CONNS: [usize; 5] = [1, 4, 16, 64, 256];
/// Connections measured by `--quick`.
const QUICK_CONNS: [usize; 2] = [1, 16];
/// Keys pre-filled for the own generator (uniform choice).
const KEYS: usize = 10_000;
/// Share of `set`s, percent (memcaslap's 9:1 `get`:`set`).
const WRITE_PERCENT: u32 = 10;
/// Seconds of one memcaslap run (its `-t` counts whole seconds).
const SLAP_SECS: u64 = 1;
/// Operations of one memcaslap run with `--quick` (`-x`).
const QUICK_SLAP_OPS: usize = 2_000;
/// Share of memcaslap's `get`s whose value it checks (`-v`).
const SLAP_VERIFY: &str = "0.1";
/// memcaslap's command file: 16-byte keys (its minimum) and values, 10% `set`, 90% `get`.
const SLAP_CONFIG: &str = "key\n16 16 1\nvalue\n16 16 1\ncmd\n0 0.1\n1 0.9\n";

/// A server measured: kind, binary, name, extra options (see [`crate::kvs::systems`]).
type System<'a> = (Kind, &'a Path, String, &'static [&'static str]);

/// `memcaslap` from `PATH`.
pub fn memcaslap_binary() -> anyhow::Result<PathBuf> {
    in_path("memcaslap").context(
        "memcaslap is not installed (not found in PATH): install it with \
         `apt-get install libmemcached-tools` (the unpipelined kvs benchmark uses it as an \
         independent load generator)",
    )
}

/// What one memcaslap run reported.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slap {
    /// Operations completed.
    pub ops: u64,
    /// Operations per second, as memcaslap computed them.
    pub tps: f64,
    /// Mean latency of all operations, µs.
    pub mean_us: f64,
}

/// Reads memcaslap's report (its standard output), checking that every `get` found its key and
/// every verified value was the one written.
pub fn parse_slap(out: &str) -> anyhow::Result<Slap> {
    let field = |name: &str| -> Option<&str> {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
    };
    let number = |name: &str| -> anyhow::Result<f64> {
        field(name)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("memcaslap's report has no `{name}`: {out}"))
    };
    for check in ["get_misses:", "verify_misses:", "verify_failed:"] {
        let n = number(check)?;
        ensure!(n == 0.0, "memcaslap reports {check} {n}");
    }
    let summary = out
        .lines()
        .find(|l| l.starts_with("Run time:"))
        .with_context(|| format!("memcaslap's report has no `Run time:` line: {out}"))?;
    let after = |tag: &str| -> anyhow::Result<f64> {
        summary
            .split(tag)
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no `{tag}` in memcaslap's `{summary}`"))
    };
    let ops = after("Ops:")? as u64;
    ensure!(ops > 0, "memcaslap completed no operation: {summary}");
    // "Total Statistics (N events)" is followed by Min/Max/Avg lines.
    let total = out
        .split("Total Statistics")
        .nth(1)
        .with_context(|| format!("memcaslap's report has no `Total Statistics`: {out}"))?;
    let mean_us = total
        .lines()
        .find_map(|l| l.trim().strip_prefix("Avg:"))
        .and_then(|v| v.trim().parse().ok())
        .context("memcaslap's `Total Statistics` has no `Avg:`")?;
    Ok(Slap {
        ops,
        tps: after("TPS:")?,
        mean_us,
    })
}

/// Runs memcaslap once against `addr` with `conns` connections.
fn slap(
    program: &Path,
    config: &Path,
    addr: SocketAddr,
    conns: usize,
    quick: bool,
) -> anyhow::Result<Slap> {
    let mut cmd = Command::new(program);
    cmd.arg("-s")
        .arg(addr.to_string())
        .args([
            "-T",
            "1",
            "-c",
            &conns.to_string(),
            "-X",
            "16",
            "-v",
            SLAP_VERIFY,
        ])
        .arg("-F")
        .arg(config);
    if quick {
        // At least one operation per connection.
        cmd.args(["-x", &QUICK_SLAP_OPS.max(conns).to_string()]);
    } else {
        cmd.args(["-t", &format!("{SLAP_SECS}s")]);
    }
    // `-S` makes memcaslap print its latency statistics.
    cmd.args(["-S", &format!("{}s", SLAP_SECS + 60)]);
    let out = cmd.output().context("running memcaslap")?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "memcaslap against {addr} failed ({}): {}{}",
        out.status,
        text.trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    parse_slap(&text)
}

fn own_id(conns: usize) -> String {
    format!("own/{conns}")
}

/// The id of panel `id` (`own`, `memcaslap/mean`, ...) for `condition`.
fn panel_id(condition: Condition, id: &str) -> String {
    format!("{}/{id}", condition.label())
}

/// Runs the experiment and returns its figure.
pub fn run(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let conns: &[usize] = if ctx.quick { &QUICK_CONNS } else { &CONNS };
    let conditions = Condition::both();
    let threads = ctx.cores;
    let kvs_path = kvs_binary(ctx)?;
    let mc_path = memcached_binary()?;
    let slap_path = memcaslap_binary()?;
    let kvs_version = version(&kvs_path, "-V");
    let mc_version = version(&mc_path, "-V");
    let kvs_name = "kvs".to_owned();
    let mc_name = mc_version.clone();
    let [kvs, one_trustee, memcached] = systems(&kvs_path, &mc_path, &mc_name);
    let no_spin: System = (
        Kind::Kvs,
        &kvs_path,
        KVS_NO_SPIN.to_owned(),
        &["--spin-us", "0"],
    );
    let systems: Vec<System> = [kvs, no_spin, one_trustee, memcached]
        .into_iter()
        .filter(|(_, _, name, _)| ctx.selected(name))
        .collect();
    ensure!(
        !systems.is_empty(),
        "--only selected none of `{kvs_name}`, `{KVS_NO_SPIN}`, `{KVS_ONE_TRUSTEE}` and `{mc_name}`"
    );
    let baseline = systems
        .iter()
        .any(|s| s.0 == Kind::Memcached)
        .then(|| mc_name.clone());
    let slap_mode = if ctx.quick {
        format!("`-x {QUICK_SLAP_OPS}` operations")
    } else {
        format!("`-t {SLAP_SECS}s`")
    };
    let mut fig = Figure {
        name: "kvs-unpipelined".into(),
        title: "kvs against memcached with one request in flight per connection".into(),
        notes: vec![
            format!(
                "Servers: `{kvs_version}` ({}) and `{mc_version}` ({}), each with {threads} worker \
                 threads and {MEMORY_MB} MB, on 127.0.0.1 of the same machine as the generator, \
                 started as in the `kvs` figure (`-t {threads} -m {MEMORY_MB} -c 1024 -U 0`, memcached \
                 with `-o hashpower`); kvs once as configured by default (one shard per worker, every \
                 worker a trustee; an idle worker polls for 50 µs before it blocks), again with \
                 `--spin-us 0` (`{KVS_NO_SPIN}`: an idle worker blocks at once, leaving the cores to \
                 the generator) and once with `--shards 1` (`{KVS_ONE_TRUSTEE}`: the whole table on \
                 one trustee, the other worker only reads, forwards and writes). Only the server being \
                 measured runs (the others are stopped with SIGSTOP); they take turns run by run. The generator shares the {} cores with \
                 the server.",
                shown(&kvs_path),
                shown(&mc_path),
                ctx.cores
            ),
            format!(
                "Own generator (`src/memcache.rs`): one OS thread polling every connection; each \
                 connection has exactly one request in flight (`get`, or `set` with a reply, \
                 {WRITE_PERCENT}% `set`s), 8-byte keys chosen uniformly from {} pre-filled keys, \
                 16-byte values. Every answer is checked as in the `kvs` figure. Latency runs from \
                 writing a request to reading its answer (HDR histogram).",
                count(KEYS as f64)
            ),
            format!(
                "memcaslap: `{} -s 127.0.0.1:PORT -T 1 -c CONNS -X 16 -v {SLAP_VERIFY} -F CFG` with \
                 {slap_mode} per run, CFG giving 16-byte keys and values and 9:1 `get`:`set` \
                 (`key 16 16 1`, `value 16 16 1`, `cmd 0 0.1`, `cmd 1 0.9`). It runs against a \
                 fresh pair of servers after the own generator's runs; its throughput is its own \
                 `TPS`, its latency the mean of its `Total Statistics` (it reports no percentiles). \
                 A run fails if memcaslap fails, or reports a `get` miss or a value that fails \
                 its verification.",
                slap_path.display()
            ),
            format!(
                "Conditions: every connection count is measured idle and then loaded: beside one \
                 `sh -c 'while :; do :; done'` process per core ({}), each pinned to its core, \
                 started before that condition's runs and killed after them. The panels' ids \
                 in the CSV begin with the condition.",
                conditions[1].label()
            ),
        ],
        panels: Vec::new(),
        columns: 2,
        extra_markdown: String::new(),
    };
    let x_label = "concurrent connections (log)";
    for condition in conditions {
        for (id, title, y_label, plotted) in [
            (
                "own",
                "own generator: throughput",
                "throughput, kops/s",
                true,
            ),
            (
                "own/p99",
                "own generator: p99 latency",
                "p99 latency, µs",
                true,
            ),
            (
                "own/p50",
                "own generator: p50 latency",
                "p50 latency, µs",
                false,
            ),
            (
                "memcaslap",
                "memcaslap: throughput",
                "throughput, kops/s",
                true,
            ),
            (
                "memcaslap/mean",
                "memcaslap: mean latency",
                "mean latency, µs",
                true,
            ),
        ] {
            let mut p = Panel::new(
                panel_id(condition, id),
                format!("{title} ({})", condition.label()),
            );
            p.x_label = x_label.into();
            p.y_label = y_label.into();
            p.baseline = baseline.clone();
            p.plotted = plotted;
            fig.panels.push(p);
        }
    }

    ctx.begin(
        "kvs-unpipelined",
        (2 * conditions.len() * conns.len() * ctx.runs * systems.len()) as u64,
    );
    // Own generator.
    let mut suts = Vec::new();
    for (kind, path, name, extra) in &systems {
        let mut s = Sut::start(*kind, path, name, extra, threads, KEYS)?;
        ctx.status(format!("{name} prefill {}", count(KEYS as f64)));
        s.grow(KEYS)?;
        s.process.pause()?;
        suts.push(s);
    }
    let stream = Stream::new(Dist::Uniform, KEYS, 0x1D1);
    let warmup = (ctx.window / 4).min(Duration::from_millis(50));
    // Ascending, so that every value a client reads was stamped by a connection number it has.
    for &c in conns {
        let mut clients = Vec::new();
        for s in &mut suts {
            s.process.resume()?;
            let client = Client::connect(s.process.addr(), 1, c)
                .with_context(|| format!("{}: opening {c} connections", s.name));
            s.process.pause()?;
            clients.push(client?);
        }
        for condition in conditions {
            let _busy = condition.start()?;
            for rep in 0..ctx.runs {
                for i in turns(suts.len(), rep) {
                    let s = &mut suts[i];
                    ctx.status(format!(
                        "{} own generator, {c} connections, {}, run {}",
                        s.name,
                        condition.label(),
                        rep + 1
                    ));
                    let load = Load {
                        stream: &stream,
                        write_percent: WRITE_PERCENT,
                        depth: 1,
                        warmup,
                        window: ctx.window,
                        seed: rep as u64,
                    };
                    s.process.resume()?;
                    let result = clients[i].run(&load);
                    s.process.pause()?;
                    let (tally, elapsed) = result.with_context(|| {
                        format!("kvs-unpipelined: {} with {c} connections", s.name)
                    })?;
                    ensure!(
                        tally.ops > 0,
                        "{}: no answer in the {} ms window ({c} connections)",
                        s.name,
                        ctx.window.as_millis()
                    );
                    let x = c as f64;
                    fig.panel_mut(&panel_id(condition, "own")).add(
                        &s.name,
                        x,
                        tally.ops as f64 / elapsed.as_secs_f64() / 1e3,
                    );
                    for (id, q) in [("own/p50", 0.5), ("own/p99", 0.99)] {
                        let us = tally.hist.value_at_quantile(q) as f64 / 1e3;
                        fig.panel_mut(&panel_id(condition, id)).add(&s.name, x, us);
                    }
                    ctx.tick();
                }
            }
        }
        drop(clients);
        for s in &mut suts {
            s.process.resume()?;
            let checked = s.check_table(KEYS);
            s.process.pause()?;
            checked.with_context(|| own_id(c))?;
        }
    }
    drop(suts);

    // memcaslap, against fresh servers.
    let config =
        std::env::temp_dir().join(format!("gsm-bench-memcaslap-{}.cfg", std::process::id()));
    std::fs::write(&config, SLAP_CONFIG)
        .with_context(|| format!("writing {}", config.display()))?;
    let slapped = run_slap(ctx, &mut fig, &systems, conns, &slap_path, &config, threads);
    let _ = std::fs::remove_file(&config);
    slapped?;
    ctx.finish();
    if let Some(base) = &baseline {
        let kvs: Vec<&str> = systems
            .iter()
            .filter(|s| s.0 == Kind::Kvs)
            .map(|s| s.2.as_str())
            .collect();
        fig.extra_markdown = goals(&fig, &kvs, base, &conditions);
    }
    Ok(fig)
}

/// The order the servers take turns in run `rep`.
pub(crate) fn turns(n: usize, rep: usize) -> Vec<usize> {
    if rep.is_multiple_of(2) {
        (0..n).collect()
    } else {
        (0..n).rev().collect()
    }
}

fn run_slap(
    ctx: &mut Ctx,
    fig: &mut Figure,
    systems: &[System],
    conns: &[usize],
    program: &Path,
    config: &Path,
    threads: usize,
) -> anyhow::Result<()> {
    let mut suts = Vec::new();
    for (kind, path, name, extra) in systems {
        let mut s = Sut::start(*kind, path, name, extra, threads, KEYS)?;
        s.process.pause()?;
        suts.push(s);
    }
    for &c in conns {
        for condition in Condition::both() {
            let _busy = condition.start()?;
            for rep in 0..ctx.runs {
                for i in turns(suts.len(), rep) {
                    let s = &mut suts[i];
                    ctx.status(format!(
                        "{} memcaslap, {c} connections, {}, run {}",
                        s.name,
                        condition.label(),
                        rep + 1
                    ));
                    s.process.resume()?;
                    let result = slap(program, config, s.process.addr(), c, ctx.quick);
                    s.process.pause()?;
                    let r = result.with_context(|| {
                        format!(
                            "kvs-unpipelined: memcaslap against {} with {c} connections",
                            s.name
                        )
                    })?;
                    let x = c as f64;
                    fig.panel_mut(&panel_id(condition, "memcaslap"))
                        .add(&s.name, x, r.tps / 1e3);
                    fig.panel_mut(&panel_id(condition, "memcaslap/mean"))
                        .add(&s.name, x, r.mean_us);
                    ctx.tick();
                }
            }
        }
    }
    Ok(())
}

/// The goals, reported (not asserted): kvs at least memcached's throughput at every
/// connection count, at least 1.3× it from 64 connections, and a p99 latency no worse; in each
/// condition.
fn goals(fig: &Figure, kvs: &[&str], base: &str, conditions: &[Condition]) -> String {
    let ratio = |id: &str, system: &str, x: f64| {
        Some(fig.median(id, system, x)? / fig.median(id, base, x)?)
    };
    let mut out = String::new();
    let _ = writeln!(out, "## Goals (reported, not asserted)\n");
    let _ = writeln!(
        out,
        "Ratios to memcached of the medians. Goal: throughput ≥ 1.0× at every connection count and \
         ≥ 1.3× from 64 on; p99 latency (own generator) ≤ 1.0×.\n"
    );
    for &condition in conditions {
        let id = |panel: &str| panel_id(condition, panel);
        let xs = fig
            .panels
            .iter()
            .find(|p| p.id == id("own"))
            .map(Panel::xs)
            .unwrap_or_default();
        for system in kvs {
            let _ = writeln!(out, "### `{system}` ({})\n", condition.label());
            let _ = writeln!(
                out,
                "| connections | own throughput | memcaslap throughput | own p99 latency | met |"
            );
            let _ = writeln!(out, "| ---: | ---: | ---: | ---: | --- |");
            let (mut met, mut total) = (0, 0);
            for &x in &xs {
                let want = if x >= 64.0 { 1.3 } else { 1.0 };
                let own = ratio(&id("own"), system, x);
                let slap = ratio(&id("memcaslap"), system, x);
                let p99 = ratio(&id("own/p99"), system, x);
                let ok = own.is_some_and(|r| r >= want)
                    && slap.is_some_and(|r| r >= want)
                    && p99.is_some_and(|r| r <= 1.0);
                total += 1;
                met += usize::from(ok);
                let cell = |r: Option<f64>| r.map_or("–".to_owned(), |r| format!("×{}", sig(r)));
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} |",
                    count(x),
                    cell(own),
                    cell(slap),
                    cell(p99),
                    if ok { "yes" } else { "**no**" }
                );
            }
            let _ = writeln!(out, "\nMet at {met} of {total} connection counts.\n");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "servers: 127.0.0.1:29911\nthreads count: 1\nconcurrency: 4\n\
        Total Statistics (91463 events)\n   Min:         9\n   Max:      9387\n   Avg:        87\n\
        cmd_get: 82318\ncmd_set: 9149\nget_misses: 0\nverify_misses: 0\nverify_failed: 0\n\
        written_bytes: 2240911\n\nRun time: 2.0s Ops: 91467 TPS: 45729 Net_rate: 3.1M/s\n";

    #[test]
    fn reads_memcaslaps_report() {
        let r = parse_slap(REPORT).unwrap();
        assert_eq!(
            r,
            Slap {
                ops: 91467,
                tps: 45729.0,
                mean_us: 87.0
            }
        );
    }

    #[test]
    fn a_miss_or_a_bad_value_fails() {
        for (good, bad) in [
            ("get_misses: 0", "get_misses: 3"),
            ("verify_failed: 0", "verify_failed: 1"),
        ] {
            let e = parse_slap(&REPORT.replace(good, bad))
                .unwrap_err()
                .to_string();
            assert!(e.contains(bad), "{e}");
        }
        assert!(parse_slap("Run time: 1.0s Ops: 0 TPS: 0").is_err());
    }
}
