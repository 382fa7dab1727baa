//! The property a trustee keeps for one lock: the table, and the reply of every request that
//! waits, which the trustee sends the moment the request is granted — by an unlock, a
//! downgrade or another request's deadline, whichever frees its ranges.

use std::collections::HashMap;

use gossamer::{Reply, ReplyId};

use crate::part::{Id, Parts, check};
use crate::table::Table;

/// One lock's state on its trustee.
#[derive(Debug)]
pub(crate) struct Service {
    /// The lock's units: `0..units`.
    units: u64,
    table: Table,
    /// The replies of waiting requests.
    waiting: HashMap<Id, Reply<Id>>,
    /// Which request each waiting reply answers (for `expire`).
    by_reply: HashMap<ReplyId, Id>,
    /// Scratch list of requests granted by one step.
    granted: Vec<Id>,
}

impl Service {
    pub(crate) fn new(units: u64) -> Self {
        Service {
            units,
            table: Table::default(),
            waiting: HashMap::new(),
            by_reply: HashMap::new(),
            granted: Vec::new(),
        }
    }

    /// Refuses parts the table must never hold (a caller checks them first; this is for a
    /// peer that did not): the panic reaches the caller.
    fn checked(&self, parts: &Parts) {
        if let Err(e) = check(parts, self.units) {
            panic!("rangelock: {e}");
        }
    }

    /// A lock request: granted now, or its reply kept until it is.
    pub(crate) fn lock(&mut self, parts: Parts, reply: Reply<Id>) {
        self.checked(&parts);
        let (id, now) = self.table.lock(parts);
        if now {
            if reply.send(id).is_err() {
                // Its caller is gone already (a deadline that passed on the way).
                self.release(id);
            }
        } else {
            self.by_reply.insert(reply.id(), id);
            self.waiting.insert(id, reply);
        }
    }

    /// Grants `parts` if nothing conflicts with them now.
    pub(crate) fn try_lock(&mut self, parts: Parts) -> Option<Id> {
        self.checked(&parts);
        self.table.try_lock(parts)
    }

    /// Unlocks held request `id` (or withdraws a waiting one), answering the requests that
    /// this frees.
    pub(crate) fn release(&mut self, id: Id) {
        self.granted.clear();
        if self.table.release(id, &mut self.granted) {
            self.answer_granted();
        }
    }

    /// Splits held request `id` at unit `at`: the id of its upper half.
    pub(crate) fn split(&mut self, id: Id, at: u64) -> Option<Id> {
        self.table.split(id, at)
    }

    /// Makes held request `id` a reader, answering the readers this lets in.
    pub(crate) fn downgrade(&mut self, id: Id) -> bool {
        self.granted.clear();
        let done = self.table.downgrade(id, &mut self.granted);
        self.answer_granted();
        done
    }

    /// The deadline of the request whose reply is `reply` passed first: it leaves the table
    /// (its caller gets `TimedOut`), and the requests that waited only for it are granted.
    pub(crate) fn expire(&mut self, reply: ReplyId) {
        if let Some(id) = self.by_reply.remove(&reply) {
            // The reply can no longer be sent; dropping it is harmless now.
            self.waiting.remove(&id);
            self.release(id);
        }
    }

    /// Sends the replies of the requests in `granted`, in arrival order.
    fn answer_granted(&mut self) {
        let mut granted = std::mem::take(&mut self.granted);
        let mut at = 0;
        while at < granted.len() {
            let id = granted[at];
            at += 1;
            let reply = self.waiting.remove(&id).expect("a granted request waited");
            self.by_reply.remove(&reply.id());
            if reply.send(id).is_err() {
                // Ended meanwhile: release it, and grant whatever waited for it.
                self.table.release(id, &mut granted);
            }
        }
        granted.clear();
        self.granted = granted;
    }

    /// Requests held or waiting.
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }
}
