//! [`Msw`]: a replicated value of any size, read whole or not at all (the seed's H.6).

use std::fmt;

use crate::error::OpenError;
use crate::fabric::{Fabric, Rack};
use crate::object::{Declare, Object, On, Parts, Regions};
use crate::work::Work;

/// Word 0 of a replica: the hash of words 1.. (the length in bytes, then the data).
const HASH: usize = 0;
const LEN: usize = 1;
const DATA: usize = 2;

/// A value of up to `capacity` bytes replicated on every member, as a
/// [`SharedVar`](crate::SharedVar) is for one word: [`store`](Msw::store) writes this member's replica,
/// [`broadcast`](Msw::broadcast) puts it to the others'.
///
/// A put of many words may tear (the memory model of [`gossamer::region`]), so a replica
/// carries a hash of its contents beside them: [`try_load`](Msw::try_load) returns `None`
/// when the words it read do not match their hash (a broadcast landing meanwhile), and
/// [`load`](Msw::load) tries again until they do. A value that loads was written whole by
/// some store, never a mix of two. A replica never written loads as empty.
///
/// As with a shared variable, one member writes a given replica at a time.
///
/// ```
/// let code = gossamer::Rack::from_env().run(|| {
///     let members: Vec<_> = gossamer::nodes().collect();
///     objects::on_members(&members, |members| {
///         let mut config = objects::open::<objects::Msw>("doc-msw", &64, &members).unwrap();
///         assert_eq!(config.load(), b"");
///         config.store(b"a value of many words").unwrap();
///         let work = objects::Work::new();
///         config.broadcast(&work);
///         work.wait().unwrap();
///         assert_eq!(config.load(), b"a value of many words");
///         // Larger than its capacity: refused, nothing written.
///         assert!(config.store(&[0; 65]).is_err());
///     });
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
pub struct Msw<F: Fabric = Rack> {
    replica: Regions<F>,
    capacity: usize,
}

/// Words of a replica of `capacity` bytes.
fn replica_words(capacity: usize) -> usize {
    DATA + capacity.div_ceil(8)
}

impl<F: Fabric> Object<F> for Msw<F> {
    /// The largest value in bytes.
    type Params = usize;

    fn declare(d: &mut Declare, capacity: &usize) {
        d.region("replica", replica_words(*capacity), On::EachMember);
    }

    fn build(parts: Parts<F>, capacity: &usize) -> Result<Self, OpenError> {
        Ok(Msw {
            replica: parts.region("replica"),
            capacity: *capacity,
        })
    }
}

/// A 64-bit hash of the words: each is mixed in with a multiply and a rotation, so that a
/// torn mix of two values' words hashes apart from both with overwhelming probability.
pub(crate) fn hash(words: impl IntoIterator<Item = u64>) -> u64 {
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    for w in words {
        h = (h ^ w).wrapping_mul(0xff51_afd7_ed55_8ccd).rotate_left(29);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// A value's bytes as words, little-endian, the last padded with zeros.
pub(crate) fn to_words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect()
}

/// The first `len` bytes of `words`.
pub(crate) fn to_bytes(words: &[u64], len: usize) -> Vec<u8> {
    let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    bytes.truncate(len);
    bytes
}

/// The value is larger than the capacity the object was opened with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge {
    /// Its size in bytes.
    pub len: usize,
    /// The object's capacity in bytes.
    pub capacity: usize,
}

impl fmt::Display for TooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a value of {} bytes does not fit a capacity of {}",
            self.len, self.capacity
        )
    }
}

impl std::error::Error for TooLarge {}

impl<F: Fabric> Msw<F> {
    /// The largest value in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Writes `value` to this member's replica: the data first, the hash last.
    ///
    /// # Errors
    /// `value` is larger than the capacity; the replica is left as it was.
    pub fn store(&mut self, value: &[u8]) -> Result<(), TooLarge> {
        if value.len() > self.capacity {
            return Err(TooLarge {
                len: value.len(),
                capacity: self.capacity,
            });
        }
        let data = to_words(value);
        let len = value.len() as u64;
        for (i, w) in data.iter().enumerate() {
            self.replica.store(DATA + i, *w);
        }
        self.replica.store(LEN, len);
        self.replica
            .store(HASH, hash(std::iter::once(len).chain(data.iter().copied())));
        Ok(())
    }

    /// This member's replica, if its words match their hash now.
    pub fn try_load(&self) -> Option<Vec<u8>> {
        let stored = self.replica.load(HASH);
        let len = self.replica.load(LEN);
        if stored == 0 && len == 0 {
            return Some(Vec::new());
        }
        let len = usize::try_from(len).ok().filter(|&l| l <= self.capacity)?;
        let data: Vec<u64> = (0..len.div_ceil(8))
            .map(|i| self.replica.load(DATA + i))
            .collect();
        (hash(std::iter::once(len as u64).chain(data.iter().copied())) == stored)
            .then(|| to_bytes(&data, len))
    }

    /// This member's replica, read again until it is whole.
    pub fn load(&self) -> Vec<u8> {
        loop {
            if let Some(v) = self.try_load() {
                return v;
            }
            self.replica.fabric().relax();
        }
    }

    /// Puts this member's replica (its hash, length and data) to every other member's.
    pub fn broadcast(&self, work: &Work) {
        let len = usize::try_from(self.replica.load(LEN)).unwrap_or(usize::MAX);
        let words = DATA + len.min(self.capacity).div_ceil(8);
        self.replica.broadcast(HASH, words, work);
    }
}

impl<F: Fabric> fmt::Debug for Msw<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Msw")
            .field("capacity", &self.capacity)
            .finish()
    }
}
