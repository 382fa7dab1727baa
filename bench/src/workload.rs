//! Access patterns: which object (or key) each operation touches.
//!
//! Sampling a Zipf variate costs a few logarithms, more than the critical sections we measure, so the
//! indices are drawn before the clock starts into one shared stream. Every thread (or fiber) walks the
//! stream from its own offset, so all systems see the same pattern and no time goes into sampling.

use std::fmt;
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Zipf};

/// How objects are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dist {
    /// Every object equally likely.
    Uniform,
    /// Zipf: the object of rank `r` is chosen with probability ∝ 1/r^α (α = 1 unless the
    /// stream says otherwise, see [`Stream::with_exponent`]).
    Zipf,
}

impl Dist {
    /// Lower-case name used in file names and CSV.
    pub fn name(self) -> &'static str {
        match self {
            Dist::Uniform => "uniform",
            Dist::Zipf => "zipf",
        }
    }

    /// Human-readable label for plots and tables.
    pub fn label(self) -> &'static str {
        match self {
            Dist::Uniform => "uniform",
            Dist::Zipf => "Zipf (α = 1)",
        }
    }
}

impl fmt::Display for Dist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Length of the pre-drawn index stream (a power of two).
const STREAM_LEN: usize = 1 << 20;

/// A pre-drawn sequence of object indices in `0..objects`, shared read-only by all threads.
#[derive(Debug, Clone)]
pub struct Stream {
    indices: Arc<[u32]>,
    objects: usize,
}

impl Stream {
    /// Draws the stream for `objects` objects (at most `u32::MAX`) with a fixed seed.
    pub fn new(dist: Dist, objects: usize, seed: u64) -> Self {
        Stream::with_exponent(dist, 1.0, objects, seed)
    }

    /// [`new`](Stream::new) with the Zipf exponent `exponent` (α) for [`Dist::Zipf`].
    pub fn with_exponent(dist: Dist, exponent: f64, objects: usize, seed: u64) -> Self {
        assert!(
            objects > 0 && objects <= u32::MAX as usize,
            "object count out of range"
        );
        let mut rng = SmallRng::seed_from_u64(seed ^ (objects as u64).rotate_left(17));
        let indices: Arc<[u32]> = match dist {
            Dist::Uniform => (0..STREAM_LEN)
                .map(|_| rng.random_range(0..objects as u32))
                .collect(),
            Dist::Zipf => {
                let zipf = Zipf::new(objects as f64, exponent).expect("valid Zipf parameters");
                (0..STREAM_LEN)
                    .map(|_| {
                        // Ranks are 1..=objects; rank 1 is the most popular object, index 0.
                        let rank = zipf.sample(&mut rng) as u32;
                        rank.clamp(1, objects as u32) - 1
                    })
                    .collect()
            }
        };
        Stream { indices, objects }
    }

    /// Number of distinct objects the stream draws from.
    pub fn objects(&self) -> usize {
        self.objects
    }

    /// A cursor starting at a position derived from `who` (a thread or fiber number).
    pub fn cursor(&self, who: usize) -> Cursor {
        // Spread starting points with the golden ratio so cursors do not walk in lock step.
        let start = (who as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 44;
        Cursor {
            indices: Arc::clone(&self.indices),
            pos: start as usize & (STREAM_LEN - 1),
        }
    }
}

/// One reader's position in a [`Stream`].
#[derive(Debug)]
pub struct Cursor {
    indices: Arc<[u32]>,
    pos: usize,
}

impl Cursor {
    /// The next object index.
    #[inline]
    pub fn next_index(&mut self) -> usize {
        // The stream length is a power of two, so masking wraps around.
        let i = self.indices[self.pos & (STREAM_LEN - 1)];
        self.pos = self.pos.wrapping_add(1);
        i as usize
    }

    /// Whether the operation at the current position is a write, for a write share in percent.
    ///
    /// Decided by hashing the position, so the mix is the same for every system.
    #[inline]
    pub fn is_write(&self, write_percent: u32) -> bool {
        let h = (self.pos as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        (h % 100) < u64::from(write_percent)
    }
}

/// A cheap, well-mixing hash of a key (used to pick shards and to check map values).
#[inline]
pub fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_prefers_low_ranks() {
        let s = Stream::new(Dist::Zipf, 1000, 1);
        let mut c = s.cursor(0);
        let mut hits = [0usize; 2];
        for _ in 0..100_000 {
            let i = c.next_index();
            assert!(i < 1000);
            if i == 0 {
                hits[0] += 1;
            } else if i == 999 {
                hits[1] += 1;
            }
        }
        // P(rank 1) / P(rank 1000) = 1000 under α = 1.
        assert!(hits[0] > 50 * hits[1].max(1), "{hits:?}");
    }

    #[test]
    fn uniform_covers_range() {
        let s = Stream::new(Dist::Uniform, 10, 1);
        let mut c = s.cursor(3);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            seen[c.next_index()] = true;
        }
        assert!(seen.iter().all(|&b| b));
    }

    #[test]
    fn write_share_is_close() {
        let s = Stream::new(Dist::Uniform, 10, 1);
        let mut c = s.cursor(0);
        let mut writes = 0;
        for _ in 0..100_000 {
            c.next_index();
            writes += usize::from(c.is_write(5));
        }
        assert!((4_000..6_000).contains(&writes), "{writes}");
    }
}
