//! Fuzzes what a durable store reads back: log records, snapshots and property entries, and
//! the same bytes as a log segment (the frames, and the search past a bad one).
//!
//! Run (nightly), from the repository root: `cargo +nightly fuzz run durable_record`.
//! The checks live in `gossamer::fuzzing::durable_record`: no panic, and whatever decodes
//! encodes again to a value that decodes the same.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gossamer::fuzzing::durable_record(data);
});
