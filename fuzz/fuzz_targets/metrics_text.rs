//! Fuzzes what `gsm top` and `gsm run --stats` read from the ranks: Prometheus text.
//!
//! Run (nightly), from the repository root: `cargo +nightly fuzz run metrics_text`.
//! Reading must never panic, and what is read must write and read back the same (the checks
//! live in `gossamer::fuzzing::metrics_text`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gossamer::fuzzing::metrics_text(data);
});
