//! The crate's two hashes: 64-bit FNV-1a for names that must hash the same in every process
//! and build (job ids, type fingerprints), and a multiply for maps keyed by numbers this
//! process made itself.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// 64-bit FNV-1a: stable across processes, builds and platforms (unlike std's `RandomState`).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// A map keyed by numbers this process made itself (request ids, op offsets, property ids):
/// they need no defence against chosen collisions, only spreading, so a multiply replaces
/// SipHash on the per-call path.
pub(crate) type ByNumber<V, K = u64> = HashMap<K, V, BuildHasherDefault<NumberHasher>>;

/// Fibonacci hashing of one `u64`.
#[derive(Debug, Default)]
pub(crate) struct NumberHasher(u64);

impl Hasher for NumberHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0 ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(n.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_reference_values() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
