//! Gossamer's comparison benchmarks: delegation against the locks and concurrent maps a Rust engineer
//! would otherwise pick, measured side by side in one run.
//!
//! `cargo run --release -p bench -- NAME` runs one experiment and writes `NAME.csv`, `NAME.png` and
//! `NAME.md` under `bench/results/` (a table experiment, `instructions`, writes no PNG); `--list`
//! names the experiments. See `bench/README.md`. The runner is this package's own binary, so
//! that `gsm` (the demo and `gsm run`) builds without the RPC and plotting crates measured here.
//!
//! The module tree follows the pipeline: [`workload`] draws the access pattern, [`locks`] and [`map`]
//! hold the baselines, [`map_workload`] the values, sharding and checks every map system shares,
//! [`open_loop`] the latency experiment's request schedules and summaries, [`delegation`] the
//! `trust` systems, [`faa`], [`latency`] and [`map`] the experiments ([`handover`] the hand-over
//! measurement `faa` appends), [`memcache`] a memcached-protocol load generator and [`kvs`] the
//! experiment running it against the `kvs` server and memcached ([`kvs_unpipelined`] the same with
//! one request per connection, and `memcaslap` as a second generator), [`rack`] a delegated call
//! to another process against raw TCP, tarpc and tonic, [`regions`] one-sided operations against
//! Open MPI, [`rangelock`] range locks against seed 002's designs (its baselines, static
//! segmentation, Citron, the interval-tree server and `launch`, are files of that module, below
//! its `server`, which runs on the ranks), [`durable`] durable calls against plain ones (its
//! `client` runs on rank 0), [`objects`] the `objects` crate's barrier and ring against Open
//! MPI's collectives (its `members` run on the ranks), [`instructions`] instruction counts per
//! operation under callgrind, [`default_use`] the newcomer's tasks with the defaults, idle and
//! loaded, [`migrate`] moving properties between trustees (a badly placed load over time, calls
//! during moves), [`busy`] the busy loops that load the machine, [`harness`] the shared start/stop and progress machinery,
//! [`figure`] the results (figures, tables) and their number formatting, [`report`] their CSV and
//! markdown, [`plot`] their PNG, [`results`] the writing of all of them, [`machine`] the header
//! naming the machine.
//!
//! Files import only files below them (`scripts/layers.py` finds any circle). At the bottom are
//! the shared pieces: [`workload`], [`locks`], [`map_workload`], [`open_loop`], [`harness`],
//! [`machine`] and [`figure`], the result types every layer above speaks. Above them are the
//! systems ([`delegation`], [`memcache`]) and [`report`] and [`plot`], which only read figures;
//! then the experiments, which run systems and build figures; then [`results`], which writes a
//! figure through both [`report`] and [`plot`]; and on top this file, which runs the experiments
//! and hands their results to [`results`].

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;

pub mod am;
pub mod busy;
pub mod capi;
pub mod default_use;
pub mod delegation;
pub mod durable;
pub mod faa;
pub mod figure;
pub mod handover;
pub mod harness;
pub mod instructions;
pub mod kvs;
pub mod kvs_unpipelined;
pub mod latency;
pub mod locks;
pub mod machine;
pub mod map;
pub mod map_workload;
pub mod memcache;
pub mod migrate;
pub mod objects;
pub mod open_loop;
pub mod plot;
pub mod programs;
pub mod rack;
pub mod rangelock;
pub mod regions;
pub mod report;
pub mod results;
#[cfg(feature = "ucx")]
mod ucx_perftest;
pub mod workload;
pub mod ycsb;

use figure::{Figure, Table};
use harness::Ctx;

/// One experiment: a name for the command line and the function producing its figure.
#[derive(Debug, Clone, Copy)]
pub struct Experiment {
    /// Command-line name and file stem.
    pub name: &'static str,
    /// One-line description for `--list`.
    pub about: &'static str,
    /// Runs the experiment.
    pub run: Run,
}

/// What an experiment produces.
#[derive(Debug, Clone, Copy)]
pub enum Run {
    /// A figure: CSV, PNG and markdown.
    Figure(fn(&mut Ctx) -> anyhow::Result<Figure>),
    /// A table: CSV and markdown.
    Table(fn(&mut Ctx) -> anyhow::Result<Table>),
}

/// Every experiment, in the order `all` runs them.
pub const EXPERIMENTS: &[Experiment] = &[
    Experiment {
        name: "faa",
        about: "fetch-and-add throughput vs. object count (1..10^6), uniform and Zipf; delegation vs. locks",
        run: Run::Figure(faa::run),
    },
    Experiment {
        name: "faa-struct",
        about: "updating a 4-cache-line struct in place vs. object count (1..10^6), uniform and Zipf; delegation vs. locks",
        run: Run::Figure(faa::run_struct),
    },
    Experiment {
        name: "latency",
        about: "mean and p99.9 fetch-and-add latency vs. offered load (open loop); delegation vs. locks",
        run: Run::Figure(latency::run),
    },
    Experiment {
        name: "map-size",
        about: "key-value map throughput vs. table size (10..10^7 keys), 5% writes, uniform and Zipf",
        run: Run::Figure(map::run_size),
    },
    Experiment {
        name: "map-writes",
        about: "key-value map throughput vs. write share (0..100%), 1k keys uniform and 10^7 keys Zipf",
        run: Run::Figure(map::run_writes),
    },
    Experiment {
        name: "kvs",
        about: "the kvs server vs. memcached over loopback: throughput and latency vs. table size (10^2..10^7 keys), 1/5/10% writes",
        run: Run::Figure(kvs::run),
    },
    Experiment {
        name: "instructions",
        about: "instructions per operation under callgrind, client and trustee side: apply_then, apply (fiber, thread) vs. mutexes and fetch_add",
        run: Run::Table(instructions::run),
    },
    Experiment {
        name: "kvs-unpipelined",
        about: "the kvs server vs. memcached with one request in flight per connection (1..256 connections), own generator and memcaslap",
        run: Run::Figure(kvs_unpipelined::run),
    },
    Experiment {
        name: "rack",
        about: "a delegated call to another process over loopback vs. raw TCP, tarpc and tonic: latency, throughput vs. calls outstanding, open loop, all-to-all",
        run: Run::Figure(rack::run),
    },
    Experiment {
        name: "regions",
        about: "one-sided operations on another process (fetch_add, put, get) vs. Open MPI RMA, through shared memory and over TCP",
        run: Run::Figure(regions::run),
    },
    Experiment {
        name: "rangelock",
        about: "range locks on a trustee (answered when the range frees) vs. seed 002's designs: polling combiners, launch, the interval-tree server, static segmentation and Citron on one-sided regions; workloads L, M and O on shared memory and TCP",
        run: Run::Figure(rangelock::run),
    },
    Experiment {
        name: "am",
        about: "the seed's active messages (Server-Side Sum, Indirect Put) as a closure, a function by name and a signed code package's export: latency vs. payload against raw TCP, injection rate vs. the window (M banks × N slots), a package's first call vs. its size",
        run: Run::Figure(am::run),
    },
    Experiment {
        name: "am-ship",
        about: "seed 003's Figures 7 and 8 for packages: Indirect Put by the package's id vs. with the whole package shipped before every call, latency and rate vs. payload",
        run: Run::Figure(am::ship::run),
    },
    Experiment {
        name: "durable",
        about: "a durable call (os, sync; with and without exactly-once) vs. a plain apply_with to another process: latency, throughput, fdatasyncs and log bytes per call, snapshot pause, replay",
        run: Run::Figure(durable::run),
    },
    Experiment {
        name: "objects",
        about: "the objects crate's Barrier (wait, wait_unfenced) and Ring broadcast (64 B, k in flight) vs. Open MPI's MPI_Barrier and MPI_Ibcast, 2 and 3 processes, shared memory and TCP",
        run: Run::Figure(objects::run),
    },
    Experiment {
        name: "objects-locks",
        about: "one contended lock and transfers between 10^7 accounts under two locks: the objects crate's one-sided locks and the same work delegated vs. Open MPI's window locks (341 windows), 2 and 3 processes, shared memory and TCP",
        run: Run::Figure(objects::locks::run),
    },
    Experiment {
        name: "objects-map",
        about: "the objects crate's one-sided DMap vs. its delegated twin ShardMap: read-only, 50% and 100% updates, uniform and Zipf 0.99 keys, windows 3 and 128, a 10 MB keyspace 80% full, 2 processes, shared memory and TCP",
        run: Run::Figure(objects::map::run),
    },
    Experiment {
        name: "ycsb",
        about: "kvs across a rack (1-4 ranks) vs. Redis Cluster and memcached + ketama with the same server processes, under YCSB workloads C and D",
        run: Run::Figure(ycsb::run),
    },
    Experiment {
        name: "default-use",
        about: "the newcomer's tasks with the defaults, idle and beside one busy loop per core: word count (apply_then without and with a window, dashmap, Mutex shards), tokio tasks (apply_async vs tokio and std mutexes), plain threads (apply vs mutexes), gsm demo",
        run: Run::Figure(default_use::run),
    },
    Experiment {
        name: "migrate",
        about: "moving properties between trustees: a badly placed Zipf-hot load over time without rebalancing, with Builder::rebalance, and placed well; latency of calls while a property moves",
        run: Run::Figure(migrate::run),
    },
    Experiment {
        name: "capi",
        about: "the trust runtime from C: a counter and a chained hash table shared by threads under pthread_mutex_t, pthread_spinlock_t, trust_apply and trust_apply_then",
        run: Run::Figure(capi::run),
    },
];

/// Group names accepted besides the experiment names.
const GROUPS: &[(&str, &[&str], &str)] = &[
    (
        "all",
        &[
            "faa",
            "faa-struct",
            "latency",
            "map-size",
            "map-writes",
            "kvs",
            "instructions",
            "kvs-unpipelined",
            "rack",
            "regions",
            "rangelock",
            "am",
            "am-ship",
            "durable",
            "objects",
            "objects-locks",
            "objects-map",
            "capi",
            "migrate",
            "default-use",
            "ycsb",
        ],
        "every experiment",
    ),
    (
        "map",
        &["map-size", "map-writes"],
        "both key-value map figures",
    ),
];

/// Default runs per point.
const RUNS: u64 = 5;
/// Runs per point with `--quick`: the smoke run judges no speed, and two runs still take every
/// path between runs (set-up, turns, medians); three made `--quick all` a quarter longer.
const QUICK_RUNS: u64 = 2;
/// Default measurement window of one run.
const WINDOW_MS: u64 = 200;
/// Measurement window of one run with `--quick`.
const QUICK_WINDOW_MS: u64 = 15;

#[derive(Debug, Parser)]
#[command(
    name = "bench",
    about = "Run Gossamer's comparison benchmarks and write CSV, PNG and markdown results",
    after_help = "Examples:\n  cargo run --release -p bench -- --list\n  cargo run --release -p bench -- faa\n  cargo run --release -p bench -- all\n  cargo run --release -p bench -- --quick all"
)]
struct Args {
    /// Experiments to run: names from --list, `map` for both map figures, `all` for everything.
    names: Vec<String>,
    /// List the experiments and exit.
    #[arg(long)]
    list: bool,
    /// Smoke run: few points and short windows; checks that everything runs and verifies itself.
    #[arg(long)]
    quick: bool,
    /// Run only the correctness checks of the experiments that have one (`rangelock`: every
    /// system under the shadow-region checker), and measure nothing.
    #[arg(long)]
    check: bool,
    /// Runs per point; the median is reported with min and max [default: 5, 2 with --quick].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    runs: Option<u64>,
    /// Measurement window of one run, in milliseconds.
    #[arg(long)]
    window_ms: Option<u64>,
    /// Measure only the systems whose name contains this text (repeatable); for development,
    /// since ratios need the baseline too.
    #[arg(long, value_name = "TEXT")]
    only: Vec<String>,
    /// Leave threads and runtime workers to the OS scheduler instead of pinning them to cores.
    #[arg(long)]
    no_pin: bool,
    /// Output directory [default: bench/results, or bench/results/quick with --quick].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Internal (`instructions`): run this one scenario and exit, under callgrind.
    #[arg(long, hide = true, requires = "ops")]
    scenario: Option<String>,
    /// Internal (`instructions`): operations of the scenario.
    #[arg(long, hide = true, requires = "scenario")]
    ops: Option<u64>,
    /// Internal (`rack`): run as one of the experiment's servers or rack ranks.
    #[arg(long, hide = true)]
    rack_role: Option<String>,
}

/// Runs the benchmark binary with `args`, its command-line arguments.
///
/// Fails if an argument is wrong, a benchmark run fails its self-check, or a result file cannot be
/// written.
pub fn cli(args: &[String]) -> anyhow::Result<()> {
    let self_exe = harness::self_exe(args);
    let args =
        match Args::try_parse_from(std::iter::once("bench".to_owned()).chain(args.iter().cloned()))
        {
            Ok(a) => a,
            Err(e) if !e.use_stderr() => {
                // --help and --version: print and succeed.
                e.print()?;
                return Ok(());
            }
            Err(e) => bail!("{}", e.render().to_string().trim_end()),
        };
    if let Some(role) = &args.rack_role {
        if role == "durable-kill" {
            return durable::kill::run();
        }
        return rack::role(role);
    }
    if let (Some(scenario), Some(ops)) = (&args.scenario, args.ops) {
        return instructions::run_scenario(scenario, ops);
    }
    if args.list {
        print_list();
        return Ok(());
    }
    if args.names.is_empty() {
        print_list();
        bail!("name an experiment to run (or `all`)");
    }
    let selected = resolve(&args.names)?;
    let runs = args
        .runs
        .unwrap_or(if args.quick { QUICK_RUNS } else { RUNS }) as usize;
    if runs < 3 && !args.quick {
        eprintln!("warning: fewer than 3 runs per point; figures want the median of at least 3");
    }
    let out = args.out.clone().unwrap_or_else(|| {
        let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results");
        if args.quick { base.join("quick") } else { base }
    });
    let window_ms = args.window_ms.unwrap_or(if args.quick {
        QUICK_WINDOW_MS
    } else {
        WINDOW_MS
    });
    let mut machine = machine::Machine::detect();
    if machine.profile != "release" {
        eprintln!(
            "warning: benchmarks built with the `{}` profile; numbers are only meaningful in release",
            machine.profile
        );
    }
    let total = Instant::now();
    for exp in selected {
        let mut ctx = Ctx::new(args.quick, runs, Duration::from_millis(window_ms));
        ctx.only = args.only.clone();
        ctx.check = args.check;
        ctx.self_exe = self_exe.clone();
        harness::set_pinning(!args.no_pin);
        let started = harness::utc_now();
        machine.load = machine::load();
        let t0 = Instant::now();
        eprintln!("== {}: {}", exp.name, exp.about);
        let failed = || format!("benchmark `{}` failed", exp.name);
        let info = |ran: Instant| figure::RunInfo {
            command: command_line(exp.name, &args),
            runs,
            window_ms,
            quick: args.quick,
            started: started.clone(),
            seconds: ran.elapsed().as_secs_f64(),
        };
        let (files, info) = match exp.run {
            Run::Figure(run) => {
                let fig = run(&mut ctx).with_context(failed)?;
                let info = info(t0);
                (results::write_figure(&out, &fig, &machine, &info)?, info)
            }
            Run::Table(run) => {
                let table = run(&mut ctx).with_context(failed)?;
                println!("{}", report::table_body(&table));
                let info = info(t0);
                (results::write_table(&out, &table, &machine, &info)?, info)
            }
        };
        eprintln!(
            "   {} done in {:.0} s; self-checks passed; wrote:",
            exp.name, info.seconds
        );
        for f in files {
            eprintln!("     {}", f.display());
        }
    }
    eprintln!("== finished in {:.0} s", total.elapsed().as_secs_f64());
    Ok(())
}

fn print_list() {
    println!("Experiments (cargo run --release -p bench -- NAME):");
    for e in EXPERIMENTS {
        println!("  {:<15} {}", e.name, e.about);
    }
    for (name, _, about) in GROUPS {
        println!("  {name:<15} {about}");
    }
    println!(
        "Options: --quick (smoke run), --runs N, --window-ms MS, --only TEXT, --no-pin, --out DIR; see --help"
    );
}

fn resolve(names: &[String]) -> anyhow::Result<Vec<&'static Experiment>> {
    let mut out: Vec<&'static Experiment> = Vec::new();
    for name in names {
        let members: Vec<&str> = match GROUPS.iter().find(|g| g.0 == name) {
            Some(g) => g.1.to_vec(),
            None => vec![name.as_str()],
        };
        for m in members {
            let Some(e) = EXPERIMENTS.iter().find(|e| e.name == m) else {
                bail!("unknown experiment `{m}`; `--list` shows the names");
            };
            if !out.iter().any(|o| o.name == e.name) {
                out.push(e);
            }
        }
    }
    Ok(out)
}

fn command_line(name: &str, args: &Args) -> String {
    let features = if cfg!(feature = "ucx") {
        " --features ucx"
    } else {
        ""
    };
    let mut cmd = format!("cargo run --release -p bench{features} -- {name}");
    if args.quick {
        cmd.push_str(" --quick");
    }
    if let Some(runs) = args.runs {
        cmd.push_str(&format!(" --runs {runs}"));
    }
    if let Some(w) = args.window_ms {
        cmd.push_str(&format!(" --window-ms {w}"));
    }
    if args.no_pin {
        cmd.push_str(" --no-pin");
    }
    for o in &args.only {
        cmd.push_str(&format!(" --only '{o}'"));
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_resolve() {
        let all = resolve(&["all".to_owned()]).unwrap();
        assert_eq!(all.len(), EXPERIMENTS.len());
        let m = resolve(&["map".to_owned(), "map-size".to_owned()]).unwrap();
        assert_eq!(m.len(), 2);
        assert!(resolve(&["nope".to_owned()]).is_err());
    }

    #[test]
    fn list_and_help_succeed() {
        cli(&["--list".to_owned()]).unwrap();
        cli(&["--help".to_owned()]).unwrap();
        assert!(cli(&["--bogus".to_owned()]).is_err());
    }
}
