//! [`DMap`]: the seed's key-value store (§6.2, App. I), of 64-bit keys and values.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use gossamer::RegionError;
use serde::{Deserialize, Serialize};

use crate::error::{OpenError, SendError};
use crate::fabric::{Fabric, Rack};
use crate::msw::hash;
use crate::mutex::LockArray;
use crate::object::{Declare, Object, On, Parts, Regions};
use crate::ring::{Ring, RingParams, RingReader, RingWriter};
use crate::work::Work;

/// A slot's words: the value, the slot's counter (bumped at each reuse), a checksum of key,
/// value and counter, and the valid bit.
const VALUE: usize = 0;
const COUNTER: usize = 1;
const CHECK: usize = 2;
const VALID: usize = 3;
const SLOT: usize = 4;

/// A tracker message: an insert or a delete of `key` at (member, slot, counter).
const INSERT: u64 = 1;
const DELETE: u64 = 2;

/// A map's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DMapParams {
    /// Slots for values on each member: how many keys a member can insert.
    pub slots: usize,
    /// Locks, striped across the members (a key takes lock `hash(key) % locks`).
    pub locks: usize,
}

/// Where a key's value is, as a member's index says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    member: usize,
    slot: usize,
    counter: u64,
}

type Index = Arc<Mutex<HashMap<u64, Entry>>>;
type Free = Arc<Mutex<Vec<usize>>>;

fn check(key: u64, value: u64, counter: u64) -> u64 {
    hash([key, value, counter])
}

/// A map of `u64` keys to `u64` values spread over its members (the seed's design, §6.2).
///
/// Each member holds values in slots of a region, and every member keeps a local index of
/// where each key's value is. A [`get`](DMap::get) looks the key up in the local index and
/// reads its slot with one get, taking no lock: the slot's checksum and counter tell a whole,
/// current value from a torn or reused one, and a read that fails them is tried again. An
/// insert, update or remove takes the key's lock (a [`LockArray`]). A new key's value goes in
/// a slot of the inserting member, not yet valid; its place goes to every other member on the
/// inserter's tracker ([`Ring`]), whose background fiber adds it to its index and
/// acknowledges by returning the ring's space; once all have, the inserter marks it valid.
/// A remove marks the slot invalid first, then tells every member to drop the key, and the
/// slot is reused once all have. Every write is fenced before its lock is released.
///
/// Each member runs a fiber that applies the other members' trackers while the map is open.
///
/// ```
/// use objects::{DMap, DMapParams};
/// let code = gossamer::Rack::from_env().run(|| {
///     let members: Vec<_> = gossamer::nodes().collect();
///     objects::on_members(&members, |members| {
///         let params = DMapParams { slots: 1024, locks: 64 };
///         let map = objects::open::<DMap>("doc-map", &params, &members).unwrap();
///         map.insert(7, 70).unwrap();
///         assert_eq!(map.get(7).unwrap(), Some(70));
///         assert_eq!(map.remove(7).unwrap(), Some(70));
///         assert_eq!(map.get(7).unwrap(), None);
///     });
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
pub struct DMap<F: Fabric = Rack> {
    data: Regions<F>,
    slots: usize,
    locks: LockArray<F>,
    /// This member's tracker; none when it is the only member.
    tracker: Option<Mutex<RingWriter<F>>>,
    index: Index,
    /// This member's free slots.
    free: Free,
    stop: Arc<AtomicBool>,
    monitor: Option<trust::JoinHandle<()>>,
}

impl<F> Object<F> for DMap<F>
where
    F: Fabric + Send + Sync,
    F::Region: Send + Sync,
{
    type Params = DMapParams;

    fn declare(d: &mut Declare, p: &DMapParams) {
        d.region("slots", p.slots.max(1) * SLOT, On::EachMember);
        d.object::<F, LockArray<F>>("locks", &p.locks);
        if d.members() > 1 {
            for m in 0..d.members() {
                d.object::<F, Ring<F>>(&format!("tracker{m}"), &tracker(m));
            }
        }
    }

    fn build(parts: Parts<F>, p: &DMapParams) -> Result<Self, OpenError> {
        if p.slots == 0 || p.locks == 0 {
            return Err(OpenError::BadParams {
                why: format!(
                    "a map of {} slots and {} locks: it needs at least one of each",
                    p.slots, p.locks
                ),
            });
        }
        let members = parts.members().len();
        let mut writer = None;
        let mut readers = Vec::new();
        for m in (0..members).filter(|_| members > 1) {
            match parts.object::<Ring<F>>(&format!("tracker{m}"), &tracker(m))? {
                Ring::Writer(w) => writer = Some(Mutex::new(w)),
                Ring::Reader(r) => readers.push(r),
            }
        }
        let index: Index = Arc::default();
        let free: Free = Arc::new(Mutex::new((0..p.slots).rev().collect()));
        let stop = Arc::new(AtomicBool::new(false));
        let data = parts.region("slots");
        let monitor = (!readers.is_empty()).then(|| {
            let (index, free, stop, data) =
                (index.clone(), free.clone(), stop.clone(), data.clone());
            trust::spawn(move || monitor(readers, &index, &free, &stop, &data))
        });
        Ok(DMap {
            data,
            slots: p.slots,
            locks: parts.object("locks", &p.locks)?,
            tracker: writer,
            index,
            free,
            stop,
            monitor,
        })
    }
}

/// A member's tracker: a ring it writes and every other member reads.
fn tracker(writer: usize) -> RingParams {
    RingParams {
        writer,
        capacity: 1024,
    }
}

/// Applies the other members' tracker messages to this member's index until `stop`; frees
/// this member's slots whose keys others removed.
fn monitor<F: Fabric>(
    mut readers: Vec<RingReader<F>>,
    index: &Index,
    free: &Free,
    stop: &AtomicBool,
    data: &Regions<F>,
) {
    while !stop.load(Ordering::Acquire) {
        let mut idle = true;
        for r in &mut readers {
            while let Some(message) = r.try_recv().expect("a tracker message") {
                idle = false;
                apply(index, free, data.me(), &crate::msw::to_words(&message));
            }
        }
        if idle {
            data.fabric().relax();
        }
    }
}

fn apply(index: &Index, free: &Free, me: usize, m: &[u64]) {
    let [op, key, member, slot, counter] = m[..] else {
        return;
    };
    let entry = Entry {
        member: member as usize,
        slot: slot as usize,
        counter,
    };
    let mut index = index.lock().unwrap_or_else(|p| p.into_inner());
    match op {
        INSERT => {
            index.insert(key, entry);
        }
        DELETE => {
            index.remove(&key);
            // Another member removed a key whose value is in one of this member's slots.
            if entry.member == me {
                free.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(entry.slot);
            }
        }
        _ => {}
    }
}

/// The map has no free slot on this member for a new key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MapError {
    /// This member's slots are all in use.
    Full {
        /// Its slots.
        slots: usize,
    },
    /// A region operation failed.
    Region(RegionError),
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapError::Full { slots } => write!(f, "all {slots} slots of this member are in use"),
            MapError::Region(e) => write!(f, "map: {e}"),
        }
    }
}

impl std::error::Error for MapError {}

impl From<RegionError> for MapError {
    fn from(e: RegionError) -> MapError {
        MapError::Region(e)
    }
}

impl From<SendError> for MapError {
    fn from(e: SendError) -> MapError {
        match e {
            SendError::Region(e) => MapError::Region(e),
            other => MapError::Region(RegionError::Failed {
                why: other.to_string(),
            }),
        }
    }
}

impl<F: Fabric> DMap<F> {
    fn lookup(&self, key: u64) -> Option<Entry> {
        self.index
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .copied()
    }

    fn lock_of(&self, key: u64) -> usize {
        (hash([key]) % self.locks.len() as u64) as usize
    }

    /// The value of `key`, taking no lock: one get of its slot, again while the slot is torn
    /// or was reused meanwhile.
    ///
    /// # Errors
    /// A region operation failed.
    pub fn get(&self, key: u64) -> Result<Option<u64>, RegionError> {
        loop {
            let Some(e) = self.lookup(key) else {
                return Ok(None);
            };
            let w = self.data.get(e.member, e.slot * SLOT, SLOT)?;
            if w[COUNTER] == e.counter && w[CHECK] == check(key, w[VALUE], w[COUNTER]) {
                // Valid: the value. Not yet (an insert waiting for its acknowledgements) or no
                // longer (a remove under way): none.
                return Ok((w[VALID] == 1).then_some(w[VALUE]));
            }
            // Torn, or the slot now holds another key: read the index again.
            self.data.fabric().relax();
        }
    }

    /// Sets `key` to `value`; its previous value.
    ///
    /// # Errors
    /// [`MapError::Full`] for a new key when this member has no free slot.
    pub fn insert(&self, key: u64, value: u64) -> Result<Option<u64>, MapError> {
        let guard = self.locks.lock(self.lock_of(key))?;
        let result = match self.lookup(key) {
            Some(e) => {
                let old = self.data.get(e.member, e.slot * SLOT, SLOT)?[VALUE];
                let words = [value, e.counter, check(key, value, e.counter), 1];
                self.put_slot(e.member, e.slot, &words);
                Ok(Some(old))
            }
            None => self.insert_new(key, value).map(|()| None),
        };
        guard.unlock()?;
        result
    }

    fn put_slot(&self, member: usize, slot: usize, words: &[u64]) {
        if member == self.data.me() {
            for (i, w) in words.iter().enumerate() {
                self.data.store(slot * SLOT + i, *w);
            }
        } else {
            self.data.put(member, slot * SLOT, words, &Work::new());
        }
    }

    fn insert_new(&self, key: u64, value: u64) -> Result<(), MapError> {
        let slot = self
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .ok_or(MapError::Full { slots: self.slots })?;
        let me = self.data.me();
        let counter = self.data.load(slot * SLOT + COUNTER) + 1;
        // Not valid yet: readers that find it through their index return none until every
        // index has it.
        self.put_slot(me, slot, &[value, counter, check(key, value, counter), 0]);
        let message = [INSERT, key, me as u64, slot as u64, counter];
        self.track(&message)?;
        self.index.lock().unwrap_or_else(|p| p.into_inner()).insert(
            key,
            Entry {
                member: me,
                slot,
                counter,
            },
        );
        self.data.store(slot * SLOT + VALID, 1);
        Ok(())
    }

    /// Sends `message` on this member's tracker and waits until every other member has
    /// applied it. Other fibers' messages go out while this one waits.
    fn track(&self, message: &[u64]) -> Result<(), MapError> {
        let Some(tracker) = &self.tracker else {
            return Ok(());
        };
        let fabric = self.data.fabric();
        let sent = {
            let mut writer = lock_in_fiber(tracker, fabric);
            writer.send(&words_to_bytes(message))?;
            writer.sent()
        };
        while !lock_in_fiber(tracker, fabric).delivered_up_to(sent) {
            fabric.relax();
        }
        Ok(())
    }

    /// Removes `key`; its value, if it had one.
    ///
    /// # Errors
    /// A region operation failed.
    pub fn remove(&self, key: u64) -> Result<Option<u64>, MapError> {
        let guard = self.locks.lock(self.lock_of(key))?;
        let result = self.remove_locked(key);
        guard.unlock()?;
        result
    }

    fn remove_locked(&self, key: u64) -> Result<Option<u64>, MapError> {
        let Some(e) = self.lookup(key) else {
            return Ok(None);
        };
        let w = self.data.get(e.member, e.slot * SLOT, SLOT)?;
        // Invalid first, landed, then out of every index: a reader that still finds it
        // reads it invalid.
        self.put_slot(e.member, e.slot, &[w[VALUE], e.counter, w[CHECK], 0]);
        let work = Work::new();
        let fabric = self.data.fabric();
        fabric.fence_in(fabric.node_of(self.data.of(e.member)), &work);
        work.wait()?;
        let message = [DELETE, key, e.member as u64, e.slot as u64, e.counter];
        self.track(&message)?;
        self.index
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        if e.member == self.data.me() {
            self.free
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(e.slot);
        } else {
            // The slot's member frees it when it applies the delete (see `monitor`).
        }
        Ok((w[VALID] == 1).then_some(w[VALUE]))
    }

    /// How many keys this member's index holds.
    pub fn len(&self) -> usize {
        self.index.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether this member's index holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Locks `mutex` from a fiber. Its holder may be a fiber suspended until its puts complete:
/// blocking the thread instead would keep that fiber's worker from ever resuming it.
fn lock_in_fiber<'a, T, F: Fabric>(mutex: &'a Mutex<T>, fabric: &F) -> MutexGuard<'a, T> {
    loop {
        match mutex.try_lock() {
            Ok(guard) => return guard,
            Err(TryLockError::Poisoned(p)) => return p.into_inner(),
            Err(TryLockError::WouldBlock) => fabric.relax(),
        }
    }
}

fn words_to_bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

impl<F: Fabric> Drop for DMap<F> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(m) = self.monitor.take() {
            m.join();
        }
    }
}

impl<F: Fabric> fmt::Debug for DMap<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DMap").field("keys", &self.len()).finish()
    }
}
