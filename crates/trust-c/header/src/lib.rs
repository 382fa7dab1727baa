//! Nothing but a home for `tests/header.rs`, which checks that `crates/trust-c/include/trust.h`
//! is what cbindgen generates from `crates/trust-c/src/lib.rs` (regenerate it with
//! `TRUST_C_WRITE_HEADER=1 cargo test -p trust-c-header`).
