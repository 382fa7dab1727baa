//! splitmix64: the one small seeded generator of this crate's randomized tests (so a failure
//! replays) and of the SSSP example's graphs (so any process can regenerate any edge).
//!
//! Not part of the API: the integration tests and the example include this file with
//! `#[path]`, since an example sees only public items.

/// splitmix64's increment, the golden ratio in 64 bits.
pub(crate) const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// splitmix64's output function: a bijective mix of 64 bits.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A splitmix64 stream from its state.
#[derive(Debug, Clone)]
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix(self.0)
    }

    /// Uniform in `0..n`, for `n > 0`, by the high half of a 128-bit product.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }

    pub(crate) fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    /// Appends `len` random bytes.
    pub(crate) fn fill(&mut self, out: &mut Vec<u8>, len: usize) {
        out.extend((0..len).map(|_| self.next() as u8));
    }

    pub(crate) fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        self.fill(&mut out, len);
        out
    }
}

/// Scales a test's size: `GOSSAMER_TEST_SCALE` divides it (the valgrind run sets it).
pub(crate) fn scaled(n: usize) -> usize {
    let div: usize = std::env::var("GOSSAMER_TEST_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    (n / div.max(1)).max(1)
}
