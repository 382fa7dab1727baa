//! Requests one trustee serves per second: one worker issues `apply_then` increments to a
//! trustee (its own, or a dedicated one) as fast as it can. Used for profiling the hot path:
//! `cargo run --release -p trust --example ceiling -- [requests] [workers]`.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let requests: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let workers: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let rt = trust::Runtime::builder()
        .workers(workers)
        .dedicated_trustees(workers - 1)
        .build()
        .unwrap();
    let counter = rt.entrust(0u64);
    let c = counter.clone();
    let began = Instant::now();
    rt.spawn_on(0, move || {
        let answered = Rc::new(Cell::new(0u64));
        let mut issued = 0;
        while issued < requests {
            for _ in 0..256 {
                let a = answered.clone();
                c.apply_then(|n| *n += 1, move |()| a.set(a.get() + 1));
            }
            issued += 256;
            while issued - answered.get() > 2048 {
                trust::yield_now();
            }
        }
        while answered.get() < issued {
            trust::yield_now();
        }
    })
    .join();
    let elapsed = began.elapsed();
    let served = counter.apply(|n| *n);
    println!(
        "{served} requests in {elapsed:?}: {:.1} M/s, {:.1} ns each",
        served as f64 / elapsed.as_secs_f64() / 1e6,
        elapsed.as_nanos() as f64 / served as f64
    );
}
