//! What a request locks: its parts (ranges with a mode), and the checks a lock applies to
//! them.

use std::fmt;
use std::ops::Range;

use serde::{Deserialize, Serialize};

/// A request's name in its table.
pub(crate) type Id = u64;

/// How a range is locked.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, Serialize, Deserialize)]
pub enum Mode {
    /// Shared with other readers.
    Read,
    /// Exclusive.
    Write,
}

/// One locked range of a request: units `start..end`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub(crate) struct Part {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) mode: Mode,
}

impl Part {
    pub(crate) fn len(&self) -> u64 {
        self.end - self.start
    }

    pub(crate) fn overlaps(&self, other: &Part) -> bool {
        self.start < other.end && other.start < self.end
    }

    /// Whether the two parts may not be held at once.
    pub(crate) fn conflicts(&self, other: &Part) -> bool {
        self.overlaps(other) && (self.mode == Mode::Write || other.mode == Mode::Write)
    }
}

/// Why a lock cannot take the ranges it was given, or a guard cannot split where asked: the
/// caller's mistake, refused before anything is locked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RangeError {
    /// The range holds no unit.
    Empty(Range<u64>),
    /// The range reaches past the lock's units.
    OutOfBounds {
        /// The range asked for.
        range: Range<u64>,
        /// The lock's units.
        units: u64,
    },
    /// Two ranges of one `lock_all` overlap.
    Overlap(Range<u64>, Range<u64>),
    /// `lock_all` was given no range.
    NoRanges,
    /// `split_at(mid)` would leave one of the two guards holding nothing.
    SplitOutside {
        /// The offset asked for.
        mid: u64,
        /// From the guard's first held unit to the end of its last held range.
        held: Range<u64>,
    },
    /// `RangeLock::sharded` was asked for a number of shards that the units cannot fill.
    Shards {
        /// The shards asked for.
        shards: usize,
        /// The lock's units.
        units: u64,
    },
}

impl fmt::Display for RangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RangeError::Empty(r) => {
                write!(f, "the range {r:?} is empty: a range must hold a unit")
            }
            RangeError::OutOfBounds { range, units } => write!(
                f,
                "the range {range:?} reaches past the lock's {units} units (0..{units})"
            ),
            RangeError::Overlap(a, b) => write!(
                f,
                "the ranges {a:?} and {b:?} overlap: join them, or lock them in turn"
            ),
            RangeError::NoRanges => write!(f, "lock_all was given no range: give it at least one"),
            RangeError::SplitOutside { mid, held } => write!(
                f,
                "split_at({mid}) leaves a guard empty: the guard spans {held:?}, so mid must lie \
                 in 1..{}",
                held.end - held.start
            ),
            RangeError::Shards { shards, units } => write!(
                f,
                "{units} units cannot be spread over {shards} shards: ask for 1 to {units} shards"
            ),
        }
    }
}

impl std::error::Error for RangeError {}

/// Why a lock call with a deadline, or one that must not wait, returned no guard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockError {
    /// The ranges asked for cannot be taken (nothing was locked).
    Range(RangeError),
    /// `try_lock`: a held or waiting request conflicts with the range now.
    WouldBlock,
    /// `lock_until`: the range was not granted by the deadline (the request left the table).
    TimedOut,
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::Range(e) => e.fmt(f),
            LockError::WouldBlock => write!(f, "the range is locked or awaited by another request"),
            LockError::TimedOut => write!(f, "the range was not granted by the deadline"),
        }
    }
}

impl std::error::Error for LockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LockError::Range(e) => Some(e),
            LockError::WouldBlock | LockError::TimedOut => None,
        }
    }
}

impl From<RangeError> for LockError {
    fn from(e: RangeError) -> Self {
        LockError::Range(e)
    }
}

/// Checks `parts` against a lock of `units` units: at least one, each range non-empty and
/// inside, no two overlapping.
pub(crate) fn check(parts: &[Part], units: u64) -> Result<(), RangeError> {
    if parts.is_empty() {
        return Err(RangeError::NoRanges);
    }
    for (i, p) in parts.iter().enumerate() {
        if p.start >= p.end {
            return Err(RangeError::Empty(p.start..p.end));
        }
        if p.end > units {
            return Err(RangeError::OutOfBounds {
                range: p.start..p.end,
                units,
            });
        }
        if let Some(q) = parts[..i]
            .iter()
            .find(|q| q.start < p.end && p.start < q.end)
        {
            return Err(RangeError::Overlap(q.start..q.end, p.start..p.end));
        }
    }
    Ok(())
}

/// The parts of one request: one range, or several disjoint ones taken together (`lock_all`).
pub(crate) type Parts = Vec<Part>;

/// `parts` cut at unit `at`: the units below it, and the rest (a part that `at` falls
/// strictly inside is cut in two). Either side may be empty.
pub(crate) fn cut(parts: &[Part], at: u64) -> (Parts, Parts) {
    let mut below = Vec::new();
    let mut above = Vec::new();
    for &p in parts {
        if p.end <= at {
            below.push(p);
        } else if p.start >= at {
            above.push(p);
        } else {
            below.push(Part { end: at, ..p });
            above.push(Part { start: at, ..p });
        }
    }
    (below, above)
}
