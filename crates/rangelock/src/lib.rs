//! Range locks served by a trustee (seed 002): lock any range of a lock's units for reading or
//! writing; the lock's trustee combines every request and answers each one the moment its
//! range frees.
//!
//! ```
//! use rangelock::{Mode, RangeLock};
//! use std::time::{Duration, Instant};
//!
//! gossamer::Rack::from_env().workers(2).run(|| {
//!     let locks = RangeLock::entrust_on(gossamer::this_node(), 1 << 16); // units 0..65536
//!     let mut w = locks.write(0..64); // only this fiber waits
//!     let soon = Instant::now() + Duration::from_millis(10);
//!     assert!(locks.read_until(32..40, soon).is_err(), "32..40 is written");
//!     assert!(locks.try_write(100..110).is_some(), "disjoint ranges never wait");
//!     let upper = w.split_at(32); // two guards: 0..32 and 32..64
//!     drop(upper); // unlocks 32..64 only
//!     assert!(locks.try_read(32..40).is_some());
//!     let r = w.downgrade(); // 0..32 is now read, with no moment unlocked
//!     assert!(locks.try_read(0..8).is_some());
//!     drop(r);
//!     let both = locks.lock_all(&[(0..8, Mode::Write), (900..910, Mode::Read)]).unwrap();
//!     assert_eq!(both.ranges().count(), 2);
//! });
//! ```
//!
//! # How it works
//!
//! A [`RangeLock`] is a handle to a property — the lock's table — on one trustee, on this node
//! or another node of the rack. A lock call is a deferred request
//! ([`gossamer::Trust::apply_deferred_with`]): the trustee adds it to the table and, if no
//! earlier request conflicts with it, answers at once; otherwise it keeps the request's reply
//! and sends it from whichever later request frees the range — an unlock, a downgrade, or
//! another request's deadline. The caller's fiber waits; nothing polls. The trustee plays the
//! seed's combiner, and the worker's lanes replace its handler threads and shared queue.
//!
//! Fairness: conflicting requests are granted in arrival order (FIFO); a reader that overlaps
//! a waiting writer queues behind it, readers that overlap only readers pass at once, and
//! disjoint requests never wait for each other, so nobody starves. Two guards taken crosswise
//! by two callers can deadlock, as with any lock: deadlines ([`RangeLock::lock_until`]) and
//! taking every range at once ([`RangeLock::lock_all`]) are the ways out.
//!
//! A guard unlocks when dropped (also when its holder unwinds), without waiting. The seed's
//! client sent an unlock and then at once its next lock, which could be handled in the other
//! order, hence its flip bit and two slots per client; here requests from one worker to one
//! trustee run in the order they were made, and each request names its guard by id, so
//! neither is needed, and a caller may hold any number of ranges (the seed: one).
//!
//! A rank that dies holding locks ends the job, as every rank's death does.

mod index;
mod part;
mod service;
mod table;

use std::fmt;
use std::ops::Range;
use std::time::Instant;

use gossamer::{Node, ReplyId, TimedOut, Trust};
use serde::{Deserialize, Serialize};

use part::{Id, Part, Parts, check};
pub use part::{Mode, RangeError};
use service::Service;

/// A range lock over units `0..units`, served by one trustee. Cloning is cheap and shares
/// the lock; the handle is `Wire`, so it travels to other nodes like any trust.
#[derive(Clone, Serialize, Deserialize)]
pub struct RangeLock {
    service: Trust<Service>,
    units: u64,
}

impl fmt::Debug for RangeLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RangeLock")
            .field("node", &self.service.node().rank())
            .field("units", &self.units)
            .finish()
    }
}

impl RangeLock {
    /// A lock over units `0..units` whose table lives on a trustee of `node` (this node, or
    /// another node of the rack).
    pub fn entrust_on(node: Node, units: u64) -> Self {
        let service = node.entrust_with(Service::new, units);
        RangeLock { service, units }
    }

    /// How many units the lock has.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// The parts of a one-range request, or a panic naming what is wrong with the range.
    fn one(&self, range: Range<u64>, mode: Mode) -> Parts {
        let parts = vec![Part {
            start: range.start,
            end: range.end,
            mode,
        }];
        if let Err(e) = check(&parts, self.units) {
            panic!("rangelock: {e}");
        }
        parts
    }

    fn guard(&self, id: Id, parts: Parts) -> Guard {
        Guard {
            held: Some(Held {
                lock: self.clone(),
                id,
                parts,
            }),
        }
    }

    /// Locks `range` in `mode`, waiting until it is granted (only the calling fiber waits).
    ///
    /// # Panics
    /// If the range is empty or reaches past the lock's units; in delegated context (use
    /// [`RangeLock::lock_then`] there).
    pub fn lock(&self, range: Range<u64>, mode: Mode) -> Guard {
        let parts = self.one(range, mode);
        let id = self
            .service
            .apply_deferred_with(|s, parts: Parts, reply| s.lock(parts, reply), parts.clone());
        self.guard(id, parts)
    }

    /// Locks `range` for writing: [`RangeLock::lock`] with [`Mode::Write`].
    pub fn write(&self, range: Range<u64>) -> Guard {
        self.lock(range, Mode::Write)
    }

    /// Locks `range` for reading: [`RangeLock::lock`] with [`Mode::Read`].
    pub fn read(&self, range: Range<u64>) -> Guard {
        self.lock(range, Mode::Read)
    }

    /// [`RangeLock::lock`] with a deadline: `Err(TimedOut)` if the range is not granted by
    /// then, and the request leaves the table (requests that waited only for it go on).
    pub fn lock_until(
        &self,
        range: Range<u64>,
        mode: Mode,
        deadline: Instant,
    ) -> Result<Guard, TimedOut> {
        let parts = self.one(range, mode);
        let id = self.service.apply_deferred_until_with(
            |s, parts: Parts, reply| s.lock(parts, reply),
            parts.clone(),
            deadline,
            |s: &mut Service, reply: ReplyId| s.expire(reply),
        )?;
        Ok(self.guard(id, parts))
    }

    /// [`RangeLock::lock_until`] for writing.
    pub fn write_until(&self, range: Range<u64>, deadline: Instant) -> Result<Guard, TimedOut> {
        self.lock_until(range, Mode::Write, deadline)
    }

    /// [`RangeLock::lock_until`] for reading.
    pub fn read_until(&self, range: Range<u64>, deadline: Instant) -> Result<Guard, TimedOut> {
        self.lock_until(range, Mode::Read, deadline)
    }

    /// Locks `range` in `mode` if nothing held or waiting conflicts with it now; never waits
    /// for the range (one round trip to the trustee).
    pub fn try_lock(&self, range: Range<u64>, mode: Mode) -> Option<Guard> {
        let parts = self.one(range, mode);
        let id = self
            .service
            .apply_with(|s, parts: Parts| s.try_lock(parts), parts.clone())?;
        Some(self.guard(id, parts))
    }

    /// [`RangeLock::try_lock`] for writing.
    pub fn try_write(&self, range: Range<u64>) -> Option<Guard> {
        self.try_lock(range, Mode::Write)
    }

    /// [`RangeLock::try_lock`] for reading.
    pub fn try_read(&self, range: Range<u64>) -> Option<Guard> {
        self.try_lock(range, Mode::Read)
    }

    /// Locks `range` in `mode` without waiting: `then(guard)` runs on the calling worker once
    /// it is granted. Allowed anywhere, including in delegated context.
    pub fn lock_then(&self, range: Range<u64>, mode: Mode, then: impl FnOnce(Guard) + 'static) {
        let parts = self.one(range, mode);
        let lock = self.clone();
        let mine = parts.clone();
        self.service.apply_deferred_then_with(
            |s, parts: Parts, reply| s.lock(parts, reply),
            parts,
            move |id| then(lock.guard(id, mine)),
        );
    }

    /// Locks every range of `ranges` at once, each in its mode, waiting until all are
    /// granted together: the request never holds some while it waits for others, so two
    /// callers that need the same ranges cannot deadlock on them.
    pub fn lock_all(&self, ranges: &[(Range<u64>, Mode)]) -> Result<Guard, RangeError> {
        let parts: Parts = ranges
            .iter()
            .map(|(r, mode)| Part {
                start: r.start,
                end: r.end,
                mode: *mode,
            })
            .collect();
        check(&parts, self.units)?;
        if parts.is_empty() {
            return Err(RangeError::Empty(0..0));
        }
        let id = self
            .service
            .apply_deferred_with(|s, parts: Parts, reply| s.lock(parts, reply), parts.clone());
        Ok(self.guard(id, parts))
    }

    /// How many requests the lock's table holds, granted or waiting (0 once every guard is
    /// dropped and every unlock has arrived).
    pub fn requests(&self) -> usize {
        self.service.apply(|s| s.len())
    }
}

/// Held ranges of a [`RangeLock`]. Dropping the guard unlocks them (without waiting, also
/// while unwinding). `Send`, so it may move to another fiber or thread; not `Wire`: a guard
/// does not travel to another node.
#[must_use = "dropping a guard unlocks its ranges at once"]
pub struct Guard {
    held: Option<Held>,
}

struct Held {
    lock: RangeLock,
    id: Id,
    parts: Parts,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self.held();
        f.debug_struct("Guard")
            .field("id", &held.id)
            .field("parts", &held.parts)
            .finish()
    }
}

impl Guard {
    fn held(&self) -> &Held {
        self.held
            .as_ref()
            .expect("a guard holds its ranges until dropped")
    }

    /// The held ranges and their modes.
    pub fn ranges(&self) -> impl Iterator<Item = (Range<u64>, Mode)> + '_ {
        self.held().parts.iter().map(|p| (p.start..p.end, p.mode))
    }

    /// Splits a one-range guard at `mid` units from its start: this guard keeps the lower
    /// part, and the returned one holds the rest. Each unlocks on its own when dropped, so
    /// dropping the returned guard releases the upper part only.
    ///
    /// # Panics
    /// If the guard holds several ranges, if `mid` is not strictly inside its range, or in
    /// delegated context (the split waits for the trustee, so that the new guard exists
    /// there before anything else can name it).
    pub fn split_at(&mut self, mid: u64) -> Guard {
        let held = self
            .held
            .as_mut()
            .expect("a guard holds its ranges until dropped");
        let [whole] = held.parts[..] else {
            panic!("rangelock: split_at on a guard of several ranges");
        };
        assert!(
            mid > 0 && mid < whole.end - whole.start,
            "rangelock: split_at({mid}) outside the range {:?}",
            whole.start..whole.end
        );
        let at = whole.start + mid;
        let upper = held
            .lock
            .service
            .apply_with(|s, (id, at): (Id, u64)| s.split(id, at), (held.id, at))
            .expect("a held one-range guard splits inside its range");
        held.parts = vec![Part { end: at, ..whole }];
        held.lock.guard(upper, vec![Part { start: at, ..whole }])
    }

    /// Turns a write guard into a read guard of the same ranges, with no moment unlocked;
    /// readers waiting for it are let in. A read guard is returned as it is.
    ///
    /// # Panics
    /// In delegated context (the downgrade waits for the trustee).
    pub fn downgrade(mut self) -> Guard {
        let mut held = self
            .held
            .take()
            .expect("a guard holds its ranges until dropped");
        if held.parts.iter().any(|p| p.mode == Mode::Write) {
            let done = held
                .lock
                .service
                .apply_with(|s, id: Id| s.downgrade(id), held.id);
            assert!(done, "a guard's request is held");
            for p in &mut held.parts {
                p.mode = Mode::Read;
            }
        }
        Guard { held: Some(held) }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            held.lock
                .service
                .apply_then_with(|s, id: Id| s.release(id), held.id, |()| {});
        }
    }
}
