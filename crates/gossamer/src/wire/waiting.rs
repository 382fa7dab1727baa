//! The requests a side waits on: each request it sends waits under its id until the one
//! answer that names it arrives. Answers come in any order — a deferred request is answered
//! when its trustee decides, long after later ones — but an answer naming an id that does not
//! wait (never sent, or answered already) breaks the protocol: it is a bad frame, and nothing
//! runs for it.

use crate::hash::ByNumber;

/// What waits for each outstanding request's answer, by id.
pub(crate) struct Waiting<V>(ByNumber<V>);

impl<V> Default for Waiting<V> {
    fn default() -> Self {
        Waiting(ByNumber::default())
    }
}

impl<V> Waiting<V> {
    /// Request `id` was sent and waits with `v`.
    pub(crate) fn insert(&mut self, id: u64, v: V) {
        self.0.insert(id, v);
    }

    /// The answer to request `id` arrived: what waited for it, which no longer waits.
    pub(crate) fn answer(&mut self, id: u64) -> Result<V, String> {
        self.0
            .remove(&id)
            .ok_or_else(|| format!("answer to unknown request {id}"))
    }

    /// Everything that waits, taken out: the peer is gone and no answer will come.
    pub(crate) fn drain(&mut self) -> Vec<V> {
        self.0.drain().map(|(_, v)| v).collect()
    }
}
