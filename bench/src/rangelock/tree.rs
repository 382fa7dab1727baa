//! The interval-tree server (seed 002 §5.1): handler threads on the server, each serving its
//! clients' calls ("a thread per connection"), all sharing one tree of held ranges behind one
//! mutex. A lock call is granted at once or refused; a refused client asks again (grant or
//! poll): the server keeps no queue, so nothing orders waiters.
//!
//! Here a handler is a property on one worker of the server node, and a client's calls go to
//! the handler of its number modulo the handler count: the same lanes as the trustee's, so
//! the comparison isolates the design (a shared tree under a mutex against a combiner). The
//! seed's tree was a red-black tree; this one is a B-tree (`BTreeMap`) keyed by start, with
//! the held lengths in a multiset so that an overlap query scans only starts that can reach
//! the range.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use gossamer::{Node, Trust};
use rangelock::Mode;
use serde::{Deserialize, Serialize};

/// Held ranges; what every handler shares.
#[derive(Default)]
struct Tree {
    /// (start, id) → (end, mode).
    held: BTreeMap<(u64, u64), (u64, Mode)>,
    /// Held lengths, counted: the longest bounds how far left an overlapping range starts.
    lengths: BTreeMap<u64, usize>,
    /// id → start, to find a range again at unlock.
    starts: HashMap<u64, u64>,
    next: u64,
}

impl Tree {
    /// Inserts `range` if nothing held conflicts with it (overlaps, and one is a write).
    fn try_lock(&mut self, range: Range<u64>, mode: Mode) -> Option<u64> {
        let longest = self.lengths.last_key_value().map_or(0, |(&l, _)| l);
        let from = range.start.saturating_sub(longest);
        let conflict = self
            .held
            .range((from, 0)..(range.end, 0))
            .any(|(_, &(end, held))| {
                end > range.start && (mode == Mode::Write || held == Mode::Write)
            });
        if conflict {
            return None;
        }
        self.next += 1;
        let id = self.next;
        self.held.insert((range.start, id), (range.end, mode));
        *self.lengths.entry(range.end - range.start).or_default() += 1;
        self.starts.insert(id, range.start);
        Some(id)
    }

    fn unlock(&mut self, id: u64) {
        let start = self
            .starts
            .remove(&id)
            .unwrap_or_else(|| panic!("interval tree: unlock of {id}, which is not held"));
        let (end, _) = self.held.remove(&(start, id)).expect("held with its start");
        let length = end - start;
        match self.lengths.get_mut(&length) {
            Some(1) => {
                self.lengths.remove(&length);
            }
            Some(n) => *n -= 1,
            None => unreachable!("every held length is counted"),
        }
    }
}

/// The tree of this process: a server serves one interval-tree lock (one per rack).
fn shared() -> Arc<Mutex<Tree>> {
    static TREE: OnceLock<Arc<Mutex<Tree>>> = OnceLock::new();
    TREE.get_or_init(Arc::default).clone()
}

/// One handler: a way into the shared tree from one server thread.
pub(crate) struct Handler {
    tree: Arc<Mutex<Tree>>,
}

fn handler(_: ()) -> Handler {
    Handler { tree: shared() }
}

fn try_lock(h: &mut Handler, (range, mode): (Range<u64>, Mode)) -> Option<u64> {
    h.tree.lock().expect("tree").try_lock(range, mode)
}

fn unlock(h: &mut Handler, id: u64) {
    h.tree.lock().expect("tree").unlock(id);
}

fn held(h: &mut Handler, (): ()) -> usize {
    h.tree.lock().expect("tree").held.len()
}

/// The server's handlers, as clients reach them.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct TreeServer {
    handlers: Vec<Trust<Handler>>,
}

/// What a client holds: its handler and the range's id.
pub(crate) struct TreeHeld {
    handler: usize,
    id: u64,
}

impl TreeServer {
    /// One handler on each of `threads` workers of `node` (which must have that many).
    pub(crate) fn new(node: Node, threads: u32) -> anyhow::Result<TreeServer> {
        anyhow::ensure!(
            node.workers() >= threads,
            "the interval-tree server wants {threads} workers; node {} has {}",
            node.rank(),
            node.workers()
        );
        let handlers = (0..threads)
            .map(|w| node.trustee(w).entrust_with(handler, ()))
            .collect();
        Ok(TreeServer { handlers })
    }

    /// Asks `client`'s handler until `range` is granted; every ask is a round trip.
    pub(crate) fn lock(
        &self,
        client: u64,
        range: Range<u64>,
        mode: Mode,
        trips: &mut u64,
    ) -> TreeHeld {
        let handler = client as usize % self.handlers.len();
        loop {
            *trips += 1;
            let asked = self.handlers[handler].apply_with(try_lock, (range.clone(), mode));
            if let Some(id) = asked {
                return TreeHeld { handler, id };
            }
            gossamer::yield_now();
        }
    }

    /// Releases, not waiting for the answer (as the range lock's guards do).
    pub(crate) fn unlock(&self, held: TreeHeld) {
        self.handlers[held.handler].apply_then_with(unlock, held.id, |()| {});
    }

    /// After every client has released: an error unless the tree is empty.
    pub(crate) fn check_idle(&self) -> anyhow::Result<()> {
        let left = self.handlers[0].apply_with(held, ());
        anyhow::ensure!(left == 0, "the interval tree still holds {left} ranges");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_grants_only_what_does_not_conflict() {
        let mut t = Tree::default();
        let a = t.try_lock(10..20, Mode::Read).expect("free");
        assert!(t.try_lock(15..30, Mode::Read).is_some(), "reads share");
        assert!(
            t.try_lock(19..21, Mode::Write).is_none(),
            "a write waits for reads"
        );
        assert!(
            t.try_lock(0..10, Mode::Write).is_some(),
            "ends are exclusive"
        );
        assert!(
            t.try_lock(5..11, Mode::Read).is_none(),
            "a read waits for a write"
        );
        t.unlock(a);
        assert!(t.try_lock(30..40, Mode::Write).is_some());
        assert!(t.try_lock(12..14, Mode::Write).is_some(), "12..14 freed");
        assert_eq!(t.held.len(), 4);
    }
}
