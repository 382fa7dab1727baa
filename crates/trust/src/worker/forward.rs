//! The trustee side of moved properties (the protocol is in `home`): serving a batch record by
//! record once this trustee has given a property away, parking a batch whose records must go
//! to another home, sending them there in groups, running the groups other trustees send
//! here, and answering a parked batch once its records are back.
//!
//! Everything here belongs to the worker's thread, except the groups, which travel through
//! the registry's mailboxes.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};

use super::{Running, Worker};
use crate::home::{Group, Header};
use crate::request::{self, BatchWords};

/// A worker's forwarding state.
pub(super) struct Forwarding {
    /// Whether this trustee has ever given a property away: from then on it checks the home
    /// of every record it serves (until then, every record it receives is its own).
    lost: Cell<bool>,
    /// Per client: the records of its parked batch that are away (0: no batch parked).
    parked: RefCell<Box<[usize]>>,
    /// How many clients have a parked batch.
    parked_batches: Cell<usize>,
    /// Per property (by address): its records here that wait to be sent on, in order, and
    /// whether a group of it is out. An entry exists while either is the case.
    waiting: RefCell<HashMap<usize, Waiting>>,
}

/// What becomes of a record a trustee serves once it has given properties away.
enum Fate {
    Run,
    Forward,
    Refuse,
}

#[derive(Default)]
struct Waiting {
    /// Client and record address, in the order they must run.
    records: VecDeque<(usize, *mut u64)>,
    out: bool,
}

impl Forwarding {
    pub(super) fn new(clients: usize) -> Self {
        Forwarding {
            lost: Cell::new(false),
            parked: RefCell::new(vec![0; clients].into_boxed_slice()),
            parked_batches: Cell::new(0),
            waiting: RefCell::new(HashMap::new()),
        }
    }

    /// Whether `client`'s batch is parked here (the serving loop skips its channel).
    #[inline(always)]
    pub(super) fn is_parked(&self, client: usize) -> bool {
        self.parked_batches.get() != 0 && self.parked.borrow()[client] != 0
    }

    pub(super) fn has_lost(&self) -> bool {
        self.lost.get()
    }
}

impl Worker {
    /// This trustee has just moved the property at `property` to `to` (see `home`).
    pub(crate) fn gave_away(&self, property: *const (), to: usize) {
        self.forwarding.lost.set(true);
        self.gave_work_away.set(true);
        self.counters().moved_away();
        self.counters().forget(property as usize);
        self.registry.counters[to].entrusted();
    }

    /// This trustee has just withdrawn the property at `property` from the runtime (see
    /// `home`): from now on it checks every record's property, to refuse that one's.
    pub(crate) fn withdrew(&self, property: *const ()) {
        self.forwarding.lost.set(true);
        self.counters().freed();
        self.counters().forget(property as usize);
    }

    /// Serves a batch of `client` checking each record's home: runs the records whose
    /// property lives here and has nothing of its own still away, and keeps the others to
    /// send on. Returns whether the batch may be answered now (nothing was kept).
    ///
    /// # Safety
    /// As `request::run_all`'s.
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn serve_checked(
        &self,
        client: usize,
        words: &BatchWords,
        len: usize,
        sample: bool,
    ) -> bool {
        let mut kept = 0;
        let mut records = 0;
        let mut sampled = if sample {
            self.sampled.take()
        } else {
            Vec::new()
        };
        let mut last = sample.then(std::time::Instant::now);
        // SAFETY: per the caller; a record's property is null or live, read before it runs.
        unsafe {
            request::for_each_record(words, len, |record| {
                let property = request::property(record);
                if !property.is_null() {
                    match self.fate(property) {
                        Fate::Run => {}
                        Fate::Forward => {
                            self.keep_for(property, client, record);
                            kept += 1;
                            return;
                        }
                        Fate::Refuse => return request::refuse(record),
                    }
                }
                records += 1;
                // Named before it runs: a free request may end the property.
                let name = (sample && !property.is_null()).then(|| Header::of(property).type_name);
                request::run(record);
                if let Some(last) = &mut last {
                    let now = std::time::Instant::now();
                    if let Some(name) = name {
                        sampled.push((name, property as usize, now - *last));
                    }
                    *last = now;
                }
            })
        };
        if sample {
            self.counters().sample(&sampled);
            sampled.clear();
            self.sampled.set(sampled);
        }
        self.count_batch(records);
        if kept == 0 {
            return true;
        }
        let f = &self.forwarding;
        f.parked.borrow_mut()[client] = kept;
        f.parked_batches.set(f.parked_batches.get() + 1);
        self.send_groups();
        false
    }

    /// What becomes of a record for `property` served here: it runs, or goes elsewhere (the
    /// property lives elsewhere, or earlier records of it wait here or are away, and a later
    /// one must not overtake them), or is refused (the property was withdrawn).
    ///
    /// # Safety
    /// `property` is live.
    unsafe fn fate(&self, property: *const ()) -> Fate {
        // SAFETY: per the caller.
        let header = unsafe { Header::of(property) };
        if header.withdrawn() {
            return Fate::Refuse;
        }
        if header.home() != self.index {
            return Fate::Forward;
        }
        let waiting = self.forwarding.waiting.borrow();
        if !waiting.is_empty() && waiting.contains_key(&(property as usize)) {
            Fate::Forward
        } else {
            Fate::Run
        }
    }

    fn keep_for(&self, property: *const (), client: usize, record: *mut u64) {
        self.forwarding
            .waiting
            .borrow_mut()
            .entry(property as usize)
            .or_default()
            .records
            .push_back((client, record));
    }

    /// Sends a group of each property whose records wait here and have none away, to the
    /// property's home.
    fn send_groups(&self) {
        let mut waiting = self.forwarding.waiting.borrow_mut();
        for (&property, w) in waiting.iter_mut() {
            if w.out || w.records.is_empty() {
                continue;
            }
            let property = property as *const ();
            let mut group = Group {
                property,
                forwarder: self.index,
                words: Vec::new(),
                origins: Vec::with_capacity(w.records.len()),
                ran: 0,
            };
            for (client, record) in w.records.drain(..) {
                // SAFETY: the record lies in a batch parked here, which this trustee owns,
                // and has not run; its words move into the group until it comes back.
                unsafe {
                    let len = request::length(record);
                    group
                        .words
                        .extend_from_slice(std::slice::from_raw_parts(record, len));
                }
                group.origins.push((client, record));
            }
            w.out = true;
            // SAFETY: a record of the group is parked here, so the property is alive.
            let home = unsafe { Header::of(property) }.home();
            self.registry.forwards[home].push(group);
            self.registry.parkers[home].wake();
        }
    }

    /// Runs the groups other trustees sent here, in order, each while this is still its
    /// property's home, and sends each back. Returns whether there were any.
    #[cold]
    pub(super) fn serve_groups(&self) -> bool {
        let groups = self.registry.forwards[self.index].take();
        if groups.is_empty() {
            return false;
        }
        let _delegated = self.enter(Running::Delegated);
        for mut group in groups {
            let mut at = 0;
            for &(client, _) in &group.origins {
                // SAFETY: the group's records are parked at its forwarder, so the property is
                // alive; a record that moved it runs before this check of the next one.
                let header = unsafe { Header::of(group.property) };
                let withdrawn = header.withdrawn();
                if !withdrawn && header.home() != self.index {
                    break;
                }
                self.serving(client);
                // SAFETY: `at` is the start of a record of the group, which has not run, and
                // this is its property's home (or was, when it was withdrawn here: then the
                // record is refused, not run); the group's words do not move meanwhile.
                unsafe {
                    let record = group.words.as_mut_ptr().add(at);
                    at += request::length(record);
                    if withdrawn {
                        request::refuse(record);
                    } else {
                        request::run(record);
                    }
                }
                group.ran += 1;
            }
            self.count_batch(group.ran as u64);
            let forwarder = group.forwarder;
            self.registry.returns[forwarder].push(group);
            self.registry.parkers[forwarder].wake();
        }
        true
    }

    /// Takes back this trustee's groups: copies each record into its parked batch, answers
    /// the batches whose records are all back, and sends again (to the home of the moment)
    /// the records a home did not run. Returns whether there were any.
    #[cold]
    pub(super) fn take_groups(&self) -> bool {
        let groups = self.registry.returns[self.index].take();
        if groups.is_empty() {
            return false;
        }
        for group in groups {
            let mut unrun = VecDeque::new();
            // SAFETY: the group is this trustee's, back from its home.
            unsafe {
                copy_back(&group, |ran, client, record| {
                    if ran {
                        self.one_back(client);
                    } else {
                        unrun.push_back((client, record));
                    }
                })
            };
            let mut waiting = self.forwarding.waiting.borrow_mut();
            let key = group.property as usize;
            let w = waiting.get_mut(&key).expect("a group out has its entry");
            w.out = false;
            // The unrun records go first: they were made before the ones that came since.
            unrun.append(&mut w.records);
            w.records = unrun;
            if w.records.is_empty() {
                waiting.remove(&key);
            }
        }
        self.send_groups();
        true
    }

    /// A record of `client`'s parked batch is back and has run: answers the batch if it was
    /// the last.
    fn one_back(&self, client: usize) {
        let f = &self.forwarding;
        let left = {
            let mut parked = f.parked.borrow_mut();
            parked[client] -= 1;
            parked[client]
        };
        if left == 0 {
            f.parked_batches.set(f.parked_batches.get() - 1);
            // SAFETY: the batch is parked here and every record of it has run.
            unsafe { self.registry.channel(client, self.index).answer() };
            self.executed.borrow_mut()[client] += 1;
            self.registry.parkers[client].wake();
        }
    }

    /// Shutdown, trustee side: sends back unrun the groups waiting here (no request runs any
    /// more).
    pub(super) fn return_groups_unrun(&self) {
        for group in self.registry.forwards[self.index].take() {
            self.registry.returns[group.forwarder].push(group);
        }
    }

    /// Shutdown, after every trustee has sent back the groups it held: flags every record of
    /// this trustee's parked batches that did not run cancelled, and answers the batches.
    pub(super) fn cancel_parked(&self) {
        for group in self.registry.returns[self.index].take() {
            // SAFETY: the group is this trustee's, back from its home; an unrun record is
            // flagged cancelled in its batch, its closure still in place.
            unsafe {
                copy_back(&group, |ran, client, record| {
                    if !ran {
                        request::cancel(record);
                    }
                    self.one_back(client);
                })
            };
        }
        let waiting = std::mem::take(&mut *self.forwarding.waiting.borrow_mut());
        for (_, w) in waiting {
            for (client, record) in w.records {
                // SAFETY: the record waits in a batch parked here and has not run.
                unsafe { request::cancel(record) };
                self.one_back(client);
            }
        }
        debug_assert_eq!(self.forwarding.parked_batches.get(), 0);
    }
}

/// Copies each record of a group that came back into its place in its parked batch, in
/// order, and tells `each` whether it ran, its client and where it lies.
///
/// # Safety
/// `group` was sent by this trustee and has come back; its records' batches are still parked
/// here.
unsafe fn copy_back(group: &Group, mut each: impl FnMut(bool, usize, *mut u64)) {
    let mut at = 0;
    for (i, &(client, record)) in group.origins.iter().enumerate() {
        // SAFETY: per the caller, the record came from the batch at `record`, which this
        // trustee owns while it is parked; its words (run or not) move back whole.
        unsafe {
            let from = group.words.as_ptr().add(at);
            let len = request::length(from);
            std::ptr::copy_nonoverlapping(from, record, len);
            at += len;
        }
        each(i < group.ran, client, record);
    }
}
