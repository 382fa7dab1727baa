//! Deferred requests across the rack: [`Trust::apply_deferred_with`] and its forms, whose
//! closure gets a [`trust::Reply`] and may answer later (a lock granted when it frees).
//!
//! On the property's node a deferred request is `trust`'s: the remote operation
//! (`call::DeferredOp`) makes it on the trustee with `apply_deferred_settle`, and answers the
//! caller's request id on the lane whenever the outcome comes — at once, or long after later
//! requests were answered. Answers already name their request, so a late one needs nothing
//! new on the wire; one naming an unknown or already answered id is a bad frame that ends
//! the job, never a call. A deadline travels as the time left, in nanoseconds, and restarts
//! on the trustee's clock; the answer is `Option<R>`, `None` for a time-out.

use std::time::{Duration, Instant};

use crate::{Reply, ReplyId, TimedOut};

use crate::call::{self, DeferredOp, expire, on_rack, wait_for};
use crate::capture_free::check;
use crate::codec::{self, Wire};
use crate::export::Target;
use crate::link::{self, OnAnswer};
use crate::proxy::{ApplyFuture, BLOCKING, Placement, Trust};
use crate::state;

impl<T: Send + 'static> Trust<T> {
    /// Runs `f(property, argument, reply)` on the property's trustee and waits for the value
    /// sent through `reply` — by `f`, or later by another request that finds the reply where
    /// `f` kept it (see [`trust::Trust::apply_deferred`]). Only the calling fiber waits. `f`
    /// must capture nothing; a panic in `f`, or a reply dropped unsent, is raised here.
    ///
    /// ```
    /// use gossamer::Reply;
    /// let code = gossamer::Rack::from_env().workers(2).run(|| {
    ///     let waiting = gossamer::entrust(Vec::<Reply<u64>>::new());
    ///     let w = waiting.clone();
    ///     let caller = gossamer::spawn(move || w.apply_deferred_with(|w, (), r| w.push(r), ()));
    ///     while waiting.apply(|w| w.is_empty()) {
    ///         gossamer::yield_now();
    ///     }
    ///     waiting.apply_with(|w, v: u64| w.drain(..).for_each(|r| r.send(v).unwrap()), 9);
    ///     assert_eq!(caller.join(), 9);
    /// });
    /// assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// ```
    ///
    /// # Panics
    /// In delegated context: use [`Trust::apply_deferred_then_with`] there.
    pub fn apply_deferred_with<A, R, F>(&self, f: F, argument: A) -> R
    where
        F: FnOnce(&mut T, A, Reply<R>) + Send + 'static,
        A: Wire,
        R: Wire,
    {
        self.try_apply_deferred_with(f, argument)
            .unwrap_or_else(|e| call::raise(e))
    }

    /// [`Trust::apply_deferred_with`] with a deadline: when it passes first, the trustee runs
    /// `on_expire(property, id)` (capture-free, like `f`) so the property forgets the reply
    /// it keeps for request `id`, and this returns `Err(TimedOut)`. Across nodes the deadline
    /// travels as the time left and is measured again on the trustee's node.
    ///
    /// # Panics
    /// In delegated context.
    pub fn apply_deferred_until_with<A, R, F, E>(
        &self,
        f: F,
        argument: A,
        deadline: Instant,
        on_expire: E,
    ) -> Result<R, TimedOut>
    where
        F: FnOnce(&mut T, A, Reply<R>) + Send + 'static,
        E: Fn(&mut T, ReplyId) + Send + 'static,
        A: Wire,
        R: Wire,
    {
        check!(F);
        check!(E);
        match self.placement() {
            Placement::Local(t) => {
                std::mem::forget(on_expire);
                t.apply_deferred_until(move |v, r| f(v, argument, r), deadline, expire::<T, E>)
            }
            Placement::ViaFiber => {
                let this = self.clone();
                on_rack(move || this.apply_deferred_until_with(f, argument, deadline, on_expire))
            }
            Placement::Moved(m, first) => Trust::forwarded(&m, first)
                .apply_deferred_until_with(f, argument, deadline, on_expire),
            Placement::Remote(t) => {
                let left = deadline.saturating_duration_since(Instant::now());
                self.wait_remote(t, f, argument, Some(left), on_expire)
                    .ok_or(TimedOut)
            }
        }
    }

    /// [`Trust::apply_deferred_with`] without waiting: `then(answer)` runs later on the
    /// calling worker, when the answer arrives. Allowed anywhere, including in delegated
    /// context. A panic in `f` or `then`, or a reply dropped unsent, goes to the panic handler
    /// of the caller's runtime. From a plain thread the call waits and runs `then` before
    /// returning.
    pub fn apply_deferred_then_with<A, R, F, Then>(&self, f: F, argument: A, then: Then)
    where
        F: FnOnce(&mut T, A, Reply<R>) + Send + 'static,
        A: Wire,
        R: Wire,
        Then: FnOnce(R) + 'static,
    {
        self.try_apply_deferred_then_with(f, argument, move |answer| {
            then(answer.unwrap_or_else(|e| call::raise(e)))
        })
    }

    /// [`Trust::apply_deferred_with`], returning a remote failure (the trustee's rank lost,
    /// a panic) rather than raising it: how durable calls find a lost rank and send again.
    pub(crate) fn try_apply_deferred_with<A, R, F>(
        &self,
        f: F,
        argument: A,
    ) -> Result<R, call::Failure>
    where
        F: FnOnce(&mut T, A, Reply<R>) + Send + 'static,
        A: Wire,
        R: Wire,
    {
        check!(F);
        match self.placement() {
            Placement::Local(t) => Ok(t.apply_deferred(move |v, r| f(v, argument, r))),
            Placement::ViaFiber => {
                let this = self.clone();
                on_rack(move || this.try_apply_deferred_with(f, argument))
            }
            Placement::Moved(m, first) => {
                Trust::forwarded(&m, first).try_apply_deferred_with(f, argument)
            }
            Placement::Remote(t) => {
                if !link::is_rack_worker() {
                    let this = self.clone();
                    return on_rack(move || this.try_apply_deferred_with(f, argument));
                }
                if trust::in_delegated_context() {
                    panic!("{BLOCKING}");
                }
                let answer: Option<R> = call::wait_for_try(|on_answer| {
                    call_remote(t, f, argument, None, no_expiry::<T>(), on_answer)
                })?;
                answer.ok_or_else(no_deadline)
            }
        }
    }

    /// [`Trust::apply_deferred_then_with`], handing a remote failure (the trustee's rank
    /// lost, a panic) to `then` rather than raising it.
    pub(crate) fn try_apply_deferred_then_with<A, R, F, Then>(&self, f: F, argument: A, then: Then)
    where
        F: FnOnce(&mut T, A, Reply<R>) + Send + 'static,
        A: Wire,
        R: Wire,
        Then: FnOnce(Result<R, call::Failure>) + 'static,
    {
        check!(F);
        match self.placement() {
            Placement::Local(t) => {
                t.apply_deferred_then(move |v, r| f(v, argument, r), move |r| then(Ok(r)))
            }
            Placement::Moved(m, first) => Trust::forward(&m, first, move |at| {
                at.try_apply_deferred_then_with(f, argument, then)
            }),
            Placement::Remote(t) if link::is_rack_worker() => {
                let on_answer: OnAnswer = Box::new(move |outcome| {
                    let answer = call::decode_answer::<Option<R>>(outcome)
                        .and_then(|a| a.ok_or_else(no_deadline));
                    trust::defer(move || then(answer));
                });
                call_remote(t, f, argument, None, no_expiry::<T>(), on_answer);
            }
            Placement::Remote(_) | Placement::ViaFiber => {
                then(self.try_apply_deferred_with(f, argument))
            }
        }
    }

    /// [`Trust::apply_deferred_with`] as a future, for any executor or thread.
    pub fn apply_deferred_async_with<A, R, F>(&self, f: F, argument: A) -> ApplyFuture<R>
    where
        F: FnOnce(&mut T, A, Reply<R>) + Send + 'static,
        A: Wire,
        R: Wire,
    {
        check!(F);
        match self.placement() {
            // The future sends its request when first polled, maybe after a move began: with
            // several ranks, a fiber makes the call instead (see `moved`).
            Placement::Local(t) if !state::several_ranks() => {
                ApplyFuture::local(t.apply_deferred_async(move |v, r| f(v, argument, r)))
            }
            Placement::Local(_)
            | Placement::Remote(_)
            | Placement::Moved(..)
            | Placement::ViaFiber => {
                let state = state::current().expect("a remote trust outlived its rack");
                let this = self.clone();
                ApplyFuture::fiber(
                    state
                        .handle
                        .spawn(move || this.apply_deferred_with(f, argument)),
                )
            }
        }
    }

    /// Makes a deferred request of a remote property and waits for its answer (`None`: timed
    /// out), from a fiber of the rack or, through one, from a plain thread.
    fn wait_remote<A, R, F, E>(
        &self,
        t: Target,
        f: F,
        argument: A,
        wait: Option<Duration>,
        on_expire: E,
    ) -> Option<R>
    where
        F: FnOnce(&mut T, A, Reply<R>) + Send + 'static,
        E: Fn(&mut T, ReplyId) + Send + 'static,
        A: Wire,
        R: Wire,
    {
        if !link::is_rack_worker() {
            // A plain thread has no links: a fiber of the rack makes the call.
            let this = self.clone();
            return on_rack(move || this.wait_remote(t, f, argument, wait, on_expire));
        }
        if trust::in_delegated_context() {
            panic!("{BLOCKING}");
        }
        wait_for(|on_answer| call_remote(t, f, argument, wait, on_expire, on_answer))
    }
}

/// Sends a deferred request to the remote property at `t`. `f` and `on_expire` are
/// capture-free: the operation names their types, and the trustee's node makes them anew.
fn call_remote<T, A, R, F, E>(
    t: Target,
    f: F,
    argument: A,
    wait: Option<Duration>,
    on_expire: E,
    on_answer: OnAnswer,
) where
    T: Send + 'static,
    F: FnOnce(&mut T, A, Reply<R>) + Send + 'static,
    E: Fn(&mut T, ReplyId) + Send + 'static,
    A: Wire,
    R: Wire,
{
    std::mem::forget(f);
    std::mem::forget(on_expire);
    // Nanoseconds left; more than u64 holds (585 years) is no deadline at all.
    let wait = wait.map(|w| u64::try_from(w.as_nanos()).unwrap_or(u64::MAX));
    let bytes = codec::encode(t.life(), &(argument, wait));
    let op = DeferredOp::<T, A, R, F, E>::OP;
    link::call(
        t.node,
        t.worker,
        Some(t.incarnation),
        op,
        Some((t.slot, t.generation)),
        bytes.as_slice(),
        on_answer,
    );
}

/// The `on_expire` of a request without a deadline (never runs): capture-free, so the
/// operation can name its type.
fn no_expiry<T>() -> impl Fn(&mut T, ReplyId) + Send + 'static {
    |_: &mut T, _: ReplyId| {}
}

/// A time-out answered to a request that had no deadline: a broken peer.
fn no_deadline() -> call::Failure {
    call::Failure::Refused("a time-out answered to a request without a deadline".into())
}
