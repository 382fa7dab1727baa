//! The property a trustee keeps for one lock: the table, and how each waiting request learns
//! of its grant — its reply, sent the moment the request is granted (by an unlock, a
//! downgrade or another request's deadline, whichever frees its ranges), or, for the seed's
//! polling designs kept as baselines, nothing (the client asks again) or a flag in a region
//! that the client reads.

use std::collections::{HashMap, HashSet};

use gossamer::{Region, Reply, ReplyId};
use serde::{Deserialize, Serialize};

use crate::part::{Id, Parts, check};
use crate::table::Table;

/// One lock's state on its trustee.
#[derive(Debug)]
pub(crate) struct Service {
    /// The lock's units: `0..units`.
    units: u64,
    table: Table,
    /// How each waiting request learns of its grant.
    waiting: HashMap<Id, Waiter>,
    /// The flags of `Notify::PollFlag`, once a client has set them up.
    flags: Option<Flags>,
    /// Which request each waiting reply answers (for `expire`).
    by_reply: HashMap<ReplyId, Id>,
    /// Scratch list of requests granted by one step.
    granted: Vec<Id>,
}

/// How a waiting request learns of its grant.
#[derive(Debug)]
enum Waiter {
    /// Its reply is sent.
    Reply(Reply<Id>),
    /// Its client asks (`poll`).
    Polled,
    /// Its flag is raised.
    Flag(usize),
}

/// How far apart the flags of waiting requests lie in their region.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum FlagSpacing {
    /// One byte each, eight to a word, as in the seed: neighbours share a cache line.
    Byte,
    /// One cache line (64 bytes) each.
    Line,
}

impl FlagSpacing {
    /// The region words that `slots` flags take.
    pub(crate) fn words(self, slots: usize) -> usize {
        match self {
            FlagSpacing::Byte => slots.div_ceil(8),
            FlagSpacing::Line => slots * 8,
        }
    }

    /// Where flag `slot` lies: its word, and the bit that is raised in it.
    pub(crate) fn place(self, slot: usize) -> (usize, u64) {
        match self {
            FlagSpacing::Byte => (slot / 8, 1 << (8 * (slot % 8))),
            FlagSpacing::Line => (slot * 8, 1),
        }
    }
}

/// The flags of one lock: a region on the trustee's node, one slot per waiting request.
#[derive(Debug)]
struct Flags {
    region: Region,
    spacing: FlagSpacing,
    free: Vec<usize>,
    /// Each request's slot, from its lock until its release.
    of: HashMap<Id, usize>,
    /// Slots whose flag is up.
    raised: HashSet<usize>,
}

impl Flags {
    /// Raises (`up`) or lowers flag `slot`; a raise is visible to a reader of its word once
    /// the trustee's next request runs (a local atomic).
    fn set(&mut self, slot: usize, up: bool) {
        let (word, bit) = self.spacing.place(slot);
        let delta = if up { bit } else { bit.wrapping_neg() };
        self.region.fetch_add(word, delta).then(|done| {
            if let Err(e) = done {
                panic!("rangelock: a flag of this lock's own region failed: {e}");
            }
        });
    }

    /// Frees request `id`'s slot, lowering its flag if it is up.
    fn free(&mut self, id: Id) {
        if let Some(slot) = self.of.remove(&id) {
            if self.raised.remove(&slot) {
                self.set(slot, false);
            }
            self.free.push(slot);
        }
    }
}

impl Service {
    pub(crate) fn new(units: u64) -> Self {
        Service {
            units,
            table: Table::default(),
            waiting: HashMap::new(),
            flags: None,
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

    /// A lock request (`counted` if it is its lock call's first piece): granted now, or its
    /// reply kept until it is.
    pub(crate) fn lock(&mut self, (parts, counted): (Parts, bool), reply: Reply<Id>) {
        self.checked(&parts);
        let (id, now) = self.table.lock(parts, counted);
        if now {
            if reply.send(id).is_err() {
                // Its caller is gone already (a deadline that passed on the way).
                self.release(id);
            }
        } else {
            self.by_reply.insert(reply.id(), id);
            self.waiting.insert(id, Waiter::Reply(reply));
        }
    }

    /// A lock request of a polling client: its id, whether it is granted now, and, if it
    /// waits and `flag` is asked for and a slot is free, the flag slot that will be raised
    /// when it is (without one, the client polls with [`Service::poll`]).
    pub(crate) fn lock_polled(
        &mut self,
        (parts, counted): (Parts, bool),
        flag: bool,
    ) -> (Id, bool, Option<usize>) {
        self.checked(&parts);
        let (id, now) = self.table.lock(parts, counted);
        if now {
            return (id, true, None);
        }
        let slot = match &mut self.flags {
            Some(flags) if flag => flags.free.pop().inspect(|&slot| {
                flags.of.insert(id, slot);
            }),
            _ => None,
        };
        let waiter = slot.map_or(Waiter::Polled, Waiter::Flag);
        self.waiting.insert(id, waiter);
        (id, false, slot)
    }

    /// Whether polled request `id` is granted.
    pub(crate) fn poll(&self, id: Id) -> bool {
        self.table.is_held(id)
    }

    /// Takes `region` (on this node, lowered) for `slots` flags `spacing` apart.
    pub(crate) fn use_flags(&mut self, region: Region, spacing: FlagSpacing, slots: usize) {
        self.flags = Some(Flags {
            region,
            spacing,
            free: (0..slots).rev().collect(),
            of: HashMap::new(),
            raised: HashSet::new(),
        });
    }

    /// Grants `parts` if nothing conflicts with them now.
    pub(crate) fn try_lock(&mut self, (parts, counted): (Parts, bool)) -> Option<Id> {
        self.checked(&parts);
        self.table.try_lock(parts, counted)
    }

    /// Unlocks held request `id` (or withdraws a waiting one), answering the requests that
    /// this frees.
    pub(crate) fn release(&mut self, id: Id) {
        self.waiting.remove(&id);
        if let Some(flags) = &mut self.flags {
            flags.free(id);
        }
        self.granted.clear();
        if self.table.release(id, &mut self.granted) {
            self.answer_granted();
        }
    }

    /// Splits held request `id` at unit `at`: the id of its upper half, counted as a request.
    pub(crate) fn split(&mut self, id: Id, at: u64) -> Option<Id> {
        self.table.split(id, at)
    }

    /// Counts held request `id` as a request of its own (it became a guard's first piece).
    pub(crate) fn count(&mut self, id: Id) -> bool {
        self.table.count(id)
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
            match self.waiting.remove(&id).expect("a granted request waited") {
                Waiter::Reply(reply) => {
                    self.by_reply.remove(&reply.id());
                    if reply.send(id).is_err() {
                        // Ended meanwhile: release it, and grant whatever waited for it.
                        self.table.release(id, &mut granted);
                    }
                }
                // Its client sees it held at its next poll.
                Waiter::Polled => {}
                Waiter::Flag(slot) => {
                    let flags = self.flags.as_mut().expect("a flag waiter has flags");
                    flags.raised.insert(slot);
                    flags.set(slot, true);
                }
            }
        }
        granted.clear();
        self.granted = granted;
    }

    /// Requests held or waiting, each lock call once (its first piece).
    pub(crate) fn requests(&self) -> usize {
        self.table.requests()
    }
}
