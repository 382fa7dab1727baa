//! Where a rank's durable state lives: an append-only log in segments, and snapshot files.
//!
//! ```text
//! GSM_STATE_DIR/<job>/rank-<r>/
//!   lock                      held (flock) while a process uses this state
//!   log/<first LSN>.seg       frames: the segment's header, property entries, call records
//!   snap/<property>-<LSN>.snap   one frame: a property's state before LSN
//! ```
//!
//! A frame is `[length u32][CRC-32 of the payload u32][payload]`, little-endian; the payload is
//! a [`format`] value. Every process starts a new segment, whose first frame names the build
//! that writes it, so a record's writer is known without a table.
//!
//! **Commit.** The syncer hands a round's writes to [`Store::commit`]: its records and
//! property entries go to the current segment in one `write`, then — under
//! [`Durability::Sync`] — one `fdatasync`; then its snapshots, each written to a temporary file,
//! flushed, renamed into place and the directory flushed. A snapshot is therefore complete or
//! absent, and never ahead of a record it covers.
//!
//! **Recovery.** On open every segment is read in order. A frame that is cut short or fails
//! its CRC ends the log if it is in the newest segment (the tail a crash tore: the segment is
//! truncated there); anywhere else it is damage, and the store refuses to open, naming the
//! file and offset. Leftover temporary snapshot files are deleted.
//!
//! **Compaction.** Each property keeps its two newest snapshots (if the newer one cannot be
//! read, the older one and the records after it still rebuild the property); a snapshot
//! commit deletes the older ones, and every segment none of whose records is needed any more
//! (each lies at or before its property's older kept snapshot) is deleted.
//!
//! This log replaced an embedded database (redb, then measured against fjall): with a group
//! of 1,024 calls per commit, neither came within a tenth of the throughput the rack's plain
//! calls reach, which the output-commit goals are measured against (see the issue notes).

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write as _};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::DurableError;
use super::crash;
use super::format::{self, Entry, PropertyMeta, Snapshot};
use crate::env::Durability;

/// A segment file's size: it is written with zeros when it starts, and a new one starts when
/// a round would not fit. Records then overwrite blocks the file already has, so the
/// `fdatasync` after them flushes data only; appending to a growing file also commits the
/// file system's journal for the new size (measured here: 165 µs against 70 µs a flush).
const SEGMENT_BYTES: u64 = if cfg!(test) { 64 << 10 } else { 16 << 20 };
/// A frame's payload is at most this long (a record holds one argument and one result).
const MAX_FRAME: usize = 1 << 31;

/// `fdatasync`s made by durable stores in this process, and the bytes they appended to log
/// segments: the benchmark's counts.
pub(crate) static SYNCS: AtomicU64 = AtomicU64::new(0);
pub(crate) static LOG_BYTES: AtomicU64 = AtomicU64::new(0);

/// A write that is not a call's record.
#[derive(Debug)]
pub(crate) enum Write {
    /// A new property (with its first snapshot right after).
    Property(PropertyMeta),
    /// A snapshot, encoded.
    Snapshot {
        property: u32,
        lsn: u64,
        bytes: Vec<u8>,
    },
}

/// One round of writes: call records already framed, in the order they were staged (each
/// with its property and LSN, for the segment's index), then the other writes.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    frames: Vec<u8>,
    records: Vec<(u32, u64)>,
    others: Vec<Write>,
}

impl Batch {
    /// Appends the record of property `property` at `lsn`, which `encode` writes (a payload:
    /// the frame around it is added here).
    pub(crate) fn record(&mut self, property: u32, lsn: u64, encode: impl FnOnce(&mut Vec<u8>)) {
        append_frame(&mut self.frames, encode);
        self.records.push((property, lsn));
    }

    pub(crate) fn push(&mut self, write: Write) {
        self.others.push(write);
    }

    /// Appends `later`, a batch staged after this one.
    pub(crate) fn extend(&mut self, later: Batch) {
        self.frames.extend_from_slice(&later.frames);
        self.records.extend(later.records);
        self.others.extend(later.others);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty() && self.others.is_empty()
    }
}

/// Appends the frame (`[length][CRC][payload]`) of the payload `encode` writes.
fn append_frame(out: &mut Vec<u8>, encode: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; 8]);
    encode(out);
    let payload = &out[start + 8..];
    let len = (payload.len() as u32).to_le_bytes();
    let crc = crc32fast::hash(payload).to_le_bytes();
    out[start..start + 4].copy_from_slice(&len);
    out[start + 4..start + 8].copy_from_slice(&crc);
}

/// A stored record: its LSN, its frame's payload and the build that wrote it.
pub(crate) type StoredRecord = (u64, Vec<u8>, Arc<str>);

/// A property as stored: its newest snapshots (newest first, at most two) and the records
/// after the older one in LSN order, each with the build that wrote it.
#[derive(Debug, Default)]
pub(crate) struct Stored {
    pub(crate) snapshots: Vec<(u64, Vec<u8>)>,
    pub(crate) records: Vec<StoredRecord>,
}

/// A rank's open store.
pub(crate) struct Store {
    dir: PathBuf,
    flush: bool,
    /// This build, as segment headers and snapshots name it.
    pub(crate) build: Arc<str>,
    /// The newest LSN stored when this process opened the store.
    pub(crate) last_lsn: u64,
    /// Held for the store's life: another process opening this rank's state is refused.
    _lock: File,
    inner: Mutex<Inner>,
}

struct Inner {
    /// The segment being written, and how long it is.
    segment: File,
    segment_len: u64,
    /// Every segment by first LSN: the newest LSN each property has in it.
    segments: BTreeMap<u64, HashMap<u32, u64>>,
    properties: HashMap<String, PropertyMeta>,
    next_id: u32,
    /// The newest LSN written.
    newest: u64,
    /// Each property's kept snapshots' LSNs, ascending.
    snapshots: HashMap<u32, Vec<u64>>,
    /// Records read at open, for properties not opened since: property → (LSN, payload, build).
    unread: HashMap<u32, Vec<StoredRecord>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn failed(dir: &Path, what: impl std::fmt::Display, e: impl std::fmt::Display) -> DurableError {
    DurableError::Store {
        dir: dir.to_path_buf(),
        why: format!("{what}: {e}"),
    }
}

/// The frame at the start of `bytes`: `Ok(Some((payload, length)))`, `Ok(None)` at the end,
/// `Err` for a frame cut short or failing its CRC.
fn next_frame(bytes: &[u8]) -> Result<Option<(&[u8], usize)>, &'static str> {
    if bytes.is_empty() {
        return Ok(None);
    }
    // The zeros a segment starts as: the end of what was written (a frame's payload is never
    // empty), provided nothing but zeros follows. Fewer than a header's worth may be left
    // when the records end just short of the segment's end.
    if bytes[..bytes.len().min(8)].iter().all(|&b| b == 0) {
        return if all_zeros(bytes) {
            Ok(None)
        } else {
            Err("bytes after the end of the log")
        };
    }
    let header: [u8; 8] = bytes
        .get(..8)
        .ok_or("a frame header cut short")?
        .try_into()
        .expect("8 bytes");
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
    if len > MAX_FRAME {
        return Err("a frame length past the limit");
    }
    let payload = bytes.get(8..8 + len).ok_or("a frame cut short")?;
    if crc32fast::hash(payload) != crc {
        return Err("a frame failing its CRC");
    }
    Ok(Some((payload, 8 + len)))
}

/// Whether `bytes` are all zero: a segment's unwritten tail, megabytes long, is checked at
/// every open. Compared a page at a time (`memcmp`), which stays fast in unoptimised builds
/// too: a byte loop there was half the CPU time of the crash tests' ranks.
fn all_zeros(bytes: &[u8]) -> bool {
    const PAGE: [u8; 4096] = [0; 4096];
    bytes.chunks(PAGE.len()).all(|c| c == &PAGE[..c.len()])
}

fn segment_path(dir: &Path, first_lsn: u64) -> PathBuf {
    dir.join("log").join(format!("{first_lsn:020}.seg"))
}

fn snapshot_path(dir: &Path, property: u32, lsn: u64) -> PathBuf {
    dir.join("snap")
        .join(format!("{property:010}-{lsn:020}.snap"))
}

/// Where property `property` keeps the bytes of its blobs of SHA-256 `hash` (blobs of one
/// property with the same bytes share the file).
fn blob_path(dir: &Path, property: u32, hash: &[u8; 32]) -> PathBuf {
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    dir.join("blobs").join(format!("{property:010}-{hex}"))
}

/// The SHA-256 of `bytes`: what names a blob's bytes and checks them.
pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes).into()
}

/// Flushes a directory, so that files created, renamed or deleted in it stay so.
fn sync_dir(path: &Path) -> std::io::Result<()> {
    File::open(path)?.sync_all()
}

impl Store {
    /// Opens (or creates) the store in `dir`, taking its lock, reading its log and starting
    /// this process's segment; `build` names this build in what it writes.
    pub(crate) fn open(
        dir: &Path,
        durability: Durability,
        build: &str,
    ) -> Result<Store, DurableError> {
        for sub in ["log", "snap", "blobs"] {
            fs::create_dir_all(dir.join(sub))
                .map_err(|e| failed(dir, "creating the state directory", e))?;
        }
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))
            .map_err(|e| failed(dir, "opening its lock file", e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(DurableError::InUse {
                    dir: dir.to_path_buf(),
                });
            }
            Err(fs::TryLockError::Error(e)) => return Err(failed(dir, "locking it", e)),
        }
        let flush = durability == Durability::Sync;
        let mut index = Index {
            mend: true,
            ..Index::default()
        };
        index.read_snapshots(dir)?;
        index.read_log(dir)?;
        let last_lsn = index.last_lsn;
        let first_lsn = last_lsn + 1;
        let (segment, segment_len) = start_segment(dir, first_lsn, build, flush)?;
        index.segments.insert(first_lsn, HashMap::new());
        let next_id = index
            .properties
            .values()
            .map(|p| p.id + 1)
            .max()
            .unwrap_or(0);
        Ok(Store {
            dir: dir.to_path_buf(),
            flush,
            build: build.into(),
            last_lsn,
            _lock: lock,
            inner: Mutex::new(Inner {
                segment,
                segment_len,
                segments: index.segments,
                properties: index.properties,
                next_id,
                newest: last_lsn,
                snapshots: index.snapshots,
                unread: index.records,
            }),
        })
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The property named `name`, if the store has it.
    pub(crate) fn property(&self, name: &str) -> Option<PropertyMeta> {
        self.inner().properties.get(name).cloned()
    }

    /// A new property: its id, taken now, and its entry, to be committed with its first
    /// snapshot.
    pub(crate) fn new_property(&self, name: &str, type_name: &str) -> PropertyMeta {
        let mut inner = self.inner();
        let meta = PropertyMeta {
            id: inner.next_id,
            name: name.into(),
            type_name: type_name.into(),
        };
        inner.next_id += 1;
        inner.properties.insert(name.into(), meta.clone());
        meta
    }

    /// Everything stored of property `id`: read the first time; afterwards the property lives
    /// in memory, and this is only asked again if that first open failed.
    pub(crate) fn load(&self, id: u32) -> Result<Stored, DurableError> {
        let inner = self.inner();
        let mut stored = Stored::default();
        let kept = inner.snapshots.get(&id).cloned().unwrap_or_default();
        for &lsn in kept.iter().rev() {
            let path = snapshot_path(&self.dir, id, lsn);
            let bytes = read_snapshot(&path)
                .map_err(|e| failed(&self.dir, format_args!("reading {}", path.display()), e))?;
            stored.snapshots.push((lsn, bytes));
        }
        let after = kept.first().copied().unwrap_or(0);
        stored.records = inner
            .unread
            .get(&id)
            .map(|r| r.iter().filter(|(lsn, ..)| *lsn > after).cloned().collect())
            .unwrap_or_default();
        Ok(stored)
    }

    /// Drops what [`Store::load`] read of property `id`, once it is open.
    pub(crate) fn loaded(&self, id: u32) {
        self.inner().unread.remove(&id);
    }

    /// Commits one round of writes (see the module docs), leaving `batch` empty (with its
    /// capacity).
    pub(crate) fn commit(&self, batch: &mut Batch) -> Result<(), DurableError> {
        let mut inner = self.inner();
        let inner = &mut *inner;
        let buffer = &mut batch.frames;
        let mut snapshots = Vec::new();
        for w in batch.others.drain(..) {
            match w {
                Write::Property(meta) => {
                    append_frame(buffer, |out| {
                        format::encode_into(out, &Entry::Property(meta))
                    });
                }
                Write::Snapshot {
                    property,
                    lsn,
                    bytes,
                } => {
                    inner.newest = inner.newest.max(lsn);
                    snapshots.push((property, lsn, bytes));
                }
            }
        }
        let mut current = *inner
            .segments
            .keys()
            .next_back()
            .expect("a current segment");
        let records = batch.records.drain(..);
        let newest_record = records.as_slice().iter().map(|(_, lsn)| *lsn).max();
        if !buffer.is_empty() && inner.segment_len + buffer.len() as u64 > SEGMENT_BYTES {
            // This round starts the next segment. Segments are named in the order they
            // start; a record staged before a later one may land after it (trustees flush
            // in any order), so a property's records are put back in LSN order when read.
            current = inner.newest.max(newest_record.unwrap_or(0)).max(current) + 1;
            let (segment, len) = start_segment(&self.dir, current, &self.build, self.flush)?;
            inner.segment = segment;
            inner.segment_len = len;
            inner.segments.insert(current, HashMap::new());
        }
        let index = inner
            .segments
            .get_mut(&current)
            .expect("the current segment");
        for (property, lsn) in records {
            inner.newest = inner.newest.max(lsn);
            let newest = index.entry(property).or_insert(lsn);
            *newest = (*newest).max(lsn);
        }
        if !buffer.is_empty() {
            // Named only when something fails: building the path would allocate every round.
            let path = || segment_path(&self.dir, current);
            let at = inner.segment_len;
            if crash::at("half-record") {
                // What a crash in the middle of this write leaves: half of it.
                inner
                    .segment
                    .write_all_at(&buffer[..buffer.len() / 2], at)
                    .ok();
                crash::kill("half-record");
            }
            inner.segment.write_all_at(buffer, at).map_err(|e| {
                failed(
                    &self.dir,
                    format_args!("appending to {}", path().display()),
                    e,
                )
            })?;
            inner.segment_len += buffer.len() as u64;
            LOG_BYTES.fetch_add(buffer.len() as u64, Ordering::Relaxed);
            buffer.clear();
            crash::point("appended");
            if self.flush {
                SYNCS.fetch_add(1, Ordering::Relaxed);
                inner.segment.sync_data().map_err(|e| {
                    failed(&self.dir, format_args!("flushing {}", path().display()), e)
                })?;
            }
        }
        if !snapshots.is_empty() {
            for (property, lsn, bytes) in snapshots {
                self.write_snapshot(property, lsn, &bytes)?;
                let kept = inner.snapshots.entry(property).or_default();
                kept.push(lsn);
                while kept.len() > 2 {
                    let old = kept.remove(0);
                    let path = snapshot_path(&self.dir, property, old);
                    fs::remove_file(&path).map_err(|e| {
                        failed(&self.dir, format_args!("deleting {}", path.display()), e)
                    })?;
                }
            }
            self.compact(inner)?;
        }
        Ok(())
    }

    /// Keeps `bytes` as a blob of property `property` (SHA-256 `hash`): complete under its
    /// final name, durable under `Sync`, before this returns. Bytes already kept are not
    /// written again.
    pub(crate) fn write_blob(
        &self,
        property: u32,
        hash: &[u8; 32],
        bytes: &[u8],
    ) -> Result<(), DurableError> {
        let path = blob_path(&self.dir, property, hash);
        if fs::metadata(&path).is_ok_and(|m| m.len() == bytes.len() as u64) {
            return Ok(());
        }
        let tmp = path.with_extension("tmp");
        let write = || -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(bytes)?;
            if self.flush {
                SYNCS.fetch_add(1, Ordering::Relaxed);
                f.sync_data()?;
            }
            fs::rename(&tmp, &path)?;
            if self.flush {
                sync_dir(&self.dir.join("blobs"))?;
            }
            Ok(())
        };
        write().map_err(|e| failed(&self.dir, format_args!("writing {}", path.display()), e))
    }

    /// The bytes of a blob of property `property`, checked against its length and hash;
    /// `None` when they are gone (or damaged).
    pub(crate) fn read_blob(&self, property: u32, hash: &[u8; 32], len: u64) -> Option<Vec<u8>> {
        let bytes = fs::read(blob_path(&self.dir, property, hash)).ok()?;
        (bytes.len() as u64 == len && sha256(&bytes) == *hash).then_some(bytes)
    }

    /// Deletes the bytes of a blob of property `property` (gone already is fine).
    pub(crate) fn delete_blob(&self, property: u32, hash: &[u8; 32]) {
        let _ = fs::remove_file(blob_path(&self.dir, property, hash));
    }

    /// Writes a snapshot file: complete under its final name, or not at all.
    fn write_snapshot(&self, property: u32, lsn: u64, bytes: &[u8]) -> Result<(), DurableError> {
        let path = snapshot_path(&self.dir, property, lsn);
        let tmp = path.with_extension("tmp");
        let mut framed = Vec::with_capacity(bytes.len() + 8);
        append_frame(&mut framed, |out| out.extend_from_slice(bytes));
        let write = || -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(&framed)?;
            if self.flush {
                SYNCS.fetch_add(1, Ordering::Relaxed);
                f.sync_data()?;
            }
            crash::point("snapshot-written");
            fs::rename(&tmp, &path)?;
            if self.flush {
                sync_dir(&self.dir.join("snap"))?;
            }
            crash::point("renamed");
            Ok(())
        };
        write().map_err(|e| failed(&self.dir, format_args!("writing {}", path.display()), e))
    }

    /// Deletes the closed segments whose records are all covered by their properties' older
    /// kept snapshots.
    fn compact(&self, inner: &mut Inner) -> Result<(), DurableError> {
        let current = *inner
            .segments
            .keys()
            .next_back()
            .expect("a current segment");
        let needed = |newest: &HashMap<u32, u64>| {
            newest.iter().any(|(p, lsn)| {
                inner
                    .snapshots
                    .get(p)
                    .and_then(|kept| kept.first())
                    .is_none_or(|older| older < lsn)
            })
        };
        let done: Vec<u64> = inner
            .segments
            .iter()
            .filter(|(first, newest)| **first != current && !needed(newest))
            .map(|(first, _)| *first)
            .collect();
        for first in done {
            let path = segment_path(&self.dir, first);
            fs::remove_file(&path)
                .map_err(|e| failed(&self.dir, format_args!("deleting {}", path.display()), e))?;
            inner.segments.remove(&first);
        }
        Ok(())
    }
}

/// Creates the segment whose first LSN is `first_lsn`: its header, then zeros up to
/// [`SEGMENT_BYTES`], flushed with its directory entry under `Sync`; returns it and the
/// length of its header.
fn start_segment(
    dir: &Path,
    first_lsn: u64,
    build: &str,
    flush: bool,
) -> Result<(File, u64), DurableError> {
    let path = segment_path(dir, first_lsn);
    let mut header = Vec::new();
    append_frame(&mut header, |out| {
        format::encode_into(
            out,
            &Entry::Segment {
                first_lsn,
                build: build.into(),
            },
        )
    });
    let create = || -> std::io::Result<File> {
        // A segment of this name holds no record (its first LSN is past every stored one):
        // at most the header and property entries of a process that crashed before its
        // first record, whose properties have no snapshot and so were never created.
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)?;
        f.write_all(&header)?;
        // Written out (not a hole, not preallocated space), so that no record's flush has
        // to allocate (see SEGMENT_BYTES).
        let zeros = vec![0u8; 1 << 20];
        let mut left = SEGMENT_BYTES.saturating_sub(header.len() as u64);
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            f.write_all(&zeros[..n])?;
            left -= n as u64;
        }
        if flush {
            SYNCS.fetch_add(1, Ordering::Relaxed);
            f.sync_data()?;
            sync_dir(&dir.join("log"))?;
        }
        Ok(f)
    };
    let f = create().map_err(|e| failed(dir, format_args!("starting {}", path.display()), e))?;
    Ok((f, header.len() as u64))
}

/// A rank's stored state as text, read without changing it and without its lock: each
/// property with its snapshots and the records after them, and what a crash left to mend.
pub(crate) fn inspect(dir: &Path) -> Result<String, DurableError> {
    use std::fmt::Write as _;
    let mut index = Index::default();
    index.read_snapshots(dir)?;
    index.read_log(dir)?;
    let mut out = String::new();
    let mut properties: Vec<_> = index.properties.values().collect();
    properties.sort_by_key(|p| p.id);
    let _ = writeln!(
        out,
        "{}: {} properties, {} segments, last LSN {}",
        dir.display(),
        properties.len(),
        index.segments.len(),
        index.last_lsn
    );
    for p in properties {
        let _ = writeln!(
            out,
            "property \"{}\" (id {}, {})",
            p.name, p.id, p.type_name
        );
        for &lsn in index.snapshots.get(&p.id).into_iter().flatten().rev() {
            let path = snapshot_path(dir, p.id, lsn);
            match read_snapshot(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| format::decode::<Snapshot>(&b).map_err(|e| e.to_string()))
            {
                Ok(s) => {
                    let kept: usize = s.completions.values().map(|c| c.done.len()).sum();
                    let _ = writeln!(
                        out,
                        "  snapshot before LSN {lsn}: state {} bytes (fingerprint {:016x}), {} \
                         clients, {kept} outcomes kept, {} calls of its own in flight; by {}",
                        s.state.len(),
                        s.fingerprint,
                        s.completions.len(),
                        s.outgoing.pending.len(),
                        s.build
                    );
                    for made in s.blobs.describe() {
                        let _ = writeln!(out, "    {made}");
                    }
                    for notice in &s.blobs.notices {
                        let _ = writeln!(out, "    owes {notice}");
                    }
                }
                Err(e) => {
                    let _ = writeln!(out, "  snapshot before LSN {lsn}: unreadable: {e}");
                }
            }
        }
        for (lsn, payload, build) in index.records.get(&p.id).into_iter().flatten() {
            match format::decode::<Entry>(payload) {
                Ok(Entry::Record(r)) if r.op == format::LAPSE => {
                    let ended = match postcard::from_bytes::<format::Lapsed>(&r.argument) {
                        Ok(lapsed) => lapsed
                            .iter()
                            .map(|(client, below)| format!("{client:016x} (below seq {below})"))
                            .collect::<Vec<_>>()
                            .join(", "),
                        Err(e) => format!("unreadable ({e})"),
                    };
                    let _ = writeln!(out, "  LSN {lsn}: leases ended: {ended}");
                }
                Ok(Entry::Record(r)) if r.op == super::blob::CHANGE => {
                    let change = postcard::from_bytes::<super::blob::Change>(&r.argument)
                        .map_or_else(|e| format!("unreadable ({e})"), |c| format!("{c:?}"));
                    let _ = writeln!(out, "  LSN {lsn}: blobs: {change}");
                }
                Ok(Entry::Record(r)) => {
                    let outcome = match &r.outcome {
                        format::Outcome::Returned(b) => format!("returned {} bytes", b.len()),
                        format::Outcome::Panicked(m) => format!("panicked: {m}"),
                    };
                    let carried: String = r
                        .passing
                        .iter()
                        .flat_map(|p| &p.blobs)
                        .map(|b| format!(", carried {b}"))
                        .collect();
                    let _ = writeln!(
                        out,
                        "  LSN {lsn}: {} from client {:016x} seq {} (ack {}), argument {} \
                         bytes{carried}, {outcome}",
                        r.op,
                        r.client,
                        r.seq,
                        r.ack,
                        r.argument.len()
                    );
                }
                Ok(other) => {
                    let _ = writeln!(out, "  LSN {lsn}: not a record: {other:?}");
                }
                Err(e) => {
                    let _ = writeln!(out, "  LSN {lsn}: unreadable ({e}), written by {build}");
                }
            }
        }
    }
    for note in &index.notes {
        let _ = writeln!(out, "to mend: {note}");
    }
    Ok(out)
}

/// A snapshot file's payload.
fn read_snapshot(path: &Path) -> Result<Vec<u8>, String> {
    let bytes = fs::read(path).map_err(|e| e.to_string())?;
    match next_frame(&bytes) {
        Ok(Some((payload, len))) if len == bytes.len() => Ok(payload.to_vec()),
        Ok(_) => Err("not one frame".into()),
        Err(why) => Err(why.into()),
    }
}

/// What reading the state directory found.
#[derive(Default)]
struct Index {
    /// Whether to mend what a crash left (cut a torn tail, delete temporary snapshots), as
    /// opening does; an inspection only notes it.
    mend: bool,
    /// What an inspection found to mend.
    notes: Vec<String>,
    segments: BTreeMap<u64, HashMap<u32, u64>>,
    properties: HashMap<String, PropertyMeta>,
    snapshots: HashMap<u32, Vec<u64>>,
    records: HashMap<u32, Vec<StoredRecord>>,
    last_lsn: u64,
}

impl Index {
    /// Lists the snapshot files (deleting temporary ones) and reads who each belongs to.
    fn read_snapshots(&mut self, dir: &Path) -> Result<(), DurableError> {
        let snap = dir.join("snap");
        let listing = fs::read_dir(&snap).map_err(|e| failed(dir, "listing snap/", e))?;
        for entry in listing {
            let path = entry.map_err(|e| failed(dir, "listing snap/", e))?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if name.ends_with(".tmp") {
                // A snapshot a crash interrupted before its rename: never used.
                if self.mend {
                    fs::remove_file(&path)
                        .map_err(|e| failed(dir, format_args!("deleting {}", path.display()), e))?;
                } else {
                    self.notes.push(format!(
                        "{}: a snapshot a crash left unfinished (deleted when opened)",
                        path.display()
                    ));
                }
                continue;
            }
            let parsed = name.strip_suffix(".snap").and_then(|stem| {
                let (p, lsn) = stem.split_once('-')?;
                Some((p.parse::<u32>().ok()?, lsn.parse::<u64>().ok()?))
            });
            let Some((property, lsn)) = parsed else {
                return Err(failed(
                    dir,
                    format_args!("{}", path.display()),
                    "not a snapshot file",
                ));
            };
            self.snapshots.entry(property).or_default().push(lsn);
            self.last_lsn = self.last_lsn.max(lsn);
        }
        for (property, kept) in &mut self.snapshots {
            kept.sort_unstable();
            // Name and type are in every snapshot: read the newest readable one.
            let meta = kept.iter().rev().find_map(|&lsn| {
                let bytes = read_snapshot(&snapshot_path(dir, *property, lsn)).ok()?;
                let s = format::decode::<Snapshot>(&bytes).ok()?;
                Some(PropertyMeta {
                    id: s.property,
                    name: s.name,
                    type_name: s.type_name,
                })
            });
            if let Some(meta) = meta {
                self.properties.insert(meta.name.clone(), meta);
            }
        }
        Ok(())
    }

    /// Reads every segment in order, truncating a torn tail of the newest one.
    fn read_log(&mut self, dir: &Path) -> Result<(), DurableError> {
        let log = dir.join("log");
        let mut firsts = Vec::new();
        for entry in fs::read_dir(&log).map_err(|e| failed(dir, "listing log/", e))? {
            let path = entry.map_err(|e| failed(dir, "listing log/", e))?.path();
            let first = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".seg"))
                .and_then(|n| n.parse::<u64>().ok())
                .ok_or_else(|| failed(dir, format_args!("{}", path.display()), "not a segment"))?;
            firsts.push(first);
        }
        firsts.sort_unstable();
        for (i, &first) in firsts.iter().enumerate() {
            let newest = i + 1 == firsts.len();
            self.read_segment(dir, first, newest)?;
        }
        for records in self.records.values_mut() {
            records.sort_by_key(|(lsn, ..)| *lsn);
        }
        Ok(())
    }

    fn read_segment(&mut self, dir: &Path, first: u64, newest: bool) -> Result<(), DurableError> {
        let path = segment_path(dir, first);
        let at = |offset: usize, why: &dyn std::fmt::Display| {
            failed(
                dir,
                format_args!("{} at byte {offset}", path.display()),
                why,
            )
        };
        let mut bytes = Vec::new();
        File::open(&path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|e| failed(dir, format_args!("reading {}", path.display()), e))?;
        let mut offset = 0;
        let mut build: Arc<str> = Arc::from("an unknown build");
        let mut in_segment = HashMap::new();
        loop {
            let (payload, len) = match next_frame(&bytes[offset..]) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(why) if newest && !self.mend => {
                    self.notes.push(format!(
                        "{} at byte {offset}: {why}, the tail a crash tore (cut when opened)",
                        path.display()
                    ));
                    break;
                }
                Err(_) if newest => {
                    // The tail a crash tore: nothing after it was ever answered.
                    let f = OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .map_err(|e| at(offset, &e))?;
                    f.set_len(offset as u64).map_err(|e| at(offset, &e))?;
                    f.sync_all().map_err(|e| at(offset, &e))?;
                    break;
                }
                Err(why) => return Err(at(offset, &format_args!("damage ({why})"))),
            };
            // Records are most of a log: only their head is read here, the rest when their
            // property opens.
            if let Some((property, lsn)) = format::record_head(payload) {
                self.last_lsn = self.last_lsn.max(lsn);
                let newest_lsn = in_segment.entry(property).or_insert(lsn);
                *newest_lsn = (*newest_lsn).max(lsn);
                let covered = self
                    .snapshots
                    .get(&property)
                    .and_then(|kept| kept.first())
                    .is_some_and(|older| *older >= lsn);
                if !covered {
                    self.records.entry(property).or_default().push((
                        lsn,
                        payload.to_vec(),
                        build.clone(),
                    ));
                }
            } else {
                match format::decode::<Entry>(payload).map_err(|e| at(offset, &e))? {
                    Entry::Segment { build: b, .. } => build = b.into(),
                    Entry::Property(meta) => {
                        self.properties.entry(meta.name.clone()).or_insert(meta);
                    }
                    Entry::Record(_) => {
                        return Err(at(offset, &"a record whose head does not read"));
                    }
                }
            }
            offset += len;
        }
        self.segments.insert(first, in_segment);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::*;
    use super::*;

    fn open(dir: &Path) -> Result<Store, DurableError> {
        Store::open(dir, Durability::Sync, "test build")
    }

    #[test]
    fn records_come_back_in_lsn_order_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).unwrap();
        store.commit(&mut batch(&[(0, 2), (1, 3)], vec![])).unwrap();
        store.commit(&mut batch(&[(0, 1)], vec![])).unwrap(); // flushed late by its worker
        drop(store);
        let store = open(dir.path()).unwrap();
        assert_eq!(lsns(&store, 0), vec![1, 2]);
        assert_eq!(lsns(&store, 1), vec![3]);
        assert_eq!(store.last_lsn, 3);
    }

    #[test]
    fn a_torn_tail_is_cut_and_damage_elsewhere_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).unwrap();
        store.commit(&mut batch(&[(0, 1), (0, 2)], vec![])).unwrap();
        drop(store);
        let segment = newest_segment(dir.path());
        let end = written_len(&segment);
        let whole = fs::read(&segment).unwrap();
        // A crash in the middle of the next commit's write: half a frame after the end.
        let mut torn = whole.clone();
        torn[end..end + 7].copy_from_slice(&[40, 0, 0, 0, 1, 2, 3]);
        fs::write(&segment, &torn).unwrap();
        let store = open(dir.path()).unwrap();
        assert_eq!(lsns(&store, 0), vec![1, 2]);
        assert_eq!(
            fs::read(&segment).unwrap(),
            whole[..end],
            "the torn tail is cut"
        );
        drop(store);
        // The same segment is no longer the newest: a flipped byte in it is damage.
        let mut damaged = whole[..end].to_vec();
        damaged[end - 3] ^= 0xff;
        fs::write(&segment, &damaged).unwrap();
        let err = open(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("damage") && err.contains(".seg at byte"),
            "{err}"
        );
    }

    #[test]
    fn snapshots_keep_two_and_covered_segments_go() {
        let dir = tempfile::tempdir().unwrap();
        let snapshot = |lsn| Write::Snapshot {
            property: 0,
            lsn,
            bytes: vec![lsn as u8],
        };
        let store = open(dir.path()).unwrap();
        store
            .commit(&mut batch(&[(0, 1)], vec![snapshot(2)]))
            .unwrap();
        drop(store);
        let store = open(dir.path()).unwrap();
        store
            .commit(&mut batch(&[(0, 3)], vec![snapshot(4)]))
            .unwrap();
        drop(store);
        // A crash between writing a snapshot and renaming it leaves a temporary file.
        fs::write(
            dir.path().join("snap/0000000000-00000000000000000009.tmp"),
            b"x",
        )
        .unwrap();
        let store = open(dir.path()).unwrap();
        store
            .commit(&mut batch(&[(0, 5)], vec![snapshot(6)]))
            .unwrap();
        let snaps: Vec<_> = fs::read_dir(dir.path().join("snap"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(snaps.len(), 2, "{snaps:?}");
        let stored = store.load(0).unwrap();
        let kept: Vec<u64> = stored.snapshots.iter().map(|(lsn, _)| *lsn).collect();
        assert_eq!(kept, vec![6, 4]);
        // Records 1 and 3 lie before the older kept snapshot: their segments are gone.
        let segments = fs::read_dir(dir.path().join("log")).unwrap().count();
        assert_eq!(segments, 1, "only the segment with record 5 remains");
        drop(store);
        let store = open(dir.path()).unwrap();
        assert_eq!(lsns(&store, 0), vec![5]);
    }

    #[test]
    fn frames_refuse_lengths_and_checksums_that_do_not_hold() {
        let mut bytes = Vec::new();
        append_frame(&mut bytes, |out| out.extend_from_slice(b"hello"));
        assert_eq!(next_frame(&bytes), Ok(Some((&b"hello"[..], 13))));
        assert!(next_frame(&bytes[..12]).is_err());
        let mut flipped = bytes.clone();
        flipped[9] ^= 1;
        assert_eq!(next_frame(&flipped), Err("a frame failing its CRC"));
        let mut long = bytes.clone();
        long[3] = 0xff;
        assert_eq!(next_frame(&long), Err("a frame length past the limit"));
        // Records that end short of a header's worth before the segment's end.
        for left in 0..=9 {
            assert_eq!(next_frame(&vec![0; left]), Ok(None), "{left} zeros left");
        }
        assert!(next_frame(&[0, 0, 0, 1]).is_err());
    }
}

/// What a crash leaves of a log, at random: the durable bytes of the segment stay, the bytes
/// written since its last flush are cut anywhere and may end in garbage (a torn write); the
/// recovered log is what was durable and, past it, only whole records that were written.
#[cfg(test)]
mod crash_tests {
    use proptest::prelude::*;

    use super::tests_support::*;
    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn a_crash_loses_nothing_durable_and_keeps_no_torn_record(
            rounds in proptest::collection::vec(1usize..6, 1..8),
            synced in 0usize..8,
            cut in 0.0f64..1.0,
            garbage in proptest::collection::vec(any::<u8>(), 0..24),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(dir.path(), Durability::Os, "test").unwrap();
            let segment = newest_segment(dir.path());
            let synced = synced.min(rounds.len());
            let (mut lsn, mut durable_len, mut durable_lsn) = (0u64, 0u64, 0u64);
            for (i, &n) in rounds.iter().enumerate() {
                let records: Vec<(u32, u64)> = (0..n).map(|_| { lsn += 1; (0, lsn) }).collect();
                store.commit(&mut batch(&records, vec![])).unwrap();
                if i < synced {
                    // Flushed: these bytes survive whatever comes after.
                    durable_len = written_len(&segment) as u64;
                    durable_lsn = lsn;
                }
            }
            drop(store);
            let mut crashed = fs::read(&segment).unwrap();
            let written = written_len(&segment);
            // Of the bytes written since the flush, a prefix stays; the rest reads as zeros
            // (never written) or garbage (a torn write).
            let keep = durable_len as usize
                + ((written - durable_len as usize) as f64 * cut) as usize;
            crashed[keep..written].fill(0);
            crashed[keep..keep + garbage.len()].copy_from_slice(&garbage);
            fs::write(&segment, &crashed).unwrap();
            let store = Store::open(dir.path(), Durability::Os, "test").unwrap();
            let recovered = lsns(&store, 0);
            // Every durable record, in order, then a prefix of the later ones: no gap, no
            // record that was not written whole.
            let expected: Vec<u64> = (1..=recovered.len() as u64).collect();
            prop_assert_eq!(&recovered, &expected);
            prop_assert!(recovered.len() as u64 >= durable_lsn, "lost a durable record");
            prop_assert!(recovered.len() as u64 <= lsn);
        }
    }
}

/// Helpers the store's tests share.
#[cfg(test)]
mod tests_support {
    use super::*;
    use crate::durable::format::{Bytes, Outcome, Record};

    /// A batch of records of `(property, lsn)`, then `others`.
    pub(super) fn batch(records: &[(u32, u64)], others: Vec<Write>) -> Batch {
        let mut batch = Batch::default();
        for &(property, lsn) in records {
            let r = Record {
                property,
                lsn,
                client: 1,
                seq: lsn,
                ack: 1,
                op: "op".into(),
                op_fingerprint: 0,
                argument: vec![lsn as u8].into(),
                outcome: Outcome::Returned(Bytes::empty()),
                passing: None,
            };
            batch.record(property, lsn, |out| {
                format::encode_into(out, &format::Entry::Record(r))
            });
        }
        for w in others {
            batch.push(w);
        }
        batch
    }

    pub(super) fn lsns(store: &Store, property: u32) -> Vec<u64> {
        let stored = store.load(property).unwrap();
        stored.records.iter().map(|(lsn, ..)| *lsn).collect()
    }

    /// Where a segment's frames end (its zeros start).
    pub(super) fn written_len(segment: &Path) -> usize {
        let bytes = fs::read(segment).unwrap();
        let mut at = 0;
        while let Ok(Some((_, len))) = next_frame(&bytes[at..]) {
            at += len;
        }
        at
    }

    pub(super) fn newest_segment(dir: &Path) -> PathBuf {
        let mut all: Vec<_> = fs::read_dir(dir.join("log"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        all.sort();
        all.pop().unwrap()
    }
}
