//! Durable properties: state that outlives its process, changed only by named ops whose
//! calls take effect exactly once.
//!
//! A [`Durable<T>`] is a property kept in its rank's durable state, named by (rank, name). It
//! changes only through [`Op`]s: serializable values with a stable [`Op::NAME`], registered
//! with [`durable_ops!`](crate::durable_ops). Each call runs on the property's trustee like
//! any delegated closure; its effect is logged — the op's name and argument, its outcome and
//! the call's id — and the answer leaves only once that record, and every record before it,
//! is durable (output commit). A restarted node rebuilds the property from its newest
//! snapshot and the records after it, by running the ops again: `apply` must therefore be
//! deterministic in (state, op). Debug builds check this at every snapshot and name the op
//! that is not.
//!
//! ```no_run
//! use gossamer::durable::{Cx, Op};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, Default)]
//! struct Account { balance: i64 }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Deposit(i64);
//!
//! impl Op<Account> for Deposit {
//!     const NAME: &'static str = "account.deposit"; // the log keeps names, not addresses
//!     type Output = i64;
//!     fn apply(self, a: &mut Account, _: &mut Cx<Account>) -> i64 {
//!         a.balance += self.0;
//!         a.balance
//!     }
//! }
//! gossamer::durable_ops!(Account: Deposit);
//!
//! let code = gossamer::Rack::from_env().run(|| {
//!     let node = gossamer::nodes().last().unwrap();
//!     // Opens the account, or reopens it with everything earlier runs deposited.
//!     let alice = node.durable("alice", Account::default).unwrap();
//!     let balance = alice.call(Deposit(5)).unwrap();
//!     assert_eq!(alice.read(|a| a.balance).unwrap(), balance);
//! });
//! assert_eq!(code, std::process::ExitCode::SUCCESS);
//! ```
//!
//! # Exactly once
//! Every call has an id, (client, seq), as in RIFL (RAMCloud): a client is a thread of a
//! process (each process draws fresh client ids) or a [`Session`], and seq counts its calls.
//! The property keeps each call's outcome — its *completion record*, logged in the same
//! record as the call's effect — until the client acknowledges it, which each call does for
//! all the client's earlier ones (it carries the client's first unfinished seq). A call that
//! arrives again is answered from its record and not run; one that arrives while its first
//! copy is still being made durable waits for that copy's answer; one below the acknowledged
//! seq is refused. A client's calls leave within a [`WINDOW`] of 1,024 seqs of its first
//! unfinished one, so a property keeps at most that many records per client: a later call
//! waits to leave (a [`Durable::call`] waits; a [`Durable::call_then`] is held and leaves
//! when an earlier call is answered). A panicking op has no effect (the state is rebuilt from the snapshot and
//! the records since), and its record makes every retry panic the same way.
//!
//! A thread's calls are exactly once while its process lives; when it ends, a call it had
//! sent took effect once or not at all, and nothing says which. A [`Session`] logs each call
//! before it leaves and each answer before returning it, so a session reopened by a later
//! process finds and finishes what its predecessor left ([`Session::resume`]).
//!
//! # Storage
//! Each rank keeps its durable state in a log of its own under
//! `GSM_STATE_DIR/<GSM_JOB_NAME>/rank-<r>/` (see [`env`](crate::env) and the `store` module),
//! locked while a process uses it. A trustee stages its records in its worker's buffer and
//! flushes the buffer once per round of the worker's loop: under `GSM_DURABILITY=os` it
//! writes the buffer to the log itself and answers; under `sync` (the default) a syncer
//! thread writes every buffer handed to it since its last commit and flushes them with one
//! `fdatasync` (group commit), then the answers they cover leave. A property is
//! snapshotted when its log since the last snapshot exceeds [`SNAPSHOT_RECORDS`] records or
//! [`SNAPSHOT_BYTES`] bytes; two snapshots are kept, and the records the older one covers
//! are deleted.
//!
//! On open, a state written by a build whose op or state type had another serde shape, or
//! naming an op this build lacks, or whose ops give other outputs when replayed, is refused
//! with an error that names the op and the build that wrote it: a log is never replayed
//! into the wrong fields or through other code.
//!
//! # A rank lost and back
//! Under `gsm run --recover` a lost rank other than 0 is restarted and rejoins the job (see
//! the crate's `recovery` module). A call whose answer the loss cut off, or that found the
//! rank down, fails on the wire with `Lost`; every durable caller then waits for the rank's
//! next life and sends the same call again, under the same (client, seq): [`Durable::call`]
//! and [`Durable::call_then`] (a thread's volatile client), [`Session::call`] and
//! [`Session::resume`], and the calls ops make ([`Cx::call`], which wait on past
//! `GSM_RECOVERY_TIMEOUT`: a property's call is kept until answered). The new life replays the
//! property's log before it runs anything, so a call that ran and was logged is answered from
//! its record, and one that was lost with the process (never durable, never answered) runs
//! now: once, either way. A blocking caller whose rank stays down for `GSM_RECOVERY_TIMEOUT`
//! gets [`CallError::Unavailable`]: the call ran at most once. [`Durable::read`],
//! [`Durable::read_with`] and [`Durable::calls_in_flight`] return it too.
//!
//! A [`Durable`] names its property by (rank, name). Inside a rack call it also carries the
//! live property of the rank's life it was found in; when that life is over by the time it
//! arrives (the rank restarted), the receiver drops that part and finds the property again by
//! name, in the rank's present life.
//!
//! Without recovery a lost rank ends the job, as every rack's does: its durable state
//! survives, and the job run again reopens it (and sessions finish their calls).
//!
//! # Leases
//! A property keeps a client's completion records until the client acknowledges them, or
//! until the client's lease ends, as in RIFL. A thread's lease is its process's life: a
//! client id names the run of the job, the rank and its incarnation, and once that life is
//! over (the rank was lost, restarted, or the job ran again) its records are dropped
//! `GSM_CLIENT_LEASE` (10 s) later. A session's lease runs `GSM_SESSION_LEASE` (an hour) from
//! its last call to the property, and each call renews it; when it ends, the session's
//! unacknowledged records are dropped, and a [`Session::resume`] of a call they covered gets
//! [`CallError::Expired`]: the call ran at most once. A property's own calls to others are
//! kept until answered and have no lease. Ending a lease is logged like a call, so a
//! restarted property ends the same leases.
//!
//! # Blobs
//! A [`Blob`] is immutable bytes, passed to ops by reference: a call carries the handle, and
//! the property called fetches the bytes from the blob's maker before the op runs, which
//! reads them with [`Cx::read`]. A session makes one with [`Session::blob`], an op with
//! [`Cx::blob`]; the bytes stay at the maker's rank. Passing a blob leases it to the call
//! (seed 001, §4.1): it cannot be freed until a snapshot of the called property covers the
//! call, since until then a replay fetches the bytes again (a lease taken for a call that
//! never ran, its lessee's process having ended first, is dropped by the free that finds
//! it). The bytes travel in pieces, so a blob may exceed `GSM_MAX_MESSAGE`, and bytes
//! written for a blob whose making was never logged are deleted when their maker next
//! opens. Only its controller frees it —
//! its maker, or the session or property an op returned it to ([`Session::free`],
//! [`Cx::free`]).
//!
//! ```no_run
//! use gossamer::durable::{Blob, BlobError, Cx, Op, Session};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, Default)]
//! struct Index { lengths: Vec<usize> }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Add(Blob);
//!
//! impl Op<Index> for Add {
//!     const NAME: &'static str = "index.add";
//!     type Output = Result<usize, BlobError>;
//!     fn apply(self, index: &mut Index, cx: &mut Cx<Index>) -> Result<usize, BlobError> {
//!         let words = cx.read(&self.0)?.split(|&b| b == b' ').count();
//!         index.lengths.push(words);
//!         Ok(words)
//!     }
//! }
//! gossamer::durable_ops!(Index: Add);
//!
//! let code = gossamer::Rack::from_env().run(|| {
//!     let index = gossamer::nodes().last().unwrap().durable("index", Index::default).unwrap();
//!     let session = Session::open("loader").unwrap();
//!     let page = session.blob(b"bytes that travel once, fetched by the callee").unwrap();
//!     assert_eq!(session.call(&index, Add(page.clone())).unwrap(), Ok(7));
//!     // Leased until the index's next snapshot covers the call: free it later.
//!     assert!(matches!(session.free(&page), Err(BlobError::Leased { .. })));
//! });
//! assert_eq!(code, std::process::ExitCode::SUCCESS);
//! ```

mod blob;
mod cell;
mod client;
pub(crate) mod crash;
mod fetch;
mod format;
mod host;

#[cfg(feature = "fuzzing")]
pub(crate) use format::check_decoders;
pub(crate) use host::close;
#[cfg(feature = "fuzzing")]
pub(crate) use store::check_segment;
mod registry;
mod session;
mod store;
#[cfg(test)]
mod tests;

use std::fmt;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::call::{self, Failure};
use crate::codec::{self, Wire};
use crate::node::{Node, spawn_on, spawn_on_then, this_node};
use crate::proxy::Trust;
use crate::recovery;

pub use crate::env::Durability;
pub use blob::{Blob, BlobError};
pub use client::WINDOW;
#[doc(hidden)]
pub use inventory;
#[doc(hidden)]
pub use registry::Registered;
pub use session::{Session, SessionCall};

use blob::{Blobs, Holder};
use cell::Cell;

/// The `fdatasync`s this process's durable stores have made so far, and the bytes they
/// appended to their logs (`bench durable` counts both per call).
#[doc(hidden)]
pub fn store_counts() -> (u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    (store::SYNCS.load(Relaxed), store::LOG_BYTES.load(Relaxed))
}

/// The durable state kept in `dir` (a rank's directory, `GSM_STATE_DIR/<job>/rank-<r>`) as
/// text, read without changing anything and without a rack: every property with its
/// snapshots and the records after them (op, call id, sizes, outcome), and what a crash
/// left that opening would mend. `gsm state dump` prints it.
///
/// # Errors
/// The directory cannot be read, or a part of the log other than its torn tail is damaged.
pub fn dump(dir: &std::path::Path) -> Result<String, DurableError> {
    store::inspect(dir)
}

/// Gives up, knowingly, the records of the rank's state in `dir` from byte `at` of its newest
/// log segment `segment` on, where opening found damage and refused, naming both (`gsm state
/// cut` runs it). Every record from that byte on is lost, including answered ones; LSNs
/// continue after the newest one read anywhere, those given up included, and the cut is
/// recorded in the rank's `cuts` file. Returns what was given up, by property, as text.
///
/// # Errors
/// The state is in use, `segment` is not the newest segment, its first bad frame is not at
/// `at`, or the directory cannot be read or written.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let err = gossamer::durable::cut(dir.path(), "00000000000000000001.seg", 40).unwrap_err();
/// assert!(err.to_string().contains("no log/"), "{err}");
/// ```
pub fn cut(dir: &std::path::Path, segment: &str, at: u64) -> Result<String, DurableError> {
    store::cut(dir, segment, at)
}

/// A property's log since its last snapshot may hold this many records before the next call
/// snapshots it.
pub const SNAPSHOT_RECORDS: usize = 8192;
/// ... or this many bytes of arguments and outcomes.
pub const SNAPSHOT_BYTES: usize = 8 << 20;

/// A named, serializable change to a durable `T`.
///
/// `apply` runs on the property's trustee, in delegated context (it must not block), once
/// when called and again whenever the property is rebuilt from its log: it must depend only
/// on the state and the op (no clock, no randomness, no I/O). Register every op with
/// [`durable_ops!`](crate::durable_ops).
pub trait Op<T>: Wire {
    /// The op's name in the log: keep it when the code changes, and unique for `T`.
    const NAME: &'static str;
    /// What the call returns.
    type Output: Wire;
    /// Applies the op.
    fn apply(self, state: &mut T, cx: &mut Cx<T>) -> Self::Output;
}

/// What a durable property does with the answer of a call it made to another
/// ([`Cx::call`]): a named, serializable continuation, run as a logged op on the caller when
/// the answer comes (once, even across restarts of either side).
pub trait Then<T>: Wire {
    /// Its name in the log, like [`Op::NAME`].
    const NAME: &'static str;
    /// The output of the op it answers.
    type Input: Wire;
    /// Runs on the calling property with the call's outcome.
    fn then(self, state: &mut T, outcome: Result<Self::Input, CallError>, cx: &mut Cx<T>);
}

/// The op a continuation runs as: the [`Then`] and the answer it takes.
#[doc(hidden)]
#[derive(Debug, Serialize, Deserialize)]
#[serde(bound = "K: Wire")]
pub struct Resume<K: Send + 'static> {
    then: K,
    answer: Result<format::Answer, DurableError>,
}

impl<T: Wire, K: Then<T>> Op<T> for Resume<K> {
    const NAME: &'static str = K::NAME;
    type Output = ();
    fn apply(self, state: &mut T, cx: &mut Cx<T>) {
        let outcome = match self.answer {
            Err(e) => Err(CallError::Open(e)),
            Ok(Err(format::Refusal::Panicked(m))) => Err(CallError::Panicked(m)),
            // A property's calls have no lease (they never expire), nor acknowledged seqs.
            Ok(Err(refused)) => Err(CallError::Panicked(format!("{refused:?}"))),
            Ok(Ok(bytes)) => postcard::from_bytes(&bytes).map_err(|e| {
                CallError::Panicked(format!(
                    "the answer does not decode as a {}: {e}",
                    std::any::type_name::<K::Input>()
                ))
            }),
        };
        self.then.then(state, outcome, cx);
    }
}

/// Registers durable ops so that a restarted node can replay them: `durable_ops!(State: Op1,
/// Op2)`, and the continuations of calls the state's ops make, after `then`:
/// `durable_ops!(State: Op1, Op2; then Done1)`. Registration happens at link time; two ops of
/// one state type with one name are an error at the first open.
#[macro_export]
macro_rules! durable_ops {
    ($state:ty : $($op:ty),+ $(; then $($then:ty),+)? $(,)?) => {
        $(
            $crate::durable::inventory::submit! {
                $crate::durable::Registered::of::<$state, $op>()
            }
        )+
        $($(
            $crate::durable::inventory::submit! {
                $crate::durable::Registered::of::<$state, $crate::durable::Resume<$then>>()
            }
        )+)?
    };
}

/// What an op knows of the call it runs for.
pub struct Cx<T> {
    info: CallInfo,
    _state: PhantomData<fn(&mut T)>,
}

/// [`Cx`] without its state type, as the trustee keeps it.
#[derive(Debug, Default, Clone)]
pub(crate) struct CallInfo {
    pub(crate) property: Arc<str>,
    pub(crate) replaying: bool,
    /// Calls the running op made to other properties (their seqs not yet given).
    pub(crate) outgoing: Vec<format::OutCall>,
    /// What the property's blobs need: boxed, since every call moves its `CallInfo` into its
    /// `Cx` and back. Set for every open property.
    pub(crate) blob: Option<Box<BlobInfo>>,
}

/// The blob side of a [`CallInfo`].
#[derive(Debug, Default, Clone)]
pub(crate) struct BlobInfo {
    /// The property as a blob holder, its id in the store and its state type.
    pub(crate) holder: Holder,
    pub(crate) store_id: u32,
    pub(crate) state_type: &'static str,
    /// The blobs the property made, and the notices it owes.
    pub(crate) blobs: Blobs,
    /// The running call's blobs, with their bytes (its property's own, once read).
    pub(crate) carried: Vec<(Blob, Arc<[u8]>)>,
    /// The blobs the running op's output carries.
    pub(crate) returned: Vec<Blob>,
    /// Hashes of the property's blob files no blob uses any more: deleted once a snapshot
    /// covers the frees (a replay from an earlier one reads them).
    pub(crate) freed: Vec<[u8; 32]>,
    /// Blobs of its own the running op could not free for their leases: their lessees are
    /// asked whether they still need them, once the op has run.
    pub(crate) ask_lessees: Vec<u64>,
}

impl CallInfo {
    pub(crate) fn blob(&self) -> &BlobInfo {
        self.blob.as_deref().expect("an open property's blob state")
    }

    pub(crate) fn blob_mut(&mut self) -> &mut BlobInfo {
        self.blob
            .as_deref_mut()
            .expect("an open property's blob state")
    }

    pub(crate) fn typed<T>(&mut self) -> CxGuard<'_, T> {
        CxGuard {
            info: self,
            cx: None,
        }
    }
}

/// Lends a [`CallInfo`] to an op as a `Cx<T>` and takes it back.
pub(crate) struct CxGuard<'a, T> {
    info: &'a mut CallInfo,
    cx: Option<Cx<T>>,
}

impl<T> std::ops::Deref for CxGuard<'_, T> {
    type Target = Cx<T>;
    fn deref(&self) -> &Cx<T> {
        self.cx.as_ref().expect("set by deref_mut first")
    }
}

impl<T> std::ops::DerefMut for CxGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut Cx<T> {
        let info = std::mem::take(self.info);
        self.cx.get_or_insert(Cx {
            info,
            _state: PhantomData,
        })
    }
}

impl<T> Drop for CxGuard<'_, T> {
    fn drop(&mut self) {
        if let Some(cx) = self.cx.take() {
            *self.info = cx.info;
        }
    }
}

impl<T> Cx<T> {
    /// The property's name.
    pub fn property(&self) -> &str {
        &self.info.property
    }

    /// Whether the op runs again to rebuild the property (after a restart or a panic) rather
    /// than for a call.
    pub fn replaying(&self) -> bool {
        self.info.replaying
    }

    /// Calls `op` on `target` as this property: the call leaves once the running op's record
    /// is durable, and `then` runs on this property, as a logged op, with the answer. Each
    /// takes effect once, whichever side restarts in between; a replay of the running op does
    /// not call again.
    ///
    /// # Panics
    /// When `O` is not registered for `U`, or `K` not for `T` (`durable_ops!(T: ..; then K)`).
    pub fn call<U: Wire, O: Op<U>, K: Then<T, Input = O::Output>>(
        &mut self,
        target: &Durable<U>,
        op: O,
        then: K,
    ) where
        T: Wire,
    {
        if let Err(why) = registry::entry_of::<T, Resume<K>>() {
            panic!("{why} (register it with `durable_ops!(State: ..; then Continuation)`)");
        }
        let (argument, blobs) = client::encode_op(&op);
        self.info.outgoing.push(format::OutCall {
            seq: 0,
            ack: 0,
            rank: target.rank,
            property: target.name.to_string(),
            state_type: std::any::type_name::<U>().into(),
            op: O::NAME.into(),
            argument,
            blobs,
            then: K::NAME.into(),
            then_argument: client::encode_logged("continuation", &then),
        });
    }
}

impl<T> Cx<T> {
    /// Makes a blob of `bytes`, controlled by this property: its bytes are kept in the
    /// property's rank directory before this returns. Pass it in calls, return it (which
    /// hands control to the calling session or property), or free it ([`Cx::free`]).
    ///
    /// # Panics
    /// When the bytes cannot be written (the op then has no effect).
    pub fn blob(&mut self, bytes: &[u8]) -> Blob {
        let hash = fetch::write_bytes(self.info.blob().store_id, bytes)
            .unwrap_or_else(|why| panic!("durable property \"{}\": {why}", self.info.property));
        self.adopt(bytes.len() as u64, hash)
    }

    /// Makes a blob of bytes already kept in this property's store.
    pub(crate) fn adopt(&mut self, len: u64, hash: [u8; 32]) -> Blob {
        let info = self.info.blob_mut();
        info.blobs.make(&info.holder, info.state_type, len, hash)
    }

    /// The bytes of `blob`: one the running call carried in its op (fetched before the op
    /// ran), or one this property made.
    ///
    /// # Errors
    /// [`BlobError::NotCarried`] for another blob; [`BlobError::Gone`] for a blob of this
    /// property's that it freed.
    ///
    /// # Panics
    /// When a blob this property holds lost its bytes on disk.
    pub fn read(&mut self, blob: &Blob) -> Result<&[u8], BlobError> {
        let info = self.info.blob_mut();
        let at = match info.carried.iter().position(|(b, _)| b == blob) {
            Some(at) => at,
            None if blob.maker_holder() == &info.holder => {
                if !info.blobs.has(&info.holder, blob) {
                    return Err(BlobError::Gone {
                        blob: blob.to_string(),
                    });
                }
                let host = host::host().unwrap_or_else(|e| panic!("{e}"));
                let bytes = host
                    .store
                    .read_blob(info.store_id, &blob.hash(), blob.len())
                    .unwrap_or_else(|| panic!("the bytes of {blob} are gone from its store"));
                info.carried.push((blob.clone(), bytes.into()));
                info.carried.len() - 1
            }
            None => {
                return Err(BlobError::NotCarried {
                    blob: blob.to_string(),
                });
            }
        };
        Ok(&info.carried[at].1)
    }

    /// Frees `blob`, which this property controls. One it made goes now (refused while a
    /// call that carried it may still be replayed; the refusal has its lessees asked, once
    /// the op has run, and the leases of calls that never ran dropped, so that a later free
    /// goes); one another made is freed by its maker once this op's record is durable, and
    /// asked again after this property's next snapshot while calls still hold it.
    ///
    /// # Errors
    /// For a blob this property made: [`BlobError::Leased`] or [`BlobError::NotController`].
    pub fn free(&mut self, blob: &Blob) -> Result<(), BlobError> {
        let info = self.info.blob_mut();
        if blob.maker_holder() != &info.holder {
            info.blobs
                .notices
                .push(blob::Notice::Free { blob: blob.clone() });
            return Ok(());
        }
        let change = blob::Change::Free {
            id: blob.id(),
            by: info.holder.clone(),
        };
        match info.blobs.apply(&info.holder, &change) {
            Ok(Some(unused)) => info.freed.push(unused),
            Ok(None) => {}
            Err(leased @ BlobError::Leased { .. }) => {
                // Its lessees are asked once the op has run (not on a replay): a lease no
                // call needs goes, and a later free with it.
                if !self.info.replaying {
                    self.info.blob_mut().ask_lessees.push(blob.id());
                }
                return Err(leased);
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }
}

impl<T> fmt::Debug for Cx<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cx")
            .field("property", &self.info.property)
            .field("replaying", &self.info.replaying)
            .finish()
    }
}

/// Why a durable property could not be opened or kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum DurableError {
    /// The store failed (I/O, or damage redb found).
    Store {
        /// The rank's state directory.
        dir: PathBuf,
        /// What failed.
        why: String,
    },
    /// Another process holds this rank's state.
    InUse {
        /// The rank's state directory.
        dir: PathBuf,
    },
    /// No property of that name exists (a handle's property was never created there).
    NotFound {
        /// The property.
        name: String,
        /// Its rank.
        rank: u32,
    },
    /// The property exists with another type.
    Type {
        /// The property.
        name: String,
        /// The type it was stored as.
        stored: String,
        /// The type asked for.
        asked: String,
    },
    /// The stored state cannot be replayed by this build: an op it names is unknown, or a
    /// type's serde shape changed.
    Incompatible {
        /// The property.
        name: String,
        /// What does not match.
        why: String,
        /// The build that wrote the record or snapshot.
        written_by: String,
    },
    /// The state does not serialize (it holds a volatile `Trust`, say).
    State {
        /// The property.
        name: String,
        /// Why.
        why: String,
    },
    /// The registered ops are inconsistent (two share a name).
    Registry(String),
    /// The property's rank was lost and did not come back within `GSM_RECOVERY_TIMEOUT`.
    Unavailable {
        /// The property.
        name: String,
        /// Its rank.
        rank: u32,
    },
    /// [`Session::open`] of a session this process holds open already: share that handle.
    SessionOpen {
        /// The session's name.
        name: String,
    },
}

impl fmt::Display for DurableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DurableError::Store { dir, why } => {
                write!(f, "durable state at {}: {why}", dir.display())
            }
            DurableError::InUse { dir } => write!(
                f,
                "durable state at {} is in use by another process (a rank of a job still \
                 running, or of another job with the same GSM_JOB_NAME)",
                dir.display()
            ),
            DurableError::NotFound { name, rank } => {
                write!(f, "no durable property \"{name}\" on rank {rank}")
            }
            DurableError::Type {
                name,
                stored,
                asked,
            } => write!(
                f,
                "durable property \"{name}\" holds a {stored}, not a {asked}"
            ),
            DurableError::Incompatible {
                name,
                why,
                written_by,
            } => write!(
                f,
                "durable property \"{name}\" cannot be reopened by this build: {why} \
                 (written by {written_by})"
            ),
            DurableError::State { name, why } => {
                write!(
                    f,
                    "the state of durable property \"{name}\" cannot be saved: {why}"
                )
            }
            DurableError::Registry(why) => f.write_str(why),
            DurableError::Unavailable { name, rank } => write!(
                f,
                "durable property \"{name}\" cannot be opened: rank {rank} was lost and did \
                 not come back within GSM_RECOVERY_TIMEOUT"
            ),
            DurableError::SessionOpen { name } => write!(
                f,
                "the session \"{name}\" is open in this process already: share that Session \
                 (its calls may come from any fiber or thread) or drop it before opening the \
                 name again"
            ),
        }
    }
}

impl std::error::Error for DurableError {}

/// Why a durable call did not return the op's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum CallError {
    /// The property could not be opened where it lives.
    Open(DurableError),
    /// The op panicked (what a [`Then`] gets; a blocking call raises the panic instead).
    Panicked(String),
    /// The property's rank was lost and has not come back within `GSM_RECOVERY_TIMEOUT`
    /// (under `gsm run --recover`; without it a lost rank ends the job). The call ran at most
    /// once; a [`Session`]'s [`resume`](Session::resume) finds out whether it did.
    Unavailable {
        /// The property's rank.
        rank: u32,
        /// How long the call waited for the rank to come back.
        waited: Duration,
    },
    /// The caller's lease ended before the call was answered (a [`Session`] that did not call
    /// the property for `GSM_SESSION_LEASE`, or a thread of a process whose life has been
    /// over for `GSM_CLIENT_LEASE`): the property dropped the call's record, if it had one.
    /// The call ran at most once, and nothing tells whether it did.
    Expired {
        /// The property called.
        property: String,
        /// The call's seq in its client.
        seq: u64,
    },
    /// A blob the op carried was freed (or its maker could not be reached) before the
    /// property could lease it: the call did not run.
    Blob(BlobError),
    /// A [`Session`]'s call could not leave: call `seq`, to `property`, is unanswered and
    /// nobody sends it (it failed, or an earlier process sent it), and this call is a
    /// [`WINDOW`] past it. [`Session::resume`] settles it; this call did not run.
    Unsettled {
        /// The unanswered call's seq.
        seq: u64,
        /// The property it went to.
        property: String,
    },
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Open(e) => e.fmt(f),
            CallError::Panicked(m) => write!(f, "the op panicked: {m}"),
            CallError::Unavailable { rank, waited } => write!(
                f,
                "rank {rank} was lost and did not come back within {} ms \
                 (GSM_RECOVERY_TIMEOUT): the call ran at most once",
                waited.as_millis()
            ),
            CallError::Expired { property, seq } => write!(
                f,
                "durable property \"{property}\" dropped the record of call {seq}: the \
                 caller's lease ended (GSM_SESSION_LEASE, GSM_CLIENT_LEASE), so the call ran at \
                 most once"
            ),
            CallError::Blob(e) => write!(f, "the call did not run: {e}"),
            CallError::Unsettled { seq, property } => write!(
                f,
                "the call did not run: the session's call {seq} to durable property \
                 \"{property}\" is unanswered and this call is {WINDOW} calls past it; \
                 Session::resume settles it"
            ),
        }
    }
}

/// Why one attempt at a durable call got no answer: the property could not be opened, or its
/// rank was lost on the way (the attempt is made again once it is back).
#[derive(Debug)]
pub(crate) enum Missed {
    Open(DurableError),
    Lost(Failure),
}

impl From<Failure> for Missed {
    fn from(f: Failure) -> Missed {
        Missed::Lost(f)
    }
}

impl From<DurableError> for Missed {
    fn from(e: DurableError) -> Missed {
        Missed::Open(e)
    }
}

/// What a durable call runs on the property's trustee: capture-free, so that it can be sent
/// again after a loss.
pub(crate) trait CellOp<T, A, R>:
    FnOnce(&mut Cell<T>, A, trust::Reply<R>) + Send + Copy + 'static
{
}

impl<T, A, R, F> CellOp<T, A, R> for F where
    F: FnOnce(&mut Cell<T>, A, trust::Reply<R>) + Send + Copy + 'static
{
}

/// Makes `attempt` until it is answered: after each loss of `rank` on the way, waits (this
/// fiber) for the rank to come back and makes it again, as calls are resent under their ids;
/// [`CallError::Unavailable`] once the rank has been down for `GSM_RECOVERY_TIMEOUT`. A remote
/// failure other than a loss (a panic) is raised.
pub(crate) fn until_answered<R>(
    rank: u32,
    mut attempt: impl FnMut() -> Result<R, Missed>,
) -> Result<R, CallError> {
    let mut down_since = None;
    loop {
        match attempt() {
            Ok(r) => return Ok(r),
            Err(Missed::Open(e)) => return Err(CallError::Open(e)),
            Err(Missed::Lost(Failure::Lost(_))) => {}
            Err(Missed::Lost(other)) => call::raise(other),
        }
        let since = *down_since.get_or_insert_with(Instant::now);
        if !recovery::wait_for_rank(rank, since + recovery_timeout()) {
            return Err(CallError::Unavailable {
                rank,
                waited: since.elapsed(),
            });
        }
    }
}

fn recovery_timeout() -> Duration {
    crate::state::with_current(|s| s.settings.recovery.timeout).unwrap_or_default()
}

impl std::error::Error for CallError {}

/// A handle to a durable property: its rank and name. Cheap to clone, [`Wire`], and valid
/// across restarts of either side: kept in durable state, or passed in a call to any rank
/// (the property's own rank in a later life too), it finds the property by its name.
pub struct Durable<T: Send + 'static> {
    rank: u32,
    name: Arc<str>,
    /// The property on its trustee, once found in this process (forgotten when its rank is
    /// lost, and found again in its next life).
    trust: Arc<Mutex<Option<Trust<Cell<T>>>>>,
}

impl<T: Send + 'static> Clone for Durable<T> {
    fn clone(&self) -> Self {
        Durable {
            rank: self.rank,
            name: self.name.clone(),
            trust: self.trust.clone(),
        }
    }
}

impl<T: Send + 'static> fmt::Debug for Durable<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Durable<{}>(rank {}, \"{}\")",
            std::any::type_name::<T>(),
            self.rank,
            self.name
        )
    }
}

/// How a [`Durable`] travels: a handle inside a rack call brings the live property along (no
/// lookup at the receiver); stored in durable state it is only (rank, name). A live property
/// of a life of its rank that is over by the time the handle arrives (the rank restarted) is
/// dropped on the way, and the receiver finds the property again by its name.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
struct WireDurable<T: Send + 'static> {
    rank: u32,
    name: String,
    #[serde(deserialize_with = "live_unless_gone")]
    live: Option<Trust<Cell<T>>>,
}

fn live_unless_gone<'de, D: serde::Deserializer<'de>, T: Send + 'static>(
    deserializer: D,
) -> Result<Option<Trust<Cell<T>>>, D::Error> {
    let live = Option::<crate::proxy::UnlessGone<Cell<T>>>::deserialize(deserializer)?;
    Ok(live.and_then(|l| l.0))
}

impl<T: Send + 'static> Serialize for Durable<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let live = codec::encoding_for().and_then(|_| self.found());
        WireDurable {
            rank: self.rank,
            name: self.name.to_string(),
            live,
        }
        .serialize(serializer)
    }
}

impl<'de, T: Send + 'static> Deserialize<'de> for Durable<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let w = WireDurable::<T>::deserialize(deserializer)?;
        Ok(Durable {
            rank: w.rank,
            name: w.name.into(),
            trust: Arc::new(Mutex::new(w.live)),
        })
    }
}

impl Node {
    /// Opens the durable property `name` on this node, creating it with `init()` if its rank's
    /// state has none (`init` must capture nothing: it runs there). Only the calling fiber
    /// waits, on the replay of its log when the property is reopened.
    ///
    /// # Errors
    /// The property exists with another type, its state was written by a build this one
    /// cannot replay, or the store fails; each error names the property and the cause.
    pub fn durable<T, I>(self, name: &str, init: I) -> Result<Durable<T>, DurableError>
    where
        T: Wire,
        I: FnOnce() -> T + Send + 'static,
    {
        crate::capture_free::check!(I);
        let trust = if self.rank == this_node().rank {
            cell::open::<T>(name, Some(init))?
        } else {
            std::mem::forget(init);
            let opened = until_answered(self.rank, || {
                Ok(spawn_on(self, open_here::<T, I>, name.to_string()).join_or_failure()??)
            });
            opened.map_err(|e| match e {
                CallError::Open(e) => e,
                _ => DurableError::Unavailable {
                    name: name.into(),
                    rank: self.rank,
                },
            })?
        };
        Ok(Durable {
            rank: self.rank,
            name: name.into(),
            trust: Arc::new(Mutex::new(Some(trust))),
        })
    }
}

/// Runs on the property's node: opens it, creating it with `I` if needed.
fn open_here<T: Wire, I: FnOnce() -> T + Send + 'static>(
    name: String,
) -> Result<Trust<Cell<T>>, DurableError> {
    cell::open::<T>(&name, Some(crate::capture_free::conjure::<I>()))
}

/// Runs on the property's node: opens it if it exists.
fn find_here<T: Wire>(name: String) -> Result<Trust<Cell<T>>, DurableError> {
    cell::open::<T>(&name, None::<fn() -> T>)
}

impl<T: Send + 'static> Durable<T> {
    /// The live property, if this process found it already.
    fn found(&self) -> Option<Trust<Cell<T>>> {
        self.trust.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn keep(&self, trust: &Trust<Cell<T>>) {
        *self.trust.lock().unwrap_or_else(|p| p.into_inner()) = Some(trust.clone());
    }

    /// Forgets the live property: its rank was lost, and its next life has it anew.
    fn forget(&self) {
        self.trust.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

impl<T: Wire> Durable<T> {
    /// The property's node.
    pub fn node(&self) -> Node {
        Node { rank: self.rank }
    }

    /// The property's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The live property, found (and reopened from its store if need be) where it lives.
    pub(crate) fn resolve(&self) -> Result<Trust<Cell<T>>, Missed> {
        if let Some(t) = self.found() {
            return Ok(t);
        }
        let found = if self.rank == this_node().rank {
            find_here::<T>(self.name.to_string())
        } else {
            spawn_on(self.node(), find_here::<T>, self.name.to_string()).join_or_failure()?
        }?;
        self.keep(&found);
        Ok(found)
    }

    /// Makes one call with `f` on the property and waits for its answer; made again under the
    /// same id after each loss of the property's rank (see [`until_answered`]).
    pub(crate) fn send<A: Wire + Clone, R: Wire>(
        &self,
        f: impl CellOp<T, A, R>,
        args: A,
    ) -> Result<R, CallError> {
        // Only a job that recovers lost ranks can lose a call and send it again.
        let keep = crate::state::recovering();
        let mut args = Some(args);
        until_answered(self.rank, || {
            let trust = self.resolve()?;
            // Without recovery there is one attempt: the call need not be kept.
            let sent = if keep { args.clone() } else { args.take() };
            let answer = trust.try_apply_deferred_with(f, sent.expect("one attempt"));
            if answer.is_err() {
                self.forget();
            }
            Ok(answer?)
        })
    }

    /// [`Durable::send`] without waiting: `then` gets the answer on this worker, in delegated
    /// context.
    fn send_then<A: Wire + Clone, R: Wire>(
        &self,
        f: impl CellOp<T, A, R>,
        args: A,
        down_since: Option<Instant>,
        then: impl FnOnce(Result<R, CallError>) + 'static,
    ) {
        // The usual case, and the cheap one: the property was found before.
        if let Some(trust) = self.found() {
            return self.send_to(trust, f, args, down_since, then);
        }
        let this = self.clone();
        let found = move |found: Result<Trust<Cell<T>>, Missed>| match found {
            Ok(trust) => {
                this.keep(&trust);
                this.send_to(trust, f, args, down_since, then);
            }
            Err(Missed::Open(e)) => then(Err(CallError::Open(e))),
            Err(Missed::Lost(Failure::Lost(_))) => this.send_again(f, args, down_since, then),
            Err(Missed::Lost(other)) => call::raise(other),
        };
        if self.rank == this_node().rank {
            return found(self.resolve());
        }
        spawn_on_then(
            self.node(),
            find_here::<T>,
            self.name.to_string(),
            move |f| {
                found(
                    f.map_err(Missed::from)
                        .and_then(|f| f.map_err(Missed::from)),
                )
            },
        );
    }

    /// Sends the call to the property `trust`; `then` gets the answer, or the call goes again
    /// once the rank is back if it was lost.
    fn send_to<A: Wire + Clone, R: Wire>(
        &self,
        trust: Trust<Cell<T>>,
        f: impl CellOp<T, A, R>,
        args: A,
        down_since: Option<Instant>,
        then: impl FnOnce(Result<R, CallError>) + 'static,
    ) {
        // Without recovery no call is lost: none is kept to send again.
        let kept = crate::state::recovering().then(|| (self.clone(), args.clone()));
        trust.try_apply_deferred_then_with(f, args, move |answer| match (answer, kept) {
            (Ok(r), _) => then(Ok(r)),
            (Err(Failure::Lost(_)), Some((this, args))) => {
                this.forget();
                this.send_again(f, args, down_since, then);
            }
            (Err(other), _) => call::raise(other),
        });
    }

    /// Sends a call whose rank was lost again once the rank is back, or answers it
    /// [`CallError::Unavailable`] after `GSM_RECOVERY_TIMEOUT`.
    fn send_again<A: Wire + Clone, R: Wire>(
        &self,
        f: impl CellOp<T, A, R>,
        args: A,
        down_since: Option<Instant>,
        then: impl FnOnce(Result<R, CallError>) + 'static,
    ) {
        let since = down_since.unwrap_or_else(Instant::now);
        let this = self.clone();
        recovery::when_rank_up(self.rank, since + recovery_timeout(), move |up| {
            if up {
                this.send_then(f, args, Some(since), then);
            } else {
                then(Err(CallError::Unavailable {
                    rank: this.rank,
                    waited: since.elapsed(),
                }));
            }
        });
    }

    /// Calls `op` and waits for its output; only the calling fiber waits. The output comes
    /// once the call's record is durable; a retry of the same call never runs it again. When
    /// the property's rank is lost on the way (under `gsm run --recover`), the call is sent
    /// again under the same id once the rank is back, so it runs once.
    ///
    /// # Errors
    /// The property cannot be opened ([`CallError::Open`]), or its rank stayed lost for
    /// `GSM_RECOVERY_TIMEOUT` ([`CallError::Unavailable`]).
    ///
    /// # Panics
    /// In delegated context (use [`Durable::call_then`]); when the op panicked (the panic
    /// is raised here, and the property is as if the call never ran); when `O` is not
    /// registered with [`durable_ops!`](crate::durable_ops).
    pub fn call<O: Op<T>>(&self, op: O) -> Result<O::Output, CallError> {
        let (mut args, done) = client::start::<T, O>(&op, true);
        if !done.within() {
            done.wait_within(&mut args);
        }
        let answer = self.send(cell::run::<T, O>, args)?;
        done.finish();
        cell::output(&self.name, O::NAME, answer)
    }

    /// Calls `op` without waiting: `then(output)` runs later on this worker. Allowed in
    /// delegated context.
    ///
    /// # Panics
    /// As [`Durable::call`], except that an op's panic goes to this runtime's panic handler.
    pub fn call_then<O, Then>(&self, op: O, then: Then)
    where
        O: Op<T>,
        Then: FnOnce(Result<O::Output, CallError>) + 'static,
    {
        self.call_then_as(op, then, true);
    }

    /// [`Durable::call_then`] without the exactly-once record: logged, never answered from
    /// a record. Only the benchmark's baseline for what exactly-once costs.
    #[doc(hidden)]
    pub fn call_then_without_dedup<O, Then>(&self, op: O, then: Then)
    where
        O: Op<T>,
        Then: FnOnce(Result<O::Output, CallError>) + 'static,
    {
        self.call_then_as(op, then, false);
    }

    fn call_then_as<O, Then>(&self, op: O, then: Then, dedup: bool)
    where
        O: Op<T>,
        Then: FnOnce(Result<O::Output, CallError>) + 'static,
    {
        let (args, done) = client::start::<T, O>(&op, dedup);
        if done.within() {
            return self.send_started::<O>(args, done, then);
        }
        let this = self.clone();
        done.when_within(args, move |args, done| {
            this.send_started::<O>(args, done, then)
        });
    }

    /// Sends a started call of `O`; `then` gets its output.
    fn send_started<O: Op<T>>(
        &self,
        args: format::CallArgs,
        done: client::Started,
        then: impl FnOnce(Result<O::Output, CallError>) + 'static,
    ) {
        let name = self.name.clone();
        self.send_then(cell::run::<T, O>, args, None, move |answer| {
            done.finish();
            then(answer.and_then(|a| cell::output(&name, O::NAME, a)));
        });
    }

    /// How many calls the property made to others ([`Cx::call`]) wait for their answer's
    /// continuation: 0 once every one of them has run.
    ///
    /// # Errors
    /// As [`Durable::read`].
    ///
    /// # Panics
    /// In delegated context.
    pub fn calls_in_flight(&self) -> Result<usize, CallError> {
        fn count<T: Wire>(c: &mut Cell<T>, (): (), reply: trust::Reply<usize>) {
            let _ = reply.send(c.pending_calls().len()); // Err: the caller is gone
        }
        self.send(count::<T>, ())
    }

    /// Runs `f` on the committed state and returns its result, without logging anything:
    /// the answer leaves once every call the property ran before it is durable. `f` must
    /// capture nothing (pass what it needs with [`Durable::read_with`]). Only the calling
    /// fiber waits; when the property's rank is lost on the way, the read is made again
    /// once the rank is back.
    ///
    /// ```no_run
    /// # use gossamer::durable::{Cx, Op};
    /// # #[derive(serde::Serialize, serde::Deserialize, Default)] struct Account { balance: i64 }
    /// let code = gossamer::Rack::from_env().run(|| {
    ///     let node = gossamer::nodes().last().unwrap();
    ///     let alice = node.durable("alice", Account::default).unwrap();
    ///     match alice.read(|a| a.balance) {
    ///         Ok(balance) => println!("alice has {balance}"),
    ///         Err(e) => println!("no answer: {e}"), // its rank stayed down, say
    ///     }
    /// });
    /// # assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// ```
    ///
    /// # Errors
    /// The property cannot be opened where it lives ([`CallError::Open`]), or its rank stayed
    /// lost for `GSM_RECOVERY_TIMEOUT` ([`CallError::Unavailable`]).
    ///
    /// # Panics
    /// In delegated context; when `f` panics.
    pub fn read<R, F>(&self, f: F) -> Result<R, CallError>
    where
        R: Wire,
        F: FnOnce(&T) -> R + Send + 'static,
    {
        /// `F` with the unit argument: a function item, so it captures nothing either.
        fn without_argument<T, R, F: FnOnce(&T) -> R>(state: &T, (): ()) -> R {
            crate::capture_free::conjure::<F>()(state)
        }
        crate::capture_free::check!(F);
        std::mem::forget(f);
        self.read_with(without_argument::<T, R, F>, ())
    }

    /// [`Durable::read`] with an argument: runs `f(state, argument)`, the way
    /// [`Trust::apply_with`](crate::Trust::apply_with) passes data to a closure that captures
    /// nothing.
    ///
    /// ```no_run
    /// # #[derive(serde::Serialize, serde::Deserialize, Default)] struct Book { lines: Vec<String> }
    /// let code = gossamer::Rack::from_env().run(|| {
    ///     let node = gossamer::nodes().last().unwrap();
    ///     let book = node.durable("book", Book::default).unwrap();
    ///     let line = book.read_with(|b, n: usize| b.lines.get(n).cloned(), 3).unwrap();
    ///     println!("line 3: {line:?}");
    /// });
    /// # assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// ```
    ///
    /// # Errors
    /// As [`Durable::read`].
    ///
    /// # Panics
    /// As [`Durable::read`].
    pub fn read_with<A, R, F>(&self, f: F, argument: A) -> Result<R, CallError>
    where
        A: Wire + Clone,
        R: Wire,
        F: FnOnce(&T, A) -> R + Send + 'static,
    {
        crate::capture_free::check!(F);
        std::mem::forget(f);
        self.send(cell::read::<T, A, R, F>, argument)
    }
}
