//! Fuzzes the rack's frame decoder.
//!
//! Run (nightly), from the repository root: `cargo +nightly fuzz run rack_frame`.
//! The input is decoded as a stream of frames under small limits; every frame the decoder
//! accepts must re-encode to bytes that decode to the same frame, and the decoder must never
//! panic (the checks live in `gossamer::fuzzing::rack_frame`, shared with the seeded mutation
//! test in `crates/gossamer/src/wire/check.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gossamer::fuzzing::rack_frame(data);
});
