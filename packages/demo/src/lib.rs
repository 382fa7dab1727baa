//! A code package for tests, the README's example and `bench am`: the seed's two active
//! messages, *Server-Side Sum* (sum the payload into the next slot of an array on the server)
//! and *Indirect Put* (hash the key to a slot, copy the value there), as exports of a
//! `gossamer-package` cdylib.
//!
//! Built with the feature `v2` it is version 2.0.0: `Put` carries a `ttl` too, and `sum` is
//! gone, so tests can run two versions side by side. When `GOSSAMER_TEST_MARKER` names a file,
//! loading the library appends a line to it (from an ELF initializer, which runs inside
//! `dlopen`): proof of whether a node loaded it at all.

use gossamer_package::{Export, State};
use serde::{Deserialize, Serialize};

/// The server's memory: an array of sums, and the indirect-put table.
#[derive(Debug)]
pub struct Server {
    sums: Vec<u64>,
    next_sum: usize,
    /// Open addressing: `keys[i]` owns `data[i * width..][..width]`.
    keys: Vec<Option<u64>>,
    data: Vec<u8>,
    width: usize,
}

impl State for Server {
    const NAME: &'static str = "Server";
}

/// How to make a [`Server`].
#[derive(Debug, Serialize, Deserialize)]
pub struct Shape {
    /// Slots of the sum array (reused round-robin).
    pub sums: u64,
    /// Keys the indirect-put table holds.
    pub keys: u64,
    /// Bytes per key.
    pub width: u64,
}

fn new_server(shape: Shape) -> Server {
    Server {
        sums: vec![0; shape.sums.max(1) as usize],
        next_sum: 0,
        keys: vec![None; shape.keys.max(1) as usize],
        data: vec![0; (shape.keys.max(1) * shape.width) as usize],
        width: shape.width as usize,
    }
}

/// A message's payload: bytes, encoded as one block.
#[derive(Debug, Serialize, Deserialize)]
pub struct Payload(#[serde(with = "serde_bytes")] pub Vec<u8>);

/// Server-Side Sum: the payload's bytes, summed into the next slot; returns the sum.
fn server_sum(s: &mut Server, payload: Payload) -> u64 {
    let sum = payload.0.iter().map(|&b| u64::from(b)).sum();
    let at = s.next_sum;
    s.sums[at] = sum;
    s.next_sum = (at + 1) % s.sums.len();
    sum
}

/// An indirect put: the key picks a slot by hash probe, the value is copied there.
#[derive(Debug, Serialize, Deserialize)]
pub struct Put {
    /// The key.
    pub key: u64,
    /// The bytes to store.
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    /// Seconds to keep it (version 2 only).
    #[cfg(feature = "v2")]
    pub ttl: u32,
}

/// Indirect Put: probe for the key's slot (linear, from its hash), copy the value there (cut
/// to the width); returns the slot, or `u64::MAX` when the table is full.
fn indirect_put(s: &mut Server, p: Put) -> u64 {
    let n = s.keys.len();
    let start = (p.key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize % n;
    for probe in 0..n {
        let at = (start + probe) % n;
        if s.keys[at].is_none_or(|k| k == p.key) {
            s.keys[at] = Some(p.key);
            let slot = &mut s.data[at * s.width..(at + 1) * s.width];
            let len = p.value.len().min(s.width);
            slot[..len].copy_from_slice(&p.value[..len]);
            return at as u64;
        }
    }
    u64::MAX
}

/// The value stored for `key`, if any.
fn get(s: &mut Server, key: u64) -> Option<Vec<u8>> {
    let at = s.keys.iter().position(|k| *k == Some(key))?;
    Some(s.data[at * s.width..(at + 1) * s.width].to_vec())
}

/// A pure function: the sum of the numbers.
#[cfg(not(feature = "v2"))]
fn sum(values: Vec<u64>) -> u64 {
    values.iter().sum()
}

/// Which version this build is, and the rank it runs on.
fn version(_: ()) -> (String, u32) {
    let rank = gossamer_package::rank().unwrap_or(u32::MAX);
    (env_version().to_string(), rank)
}

fn env_version() -> &'static str {
    if cfg!(feature = "v2") {
        "2.0.0"
    } else {
        "1.0.0"
    }
}

/// Panics with the message given: the host must raise it at the caller.
fn panics(why: String) -> u64 {
    panic!("{why}")
}

/// Ends the process at once: the rack must end the job.
fn abort(_: ()) -> u64 {
    std::process::abort()
}

fn on_load() -> Result<(), String> {
    gossamer_package::log("demo package loaded");
    Ok(())
}

#[cfg(not(feature = "v2"))]
gossamer_package::package! {
    name: "demo",
    version: "1.0.0",
    on_load: Some(on_load),
    exports: [
        Export::state(new_server),
        Export::method("server_sum", server_sum),
        Export::method("indirect_put", indirect_put),
        Export::method("get", get),
        Export::function("sum", sum),
        Export::function("version", version),
        Export::function("panics", panics),
        Export::function("abort", abort),
    ],
}

#[cfg(feature = "v2")]
gossamer_package::package! {
    name: "demo",
    version: "2.0.0",
    on_load: Some(on_load),
    exports: [
        Export::state(new_server),
        Export::method("server_sum", server_sum),
        Export::method("indirect_put", indirect_put),
        Export::method("get", get),
        Export::function("version", version),
        Export::function("panics", panics),
        Export::function("abort", abort),
    ],
}

/// Appends a line to the file `GOSSAMER_TEST_MARKER` names, when it is set: runs inside
/// `dlopen`, before the host could call anything.
extern "C" fn mark_loaded() {
    if let Some(path) = std::env::var_os("GOSSAMER_TEST_MARKER") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "loaded {} in {}", env_version(), std::process::id());
        }
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static MARK_LOADED: extern "C" fn() = mark_loaded;
