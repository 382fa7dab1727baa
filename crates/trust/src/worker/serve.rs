//! The trustee side of a worker: serving every channel that holds a batch, and freeing dead
//! properties once their watermark is reached (the protocol is in `free`).

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::{Running, Worker};
use crate::free::DeadProperty;
use crate::request::{self, BatchWords};
use crate::stats::SAMPLE_EVERY;

impl Worker {
    pub(super) fn serve(&self) -> bool {
        let mut answered = self.answered.borrow_mut();
        answered.clear();
        for client in self.registry.active_clients() {
            let channel = self.registry.channel(client, self.index);
            self.serving(client);
            // SAFETY: this worker is the only trustee of `channel`; every record's closure is
            // consumed by its run trampoline, which catches a panic of the closure it runs.
            let served =
                unsafe { channel.serve(|words, len| self.serve_batch(client, words, len)) };
            if served {
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
                .ready(&self.executed.borrow());
            ready.into_iter().for_each(|p| self.free_now(p));
        }
        progress
    }

    /// Runs the batch of `client` at `words` and counts it. Out of line, so that the loop over
    /// the channels keeps its state in registers (inlined, the counting made it spill them:
    /// 4 more instructions per channel scanned).
    ///
    /// # Safety
    /// As `request::run_all`'s; called by `Channel::serve` of `client`'s channel.
    #[inline(never)]
    unsafe fn serve_batch(&self, client: usize, words: &BatchWords, len: usize) {
        let _delegated = self.enter(Running::Delegated);
        // SAFETY: per the caller.
        let records = unsafe {
            if self.sample_next.get() {
                self.run_sampled(words, len)
            } else {
                request::run_all(words, len)
            }
        };
        self.count_batch(records);
        self.executed.borrow_mut()[client] += 1;
    }

    /// Counts a batch of `records` requests served, and decides whether the next one is
    /// sampled (each `SAMPLE_EVERY`-th). Plain cells: published by `publish_counts`.
    #[inline(always)]
    fn count_batch(&self, records: u64) {
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
                    let name = crate::trust::property_type_name(property);
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
    /// (see `free` for why the watermark read here suffices).
    pub(crate) fn free_later(&self, property: DeadProperty) {
        let watermark = (0..self.registry.clients)
            .map(|c| self.registry.channel(c, self.index).staged())
            .collect();
        let now = self
            .pending_frees
            .borrow_mut()
            .add(property, watermark, &self.executed.borrow());
        if let Some(property) = now {
            self.free_now(property);
        }
    }

    pub(super) fn free_now(&self, property: DeadProperty) {
        let _delegated = self.enter(Running::Delegated);
        // SAFETY: every request staged for the property has run (see `free`), or the runtime
        // is closed.
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| unsafe { property.free() })) {
            self.registry.unhandled_panic(panic);
        }
        self.counters().freed();
    }
}
