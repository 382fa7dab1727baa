//! What can go wrong with a region.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a region operation failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum RegionError {
    /// Words `index .. index + len` are not all within the region.
    OutOfBounds {
        /// The first word named.
        index: usize,
        /// How many words from it.
        len: usize,
        /// The region's length in words.
        region_len: usize,
    },
    /// The region this name gave is gone (freed, its slot maybe reused) or never was.
    Stale {
        /// The region's slot on its node.
        slot: u32,
        /// The generation the name carries.
        generation: u32,
    },
    /// A region of 0 words, or of more than `u32::MAX`.
    BadLength {
        /// The length asked for.
        len: usize,
    },
    /// The node's heap has no free run of `len` words (`GSM_REGION_HEAP`).
    HeapFull {
        /// The length asked for.
        len: usize,
        /// The words the heap has for regions.
        heap_words: usize,
    },
    /// The node has as many regions as it can name.
    TooManyRegions {
        /// Regions per node.
        max: usize,
    },
    /// The heap's table, which another process can write, says something impossible.
    Corrupt {
        /// What it says.
        why: String,
    },
    /// The target could not run the operation (it answered with this).
    Failed {
        /// Its answer.
        why: String,
    },
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionError::OutOfBounds {
                index,
                len,
                region_len,
            } => write!(
                f,
                "words {index}..{} are out of bounds of a region of {region_len} words",
                index.saturating_add(*len)
            ),
            RegionError::Stale { slot, generation } => write!(
                f,
                "region slot {slot} generation {generation} is gone (freed, or never made)"
            ),
            RegionError::BadLength { len } => {
                write!(f, "a region has 1 to {} words, not {len}", u32::MAX)
            }
            RegionError::HeapFull { len, heap_words } => write!(
                f,
                "no room for a region of {len} words in a heap of {heap_words} (GSM_REGION_HEAP)"
            ),
            RegionError::TooManyRegions { max } => {
                write!(f, "the node already has {max} regions")
            }
            RegionError::Corrupt { why } => write!(f, "the region heap is corrupt: {why}"),
            RegionError::Failed { why } => write!(f, "the region operation failed: {why}"),
        }
    }
}

impl std::error::Error for RegionError {}
