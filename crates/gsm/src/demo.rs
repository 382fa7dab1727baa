//! `gsm demo`: one shared counter, incremented as fast as possible by every core, with
//! delegation and with mutexes, side by side in one run.

use std::cell::{Cell, RefCell};
use std::hint::spin_loop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use anyhow::ensure;
use trust::{Runtime, Trust};

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
const WINDOW: u64 = 4096;

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
    println!("(each critical section increments the counter and executes one spin-loop pause)\n");

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
            ceiling_line(duration)?,
            lock_line(
                MUTEXES[0],
                threads,
                duration,
                std::sync::Mutex::new(0u64),
                |m| {
                    let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
                    *g += 1;
                    spin_loop();
                },
            )?,
            lock_line(
                MUTEXES[1],
                threads,
                duration,
                parking_lot::Mutex::new(0u64),
                |m| {
                    *m.lock() += 1;
                    spin_loop();
                },
            )?,
            apply_line(&shared, options.fibers, duration)?,
            apply_then_line("Trust apply_then (shared trustees)", &shared, duration)?,
        ];
        if let Some(dedicated) = &dedicated {
            lines.push(apply_then_line(
                "Trust apply_then (1 dedicated trustee)",
                dedicated,
                duration,
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
fn ceiling_line(duration: Duration) -> anyhow::Result<Line> {
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
                    let c = std::hint::black_box(&mut *counter);
                    *c += 1;
                    spin_loop();
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
    critical: fn(&L),
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
fn apply_line(rt: &Runtime, fibers: usize, duration: Duration) -> anyhow::Result<Line> {
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
                    counter.apply(|c| {
                        *c += 1;
                        spin_loop();
                    });
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

thread_local! {
    /// `apply_then` answers received on this worker (the callbacks run on the issuing worker).
    static ANSWERED: Cell<u64> = const { Cell::new(0) };
    /// The issuing fiber, waiting until `ANSWERED` reaches the count it holds.
    static WAITER: RefCell<Option<(u64, Waker)>> = const { RefCell::new(None) };
}

fn answered() -> u64 {
    ANSWERED.with(Cell::get)
}

/// The `apply_then` callback: counts the answer and wakes the issuer when it is due.
fn count_answer() {
    let n = ANSWERED.with(|a| {
        a.set(a.get() + 1);
        a.get()
    });
    WAITER.with(|w| {
        let mut w = w.borrow_mut();
        if w.as_ref().is_some_and(|(target, _)| n >= *target) {
            w.take().expect("checked").1.wake();
        }
    });
}

/// Suspends the calling fiber until `ANSWERED` reaches `target`.
fn wait_for_answers(target: u64) {
    trust::block_on(std::future::poll_fn(|cx| {
        if answered() >= target {
            return Poll::Ready(());
        }
        WAITER.with(|w| *w.borrow_mut() = Some((target, cx.waker().clone())));
        Poll::Pending
    }));
}

/// One fiber per client worker issuing `apply_then` increments, at most `WINDOW` in flight.
fn apply_then_line(name: &str, rt: &Runtime, duration: Duration) -> anyhow::Result<Line> {
    let counter = rt.entrust(0u64);
    let stop = Arc::new(AtomicBool::new(false));
    let began = Instant::now();
    let handles: Vec<_> = (0..rt.client_workers())
        .map(|w| {
            let (counter, stop) = (counter.clone(), stop.clone());
            rt.spawn_on(w, move || {
                let start = answered();
                let mut issued = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        counter.apply_then(
                            |c| {
                                *c += 1;
                                spin_loop();
                                *c
                            },
                            |_| count_answer(),
                        );
                    }
                    issued += 256;
                    if issued >= WINDOW {
                        // Block (not poll) until half the window is answered.
                        wait_for_answers(start + issued - WINDOW / 2);
                    }
                }
                wait_for_answers(start + issued);
                issued
            })
        })
        .collect();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    let ops: u64 = handles.into_iter().map(|h| h.join()).sum();
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
