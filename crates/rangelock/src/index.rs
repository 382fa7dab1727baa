//! The interval index: which parts of which requests cover which units, for the one query the
//! table makes — every part that overlaps a range.
//!
//! Parts are kept in a B-tree ordered by start, with a multiset of their lengths. A part
//! `[s, e)` overlaps a query `[qs, qe)` when `s < qe` and `e > qs`; since `e ≤ s + longest`,
//! only starts in `(qs − longest, qe)` can, and the query scans exactly that key range. With
//! the bounded lengths of a lock table (the seed's at most 2¹¹ of 2¹⁶ units) a query visits
//! the parts near the range and little else, in O(log n + k); one long held range widens every
//! scan while it lasts (the multiset gives the exact longest, so it narrows again once that
//! range leaves). An augmented interval tree would bound that case too, at the price of
//! rebalancing code of its own; the seed's red-black tree had no augmentation either.

use std::collections::BTreeMap;

use crate::part::{Id, Part};

/// Parts by `(start, request, part index)`.
#[derive(Debug, Default)]
pub(crate) struct Index {
    parts: BTreeMap<(u64, Id, u32), Part>,
    /// How many parts have each length.
    lengths: BTreeMap<u64, usize>,
}

impl Index {
    pub(crate) fn insert(&mut self, id: Id, at: u32, part: Part) {
        self.parts.insert((part.start, id, at), part);
        *self.lengths.entry(part.len()).or_default() += 1;
    }

    pub(crate) fn remove(&mut self, id: Id, at: u32, part: Part) {
        let removed = self.parts.remove(&(part.start, id, at));
        debug_assert_eq!(removed, Some(part), "the index holds the part it removes");
        let len = part.len();
        match self.lengths.get_mut(&len) {
            Some(1) => {
                self.lengths.remove(&len);
            }
            Some(n) => *n -= 1,
            None => debug_assert!(false, "a part's length is counted"),
        }
    }

    /// Calls `f(request, part)` for every part that overlaps `[start, end)`.
    pub(crate) fn overlapping(&self, start: u64, end: u64, mut f: impl FnMut(Id, &Part)) {
        let Some((&longest, _)) = self.lengths.last_key_value() else {
            return;
        };
        let from = start.saturating_sub(longest);
        for (&(_, id, _), part) in self.parts.range((from, 0, 0)..(end, 0, 0)) {
            if part.end > start {
                f(id, part);
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }
}
