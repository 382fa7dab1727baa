//! Fuzzes the kvs request parser and the connection engine.
//!
//! Run (nightly), from the repository root: `cargo +nightly fuzz run kvs_parser`.
//! The input is split at its first byte's value into two reads, so that incremental
//! parsing is exercised too; every parse result is checked for sanity.
#![no_main]

use kvs::config::Config;
use kvs::conn::Engine;
use kvs::protocol::{Limits, Parse, Request, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        item_size_max: 4096,
        max_get_line: 8192,
    };
    // 1. The parser alone: never panics, always makes progress or asks for more.
    let mut rest = data;
    while !rest.is_empty() {
        match parse(rest, &limits) {
            Parse::Incomplete | Parse::Close => break,
            Parse::Request { request, consumed } => {
                assert!(consumed > 0);
                if let Request::Store { key, .. } = &request {
                    assert!(key.len() <= 250);
                    assert!(consumed <= rest.len());
                }
                rest = &rest[consumed.min(rest.len())..];
            }
        }
    }
    // 2. The whole engine, fed in two reads.
    let Some((&split, body)) = data.split_first() else {
        return;
    };
    let cut = usize::from(split).min(body.len());
    let cfg = Config {
        shards: 2,
        memory_limit: 1 << 20,
        item_size_max: 4096,
        ..Config::default()
    };
    let mut engine = Engine::new(cfg, 1_700_000_000);
    let mut conn = engine.connect();
    let (_, open) = engine.feed(&mut conn, &body[..cut], 1_700_000_000);
    if open {
        engine.feed(&mut conn, &body[cut..], 1_700_001_000);
    }
    for shard in engine.shards() {
        shard.check();
    }
});
