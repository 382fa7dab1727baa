//! The rack in a page: a counter on every node, calls to each, and a fiber on the last node
//! that is handed every counter in its argument.
//!
//! ```sh
//! cargo run --release -p gossamer --example rack            # a one-node rack
//! cargo build --release -p gsm && cargo build --release -p gossamer --example rack
//! target/release/gsm run -n 4 -- target/release/examples/rack   # four nodes on this machine
//! ```

use gossamer::{Rack, Trust};

fn main() -> std::process::ExitCode {
    Rack::from_env().run(|| {
        let cs: Vec<Trust<u64>> = gossamer::nodes().map(|n| n.entrust(0u64)).collect();
        for c in &cs {
            c.apply_with(|v, x: u64| *v += x, 5); // only this fiber waits
            let rank = c.node().rank();
            c.apply_then(|v| *v, move |v| println!("rank {rank} holds {v}")); // `then` runs here
        }
        let last = gossamer::nodes().last().unwrap();
        let sum = gossamer::spawn_on(
            last,
            |cs: Vec<Trust<u64>>| cs.iter().map(|c| c.apply(|v| *v)).sum::<u64>(),
            cs.clone(), // trusts travel in arguments
        )
        .join();
        assert_eq!(sum, 5 * cs.len() as u64);
        println!(
            "{} nodes, sum {sum} computed on rank {}",
            cs.len(),
            last.rank()
        );
    })
}
