//! One-sided regions: arrays of 64-bit words on a node that any rank reads, writes and updates
//! atomically without running code of its own there.
//!
//! [`Node::region`] registers a region of `len` words, zeroed, on a node and returns a
//! [`Region`]: a handle that travels like a [`Trust`] (inside arguments, results and other
//! properties), names the region by its slot and generation on that node and the word its
//! words start at in the node's heap (an offset, checked against the heap before each access:
//! never an address), and is counted: the region is freed after the last handle anywhere is
//! gone and every operation in flight has arrived.
//!
//! ```
//! let code = gossamer::Rack::from_env().run(|| {
//!     let node = gossamer::nodes().last().unwrap();
//!     let counters = node.region(4).unwrap();
//!     counters.put(0, &[10, 20]).wait().unwrap();
//!     assert_eq!(counters.fetch_add(1, 5).wait().unwrap(), 20);
//!     assert_eq!(counters.compare_exchange(0, 10, 11).wait().unwrap(), Ok(10));
//!     assert_eq!(counters.get(0, 3).wait().unwrap(), vec![11, 25, 0]);
//!     // Out of bounds is an error, never a write.
//!     assert!(counters.put(3, &[1, 2]).wait().is_err());
//! });
//! assert_eq!(code, std::process::ExitCode::SUCCESS);
//! ```
//!
//! # Operations and completions
//! [`put`](Region::put), [`get`](Region::get), [`fetch_add`](Region::fetch_add) and
//! [`compare_exchange`](Region::compare_exchange) work on one word or a run of them, and each
//! returns a [`Done`]: wait for it ([`Done::wait`], which suspends only the calling fiber),
//! chain a callback ([`Done::then`], allowed in delegated context), count it in a
//! [`Group`](crate::Group) (`done.then(group.track(...))`) or `.await` it. [`fence`] waits
//! until this worker's earlier operations to a node have landed.
//!
//! # How they travel
//! - **Through shared memory** (a node on this host whose links use it, and this node
//!   itself): the regions of a node live in its *heap*, a sealed `memfd` mapped by every rank
//!   of the host that talks to it through shared memory. An operation is a plain atomic
//!   instruction on the mapping: no message, no CPU of the target. The heap's table, which
//!   says where each region is, is checked before every access (see `heap`).
//! - **Over UCX** (links on UCX, `GSM_TRANSPORT=ucx`): the node's heap is memory UCX
//!   allocated, and its key and extent travel on its links (`transport::ucx::rma`). Where UCX
//!   maps it into this process (its shared memory, on one host), it is reached as through
//!   shared memory above. Elsewhere an operation is UCX's `ucp_put_nbx`, `ucp_get_nbx` or
//!   `ucp_atomic_op_nbx`, and [`fence`] is `ucp_ep_flush_nbx`: on RDMA hardware the NIC moves
//!   a put's or a get's words with no code of the target's; over UCX's TCP the target's UCX
//!   applies them when its worker progresses (every round of its loop). Atomics there are the
//!   target CPU's, always (below): the target's worker applies them as messages. (With
//!   `auto`, which takes UCX between RDMA hosts and shared memory within one, the heap is the
//!   node's own file, registered with UCX.)
//! - **Over TCP**: an operation is a request to the target node's worker 0, which owns all of
//!   the node's regions, and is applied there by its loop: it costs the target CPU time, as a
//!   delegated call does, and its latency is a round trip.
//!
//! # The memory model every transport meets
//! The objects built on regions rely on nothing more than this:
//! - Word-sized accesses are atomic; a `put` or `get` of several words may tear (another
//!   operation may see some of its words and not others).
//! - A completed `put` means its source was read, not that it landed. A completed `get`,
//!   `fetch_add` or `compare_exchange` has taken effect.
//! - From one worker to one node, puts land in issue order, and a `get` or an atomic takes
//!   effect after every earlier put of that worker to that node.
//! - Nothing is ordered across nodes: a put to node A may land after a later put to node B.
//! - [`fence(node)`](fence) completes once every earlier operation of this worker to that node
//!   has landed.
//!
//! Shared memory gives more: there every operation has taken effect when it returns (a put
//! has landed), so one worker's operations take effect in issue order across nodes too, and
//! `fence` costs one memory fence.
//!
//! What UCX gives, and how:
//! - Order: UCX may carry one worker's operations in any order, so each of its operations
//!   after another is preceded by `ucp_worker_fence`: to a node, they take effect in issue
//!   order. A put's words are copied when it is issued, so a completed put has read them.
//! - Atomics: `fetch_add` and `compare_exchange` are atomic against each other and against
//!   the owner's own atomic instructions on the words ([`Region::words`], which the objects
//!   built on regions use on their local replicas): gossamer sets UCX's `ATOMIC_MODE` to
//!   `cpu`, so that UCX performs them with the CPU's atomic instructions on the target, never
//!   with a NIC's (which are not atomic against the CPU's). On RDMA hardware this makes an
//!   atomic a message to the target's worker rather than a NIC operation.
//! - Words: where UCX does not map the heap, a put's or get's words are copied by the NIC
//!   (RDMA) or by UCX's `memcpy` on the target (TCP). Each aligned 64-bit word is copied whole
//!   by such copies on the x86-64 and AArch64 machines this crate runs on, but neither UCX nor
//!   the hardware promises it; the model's word atomicity for puts and gets there rests on
//!   that (the atomics above do not).
//! - Trust: this node checks its own operations against the heap the target registered, but
//!   what a peer's UCX asks of this node's UCX is UCX's to check, and it does not: over UCX's
//!   TCP it writes where the peer names (RDMA NICs hold a peer to its key's bounds; UCX's shared
//!   memory to the heap it maps). The handshake keeps out anyone without the job's secret, and
//!   a rank of the job is trusted with this node's heap, and over UCX's TCP with its memory.
//!
//! Errors are returned, never acted on: an index past the region's end, a region freed or
//! never made (a stale name), a heap with no room for a new region, a region whose node's life
//! was lost (`gsm run --recover`).
//!
//! # Regions of a lost life
//! A region belongs to one life (incarnation) of its node's rank. Once this rank knows that
//! life lost, every operation on the region fails ([`RegionError::Failed`]), whichever way it
//! travels: a request's call fails; a one-sided operation under way over UCX fails, and later
//! ones go as requests, which fail; a mapped heap is marked lost, and [`Region::words`] gives
//! `None`. Operations issued before the loss is known may complete on the lost life's words;
//! none reaches the next life's heap, even where a new region takes the same slot. Words a
//! caller took from `words()` before stay mapped (for good) but are nobody's.

mod error;
pub(crate) mod heap;
#[cfg(feature = "ucx")]
mod rma;

pub use error::RegionError;

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{self, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};

use serde::{Deserialize, Serialize};

use crate::call::on_rack;
use crate::link;
use crate::node::Node;
use crate::proxy::Trust;
use crate::state;
use heap::{Heap, Place};

/// A region's words on its node's worker 0: freed from the heap when the last handle drops.
struct Allocation {
    heap: Arc<Heap>,
    name: Result<(u32, u32), RegionError>,
    len: usize,
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if let Ok((slot, generation)) = self.name {
            self.heap.free(slot, generation);
        }
    }
}

/// Runs on the owner: allocates `len` words in this node's heap.
fn allocate(len: u64) -> Allocation {
    let heap = state::current()
        .expect("a region is made inside Rack::run")
        .regions
        .own
        .clone();
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    Allocation {
        name: heap.alloc(len),
        heap,
        len,
    }
}

/// The region's name, and where its words start in the heap.
fn name_of(a: &mut Allocation) -> Result<(u32, u32, u32), RegionError> {
    let (slot, generation) = a.name.clone()?;
    let place = a.heap.resolve(slot, generation, a.len)?;
    Ok((slot, generation, place.offset as u32))
}

/// A handle to a region: see the [module docs](self).
#[derive(Clone, Serialize, Deserialize)]
pub struct Region {
    node: u32,
    slot: u32,
    generation: u32,
    len: u32,
    /// Where its words start in the node's heap, in words: what one-sided access over UCX
    /// addresses (checked against the heap the node registered).
    offset: u32,
    /// Keeps the region alive (its counting is `Trust`'s) and carries operations sent as
    /// requests (over TCP).
    keep: Trust<Allocation>,
    /// The node's heap and where the region is in it, when this process maps it (looked up
    /// once: while this handle lives, the region stays where it is).
    #[serde(skip)]
    direct: OnceLock<Option<(Arc<Heap>, Place)>>,
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("node", &self.node)
            .field("slot", &self.slot)
            .field("generation", &self.generation)
            .field("len", &self.len)
            .finish()
    }
}

impl Node {
    /// Registers a region of `len` zeroed 64-bit words on this node (module docs of
    /// [`region`](crate::region)). Waits for the node when it is another one.
    ///
    /// # Errors
    /// `len` is 0 or past `u32::MAX`, the node's heap has no room for it
    /// (`GSM_REGION_HEAP`), or the node has [`MAX_REGIONS`] regions.
    ///
    /// # Panics
    /// Outside [`Rack::run`](crate::Rack::run).
    pub fn region(self, len: usize) -> Result<Region, RegionError> {
        if len == 0 || len > u32::MAX as usize {
            return Err(RegionError::BadLength { len });
        }
        let keep = self.trustee(0).entrust_with(allocate, len as u64);
        let (slot, generation, offset) = keep.apply(name_of)?;
        Ok(Region {
            node: self.rank,
            slot,
            generation,
            len: len as u32,
            offset,
            keep,
            direct: OnceLock::new(),
        })
    }
}

/// Region slots per node.
pub const MAX_REGIONS: usize = heap::MAX_REGIONS;

/// An operation; what a request carries over TCP (where `words` is owned).
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Op<'a> {
    Put { index: u64, words: Raw<'a> },
    Get { index: u64, len: u64 },
    FetchAdd { index: u64, x: u64 },
    CompareExchange { index: u64, current: u64, new: u64 },
}

impl Op<'_> {
    /// The words it names: the first, and how many.
    fn span(&self) -> (u64, u64) {
        match self {
            Op::Put { index, words } => (*index, words.0.len() as u64),
            Op::Get { index, len } => (*index, *len),
            Op::FetchAdd { index, .. } | Op::CompareExchange { index, .. } => (*index, 1),
        }
    }

    /// The same operation owning its words, to be sent.
    fn into_owned(self) -> Op<'static> {
        match self {
            Op::Put { index, words } => Op::Put {
                index,
                words: Raw(Cow::Owned(words.0.into_owned())),
            },
            Op::Get { index, len } => Op::Get { index, len },
            Op::FetchAdd { index, x } => Op::FetchAdd { index, x },
            Op::CompareExchange {
                index,
                current,
                new,
            } => Op::CompareExchange {
                index,
                current,
                new,
            },
        }
    }
}

/// Words on the wire as their little-endian bytes: a copy, where postcard's variable-length
/// integers would cost a branch per byte at both ends.
#[derive(Debug, Clone)]
struct Raw<'a>(Cow<'a, [u64]>);

impl Serialize for Raw<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let bytes: Vec<u8> = self.0.iter().flat_map(|w| w.to_le_bytes()).collect();
        serializer.serialize_bytes(&bytes)
    }
}

impl<'de> Deserialize<'de> for Raw<'_> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = Cow<'static, [u64]>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("64-bit words as little-endian bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<Self::Value, E> {
                if !bytes.len().is_multiple_of(8) {
                    return Err(E::invalid_length(bytes.len(), &self));
                }
                Ok(Cow::Owned(
                    bytes
                        .chunks_exact(8)
                        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                        .collect(),
                ))
            }
        }
        deserializer.deserialize_bytes(Visit).map(Raw)
    }
}

/// What the owner answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Reply {
    Put,
    Words(Raw<'static>),
    Value(u64),
    Exchanged(Result<u64, u64>),
}

/// The words of a region, resolved in a heap.
struct Words<'a>(&'a [AtomicU64]);

impl Words<'_> {
    fn check(&self, index: u64, len: u64) -> Result<usize, RegionError> {
        let region_len = self.0.len();
        match (usize::try_from(index), usize::try_from(len)) {
            (Ok(i), Ok(n)) if i.checked_add(n).is_some_and(|end| end <= region_len) => Ok(i),
            _ => Err(RegionError::OutOfBounds {
                index: usize::try_from(index).unwrap_or(usize::MAX),
                len: usize::try_from(len).unwrap_or(usize::MAX),
                region_len,
            }),
        }
    }

    /// Applies `op` with the orderings the memory model needs (module docs): puts release
    /// each word and end with a full fence, so that no later load of this thread is done
    /// before they land; gets acquire; atomics acquire and release.
    fn apply(&self, op: Op<'_>) -> Result<Reply, RegionError> {
        let word = |i: usize| &self.0[i];
        Ok(match op {
            Op::Put { index, words } => {
                let at = self.check(index, words.0.len() as u64)?;
                for (to, w) in self.0[at..at + words.0.len()].iter().zip(words.0.iter()) {
                    to.store(*w, Ordering::Release);
                }
                atomic::fence(Ordering::SeqCst);
                Reply::Put
            }
            Op::Get { index, len } => {
                let at = self.check(index, len)?;
                Reply::Words(Raw(Cow::Owned(
                    self.0[at..at + len as usize]
                        .iter()
                        .map(|w| w.load(Ordering::Acquire))
                        .collect(),
                )))
            }
            Op::FetchAdd { index, x } => {
                let at = self.check(index, 1)?;
                Reply::Value(word(at).fetch_add(x, Ordering::AcqRel))
            }
            Op::CompareExchange {
                index,
                current,
                new,
            } => {
                let at = self.check(index, 1)?;
                Reply::Exchanged(word(at).compare_exchange(
                    current,
                    new,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ))
            }
        })
    }
}

/// Runs on the owner's worker 0 for a request that came over a link.
fn serve(a: &mut Allocation, op: Op<'static>) -> Result<Reply, RegionError> {
    let (slot, generation) = a.name.clone()?;
    let place = a.heap.resolve(slot, generation, a.len)?;
    Words(a.heap.region_words(place)).apply(op)
}

/// The fuzz target's body (`gossamer::fuzzing::region_op`): `data` is a table entry's `place`
/// word (8 bytes, then a length byte), then a region request's argument bytes. The entry must
/// be judged without panicking; a request that decodes runs on a 16-word region in a heap of
/// its own, and must fail exactly when it names words past the region, leaving the words
/// around the region untouched.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_op(data: &[u8]) {
    use std::sync::atomic::AtomicU64;
    let Some((entry, request)) = data.split_first_chunk::<9>() else {
        return;
    };
    let place = u64::from_le_bytes(entry[..8].try_into().expect("8 bytes"));
    if let Ok(p) = heap::decode_place(place, usize::from(entry[8]), 1 << 17) {
        assert!(p.offset + p.len <= 1 << 17);
    }
    thread_local! {
        static HEAP: (Heap, Place, Place) = {
            let heap = Heap::create(1 << 20).expect("a heap");
            let (before, gb) = heap.alloc(1).expect("room");
            let (slot, generation) = heap.alloc(16).expect("room");
            let (after, ga) = heap.alloc(1).expect("room");
            let outside = |slot, generation| heap.resolve(slot, generation, 1).expect("live");
            let (b, a) = (outside(before, gb), outside(after, ga));
            let place = heap.resolve(slot, generation, 16).expect("live");
            heap.word_at(b, 0).store(0xB0, Ordering::Relaxed);
            heap.word_at(a, 0).store(0xA0, Ordering::Relaxed);
            (heap, place, Place { offset: b.offset, len: a.offset - b.offset + 1 })
        };
    }
    let Ok(op) = crate::codec::decode_value::<Op<'static>>(request) else {
        return;
    };
    let (index, len) = op.span();
    let inside = index.checked_add(len).is_some_and(|end| end <= 16);
    HEAP.with(|(heap, place, span)| {
        let result = Words(heap.region_words(*place)).apply(op);
        assert_eq!(
            result.is_ok(),
            inside,
            "{index}+{len} in a region of 16 gave {result:?}"
        );
        let word = |i| -> &AtomicU64 { heap.word_at(*span, i) };
        assert_eq!(word(0).load(Ordering::Relaxed), 0xB0);
        assert_eq!(word(span.len - 1).load(Ordering::Relaxed), 0xA0);
    });
}

fn unexpected(reply: &Reply) -> RegionError {
    RegionError::Failed {
        why: format!("the owner answered {reply:?}, which does not fit the operation"),
    }
}

impl Region {
    /// The node the region lives on.
    pub fn node(&self) -> Node {
        Node { rank: self.node }
    }

    /// Its length in words.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether it has no words (never: a region has at least one).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes `words` from word `index` on. Complete once `words` was read (memory model in
    /// the module docs); [`fence`] waits for it to land.
    #[inline]
    pub fn put(&self, index: usize, words: &[u64]) -> Done<()> {
        self.run(
            Op::Put {
                index: index as u64,
                words: Raw(Cow::Borrowed(words)),
            },
            |r| match r {
                Reply::Put => Ok(()),
                r => Err(unexpected(&r)),
            },
        )
    }

    /// Reads `len` words from word `index` on.
    #[inline]
    pub fn get(&self, index: usize, len: usize) -> Done<Vec<u64>> {
        self.run(
            Op::Get {
                index: index as u64,
                len: len as u64,
            },
            |r| match r {
                Reply::Words(w) => Ok(w.0.into_owned()),
                r => Err(unexpected(&r)),
            },
        )
    }

    /// Adds `x` to word `index` (wrapping) and returns what it held before.
    #[inline]
    pub fn fetch_add(&self, index: usize, x: u64) -> Done<u64> {
        self.run(
            Op::FetchAdd {
                index: index as u64,
                x,
            },
            |r| match r {
                Reply::Value(v) => Ok(v),
                r => Err(unexpected(&r)),
            },
        )
    }

    /// Stores `new` in word `index` if it holds `current`: `Ok(current)` then, else
    /// `Err(what it holds)`, as [`AtomicU64::compare_exchange`](std::sync::atomic::AtomicU64::compare_exchange).
    #[inline]
    pub fn compare_exchange(&self, index: usize, current: u64, new: u64) -> Done<Result<u64, u64>> {
        self.run(
            Op::CompareExchange {
                index: index as u64,
                current,
                new,
            },
            |r| match r {
                Reply::Exchanged(x) => Ok(x),
                r => Err(unexpected(&r)),
            },
        )
    }

    /// The region's words as atomics, when this process maps its node's heap (the region is on
    /// this node, or on one reached through shared memory, the rack's or UCX's): loads and stores on them are
    /// operations of this node's CPU, as the objects built on regions make on their local
    /// replicas. `None` otherwise (use [`get`](Region::get) and [`put`](Region::put)), or when
    /// the region is stale.
    ///
    /// ```
    /// use std::sync::atomic::Ordering;
    /// let code = gossamer::Rack::from_env().run(|| {
    ///     let r = gossamer::this_node().region(2).unwrap();
    ///     r.put(1, &[5]).wait().unwrap();
    ///     let words = r.words().expect("a region of this node is mapped");
    ///     assert_eq!(words[1].load(Ordering::Acquire), 5);
    /// });
    /// assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// ```
    pub fn words(&self) -> Option<&[AtomicU64]> {
        match self.direct()? {
            Ok(words) => Some(words.0),
            Err(_) => None,
        }
    }

    /// The region's words, if this process maps its node's heap.
    fn direct(&self) -> Option<Result<Words<'_>, RegionError>> {
        if let Some(direct) = self.direct.get() {
            return direct.as_ref().map(|(heap, place)| {
                if heap.is_lost() {
                    return Err(self.lost());
                }
                Ok(Words(heap.region_words(*place)))
            });
        }
        let state = state::current()?;
        let life = self.incarnation();
        let heap = state.regions.heap_of(self.node, life);
        #[cfg(feature = "ucx")]
        let heap = heap.or_else(|| rma::mapped_heap(&state, self.node, life));
        let heap = heap?;
        // A stale name is not cached: it stays an error.
        let place = match heap.resolve(self.slot, self.generation, self.len()) {
            Ok(place) => place,
            Err(e) => return Some(Err(e)),
        };
        let _ = self.direct.set(Some((heap, place)));
        self.direct()
    }

    /// The life (incarnation) of the other rank the region belongs to; 0 for this rank's own
    /// regions, whose heap is found without it.
    fn incarnation(&self) -> u32 {
        match self.keep.placement() {
            crate::proxy::Placement::Remote(target) => target.incarnation,
            // An allocation is not Wire: it never moves.
            _ => 0,
        }
    }

    /// What an operation on a region of a lost life fails with.
    fn lost(&self) -> RegionError {
        RegionError::Failed {
            why: format!(
                "rank {} lost the life that held the region (it restarted, or is down)",
                self.node
            ),
        }
    }

    fn run<T: Send + 'static>(
        &self,
        op: Op<'_>,
        take: fn(Reply) -> Result<T, RegionError>,
    ) -> Done<T> {
        if let Some(words) = self.direct() {
            return Done::ready(words.and_then(|w| w.apply(op)).and_then(take));
        }
        // Bounds are checked here too, so that a put, complete before it lands, still fails
        // at once; the owner checks again.
        let (index, len) = op.span();
        if index
            .checked_add(len)
            .is_none_or(|end| end > u64::from(self.len))
        {
            return Done::ready(Err(RegionError::OutOfBounds {
                index: index as usize,
                len: len as usize,
                region_len: self.len(),
            }));
        }
        if !link::is_rack_worker() {
            let op = op.into_owned();
            // A plain thread has no links: a fiber of the rack runs the operation, and waits
            // for it to land, since this thread cannot fence later.
            let region = self.clone();
            let node = self.node();
            return Done::ready(on_rack(move || {
                let result = region.run(op, take).wait();
                fence(node).wait().and(result)
            }));
        }
        #[cfg(feature = "ucx")]
        if let Some(route) = crate::transport::ucx::rma::route(self.node, self.incarnation()) {
            return rma::run(self, &route, op, take);
        }
        let op = op.into_owned();
        let is_put = matches!(op, Op::Put { .. });
        let seq = Inflight::issue(self.node);
        let node = self.node;
        if is_put {
            self.keep.try_apply_then_with(serve, op, move |r| {
                let r = r.unwrap_or_else(|e| Err(RegionError::Failed { why: e.to_string() }));
                Inflight::complete(node, seq, r.err());
            });
            // The words were copied into the request: the put is complete.
            return Done::ready(Ok(()).and_then(|()| take(Reply::Put)));
        }
        let (done, fill) = Done::pending();
        self.keep.try_apply_then_with(serve, op, move |r| {
            let r = r.unwrap_or_else(|e| Err(RegionError::Failed { why: e.to_string() }));
            Inflight::complete(node, seq, None);
            fill.fill(r.and_then(take));
        });
        done
    }
}

/// Completes once every operation this worker issued to `node` before it has landed (module
/// docs of [`region`](crate::region)); fails with the first error of a put since the last
/// fence, which only the target could see.
///
/// ```
/// let code = gossamer::Rack::from_env().run(|| {
///     let node = gossamer::nodes().last().unwrap();
///     let r = node.region(1).unwrap();
///     r.put(0, &[7]);
///     gossamer::fence(node).wait().unwrap();
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
pub fn fence(node: Node) -> Done<()> {
    if state::with_current(|s| s.regions.maps(node.rank)) == Some(true) {
        atomic::fence(Ordering::SeqCst);
        return Done::ready(Ok(()));
    }
    if !link::is_rack_worker() {
        // Operations of plain threads landed before they returned.
        return Done::ready(Ok(()));
    }
    #[cfg(feature = "ucx")]
    if let Some(route) = crate::transport::ucx::rma::route_to(node.rank) {
        // Operations on regions of a life the route does not reach went as requests.
        let requests = Inflight::fence(node.rank);
        let (done, fill) = Done::pending();
        rma::fence(&route).then(move |ucx| requests.then(move |sent| fill.fill(sent.and(ucx))));
        return done;
    }
    Inflight::fence(node.rank)
}

/// This worker's region operations in flight as requests, per node: what [`fence`] waits for.
#[derive(Default)]
struct Inflight {
    next: u64,
    outstanding: BTreeSet<u64>,
    /// Fences waiting for every operation up to a number.
    fences: Vec<(u64, Fill<()>)>,
    /// The first put refused since the last fence.
    error: Option<RegionError>,
}

thread_local! {
    static INFLIGHT: RefCell<HashMap<u32, Inflight>> = RefCell::default();
}

impl Inflight {
    fn issue(node: u32) -> u64 {
        INFLIGHT.with(|all| {
            let mut all = all.borrow_mut();
            let f = all.entry(node).or_default();
            let seq = f.next;
            f.next += 1;
            f.outstanding.insert(seq);
            seq
        })
    }

    fn complete(node: u32, seq: u64, error: Option<RegionError>) {
        let ready = INFLIGHT.with(|all| {
            let mut all = all.borrow_mut();
            let f = all.get_mut(&node)?;
            f.outstanding.remove(&seq);
            if f.error.is_none() {
                f.error = error;
            }
            let oldest = f.outstanding.first().copied().unwrap_or(u64::MAX);
            let (ready, waiting) = std::mem::take(&mut f.fences)
                .into_iter()
                .partition(|(upto, _)| *upto < oldest);
            f.fences = waiting;
            let ready: Vec<(u64, Fill<()>)> = ready;
            if ready.is_empty() {
                return None;
            }
            Some((ready, f.error.take()))
        });
        // Callbacks run after the borrow ends: they may issue more operations.
        if let Some((ready, error)) = ready {
            for (_, fill) in ready {
                fill.fill(error.clone().map_or(Ok(()), Err));
            }
        }
    }

    fn fence(node: u32) -> Done<()> {
        INFLIGHT.with(|all| {
            let mut all = all.borrow_mut();
            let f = all.entry(node).or_default();
            if f.outstanding.is_empty() {
                return Done::ready(f.error.take().map_or(Ok(()), Err));
            }
            let (done, fill) = Done::pending();
            f.fences.push((f.next - 1, fill));
            done
        })
    }
}

/// The completion of a region operation (or a [`fence`]): wait for it, chain a callback, or
/// `.await` it.
#[must_use = "a region operation's result is only seen through its `Done`"]
pub struct Done<T> {
    state: DoneState<T>,
}

enum DoneState<T> {
    Ready(Option<Result<T, RegionError>>),
    Pending(Rc<Slot<T>>),
}

/// A callback chained to a pending operation.
type Then<T> = Box<dyn FnOnce(Result<T, RegionError>)>;

/// Where a pending operation's result goes.
struct Slot<T> {
    result: RefCell<Option<Result<T, RegionError>>>,
    then: RefCell<Option<Then<T>>>,
    waker: RefCell<Option<Waker>>,
}

/// The side that completes a pending [`Done`].
struct Fill<T>(Rc<Slot<T>>);

impl<T> Fill<T> {
    fn fill(self, result: Result<T, RegionError>) {
        let then = self.0.then.borrow_mut().take();
        match then {
            Some(then) => then(result),
            None => {
                *self.0.result.borrow_mut() = Some(result);
                if let Some(w) = self.0.waker.borrow_mut().take() {
                    w.wake();
                }
            }
        }
    }
}

impl<T> Done<T> {
    fn ready(result: Result<T, RegionError>) -> Done<T> {
        Done {
            state: DoneState::Ready(Some(result)),
        }
    }

    fn pending() -> (Done<T>, Fill<T>) {
        let slot = Rc::new(Slot {
            result: RefCell::new(None),
            then: RefCell::new(None),
            waker: RefCell::new(None),
        });
        (
            Done {
                state: DoneState::Pending(slot.clone()),
            },
            Fill(slot),
        )
    }

    /// Whether the operation has completed (a wait would not suspend).
    pub fn is_done(&self) -> bool {
        match &self.state {
            DoneState::Ready(_) => true,
            DoneState::Pending(slot) => slot.result.borrow().is_some(),
        }
    }

    /// Suspends the calling fiber until the operation completes, and returns its result.
    ///
    /// # Panics
    /// In delegated context when the operation has not completed (use [`then`](Done::then)).
    #[inline]
    pub fn wait(self) -> Result<T, RegionError> {
        match self.state {
            DoneState::Ready(mut result) => result.take().expect("a Done completes once"),
            DoneState::Pending(_) => trust::block_on(self),
        }
    }

    /// Runs `then` with the result once the operation completes: at once if it has, else on
    /// this worker when its answer arrives. Allowed in delegated context.
    #[inline]
    pub fn then(self, then: impl FnOnce(Result<T, RegionError>) + 'static) {
        match self.state {
            DoneState::Ready(mut result) => then(result.take().expect("a Done completes once")),
            DoneState::Pending(slot) => {
                let result = slot.result.borrow_mut().take();
                match result {
                    Some(result) => then(result),
                    None => *slot.then.borrow_mut() = Some(Box::new(then)),
                }
            }
        }
    }
}

// A `Done` is never pinned in place: its result is moved out whole, never borrowed.
impl<T> Unpin for Done<T> {}

impl<T> Future for Done<T> {
    type Output = Result<T, RegionError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match &mut this.state {
            DoneState::Ready(result) => Poll::Ready(
                result
                    .take()
                    .expect("a Done is not polled after it completed"),
            ),
            DoneState::Pending(slot) => match slot.result.borrow_mut().take() {
                Some(result) => Poll::Ready(result),
                None => {
                    *slot.waker.borrow_mut() = Some(cx.waker().clone());
                    Poll::Pending
                }
            },
        }
    }
}

impl<T> fmt::Debug for Done<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Done")
            .field("done", &self.is_done())
            .finish()
    }
}

#[cfg(all(test, feature = "fuzzing", not(loom)))]
mod tests {
    /// The fuzz target's checks on the requests of every kind, in and past the region.
    #[test]
    fn requests_fail_exactly_past_the_region() {
        let entry = [0u8; 9];
        for index in [0u64, 1, 15, 16, 17, u64::MAX] {
            for (kind, rest) in [
                // Two words, as 16 bytes.
                (0u8, [16].into_iter().chain([7u8; 16]).collect()),
                (1, vec![2]),
                (2, vec![5]),
                (3, vec![0, 1]),
            ] {
                let mut data = entry.to_vec();
                data.push(kind);
                let mut n = index;
                loop {
                    let byte = (n & 0x7f) as u8;
                    n >>= 7;
                    data.push(if n == 0 { byte } else { byte | 0x80 });
                    if n == 0 {
                        break;
                    }
                }
                data.extend(rest);
                super::fuzz_op(&data);
            }
        }
    }
}
