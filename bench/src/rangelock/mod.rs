//! `rangelock`: the range lock of `crates/rangelock` against the designs of seed 002, under
//! the seed's workloads L (network latencies, Table 5), M (the micro-benchmark, §5.2.2) and
//! O (the OLTP-like mix, §5.2.3).
//!
//! Systems: the lock's own notification modes (`Deferred`, the trustee answers when the
//! range frees; `PollRpc` and `PollFlag` with flags 1 and 64 bytes apart, the seed's two
//! combiner designs); `launch` (a server fiber per waiter, `launch`); the interval-tree
//! server with 1 and 2 handler threads (`tree`); and the client-side designs on one-sided
//! regions, static segmentation (`segments`) and Citron with leaf bitmaps and in the seed's
//! all-internal variant (`citron`).
//!
//! Each system gets a rack of 3 ranks: rank 0 holds the lock (the server, on one core),
//! ranks 1 and 2 run the client fibers (on the other core). The systems take turns in one
//! run: while one is measured, every rank of the others is stopped (`SIGSTOP`). Per run:
//! locks per second, p50/p99 from the lock call to the grant, the least locks of one client
//! over its role's mean, the server's CPU time per lock (every thread of rank 0, from
//! `/proc`), and round trips per lock (what the clients waited on). Before measuring, every
//! system runs M and O under the checker: holders stamp a shadow region on the server at the
//! grant and check the stamps at the release (`--check` runs only that). All of it once
//! through shared memory and once over TCP.

mod citron;
mod launch;
mod segments;
mod server;
mod tree;

pub(crate) use server::Server;

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context as _, ensure};

use crate::figure::{Figure, Panel};
use crate::harness::Ctx;
use crate::rack::child::{self, Child};
use crate::rack::{PATIENCE, goal_row, median, rack_env, with_fresh_port};

/// One system: its name in results, its word in commands, its server's workers.
struct System {
    name: &'static str,
    word: &'static str,
    server_workers: u32,
    kind: Kind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Trustee,
    Polling,
    Launch,
    Tree,
    ClientSide,
}

const DEFERRED: &str = "Deferred";
const POLL_RPC: &str = "PollRpc";

const SYSTEMS: [System; 10] = [
    System {
        name: DEFERRED,
        word: "deferred",
        server_workers: 1,
        kind: Kind::Trustee,
    },
    System {
        name: POLL_RPC,
        word: "poll-rpc",
        server_workers: 1,
        kind: Kind::Polling,
    },
    System {
        name: "PollFlag (1 B)",
        word: "poll-byte",
        server_workers: 1,
        kind: Kind::Polling,
    },
    System {
        name: "PollFlag (64 B)",
        word: "poll-line",
        server_workers: 1,
        kind: Kind::Polling,
    },
    System {
        name: "launch",
        word: "launch",
        server_workers: 1,
        kind: Kind::Launch,
    },
    System {
        name: "interval tree (1 thread)",
        word: "tree-1",
        server_workers: 1,
        kind: Kind::Tree,
    },
    System {
        name: "interval tree (2 threads)",
        word: "tree-2",
        server_workers: 2,
        kind: Kind::Tree,
    },
    System {
        name: "static segmentation",
        word: "segments",
        server_workers: 1,
        kind: Kind::ClientSide,
    },
    System {
        name: "Citron",
        word: "citron",
        server_workers: 1,
        kind: Kind::ClientSide,
    },
    System {
        name: "Citron (all internal)",
        word: "citron-internal",
        server_workers: 1,
        kind: Kind::ClientSide,
    },
];

/// One system's rack; its ranks stopped between turns.
struct Rack {
    system: &'static System,
    ranks: Vec<Child>,
}

impl Rack {
    fn start(
        me: &std::path::Path,
        system: &'static System,
        transport: &str,
    ) -> anyhow::Result<Rack> {
        with_fresh_port(|coord| Rack::start_at(me, system, transport, coord))
    }

    fn start_at(
        me: &std::path::Path,
        system: &'static System,
        transport: &str,
        coord: std::net::SocketAddr,
    ) -> anyhow::Result<Rack> {
        let secret = format!(
            "{:016x}{:016x}",
            rand::random::<u64>(),
            rand::random::<u64>()
        );
        let mut ranks = Vec::new();
        for rank in 0..3 {
            let mut env = rack_env(rank, 3, coord, &secret, transport);
            if rank == 0 {
                for (k, v) in &mut env {
                    if k == gossamer::env::WORKERS {
                        *v = system.server_workers.to_string();
                    }
                }
            }
            ranks.push(Child::start(
                me,
                &format!("{} ({transport}) rank {rank}/3", system.name),
                "gossamer",
                &[],
                &env,
            )?);
        }
        let ready = ranks[0].answer(PATIENCE).context("starting the rack")?;
        ensure!(ready == ["ready"], "rank 0 said {ready:?} instead of ready");
        // The server on one core, both client ranks on the other.
        child::pin(ranks[0].pid(), 0)?;
        child::pin(ranks[1].pid(), 1)?;
        child::pin(ranks[2].pid(), 1)?;
        let mut rack = Rack { system, ranks };
        rack.call(&format!("rl-setup {}", system.word), PATIENCE)?;
        rack.pause()?;
        Ok(rack)
    }

    fn call(&mut self, command: &str, patience: Duration) -> anyhow::Result<Vec<String>> {
        self.ranks[0]
            .call(command, patience)
            .with_context(|| format!("{}: `{command}`", self.system.name))
    }

    fn pause(&mut self) -> anyhow::Result<()> {
        self.ranks.iter_mut().try_for_each(Child::pause)
    }

    fn resume(&mut self) -> anyhow::Result<()> {
        self.ranks.iter_mut().try_for_each(Child::resume)
    }

    /// Runs `command` in this system's turn; its answer and the server's CPU time meanwhile,
    /// less its workers' idle spinning.
    fn turn(
        &mut self,
        command: &str,
        patience: Duration,
    ) -> anyhow::Result<(Measured, Option<Duration>)> {
        self.resume()?;
        let before = server_cpu(self.ranks[0].pid())?;
        let words = self.call(command, patience)?;
        let used = server_cpu(self.ranks[0].pid())? - before;
        self.pause()?;
        let m = Measured::parse(&words)?;
        // Idle spinning is CPU time that served nothing: what is left is the server's work.
        // Spin is counted in wall-clock time, so it matches CPU time only while the spinning
        // worker has its core: not for a server of 2 workers on one core.
        let worked = (self.system.server_workers == 1)
            .then(|| used.saturating_sub(Duration::from_nanos(m.spun_ns)));
        Ok((m, worked))
    }

    fn finish(mut self) -> anyhow::Result<()> {
        self.resume()?;
        for r in self.ranks {
            r.finish(PATIENCE)?;
        }
        Ok(())
    }
}

/// CPU time of every thread of `pid`, at nanosecond resolution (`schedstat`).
fn server_cpu(pid: u32) -> anyhow::Result<Duration> {
    let mut ns = 0u64;
    let dir = format!("/proc/{pid}/task");
    for task in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        let path = task?.path().join("schedstat");
        // A thread may end between the listing and the read: it no longer counts.
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let first = text.split_whitespace().next().unwrap_or("0");
        ns += first
            .parse::<u64>()
            .with_context(|| format!("{}", path.display()))?;
    }
    Ok(Duration::from_nanos(ns))
}

/// One run's figures, as rank 0 answers them.
struct Measured {
    ops: u64,
    secs: f64,
    p50_us: f64,
    p99_us: f64,
    trips: u64,
    fairness: f64,
    spun_ns: u64,
}

impl Measured {
    fn parse(words: &[String]) -> anyhow::Result<Measured> {
        ensure!(words.len() == 7, "a measurement is 7 words: {words:?}");
        Ok(Measured {
            ops: words[0].parse()?,
            secs: words[1].parse()?,
            p50_us: words[2].parse()?,
            p99_us: words[3].parse()?,
            trips: words[4].parse()?,
            fairness: words[5].parse()?,
            spun_ns: words[6].parse()?,
        })
    }
}

/// The panels of one workload point (x = clients).
struct Point {
    rate: Panel,
    p50: Panel,
    p99: Panel,
    fairness: Panel,
    cpu: Panel,
    trips: Panel,
}

impl Point {
    fn new(id: &str, title: &str) -> Point {
        let panel = |what: &str, label: &str, log_y: bool, plotted: bool| {
            let mut p = Panel::new(format!("{what}/{id}"), format!("{title}: {label}"));
            p.x_label = "clients".into();
            p.y_label = label.into();
            p.log_y = log_y;
            p.plotted = plotted;
            p.baseline = Some(DEFERRED.into());
            p
        };
        Point {
            rate: panel("rate", "locks per second (M)", true, true),
            p50: panel("p50", "p50 lock → grant (µs)", true, false),
            p99: panel("p99", "p99 lock → grant (µs)", true, false),
            fairness: panel("fairness", "least client / its role's mean", false, false),
            cpu: panel("cpu", "server CPU per lock (µs)", false, false),
            trips: panel("trips", "round trips per lock", false, false),
        }
    }

    /// Adds one run; `cpu` is `None` where it cannot be measured.
    fn add(&mut self, system: &str, clients: f64, m: &Measured, cpu: Option<Duration>) {
        let ops = m.ops as f64;
        self.rate.add(system, clients, ops / m.secs / 1e6);
        self.p50.add(system, clients, m.p50_us);
        self.p99.add(system, clients, m.p99_us);
        self.fairness.add(system, clients, m.fairness);
        if let Some(cpu) = cpu {
            self.cpu.add(system, clients, cpu.as_secs_f64() * 1e6 / ops);
        }
        self.trips.add(system, clients, m.trips as f64 / ops);
    }

    fn panels(self) -> [Panel; 6] {
        [
            self.rate,
            self.p50,
            self.p99,
            self.fairness,
            self.cpu,
            self.trips,
        ]
    }
}

/// Workload M's points: (writes %, hold µs).
fn m_mixes(quick: bool, transport: &str) -> Vec<(u64, u64)> {
    if quick {
        return vec![(20, 0)];
    }
    // Over TCP every system pays a round trip per step; holding adds little there.
    let holds: &[u64] = if transport == "shm" { &[0, 10] } else { &[0] };
    holds
        .iter()
        .flat_map(|&h| [0, 1, 20, 100].map(|w| (w, h)))
        .collect()
}

/// Runs the experiment.
pub fn run(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let me = ctx.self_exe.clone().context(
        "`rangelock` starts its ranks by running this executable again: run it as `cargo run --release -p bench -- rangelock`",
    )?;
    let systems: Vec<&'static System> = SYSTEMS.iter().filter(|s| ctx.selected(s.name)).collect();
    let clients: &[u64] = if ctx.quick { &[1, 8] } else { &[1, 2, 8, 48] };
    // UCX's too, where the bench is built with its `ucx` feature.
    let ucx: &[&str] = if cfg!(feature = "ucx") {
        &["ucx/sm", "ucx/tcp"]
    } else {
        &[]
    };
    let transports: Vec<&str> = ["shm", "tcp"].iter().chain(ucx).copied().collect();
    let mut fig = Figure {
        name: "rangelock".into(),
        title: "Range locks: a trustee that answers at the grant vs. the seed's designs".into(),
        notes: notes(ctx),
        panels: Vec::new(),
        columns: 4,
        extra_markdown: String::new(),
    };
    let turns: usize = transports
        .iter()
        .map(|t| m_mixes(ctx.quick, t).len() * clients.len() + 1)
        .sum();
    ctx.begin(
        "rangelock",
        (systems.len() * (2 + ctx.runs * turns)) as u64 + 2,
    );
    let window_ms = ctx.window.as_millis().max(1) as u64;
    let patience = ctx.window * 8 + PATIENCE;
    for spec in transports {
        // How figures name it: `ucx sm` in titles, `ucx-sm` in panel names.
        let transport = spec.replace('/', " ");
        let transport = transport.as_str();
        let id = spec.replace('/', "-");
        ctx.status(format!("starting {} racks ({transport})", systems.len()));
        let mut racks = Vec::new();
        for &s in &systems {
            racks.push(Rack::start(&me, s, spec)?);
        }
        let measured = (|| -> anyhow::Result<()> {
            // The checker first: every system, both workloads.
            let check_ms = if ctx.quick { 50 } else { 300 };
            for rack in racks.iter_mut() {
                ctx.status(format!(
                    "{} ({transport}): under the checker",
                    rack.system.name
                ));
                rack.turn(&format!("rl-m 20 0 8 {check_ms} 7 1"), patience)?;
                ctx.tick();
                rack.turn(&format!("rl-o {check_ms} 7 1"), patience)?;
                ctx.tick();
            }
            if ctx.check {
                return Ok(());
            }
            // L, from the first rack (its ranks are as any other's).
            if let Some(rack) = racks.first_mut() {
                ctx.status(format!("L ({transport})"));
                rack.resume()?;
                let count = if ctx.quick { 200 } else { 20_000 };
                let words = rack.call(&format!("rl-l {count}"), patience)?;
                rack.pause()?;
                fig.panels.push(latency_panel(&id, transport, &words)?);
                fig.extra_markdown
                    .push_str(&latency_table(transport, &words));
                ctx.tick();
            }
            let mixes = m_mixes(ctx.quick, transport);
            let mut points: Vec<Point> = mixes
                .iter()
                .map(|(w, h)| {
                    Point::new(
                        &format!("{id}/m/writes-{w}/hold-{h}us"),
                        &format!("{transport}, M, {w}% writes, hold {h} µs"),
                    )
                })
                .collect();
            let mut oltp = Point::new(&format!("{id}/o"), &format!("{transport}, O"));
            for run in 0..ctx.runs {
                for ((w, h), point) in mixes.iter().zip(points.iter_mut()) {
                    for &c in clients {
                        for rack in racks.iter_mut() {
                            let name = rack.system.name;
                            ctx.status(format!(
                                "{name} ({transport}): M {w}% writes, hold {h} µs, {c} clients"
                            ));
                            let seed = run as u64 * 1000 + c;
                            let (m, cpu) = rack.turn(
                                &format!("rl-m {w} {h} {c} {window_ms} {seed} 0"),
                                patience,
                            )?;
                            point.add(name, c as f64, &m, cpu);
                            ctx.tick();
                        }
                    }
                }
                for rack in racks.iter_mut() {
                    let name = rack.system.name;
                    ctx.status(format!("{name} ({transport}): O"));
                    let (m, cpu) =
                        rack.turn(&format!("rl-o {window_ms} {} 0", run + 1), patience)?;
                    oltp.add(name, server::O_CLIENTS as f64, &m, cpu);
                    ctx.tick();
                }
            }
            fig.extra_markdown
                .push_str(&goals(transport, &mixes, &points, &oltp, &systems));
            fig.extra_markdown.push_str(&summary(
                &format!("O ({transport})"),
                &oltp,
                server::O_CLIENTS as f64,
                &systems,
            ));
            if let Some(i) = mixes.iter().position(|&m| m == (20, 0)) {
                let c = *clients
                    .iter()
                    .filter(|&&c| c <= 8)
                    .max()
                    .expect("client counts");
                fig.extra_markdown.push_str(&summary(
                    &format!("M ({transport}), 20% writes, hold 0, {c} clients"),
                    &points[i],
                    c as f64,
                    &systems,
                ));
            }
            for p in points {
                fig.panels.extend(p.panels());
            }
            fig.panels.extend(oltp.panels());
            Ok(())
        })();
        for rack in racks {
            rack.finish()?;
        }
        measured?;
    }
    ctx.finish();
    Ok(fig)
}

/// Workload L's operations, in the order rank 0 answers them.
const LATENCY_OPS: [&str; 3] = [
    "RPC (a call, 8 B each way)",
    "one-sided read (8 B)",
    "one-sided atomic (fetch-add)",
];

fn latency_panel(id: &str, transport: &str, words: &[String]) -> anyhow::Result<Panel> {
    ensure!(words.len() == 6, "L answers 6 numbers: {words:?}");
    let mut p = Panel::new(
        format!("l/{id}"),
        format!(
            "L ({transport}): latency of one operation from another process (µs), by percentile"
        ),
    );
    p.x_label = "percentile".into();
    p.y_label = "µs".into();
    p.plotted = false;
    for (i, op) in LATENCY_OPS.into_iter().enumerate() {
        p.add(op, 50.0, words[2 * i].parse()?);
        p.add(op, 99.0, words[2 * i + 1].parse()?);
    }
    Ok(p)
}

fn notes(ctx: &Ctx) -> Vec<String> {
    vec![
        format!(
            "Each system has a rack of 3 ranks (`GSM_WORKERS=1`; the 2-thread interval tree's \
             server has 2): rank 0 holds the lock and is pinned to one core, ranks 1 and 2 run \
             the client fibers (split between them) on the other. Systems take turns; the \
             others' ranks are stopped (`SIGSTOP`). {} runs of {} ms per point; each cell the \
             median, with min–max. Once through shared memory (`shm`: one-sided operations \
             are atomics on the server's mapped heap, costing it no CPU, as RDMA would) and \
             once over TCP (`tcp`: the server's worker applies each one-sided operation, CPU \
             a NIC would spend instead).",
            ctx.runs,
            ctx.window.as_millis()
        ),
        "M: 2^16 units, a range of uniform length 1..2^11 at a uniform start for every system \
         (the seed capped static segmentation at 8 segments; not here), writes with the given \
         share, held for the given time (spinning), unlocked. O: 2^16 units in 9 files of \
         7,281 (8 data, 1 log); 39 readers (2^6 units in a random data file), 9 writers (2^6, \
         the data files in turn, 100 writes per 1,000 reads of each reader), 1 log writer \
         (2^11 in the log file, one lock per 3,200 reads); 49 clients, hold 0. L: one RPC, \
         one one-sided read and one one-sided atomic from a client rank to the server, one at \
         a time."
            .into(),
        "Latency: lock call to grant. Fairness: the least locks of one client over the mean \
         of its role, worst role. Server CPU: every thread of rank 0 (schedstat) per lock \
         granted, less the time its workers spun idle waiting for work (`trust::Stats`, each worker's `spinning`: \
         an idle worker spins 50 µs before it sleeps, so raw CPU time is about a whole core \
         whenever requests come faster than that; not given for the 2-thread interval tree, \
         whose two workers share one core, so that wall-clock spin overstates spin CPU). \
         Round trips: the operations a client \
         waited on per lock (a batch waited together counts once; releases that are not \
         awaited count 0)."
            .into(),
    ]
}

/// The median of the best system of `kind` at `x` in `p`, and its name.
fn best_of(p: &Panel, systems: &[&System], kind: Kind, x: f64) -> Option<(f64, &'static str)> {
    systems
        .iter()
        .filter(|s| s.kind == kind)
        .filter_map(|s| Some((median(p, s.name, x)?, s.name)))
        .max_by(|a, b| a.0.total_cmp(&b.0))
}

/// The goals for `Deferred` on this transport.
fn goals(
    transport: &str,
    mixes: &[(u64, u64)],
    points: &[Point],
    oltp: &Point,
    systems: &[&System],
) -> String {
    let mut out = format!(
        "\n## Goals (issue #16), {transport}\n\n| goal | ratio (worst point) | met |\n| --- | ---: | ---: |\n"
    );
    let o = server::O_CLIENTS as f64;
    let deferred = |p: &Panel, x| median(p, DEFERRED, x);
    let vs = |p: &Panel, x, kind| -> Option<f64> {
        Some(deferred(p, x)? / best_of(p, systems, kind, x)?.0)
    };
    goal_row(
        &mut out,
        "O: Deferred ≥ 1.76 × the best client-side (locks/s)",
        vs(&oltp.rate, o, Kind::ClientSide),
        &|r| r >= 1.76,
    );
    goal_row(
        &mut out,
        "O: Deferred ≥ 1.3 × PollRpc",
        deferred(&oltp.rate, o)
            .zip(median(&oltp.rate, POLL_RPC, o))
            .map(|(a, b)| a / b),
        &|r| r >= 1.3,
    );
    goal_row(
        &mut out,
        "O: Deferred ≥ 2 × the interval tree (its better thread count)",
        vs(&oltp.rate, o, Kind::Tree),
        &|r| r >= 2.0,
    );
    // p99: every other system's over Deferred's; ≥ 1 means Deferred's is no worse.
    let worst_p99 = systems
        .iter()
        .filter(|s| s.name != DEFERRED)
        .filter_map(|s| Some(median(&oltp.p99, s.name, o)? / deferred(&oltp.p99, o)?))
        .fold(None, |w: Option<f64>, r| Some(w.map_or(r, |w| w.min(r))));
    goal_row(
        &mut out,
        "O: every other system's p99 / Deferred's p99 ≥ 1",
        worst_p99,
        &|r| r >= 1.0,
    );
    let worst = |f: &dyn Fn(&Point, f64) -> Option<f64>, pick: &dyn Fn(u64, u64, f64) -> bool| {
        mixes
            .iter()
            .zip(points)
            .flat_map(|(&(w, h), p)| {
                p.rate
                    .xs()
                    .into_iter()
                    .filter(move |&c| pick(w, h, c))
                    .filter_map(move |c| f(p, c))
            })
            .fold(None, |a: Option<f64>, r| Some(a.map_or(r, |a| a.min(r))))
    };
    for (label, share, goal) in [
        ("0–1%", &[0u64, 1][..], 1.5),
        ("20%", &[20][..], 1.2),
        ("100%", &[100][..], 1.0),
    ] {
        goal_row(
            &mut out,
            &format!("M, 8+ clients, {label} writes: Deferred ≥ {goal} × the best client-side"),
            worst(&|p, c| vs(&p.rate, c, Kind::ClientSide), &|w, _, c| {
                share.contains(&w) && c >= 8.0
            }),
            &|r| r >= goal,
        );
    }
    goal_row(
        &mut out,
        "M, 1–2 clients: Deferred ≥ the interval tree (its better thread count)",
        worst(&|p, c| vs(&p.rate, c, Kind::Tree), &|_, _, c| c <= 2.0),
        &|r| r >= 1.0,
    );
    for other in systems
        .iter()
        .filter(|s| matches!(s.kind, Kind::Polling | Kind::Launch))
    {
        goal_row(
            &mut out,
            &format!("M and O: Deferred ≥ {} (locks/s), every point", other.name),
            worst(
                &|p, c| Some(deferred(&p.rate, c)? / median(&p.rate, other.name, c)?),
                &|_, _, _| true,
            )
            .into_iter()
            .chain(
                deferred(&oltp.rate, o)
                    .zip(median(&oltp.rate, other.name, o))
                    .map(|(a, b)| a / b),
            )
            .reduce(f64::min),
            &|r| r >= 1.0,
        );
    }
    // Fairness: the worst single run of any point (a client starved once is starved).
    for s in systems {
        let runs = points
            .iter()
            .chain(std::iter::once(oltp))
            .flat_map(|p| p.fairness.series.iter())
            .filter(|series| series.system == s.name)
            .flat_map(|series| series.points.iter().flat_map(|p| p.samples.iter().copied()))
            .reduce(f64::min);
        let name = if s.name == DEFERRED {
            "Deferred: least client ≥ 0.5 × its role's mean, worst run".to_string()
        } else {
            format!("({}: least client / its role's mean, worst run)", s.name)
        };
        goal_row(&mut out, &name, runs, &|r| r >= 0.5);
    }
    out
}

/// One point's every figure, system by system (for O, the seed's Table 6 with this
/// benchmark's other columns).
fn summary(title: &str, point: &Point, x: f64, systems: &[&System]) -> String {
    let mut out = format!(
        "\n## {title}, medians\n\n| system | locks/s (M) | p50 µs | p99 µs | fairness | server CPU µs/lock | round trips/lock |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    );
    for s in systems {
        let cell = |p: &Panel| median(p, s.name, x).map_or("–".into(), |v| format!("{v:.3}"));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            s.name,
            cell(&point.rate),
            cell(&point.p50),
            cell(&point.p99),
            cell(&point.fairness),
            cell(&point.cpu),
            cell(&point.trips)
        );
    }
    out
}

/// Workload L as the seed's Table 5.
fn latency_table(transport: &str, words: &[String]) -> String {
    let mut out = format!(
        "\n## L ({transport}): one operation from a client rank to the server, µs\n\n| operation | p50 | p99 |\n| --- | ---: | ---: |\n"
    );
    for (i, op) in LATENCY_OPS.iter().enumerate() {
        let _ = writeln!(out, "| {op} | {} | {} |", words[2 * i], words[2 * i + 1]);
    }
    out
}
