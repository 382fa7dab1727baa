//! One shard of the table: items, an LRU list, memory accounting, expiry and cas uniques.
//!
//! A [`Shard`] is a plain single-threaded struct. The server entrusts each shard to a trustee
//! and ships [`ShardCommand`]s to it; [`execute`] runs one command and returns an owned
//! [`ShardReply`], so every delegated closure is one short, non-blocking call:
//!
//! ```
//! use bytes::Bytes;
//! use kvs::protocol::StoreMode;
//! use kvs::store::{execute, Shard, ShardCommand, ShardConfig, ShardReply, StoreRequest, StoreResult};
//!
//! let mut shard = Shard::new(ShardConfig::default());
//! let now = 1_700_000_000;
//! let set = ShardCommand::Store(Box::new(StoreRequest {
//!     mode: StoreMode::Set,
//!     key: Bytes::from_static(b"k"),
//!     flags: 3,
//!     exptime: 0,
//!     data: Bytes::from_static(b"hello"),
//!     cas_unique: 0,
//! }));
//! assert_eq!(execute(&mut shard, set, now), ShardReply::Store(StoreResult::Stored));
//! let get = ShardCommand::Get { key: Bytes::from_static(b"k"), touch: None };
//! let ShardReply::Value(Some(item)) = execute(&mut shard, get, now) else { panic!() };
//! assert_eq!((item.flags, item.value.as_ref()), (3, &b"hello"[..]));
//! ```
//!
//! # Semantics (memcached 1.6)
//! * Times are Unix seconds. An expiry of 0 never expires, up to 30 days is relative, more is
//!   an absolute Unix time, a negative one has already passed. An item whose expiry is at or
//!   before `now` is gone; it is removed lazily when met (lookup, LRU tail).
//! * Memory: every item is charged `item_size` bytes
//!   (memcached's header, key and value). Storing evicts from the cold end of the LRU until the
//!   shard is within its limit; an item larger than the whole limit is refused with
//!   `SERVER_ERROR out of memory storing object`.
//! * cas uniques: shard `i` of `n` hands out `i + 1, i + 1 + n, i + 1 + 2n, …`, so they are
//!   unique across shards. Every store, append and incr gives the item a new one; touch keeps it.
//! * `incr` wraps at 2^64, `decr` stops at 0. A result no longer than the old value is
//!   written over it and padded with spaces (memcached's in-place update); a longer one
//!   replaces the value.
//! * `append`/`prepend` keep the old flags and expiry.
//! * `flush_all` without delay empties the shard; with a delay `d` it marks every item last
//!   stored at or before `now + d - 1` as gone once that time has come.
//!
//! # Layout
//! * `shard.rs`: the [`Shard`] itself: the item slots, the LRU list, memory accounting and
//!   eviction, cas uniques, the counters, and the invariant check;
//! * `commands.rs`: the classic commands on a shard (`get`, the storage commands, `delete`,
//!   `incr`/`decr`, `touch`, `flush_all`);
//! * `meta.rs`: the meta commands (`mg`, `ms`, `md`, `ma`) and their types;
//! * `message.rs`: [`ShardCommand`] and [`ShardReply`], what is shipped to a trustee and back.

mod commands;
mod message;
mod meta;
mod shard;

#[cfg(test)]
mod fixtures;

pub use message::{
    ArithResult, INLINE_VALUE, ItemView, ShardCommand, ShardReply, StoreRequest, StoreResult, Value,
};
pub use meta::{MetaKind, MetaOp, MetaReply, MetaStatus};
pub use shard::{Shard, ShardConfig, ShardStats};

use crate::common::REALTIME_MAXDELTA;

/// Converts a client's expiry time to a Unix time (0: never), memcached's `realtime`.
///
/// ```
/// use kvs::store::expiry;
/// assert_eq!(expiry(0, 1000), 0);
/// assert_eq!(expiry(10, 1000), 1010);
/// assert_eq!(expiry(2_592_001, 1000), 2_592_001); // more than 30 days: absolute
/// assert!(expiry(-1, 1000) <= 1000);                // negative: already expired
/// ```
pub fn expiry(exptime: i32, now: u64) -> u64 {
    let e = i64::from(exptime);
    if e < 0 {
        // memcached turns a negative time into an absolute time in 1970: already past.
        1
    } else if e == 0 {
        0
    } else if e > REALTIME_MAXDELTA {
        e as u64
    } else {
        now + e as u64
    }
}

/// Runs one command on a shard. `now` is the Unix time in seconds.
pub fn execute(shard: &mut Shard, cmd: ShardCommand, now: u64) -> ShardReply {
    match cmd {
        ShardCommand::Get { key, touch } => ShardReply::Value(shard.get(&key, touch, now)),
        ShardCommand::Store(req) => ShardReply::Store(shard.store(*req, now)),
        ShardCommand::TooLarge { mode, key } => ShardReply::Store(shard.too_large(mode, &key)),
        ShardCommand::Delete { key } => ShardReply::Deleted(shard.delete(&key, now)),
        ShardCommand::Arith { key, incr, delta } => {
            ShardReply::Arith(shard.arith(&key, incr, delta, now))
        }
        ShardCommand::Touch { key, exptime } => {
            ShardReply::Touched(shard.touch(&key, exptime, now))
        }
        ShardCommand::FlushAll { delay } => {
            shard.flush_all(delay, now);
            ShardReply::Done
        }
        ShardCommand::Meta(op) => ShardReply::Meta(Box::new(shard.meta(*op, now))),
        ShardCommand::Stats => ShardReply::Stats(Box::new(shard.stats())),
        ShardCommand::ResetStats => {
            shard.reset_stats();
            ShardReply::Done
        }
    }
}

/// The shard that owns `key` among `shards` (FNV-1a, stable across runs and builds).
///
/// ```
/// let s = kvs::store::shard_of(b"user:42", 8);
/// assert!(s < 8);
/// assert_eq!(s, kvs::store::shard_of(b"user:42", 8));
/// ```
pub fn shard_of(key: &[u8], shards: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // Mix the high bits in: FNV's low bits are weak for short keys.
    h ^= h >> 29;
    (h % shards.max(1) as u64) as usize
}
