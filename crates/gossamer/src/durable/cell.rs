//! A durable property on its trustee: the state, the completion records that answer retries,
//! and what it takes to rebuild the state (the last snapshot's bytes and the calls since).
//!
//! Everything here runs on the property's trustee, in delegated context, except `open`,
//! `create` and `recover`, which find or build the cell before it is entrusted.

use std::any::type_name;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use super::blob::{self, Blob, BlobError, Blobs, Change, Holder, Lease, Notice};

use super::client::{self, Kind, NO_DEDUP, WINDOW, property_id};
use super::crash;
use super::fetch;
use super::format::{
    self, Answer, Bytes, CallArgs, Completions, Entry, LAPSE, Lapsed, OutCall, Outcome, Outgoing,
    Passing, RecordRef, Refusal, Snapshot,
};
use super::host::{self, Host, OpenProperty, Sweep, lock};
use super::registry::{self, Registered, Resend, op_fingerprint, state_fingerprint};
use super::store::{Stored, StoredRecord, Write};
use super::{
    BlobInfo, CallError, CallInfo, DurableError, Op, SNAPSHOT_BYTES, SNAPSHOT_RECORDS,
    until_answered,
};
use crate::codec::{self, Wire};
use crate::node::{Node, spawn_on};
use crate::proxy::Trust;
use crate::state;
use trust::Reply;

/// Opens property `name` of type `T`: the one open in this process, else the stored one
/// (replayed), else a new one made by `init` (`None`: [`DurableError::NotFound`]).
pub(crate) fn open<T: Wire>(
    name: &str,
    init: Option<impl FnOnce() -> T>,
) -> Result<Trust<Cell<T>>, DurableError> {
    let host = host::host()?;
    let already = |open: &HashMap<String, OpenProperty>| {
        open.get(name).map(|p| {
            p.trust
                .downcast_ref::<Trust<Cell<T>>>()
                .cloned()
                .ok_or_else(|| DurableError::Type {
                    name: name.into(),
                    stored: p.type_name.to_string(),
                    asked: type_name::<T>().into(),
                })
        })
    };
    if let Some(found) = already(&lock(&host.open)) {
        return found;
    }
    // Read without the lock: fetching the blobs a replay needs waits for other ranks.
    let stored = match host.store.property(name) {
        Some(meta) if meta.type_name != type_name::<T>() => {
            return Err(DurableError::Type {
                name: name.into(),
                stored: meta.type_name,
                asked: type_name::<T>().into(),
            });
        }
        Some(meta) => {
            let stored = host.store.load(meta.id)?;
            // An entry with no snapshot: its process ended before the property's first
            // commit was complete, so it was never created.
            let created = !stored.snapshots.is_empty() || !stored.records.is_empty();
            created
                .then(|| read_stored(&host, name, stored))
                .transpose()?
                .map(|read| (meta.id, read))
        }
        None => None,
    };
    let mut open = lock(&host.open);
    if let Some(found) = already(&open) {
        return found; // opened meanwhile
    }
    let cell = match (stored, init) {
        (Some((id, read)), _) => {
            let cell = Cell::recover(host.clone(), id, name, read)?;
            host.store.loaded(id);
            cell
        }
        (_, Some(init)) => Cell::create(host.clone(), name, init())?,
        (_, None) => {
            return Err(DurableError::NotFound {
                name: name.into(),
                rank: state::current().map_or(0, |s| s.rank),
            });
        }
    };
    let pending = (cell.pending_calls(), (cell.caller, cell.continuations));
    let (me, notices) = (
        cell.info.blob().holder.clone(),
        cell.info.blob().blobs.notices.clone(),
    );
    let trust = crate::node::entrust(cell);
    // Its log is written on this worker: it stays (rebalancing and `migrate_to` leave it).
    trust.fix_home();
    // Calls a property made before its process ended, still unanswered: sent again (the
    // called property answers them from its records if they ran). So are its notices.
    for call in pending.0 {
        deliver(trust.clone(), pending.1, me.clone(), call);
    }
    let swept = trust.clone();
    open.insert(
        name.to_string(),
        OpenProperty {
            type_name: type_name::<T>(),
            trust: Box::new(trust.clone()),
            sweep: Box::new(move |s| {
                let trust = swept.clone();
                Box::new(move || trust.apply_with(sweep::<T>, s))
            }),
        },
    );
    drop(open);
    if !notices.is_empty() {
        send_notices::<T>(name.to_string(), notices);
    }
    Ok(trust)
}

/// A stored property as read before it is rebuilt: its newest readable snapshot, the records
/// after it, and the bytes of the blobs those calls carried.
pub(crate) struct Read {
    snapshot: Snapshot,
    records: Vec<StoredRecord>,
    fetched: HashMap<Blob, Arc<[u8]>>,
}

/// Picks the newest readable snapshot of a stored property, and fetches the blobs that the
/// calls of the records after it carried (from other ranks, maybe: this waits). Only the
/// records that pass something are decoded here; the rebuild decodes each record once more
/// as it replays it, as it always does.
fn read_stored(host: &Host, name: &str, stored: Stored) -> Result<Read, DurableError> {
    let corrupt = |what: String| DurableError::Store {
        dir: host.dir.clone(),
        why: format!("property \"{name}\": {what}"),
    };
    let mut newest = None;
    let mut errors = Vec::new();
    for (lsn, bytes) in &stored.snapshots {
        let read = bytes
            .as_ref()
            .map_err(String::clone)
            .and_then(|b| format::decode::<Snapshot>(b).map_err(|e| e.to_string()));
        match read {
            // An older snapshot stands in for a newer one only with every record after it,
            // which a knowing cut of the log since may have removed.
            Ok(_) if !errors.is_empty() && *lsn <= stored.cut => {
                errors.push(format!(
                    "the older snapshot at LSN {lsn} is not used: the log was cut knowingly \
                     after it (`gsm state cut`, LSNs continuing after {}), so records after it may be gone",
                    stored.cut
                ));
                break;
            }
            Ok(s) => {
                newest = Some(s);
                break;
            }
            Err(e) => errors.push(format!("snapshot at LSN {lsn}: {e}")),
        }
    }
    let Some(snapshot) = newest else {
        return Err(corrupt(if errors.is_empty() {
            "no snapshot".into()
        } else {
            errors.join("; ")
        }));
    };
    let mut fetched = HashMap::new();
    let me = blob::Holder {
        rank: state::current().map_or(0, |s| s.rank),
        property: name.into(),
    };
    let records: Vec<StoredRecord> = stored
        .records
        .into_iter()
        .filter(|(lsn, ..)| *lsn > snapshot.lsn)
        .collect();
    for (lsn, bytes, _) in records.iter().filter(|(_, b, _)| format::record_passes(b)) {
        let r = decode_record(*lsn, bytes).map_err(corrupt)?;
        // A replay reads the property's own blobs from its files, and those of a call
        // that panicked not at all.
        if !matches!(r.outcome, Outcome::Returned(_)) {
            continue;
        }
        let carried = r.passing.iter().flat_map(|p| &p.blobs);
        for b in carried.filter(|b| *b.maker_holder() != me) {
            if !fetched.contains_key(b) {
                let bytes = fetch::fetch(b)
                    .map_err(|e| corrupt(format!("LSN {lsn} carried {b}, which is lost: {e}")))?;
                fetched.insert(b.clone(), bytes);
            }
        }
    }
    Ok(Read {
        snapshot,
        records,
        fetched,
    })
}

/// The record stored at `lsn`, or why those bytes are not one.
fn decode_record(lsn: u64, bytes: &[u8]) -> Result<format::Record, String> {
    match format::decode::<Entry>(bytes) {
        Ok(Entry::Record(r)) => Ok(r),
        Ok(other) => Err(format!("LSN {lsn} is not a record: {other:?}")),
        Err(e) => Err(format!("the record at LSN {lsn}: {e}")),
    }
}

/// A call since the last snapshot, as a rebuild runs it again.
struct Logged {
    lsn: u64,
    /// The op's registry entry: its name, and what runs it again.
    entry: registry::Entry,
    argument: Bytes,
    /// The blobs it carried, with their bytes, and its caller; `None` for most calls, which
    /// have neither.
    passing: Option<Box<(Carried, Option<Holder>)>>,
    /// Whether it returned, and a hash of its outcome: what a rebuild compares.
    outcome: (bool, u64),
}

/// A record since the last snapshot, as a rebuild applies it again.
enum Since {
    Call(Logged),
    /// A change to the blobs the property made.
    Blobs(Change),
}

/// The blobs a call carried, with their bytes.
type Carried = Vec<(Blob, Arc<[u8]>)>;

/// What a rebuild compares of an outcome.
fn summary(outcome: &Outcome) -> (bool, u64) {
    match outcome {
        Outcome::Returned(b) => (true, crate::hash::fnv1a(b)),
        Outcome::Panicked(m) => (false, crate::hash::fnv1a(m.as_bytes())),
    }
}

pub(crate) struct Cell<T> {
    host: Arc<Host>,
    id: u32,
    info: CallInfo,
    state: T,
    completions: Completions,
    /// Its calls to other properties, and the client ids it makes them (and takes their
    /// answers) as.
    outgoing: Outgoing,
    caller: u64,
    continuations: u64,
    /// The newest LSN its trustee staged for it (record or snapshot); 0 when everything it
    /// holds was durable before it opened. A read's answer waits for this one.
    staged: u64,
    /// The state at the last snapshot, encoded, and its blobs then.
    base: Vec<u8>,
    base_blobs: Blobs,
    since: Vec<Since>,
    since_bytes: usize,
    /// The leases of the calls since the last snapshot, by their record's LSN: they end
    /// once a snapshot covers them.
    leased: Vec<(u64, Blob, Lease)>,
    /// The leases calls that have not run yet are taking (asked for or taken, bytes being
    /// fetched): noted before the first ask leaves, gone when the call runs or is refused.
    taking: Vec<(Blob, Lease)>,
}

/// The state's bytes, or why it cannot be saved.
fn encode_state<T: Wire>(name: &str, state: &T) -> Result<Vec<u8>, DurableError> {
    postcard::to_allocvec(state).map_err(|e| {
        let why = e.to_string();
        DurableError::State {
            name: name.into(),
            why: if why.contains(codec::NOT_IN_A_CALL) {
                "it holds a volatile gossamer::Trust, which cannot outlive its process; \
                 hold a gossamer::durable::Durable<T> instead"
                    .into()
            } else {
                why
            },
        }
    })
}

impl<T: Wire> Cell<T> {
    fn new(host: Arc<Host>, id: u32, name: &str, state: T, base: Vec<u8>) -> Self {
        let rank = state::current().map_or(0, |s| s.rank);
        let holder = Holder {
            rank,
            property: name.into(),
        };
        let (rank, id_bytes) = (rank.to_le_bytes(), id.to_le_bytes());
        Cell {
            outgoing: Outgoing::default(),
            caller: property_id(&[b"property", &rank, &id_bytes]),
            continuations: property_id(&[b"continuations", &rank, &id_bytes]),
            host,
            id,
            info: CallInfo {
                property: name.into(),
                blob: Some(Box::new(BlobInfo {
                    holder,
                    store_id: id,
                    state_type: type_name::<T>(),
                    ..BlobInfo::default()
                })),
                ..CallInfo::default()
            },
            state,
            completions: Completions::new(),
            staged: 0,
            base,
            base_blobs: Blobs::default(),
            since: Vec::new(),
            since_bytes: 0,
            leased: Vec::new(),
            taking: Vec::new(),
        }
    }

    /// A new property: its entry and first snapshot are committed before it is used.
    pub(crate) fn create(host: Arc<Host>, name: &str, state: T) -> Result<Self, DurableError> {
        let base = encode_state(name, &state)?;
        let meta = host.store.new_property(name, type_name::<T>());
        let id = meta.id;
        let cell = Cell::new(host, id, name, state, base);
        let lsn = cell.host.next_lsn();
        let snapshot = cell.snapshot(lsn);
        cell.host
            .commit_now(vec![Write::Property(meta), snapshot])?;
        Ok(cell)
    }

    /// A stored property, rebuilt from its newest readable snapshot and the records after it
    /// (as [`read_stored`] read them).
    pub(crate) fn recover(
        host: Arc<Host>,
        id: u32,
        name: &str,
        read: Read,
    ) -> Result<Self, DurableError> {
        let corrupt = |what: String| DurableError::Store {
            dir: host.dir.clone(),
            why: format!("property \"{name}\": {what}"),
        };
        let incompatible = |why: String, build: &str| DurableError::Incompatible {
            name: name.into(),
            why,
            written_by: build.into(),
        };
        let Read {
            snapshot: snap,
            records,
            fetched,
        } = read;
        let state: T = postcard::from_bytes(&snap.state)
            .map_err(|e| incompatible(format!("its state does not decode: {e}"), &snap.build))?;
        let mut cell = Cell::new(host.clone(), id, name, state, snap.state);
        let mut found: Vec<(String, registry::Entry)> = Vec::new();
        cell.completions = snap.completions;
        cell.outgoing = snap.outgoing;
        cell.info.blob_mut().blobs = snap.blobs.clone();
        cell.base_blobs = snap.blobs;
        for (lsn, bytes, build) in &records {
            let r = decode_record(*lsn, bytes).map_err(corrupt)?;
            if r.op == LAPSE {
                let lapsed: Lapsed = postcard::from_bytes(&r.argument)
                    .map_err(|e| corrupt(format!("the lease record at LSN {lsn}: {e}")))?;
                lapse(&mut cell.completions, &lapsed);
                continue;
            }
            if r.op == blob::CHANGE {
                let change: Change = postcard::from_bytes(&r.argument)
                    .map_err(|e| corrupt(format!("the blob record at LSN {lsn}: {e}")))?;
                // It applied when it was logged, so it applies again.
                let _ = cell.change_blobs(change);
                continue;
            }
            // A log names few ops: found once each, not hashed again for every record.
            let known = found.iter().find(|(op, _)| *op == r.op).map(|&(_, e)| e);
            let entry = match known.or_else(|| registry::find(type_name::<T>(), &r.op)) {
                Some(entry) => entry,
                None => {
                    return Err(incompatible(
                        format!(
                            "its log names op \"{}\", which this build does not register for {}",
                            r.op,
                            type_name::<T>()
                        ),
                        build,
                    ));
                }
            };
            if known.is_none() {
                found.push((r.op.clone(), entry));
            }
            if entry.fingerprint != r.op_fingerprint {
                return Err(incompatible(
                    format!(
                        "op \"{}\" ({}) changed its argument or output type since it was logged",
                        r.op, entry.op_type
                    ),
                    build,
                ));
            }
            // The call's leases hold until a snapshot covers it; its bytes were fetched again.
            let (carried, holder) = match r.passing {
                None => (Carried::new(), None),
                Some(p) => {
                    let mut carried = Carried::new();
                    for b in cell.others(&p.blobs) {
                        let lease = Lease {
                            lessee: cell.info.blob().holder.clone(),
                            client: r.client,
                            seq: r.seq,
                        };
                        cell.leased.push((r.lsn, b.clone(), lease));
                        if matches!(r.outcome, Outcome::Returned(_)) {
                            let bytes = fetched.get(&b).cloned().ok_or_else(|| {
                                corrupt(format!("LSN {lsn} carried {b}, which was not fetched"))
                            })?;
                            carried.push((b, bytes));
                        }
                    }
                    (carried, p.holder)
                }
            };
            if let Outcome::Returned(logged) = &r.outcome {
                let again_carried = if carried.is_empty() {
                    Carried::new()
                } else {
                    carried.clone()
                };
                let (again, outgoing) =
                    cell.replay(entry, &r.argument, again_carried, holder.as_ref());
                cell.made_calls(outgoing, r.client, r.seq);
                if !matches!(&again, Ok(Outcome::Returned(b)) if b == logged) {
                    return Err(incompatible(
                        format!(
                            "op \"{}\" at LSN {} gives another result on replay ({again:?}) than \
                             it logged: it is not deterministic, or its code changed",
                            r.op, r.lsn
                        ),
                        build,
                    ));
                }
            }
            // Replayed records are durable: retries are answered from them at once (LSN 0).
            cell.logged(r.lsn, entry, r.argument, carried, holder, &r.outcome);
            cell.complete(r.client, r.seq, r.ack, 0, r.outcome);
        }
        // Leases count from now: how long a client was quiet before is not known.
        let now = host.clock();
        cell.completions.values_mut().for_each(|c| c.touched = now);
        cell.sweep_blob_files()?;
        Ok(cell)
    }

    /// Deletes the property's blob files that no blob of its snapshot or of the records
    /// replayed since uses: bytes written for a blob whose making never became durable (the
    /// process ended between writing them and logging the op or the `Adopt` that made the
    /// blob, or the op panicked). A blob made by a durable record was made again by its
    /// replay, so its file is kept; so are the files of blobs freed since the snapshot,
    /// which a replay from it reads (they go after the next snapshot). Runs before the
    /// property is entrusted, so nothing writes its files meanwhile.
    fn sweep_blob_files(&self) -> Result<(), DurableError> {
        let info = self.info.blob();
        let keep: std::collections::BTreeSet<[u8; 32]> = info
            .blobs
            .hashes()
            .chain(self.base_blobs.hashes())
            .chain(info.freed.iter().copied())
            .collect();
        self.host.store.sweep_blobs(self.id, &keep)?;
        Ok(())
    }

    /// Runs a logged op again (`replaying`), catching a panic; returns its outcome and the
    /// calls it made to other properties.
    fn replay(
        &mut self,
        entry: registry::Entry,
        argument: &[u8],
        carried: Carried,
        holder: Option<&Holder>,
    ) -> (Result<Outcome, String>, Vec<OutCall>) {
        self.info.replaying = true;
        let run = self.run_op(entry, argument, carried, holder);
        self.info.replaying = false;
        let outgoing = std::mem::take(&mut self.info.outgoing);
        match run {
            Ok(r) => (r, outgoing),
            Err(p) => (Ok(Outcome::Panicked(codec::panic_message(&*p))), Vec::new()),
        }
    }

    /// Stages a record of the runtime's own (`op` is [`LAPSE`] or [`blob::CHANGE`]): no
    /// client, no outcome. Returns its LSN.
    fn stage_runtime_record(&mut self, op: &'static str, argument: &[u8]) -> u64 {
        let id = self.id;
        let no_outcome = Outcome::Returned(Bytes::empty());
        self.staged = self.host.stage_record(id, |lsn, out| {
            let record = RecordRef {
                property: id,
                lsn,
                passing: None,
                client: NO_DEDUP,
                seq: 0,
                ack: 0,
                op,
                op_fingerprint: 0,
                argument,
                outcome: &no_outcome,
            };
            format::encode_record(out, record);
        });
        self.staged
    }

    /// The blobs of `blobs` another property or session made: those a call leases.
    fn others(&self, blobs: &[Blob]) -> Vec<Blob> {
        let me = &self.info.blob().holder;
        blobs
            .iter()
            .filter(|b| b.maker_holder() != me)
            .cloned()
            .collect()
    }

    /// Runs an op with the blobs its call carried, catching a panic; the blobs this property
    /// made that a returning op's output carries go to the caller (`holder`).
    fn run_op(
        &mut self,
        entry: registry::Entry,
        argument: &[u8],
        carried: Carried,
        holder: Option<&Holder>,
    ) -> std::thread::Result<Result<Outcome, String>> {
        if !carried.is_empty() {
            self.info.blob_mut().carried = carried;
        }
        let (state, info) = (&mut self.state, &mut self.info);
        let run = catch_unwind(AssertUnwindSafe(|| (entry.run)(state, argument, info)));
        // Most ops carry, read and return no blob: then there is nothing to undo here.
        let info = self.info.blob_mut();
        if !info.returned.is_empty() {
            let returned = std::mem::take(&mut info.returned);
            if let (Ok(Ok(Outcome::Returned(_))), Some(to)) = (&run, holder) {
                for b in &returned {
                    info.blobs.hand_over(&info.holder, b, to);
                }
            }
        }
        if !info.carried.is_empty() {
            info.carried.clear();
        }
        run
    }

    /// Applies a change a holder asked of the blobs this property made (logged already);
    /// a file no blob uses any more goes after the next snapshot.
    fn change_blobs(&mut self, change: Change) -> Result<(), BlobError> {
        let info = self.info.blob_mut();
        if let Some(unused) = info.blobs.apply(&info.holder, &change)? {
            info.freed.push(unused);
        }
        self.since.push(Since::Blobs(change));
        Ok(())
    }

    /// The leases of call (`client`, `seq`) on `blobs` are taken no more: it runs now (its
    /// record lists them), or was refused.
    fn took(&mut self, blobs: &[Blob], client: u64, seq: u64) {
        for b in blobs {
            let at = self
                .taking
                .iter()
                .position(|(t, l)| t == b && l.client == client && l.seq == seq);
            if let Some(at) = at {
                self.taking.swap_remove(at);
            }
        }
    }

    /// Whether this property may still need `lease` of blob `id` of `maker`: a call that
    /// has not run is taking it, or a record that no durable snapshot covers lists it (its
    /// replay fetches the bytes), or an unlease of it is owed (sent once that snapshot is
    /// durable). Otherwise no call of this process needs it, and none logged before: a
    /// call that took it and never logged its record did not run.
    fn needs(&self, maker: &Holder, id: u64, lease: &Lease) -> bool {
        let same = |b: &Blob, l: &Lease| b.maker_holder() == maker && b.id() == id && l == lease;
        self.taking.iter().any(|(b, l)| same(b, l))
            || self.leased.iter().any(|(_, b, l)| same(b, l))
            || self.info.blob().blobs.notices.iter().any(|n| match n {
                Notice::Unlease { blob, lease } => same(blob, lease),
                Notice::Free { .. } => false,
            })
    }

    /// Takes the calls a successful op made (`outgoing`) as this property's, giving them seqs;
    /// a continuation's record (`client`, `seq`) ends the call it answers.
    fn made_calls(&mut self, outgoing: Vec<OutCall>, client: u64, seq: u64) -> Vec<OutCall> {
        if client == self.continuations {
            self.outgoing.pending.remove(&seq);
        }
        outgoing.into_iter().map(|c| self.outgoing.add(c)).collect()
    }

    /// The calls this property made and has not had answered.
    pub(crate) fn pending_calls(&self) -> Vec<OutCall> {
        self.outgoing.pending.values().cloned().collect()
    }

    /// Notes call (client, seq)'s outcome and the client's acknowledgement.
    fn complete(&mut self, client: u64, seq: u64, ack: u64, lsn: u64, outcome: Outcome) {
        if client == NO_DEDUP {
            return;
        }
        let calls = self.completions.entry(client).or_default();
        calls.acknowledge(ack);
        calls.insert(seq, lsn, outcome);
    }

    fn logged(
        &mut self,
        lsn: u64,
        entry: registry::Entry,
        argument: Bytes,
        carried: Carried,
        holder: Option<Holder>,
        outcome: &Outcome,
    ) {
        self.since_bytes += argument.len()
            + carried.iter().map(|(_, b)| b.len()).sum::<usize>()
            + match outcome {
                Outcome::Returned(b) => b.len(),
                Outcome::Panicked(m) => m.len(),
            };
        let passing =
            (!carried.is_empty() || holder.is_some()).then(|| Box::new((carried, holder)));
        self.since.push(Since::Call(Logged {
            lsn,
            entry,
            argument,
            passing,
            outcome: summary(outcome),
        }));
    }

    /// The state and blobs rebuilt from the last snapshot and the records since; `Err`
    /// names the first call whose outcome differs from the one it logged.
    fn rebuild(&mut self) -> Result<(T, Blobs), String> {
        let mut state: T = postcard::from_bytes(&self.base)
            .map_err(|e| format!("the last snapshot does not decode: {e}"))?;
        std::mem::swap(&mut self.state, &mut state);
        let mut blobs = self.base_blobs.clone();
        std::mem::swap(&mut self.info.blob_mut().blobs, &mut blobs);
        let freed = self.info.blob().freed.len();
        let since = std::mem::take(&mut self.since);
        let mut failed = None;
        for record in &since {
            let l = match record {
                Since::Call(l) if l.outcome.0 => l,
                Since::Call(_) => continue,
                Since::Blobs(change) => {
                    let info = self.info.blob_mut();
                    // It applied when logged, so it applies again.
                    let _ = info.blobs.apply(&info.holder, change);
                    continue;
                }
            };
            // The calls these ops made are this property's already.
            let (again, _) = match l.passing.as_deref() {
                Some((carried, holder)) => {
                    self.replay(l.entry, &l.argument, carried.clone(), holder.as_ref())
                }
                None => self.replay(l.entry, &l.argument, Carried::new(), None),
            };
            if again.as_ref().map(summary) != Ok(l.outcome) {
                failed = Some(format!(
                    "op \"{}\" at LSN {} gave {again:?} when run again, not what it logged",
                    l.entry.name, l.lsn
                ));
                break;
            }
        }
        self.since = since;
        self.info.blob_mut().freed.truncate(freed);
        std::mem::swap(&mut self.state, &mut state);
        std::mem::swap(&mut self.info.blob_mut().blobs, &mut blobs);
        match failed {
            Some(why) => Err(why),
            None => Ok((state, blobs)),
        }
    }

    /// The snapshot write of the current state (encoded already as `base`) at `lsn`.
    fn snapshot(&self, lsn: u64) -> Write {
        let snapshot = Snapshot {
            property: self.id,
            name: self.info.property.to_string(),
            lsn,
            type_name: type_name::<T>().into(),
            fingerprint: state_fingerprint::<T>(),
            state: self.base.clone(),
            completions: self.completions.clone(),
            outgoing: self.outgoing.clone(),
            blobs: self.info.blob().blobs.clone(),
            build: self.host.store.build.to_string(),
        };
        Write::Snapshot {
            property: self.id,
            lsn,
            bytes: format::encode(&snapshot),
        }
    }

    /// Snapshots the property if its log since the last snapshot has grown past the bounds.
    /// Debug builds first check that the calls since rebuild the state exactly.
    fn maybe_snapshot(&mut self) {
        if self.since.len() < SNAPSHOT_RECORDS && self.since_bytes < SNAPSHOT_BYTES {
            return;
        }
        let bytes =
            encode_state(&self.info.property, &self.state).unwrap_or_else(|e| panic!("{e}"));
        if cfg!(debug_assertions) {
            let rebuilt = self.rebuild().and_then(|(s, blobs)| {
                let b = postcard::to_allocvec(&s).map_err(|e| e.to_string())?;
                Ok((b, blobs))
            });
            match rebuilt {
                Ok((b, blobs)) if b == bytes && blobs.same_made(&self.info.blob().blobs) => {}
                Ok(_) => panic!(
                    "durable property \"{}\": the calls since LSN {} rebuild another state \
                     than they made; an op among {:?} is not deterministic",
                    self.info.property,
                    self.since.iter().find_map(Since::lsn).unwrap_or(0),
                    distinct_ops(&self.since)
                ),
                Err(why) => panic!(
                    "durable property \"{}\": {why}; ops must be deterministic",
                    self.info.property
                ),
            }
        }
        // The calls since are covered now: their leases end once the snapshot is durable.
        for (_, blob, lease) in std::mem::take(&mut self.leased) {
            let notices = &mut self.info.blob_mut().blobs.notices;
            notices.push(Notice::Unlease { blob, lease });
        }
        self.base = bytes;
        self.base_blobs = self.info.blob().blobs.clone();
        let host = self.host.clone();
        self.staged = host.stage(|lsn| self.snapshot(lsn));
        self.since.clear();
        self.since_bytes = 0;
        let mut freed = std::mem::take(&mut self.info.blob_mut().freed);
        // A blob made since with the same bytes uses the file again.
        let made: std::collections::BTreeSet<[u8; 32]> = self.info.blob().blobs.hashes().collect();
        freed.retain(|hash| !made.contains(hash));
        let (id, notices) = (self.id, self.info.blob().blobs.notices.clone());
        let name = self.info.property.to_string();
        host.hold(self.staged, move || {
            let host = host::host().expect("a durable host while its property is open");
            freed
                .iter()
                .for_each(|hash| host.store.delete_blob(id, hash));
            send_notices::<T>(name, notices);
        });
    }

    /// Forces a snapshot at the next call.
    #[cfg(test)]
    pub(crate) fn snapshot_soon(&mut self) {
        self.since_bytes = SNAPSHOT_BYTES;
    }
}

impl Since {
    fn lsn(&self) -> Option<u64> {
        match self {
            Since::Call(l) => Some(l.lsn),
            Since::Blobs(_) => None,
        }
    }
}

fn distinct_ops(since: &[Since]) -> Vec<&str> {
    let mut ops: Vec<&str> = since
        .iter()
        .filter_map(|s| match s {
            Since::Call(l) => Some(l.entry.name),
            Since::Blobs(_) => None,
        })
        .collect();
    ops.sort_unstable();
    ops.dedup();
    ops
}

fn answer_of(outcome: &Outcome) -> Answer {
    match outcome {
        Outcome::Returned(b) => Ok(b.clone()),
        Outcome::Panicked(m) => Err(Refusal::Panicked(m.clone())),
    }
}

impl Registered {
    /// The entry of op `O` on state `T`: what [`durable_ops!`](crate::durable_ops) submits.
    pub const fn of<T: Wire, O: Op<T>>() -> Registered {
        Registered {
            state: type_name::<T>,
            op_type: type_name::<O>,
            name: O::NAME,
            fingerprint: op_fingerprint::<O, O::Output>,
            run: registry::run::<T, O>,
            resend: resend::<T>,
            change: change_blob::<T>,
            needs: needs_lease::<T>,
        }
    }
}

/// The trustee's side of a call of `O`.
pub(crate) fn run<T: Wire, O: Op<T>>(cell: &mut Cell<T>, args: CallArgs, reply: Reply<Answer>) {
    let entry = registry::entry_of::<T, O>();
    run_entry(cell, entry, args, None, reply);
}

/// The trustee's side of a call named by its op (a resent call).
fn run_named<T: Wire>(cell: &mut Cell<T>, (op, args): (String, CallArgs), reply: Reply<Answer>) {
    let entry = registry::find(type_name::<T>(), &op).ok_or_else(|| {
        format!(
            "the durable op \"{op}\" on {} is not registered",
            type_name::<T>()
        )
    });
    run_entry(cell, entry, args, None, reply);
}

/// Runs in a fiber on the property's node: sends a call again by names.
fn resend<T: Wire>(r: Resend) -> Result<Answer, DurableError> {
    let trust = open::<T>(&r.property, None::<fn() -> T>)?;
    Ok(trust.apply_deferred_with(run_named::<T>, (r.op, r.args)))
}

/// A call on its trustee: answered from its record if it has one, else run, logged, and
/// answered once the record is durable.
fn run_entry<T: Wire>(
    cell: &mut Cell<T>,
    entry: Result<registry::Entry, String>,
    args: CallArgs,
    carried: Option<Carried>,
    reply: Reply<Answer>,
) {
    crash::point("received");
    if carried.is_some() {
        // Its leases were taken for it: from here on it runs (and its record lists them) or
        // is answered otherwise.
        let others = cell.others(args.blobs());
        cell.took(&others, args.client, args.seq);
    }
    if args.client != NO_DEDUP {
        // A continuation's acknowledgement is the property's own: every call of its below the
        // first one still pending is answered.
        let ack = if args.client == cell.continuations {
            cell.outgoing
                .pending
                .keys()
                .next()
                .copied()
                .unwrap_or(cell.outgoing.next_seq)
        } else {
            args.ack
        };
        let windowed = matches!(
            client::kind(args.client),
            Kind::Volatile { .. } | Kind::Session
        );
        if windowed && !client::within_window(args.seq, args.ack) {
            let (seq, ack) = (args.seq, args.ack);
            let _ = reply.send(Err(Refusal::PastWindow { seq, ack }));
            return;
        }
        let calls = cell.completions.entry(args.client).or_default();
        calls.touched = cell.host.clock();
        calls.acknowledge(ack);
        if args.seq < calls.acked {
            let seq = args.seq;
            if seq < calls.lapsed {
                // Answered once the lapse is durable, as an answer from a record would be.
                let expired = Err(Refusal::Expired { seq });
                cell.host.answer(cell.staged, reply, expired);
            } else {
                let acked = calls.acked;
                let _ = reply.send(Err(Refusal::Acknowledged { seq, acked }));
            }
            return;
        }
        if let Some((lsn, outcome)) = calls.get(args.seq) {
            let answer = answer_of(outcome);
            cell.host.answer(lsn, reply, answer);
            return;
        }
    }
    let entry = match entry {
        Ok(e) => e,
        Err(why) => {
            let _ = reply.send(Err(Refusal::Panicked(why)));
            return;
        }
    };
    // Blobs its own property made need no lease: they are read from its own files, which
    // stay until a snapshot covers their free.
    let others = match args.blobs() {
        [] => Vec::new(),
        blobs => cell.others(blobs),
    };
    let carried = match carried {
        None if others.is_empty() => Carried::new(),
        None => return prefetch(cell, entry, args, others, reply),
        Some(carried) => carried,
    };
    let freed = cell.info.blob().freed.len();
    let notices = cell.info.blob().blobs.notices.len();
    // The bytes stay with the call's log entry, for a rebuild (none for most calls).
    let kept = if carried.is_empty() {
        Carried::new()
    } else {
        carried.clone()
    };
    let run = cell.run_op(entry, &args.argument, carried, args.holder());
    let ask = std::mem::take(&mut cell.info.blob_mut().ask_lessees);
    if !ask.is_empty() {
        // Frees the op was refused: their lessees are asked now, for a later free.
        let (host, name) = (cell.host.clone(), cell.info.property.to_string());
        let maker = cell.info.blob().holder.clone();
        drop(trust::spawn(move || {
            if let Some(trust) = own::<T>(&host, &name) {
                for id in ask {
                    drop_unneeded(&trust, &maker, id);
                }
            }
        }));
    }
    let outcome = match run {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(why)) => Outcome::Panicked(why),
        Err(p) => Outcome::Panicked(codec::panic_message(&*p)),
    };
    crash::point("executed");
    let made = std::mem::take(&mut cell.info.outgoing);
    let calls = if matches!(outcome, Outcome::Panicked(_)) {
        // No effect: back to the state and blobs before the call, and no call to others.
        (cell.state, cell.info.blob_mut().blobs) = cell
            .rebuild()
            .unwrap_or_else(|why| panic!("durable property \"{}\": {why}", cell.info.property));
        cell.info.blob_mut().freed.truncate(freed);
        if args.client == cell.continuations {
            cell.outgoing.pending.remove(&args.seq);
        }
        Vec::new()
    } else {
        cell.made_calls(made, args.client, args.seq)
    };
    let (id, client, seq, ack) = (cell.id, args.client, args.seq, args.ack);
    let fingerprint = entry.fingerprint;
    let lsn = cell.host.stage_record(id, |lsn, out| {
        let record = RecordRef {
            property: id,
            lsn,
            client,
            seq,
            ack,
            op: entry.name,
            op_fingerprint: fingerprint,
            argument: &args.argument,
            outcome: &outcome,
            passing: args.passing.as_deref(),
        };
        format::encode_record(out, record);
    });
    let answer = answer_of(&outcome);
    cell.staged = lsn;
    for b in others {
        let lease = Lease {
            lessee: cell.info.blob().holder.clone(),
            client,
            seq,
        };
        cell.leased.push((lsn, b, lease));
    }
    let holder = args.holder().cloned();
    cell.logged(lsn, entry, args.argument, kept, holder, &outcome);
    cell.complete(client, seq, ack, lsn, outcome);
    cell.host.answer(lsn, reply, answer);
    if !calls.is_empty() {
        // The calls leave once the record that made them is durable (output commit).
        let property = cell.info.property.to_string();
        let host = cell.host.clone();
        let ids = (cell.caller, cell.continuations);
        let me = cell.info.blob().holder.clone();
        cell.host.hold(lsn, move || {
            if let Some(trust) = own::<T>(&host, &property) {
                for call in calls {
                    deliver(trust.clone(), ids, me.clone(), call);
                }
            }
        });
    }
    // Frees of others' blobs the op asked for go once its record is durable.
    let owed = &cell.info.blob().blobs.notices;
    if owed.len() > notices {
        let asked = owed[notices..].to_vec();
        let name = cell.info.property.to_string();
        cell.host.hold(lsn, move || send_notices::<T>(name, asked));
    }
    cell.maybe_snapshot();
}

/// Leases the blobs a call carries at their makers and fetches their bytes, on a fiber of
/// the property's worker; then runs the call with them. A blob that cannot be leased answers
/// the call without running it (the leases taken for it go again).
fn prefetch<T: Wire>(
    cell: &mut Cell<T>,
    entry: registry::Entry,
    args: CallArgs,
    others: Vec<Blob>,
    reply: Reply<Answer>,
) {
    let (host, name) = (cell.host.clone(), cell.info.property.to_string());
    let lease = Lease {
        lessee: cell.info.blob().holder.clone(),
        client: args.client,
        seq: args.seq,
    };
    // Noted before any ask leaves: a maker that asks whether this lease is needed (after
    // a refused free) hears so until the call runs or is refused.
    cell.taking
        .extend(others.iter().map(|b| (b.clone(), lease.clone())));
    let take = new_take();
    drop(trust::spawn(move || {
        let mut carried = Carried::new();
        for b in &others {
            let id = b.id();
            let take = Change::Lease {
                id,
                lease: lease.clone(),
                take,
            };
            let leased = fetch::ask_maker(b, take);
            match leased.clone().and_then(|()| fetch::fetch(b)) {
                Ok(bytes) => carried.push((b.clone(), bytes)),
                Err(e) => {
                    // The call does not run: every lease it took ends, this blob's too when
                    // only its bytes failed.
                    let taken = carried.iter().map(|(b, _)| b);
                    for b in taken.chain(leased.is_ok().then_some(b)) {
                        let id = b.id();
                        let _ = fetch::ask_maker(
                            b,
                            Change::Unlease {
                                id,
                                lease: lease.clone(),
                            },
                        );
                    }
                    if let Some(trust) = own::<T>(&host, &name) {
                        let (client, seq) = (args.client, args.seq);
                        let local = trust.local().expect("a property is local to its own node");
                        local.apply(move |cell| cell.took(&others, client, seq));
                    }
                    let _ = reply.send(Err(Refusal::Blob(e)));
                    return;
                }
            }
        }
        crash::point("leased");
        let Some(trust) = own::<T>(&host, &name) else {
            return; // closed meanwhile: the reply, dropped, fails the call
        };
        let local = trust
            .local()
            .expect("a property is local to its own node")
            .clone();
        local.apply(move |cell| run_entry(cell, Ok(entry), args, Some(carried), reply));
    }));
}

/// Sends the notices a property owes the makers of blobs it used, from a fiber; each one
/// acknowledged leaves the property's list. An unlease of a freed blob is done; a free the
/// maker refuses while calls hold the blob is asked again after the next snapshot.
fn send_notices<T: Wire>(name: String, notices: Vec<Notice>) {
    let Some(state) = state::current() else {
        return;
    };
    drop(state.handle.spawn(move || {
        let Ok(host) = host::host() else {
            return;
        };
        let me = Holder {
            rank: state::current().map_or(0, |s| s.rank),
            property: name.clone(),
        };
        for notice in notices {
            let done = match &notice {
                Notice::Unlease { blob, lease } => {
                    let change = Change::Unlease {
                        id: blob.id(),
                        lease: lease.clone(),
                    };
                    fetch::ask_maker(blob, change)
                }
                Notice::Free { blob } => {
                    let change = Change::Free {
                        id: blob.id(),
                        by: me.clone(),
                    };
                    fetch::ask_maker(blob, change)
                }
            };
            match done {
                Ok(()) | Err(BlobError::Gone { .. }) => {}
                Err(
                    BlobError::NotController { .. }
                    | BlobError::NotCarried { .. }
                    | BlobError::Damaged { .. },
                ) => {
                    eprintln!(
                        "gossamer: durable property \"{name}\": {}",
                        done.unwrap_err()
                    );
                }
                // Asked again after the next snapshot, or by the next process.
                Err(
                    BlobError::Leased { .. }
                    | BlobError::Unavailable { .. }
                    | BlobError::Store { .. },
                ) => continue,
            }
            if let Some(trust) = own::<T>(&host, &name) {
                trust
                    .local()
                    .expect("a property is local to its own node")
                    .apply(move |cell| cell.info.blob_mut().blobs.notices.retain(|n| *n != notice));
            }
        }
    }));
}

/// The maker's side of a blob change: applied and logged, answered once durable.
fn apply_change<T: Wire>(cell: &mut Cell<T>, change: Change, reply: Reply<Result<(), BlobError>>) {
    if let Change::Check { .. } = change {
        let info = cell.info.blob_mut();
        let _ = reply.send(info.blobs.apply(&info.holder, &change).map(drop));
        return;
    }
    let argument = postcard::to_allocvec(&change).expect("a blob change serializes");
    if let Err(e) = cell.change_blobs(change) {
        let _ = reply.send(Err(e));
        return;
    }
    let lsn = cell.stage_runtime_record(blob::CHANGE, &argument);
    cell.host.hold(lsn, move || {
        let _ = reply.send(Ok(()));
    });
    cell.maybe_snapshot();
}

/// Runs on a blob's maker's node: opens the maker, a `T` named `name`, and changes the blob.
/// A free refused while the blob is leased asks each lessee whether it still needs its
/// lease ([`needs_here`]); the takes of those that do not are dropped (logged), and the
/// free is tried once more.
fn change_blob<T: Wire>(name: String, change: Change) -> Result<(), BlobError> {
    let gone = || BlobError::Gone {
        blob: format!("a blob of \"{name}\""),
    };
    let trust = match open::<T>(&name, None::<fn() -> T>) {
        Ok(trust) => trust,
        Err(DurableError::NotFound { .. }) => return Err(gone()),
        Err(e) => {
            return Err(BlobError::Unavailable {
                blob: format!("a blob of \"{name}\""),
                why: e.to_string(),
            });
        }
    };
    let id = match &change {
        Change::Free { id, .. } => *id,
        _ => return trust.apply_deferred_with(apply_change::<T>, change),
    };
    let refused = match trust.apply_deferred_with(apply_change::<T>, change.clone()) {
        Err(refused @ BlobError::Leased { .. }) => refused,
        done => return done,
    };
    let maker = Holder {
        rank: state::current().map_or(0, |s| s.rank),
        property: name,
    };
    if !drop_unneeded(&trust, &maker, id) {
        return Err(refused);
    }
    trust.apply_deferred_with(apply_change::<T>, change)
}

/// Asks each lessee of blob `id` of `maker` (this node's property, `trust`) whether it may
/// still need its lease ([`needs_here`]), and drops (logged) the takes of those that do not;
/// returns whether it dropped any. From a fiber.
fn drop_unneeded<T: Wire>(trust: &Trust<Cell<T>>, maker: &Holder, id: u64) -> bool {
    let leases = trust.apply_with(
        |cell: &mut Cell<T>, id| cell.info.blob().blobs.leases(id),
        id,
    );
    let mut dropped = false;
    for (lease, takes) in leases {
        let node = Node {
            rank: lease.lessee.rank,
        };
        let ask = (maker.clone(), id, lease.clone());
        // Not waited for past a loss: a lessee that cannot be asked keeps its lease.
        let needed = spawn_on(node, needs_here, ask).join_or_failure();
        if !matches!(needed, Ok(false)) {
            continue;
        }
        let drop_it = Change::Drop { id, lease, takes };
        if trust
            .apply_deferred_with(apply_change::<T>, drop_it)
            .is_ok()
        {
            dropped = true;
        }
    }
    dropped
}

/// Runs on a lessee's node: whether its property `lease.lessee` may still need `lease` of
/// blob `id` of `maker` ([`Cell::needs`]), opening the property (its log rebuilds what it
/// needs) if this process has not. `true` whenever it cannot tell.
fn needs_here((maker, id, lease): (Holder, u64, Lease)) -> bool {
    let Ok(host) = host::host() else {
        return true;
    };
    let Some(meta) = host.store.property(&lease.lessee.property) else {
        return false; // never made here: nothing of it can need the lease
    };
    match registry::any_of(&meta.type_name) {
        Some(entry) => (entry.needs)(maker, id, lease),
        None => true,
    }
}

/// [`needs_here`] for a `T`.
fn needs_lease<T: Wire>(maker: Holder, id: u64, lease: Lease) -> bool {
    match open::<T>(&lease.lessee.property, None::<fn() -> T>) {
        Ok(trust) => trust.apply_with(
            |cell: &mut Cell<T>, (maker, id, lease): (Holder, u64, Lease)| {
                cell.needs(&maker, id, &lease)
            },
            (maker, id, lease),
        ),
        Err(DurableError::NotFound { .. }) => false,
        Err(_) => true,
    }
}

/// A number for one ask of leases: a lessee's process draws a fresh one each time, so that
/// dropping the takes of an earlier process (or ask) never drops a later one's.
fn new_take() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(|| getrandom::u64().unwrap_or_else(|_| state::life()));
    base.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The trustee's side of a lease sweep: drops the records of every client whose lease ran
/// out — a thread's once its process's life has been over for the client lease, a session's
/// once it has not called for the session lease — and logs it.
fn sweep<T: Wire>(cell: &mut Cell<T>, s: Sweep) {
    let mut lapsed: Lapsed = Vec::new();
    for (&id, calls) in cell.completions.iter_mut() {
        let over = match client::kind(id) {
            Kind::Volatile { life } if s.lives.binary_search(&life).is_ok() => {
                calls.dead_since = None;
                false
            }
            Kind::Volatile { .. } => {
                let since = *calls.dead_since.get_or_insert(s.now);
                s.now.saturating_sub(since) >= s.leases.client
            }
            // Nothing kept is nothing to drop (and no record to log at every sweep).
            Kind::Session => {
                !calls.done.is_empty() && s.now.saturating_sub(calls.touched) >= s.leases.session
            }
            // A property's calls are kept until answered; unrecorded calls have no lease.
            Kind::Property | Kind::NoDedup => false,
        };
        if over {
            lapsed.push((id, calls.lapse_bound()));
        }
    }
    if lapsed.is_empty() {
        return;
    }
    lapse(&mut cell.completions, &lapsed);
    let argument = postcard::to_allocvec(&lapsed).expect("a lapse list serializes");
    cell.stage_runtime_record(LAPSE, &argument);
}

/// Ends the leases `lapsed` names: a thread's client is forgotten (its process is gone, and
/// can send nothing more), a session's keeps the bound below which its calls expired.
fn lapse(completions: &mut Completions, lapsed: &Lapsed) {
    for &(id, bound) in lapsed {
        match client::kind(id) {
            Kind::Volatile { .. } => {
                completions.remove(&id);
            }
            _ => completions.entry(id).or_default().lapse_below(bound),
        }
    }
}

/// This process's handle of the open property `name`, if it is open as a `T`.
fn own<T: Wire>(host: &Host, name: &str) -> Option<Trust<Cell<T>>> {
    lock(&host.open)
        .get(name)
        .and_then(|p| p.trust.downcast_ref::<Trust<Cell<T>>>().cloned())
}

/// Sends a call a property made to another, from a fiber of this worker, and runs its
/// continuation on the property with the answer. Sent again by a later process if this one
/// ends first: the property keeps the call pending until its continuation's record.
fn deliver<T: Wire>(trust: Trust<Cell<T>>, ids: (u64, u64), me: Holder, call: OutCall) {
    drop(trust::spawn(move || {
        let resend = Resend {
            property: call.property.clone(),
            op: call.op.clone(),
            args: CallArgs {
                client: ids.0,
                seq: call.seq,
                ack: call.ack,
                argument: call.argument,
                passing: Passing::of(call.blobs, Some(me)),
            },
        };
        let node = Node { rank: call.rank };
        // A call of a durable property is kept until answered: past each
        // `GSM_RECOVERY_TIMEOUT` it waits on for its rank.
        let answer: Result<Answer, DurableError> = loop {
            let answered = until_answered(call.rank, || {
                let state_type = call.state_type.clone();
                let resent = spawn_on(node, resend_by_type, (state_type, resend.clone()));
                Ok(resent.join_or_failure()??)
            });
            match answered {
                Ok(answer) => break Ok(answer),
                Err(CallError::Open(e)) => break Err(e),
                Err(e) => eprintln!(
                    "gossamer: a call of durable property \"{}\" waits on: {e}",
                    call.property
                ),
            }
        };
        let mut argument = call.then_argument;
        argument.extend(postcard::to_allocvec(&answer).expect("an answer serializes"));
        let args = CallArgs {
            client: ids.1,
            seq: call.seq,
            ack: 0,
            argument: argument.into(),
            passing: None,
        };
        let done = trust.apply_deferred_with(run_named::<T>, (call.then, args));
        if let Err(Refusal::Panicked(m)) = done {
            eprintln!("gossamer: a continuation of durable property panicked: {m}");
        }
    }));
}

/// Runs on the called property's node: finds its state type's resender and sends the call.
pub(crate) fn resend_by_type((state_type, r): (String, Resend)) -> Result<Answer, DurableError> {
    let entry = registry::find(&state_type, &r.op).ok_or_else(|| DurableError::Incompatible {
        name: r.property.clone(),
        why: format!(
            "a call names op \"{}\" on {state_type}, which this build does not register",
            r.op
        ),
        written_by: "the calling rank".into(),
    })?;
    (entry.resend)(r)
}

/// The trustee's side of a read: `F` on the state and the argument, answered once the
/// property's last record is durable.
pub(crate) fn read<T: Wire, A, R: Wire, F: FnOnce(&T, A) -> R + Send + 'static>(
    cell: &mut Cell<T>,
    argument: A,
    reply: Reply<R>,
) {
    let r = crate::capture_free::conjure::<F>()(&cell.state, argument);
    cell.host.hold(cell.staged, move || drop(reply.send(r)));
}

/// The caller's side: the op's output from an answer of property `property`, or
/// [`CallError::Expired`].
///
/// # Panics
/// When the op panicked, or the answer does not decode.
pub(crate) fn output<R: Wire>(property: &str, op: &str, answer: Answer) -> Result<R, CallError> {
    match answer {
        Ok(bytes) => Ok(postcard::from_bytes(&bytes).unwrap_or_else(|e| {
            panic!(
                "the output of durable op \"{op}\" does not decode as a {}: {e}",
                type_name::<R>()
            )
        })),
        Err(Refusal::Expired { seq }) => Err(CallError::Expired {
            property: property.into(),
            seq,
        }),
        Err(Refusal::Blob(e)) => Err(CallError::Blob(e)),
        Err(Refusal::Panicked(m)) => panic!("durable op \"{op}\" panicked: {m}"),
        Err(Refusal::Acknowledged { seq, acked }) => panic!(
            "durable op \"{op}\": the property refused call seq {seq}, below the client's \
             acknowledged {acked} (a protocol error: no client resends an acknowledged call)"
        ),
        Err(Refusal::PastWindow { seq, ack }) => panic!(
            "durable op \"{op}\": the property refused call seq {seq}, {} past the client's \
             first unfinished call {ack} (a protocol error: a client's calls leave within a \
             window of {WINDOW})",
            seq - ack
        ),
    }
}
