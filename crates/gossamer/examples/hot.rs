//! Hot and cold counters, for `gsm top` to watch: counters spread over every node's workers,
//! and on every node a fiber that adds to them for a while, picking each counter by a Zipf
//! law (a few counters take most requests), with up to 256 calls in flight.
//!
//! ```sh
//! cargo build --release -p gsm && cargo build --release -p gossamer --example hot
//! target/release/gsm run -n 2 -- target/release/examples/hot --secs 30 &
//! target/release/gsm top                                  # in another terminal
//! target/release/gsm run -n 2 --stats -- target/release/examples/hot --secs 3
//! ```
//!
//! Options: `--secs S` (10), `--counters K` (64), `--skew X` (1.0, the Zipf exponent).

use std::time::{Duration, Instant};

use gossamer::{Rack, Trust};

fn main() -> std::process::ExitCode {
    let mut secs = 10u64;
    let mut counters = 64usize;
    let mut skew = 1.0f64;
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value = pair.get(1).map(String::as_str).unwrap_or_default();
        let bad = || -> ! {
            eprintln!("usage: hot [--secs S] [--counters K] [--skew X]; got {pair:?}");
            std::process::exit(2)
        };
        match pair[0].as_str() {
            "--secs" => secs = value.parse().unwrap_or_else(|_| bad()),
            "--counters" => counters = value.parse().unwrap_or_else(|_| bad()),
            "--skew" => skew = value.parse().unwrap_or_else(|_| bad()),
            _ => bad(),
        }
    }
    Rack::from_env().run(move || {
        let nodes: Vec<_> = gossamer::nodes().collect();
        // Counter i on node i mod N, on that node's worker (i / N) mod its workers.
        let cs: Vec<Trust<u64>> = (0..counters.max(1))
            .map(|i| {
                let node = nodes[i % nodes.len()];
                let worker = (i / nodes.len()) as u32 % node.workers();
                node.trustee(worker).entrust(0u64)
            })
            .collect();
        let drivers: Vec<_> = nodes
            .iter()
            .map(|&n| gossamer::spawn_on(n, drive, (cs.clone(), secs, skew, n.rank())))
            .collect();
        let made: u64 = drivers.into_iter().map(|d| d.join()).sum();
        let held: u64 = cs.iter().map(|c| c.apply(|c| *c)).sum();
        assert_eq!(made, held, "every call counted once");
        println!(
            "{made} calls to {} counters from {} nodes in {secs} s",
            cs.len(),
            nodes.len()
        );
    })
}

/// Adds 1 to counters picked by a Zipf law for `secs` seconds; returns the calls made.
fn drive((cs, secs, skew, seed): (Vec<Trust<u64>>, u64, f64, u32)) -> u64 {
    // The law's cumulative weights: counter i weighs 1 / (i + 1)^skew.
    let mut cdf: Vec<f64> = (0..cs.len())
        .scan(0.0, |sum, i| {
            *sum += 1.0 / ((i + 1) as f64).powf(skew);
            Some(*sum)
        })
        .collect();
    let total = *cdf.last().expect("a counter");
    cdf.iter_mut().for_each(|w| *w /= total);
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(seed);
    let mut uniform = move || {
        // splitmix64
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) as f64 / u64::MAX as f64
    };
    let group = trust::Group::new();
    let until = Instant::now() + Duration::from_secs(secs);
    let mut calls = 0u64;
    while Instant::now() < until {
        for _ in 0..64 {
            let u = uniform();
            let i = cdf.partition_point(|&w| w < u).min(cs.len() - 1);
            cs[i].apply_then_with(|c, x: u64| *c += x, 1, group.track(|()| {}));
            calls += 1;
        }
        group.wait_until_pending_at_most(256);
    }
    group.wait();
    calls
}
