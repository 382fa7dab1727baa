//! The combiner's table (seed 002, §4.3, Algorithms 1 and 4): every held and waiting
//! request, and for each the number of earlier requests it waits for.
//!
//! Two requests *conflict* when a part of one overlaps a part of the other and at least one of
//! the two parts is a write. A request arriving counts as `blocking` the requests already in
//! the table that conflict with it — every one of them arrived earlier, held or waiting — and
//! is granted when that count is 0. When a request leaves (unlocked, or withdrawn at its
//! deadline) only the *later* requests that conflict with it count it, so only those are
//! decremented (Algorithm 4 leaves this implicit): a reader behind a waiting writer waits
//! for that writer too, which makes the table FIFO among conflicting requests, starves
//! nobody, and lets readers that overlap only readers, and disjoint requests, pass at once.
//!
//! The table is plain data with no runtime in it, so the tests drive it against a brute-force
//! model; the service (`service`) keeps the replies of the waiting requests beside it.

use std::collections::HashMap;

use crate::index::Index;
use crate::part::{Id, Mode, Part, Parts, cut};

#[derive(Debug)]
struct Entry {
    parts: Parts,
    /// Arrival order; the two halves of a split request share theirs.
    order: u64,
    /// Whether [`Table::requests`] counts this entry: a request that reaches several shards
    /// has an entry in each, and only its first (lowest) shard's entry is counted.
    counted: bool,
    /// Earlier requests in the table that conflict with this one.
    blocking: u32,
    held: bool,
}

/// Every held and waiting request of one lock.
#[derive(Debug, Default)]
pub(crate) struct Table {
    entries: HashMap<Id, Entry>,
    index: Index,
    next_id: Id,
    next_order: u64,
}

impl Table {
    /// Adds a request for `parts` (non-empty, disjoint, checked by the caller), `counted` as
    /// a request or not (see [`Table::requests`]): its id, and whether it is granted at once.
    pub(crate) fn lock(&mut self, parts: Parts, counted: bool) -> (Id, bool) {
        let blocking = self.conflicting(&parts, |_| true).len() as u32;
        let id = self.insert(parts, blocking, counted);
        (id, blocking == 0)
    }

    /// Adds and grants a request for `parts` if nothing in the table conflicts with it;
    /// otherwise leaves the table as it was.
    pub(crate) fn try_lock(&mut self, parts: Parts, counted: bool) -> Option<Id> {
        if self.conflicting(&parts, |_| true).is_empty() {
            Some(self.insert(parts, 0, counted))
        } else {
            None
        }
    }

    fn insert(&mut self, parts: Parts, blocking: u32, counted: bool) -> Id {
        let id = self.next_id;
        self.next_id += 1;
        let order = self.next_order;
        self.next_order += 1;
        for (at, part) in parts.iter().enumerate() {
            self.index.insert(id, at as u32, *part);
        }
        self.entries.insert(
            id,
            Entry {
                parts,
                order,
                blocking,
                held: blocking == 0,
                counted,
            },
        );
        id
    }

    /// The distinct requests in the table, other than those `keep` refuses, with a part that
    /// conflicts with one of `parts`.
    fn conflicting(&self, parts: &[Part], keep: impl Fn(&Entry) -> bool) -> Vec<Id> {
        let mut found = Vec::new();
        for part in parts {
            self.index.overlapping(part.start, part.end, |id, other| {
                if part.conflicts(other) && !found.contains(&id) && keep(&self.entries[&id]) {
                    found.push(id);
                }
            });
        }
        found
    }

    /// Ends request `id`, held (unlocked) or waiting (withdrawn at its deadline); the
    /// requests this grants are appended to `granted` in arrival order. False if there is no
    /// such request.
    pub(crate) fn release(&mut self, id: Id, granted: &mut Vec<Id>) -> bool {
        let Some(entry) = self.entries.remove(&id) else {
            return false;
        };
        for (at, part) in entry.parts.iter().enumerate() {
            self.index.remove(id, at as u32, *part);
        }
        let later = self.conflicting(&entry.parts, |e| e.order > entry.order);
        self.unblock(later, granted);
        true
    }

    /// Counts one blocking request less for each of `ids`, granting those that reach 0.
    fn unblock(&mut self, ids: Vec<Id>, granted: &mut Vec<Id>) {
        let first = granted.len();
        for id in ids {
            let entry = self
                .entries
                .get_mut(&id)
                .expect("a request found in the index");
            debug_assert!(!entry.held, "a held request waits for nothing");
            entry.blocking -= 1;
            if entry.blocking == 0 {
                entry.held = true;
                granted.push(id);
            }
        }
        granted[first..].sort_by_key(|id| self.entries[id].order);
    }

    /// Splits held request `id` at unit `at`: `id` keeps its units below `at`, and the new
    /// request returned holds the rest. `None` if `id` is not held or one side would hold
    /// nothing. Grants nothing: every request that waited for `id` now waits for one or both
    /// halves. The upper half counts as a request of its own (see [`Table::requests`]).
    pub(crate) fn split(&mut self, id: Id, at: u64) -> Option<Id> {
        let entry = self.entries.get(&id)?;
        let (low, high) = cut(&entry.parts, at);
        if !entry.held || low.is_empty() || high.is_empty() {
            return None;
        }
        let order = entry.order;
        let whole = entry.parts.clone();
        let later = self.conflicting(&whole, |e| e.order > order);
        for (at, part) in whole.iter().enumerate() {
            self.index.remove(id, at as u32, *part);
        }
        for (at, part) in low.iter().enumerate() {
            self.index.insert(id, at as u32, *part);
        }
        let upper = self.next_id;
        self.next_id += 1;
        for (at, part) in high.iter().enumerate() {
            self.index.insert(upper, at as u32, *part);
        }
        let conflicts = |theirs: &Parts, half: &Parts| {
            u32::from(theirs.iter().any(|p| half.iter().any(|h| p.conflicts(h))))
        };
        for waiting in later {
            let theirs = &self.entries[&waiting].parts;
            let both = conflicts(theirs, &low) + conflicts(theirs, &high);
            debug_assert!(
                both >= 1,
                "a request that waited for the whole waits for a half"
            );
            let entry = self.entries.get_mut(&waiting).expect("found in the index");
            entry.blocking = entry.blocking - 1 + both;
        }
        self.entries.get_mut(&id).expect("found above").parts = low;
        self.entries.insert(
            upper,
            Entry {
                parts: high,
                order,
                blocking: 0,
                held: true,
                counted: true,
            },
        );
        Some(upper)
    }

    /// Turns held request `id` into a reader of the same ranges, with no moment unlocked;
    /// the readers this lets in are appended to `granted`. False if `id` is not held.
    pub(crate) fn downgrade(&mut self, id: Id, granted: &mut Vec<Id>) -> bool {
        let Some(entry) = self.entries.get(&id) else {
            return false;
        };
        if !entry.held {
            return false;
        }
        let order = entry.order;
        let parts = entry.parts.clone();
        let later = self.conflicting(&parts, |e| e.order > order);
        let reads: Parts = parts
            .iter()
            .map(|p| Part {
                mode: Mode::Read,
                ..*p
            })
            .collect();
        for (at, (old, new)) in parts.iter().zip(&reads).enumerate() {
            self.index.remove(id, at as u32, *old);
            self.index.insert(id, at as u32, *new);
        }
        let freed: Vec<Id> = later
            .into_iter()
            .filter(|w| {
                let theirs = &self.entries[w].parts;
                !theirs.iter().any(|p| reads.iter().any(|r| r.conflicts(p)))
            })
            .collect();
        self.entries.get_mut(&id).expect("found above").parts = reads;
        self.unblock(freed, granted);
        true
    }

    /// Whether request `id` is in the table and granted.
    pub(crate) fn is_held(&self, id: Id) -> bool {
        self.entries.get(&id).is_some_and(|e| e.held)
    }

    /// Entries in the table, held or waiting.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Entries in the table counted as requests, held or waiting.
    pub(crate) fn requests(&self) -> usize {
        self.entries.values().filter(|e| e.counted).count()
    }

    /// Counts held request `id` as a request from now on (it became the first piece of a
    /// guard). False if there is no such request.
    pub(crate) fn count(&mut self, id: Id) -> bool {
        self.entries
            .get_mut(&id)
            .map(|e| e.counted = true)
            .is_some()
    }

    /// Checks every invariant by recounting from scratch; panics naming the first broken one.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let all: Vec<(&Id, &Entry)> = self.entries.iter().collect();
        for (id, e) in &all {
            let recount = all
                .iter()
                .filter(|(other, o)| {
                    other != id
                        && o.order < e.order
                        && o.parts
                            .iter()
                            .any(|p| e.parts.iter().any(|q| p.conflicts(q)))
                })
                .count() as u32;
            assert_eq!(e.blocking, recount, "request {id}: blocking is a recount");
            assert_eq!(e.held, e.blocking == 0, "request {id}: no waiter sits at 0");
            if e.held {
                for (other, o) in &all {
                    if other != id && o.held {
                        for p in &e.parts {
                            for q in &o.parts {
                                assert!(
                                    !p.conflicts(q),
                                    "held {id} {p:?} and held {other} {q:?} conflict"
                                );
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(self.index.is_empty(), self.entries.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The brute-force model: requests in arrival order, a request granted iff no earlier
    /// present request conflicts with it (the FIFO rule, stated directly).
    #[derive(Default, Clone)]
    struct Model {
        /// (id, order, parts, held).
        requests: Vec<(Id, u64, Parts, bool)>,
    }

    impl Model {
        fn conflicts(a: &[Part], b: &[Part]) -> bool {
            a.iter().any(|p| b.iter().any(|q| p.conflicts(q)))
        }

        /// An order later than every request's.
        fn next_order(&self) -> u64 {
            self.requests.iter().map(|r| r.1 + 1).max().unwrap_or(0)
        }

        /// Grants every waiting request with no earlier conflicting one; returns them in
        /// arrival order.
        fn settle(&mut self) -> Vec<Id> {
            let mut granted = Vec::new();
            let snapshot = self.requests.clone();
            for (i, r) in self.requests.iter_mut().enumerate() {
                if r.3 {
                    continue;
                }
                let blocked = snapshot[..i]
                    .iter()
                    .chain(&snapshot[i + 1..])
                    .any(|o| o.1 < r.1 && Self::conflicts(&o.2, &r.2));
                if !blocked {
                    r.3 = true;
                    granted.push(r.0);
                }
            }
            granted
        }
    }

    #[derive(Debug, Clone)]
    enum Step {
        Lock(Vec<(u64, u64, bool)>),
        TryLock(u64, u64, bool),
        Release(usize),
        Split(usize, u64),
        Downgrade(usize),
    }

    const UNITS: u64 = 64;

    fn part() -> impl Strategy<Value = (u64, u64, bool)> {
        (0..UNITS, 1..12u64, any::<bool>()).prop_map(|(s, l, w)| (s, (s + l).min(UNITS), w))
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => prop::collection::vec(part(), 1..4).prop_map(Step::Lock),
            1 => part().prop_map(|(s, e, w)| Step::TryLock(s, e, w)),
            4 => any::<usize>().prop_map(Step::Release),
            1 => (any::<usize>(), 0..24u64).prop_map(|(i, k)| Step::Split(i, k)),
            1 => any::<usize>().prop_map(Step::Downgrade),
        ]
    }

    /// Disjoint parts from a generated list (overlapping ones dropped, as `lock_all` refuses
    /// them).
    fn parts(list: &[(u64, u64, bool)]) -> Parts {
        let mut out: Parts = Vec::new();
        for &(start, end, write) in list {
            let p = Part {
                start,
                end,
                mode: if write { Mode::Write } else { Mode::Read },
            };
            if !out.iter().any(|q| q.overlaps(&p)) {
                out.push(p);
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Random locks, releases (unlocks and withdrawals), splits and downgrades: the table
        /// grants the same requests in the same order as the model, and its invariants hold
        /// after every step; at the end everything is released and the table is empty.
        #[test]
        fn the_table_grants_what_the_model_grants(steps in prop::collection::vec(step(), 1..80)) {
            let mut table = Table::default();
            let mut model = Model::default();
            let mut granted = Vec::new();
            for step in steps {
                granted.clear();
                let mut expected = Vec::new();
                match step {
                    Step::Lock(list) => {
                        let parts = parts(&list);
                        let (id, now) = table.lock(parts.clone(), true);
                        let order = model.next_order();
                        model.requests.push((id, order, parts, false));
                        let settled = model.settle();
                        prop_assert_eq!(now, settled == vec![id]);
                        prop_assert!(settled.is_empty() || settled == vec![id]);
                    }
                    Step::TryLock(s, e, w) => {
                        let p = parts(&[(s, e, w)]);
                        let free = !model.requests.iter().any(|r| Model::conflicts(&r.2, &p));
                        let got = table.try_lock(p.clone(), true);
                        prop_assert_eq!(got.is_some(), free);
                        if let Some(id) = got {
                            let order = model.next_order();
                            model.requests.push((id, order, p, true));
                        }
                    }
                    Step::Release(i) if !model.requests.is_empty() => {
                        let r = model.requests.remove(i % model.requests.len());
                        prop_assert!(table.release(r.0, &mut granted));
                        expected = model.settle();
                    }
                    Step::Split(i, k) if !model.requests.is_empty() => {
                        let i = i % model.requests.len();
                        let r = model.requests[i].clone();
                        let at = r.2[0].start + k;
                        let (low, high) = cut(&r.2, at);
                        let splittable = r.3 && !low.is_empty() && !high.is_empty();
                        let got = table.split(r.0, at);
                        prop_assert_eq!(got.is_some(), splittable);
                        if let Some(upper) = got {
                            model.requests[i].2 = low;
                            model.requests.push((upper, r.1, high, true));
                            prop_assert!(model.settle().is_empty(), "a split grants nothing");
                        }
                    }
                    Step::Downgrade(i) if !model.requests.is_empty() => {
                        let i = i % model.requests.len();
                        let held = model.requests[i].3;
                        prop_assert_eq!(table.downgrade(model.requests[i].0, &mut granted), held);
                        if held {
                            for p in &mut model.requests[i].2 {
                                p.mode = Mode::Read;
                            }
                            expected = model.settle();
                        }
                    }
                    _ => {}
                }
                prop_assert_eq!(&granted, &expected, "grants and their order");
                table.check();
                prop_assert_eq!(table.len(), model.requests.len());
                prop_assert_eq!(table.requests(), model.requests.len());
                for r in &model.requests {
                    prop_assert_eq!(table.is_held(r.0), r.3, "request {}", r.0);
                }
            }
            while let Some(r) = model.requests.pop() {
                prop_assert!(table.release(r.0, &mut granted));
            }
            table.check();
            prop_assert_eq!(table.len(), 0);
        }
    }

    #[test]
    fn readers_pass_readers_and_queue_behind_a_waiting_writer() {
        let mut t = Table::default();
        let read = |s, e| {
            vec![Part {
                start: s,
                end: e,
                mode: Mode::Read,
            }]
        };
        let write = |s, e| {
            vec![Part {
                start: s,
                end: e,
                mode: Mode::Write,
            }]
        };
        let (r1, now) = t.lock(read(0, 10), true);
        assert!(now);
        assert!(
            t.lock(read(5, 15), true).1,
            "readers overlapping only readers pass"
        );
        let (w, now) = t.lock(write(8, 9), true);
        assert!(!now, "the writer waits for both readers");
        let (r3, now) = t.lock(read(8, 20), true);
        assert!(
            !now,
            "a reader overlapping a waiting writer queues behind it"
        );
        assert!(
            t.lock(write(30, 40), true).1,
            "disjoint requests never wait"
        );
        let mut granted = Vec::new();
        assert!(t.release(r1, &mut granted));
        assert!(granted.is_empty());
        assert!(t.release(1, &mut granted));
        assert_eq!(granted, [w]);
        granted.clear();
        assert!(t.release(w, &mut granted));
        assert_eq!(granted, [r3]);
        t.check();
    }
}
