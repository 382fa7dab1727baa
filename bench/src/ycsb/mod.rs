//! `ycsb`: kvs across a rack against Redis Cluster and memcached with ketama, under YCSB's
//! workloads C and D (seed 000, Figures 23–24), 1 to 4 server processes on this host.
//!
//! * [`generators`]: YCSB's key choosers, exactly (`tests/ycsb_java.rs` checks them against
//!   YCSB's own classes);
//! * [`client`]: YCSB's records and operations over memcached's protocol and RESP, routed as
//!   each system's clients route them, one request in flight per client;
//! * [`systems`]: starting the three systems with the same number of single-threaded server
//!   processes.
//!
//! For each server count: the three systems start, each is loaded with YCSB's records, and
//! then workload C and workload D run, the systems taking turns run by run (the others
//! stopped). Workload D's inserts grow each system's own table across its runs.

pub mod client;
pub mod generators;
pub mod hosts;
pub mod systems;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};

use crate::figure::{Figure, Panel, count, sig};
use crate::harness::Ctx;
use client::{Client, KeySpace, VALUE_LEN, Workload, load};
use hosts::Hosts;
use systems::{Kind, Programs, System};

/// YCSB records loaded (its default record count for these figures: 10^6 of 1 KB).
const RECORDS: u64 = 1_000_000;
/// Records with `--quick`.
const QUICK_RECORDS: u64 = 10_000;
/// Server processes per system.
const SERVERS: [usize; 4] = [1, 2, 3, 4];
/// Server processes with `--quick`.
const QUICK_SERVERS: [usize; 2] = [1, 3];
/// Logical clients, one request in flight each.
const CLIENTS: usize = 32;
/// Stores in flight per server while loading.
const LOAD_BATCH: usize = 256;
/// Hosts of the multi-host run (network namespaces), one server of each system on each.
const HOSTS: usize = 3;

/// The panels: (id suffix, title, y label, plotted).
const METRICS: [(&str, &str, &str, bool); 4] = [
    ("", "throughput", "throughput, kops/s", true),
    ("/p99", "p99 latency", "p99 latency, µs", true),
    (
        "/cpu",
        "server CPU per operation",
        "µs of CPU per operation, all server processes",
        true,
    ),
    ("/p50", "p50 latency", "p50 latency, µs", false),
];

fn workload_id(w: Workload) -> &'static str {
    match w {
        Workload::C => "C",
        Workload::D => "D",
    }
}

/// Runs the experiment (see the module docs).
pub fn run(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let records = if ctx.quick { QUICK_RECORDS } else { RECORDS };
    let servers: &[usize] = if ctx.quick { &QUICK_SERVERS } else { &SERVERS };
    let programs = Programs::find(ctx)?;
    let redis_version = crate::kvs::version(&programs.redis, "--version");
    let mc_version = crate::kvs::version(&programs.memcached, "-V");
    let redis_short = redis_version
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .unwrap_or("?")
        .to_owned();
    let names = [
        (Kind::Kvs, "kvs (rack)".to_owned()),
        (Kind::Redis, format!("Redis Cluster {redis_short}")),
        (Kind::Memcached, format!("{mc_version} + ketama")),
    ];
    let chosen: Vec<(Kind, String)> = names
        .iter()
        .filter(|(_, n)| ctx.selected(n))
        .cloned()
        .collect();
    ensure!(!chosen.is_empty(), "--only selected none of {names:?}");
    let warmup = warmup(ctx);
    let mut fig = Figure {
        name: "ycsb".into(),
        title: "kvs across a rack vs. Redis Cluster and memcached + ketama, YCSB C and D".into(),
        notes: vec![
            format!(
                "YCSB's core workloads as `site.ycsb:core` 0.17.0 defines them, implemented in \
                 `src/ycsb/generators.rs` and checked against YCSB's own generators by \
                 `tests/ycsb_java.rs`: {} records (`recordcount`) of ten 100-byte fields, stored \
                 as one {VALUE_LEN}-byte value under YCSB's key `user<fnvhash64(n)>`, loaded in \
                 key-number order (YCSB's load phase, {LOAD_BATCH} stores in flight per server). \
                 Workload C: 100% reads, keys from YCSB's scrambled Zipfian (constant 0.99). \
                 Workload D: 95% reads of keys from YCSB's skewed-latest chooser over the \
                 inserts acknowledged so far, 5% inserts of new records; its inserts accumulate \
                 over the runs. Every read is checked against the record's bytes; a miss fails \
                 the run.",
                count(records as f64)
            ),
            format!(
                "Every system runs N single-threaded server processes on 127.0.0.1 (N on the x \
                 axis) on the same {} cores as the client: kvs as an N-rank rack job (`kvs -t 1 \
                 --spin-us 0 -p PORT0,…` per rank: idle workers block at once, as the peers' event \
                 loops do, the variables of `gsm run`, links through shared memory; \
                 a request reaching any rank is applied on its key's shard, one shard per rank); \
                 `{redis_version}` as a Redis Cluster of N masters, no replicas, no persistence, \
                 slots in N equal ranges; `{mc_version}` as N instances (`-t 1`), the client \
                 choosing by ketama (libketama's continuum, MD5). Item memory per server is sized \
                 for the records with room to spare; nothing is evicted.",
                ctx.cores
            ),
            format!(
                "The client: {CLIENTS} logical clients (YCSB's client threads), each with exactly \
                 one request in flight, driven by one thread through epoll; kvs's clients each \
                 hold one connection, to rank `client mod N`; Redis Cluster's and memcached's a \
                 connection to every server, each request sent to its key's server (slot table \
                 from `CLUSTER SLOTS`; ketama). Latency runs from writing a request to reading \
                 its whole answer. Server CPU per operation: the CPU time of every thread of the \
                 system's processes over a run (the kernel's schedstat), divided by the answers \
                 of the run. Each run warms up for {} ms, then measures for {} ms; only the \
                 measured system runs (the others are stopped with SIGSTOP), turns alternating \
                 run by run.",
                warmup.as_millis(),
                ctx.window.as_millis()
            ),
            format!(
                "The multi-host run (the `3 on {HOSTS} hosts` row of the goals, and the `hosts/` \
                 panels of the CSV): {HOSTS} network namespaces on one switch (a bridge), one \
                 server of each system per host on its own address, the client on a fourth \
                 host; kvs's ranks link over TCP. The hosts share this machine's cores: the run \
                 adds the network path (veth and bridge) and TCP between kvs's ranks, not CPU."
            ),
        ],
        panels: Vec::new(),
        columns: 3,
        extra_markdown: String::new(),
    };
    let baseline = chosen
        .iter()
        .find(|(k, _)| *k == Kind::Redis)
        .map(|(_, n)| n.clone());
    for on_hosts in [false, true] {
        for w in [Workload::C, Workload::D] {
            for (suffix, what, y_label, plotted) in METRICS {
                let id = panel_id(w, suffix, on_hosts);
                let place = if on_hosts {
                    format!(", {HOSTS} hosts")
                } else {
                    String::new()
                };
                let mut p = Panel::new(&id, format!("workload {}{place}: {what}", workload_id(w)));
                p.x_label = "server processes".into();
                p.y_label = y_label.into();
                p.log_x = false;
                p.baseline = baseline.clone();
                // The multi-host run is one point: its numbers are in the goals table.
                p.plotted = plotted && !on_hosts;
                fig.panels.push(p);
            }
        }
    }
    // Every server count, then the run on hosts.
    ctx.begin(
        "ycsb",
        ((servers.len() + 1) * 2 * ctx.runs * chosen.len()) as u64,
    );
    let setup = Setup {
        chosen,
        programs,
        records,
    };
    let mut load_secs = Vec::new();
    for &n in servers {
        measure(ctx, &setup, &mut fig, &mut load_secs, n, None)?;
    }
    // The same on hosts of their own: one server of each system per host.
    // Without root (or `ip`) there are no hosts to make: the run says so and goes on, unless
    // GSM_REQUIRE_NETNS=1 (the test command's) makes that a failure.
    match Hosts::new(HOSTS) {
        Ok(hosts) => {
            let on_hosts = hosts.run_as_client(|| {
                measure(ctx, &setup, &mut fig, &mut load_secs, HOSTS, Some(&hosts))
            });
            drop(hosts);
            on_hosts?;
        }
        Err(e) if std::env::var("GSM_REQUIRE_NETNS").as_deref() != Ok("1") => {
            let why = format!("{e:#}");
            ctx.println(format!("skipped the run on {HOSTS} hosts: {why}"));
            ctx.skip((2 * ctx.runs * setup.chosen.len()) as u64);
            fig.notes
                .push(format!("The run on {HOSTS} hosts was skipped: {why}."));
        }
        Err(e) => {
            return Err(e.context("building hosts in network namespaces (GSM_REQUIRE_NETNS=1)"));
        }
    }
    ctx.finish();
    let mut extra = String::new();
    let _ = writeln!(extra, "## Load phase\n");
    let _ = writeln!(
        extra,
        "Seconds to store the {} records (one run each, not a measurement of record):\n",
        count(records as f64)
    );
    let _ = writeln!(extra, "| system | servers | seconds |");
    let _ = writeln!(extra, "| --- | --- | ---: |");
    for (name, place, secs) in &load_secs {
        let _ = writeln!(extra, "| {name} | {place} | {} |", sig(*secs));
    }
    let name_of = |kind: Kind| {
        setup
            .chosen
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|c| c.1.clone())
    };
    if let (Some(kvs), Some(redis), Some(mc)) = (
        name_of(Kind::Kvs),
        name_of(Kind::Redis),
        name_of(Kind::Memcached),
    ) {
        extra.push_str(&goals(&fig, &kvs, &redis, &mc));
    }
    fig.extra_markdown = extra;
    Ok(fig)
}

/// The panel id of `metric` of workload `w` (`C`, `C/p99`, …), under `hosts/` for the
/// multi-host run.
fn panel_id(w: Workload, suffix: &str, on_hosts: bool) -> String {
    format!(
        "{}{}{suffix}",
        if on_hosts { "hosts/" } else { "" },
        workload_id(w)
    )
}

/// What every measurement of a run shares: the systems chosen, their programs, the records.
struct Setup {
    chosen: Vec<(Kind, String)>,
    programs: Programs,
    records: u64,
}

/// Starts the chosen systems with `n` servers each (on `hosts`, or on 127.0.0.1), loads them,
/// and runs workloads C and D, turn by turn, into the figure; each load's seconds go to
/// `load_secs`.
fn measure(
    ctx: &mut Ctx,
    setup: &Setup,
    fig: &mut Figure,
    load_secs: &mut Vec<(String, String, f64)>,
    n: usize,
    hosts: Option<&Hosts>,
) -> anyhow::Result<()> {
    let Setup {
        chosen,
        programs,
        records,
    } = setup;
    let records = *records;
    let servers = if n == 1 {
        "1 server".to_owned()
    } else {
        format!("{n} servers")
    };
    let place = match hosts {
        Some(h) => format!("{servers} on {} hosts", h.count()),
        None => servers,
    };
    let warmup = warmup(ctx);
    let mut running = Vec::new();
    for (kind, name) in chosen {
        ctx.status(format!("{name}: starting {place}"));
        let mut system = System::start(*kind, name, programs, n, records, hosts)?;
        ctx.status(format!("{name}: loading {} records", count(records as f64)));
        system.resume()?;
        let t0 = Instant::now();
        let loaded = load(&system.target, records, LOAD_BATCH)
            .with_context(|| format!("loading {name} ({place})"));
        let clients = loaded.and_then(|()| Client::connect(&system.target, CLIENTS));
        system.pause()?;
        let client = clients.with_context(|| format!("{name} ({place})"))?;
        load_secs.push((name.clone(), place.clone(), t0.elapsed().as_secs_f64()));
        running.push((system, client, KeySpace::loaded(records)));
    }
    for w in [Workload::C, Workload::D] {
        for rep in 0..ctx.runs {
            for i in crate::kvs_unpipelined::turns(running.len(), rep) {
                let (system, client, keys) = &mut running[i];
                ctx.status(format!(
                    "{}: workload {}, {place}, run {}",
                    system.name,
                    workload_id(w),
                    rep + 1
                ));
                system.resume()?;
                let seed = (n * 1000 + rep) as u64;
                let cpu_before = system.cpu_ns()?;
                let outcome = client.run(keys, w, warmup, ctx.window, seed);
                let cpu = system.cpu_ns()? - cpu_before;
                system.pause()?;
                let o = outcome.with_context(|| {
                    format!(
                        "ycsb: {} ({place}), workload {}",
                        system.name,
                        workload_id(w)
                    )
                })?;
                ensure!(
                    o.ops > 0,
                    "{} ({place}): no answer in the {} ms window",
                    system.name,
                    ctx.window.as_millis()
                );
                let x = n as f64;
                let on_hosts = hosts.is_some();
                fig.panel_mut(&panel_id(w, "", on_hosts)).add(
                    &system.name,
                    x,
                    o.ops as f64 / o.elapsed.as_secs_f64() / 1e3,
                );
                fig.panel_mut(&panel_id(w, "/cpu", on_hosts)).add(
                    &system.name,
                    x,
                    cpu as f64 / o.answered as f64 / 1e3,
                );
                for (suffix, q) in [("/p99", 0.99), ("/p50", 0.5)] {
                    let us = o.hist.value_at_quantile(q) as f64 / 1e3;
                    fig.panel_mut(&panel_id(w, suffix, on_hosts))
                        .add(&system.name, x, us);
                }
                ctx.tick();
            }
        }
    }
    let grown: Vec<String> = running
        .iter()
        .map(|(s, _, k)| format!("{} {}", s.name, count(k.records() as f64)))
        .collect();
    ctx.println(format!(
        "{place}: records after workload D: {}",
        grown.join(", ")
    ));
    Ok(())
}

/// The warm-up of each run.
fn warmup(ctx: &Ctx) -> Duration {
    (ctx.window / 4).max(Duration::from_millis(10))
}

/// The goals, reported (not asserted): workload C ≥ 2× Redis Cluster and ≥ 1.5×
/// memcached + ketama at every server count, workload D ≥ 1.5× Redis Cluster, and a p99 no
/// worse than either in both.
fn goals(fig: &Figure, kvs: &str, redis: &str, mc: &str) -> String {
    let median = |id: &str, system: &str, x: f64| fig.median(id, system, x);
    let ratio = |id: &str, base: &str, x: f64| Some(median(id, kvs, x)? / median(id, base, x)?);
    let cell = |r: Option<f64>, ok: bool| {
        r.map_or("–".to_owned(), |r| {
            format!("×{}{}", sig(r), if ok { "" } else { " **no**" })
        })
    };
    let mut out = String::new();
    let _ = writeln!(out, "\n## Goals (reported, not asserted)\n");
    let _ = writeln!(
        out,
        "Ratios of kvs's medians to each peer's at the same server count. Goals: workload C \
         throughput ≥ 2× Redis Cluster and ≥ 1.5× memcached + ketama; workload D throughput ≥ \
         1.5× Redis Cluster; p99 latency ≤ 1× either in both workloads.\n"
    );
    let _ = writeln!(
        out,
        "| servers | C vs Redis | C vs memcached | D vs Redis | D vs memcached | C p99 vs Redis | C p99 vs memcached | D p99 vs Redis | D p99 vs memcached |"
    );
    let _ = writeln!(
        out,
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    let xs = |id: &str| {
        fig.panels
            .iter()
            .find(|p| p.id == id)
            .map(Panel::xs)
            .unwrap_or_default()
    };
    let rows = xs("C").into_iter().map(|x| ("", x, count(x))).chain(
        xs("hosts/C")
            .into_iter()
            .map(|x| ("hosts/", x, format!("{} on {HOSTS} hosts", count(x)))),
    );
    let (mut met, mut total) = (0, 0);
    for (prefix, x, label) in rows {
        let mut row = format!("| {label} ");
        for (id, base, want, higher) in [
            ("C", redis, 2.0, true),
            ("C", mc, 1.5, true),
            ("D", redis, 1.5, true),
            ("D", mc, 0.0, true),
            ("C/p99", redis, 1.0, false),
            ("C/p99", mc, 1.0, false),
            ("D/p99", redis, 1.0, false),
            ("D/p99", mc, 1.0, false),
        ] {
            let r = ratio(&format!("{prefix}{id}"), base, x);
            let ok = r.is_some_and(|r| if higher { r >= want } else { r <= want });
            if want > 0.0 {
                total += 1;
                met += usize::from(ok);
            }
            let _ = write!(row, "| {} ", cell(r, ok || want == 0.0));
        }
        let _ = writeln!(out, "{row}|");
    }
    let _ = writeln!(
        out,
        "\nMet {met} of {total} (D against memcached has no goal and is shown for reference).\n"
    );
    out
}
