//! What durable state is made of on disk: log records and snapshots, each a postcard value
//! behind a one-byte format version, decoded without trusting a byte.
//!
//! A record is one call's effect: which property, its log sequence number (LSN, per rank,
//! increasing), the call id (client, seq) and the client's first unfinished seq (`ack`), the
//! op's name and argument as sent, the op's schema fingerprint, and the outcome. A snapshot
//! is a property's state after every record up to its LSN, with the completion table that
//! answers retries, the state's type name and schema fingerprint.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::blob::{Blob, BlobError, Blobs, Holder};
use crate::codec::Encoded;

/// The first byte of every stored value; another value is a build that cannot read it.
/// (2: completion tables keep where a lease lapsed; 3: blobs; 4: client ids of fixed width;
/// 5: a blob's leases keep their takes, and a lease can be dropped.)
pub(crate) const VERSION: u8 = 5;

/// The op name of a record that ends the leases of clients: its argument is a [`Lapsed`]
/// list, and it has no client. Op names under `gossamer.` are the runtime's.
pub(crate) const LAPSE: &str = "gossamer.lapse";

/// Clients whose records a property dropped, each with the seq below which its calls are
/// now expired.
pub(crate) type Lapsed = Vec<(u64, u64)>;

/// What a call came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Outcome {
    /// The op returned: its output, postcard-encoded.
    Returned(Bytes),
    /// The op panicked with this message: it had no effect, and a retry panics the same way.
    Panicked(String),
}

/// One call's effect on one property.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) property: u32,
    pub(crate) lsn: u64,
    /// The blobs the op carried (a replay fetches them again) and the calling session or
    /// property (blobs the op returned are handed to it); `None` when neither. Third, so
    /// that [`record_passes`] reads it without decoding the rest.
    pub(crate) passing: Option<Passing>,
    #[serde(with = "fixed_width")]
    pub(crate) client: u64,
    pub(crate) seq: u64,
    /// The client's first unfinished seq when it called: its records below it can go.
    pub(crate) ack: u64,
    pub(crate) op: String,
    /// The op's schema fingerprint when it was logged.
    pub(crate) op_fingerprint: u64,
    pub(crate) argument: Bytes,
    pub(crate) outcome: Outcome,
}

/// What a call passes besides its op: the blobs the op carries, which the property leases
/// and fetches before it runs it, and the calling session or property (a thread is none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Passing {
    pub(crate) blobs: Vec<Blob>,
    pub(crate) holder: Option<Holder>,
}

impl Passing {
    /// `None` for a call that passes nothing: most calls, which then carry one byte for it.
    pub(crate) fn of(blobs: Vec<Blob>, holder: Option<Holder>) -> Option<Box<Passing>> {
        (!blobs.is_empty() || holder.is_some()).then(|| Box::new(Passing { blobs, holder }))
    }
}

/// A client's calls a property remembers the outcome of.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ClientCalls {
    /// Seqs below this were acknowledged: their records are gone, and a call with one is
    /// not a retry but a protocol error.
    pub(crate) acked: u64,
    /// Seqs below this lost their records when the client's lease ended: a call with one
    /// is answered [`Refusal::Expired`] (it ran at most once).
    pub(crate) lapsed: u64,
    /// (seq, LSN of its record, outcome), by seq: a client's calls mostly arrive in seq
    /// order, so this is appended to at the back and acknowledged from the front.
    pub(crate) done: VecDeque<(u64, u64, Outcome)>,
    /// The host's lease clock (ms) at the client's last call; a replayed client counts from
    /// its property's opening.
    #[serde(skip)]
    pub(crate) touched: u64,
    /// The lease clock when a sweep first found the client's life over (a thread's client).
    #[serde(skip)]
    pub(crate) dead_since: Option<u64>,
}

impl ClientCalls {
    /// The outcome of call `seq`, and its record's LSN.
    pub(crate) fn get(&self, seq: u64) -> Option<(u64, &Outcome)> {
        // A new call comes after every kept one: the common case, answered without a search.
        if self.done.back().is_none_or(|(last, ..)| *last < seq) {
            return None;
        }
        let i = self.done.binary_search_by_key(&seq, |(s, ..)| *s).ok()?;
        self.done.get(i).map(|(_, lsn, o)| (*lsn, o))
    }

    /// Keeps the outcome of call `seq` (a call already kept keeps its first outcome).
    pub(crate) fn insert(&mut self, seq: u64, lsn: u64, outcome: Outcome) {
        match self.done.back() {
            Some(&(last, ..)) if last < seq => self.done.push_back((seq, lsn, outcome)),
            None => self.done.push_back((seq, lsn, outcome)),
            Some(_) => {
                if let Err(i) = self.done.binary_search_by_key(&seq, |(s, ..)| *s) {
                    self.done.insert(i, (seq, lsn, outcome));
                }
            }
        }
    }

    /// Where a lease ending now would put the bound: just past the newest seq seen (what a
    /// [`LAPSE`] record logs).
    pub(crate) fn lapse_bound(&self) -> u64 {
        let seen = self.done.back().map_or(0, |(seq, ..)| seq + 1);
        seen.max(self.acked)
    }

    /// The lease ended: forgets every outcome kept; seqs below `bound` expire.
    pub(crate) fn lapse_below(&mut self, bound: u64) {
        self.lapsed = self.lapsed.max(bound);
        self.acked = self.acked.max(bound);
        self.done.clear();
    }

    /// Forgets the calls below `ack`, which the client acknowledged.
    pub(crate) fn acknowledge(&mut self, ack: u64) {
        if ack > self.acked {
            self.acked = ack;
            while self.done.front().is_some_and(|(seq, ..)| *seq < ack) {
                self.done.pop_front();
            }
        }
    }
}

/// Every call outcome a property remembers, by client.
pub(crate) type Completions = BTreeMap<u64, ClientCalls>;

/// What a durable call answers: the op's output (postcard), or why there is none.
pub(crate) type Answer = Result<Bytes, Refusal>;

/// Encoded bytes, inline when small (most outputs are a number or a short tuple), so that
/// keeping an outcome for retries and answering it allocate nothing. Stored and sent as
/// bytes, the layout of a `Vec<u8>` under `serde_bytes`.
#[derive(Debug, Clone)]
pub(crate) struct Bytes(Encoded);

impl Bytes {
    pub(crate) fn empty() -> Bytes {
        Bytes(Encoded::copy_of(&[]))
    }
}

impl From<Encoded> for Bytes {
    fn from(encoded: Encoded) -> Bytes {
        Bytes(encoded)
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(bytes: Vec<u8>) -> Bytes {
        Bytes(Encoded::Heap(bytes))
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

impl PartialEq for Bytes {
    fn eq(&self, other: &Bytes) -> bool {
        **self == **other
    }
}

impl Eq for Bytes {}

impl Serialize for Bytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self)
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Bytes;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }

            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Bytes, E> {
                Ok(Bytes(Encoded::copy_of(v)))
            }

            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
                Ok(Bytes::from(v))
            }
        }
        d.deserialize_bytes(Visitor)
    }
}

/// Why a call has no output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Refusal {
    /// The op panicked (now or in the call's first run).
    Panicked(String),
    /// The call's seq was acknowledged already: a client never sends that.
    Acknowledged { seq: u64, acked: u64 },
    /// The client's lease ended and the call's record, if it had one, is gone: the call ran
    /// at most once.
    Expired { seq: u64 },
    /// A blob the call carried could not be leased or fetched: the call did not run.
    Blob(BlobError),
    /// The call's seq is a [`WINDOW`](super::WINDOW) or more past the first unfinished call
    /// its client names: a client never sends that.
    PastWindow { seq: u64, ack: u64 },
}

/// What a call carries besides the op.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CallArgs {
    #[serde(with = "fixed_width")]
    pub(crate) client: u64,
    pub(crate) seq: u64,
    /// The client's first unfinished seq: its calls below it are answered and acknowledged.
    pub(crate) ack: u64,
    /// The op, postcard-encoded: logged as it is.
    pub(crate) argument: Bytes,
    pub(crate) passing: Option<Box<Passing>>,
}

impl CallArgs {
    /// The blobs the op carries.
    pub(crate) fn blobs(&self) -> &[Blob] {
        self.passing.as_ref().map_or(&[], |p| &p.blobs)
    }

    /// The calling session or property.
    pub(crate) fn holder(&self) -> Option<&Holder> {
        self.passing.as_ref().and_then(|p| p.holder.as_ref())
    }
}

/// A property's state after every record before `lsn`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Snapshot {
    pub(crate) property: u32,
    pub(crate) name: String,
    pub(crate) lsn: u64,
    pub(crate) type_name: String,
    pub(crate) fingerprint: u64,
    /// postcard of the state.
    #[serde(with = "serde_bytes")]
    pub(crate) state: Vec<u8>,
    pub(crate) completions: Completions,
    /// The calls the property made to others and has not had answered.
    pub(crate) outgoing: Outgoing,
    /// The blobs it made, and what it owes the makers of blobs it used.
    pub(crate) blobs: Blobs,
    /// The build that wrote it.
    pub(crate) build: String,
}

/// A call a durable property made to another (`Cx::call`), and the op that takes its answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OutCall {
    pub(crate) seq: u64,
    /// The caller's first unfinished seq when it made the call.
    pub(crate) ack: u64,
    pub(crate) rank: u32,
    pub(crate) property: String,
    pub(crate) state_type: String,
    pub(crate) op: String,
    pub(crate) argument: Bytes,
    pub(crate) blobs: Vec<Blob>,
    /// The continuation's name and its own fields (postcard); the answer follows them.
    pub(crate) then: String,
    #[serde(with = "serde_bytes")]
    pub(crate) then_argument: Vec<u8>,
}

/// A property's calls to others: the next seq, and those not yet answered, by seq.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Outgoing {
    pub(crate) next_seq: u64,
    pub(crate) pending: BTreeMap<u64, OutCall>,
}

impl Outgoing {
    /// Gives `call` the next seq (from 1) and keeps it as pending.
    pub(crate) fn add(&mut self, mut call: OutCall) -> OutCall {
        self.next_seq = self.next_seq.max(1);
        call.seq = self.next_seq;
        self.next_seq += 1;
        call.ack = self.pending.keys().next().copied().unwrap_or(call.seq);
        self.pending.insert(call.seq, call.clone());
        call
    }
}

/// A property's identity: its rank-wide id, name and state type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PropertyMeta {
    pub(crate) id: u32,
    pub(crate) name: String,
    pub(crate) type_name: String,
}

/// One frame of a log segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Entry {
    /// The first frame of every segment: who wrote it. A process writes its own segments.
    Segment {
        first_lsn: u64,
        build: String,
    },
    /// A property is created (with its first snapshot).
    Property(PropertyMeta),
    Record(Record),
}

/// Why stored bytes could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FormatError {
    Empty,
    Version(u8),
    Malformed(String),
}

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FormatError::Empty => f.write_str("an empty value"),
            FormatError::Version(v) => write!(
                f,
                "format version {v}, this build reads version {VERSION} (written by another build)"
            ),
            FormatError::Malformed(why) => write!(f, "malformed: {why}"),
        }
    }
}

/// A client id as 8 bytes rather than a varint: ids keep their kind in the top bits, which
/// a varint would spend 10 bytes and a loop on, on both sides of every call.
mod fixed_width {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        serde_bytes::serialize(&v.to_le_bytes(), s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let bytes = serde_bytes::ByteArray::<8>::deserialize(d)?;
        Ok(u64::from_le_bytes(bytes.into_array()))
    }
}

/// `VERSION` then postcard.
pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut bytes = Vec::new();
    encode_into(&mut bytes, value);
    bytes
}

/// [`encode`], appended to `out`.
pub(crate) fn encode_into<T: Serialize>(out: &mut Vec<u8>, value: &T) {
    out.push(VERSION);
    // Writing to a Vec fails only for values serde cannot express, which these types are not.
    crate::codec::append(out, value).expect("a stored value serializes");
}

/// A [`Record`] by reference, encoded as an [`Entry::Record`] (the same bytes): how a
/// trustee logs a call without copying its argument and outcome into an owned record.
#[derive(Serialize)]
pub(crate) struct RecordRef<'a> {
    pub(crate) property: u32,
    pub(crate) lsn: u64,
    pub(crate) passing: Option<&'a Passing>,
    #[serde(with = "fixed_width")]
    pub(crate) client: u64,
    pub(crate) seq: u64,
    pub(crate) ack: u64,
    pub(crate) op: &'a str,
    pub(crate) op_fingerprint: u64,
    #[serde(with = "serde_bytes")]
    pub(crate) argument: &'a [u8],
    pub(crate) outcome: &'a Outcome,
}

/// [`Entry`]'s layout for encoding a [`RecordRef`]: postcard writes a variant's index, so
/// only the index of `Record` (the third) must match.
#[derive(Serialize)]
enum EntryRef<'a> {
    _Segment,
    _Property,
    Record(RecordRef<'a>),
}

/// Appends `record` encoded as an [`Entry::Record`].
pub(crate) fn encode_record(out: &mut Vec<u8>, record: RecordRef<'_>) {
    encode_into(out, &EntryRef::Record(record));
}

/// The variant index, property and LSN at the start of an encoded [`Entry::Record`],
/// read without decoding the rest; `None` for another entry or bytes that do not start so.
pub(crate) fn record_head(payload: &[u8]) -> Option<(u32, u64)> {
    let (&version, body) = payload.split_first()?;
    if version != VERSION {
        return None;
    }
    let ((variant, property, lsn), _) = postcard::take_from_bytes::<(u32, u32, u64)>(body).ok()?;
    (variant == 2).then_some((property, lsn))
}

/// Whether `payload` starts as an encoded [`Entry`] does: this format's version, then a
/// variant index (one byte, below 3). What recovery asks of a frame it finds past a bad one,
/// before checking its CRC.
pub(crate) fn starts_entry(payload: &[u8]) -> bool {
    matches!(payload, [VERSION, variant, ..] if *variant < 3)
}

/// Whether an encoded [`Entry::Record`] passes anything (blobs, a caller): read from its
/// head, without decoding the rest. `false` for bytes that are not a record.
pub(crate) fn record_passes(payload: &[u8]) -> bool {
    let Some((&VERSION, body)) = payload.split_first() else {
        return false;
    };
    postcard::take_from_bytes::<(u32, u32, u64, u8)>(body)
        .is_ok_and(|((variant, _, _, some), _)| variant == 2 && some == 1)
}

/// Decodes what [`encode`] wrote; trailing bytes are an error.
pub(crate) fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, FormatError> {
    let (&version, body) = bytes.split_first().ok_or(FormatError::Empty)?;
    if version != VERSION {
        return Err(FormatError::Version(version));
    }
    let (value, rest) =
        postcard::take_from_bytes(body).map_err(|e| FormatError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(FormatError::Malformed(format!(
            "{} bytes after the value",
            rest.len()
        )));
    }
    Ok(value)
}

/// For the fuzz target: decodes `data` as each stored kind; what decodes re-encodes to the
/// same bytes. Panics when that fails.
#[cfg(feature = "fuzzing")]
pub(crate) fn check_decoders(data: &[u8]) {
    fn round_trip<T: Serialize + for<'de> Deserialize<'de> + PartialEq + std::fmt::Debug>(
        data: &[u8],
    ) {
        if let Ok(value) = decode::<T>(data) {
            let again = encode(&value);
            assert_eq!(decode::<T>(&again).as_ref(), Ok(&value));
        }
    }
    round_trip::<Entry>(data);
    round_trip::<Snapshot>(data);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            property: 3,
            lsn: 99,
            client: 1 << 63 | 7,
            seq: 12,
            ack: 10,
            op: "account.deposit".into(),
            op_fingerprint: 0xfeed,
            argument: vec![5].into(),
            outcome: Outcome::Returned(vec![10].into()),
            passing: None,
        }
    }

    #[test]
    fn a_record_round_trips_and_no_prefix_of_it_decodes() {
        let bytes = encode(&record());
        assert_eq!(decode::<Record>(&bytes), Ok(record()));
        for cut in 0..bytes.len() {
            assert!(decode::<Record>(&bytes[..cut]).is_err(), "prefix of {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            decode::<Record>(&longer),
            Err(FormatError::Malformed(_))
        ));
    }

    #[test]
    fn a_record_by_reference_encodes_as_the_owned_entry() {
        let r = record();
        let mut by_ref = Vec::new();
        encode_record(
            &mut by_ref,
            RecordRef {
                property: r.property,
                lsn: r.lsn,
                client: r.client,
                seq: r.seq,
                ack: r.ack,
                op: &r.op,
                op_fingerprint: r.op_fingerprint,
                argument: &r.argument,
                outcome: &r.outcome,
                passing: r.passing.as_ref(),
            },
        );
        assert_eq!(by_ref, encode(&Entry::Record(r.clone())));
        assert_eq!(record_head(&by_ref), Some((r.property, r.lsn)));
        assert!(!record_passes(&by_ref));
        let passing = Record {
            passing: Some(Passing {
                blobs: Vec::new(),
                holder: Some(Holder::default()),
            }),
            ..r.clone()
        };
        assert!(record_passes(&encode(&Entry::Record(passing))));
        let segment = Entry::Segment {
            first_lsn: 1,
            build: "b".into(),
        };
        assert_eq!(record_head(&encode(&segment)), None);
    }

    #[test]
    fn a_lapsed_client_keeps_no_outcome_and_expires_every_seq_it_sent() {
        let mut calls = ClientCalls::default();
        calls.acknowledge(2);
        calls.insert(2, 10, Outcome::Returned(vec![1].into()));
        calls.insert(4, 11, Outcome::Returned(vec![2].into()));
        assert_eq!(calls.lapse_bound(), 5, "seqs up to the newest seen");
        calls.lapse_below(5);
        assert_eq!((calls.acked, calls.lapsed), (5, 5));
        assert!(calls.get(4).is_none() && calls.done.is_empty());
        // Logged and replayed, the bound only rises.
        calls.lapse_below(3);
        assert_eq!((calls.acked, calls.lapsed), (5, 5));
        // A client whose outcomes were all acknowledged lapses at what it acknowledged.
        let mut quiet = ClientCalls::default();
        quiet.acknowledge(7);
        assert_eq!(quiet.lapse_bound(), 7);
    }

    #[test]
    fn another_version_is_named() {
        let mut bytes = encode(&record());
        bytes[0] = 9;
        let err = decode::<Record>(&bytes).unwrap_err();
        assert_eq!(err, FormatError::Version(9));
        assert!(err.to_string().contains("version 9"), "{err}");
    }
}
