//! Where a property lives, and how it moves: the property header's *home*, the route table of
//! a property that has moved, and pins.
//!
//! # Protocol
//!
//! Every property starts with a [`Header`] (`repr(C)`, the same for every value type). Its
//! `home` is the worker whose trustee owns the value; only that trustee touches the value.
//!
//! * **Moving.** A move runs on the home's worker, in its loop between batches
//!   (`Trust::migrate_to` hands it there; so does rebalancing): it checks that nothing pins
//!   the property, makes the route table if there is none yet, and stores the new home with
//!   the `MOVED` flag, *release*. Everything the old home did to the
//!   value happens before that store. The new home touches the value only after it loaded the
//!   home word, *acquire*, itself (inline runs), or after a batch or a forwarded group whose
//!   sender loaded it so (a channel or a queue lock passes the order on). A value never moves
//!   in memory: only its owner changes.
//! * **Routing.** A client that is a worker sends a request where the header says, unless the
//!   property has moved: then it looks up its own slot in the route table, the trustee it
//!   last sent the property's requests to and the batch (its number in that lane) the last
//!   one went into. Until that batch is answered it may not send to the home (the new
//!   request would overtake the old ones): a fiber waits for the answer, then switches;
//!   code that may not wait (delegated closures, callbacks) sends there too, to be
//!   forwarded, and switches at its first request after the answer. Either way the client
//!   writes where the request goes, and into which batch, into its slot. So a client's
//!   requests for one property are never on two trustees at once, and a later one never
//!   overtakes an earlier one on a shorter path; requests for other properties in the same
//!   lane do not hold the switch back. Plain threads wait for each answer and send
//!   to the home; requests from outside a runtime's workers (futures, other runtimes) go
//!   to the property's first trustee (`origin`), whose worker re-sends them in order.
//! * **Forwarding.** A trustee that serves a record whose property lives elsewhere (or that
//!   still has earlier records of that property on their way) does not run it: it holds the
//!   client's batch unanswered (*parks* it) and sends the record, with every other such
//!   record of the property, as one *group* to the home's forward queue, one group per
//!   property at a time. The home runs the group's records in order while it is still their
//!   home and sends the group back; records it did not run (the property moved on) go out
//!   again, first, in the next group. When every record of a parked batch is back, the batch
//!   is answered. A request is forwarded once per move it races with: there is no chain of
//!   forwarders and no loop, since a group always goes to the home of the moment.
//! * **Withdrawing.** `Trust::withdraw` takes the value out of the runtime, on its home
//!   between batches like a move: after the same checks it stores the home with `WITHDRAWN`
//!   (and `MOVED`, so that routing leaves the common path) and fixes the property, then
//!   reads the value out. A request made after that panics where it is made (`route`); one
//!   already on its way is refused wherever it is served (the home, or a trustee that sends
//!   it there as part of a group): flagged instead of run, its closure dropped by its
//!   completion, which raises the refusal as the closure's panic. Runtime code that sends
//!   requests on behalf of others (submissions from outside, frees) checks
//!   [`Header::withdrawn`] first, so that nothing panics in a worker's loop. The value's
//!   memory stays until the last trust goes; it is not dropped again then.
//! * **Pins.** A fiber started by `launch` works on the value across suspension points, and a
//!   deferred request that waits for its [`Reply`](crate::Reply) has its expiry run on the
//!   trustee that keeps it: both pin the property to its home (a count only its home
//!   changes), and a move of a pinned property is refused. A property can also be fixed to
//!   its home for good (durable properties, whose log is their worker's).
//!
//! Ordering: one client's requests to one property run in the order they were made, across
//! any number of moves. Requests to *different* properties of one trustee stay in order
//! only while neither moves: a forwarded request runs after later requests to properties
//! that stayed.
//!
//! Freeing (see `free`): a property that has moved may still have requests on an earlier
//! trustee. The route table says which: a client whose slot is not the home may have some in
//! its lane to that slot, so the free also waits until each such lane has answered the batch
//! the slot names (every batch started, for a slot unused since the first move); a parked
//! batch is answered only after its forwarded records ran.

use std::ptr;

use crate::loom::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// The home word's flag: the property has moved at least once (its route table exists).
pub(crate) const MOVED: usize = 1 << (usize::BITS - 1);

/// The home word's flag: the value was taken out of the runtime (`Trust::withdraw`); the
/// home part is the worker it was taken out on.
const WITHDRAWN: usize = 1 << (usize::BITS - 2);

/// The pin count's flag: the property never moves (`Trust::fix_home`).
const FIXED: u32 = 1 << 31;

/// The first part of every property (`repr(C)`, so its fields lie at the same place for every
/// value type and code that does not know the type can read them).
#[repr(C)]
pub(crate) struct Header {
    /// The value's type name (for `stats`).
    pub(crate) type_name: fn() -> &'static str,
    /// The owning worker, with `MOVED` once the property has moved.
    home: AtomicUsize,
    /// The first home: requests from outside the workers go there (see the module docs).
    pub(crate) origin: usize,
    /// Made by the first move; freed with the property.
    route: AtomicPtr<Route>,
    /// Fibers and waiting deferred requests that hold the property to its home, and `FIXED`.
    pins: AtomicU32,
}

/// Where each worker last sent a moved property's requests, and into which of its batches to
/// that trustee (see `Lanes`): one slot per worker, each on cache lines of its own since its
/// worker writes it with every request.
struct Route {
    clients: Box<[Slot]>,
}

#[repr(align(128))]
struct Slot(AtomicU64);

/// A slot no request has used since the table was made: the worker's requests before went
/// to the property's first trustee, which was its home until then.
const UNUSED: u64 = u64::MAX;

/// What routing asks of the calling worker's lanes, by trustee: the number (a `staged` count,
/// see `free`) of the batch its next request there would join, and whether every batch up to
/// a number has been answered (a parked batch only once its forwarded records ran).
pub(crate) trait Lanes {
    fn next_batch(&self, trustee: usize) -> u32;
    fn answered_up_to(&self, trustee: usize, batch: u32) -> bool;
    /// Waits (the calling fiber blocks) until `answered_up_to(trustee, batch)`; false, at
    /// once, where nothing may wait (not in a fiber).
    fn wait_answered(&self, trustee: usize, batch: u32) -> bool;
}

fn pack(trustee: usize, batch: u32) -> u64 {
    (trustee as u64) << 32 | u64::from(batch)
}

fn unpack(slot: u64) -> (usize, u32) {
    ((slot >> 32) as usize, slot as u32)
}

/// The panic of a request made, or still on its way, after its property was withdrawn.
pub(crate) const WITHDRAWN_MESSAGE: &str = "the property was withdrawn from its runtime \
     (Trust::withdraw): no request runs on it any more";

/// Why a property did not move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrateError {
    /// The target is not a trustee of the property's runtime.
    NotATrustee {
        /// The worker asked for.
        worker: usize,
        /// The runtime's trustees.
        trustees: Vec<usize>,
    },
    /// A fiber started by `launch` works on it, or a deferred request waits for its reply:
    /// it stays until they end.
    Pinned {
        /// How many hold it.
        pins: u32,
    },
    /// It was fixed to its trustee for good ([`Trust::fix_home`](crate::Trust::fix_home)).
    Fixed,
    /// The property was taken out of its runtime ([`Trust::withdraw`](crate::Trust::withdraw)).
    Withdrawn,
    /// No property of that id is among the trustee's hottest (it was freed or moved since, or
    /// never was hot there): [`Handle::move_hot`](crate::Handle::move_hot) moves only those.
    NotHot {
        /// The id asked for.
        id: usize,
        /// The trustee asked to move it.
        worker: usize,
    },
}

impl std::fmt::Display for MigrateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MigrateError::NotATrustee { worker, trustees } => write!(
                f,
                "cannot move a property to worker {worker}: it is not a trustee of this runtime \
                 (trustees: {trustees:?})"
            ),
            MigrateError::Pinned { pins } => write!(
                f,
                "cannot move the property now: it is pinned to its trustee by {pins} launched \
                 fiber(s) or deferred request(s) waiting for a reply"
            ),
            MigrateError::Fixed => f.write_str(
                "cannot move the property: it is fixed to its trustee (such as a durable \
                 property, which stays where its log is)",
            ),
            MigrateError::Withdrawn => f.write_str(
                "the property was withdrawn from its runtime (Trust::withdraw): it is no \
                 longer there to move",
            ),
            MigrateError::NotHot { id, worker } => write!(
                f,
                "no property {id} is among worker {worker}'s hottest now (freed or moved \
                 since, or never hot there): nothing moved"
            ),
        }
    }
}

impl std::error::Error for MigrateError {}

impl Header {
    pub(crate) fn new(type_name: fn() -> &'static str, home: usize) -> Self {
        Header {
            type_name,
            home: AtomicUsize::new(home),
            origin: home,
            route: AtomicPtr::new(ptr::null_mut()),
            pins: AtomicU32::new(0),
        }
    }

    /// The header of the property at `property` (a record's property address).
    ///
    /// # Safety
    /// `property` is a live property, of any type.
    pub(crate) unsafe fn of<'a>(property: *const ()) -> &'a Header {
        // SAFETY: per the caller; every property begins with its header.
        unsafe { &*property.cast::<Header>() }
    }

    /// The owning worker now.
    #[inline(always)]
    pub(crate) fn home(&self) -> usize {
        self.home.load(Ordering::Acquire) & !(MOVED | WITHDRAWN)
    }

    /// Whether the value was taken out of the runtime (`Trust::withdraw`).
    pub(crate) fn withdrawn(&self) -> bool {
        self.home.load(Ordering::Acquire) & WITHDRAWN != 0
    }

    /// Whether the property has ever moved.
    pub(crate) fn moved(&self) -> bool {
        self.home.load(Ordering::Acquire) & MOVED != 0
    }

    /// Where worker `client` sends its next request: the home, or while the property has
    /// moved and the client's last request for it still waits on another trustee (its batch
    /// there is not answered), that trustee (see the module docs). Only worker `client` calls
    /// this, for its own slot, and sends the request where it says.
    #[inline(always)]
    pub(crate) fn route(&self, client: usize, lanes: &impl Lanes) -> usize {
        let home = self.home.load(Ordering::Acquire);
        if home & MOVED == 0 {
            return home;
        }
        self.route_moved(client, home & !MOVED, lanes)
    }

    /// Out of line: the common path (a property that never moved) stays a load and a test.
    #[inline(never)]
    fn route_moved(&self, client: usize, mut home: usize, lanes: &impl Lanes) -> usize {
        if home & WITHDRAWN != 0 {
            panic!("{WITHDRAWN_MESSAGE}"); // before the route table, which it may lack
        }
        // SAFETY: the table is made before `MOVED` is stored (release), which the caller's
        // acquire load saw, and lives as long as the property.
        let route = unsafe { &*self.route.load(Ordering::Acquire) };
        let slot = &route.clients[client].0;
        loop {
            // Only this worker writes its slot; its fibers share it.
            let (last, batch) = match slot.load(Ordering::Relaxed) {
                // Its requests so far went to the first trustee, in batches up to the next.
                UNUSED => (self.origin, lanes.next_batch(self.origin)),
                used => unpack(used),
            };
            let to = if last == home || lanes.answered_up_to(last, batch) {
                home
            } else if lanes.wait_answered(last, batch) {
                // A fiber waited for the earlier requests to come back rather than send more
                // the long way (under steady traffic the last one's batch would never be
                // answered before the next request). Meanwhile other fibers of this worker
                // may have routed, and the property may have moved: decide again.
                home = self.home.load(Ordering::Acquire) & !MOVED;
                if home & WITHDRAWN != 0 {
                    panic!("{WITHDRAWN_MESSAGE}");
                }
                continue;
            } else {
                // Where nothing may wait: the long way, to be forwarded.
                last
            };
            slot.store(pack(to, lanes.next_batch(to)), Ordering::Relaxed);
            return to;
        }
    }

    /// Each worker whose requests for the property may still wait on a trustee other than
    /// the home, with that trustee and the batch of its last one there (`None`: not known,
    /// any batch started so far), for the free (see the module docs).
    pub(crate) fn stale_routes(&self) -> Vec<(usize, usize, Option<u32>)> {
        let route = self.route.load(Ordering::Acquire);
        if route.is_null() {
            return Vec::new();
        }
        let home = self.home();
        // SAFETY: as in `route_moved`.
        let route = unsafe { &*route };
        route
            .clients
            .iter()
            .enumerate()
            .map(|(client, slot)| match slot.0.load(Ordering::Relaxed) {
                UNUSED => (client, self.origin, None),
                used => {
                    let (trustee, batch) = unpack(used);
                    (client, trustee, Some(batch))
                }
            })
            .filter(|&(_, trustee, _)| trustee != home)
            .collect()
    }

    /// Whether the property may leave its home `me` (the caller runs there): not withdrawn,
    /// fixed or pinned.
    fn may_leave(&self, me: usize) -> Result<(), MigrateError> {
        if self.withdrawn() {
            return Err(MigrateError::Withdrawn);
        }
        debug_assert_eq!(self.home(), me, "a move or withdrawal runs on the home");
        let pins = self.pins.load(Ordering::Relaxed);
        if pins & FIXED != 0 {
            return Err(MigrateError::Fixed);
        }
        if pins > 0 {
            return Err(MigrateError::Pinned { pins });
        }
        Ok(())
    }

    /// Moves the property from its home `me` (the caller runs there, on its behalf) to
    /// worker `to`, of a runtime of `workers` workers.
    pub(crate) fn move_to(&self, me: usize, to: usize, workers: usize) -> Result<(), MigrateError> {
        self.may_leave(me)?;
        if to == me {
            return Ok(());
        }
        if self.route.load(Ordering::Relaxed).is_null() {
            let clients = (0..workers).map(|_| Slot(AtomicU64::new(UNUSED))).collect();
            let table = Box::into_raw(Box::new(Route { clients }));
            self.route.store(table, Ordering::Release);
        }
        self.home.store(to | MOVED, Ordering::Release);
        Ok(())
    }

    /// Marks the property withdrawn from its home `me` (the caller runs there, between
    /// batches, and takes the value out next): after the checks a move makes, fixes it and
    /// stores the flag, *release* (see the module docs).
    pub(crate) fn withdraw(&self, me: usize) -> Result<(), MigrateError> {
        self.may_leave(me)?;
        self.pins.fetch_or(FIXED, Ordering::Relaxed);
        self.home.store(me | MOVED | WITHDRAWN, Ordering::Release);
        Ok(())
    }

    /// Fixes the property to its home for good (any thread).
    pub(crate) fn fix(&self) {
        self.pins.fetch_or(FIXED, Ordering::Relaxed);
    }

    /// One more hold on the home (the home's worker only).
    pub(crate) fn pin(&self) {
        self.pins.fetch_add(1, Ordering::Relaxed);
    }

    /// One hold less (the home's worker only).
    pub(crate) fn unpin(&self) {
        self.pins.fetch_sub(1, Ordering::Relaxed);
    }

    /// How many hold the property to its home (fibers and waiting requests).
    pub(crate) fn pins(&self) -> u32 {
        self.pins.load(Ordering::Relaxed) & !FIXED
    }

    /// Frees the route table, with the property.
    ///
    /// # Safety
    /// Nothing uses the property any more.
    pub(crate) unsafe fn free_route(&self) {
        let route = self.route.load(Ordering::Relaxed);
        if !route.is_null() {
            // SAFETY: made by `move_to` with `Box`, and nobody routes any more.
            drop(unsafe { Box::from_raw(route) });
        }
    }
}

/// Records of one property, sent by a trustee that is not their home to the home, and back
/// (see the module docs).
pub(crate) struct Group {
    pub(crate) property: *const (),
    /// The trustee that sent it, which gets it back.
    pub(crate) forwarder: usize,
    /// The records, back to back, moved bit for bit out of their batches.
    pub(crate) words: Vec<u64>,
    /// Per record: its client, and where it lies in its parked batch (for the forwarder).
    pub(crate) origins: Vec<(usize, *mut u64)>,
    /// How many records, from the first, the home ran; the others come back unrun.
    pub(crate) ran: usize,
}

// SAFETY: a group carries requests, whose closures are `Send`, to the home and back. Their
// completions' payloads (which need not be `Send`) travel only as bits and are used nowhere
// but in the client's own batch, after the forwarder has copied them back; the record
// pointers are used only by the forwarder.
unsafe impl Send for Group {}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::loom::cell::UnsafeCell;
    use loom::sync::Arc;

    /// Lanes with every batch answered.
    struct Answered;

    impl Lanes for Answered {
        fn next_batch(&self, _: usize) -> u32 {
            1
        }
        fn answered_up_to(&self, _: usize, _: u32) -> bool {
            true
        }
        fn wait_answered(&self, _: usize, _: u32) -> bool {
            true
        }
    }

    /// The old home writes the value and moves the property; another worker routes by the
    /// header and, once it finds itself the home, uses the value: it sees the old home's
    /// write, and the route table the move made (loom reports a race otherwise).
    #[test]
    fn the_new_home_sees_what_the_old_one_did() {
        loom::model(|| {
            let shared = Arc::new((Header::new(|| "u64", 0), UnsafeCell::new(0u64)));
            let old = {
                let shared = shared.clone();
                loom::thread::spawn(move || {
                    let (header, value) = &*shared;
                    // SAFETY: worker 0 is the home: it alone touches the value.
                    value.with_mut(|v| unsafe { *v = 1 });
                    header.move_to(0, 1, 2).unwrap();
                })
            };
            let (header, value) = &*shared;
            // Worker 1, whose lanes are empty.
            while header.route(1, &Answered) != 1 {
                loom::thread::yield_now();
            }
            // SAFETY: worker 1 is the home now.
            value.with_mut(|v| unsafe {
                assert_eq!(*v, 1);
                *v = 2;
            });
            old.join().unwrap();
            assert!(header.moved());
            // Worker 1 routes to the home now; worker 0 has not routed since, so a free
            // would still look at its lane to itself.
            assert_eq!(header.stale_routes(), vec![(0, 0, None)]);
            // SAFETY: nobody routes any more.
            unsafe { header.free_route() };
        });
    }
}
