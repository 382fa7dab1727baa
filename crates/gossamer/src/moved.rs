//! Where a property that left this rank lives now, and the calls held while it moves.
//!
//! A property moves between ranks with `Trust::migrate_to` (the steps are in `proxy`). Its
//! *first home*, the rank it was made on, stays its forwarder for good: every handle to it
//! anywhere names the first home (a local handle there, or an export there), and the first
//! home keeps, attached to the property's `trust::Trust` ([`trust::Trust::attach`]), a
//! [`Moved`]: where the value lives now ([`At`]), and per worker of this rank whether its
//! calls are held. So a call through any handle takes at most one hop after the first home,
//! however many times the property moved: a move re-points the one forward. The first home
//! also tells a caller on another rank where the value went, and that caller's calls then
//! skip it (see `redirect`).
//!
//! # Holding, and per-client order
//! A call to a moved property is made on a worker of the first home (calls from elsewhere
//! reach one through a fiber, see `proxy`), with [`Moved::call`]: at once if that worker's
//! calls are not held; otherwise a fiber waits until they are not, and code that may not
//! wait (delegated context) queues the call on its worker, behind the ones queued before.
//! A move holds every worker's calls, waits until what each worker sent to the old place has
//! run there (a marker call from each worker: one client's calls to one place run in order),
//! takes the value out, places it, and then releases each worker in its own loop, which sends
//! its queued calls on in order before any later call of that worker. So the calls of one
//! client (a fiber, or a link from another rank, both served by one worker) stay in order
//! across moves, and none is lost or run twice: each runs on whichever place held the
//! value when it was sent, and no place holds it while calls sent to the old one may run.
//!
//! # The first move
//! Until its first move a property is called directly, on its trustee, with no look at any
//! of this (one load: its attachment, absent). The first move attaches the state and sets
//! it active, then makes its marker calls through the trust itself: a call that found it
//! inactive was staged on its worker's lane before that worker's marker, since a worker
//! checks and stages without yielding in between. Callers outside the rank's workers do not
//! use lanes, so in a rack of several ranks they always call through a fiber (see `proxy`).

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use crate::export::Target;
use crate::link;
use crate::op::Origin;
use crate::redirect;
use crate::remote::Remote;

/// Where a moved property's value lives: on this rank, in a property of its own (not the
/// first one, whose value left), or on another rank.
pub(crate) enum At<T: Send + 'static> {
    Here(trust::Trust<T>),
    There(Arc<Remote>),
}

impl<T: Send + 'static> Clone for At<T> {
    fn clone(&self) -> Self {
        match self {
            At::Here(t) => At::Here(t.clone()),
            At::There(r) => At::There(r.clone()),
        }
    }
}

/// A property's forwarding state on its first home (see the module docs).
pub(crate) struct Moved<T: Send + 'static> {
    /// Whether calls go through here: set by the first move, cleared if that move failed
    /// before the value left.
    active: AtomicBool,
    state: Mutex<State<T>>,
}

struct State<T: Send + 'static> {
    /// Where the value lives; `None` until the first move placed it (the first property).
    at: Option<At<T>>,
    /// Per worker of this rank: whether its calls are held.
    holding: Vec<bool>,
    /// Whether a move is on (moves of one property go one at a time).
    moving: bool,
    /// Fibers waiting for a hold or a move to end.
    waiters: Vec<Waker>,
    /// The callers on other ranks told where the value lives since the last move began
    /// (see `redirect`).
    told: Vec<Origin>,
}

/// A call queued while its worker's calls are held.
type Queued = Box<dyn FnOnce()>;

thread_local! {
    /// This worker's queued calls, per moved property (by the address of its `Moved`).
    static QUEUED: RefCell<HashMap<usize, VecDeque<Queued>>> = RefCell::new(HashMap::new());
}

/// The forwarding state of `trust`'s property if it moved (or is moving) to another place:
/// one load and a test for a property that never did.
#[inline(always)]
pub(crate) fn moved<T: Send + 'static>(trust: &trust::Trust<T>) -> Option<Arc<Moved<T>>> {
    let attached = trust.attachment()?;
    active(attached)
}

#[cold]
#[inline(never)]
fn active<T: Send + 'static>(attached: &trust::Attachment) -> Option<Arc<Moved<T>>> {
    let moved = attached.clone().downcast::<Moved<T>>().ok()?;
    moved.active.load(Ordering::SeqCst).then_some(moved)
}

impl<T: Send + 'static> Moved<T> {
    /// The forwarding state of `trust`'s property, attached now if it had none (inactive).
    pub(crate) fn of(trust: &trust::Trust<T>, workers: usize) -> Arc<Moved<T>> {
        let fresh: trust::Attachment = Arc::new(Moved::<T> {
            active: AtomicBool::new(false),
            state: Mutex::new(State {
                at: None,
                holding: vec![false; workers],
                moving: false,
                waiters: Vec::new(),
                told: Vec::new(),
            }),
        });
        let _ = trust.attach(fresh);
        trust
            .attachment()
            .expect("attached above")
            .clone()
            .downcast::<Moved<T>>()
            .expect("only gossamer attaches to its properties")
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn key(&self) -> usize {
        self as *const Self as usize
    }

    /// Where the value lives (the first property's, before its first move placed it).
    fn at_or(state: &State<T>, first: &trust::Trust<T>) -> At<T> {
        state.at.clone().unwrap_or_else(|| At::Here(first.clone()))
    }

    /// Where the value lives, for a call that `origin` (a worker of another rank) made: notes
    /// that it is to be told where, if that is a third rank and it was not told yet (see
    /// `redirect`), and returns the telling, to send once the lock is dropped.
    fn at_for(
        state: &mut State<T>,
        first: &trust::Trust<T>,
        origin: Option<Origin>,
    ) -> (At<T>, Option<(Origin, Target)>) {
        let at = Self::at_or(state, first);
        let tell = match (&at, origin) {
            (At::There(r), Some(o)) if r.target.node != o.rank && !state.told.contains(&o) => {
                state.told.push(o);
                Some((o, r.target))
            }
            _ => None,
        };
        (at, tell)
    }

    /// Runs `call` with where the value lives, in this worker's order (see the module docs):
    /// at once, after waiting for a hold to end (a fiber), or queued behind the held calls
    /// (delegated context). `first` is the first property; `origin`, the caller on another
    /// rank whose request this is, if it is one.
    pub(crate) fn call(
        self: &Arc<Self>,
        first: &trust::Trust<T>,
        origin: Option<Origin>,
        call: impl FnOnce(At<T>) + 'static,
    ) {
        let worker = worker();
        if !trust::in_delegated_context() {
            return call(self.wait_at(first));
        }
        let now = {
            let mut state = self.lock();
            (!state.holding[worker]).then(|| Self::at_for(&mut state, first, origin))
        };
        match now {
            Some((at, tell)) => {
                if let Some((o, to)) = tell {
                    redirect::tell(o, to);
                }
                call(at)
            }
            None => {
                let (me, first) = (self.clone(), first.clone());
                let queued: Queued = Box::new(move || {
                    let (at, tell) = Self::at_for(&mut me.lock(), &first, origin);
                    if let Some((o, to)) = tell {
                        redirect::tell(o, to);
                    }
                    call(at)
                });
                QUEUED.with(|q| {
                    q.borrow_mut()
                        .entry(self.key())
                        .or_default()
                        .push_back(queued)
                });
            }
        }
    }

    /// Where the value lives, once this worker's calls are not held and its link there has
    /// room: for a fiber's call, which stages at once, with no yield in between (a move's
    /// marker must not overtake it).
    pub(crate) fn wait_at(&self, first: &trust::Trust<T>) -> At<T> {
        let worker = worker();
        loop {
            let at = trust::block_on(std::future::poll_fn(|cx| {
                let mut state = self.lock();
                if state.holding[worker] {
                    state.waiters.push(cx.waker().clone());
                    return Poll::Pending;
                }
                Poll::Ready(Self::at_or(&state, first))
            }));
            let At::There(remote) = &at else {
                return at; // a trust call stages without waiting
            };
            link::wait_for_room_to(remote.target.node, remote.target.worker);
            if !self.lock().holding[worker] {
                return at;
            }
        }
    }

    /// The rank the value lives on, if not this one.
    pub(crate) fn rank_now(&self) -> Option<u32> {
        match &self.lock().at {
            Some(At::There(remote)) => Some(remote.target.node),
            Some(At::Here(_)) | None => None,
        }
    }

    /// Starts a move: waits for one under way to end, then holds every worker's calls and
    /// sets the state active. Returns where the value lives, whether this is the first move
    /// (it was inactive), and the callers told where it lives, whose switches there the move
    /// revokes before it takes the value out (see `redirect`).
    pub(crate) fn begin(&self, first: &trust::Trust<T>) -> (At<T>, bool, Vec<Origin>) {
        let (at, told) = trust::block_on(std::future::poll_fn(|cx| {
            let mut state = self.lock();
            if state.moving || state.holding.iter().any(|&h| h) {
                state.waiters.push(cx.waker().clone());
                return Poll::Pending;
            }
            state.moving = true;
            state.holding.iter_mut().for_each(|h| *h = true);
            let told = std::mem::take(&mut state.told);
            Poll::Ready((Self::at_or(&state, first), told))
        }));
        // After the holds: a worker that finds the state active finds its calls held.
        let first_move = !self.active.swap(true, Ordering::SeqCst);
        (at, first_move, told)
    }

    /// Ends a move: the value lives at `at` now (`None`: where it was; if this was the first
    /// move, calls go straight to the first property again), and each worker is released in
    /// its own loop, sending its queued calls on first.
    pub(crate) fn end(self: &Arc<Self>, at: Option<At<T>>, first_move: bool, rack: &trust::Handle) {
        {
            let mut state = self.lock();
            match at {
                Some(at) => state.at = Some(at),
                None if first_move => self.active.store(false, Ordering::SeqCst),
                None => {}
            }
            state.moving = false;
        }
        for worker in 0..rack.workers() {
            let me = self.clone();
            drop(rack.spawn_on(worker, move || me.release(worker)));
        }
    }

    /// On `worker`: sends its queued calls on, in order, then lets its calls through.
    fn release(&self, worker: usize) {
        loop {
            let next = QUEUED.with(|q| {
                let mut q = q.borrow_mut();
                let calls = q.get_mut(&self.key())?;
                let next = calls.pop_front();
                if calls.is_empty() {
                    q.remove(&self.key());
                }
                next
            });
            match next {
                // A call may wait (for room on a link): others of this worker queue meanwhile.
                Some(call) => call(),
                None => break,
            }
        }
        let waiters = {
            let mut state = self.lock();
            state.holding[worker] = false;
            std::mem::take(&mut state.waiters)
        };
        waiters.into_iter().for_each(Waker::wake);
    }
}

/// This thread's worker index: calls to moved properties are made on the rack's workers.
fn worker() -> usize {
    trust::current_worker().expect("a call to a moved property off the rack's workers")
}
