//! Range locks served by a trustee (seed 002): lock any range of a lock's units for reading or
//! writing; the lock's trustee combines every request and answers each one the moment its
//! range frees.
//!
//! ```
//! use rangelock::{LockError, Mode, RangeError, RangeLock};
//! use std::time::{Duration, Instant};
//!
//! let code = gossamer::Rack::from_env().workers(2).run(|| {
//!     let locks = RangeLock::entrust_on(gossamer::this_node(), 1 << 16); // units 0..65536
//!     let mut w = locks.write(0..64).unwrap(); // only this fiber waits
//!     let soon = Instant::now() + Duration::from_millis(10);
//!     let late = locks.read_until(32..40, soon);
//!     assert_eq!(late.unwrap_err(), LockError::TimedOut, "32..40 is written");
//!     assert!(locks.try_write(100..110).is_ok(), "disjoint ranges never wait");
//!     let upper = w.split_at(32).unwrap(); // two guards: 0..32 and 32..64
//!     drop(upper); // unlocks 32..64 only
//!     assert!(locks.try_read(32..40).is_ok());
//!     let r = w.downgrade(); // 0..32 is now read, with no moment unlocked
//!     assert!(locks.try_read(0..8).is_ok());
//!     drop(r);
//!     let both = locks.lock_all(&[(0..8, Mode::Write), (900..910, Mode::Read)]).unwrap();
//!     assert_eq!(both.ranges().len(), 2);
//!     // A range the lock cannot take is refused, and nothing is locked.
//!     let refused = locks.lock(60_000..70_000, Mode::Read).unwrap_err();
//!     assert_eq!(refused, RangeError::OutOfBounds { range: 60_000..70_000, units: 1 << 16 });
//! });
//! assert_eq!(code, std::process::ExitCode::SUCCESS);
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
//! Errors: every call that takes ranges checks them first and returns [`RangeError`] for
//! a range that is empty, reaches past the lock's units, or (`lock_all`) overlaps another,
//! with nothing locked; [`RangeLock::lock_until`] and [`RangeLock::try_lock`] return
//! [`LockError`], which also says "timed out" or "would block". What still panics: a call
//! that waits, made in delegated context (as everywhere in the runtime), and
//! [`RangeLock::notify`] when its node's region heap is full.
//!
//! A rank that dies holding locks ends the job, as every rank's death does.

mod index;
mod part;
mod service;
mod table;

use std::fmt;
use std::ops::Range;
use std::time::Instant;

use gossamer::{Node, Region, ReplyId, TimedOut, Trust};
use serde::{Deserialize, Serialize};

use part::{Id, Part, Parts, check, cut};
pub use part::{LockError, Mode, RangeError};
pub use service::FlagSpacing;
use service::Service;

/// A range lock over units `0..units`, served by one trustee or, sharded, by several.
/// Cloning is cheap and shares the lock; the handle is `Wire`, so it travels to other nodes
/// like any trust.
#[derive(Clone, Serialize, Deserialize)]
pub struct RangeLock {
    /// Shard `i` serves units `shard_start(i)..shard_start(i + 1)`.
    shards: Vec<Trust<Service>>,
    units: u64,
    notify: Notify,
    /// Each shard's flags, for `Notify::PollFlag`.
    flags: Vec<Region>,
}

/// How a waiting lock request learns that it is granted: the default, and the seed's two
/// polling designs (§4.1), kept so that all three can be compared on one code base.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub enum Notify {
    /// The trustee answers the request the moment it is granted (a deferred request).
    #[default]
    Deferred,
    /// The lock call returns at once; the client asks the trustee by RPC until granted (the
    /// seed's design 1, and the "RPC lock" baseline of RDMA lock papers).
    PollRpc,
    /// The trustee raises a flag in a region on its node, which the client reads with
    /// one-sided gets until it is up (the seed's design 2). Flags run out beyond
    /// [`FLAG_SLOTS`] waiting requests per shard; later ones poll by RPC.
    PollFlag(FlagSpacing),
}

/// Flags per shard under [`Notify::PollFlag`].
pub const FLAG_SLOTS: usize = 1024;

thread_local! {
    static ROUND_TRIPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn count_round_trip() {
    ROUND_TRIPS.with(|n| n.set(n.get() + 1));
}

/// How many round trips to a table the waiting lock calls of this thread have made so far: one
/// per piece asked for, plus one per poll (a diagnostic, for comparing the [`Notify`] modes;
/// releases are not awaited and not counted).
pub fn round_trips() -> u64 {
    ROUND_TRIPS.with(std::cell::Cell::get)
}

impl fmt::Debug for RangeLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RangeLock")
            .field("units", &self.units)
            .field("shards", &self.shards.len())
            .finish()
    }
}

/// The part of a request one shard serves.
type Piece = (usize, Parts);

impl RangeLock {
    /// A lock over units `0..units` whose table lives on a trustee of `node` (this node, or
    /// another node of the rack). Every `units` is accepted, 0 (a lock that refuses every
    /// range) to `u64::MAX`.
    pub fn entrust_on(node: Node, units: u64) -> Self {
        RangeLock {
            shards: vec![node.entrust_with(Service::new, units)],
            units,
            notify: Notify::Deferred,
            flags: Vec::new(),
        }
    }

    /// A lock over units `0..units` spread over `k` tables, placed on the trustees of the
    /// rack in turn: worker 0 of every node, then worker 1, and so on. Each table serves a
    /// run of consecutive units, `units / k` or one more (the first `units % k` tables take
    /// the extra unit), so no table is empty. A range that crosses shards is taken shard by
    /// shard in ascending order, so requests that cross the same shards cannot deadlock.
    ///
    /// # Errors
    /// [`RangeError::Shards`] if `k` is 0 or more than `units`: every shard must serve at
    /// least one unit.
    ///
    /// ```
    /// use rangelock::{RangeError, RangeLock};
    ///
    /// gossamer::Rack::from_env().workers(2).run(|| {
    ///     let lock = RangeLock::sharded(u64::MAX, 4).unwrap(); // 4 runs of about 2^62 units
    ///     drop(lock.write(u64::MAX - 8..u64::MAX).unwrap()); // the top, in the last shard
    ///     let refused = RangeLock::sharded(3, 4).unwrap_err();
    ///     assert_eq!(refused, RangeError::Shards { shards: 4, units: 3 });
    /// });
    /// ```
    pub fn sharded(units: u64, k: usize) -> Result<Self, RangeError> {
        if k == 0 || k as u64 > units {
            return Err(RangeError::Shards { shards: k, units });
        }
        let nodes: Vec<Node> = gossamer::nodes().collect();
        let mut lock = RangeLock {
            shards: Vec::with_capacity(k),
            units,
            notify: Notify::Deferred,
            flags: Vec::new(),
        };
        for i in 0..k {
            let node = nodes[i % nodes.len()];
            let worker = (i / nodes.len()) as u32 % node.workers();
            let end = shard_start(units, k, i + 1);
            lock.shards
                .push(node.trustee(worker).entrust_with(Service::new, end));
        }
        Ok(lock)
    }

    /// This lock, with its waiting requests told of their grants as `notify` says (the
    /// returned handle and its clones; others keep theirs). For [`Notify::PollFlag`] each
    /// shard gets a region of flags on its node.
    ///
    /// # Panics
    /// If a flag region cannot be made (the node's region heap is full).
    pub fn notify(mut self, notify: Notify) -> Self {
        if let Notify::PollFlag(spacing) = notify {
            self.flags = self
                .shards
                .iter()
                .map(|shard| {
                    let region = shard
                        .node()
                        .region(spacing.words(FLAG_SLOTS))
                        .unwrap_or_else(|e| panic!("rangelock: a flag region: {e}"));
                    shard.apply_with(
                        |s, (region, spacing): (Region, FlagSpacing)| {
                            s.use_flags(region, spacing, FLAG_SLOTS)
                        },
                        (region.clone(), spacing),
                    );
                    region
                })
                .collect();
        }
        self.notify = notify;
        self
    }

    /// Takes one piece (`counted` if it is its lock call's first), waiting as the lock's
    /// [`Notify`] says, until `deadline` if any.
    fn take_piece(
        &self,
        shard: usize,
        piece: (Parts, bool),
        deadline: Option<Instant>,
    ) -> Result<Id, TimedOut> {
        let service = &self.shards[shard];
        count_round_trip();
        let spacing = match self.notify {
            Notify::Deferred => {
                let lock = |s: &mut Service, piece: (Parts, bool), reply| s.lock(piece, reply);
                return match deadline {
                    None => Ok(service.apply_deferred_with(lock, piece)),
                    Some(at) => service.apply_deferred_until_with(
                        lock,
                        piece,
                        at,
                        |s: &mut Service, reply: ReplyId| s.expire(reply),
                    ),
                };
            }
            Notify::PollRpc => None,
            Notify::PollFlag(spacing) => Some(spacing),
        };
        let (id, now, slot) = service.apply_with(
            |s, (piece, flag): ((Parts, bool), bool)| s.lock_polled(piece, flag),
            (piece, spacing.is_some()),
        );
        let mut granted = now;
        while !granted {
            if deadline.is_some_and(|at| Instant::now() >= at) {
                // Withdrawn; granted meanwhile, it is unlocked all the same.
                release(service, id);
                return Err(TimedOut);
            }
            gossamer::yield_now();
            count_round_trip();
            granted = match (slot, spacing) {
                (Some(slot), Some(spacing)) => {
                    let (word, bit) = spacing.place(slot);
                    let words = self.flags[shard].get(word, 1).wait();
                    words.unwrap_or_else(|e| panic!("rangelock: reading a flag: {e}"))[0] & bit != 0
                }
                _ => service.apply_with(|s, id: Id| s.poll(id), id),
            };
        }
        Ok(id)
    }

    /// How many units the lock has.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// `parts` checked, and cut at the shards' boundaries: one piece per shard they reach,
    /// in ascending shard order.
    fn pieces(&self, parts: &[Part]) -> Result<Vec<Piece>, RangeError> {
        check(parts, self.units)?;
        let k = self.shards.len();
        let mut cut: Vec<(usize, Part)> = Vec::new();
        for p in parts {
            let mut start = p.start;
            while start < p.end {
                let shard = shard_of(self.units, k, start);
                let end = p.end.min(shard_start(self.units, k, shard + 1));
                cut.push((shard, Part { start, end, ..*p }));
                start = end;
            }
        }
        cut.sort_by_key(|(shard, p)| (*shard, p.start));
        let mut pieces: Vec<Piece> = Vec::new();
        for (shard, part) in cut {
            match pieces.last_mut() {
                Some((s, parts)) if *s == shard => parts.push(part),
                _ => pieces.push((shard, vec![part])),
            }
        }
        Ok(pieces)
    }

    /// The pieces of a one-range request.
    fn one(&self, range: Range<u64>, mode: Mode) -> Result<Vec<Piece>, RangeError> {
        self.pieces(&[Part {
            start: range.start,
            end: range.end,
            mode,
        }])
    }

    /// A guard that holds nothing yet: pieces join it as they are granted, and if taking
    /// the rest fails or unwinds, dropping it unlocks those.
    fn empty_guard(&self) -> Guard {
        Guard {
            held: Some(Held {
                lock: self.clone(),
                pieces: Vec::new(),
            }),
        }
    }

    /// Takes `pieces` in order, each waiting until granted or `deadline`.
    fn take(&self, pieces: Vec<Piece>, deadline: Option<Instant>) -> Result<Guard, TimedOut> {
        let mut guard = self.empty_guard();
        for (shard, parts) in pieces {
            let counted = guard.held().pieces.is_empty();
            let id = self.take_piece(shard, (parts.clone(), counted), deadline)?;
            guard.push(shard, id, parts);
        }
        Ok(guard)
    }

    /// Locks `range` in `mode`, waiting until it is granted (only the calling fiber waits).
    ///
    /// # Errors
    /// [`RangeError::Empty`] or [`RangeError::OutOfBounds`] if the range holds no unit or
    /// reaches past the lock's units; nothing is locked then.
    ///
    /// # Panics
    /// In delegated context (use [`RangeLock::lock_then`] there).
    pub fn lock(&self, range: Range<u64>, mode: Mode) -> Result<Guard, RangeError> {
        let pieces = self.one(range, mode)?;
        Ok(self.take(pieces, None).expect("no deadline, no time-out"))
    }

    /// Locks `range` for writing: [`RangeLock::lock`] with [`Mode::Write`].
    pub fn write(&self, range: Range<u64>) -> Result<Guard, RangeError> {
        self.lock(range, Mode::Write)
    }

    /// Locks `range` for reading: [`RangeLock::lock`] with [`Mode::Read`].
    pub fn read(&self, range: Range<u64>) -> Result<Guard, RangeError> {
        self.lock(range, Mode::Read)
    }

    /// [`RangeLock::lock`] with a deadline: [`LockError::TimedOut`] if the range is not
    /// granted by then, and the request leaves the table (requests that waited only for it
    /// go on); [`LockError::Range`] for a range that [`RangeLock::lock`] refuses.
    pub fn lock_until(
        &self,
        range: Range<u64>,
        mode: Mode,
        deadline: Instant,
    ) -> Result<Guard, LockError> {
        let pieces = self.one(range, mode)?;
        self.take(pieces, Some(deadline))
            .map_err(|TimedOut| LockError::TimedOut)
    }

    /// [`RangeLock::lock_until`] for writing.
    pub fn write_until(&self, range: Range<u64>, deadline: Instant) -> Result<Guard, LockError> {
        self.lock_until(range, Mode::Write, deadline)
    }

    /// [`RangeLock::lock_until`] for reading.
    pub fn read_until(&self, range: Range<u64>, deadline: Instant) -> Result<Guard, LockError> {
        self.lock_until(range, Mode::Read, deadline)
    }

    /// Locks `range` in `mode` if nothing held or waiting conflicts with it now; never waits
    /// for the range (one round trip to each shard it reaches): [`LockError::WouldBlock`]
    /// if something does, [`LockError::Range`] for a range that [`RangeLock::lock`] refuses.
    pub fn try_lock(&self, range: Range<u64>, mode: Mode) -> Result<Guard, LockError> {
        let mut guard = self.empty_guard();
        for (shard, parts) in self.one(range, mode)? {
            let counted = guard.held().pieces.is_empty();
            let id = self.shards[shard]
                .apply_with(
                    |s, piece: (Parts, bool)| s.try_lock(piece),
                    (parts.clone(), counted),
                )
                .ok_or(LockError::WouldBlock)?;
            guard.push(shard, id, parts);
        }
        Ok(guard)
    }

    /// [`RangeLock::try_lock`] for writing.
    pub fn try_write(&self, range: Range<u64>) -> Result<Guard, LockError> {
        self.try_lock(range, Mode::Write)
    }

    /// [`RangeLock::try_lock`] for reading.
    pub fn try_read(&self, range: Range<u64>) -> Result<Guard, LockError> {
        self.try_lock(range, Mode::Read)
    }

    /// Locks `range` in `mode` without waiting: `then(guard)` runs on the calling worker once
    /// it is granted. Allowed anywhere, including in delegated context.
    ///
    /// # Errors
    /// As [`RangeLock::lock`], at once: nothing is asked for then, and `then` never runs.
    pub fn lock_then(
        &self,
        range: Range<u64>,
        mode: Mode,
        then: impl FnOnce(Guard) + 'static,
    ) -> Result<(), RangeError> {
        let pieces = self.one(range, mode)?;
        take_then(self.empty_guard(), pieces.into(), then);
        Ok(())
    }

    /// Locks every range of `ranges`, each in its mode, waiting until all are granted. On one
    /// shard they are one request, granted all at once: it never holds some while it waits
    /// for others, so callers that need the same ranges cannot deadlock on them. Across
    /// shards they are taken shard by shard in ascending order, which cannot deadlock either.
    ///
    /// # Errors
    /// As [`RangeLock::lock`] for each range; also [`RangeError::NoRanges`] for an empty
    /// list and [`RangeError::Overlap`] if two ranges overlap. Nothing is locked then.
    pub fn lock_all(&self, ranges: &[(Range<u64>, Mode)]) -> Result<Guard, RangeError> {
        let parts: Parts = ranges
            .iter()
            .map(|(r, mode)| Part {
                start: r.start,
                end: r.end,
                mode: *mode,
            })
            .collect();
        let pieces = self.pieces(&parts)?;
        Ok(self.take(pieces, None).expect("no deadline, no time-out"))
    }

    /// How many requests the lock's tables hold, granted or waiting: each lock call whose
    /// guard is alive or which still waits counts once, however many shards it reaches, and
    /// [`Guard::split_at`] makes its upper guard a request of its own. 0 once every guard is
    /// dropped and every unlock has arrived (unlocks are not awaited, so a count taken right
    /// after a drop may still include it).
    ///
    /// # Panics
    /// In delegated context (it asks every shard).
    pub fn requests(&self) -> usize {
        self.shards.iter().map(|s| s.apply(|s| s.requests())).sum()
    }
}

/// The first unit of shard `i` of a lock of `units` units in `k` shards (`units` for `i =
/// k`). With `units = q·k + r`, the shards below `r` serve `q + 1` units and the others `q`;
/// no step exceeds `units`, so nothing overflows.
fn shard_start(units: u64, k: usize, i: usize) -> u64 {
    let (k, i) = (k as u64, i as u64);
    let (q, r) = (units / k, units % k);
    i * q + i.min(r)
}

/// The shard of a lock of `units` units in `k` shards that serves `unit` (below `units`).
fn shard_of(units: u64, k: usize, unit: u64) -> usize {
    let k = k as u64;
    let (q, r) = (units / k, units % k);
    // The first `r` shards, of `q + 1` units each, end at `r·q + r ≤ units`; `r > 0` means
    // `k ≥ 2`, so `q + 1` does not overflow there.
    let longer = r * q + r;
    let shard = if unit < longer {
        unit / (q + 1)
    } else {
        r + (unit - longer) / q
    };
    shard as usize
}

/// Takes `pieces` in order without waiting, adding each to `guard`; then `then(guard)`.
fn take_then(
    mut guard: Guard,
    mut pieces: std::collections::VecDeque<Piece>,
    then: impl FnOnce(Guard) + 'static,
) {
    let Some((shard, parts)) = pieces.pop_front() else {
        return then(guard);
    };
    let lock = guard.held().lock.clone();
    let counted = guard.held().pieces.is_empty();
    let mine = parts.clone();
    piece_then(
        &lock,
        shard,
        (parts, counted),
        Box::new(move |id| {
            guard.push(shard, id, mine);
            take_then(guard, pieces, then);
        }),
    );
}

/// Takes one piece (`counted` if it is its lock call's first) without waiting; `then(id)`
/// once it is granted. Under a polling
/// [`Notify`] the polls are callbacks too: a poll by RPC when the last one is answered, a
/// flag read in the worker's next round.
fn piece_then(lock: &RangeLock, shard: usize, piece: (Parts, bool), then: Box<dyn FnOnce(Id)>) {
    let service = &lock.shards[shard];
    let spacing = match lock.notify {
        Notify::Deferred => {
            return service.apply_deferred_then_with(
                |s, piece: (Parts, bool), reply| s.lock(piece, reply),
                piece,
                then,
            );
        }
        Notify::PollRpc => None,
        Notify::PollFlag(spacing) => Some(spacing),
    };
    let lock = lock.clone();
    service.apply_then_with(
        |s, (piece, flag): ((Parts, bool), bool)| s.lock_polled(piece, flag),
        (piece, spacing.is_some()),
        move |(id, now, slot)| {
            if now {
                return then(id);
            }
            let flag = slot.zip(spacing).map(|(slot, spacing)| spacing.place(slot));
            poll_then(lock, shard, id, flag, then);
        },
    );
}

/// Polls request `id` until it is granted — its flag (word, bit), or by RPC — then `then`.
fn poll_then(
    lock: RangeLock,
    shard: usize,
    id: Id,
    flag: Option<(usize, u64)>,
    then: Box<dyn FnOnce(Id)>,
) {
    match flag {
        Some((word, bit)) => {
            let region = lock.flags[shard].clone();
            region.get(word, 1).then(move |words| {
                let words = words.unwrap_or_else(|e| panic!("rangelock: reading a flag: {e}"));
                if words[0] & bit != 0 {
                    then(id);
                } else {
                    // A local read completes at once: the next one waits for the next round.
                    trust::defer(move || poll_then(lock, shard, id, flag, then));
                }
            });
        }
        None => {
            let service = lock.shards[shard].clone();
            service.apply_then_with(
                |s, id: Id| s.poll(id),
                id,
                move |granted| {
                    if granted {
                        then(id);
                    } else {
                        poll_then(lock, shard, id, flag, then);
                    }
                },
            );
        }
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
    /// One granted request per shard: (shard, its id there, its parts).
    pieces: Vec<(usize, Id, Parts)>,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("ranges", &self.ranges())
            .finish()
    }
}

impl Guard {
    fn held(&self) -> &Held {
        self.held
            .as_ref()
            .expect("a guard holds its ranges until dropped")
    }

    fn held_mut(&mut self) -> &mut Held {
        self.held
            .as_mut()
            .expect("a guard holds its ranges until dropped")
    }

    fn push(&mut self, shard: usize, id: Id, parts: Parts) {
        self.held_mut().pieces.push((shard, id, parts));
    }

    /// The held ranges and their modes, in ascending order, adjacent ranges of one mode
    /// joined (a range that crosses shards is one range here).
    pub fn ranges(&self) -> Vec<(Range<u64>, Mode)> {
        let mut parts: Vec<&Part> = self
            .held()
            .pieces
            .iter()
            .flat_map(|(_, _, parts)| parts)
            .collect();
        parts.sort_by_key(|p| p.start);
        let mut out: Vec<(Range<u64>, Mode)> = Vec::new();
        for p in parts {
            match out.last_mut() {
                Some((r, mode)) if r.end == p.start && *mode == p.mode => r.end = p.end,
                _ => out.push((p.start..p.end, p.mode)),
            }
        }
        out
    }

    /// Splits the guard at `mid` units past its first held unit: this guard keeps every held
    /// unit below that point, and the returned guard holds the rest, each in its mode (a
    /// range that the point falls inside is cut in two). Each unlocks on its own when
    /// dropped, so dropping the returned guard releases the upper part only; together the two
    /// hold exactly what this guard held, with no moment unlocked. Any guard splits: one range
    /// or several, adjacent or not, of one mode or both.
    ///
    /// # Errors
    /// [`RangeError::SplitOutside`] if either guard would hold nothing: `mid` must be at least
    /// 1 and less than the distance from the first held unit to the end of the last held
    /// range. This guard is unchanged then.
    ///
    /// # Panics
    /// In delegated context (the split waits for the trustee, so that the new guard exists
    /// there before anything else can name it).
    pub fn split_at(&mut self, mid: u64) -> Result<Guard, RangeError> {
        let held = self.held_mut();
        let units = held.pieces.iter().flat_map(|(_, _, parts)| parts);
        let first = units.clone().map(|p| p.start).min();
        let end = units.map(|p| p.end).max();
        let (Some(first), Some(end)) = (first, end) else {
            unreachable!("a guard holds at least one unit");
        };
        if mid == 0 || mid >= end - first {
            return Err(RangeError::SplitOutside {
                mid,
                held: first..end,
            });
        }
        let at = first + mid;
        // At most one piece has units on both sides of `at` (pieces lie in disjoint shards):
        // it splits on its trustee into two requests, before this guard changes.
        let straddling = held.pieces.iter().position(|(_, _, parts)| {
            let (below, above) = cut(parts, at);
            !below.is_empty() && !above.is_empty()
        });
        if let Some(i) = straddling {
            let (shard, id, ref parts) = held.pieces[i];
            let (below, above) = cut(parts, at);
            let upper = held.lock.shards[shard]
                .apply_with(|s, (id, at): (Id, u64)| s.split(id, at), (id, at))
                .expect("a guard's piece is held, with units on both sides of `at`");
            held.pieces[i].2 = below;
            held.pieces.insert(i + 1, (shard, upper, above));
        }
        let (low, high): (Vec<_>, Vec<_>) = held
            .pieces
            .drain(..)
            .partition(|(_, _, parts)| parts[0].start < at);
        held.pieces = low;
        let upper = Guard {
            held: Some(Held {
                lock: held.lock.clone(),
                pieces: high,
            }),
        };
        if straddling.is_none() {
            // The upper guard's first piece was counted as part of this guard's request;
            // it now names a request of its own (a split piece's upper half is counted).
            let (shard, id, _) = upper.held().pieces[0];
            let counted = upper.held().lock.shards[shard].apply_with(|s, id: Id| s.count(id), id);
            assert!(counted, "a guard's piece is held");
        }
        Ok(upper)
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
        for (shard, id, parts) in &mut held.pieces {
            if parts.iter().any(|p| p.mode == Mode::Write) {
                let done = held.lock.shards[*shard].apply_with(|s, id: Id| s.downgrade(id), *id);
                assert!(done, "a guard's request is held");
                for p in parts.iter_mut() {
                    p.mode = Mode::Read;
                }
            }
        }
        Guard { held: Some(held) }
    }
}

/// Releases (or withdraws) lock request `id` on `service`: without waiting on a worker, where
/// a guard may be dropped in delegated context; a plain thread, which has no worker to run a
/// callback, waits for the release.
fn release(service: &Trust<Service>, id: Id) {
    if trust::current_worker().is_some() {
        service.apply_then_with(|s, id: Id| s.release(id), id, |()| {});
    } else {
        service.apply_with(|s, id: Id| s.release(id), id);
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            for (shard, id, _) in held.pieces {
                release(&held.lock.shards[shard], id);
            }
        }
    }
}
