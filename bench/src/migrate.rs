//! `migrate` — moving properties between trustees: a badly placed workload (every property on
//! one trustee, Zipf-hot) over time without rebalancing, with it, and placed well from the
//! start; and the latency of calls while a property moves.
//!
//! Throughput: a runtime of one worker per core; 32 counters, each request picks one by a
//! Zipf (α = 0.99) stream and runs a short critical section (`WORK` spins) on it; one fiber per
//! worker keeps 256 `apply_then` in flight (a `Group` window), counting answers. A sampler
//! reads the counts every 200 ms (100 ms in a smoke run). *Ideal* places the counters greedily
//! by their Zipf weight on the least loaded trustee; *badly placed* puts all of them on worker
//! 0. Moves after the first 2 s of a rebalanced run are counted (`WorkerStats::moved_away`).
//! A full run also keeps a rebalanced run going for a minute after those 2 s and counts its
//! moves there (the goal allows one a minute once the load is even): one with the default
//! policy, one with its rounds of moves not rationed (`Rebalance::spacing(ZERO)`) as the
//! baseline.
//!
//! Latency: a plain thread calls `apply` on one counter, one call in flight, while another
//! thread moves the counter between two trustees at a given rate; p50 and p99 of the calls.
//! Every call is checked to have run once (the counter's final value).
//!
//! Between ranks: a rack of three ranks of one worker each on loopback TCP
//! (`rack::start_rack`); a fiber of rank 0 calls `apply_with` on a counter made there, one call
//! in flight, while another fiber of rank 0 moves the counter between rank 1 and rank 2 at a
//! given rate (`gossamer::Trust::migrate_to`), so that every call takes the same path (through
//! rank 0, its first home, to where it lives); p50 and p99 of the calls, against the same calls
//! with the counter staying on rank 1. Every call is checked to have run once, in order (each
//! answers the sum so far).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::ensure;
use trust::{Group, Rebalance, Runtime, Trust};

use crate::figure::{Figure, Panel, XFormat};
use crate::harness::Ctx;
use crate::rack::load::Measured;
use crate::workload::{Dist, Stream};

/// Properties in the throughput runs.
const PROPERTIES: usize = 32;
/// Zipf exponent of the property stream.
const ALPHA: f64 = 0.99;
/// Spins of the critical section (a few tens of nanoseconds).
const WORK: u32 = 32;
/// Requests each client fiber keeps in flight.
const WINDOW: usize = 256;

/// The latency panel's baseline: calls' p99 while nothing moves.
const UNMOVED: &str = "p99, not moving";

/// How the properties are placed and whether the runtime rebalances.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Placement {
    Ideal,
    Bad,
    BadRebalanced,
}

impl Placement {
    fn name(self) -> &'static str {
        match self {
            Placement::Ideal => "placed well from the start",
            Placement::Bad => "all on worker 0",
            Placement::BadRebalanced => "all on worker 0, rebalanced",
        }
    }
}

/// A counter with its padding, so that two never share a cache line.
#[repr(align(128))]
struct Counter(u64);

fn critical_section(c: &mut Counter) {
    for _ in 0..WORK {
        std::hint::spin_loop();
    }
    c.0 += 1;
}

/// Places property `i` (Zipf rank `i + 1`) for `placement` on `workers` trustees.
fn placement_of(placement: Placement, workers: usize) -> Vec<usize> {
    match placement {
        Placement::Bad | Placement::BadRebalanced => vec![0; PROPERTIES],
        Placement::Ideal => {
            let mut load = vec![0.0f64; workers];
            (0..PROPERTIES)
                .map(|i| {
                    let weight = 1.0 / ((i + 1) as f64).powf(ALPHA);
                    let w = (0..workers)
                        .min_by(|&a, &b| load[a].total_cmp(&load[b]))
                        .expect("a worker");
                    load[w] += weight;
                    w
                })
                .collect()
        }
    }
}

/// One run of the throughput panel: requests per second in each bucket, and how many moves
/// happened after `CONVERGED` (`None` for a run shorter than that).
fn timeline(
    placement: Placement,
    policy: &Rebalance,
    workers: usize,
    buckets: usize,
    bucket: Duration,
    stream: &Stream,
) -> anyhow::Result<(Vec<f64>, Option<u64>)> {
    let mut builder = Runtime::builder().workers(workers);
    if placement == Placement::BadRebalanced {
        builder = builder.rebalance(policy.clone());
    }
    let rt = builder.build()?;
    let homes = placement_of(placement, workers);
    let properties: Arc<Vec<Trust<Counter>>> = Arc::new(
        homes
            .iter()
            .map(|&w| rt.trustee(w).entrust(Counter(0)))
            .collect(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let answered: Arc<Vec<AtomicU64>> = Arc::new((0..workers).map(|_| AtomicU64::new(0)).collect());
    let clients: Vec<_> = (0..workers)
        .map(|w| {
            let (properties, stop, answered) = (properties.clone(), stop.clone(), answered.clone());
            let mut cursor = stream.cursor(w);
            rt.spawn_on(w, move || {
                let group = Group::new();
                let mut sent = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        let answered = answered.clone();
                        properties[cursor.next_index()].apply_then(
                            critical_section,
                            group.track(move |()| {
                                answered[w].fetch_add(1, Ordering::Relaxed);
                            }),
                        );
                        sent += 1;
                    }
                    group.wait_until_pending_at_most(WINDOW);
                }
                group.wait();
                sent
            })
        })
        .collect();
    let total = || {
        answered
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let moves = || -> u64 { rt.stats().workers.iter().map(|w| w.moved_away).sum() };
    let mut rates = Vec::with_capacity(buckets);
    let mut moves_at_deadline = None;
    let (mut last, mut at) = (total(), Instant::now());
    for b in 0..buckets {
        std::thread::sleep(bucket);
        let (now, when) = (total(), Instant::now());
        rates.push((now - last) as f64 / (when - at).as_secs_f64() / 1e6);
        (last, at) = (now, when);
        if (b + 1) as u32 * bucket == CONVERGED {
            moves_at_deadline = Some(moves());
        }
    }
    // Moves after the time the goal gives the placement to converge.
    let late_moves = moves_at_deadline.map(|m| moves() - m);
    stop.store(true, Ordering::Relaxed);
    let sent: u64 = clients.into_iter().map(|c| c.join()).sum();
    let ran: u64 = properties.iter().map(|p| p.apply(|c| c.0)).sum();
    ensure!(
        ran == sent,
        "{}: {sent} requests made, {ran} ran",
        placement.name()
    );
    Ok((rates, late_moves))
}

/// The time a badly placed load has to reach 0.9× the well placed one's throughput (the
/// goal); moves after it count as churn.
const CONVERGED: Duration = Duration::from_secs(2);

/// The run that counts the moves in a minute after convergence (full runs only).
const STEADY: &str = "a minute after convergence";
const STEADY_FOR: Duration = Duration::from_secs(60);

/// One run of the latency panel at `rate` moves per second: p50 and p99 in microseconds.
fn latency_under_moves(rate: u64, window: Duration) -> anyhow::Result<(f64, f64)> {
    let rt = Runtime::builder().workers(2).build()?;
    let counter = rt.trustee(0).entrust(0u64);
    let stop = Arc::new(AtomicBool::new(false));
    let mover = (rate > 0).then(|| {
        let (counter, stop) = (counter.clone(), stop.clone());
        std::thread::spawn(move || -> anyhow::Result<u64> {
            let gap = Duration::from_secs_f64(1.0 / rate as f64);
            let mut next = Instant::now();
            let mut moves = 0;
            while !stop.load(Ordering::Relaxed) {
                counter
                    .migrate_to((counter.trustee() + 1) % 2)
                    .map_err(anyhow::Error::msg)?;
                moves += 1;
                next += gap;
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            Ok(moves)
        })
    });
    let mut histogram = hdrhistogram::Histogram::<u64>::new(3)?;
    let mut calls = 0u64;
    let end = Instant::now() + window;
    while Instant::now() < end {
        let started = Instant::now();
        counter.apply(|n| *n += 1);
        histogram.record(started.elapsed().as_nanos() as u64)?;
        calls += 1;
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(mover) = mover {
        let moves = mover.join().expect("the mover thread")?;
        ensure!(moves > 0, "no move happened during the run");
    }
    let ran = counter.apply(|n| *n);
    ensure!(ran == calls, "{calls} calls made, {ran} ran");
    let us = |q: f64| histogram.value_at_quantile(q) as f64 / 1e3;
    Ok((us(0.5), us(0.99)))
}

/// The rack panel's baseline: the counter staying on rank 1.
const STAYS: &str = "p99, not moving (on rank 1)";

/// The rack panel: p50 and p99 at each rate, and the baseline drawn at every rate.
fn rack_panel(ctx: &mut Ctx, rates: &[u64], window: Duration) -> anyhow::Result<Panel> {
    let mut panel = Panel::new(
        "rack-latency",
        "Latency of calls while the property moves between two ranks",
    );
    panel.x_label = "moves per second".into();
    panel.x_format = XFormat::Count;
    panel.y_label = "µs per call (one in flight, a fiber of rank 0)".into();
    panel.baseline = Some(STAYS.into());
    let me = std::env::current_exe()?;
    let mut ranks = crate::rack::start_rack(&me, 3, "tcp")?;
    let patience = window + Duration::from_secs(60);
    let mut measure = |rate: u64| -> anyhow::Result<Measured> {
        let command = format!("mig-lat {rate} {}", window.as_millis());
        let words = ranks[0].call(&command, patience)?;
        ensure!(words.len() == 7, "`{command}` answered {words:?}");
        let moves: u64 = words[6].parse()?;
        ensure!(rate == 0 || moves > 0, "no move in `{command}`");
        Measured::parse(&words[..6])
    };
    for _ in 0..ctx.runs {
        ctx.status("rack latency, not moving");
        let still = measure(0)?;
        ctx.tick();
        for &rate in rates {
            ctx.status(format!("rack latency at {rate} moves/s"));
            let moving = measure(rate)?;
            panel.add("p50", rate as f64, moving.p50_us);
            panel.add("p99", rate as f64, moving.p99_us);
            panel.add(STAYS, rate as f64, still.p99_us);
            ctx.tick();
        }
    }
    ranks[0].call("check-moved", patience)?;
    Ok(panel)
}

/// The redirect panel's baseline: a counter made where it lives.
const MADE_THERE: &str = "p99, made on rank 2";

/// The redirect panel: from rank 1, p50 and p99 of calls to a counter on rank 2 that was
/// made there, and to one made on rank 0 and moved there, over `runs` runs.
fn redirect_panel(ctx: &mut Ctx, window: Duration) -> anyhow::Result<Panel> {
    let mut panel = Panel::new(
        "rack-redirect",
        "Calls from rank 1 to a property on rank 2: made there, or made on rank 0 and moved",
    );
    panel.x_label = "ranks in the job".into();
    panel.x_format = XFormat::Whole;
    panel.y_label = "µs per call (one in flight, a fiber of rank 1)".into();
    panel.baseline = Some(MADE_THERE.into());
    let me = std::env::current_exe()?;
    let mut ranks = crate::rack::start_rack(&me, 3, "tcp")?;
    let patience = 2 * window + Duration::from_secs(60);
    for run in 1..=ctx.runs {
        ctx.status(format!("redirect latency, run {run}"));
        let command = format!("far-lat {}", window.as_millis());
        let words = ranks[0].call(&command, patience)?;
        ensure!(words.len() == 12, "`{command}` answered {words:?}");
        let (made, moved) = (Measured::parse(&words[..6])?, Measured::parse(&words[6..])?);
        let x = 3.0;
        panel.add("p50, made on rank 2", x, made.p50_us);
        panel.add(MADE_THERE, x, made.p99_us);
        panel.add("p50, made on rank 0, moved to rank 2", x, moved.p50_us);
        panel.add("p99, made on rank 0, moved to rank 2", x, moved.p99_us);
        ctx.tick();
    }
    Ok(panel)
}

/// Runs the experiment.
pub fn run(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let workers = ctx.cores.max(2);
    // Quick: 0.6 s; full: 6 s, 4 of them after the time the goal gives to converge.
    let (buckets, bucket) = if ctx.quick {
        (6, Duration::from_millis(100))
    } else {
        (30, Duration::from_millis(200))
    };
    // Each run measures the unmoved latency too (the baseline), before the moving rates.
    let rates: &[u64] = if ctx.quick { &[100] } else { &[10, 100, 1000] };
    let latency_window = if ctx.quick {
        Duration::from_millis(100)
    } else {
        Duration::from_secs(1)
    };
    let placements = [Placement::Ideal, Placement::Bad, Placement::BadRebalanced];
    // A full run also keeps two rebalanced runs going for a minute after they converged.
    let steady = !ctx.quick && ctx.selected(STEADY);
    let rack_rates: &[u64] = if ctx.quick { &[10] } else { &[10, 100] };
    let rack = ctx.selected("rack");
    // The rate panel's baseline and rates, and the redirect panel's run.
    let rack_ticks = if rack { 2 + rack_rates.len() } else { 0 };
    ctx.begin(
        "migrate",
        (ctx.runs * (placements.len() + 1 + rates.len() + rack_ticks) + 2 * usize::from(steady))
            as u64,
    );
    let stream = Stream::with_exponent(Dist::Zipf, ALPHA, PROPERTIES, 1);

    let mut over_time = Panel::new("over-time", "Throughput over time, badly placed and not");
    over_time.x_label = "seconds since start".into();
    over_time.x_format = XFormat::Rate;
    over_time.log_x = false;
    over_time.y_label = "million requests/s".into();
    over_time.baseline = Some(Placement::Ideal.name().into());
    let mut late_moves = Vec::new();
    for _ in 0..ctx.runs {
        for placement in placements {
            if !ctx.selected(placement.name()) {
                ctx.skip(1);
                continue;
            }
            ctx.status(placement.name());
            let (rates, moves) = timeline(
                placement,
                &Rebalance::default(),
                workers,
                buckets,
                bucket,
                &stream,
            )?;
            for (b, rate) in rates.into_iter().enumerate() {
                over_time.add(
                    placement.name(),
                    (b + 1) as f64 * bucket.as_secs_f64(),
                    rate,
                );
            }
            if let (Placement::BadRebalanced, Some(moves)) = (placement, moves) {
                late_moves.push(moves);
            }
            ctx.tick();
        }
    }

    // The default policy, and as the baseline the same without its rationing of rounds.
    let mut steady_moves = Vec::new();
    if steady {
        let unrationed = Rebalance::default().spacing(Duration::ZERO);
        for (name, policy) in [
            ("default policy", Rebalance::default()),
            ("rounds not rationed (`spacing(ZERO)`)", unrationed),
        ] {
            ctx.status(format!("{STEADY}, {name}"));
            let buckets = ((CONVERGED + STEADY_FOR).as_millis() / bucket.as_millis()) as usize;
            let placement = Placement::BadRebalanced;
            let (_, moves) = timeline(placement, &policy, workers, buckets, bucket, &stream)?;
            steady_moves.push((name, moves.unwrap_or_default()));
            ctx.tick();
        }
    }

    let mut latency = Panel::new("latency", "Latency of calls while the property moves");
    latency.x_label = "moves per second".into();
    latency.x_format = XFormat::Count;
    latency.y_label = "µs per call (one in flight, a plain thread)".into();
    // The unmoved p99 is drawn at every rate, as the line the goal (≤ 5×) is measured from:
    // a point at 0 moves a second has no place on the log axis.
    latency.baseline = Some(UNMOVED.into());
    for _ in 0..ctx.runs {
        ctx.status("latency, not moving");
        let (_, still) = latency_under_moves(0, latency_window)?;
        ctx.tick();
        for &rate in rates {
            ctx.status(format!("latency at {rate} moves/s"));
            let (p50, p99) = latency_under_moves(rate, latency_window)?;
            latency.add("p50", rate as f64, p50);
            latency.add("p99", rate as f64, p99);
            latency.add(UNMOVED, rate as f64, still);
            ctx.tick();
        }
    }
    let mut panels = vec![over_time, latency];
    if rack {
        panels.push(rack_panel(ctx, rack_rates, latency_window)?);
        panels.push(redirect_panel(ctx, latency_window)?);
    }
    ctx.finish();

    let mut notes = vec![
        format!(
            "{workers} workers, {PROPERTIES} counters chosen by a Zipf (α = {ALPHA}) stream, a \
             critical section of {WORK} spins; one fiber per worker keeps {WINDOW} `apply_then` \
             in flight. Throughput is sampled every {} ms; the median of {} runs per point.",
            bucket.as_millis(),
            ctx.runs
        ),
        format!(
            "Latency: a plain thread calls `apply` in a loop while another moves the counter \
             between workers 0 and 1 at the given rate ({} per rate); `{UNMOVED}` is the same \
             calls' p99 with no move in the same run, drawn at every rate. Rebalanced: \
             `Builder::rebalance(Rebalance::default())`.",
            if ctx.quick { "100 ms" } else { "1 s" }
        ),
    ];
    if rack {
        notes.push(format!(
            "Between ranks: three ranks of one worker on loopback TCP; a fiber of rank 0 \
             calls `apply_with` on a counter made there while another moves it between rank 1 \
             and rank 2 at the given rate ({} per rate), so that every call goes through rank \
             0 to where the counter lives; `{STAYS}` is the same calls with the counter \
             staying on rank 1, in the same run.",
            if ctx.quick { "100 ms" } else { "1 s" }
        ));
        notes.push(format!(
            "Redirected: on the same three ranks, a fiber of rank 1 calls `apply_with` on a \
             counter living on rank 2 ({} each, per run): one made there (`{MADE_THERE}`, the \
             baseline), and one made on rank 0 and moved there, whose first call goes through \
             rank 0, which tells rank 1 where it went; the later ones go straight to rank 2.",
            if ctx.quick { "100 ms" } else { "1 s" }
        ));
    }
    if let Some(reached) = reached(&panels[0], 0.9) {
        notes.push(format!(
            "With rebalancing, the badly placed workload first reaches 0.9× the well placed \
             one's median at {reached:.1} s."
        ));
    }
    if !late_moves.is_empty() {
        let after = buckets as f64 * bucket.as_secs_f64() - CONVERGED.as_secs_f64();
        notes.push(format!(
            "Moves after the first {} s of each rebalanced run (`WorkerStats::moved_away`), \
             over {after:.0} s each: {late_moves:?}.",
            CONVERGED.as_secs()
        ));
    }
    if !steady_moves.is_empty() {
        let counted: Vec<String> = steady_moves
            .iter()
            .map(|(name, moves)| format!("{moves} with the {name}"))
            .collect();
        notes.push(format!(
            "Moves in one rebalanced run kept going for {} s after the first {} s: {} (the \
             goal: at most one a minute).",
            STEADY_FOR.as_secs(),
            CONVERGED.as_secs(),
            counted.join(", ")
        ));
    }
    Ok(Figure {
        name: "migrate".into(),
        title: "Moving properties: a badly placed load over time, and calls during moves".into(),
        notes,
        panels,
        columns: 2,
        extra_markdown: String::new(),
    })
}

/// The first time at which the rebalanced series' median reaches `share` of the well placed
/// series' median over the whole run.
fn reached(panel: &Panel, share: f64) -> Option<f64> {
    let series = |name: &str| panel.series.iter().find(|s| s.system == name);
    let ideal = series(Placement::Ideal.name())?;
    let rebalanced = series(Placement::BadRebalanced.name())?;
    let mut ideal_medians: Vec<f64> = ideal.points.iter().map(|p| p.median()).collect();
    ideal_medians.sort_by(f64::total_cmp);
    let ideal = ideal_medians.get(ideal_medians.len() / 2)?;
    rebalanced
        .points
        .iter()
        .find(|p| p.median() >= share * ideal)
        .map(|p| p.x)
}
