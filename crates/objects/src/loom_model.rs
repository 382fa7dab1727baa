//! Loom models of the objects on shared memory: a [`Fabric`] whose regions are loom atomics,
//! with the orderings gossamer's shared-memory regions use (loads acquire, stores release, a
//! put's stores then a full fence, atomics acquire-release), and a loom thread per member.
//! Loom runs the real `Ring` and `Barrier` code under every interleaving and every weak
//! memory behaviour those orderings allow (within a preemption bound), so a missing ordering
//! between a ring's words and its indices, or in the barrier's counts, fails here.
//!
//! `RUSTFLAGS="--cfg loom" cargo test -p objects --lib loom`

use std::collections::HashMap;

use loom::sync::atomic::{AtomicU64, Ordering, fence};
use loom::sync::{Arc, Mutex};

use gossamer::RegionError;

use crate::barrier::Barrier;
use crate::error::OpenError;
use crate::fabric::Fabric;
use crate::object::open_on;
use crate::ring::{Ring, RingParams};
use crate::signature::Signature;
use crate::work::Then;

type Words = Arc<Vec<AtomicU64>>;

/// A region: its node and its words.
#[derive(Clone)]
struct LoomRegion {
    node: u32,
    words: Words,
}

impl std::fmt::Debug for LoomRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LoomRegion({} words on {})", self.words.len(), self.node)
    }
}

type Joined = HashMap<String, Vec<Option<Vec<Option<LoomRegion>>>>>;

#[derive(Clone)]
struct LoomFabric {
    rank: u32,
    nodes: u32,
    joined: Arc<Mutex<Joined>>,
}

impl Fabric for LoomFabric {
    type Region = LoomRegion;

    fn rank(&self) -> u32 {
        self.rank
    }

    fn nodes(&self) -> u32 {
        self.nodes
    }

    fn node_of(&self, region: &LoomRegion) -> u32 {
        region.node
    }

    fn load(&self, region: &LoomRegion, index: usize) -> u64 {
        region.words[index].load(Ordering::Acquire)
    }

    fn store(&self, region: &LoomRegion, index: usize, value: u64) {
        region.words[index].store(value, Ordering::Release);
    }

    fn swap_local(
        &self,
        region: &LoomRegion,
        index: usize,
        current: u64,
        new: u64,
    ) -> Result<u64, u64> {
        region.words[index].compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
    }

    fn put(&self, region: &LoomRegion, index: usize, words: &[u64], then: Then<()>) {
        for (to, w) in region.words[index..index + words.len()].iter().zip(words) {
            to.store(*w, Ordering::Release);
        }
        fence(Ordering::SeqCst);
        then(Ok(()));
    }

    fn get(&self, region: &LoomRegion, index: usize, len: usize, then: Then<Vec<u64>>) {
        let words = region.words[index..index + len]
            .iter()
            .map(|w| w.load(Ordering::Acquire))
            .collect();
        then(Ok(words));
    }

    fn compare_exchange(
        &self,
        region: &LoomRegion,
        index: usize,
        current: u64,
        new: u64,
        then: Then<Result<u64, u64>>,
    ) {
        then(Ok(self.swap_local(region, index, current, new)));
    }

    fn fence(&self, _node: u32, then: Then<()>) {
        fence(Ordering::SeqCst);
        then(Ok(()));
    }

    fn relax(&self) {
        loom::thread::yield_now();
    }

    fn alloc(&self, len: usize) -> Result<LoomRegion, RegionError> {
        Ok(LoomRegion {
            node: self.rank,
            words: Arc::new((0..len).map(|_| AtomicU64::new(0)).collect()),
        })
    }

    fn join(
        &self,
        name: &str,
        signature: &Signature,
        mine: Vec<Option<LoomRegion>>,
    ) -> Result<Vec<Vec<Option<LoomRegion>>>, OpenError> {
        let me = signature
            .members
            .iter()
            .position(|&r| r == self.rank)
            .expect("open checked the members");
        let n = signature.members.len();
        self.joined
            .lock()
            .unwrap()
            .entry(name.to_owned())
            .or_insert_with(|| vec![None; n])[me] = Some(mine);
        loop {
            let all: Option<Vec<_>> = self.joined.lock().unwrap()[name].iter().cloned().collect();
            if let Some(all) = all {
                return Ok(all);
            }
            loom::thread::yield_now();
        }
    }

    fn leave(&self, _name: &str) {}
}

fn fabrics(nodes: u32) -> Vec<LoomFabric> {
    let joined = Arc::new(Mutex::new(HashMap::new()));
    (0..nodes)
        .map(|rank| LoomFabric {
            rank,
            nodes,
            joined: joined.clone(),
        })
        .collect()
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    builder.check(f);
}

/// A ring of 4 words and three messages of 1 word (2 words each): the writer wraps around and
/// finds the ring full until the reader returns space; the reader gets each message once, in
/// order, never a word of the next one.
#[test]
fn loom_ring_indices_order_words_and_space() {
    model(|| {
        let mut f = fabrics(2).into_iter();
        let (fw, fr) = (f.next().unwrap(), f.next().unwrap());
        let params = RingParams {
            writer: 0,
            capacity: 4,
        };
        let writer = loom::thread::spawn(move || {
            let ring = open_on::<LoomFabric, Ring<LoomFabric>>(&fw, "r", &params, &[0, 1]);
            let mut w = ring.expect("open").writer().expect("the writer");
            for m in 1..=3u64 {
                w.send(&m.to_le_bytes()).expect("send");
            }
        });
        let ring = open_on::<LoomFabric, Ring<LoomFabric>>(&fr, "r", &params, &[0, 1]);
        let mut r = ring.expect("open").reader().expect("a reader");
        for m in 1..=3u64 {
            assert_eq!(r.recv().expect("recv"), m.to_le_bytes());
        }
        writer.join().unwrap();
    });
}

/// Two members each put 1 into the other's word, pass a fenced barrier, and read their own:
/// both see 1.
#[test]
fn loom_barrier_lands_puts() {
    model(|| {
        let mut f = fabrics(2).into_iter();
        let (f0, f1) = (f.next().unwrap(), f.next().unwrap());
        let x = f0.alloc(1).unwrap();
        let y = f1.alloc(1).unwrap();
        let side = |f: LoomFabric, mine: LoomRegion, theirs: LoomRegion| {
            move || {
                let mut b = open_on::<LoomFabric, Barrier<LoomFabric>>(&f, "b", &(), &[0, 1])
                    .expect("open");
                f.put(&theirs, 0, &[1], Box::new(|r| r.unwrap()));
                b.wait().expect("barrier");
                assert_eq!(f.load(&mine, 0), 1);
            }
        };
        let other = loom::thread::spawn(side(f1, y.clone(), x.clone()));
        side(f0, x, y)();
        other.join().unwrap();
    });
}
