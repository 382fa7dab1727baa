//! What a call into a trustee costs from outside the runtime — from a plain thread and from
//! tokio tasks — beside the locks such a caller would otherwise use, all in one run:
//! `cargo run --release -p trust --example cross_thread -- [scale] [filter]` (only the lines
//! whose name contains `filter` are measured).
//!
//! Every figure is nanoseconds per operation (median of 5 rounds, with min and max), where an
//! operation is one increment of a shared counter:
//!
//! * `std Mutex+Condvar round trip`: two threads pass a token back and forth through one
//!   `std::sync::Mutex<bool>` and a `Condvar` each way; one operation is a full round trip
//!   (there and back, two hand-overs), the same shape as one `apply` (request out, answer
//!   back). Each side waits with `Condvar::wait`, so a hand-over may cost a futex wake.
//! * `apply, plain thread`: a plain thread's `Trust::apply` in a loop, the trustee on a
//!   runtime of 1 worker (then 2 workers, the trustee on worker 1).
//! * `one at a time`: one tokio task awaits N calls in a row: `apply_async`, then
//!   `tokio::sync::Mutex::lock`, then `std::sync::Mutex::lock`, on a current-thread and on a
//!   2-worker multi-thread tokio runtime. The locks are uncontended here (one task).
//! * `joined`: 200 tasks × 1,000 increments each, all spawned, then joined; the same three ways.
//!
//! The trust runtime has 1 worker (the trustee) beside the tokio threads. To see the figures
//! under load, start one busy loop per core beside it.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const ROUNDS: usize = 5;

fn main() {
    let scale: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let filter = std::env::args().nth(2).unwrap_or_default();
    let report = |name: &str, ops: u64, measure: &mut dyn FnMut() -> Duration| {
        if name.contains(filter.as_str()) {
            report(name, ops, measure);
        }
    };
    let one_by_one = 20_000 * scale;
    let (tasks, per_task) = (200, 1_000 * scale);
    println!(
        "cross_thread: {} cores; {ROUNDS} rounds each; ns per operation: median (min..max)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    report("std Mutex+Condvar round trip", one_by_one, &mut || {
        mutex_ping_pong(one_by_one)
    });
    for workers in [1, 2] {
        let rt = trust::Runtime::builder().workers(workers).build().unwrap();
        let counter = rt.trustee(workers - 1).entrust(0u64);
        report(
            &format!("apply, plain thread, {workers} worker(s)"),
            one_by_one,
            &mut || time(|| (0..one_by_one).for_each(|_| counter.apply(|c| *c += 1))),
        );
    }

    let rt = trust::Runtime::builder().workers(1).build().unwrap();
    for flavour in ["current_thread", "multi_thread(2)"] {
        let tokio_rt = match flavour {
            "current_thread" => tokio::runtime::Builder::new_current_thread().build(),
            _ => tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .build(),
        }
        .unwrap();
        let trusted = rt.entrust(0u64);
        let async_lock = Arc::new(tokio::sync::Mutex::new(0u64));
        let std_lock = Arc::new(Mutex::new(0u64));

        report(
            &format!("one at a time, {flavour}: apply_async"),
            one_by_one,
            &mut || {
                let t = trusted.clone();
                tokio_rt.block_on(async move {
                    time_async(async {
                        for _ in 0..one_by_one {
                            t.apply_async(|c| *c += 1).await;
                        }
                    })
                    .await
                })
            },
        );
        report(
            &format!("one at a time, {flavour}: tokio Mutex"),
            one_by_one,
            &mut || {
                let m = async_lock.clone();
                tokio_rt.block_on(async move {
                    time_async(async {
                        for _ in 0..one_by_one {
                            *m.lock().await += 1;
                        }
                    })
                    .await
                })
            },
        );

        let total = tasks * per_task;
        report(
            &format!("joined, {flavour}: apply_async"),
            total,
            &mut || {
                joined(&tokio_rt, tasks, |_| {
                    let t = trusted.clone();
                    async move {
                        for _ in 0..per_task {
                            t.apply_async(|c| *c += 1).await;
                        }
                    }
                })
            },
        );
        report(
            &format!("joined, {flavour}: tokio Mutex"),
            total,
            &mut || {
                joined(&tokio_rt, tasks, |_| {
                    let m = async_lock.clone();
                    async move {
                        for _ in 0..per_task {
                            *m.lock().await += 1;
                        }
                    }
                })
            },
        );
        report(&format!("joined, {flavour}: std Mutex"), total, &mut || {
            joined(&tokio_rt, tasks, |_| {
                let m = std_lock.clone();
                async move {
                    for _ in 0..per_task {
                        *m.lock().unwrap() += 1;
                        tokio::task::yield_now().await;
                    }
                }
            })
        });
    }
}

/// Runs `measure` `ROUNDS` times and prints nanoseconds per operation.
fn report(name: &str, ops: u64, measure: &mut dyn FnMut() -> Duration) {
    let mut ns: Vec<f64> = (0..ROUNDS)
        .map(|_| measure().as_nanos() as f64 / ops as f64)
        .collect();
    ns.sort_by(f64::total_cmp);
    println!(
        "{name:<48} {:>9.0} ns  ({:.0}..{:.0})",
        ns[ROUNDS / 2],
        ns[0],
        ns[ROUNDS - 1]
    );
}

fn time(f: impl FnOnce()) -> Duration {
    let began = Instant::now();
    f();
    began.elapsed()
}

async fn time_async(f: impl Future<Output = ()>) -> Duration {
    let began = Instant::now();
    f.await;
    began.elapsed()
}

/// Spawns `tasks` tasks made by `task` on `rt` and waits for all of them.
fn joined<Fut>(rt: &tokio::runtime::Runtime, tasks: u64, task: impl Fn(u64) -> Fut) -> Duration
where
    Fut: Future<Output = ()> + Send + 'static,
{
    rt.block_on(async {
        let began = Instant::now();
        let handles: Vec<_> = (0..tasks).map(|i| tokio::spawn(task(i))).collect();
        for h in handles {
            h.await.unwrap();
        }
        began.elapsed()
    })
}

/// `round_trips` round trips of a token between this thread and another through a mutex and
/// two condition variables.
fn mutex_ping_pong(round_trips: u64) -> Duration {
    // `true`: the token is with the other thread.
    let shared = Arc::new((Mutex::new(false), Condvar::new(), Condvar::new()));
    let other = {
        let shared = shared.clone();
        std::thread::spawn(move || {
            let (token, to_other, to_main) = &*shared;
            for _ in 0..round_trips {
                let mut with_other = token.lock().unwrap();
                while !*with_other {
                    with_other = to_other.wait(with_other).unwrap();
                }
                *with_other = false;
                to_main.notify_one();
            }
        })
    };
    let (token, to_other, to_main) = &*shared;
    let began = Instant::now();
    for _ in 0..round_trips {
        let mut with_other = token.lock().unwrap();
        *with_other = true;
        to_other.notify_one();
        while *with_other {
            with_other = to_main.wait(with_other).unwrap();
        }
    }
    let elapsed = began.elapsed();
    other.join().unwrap();
    elapsed
}
