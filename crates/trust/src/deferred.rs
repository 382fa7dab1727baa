//! Deferred requests: `Trust::apply_deferred` and its forms, whose closure gets a [`Reply`]
//! and may answer later instead of returning the answer.
//!
//! A deferred request is an ordinary record (`request`) whose answer area holds a
//! `Deferred<R>`: the answer itself when the closure sent its reply before returning — the
//! common case, which costs what `apply` costs plus the reply's bookkeeping — or the client's
//! reference to a late-answer cell (`late`) when it did not. The client's completion then
//! waits for the cell in its worker's table (`worker/replies`) instead of running, and runs
//! when the answer arrives. No fiber waits on the trustee's side: a waiting request costs its
//! cell and one table entry.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::time::Instant;

use crate::async_call::{ApplyFuture, SendLater};
use crate::fiber::{self, Oneshot};
use crate::inject::{FiberId, Injected};
use crate::late::{Finished, LateRef};
use crate::record;
use crate::reply::{Deferred, Reply, ReplyId, TimedOut, abandoned};
use crate::request::{self, CompleteFn, Panic, RunFn};
use crate::trust::{Trust, property_value, shut_down_panic, then_in_fiber, unhandled};
use crate::worker::{
    self, AnswerState, BLOCKING_IN_DELEGATED, Expire, MAX_BACKLOG, Running, Worker,
};

/// A deferred request's deadline, and the function its trustee runs on the property when it
/// passes first (see [`Trust::apply_deferred_until`]).
pub type Deadline<T> = (Instant, fn(&mut T, ReplyId));

/// The deadline part of a deferred request: `()` for none, or a [`Deadline`].
pub(crate) trait Expiry<T>: Send + 'static {
    fn deadline(self) -> Option<Deadline<T>>;
}

impl<T> Expiry<T> for () {
    #[inline(always)]
    fn deadline(self) -> Option<Deadline<T>> {
        None
    }
}

impl<T: 'static> Expiry<T> for Deadline<T> {
    fn deadline(self) -> Option<Deadline<T>> {
        Some(self)
    }
}

impl<T: 'static> Expiry<T> for Option<Deadline<T>> {
    fn deadline(self) -> Option<Deadline<T>> {
        self
    }
}

/// Everything that can end a deferred request, as [`Trust::apply_deferred_settle`] hands it
/// over.
#[derive(Debug)]
pub enum Outcome<R> {
    /// The reply was sent.
    Answer(R),
    /// The deadline passed first.
    TimedOut,
    /// The closure panicked, its reply was dropped unsent, or the runtime shut down: the
    /// panic the other forms raise or hand to the panic handler.
    Panicked(Panic),
}

impl<T: Send + 'static> Trust<T> {
    /// Runs `f` on the property with a [`Reply`] and waits for the value sent through it —
    /// now, by `f`, or later, by another closure on the trustee that finds the reply where `f`
    /// kept it. Only the calling fiber waits; the trustee goes on serving meanwhile.
    ///
    /// This is how a trustee answers "when it can": a lock granted when its holder releases,
    /// a queue's `take` answered by the next `put`. The request costs no fiber on the
    /// trustee's side, only its reply's record while it waits.
    ///
    /// A panic in `f` is raised here, unless `f` had sent its reply first (then the caller
    /// gets the answer and the panic goes to the runtime's panic handler). A reply dropped
    /// unsent raises "request abandoned: its Reply was dropped unanswered" here.
    ///
    /// ```
    /// let rt = trust::Runtime::builder().workers(2).build().unwrap();
    /// let waiting = rt.entrust(Vec::<trust::Reply<u32>>::new());
    /// let caller = {
    ///     let waiting = waiting.clone();
    ///     rt.spawn(move || waiting.apply_deferred(|w, reply| w.push(reply)))
    /// };
    /// rt.block_on(|| {
    ///     while waiting.apply(|w| w.is_empty()) {
    ///         trust::yield_now();
    ///     }
    ///     waiting.apply(|w| w.drain(..).for_each(|r| r.send(7).unwrap()));
    /// });
    /// assert_eq!(caller.join(), 7);
    /// ```
    ///
    /// # Panics
    /// In delegated context, where waiting would stall the trustee: use
    /// [`Trust::apply_deferred_then`] there.
    #[track_caller]
    pub fn apply_deferred<R, F>(&self, f: F) -> R
    where
        F: FnOnce(&mut T, Reply<R>) + Send + 'static,
        R: Send + 'static,
    {
        match self.wait_deferred(f, ()) {
            Finished::Answer(r) => r,
            other => raise(other),
        }
    }

    /// [`Trust::apply_deferred`] with a deadline: if `deadline` passes before the reply is
    /// sent, the trustee runs `on_expire(property, id)` — so the property can forget the reply
    /// it keeps for request `id` ([`Reply::id`]) — and the caller gets `Err(TimedOut)`. A
    /// later [`Reply::send`] returns `Err(answer)`: exactly one outcome reaches the caller,
    /// and the property knows which.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use trust::{Reply, ReplyId, TimedOut};
    ///
    /// let rt = trust::Runtime::builder().workers(1).build().unwrap();
    /// let waiting = rt.entrust(Vec::<Reply<u32>>::new());
    /// let forget = |w: &mut Vec<Reply<u32>>, id: ReplyId| w.retain(|r| r.id() != id);
    /// let deadline = Instant::now() + Duration::from_millis(10);
    /// let outcome = rt.block_on(|| waiting.apply_deferred_until(|w, r| w.push(r), deadline, forget));
    /// assert_eq!(outcome, Err(TimedOut));
    /// assert!(waiting.apply(|w| w.is_empty()));
    /// ```
    ///
    /// # Panics
    /// In delegated context (use [`Trust::apply_deferred_until_then`] there).
    #[track_caller]
    pub fn apply_deferred_until<R, F>(
        &self,
        f: F,
        deadline: Instant,
        on_expire: fn(&mut T, ReplyId),
    ) -> Result<R, TimedOut>
    where
        F: FnOnce(&mut T, Reply<R>) + Send + 'static,
        R: Send + 'static,
    {
        match self.wait_deferred(f, (deadline, on_expire)) {
            Finished::Answer(r) => Ok(r),
            Finished::TimedOut => Err(TimedOut),
            other => raise(other),
        }
    }

    /// Like [`Trust::apply_deferred`] without waiting: `then` runs with the answer on the
    /// caller's worker when it arrives. Allowed anywhere, including in delegated context.
    ///
    /// Order: requests of one worker to one trustee run in the order they were made, as with
    /// `apply_then`; their `then`s run in the order the answers were sent (an answer sent by
    /// a later request of the same batch runs when that batch comes back, in request order).
    /// Panics go to the panic handler of the caller's runtime. From a plain thread the call
    /// waits and runs `then` before returning.
    pub fn apply_deferred_then<R, F, Then>(&self, f: F, then: Then)
    where
        F: FnOnce(&mut T, Reply<R>) + Send + 'static,
        R: Send + 'static,
        Then: FnOnce(R) + 'static,
    {
        let callback = Callback {
            then,
            map: answer_of,
        };
        self.deferred_then(f, (), callback, |f, c| (c.then)(self.apply_deferred(f)));
    }

    /// [`Trust::apply_deferred_until`] without waiting: `then` gets the answer or
    /// `Err(TimedOut)`. Allowed anywhere, including in delegated context.
    pub fn apply_deferred_until_then<R, F, Then>(
        &self,
        f: F,
        deadline: Instant,
        on_expire: fn(&mut T, ReplyId),
        then: Then,
    ) where
        F: FnOnce(&mut T, Reply<R>) + Send + 'static,
        R: Send + 'static,
        Then: FnOnce(Result<R, TimedOut>) + 'static,
    {
        let callback = Callback {
            then,
            map: until_answer_of,
        };
        self.deferred_then(f, (deadline, on_expire), callback, |f, c| {
            (c.then)(self.apply_deferred_until(f, deadline, on_expire))
        });
    }

    /// The general form of the `_then` calls, for layers that forward an outcome elsewhere
    /// (the rack answers a remote caller with it): `then` gets every outcome, panics included,
    /// and `deadline` is optional. Allowed anywhere, including in delegated context.
    ///
    /// ```
    /// use trust::{Outcome, Reply};
    ///
    /// let rt = trust::Runtime::builder().workers(1).build().unwrap();
    /// let t = rt.entrust(0u32);
    /// let seen = rt.block_on(|| {
    ///     let seen = std::rc::Rc::new(std::cell::RefCell::new(None));
    ///     let (s, group) = (seen.clone(), trust::Group::new());
    ///     let done = group.track(move |o: Outcome<u32>| *s.borrow_mut() = Some(o));
    ///     t.apply_deferred_settle(|_, r: Reply<u32>| drop(r), None, done);
    ///     group.wait();
    ///     seen.take()
    /// });
    /// assert!(matches!(seen, Some(Outcome::Panicked(_))), "the reply was dropped");
    /// ```
    pub fn apply_deferred_settle<R, F, Then>(&self, f: F, deadline: Option<Deadline<T>>, then: Then)
    where
        F: FnOnce(&mut T, Reply<R>) + Send + 'static,
        R: Send + 'static,
        Then: FnOnce(Outcome<R>) + 'static,
    {
        let callback = Callback {
            then,
            map: outcome_of,
        };
        self.deferred_then(f, deadline, callback, |f, c| {
            let outcome = match catch_unwind(AssertUnwindSafe(|| match deadline {
                Some((at, on_expire)) => self.apply_deferred_until(f, at, on_expire),
                None => Ok(self.apply_deferred(f)),
            })) {
                Ok(Ok(r)) => Outcome::Answer(r),
                Ok(Err(TimedOut)) => Outcome::TimedOut,
                Err(panic) => Outcome::Panicked(panic),
            };
            (c.then)(outcome)
        });
    }

    /// [`Trust::apply_deferred`] as a future, for any executor or thread. The request is sent
    /// when the future is first polled; dropping the future later does not cancel it.
    pub fn apply_deferred_async<R, F>(&self, f: F) -> ApplyFuture<R>
    where
        F: FnOnce(&mut T, Reply<R>) + Send + 'static,
        R: Send + 'static,
    {
        let cell = Oneshot::new();
        let trust = self.clone();
        let settle = AsyncSettle::new(cell.clone(), answer_of);
        let send = Box::new(move || trust.submit_deferred(f, (), settle));
        ApplyFuture::new(self.registry(), SendLater::new(cell, send))
    }

    /// Stages a deferred request on `w`, a worker of this trust's runtime.
    ///
    /// # Safety
    /// `w` is a worker of this trust's runtime.
    #[inline(always)]
    unsafe fn stage_deferred<R, F, E, S>(
        &self,
        w: &Worker,
        target: usize,
        f: F,
        expiry: E,
        settle: S,
    ) -> usize
    where
        F: FnOnce(&mut T, Reply<R>) + Send + 'static,
        E: Expiry<T>,
        R: Send + 'static,
        S: Settle<R>,
    {
        let run: RunFn = run_deferred::<T, F, E, R>;
        let complete: CompleteFn = complete_deferred::<(F, E), R, S>;
        // SAFETY: per the caller; `run_deferred` takes an `(F, E)` and writes a `Deferred<R>`,
        // `complete_deferred` takes those and an `S`.
        unsafe {
            w.stage::<(F, E), Deferred<R>, S>(
                target,
                run,
                self.property_ptr(),
                complete,
                (f, expiry),
                settle,
            )
        }
    }

    /// Makes a deferred request and waits for its outcome (in a fiber, or on a plain thread).
    #[track_caller]
    fn wait_deferred<R, F, E>(&self, f: F, expiry: E) -> Finished<R>
    where
        F: FnOnce(&mut T, Reply<R>) + Send + 'static,
        E: Expiry<T>,
        R: Send + 'static,
    {
        let Some(w) = worker::current_on(self.registry()) else {
            if worker::current().is_some_and(|w| w.running() != Running::Fiber) {
                panic!("{BLOCKING_IN_DELEGATED}");
            }
            // A plain thread, or a fiber of another runtime: the trustee's worker makes the
            // request for it.
            let cell = Oneshot::new();
            self.submit_deferred(f, expiry, AsyncSettle::new(cell.clone(), Ok));
            return fiber::wait(std::future::poll_fn(|cx| cell.poll_result(cx)));
        };
        if w.running() != Running::Fiber {
            panic!("{BLOCKING_IN_DELEGATED}");
        }
        let mut slot = DeferredSlot::<R> {
            outcome: None,
            fiber: w.current_fiber(),
        };
        let slot_ptr: *mut DeferredSlot<R> = &mut slot;
        // SAFETY: `w` is of this runtime.
        unsafe { self.stage_deferred(w, self.target(w), f, expiry, WaitFor(slot_ptr)) };
        loop {
            // SAFETY: the slot lives on this (suspended, then resumed) fiber's stack; the
            // completion writes it before waking us, and nothing else touches it.
            if let Some(outcome) = unsafe { (*slot_ptr).outcome.take() } {
                return outcome;
            }
            w.block();
        }
    }

    /// The body of the `_then` forms: stage on this runtime's worker, go through a fiber from
    /// another runtime's, wait on a plain thread (`wait`).
    fn deferred_then<R, F, E, S>(&self, f: F, expiry: E, settle: S, wait: impl FnOnce(F, S))
    where
        F: FnOnce(&mut T, Reply<R>) + Send + 'static,
        E: Expiry<T>,
        R: Send + 'static,
        S: Settle<R>,
    {
        match worker::current_on(self.registry()) {
            Some(w) => {
                let target = self.target(w);
                // SAFETY: `w` is of this runtime.
                let backlog = unsafe { self.stage_deferred(w, target, f, expiry, settle) };
                if backlog >= MAX_BACKLOG {
                    w.wait_for_backlog(target);
                }
            }
            None => match worker::current() {
                Some(w) => {
                    // A worker of another runtime: a fiber of its own waits for the outcome.
                    let cell = Oneshot::new();
                    self.submit_deferred(f, expiry, AsyncSettle::new(cell.clone(), Ok));
                    then_in_fiber(w, cell, move |outcome| settle.settle(outcome));
                }
                None => wait(f, settle),
            },
        }
    }

    /// Makes a deferred request from anywhere: staged here on a worker of this runtime,
    /// otherwise handed to the trustee's worker, which stages it to itself.
    fn submit_deferred<R, F, E, X>(&self, f: F, expiry: E, settle: AsyncSettle<R, X>)
    where
        F: FnOnce(&mut T, Reply<R>) + Send + 'static,
        E: Expiry<T>,
        R: Send + 'static,
        X: Send + 'static,
    {
        match worker::current_on(self.registry()) {
            Some(w) => {
                // SAFETY: `w` is of this runtime.
                unsafe { self.stage_deferred(w, self.target(w), f, expiry, settle) };
            }
            None => {
                // Should the runtime close first, the dropped settle completes the cell.
                let trust = self.clone();
                // To the first trustee, as other requests from outside (see `home`).
                self.registry().inject(
                    self.header().origin,
                    Injected::Run(Box::new(move || {
                        if trust.header().withdrawn() {
                            // Refused here, as a trustee refuses a withdrawn property's records.
                            let refused = Box::new(crate::home::WITHDRAWN_MESSAGE);
                            return settle.settle(Finished::Panicked(refused));
                        }
                        trust.submit_deferred(f, expiry, settle)
                    })),
                );
            }
        }
    }
}

// ----- how a caller receives the outcome -----

/// What a caller does with a deferred request's outcome (on its worker).
pub(crate) trait Settle<R>: 'static {
    fn settle(self, outcome: Finished<R>);
}

/// A fiber waiting in `apply_deferred`.
struct WaitFor<R>(*mut DeferredSlot<R>);

struct DeferredSlot<R> {
    outcome: Option<Finished<R>>,
    fiber: FiberId,
}

impl<R: 'static> Settle<R> for WaitFor<R> {
    #[inline]
    fn settle(self, outcome: Finished<R>) {
        // SAFETY: the waiting fiber is suspended in `wait_deferred` and its stack holds the
        // slot; only this completion writes it.
        let fiber = unsafe {
            (*self.0).outcome = Some(outcome);
            (*self.0).fiber
        };
        worker::current()
            .expect("completion outside a worker")
            .wake(fiber);
    }
}

/// The callback of a `_then` form: `map` turns the outcome into the callback's argument, or
/// into the panic that goes to the panic handler instead.
struct Callback<R, X, Then> {
    then: Then,
    map: fn(Finished<R>) -> Result<X, Panic>,
}

impl<R: 'static, X: 'static, Then: FnOnce(X) + 'static> Settle<R> for Callback<R, X, Then> {
    fn settle(self, outcome: Finished<R>) {
        let delivered =
            (self.map)(outcome).and_then(|x| catch_unwind(AssertUnwindSafe(|| (self.then)(x))));
        if let Err(panic) = delivered {
            unhandled(panic);
        }
    }
}

/// Every outcome, for `apply_deferred_settle`.
fn outcome_of<R>(outcome: Finished<R>) -> Result<Outcome<R>, Panic> {
    Ok(match until_answer_of(outcome) {
        Ok(Ok(r)) => Outcome::Answer(r),
        Ok(Err(TimedOut)) => Outcome::TimedOut,
        Err(panic) => Outcome::Panicked(panic),
    })
}

/// A one-shot cell that a future or another thread waits on; `map` turns the outcome into
/// its value. Dropped unsettled (the runtime closed first), it completes with the shut-down
/// panic, so no waiter hangs.
struct AsyncSettle<R, X> {
    cell: Option<Arc<Oneshot<X>>>,
    map: fn(Finished<R>) -> Result<X, Panic>,
}

impl<R, X> AsyncSettle<R, X> {
    fn new(cell: Arc<Oneshot<X>>, map: fn(Finished<R>) -> Result<X, Panic>) -> Self {
        AsyncSettle {
            cell: Some(cell),
            map,
        }
    }
}

impl<R: 'static, X: 'static> Settle<R> for AsyncSettle<R, X> {
    fn settle(mut self, outcome: Finished<R>) {
        if let Some(cell) = self.cell.take() {
            cell.complete((self.map)(outcome));
        }
    }
}

impl<R, X> Drop for AsyncSettle<R, X> {
    fn drop(&mut self) {
        if let Some(cell) = self.cell.take() {
            cell.complete(Err(shut_down_panic()));
        }
    }
}

/// Raises what a caller gets instead of an answer (a time-out where none was asked for
/// cannot happen).
#[cold]
fn raise<R>(outcome: Finished<R>) -> ! {
    match answer_of(outcome) {
        Err(panic) => resume_unwind(panic),
        Ok(_) => unreachable!("raise is called without an answer"),
    }
}

/// The answer, or the panic to raise instead.
fn answer_of<R>(outcome: Finished<R>) -> Result<R, Panic> {
    match until_answer_of(outcome)? {
        Ok(r) => Ok(r),
        Err(TimedOut) => Err(Box::new(TimedOut.to_string())),
    }
}

/// The answer or the time-out, or the panic to raise instead.
fn until_answer_of<R>(outcome: Finished<R>) -> Result<Result<R, TimedOut>, Panic> {
    match outcome {
        Finished::Answer(r) => Ok(Ok(r)),
        Finished::TimedOut => Ok(Err(TimedOut)),
        Finished::Panicked(panic) => Err(panic),
        Finished::Cancelled => Err(shut_down_panic()),
    }
}

// ----- trampolines (the record layout they read is in `request`) -----

/// Runs a deferred request: takes the closure out of the record and runs it with a reply
/// whose answer, if sent before the closure returns, goes straight into the record; an
/// unanswered request gets a late-answer cell and waits in the trustee's table.
unsafe fn run_deferred<T, F, E, R>(record: *mut u64)
where
    T: Send + 'static,
    F: FnOnce(&mut T, Reply<R>),
    E: Expiry<T>,
    R: Send + 'static,
{
    // SAFETY: the record was staged by `stage_deferred` with an `(F, E)` closure and a
    // `Deferred<R>` answer; we run on the property's trustee, one request at a time, and the
    // property is alive (its free waits for every staged request).
    unsafe {
        let area = record.add(request::CLOSURE_AT);
        let (f, expiry) = record::take::<(F, E)>(area);
        let property = request::property(record);
        let value = &mut *property_value::<T>(property);
        let w = worker::current().expect("a request outside a worker");
        let id = w.begin_answering(area);
        let outcome = catch_unwind(AssertUnwindSafe(|| f(value, Reply::new(id, w))));
        match (w.end_answering(), outcome) {
            (AnswerState::Answered, Ok(())) => {}
            (AnswerState::Open, Ok(())) => defer::<T, E, R>(w, id, area, property, expiry),
            (AnswerState::Dropped, Ok(())) => request::panicked(record, abandoned()),
            // The caller has its answer: the panic has nobody waiting for it.
            (AnswerState::Answered, Err(panic)) => w.registry.unhandled_panic(panic),
            // A reply the closure kept is now stale: sending it returns `Err`.
            (_, Err(panic)) => request::panicked(record, panic),
        }
    }
}

/// Leaves a late-answer cell in an unanswered request's record and puts the request in the
/// trustee's table.
///
/// # Safety
/// Called by `run_deferred` for its record: `area` is the record's answer area, free now,
/// and `property` the live property.
#[cold]
unsafe fn defer<T, E, R>(w: &Worker, id: u64, area: *mut u64, property: *const (), expiry: E)
where
    T: Send + 'static,
    E: Expiry<T>,
    R: Send + 'static,
{
    debug_assert!(w.served_client() < w.registry.workers, "a worker's request");
    let (trustee_ref, client_ref) = LateRef::make::<R>(w.served_client(), w.index);
    // SAFETY: per the caller; the area was laid out for a `Deferred<R>`.
    unsafe { record::store::<Deferred<R>>(area, Deferred::Later(client_ref)) };
    let deadline = expiry.deadline().map(|(at, on_expire)| {
        // The expiry holds the property alive until it runs or the request ends.
        // SAFETY: per the caller, the property is alive.
        let trust = unsafe { Trust::<T>::from_property(property) };
        let expire: Expire = Box::new(move |id| {
            // SAFETY: expiries run on the trustee's worker, in its loop, where no other
            // closure on the property runs.
            on_expire(unsafe { trust.property_mut() }, ReplyId(id));
        });
        (at, expire)
    });
    // Waiting, the request pins the property to this trustee (see `home`): its expiry runs
    // here, and so do the closures its reply may be kept for.
    // SAFETY: per the caller; the request runs on the property's home.
    unsafe { w.await_reply(id, trustee_ref, deadline, property) };
}

/// Completes a deferred request: settles an answer that came with the batch, or waits for a
/// late one.
unsafe fn complete_deferred<C, R: 'static, S: Settle<R>>(record: *mut u64, run: bool) {
    // SAFETY: staged by `stage_deferred` with a `C` closure, a `Deferred<R>` answer and an
    // `S` payload.
    let (settle, answer) = unsafe {
        (
            request::take_done::<C, Deferred<R>, S>(record),
            request::take_answer::<C, Deferred<R>>(record),
        )
    };
    if !run {
        return;
    }
    let outcome = match answer {
        Some(Ok(Deferred::Now(r))) => Finished::Answer(r),
        Some(Ok(Deferred::Later(late))) => return await_late(late, settle),
        Some(Err(panic)) => Finished::Panicked(panic),
        None => Finished::Cancelled,
    };
    settle.settle(outcome);
}

#[cold]
fn await_late<R: 'static, S: Settle<R>>(late: LateRef, settle: S) {
    let w = worker::current().expect("completion outside a worker");
    w.await_late(
        late,
        Box::new(move |late, run| {
            if run {
                // SAFETY: delivered on the client's thread once the trustee's reference
                // arrived; the cell holds an `R`.
                settle.settle(unsafe { late.take::<R>() });
            }
        }),
    );
}
