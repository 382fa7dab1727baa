//! Citron (seed 002 §3.2, after Gao et al., FAST'23): a client-side range lock on one-sided
//! regions. The server node only hosts the words; every step is a client's `get`,
//! `fetch_add` or `compare_exchange`.
//!
//! # The tree
//! A fixed 4-ary tree over the units, one 64-bit word per node, stored in heap order (root
//! 0, the children of `n` are `4n+1..=4n+4`, so a node's descendants at one depth are a
//! contiguous run of words and every ancestor has a smaller index than its descendants). A
//! leaf covers 64 units; the tree is as deep as needed for `units` (2¹⁶ units: 1024 leaves
//! at depth 5 under 1 + 4 + 16 + 64 + 256 internal nodes).
//!
//! An internal node's word (its fields are laid out so that no addition carries into a
//! neighbour, see *Wraparound*):
//!
//! | bits   | field                                                              |
//! |--------|--------------------------------------------------------------------|
//! | 0..31  | D: descendants present (the D bakery's ticket − serving)           |
//! | 31     | occupied: the whole node is locked                                 |
//! | 32..48 | T serving                                                          |
//! | 48..64 | T ticket                                                           |
//!
//! A leaf ([`Leaves::Bitmaps`]) is a bitmap, one bit per unit. With [`Leaves::AllInternal`]
//! (the seed's re-implementation) a leaf has the internal layout and is always locked whole,
//! even for part of its units.
//!
//! A request is split into a cover: greedily, the highest nodes wholly inside the range, and
//! for a partly covered leaf the leaf with a mask of its units (not the paper's
//! tree-knapsack). The pieces are taken one at a time from left to right (by their units;
//! see *Deadlock freedom* for why not by node index). Citron has no shared mode: every
//! request is exclusive and `mode` is ignored.
//!
//! # Taking a node `n`
//! Notified set `N(n)`: the ancestors every `M` layers above `n` (depths `d-M`, `d-2M`, …).
//! Polled set `P(n)`: the descendants of `n` within `M` layers (depths `d+1..=d+M`).
//! - Internal node (and every node with `AllInternal`):
//!   1. T ticket (`fetch_add` into the top field); wait (reads) until T serving shows it.
//!      The turn makes this client the only one touching `n`'s occupied bit and T serving.
//!   2. *Announce*, one batch: set `n`'s occupied bit and add 1 to D of each node of `N(n)`.
//!   3. *Look*, one batch issued after 2 completed: read every ancestor of `n` and `P(n)`.
//!      An occupied ancestor: *back off* (below). Else, while some node of `P(n)` is
//!      occupied, has D ≠ 0 or (a bitmap leaf) any bit set, read `P(n)` again.
//! - Leaf with [`Leaves::Bitmaps`]:
//!   1. *Announce*, one batch: add 1 to D of each node of `N(n)`, and set the unit bits with
//!      a masked compare-and-swap. Regions have only full-word `compare_exchange`, so it is
//!      emulated: CAS `old → old | mask` with a guess of `old` (first 0); on failure, if
//!      none of my bits is set in what the word holds, CAS again from that; if some is, read
//!      the word (with backoff) until none is.
//!   2. *Look*: read every ancestor; an occupied one: back off.
//!
//! *Back off*: undo the announce of the piece at hand (clear what it set, subtract its D
//! notes, and pass the T turn on), release every piece already held, wait (holding nothing)
//! until that ancestor reads unoccupied, and start the request again. *Unlock* is the same
//! undo for every held piece, in one batch: subtract 1 from D of `N(n)`, and either clear
//! the leaf bits or clear occupied and advance T serving.
//!
//! # Mutual exclusion
//! Two requests conflict only through two pieces: the same node (internal: the T turn
//! admits one holder at a time; bitmap leaf: the emulated masked CAS sets bits only when
//! none of them is set), or a node `a` and a node `b` strictly below it. For the latter,
//! each side *writes* (announce) and, only once that has completed, *reads* (look). The
//! region docs promise that a completed atomic has taken effect, so the four events fall in
//! one order and it is a Dekker handshake: if `b`'s locker read `a` as unoccupied, its read
//! came before `a`'s announce, so its own announce came before `a`'s locker's look. That
//! look then sees `b`'s locker, until that one has left:
//! - `b` within `M` layers below `a` is in `P(a)`: its occupied bit or leaf bits are read
//!   directly.
//! - `b` deeper: the depths `d(b) - kM` meet the `M` depths of `P(a)` exactly once (and
//!   above `b`), so one node `x` of `N(b)` is in `P(a)`, and its D counts `b`'s locker
//!   from its announce until its unlock or back off.
//!
//! `a`'s locker keeps polling until `P(a)` is empty of both, so it is granted only after
//! `b`'s locker has left; if instead `b`'s locker saw `a` occupied, it backs off. Either way
//! the two never hold at once. An occupied bit or D note that is about to be withdrawn
//! (a backing-off locker) only delays others.
//!
//! # Deadlock freedom
//! Ancestors wait for descendants; descendants that meet an occupied ancestor never wait
//! for it while holding anything (they release everything, including the T turn). Rank a
//! client by its current piece's (first unit, depth). The remaining waits go from a client
//! at piece `c` (waiting on a T turn of `c`, on leaf bits of `c`, or on `P(c)`) to a client
//! holding or announcing a piece nested in `c`; as pieces are taken left to right, that
//! client's current piece ranks higher, or equal only for the T turn, whose holder is past
//! its T wait: no cycle of waits.
//!
//! Back offs cannot chase each other in a cycle either: if each of `k` clients holds `hᵢ`
//! and backs off at `cᵢ` (right of `hᵢ`) because `cᵢ` lies under `hᵢ₊₁`, then `hᵢ₊₁`, apart
//! from `hᵢ` and reaching right of it, lies wholly right of `hᵢ`, so `h₁ < h₂ < … < h₁`.
//! Node-index order (tried first) allows exactly such a pair: A holds a quarter and backs
//! off at a leaf under B's depth-2 node, while B, holding that node, backs off at a leaf
//! under A's quarter; the test saw them retry in step forever. Starvation remains possible
//! (a descendant may keep backing off; the seed reports starvation for its Citron too).
//!
//! # Wraparound
//! A masked fetch-and-add is emulated by laying the fields so that no carry or borrow ever
//! reaches a neighbour, keeping each node in one 8-byte word (RDMA atomics are 8 bytes, and
//! one read sees a node whole):
//! - T ticket sits in the top 16 bits: the carry of its wrap leaves the word. Tickets are
//!   compared with serving as 16-bit values, right while fewer than 2¹⁶ lockers queue on a
//!   node.
//! - T serving and occupied change only under the T turn, whose holder knows their values
//!   (serving = its ticket, occupied = 1), so it adds exactly what makes serving
//!   `ticket + 1 mod 2¹⁶` and occupied 0.
//! - The D bakery is kept as its difference (ticket − serving), the only thing ever asked
//!   of it (`serving == ticket` is `D == 0`). It counts lockers present below, each adding
//!   1 and later subtracting 1 after its add completed, so it never goes below 0 or near
//!   2³¹: it cannot wrap.
//! - A bitmap leaf's bits are set by CAS and cleared by adding `-mask`: all of `mask` is
//!   set and only their owner clears them, so no borrow.
//!
//! # Round trips
//! `trips` counts batches waited on (operations issued together and then waited together
//! count 1), lock and unlock alike. Uncontended: 2 per bitmap leaf piece (announce, look),
//! 3 per internal piece (T ticket, announce, look); every further T poll, leaf re-CAS or
//! read, or `P(n)` poll costs 1; a back off costs 1 for the undo plus 1 per poll of the
//! ancestor. Unlock is 1 batch for the whole request (it is waited on, so it has landed).
//!
//! `M` = 2: with 2¹⁶ units a leaf notifies depths 3 and 1, and the root polls 4 + 16 words.

use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use gossamer::{Done, Node, Region};
use rangelock::Mode;
use serde::{Deserialize, Serialize};

/// Units per leaf: one bit each of a bitmap word.
const LEAF_UNITS: u64 = 64;
/// Layers between the ancestors a node notifies, and how deep a locker polls below its node.
const M: u32 = 2;

/// One descendant present (D field, bits 0..31).
const D_ONE: u64 = 1;
const D_MASK: u64 = (1 << 31) - 1;
const OCCUPIED: u64 = 1 << 31;
const SERVING_SHIFT: u32 = 32;
const TICKET_SHIFT: u32 = 48;
const FIELD: u64 = 0xFFFF;

/// How leaves lock their units.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub(crate) enum Leaves {
    /// Leaf bitmaps, one bit per unit, set with a masked compare-and-swap (emulated: regions
    /// have none).
    Bitmaps,
    /// The seed's variant: every node is internal; a leaf is locked whole.
    AllInternal,
}

/// The lock's words, on the server node.
// Until the benchmark (`mod.rs`) runs it, only the tests use it.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct Citron {
    words: Region,
    units: u64,
    /// Depth of the leaves (the root's is 0).
    leaf_depth: u32,
    leaves: Leaves,
}

/// What a client holds: enough to release it.
pub(crate) struct CitronHeld {
    held: Vec<Held>,
}

/// One piece of a request's cover.
#[derive(Clone, Copy, Debug)]
struct Piece {
    node: usize,
    /// The units to set in a bitmap leaf; `None`: the whole node, by its T turn.
    bits: Option<u64>,
}

/// A piece taken (or announced, while backing off).
#[derive(Clone, Copy, Debug)]
struct Held {
    node: usize,
    how: How,
}

#[derive(Clone, Copy, Debug)]
enum How {
    /// These bits of a bitmap leaf.
    Bits(u64),
    /// The node's T turn with this ticket, occupied set.
    Turn(u64),
}

/// First node index at `depth`.
fn level_start(depth: u32) -> usize {
    ((1usize << (2 * depth)) - 1) / 3
}

fn depth_of(node: usize) -> u32 {
    let mut d = 0;
    while level_start(d + 1) <= node {
        d += 1;
    }
    d
}

fn parent(node: usize) -> usize {
    (node - 1) / 4
}

/// What to add to a T word, under the turn of `ticket`, to clear occupied and serve the
/// next ticket: exact, since the holder knows both fields (no carry into T ticket).
fn pass_turn(ticket: u64) -> u64 {
    let next = (ticket + 1) & FIELD;
    (next << SERVING_SHIFT)
        .wrapping_sub(ticket << SERVING_SHIFT)
        .wrapping_sub(OCCUPIED)
}

/// Polls with growing pauses; only the calling fiber waits.
#[derive(Default)]
struct Backoff(u32);

impl Backoff {
    fn pause(&mut self) {
        self.0 += 1;
        let micros = if self.0 < 4 {
            0
        } else {
            1u64 << (self.0 - 4).min(5)
        };
        let until = Instant::now() + Duration::from_micros(micros);
        loop {
            gossamer::yield_now();
            if Instant::now() >= until {
                break;
            }
        }
    }
}

/// The result of a region operation: errors here are bugs of the lock.
fn ok<T>(done: Done<T>) -> T {
    done.wait()
        .expect("a Citron region operation failed (bug: bad index or a freed region)")
}

/// Counts one waited batch. In tests, other fibers run here as they would during a round
/// trip, so that shared memory (where every operation completes at once) still interleaves
/// clients between the steps.
fn trip(trips: &mut u64) {
    *trips += 1;
    if cfg!(test) {
        gossamer::yield_now();
    }
}

impl Citron {
    /// A lock over `0..units` whose words live in a region on `node`.
    pub(crate) fn new(node: Node, units: u64, leaves: Leaves) -> anyhow::Result<Citron> {
        anyhow::ensure!(units > 0, "a Citron lock needs at least one unit");
        let mut leaf_depth = 0;
        while LEAF_UNITS << (2 * leaf_depth) < units {
            leaf_depth += 1;
        }
        let words = node
            .region(level_start(leaf_depth + 1))
            .map_err(|e| anyhow!("Citron's words on node {}: {e}", node.rank()))?;
        Ok(Citron {
            words,
            units,
            leaf_depth,
            leaves,
        })
    }

    /// Takes `range` in `mode`, waiting (this fiber only) until granted. `trips` counts the
    /// round trips the client waited on.
    pub(crate) fn lock(&self, range: Range<u64>, mode: Mode, trips: &mut u64) -> CitronHeld {
        // Citron has no shared mode: every request is exclusive.
        let _ = mode;
        assert!(
            range.start <= range.end && range.end <= self.units,
            "range {range:?} outside the lock's 0..{}",
            self.units
        );
        let pieces = self.cover(&range);
        loop {
            let mut held = Vec::with_capacity(pieces.len());
            let mut blocked = None;
            for &piece in &pieces {
                match self.take(piece, trips) {
                    Ok(h) => held.push(h),
                    Err(ancestor) => {
                        blocked = Some(ancestor);
                        break;
                    }
                }
            }
            let Some(ancestor) = blocked else {
                return CitronHeld { held };
            };
            self.release(&held, trips);
            self.wait_unoccupied(ancestor, trips);
        }
    }

    /// Releases what `lock` took.
    pub(crate) fn unlock(&self, held: CitronHeld, trips: &mut u64) {
        self.release(&held.held, trips);
    }

    /// After every client has released: an error unless every segment is free and balanced.
    pub(crate) fn check_idle(&self) -> anyhow::Result<()> {
        let words = ok(self.words.get(0, self.words.len()));
        for (node, &w) in words.iter().enumerate() {
            let units = self.units_of(node);
            if self.is_bitmap(node) {
                if w != 0 {
                    bail!("leaf {node} (units {units:?}) still has bits {w:#x} set");
                }
                continue;
            }
            let (ticket, serving) = ((w >> TICKET_SHIFT) & FIELD, (w >> SERVING_SHIFT) & FIELD);
            if ticket != serving {
                bail!("node {node} (units {units:?}): T ticket {ticket} but T serving {serving}");
            }
            if w & D_MASK != 0 {
                bail!(
                    "node {node} (units {units:?}): D unbalanced by {}",
                    w & D_MASK
                );
            }
            if w & OCCUPIED != 0 {
                bail!("node {node} (units {units:?}) is still occupied");
            }
        }
        Ok(())
    }

    /// Whether `node`'s word is a bitmap.
    fn is_bitmap(&self, node: usize) -> bool {
        self.leaves == Leaves::Bitmaps && depth_of(node) == self.leaf_depth
    }

    /// The units `node` covers.
    fn units_of(&self, node: usize) -> Range<u64> {
        let depth = depth_of(node);
        let width = LEAF_UNITS << (2 * (self.leaf_depth - depth));
        let start = (node - level_start(depth)) as u64 * width;
        start..start + width
    }

    /// The pieces covering `range` exactly (units) or, with `AllInternal`, its partly
    /// covered leaves whole; left to right, the order they are taken in (module docs).
    fn cover(&self, range: &Range<u64>) -> Vec<Piece> {
        let mut out = Vec::new();
        if !range.is_empty() {
            self.cover_under(0, range, &mut out);
        }
        out
    }

    fn cover_under(&self, node: usize, range: &Range<u64>, out: &mut Vec<Piece>) {
        let units = self.units_of(node);
        if units.end <= range.start || units.start >= range.end {
            return;
        }
        let whole = range.start <= units.start && units.end <= range.end;
        if self.is_bitmap(node) {
            let (lo, hi) = (
                range.start.max(units.start) - units.start,
                range.end.min(units.end) - units.start,
            );
            let bits = (u64::MAX >> (64 - (hi - lo))) << lo;
            out.push(Piece {
                node,
                bits: Some(bits),
            });
        } else if whole || depth_of(node) == self.leaf_depth {
            out.push(Piece { node, bits: None });
        } else {
            for child in 4 * node + 1..=4 * node + 4 {
                self.cover_under(child, range, out);
            }
        }
    }

    /// Every ancestor of `node`, nearest first.
    fn ancestors(node: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut n = node;
        while n > 0 {
            n = parent(n);
            out.push(n);
        }
        out
    }

    /// `N(node)`: the ancestors `M`, `2M`, … layers above it.
    fn notified(node: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let (mut n, mut depth) = (node, depth_of(node));
        while depth >= M {
            for _ in 0..M {
                n = parent(n);
            }
            depth -= M;
            out.push(n);
        }
        out
    }

    /// `P(node)` as runs of words: its descendants at each of the `M` depths below it.
    fn polled(&self, node: usize) -> Vec<(usize, usize)> {
        let depth = depth_of(node);
        let offset = node - level_start(depth);
        (1..=M)
            .take_while(|k| depth + k <= self.leaf_depth)
            .map(|k| (level_start(depth + k) + (offset << (2 * k)), 1 << (2 * k)))
            .collect()
    }

    /// Whether the words read from `P(node)` show no locker below it.
    fn clear_below(&self, runs: &[(usize, usize)], words: &[Vec<u64>]) -> bool {
        runs.iter().zip(words).all(|(&(first, _), run)| {
            if self.is_bitmap(first) {
                run.iter().all(|&w| w == 0)
            } else {
                run.iter().all(|&w| w & (OCCUPIED | D_MASK) == 0)
            }
        })
    }

    fn read(&self, node: usize, trips: &mut u64) -> u64 {
        let w = ok(self.words.get(node, 1))[0];
        trip(trips);
        w
    }

    /// Takes one piece; `Err(ancestor)` when an occupied ancestor made it back off (the
    /// piece is undone then).
    fn take(&self, piece: Piece, trips: &mut u64) -> Result<Held, usize> {
        match piece.bits {
            Some(bits) => self.take_bits(piece.node, bits, trips),
            None => self.take_turn(piece.node, trips),
        }
    }

    fn take_turn(&self, node: usize, trips: &mut u64) -> Result<Held, usize> {
        let mut word = ok(self.words.fetch_add(node, 1 << TICKET_SHIFT));
        trip(trips);
        let ticket = (word >> TICKET_SHIFT) & FIELD;
        let mut backoff = Backoff::default();
        while (word >> SERVING_SHIFT) & FIELD != ticket {
            backoff.pause();
            word = self.read(node, trips);
        }
        // Our turn: the previous holder cleared occupied when it passed the turn on.
        let occupy = self.words.fetch_add(node, OCCUPIED);
        self.announce(node, occupy, trips);
        let held = Held {
            node,
            how: How::Turn(ticket),
        };
        let (ancestor, mut clear) = self.look(node, trips);
        if let Some(a) = ancestor {
            self.release(&[held], trips);
            return Err(a);
        }
        let mut backoff = Backoff::default();
        while !clear {
            backoff.pause();
            clear = self.poll_below(node, trips);
        }
        Ok(held)
    }

    fn take_bits(&self, leaf: usize, bits: u64, trips: &mut u64) -> Result<Held, usize> {
        let set = self.words.compare_exchange(leaf, 0, bits);
        let mut seen = self.announce(leaf, set, trips);
        let mut backoff = Backoff::default();
        // The masked CAS, emulated: retry from what the word holds while none of our bits is
        // set there; wait while some is.
        while let Err(w) = seen {
            seen = if w & bits == 0 {
                let r = ok(self.words.compare_exchange(leaf, w, w | bits));
                trip(trips);
                r
            } else {
                backoff.pause();
                Err(self.read(leaf, trips))
            };
        }
        let held = Held {
            node: leaf,
            how: How::Bits(bits),
        };
        if let (Some(a), _) = self.look(leaf, trips) {
            self.release(&[held], trips);
            return Err(a);
        }
        Ok(held)
    }

    /// Announce: `mark` (the operation on the node itself, already issued) and a D note on
    /// every notified ancestor, waited on together.
    fn announce<T>(&self, node: usize, mark: Done<T>, trips: &mut u64) -> T {
        let notes: Vec<Done<u64>> = Self::notified(node)
            .into_iter()
            .map(|x| self.words.fetch_add(x, D_ONE))
            .collect();
        let marked = ok(mark);
        notes.into_iter().for_each(|n| {
            ok(n);
        });
        trip(trips);
        marked
    }

    /// Look (after the announce completed): the first occupied ancestor, if any, and whether
    /// `P(node)` is clear; one batch.
    fn look(&self, node: usize, trips: &mut u64) -> (Option<usize>, bool) {
        let ancestors = Self::ancestors(node);
        let above: Vec<Done<Vec<u64>>> = ancestors.iter().map(|&a| self.words.get(a, 1)).collect();
        let runs = self.polled(node);
        let below: Vec<Done<Vec<u64>>> = runs
            .iter()
            .map(|&(first, len)| self.words.get(first, len))
            .collect();
        let above: Vec<u64> = above.into_iter().map(|d| ok(d)[0]).collect();
        let below: Vec<Vec<u64>> = below.into_iter().map(ok).collect();
        trip(trips);
        let occupied = ancestors
            .iter()
            .zip(&above)
            .find(|(_, w)| *w & OCCUPIED != 0)
            .map(|(&a, _)| a);
        (occupied, self.clear_below(&runs, &below))
    }

    /// Reads `P(node)` again: whether it is clear.
    fn poll_below(&self, node: usize, trips: &mut u64) -> bool {
        let runs = self.polled(node);
        let below: Vec<Done<Vec<u64>>> = runs
            .iter()
            .map(|&(first, len)| self.words.get(first, len))
            .collect();
        let below: Vec<Vec<u64>> = below.into_iter().map(ok).collect();
        trip(trips);
        self.clear_below(&runs, &below)
    }

    /// Undoes `held` in one batch: D notes withdrawn, bits cleared or the turn passed on.
    fn release(&self, held: &[Held], trips: &mut u64) {
        if held.is_empty() {
            return;
        }
        let mut batch = Vec::new();
        for h in held {
            for x in Self::notified(h.node) {
                batch.push(self.words.fetch_add(x, D_ONE.wrapping_neg()));
            }
            let undo = match h.how {
                How::Bits(bits) => bits.wrapping_neg(),
                How::Turn(ticket) => pass_turn(ticket),
            };
            batch.push(self.words.fetch_add(h.node, undo));
        }
        batch.into_iter().for_each(|d| {
            ok(d);
        });
        trip(trips);
    }

    /// Waits, holding nothing, until `ancestor` is not occupied.
    fn wait_unoccupied(&self, ancestor: usize, trips: &mut u64) {
        let mut backoff = Backoff::default();
        while self.read(ancestor, trips) & OCCUPIED != 0 {
            backoff.pause();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    use super::*;
    use crate::rack::Rng;

    const FIBERS: u64 = 16;
    const ROUNDS: u64 = 300;
    const PATIENCE: Duration = Duration::from_secs(60);

    /// Claims `range` in the shadow for `tag`, panicking if any unit is someone else's.
    fn claim(shadow: &[AtomicU64], range: &Range<u64>, tag: u64) {
        for u in range.clone() {
            if let Err(other) =
                shadow[u as usize].compare_exchange(0, tag, Ordering::SeqCst, Ordering::SeqCst)
            {
                panic!(
                    "unit {u} held by two clients ({} and {})",
                    other - 1,
                    tag - 1
                );
            }
        }
    }

    fn unclaim(shadow: &[AtomicU64], range: &Range<u64>, tag: u64) {
        for u in range.clone() {
            let was = shadow[u as usize].swap(0, Ordering::SeqCst);
            assert_eq!(
                was,
                tag,
                "unit {u} changed hands while client {} held it",
                tag - 1
            );
        }
    }

    /// A random range: mostly of length 1..=512, some aligned to a node, a few whole high
    /// nodes (to race ancestors against descendants).
    fn pick(rng: &mut Rng, units: u64) -> Range<u64> {
        let kind = rng.below(100);
        let width = match kind {
            0..=69 => {
                let len = 1 + rng.below(512);
                let start = rng.below(units - len + 1);
                return start..start + len;
            }
            70..=89 => LEAF_UNITS << (2 * rng.below(2)),
            _ => units >> (2 * (1 + rng.below(2))),
        };
        let start = rng.below(units / width) * width;
        start..start + width
    }

    fn stress(leaves: Leaves, units: u64) {
        let lock = Citron::new(gossamer::this_node(), units, leaves).expect("the lock's region");
        let shadow: Arc<Vec<AtomicU64>> = Arc::new((0..units).map(|_| AtomicU64::new(0)).collect());
        let finished = Arc::new(AtomicUsize::new(0));
        let wanting: Arc<Vec<std::sync::Mutex<Option<Range<u64>>>>> =
            Arc::new((0..FIBERS).map(|_| std::sync::Mutex::new(None)).collect());
        let fibers: Vec<_> = (0..FIBERS)
            .map(|f| {
                let (lock, shadow, finished) = (lock.clone(), shadow.clone(), finished.clone());
                let wanting = wanting.clone();
                gossamer::spawn(move || {
                    let mut rng = Rng::new(units + f * 7919 + 1);
                    let mut trips = 0;
                    for round in 0..ROUNDS {
                        let range = pick(&mut rng, units);
                        let mode = if round % 2 == 0 {
                            Mode::Write
                        } else {
                            Mode::Read
                        };
                        *wanting[f as usize].lock().unwrap() = Some(range.clone());
                        let held = lock.lock(range.clone(), mode, &mut trips);
                        *wanting[f as usize].lock().unwrap() = None;
                        claim(&shadow, &range, f + 1);
                        for _ in 0..1 + rng.below(3) {
                            gossamer::yield_now();
                        }
                        unclaim(&shadow, &range, f + 1);
                        lock.unlock(held, &mut trips);
                    }
                    finished.fetch_add(1, Ordering::SeqCst);
                    trips
                })
            })
            .collect();
        let deadline = Instant::now() + PATIENCE;
        while finished.load(Ordering::SeqCst) < FIBERS as usize {
            if Instant::now() >= deadline {
                let words = ok(lock.words.get(0, lock.words.len()));
                for (n, w) in words.iter().enumerate() {
                    if *w != 0 {
                        eprintln!("node {n} depth {} word {w:#018x}", depth_of(n));
                    }
                }
                for (f, w) in wanting.iter().enumerate() {
                    let w = w.lock().unwrap().clone();
                    if let Some(r) = w {
                        eprintln!("fiber {f} wants {r:?}: {:?}", lock.cover(&r));
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "{leaves:?} over {units} units: only {} of {FIBERS} clients finished their \
                 {ROUNDS} lock/unlock rounds within {PATIENCE:?}",
                finished.load(Ordering::SeqCst)
            );
            gossamer::yield_now();
        }
        let trips: u64 = fibers.into_iter().map(|h| h.join()).sum();
        assert!(
            trips >= FIBERS * ROUNDS * 3,
            "too few trips counted: {trips}"
        );
        lock.check_idle()
            .unwrap_or_else(|e| panic!("{leaves:?} over {units} units not idle: {e}"));
    }

    /// Uncontended costs: a bitmap leaf piece is 2 trips, an internal piece 3, unlock 1.
    fn trips_alone(leaves: Leaves) {
        let lock = Citron::new(gossamer::this_node(), 1 << 12, leaves).expect("the region");
        let mut trips = 0;
        let held = lock.lock(0..10, Mode::Write, &mut trips);
        let leaf = if leaves == Leaves::Bitmaps { 2 } else { 3 };
        assert_eq!(trips, leaf);
        lock.unlock(held, &mut trips);
        assert_eq!(trips, leaf + 1);
        // 0..256 is one node one layer above the leaves.
        let mut trips = 0;
        let held = lock.lock(0..256, Mode::Write, &mut trips);
        assert_eq!(trips, 3);
        lock.unlock(held, &mut trips);
        lock.check_idle().expect("idle");
    }

    #[test]
    fn excludes_and_ends_idle_in_both_variants() {
        let _turn = crate::harness::one_rack_at_a_time();
        let code = gossamer::Rack::from_env()
            .workers(1)
            .try_run(|| {
                fields_never_carry();
                for leaves in [Leaves::Bitmaps, Leaves::AllInternal] {
                    trips_alone(leaves);
                    for units in [1 << 12, 1 << 16] {
                        stress(leaves, units);
                    }
                }
            })
            .expect("the rack starts");
        assert_eq!(code, 0, "the rack's main panicked (see stderr)");
    }

    /// The packed fields: no addition reaches a neighbour.
    fn fields_never_carry() {
        // Serving wraps from 0xFFFF to 0 without touching the ticket above it.
        let word = (5u64 << TICKET_SHIFT) | (FIELD << SERVING_SHIFT) | OCCUPIED | 3;
        let after = word.wrapping_add(pass_turn(FIELD));
        assert_eq!(after, (5u64 << TICKET_SHIFT) | 3);
        // The ticket's carry leaves the word.
        let full = FIELD << TICKET_SHIFT;
        assert_eq!(full.wrapping_add(1 << TICKET_SHIFT), 0);
    }
}
