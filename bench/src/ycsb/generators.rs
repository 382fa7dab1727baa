//! YCSB's key generators, reproduced exactly so that our YCSB runs draw the keys YCSB would.
//!
//! Each type mirrors one class of `site.ycsb.generator` in YCSB 0.17.0 (`core-0.17.0.jar`).
//! Everything below was read off that jar's bytecode (`javap -c -p`), not off memory or the
//! YCSB documentation, and `bench/tests/ycsb_java.rs` compares these generators with the Java
//! ones: hashes and zeta sums bit for bit, the samplers by a chi-square test of their histograms.
//!
//! # What YCSB does
//!
//! - Keys. `CoreWorkload.buildKeyName(keynum)` is `"user"` followed by the decimal
//!   `Utils.hash(keynum)`, which is `Utils.fnvhash64` ([`fnvhash64`], [`key_name`]) under the
//!   defaults: `insertorder=hashed` and `zeropadding=1` (pads to one digit, so never).
//! - Zipfian ([`Zipfian`]) is Gray et al.'s approximate sampler: items `min..=max`, `theta =
//!   0.99`, `zeta(n) = Σ_{i<n} 1/(i+1)^theta` summed from `i = 0` upwards. `nextLong(itemcount)`
//!   with more items than its zeta covers extends the sum from where it stopped, but recomputes
//!   `eta` from the constructor's item count, not the new one; fewer items change nothing (the
//!   `allowitemcountdecrease` flag is never set). The first two ranks come from the thresholds
//!   `1` and `1 + 0.5^theta`, the rest from `base + (long)(itemcount · (eta·u − eta + 1)^alpha)`,
//!   which is `base + itemcount`, one past the range, when `u` is within about 10^-15 of 1
//!   (the power's base rounds to 1).
//! - Scrambled zipfian ([`ScrambledZipfian`], `requestdistribution=zipfian`, workloads A–C, F)
//!   draws from a zipfian over `0..=10^10` (max is `ITEM_COUNT` itself, so 10^10 + 1 items) whose
//!   zeta is the constant 26.46902820178302, and returns `min + fnvhash64(x) % itemcount`.
//!   `CoreWorkload` builds it as `ScrambledZipfianGenerator(insertstart, insertstart +
//!   insertcount + expectednewkeys)`, with no `- 1`: the range holds one key past the table.
//!   `expectednewkeys = (int)(operationcount · insertproportion · 2.0)`.
//! - Skewed latest ([`SkewedLatest`], `requestdistribution=latest`, workload D) takes a zipfian
//!   over `basis.lastValue()` items (its one-argument constructor) and returns `last −
//!   zipfian.nextLong(last)` with `last = basis.lastValue()` at each draw, so recent keys are hot.
//!   The basis is `transactioninsertkeysequence`, an acknowledged counter started at
//!   `recordcount`, whose last value starts at `recordcount − 1`: the zipfian covers one key
//!   fewer than the table, and key 0 is drawn only through that rounding.
//! - The acknowledged counter ([`AcknowledgedCounter`]) hands out insert key numbers in order;
//!   `doTransactionInsert` acknowledges each once its insert returns, failed or not, and the
//!   counter's last value only moves past keys that are all acknowledged, through a window of
//!   2^20 slots.
//! - `CoreWorkload.nextKeynum` redraws while the key exceeds that last value, so reads never ask
//!   for a key whose insert is still in flight; for workload C, this drops the scrambled
//!   zipfian's one key past the table. It narrows the drawn value with `intValue()` first, which
//!   only matters for tables above 2^31 keys.
//!
//! The Java classes draw from `ThreadLocalRandom`; these take any [`rand::Rng`], a uniform
//! `f64` in `[0, 1)` in place of `nextDouble()`. Java's `Math.pow` and Rust's `powf` (libm)
//! agreed on every zeta sum compared. Unlike the Java classes, these are not shared between
//! threads: a driver gives each thread its own generator, or wraps one in a lock.
//!
//! ```
//! use bench::ycsb::generators::{AcknowledgedCounter, ScrambledZipfian, SkewedLatest, key_name};
//! use rand::SeedableRng;
//!
//! let mut rng = rand::rngs::StdRng::seed_from_u64(1);
//! // Workload C over 1000 records: zipfian keys, redrawn past the last inserted one.
//! let inserted = AcknowledgedCounter::new(1000);
//! let mut chooser = ScrambledZipfian::new(0, 1000);
//! let keynum = loop {
//!     let k = chooser.next(&mut rng);
//!     if k <= inserted.last() {
//!         break k;
//!     }
//! };
//! assert!(key_name(keynum).starts_with("user"));
//!
//! // Workload D: the latest keys are the hottest, and an insert makes its key readable.
//! let mut inserted = AcknowledgedCounter::new(1000);
//! let mut chooser = SkewedLatest::new(inserted.last());
//! let key = inserted.next();
//! inserted.acknowledge(key);
//! assert!(chooser.next(inserted.last(), &mut rng) <= 1000);
//! ```

use std::fmt;

use rand::{Rng, RngExt};

/// FNV-1a's 64-bit offset basis, `Utils.FNV_OFFSET_BASIS_64`.
const FNV_OFFSET_BASIS: i64 = 0xCBF2_9CE4_8422_2325_u64 as i64;

/// FNV's 64-bit prime, `Utils.FNV_PRIME_64`.
const FNV_PRIME: i64 = 1_099_511_628_211;

/// YCSB's hash of a key number (`Utils.fnvhash64`): FNV-1a over the eight bytes, low byte first,
/// then `Math.abs`.
///
/// `Math.abs(Long.MIN_VALUE)` is `Long.MIN_VALUE`, hence `i64` and `wrapping_abs`.
///
/// ```
/// assert_eq!(bench::ycsb::generators::fnvhash64(0), 6284781860667377211);
/// ```
pub fn fnvhash64(value: i64) -> i64 {
    let mut hash = FNV_OFFSET_BASIS;
    let mut rest = value;
    for _ in 0..8 {
        hash ^= rest & 0xff;
        hash = hash.wrapping_mul(FNV_PRIME);
        rest >>= 8;
    }
    hash.wrapping_abs()
}

/// The key YCSB's `CoreWorkload` stores for key number `keynum` under its defaults (hashed
/// insert order, no zero padding).
///
/// ```
/// assert_eq!(bench::ycsb::generators::key_name(1), "user8517097267634966620");
/// ```
pub fn key_name(keynum: u64) -> String {
    format!("user{}", fnvhash64(keynum as i64))
}

/// `ZipfianGenerator.zetastatic(n, theta)`: `Σ_{i<n} 1/(i+1)^theta`, summed in Java's order so
/// that the result is the same `f64`.
///
/// One `powf` per item: for a million items, milliseconds in release.
///
/// ```
/// assert_eq!(bench::ycsb::generators::zeta(2, 0.99), 1.0 + 0.5f64.powf(0.99));
/// ```
pub fn zeta(n: u64, theta: f64) -> f64 {
    zeta_from(0, n, theta, 0.0)
}

/// Extends a zeta sum over `0..start` (which is `sum`) to `0..n`, as `zetastatic(st, n, theta,
/// initialsum)` does.
fn zeta_from(start: u64, n: u64, theta: f64, sum: f64) -> f64 {
    (start..n).fold(sum, |sum, i| sum + 1.0 / ((i + 1) as f64).powf(theta))
}

/// The skew YCSB uses everywhere (`ZipfianGenerator.ZIPFIAN_CONSTANT`).
pub const ZIPFIAN_CONSTANT: f64 = 0.99;

/// `ZipfianGenerator`: item `min + r` with probability about ∝ 1/(r+1)^0.99, most popular first.
///
/// ```
/// use bench::ycsb::generators::Zipfian;
/// use rand::SeedableRng;
///
/// let mut rng = rand::rngs::StdRng::seed_from_u64(7);
/// let mut zipfian = Zipfian::new(10, 19);
/// let hits = (0..1000).filter(|_| zipfian.next(&mut rng) == 10).count();
/// assert!(hits > 200, "the first item is the most popular");
/// ```
#[derive(Debug, Clone)]
pub struct Zipfian {
    /// `max - min + 1` at construction; `eta` keeps using it after the item count grows.
    items: u64,
    base: u64,
    theta: f64,
    /// `zeta(2, theta)`.
    zeta2theta: f64,
    /// `1 / (1 - theta)`.
    alpha: f64,
    /// `zeta(countforzeta, theta)`.
    zetan: f64,
    eta: f64,
    /// The item count `zetan` sums over.
    countforzeta: u64,
    /// `1 + 0.5^theta`, the threshold of the second item (Java computes it at every draw).
    second: f64,
}

impl Zipfian {
    /// Items `min..=max` with YCSB's skew, zeta summed here.
    pub fn new(min: u64, max: u64) -> Zipfian {
        Self::with_zetan(min, max, zeta(max - min + 1, ZIPFIAN_CONSTANT))
    }

    /// Items `min..=max` with a zeta sum the caller computed before (YCSB's own shortcut for
    /// ranges too large to sum).
    pub fn with_zetan(min: u64, max: u64, zetan: f64) -> Zipfian {
        Self::from_parts(min, max - min + 1, ZIPFIAN_CONSTANT, zetan)
    }

    /// The four-argument constructor, with the item count instead of `max` so that zero items
    /// (`SkewedLatest` of an empty basis) needs no `max` of `-1`.
    fn from_parts(base: u64, items: u64, theta: f64, zetan: f64) -> Zipfian {
        let zeta2theta = zeta(2, theta);
        Zipfian {
            items,
            base,
            theta,
            zeta2theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta: eta(items, theta, zeta2theta, zetan),
            countforzeta: items,
            second: 1.0 + 0.5f64.powf(theta),
        }
    }

    /// `nextLong(itemcount)`: a draw over `itemcount` items from `min`; more items than before
    /// extend the zeta sum (with YCSB's stale `eta`), fewer are drawn with the old sum.
    pub fn next_long<R: Rng + ?Sized>(&mut self, itemcount: u64, rng: &mut R) -> u64 {
        if itemcount > self.countforzeta {
            self.grow(itemcount);
        }
        let u: f64 = rng.random();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < self.second {
            return self.base + 1;
        }
        // Java's `(long)` and Rust's `as` agree: truncation, saturation, NaN to 0.
        self.base + (itemcount as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64
    }

    /// `nextValue()`: a draw over the constructor's items.
    pub fn next<R: Rng + ?Sized>(&mut self, rng: &mut R) -> u64 {
        self.next_long(self.items, rng)
    }

    /// Extends the zeta sum to `itemcount` items; kept off the draw's path.
    #[cold]
    fn grow(&mut self, itemcount: u64) {
        self.zetan = zeta_from(self.countforzeta, itemcount, self.theta, self.zetan);
        self.countforzeta = itemcount;
        self.eta = eta(self.items, self.theta, self.zeta2theta, self.zetan);
    }
}

/// Gray et al.'s `eta`, as YCSB writes it.
fn eta(items: u64, theta: f64, zeta2theta: f64, zetan: f64) -> f64 {
    (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2theta / zetan)
}

/// `ScrambledZipfianGenerator.ITEM_COUNT`: the inner zipfian's `max`.
const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;

/// `ScrambledZipfianGenerator.ZETAN`: the inner zipfian's zeta, precomputed by YCSB.
const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

/// `ScrambledZipfianGenerator`: zipfian popularity spread over `min..=max` by hashing, so that
/// the hot keys are not neighbours.
///
/// ```
/// use bench::ycsb::generators::ScrambledZipfian;
/// use rand::SeedableRng;
///
/// let mut rng = rand::rngs::StdRng::seed_from_u64(7);
/// let mut keys = ScrambledZipfian::new(100, 199);
/// assert!((0..1000).all(|_| (100..=199).contains(&keys.next(&mut rng))));
/// ```
#[derive(Debug, Clone)]
pub struct ScrambledZipfian {
    min: u64,
    itemcount: u64,
    inner: Zipfian,
}

impl ScrambledZipfian {
    /// Keys `min..=max`.
    pub fn new(min: u64, max: u64) -> ScrambledZipfian {
        ScrambledZipfian {
            min,
            itemcount: max - min + 1,
            inner: Zipfian::with_zetan(0, SCRAMBLED_ITEM_COUNT, SCRAMBLED_ZETAN),
        }
    }

    /// `nextValue()`.
    pub fn next<R: Rng + ?Sized>(&mut self, rng: &mut R) -> u64 {
        let x = self.inner.next(rng);
        // Java's `%` on longs; the hash is negative only for `Long.MIN_VALUE`'s preimage, if any.
        let offset = fnvhash64(x as i64) % self.itemcount as i64;
        (self.min as i64 + offset) as u64
    }
}

/// `SkewedLatestGenerator`: the most recently inserted keys are the most popular.
///
/// ```
/// use bench::ycsb::generators::SkewedLatest;
/// use rand::SeedableRng;
///
/// let mut rng = rand::rngs::StdRng::seed_from_u64(7);
/// let mut latest = SkewedLatest::new(999);
/// let recent = (0..1000).filter(|_| latest.next(999, &mut rng) >= 990).count();
/// assert!(recent > 300, "the last keys are the hottest");
/// ```
#[derive(Debug, Clone)]
pub struct SkewedLatest {
    zipfian: Zipfian,
}

impl SkewedLatest {
    /// A generator over a basis whose `lastValue()` is `last` now: a zipfian over `last` items.
    pub fn new(last: u64) -> SkewedLatest {
        SkewedLatest {
            zipfian: Zipfian::from_parts(0, last, ZIPFIAN_CONSTANT, zeta(last, ZIPFIAN_CONSTANT)),
        }
    }

    /// `nextValue()`, where `last` is the basis's `lastValue()` now.
    pub fn next<R: Rng + ?Sized>(&mut self, last: u64, rng: &mut R) -> u64 {
        last - self.zipfian.next_long(last, rng)
    }
}

/// `AcknowledgedCounterGenerator.WINDOW_SIZE`: how far acknowledgements may run ahead of the
/// oldest unacknowledged key.
const WINDOW: usize = 1 << 20;

/// `AcknowledgedCounterGenerator`: insert key numbers, and the last one below which every insert
/// has finished.
///
/// ```
/// use bench::ycsb::generators::AcknowledgedCounter;
///
/// let mut keys = AcknowledgedCounter::new(10);
/// let (a, b) = (keys.next(), keys.next());
/// keys.acknowledge(b);
/// assert_eq!(keys.last(), 9, "key 10 is still being inserted");
/// keys.acknowledge(a);
/// assert_eq!(keys.last(), 11);
/// ```
#[derive(Clone)]
pub struct AcknowledgedCounter {
    /// The next key number to hand out (`CounterGenerator.counter`).
    counter: u64,
    /// `lastValue()`: every key up to here is acknowledged.
    limit: u64,
    /// Acknowledged keys above `limit`, by key modulo the window.
    window: Vec<bool>,
}

impl AcknowledgedCounter {
    /// A counter whose first key is `start` and whose last value is `start - 1`.
    ///
    /// # Panics
    ///
    /// If `start` is 0: YCSB's last value would be -1, which no key number is below (YCSB
    /// starts at `recordcount`, and takes 0 records to mean `i32::MAX`).
    pub fn new(start: u64) -> AcknowledgedCounter {
        assert!(
            start > 0,
            "an acknowledged counter starts at 1 or above (YCSB's recordcount)"
        );
        AcknowledgedCounter {
            counter: start,
            limit: start - 1,
            window: vec![false; WINDOW],
        }
    }

    /// The next key number to insert (`nextValue()`).
    #[allow(clippy::should_implement_trait)] // never ends: an `Option` would only be unwrapped
    pub fn next(&mut self) -> u64 {
        let value = self.counter;
        self.counter += 1;
        value
    }

    /// Marks the insert of `value` as finished, and moves the last value over every key
    /// acknowledged in a row (`acknowledge(value)`).
    ///
    /// # Panics
    ///
    /// If `value`'s slot still holds a key `2^20` earlier that is acknowledged but not yet passed,
    /// YCSB's "Too many unacknowledged insertion keys".
    pub fn acknowledge(&mut self, value: u64) {
        let mask = WINDOW as u64 - 1;
        let slot = (value & mask) as usize;
        assert!(
            !self.window[slot],
            "too many unacknowledged insertion keys: key {value} is 2^20 or more past the oldest \
             key not yet acknowledged; acknowledge every key handed out"
        );
        self.window[slot] = true;
        // Java also stops the walk at `index == (limit & mask)`, a key compared with a slot,
        // which never holds once `limit >= 0`. The walk ends within one lap all the same: it
        // clears each slot it passes.
        let mut index = self.limit + 1;
        while self.window[(index & mask) as usize] {
            self.window[(index & mask) as usize] = false;
            index += 1;
        }
        self.limit = index - 1;
    }

    /// `lastValue()`: the highest key number with every insert up to it finished.
    pub fn last(&self) -> u64 {
        self.limit
    }
}

impl fmt::Debug for AcknowledgedCounter {
    /// The counter and the limit; the window's million slots would bury them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcknowledgedCounter")
            .field("counter", &self.counter)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    //! Expected values were printed by YCSB 0.17.0 itself (private fields read by reflection).

    use std::convert::Infallible;

    use rand::TryRng;

    use super::*;

    /// An rng whose `random::<f64>()` is always `u`.
    struct Fixed(u64);

    impl Fixed {
        fn new(u: f64) -> Fixed {
            // `StandardUniform` takes the top 53 bits: `(x >> 11) * 2^-53`.
            Fixed(((u * (1u64 << 53) as f64) as u64) << 11)
        }
    }

    impl TryRng for Fixed {
        type Error = Infallible;
        fn try_next_u32(&mut self) -> Result<u32, Infallible> {
            Ok((self.0 >> 32) as u32)
        }
        fn try_next_u64(&mut self) -> Result<u64, Infallible> {
            Ok(self.0)
        }
        fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
            dst.fill(0);
            Ok(())
        }
    }

    #[test]
    fn fnvhash64_matches_java() {
        let java = [
            (0, 6284781860667377211),
            (1, 8517097267634966620),
            (255, 8064062821143829734),
            (10_000_000_000, 1201321332300452516),
            (-1, 8289690350564177859),
            (i64::MIN, 6284922598155788219),
            (i64::MAX, 8289549613075766851),
        ];
        for (input, hash) in java {
            assert_eq!(fnvhash64(input), hash, "fnvhash64({input})");
        }
        // No input hashing to `Long.MIN_VALUE` is known; Java's `Math.abs` keeps it negative.
        assert_eq!(i64::MIN.wrapping_abs(), i64::MIN);
    }

    #[test]
    fn key_name_matches_java() {
        assert_eq!(key_name(0), "user6284781860667377211");
        assert_eq!(key_name(42), "user55488592825689361");
    }

    #[test]
    fn zeta_matches_java_bit_for_bit() {
        assert_eq!(zeta(0, 0.99).to_bits(), 0);
        assert_eq!(zeta(2, 0.99).to_bits(), 0x3ff8_0e3e_b620_2786);
        assert_eq!(zeta(1000, 0.99).to_bits(), 4620388046134719779);
    }

    #[test]
    fn constructors_match_java_fields() {
        let z = Zipfian::new(0, 999);
        assert_eq!(z.zetan.to_bits(), 0x401e_ea72_b652_3523);
        assert_eq!(z.eta.to_bits(), 0x3fb3_267d_dff2_a771);
        assert_eq!(z.alpha.to_bits(), 0x4058_ffff_ffff_fffa);
        assert_eq!(z.zeta2theta.to_bits(), 0x3ff8_0e3e_b620_2786);
        assert_eq!(z.second.to_bits(), 0x3ff8_0e3e_b620_2786);

        let s = ScrambledZipfian::new(0, 999);
        assert_eq!(s.inner.items, 10_000_000_001);
        assert_eq!(s.inner.eta.to_bits(), 0x3fcb_295e_e6b6_1936);

        let l = SkewedLatest::new(999);
        assert_eq!(l.zipfian.items, 999);
        assert_eq!(l.zipfian.zetan.to_bits(), 0x401e_e959_d1e0_b728);
        assert_eq!(l.zipfian.eta.to_bits(), 0x3fb3_25e4_0ebc_1d60);
    }

    #[test]
    fn growing_extends_zeta_but_keeps_the_old_item_count_in_eta() {
        let mut z = Zipfian::new(0, 499);
        z.next_long(1000, &mut Fixed::new(0.0));
        assert_eq!(z.countforzeta, 1000);
        assert_eq!(
            z.zetan.to_bits(),
            0x401e_ea72_b652_3523,
            "as if summed from 0"
        );
        assert_eq!(
            z.eta.to_bits(),
            0x3fb1_12aa_5324_cc99,
            "YCSB's eta with 500 items"
        );
        // Fewer items again leave everything as it is.
        z.next_long(700, &mut Fixed::new(0.0));
        assert_eq!(z.countforzeta, 1000);
        assert_eq!(z.eta.to_bits(), 0x3fb1_12aa_5324_cc99);
    }

    #[test]
    fn the_first_two_items_come_from_thresholds() {
        let mut z = Zipfian::new(5, 1004);
        let zetan = z.zetan;
        assert_eq!(z.next(&mut Fixed::new(0.0)), 5);
        assert_eq!(z.next(&mut Fixed::new(0.99 / zetan)), 5);
        assert_eq!(z.next(&mut Fixed::new(1.01 / zetan)), 6);
        assert!(z.next(&mut Fixed::new(0.5)) > 6);
        assert!(z.next(&mut Fixed::new(1.0 - 1e-9)) <= 1004);
        // As in Java: `eta·u − eta + 1` rounds to 1 within a few ulps of `u = 1`, which gives
        // one past the last item (chance about 10^-15).
        assert_eq!(z.next(&mut Fixed::new(1.0 - f64::EPSILON)), 1005);
    }

    #[test]
    fn acknowledged_counter_passes_only_contiguous_keys() {
        let mut c = AcknowledgedCounter::new(100);
        assert_eq!(c.last(), 99);
        let keys: Vec<u64> = (0..5).map(|_| c.next()).collect();
        assert_eq!(keys, [100, 101, 102, 103, 104]);
        c.acknowledge(101);
        c.acknowledge(103);
        assert_eq!(c.last(), 99);
        c.acknowledge(100);
        assert_eq!(c.last(), 101);
        c.acknowledge(102);
        assert_eq!(c.last(), 103);
        c.acknowledge(104);
        assert_eq!(c.last(), 104);
    }

    #[test]
    fn acknowledged_counter_wraps_its_window() {
        let mut c = AcknowledgedCounter::new(WINDOW as u64 - 3);
        for _ in 0..10 {
            let k = c.next();
            c.acknowledge(k);
        }
        assert_eq!(c.last(), WINDOW as u64 + 6);
    }
}
