//! `rangelock`: the range lock of `crates/rangelock` under the seed's workload M (§5.2.2),
//! with each way a waiting request learns of its grant: `Deferred` (the trustee answers when
//! the range frees), and the seed's polling designs kept as baselines, `PollRpc` and
//! `PollFlag` with flags 1 byte and 64 bytes apart.
//!
//! A rack of 3 ranks through shared memory: rank 0 holds every lock (one per system) and is
//! the server, on one core; ranks 1 and 2 run the client fibers, both on the other core
//! (`fibers in 2 processes`). Each client loops for the window: a range of uniform length
//! 1..2¹¹ at a uniform start in 2¹⁶ units, a write with the given share, held for the given
//! time (spinning), then unlocked. Per run: locks per second, p50/p99 of the time from the
//! lock call to the grant, and the least and mean locks of one client (fairness). The
//! systems take turns within one rack; the others' locks sit idle meanwhile.
//!
//! The client-side baselines (static segmentation, Citron, the interval-tree server,
//! `launch`) are not built yet; this experiment measures the lock's own modes against each
//! other.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use gossamer::Node;
use rangelock::{FlagSpacing, Mode, Notify, RangeLock};

use crate::figure::{Figure, Panel};
use crate::harness::Ctx;
use crate::rack::child;
use crate::rack::{PATIENCE, goal_row, ratio, start_rack};


/// The lock's units (the seed's 2¹⁶).
const UNITS: u64 = 1 << 16;
/// Longest range (the seed's 2¹¹).
const LONGEST: u64 = 1 << 11;
/// Latency samples kept per client rank and run.
const SAMPLES: usize = 20_000;

const DEFERRED: &str = "Deferred";
const POLL_RPC: &str = "PollRpc";
const POLL_BYTE: &str = "PollFlag (1 B)";
const POLL_LINE: &str = "PollFlag (64 B)";
const SYSTEMS: [&str; 4] = [DEFERRED, POLL_RPC, POLL_BYTE, POLL_LINE];

/// The command-line word of a system (no spaces).
fn word(system: &str) -> &'static str {
    match system {
        DEFERRED => "deferred",
        POLL_RPC => "poll-rpc",
        POLL_BYTE => "poll-byte",
        _ => "poll-line",
    }
}

fn notify_of(word: &str) -> anyhow::Result<Notify> {
    Ok(match word {
        "deferred" => Notify::Deferred,
        "poll-rpc" => Notify::PollRpc,
        "poll-byte" => Notify::PollFlag(FlagSpacing::Byte),
        "poll-line" => Notify::PollFlag(FlagSpacing::Line),
        other => anyhow::bail!("unknown range-lock system {other}"),
    })
}

/// Runs the experiment.
pub fn run(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let me = ctx.self_exe.clone().context(
        "`rangelock` starts its ranks by running this executable again: run it as `cargo run --release -p bench -- rangelock`",
    )?;
    let window = ctx.window;
    let (writes, clients, holds): (&[u64], &[u64], &[u64]) = if ctx.quick {
        (&[20], &[1, 8], &[0])
    } else {
        (&[0, 1, 20, 100], &[1, 2, 8, 48], &[0, 10])
    };
    let systems: Vec<&str> = SYSTEMS.into_iter().filter(|s| ctx.selected(s)).collect();
    let mut panels: Vec<((u64, u64), Panel, Panel)> = Vec::new();
    for &hold in holds {
        for &w in writes {
            let mut rate = Panel::new(
                format!("rate/writes-{w}/hold-{hold}us"),
                format!("{w}% writes, hold {hold} µs: locks per second"),
            );
            rate.x_label = "clients".into();
            rate.y_label = "locks per second (M)".into();
            rate.log_y = true;
            rate.baseline = Some(DEFERRED.into());
            let mut p99 = Panel::new(
                format!("p99/writes-{w}/hold-{hold}us"),
                format!("{w}% writes, hold {hold} µs: p99 lock → grant"),
            );
            p99.x_label = "clients".into();
            p99.y_label = "p99 (µs)".into();
            p99.log_y = true;
            p99.plotted = false;
            panels.push(((w, hold), rate, p99));
        }
    }
    let mut fairness = Panel::new("fairness", "least locks of one client / mean, every point");
    fairness.plotted = false;

    ctx.begin(
        "rangelock",
        (ctx.runs * systems.len() * writes.len() * clients.len() * holds.len()) as u64,
    );
    ctx.status("starting a rack of 3 ranks".to_string());
    let mut ranks = start_rack(&me, 3, "shm")?;
    // Rank 0 serves on one core; both client ranks share the other.
    child::pin(ranks[2].pid(), 1)?;
    let result = (|| -> anyhow::Result<()> {
        let ms = window.as_millis().max(1);
        for run in 0..ctx.runs {
            for ((w, hold), rate, p99) in panels.iter_mut() {
                for &c in clients {
                    for &s in &systems {
                        ctx.status(format!("{s}, {w}% writes, hold {hold} µs, {c} clients"));
                        let seed = run as u64 * 1000 + c;
                        let words = ranks[0].call(
                            &format!("rl {} {w} {hold} {c} {ms} {seed}", word(s)),
                            window * 4 + PATIENCE,
                        )?;
                        let m = Measured::parse(&words)?;
                        rate.add(s, c as f64, m.ops as f64 / m.secs / 1e6);
                        p99.add(s, c as f64, m.p99_us);
                        fairness.add(s, c as f64, m.least / m.mean);
                        ctx.tick();
                    }
                }
            }
        }
        Ok(())
    })();
    for r in ranks {
        r.finish(PATIENCE)?;
    }
    result?;
    ctx.finish();

    let extra = goals(&panels, &fairness, clients);
    let mut fig = Figure {
        name: "rangelock".into(),
        title: "Range locks on a trustee: how a waiting request learns of its grant".into(),
        notes: notes(ctx, window),
        panels: Vec::new(),
        columns: 4,
        extra_markdown: extra,
    };
    for (_, rate, p99) in panels {
        fig.panels.push(rate);
        fig.panels.push(p99);
    }
    fig.panels.push(fairness);
    Ok(fig)
}

fn notes(ctx: &Ctx, window: Duration) -> Vec<String> {
    vec![
        format!(
            "A rack of 3 ranks through shared memory (`GSM_WORKERS=1`): rank 0 holds one lock \
             of 2^16 units per system and serves on one core; ranks 1 and 2 run the clients \
             (fibers, split between them) on the other core. Each client loops: a range of \
             uniform length 1..2^11 at a uniform start, a write with the given share, held for \
             the given time (spinning), unlocked. {} runs of {} ms per point; each cell the \
             median, with min–max.",
            ctx.runs,
            window.as_millis()
        ),
        "Systems: `Deferred` (the trustee answers the lock call when the range frees), \
         `PollRpc` (the call returns at once; the client asks by RPC until granted; the seed's \
         design 1), `PollFlag` (the trustee raises a flag in a region on its node, 1 byte or \
         64 bytes apart; the client reads it with one-sided gets; design 2). Latency is from \
         the lock call to the grant. The seed capped lengths only for static segmentation; \
         here every system gets lengths uniform in 1..2^11."
            .into(),
        "Not yet measured: the client-side baselines (static segmentation, Citron), the \
         interval-tree server and `launch`, and workloads L and O."
            .into(),
    ]
}

/// The goals that involve only these systems: `Deferred` ≥ each polling mode at every point,
/// and no client below half its role's mean.
fn goals(panels: &[((u64, u64), Panel, Panel)], fairness: &Panel, clients: &[u64]) -> String {
    let mut out = String::from(
        "## Goals (issue #16), among the lock's own modes\n\n| goal | worst ratio | met |\n| --- | ---: | ---: |\n",
    );
    for other in [POLL_RPC, POLL_BYTE, POLL_LINE] {
        let worst = panels
            .iter()
            .flat_map(|(_, rate, _)| {
                clients
                    .iter()
                    .filter_map(|&c| ratio(rate, DEFERRED, other, c as f64))
            })
            .fold(None, |w: Option<f64>, r| Some(w.map_or(r, |w| w.min(r))));
        goal_row(
            &mut out,
            &format!("Deferred ≥ {other} (locks/s), every point"),
            worst,
            &|r| r >= 1.0,
        );
    }
    for s in SYSTEMS {
        // The worst single run of any point: a client starved once is starved.
        let worst = fairness
            .series
            .iter()
            .filter(|series| series.system == s)
            .flat_map(|series| series.points.iter().flat_map(|p| p.samples.iter().copied()))
            .fold(None, |w: Option<f64>, r| Some(w.map_or(r, |w| w.min(r))));
        goal_row(
            &mut out,
            &format!("{s}: least client ≥ 0.5 × mean, worst run"),
            worst,
            &|r| r >= 0.5,
        );
    }
    let _ = writeln!(
        out,
        "\nThe issue's other goals compare against the client-side baselines and the \
         interval-tree server, which are not built yet."
    );
    out
}

/// One run's figures, as rank 0 answers them.
struct Measured {
    ops: u64,
    secs: f64,
    p99_us: f64,
    least: f64,
    mean: f64,
}

impl Measured {
    fn parse(words: &[String]) -> anyhow::Result<Measured> {
        ensure!(words.len() == 6, "a measurement is 6 words: {words:?}");
        Ok(Measured {
            ops: words[0].parse()?,
            secs: words[1].parse()?,
            p99_us: words[3].parse()?,
            least: words[4].parse()?,
            mean: words[5].parse()?,
        })
    }
}

// ----- rank 0 and the client ranks -----

/// Rank 0's `rl SYSTEM WRITES HOLD_US CLIENTS WINDOW_MS SEED`: runs the clients on the other
/// ranks against this system's lock on this rank, checks the lock is empty afterwards, and
/// answers `OPS SECS P50_US P99_US LEAST MEAN`.
pub(crate) fn command(
    words: &[&str],
    locks: &mut HashMap<String, RangeLock>,
) -> anyhow::Result<String> {
    let [system, writes, hold, clients, window, seed] = words else {
        anyhow::bail!("rl takes 6 words: {words:?}");
    };
    let lock = match locks.get(*system) {
        Some(l) => l.clone(),
        None => {
            let l = RangeLock::entrust_on(gossamer::this_node(), UNITS).notify(notify_of(system)?);
            locks.insert(system.to_string(), l.clone());
            l
        }
    };
    let (writes, hold, clients, window, seed): (u64, u64, u64, u64, u64) = (
        writes.parse()?,
        hold.parse()?,
        clients.parse()?,
        window.parse()?,
        seed.parse()?,
    );
    let client_ranks: Vec<Node> = gossamer::nodes().filter(|n| n.rank() != 0).collect();
    ensure!(!client_ranks.is_empty(), "rangelock needs client ranks");
    let runs: Vec<_> = client_ranks
        .iter()
        .enumerate()
        .filter_map(|(i, &n)| {
            // Clients split over the client ranks, the first taking the odd one.
            let mine = clients / client_ranks.len() as u64
                + u64::from((i as u64) < clients % client_ranks.len() as u64);
            (mine > 0).then(|| {
                let arg = (
                    lock.clone(),
                    mine,
                    writes,
                    hold,
                    window,
                    seed * 16 + i as u64,
                );
                gossamer::spawn_on(n, clients_run, arg)
            })
        })
        .collect();
    let mut counts = Vec::new();
    let mut samples = Vec::new();
    let mut secs: f64 = 0.0;
    for r in runs {
        let (c, s, t) = r.join();
        counts.extend(c);
        samples.extend(s);
        secs = secs.max(t);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while lock.requests() != 0 {
        ensure!(Instant::now() < deadline, "the lock's table never emptied");
        gossamer::yield_now();
    }
    let ops: u64 = counts.iter().sum();
    ensure!(ops > 0, "no lock was granted in the window");
    let mut hist = hdrhistogram::Histogram::<u64>::new(3)?;
    for s in &samples {
        hist.record(u64::from(*s).max(1))?;
    }
    let least = *counts.iter().min().expect("clients ran") as f64;
    let mean = ops as f64 / counts.len() as f64;
    Ok(format!(
        "{ops} {secs} {} {} {least} {mean}",
        hist.value_at_quantile(0.5) as f64 / 1e3,
        hist.value_at_quantile(0.99) as f64 / 1e3,
    ))
}

/// One client rank: `n` fibers lock for `window_ms`; (locks per client, latency samples in
/// ns, seconds measured).
fn clients_run(
    (lock, n, writes, hold_us, window_ms, seed): (RangeLock, u64, u64, u64, u64, u64),
) -> (Vec<u64>, Vec<u32>, f64) {
    let started = Instant::now();
    let end = started + Duration::from_millis(window_ms);
    let hold = Duration::from_micros(hold_us);
    let fibers: Vec<_> = (0..n)
        .map(|f| {
            let lock = lock.clone();
            gossamer::spawn(move || {
                let mut rng = crate::rack::Rng::new(seed * 1024 + f + 1);
                let (mut count, mut samples) = (0u64, Vec::new());
                while Instant::now() < end {
                    let len = 1 + rng.below(LONGEST);
                    let start = rng.below(UNITS - len);
                    let mode = if rng.below(100) < writes {
                        Mode::Write
                    } else {
                        Mode::Read
                    };
                    let asked = Instant::now();
                    let guard = lock.lock(start..start + len, mode);
                    let waited = asked.elapsed().as_nanos().min(u128::from(u32::MAX)) as u32;
                    if samples.len() < SAMPLES / n as usize + 1 {
                        samples.push(waited);
                    }
                    let until = Instant::now() + hold;
                    while Instant::now() < until {
                        std::hint::spin_loop();
                    }
                    drop(guard);
                    count += 1;
                }
                (count, samples)
            })
        })
        .collect();
    let (mut counts, mut samples) = (Vec::new(), Vec::new());
    for f in fibers {
        let (c, s) = f.join();
        counts.push(c);
        samples.extend(s);
    }
    (counts, samples, started.elapsed().as_secs_f64())
}
