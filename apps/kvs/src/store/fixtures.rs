//! Shorthands shared by the unit tests of the store's modules.

use bytes::Bytes;

use super::{Shard, StoreRequest, StoreResult};
use crate::common::StoreMode;

pub(super) const NOW: u64 = 1_700_000_000;

pub(super) fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

pub(super) fn sr(
    mode: StoreMode,
    key: Bytes,
    flags: u32,
    exptime: i32,
    data: Bytes,
    cas: u64,
) -> StoreRequest {
    StoreRequest {
        mode,
        key,
        flags,
        exptime,
        data,
        cas_unique: cas,
    }
}

pub(super) fn set(s: &mut Shard, k: &str, v: &str, exptime: i32, now: u64) -> StoreResult {
    s.store(sr(StoreMode::Set, b(k), 0, exptime, b(v), 0), now)
}

pub(super) fn val(s: &mut Shard, k: &str, now: u64) -> Option<String> {
    s.get(k.as_bytes(), None, now)
        .map(|v| String::from_utf8(v.value.as_ref().to_vec()).unwrap())
}
