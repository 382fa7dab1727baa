//! Packages across nodes: the first call ships the package, the id after.
//!
//! Every node has four built-in named functions (so this works between builds too):
//! `gossamer.package.load` verifies and loads a package sent whole, `gossamer.package.new`
//! builds a state of a loaded package into a property for the caller, `gossamer.package.apply`
//! runs a method on such a property, and `gossamer.package.call` runs a function. A node that
//! has not loaded an id answers [`PackageError::Missing`]. A method call, the hot path, has a
//! trampoline of its own: its argument bytes go to the package and the package's output
//! bytes to the caller as they are, with no second encoding either way.
//!
//! The caller remembers, per process, which lives of which ranks acknowledged which ids. Its
//! first call to a node sends the package; calls that come meanwhile wait for that load
//! rather than send it again; later calls name the id. A rank that restarted is a new life,
//! which gets the package again; a `Missing` answer (the node lost it some other way) makes
//! the caller send it again and retry once. A state is bound to the package that built it,
//! so its methods run that version however many versions the node has loaded since.

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

use serde::{Deserialize, Serialize};

use super::file::{ExportKind, Package, PackageId};
use super::load::{self, Failed};
use super::{PackageError, policy};
use crate::call::{self, Failure};
use crate::codec::{self, Encoded, Wire};
use crate::export::{Export, Life, Shared};
use crate::function::{Function, Interned, Local, NamedError, Signature, StableType, intern};
use crate::link;
use crate::named::{Found, NamedFn, named_fn};
use crate::node::Node;
use crate::op::{self, Reply, Run};
use crate::proxy::{BLOCKING, Placement, Trust};
use crate::state;

/// A package's state as a property: what `gossamer.package.apply` runs methods on.
#[derive(Debug)]
pub(crate) struct PkgState(load::State);

impl StableType for PkgState {
    const STABLE_NAME: &'static str = "gossamer.PackageState/1";
}

impl PkgState {
    /// Runs method `index` on `arg` for a caller on this node; returns its output.
    fn call_local(&mut self, index: u32, arg: &[u8], rank: u32) -> Result<Vec<u8>, Failed> {
        let mut out = Vec::new();
        self.0.call(index as usize, arg, rank, &mut out)?;
        Ok(out)
    }
}

const LOAD: &str = "gossamer.package.load";
const NEW: &str = "gossamer.package.new";
const APPLY: &str = "gossamer.package.apply";
const CALL: &str = "gossamer.package.call";

/// A package sent whole, with the id the caller computed.
#[derive(Serialize, Deserialize)]
struct Ship {
    id: PackageId,
    #[serde(with = "serde_bytes")]
    file: Vec<u8>,
}

/// Build state export `export` of package `id` from `arg`, for `caller`.
#[derive(Serialize, Deserialize)]
struct NewState {
    id: PackageId,
    export: u32,
    #[serde(with = "serde_bytes")]
    arg: Vec<u8>,
    /// The caller's life, which holds the handle's ticket.
    caller: Life,
}

/// Run export `export` of package `id` (a method: the state's package) on `arg`.
#[derive(Serialize, Deserialize)]
struct Call {
    id: PackageId,
    export: u32,
    #[serde(with = "serde_bytes")]
    arg: Vec<u8>,
}

/// The functions every node has for packages.
pub(crate) fn builtins() -> [Function; 4] {
    [
        Function::free(LOAD, load_here),
        Function::free(NEW, new_here),
        method_function(),
        Function::free(CALL, call_here),
    ]
}

/// `gossamer.package.apply`: a method call whose bytes go to the package as they came. Its
/// argument is the export's index (a postcard varint) followed by the method's argument, its
/// answer the method's output: neither is encoded twice. So it has its own trampoline rather
/// than one `Function::apply` makes; the signature names the bytes it carries.
fn method_function() -> Function {
    Function {
        name: APPLY,
        code: || "gossamer::package::method",
        signature: method_signature,
        run: Run::Apply(apply_method),
        // Calls on this node's states never go by name: `PkgTrust` calls the state itself.
        local: Local::Apply(|_, _| false),
    }
}

fn method_signature() -> Signature {
    Signature::apply::<PkgState, (u32, serde_bytes::ByteBuf), serde_bytes::ByteBuf>()
}

/// The trampoline of `gossamer.package.apply` (see [`method_function`]).
fn apply_method(export: &Shared, arg: &[u8], reply: Reply) {
    let Some(trust) = op::property::<trust::Trust<PkgState>>(export) else {
        let why = op::type_mismatch(|| APPLY, "package state", export);
        return reply.refuse(why);
    };
    let (index, rest) = match postcard::take_from_bytes::<u32>(arg) {
        Ok(split) => split,
        Err(e) => return reply.refuse(format!("a package method call without an index: {e}")),
    };
    let rank = reply.rank();
    // On the trustee's own worker (the common case), the method runs here, on the frame's
    // bytes, and is answered in this round (see `Trust::try_apply_inline`).
    let here = trust.try_apply_inline(|state| {
        let mut out = buffer();
        let result = state.0.call(index as usize, rest, rank, &mut out);
        let result = result.map(|()| Encoded::take_from(&mut out));
        give_back(out);
        result
    });
    if let Ok(result) = here {
        return answer_method(reply, result);
    }
    // Otherwise the argument outlives the frame it came in, so it is copied. It and the
    // output go in buffers the trustee's thread reuses, given back as soon as the call ran.
    let mut copy = buffer();
    copy.extend_from_slice(rest);
    trust.apply_then(
        move |state| {
            let mut out = buffer();
            let result = state.0.call(index as usize, &copy, rank, &mut out);
            let result = result.map(|()| Encoded::take_from(&mut out));
            give_back(copy);
            give_back(out);
            result
        },
        move |result| answer_method(reply, result),
    );
}

/// Answers a package method call with its output or why it failed.
fn answer_method(reply: Reply, result: Result<Encoded, Failed>) {
    match result {
        Ok(bytes) => reply.ok_encoded(bytes),
        Err(Failed::Panicked(message)) => reply.panicked(&message),
        Err(Failed::BadArgument(why)) => reply.refuse(why),
    }
}

/// Buffers a thread keeps for method calls (see [`apply_method`]).
const KEPT_BUFFERS: usize = 4;
/// The largest buffer kept; a larger one goes back to the allocator.
const KEPT_BYTES: usize = 2 << 20;

thread_local! {
    static BUFFERS: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An empty buffer, reused if this worker kept one.
fn buffer() -> Vec<u8> {
    BUFFERS.with_borrow_mut(Vec::pop).unwrap_or_default()
}

/// Keeps `buf` for a later [`buffer`], if there is room and it is not too large.
fn give_back(mut buf: Vec<u8>) {
    if buf.capacity() == 0 || buf.capacity() > KEPT_BYTES {
        return;
    }
    buf.clear();
    BUFFERS.with_borrow_mut(|kept| {
        if kept.len() < KEPT_BUFFERS {
            kept.push(buf);
        }
    });
}

/// This process's handle to `gossamer.package.apply`.
fn method_name() -> Arc<Interned> {
    static NAME: std::sync::OnceLock<Arc<Interned>> = std::sync::OnceLock::new();
    NAME.get_or_init(|| intern(APPLY, method_signature()))
        .clone()
}

/// The answer to a method call: the method's output as `R`; a refusal is the package's
/// (its argument did not decode there).
fn decode_method<R: Wire>(outcome: link::Outcome<'_>) -> Result<Result<R, PackageError>, Failure> {
    match outcome {
        link::Outcome::Ok(bytes) => Ok(decode(bytes)),
        link::Outcome::Refused(why) => Ok(Err(PackageError::BadArgument(why))),
        link::Outcome::Unresolved(bytes) => {
            let e: NamedError = codec::decode_value(bytes)
                .map_err(|e| Failure::Refused(format!("an undecodable refusal: {e}")))?;
            Ok(Err(unresolved(e)))
        }
        link::Outcome::Panicked(message) => Err(Failure::Panicked(message)),
        link::Outcome::Lost(why) => Err(Failure::Lost(why)),
    }
}

fn rank() -> u32 {
    state::current()
        .expect("a package call outside a rack")
        .rank
}

/// A failed call into a package: a panic goes on as a panic (the caller's runtime raises it,
/// naming this node), a bad argument is an error.
fn failed(f: Failed) -> PackageError {
    match f {
        Failed::Panicked(message) => panic!("{message}"),
        Failed::BadArgument(why) => PackageError::BadArgument(why),
    }
}

fn load_here(ship: Ship) -> Result<PackageId, PackageError> {
    let package = Package::from_bytes(&ship.file)?;
    if package.id() != ship.id {
        return Err(PackageError::IdMismatch {
            expected: ship.id,
            found: package.id(),
        });
    }
    load::load(&package, &policy(), rank())?;
    Ok(package.id())
}

/// The loaded package `id`'s export `index`, if it is of the kind `fits` accepts.
fn export_of(
    id: PackageId,
    index: u32,
    fits: impl Fn(&ExportKind) -> bool,
) -> Result<(&'static load::Loaded, usize), PackageError> {
    let loaded = load::loaded(id).ok_or(PackageError::Missing(id))?;
    match loaded.exports.get(index as usize) {
        Some(e) if fits(&e.entry.kind) => Ok((loaded, index as usize)),
        _ => Err(PackageError::NoSuchExport {
            package: loaded.name.clone(),
            name: format!("#{index}"),
            has: loaded
                .exports
                .iter()
                .map(|e| e.entry.name.clone())
                .collect(),
        }),
    }
}

fn new_here(n: NewState) -> Result<Found, PackageError> {
    let (loaded, index) = export_of(n.id, n.export, |k| *k == ExportKind::State)?;
    let state = loaded.new_state(index, &n.arg, rank()).map_err(failed)?;
    let trust = trust::local_trustee().entrust(PkgState(state));
    let worker = trust.trustee();
    Ok(Found::export_for(n.caller, worker, &Export::of(trust)))
}

fn call_here(c: Call) -> Result<Vec<u8>, PackageError> {
    let (loaded, index) = export_of(c.id, c.export, |k| *k == ExportKind::Function)?;
    loaded.call_function(index, &c.arg, rank()).map_err(failed)
}

/// A named call that did not resolve: every node has these functions, so only a node of a
/// gossamer without packages says so.
fn unresolved(e: NamedError) -> PackageError {
    PackageError::Load(format!("the node cannot take packages: {e}"))
}

/// Where a package stands with one life of one rank, as this process knows.
enum Shipping {
    /// Sent, not yet acknowledged: these wait for the answer.
    Loading(Vec<Waker>),
    /// Acknowledged.
    Loaded,
}

/// Per (rank, incarnation, package): what this process sent there.
type Shipped = HashMap<(u32, u32, PackageId), Shipping>;

static SHIPPED: Mutex<Option<Shipped>> = Mutex::new(None);

fn shipped<R>(f: impl FnOnce(&mut Shipped) -> R) -> R {
    let mut s = SHIPPED.lock().unwrap_or_else(|p| p.into_inner());
    f(s.get_or_insert_with(HashMap::new))
}

/// Makes sure `node` has loaded `package`: sends it, unless it was acknowledged, or another
/// fiber of this process is sending it now (then waits for that).
fn ensure_loaded(node: Node, package: &Package) -> Result<(), PackageError> {
    let state = state::current().expect("a package call outside a rack");
    let key = (node.rank(), state.incarnation(node.rank()), package.id());
    let send = trust::block_on(std::future::poll_fn(|cx| {
        shipped(|s| match s.get_mut(&key) {
            Some(Shipping::Loaded) => Poll::Ready(false),
            Some(Shipping::Loading(waiters)) => {
                waiters.push(cx.waker().clone());
                Poll::Pending
            }
            None => {
                s.insert(key, Shipping::Loading(Vec::new()));
                Poll::Ready(true)
            }
        })
    }));
    if !send {
        return Ok(());
    }
    let result = ship(node, package);
    let waiters = shipped(|s| {
        let waiting = match result {
            Ok(()) => s.insert(key, Shipping::Loaded),
            Err(_) => s.remove(&key),
        };
        match waiting {
            Some(Shipping::Loading(w)) => w,
            _ => Vec::new(),
        }
    });
    for w in waiters {
        w.wake();
    }
    result
}

/// Sends `package` whole to `node` and waits until the node has loaded it (or refused it).
fn ship(node: Node, package: &Package) -> Result<(), PackageError> {
    let load: NamedFn<Ship, Result<PackageId, PackageError>> =
        named_fn(LOAD).expect("a valid name");
    let ship = Ship {
        id: package.id(),
        file: package.to_bytes(),
    };
    let result = node.spawn_named(&load, ship).join().map_err(unresolved);
    result.and_then(|r| r.map(|_| ()))
}

/// Forgets that `node` loaded `package` (it answered `Missing`).
fn forget(node: Node, package: PackageId) {
    let state = state::current().expect("a package call outside a rack");
    let key = (node.rank(), state.incarnation(node.rank()), package);
    shipped(|s| {
        if matches!(s.get(&key), Some(Shipping::Loaded)) {
            s.remove(&key);
        }
    });
}

/// Records that `node` acknowledged `package` without sending it, so that the next call names
/// the id: how a test reaches the `Missing` answer and the resend.
#[cfg(feature = "fuzzing")]
pub(crate) fn pretend_loaded(node: Node, package: PackageId) {
    let state = state::current().expect("a package call outside a rack");
    let key = (node.rank(), state.incarnation(node.rank()), package);
    shipped(|s| s.insert(key, Shipping::Loaded));
}

/// Runs `attempt` after making sure `node` has `package`; once more if the node answered
/// that it does not.
fn with_package<R>(
    node: Node,
    package: &Package,
    attempt: impl Fn() -> Result<R, PackageError>,
) -> Result<R, PackageError> {
    ensure_loaded(node, package)?;
    match attempt() {
        Err(PackageError::Missing(id)) if id == package.id() => {
            forget(node, id);
            ensure_loaded(node, package)?;
            attempt()
        }
        other => other,
    }
}

/// The kind of export a call looks for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wanted<'a> {
    /// A state type, to build one.
    State,
    /// A function.
    Function,
    /// A method of the state type named here.
    Method(&'a str),
}

impl Wanted<'_> {
    fn fits(self, kind: &ExportKind) -> bool {
        match (self, kind) {
            (Wanted::State, ExportKind::State) | (Wanted::Function, ExportKind::Function) => true,
            (Wanted::Method(wanted), ExportKind::Method { state }) => wanted == state,
            _ => false,
        }
    }
}

/// The index of `package`'s export `name` of the kind `wanted`, checked against the
/// fingerprint of the caller's types.
fn find_export(
    package: &Package,
    name: &str,
    wanted: Wanted<'_>,
    fingerprint: impl FnOnce() -> u64,
) -> Result<u32, PackageError> {
    let m = package.manifest();
    let Some(index) = m
        .exports
        .iter()
        .position(|e| e.name == name && wanted.fits(&e.kind))
    else {
        return Err(PackageError::NoSuchExport {
            package: m.name.clone(),
            name: name.to_owned(),
            has: m
                .exports
                .iter()
                .filter(|e| wanted.fits(&e.kind))
                .map(|e| e.name.clone())
                .collect(),
        });
    };
    let ours = fingerprint();
    let theirs = m.exports[index].fingerprint;
    if ours != theirs {
        return Err(PackageError::SignatureMismatch {
            export: name.to_owned(),
            ours,
            theirs,
        });
    }
    Ok(index as u32)
}

/// [`find_export`], remembered per thread for the (package, name, kind, argument, result) of
/// a call it found: the fingerprint traces types, far too slow to do per call. A refusal is
/// not remembered (it costs no tracing when the name is missing, and is rare otherwise).
fn cached_export<A: 'static, R: 'static>(
    package: &Package,
    name: &str,
    wanted: Wanted<'_>,
    fingerprint: impl FnOnce() -> u64,
) -> Result<u32, PackageError> {
    /// The kind as the cache keeps it: `None` for a function, a method's state's name.
    type Key = (PackageId, String, Option<String>, TypeId, TypeId);
    thread_local! {
        static KNOWN: std::cell::RefCell<Vec<(Key, u32)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    let state = match wanted {
        Wanted::Method(state) => Some(state),
        Wanted::Function => None,
        Wanted::State => unreachable!("state lookups are not cached"),
    };
    let (a, r) = (TypeId::of::<A>(), TypeId::of::<R>());
    let hit = KNOWN.with(|k| {
        k.borrow()
            .iter()
            .find(|((id, n, s, ka, kr), _)| {
                *id == package.id() && n == name && s.as_deref() == state && *ka == a && *kr == r
            })
            .map(|(_, index)| *index)
    });
    if let Some(index) = hit {
        return Ok(index);
    }
    let index = find_export(package, name, wanted, fingerprint)?;
    KNOWN.with(|k| {
        let key = (
            package.id(),
            name.to_owned(),
            state.map(str::to_owned),
            a,
            r,
        );
        k.borrow_mut().push((key, index))
    });
    Ok(index)
}

fn encode<A: Wire>(argument: &A) -> Result<Vec<u8>, PackageError> {
    postcard::to_allocvec(argument)
        .map_err(|e| PackageError::BadArgument(format!("the argument does not encode: {e}")))
}

fn decode<R: Wire>(bytes: &[u8]) -> Result<R, PackageError> {
    postcard::from_bytes(bytes)
        .map_err(|e| PackageError::BadArgument(format!("the result does not decode: {e}")))
}

/// A state of a code package, on a trustee of some node: what
/// [`Node::entrust_package`] returns. Its methods run the package that built it.
#[derive(Clone)]
pub struct PkgTrust {
    trust: Trust<PkgState>,
    package: Arc<Package>,
    state: String,
}

impl std::fmt::Debug for PkgTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PkgTrust")
            .field("package", &self.package)
            .field("state", &self.state)
            .field("node", &self.trust.node().rank())
            .finish()
    }
}

impl PkgTrust {
    /// Runs the state's method `name` with `argument` and waits for its result.
    ///
    /// # Errors
    /// [`PackageError::NoSuchExport`] or [`PackageError::SignatureMismatch`] before anything
    /// is sent; [`PackageError::BadArgument`] if the package could not decode it. A panic of
    /// the method is raised here, naming the node.
    pub fn call<A: Wire, R: Wire>(&self, name: &str, argument: A) -> Result<R, PackageError> {
        let export = self.method::<A, R>(name)?;
        match self.trust.placement() {
            Placement::Local(t) => {
                let arg = encode(&argument)?;
                let rank = rank();
                let out = t.apply(move |state| state.call_local(export, &arg, rank));
                decode(&out.map_err(failed)?)
            }
            Placement::Moved(..) => unreachable!("a package's state is not Wire: it never moves"),
            Placement::ViaFiber | Placement::Remote(_) if !link::is_rack_worker() => {
                let (this, name) = (self.clone(), name.to_owned());
                call::on_rack(move || this.call(&name, argument))
            }
            Placement::ViaFiber => unreachable!("only a thread off the rack's workers"),
            Placement::Remote(t) => {
                if trust::in_delegated_context() {
                    panic!("{BLOCKING}");
                }
                let bytes = codec::encode(t.life(), &(export, argument));
                let (life, property, name) = (
                    Some(t.incarnation),
                    Some((t.slot, t.generation)),
                    method_name(),
                );
                let result = call::wait_for_decoded(
                    |on_answer| {
                        link::call_named(
                            t.node,
                            t.worker,
                            life,
                            &name,
                            property,
                            bytes.as_slice(),
                            on_answer,
                        )
                    },
                    decode_method::<R>,
                );
                result.unwrap_or_else(|e| call::raise(e))
            }
        }
    }

    /// [`call`](PkgTrust::call) without waiting: `then(result)` runs later on this worker, in
    /// delegated context.
    pub fn call_then<A, R, Then>(&self, name: &str, argument: A, then: Then)
    where
        A: Wire,
        R: Wire,
        Then: FnOnce(Result<R, PackageError>) + 'static,
    {
        let export = match self.method::<A, R>(name) {
            Ok(export) => export,
            Err(e) => return then(Err(e)),
        };
        match self.trust.placement() {
            Placement::Local(t) => {
                let arg = match encode(&argument) {
                    Ok(arg) => arg,
                    Err(e) => return then(Err(e)),
                };
                let rank = rank();
                t.apply_then(
                    move |state| state.call_local(export, &arg, rank),
                    move |out| then(out.map_err(failed).and_then(|bytes| decode(&bytes))),
                );
            }
            Placement::Remote(t) if link::is_rack_worker() => {
                let bytes = codec::encode(t.life(), &(export, argument));
                let on_answer: link::OnAnswer = Box::new(move |outcome| {
                    let result = decode_method::<R>(outcome);
                    trust::defer(move || then(result.unwrap_or_else(|e| call::raise(e))));
                });
                let (life, property) = (Some(t.incarnation), Some((t.slot, t.generation)));
                link::call_named(
                    t.node,
                    t.worker,
                    life,
                    &method_name(),
                    property,
                    bytes.as_slice(),
                    on_answer,
                );
            }
            Placement::Moved(..) => unreachable!("a package's state is not Wire: it never moves"),
            Placement::Remote(_) | Placement::ViaFiber => then(self.call(name, argument)),
        }
    }

    /// The package whose state this is.
    pub fn package(&self) -> &Package {
        &self.package
    }

    /// The index of the state's method `name`, checked against the types of the call.
    fn method<A: Wire, R: Wire>(&self, name: &str) -> Result<u32, PackageError> {
        let state = &self.state;
        cached_export::<A, R>(&self.package, name, Wanted::Method(state), || {
            gossamer_schema::apply_fingerprint::<A, R>(state)
        })
    }
}

/// The handle to `gossamer.package.call`, made once per thread.
fn call_fn() -> NamedFn<Call, Result<Vec<u8>, PackageError>> {
    thread_local! {
        static CALL_FN: NamedFn<Call, Result<Vec<u8>, PackageError>> =
            named_fn(CALL).expect("a valid name");
    }
    CALL_FN.with(Clone::clone)
}

impl Node {
    /// Builds the state `state` of `package` from `argument` on this node (which loads the
    /// package first, if this process has not given it to this node yet), and returns a
    /// handle to it.
    ///
    /// # Errors
    /// The package has no such state, or it takes another argument type; the node refused the
    /// package ([`PackageError`] says which check failed); the package refused the argument.
    /// A panic of the package's constructor is raised here.
    pub fn entrust_package<A: Wire>(
        self,
        package: &Package,
        state: &str,
        argument: A,
    ) -> Result<PkgTrust, PackageError> {
        let export = find_export(package, state, Wanted::State, || {
            gossamer_schema::new_fingerprint::<A>(state)
        })?;
        let arg = encode(&argument)?;
        let rack = state::current().expect("a package call outside a rack");
        let here = rack.rank;
        let trust = if self.rank() == here {
            let loaded = load::load(package, &policy(), here)?;
            let built = loaded
                .new_state(export as usize, &arg, here)
                .map_err(failed)?;
            crate::node::entrust(PkgState(built))
        } else {
            let new: NamedFn<NewState, Result<Found, PackageError>> =
                named_fn(NEW).expect("a valid name");
            let found = with_package(self, package, || {
                let ask = NewState {
                    id: package.id(),
                    export,
                    arg: arg.clone(),
                    caller: rack.life(here),
                };
                self.spawn_named(&new, ask).join().map_err(unresolved)?
            })?;
            found.into_trust(self)
        };
        Ok(PkgTrust {
            trust,
            package: Arc::new(package.clone()),
            state: state.to_owned(),
        })
    }

    /// Sends `package` to this node and waits until it is loaded there, even if this process
    /// sent it before: to pay for the first call ahead of it, or to have every call carry the
    /// package, as the seed's injected functions carry their code. A node that has the
    /// package already only checks the bytes against its id. On this node itself, it loads
    /// the package here.
    ///
    /// # Errors
    /// The node refused the package ([`PackageError`] says which check failed).
    ///
    /// # Examples
    /// Loading a signed package (see the [`package`](crate::package) docs) on every node
    /// before any call:
    /// ```no_run
    /// let code = gossamer::Rack::from_env().run(|| {
    ///     let pkg = gossamer::package::Package::open("demo.gpkg").unwrap();
    ///     for node in gossamer::nodes() {
    ///         node.load_package(&pkg).unwrap();
    ///     }
    /// });
    /// assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// ```
    pub fn load_package(self, package: &Package) -> Result<(), PackageError> {
        let state = state::current().expect("a package call outside a rack");
        if self.rank() == state.rank {
            return load::load(package, &policy(), state.rank).map(|_| ());
        }
        ship(self, package)?;
        let key = (self.rank(), state.incarnation(self.rank()), package.id());
        // Fibers waiting for a first call's load of the same package may go on.
        if let Some(Shipping::Loading(waiters)) = shipped(|s| s.insert(key, Shipping::Loaded)) {
            waiters.into_iter().for_each(Waker::wake);
        }
        Ok(())
    }

    /// Runs the function `name` of `package` on this node with `argument` (loading the
    /// package there first if needed) and waits for its result.
    ///
    /// # Errors
    /// As [`Node::entrust_package`].
    pub fn call<A: Wire, R: Wire>(
        self,
        package: &Package,
        name: &str,
        argument: A,
    ) -> Result<R, PackageError> {
        let export = cached_export::<A, R>(
            package,
            name,
            Wanted::Function,
            gossamer_schema::free_fingerprint::<A, R>,
        )?;
        let arg = encode(&argument)?;
        let call = call_fn();
        let bytes = with_package(self, package, || {
            let c = Call {
                id: package.id(),
                export,
                arg: arg.clone(),
            };
            self.spawn_named(&call, c).join().map_err(unresolved)?
        })?;
        decode(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::package::SecretKey;
    use crate::package::file::test_manifest;

    /// What a `call::<u64, u64>(name)` on a state of type `state` looks up.
    fn method_lookup(package: &Package, state: &str, name: &str) -> Result<u32, PackageError> {
        cached_export::<u64, u64>(package, name, Wanted::Method(state), || {
            gossamer_schema::apply_fingerprint::<u64, u64>(state)
        })
    }

    #[test]
    fn lookups_are_remembered_per_kind_of_export_and_refusals_are_not() {
        use crate::package::file::{ExportEntry, ExportKind};
        let method = |name: &str, state: &str| ExportEntry {
            name: name.into(),
            kind: ExportKind::Method {
                state: state.into(),
            },
            fingerprint: gossamer_schema::apply_fingerprint::<u64, u64>(state),
        };
        let state = |name: &str| ExportEntry {
            name: name.into(),
            kind: ExportKind::State,
            fingerprint: 0,
        };
        let mut manifest = test_manifest();
        manifest.exports = vec![
            state("S"),
            state("T"),
            method("m", "S"),
            method("m", "T"),
            method("only_t", "T"),
        ];
        let key = SecretKey::generate().unwrap();
        let package = Package::signed(manifest, b"library".to_vec(), &key);
        assert_eq!(method_lookup(&package, "S", "m"), Ok(2));
        assert_eq!(method_lookup(&package, "T", "m"), Ok(3), "T's m, not S's");
        let refused = method_lookup(&package, "S", "only_t").unwrap_err();
        assert!(
            matches!(refused, PackageError::NoSuchExport { .. }),
            "{refused}"
        );
        assert_eq!(method_lookup(&package, "T", "only_t"), Ok(4), "T has it");
    }

    #[test]
    fn a_package_shipped_under_another_id_is_refused_before_it_loads() {
        let key = SecretKey::generate().unwrap();
        let expected = Package::signed(test_manifest(), b"one library".to_vec(), &key);
        let sent = Package::signed(test_manifest(), b"another library".to_vec(), &key);
        let ship = Ship {
            id: expected.id(),
            file: sent.to_bytes(),
        };
        // Refused before `load::load`, which needs a rack: this test has none.
        let err = load_here(ship).unwrap_err();
        assert_eq!(
            err,
            PackageError::IdMismatch {
                expected: expected.id(),
                found: sent.id(),
            }
        );
        assert!(err.to_string().contains("expected package"), "{err}");
    }
}
