//! Fuzzes what a daemon and `gsm run` read from each other.
//!
//! Run (nightly), from the repository root: `cargo +nightly fuzz run cluster_frame`.
//! The input is read as frames from a peer (almost all fail their MAC, and must fail cleanly,
//! allocating nothing past the frame bound), and as a request and a reply message: each that
//! decodes must go through a frame and back unchanged (the checks live in
//! `gossamer::fuzzing::cluster_frame`, shared with the seeded mutation test in
//! `crates/gossamer/src/cluster/channel.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gossamer::fuzzing::cluster_frame(data);
});
