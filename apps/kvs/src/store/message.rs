//! What crosses between a connection and a shard's trustee: [`ShardCommand`] with its
//! arguments, and [`ShardReply`] with the results and the values handed out.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{MetaOp, MetaReply, ShardStats};
use crate::common::StoreMode;

/// Values up to this many bytes are copied out of the shard; longer ones are shared by
/// reference count.
pub const INLINE_VALUE: usize = 48;

/// A value handed out of the shard: small values are copied, large ones share the stored
/// buffer by reference count.
#[derive(Clone, PartialEq, Eq)]
pub enum Value {
    /// A copy of a short value.
    Inline {
        /// Number of bytes used.
        len: u8,
        /// The bytes.
        buf: [u8; INLINE_VALUE],
    },
    /// A reference to the stored buffer.
    Shared(Bytes),
}

impl Value {
    pub(super) fn of(b: &Bytes) -> Value {
        if b.len() <= INLINE_VALUE {
            let mut buf = [0; INLINE_VALUE];
            buf[..b.len()].copy_from_slice(b);
            Value::Inline {
                len: b.len() as u8,
                buf,
            }
        } else {
            Value::Shared(b.clone())
        }
    }
}

impl AsRef<[u8]> for Value {
    fn as_ref(&self) -> &[u8] {
        match self {
            Value::Inline { len, buf } => &buf[..usize::from(*len)],
            Value::Shared(b) => b,
        }
    }
}

/// On the wire (to a shard on another rank and back) a value is its bytes; it is inlined or
/// shared again where it is decoded.
impl Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.as_ref())
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Value, D::Error> {
        Bytes::deserialize(deserializer).map(|b| Value::of(&b))
    }
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.as_ref()))
    }
}

/// What a lookup returns: a copy of the item's metadata and its value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemView {
    /// Client flags.
    pub flags: u32,
    /// The value.
    pub value: Value,
    /// The cas unique.
    pub cas: u64,
}

/// Outcome of a storage command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoreResult {
    /// `STORED`.
    Stored,
    /// `NOT_STORED`: the add/replace/append/prepend condition failed.
    NotStored,
    /// `EXISTS`: cas mismatch.
    Exists,
    /// `NOT_FOUND`: cas on a missing key.
    NotFound,
    /// `SERVER_ERROR out of memory storing object`.
    OutOfMemory,
    /// `SERVER_ERROR object too large for cache`.
    TooLarge,
}

impl StoreResult {
    /// The answer line, without `\r\n`.
    pub fn line(self) -> &'static str {
        match self {
            StoreResult::Stored => "STORED",
            StoreResult::NotStored => "NOT_STORED",
            StoreResult::Exists => "EXISTS",
            StoreResult::NotFound => "NOT_FOUND",
            StoreResult::OutOfMemory => "SERVER_ERROR out of memory storing object",
            StoreResult::TooLarge => "SERVER_ERROR object too large for cache",
        }
    }
}

/// Outcome of `incr`/`decr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ArithResult {
    /// The new value.
    Value(u64),
    /// `NOT_FOUND`.
    NotFound,
    /// `CLIENT_ERROR cannot increment or decrement non-numeric value`.
    NonNumeric,
}

/// A storage command's arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreRequest {
    /// Which command.
    pub mode: StoreMode,
    /// The key.
    pub key: Bytes,
    /// Client flags.
    pub flags: u32,
    /// Expiry time as sent.
    pub exptime: i32,
    /// The value.
    pub data: Bytes,
    /// The cas unique to compare (`cas` only).
    pub cas_unique: u64,
}

/// One operation on one shard. Everything is owned, so it can be shipped to a trustee.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShardCommand {
    /// Look up one key; with `touch`, also set its expiry (`gat`).
    Get {
        /// The key.
        key: Bytes,
        /// New expiry time as sent by the client.
        touch: Option<i32>,
    },
    /// A storage command (boxed, like the other large and rarer variants, so that a command
    /// and its reply stay small: a batch to a trustee carries more of them).
    Store(Box<StoreRequest>),
    /// A storage command whose value was too large: a `set` deletes the key.
    TooLarge {
        /// Which command.
        mode: StoreMode,
        /// The key.
        key: Bytes,
    },
    /// `delete`.
    Delete {
        /// The key.
        key: Bytes,
    },
    /// `incr`/`decr`.
    Arith {
        /// The key.
        key: Bytes,
        /// `incr` (true) or `decr`.
        incr: bool,
        /// The amount.
        delta: u64,
    },
    /// `touch`.
    Touch {
        /// The key.
        key: Bytes,
        /// New expiry time as sent.
        exptime: i32,
    },
    /// `flush_all` (sent to every shard).
    FlushAll {
        /// Delay as sent.
        delay: i32,
    },
    /// A meta command (`mg`, `ms`, `md`, `ma`).
    Meta(Box<MetaOp>),
    /// Read the shard's counters.
    Stats,
    /// Zero the shard's counters (`stats reset`).
    ResetStats,
}

/// The answer to a [`ShardCommand`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShardReply {
    /// For `Get`.
    Value(Option<ItemView>),
    /// For `Store` and `TooLarge`.
    Store(StoreResult),
    /// For `Delete`: whether the key existed.
    Deleted(bool),
    /// For `Arith`.
    Arith(ArithResult),
    /// For `Touch`: whether the key existed.
    Touched(bool),
    /// For `FlushAll` and `ResetStats`.
    Done,
    /// For `Stats`.
    Stats(Box<ShardStats>),
    /// For `Meta`.
    Meta(Box<MetaReply>),
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::Value;
    use crate::common::StoreMode;
    use crate::store::fixtures::{NOW, b, set, sr};
    use crate::store::{Shard, ShardConfig};

    #[test]
    fn large_values_are_shared() {
        let mut s = Shard::new(ShardConfig::default());
        let big = Bytes::from(vec![7u8; 4096]);
        s.store(sr(StoreMode::Set, b("k"), 0, 0, big.clone(), 0), NOW);
        let v = s.get(b"k", None, NOW).unwrap();
        match v.value {
            Value::Shared(b) => assert_eq!(b.as_ptr(), big.as_ptr()),
            Value::Inline { .. } => panic!("large value was copied"),
        }
        set(&mut s, "small", "tiny", 0, NOW);
        assert!(matches!(
            s.get(b"small", None, NOW).unwrap().value,
            Value::Inline { .. }
        ));
    }
}
