//! The adversary: a [`Fabric`] of simulated nodes, driven by a seed, that does everything the
//! memory model of `gossamer::region` allows and nothing more.
//!
//! Every node's program is a fiber on one worker; the nodes' memories are plain vectors. A
//! one-sided operation joins the FIFO queue of its (source, target) pair, and a simulated NIC
//! applies queue heads at random moments: between any two local accesses of any program, and
//! from a driver fiber while programs wait. So it may
//! - delay a put for as long as it likes (a put completes when issued: its words were read);
//! - land puts to different nodes in any order, and tear a put or get of several words (it
//!   lands or reads them one at a time, in a random order);
//! - but never reorder two operations of one source to one target, and a fence completes only
//!   when it reaches the head of its queue (everything before it landed).
//!
//! Scheduling is also seeded: a program yields to the others at random points. One seed gives
//! one run, again and again.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};

use gossamer::RegionError;

use crate::error::OpenError;
use crate::fabric::Fabric;
use crate::signature::Signature;
use crate::work::Then;

/// Simulations have at most 4 nodes: 16 (source, target) queues.
const MAX_QUEUES: usize = 16;

/// A region of a simulated node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SimRegion {
    pub(crate) node: u32,
    id: usize,
    len: usize,
}

/// One node's view of the simulated network.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sim {
    rank: u32,
}

enum Kind {
    Put(Vec<u64>),
    Get(Vec<u64>, Then<Vec<u64>>),
    Cas(u64, u64, Then<Result<u64, u64>>),
    Fence(Then<()>),
}

struct Op {
    region: SimRegion,
    index: usize,
    kind: Kind,
    /// The words not yet landed or read, in the order they will be.
    left: Vec<usize>,
}

/// A seeded xorshift generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True once in `n`.
    fn one_in(&mut self, n: u64) -> bool {
        self.next().is_multiple_of(n)
    }
}

type Endpoint = (Signature, Vec<Option<SimRegion>>);

struct Net {
    nodes: u32,
    rng: Rng,
    memory: Vec<Vec<Vec<u64>>>,
    /// Queue of (source, target) at `source * nodes + target`.
    queues: Vec<VecDeque<Op>>,
    /// How often, in 64ths, the NIC serves each queue when it picks it: some links of a run
    /// are fast and some very slow, which makes long delays and reorderings across nodes
    /// common.
    speed: Vec<u64>,
    joined: HashMap<String, Vec<Option<Endpoint>>>,
}

thread_local! {
    /// The network of the run on this worker (one worker runs a whole simulation).
    static NET: RefCell<Option<Net>> = const { RefCell::new(None) };
    static RUNNING: Cell<usize> = const { Cell::new(0) };
    /// Whether a program panicked: the run stops, naming it, rather than wait for the others.
    static PANICKED: Cell<Option<u32>> = const { Cell::new(None) };
    /// A logical clock: every read of it is later than every earlier one.
    static CLOCK: Cell<u64> = const { Cell::new(0) };
}

fn with<R>(f: impl FnOnce(&mut Net) -> R) -> R {
    NET.with(|net| f(net.borrow_mut().as_mut().expect("a simulation is running")))
}

/// A completion to run once the network is no longer borrowed.
type Ready = Box<dyn FnOnce()>;

impl Net {
    /// Applies one word of a random queue's head; what completed, to be run.
    fn step(&mut self) -> Option<Ready> {
        let mut busy = [0usize; MAX_QUEUES];
        let mut n = 0;
        for (q, queue) in self.queues.iter().enumerate() {
            if !queue.is_empty() {
                busy[n] = q;
                n += 1;
            }
        }
        if n == 0 {
            return None;
        }
        // A slow queue's pick is mostly a step where nothing lands.
        let q = busy[self.rng.below(n)];
        if self.rng.next() % 64 >= self.speed[q] {
            return None;
        }
        let op = self.queues[q].front_mut().expect("a busy queue");
        let words = &mut self.memory[op.region.node as usize][op.region.id];
        let ready: Option<Ready> = match &mut op.kind {
            Kind::Put(data) => {
                if let Some(i) = op.left.pop() {
                    words[op.index + i] = data[i];
                }
                None
            }
            Kind::Get(read, _) => {
                if let Some(i) = op.left.pop() {
                    read[i] = words[op.index + i];
                }
                None
            }
            Kind::Cas(current, new, _) => {
                let w = &mut words[op.index];
                let result = if *w == *current {
                    *w = *new;
                    Ok(*current)
                } else {
                    Err(*w)
                };
                op.left.clear();
                let Some(Op {
                    kind: Kind::Cas(_, _, then),
                    ..
                }) = self.queues[q].pop_front()
                else {
                    unreachable!("the head was a compare-and-exchange")
                };
                return Some(Box::new(move || then(Ok(result))));
            }
            Kind::Fence(_) => None,
        };
        debug_assert!(ready.is_none());
        if !op.left.is_empty() {
            return None;
        }
        match self.queues[q].pop_front().expect("a busy queue").kind {
            Kind::Put(_) => None,
            Kind::Get(read, then) => Some(Box::new(move || then(Ok(read)))),
            Kind::Fence(then) => Some(Box::new(move || then(Ok(())))),
            Kind::Cas(..) => unreachable!("handled above"),
        }
    }

    fn queue(&mut self, source: u32, op: Op) {
        let q = (source * self.nodes + op.region.node) as usize;
        self.queues[q].push_back(op);
    }

    fn order(&mut self, n: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, self.rng.below(i + 1));
        }
        order
    }
}

/// The simulation's time now: a number larger than every earlier one, so that an operation
/// that ended before another began has a smaller stamp (for linearizability checks).
pub(crate) fn now() -> u64 {
    CLOCK.with(|c| {
        c.set(c.get() + 1);
        c.get()
    })
}

/// Lets the NIC act: sometimes, a few steps. Completions run after the network is released.
fn chaos() {
    let ready: Vec<Ready> = with(|net| {
        if !net.rng.one_in(3) {
            return Vec::new();
        }
        let n = 1 + net.rng.below(4);
        (0..n).filter_map(|_| net.step()).collect()
    });
    ready.into_iter().for_each(|f| f());
}

fn check(region: &SimRegion, index: usize, len: usize) -> Result<(), RegionError> {
    match index.checked_add(len) {
        Some(end) if end <= region.len => Ok(()),
        _ => Err(RegionError::OutOfBounds {
            index,
            len,
            region_len: region.len,
        }),
    }
}

impl Sim {
    fn local<R>(&self, region: &SimRegion, f: impl FnOnce(&mut Vec<u64>) -> R) -> R {
        assert_eq!(
            region.node, self.rank,
            "a local access to another node's region"
        );
        chaos();
        with(|net| f(&mut net.memory[region.node as usize][region.id]))
    }

    /// A fresh region of `len` words on `node`, before the programs start.
    pub(crate) fn alloc_on(node: u32, len: usize) -> SimRegion {
        with(|net| {
            let memory = &mut net.memory[node as usize];
            memory.push(vec![0; len]);
            SimRegion {
                node,
                id: memory.len() - 1,
                len,
            }
        })
    }

    fn enqueue(&self, region: &SimRegion, index: usize, kind: Kind, len: usize) {
        with(|net| {
            let left = net.order(len);
            net.queue(
                self.rank,
                Op {
                    region: *region,
                    index,
                    kind,
                    left,
                },
            );
        });
    }
}

impl Fabric for Sim {
    type Region = SimRegion;

    fn rank(&self) -> u32 {
        self.rank
    }

    fn nodes(&self) -> u32 {
        with(|net| net.nodes)
    }

    fn node_of(&self, region: &SimRegion) -> u32 {
        region.node
    }

    fn load(&self, region: &SimRegion, index: usize) -> u64 {
        self.local(region, |w| w[index])
    }

    fn store(&self, region: &SimRegion, index: usize, value: u64) {
        self.local(region, |w| w[index] = value);
    }

    fn swap_local(
        &self,
        region: &SimRegion,
        index: usize,
        current: u64,
        new: u64,
    ) -> Result<u64, u64> {
        self.local(region, |w| {
            if w[index] == current {
                w[index] = new;
                Ok(current)
            } else {
                Err(w[index])
            }
        })
    }

    fn put(&self, region: &SimRegion, index: usize, words: &[u64], then: Then<()>) {
        chaos();
        if let Err(e) = check(region, index, words.len()) {
            return then(Err(e));
        }
        self.enqueue(region, index, Kind::Put(words.to_vec()), words.len());
        // Complete once its words were read: now, whenever it lands.
        then(Ok(()));
    }

    fn get(&self, region: &SimRegion, index: usize, len: usize, then: Then<Vec<u64>>) {
        chaos();
        if let Err(e) = check(region, index, len) {
            return then(Err(e));
        }
        self.enqueue(region, index, Kind::Get(vec![0; len], then), len);
    }

    fn compare_exchange(
        &self,
        region: &SimRegion,
        index: usize,
        current: u64,
        new: u64,
        then: Then<Result<u64, u64>>,
    ) {
        chaos();
        if let Err(e) = check(region, index, 1) {
            return then(Err(e));
        }
        self.enqueue(region, index, Kind::Cas(current, new, then), 1);
    }

    fn fence(&self, node: u32, then: Then<()>) {
        chaos();
        // A fence names a node, not a region: any region of it does as the queue's key.
        let region = SimRegion {
            node,
            id: 0,
            len: 0,
        };
        self.enqueue(&region, 0, Kind::Fence(then), 0);
    }

    fn relax(&self) {
        chaos();
        trust::yield_now();
    }

    fn alloc(&self, len: usize) -> Result<SimRegion, RegionError> {
        Ok(Sim::alloc_on(self.rank, len))
    }

    fn join(
        &self,
        name: &str,
        signature: &Signature,
        mine: Vec<Option<SimRegion>>,
    ) -> Result<Vec<Vec<Option<SimRegion>>>, OpenError> {
        let me = signature
            .members
            .iter()
            .position(|&r| r == self.rank)
            .expect("open checked the members");
        let duplicate = with(|net| {
            let entry = net
                .joined
                .entry(name.to_owned())
                .or_insert_with(|| vec![None; signature.members.len()]);
            if entry.len() != signature.members.len() {
                *entry = vec![None; signature.members.len().max(entry.len())];
            }
            entry[me].replace((signature.clone(), mine)).is_some()
        });
        if duplicate {
            return Err(OpenError::Duplicate {
                name: name.to_owned(),
            });
        }
        // Wait for the others, a bounded number of turns (the simulation's deadline).
        for _ in 0..100_000 {
            let all = with(|net| {
                let entry = &net.joined[name];
                let mut all = Vec::new();
                for (m, slot) in entry.iter().enumerate() {
                    match slot {
                        None => return Ok(None),
                        Some((theirs, _)) if theirs != signature => {
                            return Err(OpenError::Mismatch {
                                name: name.to_owned(),
                                rank: signature.members[m],
                                ours: signature.to_string(),
                                theirs: theirs.to_string(),
                            });
                        }
                        Some((_, regions)) => all.push(regions.clone()),
                    }
                }
                Ok(Some(all))
            })?;
            if let Some(all) = all {
                return Ok(all);
            }
            self.relax();
        }
        let missing = with(|net| {
            net.joined[name]
                .iter()
                .zip(&signature.members)
                .filter(|(slot, _)| slot.is_none())
                .map(|(_, r)| *r)
                .collect()
        });
        Err(OpenError::Missing {
            name: name.to_owned(),
            ranks: missing,
            waited_ms: 0,
        })
    }

    fn leave(&self, _name: &str) {
        // Endpoints live until the run ends: a run opens each name once.
    }
}

/// A program of one node: what it observed, as numbers.
pub(crate) type Program = Box<dyn FnOnce(Sim) -> Vec<u64> + Send>;

/// Runs one program per node under `seed`, in a fiber each, until all end and every queued
/// operation has landed; returns what each observed. `make` allocates the regions the
/// programs share ([`Sim::alloc_on`]) and returns the programs. Must run in a fiber of a
/// one-worker runtime (see [`runtime`]).
pub(crate) fn run(seed: u64, nodes: u32, make: impl FnOnce() -> Vec<Program>) -> Vec<Vec<u64>> {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let speed = (0..nodes * nodes)
        .map(|_| [1, 4, 64, 64][rng.below(4)])
        .collect();
    NET.with(|net| {
        *net.borrow_mut() = Some(Net {
            nodes,
            rng,
            speed,
            memory: vec![Vec::new(); nodes as usize],
            queues: (0..nodes * nodes).map(|_| VecDeque::new()).collect(),
            joined: HashMap::new(),
        })
    });
    let programs = make();
    assert_eq!(programs.len(), nodes as usize);
    assert!(
        (nodes * nodes) as usize <= MAX_QUEUES,
        "a simulation of {nodes} nodes"
    );
    RUNNING.with(|r| r.set(programs.len()));
    let handles: Vec<_> = programs
        .into_iter()
        .enumerate()
        .map(|(rank, program)| {
            trust::spawn(move || {
                /// Counts the program out however it ends.
                struct Ended(u32);
                impl Drop for Ended {
                    fn drop(&mut self) {
                        RUNNING.with(|r| r.set(r.get() - 1));
                        if std::thread::panicking() {
                            PANICKED.with(|p| p.set(Some(self.0)));
                        }
                    }
                }
                let _ended = Ended(rank as u32);
                let sim = Sim { rank: rank as u32 };
                // Start at a random moment.
                for _ in 0..with(|net| net.rng.below(3)) {
                    trust::yield_now();
                }
                program(sim)
            })
        })
        .collect();
    PANICKED.with(|p| p.set(None));
    // The NIC runs beside the programs, so that one waiting for a completion gets it. A run
    // that goes on this long is stuck: the programs wait for one another.
    let mut turns = 0u64;
    while RUNNING.with(Cell::get) > 0 {
        if let Some(rank) = PANICKED.with(Cell::get) {
            panic!(
                "seed {seed}: the program of node {rank} panicked (above); the others are left waiting"
            );
        }
        turns += 1;
        assert!(turns < 10_000_000, "seed {seed}: the programs are stuck");
        let ready: Vec<Ready> = with(|net| {
            let n = net.rng.below(3);
            (0..n).filter_map(|_| net.step()).collect()
        });
        ready.into_iter().for_each(|f| f());
        trust::yield_now();
    }
    let outcomes = handles.into_iter().map(|h| h.join()).collect();
    // Land whatever is still queued, for checks of the final memory.
    loop {
        let Some(ready) =
            with(|net| (!net.queues.iter().all(VecDeque::is_empty)).then(|| net.step()))
        else {
            break;
        };
        if let Some(f) = ready {
            f();
        }
    }
    outcomes
}

/// A runtime of one worker, where every simulation runs.
pub(crate) fn runtime() -> trust::Runtime {
    trust::Runtime::builder()
        .workers(1)
        .build()
        .expect("a one-worker runtime")
}
