//! Fuzzes what a region operation reads from others: a heap table entry, and a request's
//! argument as it arrives over TCP.
//!
//! Run (nightly), from the repository root: `cargo +nightly fuzz run region_op`.
//! The checks live in `gossamer::fuzzing::region_op`: no panic, an error exactly when the
//! request reaches past its region, and no word outside the region written.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gossamer::fuzzing::region_op(data);
});
