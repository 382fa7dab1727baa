//! A node's region heap: the memory its regions live in, shared with the ranks of its host.
//!
//! # Layout
//! One sealed `memfd` (see `transport::shm::mapping` for why sharing it is safe), made when the
//! rack starts, `GSM_REGION_HEAP` bytes long (pages are only backed once touched), passed to
//! every peer that talks to this node through shared memory when their link is set up (and
//! registered with UCX, if it started). When every link takes UCX (`GSM_TRANSPORT=ucx`), the
//! heap is memory UCX allocated instead, which UCX's shared memory maps into peers on the
//! host and its other transports reach one-sidedly (`transport::ucx::rma`). It is an array of
//! 64-bit words:
//!
//! - words `0 .. 2 × MAX_REGIONS`: the *slot table*, two words per region slot:
//!   `state = generation << 1 | live` and `place = offset << 32 | len` (offset and length in
//!   words, from the start of the heap);
//! - then the regions' words, wherever the owner's allocator put them.
//!
//! # Protocol
//! Only the owner writes the table. To publish region `(slot, generation)` it stores `place`,
//! then `state` with release; to free it, it stores the next generation, not live, then zeros
//! the words. A user (the owner itself, or a peer) loads `state` with acquire, then `place`,
//! and checks them: live, the generation it names, the length it was created with, and
//! offset and length within the table's end and the mapping's. Only then does it touch a
//! word, and only through atomics. The allocator's own books are private to the owner: a
//! peer that scribbles on the table can misdirect accesses only to other words of the heap,
//! never outside the mapping, and never corrupt the owner's allocator.
//!
//! A region is freed only after its last handle is gone and every operation in flight has
//! arrived (the handle counting of `Trust`), so a well-behaved user never finds its slot
//! reused under it: the checks are against broken peers and stale names.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::error::RegionError;
use crate::transport::shm::mapping::{self, Mapping};

/// Region slots per node.
pub(crate) const MAX_REGIONS: usize = 4096;
/// Words of the slot table; regions start after it.
pub(crate) const TABLE_WORDS: usize = 2 * MAX_REGIONS;
const LIVE: u64 = 1;

/// Where a region's words are, as read from the table and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

/// A node's heap, mapped in this process: its own (with the allocator) or a peer's.
#[derive(Debug)]
pub(crate) struct Heap {
    /// Its first byte: page-aligned for a node's own heap, word-aligned at least.
    base: *mut u8,
    /// Words from `base`.
    words: usize,
    /// The mapping of its file, unmapped with the heap; `None` for memory UCX allocated or
    /// maps, which stays for good (`transport::ucx`).
    _map: Option<Mapping>,
    /// The owner's books and the file it passes to peers; `None` in a peer's mapping.
    owner: Option<Owner>,
    /// A peer's heap whose life (incarnation) was lost: its regions are gone with it.
    lost: AtomicBool,
}

// SAFETY: the heap's memory is shared between threads (and processes) through atomics alone
// (module docs); the books are behind a mutex.
unsafe impl Send for Heap {}
// SAFETY: as for `Send`.
unsafe impl Sync for Heap {}

#[derive(Debug)]
struct Owner {
    /// The file peers map; `None` for memory UCX allocated (its peers reach it through UCX).
    file: Option<OwnedFd>,
    books: Mutex<Books>,
}

/// The owner's private record of its heap.
#[derive(Debug, Default)]
struct Books {
    /// Per slot ever used: its current generation and where its region is, while live.
    slots: Vec<(u32, Option<Place>)>,
    /// Slots free for reuse.
    free_slots: Vec<u32>,
    /// Free runs of words, by offset: offset → length.
    free: std::collections::BTreeMap<usize, usize>,
}

impl Books {
    /// First fit.
    fn take(&mut self, len: usize) -> Option<usize> {
        let (&offset, &run) = self.free.iter().find(|&(_, &run)| run >= len)?;
        self.free.remove(&offset);
        if run > len {
            self.free.insert(offset + len, run - len);
        }
        Some(offset)
    }

    /// Returns a run, merging it with its free neighbours.
    fn give(&mut self, mut offset: usize, mut len: usize) {
        if let Some((&before, &run)) = self.free.range(..offset).next_back()
            && before + run == offset
        {
            self.free.remove(&before);
            offset = before;
            len += run;
        }
        if let Some(run) = self.free.remove(&(offset + len)) {
            len += run;
        }
        self.free.insert(offset, len);
    }
}

impl Heap {
    /// Creates this node's heap of `bytes` (rounded down to words; at least the table and one
    /// page of words).
    pub(crate) fn create(bytes: usize) -> io::Result<Heap> {
        let words = bytes.max(Heap::MIN_BYTES) / 8;
        let file = mapping::create_file(c"gossamer-regions", words * 8)?;
        let map = Mapping::map_len(&file, words * 8)?;
        Ok(Heap::own(map.bytes().0, words, Some(map), Some(file)))
    }

    /// The least a heap may be: its table and a page of words.
    pub(crate) const MIN_BYTES: usize = (TABLE_WORDS + 512) * 8;

    /// This node's heap in `bytes` (at least [`MIN_BYTES`](Heap::MIN_BYTES)) at `base`:
    /// memory UCX allocated for it.
    ///
    /// # Safety
    /// The bytes are page-aligned, zeroed, stay mapped as long as the process, and are only
    /// accessed through this heap (and peers' atomics).
    pub(crate) unsafe fn create_at(base: *mut u8, bytes: usize) -> Heap {
        assert!(bytes >= Heap::MIN_BYTES, "a heap of {bytes} bytes");
        Heap::own(base, bytes / 8, None, None)
    }

    fn own(base: *mut u8, words: usize, map: Option<Mapping>, file: Option<OwnedFd>) -> Heap {
        let mut books = Books::default();
        books.free.insert(TABLE_WORDS, words - TABLE_WORDS);
        Heap {
            base,
            words,
            _map: map,
            lost: AtomicBool::new(false),
            owner: Some(Owner {
                file,
                books: Mutex::new(books),
            }),
        }
    }

    /// Maps a peer's heap from the file it passed, after checking it.
    pub(crate) fn map_peer(file: &OwnedFd) -> Result<Heap, String> {
        let what = "the peer's region heap";
        let bytes = mapping::check_file(file, what)?;
        let words = usize::try_from(bytes / 8).map_err(|_| format!("{what} is too large"))?;
        if words < TABLE_WORDS {
            return Err(format!("{what} has {bytes} bytes, too few for its table"));
        }
        let map = Mapping::map_len(file, words * 8).map_err(|e| format!("mapping {what}: {e}"))?;
        Ok(Heap {
            base: map.bytes().0,
            words,
            _map: Some(map),
            owner: None,
            lost: AtomicBool::new(false),
        })
    }

    /// A peer's heap of `words` words at `base`, where UCX maps it into this process.
    ///
    /// # Safety
    /// The words stay mapped as long as the process, `base` is word-aligned, and every
    /// access to them, in any process, is atomic.
    #[cfg(feature = "ucx")]
    pub(crate) unsafe fn peer_at(base: *mut u8, words: usize) -> Result<Heap, String> {
        if words < TABLE_WORDS || !(base as usize).is_multiple_of(8) {
            return Err(format!("a peer's heap of {words} words at {base:?}"));
        }
        Ok(Heap {
            base,
            words,
            _map: None,
            owner: None,
            lost: AtomicBool::new(false),
        })
    }

    /// The heap's first byte (page-aligned) and its length: what UCX registers.
    pub(crate) fn memory(&self) -> (*mut u8, usize) {
        (self.base, self.words * 8)
    }

    /// The file to pass to a peer: this node's own heap only.
    pub(crate) fn file(&self) -> Option<&OwnedFd> {
        self.owner.as_ref()?.file.as_ref()
    }

    /// Word `i` of the mapping.
    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.words, "word {i} of a heap of {}", self.words);
        let ptr = self.base;
        // SAFETY: `i < words` and the memory holds `words * 8` bytes from a word-aligned
        // `base` (a mapping's page, UCX's page-aligned allocation, or UCX's mapping checked
        // by `peer_at`), so the pointer is in bounds and aligned for `AtomicU64`; every bit
        // pattern is a valid `AtomicU64`, the bytes are initialized (fresh pages read as zero
        // until written) and the memory lives as long as `self` (or for good). Every access
        // to the heap, in any process, is atomic, so sharing it through `&AtomicU64` races
        // with nothing.
        unsafe { &*ptr.add(i * 8).cast::<AtomicU64>() }
    }

    /// Allocates `len` zeroed words and publishes them; returns the region's slot and
    /// generation. On this node's own heap only.
    pub(crate) fn alloc(&self, len: usize) -> Result<(u32, u32), RegionError> {
        let owner = self
            .owner
            .as_ref()
            .expect("only a node's own heap allocates");
        let mut books = owner.books.lock().unwrap_or_else(|p| p.into_inner());
        if len == 0 || len > u32::MAX as usize {
            return Err(RegionError::BadLength { len });
        }
        let full = || RegionError::HeapFull {
            len,
            heap_words: self.words - TABLE_WORDS,
        };
        let slot = match books.free_slots.pop() {
            Some(slot) => slot,
            None if books.slots.len() < MAX_REGIONS => {
                books.slots.push((0, None));
                (books.slots.len() - 1) as u32
            }
            None => return Err(RegionError::TooManyRegions { max: MAX_REGIONS }),
        };
        let Some(offset) = books.take(len) else {
            books.free_slots.push(slot);
            return Err(full());
        };
        let place = Place { offset, len };
        let generation = books.slots[slot as usize].0;
        books.slots[slot as usize].1 = Some(place);
        // Freed words were zeroed when freed, fresh ones are zero: nothing to clear here.
        let entry = 2 * slot as usize;
        self.word(entry + 1)
            .store(((offset as u64) << 32) | len as u64, Ordering::Relaxed);
        self.word(entry)
            .store(u64::from(generation) << 1 | LIVE, Ordering::Release);
        Ok((slot, generation))
    }

    /// Frees region `(slot, generation)`: unpublishes it, zeros its words and returns them.
    /// On this node's own heap only; a name that is not live is ignored.
    pub(crate) fn free(&self, slot: u32, generation: u32) {
        let owner = self.owner.as_ref().expect("only a node's own heap frees");
        let mut books = owner.books.lock().unwrap_or_else(|p| p.into_inner());
        let Some(entry) = books.slots.get_mut(slot as usize) else {
            return;
        };
        let (current, Some(place)) = *entry else {
            return;
        };
        if current != generation {
            return;
        }
        let next = generation.wrapping_add(1);
        *entry = (next, None);
        self.word(2 * slot as usize)
            .store(u64::from(next) << 1, Ordering::Release);
        for i in place.offset..place.offset + place.len {
            self.word(i).store(0, Ordering::Relaxed);
        }
        books.give(place.offset, place.len);
        books.free_slots.push(slot);
    }

    /// Reads and checks the table entry of region `(slot, generation)` of `len` words.
    pub(crate) fn resolve(
        &self,
        slot: u32,
        generation: u32,
        len: usize,
    ) -> Result<Place, RegionError> {
        if slot as usize >= MAX_REGIONS {
            return Err(RegionError::Stale { slot, generation });
        }
        let entry = 2 * slot as usize;
        let state = self.word(entry).load(Ordering::Acquire);
        let place = self.word(entry + 1).load(Ordering::Relaxed);
        if state & LIVE == 0 || (state >> 1) as u32 != generation {
            return Err(RegionError::Stale { slot, generation });
        }
        decode_place(place, len, self.words)
    }

    /// The words of a resolved region.
    pub(crate) fn region_words(&self, place: Place) -> &[AtomicU64] {
        assert!(
            place.offset + place.len <= self.words,
            "{place:?} in a heap of {} words",
            self.words
        );
        let ptr = self.base;
        // SAFETY: in bounds of the mapping (checked above; a `Place` is only made by
        // `decode_place`, which checks it too), aligned, initialized and alive as in `word`;
        // every access to the heap, in any process, is atomic.
        unsafe {
            std::slice::from_raw_parts(ptr.add(place.offset * 8).cast::<AtomicU64>(), place.len)
        }
    }

    /// Word `i` of a resolved region.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn word_at(&self, place: Place, i: usize) -> &AtomicU64 {
        &self.region_words(place)[i]
    }
}

/// Checks a table entry's `place` word against the length the region's name carries and the
/// heap's size. Every value of the word is handled (the fuzz target feeds it anything).
pub(crate) fn decode_place(
    place: u64,
    len: usize,
    heap_words: usize,
) -> Result<Place, RegionError> {
    let offset = (place >> 32) as usize;
    let stored = (place & u64::from(u32::MAX)) as usize;
    if stored != len
        || offset < TABLE_WORDS
        || offset.checked_add(len).is_none_or(|end| end > heap_words)
    {
        return Err(RegionError::Corrupt {
            why: format!(
                "the heap's table places a region of {len} words at word {offset} with length \
                 {stored}, in a heap of {heap_words} words"
            ),
        });
    }
    Ok(Place { offset, len })
}

/// The heaps of a node's regions: its own, and those of peers it maps.
#[derive(Debug)]
pub(crate) struct Heaps {
    pub(crate) own: Arc<Heap>,
    /// By rank: the heap of a peer on this host whose link uses shared memory, or that UCX
    /// maps into this process (`region::rma`).
    peers: Vec<RwLock<PeerHeap>>,
    /// By rank: whether `peers` holds a heap, read without its lock (by every `fence`).
    mapped: Vec<AtomicBool>,
    rank: u32,
}

impl Heaps {
    pub(crate) fn new(own: Arc<Heap>, rank: u32, size: usize) -> Heaps {
        Heaps {
            own,
            peers: (0..size).map(|_| RwLock::default()).collect(),
            mapped: (0..size).map(|_| AtomicBool::new(false)).collect(),
            rank,
        }
    }

    /// Records the heap of life `incarnation` of peer `rank` (the first of its links to bring
    /// it; the others' are dropped); a newer life's replaces an older one's, which is lost. A
    /// life already lost is not recorded.
    pub(crate) fn add_peer(&self, rank: u32, incarnation: u32, heap: Arc<Heap>) {
        let mut peer = self.peers[rank as usize]
            .write()
            .unwrap_or_else(|p| p.into_inner());
        let known = peer.heap.as_ref().map(|(life, _)| *life);
        if peer.lost_through.is_some_and(|lost| incarnation <= lost)
            || known.is_some_and(|life| life >= incarnation)
        {
            return;
        }
        if let Some((_, old)) = peer.heap.replace((incarnation, heap)) {
            old.lost.store(true, Ordering::Release);
        }
        self.mapped[rank as usize].store(true, Ordering::Release);
    }

    /// Forgets the heap of life `incarnation` of peer `rank` (and of any older one): its
    /// regions fail from now on, even through handles that found the heap before.
    pub(crate) fn lose(&self, rank: u32, incarnation: u32) {
        let Some(peer) = self.peers.get(rank as usize) else {
            return;
        };
        let mut peer = peer.write().unwrap_or_else(|p| p.into_inner());
        peer.lost_through = peer.lost_through.max(Some(incarnation));
        if peer
            .heap
            .as_ref()
            .is_some_and(|(life, _)| *life <= incarnation)
        {
            if let Some((_, heap)) = peer.heap.take() {
                heap.lost.store(true, Ordering::Release);
            }
            self.mapped[rank as usize].store(false, Ordering::Release);
        }
    }

    /// Whether this process maps the heap of `rank`'s regions.
    pub(crate) fn maps(&self, rank: u32) -> bool {
        rank == self.rank
            || self
                .mapped
                .get(rank as usize)
                .is_some_and(|m| m.load(Ordering::Acquire))
    }

    /// The heap of `rank`'s regions of life `incarnation`, if this process maps it.
    pub(crate) fn heap_of(&self, rank: u32, incarnation: u32) -> Option<Arc<Heap>> {
        if rank == self.rank {
            return Some(self.own.clone());
        }
        let peer = self.peers.get(rank as usize)?;
        let peer = peer.read().unwrap_or_else(|p| p.into_inner());
        peer.heap
            .as_ref()
            .filter(|(life, _)| *life == incarnation)
            .map(|(_, heap)| heap.clone())
    }
}

/// What a node knows of one peer's heap.
#[derive(Debug, Default)]
struct PeerHeap {
    /// The heap this process maps, and the life (incarnation) of the peer it belongs to.
    heap: Option<(u32, Arc<Heap>)>,
    /// The newest life of the peer that was lost.
    lost_through: Option<u32>,
}

impl Heap {
    /// Whether this is a peer's heap whose life was lost ([`Heaps::lose`]).
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A peer's heap is found only for the life it belongs to; losing that life marks it
    /// lost for handles that found it before, and a lost life's heap is never recorded again.
    #[test]
    fn peer_heaps_follow_the_peer_s_lives() {
        let own = Arc::new(Heap::create(1 << 20).unwrap());
        let heaps = Heaps::new(own, 0, 2);
        let first = Arc::new(Heap::create(1 << 20).unwrap());
        heaps.add_peer(1, 0, first.clone());
        assert!(heaps.maps(1));
        assert!(heaps.heap_of(1, 0).is_some() && heaps.heap_of(1, 1).is_none());
        heaps.lose(1, 0);
        assert!(first.is_lost() && !heaps.maps(1) && heaps.heap_of(1, 0).is_none());
        heaps.add_peer(1, 0, Arc::new(Heap::create(1 << 20).unwrap()));
        assert!(heaps.heap_of(1, 0).is_none(), "a lost life came back");
        let second = Arc::new(Heap::create(1 << 20).unwrap());
        heaps.add_peer(1, 1, second.clone());
        assert!(heaps.heap_of(1, 1).is_some() && !second.is_lost());
        // A newer life's heap replaces the one it finds; an older one's is dropped.
        heaps.add_peer(1, 2, Arc::new(Heap::create(1 << 20).unwrap()));
        assert!(second.is_lost() && heaps.heap_of(1, 2).is_some());
        heaps.add_peer(1, 1, Arc::new(Heap::create(1 << 20).unwrap()));
        assert!(heaps.heap_of(1, 2).is_some() && heaps.heap_of(1, 1).is_none());
        assert!(
            heaps.heap_of(0, 7).is_some(),
            "its own heap, whatever the life"
        );
    }

    #[test]
    fn regions_are_allocated_zeroed_freed_and_their_names_go_stale() {
        let heap = Heap::create(1 << 20).unwrap();
        let (a, ga) = heap.alloc(10).unwrap();
        let (b, gb) = heap.alloc(20).unwrap();
        let pa = heap.resolve(a, ga, 10).unwrap();
        let pb = heap.resolve(b, gb, 20).unwrap();
        assert!(pa.offset + 10 <= pb.offset || pb.offset + 20 <= pa.offset);
        heap.word_at(pa, 9).store(7, Ordering::Relaxed);
        heap.free(a, ga);
        assert_eq!(
            heap.resolve(a, ga, 10),
            Err(RegionError::Stale {
                slot: a,
                generation: ga
            })
        );
        // The slot comes back with the next generation, its words zeroed.
        let (c, gc) = heap.alloc(10).unwrap();
        assert_eq!((c, gc), (a, ga + 1));
        let pc = heap.resolve(c, gc, 10).unwrap();
        assert_eq!(heap.word_at(pc, 9).load(Ordering::Relaxed), 0);
        // A wrong length is refused, as is a slot past the table.
        assert!(matches!(
            heap.resolve(c, gc, 11),
            Err(RegionError::Corrupt { .. })
        ));
        assert!(heap.resolve(MAX_REGIONS as u32, 0, 1).is_err());
    }

    #[test]
    fn freed_runs_merge_and_a_full_heap_is_an_error() {
        let heap = Heap::create((TABLE_WORDS + 1000) * 8).unwrap();
        let words = heap.words - TABLE_WORDS;
        let names: Vec<_> = (0..4).map(|_| heap.alloc(words / 4).unwrap()).collect();
        assert!(matches!(
            heap.alloc(words),
            Err(RegionError::HeapFull { .. })
        ));
        for &(slot, generation) in &names {
            heap.free(slot, generation);
        }
        // All four runs merged back into one.
        let (slot, generation) = heap.alloc(words).unwrap();
        heap.free(slot, generation);
        assert!(matches!(heap.alloc(0), Err(RegionError::BadLength { .. })));
    }

    #[test]
    fn a_peer_mapping_sees_the_owners_words() {
        let heap = Heap::create(1 << 20).unwrap();
        let peer = Heap::map_peer(heap.file().unwrap()).unwrap();
        let (slot, generation) = heap.alloc(4).unwrap();
        let place = peer.resolve(slot, generation, 4).unwrap();
        peer.word_at(place, 3).fetch_add(5, Ordering::AcqRel);
        let own = heap.resolve(slot, generation, 4).unwrap();
        assert_eq!(heap.word_at(own, 3).load(Ordering::Acquire), 5);
    }

    #[test]
    fn every_place_word_is_checked() {
        let heap_words = TABLE_WORDS + 100;
        let place = |offset: u64, len: u64| offset << 32 | len;
        assert!(decode_place(place(TABLE_WORDS as u64, 100), 100, heap_words).is_ok());
        assert!(decode_place(place(TABLE_WORDS as u64 + 1, 100), 100, heap_words).is_err());
        assert!(decode_place(place(0, 10), 10, heap_words).is_err());
        assert!(
            decode_place(
                place(u32::MAX as u64, u32::MAX as u64),
                u32::MAX as usize,
                heap_words
            )
            .is_err()
        );
        assert!(decode_place(u64::MAX, 5, heap_words).is_err());
    }
}
