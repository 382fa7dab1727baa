//! The seam between objects and the memory they live in.
//!
//! Objects are written against [`Fabric`]: local loads and stores on this node's regions, and
//! one-sided operations on any node's, with the memory model of
//! [`gossamer::region`] and nothing more. [`Rack`] is the fabric of a real job (gossamer's
//! regions, over TCP or shared memory); the tests add an adversary that does everything the
//! model allows, so that an object that relies on more fails there.

use std::fmt;
use std::sync::atomic::Ordering;

use gossamer::{Region, RegionError};

use crate::directory;
use crate::error::OpenError;
use crate::signature::Signature;
use crate::work::{Then, Work};

/// The memory objects are built on: local loads and stores on this node's regions, and
/// one-sided operations on any node's, with the memory model of [`gossamer::region`] and
/// nothing more. [`Rack`] is a real job's; the crate's tests add an adversary that does
/// everything the model allows.
///
/// Local operations act on regions of this node; they panic when given another node's (an
/// object's bug, never input). Remote operations complete through their `Then`, which runs on
/// this worker: at once, or later from the worker's loop.
pub trait Fabric: Clone + 'static {
    /// A handle to a region: it names the region on its node and keeps it alive.
    type Region: Clone + fmt::Debug + 'static;

    /// This node's rank.
    fn rank(&self) -> u32;
    /// How many nodes the job has (a barrier fences them all).
    fn nodes(&self) -> u32;
    /// The node a region lives on.
    fn node_of(&self, region: &Self::Region) -> u32;

    /// Word `index` of a region of this node (acquire).
    fn load(&self, region: &Self::Region, index: usize) -> u64;
    /// Stores `value` in word `index` of a region of this node (release).
    fn store(&self, region: &Self::Region, index: usize, value: u64);
    /// Compare-and-exchange on a word of a region of this node.
    fn swap_local(
        &self,
        region: &Self::Region,
        index: usize,
        current: u64,
        new: u64,
    ) -> Result<u64, u64>;

    /// Writes `words` at `index` of any node's region; complete once `words` was read.
    fn put(&self, region: &Self::Region, index: usize, words: &[u64], then: Then<()>);
    /// [`put`](Fabric::put) tracked in `work`. A fabric whose puts can complete at issue
    /// overrides it to skip making a completion for them (the barrier's and the ring's puts
    /// through shared memory).
    fn put_in(&self, region: &Self::Region, index: usize, words: &[u64], work: &Work) {
        self.put(region, index, words, work.count());
    }
    /// Reads `len` words at `index` of any node's region.
    fn get(&self, region: &Self::Region, index: usize, len: usize, then: Then<Vec<u64>>);
    /// Compare-and-exchange on a word of any node's region.
    fn compare_exchange(
        &self,
        region: &Self::Region,
        index: usize,
        current: u64,
        new: u64,
        then: Then<Result<u64, u64>>,
    );
    /// Completes once every earlier operation of this worker to `node` has landed.
    fn fence(&self, node: u32, then: Then<()>);
    /// [`fence`](Fabric::fence) tracked in `work` (see [`put_in`](Fabric::put_in)).
    fn fence_in(&self, node: u32, work: &Work) {
        self.fence(node, work.count());
    }
    /// Lets others run: called in every loop that waits for a word to change.
    fn relax(&self);

    /// Allocates `len` zeroed words on this node.
    ///
    /// # Errors
    /// The node's heap has no room.
    fn alloc(&self, len: usize) -> Result<Self::Region, RegionError>;
    /// Publishes this member's endpoint of object `name` (its regions, `None` where it has
    /// none) and returns every member's, in member order, once each has opened it.
    ///
    /// # Errors
    /// As [`OpenError`]: a duplicate name here, a member that does not open it in time, or one
    /// that opened it as another object.
    fn join(
        &self,
        name: &str,
        signature: &Signature,
        mine: Vec<Option<Self::Region>>,
    ) -> Result<Vec<Vec<Option<Self::Region>>>, OpenError>;
    /// Withdraws this member's endpoint of `name`: its regions are freed once every member
    /// dropped its handles and nothing is in flight.
    fn leave(&self, name: &str);
}

/// The fabric of a rack job: gossamer's regions (see [`gossamer::region`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Rack;

fn words(region: &Region) -> &[std::sync::atomic::AtomicU64] {
    region
        .words()
        .expect("an object's local operation on a region of this node")
}

fn rack_node(node: u32) -> gossamer::Node {
    gossamer::nodes()
        .nth(node as usize)
        .unwrap_or_else(|| panic!("fence of node {node}, which the job does not have"))
}

impl Fabric for Rack {
    type Region = Region;

    fn rank(&self) -> u32 {
        gossamer::this_node().rank()
    }

    fn nodes(&self) -> u32 {
        gossamer::nodes().len() as u32
    }

    fn node_of(&self, region: &Region) -> u32 {
        region.node().rank()
    }

    #[inline]
    fn load(&self, region: &Region, index: usize) -> u64 {
        words(region)[index].load(Ordering::Acquire)
    }

    #[inline]
    fn store(&self, region: &Region, index: usize, value: u64) {
        words(region)[index].store(value, Ordering::Release);
    }

    fn swap_local(
        &self,
        region: &Region,
        index: usize,
        current: u64,
        new: u64,
    ) -> Result<u64, u64> {
        words(region)[index].compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
    }

    #[inline]
    fn put(&self, region: &Region, index: usize, words: &[u64], then: Then<()>) {
        region.put(index, words).then(then);
    }

    #[inline]
    fn put_in(&self, region: &Region, index: usize, words: &[u64], work: &Work) {
        let done = region.put(index, words);
        if done.is_done() {
            // Complete at issue (shared memory): only its outcome is kept.
            work.record(done.wait());
        } else {
            done.then(work.count());
        }
    }

    fn get(&self, region: &Region, index: usize, len: usize, then: Then<Vec<u64>>) {
        region.get(index, len).then(then);
    }

    fn compare_exchange(
        &self,
        region: &Region,
        index: usize,
        current: u64,
        new: u64,
        then: Then<Result<u64, u64>>,
    ) {
        region.compare_exchange(index, current, new).then(then);
    }

    fn fence(&self, node: u32, then: Then<()>) {
        gossamer::fence(rack_node(node)).then(then);
    }

    fn fence_in(&self, node: u32, work: &Work) {
        let done = gossamer::fence(rack_node(node));
        if done.is_done() {
            work.record(done.wait());
        } else {
            done.then(work.count());
        }
    }

    fn relax(&self) {
        // Other fibers of this worker first. Every 64th time, the thread too: with more ranks
        // than cores a rank that only yields to its own fibers keeps its core until the kernel
        // preempts it (milliseconds), while the rank it waits for cannot run (Open MPI yields
        // likewise when oversubscribed).
        thread_local! {
            static SPINS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
        }
        trust::yield_now();
        let spins = SPINS.with(|s| {
            s.set(s.get().wrapping_add(1));
            s.get()
        });
        if spins.is_multiple_of(64) {
            std::thread::yield_now();
        }
    }

    fn alloc(&self, len: usize) -> Result<Region, RegionError> {
        gossamer::this_node().region(len)
    }

    fn join(
        &self,
        name: &str,
        signature: &Signature,
        mine: Vec<Option<Region>>,
    ) -> Result<Vec<Vec<Option<Region>>>, OpenError> {
        directory::join(name, signature, mine)
    }

    fn leave(&self, name: &str) {
        directory::leave(name);
    }
}
