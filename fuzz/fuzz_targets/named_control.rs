//! Fuzzes the control message that gives a function's name its index on a link, and its
//! resolution against a node's functions.
//!
//! Run (nightly), from the repository root: `cargo +nightly fuzz run named_control`.
//! The checks live in `gossamer::fuzzing::named_control`: no panic, a name out of turn or
//! malformed is an error, and a name resolves exactly when the node has it with that
//! signature.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gossamer::fuzzing::named_control(data);
});
