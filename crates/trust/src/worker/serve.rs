//! The trustee side of a worker: serving every channel that holds a batch, and freeing dead
//! properties once their watermark is reached (the protocol is in `free`).

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::{Running, Worker};
use crate::free::DeadProperty;
use crate::home::Header;
use crate::request::{self, BatchWords};
use crate::stats::SAMPLE_EVERY;

impl Worker {
    pub(super) fn serve(&self) -> bool {
        let mut answered = self.answered.borrow_mut();
        answered.clear();
        for client in self.registry.active_clients() {
            if self.forwarding.is_parked(client) {
                continue;
            }
            let channel = self.registry.channel(client, self.index);
            self.serving(client);
            let mut now = false;
            // SAFETY: this worker is the only trustee of `channel`, and its batch is not
            // parked; every record's closure is consumed by its run trampoline (which catches
            // a panic of the closure it runs), here or, parked, after it comes back.
            unsafe {
                channel.serve(|words, len| {
                    now = self.serve_batch(client, words, len);
                    now
                })
            };
            if now {
                answered.push(client);
            }
        }
        for &client in answered.iter() {
            self.registry.parkers[client].wake();
        }
        let progress = !answered.is_empty();
        drop(answered);
        if !self.pending_frees.borrow().is_empty() {
            let ready = self
                .pending_frees
                .borrow_mut()
                .ready(&self.executed.borrow(), |d| self.stale_done(d));
            ready.into_iter().for_each(|d| self.free_now(d.property));
        }
        progress
    }

    /// Runs the batch of `client` at `words` and counts it; returns whether it may be
    /// answered now (false: parked, see `forward`). Out of line, so that the loop over the
    /// channels keeps its state in registers (inlined, the counting made it spill them: 4 more
    /// instructions per channel scanned).
    ///
    /// # Safety
    /// As `request::run_all`'s; called by `Channel::serve` of `client`'s channel.
    #[inline(never)]
    unsafe fn serve_batch(&self, client: usize, words: &BatchWords, len: usize) -> bool {
        let _delegated = self.enter(Running::Delegated);
        // Moves happen in the worker's loop, never during a batch (`Trust::migrate_to`), so
        // whether to check each record's home is decided once per batch.
        // SAFETY: per the caller.
        unsafe {
            if self.forwarding.has_lost() {
                if !self.serve_checked(client, words, len, self.sample_next.get()) {
                    return false;
                }
            } else {
                let records = if self.sample_next.get() {
                    self.run_sampled(words, len)
                } else {
                    request::run_all(words, len)
                };
                self.count_batch(records);
            }
        }
        self.executed.borrow_mut()[client] += 1;
        true
    }

    /// Counts a batch of `records` requests served, and decides whether the next one is
    /// sampled (each `SAMPLE_EVERY`-th). Plain cells: published by `publish_counts`.
    #[inline(always)]
    pub(super) fn count_batch(&self, records: u64) {
        let totals = &self.totals;
        totals.batched.set(totals.batched.get() + records);
        let batches = totals.batches.get() + 1;
        totals.batches.set(batches);
        self.sample_next
            .set((batches + 1).is_multiple_of(SAMPLE_EVERY));
    }

    /// Runs a batch timing each record, and tallies them by property type and property
    /// (the sampled path of `stats`).
    ///
    /// # Safety
    /// As `request::run_all`'s.
    #[cold]
    #[inline(never)]
    unsafe fn run_sampled(&self, words: &BatchWords, len: usize) -> u64 {
        let mut sampled = self.sampled.take();
        // SAFETY: per the caller; a record's property address is null or a live property,
        // read before its request runs (see `request`).
        let records = unsafe {
            request::run_all_timed(words, len, |property, time| {
                if !property.is_null() {
                    let name = crate::home::Header::of(property).type_name;
                    sampled.push((name, property as usize, time));
                }
            })
        };
        self.counters().sample(&sampled);
        sampled.clear();
        self.sampled.set(sampled);
        records
    }

    /// Frees a property whose last trust is gone, once every request staged for it has run
    /// (see `free` for why the watermark read here suffices): those staged here, and for a
    /// property that has moved, those that may still be on trustees it left (`home`).
    pub(crate) fn free_later(&self, property: DeadProperty) {
        let registry = &self.registry;
        let watermark = (0..registry.clients)
            .map(|c| registry.channel(c, self.index).staged())
            .collect();
        // SAFETY: the property is alive until freed.
        let stale = unsafe { Header::of(property.ptr) }
            .stale_routes()
            .into_iter()
            .map(|(client, trustee, batch)| {
                // Up to the batch of the client's last request there, or every batch started.
                let batch = registry.channel(client, trustee).started_up_to(batch);
                (client, trustee, batch)
            })
            .collect();
        let dying = Dying { property, stale };
        let now =
            self.pending_frees
                .borrow_mut()
                .add(dying, watermark, &self.executed.borrow(), |d| {
                    self.stale_done(d)
                });
        if let Some(dying) = now {
            self.free_now(dying.property);
        }
    }

    /// Whether every lane of a dying property's stale routes has answered the batches it
    /// had started when the property died.
    fn stale_done(&self, dying: &Dying) -> bool {
        dying.stale.iter().all(|&(client, trustee, started)| {
            self.registry
                .channel(client, trustee)
                .answered_up_to(started)
        })
    }

    pub(super) fn free_now(&self, property: DeadProperty) {
        self.counters().forget(property.ptr as usize);
        // SAFETY: the property is alive until freed below.
        if unsafe { Header::of(property.ptr) }.pins() > 0 {
            // Deferred requests whose replies are kept elsewhere still pin it.
            self.unpin_all(property.ptr);
        }
        // SAFETY: as above. A withdrawn property was counted out when its value left.
        let withdrawn = unsafe { Header::of(property.ptr) }.withdrawn();
        let _delegated = self.enter(Running::Delegated);
        // SAFETY: every request staged for the property has run (see `free`), or the runtime
        // is closed.
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| unsafe { property.free() })) {
            self.registry.unhandled_panic(panic);
        }
        if !withdrawn {
            self.counters().freed();
        }
    }
}

/// A dead property waiting to be freed, with the lanes of its stale routes: (client, trustee,
/// batches the client had started on that lane when the property died).
pub(crate) struct Dying {
    pub(crate) property: DeadProperty,
    stale: Vec<(usize, usize, u64)>,
}
