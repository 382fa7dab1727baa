//! `Trust<T>`: a counted handle to a property owned by a trustee, and the delegation calls.
//!
//! A request travels as a record whose header holds a monomorphized *trampoline*: `run_apply`
//! reads the closure out of the record, runs it on the property and writes the answer; the
//! matching completion trampoline on the client reads the answer and delivers it (to a waiting
//! fiber, a `then` callback, or a future).

use crate::loom::sync::atomic::{AtomicUsize, Ordering, fence};
use std::cell::UnsafeCell;
use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Poll;

use crate::async_call::{ApplyFuture, Call};
use crate::external;
use crate::fiber::{self, Oneshot, Promise};
use crate::free::DeadProperty;
use crate::home::{Header, MigrateError, WITHDRAWN_MESSAGE};
use crate::inject::{FiberId, Injected, Submission, Submitted};
use crate::latch::Latch;
use crate::record;
use crate::registry::Registry;
use crate::request::{self, CompleteFn, Panic, RunFn};
use crate::worker::{self, BLOCKING_IN_DELEGATED, MAX_BACKLOG, PendingAnswer, Running};

/// Message of `apply_then` called where no worker could run its callback.
pub(crate) const APPLY_THEN_OUTSIDE_WORKERS: &str = "apply_then called outside a runtime worker \
     (on a plain thread or in another executor's task), where nothing would run its callback: \
     use apply to wait for the result, or apply_async to await it";

/// An entrusted value with its trust count. Only its home's trustee touches `value`. The
/// header comes first, at the same place for every `T`, so that code that does not know `T`
/// (the sampled counters, forwarding) can read where a record's property lives.
#[repr(C)]
struct Property<T> {
    header: Header,
    refs: AtomicUsize,
    registry: Arc<Registry>,
    /// What the layer above keeps with the property (`Trust::attach`).
    attachment: OnceLock<Attachment>,
    /// Dropped with the property, unless it was taken out (`Trust::withdraw`).
    value: UnsafeCell<ManuallyDrop<T>>,
}

/// State the layer above keeps with a property ([`Trust::attach`]).
pub type Attachment = Arc<dyn std::any::Any + Send + Sync>;

impl<T> Drop for Property<T> {
    fn drop(&mut self) {
        // SAFETY: the property is being freed: nothing routes requests to it any more.
        unsafe { self.header.free_route() };
        if !self.header.withdrawn() {
            // SAFETY: the value is still here, and dropped once, now.
            unsafe { ManuallyDrop::drop(self.value.get_mut()) };
        }
    }
}

/// A handle to a value (the *property*) owned by a trustee. Closures applied through the trust
/// run on the trustee, one at a time, with `&mut` access to the property.
///
/// Cloning a trust is cheap and does not clone the property; the property is dropped, on its
/// trustee, after the last trust is dropped. Trusts are `Send` and `Sync` when `T: Send`:
/// the property itself never leaves its trustee's thread while the runtime runs.
///
/// ```
/// let rt = trust::Runtime::builder().workers(2).build().unwrap();
/// let ct = rt.entrust(17);
/// ct.apply(|c| *c += 1); // from a plain thread: waits for the answer
/// assert_eq!(ct.apply(|c| *c), 18);
/// ```
///
/// Closures must be `Send`, since they run on another thread:
///
/// ```compile_fail
/// let rt = trust::Runtime::builder().workers(1).build().unwrap();
/// let ct = rt.entrust(0);
/// let rc = std::rc::Rc::new(1);
/// ct.apply(move |c| *c += *rc);
/// ```
pub struct Trust<T: Send + 'static> {
    property: NonNull<Property<T>>,
    /// Kept alive by the property's `Arc`, which lives at least as long as this trust.
    registry: NonNull<Registry>,
    _owns: PhantomData<T>,
}

// SAFETY: a trust only hands `&mut T` to closures that run on the trustee, one at a time, so
// sharing or sending the handle never shares the property; `T: Send` lets the property be
// created on one thread and used and dropped on the trustee's.
unsafe impl<T: Send + 'static> Send for Trust<T> {}
// SAFETY: as above; all `&self` methods are safe to call concurrently.
unsafe impl<T: Send + 'static> Sync for Trust<T> {}

impl<T: Send + 'static> fmt::Debug for Trust<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Trust")
            .field("trustee", &self.trustee())
            .field("property", &self.property)
            .finish()
    }
}

/// A reference to one trustee, used to place properties on it explicitly.
///
/// ```
/// let rt = trust::Runtime::builder().workers(2).build().unwrap();
/// let t = rt.trustee(1);
/// let counter = t.entrust(0u32);
/// assert_eq!(counter.trustee(), 1);
/// ```
#[derive(Clone)]
pub struct TrusteeRef {
    pub(crate) registry: Arc<Registry>,
    pub(crate) worker: usize,
}

impl fmt::Debug for TrusteeRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrusteeRef")
            .field("worker", &self.worker)
            .finish()
    }
}

impl TrusteeRef {
    /// Gives `value` to this trustee and returns the first trust to it.
    pub fn entrust<T: Send + 'static>(&self, value: T) -> Trust<T> {
        Trust::new(self.registry.clone(), self.worker, value)
    }

    /// The worker this trustee runs on.
    pub fn worker(&self) -> usize {
        self.worker
    }
}

/// The trustee of the worker running the caller.
///
/// ```
/// let rt = trust::Runtime::builder().workers(1).build().unwrap();
/// rt.block_on(|| {
///     let ct = trust::local_trustee().entrust(17);
///     ct.apply(|c| *c += 1);
///     assert_eq!(ct.apply(|c| *c), 18);
/// });
/// ```
///
/// # Panics
/// Outside a runtime worker, or on a worker that is not a trustee (in dedicated mode).
#[track_caller]
pub fn local_trustee() -> TrusteeRef {
    let w = worker::current().expect("local_trustee called outside a runtime worker");
    assert!(
        w.registry.trustees.contains(&w.index),
        "worker {} is not a trustee (the runtime has dedicated trustees); use trust::entrust or Handle::trustee",
        w.index
    );
    TrusteeRef {
        registry: w.registry.clone(),
        worker: w.index,
    }
}

/// Entrusts `value` to a trustee of the current runtime's pool, chosen round-robin.
///
/// # Panics
/// Outside a runtime worker (use [`Handle::entrust`](crate::Handle::entrust)).
#[track_caller]
pub fn entrust<T: Send + 'static>(value: T) -> Trust<T> {
    let w = worker::current()
        .expect("trust::entrust called outside a runtime worker; use Handle::entrust");
    Trust::new(w.registry.clone(), w.registry.next_trustee(), value)
}

impl<T: Send + 'static> Trust<T> {
    pub(crate) fn new(registry: Arc<Registry>, trustee: usize, value: T) -> Self {
        let registry_ptr = NonNull::from(&*registry);
        registry.counters[trustee].entrusted();
        let property = Box::new(Property {
            header: Header::new(std::any::type_name::<T>, trustee),
            refs: AtomicUsize::new(1),
            registry,
            attachment: OnceLock::new(),
            value: UnsafeCell::new(ManuallyDrop::new(value)),
        });
        Trust {
            property: NonNull::from(Box::leak(property)),
            registry: registry_ptr,
            _owns: PhantomData,
        }
    }

    pub(crate) fn registry(&self) -> &Registry {
        // SAFETY: the property holds an `Arc<Registry>` and outlives `self`.
        unsafe { self.registry.as_ref() }
    }

    /// One more trust to the property at `property` (a request's).
    ///
    /// # Safety
    /// `property` is a live `Property<T>` (a request for it is running, so it is not freed).
    pub(crate) unsafe fn from_property(property: *const ()) -> Self {
        let property = property.cast_mut().cast::<Property<T>>();
        // SAFETY: per the caller; counted up from a live trust, as `clone` does.
        unsafe {
            if (*property).refs.fetch_add(1, Ordering::Relaxed) > isize::MAX as usize {
                std::process::abort();
            }
            Trust {
                property: NonNull::new_unchecked(property),
                registry: NonNull::from(&*(*property).registry),
                _owns: PhantomData,
            }
        }
    }

    /// The property's address, as a request record holds it.
    pub(crate) fn property_ptr(&self) -> *const () {
        self.property.as_ptr().cast()
    }

    pub(crate) fn registry_arc(&self) -> &Arc<Registry> {
        // SAFETY: the property lives while `self` does; `registry` is never written after creation.
        unsafe { &self.property.as_ref().registry }
    }

    /// Names the property while it lives, as [`Stats::hottest`](crate::Stats::hottest)
    /// does (a property made after this one is freed may get the same id).
    ///
    /// ```
    /// let rt = trust::Runtime::builder().workers(1).build().unwrap();
    /// let a = rt.entrust(1u8);
    /// assert_eq!(a.id(), a.clone().id());
    /// assert_ne!(a.id(), rt.entrust(1u8).id());
    /// ```
    pub fn id(&self) -> usize {
        self.property.as_ptr() as usize
    }

    /// The worker whose trustee owns the property now (it changes when the property moves:
    /// see [`Trust::migrate_to`]).
    pub fn trustee(&self) -> usize {
        self.header().home()
    }

    /// Moves the property to the trustee of worker `to`, and returns once it lives there:
    /// requests made after the call run on `to`. The value stays where it is in memory;
    /// only its owner changes.
    ///
    /// Nothing is lost, run twice or reordered: requests already on their way to the old
    /// trustee, and requests made through trusts that have not heard of the move, are sent
    /// on to the new one (each in one more hop), and the requests of one worker (or thread)
    /// to this property still run in the order they were made. A worker that sent some there
    /// sends its next ones straight to `to` once they have all come back: a fiber of it that
    /// makes a request meanwhile waits for them (once per move, about one batch's round trip);
    /// code that may not wait sends its request the long way too. Requests to
    /// *other* properties of the old trustee are not held back by that: while a move is on,
    /// a forwarded request may run after later requests to properties that stayed.
    ///
    /// A property is pinned to its trustee while a fiber started by [`Trust::launch`] works
    /// on it, or a deferred request on it waits for its [`Reply`](crate::Reply): moving it
    /// then fails with [`MigrateError::Pinned`](crate::MigrateError::Pinned), and nothing
    /// changes.
    ///
    /// ```
    /// let rt = trust::Runtime::builder().workers(2).build().unwrap();
    /// let counter = rt.trustee(0).entrust(0u64);
    /// counter.apply(|n| *n += 1);
    /// counter.migrate_to(1).unwrap();
    /// assert_eq!(counter.trustee(), 1);
    /// assert_eq!(counter.apply(|n| { *n += 1; *n }), 2);
    /// assert!(counter.migrate_to(7).is_err(), "no worker 7");
    /// ```
    ///
    /// # Panics
    /// In delegated context (inside a delegated closure or an `apply_then` callback), where
    /// waiting would stall the trustee; if the runtime shuts down first.
    #[track_caller]
    pub fn migrate_to(&self, to: usize) -> Result<(), MigrateError> {
        if worker::current().is_some_and(|w| w.running() != Running::Fiber) {
            panic!("{BLOCKING_IN_DELEGATED}");
        }
        let registry = self.registry();
        if !registry.trustees.contains(&to) {
            return Err(MigrateError::NotATrustee {
                worker: to,
                trustees: registry.trustees.clone(),
            });
        }
        let cell = Oneshot::new();
        let promise = Promise::new(cell.clone());
        on_home(self.clone(), move |w, trust| {
            let moved = trust.header().move_to(w.index, to, w.registry.workers);
            if moved.is_ok() && to != w.index {
                w.gave_away(trust.property_ptr(), to);
            }
            promise.answer(Ok(moved));
        });
        fiber::wait(std::future::poll_fn(|cx| cell.poll_result(cx)))
    }

    /// Takes the value out of the runtime and returns it: requests this worker (or thread)
    /// made before the call have run, and so has every request that reached the trustee
    /// first; after it, no request runs on the property again. Handles stay valid as
    /// handles (they drop as usual, and [`Trust::id`] and [`Trust::trustee`] still
    /// answer), but a request made through any of them then panics, where it is made or,
    /// if it was already on its way, where its answer is taken ("withdrawn from its
    /// runtime"). The value is not dropped when the last handle goes: it is the caller's.
    ///
    /// The way out of a runtime for a value that is to live elsewhere: in another process
    /// (`gossamer`'s moves between ranks), or with a thread of its own.
    ///
    /// ```
    /// let rt = trust::Runtime::builder().workers(2).build().unwrap();
    /// let names = rt.trustee(1).entrust(vec![String::from("a")]);
    /// let also = names.clone();
    /// names.apply(|v| v.push(String::from("b")));
    /// assert_eq!(names.withdraw().unwrap(), ["a", "b"]);
    /// let call = std::panic::AssertUnwindSafe(|| also.apply(|v| v.len()));
    /// let refused = std::panic::catch_unwind(call);
    /// assert!(refused.is_err(), "no request runs on it any more");
    /// assert_eq!(names.withdraw(), Err(trust::MigrateError::Withdrawn));
    /// ```
    ///
    /// # Errors
    /// As [`Trust::migrate_to`]: a pinned or fixed property stays where it is, unchanged;
    /// [`MigrateError::Withdrawn`] if it was withdrawn already.
    ///
    /// # Panics
    /// In delegated context, where waiting would stall the trustee; if the runtime shuts
    /// down first.
    #[track_caller]
    pub fn withdraw(&self) -> Result<T, MigrateError> {
        if worker::current().is_some_and(|w| w.running() != Running::Fiber) {
            panic!("{BLOCKING_IN_DELEGATED}");
        }
        if self.header().withdrawn() {
            return Err(MigrateError::Withdrawn);
        }
        // This caller's earlier requests (`apply_then`s on its way) run first: a request
        // after them comes back after them. Refused only if another withdrawal won.
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.apply(|_| ()))) {
            if panic.downcast_ref::<&str>() == Some(&WITHDRAWN_MESSAGE) {
                return Err(MigrateError::Withdrawn);
            }
            resume_unwind(panic);
        }
        let cell = Oneshot::new();
        let promise = Promise::new(cell.clone());
        on_home(self.clone(), move |w, trust| {
            let taken = trust.header().withdraw(w.index).map(|()| {
                w.withdrew(trust.property_ptr());
                // SAFETY: this is the home's worker, in its loop, so no request runs on the
                // value; from the flag on none will (refused, see `home`), and the property's
                // drop leaves the value alone: it is read out once, here.
                unsafe { trust.value_ptr().read() }
            });
            promise.answer(Ok(taken));
        });
        fiber::wait(std::future::poll_fn(|cx| cell.poll_result(cx)))
    }

    /// Keeps `attachment` with the property until it is freed, for the layer above: `trust`
    /// itself does nothing with it. `gossamer` keeps there where a property that left its
    /// process lives now. Only the first stays: a later one comes back as the error.
    ///
    /// ```
    /// let rt = trust::Runtime::builder().workers(1).build().unwrap();
    /// let p = rt.entrust(0u8);
    /// p.clone().attach(std::sync::Arc::new("noted")).unwrap();
    /// let noted = p.attachment().unwrap().downcast_ref::<&str>();
    /// assert_eq!(noted, Some(&"noted"));
    /// assert!(p.attach(std::sync::Arc::new(1)).is_err(), "set once");
    /// ```
    pub fn attach(&self, attachment: Attachment) -> Result<(), Attachment> {
        // SAFETY: the property lives while `self` does.
        unsafe { self.property.as_ref() }.attachment.set(attachment)
    }

    /// The property's attachment ([`Trust::attach`]), if it has one: one load.
    #[inline(always)]
    pub fn attachment(&self) -> Option<&Attachment> {
        // SAFETY: the property lives while `self` does.
        unsafe { self.property.as_ref() }.attachment.get()
    }

    /// Fixes the property to its trustee for good: from then on [`Trust::migrate_to`] (and
    /// rebalancing) leaves it there, with [`MigrateError::Fixed`]. For a property whose state
    /// belongs with its worker, such as a durable property's, whose log is written there.
    ///
    /// ```
    /// let rt = trust::Runtime::builder().workers(2).build().unwrap();
    /// let p = rt.trustee(0).entrust(1u8);
    /// p.fix_home();
    /// assert_eq!(p.migrate_to(1), Err(trust::MigrateError::Fixed));
    /// ```
    pub fn fix_home(&self) {
        self.header().fix();
    }

    pub(crate) fn header(&self) -> &Header {
        // SAFETY: the property lives while `self` does.
        unsafe { &self.property.as_ref().header }
    }

    /// The trustee worker `w` (of this runtime) sends this trust's next request to (see
    /// `home`: the home, or while a moved property's earlier requests are still on their
    /// way, the trustee they went to).
    #[inline(always)]
    pub(crate) fn target(&self, w: &worker::Worker) -> usize {
        self.header().route(w.index, w)
    }

    /// Stages `f` on worker `w` for trustee `target` (this trust's `target(w)`), with
    /// completion `complete` taking `done`; returns the backlog (see `Worker::stage`).
    ///
    /// # Safety
    /// `w` is a worker of this trust's runtime; `complete` consumes an `F` closure, an `R`
    /// answer and a `D` payload at the layout of `request`.
    #[inline(always)]
    pub(crate) unsafe fn stage<F: FnOnce(&mut T) -> R, R, D>(
        &self,
        w: &worker::Worker,
        target: usize,
        f: F,
        complete: CompleteFn,
        done: D,
    ) -> usize {
        let run: RunFn = run_apply::<T, F, R>;
        // SAFETY: a trust's targets are workers of its runtime, which `w` belongs to (per the
        // caller); `run_apply` takes an `F` and writes an `R`; `complete` per the caller.
        unsafe {
            w.stage::<F, R, D>(
                target,
                run,
                self.property.as_ptr().cast(),
                complete,
                f,
                done,
            )
        }
    }

    /// Runs `f` on the property and returns its result; the caller waits. In a fiber only the
    /// fiber waits, and the worker runs others meanwhile; on a plain thread the thread spins,
    /// then parks. `f` may borrow from the caller's stack.
    ///
    /// A panic in `f` is re-raised here; the trustee carries on, and the property keeps
    /// whatever changes `f` made before it panicked.
    ///
    /// ```
    /// let rt = trust::Runtime::builder().workers(2).build().unwrap();
    /// let v = rt.entrust(Vec::new());
    /// let item = String::from("borrowed");
    /// v.apply(|v| v.push(item.clone()));
    /// assert_eq!(v.apply(|v| v.len()), 1);
    /// ```
    ///
    /// # Panics
    /// In delegated context (inside a delegated closure or an `apply_then` callback), where
    /// waiting would stall the trustee: use [`Trust::apply_then`] or [`Trust::launch`] there.
    #[track_caller]
    pub fn apply<R, F>(&self, f: F) -> R
    where
        F: FnOnce(&mut T) -> R + Send,
        R: Send,
    {
        match worker::current_on(self.registry()) {
            Some(w) => {
                if w.running() != Running::Fiber {
                    panic!("{BLOCKING_IN_DELEGATED}");
                }
                let target = self.target(w);
                if target == w.index && w.may_run_inline() {
                    // This worker is the home and is not serving a request right now (it runs
                    // a fiber), and nothing from it is queued before this call: run it here.
                    let _delegated = w.enter(Running::Delegated);
                    // SAFETY: on the trustee's worker, outside delegated context.
                    return f(unsafe { self.property_mut() });
                }
                let mut slot = WaitSlot::<R> {
                    result: None,
                    fiber: w.current_fiber(),
                };
                let slot_ptr: *mut WaitSlot<R> = &mut slot;
                // SAFETY: `w` is of this runtime; `complete_wait::<F, R>` takes an `F`, an `R`
                // and a `*mut WaitSlot<R>`.
                unsafe { self.stage(w, target, f, complete_wait::<F, R>, slot_ptr) };
                loop {
                    // SAFETY: the slot lives on this (suspended, then resumed) fiber's stack; the
                    // completion writes it before waking us, and nothing else touches it.
                    if let Some(result) = unsafe { (*slot_ptr).result.take() } {
                        return result.unwrap_or_else(|panic| resume_unwind(panic));
                    }
                    w.block();
                }
            }
            None => {
                if worker::current().is_some_and(|w| w.running() != Running::Fiber) {
                    panic!("{BLOCKING_IN_DELEGATED}");
                }
                external::apply::<F, R>(
                    self.registry_arc(),
                    self.trustee(),
                    run_apply::<T, F, R>,
                    self.property.as_ptr().cast(),
                    f,
                )
            }
        }
    }

    /// Runs `f` on the property without waiting; `then` runs with its result later, on the
    /// caller's worker. Allowed anywhere, including in delegated context.
    ///
    /// Order: the requests one worker makes to one trustee run in the order they were made,
    /// and their `then`s run in that order too — also when the trustee belongs to another
    /// runtime. Requests to different trustees are not ordered with each other. While a
    /// property moves ([`Trust::migrate_to`]), its requests keep their order, but one that is
    /// sent on to the new trustee may run after later requests to the old trustee's other
    /// properties.
    ///
    /// Backpressure, by default: each worker may have at most 8 full batches of requests
    /// (32 KiB: a few hundred small requests) waiting for one trustee, besides the batch in
    /// flight and the one filling. A fiber that stages past that waits — it blocks, and its
    /// worker runs other fibers, serves and sleeps — until the trustee takes the next batch, so
    /// a loop of `apply_then` with no window runs at the speed of a windowed one and holds a
    /// bounded amount of memory (towards a trustee of another runtime, the bound is 1,024
    /// awaited answers). For a narrower window, use
    /// [`Group::wait_until_pending_at_most`](crate::Group::wait_until_pending_at_most). In
    /// delegated context and in `then` callbacks, where nothing may wait, the backlog is not
    /// limited.
    ///
    /// A panic in `f` or in `then` goes to the panic handler of the caller's runtime
    /// (see [`Builder::panic_handler`](crate::Builder::panic_handler)).
    /// From a worker of another runtime the call does not block either: that worker runs
    /// `then` when the answer arrives, as above.
    ///
    /// ```
    /// use std::{cell::Cell, rc::Rc};
    /// let rt = trust::Runtime::builder().workers(2).build().unwrap();
    /// let ct = rt.entrust(17);
    /// rt.block_on(|| {
    ///     let seen = Rc::new(Cell::new(0));
    ///     let s = seen.clone();
    ///     let group = trust::Group::new(); // to wait for the callback
    ///     ct.apply_then(|c| { *c += 1; *c }, group.track(move |v| s.set(v)));
    ///     group.wait();
    ///     assert_eq!(seen.get(), 18);
    /// });
    /// ```
    ///
    /// # Panics
    /// Outside every runtime's workers — on a plain thread, or in a task of another executor
    /// such as tokio — where no worker would run `then` later (and `then`, which need not be
    /// `Send`, cannot run anywhere else): use [`Trust::apply`] to wait for the result there, or
    /// [`Trust::apply_async`] to await it.
    ///
    /// ```should_panic
    /// let rt = trust::Runtime::builder().workers(1).build().unwrap();
    /// let ct = rt.entrust(17);
    /// ct.apply_then(|c| *c + 1, |v| println!("{v}")); // a plain thread: panics
    /// ```
    #[inline]
    #[track_caller]
    pub fn apply_then<R, F, Then>(&self, f: F, then: Then)
    where
        F: FnOnce(&mut T) -> R + Send + 'static,
        R: Send + 'static,
        Then: FnOnce(R) + 'static,
    {
        match worker::current_on(self.registry()) {
            // The common case, kept small enough to inline: a worker of this runtime staging
            // for another worker's trustee.
            Some(w) => match self.target(w) {
                target if target != w.index => self.stage_then(w, target, f, then),
                _ => self.apply_then_own_trustee(w, f, then),
            },
            None => match worker::current() {
                Some(w) => self.apply_then_foreign(w, f, then),
                None => panic!("{APPLY_THEN_OUTSIDE_WORKERS}"),
            },
        }
    }

    /// Stages an `apply_then` request on `w`, which is the current worker of this trust's
    /// runtime (both callers found it with `worker::current_on`).
    #[inline]
    fn stage_then<R, F, Then>(&self, w: &worker::Worker, target: usize, f: F, then: Then)
    where
        F: FnOnce(&mut T) -> R + Send + 'static,
        R: Send + 'static,
        Then: FnOnce(R) + 'static,
    {
        // SAFETY: `w` is of this runtime (see above); `complete_then::<F, R, Then>`
        // takes an `F`, an `R` and a `Then`.
        let backlog = unsafe { self.stage(w, target, f, complete_then::<F, R, Then>, then) };
        // Backpressure: a fiber that outpaces its trustee waits (letting the worker publish
        // and take answers) instead of staging without bound.
        if backlog >= MAX_BACKLOG {
            w.wait_for_backlog(target);
        }
    }

    /// `apply_then` on a worker that is the property's own trustee.
    fn apply_then_own_trustee<R, F, Then>(&self, w: &worker::Worker, f: F, then: Then)
    where
        F: FnOnce(&mut T) -> R + Send + 'static,
        R: Send + 'static,
        Then: FnOnce(R) + 'static,
    {
        if w.running() == Running::Delegated || !w.may_run_inline() {
            return self.stage_then(w, w.index, f, then);
        }
        // No closure runs on this trustee now (we are not in delegated context), and nothing
        // from this worker is queued there: run `f` now and only defer `then`, exactly as if
        // the answer had come back at once.
        let result = {
            let _delegated = w.enter(Running::Delegated);
            // SAFETY: on the trustee's worker, outside delegated context.
            let value = unsafe { self.property_mut() };
            catch_unwind(AssertUnwindSafe(|| f(value)))
        };
        match result {
            Ok(r) => w.defer_callback(move || then(r)),
            Err(panic) => w.registry.unhandled_panic(panic),
        }
    }

    /// Runs `f` on the property at once, in the caller, if the caller is a fiber on the
    /// property's own trustee worker and nothing this worker sent that trustee earlier still
    /// waits (so `f` overtakes none of its own requests); gives `f` back otherwise. Where it
    /// runs, `f` runs in delegated context, as a closure on the trustee does.
    ///
    /// For code that already runs on the trustee and has a fallback, such as a server fiber
    /// answering a request it read: `apply_then` on the own trustee also often runs inline,
    /// but defers its callback to the worker's next round, while this returns the result here.
    /// A panic in `f` propagates to the caller.
    ///
    /// ```
    /// let rt = trust::Runtime::builder().workers(2).build().unwrap();
    /// let counter = rt.trustee(1).entrust(0u64);
    /// let c = counter.clone();
    /// let here = rt.spawn_on(1, move || c.try_apply_inline(|n| { *n += 1; *n }).ok()).join();
    /// assert_eq!(here, Some(1));
    /// let c = counter.clone();
    /// let elsewhere = rt.spawn_on(0, move || c.try_apply_inline(|n| *n).is_err()).join();
    /// assert!(elsewhere, "worker 0 is not the trustee");
    /// ```
    pub fn try_apply_inline<R, F>(&self, f: F) -> Result<R, F>
    where
        F: FnOnce(&mut T) -> R,
    {
        let Some(w) = worker::current_on(self.registry()) else {
            return Err(f);
        };
        if w.running() != Running::Fiber
            || !w.nothing_queued_for_self()
            || self.target(w) != w.index
        {
            return Err(f);
        }
        let _delegated = w.enter(Running::Delegated);
        w.ran_inline();
        // SAFETY: on the trustee's worker, outside delegated context (a fiber runs).
        Ok(f(unsafe { self.property_mut() }))
    }

    /// `apply_then` from a worker of another runtime, which has no channel to this trustee:
    /// the request goes through the trustee worker's injector, and the calling worker queues
    /// its answer behind the earlier ones it awaits from this trustee (`worker/lane`). So
    /// neither a fiber nor delegated code blocks there, and `then` runs on the calling worker,
    /// in request order.
    #[cold]
    fn apply_then_foreign<R, F, Then>(&self, w: &worker::Worker, f: F, then: Then)
    where
        F: FnOnce(&mut T) -> R + Send + 'static,
        R: Send + 'static,
        Then: FnOnce(R) + 'static,
    {
        let call = AsyncApply::new(self.clone(), f);
        let _ = call.clone().send();
        let registry = w.registry.clone();
        let mut then = Some(then);
        let answer: PendingAnswer = Box::new(move |cx| {
            let Poll::Ready(answer) = call.cell().poll_take(cx) else {
                return Poll::Pending;
            };
            let then = then.take().expect("an answer is delivered once");
            let delivered = answer.and_then(|r| catch_unwind(AssertUnwindSafe(|| then(r))));
            if let Err(panic) = delivered {
                registry.unhandled_panic(panic);
            }
            Poll::Ready(())
        });
        // Requests from other runtimes go to the property's first trustee (see `home`).
        let origin = self.header().origin;
        w.await_foreign(self.registry_arc(), origin, answer);
        w.wait_for_foreign_room(self.registry_arc(), origin);
    }

    /// Like [`Trust::apply`], with an explicit argument passed to the closure. Within one
    /// process the argument simply moves; across the machines of a rack it is what gets
    /// serialized, while the closure itself must capture nothing.
    ///
    /// ```
    /// let rt = trust::Runtime::builder().workers(1).build().unwrap();
    /// let table = rt.entrust(std::collections::HashMap::new());
    /// table.apply_with(|t, (k, v)| { t.insert(k, v); }, (String::from("key"), vec![1u8, 2]));
    /// assert_eq!(table.apply(|t| t.len()), 1);
    /// ```
    #[track_caller]
    pub fn apply_with<V, R, F>(&self, f: F, argument: V) -> R
    where
        F: FnOnce(&mut T, V) -> R + Send,
        V: Send,
        R: Send,
    {
        self.apply(move |t| f(t, argument))
    }

    /// Runs `f` on the property and returns a future of its result, for use from any executor
    /// or thread. The request is sent when the future is first polled; dropping the future
    /// after that does not cancel it (hence the `'static` closure). A panic in `f` is re-raised
    /// where the future is polled.
    ///
    /// ```
    /// let rt = trust::Runtime::builder().workers(1).build().unwrap();
    /// let ct = rt.entrust(1);
    /// let fut = ct.apply_async(|c| { *c *= 5; *c });
    /// let h = rt.spawn(move || trust::block_on(fut));
    /// assert_eq!(h.join(), 5);
    /// ```
    pub fn apply_async<R, F>(&self, f: F) -> ApplyFuture<R>
    where
        F: FnOnce(&mut T) -> R + Send + 'static,
        R: Send + 'static,
    {
        ApplyFuture::new(self.registry(), AsyncApply::new(self.clone(), f))
    }

    /// The property, for a closure run inline on its trustee's own thread.
    ///
    /// # Safety
    /// The caller runs on the trustee's worker outside delegated context — so no other closure
    /// on any property of this trustee is running (requests never suspend) — and uses the
    /// reference for one closure only.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn property_mut(&self) -> &mut T {
        // SAFETY: per the caller; the property lives while `self` does.
        unsafe { &mut *self.value_ptr() }
    }

    /// The property's address, derived from the allocation (not from a `&mut`), so that it
    /// stays valid across other requests on the property.
    fn value_ptr(&self) -> *mut T {
        // SAFETY: the property lives while `self` does.
        unsafe { self.property.as_ref().value.get().cast::<T>() }
    }
}

impl<T: Send + 'static> Clone for Trust<T> {
    /// Counts one more trust; works anywhere, including in delegated context.
    fn clone(&self) -> Self {
        // SAFETY: the property lives while `self` does.
        let refs = unsafe { &self.property.as_ref().refs };
        // Relaxed suffices to count up from a live trust (the same reasoning as `Arc`).
        if refs.fetch_add(1, Ordering::Relaxed) > isize::MAX as usize {
            std::process::abort();
        }
        Trust {
            property: self.property,
            registry: self.registry,
            _owns: PhantomData,
        }
    }
}

impl<T: Send + 'static> Drop for Trust<T> {
    fn drop(&mut self) {
        // SAFETY: the property lives while `self` does.
        let refs = unsafe { &self.property.as_ref().refs };
        if refs.fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        // Synchronize with every earlier drop, so their requests' staging is visible too.
        fence(Ordering::Acquire);
        let dead = DeadProperty {
            ptr: self.property.as_ptr().cast(),
            free: free_property::<T>,
        };
        let registry = self.registry_arc();
        if registry.closed.load(Ordering::Acquire) {
            // SAFETY: the runtime no longer runs requests, and this was the last trust.
            unsafe { dead.free() };
            return;
        }
        if self.header().withdrawn() {
            // No request may be routed to it any more (`home`), the free neither.
            registry.inject(self.trustee(), Injected::Free(dead));
            return;
        }
        match worker::current_on(registry) {
            Some(w) => {
                let run: RunFn = run_free::<T>;
                let complete: CompleteFn = complete_free::<T>;
                // SAFETY: `w` is of this runtime, as the target is; `run_free` and
                // `complete_free` take a `()` closure, answer and payload.
                unsafe { w.stage::<(), (), ()>(self.target(w), run, dead.ptr, complete, (), ()) };
            }
            // Nobody holds a trust: the property no longer moves.
            None => registry.inject(self.trustee(), Injected::Free(dead)),
        }
    }
}

impl<T: Send + 'static> Trust<Latch<T>> {
    /// Runs `f` in a fresh fiber on the trustee, holding the property's latch, and returns its
    /// result. Unlike `apply`, `f` may block — call `apply` on other trusts, join fibers — while
    /// other requests to the trustee go on; the latch keeps other `launch`es on this property
    /// out until `f` returns. It costs a fiber start and a second message.
    ///
    /// ```
    /// use trust::Latch;
    /// let rt = trust::Runtime::builder().workers(2).build().unwrap();
    /// let other = rt.trustee(0).entrust(10);
    /// let latched = rt.trustee(1).entrust(Latch::new(1));
    /// let sum = latched.launch(move |v| { *v += other.apply(|o| *o); *v }); // nested apply
    /// assert_eq!(sum, 11);
    /// ```
    ///
    /// # Panics
    /// In delegated context (use [`Trust::launch_then`] there). Re-raises a panic of `f`.
    #[track_caller]
    pub fn launch<R, F>(&self, f: F) -> R
    where
        F: FnOnce(&mut T) -> R + Send + 'static,
        R: Send + 'static,
    {
        if worker::current().is_some_and(|w| w.running() != Running::Fiber) {
            panic!("{BLOCKING_IN_DELEGATED}");
        }
        let cell = Oneshot::new();
        self.start_launch(f, cell.clone());
        fiber::wait(std::future::poll_fn(|cx| cell.poll_result(cx)))
    }

    /// Like [`Trust::launch`] without waiting: `then` runs with the result on the caller's
    /// worker (in a fiber of its own). Allowed in delegated context. Panics go to the runtime's
    /// panic handler.
    ///
    /// # Panics
    /// Outside every runtime's workers (a plain thread, another executor's task), as
    /// [`Trust::apply_then`] does: use [`Trust::launch`] to wait for the result there.
    #[track_caller]
    pub fn launch_then<R, F, Then>(&self, f: F, then: Then)
    where
        F: FnOnce(&mut T) -> R + Send + 'static,
        R: Send + 'static,
        Then: FnOnce(R) + 'static,
    {
        match worker::current_on(self.registry()) {
            Some(w) => {
                let cell = Oneshot::new();
                self.start_launch(f, cell.clone());
                then_in_fiber(w, cell, then);
            }
            None if worker::current().is_none() => panic!(
                "launch_then called outside a runtime worker (on a plain thread or in another \
                 executor's task), where nothing would run its callback: use launch to wait for \
                 the result"
            ),
            // A worker of another runtime: its fiber waits (delegated code may not).
            None => then(self.launch(f)),
        }
    }

    fn start_launch<R, F>(&self, f: F, cell: Arc<Oneshot<R>>)
    where
        F: FnOnce(&mut T) -> R + Send + 'static,
        R: Send + 'static,
    {
        let trust = self.clone();
        // Answered by the fiber; or, should shutdown drop the request or unwind the fiber
        // first, with the shut-down error.
        let promise = Promise::new(cell);
        // The request only starts the fiber; the fiber reaches the latch through `trust`, and
        // pins the property to this trustee until it ends (it holds the value across waits).
        let start = move |_: &mut Latch<T>| {
            let w = worker::current().expect("delegated closure outside a worker");
            trust.header().pin();
            w.spawn_local(Box::new(move || {
                let pinned = Pinned(&trust);
                let latch = trust.value_ptr().cast_const();
                // SAFETY: `trust` keeps the latch alive for this whole fiber; we only form
                // short-lived shared references to it, never across a suspension point.
                let result = unsafe {
                    Latch::acquire_raw(latch);
                    let value = Latch::value_raw(latch);
                    let result = fiber::catch_user(|| f(&mut *value));
                    Latch::release_raw(latch);
                    result
                };
                promise.answer(result);
                drop(pinned);
                drop(trust);
            }));
        };
        if worker::current().is_some() {
            self.apply_then(start, |()| {});
        } else {
            // A plain thread has no worker to run a callback: it waits for the start.
            self.apply(start);
        }
    }
}

/// Runs `step` on the worker of `trust`'s home, in its loop — never in the middle of a batch,
/// so a batch it serves runs on one owner throughout — or, should the property have moved on
/// meanwhile, hands it on again: how a move and a withdrawal are made. (A withdrawn property's
/// home stays the worker it was withdrawn on, where a step then finds it withdrawn.)
fn on_home<T: Send + 'static>(
    trust: Trust<T>,
    step: impl FnOnce(&worker::Worker, Trust<T>) + Send + 'static,
) {
    let registry = trust.registry_arc().clone();
    let home = trust.trustee();
    registry.inject(
        home,
        Injected::Run(Box::new(move || {
            let w = worker::current().expect("injected work outside a worker");
            if trust.header().home() != w.index {
                return on_home(trust, step);
            }
            step(w, trust)
        })),
    );
}

/// A launched fiber's hold on its property's home (see `home`), released when the fiber ends
/// or unwinds, on the same worker.
struct Pinned<'a, T: Send + 'static>(&'a Trust<T>);

impl<T: Send + 'static> Drop for Pinned<'_, T> {
    fn drop(&mut self) {
        self.0.header().unpin();
    }
}

/// Starts a fiber on `w` that waits for `cell` and runs `then` with its value; a panic (of
/// the request, re-raised by the cell, or of `then`) goes to `w`'s runtime's handler.
pub(crate) fn then_in_fiber<R: 'static, Then: FnOnce(R) + 'static>(
    w: &worker::Worker,
    cell: Arc<Oneshot<R>>,
    then: Then,
) {
    let registry = w.registry.clone();
    w.spawn_local(Box::new(move || {
        let delivered = fiber::catch_user(|| {
            then(fiber::wait(std::future::poll_fn(|cx| cell.poll_result(cx))))
        });
        if let Err(panic) = delivered {
            registry.unhandled_panic(panic);
        }
    }));
}

pub(crate) fn shut_down_panic() -> Panic {
    Box::new("the runtime shut down before the request ran")
}

// ----- trampolines (the record layout they read is in `request`) -----

/// Runs an `apply`-style request: takes the closure out of the record, runs it on the property
/// and writes its answer in the closure's place, or leaves its panic in the record.
unsafe fn run_apply<T, F: FnOnce(&mut T) -> R, R>(record: *mut u64) {
    // SAFETY: the record was staged with an `F` closure and an `R` answer (see `Trust::stage`);
    // we run on the property's trustee, which runs one request at a time, and the property is
    // alive because its free waits for every staged request (see `Worker::free_later`).
    unsafe {
        let f = record::take::<F>(record.add(request::CLOSURE_AT));
        let value = &mut *property_value::<T>(request::property(record));
        match catch_unwind(AssertUnwindSafe(|| f(value))) {
            Ok(r) => record::store(record.add(request::CLOSURE_AT), r),
            Err(panic) => request::panicked(record, panic),
        }
    }
}

/// The value of the property at `property` (a record's property address).
///
/// # Safety
/// `property` is a live `Property<T>`.
pub(crate) unsafe fn property_value<T>(property: *const ()) -> *mut T {
    // SAFETY: per the caller.
    unsafe { (*property.cast::<Property<T>>()).value.get().cast::<T>() }
}

/// Runs the free request of a property whose last trust is gone (see `free`).
unsafe fn run_free<T>(record: *mut u64) {
    // SAFETY: the record was staged by `Trust::drop` with the property's address.
    let property = unsafe { request::property(record) };
    let w = worker::current().expect("a request outside a worker");
    w.free_later(DeadProperty {
        ptr: property,
        free: free_property::<T>,
    });
}

/// Completes a free request; if it never ran (the runtime stopped), frees the property now.
unsafe fn complete_free<T>(record: *mut u64, _run: bool) {
    // SAFETY: staged by `Trust::drop` with a `()` closure, answer and payload.
    if unsafe { request::take_answer::<(), ()>(record) }.is_none() {
        // SAFETY: the runtime no longer runs requests, and nobody holds a trust any more.
        unsafe { free_property::<T>(request::property(record)) };
    }
}

unsafe fn free_property<T>(property: *const ()) {
    // SAFETY: the property was allocated by `Trust::new` as a `Box<Property<T>>`, and the
    // caller guarantees nothing uses it any more.
    drop(unsafe { Box::from_raw(property.cast_mut().cast::<Property<T>>()) });
}

struct WaitSlot<R> {
    result: Option<Result<R, Panic>>,
    fiber: FiberId,
}

unsafe fn complete_wait<F, R>(record: *mut u64, run: bool) {
    // SAFETY: staged with an `F`, an `R` and a `*mut WaitSlot<R>` payload by `Trust::apply`.
    let (slot, answer) = unsafe {
        (
            request::take_done::<F, R, *mut WaitSlot<R>>(record),
            request::take_answer::<F, R>(record),
        )
    };
    if let (true, Some(answer)) = (run, answer) {
        // SAFETY: the waiting fiber is suspended in `apply` and its stack holds the slot.
        unsafe { (*slot).result = Some(answer) };
        let w = worker::current().expect("completion outside a worker");
        // SAFETY: as above.
        w.wake(unsafe { (*slot).fiber });
    }
}

unsafe fn complete_then<F, R, Then: FnOnce(R)>(record: *mut u64, run: bool) {
    // SAFETY: staged with an `F`, an `R` and a `Then` payload by `Trust::apply_then`.
    let (then, answer) = unsafe {
        (
            request::take_done::<F, R, Then>(record),
            request::take_answer::<F, R>(record),
        )
    };
    if !run {
        return;
    }
    let outcome = match answer {
        Some(Ok(r)) => catch_unwind(AssertUnwindSafe(|| then(r))),
        Some(Err(panic)) => Err(panic),
        None => Ok(()),
    };
    if let Err(panic) = outcome {
        unhandled(panic);
    }
}

/// Hands a panic nobody waits for to the runtime's handler (on the worker running the caller).
#[cold]
pub(crate) fn unhandled(panic: Panic) {
    let w = worker::current().expect("completion outside a worker");
    w.registry.unhandled_panic(panic);
}

// ----- requests answered into a cell: `apply_async`, and `apply_then` across runtimes -----
//
// An `AsyncApply` is one `Arc` holding the trust, the closure until it runs, and the answer
// cell. The future polls that `Arc`, and the same `Arc` is what the trustee's injector carries
// when the request comes from outside the runtime, so sending allocates nothing more. The
// trustee drops its reference as soon as it has answered, so the caller's thread, which
// allocated the request, usually frees it too: memory freed on another thread than the one
// that allocated it sends glibc's allocator down its slow paths on both.
//
// Measured with callgrind (instructions per call, `valgrind --tool=callgrind
// --separate-threads=yes` on `cargo run --release -p trust --example cross_thread -- 1
// "joined, current_thread: apply_async"`): the previous shape — a shared cell, a boxed
// submission and a boxed injected closure, two of them freed by the trustee — cost the
// executor's thread 1,367 instructions per call, 480 of them in `malloc` and `free`, and the
// trustee 523; this one 1,067 and 364. The same example, old and new binaries alternating on
// the 2-vCPU machine: joined on a current-thread runtime 295–298 → 242–243 ns per call, on a
// 2-worker one 323–324 → 245–301 ns.
//
// A request that ran answers its cell even when shutdown drops the deferred delivery unrun
// (`Deliver`), and one still in an injector at shutdown is cancelled (`Submission`): a future
// never waits for a request that is gone.

/// "Apply `f` to the property of `trust`", answered into `cell`.
pub(crate) struct AsyncApply<T: Send + 'static, F, R> {
    trust: Trust<T>,
    /// Taken by whoever runs the request, or cancels it.
    f: Mutex<Option<F>>,
    cell: Oneshot<R>,
}

impl<T, F, R> AsyncApply<T, F, R>
where
    T: Send + 'static,
    F: FnOnce(&mut T) -> R + Send + 'static,
    R: Send + 'static,
{
    pub(crate) fn new(trust: Trust<T>, f: F) -> Arc<Self> {
        Arc::new(AsyncApply {
            trust,
            f: Mutex::new(Some(f)),
            cell: Oneshot::unset(),
        })
    }

    fn take(&self) -> Option<F> {
        self.f.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl<T, F, R> Call<R> for AsyncApply<T, F, R>
where
    T: Send + 'static,
    F: FnOnce(&mut T) -> R + Send + 'static,
    R: Send + 'static,
{
    fn cell(&self) -> &Oneshot<R> {
        &self.cell
    }

    fn send(self: Arc<Self>) -> bool {
        let registry = self.trust.registry_arc();
        match worker::current_on(registry) {
            Some(w) => {
                let f = self.take().expect("a request is sent once");
                // SAFETY: `w` is of this runtime; `complete_async::<T, F, R>` takes an `F`, an
                // `R` and an `Arc<AsyncApply<T, F, R>>`.
                unsafe {
                    let target = self.trust.target(w);
                    self.trust
                        .stage(w, target, f, complete_async::<T, F, R>, self.clone())
                };
                false
            }
            None if registry.closed.load(Ordering::Acquire) => {
                self.cancel();
                false
            }
            None => {
                // To the property's first trustee, whose worker runs it at once or, if the
                // property has moved, sends it on in order (see `home`).
                let trustee = self.trust.header().origin;
                let awake = registry.parkers[trustee].is_awake();
                // `self` holds the trust, which keeps the registry alive until `inject` returns.
                let submission = Submission::new(self.clone());
                registry.inject(trustee, Injected::Call(submission));
                awake
            }
        }
    }
}

impl<T, F, R> Submitted for AsyncApply<T, F, R>
where
    T: Send + 'static,
    F: FnOnce(&mut T) -> R + Send + 'static,
    R: Send + 'static,
{
    fn run(self: Arc<Self>) {
        let w = worker::current().expect("a submission runs on its trustee's worker");
        debug_assert!(w.index == self.trust.header().origin && w.running() == Running::Scheduler);
        if self.trust.header().withdrawn() {
            // Refused here, as a trustee refuses the records of a withdrawn property.
            drop(self.take());
            self.cell.complete(Err(Box::new(WITHDRAWN_MESSAGE)));
            return;
        }
        if self.trust.header().moved() {
            // Sent on from here like this worker's own requests, so that the requests that
            // came this way stay in order (see `home`).
            let f = self.take().expect("a submission runs once");
            // SAFETY: `w` is of this runtime; `complete_async::<T, F, R>` takes an `F`, an
            // `R` and an `Arc<AsyncApply<T, F, R>>`.
            unsafe {
                let target = self.trust.target(w);
                self.trust
                    .stage(w, target, f, complete_async::<T, F, R>, self.clone())
            };
            return;
        }
        let f = self.take().expect("a submission runs once");
        w.ran_inline();
        let result = {
            let _delegated = w.enter(Running::Delegated);
            // SAFETY: on the trustee's worker, in its loop: no closure runs on its properties.
            let value = unsafe { self.trust.property_mut() };
            catch_unwind(AssertUnwindSafe(|| f(value)))
        };
        // Completed after the rest of the injected work has run too: the waiting executor is
        // woken once for all of them, and finds them all answered.
        let answer = Deliver {
            call: self,
            result: Some(result),
        };
        w.defer_callback(move || drop(answer));
    }

    fn cancel(&self) {
        if self.take().is_some() {
            self.cell.complete(Err(shut_down_panic()));
        }
    }
}

/// An answer on its way to its cell, delivered when dropped: a deferred callback that
/// shutdown drops unrun still answers its future.
struct Deliver<T: Send + 'static, F, R> {
    call: Arc<AsyncApply<T, F, R>>,
    result: Option<Result<R, Panic>>,
}

impl<T: Send + 'static, F, R> Drop for Deliver<T, F, R> {
    fn drop(&mut self) {
        if let Some(result) = self.result.take() {
            self.call.cell.complete(result);
        }
    }
}

/// Completes a staged [`AsyncApply`] (the record layout is in `request`).
unsafe fn complete_async<T, F, R>(record: *mut u64, _run: bool)
where
    T: Send + 'static,
    F: FnOnce(&mut T) -> R + Send + 'static,
    R: Send + 'static,
{
    // SAFETY: staged with an `F`, an `R` and an `Arc<AsyncApply<T, F, R>>` payload by
    // `AsyncApply::send`.
    let (call, answer) = unsafe {
        (
            request::take_done::<F, R, Arc<AsyncApply<T, F, R>>>(record),
            request::take_answer::<F, R>(record),
        )
    };
    call.cell
        .complete(answer.unwrap_or_else(|| Err(shut_down_panic())));
}
