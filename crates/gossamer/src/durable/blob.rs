//! Blobs: immutable bytes that a durable property or session makes, controls and passes to
//! ops by reference (seed 001, §4.1).
//!
//! A blob's bytes are a file in its maker's rank directory (`blobs/`), written before the
//! blob exists; what the blob is — its length, SHA-256, controller and leases — is kept in
//! its maker's durable state ([`Blobs`], in every snapshot) and changed only by logged
//! records. A [`Blob`] handle names the maker (rank, property, state type), the blob's id
//! there, its length and hash.
//!
//! The protocol:
//! - **Passing leases.** A call whose op carries blobs lists them (its `CallArgs`, collected
//!   as the op is encoded). Before the called property (the lessee) runs such a call for the
//!   first time, it notes in memory that the call is taking its leases, and a fiber of its
//!   worker leases each blob at its maker for that call (a logged [`Change`] there, with a
//!   number the lessee's process draws for this ask: a *take*) and fetches the bytes; then
//!   the op runs with them ([`Cx::read`]), and the call's record lists the blobs. Running
//!   the call (staging its record) and ending the note are one step on the lessee's
//!   trustee; a call refused because a lease or a fetch failed ends its note after asking
//!   its makers to unlease. A blob freed meanwhile answers the call with
//!   [`BlobError::Gone`], without running it.
//! - **The lease ends when the callee's snapshot covers the op**: until then a replay runs
//!   the op again and fetches the bytes again. Each snapshot turns the leases of the calls
//!   before it into unlease notices, kept in the snapshot until their maker acknowledges
//!   them, and sent once the snapshot is durable (again by a later process if need be).
//! - **No free while leased**, and only the controller frees. A freed blob's file goes once
//!   a snapshot of its maker covers the free (a replay from an older one reads it), unless a
//!   blob made since with the same bytes uses it.
//! - **Files without a blob go when their maker opens.** A blob's file is
//!   `blobs/<maker's store id>-<SHA-256>` (blobs of one maker with the same bytes share it).
//!   When a property or session is rebuilt from its snapshot and log, every file of its own
//!   (by the id in the name: other properties' files in the rank's `blobs/` are not
//!   touched) whose hash no blob of the snapshot, of the replayed records, or of a free not
//!   yet covered by a snapshot uses is deleted, and so are its leftover temporary files.
//!   Those are bytes written for a blob whose making never became durable (the process
//!   was killed between writing them and logging the op or `Session::blob`'s record that
//!   made it, or the op panicked), or of a free whose snapshot was durable before its file
//!   went. A blob whose making record is durable is made again by the replay, so its file
//!   stays. A blob id is given by the maker's logged state, and a handle leaves only with
//!   a durable record (an answer, an outgoing call), so no handle names an id whose making
//!   was not logged; a file is named by its hash, never by an id.
//! - **A refused free asks the lessees.** When a free is refused because the blob is leased,
//!   the maker asks each lessee, one message each, whether it may still need its lease. The
//!   lessee (opened by the question if its process has not opened it: its log rebuilds what it
//!   holds) answers yes while a call is taking the lease, while a record that lists it is not
//!   covered by a durable snapshot (it is among the calls since the last snapshot), or while
//!   the unlease is owed (noted by a snapshot, not acknowledged); and no otherwise. For each
//!   no, the maker logs a drop of the takes it asked about, and tries the free once more (a
//!   free by an op of the maker itself, [`Cx::free`], which cannot wait, is refused, and its
//!   lessees are asked once the op has run: a later free goes). A lessee that cannot be asked
//!   (its rank lost) or cannot tell (it cannot be opened) keeps its lease. This ends a lease
//!   whose call never ran: the lessee's process took it and ended before the call's record was
//!   durable, so the call never ran and was never answered, and the client that would send it
//!   again (a thread of an ended process) never does. It is sound because a no means that no
//!   replay of the lessee needs the bytes (no record since its last snapshot lists the lease,
//!   by its log, and no unlease of it is owed; a record is staged in the same trustee step that
//!   ends the note) and no call of its present process is taking it; a call that takes it after
//!   the answer is a new take, which the drop does not touch (a drop names takes, an unlease
//!   the whole lease). If such a call is sent again later and the free went through meanwhile,
//!   its lease is refused and it is answered [`BlobError::Gone`] without running: at most once.
//! - **Returning a blob hands control back**: an op whose output carries a blob its property
//!   made gives control of it to the calling session or property (a thread cannot hold one).
//! - **Fetching in pieces.** A fetch ([`Blob::read`], a call's lease, a replay) asks the
//!   maker's node for the bytes in pieces, one message each, of at most half the fetching
//!   node's `GSM_MAX_MESSAGE` and at most 4 MiB (the maker answers at most its own piece
//!   length, whatever is asked); an answer of no bytes or of more than asked is refused as
//!   [`BlobError::Damaged`], and so is a whole that does not match the blob's SHA-256 (it
//!   is checked once, at the end). A file gone (freed) or of another length than the
//!   handle's answers [`BlobError::Gone`].
//!
//! Limits: a blob's length is not bounded by `GSM_MAX_MESSAGE`; it is held whole in memory
//! where it is made (the caller's bytes), where its file is read by its own property
//! ([`Cx::read`]), and where it is fetched (the op's [`Cx::read`], or [`Blob::read`]), so it
//! must fit those nodes' memory and disk. A lease whose call never ran is dropped only when a
//! free of its blob finds it (there is no timer; the blob stays until then), and that free then
//! goes through unless another lease is still needed. A property's unlease notices go when it
//! snapshots and when it is opened (a refused free's question opens it), so a refused free may
//! have to be tried again once those are acknowledged. A file without a blob stays until its
//! maker is next opened by a process.
//!
//! [`Cx::read`]: super::Cx::read
//! [`Cx::free`]: super::Cx::free

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::node::Node;

/// The op name of a record that changes the blobs a property made (a lease, an unlease, a
/// free asked by another): its argument is a [`Change`], and it has no client.
pub(crate) const CHANGE: &str = "gossamer.blobs";

/// A durable property that makes, controls or leases blobs: its rank and name. A session is
/// the property `gossamer.session/<name>` of its rank.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub(crate) struct Holder {
    pub(crate) rank: u32,
    pub(crate) property: String,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\" on rank {}", self.property, self.rank)
    }
}

/// What a blob handle holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct Fields {
    maker: Holder,
    /// The maker's state type: finds its registry entries from any rank.
    state_type: String,
    id: u64,
    len: u64,
    hash: [u8; 32],
}

/// Immutable bytes kept durably by the property or session that made them, passed to ops by
/// reference: a call carries the handle, and the called property fetches the bytes before
/// its op runs ([`Cx::read`](super::Cx::read)).
///
/// A session makes one with [`Session::blob`](super::Session::blob), an op with
/// [`Cx::blob`](super::Cx::blob); its controller frees it
/// ([`Session::free`](super::Session::free), [`Cx::free`](super::Cx::free)), never while a
/// call that carried it may still be replayed.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Blob(Fields);

/// A blob handle kept as data (a session's log of its calls): serializing it passes
/// nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Kept(Fields);

impl From<Blob> for Kept {
    fn from(b: Blob) -> Kept {
        Kept(b.0)
    }
}

impl From<Kept> for Blob {
    fn from(k: Kept) -> Blob {
        Blob(k.0)
    }
}

/// The state of this thread's blob collection: how many [`collecting`] calls run (while
/// any does, a blob serialized is noted in `CARRIED`), and how many blobs `CARRIED` holds.
/// One `Cell`, read and written twice per collection: most encodes carry no blob.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Collect {
    depth: u32,
    carried: u32,
}

thread_local! {
    static COLLECT: Cell<Collect> = const { Cell::new(Collect { depth: 0, carried: 0 }) };
    static CARRIED: RefCell<Vec<Blob>> = const { RefCell::new(Vec::new()) };
}

impl Serialize for Blob {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let state = COLLECT.get();
        if state.depth > 0 {
            CARRIED.with(|c| c.borrow_mut().push(self.clone()));
            COLLECT.set(Collect {
                carried: state.carried + 1,
                ..state
            });
        }
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Fields::deserialize(deserializer).map(Blob)
    }
}

/// Runs `encode`; returns what it made and the blobs it serialized, each once, in order.
/// Every op and output is encoded through here, and most carry no blob: then this costs
/// two reads and two writes of one thread-local `Cell`.
pub(crate) fn collecting<R>(encode: impl FnOnce() -> R) -> (R, Vec<Blob>) {
    /// Puts the state back as it was, dropping what was noted, when `encode` panics.
    struct Unwinding(Collect);
    impl Drop for Unwinding {
        fn drop(&mut self) {
            CARRIED.with(|c| c.borrow_mut().truncate(self.0.carried as usize));
            COLLECT.set(self.0);
        }
    }
    let before = COLLECT.get();
    COLLECT.set(Collect {
        depth: before.depth + 1,
        ..before
    });
    let unwinding = Unwinding(before);
    let made = encode();
    std::mem::forget(unwinding);
    let after = COLLECT.get();
    COLLECT.set(before);
    if after.carried == before.carried {
        return (made, Vec::new());
    }
    let mut blobs = CARRIED.with(|c| c.borrow_mut().split_off(before.carried as usize));
    if blobs.len() > 1 {
        let mut seen = BTreeSet::new();
        blobs.retain(|b| seen.insert((b.0.maker.clone(), b.0.id)));
    }
    (made, blobs)
}

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "blob {} of {} ({} bytes)",
            self.0.id, self.0.maker, self.0.len
        )
    }
}

impl Blob {
    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.0.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// The SHA-256 of its bytes.
    pub fn hash(&self) -> [u8; 32] {
        self.0.hash
    }

    /// The node and name of the property or session that made it (a session's is
    /// `gossamer.session/<name>`).
    pub fn maker(&self) -> (Node, &str) {
        (
            Node {
                rank: self.0.maker.rank,
            },
            &self.0.maker.property,
        )
    }

    pub(crate) fn state_type(&self) -> &str {
        &self.0.state_type
    }

    pub(crate) fn maker_holder(&self) -> &Holder {
        &self.0.maker
    }

    pub(crate) fn id(&self) -> u64 {
        self.0.id
    }
}

/// Why a blob could not be made, read, passed or freed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum BlobError {
    /// The blob was freed (or never made).
    Gone {
        /// The blob, as its `Display` names it.
        blob: String,
    },
    /// A free while calls that carried the blob may still be replayed.
    Leased {
        /// The blob.
        blob: String,
        /// How many calls hold it.
        leases: usize,
    },
    /// A free by a holder that does not control the blob.
    NotController {
        /// The blob.
        blob: String,
        /// Who controls it.
        controller: String,
    },
    /// [`Cx::read`](super::Cx::read) of a blob the running call did not carry (nor its
    /// property make).
    NotCarried {
        /// The blob.
        blob: String,
    },
    /// The bytes fetched from its maker are not the blob's: a piece of the wrong length,
    /// or a whole that does not match its SHA-256 (the maker's file is damaged).
    Damaged {
        /// The blob.
        blob: String,
        /// What was wrong.
        why: String,
    },
    /// The bytes could not be written to the maker's store.
    Store {
        /// Why.
        why: String,
    },
    /// Its maker could not be reached or opened.
    Unavailable {
        /// The blob.
        blob: String,
        /// Why.
        why: String,
    },
}

impl fmt::Display for BlobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlobError::Gone { blob } => write!(f, "{blob} was freed"),
            BlobError::Leased { blob, leases } => write!(
                f,
                "{blob} cannot be freed: {leases} call(s) that carried it may still be replayed \
                 (a lease ends once the called property's snapshot covers the call)"
            ),
            BlobError::NotController { blob, controller } => {
                write!(
                    f,
                    "{blob} is controlled by {controller}, which alone frees it"
                )
            }
            BlobError::NotCarried { blob } => write!(
                f,
                "{blob} was not carried by this call: an op reads the blobs its op carries and \
                 those its property made"
            ),
            BlobError::Damaged { blob, why } => {
                write!(f, "{blob} could not be fetched whole: {why}")
            }
            BlobError::Store { why } => write!(f, "a blob's bytes cannot be kept: {why}"),
            BlobError::Unavailable { blob, why } => write!(f, "{blob} cannot be reached: {why}"),
        }
    }
}

impl std::error::Error for BlobError {}

/// A call's hold on a blob: the called property and the call's id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct Lease {
    pub(crate) lessee: Holder,
    pub(crate) client: u64,
    pub(crate) seq: u64,
}

/// A blob a property made and has not freed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Made {
    len: u64,
    hash: [u8; 32],
    controller: Holder,
    /// Each lease, with the takes that made it (a lessee's process draws a fresh number
    /// each time it asks): a lease dropped because its lessee did not need it drops only
    /// the takes it asked about.
    leases: BTreeMap<Lease, BTreeSet<u64>>,
}

/// A change to the blobs a property made, asked by another property or session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Change {
    /// Not a change: whether the blob is still made (never logged).
    Check {
        id: u64,
    },
    /// A lessee takes a lease (`take`: a number its process drew for this ask).
    Lease {
        id: u64,
        lease: Lease,
        take: u64,
    },
    /// The lessee is done with the lease: every take of it ends.
    Unlease {
        id: u64,
        lease: Lease,
    },
    /// The lessee, asked after a refused free, had no call needing the lease: the takes the
    /// maker asked about end (not one taken since).
    Drop {
        id: u64,
        lease: Lease,
        takes: Vec<u64>,
    },
    Free {
        id: u64,
        by: Holder,
    },
}

/// What a property owes the makers of blobs it used: each sent until acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Notice {
    /// A call that carried the blob is covered by a snapshot.
    Unlease { blob: Blob, lease: Lease },
    /// The property, its controller, frees it.
    Free { blob: Blob },
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::Unlease { blob, lease } => write!(
                f,
                "an unlease of {blob} (call {:016x} seq {})",
                lease.client, lease.seq
            ),
            Notice::Free { blob } => write!(f, "a free of {blob}"),
        }
    }
}

/// The blobs a property made, and the notices it owes: part of its durable state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Blobs {
    next: u64,
    made: BTreeMap<u64, Made>,
    pub(crate) notices: Vec<Notice>,
}

/// What a change did to the maker's files: the hash whose last blob went, if any.
pub(crate) type Unused = Option<[u8; 32]>;

impl Blobs {
    /// Adds a blob of `len` bytes of SHA-256 `hash`, made and controlled by `me`.
    pub(crate) fn make(&mut self, me: &Holder, state_type: &str, len: u64, hash: [u8; 32]) -> Blob {
        let id = self.next;
        self.next += 1;
        let made = Made {
            len,
            hash,
            controller: me.clone(),
            leases: BTreeMap::new(),
        };
        self.made.insert(id, made);
        Blob(Fields {
            maker: me.clone(),
            state_type: state_type.into(),
            id,
            len,
            hash,
        })
    }

    /// Whether `blob` is one `me` made and has not freed.
    pub(crate) fn has(&self, me: &Holder, blob: &Blob) -> bool {
        blob.0.maker == *me && self.made.contains_key(&blob.0.id)
    }

    /// Applies `change` to the blob it names (one `me` made). A lease of a freed blob is
    /// refused; an unlease or a free of one is done already.
    pub(crate) fn apply(&mut self, me: &Holder, change: &Change) -> Result<Unused, BlobError> {
        let name = |id: u64| format!("blob {id} of {me}");
        match change {
            Change::Check { id } if self.made.contains_key(id) => Ok(None),
            Change::Check { id } => Err(BlobError::Gone { blob: name(*id) }),
            Change::Lease { id, lease, take } => match self.made.get_mut(id) {
                Some(made) => {
                    made.leases.entry(lease.clone()).or_default().insert(*take);
                    Ok(None)
                }
                None => Err(BlobError::Gone { blob: name(*id) }),
            },
            Change::Drop { id, lease, takes } => {
                if let Some(made) = self.made.get_mut(id)
                    && let Some(held) = made.leases.get_mut(lease)
                {
                    for take in takes {
                        held.remove(take);
                    }
                    if held.is_empty() {
                        made.leases.remove(lease);
                    }
                }
                Ok(None)
            }
            Change::Unlease { id, lease } => {
                if let Some(made) = self.made.get_mut(id) {
                    made.leases.remove(lease);
                }
                Ok(None)
            }
            Change::Free { id, by } => {
                let Some(made) = self.made.get(id) else {
                    return Ok(None);
                };
                if made.controller != *by {
                    return Err(BlobError::NotController {
                        blob: name(*id),
                        controller: made.controller.to_string(),
                    });
                }
                if !made.leases.is_empty() {
                    return Err(BlobError::Leased {
                        blob: name(*id),
                        leases: made.leases.len(),
                    });
                }
                let hash = made.hash;
                self.made.remove(id);
                // Blobs of one property with the same bytes share their file.
                Ok((!self.made.values().any(|m| m.hash == hash)).then_some(hash))
            }
        }
    }

    /// Hands control of `blob`, which `me` made and controls, to `to`: it was returned to
    /// them. A blob someone else controls stays theirs.
    pub(crate) fn hand_over(&mut self, me: &Holder, blob: &Blob, to: &Holder) {
        if blob.0.maker != *me {
            return;
        }
        if let Some(made) = self.made.get_mut(&blob.0.id)
            && made.controller == *me
        {
            made.controller = to.clone();
        }
    }

    /// The leases of blob `id`, each with its takes.
    pub(crate) fn leases(&self, id: u64) -> Vec<(Lease, Vec<u64>)> {
        self.made.get(&id).map_or_else(Vec::new, |m| {
            m.leases
                .iter()
                .map(|(l, takes)| (l.clone(), takes.iter().copied().collect()))
                .collect()
        })
    }

    /// The SHA-256 of every blob made and not freed: the files they need.
    pub(crate) fn hashes(&self) -> impl Iterator<Item = [u8; 32]> + '_ {
        self.made.values().map(|m| m.hash)
    }

    /// Whether the same blobs are made (whatever the notices): what a rebuild compares.
    pub(crate) fn same_made(&self, other: &Blobs) -> bool {
        self.next == other.next && self.made == other.made
    }

    /// The blobs made and not freed, with their controller and lease count: what `gsm state
    /// dump` shows.
    pub(crate) fn describe(&self) -> Vec<String> {
        self.made
            .iter()
            .map(|(id, m)| {
                format!(
                    "blob {id}: {} bytes, controlled by {}, {} lease(s)",
                    m.len,
                    m.controller,
                    m.leases.len()
                )
            })
            .collect()
    }
}
