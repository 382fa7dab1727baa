//! The [`Shard`] itself: items in slots indexed by a hash map and linked into an LRU list,
//! memory accounting and eviction from the LRU's cold end, lazy removal of expired and flushed
//! items, cas uniques, and the counters. The commands are in `commands.rs` and `meta.rs`.

use std::collections::HashMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::common::item_size;

const NIL: u32 = u32::MAX;

/// A shard's counters, named as in memcached's `stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct ShardStats {
    pub cmd_get: u64,
    pub cmd_set: u64,
    pub cmd_touch: u64,
    pub get_hits: u64,
    pub get_misses: u64,
    pub get_expired: u64,
    pub get_flushed: u64,
    pub delete_misses: u64,
    pub delete_hits: u64,
    pub incr_misses: u64,
    pub incr_hits: u64,
    pub decr_misses: u64,
    pub decr_hits: u64,
    pub cas_misses: u64,
    pub cas_hits: u64,
    pub cas_badval: u64,
    pub touch_hits: u64,
    pub touch_misses: u64,
    pub store_too_large: u64,
    pub store_no_memory: u64,
    pub bytes: u64,
    pub curr_items: u64,
    pub total_items: u64,
    pub expired_unfetched: u64,
    pub evicted_unfetched: u64,
    pub evictions: u64,
    pub reclaimed: u64,
}

impl ShardStats {
    /// Adds another shard's counters to these.
    pub fn add(&mut self, o: &ShardStats) {
        macro_rules! sum { ($($f:ident),*) => { $( self.$f += o.$f; )* } }
        sum!(
            cmd_get,
            cmd_set,
            cmd_touch,
            get_hits,
            get_misses,
            get_expired,
            get_flushed,
            delete_misses,
            delete_hits,
            incr_misses,
            incr_hits,
            decr_misses,
            decr_hits,
            cas_misses,
            cas_hits,
            cas_badval,
            touch_hits,
            touch_misses,
            store_too_large,
            store_no_memory,
            bytes,
            curr_items,
            total_items,
            expired_unfetched,
            evicted_unfetched,
            evictions,
            reclaimed
        );
    }
}

/// How a shard is set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardConfig {
    /// This shard's number, `0..shards`.
    pub index: u32,
    /// Number of shards (the cas stride).
    pub shards: u32,
    /// Memory limit of this shard in bytes (charged with [`item_size`]).
    pub mem_limit: usize,
    /// Largest item, memcached's `-I`.
    pub item_size_max: usize,
    /// Evict live items when full (false: memcached's `-M`, answer an error instead).
    pub evict: bool,
}

impl Default for ShardConfig {
    fn default() -> Self {
        ShardConfig {
            index: 0,
            shards: 1,
            mem_limit: 64 * 1024 * 1024,
            item_size_max: 1024 * 1024,
            evict: true,
        }
    }
}

/// One item and its links in the LRU list.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) key: Bytes,
    pub(super) value: Bytes,
    pub(super) flags: u32,
    /// Unix time of expiry; 0 never.
    pub(super) exptime: u64,
    /// Unix time of the last store (for delayed `flush_all`).
    pub(super) time: u64,
    pub(super) cas: u64,
    pub(super) fetched: bool,
    prev: u32,
    next: u32,
}

impl Entry {
    fn size(&self) -> usize {
        item_size(self.key.len(), self.value.len(), self.flags)
    }
}

#[derive(Debug)]
enum Slot {
    Used(Entry),
    Free(u32),
}

/// Why a lookup found nothing.
pub(super) enum Miss {
    Absent,
    Expired,
    Flushed,
}

/// One shard of the table. See the module documentation.
#[derive(Debug)]
pub struct Shard {
    pub(super) map: HashMap<Bytes, u32>,
    slots: Vec<Slot>,
    free: u32,
    /// Most recently used.
    head: u32,
    /// Least recently used.
    tail: u32,
    used: usize,
    pub(super) cfg: ShardConfig,
    next_cas: u64,
    /// Items stored at or before this time are gone once `now >= oldest_live`; 0: none.
    pub(super) oldest_live: u64,
    pub(super) stats: ShardStats,
}

impl Shard {
    /// An empty shard.
    pub fn new(cfg: ShardConfig) -> Shard {
        Shard {
            map: HashMap::new(),
            slots: Vec::new(),
            free: NIL,
            head: NIL,
            tail: NIL,
            used: 0,
            cfg,
            next_cas: u64::from(cfg.index) + 1,
            oldest_live: 0,
            stats: ShardStats::default(),
        }
    }

    /// Number of live or not yet reclaimed items.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the shard holds no items.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Bytes charged for the items held.
    pub fn bytes(&self) -> usize {
        self.used
    }

    /// The shard's counters, with the current item count and size.
    pub fn stats(&self) -> ShardStats {
        let mut s = self.stats;
        s.curr_items = self.map.len() as u64;
        s.bytes = self.used as u64;
        s
    }

    pub(super) fn entry(&self, i: u32) -> &Entry {
        match &self.slots[i as usize] {
            Slot::Used(e) => e,
            Slot::Free(_) => unreachable!("LRU or map points at a free slot"),
        }
    }

    pub(super) fn entry_mut(&mut self, i: u32) -> &mut Entry {
        match &mut self.slots[i as usize] {
            Slot::Used(e) => e,
            Slot::Free(_) => unreachable!("LRU or map points at a free slot"),
        }
    }

    fn unlink_lru(&mut self, i: u32) {
        let (prev, next) = {
            let e = self.entry(i);
            (e.prev, e.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.entry_mut(prev).next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.entry_mut(next).prev = prev;
        }
    }

    fn push_front(&mut self, i: u32) {
        let old = self.head;
        {
            let e = self.entry_mut(i);
            e.prev = NIL;
            e.next = old;
        }
        if old == NIL {
            self.tail = i;
        } else {
            self.entry_mut(old).prev = i;
        }
        self.head = i;
    }

    pub(super) fn bump(&mut self, i: u32) {
        if self.head != i {
            self.unlink_lru(i);
            self.push_front(i);
        }
    }

    /// Unlinks item `i` and frees its slot.
    pub(super) fn remove_index(&mut self, i: u32) -> Entry {
        self.unlink_lru(i);
        let slot = std::mem::replace(&mut self.slots[i as usize], Slot::Free(self.free));
        self.free = i;
        let Slot::Used(e) = slot else {
            unreachable!("removing a free slot")
        };
        self.map.remove(&e.key[..]);
        self.used -= e.size();
        e
    }

    fn is_dead(&self, e: &Entry, now: u64) -> Option<Miss> {
        if e.exptime != 0 && e.exptime <= now {
            Some(Miss::Expired)
        } else if self.oldest_live != 0 && self.oldest_live <= now && e.time <= self.oldest_live {
            Some(Miss::Flushed)
        } else {
            None
        }
    }

    /// Finds a live item, removing it if it has expired or was flushed.
    pub(super) fn find(&mut self, key: &[u8], now: u64) -> Result<u32, Miss> {
        let &i = self.map.get(key).ok_or(Miss::Absent)?;
        match self.is_dead(self.entry(i), now) {
            None => Ok(i),
            Some(m) => {
                let e = self.remove_index(i);
                if !e.fetched && matches!(m, Miss::Expired) {
                    self.stats.expired_unfetched += 1;
                }
                self.stats.reclaimed += 1;
                Err(m)
            }
        }
    }

    /// The next cas unique of this shard.
    pub(super) fn take_cas(&mut self) -> u64 {
        let c = self.next_cas;
        self.next_cas += u64::from(self.cfg.shards.max(1));
        c
    }

    /// Makes room for `size` bytes, evicting from the LRU tail. False if it cannot fit.
    fn make_room(&mut self, size: usize, now: u64) -> bool {
        if size > self.cfg.mem_limit {
            return false;
        }
        while self.used + size > self.cfg.mem_limit && self.tail != NIL {
            let t = self.tail;
            let dead = self.is_dead(self.entry(t), now).is_some();
            if !dead && !self.cfg.evict {
                break;
            }
            let e = self.remove_index(t);
            if dead {
                self.stats.reclaimed += 1;
            } else {
                self.stats.evictions += 1;
                if !e.fetched {
                    self.stats.evicted_unfetched += 1;
                }
            }
        }
        self.used + size <= self.cfg.mem_limit
    }

    /// Links a new item (the key must be absent), evicting as needed.
    pub(super) fn insert(
        &mut self,
        key: Bytes,
        value: Bytes,
        flags: u32,
        exptime: u64,
        now: u64,
    ) -> bool {
        let size = item_size(key.len(), value.len(), flags);
        if !self.make_room(size, now) {
            self.stats.store_no_memory += 1;
            return false;
        }
        let cas = self.take_cas();
        let entry = Entry {
            key: key.clone(),
            value,
            flags,
            exptime,
            time: now,
            cas,
            fetched: false,
            prev: NIL,
            next: NIL,
        };
        let i = if self.free != NIL {
            let i = self.free;
            let Slot::Free(next) = self.slots[i as usize] else {
                unreachable!("free list points at a used slot")
            };
            self.free = next;
            self.slots[i as usize] = Slot::Used(entry);
            i
        } else {
            self.slots.push(Slot::Used(entry));
            (self.slots.len() - 1) as u32
        };
        self.map.insert(key, i);
        self.push_front(i);
        self.used += size;
        self.stats.total_items += 1;
        true
    }

    /// Drops every item at once (`flush_all` without delay).
    pub(super) fn clear(&mut self) {
        self.map.clear();
        self.slots.clear();
        self.free = NIL;
        self.head = NIL;
        self.tail = NIL;
        self.used = 0;
        self.oldest_live = 0;
    }

    /// Zeroes the counters (`stats reset`).
    pub fn reset_stats(&mut self) {
        let total = self.stats.total_items;
        self.stats = ShardStats::default();
        self.stats.total_items = total;
    }

    /// Checks the internal invariants (for tests): the map, the LRU list and the byte count
    /// agree.
    pub fn check(&self) {
        let mut n = 0;
        let mut bytes = 0;
        let mut prev = NIL;
        let mut i = self.head;
        while i != NIL {
            let e = self.entry(i);
            assert_eq!(e.prev, prev, "broken back link");
            assert_eq!(
                self.map.get(&e.key[..]),
                Some(&i),
                "LRU item missing from map"
            );
            bytes += e.size();
            n += 1;
            prev = i;
            i = e.next;
        }
        assert_eq!(self.tail, prev, "tail is not the last item");
        assert_eq!(n, self.map.len(), "map and LRU disagree");
        assert_eq!(bytes, self.used, "byte count is off");
        assert!(self.used <= self.cfg.mem_limit, "over the memory limit");
    }
}

#[cfg(test)]
mod tests {
    use crate::common::item_size;
    use crate::store::fixtures::{NOW, set, val};
    use crate::store::{Shard, ShardConfig, StoreResult};

    #[test]
    fn lru_eviction_under_limit() {
        let cfg = ShardConfig {
            mem_limit: 10 * item_size(3, 100, 0),
            ..ShardConfig::default()
        };
        let mut s = Shard::new(cfg);
        let v = "x".repeat(100);
        for i in 0..10 {
            set(&mut s, &format!("k{i:02}"), &v, 0, NOW);
        }
        assert_eq!(s.len(), 10);
        // Touch k00 so that k01 is the oldest.
        assert!(val(&mut s, "k00", NOW).is_some());
        set(&mut s, "k10", &v, 0, NOW);
        assert!(val(&mut s, "k00", NOW).is_some());
        assert!(val(&mut s, "k01", NOW).is_none());
        assert_eq!(s.stats().evictions, 1);
        s.check();
        // Bigger than the whole shard.
        let huge = "x".repeat(cfg.mem_limit);
        assert_eq!(set(&mut s, "h", &huge, 0, NOW), StoreResult::OutOfMemory);
        s.check();
    }

    #[test]
    fn cas_is_unique_across_shards() {
        let mut shards: Vec<Shard> = (0..3)
            .map(|i| {
                Shard::new(ShardConfig {
                    index: i,
                    shards: 3,
                    ..ShardConfig::default()
                })
            })
            .collect();
        let mut seen = std::collections::HashSet::new();
        for round in 0..10 {
            for s in &mut shards {
                let k = format!("k{round}");
                set(s, &k, "v", 0, NOW);
                assert!(seen.insert(s.get(k.as_bytes(), None, NOW).unwrap().cas));
            }
        }
    }
}
