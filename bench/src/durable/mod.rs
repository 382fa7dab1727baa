//! `durable` — what a durable call costs over a plain delegated one, and what it takes to
//! bring a durable property back.
//!
//! The operation: `Add(x)` on a `gossamer::durable::Durable<u64>` held by rank 1 of a two-rank
//! rack over loopback TCP (one worker per rank, as `bench rack`), called from rank 0
//! (`client.rs`), against `bench rack`'s gossamer line, `apply_with` on a `Trust<u64>`. The
//! durable calls go without their exactly-once record (`call_then_without_dedup`, the hidden
//! baseline) and with it (`call`, `call_then`), under `GSM_DURABILITY=os` and `sync`. The
//! durability is a process's setting, so there are two racks, each with its own state
//! directory; they take turns, the other's ranks stopped with `SIGSTOP`; plain calls are
//! measured in the `os` rack.
//!
//! - E1: p50 and p99 with one call outstanding, beside the disk's own `fdatasync` (a 4 KiB
//!   `pwrite` and `fdatasync` on the state directory's file system, measured in each run);
//! - E2: throughput with 1, 16, 128 and 1024 calls outstanding; per call, the `fdatasync`s
//!   rank 1 made and the bytes its log grew by;
//! - the snapshot pause: the slowest calls, made one at a time, around a snapshot of a
//!   property holding 1 Mi `u64`s;
//! - replay: a log of N records (after each property's newest snapshot) read and replayed by a
//!   new rack on the same state, and the time from starting it to its first answer;
//! - kill to serving: rank 1 SIGKILLed under `gsm run --recover`, from the kill to the answer
//!   of the call that waited for its next life (`kill.rs`).

mod client;
pub(crate) use client::Add;
pub(crate) mod kill;

pub(crate) use client::Client;

use std::fmt::Write as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};

use crate::figure::{Figure, Panel, sig};
use crate::harness::Ctx;
use crate::rack::child::Child;
use crate::rack::load::Measured;
use crate::rack::{PATIENCE, goal_line, median, ratio, start_rack_with};

const PLAIN: &str = "plain apply_with";
const NODEDUP_OS: &str = "durable, no dedup (os)";
const ONCE_OS: &str = "durable, exactly-once (os)";
const NODEDUP_SYNC: &str = "durable, no dedup (sync)";
const ONCE_SYNC: &str = "durable, exactly-once (sync)";
const DEFERRED: &str = "deferred answers, no log";
/// The disk's own flush, in the E1 panel beside the systems.
const DISK: &str = "disk: 4 KiB pwrite + fdatasync";

/// `GSM_JOB_NAME` of every rack of the experiment.
const JOB_NAME: &str = "bench-durable";

/// One system: its name, its rack (0: `os`, 1: `sync`) and its counter on rank 0 (`None`:
/// the plain `Trust<u64>` of `bench rack`'s commands).
struct System {
    name: &'static str,
    rack: usize,
    counter: Option<&'static str>,
}

const SYSTEMS: [System; 6] = [
    System {
        name: PLAIN,
        rack: 0,
        counter: None,
    },
    System {
        name: DEFERRED,
        rack: 0,
        counter: Some("deferred"),
    },
    System {
        name: NODEDUP_OS,
        rack: 0,
        counter: Some("nodedup"),
    },
    System {
        name: ONCE_OS,
        rack: 0,
        counter: Some("once"),
    },
    System {
        name: NODEDUP_SYNC,
        rack: 1,
        counter: Some("nodedup"),
    },
    System {
        name: ONCE_SYNC,
        rack: 1,
        counter: Some("once"),
    },
];

impl System {
    fn latency(&self, window: Duration) -> String {
        let ms = window.as_millis();
        match self.counter {
            None => format!("lat {ms}"),
            Some(c) => format!("dur-lat {c} {ms}"),
        }
    }

    fn depth(&self, depth: u64, window: Duration) -> String {
        let ms = window.as_millis();
        match self.counter {
            None => format!("depth {depth} {ms}"),
            Some(c) => format!("dur-depth {c} {depth} {ms}"),
        }
    }

    fn check(&self) -> &'static str {
        match self.counter {
            None => "check",
            Some(_) => "dur-check",
        }
    }
}

/// A two-rank rack whose durable state is under `state` (`GSM_STATE_DIR`); its ranks stopped
/// between turns.
struct Rack {
    label: String,
    ranks: Vec<Child>,
    state: PathBuf,
}

impl Rack {
    fn start(me: &Path, label: &str, durability: &str, state: &Path) -> anyhow::Result<Rack> {
        let env: Vec<(String, String)> = [
            (gossamer::env::DURABILITY, durability.to_owned()),
            (gossamer::env::STATE_DIR, state.display().to_string()),
            (gossamer::env::JOB_NAME, JOB_NAME.to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let ranks = start_rack_with(me, label, 2, "tcp", &env)?;
        Ok(Rack {
            label: label.to_owned(),
            ranks,
            state: state.to_path_buf(),
        })
    }

    fn call(&mut self, command: &str, patience: Duration) -> anyhow::Result<Vec<String>> {
        self.ranks[0]
            .call(command, patience)
            .with_context(|| format!("{}: `{command}`", self.label))
    }

    fn pause(&mut self) -> anyhow::Result<()> {
        self.ranks.iter_mut().try_for_each(Child::pause)
    }

    fn resume(&mut self) -> anyhow::Result<()> {
        self.ranks.iter_mut().try_for_each(Child::resume)
    }

    /// Ends the job as a job ends: rank 0's `main` returns when its stdin closes.
    fn finish(mut self) -> anyhow::Result<()> {
        self.resume()?;
        for r in self.ranks {
            r.finish(PATIENCE)?;
        }
        Ok(())
    }

    /// Rank 1's state directory.
    fn rank1(&self) -> PathBuf {
        self.state.join(JOB_NAME).join("rank-1")
    }

    /// The `fdatasync`s rank 1's process has made so far, and the bytes it appended to its
    /// log.
    fn counts(&mut self) -> anyhow::Result<(u64, u64)> {
        let words = self.call("dur-syncs", PATIENCE)?;
        let count =
            |i: usize| -> anyhow::Result<u64> { Ok(words.get(i).context("no count")?.parse()?) };
        Ok((count(0)?, count(1)?))
    }

    /// Runs `measure(warmup)` unmeasured, then `measure(window)` with rank 1's `fdatasync`s and
    /// log growth counted around it, then `check`, in this rack's turn. Returns the run, and
    /// `fdatasync`s and log bytes per call made (answered after the window included).
    fn turn(
        &mut self,
        warmup: Duration,
        window: Duration,
        measure: &dyn Fn(Duration) -> String,
        check: &str,
    ) -> anyhow::Result<(Measured, f64, f64)> {
        self.resume()?;
        let result = (|| {
            self.call(&measure(warmup), warmup + PATIENCE)?;
            let (syncs, log) = self.counts()?;
            let m = Measured::parse(&self.call(&measure(window), window + PATIENCE)?)?;
            let (syncs_after, log_after) = self.counts()?;
            let (syncs, grew) = (syncs_after - syncs, log_after - log);
            self.call(check, PATIENCE)?;
            let calls = m.calls.max(1) as f64;
            Ok((m, syncs as f64 / calls, grew as f64 / calls))
        })();
        self.pause()?;
        result
    }
}

/// A directory under the system's temporary directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> anyhow::Result<Scratch> {
        let dir = std::env::temp_dir().join(format!("gsm-bench-durable-{}", std::process::id()));
        // A leftover of an earlier process with this id.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The disk's own flush: `count` writes of 4 KiB, each to its own block of a file in `dir`
/// written and flushed beforehand (so that no write changes the file's size or allocates),
/// each followed by `fdatasync`; returns p50 and p99, µs.
fn disk_fdatasync(dir: &Path, count: u64) -> anyhow::Result<(f64, f64)> {
    let path = dir.join("fdatasync-probe");
    let file =
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    file.write_all_at(&vec![0u8; count as usize * 4096], 0)?;
    file.sync_all()?;
    let block = [0x5au8; 4096];
    let mut hist = crate::rack::load::new_histogram();
    for i in 0..count {
        let start = Instant::now();
        file.write_all_at(&block, i * 4096)?;
        file.sync_data()?;
        hist.record(start.elapsed().as_nanos() as u64)?;
    }
    drop(file);
    std::fs::remove_file(&path)?;
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1e3;
    Ok((us(0.5), us(0.99)))
}

/// Runs the experiment.
pub fn run(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let me = ctx.self_exe.clone().context(
        "`durable` starts its ranks by running this executable again: run it as `cargo run --release -p bench -- durable`",
    )?;
    let window = ctx.window;
    let e1_window = window * 2;
    let warmup = (window / 4).max(Duration::from_millis(5));
    let depths: &[u64] = if ctx.quick {
        &[1, 1024]
    } else {
        &[1, 16, 128, 1024]
    };
    let disk_count = if ctx.quick { 100 } else { 500 };
    // The snapshot pause: calls timed one at a time, one snapshot among them.
    let pause_calls: u64 = if ctx.quick { 200 } else { 2000 };
    // Replay: N records over properties of at most REPLAY_PER records each, every one after
    // its property's only snapshot (made when it was created).
    let replay_records: u64 = if ctx.quick { 20_000 } else { 200_000 };
    let replay_props = replay_records.div_ceil(REPLAY_PER);
    let replay_per = replay_records.div_ceil(replay_props);
    let replay_records = replay_props * replay_per;

    let systems: Vec<&System> = SYSTEMS.iter().filter(|s| ctx.selected(s.name)).collect();
    let mut fig = Figure {
        name: "durable".into(),
        title: "Durable calls: plain apply_with against durable calls, with and without exactly-once, os and sync".into(),
        notes: Vec::new(),
        panels: Vec::new(),
        columns: 2,
        extra_markdown: String::new(),
    };
    let mut e1 = crate::rack::latency_panel(PLAIN);
    let mut e2 = crate::rack::throughput_panel(
        "calls outstanding (one client fiber)",
        "throughput (k calls/s)",
        PLAIN,
    );
    let mut syncs = Panel::new(
        "e2-fdatasyncs",
        "E2: fdatasyncs per call (rank 1's process)",
    );
    syncs.plotted = false;
    syncs.x_label = e2.x_label.clone();
    syncs.y_label = "fdatasyncs per call".into();
    let mut log_bytes = Panel::new(
        "e2-log-bytes",
        "E2: bytes appended to rank 1's log per call",
    );
    log_bytes.plotted = false;
    log_bytes.x_label = e2.x_label.clone();
    log_bytes.y_label = "bytes per call".into();
    let mut pause = Panel::new(
        "snapshot-pause",
        "Snapshot pause: latency of calls made one at a time around a snapshot",
    );
    pause.plotted = false;
    pause.log_x = false;
    pause.x_label = "percentile (100: the slowest call)".into();
    pause.y_label = "latency (µs)".into();
    let mut state_size = Panel::new("snapshot-state", "Snapshot pause: the state's encoded size");
    state_size.plotted = false;
    state_size.y_label = "bytes".into();
    let mut replay = Panel::new("replay", "Replay: reopening a property's log");
    replay.plotted = false;
    replay.x_label = "records in the log after the newest snapshots".into();
    replay.y_label = "ms, or records/s".into();

    let pauses = [ONCE_OS, ONCE_SYNC]
        .iter()
        .filter(|n| ctx.selected(n))
        .count();
    // The replay's fill, its runs, and the kill job.
    let replays = if ctx.selected(ONCE_SYNC) {
        ctx.runs + 2
    } else {
        0
    };
    ctx.begin(
        "durable",
        (ctx.runs * (systems.len() * (1 + depths.len()) + 1 + pauses) + replays) as u64,
    );
    let scratch = Scratch::new()?;

    ctx.status("starting the racks (os, sync)");
    let mut racks = Vec::new();
    for mode in ["os", "sync"] {
        let state = scratch.0.join(mode);
        let mut rack = Rack::start(&me, &format!("durable ({mode})"), mode, &state)?;
        // `big` is made here: 1 Mi entries, written and (under sync) flushed once.
        rack.call("dur-setup", PATIENCE)?;
        rack.pause()?;
        racks.push(rack);
    }
    let measured = (|| -> anyhow::Result<()> {
        for run in 0..ctx.runs {
            for s in &systems {
                ctx.status(format!("E1 {} run {}", s.name, run + 1));
                let (m, _, _) = racks[s.rack]
                    .turn(warmup, e1_window, &|w| s.latency(w), s.check())
                    .with_context(|| format!("E1 {}", s.name))?;
                e1.add(s.name, 50.0, m.p50_us);
                e1.add(s.name, 99.0, m.p99_us);
                ctx.tick();
            }
            ctx.status(format!("disk fdatasync, run {}", run + 1));
            let (p50, p99) = disk_fdatasync(&scratch.0, disk_count)?;
            e1.add(DISK, 50.0, p50);
            e1.add(DISK, 99.0, p99);
            ctx.tick();
        }
        for &depth in depths {
            for run in 0..ctx.runs {
                for s in &systems {
                    ctx.status(format!("E2 {} depth {depth} run {}", s.name, run + 1));
                    let (m, per_call, bytes) = racks[s.rack]
                        .turn(warmup, window, &|w| s.depth(depth, w), s.check())
                        .with_context(|| format!("E2 {} at depth {depth}", s.name))?;
                    let x = depth as f64;
                    e2.add(s.name, x, m.rate() / 1e3);
                    syncs.add(s.name, x, per_call);
                    log_bytes.add(s.name, x, bytes);
                    ctx.tick();
                }
            }
        }
        for run in 0..ctx.runs {
            for (rack, name) in racks.iter_mut().zip([ONCE_OS, ONCE_SYNC]) {
                if !ctx.selected(name) {
                    continue;
                }
                ctx.status(format!("snapshot pause {name} run {}", run + 1));
                rack.resume()?;
                let words = rack.call(&format!("dur-snap {pause_calls}"), PATIENCE * 5);
                rack.pause()?;
                let words = words?;
                ensure!(words.len() == 5, "dur-snap answered {words:?}");
                let snapshots: u64 = words[3].parse()?;
                ensure!(
                    snapshots == 1,
                    "{name}: {snapshots} snapshots among the timed calls, not 1"
                );
                for (x, w) in [(50.0, &words[0]), (99.9, &words[1]), (100.0, &words[2])] {
                    pause.add(name, x, w.parse()?);
                }
                state_size.add(name, client::BIG as f64, words[4].parse()?);
                ctx.tick();
            }
        }
        Ok(())
    })();
    for rack in racks {
        rack.finish()?;
    }
    measured?;

    if ctx.selected(ONCE_SYNC) {
        ctx.status(format!("replay: filling {replay_records} records"));
        let state = scratch.0.join("replay");
        let mut fill = Rack::start(&me, "durable replay (fill)", "sync", &state)?;
        fill.call(
            &format!("dur-fill {replay_props} {replay_per}"),
            PATIENCE * 5,
        )?;
        let snap_dir = fill.rank1().join("snap");
        fill.finish()?;
        // Each property's only snapshot is the one made when it was created: every record
        // filled is after it, and is replayed.
        let snapshots = std::fs::read_dir(&snap_dir)
            .with_context(|| format!("reading {}", snap_dir.display()))?
            .count() as u64;
        ensure!(
            snapshots == replay_props,
            "{snapshots} snapshots after filling {replay_props} properties"
        );
        ctx.tick();
        let x = replay_records as f64;
        for run in 0..ctx.runs {
            ctx.status(format!("replay: reopening, run {}", run + 1));
            let t0 = Instant::now();
            let mut rack = Rack::start(&me, "durable replay (reopen)", "sync", &state)?;
            let words = rack.call(
                &format!("dur-reopen {replay_props} {replay_per}"),
                PATIENCE * 5,
            )?;
            let serving = t0.elapsed();
            rack.finish()?;
            ensure!(words.len() == 3, "dur-reopen answered {words:?}");
            let open_ms = words[0].parse::<f64>()? / 1e3;
            replay.add(REPLAY_OPEN, x, open_ms);
            replay.add(REPLAY_FIRST_OPEN, x, words[1].parse::<f64>()? / 1e3);
            replay.add(REPLAY_FIRST, x, words[2].parse::<f64>()? / 1e3);
            replay.add(REPLAY_SERVING, x, serving.as_secs_f64() * 1e3);
            replay.add(REPLAY_RATE, x, x / (open_ms / 1e3));
            ctx.tick();
        }
    }
    let mut killed = Panel::new("kill", "Kill to serving under gsm run --recover");
    killed.plotted = false;
    killed.x_label = "records in the killed rank's log after the newest snapshot".into();
    killed.y_label = "ms".into();
    if ctx.selected(ONCE_SYNC) {
        let records = if ctx.quick { 1000 } else { KILL_RECORDS };
        let kills = if ctx.quick { 3 } else { 5 * ctx.runs };
        ctx.status(format!("kill to serving: {kills} kills"));
        for ms in kill_to_serving(&me, &scratch.0.join("kill"), records, kills)? {
            killed.add(KILL_SERVING, records as f64, ms);
        }
        ctx.tick();
    }
    ctx.finish();
    drop(scratch);

    fig.notes = notes(ctx, window, e1_window, warmup, disk_count, pause_calls);
    fig.extra_markdown = summary(
        &e1,
        &e2,
        &syncs,
        &log_bytes,
        &pause,
        &state_size,
        (&replay, &killed),
    );
    fig.panels = vec![e1, e2, syncs, log_bytes, pause, state_size, replay, killed];
    Ok(fig)
}

/// Most records `dur-fill` makes on one property: fewer than [`SNAPSHOT_RECORDS`], so that
/// none is snapshotted and every record is replayed.
///
/// [`SNAPSHOT_RECORDS`]: gossamer::durable::SNAPSHOT_RECORDS
const REPLAY_PER: u64 = 8000;
const _: () = assert!(REPLAY_PER < gossamer::durable::SNAPSHOT_RECORDS as u64);

const REPLAY_OPEN: &str = "open (read the log, replay), ms";
const REPLAY_FIRST_OPEN: &str = "… of which the first property (reads the whole log), ms";
const REPLAY_FIRST: &str = "first call after opening, ms";
const REPLAY_SERVING: &str = "start to first answer, ms";
const REPLAY_RATE: &str = "replay rate, records/s";
const KILL_SERVING: &str = "kill to serving, ms";
/// Records in the killed rank's log (all after its property's snapshot, all replayed).
const KILL_RECORDS: u64 = 8000;
const _: () = assert!(KILL_RECORDS < gossamer::durable::SNAPSHOT_RECORDS as u64);

/// The `gsm` beside this executable (same target directory), built first if it is not
/// there: the benchmark supervises with the real `gsm run --recover`.
fn gsm_beside(me: &Path) -> anyhow::Result<PathBuf> {
    let gsm = me.with_file_name("gsm");
    if gsm.exists() {
        return Ok(gsm);
    }
    let cargo = std::env::var_os("CARGO").with_context(|| {
        format!(
            "{} is missing: build it (`cargo build --release -p gsm`)",
            gsm.display()
        )
    })?;
    let release = me.parent().is_some_and(|d| d.ends_with("release"));
    let mut build = std::process::Command::new(cargo);
    build.args(["build", "-p", "gsm"]);
    if release {
        build.arg("--release");
    }
    ensure!(build.status()?.success(), "building gsm failed");
    ensure!(
        gsm.exists(),
        "{} is still missing after building gsm",
        gsm.display()
    );
    Ok(gsm)
}

/// Runs `kill.rs`'s job under `gsm run -n 2 --recover` (`sync`, state under `state`) and
/// returns each kill's time to serving, in ms.
fn kill_to_serving(
    me: &Path,
    state: &Path,
    records: u64,
    kills: usize,
) -> anyhow::Result<Vec<f64>> {
    let gsm = gsm_beside(me)?;
    let out = std::process::Command::new(&gsm)
        .args(["run", "-n", "2", "--workers", "1", "--recover", "--"])
        .arg(me)
        .args(["--rack-role", "durable-kill"])
        .env(gossamer::env::STATE_DIR, state)
        .env(gossamer::env::JOB_NAME, JOB_NAME)
        .env(gossamer::env::DURABILITY, "sync")
        .env("BENCH_KILL_RECORDS", records.to_string())
        .env("BENCH_KILLS", kills.to_string())
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running {}", gsm.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let errors = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "the kill job failed:\n{text}{errors}");
    let times: Vec<f64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("[0] kill-to-serving "))
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    ensure!(
        times.len() == kills,
        "{} kills timed of {kills}:\n{text}{errors}",
        times.len()
    );
    Ok(times)
}

/// `median (min–max)` of `system` at `x`, or `–`.
fn cell(p: &Panel, system: &str, x: f64) -> String {
    p.series
        .iter()
        .find(|s| s.system == system)
        .and_then(|s| s.at(x))
        .map_or("–".to_owned(), |pt| {
            format!("{} ({}–{})", sig(pt.median()), sig(pt.min()), sig(pt.max()))
        })
}

/// The markdown after the plotted panels: the disk, the per-call counts, the snapshot pause,
/// replay, and the goals.
fn summary(
    e1: &Panel,
    e2: &Panel,
    syncs: &Panel,
    log_bytes: &Panel,
    pause: &Panel,
    state_size: &Panel,
    (replay, killed): (&Panel, &Panel),
) -> String {
    let mut out = String::new();
    let disk_p50 = median(e1, DISK, 50.0);
    let _ = writeln!(
        out,
        "## The disk\n\nA 4 KiB `pwrite` into an allocated block and `fdatasync`, on the state \
         directory's file system, measured in each run: p50 {} µs, p99 {} µs (median of runs, min–max in parentheses).\n",
        cell(e1, DISK, 50.0),
        cell(e1, DISK, 99.0)
    );
    out.push_str(&crate::report::median_table(syncs));
    out.push_str(&crate::report::median_table(log_bytes));

    let _ = writeln!(
        out,
        "## {}\n\n| system | p50 µs | p99.9 µs | slowest µs | state (encoded) |\n| --- | ---: | ---: | ---: | ---: |",
        pause.title
    );
    for s in &pause.series {
        let size = median(state_size, &s.system, client::BIG as f64)
            .map_or("–".to_owned(), |b| {
                format!("{} MiB", sig(b / f64::from(1 << 20)))
            });
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {size} |",
            s.system,
            cell(pause, &s.system, 50.0),
            cell(pause, &s.system, 99.9),
            cell(pause, &s.system, 100.0),
        );
    }
    out.push('\n');

    let xs = replay.xs();
    if let Some(&n) = xs.first() {
        let _ = writeln!(
            out,
            "## {} ({} records)\n\n| | median (min–max) |\n| --- | ---: |",
            replay.title,
            sig(n)
        );
        for what in [
            REPLAY_OPEN,
            REPLAY_FIRST_OPEN,
            REPLAY_FIRST,
            REPLAY_SERVING,
            REPLAY_RATE,
        ] {
            let _ = writeln!(out, "| {what} | {} |", cell(replay, what, n));
        }
        out.push('\n');
    }
    if let Some(&k) = killed.xs().first() {
        let _ = writeln!(
            out,
            "## {} ({} records in the log)\n\n| | median (min–max) |\n| --- | ---: |\n| {KILL_SERVING} | {} |\n",
            killed.title,
            sig(k),
            cell(killed, KILL_SERVING, k)
        );
    }

    let _ = writeln!(out, "## Goals (reported, not asserted)\n");
    let _ = writeln!(out, "| goal | measured | met |\n| --- | ---: | --- |");
    let words = ["MET", "MISSED"];
    let times = |r: Option<f64>, ok: fn(f64) -> bool| {
        r.filter(|r| r.is_finite())
            .map(|r| (format!("×{}", sig(r)), ok(r)))
    };
    for (mode, once, nodedup) in [
        ("os", ONCE_OS, NODEDUP_OS),
        ("sync", ONCE_SYNC, NODEDUP_SYNC),
    ] {
        goal_line(
            &mut out,
            &format!("{mode}: exactly-once E1 p50 ≤ 1.04× no dedup"),
            times(ratio(e1, once, nodedup, 50.0), |r| r <= 1.04),
            words,
        );
        for x in e2.xs() {
            goal_line(
                &mut out,
                &format!("{mode}: exactly-once E2 at {x} ≥ 0.96× no dedup"),
                times(ratio(e2, once, nodedup, x), |r| r >= 0.96),
                words,
            );
        }
    }
    for s in [NODEDUP_OS, ONCE_OS] {
        goal_line(
            &mut out,
            &format!("{s}: E1 p50 ≤ 1.2× plain"),
            times(ratio(e1, s, PLAIN, 50.0), |r| r <= 1.2),
            words,
        );
        goal_line(
            &mut out,
            &format!("{s}: E2 at 1024 ≥ 0.7× plain"),
            times(ratio(e2, s, PLAIN, 1024.0), |r| r >= 0.7),
            words,
        );
    }
    for s in [NODEDUP_SYNC, ONCE_SYNC] {
        let bound = median(e1, PLAIN, 50.0)
            .zip(disk_p50)
            .map(|(p, d)| p + 1.2 * d);
        goal_line(
            &mut out,
            &format!("{s}: E1 p50 ≤ plain p50 + 1.2 × the disk's fdatasync p50"),
            median(e1, s, 50.0)
                .zip(bound)
                .map(|(v, b)| (format!("{} µs (bound {} µs)", sig(v), sig(b)), v <= b)),
            words,
        );
        goal_line(
            &mut out,
            &format!("{s}: E2 at 1024 ≥ 200 calls per fdatasync"),
            median(syncs, s, 1024.0)
                .map(|v| 1.0 / v)
                .filter(|v| v.is_finite())
                .map(|v| (sig(v), v >= 200.0)),
            words,
        );
        goal_line(
            &mut out,
            &format!("{s}: E2 at 1024 ≥ 0.5× plain"),
            times(ratio(e2, s, PLAIN, 1024.0), |r| r >= 0.5),
            words,
        );
    }
    if let Some(&n) = xs.first() {
        goal_line(
            &mut out,
            "replay ≥ 10⁶ records/s",
            median(replay, REPLAY_RATE, n).map(|r| (format!("{} M/s", sig(r / 1e6)), r >= 1e6)),
            words,
        );
        goal_line(
            &mut out,
            "start to first answer ≤ 1 s + replay (open)",
            median(replay, REPLAY_SERVING, n)
                .zip(median(replay, REPLAY_OPEN, n))
                .map(|(s, o)| {
                    (
                        format!("{} ms = open {} ms + {} ms", sig(s), sig(o), sig(s - o)),
                        s - o <= 1000.0,
                    )
                }),
            words,
        );
    }
    if let (Some(&k), Some(&n)) = (killed.xs().first(), xs.first()) {
        goal_line(
            &mut out,
            "kill to serving ≤ 1 s + replay",
            median(killed, KILL_SERVING, k)
                .zip(median(replay, REPLAY_RATE, n))
                .map(|(ms, rate)| {
                    let replay_ms = k / rate * 1e3;
                    (
                        format!(
                            "{} ms (replay of {} records: {} ms)",
                            sig(ms),
                            sig(k),
                            sig(replay_ms)
                        ),
                        ms <= 1000.0 + replay_ms,
                    )
                }),
            words,
        );
    }
    out.push('\n');
    out
}

fn notes(
    ctx: &Ctx,
    window: Duration,
    e1_window: Duration,
    warmup: Duration,
    disk_count: u64,
    pause_calls: u64,
) -> Vec<String> {
    vec![
        format!(
            "The operation: `Add(x)` on a `Durable<u64>` (`impl Op<u64> for Add`, named \
             `bench.add`: add `x`, answer the new value) held by rank 1 of a two-rank rack over \
             loopback TCP (`GSM_TRANSPORT=tcp`, `GSM_WORKERS=1`), called from rank 0. `{PLAIN}`: \
             `bench rack`'s gossamer line, `apply_with` (E1) or `apply_then_with` (E2) on a \
             `Trust<u64>` of rank 1. `deferred answers, no log`: the add on a plain `Trust<u64>` of rank 1 by `apply_deferred_then_with`, each reply sent at the end of the trustee's loop round as a durable property's are, nothing logged. `no dedup`: `call_then_without_dedup`, the call logged \
             without its exactly-once record (E1: waited for before the next). `exactly-once`: \
             `call` (E1) and `call_then` (E2). `(os)`: `GSM_DURABILITY=os`, the answer leaves \
             once its record is written to the kernel; `(sync)`: once it is flushed \
             (`fdatasync`, one per commit round). The durability is a process's setting: one \
             rack runs `os` (and the plain calls), another `sync`, each with a fresh \
             `GSM_STATE_DIR` in a temporary directory (removed at the end) and \
             `GSM_JOB_NAME={JOB_NAME}`."
        ),
        format!(
            "Method: the racks' ranks are child processes of this one; while one system is \
             measured, the other rack's ranks are stopped with SIGSTOP; the systems take turns \
             run by run. Each run is preceded by an unmeasured warm-up of {} ms. Windows: {} ms \
             for E1, {} ms for E2; {} runs per point, median with min–max. Every run checks \
             itself: the counter, read with `Durable::read` (plain: `apply`), must hold exactly \
             the sum of every `x` sent, and each E1 answer must be the running sum (a call run \
             twice would show in both).",
            warmup.as_millis(),
            e1_window.as_millis(),
            window.as_millis(),
            ctx.runs,
        ),
        format!(
            "Per call (E2): `fdatasync`s made by rank 1's process (gossamer's count, read \
             before and after the measured run) and the bytes it appended to its log's \
             segments (gossamer's count; snapshots are not counted), \
             both divided by the calls made, those answered after the window included. The \
             disk: {disk_count} `pwrite`s of 4 KiB, each to its own block of a file in the \
             state directory's file system that was written and flushed beforehand (no write \
             allocates or changes the file's size, so `fdatasync` flushes data only), each \
             followed by `fdatasync`, measured in each run after E1."
        ),
        format!(
            "Snapshot pause: a `Durable<Vec<u64>>` of 1 Mi entries (full-width values), changed \
             by `bench.set` (set one entry, answer the old one). gossamer snapshots a property \
             at every {}th record since its last snapshot; each run pipelines calls up to \
             {} before that one, then makes {pause_calls} calls one at a time (blocking \
             `call`), the snapshot among them, and reports their p50, p99.9 and the slowest; \
             every answer is checked against a copy kept by rank 0, and the whole state \
             afterwards.",
            gossamer::durable::SNAPSHOT_RECORDS,
            pause_calls / 2
        ),
        format!(
            "Replay: a rack under `sync` fills properties `replay-0`, … with at most \
             {REPLAY_PER} `bench.add` calls each (`call_then`, 1024 unanswered), fewer than \
             the {} records that snapshot a property, so that every record lies after its \
             property's only snapshot (made at its creation; checked by counting the snapshot \
             files), and ends. In each run a new rack starts on the same state and rank 0 opens \
             every property (`Node::durable`; the first open reads rank 1's whole log, each \
             replays its records; the first is also timed alone) and makes one call \
             (`call(Add(0))`); replay rate = records / open time. Start to first answer: from starting the new rack's processes to the \
             answer of that call, as this process sees it. The log is read from the page \
             cache (it was just written).",
            gossamer::durable::SNAPSHOT_RECORDS
        ),
        format!(
            "Kill to serving: a job of 2 ranks under `gsm run --recover` (`sync`, one worker \
             each, `kill.rs`): rank 0 makes {KILL_RECORDS} (quick: 1000) `bench.add` calls on a \
             `Durable<u64>` on rank 1, all after its snapshot, then, 5 times per run (quick: 3), \
             asks rank 1 for its pid, SIGKILLs it and calls at once; the time is from the kill \
             to that call's answer: the loss found, gsm's restart, the new process's start, \
             registration and links, the property reopened from its log, the call resent. \
             The goal's replay time is those records at the replay rate measured above."
        ),
    ]
}
