//! Calls a code package on every node: the demo package (`packages/demo`), built, signed and
//! named on the command line. Each node loads it on its first call, from the caller's bytes.
//!
//! ```sh
//! cargo build --release -p demo-package -p gsm && cargo build --release -p gossamer --example package
//! target/release/gsm package keygen demo
//! target/release/gsm package build target/release/libdemo_package.so --key demo.key -o demo.gpkg
//! GSM_TRUSTED_KEYS=$(cat demo.pub) target/release/gsm run -n 3 -- target/release/examples/package demo.gpkg
//! ```

use gossamer::Rack;
use gossamer::package::Package;
use serde::{Deserialize, Serialize};

/// The demo package's types, as a caller writes them (same names, same fields).
#[derive(Serialize, Deserialize)]
struct Shape {
    sums: u64,
    keys: u64,
    width: u64,
}

#[derive(Serialize, Deserialize)]
struct Put {
    key: u64,
    #[serde(with = "serde_bytes")]
    value: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct Payload(#[serde(with = "serde_bytes")] Vec<u8>);

fn main() -> std::process::ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: package FILE.gpkg (made by `gsm package build`)");
        return std::process::ExitCode::from(2);
    };
    Rack::from_env().run(move || {
        let package = Package::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let m = package.manifest();
        println!("{} {}, id {}", m.name, m.version, package.id());
        for node in gossamer::nodes() {
            // A state on that node, built by the package; then its methods, by name.
            let shape = Shape {
                sums: 4,
                keys: 1024,
                width: 16,
            };
            let server = node
                .entrust_package(&package, "Server", shape)
                .unwrap_or_else(|e| panic!("rank {}: {e}", node.rank()));
            let put = Put {
                key: 42,
                value: b"forty-two".to_vec(),
            };
            let slot: u64 = server.call("indirect_put", put).unwrap();
            let sum: u64 = server.call("server_sum", Payload(vec![1, 2, 3])).unwrap();
            // A pure function, and where it ran.
            let (version, rank): (String, u32) = node.call(&package, "version", ()).unwrap();
            println!("rank {rank} ran {version}: indirect_put → slot {slot}, server_sum → {sum}");
        }
    })
}
