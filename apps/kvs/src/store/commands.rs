//! The classic commands on a shard: `get` and its touching forms, the storage commands,
//! `delete`, `incr`/`decr`, `touch` and `flush_all`.

use bytes::Bytes;

use super::shard::Miss;
use super::{ArithResult, ItemView, Shard, StoreRequest, StoreResult, Value, expiry};
use crate::common::{StoreMode, item_size};

/// memcached's `safe_strtoull` applied to a stored value (followed by `\r\n` there).
fn parse_counter(v: &[u8]) -> Option<u64> {
    crate::common::safe_strtoull(v)
}

impl Shard {
    /// `get`, `gets`, `gat`, `gats` for one key.
    pub fn get(&mut self, key: &[u8], touch: Option<i32>, now: u64) -> Option<ItemView> {
        self.stats.cmd_get += 1;
        if touch.is_some() {
            self.stats.cmd_touch += 1;
        }
        match self.find(key, now) {
            Ok(i) => {
                self.stats.get_hits += 1;
                if touch.is_some() {
                    self.stats.touch_hits += 1;
                }
                self.bump(i);
                let e = self.entry_mut(i);
                if let Some(t) = touch {
                    e.exptime = expiry(t, now);
                }
                e.fetched = true;
                Some(ItemView {
                    flags: e.flags,
                    value: Value::of(&e.value),
                    cas: e.cas,
                })
            }
            Err(m) => {
                self.stats.get_misses += 1;
                if touch.is_some() {
                    self.stats.touch_misses += 1;
                }
                match m {
                    Miss::Expired => self.stats.get_expired += 1,
                    Miss::Flushed => self.stats.get_flushed += 1,
                    Miss::Absent => {}
                }
                None
            }
        }
    }

    /// `set`, `add`, `replace`, `append`, `prepend`, `cas`.
    pub fn store(&mut self, req: StoreRequest, now: u64) -> StoreResult {
        let StoreRequest {
            mode,
            key,
            flags,
            exptime,
            data,
            cas_unique,
        } = req;
        self.stats.cmd_set += 1;
        let found = self.find(&key, now).ok();
        let exp = expiry(exptime, now);
        let (value, flags, exp) = match (mode, found) {
            (StoreMode::Set, _) | (StoreMode::Add, None) | (StoreMode::Replace, Some(_)) => {
                (data, flags, exp)
            }
            (StoreMode::Add, Some(i)) => {
                self.bump(i);
                return StoreResult::NotStored;
            }
            (StoreMode::Replace | StoreMode::Append | StoreMode::Prepend, None) => {
                return StoreResult::NotStored;
            }
            (StoreMode::Cas, None) => {
                self.stats.cas_misses += 1;
                return StoreResult::NotFound;
            }
            (StoreMode::Cas, Some(i)) => {
                if self.entry(i).cas != cas_unique {
                    self.stats.cas_badval += 1;
                    return StoreResult::Exists;
                }
                self.stats.cas_hits += 1;
                (data, flags, exp)
            }
            (StoreMode::Append | StoreMode::Prepend, Some(i)) => {
                let old = self.entry(i);
                if item_size(key.len(), old.value.len() + data.len(), old.flags)
                    > self.cfg.item_size_max
                {
                    return StoreResult::NotStored;
                }
                let mut v = Vec::with_capacity(old.value.len() + data.len());
                if mode == StoreMode::Append {
                    v.extend_from_slice(&old.value);
                    v.extend_from_slice(&data);
                } else {
                    v.extend_from_slice(&data);
                    v.extend_from_slice(&old.value);
                }
                (Bytes::from(v), old.flags, old.exptime)
            }
        };
        if let Some(i) = found {
            self.remove_index(i);
        }
        if self.insert(key, value, flags, exp, now) {
            StoreResult::Stored
        } else {
            StoreResult::OutOfMemory
        }
    }

    /// A storage command whose value was too large: `set` deletes the key (memcached does, so
    /// that a failed `set` leaves no stale value behind).
    pub fn too_large(&mut self, mode: StoreMode, key: &[u8]) -> StoreResult {
        self.stats.store_too_large += 1;
        if mode == StoreMode::Set
            && let Some(&i) = self.map.get(key)
        {
            self.remove_index(i);
        }
        StoreResult::TooLarge
    }

    /// `delete`: whether a live item was removed.
    pub fn delete(&mut self, key: &[u8], now: u64) -> bool {
        match self.find(key, now) {
            Ok(i) => {
                self.remove_index(i);
                self.stats.delete_hits += 1;
                true
            }
            Err(_) => {
                self.stats.delete_misses += 1;
                false
            }
        }
    }

    /// `incr` / `decr`.
    pub fn arith(&mut self, key: &[u8], incr: bool, delta: u64, now: u64) -> ArithResult {
        let Ok(i) = self.find(key, now) else {
            if incr {
                self.stats.incr_misses += 1;
            } else {
                self.stats.decr_misses += 1;
            }
            return ArithResult::NotFound;
        };
        let e = self.entry(i);
        let Some(old) = (if e.value.is_empty() {
            None
        } else {
            parse_counter(&e.value)
        }) else {
            return ArithResult::NonNumeric;
        };
        let new = if incr {
            self.stats.incr_hits += 1;
            old.wrapping_add(delta)
        } else {
            self.stats.decr_hits += 1;
            old.saturating_sub(delta)
        };
        let digits = new.to_string();
        let e = self.entry(i);
        if digits.len() <= e.value.len() {
            // memcached rewrites the value in place, padded with spaces.
            let mut v = vec![b' '; e.value.len()];
            v[..digits.len()].copy_from_slice(digits.as_bytes());
            let cas = self.take_cas();
            self.bump(i);
            let e = self.entry_mut(i);
            e.value = Bytes::from(v);
            e.cas = cas;
            ArithResult::Value(new)
        } else {
            let e = self.remove_index(i);
            if self.insert(e.key, Bytes::from(digits), e.flags, e.exptime, now) {
                ArithResult::Value(new)
            } else {
                // memcached answers "SERVER_ERROR out of memory"; a longer counter only fails
                // to fit in a shard smaller than one item.
                ArithResult::NotFound
            }
        }
    }

    /// `touch`: whether the key was found.
    pub fn touch(&mut self, key: &[u8], exptime: i32, now: u64) -> bool {
        self.stats.cmd_touch += 1;
        match self.find(key, now) {
            Ok(i) => {
                self.stats.touch_hits += 1;
                self.bump(i);
                let e = self.entry_mut(i);
                e.exptime = expiry(exptime, now);
                e.fetched = true;
                true
            }
            Err(_) => {
                self.stats.touch_misses += 1;
                false
            }
        }
    }

    /// `flush_all [delay]`.
    pub fn flush_all(&mut self, delay: i32, now: u64) {
        if delay > 0 {
            // Lazy, like memcached: from `oldest_live` on, items last stored at or before it
            // are gone. With a delay of 1 this includes items stored later in this second.
            self.oldest_live = expiry(delay, now).saturating_sub(1).max(1);
            return;
        }
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use crate::common::StoreMode;
    use crate::store::fixtures::{NOW, b, set, sr, val};
    use crate::store::{ArithResult, Shard, ShardConfig, StoreResult};

    #[test]
    fn store_modes() {
        let mut s = Shard::new(ShardConfig::default());
        assert_eq!(
            s.store(sr(StoreMode::Add, b("k"), 0, 0, b("a"), 0), NOW),
            StoreResult::Stored
        );
        assert_eq!(
            s.store(sr(StoreMode::Add, b("k"), 0, 0, b("b"), 0), NOW),
            StoreResult::NotStored
        );
        assert_eq!(
            s.store(sr(StoreMode::Replace, b("x"), 0, 0, b("b"), 0), NOW),
            StoreResult::NotStored
        );
        assert_eq!(
            s.store(sr(StoreMode::Replace, b("k"), 7, 0, b("b"), 0), NOW),
            StoreResult::Stored
        );
        s.store(sr(StoreMode::Append, b("k"), 9, 100, b("c"), 0), NOW);
        s.store(sr(StoreMode::Prepend, b("k"), 9, 100, b("a"), 0), NOW);
        let v = s.get(b"k", None, NOW).unwrap();
        assert_eq!((v.flags, v.value.as_ref()), (7, &b"abc"[..]));
        // append kept "never expires".
        assert!(s.get(b"k", None, NOW + 1000).is_some());
        assert_eq!(
            s.store(sr(StoreMode::Cas, b("k"), 0, 0, b("z"), v.cas + 1), NOW),
            StoreResult::Exists
        );
        assert_eq!(
            s.store(sr(StoreMode::Cas, b("k"), 0, 0, b("z"), v.cas), NOW),
            StoreResult::Stored
        );
        assert_eq!(
            s.store(sr(StoreMode::Cas, b("k"), 0, 0, b("z"), v.cas), NOW),
            StoreResult::Exists
        );
        assert_eq!(
            s.store(sr(StoreMode::Cas, b("nope"), 0, 0, b("z"), 1), NOW),
            StoreResult::NotFound
        );
        s.check();
    }

    #[test]
    fn expiry_rules() {
        let mut s = Shard::new(ShardConfig::default());
        set(&mut s, "rel", "v", 10, NOW);
        set(&mut s, "abs", "v", (NOW + 5) as i32, NOW);
        set(&mut s, "neg", "v", -1, NOW);
        set(&mut s, "past", "v", (NOW - 5) as i32, NOW);
        assert!(val(&mut s, "neg", NOW).is_none());
        assert!(val(&mut s, "past", NOW).is_none());
        assert!(val(&mut s, "abs", NOW + 4).is_some());
        assert!(val(&mut s, "abs", NOW + 5).is_none());
        assert!(val(&mut s, "rel", NOW + 9).is_some());
        assert!(val(&mut s, "rel", NOW + 10).is_none());
        set(&mut s, "t", "v", 10, NOW);
        assert!(s.touch(b"t", 100, NOW));
        assert!(val(&mut s, "t", NOW + 50).is_some());
        assert!(s.get(b"t", Some(1), NOW + 50).is_some());
        assert!(val(&mut s, "t", NOW + 51).is_none());
        assert!(!s.touch(b"t", 100, NOW + 51));
        s.check();
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn incr_decr() {
        let mut s = Shard::new(ShardConfig::default());
        set(&mut s, "n", "10", 0, NOW);
        assert_eq!(s.arith(b"n", true, 5, NOW), ArithResult::Value(15));
        assert_eq!(s.arith(b"n", false, 100, NOW), ArithResult::Value(0));
        assert_eq!(val(&mut s, "n", NOW).unwrap(), "0 ");
        set(&mut s, "n", "18446744073709551615", 0, NOW);
        assert_eq!(s.arith(b"n", true, 1, NOW), ArithResult::Value(0));
        assert_eq!(
            val(&mut s, "n", NOW).unwrap(),
            format!("0{}", " ".repeat(19))
        );
        set(&mut s, "n", "99", 0, NOW);
        assert_eq!(s.arith(b"n", true, 1, NOW), ArithResult::Value(100));
        assert_eq!(val(&mut s, "n", NOW).unwrap(), "100");
        for bad in ["", "ab", "12a", "-12", "184467440737095516150"] {
            set(&mut s, "n", bad, 0, NOW);
            assert_eq!(
                s.arith(b"n", true, 1, NOW),
                ArithResult::NonNumeric,
                "{bad:?}"
            );
        }
        set(&mut s, "n", " 12", 0, NOW);
        assert_eq!(s.arith(b"n", true, 1, NOW), ArithResult::Value(13));
        assert_eq!(s.arith(b"zz", true, 1, NOW), ArithResult::NotFound);
        let before = s.get(b"n", None, NOW).unwrap().cas;
        s.arith(b"n", true, 1, NOW);
        assert_ne!(s.get(b"n", None, NOW).unwrap().cas, before);
        s.check();
    }

    #[test]
    fn flush_all_now_and_delayed() {
        let mut s = Shard::new(ShardConfig::default());
        set(&mut s, "a", "1", 0, NOW);
        s.flush_all(0, NOW);
        assert!(val(&mut s, "a", NOW).is_none());
        set(&mut s, "a", "1", 0, NOW);
        assert!(val(&mut s, "a", NOW).is_some());
        s.flush_all(2, NOW);
        assert!(val(&mut s, "a", NOW).is_some());
        set(&mut s, "b", "1", 0, NOW + 1);
        assert!(val(&mut s, "a", NOW + 2).is_none());
        assert!(val(&mut s, "b", NOW + 2).is_none());
        set(&mut s, "c", "1", 0, NOW + 2);
        assert!(val(&mut s, "c", NOW + 2).is_some());
        s.check();
    }

    #[test]
    fn too_large_set_deletes() {
        let mut s = Shard::new(ShardConfig::default());
        set(&mut s, "a", "1", 0, NOW);
        s.too_large(StoreMode::Add, b"a");
        assert!(val(&mut s, "a", NOW).is_some());
        s.too_large(StoreMode::Set, b"a");
        assert!(val(&mut s, "a", NOW).is_none());
        s.check();
    }
}
