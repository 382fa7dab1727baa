//! Calling functions by name: [`named`] and [`named_fn`] make a caller's handle to a name,
//! [`Trust::apply_named`] and [`Node::spawn_named`] call it, and [`Function::apply`] and
//! [`Function::free`] make the registrations that `#[gossamer::function]` and
//! [`Rack::function`](crate::Rack::function) add. See `function` for the protocol.
//!
//! ```
//! use serde::{Deserialize, Serialize};
//!
//! #[gossamer::stable_type("doc.Table/1")]
//! #[derive(Default)]
//! struct Table {
//!     rows: Vec<(u64, String)>,
//! }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Put {
//!     key: u64,
//!     value: String,
//! }
//!
//! #[gossamer::function("doc.put")]
//! fn put(t: &mut Table, p: Put) -> usize {
//!     t.rows.push((p.key, p.value));
//!     t.rows.len()
//! }
//!
//! let code = gossamer::Rack::from_env().run(|| {
//!     let put = gossamer::named::<Table, Put, usize>("doc.put").unwrap();
//!     let table = gossamer::this_node().entrust_with(|()| Table::default(), ());
//!     let rows = table.apply_named(&put, Put { key: 1, value: "one".into() });
//!     assert_eq!(rows, Ok(1));
//!     // A name the node does not have is an error, never a call.
//!     let typo = gossamer::named::<Table, Put, usize>("doc.putt").unwrap();
//!     let err = table.apply_named(&typo, Put { key: 2, value: "two".into() }).unwrap_err();
//!     assert!(err.to_string().contains("(it has doc.put)"), "{err}");
//! });
//! assert_eq!(code, std::process::ExitCode::SUCCESS);
//! ```

use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::call::{self, AnswerCell, ApplyOp, SpawnOp, on_rack, wait_for_named};
use crate::capture_free::{check, conjure};
use crate::codec::{self, Wire};
use crate::export::{Export, Life, Target, Ticket};
use crate::function::{Function, Interned, Local, NamedError, Signature, StableType, intern};
use crate::link;
use crate::node::{Node, RemoteJoinHandle};
use crate::op::Run;
use crate::proxy::{ApplyFuture, BLOCKING, Placement, Trust};
use crate::state::{self, Published};

use serde::{Deserialize, Serialize};

/// A caller's handle to the function `name` of type `fn(&mut T, A) -> R`, made by [`named`].
/// Make it once and keep it: making one traces the types' serde shapes.
pub struct Named<T, A, R> {
    name: Arc<Interned>,
    _types: PhantomData<fn(&mut T, A) -> R>,
}

/// A caller's handle to the function `name` of type `fn(A) -> R`, made by [`named_fn`].
pub struct NamedFn<A, R> {
    name: Arc<Interned>,
    _types: PhantomData<fn(A) -> R>,
}

impl<T, A, R> Clone for Named<T, A, R> {
    fn clone(&self) -> Self {
        Named {
            name: self.name.clone(),
            _types: PhantomData,
        }
    }
}

impl<A, R> Clone for NamedFn<A, R> {
    fn clone(&self) -> Self {
        NamedFn {
            name: self.name.clone(),
            _types: PhantomData,
        }
    }
}

impl<T, A, R> fmt::Debug for Named<T, A, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Named({:?}: {})", self.name.name, self.name.ours)
    }
}

impl<A, R> fmt::Debug for NamedFn<A, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NamedFn({:?}: {})", self.name.name, self.name.ours)
    }
}

impl<T, A, R> Named<T, A, R> {
    /// The name.
    pub fn name(&self) -> &str {
        &self.name.name
    }

    /// The signature the calls expect.
    pub fn signature(&self) -> &Signature {
        &self.name.ours
    }
}

impl<A, R> NamedFn<A, R> {
    /// The name.
    pub fn name(&self) -> &str {
        &self.name.name
    }

    /// The signature the calls expect.
    pub fn signature(&self) -> &Signature {
        &self.name.ours
    }
}

/// The function `name` that applies to a `T`, taking an `A` and returning an `R`, wherever it
/// is registered: the node that runs a call checks that its function of that name has this
/// signature. Fails only for a name that cannot be one.
pub fn named<T, A, R>(name: &str) -> Result<Named<T, A, R>, NamedError>
where
    T: StableType + Send,
    A: Wire,
    R: Wire,
{
    Ok(Named {
        name: interned(name, Signature::apply::<T, A, R>)?,
        _types: PhantomData,
    })
}

/// The function `name` that takes an `A` and returns an `R`, with no property; see [`named`].
pub fn named_fn<A: Wire, R: Wire>(name: &str) -> Result<NamedFn<A, R>, NamedError> {
    Ok(NamedFn {
        name: interned(name, Signature::free::<A, R>)?,
        _types: PhantomData,
    })
}

fn interned(name: &str, signature: fn() -> Signature) -> Result<Arc<Interned>, NamedError> {
    if !crate::function::valid_name(name) {
        return Err(NamedError::BadName {
            name: name.to_owned(),
        });
    }
    Ok(intern(name, signature()))
}

impl Function {
    /// A function `fn(&mut T, A) -> R` under `name`, applied to properties of type `T`; what
    /// `#[gossamer::function]` registers for a function of two arguments. `f` captures
    /// nothing (checked at compile time).
    pub const fn apply<T, A, R, F>(name: &'static str, f: F) -> Function
    where
        T: StableType + Send,
        A: Wire,
        R: Wire,
        F: Fn(&mut T, A) -> R + Copy + Send + 'static,
    {
        check!(F);
        let _ = f; // a value of a zero-sized, `Copy` type: the type is the function
        Function {
            name,
            code: std::any::type_name::<F>,
            signature: Signature::apply::<T, A, R>,
            run: Run::Apply(ApplyOp::<T, A, R, F>::run),
            local: Local::Apply(apply_here::<T, A, R, F>),
        }
    }

    /// A function `fn(A) -> R` under `name`, run in a fiber of the node it is spawned on; what
    /// `#[gossamer::function]` registers for a function of one argument.
    pub const fn free<A, R, F>(name: &'static str, f: F) -> Function
    where
        A: Wire,
        R: Wire,
        F: Fn(A) -> R + Copy + Send + 'static,
    {
        check!(F);
        let _ = f; // a value of a zero-sized, `Copy` type: the type is the function
        Function {
            name,
            code: std::any::type_name::<F>,
            signature: Signature::free::<A, R>,
            run: Run::Free(SpawnOp::<A, R, F>::run),
            local: Local::Free(run_here::<A, R, F>),
        }
    }
}

/// [`Local::Apply`] of `F`.
fn apply_here<T: 'static, A: 'static, R: 'static, F: Fn(&mut T, A) -> R>(
    property: &mut dyn Any,
    io: &mut dyn Any,
) -> bool {
    let (Some(t), Some((a, r))) = (
        property.downcast_mut::<T>(),
        io.downcast_mut::<(Option<A>, Option<R>)>(),
    ) else {
        return false;
    };
    let Some(a) = a.take() else { return false };
    *r = Some(conjure::<F>()(t, a));
    true
}

/// [`Local::Free`] of `F`.
fn run_here<A: 'static, R: 'static, F: Fn(A) -> R>(io: &mut dyn Any) -> bool {
    let Some((a, r)) = io.downcast_mut::<(Option<A>, Option<R>)>() else {
        return false;
    };
    let Some(a) = a.take() else { return false };
    *r = Some(conjure::<F>()(a));
    true
}

/// This node's function `name`, if it has the caller's signature.
#[track_caller]
fn here(name: &Interned) -> Result<Function, NamedError> {
    let state = state::current().expect("a named call outside a rack");
    state.functions.resolve(&name.name, &name.ours, state.rank)
}

/// The error of a function found with the caller's fingerprint but other Rust types: the
/// shapes agree, so a call from another build would run, but this build has two types of one
/// stable name and shape, and the local call does not convert between them.
fn other_types(name: &Interned, function: &Function) -> NamedError {
    let state = state::current().expect("a named call outside a rack");
    NamedError::SignatureMismatch {
        name: name.name.to_string(),
        node: state.rank,
        ours: Box::new(name.ours.clone()),
        theirs: Box::new((function.signature)()),
    }
}

/// Runs `function` (this node's, resolved) on a property of this node.
fn apply_local<T: 'static, A: 'static, R: 'static>(
    name: &Interned,
    function: &Function,
    t: &mut T,
    argument: A,
) -> Result<R, NamedError> {
    let Local::Apply(run) = function.local else {
        return Err(other_types(name, function));
    };
    let mut io = (Some(argument), None::<R>);
    match run(t, &mut io) {
        true => Ok(io.1.expect("the function ran")),
        false => Err(other_types(name, function)),
    }
}

impl<T: Send + 'static> Trust<T> {
    /// Applies the function `f` names to the property with `argument`, wherever the property
    /// is, and returns its result; the calling fiber waits, as for
    /// [`apply_with`](Trust::apply_with). The node that runs it may be of another build
    /// (see `GSM_MIXED_BUILDS` in [`env`](crate::env)).
    ///
    /// # Errors
    /// [`NamedError`] when the property's node has no function of that name, or one with
    /// another signature: then nothing ran. A panic of the function is raised here, naming
    /// the node, as for `apply_with`.
    #[track_caller]
    pub fn apply_named<A: Wire, R: Wire>(
        &self,
        f: &Named<T, A, R>,
        argument: A,
    ) -> Result<R, NamedError> {
        match self.placement() {
            Placement::Local(t) => {
                let function = here(&f.name)?;
                let name = f.name.clone();
                t.apply(move |t| apply_local(&name, &function, t, argument))
            }
            Placement::Moved(m, first) => Trust::forwarded(&m, first).apply_named(f, argument),
            Placement::ViaFiber | Placement::Remote(_) if !link::is_rack_worker() => {
                let (this, f) = (self.clone(), f.clone());
                on_rack(move || this.apply_named(&f, argument))
            }
            Placement::ViaFiber => unreachable!("only a thread off the rack's workers"),
            Placement::Remote(t) => {
                if trust::in_delegated_context() {
                    panic!("{BLOCKING}");
                }
                let bytes = codec::encode(t.life(), &argument);
                let property = Some((t.slot, t.generation));
                wait_for_named(|on_answer| {
                    let life = Some(t.incarnation);
                    link::call_named(
                        t.node,
                        t.worker,
                        life,
                        &f.name,
                        property,
                        bytes.as_slice(),
                        on_answer,
                    )
                })
            }
        }
    }

    /// [`apply_named`](Trust::apply_named) without waiting: `then(result)` runs later on the
    /// calling worker, in delegated context, as for [`apply_then_with`](Trust::apply_then_with).
    ///
    /// # Panics
    /// Outside the workers, as [`apply_then_with`](Trust::apply_then_with).
    #[track_caller]
    pub fn apply_then_named<A, R, Then>(&self, f: &Named<T, A, R>, argument: A, then: Then)
    where
        A: Wire,
        R: Wire,
        Then: FnOnce(Result<R, NamedError>) + 'static,
    {
        match self.placement() {
            Placement::Local(t) => {
                crate::proxy::refuse_then_outside_workers();
                let name = f.name.clone();
                let result = here(&f.name);
                t.apply_then(
                    move |t| result.and_then(|function| apply_local(&name, &function, t, argument)),
                    then,
                )
            }
            Placement::Remote(t) if link::is_rack_worker() => {
                let bytes = codec::encode(t.life(), &argument);
                let on_answer: link::OnAnswer = Box::new(move |outcome| {
                    // The deferred closure carries the value, and a box only on failure: a
                    // `NamedError` is large, and every answer would move it.
                    let result = match call::decode_named_answer::<R>(outcome) {
                        Ok(Ok(r)) => Ok(r),
                        Ok(Err(named)) => Err(Box::new(Ok(named))),
                        Err(failure) => Err(Box::new(Err(failure))),
                    };
                    trust::defer(move || {
                        then(result.or_else(|e| match *e {
                            Ok(named) => Err(named),
                            Err(failure) => call::raise(failure),
                        }))
                    });
                });
                let (life, property) = (Some(t.incarnation), Some((t.slot, t.generation)));
                link::call_named(
                    t.node,
                    t.worker,
                    life,
                    &f.name,
                    property,
                    bytes.as_slice(),
                    on_answer,
                )
            }
            Placement::Moved(m, first) => {
                let f = f.clone();
                Trust::forward(&m, first, move |at| at.apply_then_named(&f, argument, then))
            }
            // A rack's workers are the runtime's: only a foreign thread comes this way.
            Placement::Remote(_) | Placement::ViaFiber => {
                crate::proxy::refuse_then_outside_workers();
                then(self.apply_named(f, argument))
            }
        }
    }

    /// [`apply_named`](Trust::apply_named) as a future, for any executor or thread.
    pub fn apply_named_async<A: Wire, R: Wire>(
        &self,
        f: &Named<T, A, R>,
        argument: A,
    ) -> ApplyFuture<Result<R, NamedError>> {
        let (this, f) = (self.clone(), f.clone());
        match self.placement() {
            // As `apply_async_with`: with several ranks, through a fiber.
            Placement::Local(t) if !state::several_ranks() => {
                let result = here(&f.name);
                ApplyFuture::local(t.apply_async(move |t| {
                    result.and_then(|function| apply_local(&f.name, &function, t, argument))
                }))
            }
            Placement::Local(_)
            | Placement::Remote(_)
            | Placement::Moved(..)
            | Placement::ViaFiber => {
                let state = state::current().expect("a remote trust outlived its rack");
                ApplyFuture::fiber(state.handle.spawn(move || this.apply_named(&f, argument)))
            }
        }
    }
}

impl Node {
    /// Starts the function `f` names on this node in a fiber, with `argument`; the handle
    /// joins it. As [`spawn_on`](crate::spawn_on), for a function by name.
    ///
    /// # Errors
    /// The handle's result is [`NamedError`] when the node has no function of that name, or
    /// one with another signature: then nothing ran.
    #[track_caller]
    pub fn spawn_named<A: Wire, R: Wire>(
        self,
        f: &NamedFn<A, R>,
        argument: A,
    ) -> RemoteJoinHandle<Result<R, NamedError>> {
        let state = state::current().expect("a named call outside a rack");
        if self.rank() == state.rank {
            let f = f.clone();
            return RemoteJoinHandle::local(
                self.rank(),
                state.handle.spawn(move || {
                    let function = here(&f.name)?;
                    let Local::Free(run) = function.local else {
                        return Err(other_types(&f.name, &function));
                    };
                    let mut io = (Some(argument), None::<R>);
                    match run(&mut io) {
                        true => Ok(io.1.expect("the function ran")),
                        false => Err(other_types(&f.name, &function)),
                    }
                }),
            );
        }
        if !link::is_rack_worker() {
            let f = f.clone();
            return on_rack(move || self.spawn_named(&f, argument));
        }
        let bytes = codec::encode(state.life(self.rank()), &argument);
        let worker = state.next_trustee(self.rank());
        let cell = AnswerCell::new();
        link::call_named(
            self.rank(),
            worker,
            None,
            &f.name,
            None,
            bytes.as_slice(),
            cell.on_named_answer(),
        );
        RemoteJoinHandle::remote(self.rank(), cell)
    }
}

/// Makes the property `t`, which lives on this node, reachable by `name` from every node of
/// the job, whatever build it runs: [`Node::lookup`] returns a handle to it. The export keeps
/// the property alive until [`unexport`] or the end of the job.
///
/// ```
/// #[gossamer::stable_type("doc.Counter/1")]
/// struct Counter(u64);
///
/// #[gossamer::function("doc.add")]
/// fn add(c: &mut Counter, x: u64) -> u64 {
///     c.0 += x;
///     c.0
/// }
///
/// let code = gossamer::Rack::from_env().run(|| {
///     let here = gossamer::this_node();
///     gossamer::export("counters/0", &gossamer::entrust(Counter(0))).unwrap();
///     // On any node, of any build (here: the same one):
///     let counter = here.lookup::<Counter>("counters/0").unwrap();
///     let add = gossamer::named::<Counter, u64, u64>("doc.add").unwrap();
///     assert_eq!(counter.apply_named(&add, 5), Ok(5));
///     assert!(here.lookup::<Counter>("counters/1").is_err());
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
///
/// # Errors
/// [`NamedError::NameTaken`] if this node exports another property under `name`,
/// [`NamedError::NotOnThisNode`] for a handle to a property of another node,
/// [`NamedError::BadName`] for a name that cannot be one.
#[track_caller]
pub fn export<T: StableType + Send>(name: &str, t: &Trust<T>) -> Result<(), NamedError> {
    if !crate::function::valid_name(name) {
        return Err(NamedError::BadName {
            name: name.to_owned(),
        });
    }
    let Some(local) = t.local() else {
        return Err(NamedError::NotOnThisNode {
            name: name.to_owned(),
            node: t.node().rank(),
        });
    };
    let state = state::current().expect("gossamer::export outside a rack");
    let mut directory = state.directory.lock().unwrap_or_else(|p| p.into_inner());
    if directory.contains_key(name) {
        return Err(NamedError::NameTaken {
            name: name.to_owned(),
        });
    }
    let published = Published {
        stable: T::STABLE_NAME,
        worker: local.trustee(),
        property: Export::of(local.clone()),
    };
    directory.insert(name.to_owned(), published);
    Ok(())
}

/// Ends the export of `name` on this node (handles already looked up keep working); whether
/// there was one.
#[track_caller]
pub fn unexport(name: &str) -> bool {
    let state = state::current().expect("gossamer::unexport outside a rack");
    let removed = state
        .directory
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(name);
    // Dropped outside the lock: dropping the last share of a property runs user code.
    removed.is_some()
}

/// What a lookup asks the property's node.
#[derive(Serialize, Deserialize)]
struct Lookup {
    name: String,
    /// The stable type name the caller expects.
    stable: String,
    /// The caller's life, which holds the handle's ticket.
    caller: Life,
}

/// A property of this node handed to another by a named function: where it is, and the
/// caller's ticket to it.
#[derive(Serialize, Deserialize)]
pub(crate) struct Found {
    incarnation: u32,
    worker: u32,
    slot: u32,
    generation: u32,
    ticket: Ticket,
}

impl Found {
    /// Exports `property` (trustee `worker`, no tickets yet) again under a ticket for
    /// `caller`. If that life was lost meanwhile, nothing is exported and this panics: the
    /// panic is the answer, which goes nowhere.
    pub(crate) fn export_for(caller: Life, worker: usize, property: &Export) -> Found {
        let state = state::current().expect("an export outside a rack");
        assert!(
            (caller.rank as usize) < state.peers.len(),
            "a handle for rank {}, which this job does not have",
            caller.rank
        );
        let ticket = state.mint();
        let export = property.with_ticket(ticket, caller);
        let (slot, generation) = state
            .exports(worker)
            .insert(export)
            .unwrap_or_else(|e| panic!("{e}"));
        Found {
            incarnation: state.incarnation(state.rank),
            worker: worker as u32,
            slot,
            generation,
            ticket,
        }
    }

    /// The handle on the caller's side, for a property on `node`.
    pub(crate) fn into_trust<T: Send + 'static>(self, node: Node) -> Trust<T> {
        let target = Target {
            node: node.rank(),
            worker: self.worker,
            slot: self.slot,
            generation: self.generation,
            incarnation: self.incarnation,
        };
        Trust::remote(target, self.ticket)
    }
}

/// The name of the function every node has that answers lookups.
const LOOKUP: &str = "gossamer.lookup";

/// The functions every node has, beside the program's own.
pub(crate) fn builtins() -> [Function; 1] {
    [Function::free(LOOKUP, lookup_here)]
}

/// Answers a lookup on the property's node: exports the property again under a ticket minted
/// for the caller.
fn lookup_here(lookup: Lookup) -> Result<Found, NamedError> {
    let state = state::current().expect("a lookup outside a rack");
    let directory = state.directory.lock().unwrap_or_else(|p| p.into_inner());
    let Some(published) = directory.get(&lookup.name) else {
        return Err(NamedError::NoSuchProperty {
            similar: crate::function::similar(&lookup.name, directory.keys().map(String::as_str)),
            name: lookup.name,
            node: state.rank,
        });
    };
    if published.stable != lookup.stable {
        return Err(NamedError::PropertyType {
            name: lookup.name,
            node: state.rank,
            ours: lookup.stable,
            theirs: published.stable.to_owned(),
        });
    }
    Ok(Found::export_for(
        lookup.caller,
        published.worker,
        &published.property,
    ))
}

impl Node {
    /// A handle to the property this node exported under `name` ([`export`]), checked to be a
    /// `T` by its stable type name. Works across builds (see `GSM_MIXED_BUILDS` in
    /// [`env`](crate::env)): only named calls reach the property then.
    ///
    /// # Errors
    /// [`NamedError::NoSuchProperty`] or [`NamedError::PropertyType`].
    #[track_caller]
    pub fn lookup<T: StableType + Send>(self, name: &str) -> Result<Trust<T>, NamedError> {
        let state = state::current().expect("Node::lookup outside a rack");
        if self.rank() == state.rank {
            let directory = state.directory.lock().unwrap_or_else(|p| p.into_inner());
            let Some(published) = directory.get(name) else {
                return Err(NamedError::NoSuchProperty {
                    name: name.to_owned(),
                    node: state.rank,
                    similar: crate::function::similar(name, directory.keys().map(String::as_str)),
                });
            };
            let local = published
                .property
                .shared
                .property
                .downcast_ref::<trust::Trust<T>>()
                .filter(|_| published.stable == T::STABLE_NAME);
            return match local {
                Some(t) => Ok(Trust::local_handle(t.clone())),
                None => Err(NamedError::PropertyType {
                    name: name.to_owned(),
                    node: state.rank,
                    ours: T::STABLE_NAME.to_owned(),
                    theirs: published.stable.to_owned(),
                }),
            };
        }
        let lookup = named_fn::<Lookup, Result<Found, NamedError>>(LOOKUP)?;
        let ask = Lookup {
            name: name.to_owned(),
            stable: T::STABLE_NAME.to_owned(),
            caller: state.life(state.rank),
        };
        let found = self.spawn_named(&lookup, ask).join()??;
        Ok(found.into_trust(self))
    }
}
