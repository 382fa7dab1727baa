//! The key-value workload every map system runs, lock-based, lock-free or delegated: its values,
//! how keys are sharded, and the checks each run makes.
//!
//! Keys are 8 bytes (`u64`), values 16 bytes (`[u64; 2]`). A value is `[stamp, mix(key ^ stamp)]`,
//! so a reader can tell whether the value it got was written for its key ([`valid`]).

use std::collections::HashMap;

use anyhow::ensure;

use crate::workload::mix;

/// A 16-byte value.
pub type Value = [u64; 2];

/// The single-threaded table inside shards and trustees.
pub type Table = HashMap<u64, Value>;

/// The value a writer with `stamp` stores under `key`.
#[inline]
pub fn value_for(key: u64, stamp: u64) -> Value {
    [stamp, mix(key ^ stamp)]
}

/// Whether `v` is a value some writer stored under `key`.
#[inline]
pub fn valid(key: u64, v: &Value) -> bool {
    v[1] == mix(key ^ v[0])
}

/// Shard of `key` among `shards` (a power of two or not).
#[inline]
pub fn shard_of(key: u64, shards: usize) -> usize {
    (((mix(key) >> 32) * shards as u64) >> 32) as usize
}

/// Checks done by the clients during a run, summed over clients.
#[derive(Debug, Default, Clone, Copy)]
pub struct OpChecks {
    /// Reads issued.
    pub reads: u64,
    /// Writes issued.
    pub writes: u64,
    /// Reads that found no value for a pre-filled key.
    pub missing: u64,
    /// Reads or replaced values that did not belong to their key.
    pub invalid: u64,
    /// Writes that did not replace a value (the key was absent).
    pub inserted: u64,
}

impl OpChecks {
    /// Adds another client's checks.
    pub fn merge(&mut self, o: &OpChecks) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.missing += o.missing;
        self.invalid += o.invalid;
        self.inserted += o.inserted;
    }

    /// Records the outcome of a read of `key`.
    #[inline]
    pub fn read(&mut self, key: u64, got: Option<Value>) {
        self.reads += 1;
        match got {
            None => self.missing += 1,
            Some(v) => self.invalid += u64::from(!valid(key, &v)),
        }
    }

    /// Records the outcome of a write to `key`.
    #[inline]
    pub fn wrote(&mut self, key: u64, old: Option<Value>) {
        self.writes += 1;
        match old {
            None => self.inserted += 1,
            Some(v) => self.invalid += u64::from(!valid(key, &v)),
        }
    }

    /// Fails unless every operation saw what it should.
    pub fn ensure_clean(&self, name: &str) -> anyhow::Result<()> {
        ensure!(
            self.missing == 0,
            "{name}: {} reads found no value for a pre-filled key",
            self.missing
        );
        ensure!(
            self.invalid == 0,
            "{name}: {} operations saw a value not written for their key",
            self.invalid
        );
        ensure!(
            self.inserted == 0,
            "{name}: {} writes found their pre-filled key absent",
            self.inserted
        );
        Ok(())
    }
}

/// Checks that a map holds exactly keys `0..n`, each with a valid value.
pub fn verify_contents(
    name: &str,
    n: usize,
    scan: impl FnOnce(&mut dyn FnMut(u64, &Value)) -> usize,
) -> anyhow::Result<()> {
    let (mut bad, mut out_of_range) = (0usize, 0usize);
    let len = scan(&mut |k, v| {
        bad += usize::from(!valid(k, v));
        out_of_range += usize::from(k >= n as u64);
    });
    ensure!(
        len == n,
        "{name}: table holds {len} entries after the run, expected {n}"
    );
    ensure!(
        out_of_range == 0,
        "{name}: {out_of_range} keys outside 0..{n} after the run"
    );
    ensure!(
        bad == 0,
        "{name}: {bad} entries hold a value that was never written for their key"
    );
    Ok(())
}
