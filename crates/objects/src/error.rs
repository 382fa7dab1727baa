//! What can go wrong when opening or using an object.

use std::fmt;

use gossamer::RegionError;
use serde::{Deserialize, Serialize};

/// Why [`open`](crate::open) failed. Nothing is left behind: the endpoint's regions are freed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum OpenError {
    /// This node already has an open endpoint of that name.
    Duplicate {
        /// The object's name.
        name: String,
    },
    /// A name that cannot be one (empty, longer than 200 bytes, or not printable ASCII).
    BadName {
        /// The name given.
        name: String,
    },
    /// The members do not include this node, or name a node twice or one the job lacks.
    BadMembers {
        /// What is wrong with them.
        why: String,
    },
    /// These members had not opened the object when the time ran out (`GSM_OBJECT_TIMEOUT`).
    Missing {
        /// The object's name.
        name: String,
        /// Ranks that did not open it.
        ranks: Vec<u32>,
        /// How long this node waited, in milliseconds.
        waited_ms: u64,
    },
    /// A member opened the object with another type, parameters or member list.
    Mismatch {
        /// The object's name.
        name: String,
        /// The other member's rank.
        rank: u32,
        /// What this node opened.
        ours: String,
        /// What that member opened.
        theirs: String,
    },
    /// The parameters do not make an object (a zero-sized ring, a writer not among members).
    BadParams {
        /// Why.
        why: String,
    },
    /// A region could not be made.
    Region(RegionError),
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Duplicate { name } => {
                write!(f, "object `{name}` is already open on this node")
            }
            OpenError::BadName { name } => write!(
                f,
                "`{name}` is not an object name (1 to 200 bytes of printable ASCII)"
            ),
            OpenError::BadMembers { why } => write!(f, "bad member list: {why}"),
            OpenError::Missing {
                name,
                ranks,
                waited_ms,
            } => write!(
                f,
                "object `{name}`: rank(s) {ranks:?} did not open it within {waited_ms} ms \
                 (GSM_OBJECT_TIMEOUT)"
            ),
            OpenError::Mismatch {
                name,
                rank,
                ours,
                theirs,
            } => write!(
                f,
                "object `{name}`: this node opened {ours}, rank {rank} opened {theirs}"
            ),
            OpenError::BadParams { why } => write!(f, "bad parameters: {why}"),
            OpenError::Region(e) => write!(f, "an object's region: {e}"),
        }
    }
}

impl std::error::Error for OpenError {}

impl From<RegionError> for OpenError {
    fn from(e: RegionError) -> OpenError {
        OpenError::Region(e)
    }
}

/// Why a ring did not take a message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendError {
    /// Not enough space now: a reader has not returned it yet.
    Full,
    /// The message can never fit: it needs `needed` words of a ring of `capacity`.
    TooLarge {
        /// Words the message needs (its bytes, and one for its length).
        needed: usize,
        /// Words the ring has for messages.
        capacity: usize,
    },
    /// A region operation failed.
    Region(RegionError),
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::Full => f.write_str("the ring is full"),
            SendError::TooLarge { needed, capacity } => write!(
                f,
                "a message of {needed} words does not fit a ring of {capacity}"
            ),
            SendError::Region(e) => write!(f, "ring: {e}"),
        }
    }
}

impl std::error::Error for SendError {}

impl From<RegionError> for SendError {
    fn from(e: RegionError) -> SendError {
        SendError::Region(e)
    }
}
