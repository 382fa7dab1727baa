//! `gsm demo`: one shared counter, incremented as fast as possible by every core, with
//! delegation and with mutexes, side by side in one run.

use std::cell::Cell;
use std::hint::spin_loop;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::ensure;
use trust::{Group, Runtime, Trust};

/// Options of `gsm demo`.
#[derive(clap::Args, Debug)]
pub(crate) struct Options {
    /// Seconds each measurement runs.
    #[arg(long, default_value_t = 0.5)]
    seconds: f64,
    /// Measurements per system; the table shows their median, minimum and maximum.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Worker threads (and lock threads); default: one per core.
    #[arg(long)]
    threads: Option<usize>,
    /// Fibers per worker for the `apply` line.
    #[arg(long, default_value_t = 64)]
    fibers: usize,
    /// Critical sections only increment, without the seed's spin-loop pause: what is left is
    /// the cost of each scheme itself.
    #[arg(long)]
    no_pause: bool,
}

/// The critical section: increment, and (the seed's) one spin-loop pause.
#[inline(always)]
fn section(c: &mut u64, pause: bool) -> u64 {
    *c += 1;
    if pause {
        spin_loop();
    }
    *c
}

struct Line {
    name: String,
    ops: u64,
    elapsed: Duration,
}

impl Line {
    fn rate(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }
}

/// The mutex lines, the baseline of the "vs best mutex" column.
const MUTEXES: [&str; 2] = ["std::sync::Mutex", "parking_lot::Mutex"];
/// The single-thread, lock-free line, the baseline of the "vs ceiling" column.
const CEILING: &str = "1 thread, no lock (ceiling)";

/// Requests an `apply_then` issuer keeps in flight before it waits for answers.
const WINDOW: usize = 4096;

pub(crate) fn run(options: &Options) -> anyhow::Result<()> {
    ensure!(
        options.seconds > 0.0 && options.seconds <= 3600.0,
        "--seconds must be in (0, 3600]"
    );
    ensure!(options.fibers > 0, "--fibers must be at least 1");
    ensure!(
        (1..=100).contains(&options.runs),
        "--runs must be in 1..=100"
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = options.threads.unwrap_or(cores).max(1);
    let duration = Duration::from_secs_f64(options.seconds);
    println!(
        "gsm demo: fetch-and-add on one shared counter, {threads} threads on {cores} cores, \
         median of {} runs of {:.1} s per system",
        options.runs, options.seconds
    );
    let pause = !options.no_pause;
    if pause {
        println!(
            "(each critical section increments the counter and executes one spin-loop pause)\n"
        );
    } else {
        println!("(each critical section only increments the counter)\n");
    }

    let shared = Runtime::builder().workers(threads).build()?;
    let dedicated = if threads >= 2 {
        Some(
            Runtime::builder()
                .workers(threads)
                .dedicated_trustees(1)
                .build()?,
        )
    } else {
        None
    };
    let mut systems: Vec<(String, Vec<f64>)> = Vec::new();
    for _ in 0..options.runs {
        // Every run measures every system, so slow phases of a busy machine hit all of them.
        let mut lines = vec![
            ceiling_line(duration, pause)?,
            lock_line(
                MUTEXES[0],
                threads,
                duration,
                std::sync::Mutex::new(0u64),
                move |m| {
                    section(&mut m.lock().unwrap_or_else(|e| e.into_inner()), pause);
                },
            )?,
            lock_line(
                MUTEXES[1],
                threads,
                duration,
                parking_lot::Mutex::new(0u64),
                move |m| {
                    section(&mut m.lock(), pause);
                },
            )?,
            apply_line(&shared, options.fibers, duration, pause)?,
            apply_then_line(
                "Trust apply_then (shared trustees)",
                &shared,
                duration,
                pause,
            )?,
        ];
        if let Some(dedicated) = &dedicated {
            lines.push(apply_then_line(
                "Trust apply_then (1 dedicated trustee)",
                dedicated,
                duration,
                pause,
            )?);
        }
        for line in lines {
            match systems.iter_mut().find(|(name, _)| *name == line.name) {
                Some((_, rates)) => rates.push(line.rate()),
                None => systems.push((line.name.clone(), vec![line.rate()])),
            }
        }
    }
    drop(shared);
    drop(dedicated);

    for (_, rates) in &mut systems {
        rates.sort_by(f64::total_cmp);
    }
    let median = |rates: &[f64]| rates[rates.len() / 2];
    let median_of = |names: &[&str]| {
        systems
            .iter()
            .filter(|(name, _)| names.contains(&name.as_str()))
            .map(|(_, r)| median(r))
            .fold(0.0, f64::max)
    };
    let best_lock = median_of(&MUTEXES);
    let ceiling = median_of(&[CEILING]);
    println!(
        "{:<42} {:>14} {:>10} {:>27} {:>14} {:>11}",
        "system", "ops/s", "ns/op", "min .. max ops/s", "vs best mutex", "vs ceiling"
    );
    for (name, rates) in &systems {
        let m = median(rates);
        println!(
            "{:<42} {:>14} {:>10.1} {:>27} {:>13.2}x {:>10.2}x",
            name,
            group(m),
            1e9 / m,
            format!("{} .. {}", group(rates[0]), group(rates[rates.len() - 1])),
            m / best_lock,
            m / ceiling
        );
    }
    println!(
        "\nThe ceiling is one thread running the same critical section in a plain loop with no lock:\n\
         no scheme that runs the sections on one counter one at a time can beat it."
    );
    println!(
        "The dedicated line is one client worker feeding one trustee that does nothing else;\n\
         its rate is bounded by the client, so it is a lower bound of the trustee's ceiling."
    );
    Ok(())
}

fn group(rate: f64) -> String {
    let digits = format!("{:.0}", rate);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// One thread running the critical section on one counter in a plain loop, with no lock.
fn ceiling_line(duration: Duration, pause: bool) -> anyhow::Result<Line> {
    let stop = Arc::new(AtomicBool::new(false));
    let handle = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut counter = Box::new(0u64);
            let began = Instant::now();
            let mut ops = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..64 {
                    // Through `black_box` the counter stays in memory, as a shared one would.
                    section(std::hint::black_box(&mut *counter), pause);
                }
                ops += 64;
            }
            (ops, *counter, began.elapsed())
        })
    };
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    let (ops, value, elapsed) = handle.join().expect("ceiling thread panicked");
    ensure!(
        value == ops,
        "ceiling counter holds {value} after {ops} increments"
    );
    Ok(Line {
        name: CEILING.to_string(),
        ops,
        elapsed,
    })
}

/// One OS thread per core, each taking the lock in a loop until time is up.
fn lock_line<L: Send + Sync + 'static>(
    name: &str,
    threads: usize,
    duration: Duration,
    lock: L,
    critical: impl Fn(&L) + Copy + Send + 'static,
) -> anyhow::Result<Line> {
    let lock = Arc::new(lock);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (lock, stop, start) = (lock.clone(), stop.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let mut ops = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        critical(&lock);
                    }
                    ops += 64;
                }
                ops
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    let ops: u64 = handles
        .into_iter()
        .map(|h| h.join().expect("lock thread panicked"))
        .sum();
    let elapsed = began.elapsed();
    // The counters are checked through the critical section itself: each op added exactly one.
    Ok(Line {
        name: name.to_string(),
        ops,
        elapsed,
    })
}

/// Many fibers per worker, each applying a synchronous increment in a loop.
fn apply_line(
    rt: &Runtime,
    fibers: usize,
    duration: Duration,
    pause: bool,
) -> anyhow::Result<Line> {
    let counter = rt.entrust(0u64);
    let stop = Arc::new(AtomicBool::new(false));
    let issued = Arc::new(AtomicU64::new(0));
    let began = Instant::now();
    let handles: Vec<_> = (0..rt.client_workers())
        .flat_map(|w| (0..fibers).map(move |_| w))
        .map(|w| {
            let (counter, stop, issued) = (counter.clone(), stop.clone(), issued.clone());
            rt.spawn_on(w, move || {
                let mut ops = 0;
                while !stop.load(Ordering::Relaxed) {
                    counter.apply(|c| section(c, pause));
                    ops += 1;
                }
                issued.fetch_add(ops, Ordering::Relaxed);
            })
        })
        .collect();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    handles.into_iter().for_each(|h| h.join());
    let elapsed = began.elapsed();
    let ops = issued.load(Ordering::Relaxed);
    check(&counter, ops)?;
    Ok(Line {
        name: format!("Trust apply ({fibers} fibers per worker)"),
        ops,
        elapsed,
    })
}

/// One fiber per client worker issuing `apply_then` increments, at most `WINDOW` in flight.
fn apply_then_line(
    name: &str,
    rt: &Runtime,
    duration: Duration,
    pause: bool,
) -> anyhow::Result<Line> {
    let counter = rt.entrust(0u64);
    let stop = Arc::new(AtomicBool::new(false));
    let began = Instant::now();
    let handles: Vec<_> = (0..rt.client_workers())
        .map(|w| {
            let (counter, stop) = (counter.clone(), stop.clone());
            rt.spawn_on(w, move || {
                let group = Group::new();
                let answered = Rc::new(Cell::new(0u64));
                let mut issued = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        let answered = answered.clone();
                        counter.apply_then(
                            move |c| section(c, pause),
                            group.track(move |_| answered.set(answered.get() + 1)),
                        );
                    }
                    issued += 256;
                    // Block (not poll) while more than the window is unanswered.
                    group.wait_until_pending_at_most(WINDOW);
                }
                group.wait();
                ensure!(
                    answered.get() == issued,
                    "{} of {issued} callbacks ran",
                    answered.get()
                );
                Ok(issued)
            })
        })
        .collect();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    let ops = handles
        .into_iter()
        .map(|h| h.join())
        .sum::<anyhow::Result<u64>>()?;
    let elapsed = began.elapsed();
    check(&counter, ops)?;
    Ok(Line {
        name: name.to_string(),
        ops,
        elapsed,
    })
}

fn check(counter: &Trust<u64>, ops: u64) -> anyhow::Result<()> {
    let value = counter.apply(|c| *c);
    ensure!(
        value == ops,
        "counter holds {value} after {ops} increments: lost or repeated updates"
    );
    Ok(())
}
