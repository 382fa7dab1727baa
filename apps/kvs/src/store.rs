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
//! * Memory: every item is charged [`item_size`] bytes (memcached's header, key and value).
//!   Storing evicts from the cold end of the LRU until the shard is within its limit; an item
//!   larger than the whole limit is refused with `SERVER_ERROR out of memory storing object`.
//! * cas uniques: shard `i` of `n` hands out `i + 1, i + 1 + n, i + 1 + 2n, …`, so they are
//!   unique across shards. Every store, append and incr gives the item a new one; touch keeps it.
//! * `incr` wraps at 2^64, `decr` stops at 0. A result no longer than the old value is
//!   written over it and padded with spaces (memcached's in-place update); a longer one
//!   replaces the value.
//! * `append`/`prepend` keep the old flags and expiry.
//! * `flush_all` without delay empties the shard; with a delay `d` it marks every item last
//!   stored at or before `now + d - 1` as gone once that time has come.

use std::collections::HashMap;

use bytes::Bytes;

use crate::protocol::{REALTIME_MAXDELTA, StoreMode, item_size};

const NIL: u32 = u32::MAX;

/// Values up to this many bytes are copied out of the shard; longer ones are shared by
/// reference count.
pub const INLINE_VALUE: usize = 48;

/// A value handed out of the shard: small values are copied, large ones share the stored
/// buffer by reference count.
#[derive(Clone, PartialEq, Eq)]
pub enum Value {
    /// A copy of a short value.
    Inline {
        /// Number of bytes used.
        len: u8,
        /// The bytes.
        buf: [u8; INLINE_VALUE],
    },
    /// A reference to the stored buffer.
    Shared(Bytes),
}

impl Value {
    fn of(b: &Bytes) -> Value {
        if b.len() <= INLINE_VALUE {
            let mut buf = [0; INLINE_VALUE];
            buf[..b.len()].copy_from_slice(b);
            Value::Inline {
                len: b.len() as u8,
                buf,
            }
        } else {
            Value::Shared(b.clone())
        }
    }
}

impl AsRef<[u8]> for Value {
    fn as_ref(&self) -> &[u8] {
        match self {
            Value::Inline { len, buf } => &buf[..usize::from(*len)],
            Value::Shared(b) => b,
        }
    }
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.as_ref()))
    }
}

/// What a lookup returns: a copy of the item's metadata and its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemView {
    /// Client flags.
    pub flags: u32,
    /// The value.
    pub value: Value,
    /// The cas unique.
    pub cas: u64,
}

/// Outcome of a storage command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreResult {
    /// `STORED`.
    Stored,
    /// `NOT_STORED`: the add/replace/append/prepend condition failed.
    NotStored,
    /// `EXISTS`: cas mismatch.
    Exists,
    /// `NOT_FOUND`: cas on a missing key.
    NotFound,
    /// `SERVER_ERROR out of memory storing object`.
    OutOfMemory,
    /// `SERVER_ERROR object too large for cache`.
    TooLarge,
}

impl StoreResult {
    /// The answer line, without `\r\n`.
    pub fn line(self) -> &'static str {
        match self {
            StoreResult::Stored => "STORED",
            StoreResult::NotStored => "NOT_STORED",
            StoreResult::Exists => "EXISTS",
            StoreResult::NotFound => "NOT_FOUND",
            StoreResult::OutOfMemory => "SERVER_ERROR out of memory storing object",
            StoreResult::TooLarge => "SERVER_ERROR object too large for cache",
        }
    }
}

/// Outcome of `incr`/`decr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArithResult {
    /// The new value.
    Value(u64),
    /// `NOT_FOUND`.
    NotFound,
    /// `CLIENT_ERROR cannot increment or decrement non-numeric value`.
    NonNumeric,
}

/// A storage command's arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreRequest {
    /// Which command.
    pub mode: StoreMode,
    /// The key.
    pub key: Bytes,
    /// Client flags.
    pub flags: u32,
    /// Expiry time as sent.
    pub exptime: i32,
    /// The value.
    pub data: Bytes,
    /// The cas unique to compare (`cas` only).
    pub cas_unique: u64,
}

/// One operation on one shard. Everything is owned, so it can be shipped to a trustee.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardCommand {
    /// Look up one key; with `touch`, also set its expiry (`gat`).
    Get {
        /// The key.
        key: Bytes,
        /// New expiry time as sent by the client.
        touch: Option<i32>,
    },
    /// A storage command (boxed, like the other large and rarer variants, so that a command
    /// and its reply stay small: a batch to a trustee carries more of them).
    Store(Box<StoreRequest>),
    /// A storage command whose value was too large: a `set` deletes the key.
    TooLarge {
        /// Which command.
        mode: StoreMode,
        /// The key.
        key: Bytes,
    },
    /// `delete`.
    Delete {
        /// The key.
        key: Bytes,
    },
    /// `incr`/`decr`.
    Arith {
        /// The key.
        key: Bytes,
        /// `incr` (true) or `decr`.
        incr: bool,
        /// The amount.
        delta: u64,
    },
    /// `touch`.
    Touch {
        /// The key.
        key: Bytes,
        /// New expiry time as sent.
        exptime: i32,
    },
    /// `flush_all` (sent to every shard).
    FlushAll {
        /// Delay as sent.
        delay: i32,
    },
    /// A meta command (`mg`, `ms`, `md`, `ma`).
    Meta(Box<MetaOp>),
    /// Read the shard's counters.
    Stats,
    /// Zero the shard's counters (`stats reset`).
    ResetStats,
}

/// The answer to a [`ShardCommand`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardReply {
    /// For `Get`.
    Value(Option<ItemView>),
    /// For `Store` and `TooLarge`.
    Store(StoreResult),
    /// For `Delete`: whether the key existed.
    Deleted(bool),
    /// For `Arith`.
    Arith(ArithResult),
    /// For `Touch`: whether the key existed.
    Touched(bool),
    /// For `FlushAll` and `ResetStats`.
    Done,
    /// For `Stats`.
    Stats(Box<ShardStats>),
    /// For `Meta`.
    Meta(Box<MetaReply>),
}

/// Which meta command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
#[derive(Clone, Debug, PartialEq, Eq)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// A shard's counters, named as in memcached's `stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

#[derive(Debug)]
struct Entry {
    key: Bytes,
    value: Bytes,
    flags: u32,
    /// Unix time of expiry; 0 never.
    exptime: u64,
    /// Unix time of the last store (for delayed `flush_all`).
    time: u64,
    cas: u64,
    fetched: bool,
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
enum Miss {
    Absent,
    Expired,
    Flushed,
}

/// One shard of the table. See the module documentation.
#[derive(Debug)]
pub struct Shard {
    map: HashMap<Bytes, u32>,
    slots: Vec<Slot>,
    free: u32,
    /// Most recently used.
    head: u32,
    /// Least recently used.
    tail: u32,
    used: usize,
    cfg: ShardConfig,
    next_cas: u64,
    /// Items stored at or before this time are gone once `now >= oldest_live`; 0: none.
    oldest_live: u64,
    stats: ShardStats,
}

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

/// memcached's `safe_strtoull` applied to a stored value (followed by `\r\n` there).
fn parse_counter(v: &[u8]) -> Option<u64> {
    crate::protocol::safe_strtoull(v)
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

    fn entry(&self, i: u32) -> &Entry {
        match &self.slots[i as usize] {
            Slot::Used(e) => e,
            Slot::Free(_) => unreachable!("LRU or map points at a free slot"),
        }
    }

    fn entry_mut(&mut self, i: u32) -> &mut Entry {
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

    fn bump(&mut self, i: u32) {
        if self.head != i {
            self.unlink_lru(i);
            self.push_front(i);
        }
    }

    fn remove_index(&mut self, i: u32) -> Entry {
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
    fn find(&mut self, key: &[u8], now: u64) -> Result<u32, Miss> {
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

    fn take_cas(&mut self) -> u64 {
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
    fn insert(&mut self, key: Bytes, value: Bytes, flags: u32, exptime: u64, now: u64) -> bool {
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
        self.map.clear();
        self.slots.clear();
        self.free = NIL;
        self.head = NIL;
        self.tail = NIL;
        self.used = 0;
        self.oldest_live = 0;
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn sr(
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

    fn set(s: &mut Shard, k: &str, v: &str, exptime: i32, now: u64) -> StoreResult {
        s.store(sr(StoreMode::Set, b(k), 0, exptime, b(v), 0), now)
    }

    fn val(s: &mut Shard, k: &str, now: u64) -> Option<String> {
        s.get(k.as_bytes(), None, now)
            .map(|v| String::from_utf8(v.value.as_ref().to_vec()).unwrap())
    }

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

    #[test]
    fn large_values_are_shared() {
        let mut s = Shard::new(ShardConfig::default());
        let big = Bytes::from(vec![7u8; 4096]);
        s.store(sr(StoreMode::Set, b("k"), 0, 0, big.clone(), 0), NOW);
        let v = s.get(b"k", None, NOW).unwrap();
        match v.value {
            Value::Shared(b) => assert_eq!(b.as_ptr(), big.as_ptr()),
            Value::Inline { .. } => panic!("large value was copied"),
        }
        set(&mut s, "small", "tiny", 0, NOW);
        assert!(matches!(
            s.get(b"small", None, NOW).unwrap().value,
            Value::Inline { .. }
        ));
    }
}
