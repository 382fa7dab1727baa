//! Calls from other ranks that go straight to where a moved property lives.
//!
//! A handle on rank R to a property made on rank F (its *first home*) sends its calls to F,
//! which forwards them wherever the value lives now (see `moved`): two hops. To save one,
//! F tells the caller where the value went, and the caller's next calls go there directly.
//! The protocol keeps each caller's calls in order, per worker of R (the unit `moved`
//! orders by):
//!
//! 1. **Telling.** When F forwards to rank H a request that came on the link from worker w
//!    of R, it notes that it told w, and tells it (a `TellOp` call, whose answer says
//!    nothing) from the worker that link ends on (unless H is R itself: a call to this
//!    rank's own value has no link to take). A rank of another build refuses the call (ops
//!    do not cross builds), and its calls go by F.
//! 2. **Switching.** Worker w goes on sending its calls by F, and sends a *marker* (a call
//!    that does nothing) by F after them. F forwards it behind them, so its answer means
//!    that they ran. If w sent no call by F after the marker, it switches: its next calls
//!    go to H. Otherwise it sends another marker, until one comes back with none after it.
//! 3. **Revoking.** A move of the property first revokes every switch it told of, in
//!    parallel with its markers (see `migrate`): a `RevokeOp` call to each told worker from
//!    F's worker that told it, so that it cannot overtake the telling on their link. The
//!    worker sends its calls by F again at once (F holds them while the move is on) and
//!    answers when a marker it sent to H after its last direct call comes back: they ran.
//!    Only then does the move take the value out of H.
//!
//! So no direct call reaches a place the value has left, and a worker's calls never run
//! out of order: it changes paths only when nothing it sent on the old one is still to run.
//! A worker told nothing calls F, after one load of [`Route::told`]. The calls through a
//! rank's handles to one export share one [`Route`], whatever ticket the handles hold: a
//! table of the process keeps them by job run and export.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};
use std::task::{Poll, Waker};

use crate::codec;
use crate::export::{Life, Target};
use crate::link::{self, OnAnswer, Outcome};
use crate::op::{self, Op, Origin, Reply, Run};
use crate::state;

/// How one rank's calls to one export of another rank go (see the module docs).
pub(crate) struct Route {
    /// The export, on the property's first home.
    first: Target,
    /// The call a marker makes: one that does nothing, for the property's type.
    marker: &'static Op,
    /// Whether any of this rank's workers was told where the value lives: until then,
    /// every call goes to `first`.
    told: AtomicBool,
    /// Per worker of this rank.
    lanes: Box<[Mutex<Lane>]>,
}

/// One worker's path to a property.
#[derive(Default)]
struct Lane {
    /// Where its calls go: the first home (`None`), or the value's home.
    direct: Option<Target>,
    /// Where it was told the value lives, while it switches there.
    switching: Option<Target>,
    /// Calls sent by the first home since the last marker went, while it switches.
    sent_by_first: u64,
    /// Bumped by each telling and revocation: an earlier marker's answer is stale then.
    epoch: u64,
    /// Fibers waiting for the switch to end.
    waiters: Vec<Waker>,
}

impl Lane {
    fn target(&self, first: Target) -> Target {
        self.direct.unwrap_or(first)
    }

    /// Ends a switch: to `direct`, or (`None`) by the first home still.
    fn switched(&mut self, direct: Option<Target>) {
        self.switching = None;
        if direct.is_some() {
            self.direct = direct;
        }
        self.waiters.drain(..).for_each(Waker::wake);
    }
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("told", &self.told.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Names an export in a run of a job: the run, the export's rank, that rank's life, worker,
/// slot and generation.
type Key = (u64, u32, u32, u32, u32, u32);

fn key(run: u64, t: &Target) -> Key {
    (run, t.node, t.incarnation, t.worker, t.slot, t.generation)
}

/// This process's routes, by export; a route lives while handles under it do.
static ROUTES: LazyLock<Mutex<Table>> = LazyLock::new(Mutex::default);

#[derive(Default)]
struct Table {
    routes: HashMap<Key, Weak<Route>>,
    /// Entries after the last sweep of dead ones: the next sweeps at twice as many, so
    /// sweeping costs each insertion O(1) on average.
    swept: usize,
}

fn routes() -> MutexGuard<'static, Table> {
    ROUTES.lock().unwrap_or_else(|p| p.into_inner())
}

/// The route of this rank's calls to the export `first`, while handles use it.
fn route_to(run: u64, first: &Target) -> Option<Arc<Route>> {
    routes().routes.get(&key(run, first))?.upgrade()
}

impl Route {
    /// The route of this rank's calls to the export `first`, shared by every handle to it;
    /// `marker` is the operation that does nothing on its property (`call::marker_op`).
    pub(crate) fn of(first: Target, marker: &'static Op) -> Arc<Route> {
        let fresh = |workers: usize| {
            Arc::new(Route {
                first,
                marker,
                told: AtomicBool::new(false),
                lanes: (0..workers).map(|_| Mutex::default()).collect(),
            })
        };
        let Some(state) = state::current() else {
            return fresh(0); // never told: nothing reaches it
        };
        let mut table = routes();
        let key = key(state.run, &first);
        if let Some(route) = table.routes.get(&key).and_then(Weak::upgrade) {
            return route;
        }
        if table.routes.len() >= 2 * table.swept.max(32) {
            table.routes.retain(|_, route| route.strong_count() > 0);
            table.swept = table.routes.len();
        }
        let route = fresh(state.handle.workers());
        table.routes.insert(key, Arc::downgrade(&route));
        route
    }

    /// A route no telling reaches: for handles of the wrong type, refused as they arrive.
    pub(crate) fn detached(first: Target, marker: &'static Op) -> Arc<Route> {
        Arc::new(Route {
            first,
            marker,
            told: AtomicBool::new(false),
            lanes: Box::new([]),
        })
    }

    /// Where the calling worker's next call goes: `first`, unless the worker was told of a
    /// new home (one load).
    #[inline]
    pub(crate) fn target(&self) -> Target {
        if !self.told.load(Ordering::Acquire) {
            return self.first;
        }
        self.target_told()
    }

    /// [`Route::target`] once told. A fiber waits while its worker switches (so that the
    /// switch ends: a marker comes back with no call sent after it), and for room on the
    /// link it picked, and then checks its pick again, so that it stages with no yield after
    /// the pick. Code that may not wait (delegated context) calls by the first home during a
    /// switch, counted, and the switch sends another marker after it.
    #[cold]
    #[inline(never)]
    fn target_told(&self) -> Target {
        let Some(lane) = trust::current_worker().and_then(|w| self.lanes.get(w)) else {
            return self.first; // off the rack's workers: the call goes through a fiber
        };
        if trust::in_delegated_context() {
            let mut lane = lock(lane);
            if lane.switching.is_some() {
                lane.sent_by_first += 1;
            }
            return lane.target(self.first);
        }
        loop {
            let picked = trust::block_on(std::future::poll_fn(|cx| {
                let mut lane = lock(lane);
                if lane.switching.is_some() {
                    lane.waiters.push(cx.waker().clone());
                    return Poll::Pending;
                }
                Poll::Ready(lane.target(self.first))
            }));
            link::wait_for_room_to(picked.node, picked.worker);
            let lane = lock(lane);
            if lane.switching.is_none() && lane.target(self.first) == picked {
                return picked;
            }
        }
    }
}

fn lock(lane: &Mutex<Lane>) -> MutexGuard<'_, Lane> {
    lane.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sends `route`'s marker to `to` from this worker; `answered` runs on its answer, with
/// whether it ran (not: `to`'s rank was lost).
fn send_marker(route: &Route, to: Target, answered: impl FnOnce(bool) + 'static) {
    let bytes = codec::encode(to.life(), &());
    let on_answer: OnAnswer = Box::new(move |outcome| answered(matches!(outcome, Outcome::Ok(_))));
    link::call(
        to.node,
        to.worker,
        Some(to.incarnation),
        route.marker,
        Some((to.slot, to.generation)),
        bytes.as_slice(),
        on_answer,
    );
}

/// Step 1, on the first home, from the worker the caller `o`'s link ends on (`o.via`): tells
/// it that the property lives at `to`.
pub(crate) fn tell(o: Origin, to: Target) {
    debug_assert_eq!(trust::current_worker(), Some(o.via as usize));
    let argument = (
        (o.via, o.slot, o.generation),
        (to.node, to.worker, to.slot, to.generation, to.incarnation),
    );
    let bytes = codec::encode(o.life(), &argument);
    link::call(
        o.rank,
        o.worker,
        Some(o.incarnation),
        TellOp::OP,
        None,
        bytes.as_slice(),
        Box::new(|_| {}),
    );
}

/// The export `(worker, slot, generation)` of the rank `from`, as its callers name it.
fn export_of(from: Life, (worker, slot, generation): (u32, u32, u32)) -> Target {
    Target {
        node: from.rank,
        worker,
        slot,
        generation,
        incarnation: from.incarnation,
    }
}

/// The operation "the property of the sender's export `(worker, slot, generation)` lives at
/// `(node, worker, slot, generation, incarnation)`" (step 1), answered at once.
struct TellOp;

impl TellOp {
    const OP: &'static Op = &op::descriptor!(|| "gossamer::redirect::TellOp", Run::Free(Self::run));

    fn run(argument: &[u8], reply: Reply) {
        type Told = ((u32, u32, u32), (u32, u32, u32, u32, u32));
        let (export, (node, worker, slot, generation, incarnation)): Told =
            match codec::decode_value(argument) {
                Ok(told) => told,
                Err(e) => return reply.refuse(format!("cannot decode where a property is: {e}")),
            };
        let first = export_of(reply.peer(), export);
        reply.ok(&());
        let to = Target {
            node,
            worker,
            slot,
            generation,
            incarnation,
        };
        told(first, to);
    }
}

/// On the worker told: the property of the export `first` lives at `to` (step 1 of the
/// module docs). Starts switching there. A home this rank does not link to (itself, or no
/// worker of the job: a broken peer) is ignored.
fn told(first: Target, to: Target) {
    let (Some(state), Some(worker)) = (state::current(), trust::current_worker()) else {
        return;
    };
    let linked = state
        .workers
        .get(to.node as usize)
        .is_some_and(|&w| to.worker < w);
    if !linked || to.node == state.rank {
        return;
    }
    let Some(route) = route_to(state.run, &first) else {
        return; // the handles are gone
    };
    let Some(lane) = route.lanes.get(worker) else {
        return;
    };
    let epoch = {
        let mut lane = lock(lane);
        if lane.direct == Some(to) {
            return;
        }
        lane.epoch += 1;
        lane.switching = Some(to);
        lane.sent_by_first = 0;
        lane.epoch
    };
    route.told.store(true, Ordering::Release);
    // Out of the link's reader, where a call may be staged.
    trust::defer(move || next_marker(route, worker, epoch));
}

/// Step 2: sends a marker by the first home, unless the lane was told or revoked since
/// `epoch`; on its answer, switches if no call went by the first home after it.
fn next_marker(route: Arc<Route>, worker: usize, epoch: u64) {
    {
        let mut lane = lock(&route.lanes[worker]);
        if lane.epoch != epoch {
            return;
        }
        lane.sent_by_first = 0;
    }
    let first = route.first;
    let again = route.clone();
    send_marker(&route, first, move |ran| {
        let mut lane = lock(&again.lanes[worker]);
        if lane.epoch != epoch {
            return;
        }
        if !ran {
            lane.switched(None); // the first home was lost: its calls fail there
        } else if lane.sent_by_first == 0 {
            let to = lane.switching;
            lane.switched(to);
            if let Some(state) = state::current() {
                state.redirects.fetch_add(1, Ordering::Relaxed);
            }
        } else {
            drop(lane);
            next_marker(again, worker, epoch);
        }
    });
}

/// The last handle under `route` dropped, maybe with direct calls still on their way: keeps
/// the route, for a revocation to find and wait on, until a marker each worker sends behind
/// its direct calls comes back.
pub(crate) fn drain(route: Arc<Route>) {
    if !route.told.load(Ordering::Acquire) {
        return;
    }
    let Some(state) = state::current() else {
        return;
    };
    for (worker, lane) in route.lanes.iter().enumerate() {
        if lock(lane).direct.is_none() {
            continue;
        }
        let route = route.clone();
        // On the worker whose link the direct calls took, behind them.
        let on_worker = move || {
            if !link::is_rack_worker() {
                return; // the job ended: no revocation will come
            }
            let Some(to) = lock(&route.lanes[worker]).direct else {
                return; // revoked meanwhile: the revocation waits for them
            };
            let keep = route.clone();
            send_marker(&route, to, move |_| drop(keep));
        };
        drop(state.handle.spawn_on(worker, on_worker));
    }
}

/// Step 3, on the first home, from the worker that told the caller `o` (`o.via`): revokes
/// its switch; `on_answer` runs once its direct calls ran (or its rank was lost: then it has
/// nothing left to run).
pub(crate) fn revoke(o: Origin, on_answer: OnAnswer) {
    let bytes = codec::encode(o.life(), &(o.via, o.slot, o.generation));
    link::call(
        o.rank,
        o.worker,
        Some(o.incarnation),
        RevokeOp::OP,
        None,
        bytes.as_slice(),
        on_answer,
    )
}

/// The operation "call the export `(worker, slot, generation)` of the sender's rank by it
/// again", answered once this worker's direct calls to the property ran (step 3).
struct RevokeOp;

impl RevokeOp {
    const OP: &'static Op =
        &op::descriptor!(|| "gossamer::redirect::RevokeOp", Run::Free(Self::run));

    fn run(argument: &[u8], reply: Reply) {
        let export: (u32, u32, u32) = match codec::decode_value(argument) {
            Ok(export) => export,
            Err(e) => return reply.refuse(format!("cannot decode the export to revoke: {e}")),
        };
        let first = export_of(reply.peer(), export);
        let here = (state::current(), trust::current_worker());
        let (Some(state), Some(worker)) = here else {
            return reply.ok(&());
        };
        let Some(route) = route_to(state.run, &first) else {
            return reply.ok(&()); // the handles are gone
        };
        let Some(lane) = route.lanes.get(worker) else {
            return reply.ok(&());
        };
        let direct = {
            let mut lane = lock(lane);
            lane.epoch += 1;
            lane.switched(None);
            lane.direct.take()
        };
        match direct {
            // Behind the direct calls staged so far; later ones go by the first home.
            Some(to) => trust::defer(move || send_marker(&route, to, move |_| reply.ok(&()))),
            None => reply.ok(&()),
        }
    }
}
