//! `gossamer::Trust<T>`: a handle to a property on this node or on another, with one API.
//!
//! A local handle wraps the property's `trust::Trust<T>` and calls take the local channels,
//! with no serialization. A remote handle names the property's node, trustee worker and
//! export `(slot, generation)`; a call encodes its argument with postcard, sends it on the
//! calling worker's link to that trustee, and decodes the answer. Either way the closure must
//! capture nothing (checked at compile time) and its argument and result must be [`Wire`], so
//! a program does not change when its data moves to another node.
//!
//! Counting: clones of a handle within a process share one count (an `Arc`, or the local
//! trust's own count), so clone and drop never send a message. When the last handle to a
//! remote property drops, the node sends its trustee a release that carries how many
//! requests each of its workers had sent to that trustee; the trustee applies it only after
//! all of those have arrived, so a release cannot overtake a request sent on another link.

use std::any::type_name;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use serde::{Deserialize, Serialize};

use crate::call::{self, ApplyOp, EntrustOp, on_rack, wait_for};
use crate::capture_free::check;
use crate::codec::{self, Wire};
use crate::export::{Export, Target, Ticket};
use crate::hash;
use crate::link::{self, Control};
use crate::moved::{self, At, Moved};
use crate::remote::Remote;
use crate::state;

/// A handle to a property, on this node or another. Cloning is cheap and sends nothing; the
/// property is dropped on its trustee after the last handle anywhere is gone.
pub struct Trust<T: Send + 'static> {
    inner: Inner<T>,
}

enum Inner<T: Send + 'static> {
    Local(trust::Trust<T>),
    Remote(Arc<Remote>, PhantomData<fn() -> T>),
}

/// Where a handle's property lives: here, at a remote target, or (moved away from this rank,
/// its first home, or called from outside the rack's workers) to be reached another way.
pub(crate) enum Placement<'a, T: Send + 'static> {
    Local(&'a trust::Trust<T>),
    Remote(Target),
    Moved(Arc<Moved<T>>, &'a trust::Trust<T>),
    /// A local property called from outside the workers of a rack of several ranks: the
    /// call goes through a fiber (see `moved`).
    ViaFiber,
}

/// How a call through a local handle goes.
enum LocalRoute<T: Send + 'static> {
    Direct,
    ViaFiber,
    Moved(Arc<Moved<T>>),
}

/// How a call through a local handle to `t` goes: straight to its trustee, unless the
/// property moved away (then through its forward), or the rack has several ranks and the
/// caller is not one of its workers (then through a fiber, whose worker's lane a move
/// drains: see `moved`). One load on a one-rank rack.
#[inline(always)]
fn local_route<T: Send + 'static>(t: &trust::Trust<T>) -> LocalRoute<T> {
    if !state::several_ranks() {
        return LocalRoute::Direct;
    }
    if !link::is_rack_worker() {
        return LocalRoute::ViaFiber;
    }
    match moved::moved(t) {
        Some(m) => LocalRoute::Moved(m),
        None => LocalRoute::Direct,
    }
}

impl<T: Send + 'static> Clone for Trust<T> {
    fn clone(&self) -> Self {
        Trust {
            inner: match &self.inner {
                Inner::Local(t) => Inner::Local(t.clone()),
                Inner::Remote(r, _) => Inner::Remote(r.clone(), PhantomData),
            },
        }
    }
}

impl<T: Send + 'static> fmt::Debug for Trust<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Local(t) => f.debug_tuple("Trust::Local").field(t).finish(),
            Inner::Remote(r, _) => f
                .debug_struct("Trust::Remote")
                .field("node", &r.target.node)
                .field("worker", &r.target.worker)
                .finish(),
        }
    }
}

/// The panic of a blocking call in delegated context, as `trust` words it.
pub(crate) const BLOCKING: &str = "blocking rack call in delegated context (inside a delegated closure or an \
                        apply_then callback); use apply_then_with there";

impl<T: Send + 'static> Trust<T> {
    pub(crate) fn local_handle(trust: trust::Trust<T>) -> Self {
        Trust {
            inner: Inner::Local(trust),
        }
    }

    /// Fixes a property of this node to its worker for good (`trust::Trust::fix_home`); a
    /// remote handle's property is its own node's to fix.
    pub(crate) fn fix_home(&self) {
        if let Inner::Local(t) = &self.inner {
            t.fix_home();
        }
    }

    /// The property made on this rank that a local handle names (moved away or not).
    pub(crate) fn first_property(&self) -> Option<&trust::Trust<T>> {
        match &self.inner {
            Inner::Local(t) => Some(t),
            Inner::Remote(..) => None,
        }
    }

    /// Where a remote handle's property lives (its first home's export).
    pub(crate) fn remote_target(&self) -> Option<Target> {
        match &self.inner {
            Inner::Local(_) => None,
            Inner::Remote(r, _) => Some(r.target),
        }
    }

    /// A handle to where a moved property's value lives now (not counted apart: it shares
    /// the forward's property or ticket).
    pub(crate) fn at(at: At<T>) -> Self {
        Trust {
            inner: match at {
                At::Here(t) => Inner::Local(t),
                At::There(r) => Inner::Remote(r, PhantomData),
            },
        }
    }

    pub(crate) fn remote(target: Target, ticket: Ticket) -> Self {
        Trust {
            inner: Inner::Remote(
                Arc::new(Remote::new(target, ticket, call::marker_op::<T>())),
                PhantomData,
            ),
        }
    }

    /// The `trust::Trust<T>` of a property on this node, for closures that capture (borrow
    /// from the caller, hold `Rc`s); `None` if the property is on another node, or has been
    /// on one since it was made ([`Trust::migrate_to`]: its calls go through its forward
    /// then, even after it came back).
    ///
    /// ```
    /// let code = gossamer::Rack::from_env().workers(1).run(|| {
    ///     let names = gossamer::entrust(Vec::<String>::new());
    ///     let name = String::from("captured");
    ///     names.local().unwrap().apply(|v| v.push(name.clone()));
    ///     assert_eq!(names.apply(|v| v.len()), 1);
    /// });
    /// assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// ```
    pub fn local(&self) -> Option<&trust::Trust<T>> {
        match &self.inner {
            Inner::Local(t) if moved::moved(t).is_none() => Some(t),
            Inner::Local(_) | Inner::Remote(..) => None,
        }
    }

    /// Where the property lives, for calls defined in other files (`deferred`). For a remote
    /// handle, where this worker's next call goes (`Remote::call_target`): a fiber may wait
    /// there, and stages its call right after.
    pub(crate) fn placement(&self) -> Placement<'_, T> {
        match &self.inner {
            Inner::Local(t) => match local_route(t) {
                LocalRoute::Direct => Placement::Local(t),
                LocalRoute::ViaFiber => Placement::ViaFiber,
                LocalRoute::Moved(m) => Placement::Moved(m, t),
            },
            Inner::Remote(r, _) => Placement::Remote(r.call_target()),
        }
    }

    /// For a call that waits, through a moved property's forward: a handle to where the
    /// value lives now, once this worker's calls to it are not held (see `moved`).
    ///
    /// # Panics
    /// In delegated context.
    #[track_caller]
    pub(crate) fn forwarded(moved: &Moved<T>, first: &trust::Trust<T>) -> Self {
        if trust::in_delegated_context() {
            panic!("{BLOCKING}");
        }
        Trust::at(moved.wait_at(first))
    }

    /// For a call that does not wait, through a moved property's forward: `call` runs with a
    /// handle to where the value lives, in this worker's order (see `moved`).
    pub(crate) fn forward(
        moved: &Arc<Moved<T>>,
        first: &trust::Trust<T>,
        call: impl FnOnce(Trust<T>) + 'static,
    ) {
        moved.call(first, None, move |at| call(Trust::at(at)))
    }

    /// The node that holds the property. For a handle on another rank, that is the node the
    /// property was made on, which forwards calls to wherever it moved since
    /// ([`Trust::migrate_to`]); on that node, where the value lives now.
    pub fn node(&self) -> crate::Node {
        match &self.inner {
            Inner::Local(t) => match moved::moved(t).and_then(|m| m.rank_now()) {
                Some(rank) => crate::Node { rank },
                None => crate::this_node(),
            },
            Inner::Remote(r, _) => crate::Node {
                rank: r.target.node,
            },
        }
    }

    /// Runs `f(property, argument)` on the property's trustee and waits for its result; only
    /// the calling fiber waits. `f` must capture nothing: what it needs travels as `argument`.
    /// A panic in `f` is raised again here, naming the node it happened on.
    ///
    /// ```
    /// let code = gossamer::Rack::from_env().workers(1).run(|| {
    ///     let total = gossamer::entrust(0u64);
    ///     assert_eq!(total.apply_with(|t, x: u64| { *t += x; *t }, 5), 5);
    /// });
    /// assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// ```
    ///
    /// A closure that captures is refused at compile time:
    ///
    /// ```compile_fail
    /// gossamer::Rack::from_env().run(|| {
    ///     let total = gossamer::entrust(0u64);
    ///     let x = 5u64;
    ///     total.apply_with(move |t, ()| *t += x, ());
    /// });
    /// ```
    ///
    /// # Panics
    /// In delegated context, where waiting would stall a trustee: use
    /// [`Trust::apply_then_with`] there.
    #[track_caller]
    pub fn apply_with<A, R, F>(&self, f: F, argument: A) -> R
    where
        F: FnOnce(&mut T, A) -> R + Send + 'static,
        A: Wire,
        R: Wire,
    {
        check!(F);
        match &self.inner {
            Inner::Local(t) => match local_route(t) {
                LocalRoute::Direct => t.apply_with(f, argument),
                LocalRoute::ViaFiber => {
                    let this = self.clone();
                    on_rack(move || this.apply_with(f, argument))
                }
                LocalRoute::Moved(m) => Trust::forwarded(&m, t).apply_with(f, argument),
            },
            Inner::Remote(..) if !link::is_rack_worker() => {
                // A plain thread has no links: a fiber of the rack makes the call.
                let this = self.clone();
                on_rack(move || this.apply_with(f, argument))
            }
            Inner::Remote(remote, _) => {
                if trust::in_delegated_context() {
                    panic!("{BLOCKING}");
                }
                std::mem::forget(f);
                let t = remote.call_target();
                let bytes = codec::encode(t.life(), &argument);
                let property = Some((t.slot, t.generation));
                let op = ApplyOp::<T, A, R, F>::OP;
                wait_for(|on_answer| {
                    let life = Some(t.incarnation);
                    link::call(
                        t.node,
                        t.worker,
                        life,
                        op,
                        property,
                        bytes.as_slice(),
                        on_answer,
                    )
                })
            }
        }
    }

    /// [`Trust::apply_with`] without an argument.
    ///
    /// ```
    /// let code = gossamer::Rack::from_env().workers(1).run(|| {
    ///     let v = gossamer::entrust(vec![1u32, 2, 3]);
    ///     assert_eq!(v.apply(|v| v.iter().sum::<u32>()), 6);
    /// });
    /// assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// ```
    ///
    /// Results must be [`Wire`]:
    ///
    /// ```compile_fail
    /// gossamer::Rack::from_env().run(|| {
    ///     let v = gossamer::entrust(0u8);
    ///     let _ = v.apply(|_| std::rc::Rc::new(0));
    /// });
    /// ```
    #[track_caller]
    pub fn apply<R, F>(&self, f: F) -> R
    where
        F: FnOnce(&mut T) -> R + Send + 'static,
        R: Wire,
    {
        check!(F);
        self.apply_with(move |t, ()| f(t), ())
    }

    /// Runs `f(property, argument)` on the trustee without waiting; `then(result)` runs later
    /// on the calling worker, in delegated context, and may capture anything. Allowed on any
    /// worker, including in delegated context. A panic in `f` or `then` goes to the panic
    /// handler of the caller's runtime.
    ///
    /// # Panics
    /// Outside the workers (a plain thread, another executor's task), where no worker would
    /// run `then`: use [`Trust::apply_with`] or [`Trust::apply_async_with`] there.
    ///
    /// ```
    /// use std::{cell::Cell, rc::Rc};
    /// let code = gossamer::Rack::from_env().workers(2).run(|| {
    ///     let counter = gossamer::entrust(0u64);
    ///     let seen = Rc::new(Cell::new(0));
    ///     let group = trust::Group::new();
    ///     for _ in 0..10 {
    ///         let seen = seen.clone();
    ///         counter.apply_then_with(|c, x: u64| { *c += x; *c }, 2, group.track(move |v| seen.set(v)));
    ///     }
    ///     group.wait();
    ///     assert_eq!(seen.get(), 20);
    /// });
    /// assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// ```
    #[track_caller]
    pub fn apply_then_with<A, R, F, Then>(&self, f: F, argument: A, then: Then)
    where
        F: FnOnce(&mut T, A) -> R + Send + 'static,
        A: Wire,
        R: Wire,
        Then: FnOnce(R) + 'static,
    {
        check!(F);
        match &self.inner {
            Inner::Local(t) => match local_route(t) {
                LocalRoute::Direct => {
                    refuse_then_outside_workers();
                    t.apply_then(move |v| f(v, argument), then)
                }
                // Another runtime's worker, as for a remote property below.
                LocalRoute::ViaFiber => {
                    refuse_then_outside_workers();
                    then(self.apply_with(f, argument))
                }
                LocalRoute::Moved(m) => try_then_moved(&m, t, f, argument, move |result| {
                    then(result.unwrap_or_else(|e| call::raise(e)))
                }),
            },
            Inner::Remote(..) if link::is_rack_worker() => {
                self.try_apply_then_with(f, argument, move |result| {
                    then(result.unwrap_or_else(|e| call::raise(e)))
                });
            }
            // A rack's workers are the runtime's: only a foreign thread comes this way.
            Inner::Remote(..) => {
                refuse_then_outside_workers();
                then(self.apply_with(f, argument))
            }
        }
    }

    /// [`Trust::apply_then_with`] on a rack's worker, where `then` learns a remote failure
    /// (a lost rank, a panic) as an error instead of it being raised in the caller.
    #[inline]
    pub(crate) fn try_apply_then_with<A, R, F, Then>(&self, f: F, argument: A, then: Then)
    where
        F: FnOnce(&mut T, A) -> R + Send + 'static,
        A: Wire,
        R: Wire,
        Then: FnOnce(Result<R, call::Failure>) + 'static,
    {
        check!(F);
        match &self.inner {
            Inner::Local(t) => match moved::moved(t) {
                None => t.apply_then(move |v| f(v, argument), move |r| then(Ok(r))),
                Some(m) => try_then_moved(&m, t, f, argument, then),
            },
            Inner::Remote(remote, _) => {
                std::mem::forget(f);
                let t = remote.call_target();
                let bytes = codec::encode(t.life(), &argument);
                link::call(
                    t.node,
                    t.worker,
                    Some(t.incarnation),
                    ApplyOp::<T, A, R, F>::OP,
                    Some((t.slot, t.generation)),
                    bytes.as_slice(),
                    Box::new(move |outcome| {
                        let result = call::decode_answer::<R>(outcome);
                        trust::defer(move || then(result));
                    }),
                );
            }
        }
    }

    /// [`Trust::apply_then_with`] without an argument.
    #[track_caller]
    pub fn apply_then<R, F, Then>(&self, f: F, then: Then)
    where
        F: FnOnce(&mut T) -> R + Send + 'static,
        R: Wire,
        Then: FnOnce(R) + 'static,
    {
        check!(F);
        self.apply_then_with(move |t, ()| f(t), (), then)
    }

    /// Runs `f(property, argument)` on the trustee and returns a future of its result, for
    /// any executor or thread. A panic in `f` is raised where the future is polled.
    ///
    /// ```
    /// let code = gossamer::Rack::from_env().workers(1).run(|| {
    ///     let c = gossamer::entrust(20u64);
    ///     let answer = c.apply_async_with(|c, x: u64| *c + x, 22);
    ///     assert_eq!(trust::block_on(answer), 42);
    /// });
    /// assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// ```
    pub fn apply_async_with<A, R, F>(&self, f: F, argument: A) -> ApplyFuture<R>
    where
        F: FnOnce(&mut T, A) -> R + Send + 'static,
        A: Wire,
        R: Wire,
    {
        check!(F);
        match &self.inner {
            // The future sends its request when first polled, maybe after a move began: with
            // several ranks, a fiber makes the call instead (see `moved`).
            Inner::Local(t) if !state::several_ranks() => {
                ApplyFuture::local(t.apply_async(move |v| f(v, argument)))
            }
            Inner::Local(_) | Inner::Remote(..) => {
                let state = state::current().expect("a remote trust outlived its rack");
                let this = self.clone();
                ApplyFuture::fiber(state.handle.spawn(move || this.apply_with(f, argument)))
            }
        }
    }

    /// [`Trust::apply_async_with`] without an argument.
    pub fn apply_async<R, F>(&self, f: F) -> ApplyFuture<R>
    where
        F: FnOnce(&mut T) -> R + Send + 'static,
        R: Wire,
    {
        check!(F);
        self.apply_async_with(move |t, ()| f(t), ())
    }
}

/// The future of [`Trust::apply_async_with`] and [`Trust::apply_deferred_async_with`].
pub struct ApplyFuture<R> {
    inner: AsyncInner<R>,
}

impl<R> ApplyFuture<R> {
    /// The future of a call on this node.
    pub(crate) fn local(future: trust::ApplyFuture<R>) -> Self {
        ApplyFuture {
            inner: AsyncInner::Local(future),
        }
    }

    /// The future of a fiber that makes a remote call and waits for it.
    pub(crate) fn fiber(handle: trust::JoinHandle<R>) -> Self {
        ApplyFuture {
            inner: AsyncInner::Fiber(handle),
        }
    }
}

enum AsyncInner<R> {
    Local(trust::ApplyFuture<R>),
    /// A fiber that makes the remote call and waits for it.
    Fiber(trust::JoinHandle<R>),
}

impl<R> fmt::Debug for ApplyFuture<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApplyFuture").finish_non_exhaustive()
    }
}

impl<R> Future for ApplyFuture<R> {
    type Output = R;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<R> {
        // Both inner futures are `Unpin`.
        match &mut self.get_mut().inner {
            AsyncInner::Local(f) => Pin::new(f).poll(cx),
            AsyncInner::Fiber(f) => Pin::new(f).poll(cx),
        }
    }
}

/// A handle as it travels.
#[derive(Serialize, Deserialize)]
struct WireTrust {
    home: u32,
    /// The life of the home rank the property belongs to.
    incarnation: u32,
    worker: u32,
    slot: u32,
    generation: u32,
    fingerprint: u64,
    ticket: Ticket,
}

/// Names `T` across nodes of one build (the handshake checked that the build is the same).
fn fingerprint<T: ?Sized>() -> u64 {
    hash::fnv1a(type_name::<T>().as_bytes())
}

impl<T: Send + 'static> Serialize for Trust<T> {
    /// Sending a handle mints a ticket for the receiver: a local property is exported with it,
    /// a remote one's home is told (a toggle, on this worker's path there) that the receiver
    /// holds it.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error;
        let not_in_a_call = || S::Error::custom(codec::cannot_travel(codec::NOT_IN_A_CALL.into()));
        let Some(to) = codec::encoding_for() else {
            return Err(not_in_a_call());
        };
        let state = state::current().ok_or_else(not_in_a_call)?;
        if state.peers[to.rank as usize]
            .other_build
            .load(Ordering::Acquire)
        {
            return Err(S::Error::custom(codec::cannot_travel(format!(
                "a Trust<{}> cannot go to rank {}, which runs another build: export the \
                 property by name (gossamer::export) and look it up there (Node::lookup)",
                type_name::<T>(),
                to.rank
            ))));
        }
        let (ticket, holder) = (state.mint(), to);
        let wire = match &self.inner {
            Inner::Local(t) => {
                let worker = t.trustee();
                let export = Export::new(t.clone(), ticket, holder);
                let (slot, generation) = state
                    .exports(worker)
                    .insert(export)
                    .map_err(|e| S::Error::custom(codec::cannot_travel(e.to_string())))?;
                WireTrust {
                    home: state.rank,
                    incarnation: state.incarnation(state.rank),
                    worker: worker as u32,
                    slot,
                    generation,
                    fingerprint: fingerprint::<T>(),
                    ticket,
                }
            }
            Inner::Remote(remote, _) => {
                let t = remote.target;
                if !link::is_rack_worker() {
                    return Err(not_in_a_call());
                }
                let toggle = Control::Toggle {
                    slot: t.slot,
                    generation: t.generation,
                    ticket,
                    holder,
                };
                link::control(t.node, t.worker, t.incarnation, &toggle);
                if crate::durable::crash::at("handed-on") {
                    // What a death right here leaves: the toggle at home, the handle nowhere.
                    link::flush(t.node, t.worker);
                    crate::durable::crash::kill("handed-on");
                }
                WireTrust {
                    home: t.node,
                    incarnation: t.incarnation,
                    worker: t.worker,
                    slot: t.slot,
                    generation: t.generation,
                    fingerprint: fingerprint::<T>(),
                    ticket,
                }
            }
        };
        wire.serialize(serializer)
    }
}

impl<'de, T: Send + 'static> Deserialize<'de> for Trust<T> {
    /// A handle to a property of this node becomes local again (its ticket is released at
    /// once); any other becomes a remote handle holding the ticket.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WireTrust::deserialize(deserializer)?;
        Trust::from_wire::<D::Error>(wire)
    }
}

/// A handle decoded unless the life of its home rank it belongs to is over (the rank
/// restarted since it was sent): then `None`, and nothing is released, since that life's
/// export table went with it. A `Durable` carries its live property this way, and finds it
/// again by name when it is gone.
pub(crate) struct UnlessGone<T: Send + 'static>(pub(crate) Option<Trust<T>>);

impl<'de, T: Send + 'static> Deserialize<'de> for UnlessGone<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WireTrust::deserialize(deserializer)?;
        let state = state::current().filter(|_| codec::decoding());
        let gone = state.is_some_and(|state| {
            (wire.home as usize) < state.workers.len()
                && wire.incarnation < state.incarnation(wire.home)
        });
        if gone {
            return Ok(UnlessGone(None));
        }
        Trust::from_wire::<D::Error>(wire).map(|t| UnlessGone(Some(t)))
    }
}

impl<T: Send + 'static> Trust<T> {
    /// The handle `wire` names, checked against this node's rack.
    fn from_wire<E: serde::de::Error>(wire: WireTrust) -> Result<Self, E> {
        if !codec::decoding() {
            return Err(E::custom(codec::NOT_IN_A_CALL));
        }
        let state = state::current().ok_or_else(|| E::custom(codec::NOT_IN_A_CALL))?;
        let valid = (wire.home as usize) < state.workers.len()
            && wire.worker < state.workers[wire.home as usize];
        if !valid {
            return Err(E::custom(format!(
                "a handle to rank {} worker {}, which this job does not have",
                wire.home, wire.worker
            )));
        }
        let target = Target {
            node: wire.home,
            worker: wire.worker,
            slot: wire.slot,
            generation: wire.generation,
            incarnation: wire.incarnation,
        };
        if wire.home != state.rank {
            if wire.fingerprint != fingerprint::<T>() {
                drop(Remote::mistyped(
                    target,
                    wire.ticket,
                    call::marker_op::<T>(),
                )); // releases the ticket
                return Err(E::custom(format!(
                    "type mismatch: a handle whose property is not a {}",
                    type_name::<T>()
                )));
            }
            let remote = Remote::new(target, wire.ticket, call::marker_op::<T>());
            return Ok(Trust {
                inner: Inner::Remote(Arc::new(remote), PhantomData),
            });
        }
        if wire.incarnation != state.incarnation(state.rank) {
            return Err(E::custom(format!(
                "a handle to a property of incarnation {} of this rank, which is gone: the \
                 rank restarted since",
                wire.incarnation
            )));
        }
        let worker = wire.worker as usize;
        let local = {
            let table = state.exports(worker);
            let export = table
                .get(wire.slot, wire.generation)
                .map_err(|e| E::custom(e.to_string()))?;
            export
                .shared
                .property
                .downcast_ref::<trust::Trust<T>>()
                .cloned()
        };
        let gone = state
            .exports(worker)
            .release(wire.slot, wire.generation, wire.ticket)
            .map_err(|e| E::custom(e.to_string()))?;
        drop(gone); // outside the lock: dropping a property runs user code
        match local {
            Some(t) => Ok(Trust::local_handle(t)),
            None => Err(E::custom(format!(
                "type mismatch: a handle whose property is not a {}",
                type_name::<T>()
            ))),
        }
    }
}

/// Places a property built by `C` from `argument` on worker `worker` of node `node`.
#[track_caller]
pub(crate) fn entrust_remote<T, A, C>(node: u32, worker: u32, argument: A) -> Trust<T>
where
    T: Send + 'static,
    A: Wire,
    C: FnOnce(A) -> T + Send + 'static,
{
    if !link::is_rack_worker() {
        return on_rack(move || entrust_remote::<T, A, C>(node, worker, argument));
    }
    if trust::in_delegated_context() {
        panic!("{BLOCKING}");
    }
    // The life of the node the property is placed in: the one up now.
    let life = state::current()
        .expect("a remote trust outlived its rack")
        .life(node);
    let incarnation = life.incarnation;
    let bytes = codec::encode(life, &argument);
    let op = EntrustOp::<T, A, C>::OP;
    let (slot, generation, ticket): (u32, u32, Ticket) = wait_for(|on_answer| {
        link::call(
            node,
            worker,
            Some(incarnation),
            op,
            None,
            bytes.as_slice(),
            on_answer,
        )
    });
    Trust::remote(
        Target {
            node,
            worker,
            slot,
            generation,
            incarnation,
        },
        ticket,
    )
}

/// [`Trust::try_apply_then_with`] (and `apply_then_with`) through a moved property's forward.
/// Out of line, as the other forwarded calls: the common paths stay small enough to inline.
#[cold]
#[inline(never)]
fn try_then_moved<T, A, R, F, Then>(
    moved: &Arc<Moved<T>>,
    first: &trust::Trust<T>,
    f: F,
    argument: A,
    then: Then,
) where
    T: Send + 'static,
    F: FnOnce(&mut T, A) -> R + Send + 'static,
    A: Wire,
    R: Wire,
    Then: FnOnce(Result<R, call::Failure>) + 'static,
{
    Trust::forward(moved, first, move |at| {
        at.try_apply_then_with(f, argument, then)
    })
}

/// Refuses an `apply_then` call where no worker would run its callback (as `trust` does).
#[track_caller]
pub(crate) fn refuse_then_outside_workers() {
    if trust::current_worker().is_none() {
        panic!(
            "apply_then called outside a runtime worker (on a plain thread or in another \
             executor's task), where nothing would run its callback: use apply to wait for the \
             result, or apply_async to await it"
        );
    }
}
