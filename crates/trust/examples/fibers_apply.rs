//! Synchronous `apply` from many fibers on one client worker to one dedicated trustee, for
//! profiling the fiber and channel path: `cargo run --release -p trust --example fibers_apply
//! -- [requests per fiber] [fibers]`.

use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let per_fiber: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let fibers: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let rt = trust::Runtime::builder()
        .workers(2)
        .dedicated_trustees(1)
        .build()
        .unwrap();
    let counter = rt.entrust(0u64);
    let began = Instant::now();
    let handles: Vec<_> = (0..fibers)
        .map(|_| {
            let c = counter.clone();
            rt.spawn_on(0, move || (0..per_fiber).for_each(|_| c.apply(|n| *n += 1)))
        })
        .collect();
    handles.into_iter().for_each(|h| h.join());
    let elapsed = began.elapsed();
    let served = counter.apply(|n| *n);
    assert_eq!(served, per_fiber * fibers);
    println!(
        "{served} applies in {elapsed:?}: {:.1} M/s, {:.1} ns each",
        served as f64 / elapsed.as_secs_f64() / 1e6,
        elapsed.as_nanos() as f64 / served as f64
    );
}
