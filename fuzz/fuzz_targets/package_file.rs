//! Fuzzes what a node reads of a code package before anything of it runs: the file, the
//! manifest, the signature, the hashes and the library's ELF.
//!
//! Run (nightly), from the repository root: `cargo +nightly fuzz run package_file`.
//! The checks live in `gossamer::fuzzing::package_file`: no panic, what reads re-encodes the
//! same, and nothing verifies unless the trusted key signed it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gossamer::fuzzing::package_file(data);
});
