//! Which ops exist, by (state type, name): the table replay and the call path look ops up in.
//!
//! A log keeps an op's name, never an address, so a restarted node must know every op before
//! it replays a record. Ops are therefore registered at link time with
//! [`durable_ops!`](crate::durable_ops) (through `inventory`), and the table is complete
//! before `main` runs. Each entry carries the op's schema fingerprint (its argument's and
//! output's serde shape): a log written by a build whose op had another shape is refused
//! rather than decoded into the wrong fields.

use std::any::{Any, TypeId, type_name};
use std::collections::HashMap;
use std::sync::OnceLock;

use serde::de::DeserializeOwned;

use serde::{Deserialize, Serialize};

use super::DurableError;
use super::blob::{BlobError, Change, Holder, Lease};
use super::format::{Answer, CallArgs, Outcome};
use super::{CallInfo, Op};
use crate::codec::{self, Wire};
use gossamer_schema as schema;

/// One registered op: made by [`durable_ops!`](crate::durable_ops), not by hand.
#[doc(hidden)]
#[derive(Debug)]
pub struct Registered {
    pub(crate) state: fn() -> &'static str,
    pub(crate) op_type: fn() -> &'static str,
    pub(crate) name: &'static str,
    pub(crate) fingerprint: fn() -> u64,
    pub(crate) run: Runner,
    pub(crate) resend: Resender,
    pub(crate) change: Changer,
    pub(crate) needs: Needer,
}

/// Decodes an op from its argument bytes and applies it to a state (a `T` behind `dyn Any`).
pub(crate) type Runner = fn(&mut dyn Any, &[u8], &mut CallInfo) -> Result<Outcome, String>;

/// Sends a call again, from a fiber on the property's node, knowing only names: the property,
/// the op and the call (a session's `resume`). Made for the state type by `cell`.
pub(crate) type Resender = fn(Resend) -> Result<Answer, DurableError>;

/// Changes a blob a property of the state type made (a lease, an unlease, a free), from a
/// fiber on its node, knowing only its name. Made for the state type by `cell`.
pub(crate) type Changer = fn(String, Change) -> Result<(), BlobError>;

/// Whether a property of the state type, named in the lease, may still need the lease
/// (maker, blob id, lease), from a fiber on its node. Made for the state type by `cell`.
pub(crate) type Needer = fn(Holder, u64, Lease) -> bool;

/// What a resent call names.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Resend {
    pub(crate) property: String,
    pub(crate) op: String,
    pub(crate) args: CallArgs,
}

inventory::collect!(Registered);

/// A registered op, as replay and calls use it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    /// The op's name, as logs keep it.
    pub(crate) name: &'static str,
    pub(crate) op_type: &'static str,
    pub(crate) fingerprint: u64,
    pub(crate) run: Runner,
    pub(crate) resend: Resender,
    pub(crate) change: Changer,
    pub(crate) needs: Needer,
}

type Table = HashMap<(&'static str, &'static str), Entry>;

/// The table, or why it cannot be built (two ops of one state type share a name).
fn table() -> &'static Result<Table, String> {
    static TABLE: OnceLock<Result<Table, String>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = Table::new();
        for r in inventory::iter::<Registered> {
            if r.name == super::format::LAPSE || r.name == super::blob::CHANGE {
                return Err(format!(
                    "the durable op {} on {} is named \"{}\", which the runtime's own \
                     records use: rename it",
                    (r.op_type)(),
                    (r.state)(),
                    r.name
                ));
            }
            let entry = Entry {
                name: r.name,
                op_type: (r.op_type)(),
                fingerprint: (r.fingerprint)(),
                run: r.run,
                resend: r.resend,
                change: r.change,
                needs: r.needs,
            };
            if let Some(other) = table.insert(((r.state)(), r.name), entry)
                && other.op_type != entry.op_type
            {
                return Err(format!(
                    "two durable ops on {} are both named \"{}\": {} and {}; an op's NAME \
                     must be unique for its state type",
                    (r.state)(),
                    r.name,
                    other.op_type,
                    entry.op_type
                ));
            }
        }
        Ok(table)
    })
}

/// Checks that the table could be built.
pub(crate) fn check() -> Result<(), String> {
    table().as_ref().map(|_| ()).map_err(Clone::clone)
}

/// The op named `name` on state type `state`.
pub(crate) fn find(state: &str, name: &str) -> Option<Entry> {
    table().as_ref().ok()?.get(&(state, name)).copied()
}

/// Some op of state type `state`: what its blob changes go through.
pub(crate) fn any_of(state: &str) -> Option<Entry> {
    let table = table().as_ref().ok()?;
    table
        .iter()
        .find(|((s, _), _)| *s == state)
        .map(|(_, e)| *e)
}

/// The entry of `O` on `T`, or the message a caller of an unregistered op panics with.
/// Looked up once per thread and pair of types: calls ask for it every time.
pub(crate) fn entry_of<T: 'static, O: Op<T>>() -> Result<Entry, String> {
    thread_local! {
        static SEEN: std::cell::RefCell<Vec<((TypeId, TypeId), Entry)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    let key = (TypeId::of::<T>(), TypeId::of::<O>());
    if let Some(e) = SEEN.with(|s| s.borrow().iter().find(|(k, _)| *k == key).map(|(_, e)| *e)) {
        return Ok(e);
    }
    let name = O::NAME;
    let found = match find(type_name::<T>(), name) {
        Some(e) if e.op_type == type_name::<O>() => Ok(e),
        Some(e) => Err(format!(
            "the durable op \"{name}\" on {} is {}, not {}: two ops share the name",
            type_name::<T>(),
            e.op_type,
            type_name::<O>()
        )),
        None => Err(format!(
            "the durable op {} (\"{name}\") on {} is not registered: a restarted node could \
             not replay it; add `gossamer::durable_ops!({}: {});` beside the op",
            type_name::<O>(),
            type_name::<T>(),
            short(type_name::<T>()),
            short(type_name::<O>()),
        )),
    }?;
    SEEN.with(|s| s.borrow_mut().push((key, found)));
    Ok(found)
}

/// A path's last segment, for a message's example.
fn short(path: &str) -> &str {
    path.rsplit("::").next().unwrap_or(path)
}

pub(crate) fn run<T: Wire, O: Op<T>>(
    state: &mut dyn Any,
    arg: &[u8],
    info: &mut CallInfo,
) -> Result<Outcome, String> {
    let state = state
        .downcast_mut::<T>()
        .ok_or_else(|| format!("op \"{}\" applied to a state of another type", O::NAME))?;
    let op: O = postcard::from_bytes(arg)
        .map_err(|e| format!("the argument of op \"{}\" does not decode: {e}", O::NAME))?;
    let output = op.apply(state, &mut info.typed::<T>());
    let (encoded, returned) = super::blob::collecting(|| codec::encode_here(&output));
    if !returned.is_empty() {
        info.blob_mut().returned = returned;
    }
    encoded
        .map(|bytes| Outcome::Returned(bytes.into()))
        .map_err(|e| format!("the output of op \"{}\" does not encode: {e}", O::NAME))
}

/// The schema fingerprint of a state type: its name and serde shape. Traced once per type
/// (every snapshot carries it).
pub(crate) fn state_fingerprint<T: DeserializeOwned + 'static>() -> u64 {
    static KNOWN: std::sync::Mutex<Vec<(TypeId, u64)>> = std::sync::Mutex::new(Vec::new());
    let key = TypeId::of::<T>();
    let known = |k: &[(TypeId, u64)]| k.iter().find(|(t, _)| *t == key).map(|(_, f)| *f);
    if let Some(f) = known(&KNOWN.lock().unwrap_or_else(|p| p.into_inner())) {
        return f;
    }
    let f = schema::fingerprint(&[type_name::<T>().as_bytes(), schema::shape::<T>().as_bytes()]);
    KNOWN
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((key, f));
    f
}

pub(crate) fn op_fingerprint<A: DeserializeOwned, R: DeserializeOwned>() -> u64 {
    let (a, r) = (schema::shape::<A>(), schema::shape::<R>());
    schema::fingerprint(&[a.as_bytes(), &[0], r.as_bytes()])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    struct A {
        x: u64,
    }
    #[derive(Serialize, Deserialize)]
    struct B {
        x: u32,
    }

    #[test]
    fn fingerprints_change_with_the_shape() {
        assert_eq!(state_fingerprint::<A>(), state_fingerprint::<A>());
        assert_ne!(op_fingerprint::<A, u64>(), op_fingerprint::<B, u64>());
        assert_ne!(op_fingerprint::<A, u64>(), op_fingerprint::<A, i64>());
    }
}
