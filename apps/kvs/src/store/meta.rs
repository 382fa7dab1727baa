//! The meta commands (`mg`, `ms`, `md`, `ma`) on a shard: their arguments, their results,
//! and their semantics on top of the classic commands.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{ArithResult, Shard, StoreRequest, StoreResult, Value, expiry};
use crate::common::StoreMode;

/// Which meta command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaKind {
    /// `mg`: get.
    Get,
    /// `ms`: set (mode in [`MetaOp::mode`]).
    Set,
    /// `md`: delete.
    Delete,
    /// `ma`: arithmetic.
    Arith,
}

/// A meta command for one shard, with the flags that act on the item.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaOp {
    /// Which command.
    pub kind: MetaKind,
    /// The (decoded) key.
    pub key: Bytes,
    /// `T`: new expiry time.
    pub ttl: Option<i32>,
    /// `C`: cas unique to compare.
    pub cas: Option<u64>,
    /// `F`: client flags (`ms`).
    pub flags: u32,
    /// `M`: mode (`ms`: `S E A P R`; `ma`: `I + D -`).
    pub mode: u8,
    /// `N`: create a missing item with this expiry time (`ma`).
    pub vivify: Option<i32>,
    /// `J`: initial value of a created counter (`ma`).
    pub initial: u64,
    /// `D`: delta (`ma`).
    pub delta: u64,
    /// The value (`ms`).
    pub data: Bytes,
    /// `u`: do not mark the item fetched (`mg`).
    pub no_update: bool,
}

/// The outcome of a meta command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaStatus {
    /// `mg` found the item.
    Hit,
    /// `mg` did not (`EN`).
    Miss,
    /// `HD` for `ms`, `md`.
    Done,
    /// `NS`: not stored.
    NotStored,
    /// `EX`: cas mismatch.
    Exists,
    /// `NF`: not found.
    NotFound,
    /// `ma` on a value that is not a number.
    NonNumeric,
    /// `ms` could not find room.
    OutOfMemory,
    /// `ma`: the new number.
    Number(u64),
    /// `ma` with `N`: the counter was created with this value.
    Created(u64),
}

/// A meta command's result: the status and what the return flags may ask for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaReply {
    /// The outcome.
    pub status: MetaStatus,
    /// Client flags.
    pub flags: u32,
    /// The value (`mg` hits).
    pub value: Option<Value>,
    /// Value length.
    pub size: usize,
    /// cas unique (0 when there is no item).
    pub cas: u64,
    /// Remaining time to live in seconds before the command's `T`/`N`, -1 for none.
    pub ttl_before: i64,
    /// The time the command ran at.
    pub now: u64,
    /// Whether the item had been fetched before this command (`h`).
    pub fetched: bool,
    /// Seconds since the item was last stored or accessed (`l`).
    pub idle: u64,
}

impl MetaReply {
    fn status(status: MetaStatus) -> MetaReply {
        MetaReply {
            status,
            flags: 0,
            value: None,
            size: 0,
            cas: 0,
            ttl_before: -1,
            now: 0,
            fetched: false,
            idle: 0,
        }
    }
}

impl Shard {
    fn meta_reply(&self, i: u32, status: MetaStatus, with_value: bool, now: u64) -> MetaReply {
        let e = self.entry(i);
        MetaReply {
            status,
            flags: e.flags,
            value: with_value.then(|| Value::of(&e.value)),
            size: e.value.len(),
            cas: e.cas,
            ttl_before: if e.exptime == 0 {
                -1
            } else {
                e.exptime as i64 - now as i64
            },
            now,
            fetched: e.fetched,
            idle: now.saturating_sub(e.time),
        }
    }

    /// Runs a meta command (`mg`, `ms`, `md`, `ma`), memcached 1.6's semantics:
    /// `ms` with `C` in mode `S` or `E` is a `cas`; `ma` with `N` creates a missing counter
    /// with value `J` (no delta applied); `T` sets a new expiry on a found item.
    pub fn meta(&mut self, op: MetaOp, now: u64) -> MetaReply {
        match op.kind {
            MetaKind::Get => {
                self.stats.cmd_get += 1;
                let Ok(i) = self.find(&op.key, now) else {
                    self.stats.get_misses += 1;
                    return MetaReply::status(MetaStatus::Miss);
                };
                self.stats.get_hits += 1;
                self.bump(i);
                let reply = self.meta_reply(i, MetaStatus::Hit, true, now);
                if let Some(t) = op.ttl {
                    self.entry_mut(i).exptime = expiry(t, now);
                }
                let e = self.entry_mut(i);
                e.fetched |= !op.no_update;
                if e.time + 60 < now {
                    e.time = now;
                }
                reply
            }
            MetaKind::Set => {
                let found = self.find(&op.key, now).ok();
                // memcached: with C, set and replace become cas; add ignores C; append and
                // prepend check it against an existing item.
                let mode = match (op.mode, op.cas) {
                    (b'S' | b'R', Some(_)) => StoreMode::Cas,
                    (b'E', _) => StoreMode::Add,
                    (b'A', _) => StoreMode::Append,
                    (b'P', _) => StoreMode::Prepend,
                    (b'R', None) => StoreMode::Replace,
                    _ => StoreMode::Set,
                };
                if let (Some(c), Some(i), StoreMode::Append | StoreMode::Prepend) =
                    (op.cas, found, mode)
                    && self.entry(i).cas != c
                {
                    return MetaReply::status(MetaStatus::Exists);
                }
                let key = op.key.clone();
                let result = self.store(
                    StoreRequest {
                        mode,
                        key: op.key,
                        flags: op.flags,
                        exptime: op.ttl.unwrap_or(0),
                        data: op.data,
                        cas_unique: op.cas.unwrap_or(0),
                    },
                    now,
                );
                let status = match result {
                    StoreResult::Stored => MetaStatus::Done,
                    StoreResult::NotStored => MetaStatus::NotStored,
                    StoreResult::Exists => MetaStatus::Exists,
                    StoreResult::NotFound => MetaStatus::NotFound,
                    StoreResult::OutOfMemory | StoreResult::TooLarge => MetaStatus::OutOfMemory,
                };
                match (status, self.map.get(&key[..])) {
                    (MetaStatus::Done, Some(&i)) => self.meta_reply(i, status, false, now),
                    _ => MetaReply::status(status),
                }
            }
            MetaKind::Delete => match self.find(&op.key, now) {
                Ok(i) if op.cas.is_some_and(|c| c != self.entry(i).cas) => {
                    MetaReply::status(MetaStatus::Exists)
                }
                Ok(i) => {
                    self.remove_index(i);
                    self.stats.delete_hits += 1;
                    MetaReply::status(MetaStatus::Done)
                }
                Err(_) => {
                    self.stats.delete_misses += 1;
                    MetaReply::status(MetaStatus::NotFound)
                }
            },
            MetaKind::Arith => self.meta_arith(op, now),
        }
    }

    fn meta_arith(&mut self, op: MetaOp, now: u64) -> MetaReply {
        let incr = matches!(op.mode, b'I' | b'+');
        let i = match self.find(&op.key, now) {
            Ok(i) => i,
            Err(_) => {
                let Some(vivify) = op.vivify else {
                    return MetaReply::status(MetaStatus::NotFound);
                };
                // `vivify` carries the last of N and T: the counter's expiry.
                let digits = Bytes::from(op.initial.to_string());
                if !self.insert(op.key.clone(), digits, 0, expiry(vivify, now), now) {
                    return MetaReply::status(MetaStatus::NotStored);
                }
                let &i = self.map.get(&op.key[..]).expect("just inserted");
                let mut reply = self.meta_reply(i, MetaStatus::Created(op.initial), false, now);
                reply.ttl_before = -1;
                return reply;
            }
        };
        // memcached's order: an empty value, then the cas (0 compares nothing), then the number.
        let e = self.entry(i);
        if e.value.is_empty() {
            return MetaReply::status(MetaStatus::NonNumeric);
        }
        if op.cas.is_some_and(|c| c != 0 && c != e.cas) {
            return MetaReply::status(MetaStatus::Exists);
        }
        let old_len = e.value.len();
        match self.arith(&op.key, incr, op.delta, now) {
            ArithResult::Value(n) => {
                let &i = self.map.get(&op.key[..]).expect("arith keeps the item");
                let reply = self.meta_reply(i, MetaStatus::Number(n), false, now);
                // memcached applies T to the item it fetched; when the longer number needed a
                // new item, that one keeps the old expiry.
                if let Some(t) = op.ttl
                    && self.entry(i).value.len() == old_len
                {
                    self.entry_mut(i).exptime = expiry(t, now);
                }
                reply
            }
            ArithResult::NotFound => MetaReply::status(MetaStatus::NotFound),
            ArithResult::NonNumeric => MetaReply::status(MetaStatus::NonNumeric),
        }
    }
}
