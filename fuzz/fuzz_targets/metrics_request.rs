//! Fuzzes what the `GSM_METRICS` server reads from a client: a request head.
//!
//! Run (nightly), from the repository root: `cargo +nightly fuzz run metrics_request`.
//! Whatever the bytes, the answer must be one well-formed HTTP/1.1 response, with the
//! counters only for `GET /metrics` or `GET /` (the checks live in
//! `gossamer::fuzzing::metrics_request`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gossamer::fuzzing::metrics_request(data);
});
