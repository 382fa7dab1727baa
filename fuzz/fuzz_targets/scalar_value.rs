//! Fuzzes the scalar fast path of argument and result decoding (`crates/gossamer/src/scalar.rs`)
//! against postcard: the same value or error for every input, and postcard's bytes when what
//! decoded is encoded again.
//!
//! Run (nightly), from the repository root: `cargo +nightly fuzz run scalar_value`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gossamer::fuzzing::scalar_value(data);
});
