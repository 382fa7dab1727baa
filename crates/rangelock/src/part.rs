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

/// A range that a lock cannot take.
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
}

impl fmt::Display for RangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RangeError::Empty(r) => write!(f, "the range {r:?} is empty"),
            RangeError::OutOfBounds { range, units } => {
                write!(
                    f,
                    "the range {range:?} reaches past the lock's {units} units"
                )
            }
            RangeError::Overlap(a, b) => write!(f, "the ranges {a:?} and {b:?} overlap"),
        }
    }
}

impl std::error::Error for RangeError {}

/// Checks `parts` against a lock of `units` units: each range non-empty and inside, no two
/// overlapping.
pub(crate) fn check(parts: &[Part], units: u64) -> Result<(), RangeError> {
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
