//! [`ShardMap`]: the delegated twin of [`DMap`](crate::DMap), to compare the two designs.

use std::collections::HashMap;

use gossamer::{Node, Trust};
use serde::{Deserialize, Serialize};

use crate::msw::hash;

type Shard = HashMap<u64, u64>;

/// A map of `u64` keys to `u64` values whose shards are entrusted to the trustees of its
/// nodes: every operation is one delegated call to its key's shard, which runs on the
/// shard's trustee (the closure travels, the data stays), so no lock, checksum or
/// acknowledgement is needed; a caller keeps many in flight with the `_then` forms.
///
/// The handle travels in arguments like a [`Trust`] and is cheap to clone.
///
/// ```
/// let code = gossamer::Rack::from_env().run(|| {
///     let nodes: Vec<_> = gossamer::nodes().collect();
///     let map = objects::ShardMap::new(&nodes, 2);
///     assert_eq!(map.insert(7, 70), None);
///     assert_eq!(map.get(7), Some(70));
///     let group = gossamer::Group::new();
///     map.get_then(7, group.track(|v| assert_eq!(v, Some(70)))); // does not wait
///     group.wait();
///     assert_eq!(map.remove(7), Some(70));
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
#[derive(Clone, Serialize, Deserialize)]
pub struct ShardMap {
    shards: Vec<Trust<Shard>>,
}

impl std::fmt::Debug for ShardMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardMap")
            .field("shards", &self.shards.len())
            .finish()
    }
}

impl ShardMap {
    /// A map of `per_worker` shards on each worker of each of `nodes`.
    ///
    /// # Panics
    /// If `nodes` is empty or `per_worker` is 0.
    pub fn new(nodes: &[Node], per_worker: usize) -> ShardMap {
        assert!(
            !nodes.is_empty() && per_worker > 0,
            "a shard map needs a node and a shard per worker"
        );
        let mut shards = Vec::new();
        for _ in 0..per_worker {
            for node in nodes {
                for w in 0..node.workers() {
                    shards.push(node.trustee(w).entrust_with(|()| Shard::new(), ()));
                }
            }
        }
        ShardMap { shards }
    }

    fn shard(&self, key: u64) -> &Trust<Shard> {
        &self.shards[(hash([key]) % self.shards.len() as u64) as usize]
    }

    /// The value of `key`.
    pub fn get(&self, key: u64) -> Option<u64> {
        self.shard(key).apply_with(|s, k| s.get(&k).copied(), key)
    }

    /// Sets `key` to `value`; its previous value.
    pub fn insert(&self, key: u64, value: u64) -> Option<u64> {
        self.shard(key)
            .apply_with(|s, (k, v)| s.insert(k, v), (key, value))
    }

    /// Removes `key`; its value, if it had one.
    pub fn remove(&self, key: u64) -> Option<u64> {
        self.shard(key).apply_with(|s, k| s.remove(&k), key)
    }

    /// [`get`](ShardMap::get) without waiting: `then` runs on this worker with the value.
    pub fn get_then(&self, key: u64, then: impl FnOnce(Option<u64>) + 'static) {
        self.shard(key)
            .apply_then_with(|s, k| s.get(&k).copied(), key, then);
    }

    /// [`insert`](ShardMap::insert) without waiting.
    pub fn insert_then(&self, key: u64, value: u64, then: impl FnOnce(Option<u64>) + 'static) {
        self.shard(key)
            .apply_then_with(|s, (k, v)| s.insert(k, v), (key, value), then);
    }
}
