//! Where a rank's durable state lives: an append-only log in segments, and snapshot files.
//!
//! ```text
//! GSM_STATE_DIR/<job>/rank-<r>/
//!   lock                      held (flock) while a process uses this state
//!   log/<first LSN>.seg       frames: the segment's header, property entries, call records
//!   snap/<property>-<LSN>.snap   one frame: a property's state before LSN
//!   cuts                      one line per knowing cut: `<segment> <byte> <newest LSN>`
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
//! **Recovery.** On open every segment is read in order, and every frame is checked (its
//! length fits, its CRC holds). A frame that does not is told apart as follows.
//!
//! - *A torn tail*: the frame is in the newest segment and no whole frame starts anywhere
//!   after it. A commit is one `write` of whole frames over the segment's zeros, and a crash
//!   may leave any prefix of it: some whole frames (kept), then a frame cut short or whose
//!   bytes only partly landed, then zeros or a few bytes of garbage. Every frame before the
//!   last `fdatasync` is whole, so nothing cut was ever answered under `Sync`. The segment is
//!   truncated there and the store opens. A byte damaged in the very last frame, with nothing
//!   after it, cannot be told from this (a CRC says only that the bytes differ) and is cut
//!   the same way.
//! - *Damage*: a bad frame followed by any whole frame — one whose length fits, whose payload
//!   starts as an entry does, and whose CRC holds — found by trying every byte offset after
//!   it; or a bad frame in any segment but the newest. The frames after it were durable and
//!   may have been answered, so the store refuses to open, naming the file and the byte
//!   offset. A power loss that writes the pages of one unflushed commit out of order can also
//!   leave a whole frame after a hole: that is refused too (a false alarm, never a loss).
//!
//! Damage in the newest segment can be given up knowingly with `gsm state cut <rank dir>
//! <segment> <byte>` ([`cut`]), which truncates the segment at that byte, prints what it gave
//! up, and appends the cut to the rank's `cuts` file. Damage in an older segment cannot be
//! cut (the records after it would replay over a state missing the lost ones): restore the
//! rank's directory from a copy.
//!
//! **LSNs** are never given out twice for records that were stored: a process starts after
//! the newest LSN it reads in any frame, snapshot name or `cuts` line. A cut records in
//! `cuts` an LSN [`CUT_MARGIN`] past the newest one read in any frame, those it gives up
//! included: the damaged frame's own LSN cannot be read, but whole frames follow it, and
//! records reach the log out of LSN order only by the few rounds in flight. What can be
//! given out again is an LSN no frame ever held whole: a record of a torn tail, or one
//! staged and never written, whose answer never left.
//!
//! **Snapshots.** A snapshot is one frame, read whole and CRC-checked when its property
//! opens. If the newer of a property's two snapshots cannot be read or decoded, the older one
//! and the records after it rebuild the property, provided no cut since the older snapshot
//! can have removed some of those records (its LSN is past every `cuts` line's); otherwise,
//! and when no snapshot reads, opening the property fails naming each snapshot and why. A
//! segment deleted by hand is not detected.
//!
//! Leftover temporary snapshot files are deleted on open.
//!
//! **Compaction.** Each property keeps its two newest snapshots (see above); a snapshot
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
use crate::hash::ByNumber;

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

/// A property as stored: its newest snapshots (newest first, at most two: each its payload
/// or why it could not be read) and the records after the older one in LSN order, each with
/// the build that wrote it.
#[derive(Debug, Default)]
pub(crate) struct Stored {
    pub(crate) snapshots: Vec<(u64, Result<Vec<u8>, String>)>,
    pub(crate) records: Vec<StoredRecord>,
    /// The newest LSN any knowing cut of the log recorded (0: none): the records after a
    /// snapshot are all there only if its LSN is past this.
    pub(crate) cut: u64,
}

/// A rank's open store.
pub(crate) struct Store {
    dir: PathBuf,
    flush: bool,
    /// This build, as segment headers and snapshots name it.
    pub(crate) build: Arc<str>,
    /// The newest LSN stored when this process opened the store.
    pub(crate) last_lsn: u64,
    /// The newest LSN recorded by a knowing cut of the log (0: none).
    cut: u64,
    /// Held for the store's life: another process opening this rank's state is refused.
    _lock: File,
    inner: Mutex<Inner>,
}

struct Inner {
    /// The segment being written, and how long it is.
    segment: File,
    segment_len: u64,
    /// Every segment by first LSN: the newest LSN each property has in it.
    segments: BTreeMap<u64, ByNumber<u64, u32>>,
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
        return if next_nonzero(bytes, 0).is_none() {
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

/// Where the first byte of `bytes` at or after `from` that is not zero is: a segment's
/// unwritten tail, megabytes long, is checked at every open. Compared a page at a time
/// (`memcmp`), which stays fast in unoptimised builds too: a byte loop there was half the
/// CPU time of the crash tests' ranks.
fn next_nonzero(bytes: &[u8], from: usize) -> Option<usize> {
    const PAGE: [u8; 4096] = [0; 4096];
    let mut at = from;
    for chunk in bytes.get(from..)?.chunks(PAGE.len()) {
        if chunk != &PAGE[..chunk.len()] {
            return chunk.iter().position(|&b| b != 0).map(|i| at + i);
        }
        at += chunk.len();
    }
    None
}

/// Where the first whole frame at or after byte `from` of `bytes` starts, trying every
/// offset: what tells damage (a whole frame after a bad one) from a torn tail (none).
fn whole_frame_from(bytes: &[u8], mut from: usize) -> Option<usize> {
    while from < bytes.len() {
        // A frame's length is not zero, so a frame starts at most 3 bytes before a byte that
        // is not: runs of zeros are skipped a page at a time.
        from = from.max(next_nonzero(bytes, from)?.saturating_sub(3));
        if starts_whole_frame(bytes, from) {
            return Some(from);
        }
        from += 1;
    }
    None
}

/// Whether a frame whose length fits, whose payload starts as an entry does and whose CRC
/// holds starts at byte `at` of `bytes`. The CRC is checked last: most offsets fail before.
fn starts_whole_frame(bytes: &[u8], at: usize) -> bool {
    let Some(header) = bytes.get(at..).and_then(|rest| rest.get(..8)) else {
        return false;
    };
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
    bytes
        .get(at + 8..)
        .and_then(|rest| rest.get(..len))
        .is_some_and(|payload| {
            len <= MAX_FRAME && format::starts_entry(payload) && crc32fast::hash(payload) == crc
        })
}

/// For the fuzz target: reads `data` as a segment, frame by frame, and past each bad frame
/// looks for a whole one as recovery does. Panics if what it finds is not a frame reading
/// accepts.
#[cfg(feature = "fuzzing")]
pub(crate) fn check_segment(data: &[u8]) {
    let mut at = 0;
    loop {
        match next_frame(&data[at..]) {
            Ok(Some((_, len))) => at += len,
            Ok(None) => return,
            Err(_) => match whole_frame_from(data, at + 1) {
                Some(next) => {
                    assert!(
                        matches!(next_frame(&data[next..]), Ok(Some(_))),
                        "the search found a frame at byte {next} that reading refuses"
                    );
                    at = next;
                }
                None => return,
            },
        }
    }
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

/// The hash a blob file's name spells in hex ([`blob_path`]), if it does.
fn parse_hash(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut hash = [0u8; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(hash)
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

/// Takes the lock of the state in `dir` (creating its file): refused while another process
/// holds it.
fn lock_dir(dir: &Path) -> Result<File, DurableError> {
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))
        .map_err(|e| failed(dir, "opening its lock file", e))?;
    match lock.try_lock() {
        Ok(()) => Ok(lock),
        Err(fs::TryLockError::WouldBlock) => Err(DurableError::InUse {
            dir: dir.to_path_buf(),
        }),
        Err(fs::TryLockError::Error(e)) => Err(failed(dir, "locking it", e)),
    }
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
        let lock = lock_dir(dir)?;
        let flush = durability == Durability::Sync;
        let mut index = Index {
            mend: true,
            ..Index::default()
        };
        index.read_cuts(dir)?;
        index.read_snapshots(dir)?;
        index.read_log(dir)?;
        let last_lsn = index.last_lsn;
        let first_lsn = last_lsn + 1;
        let (segment, segment_len) = start_segment(dir, first_lsn, build, flush)?;
        index.segments.insert(first_lsn, ByNumber::default());
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
            cut: index.cut(),
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
    /// in memory, and this is only asked again if that first open failed. A snapshot that
    /// cannot be read is returned as why, for the caller to fall back on the older one.
    pub(crate) fn load(&self, id: u32) -> Result<Stored, DurableError> {
        let inner = self.inner();
        let mut stored = Stored {
            cut: self.cut,
            ..Stored::default()
        };
        let kept = inner.snapshots.get(&id).cloned().unwrap_or_default();
        for &lsn in kept.iter().rev() {
            let path = snapshot_path(&self.dir, id, lsn);
            let bytes = read_snapshot(&path).map_err(|e| format!("{}: {e}", path.display()));
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
            inner.segments.insert(current, ByNumber::default());
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

    /// Up to `count` bytes from byte `at` of a blob of property `property` whose file holds
    /// `len` bytes; `None` when the file is gone, not `len` bytes long, or `at` lies past
    /// its end. Not checked against the hash: the reader checks the whole.
    pub(crate) fn read_blob_piece(
        &self,
        property: u32,
        hash: &[u8; 32],
        len: u64,
        at: u64,
        count: u64,
    ) -> Option<Vec<u8>> {
        let file = File::open(blob_path(&self.dir, property, hash)).ok()?;
        if file.metadata().ok()?.len() != len || at > len {
            return None;
        }
        let mut bytes = vec![0; usize::try_from(count.min(len - at)).ok()?];
        file.read_exact_at(&mut bytes, at).ok()?;
        Some(bytes)
    }

    /// Deletes the bytes of a blob of property `property` (gone already is fine).
    pub(crate) fn delete_blob(&self, property: u32, hash: &[u8; 32]) {
        let _ = fs::remove_file(blob_path(&self.dir, property, hash));
    }

    /// Deletes every file of property `property` in `blobs/` whose SHA-256 `keep` does not
    /// hold, and its leftover temporary files; returns how many went. Only the names
    /// [`blob_path`] gives property `property` are touched: other properties' files, and
    /// anything else in the directory, stay.
    pub(crate) fn sweep_blobs(
        &self,
        property: u32,
        keep: &std::collections::BTreeSet<[u8; 32]>,
    ) -> Result<usize, DurableError> {
        let blobs = self.dir.join("blobs");
        let listing = fs::read_dir(&blobs).map_err(|e| failed(&self.dir, "listing blobs/", e))?;
        let prefix = format!("{property:010}-");
        let mut removed = 0;
        for entry in listing {
            let entry = entry.map_err(|e| failed(&self.dir, "listing blobs/", e))?;
            let name = entry.file_name();
            let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
                continue;
            };
            let (hex, tmp) = match rest.strip_suffix(".tmp") {
                Some(hex) => (hex, true),
                None => (rest, false),
            };
            let Some(hash) = parse_hash(hex) else {
                continue;
            };
            if tmp || !keep.contains(&hash) {
                let path = entry.path();
                fs::remove_file(&path).map_err(|e| {
                    failed(&self.dir, format_args!("deleting {}", path.display()), e)
                })?;
                removed += 1;
            }
        }
        if removed > 0 && self.flush {
            sync_dir(&blobs).map_err(|e| failed(&self.dir, "flushing blobs/", e))?;
        }
        Ok(removed)
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
        let needed = |newest: &ByNumber<u64, u32>| {
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
    index.read_cuts(dir)?;
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
    for (segment, at, newest) in &index.cuts {
        let _ = writeln!(
            out,
            "cut knowingly: {segment} at byte {at}, LSNs continue after {newest}"
        );
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

/// The first LSNs of the segments in `dir`'s log, ascending.
fn segment_firsts(dir: &Path) -> Result<Vec<u64>, DurableError> {
    let mut firsts = Vec::new();
    for entry in fs::read_dir(dir.join("log")).map_err(|e| failed(dir, "listing log/", e))? {
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
    Ok(firsts)
}

/// The refusal of a log damaged at byte `offset` of segment `path` (`why`), with the first
/// whole frame after it at `later`: what it means and how to proceed.
fn damage(
    dir: &Path,
    path: &Path,
    offset: usize,
    why: &str,
    later: Option<usize>,
    newest: bool,
) -> DurableError {
    let after = later.map_or(String::new(), |at| {
        format!(
            ", with a whole frame after it at byte {at} (what follows was stored, and may have \
             been answered)"
        )
    });
    let proceed = if newest {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        format!(
            "to give up every record from byte {offset} on, knowingly, run `gsm state cut {} \
             {name} {offset}` (it prints what it gives up), or restore the rank's directory from \
             a copy",
            dir.display()
        )
    } else {
        "it is not the newest segment, so it cannot be cut (the records after it would replay \
         over a state missing the lost ones): restore the rank's directory from a copy"
            .to_string()
    };
    failed(
        dir,
        format_args!("{} is damaged at byte {offset}", path.display()),
        format_args!("{why}{after}; {proceed}"),
    )
}

/// Gives up the newest segment of the store in `dir` from byte `at` on, where its first bad
/// frame is (see the module docs): records the cut in `cuts`, with the newest LSN read in
/// any frame (those given up too), then truncates the segment. Takes the store's lock.
/// Returns what was given up, as text.
pub(crate) fn cut(dir: &Path, segment: &str, at: u64) -> Result<String, DurableError> {
    use std::fmt::Write as _;
    if !dir.join("log").is_dir() {
        return Err(failed(
            dir,
            "cutting its log",
            "it has no log/ (not a rank's state)",
        ));
    }
    let _lock = lock_dir(dir)?;
    let mut index = Index::default();
    index.read_cuts(dir)?;
    index.read_snapshots(dir)?;
    let firsts = segment_firsts(dir)?;
    let Some((&newest, older)) = firsts.split_last() else {
        return Err(failed(dir, "cutting its log", "log/ has no segment"));
    };
    let path = segment_path(dir, newest);
    let name = path
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let asked = Path::new(segment).file_name().unwrap_or_default();
    if asked.to_string_lossy() != name {
        return Err(failed(
            dir,
            format_args!("cutting {segment}"),
            format_args!("only the newest segment, {name}, can be cut"),
        ));
    }
    for &first in older {
        index.read_segment(dir, first, false)?;
    }
    let bytes =
        fs::read(&path).map_err(|e| failed(dir, format_args!("reading {}", path.display()), e))?;
    let mut newest_lsn = index.last_lsn;
    let mut offset = 0;
    let why = loop {
        match next_frame(&bytes[offset..]) {
            Ok(Some((payload, len))) => {
                match format::record_head(payload) {
                    Some((_, lsn)) => newest_lsn = newest_lsn.max(lsn),
                    None => {
                        if let Ok(Entry::Property(meta)) = format::decode::<Entry>(payload) {
                            index.properties.entry(meta.name.clone()).or_insert(meta);
                        }
                    }
                }
                offset += len;
            }
            Ok(None) => {
                return Err(failed(
                    dir,
                    format_args!("cutting {}", path.display()),
                    "every frame in it is whole: nothing to cut",
                ));
            }
            Err(why) => break why,
        }
    };
    if offset as u64 != at {
        return Err(failed(
            dir,
            format_args!("cutting {} at byte {at}", path.display()),
            format_args!("its first bad frame is at byte {offset} ({why}): nothing cut"),
        ));
    }
    // What is given up: the whole frames after the bad one, by property.
    let mut lost: BTreeMap<u32, (usize, u64, u64)> = BTreeMap::new();
    let mut others = 0;
    let mut next = whole_frame_from(&bytes, offset + 1);
    while let Some(start) = next {
        let Ok(Some((payload, len))) = next_frame(&bytes[start..]) else {
            next = whole_frame_from(&bytes, start + 1);
            continue;
        };
        match format::record_head(payload) {
            Some((property, lsn)) => {
                newest_lsn = newest_lsn.max(lsn);
                let (n, first, last) = lost.entry(property).or_insert((0, lsn, lsn));
                *n += 1;
                *first = (*first).min(lsn);
                *last = (*last).max(lsn);
            }
            None => others += 1,
        }
        next = whole_frame_from(&bytes, start + len);
    }
    let newest_lsn = newest_lsn.saturating_add(CUT_MARGIN);
    let cuts = dir.join(CUTS);
    let record = || -> std::io::Result<()> {
        let mut f = OpenOptions::new().create(true).append(true).open(&cuts)?;
        writeln!(f, "{name} {at} {newest_lsn}")?;
        f.sync_data()?;
        sync_dir(dir)?;
        let segment = OpenOptions::new().write(true).open(&path)?;
        segment.set_len(at)?;
        segment.sync_all()
    };
    record().map_err(|e| {
        failed(
            dir,
            format_args!("cutting {} at byte {at}", path.display()),
            e,
        )
    })?;
    let names: HashMap<u32, &str> = index
        .properties
        .values()
        .map(|p| (p.id, p.name.as_str()))
        .collect();
    let mut out = format!("cut {} at byte {at} ({why}); given up:\n", path.display());
    for (property, (n, first, last)) in &lost {
        let name = names
            .get(property)
            .copied()
            .unwrap_or("(created in what was cut)");
        let _ = writeln!(
            out,
            "  property \"{name}\" (id {property}): {n} records, LSNs {first} to {last}"
        );
    }
    let _ = writeln!(
        out,
        "  {others} other entries, and what the bad frame held\nLSNs continue after \
         {newest_lsn} (recorded in {})",
        cuts.display()
    );
    Ok(out)
}

/// What reading the state directory found.
#[derive(Default)]
struct Index {
    /// Whether to mend what a crash left (cut a torn tail, delete temporary snapshots), as
    /// opening does; an inspection only notes it.
    mend: bool,
    /// What an inspection found to mend.
    notes: Vec<String>,
    segments: BTreeMap<u64, ByNumber<u64, u32>>,
    properties: HashMap<String, PropertyMeta>,
    snapshots: HashMap<u32, Vec<u64>>,
    records: HashMap<u32, Vec<StoredRecord>>,
    last_lsn: u64,
    /// The knowing cuts of the log: segment, byte, the newest LSN read when it was cut.
    cuts: Vec<(String, u64, u64)>,
}

/// The file listing the knowing cuts of a rank's log, one a line.
const CUTS: &str = "cuts";

/// How far past the newest LSN read a cut makes LSNs continue: past the LSN of the damaged
/// frame, which cannot be read (see the module docs).
const CUT_MARGIN: u64 = 1 << 32;

impl Index {
    /// The newest LSN a knowing cut recorded (0: none).
    fn cut(&self) -> u64 {
        self.cuts.iter().map(|&(_, _, lsn)| lsn).max().unwrap_or(0)
    }

    /// Reads the `cuts` file (absent: no cut); LSNs continue after the newest it names.
    fn read_cuts(&mut self, dir: &Path) -> Result<(), DurableError> {
        let path = dir.join(CUTS);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(failed(dir, format_args!("reading {}", path.display()), e)),
        };
        for (i, line) in text.lines().enumerate() {
            let mut words = line.split(' ');
            let cut = (|| Some((words.next()?, words.next()?.parse().ok()?, words.next()?)))()
                .and_then(|(segment, at, lsn)| Some((segment.to_string(), at, lsn.parse().ok()?)))
                .filter(|_| words.next().is_none());
            let Some(cut) = cut else {
                return Err(failed(
                    dir,
                    format_args!("{} line {}", path.display(), i + 1),
                    format_args!(
                        "{line:?} is not `<segment> <byte> <LSN>` (the file is written by \
                         `gsm state cut`; restore it from a copy)"
                    ),
                ));
            };
            self.last_lsn = self.last_lsn.max(cut.2);
            self.cuts.push(cut);
        }
        Ok(())
    }

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
        let firsts = segment_firsts(dir)?;
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
        let mut in_segment = ByNumber::default();
        loop {
            let (payload, len) = match next_frame(&bytes[offset..]) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(why) => match whole_frame_from(&bytes, offset + 1) {
                    None if newest && !self.mend => {
                        self.notes.push(format!(
                            "{} at byte {offset}: {why}, the tail a crash tore (cut when opened)",
                            path.display()
                        ));
                        break;
                    }
                    None if newest => {
                        // The tail a crash tore, with no whole frame after it: the rest of
                        // a commit's write that never landed, so never answered.
                        let f = OpenOptions::new()
                            .write(true)
                            .open(&path)
                            .map_err(|e| at(offset, &e))?;
                        f.set_len(offset as u64).map_err(|e| at(offset, &e))?;
                        f.sync_all().map_err(|e| at(offset, &e))?;
                        break;
                    }
                    later => return Err(damage(dir, &path, offset, why, later, newest)),
                },
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
            err.contains(&format!("{} is damaged at byte", segment.display()))
                && err.contains("cannot be cut"),
            "{err}"
        );
        let name = segment.file_name().unwrap().to_str().unwrap();
        let refused = cut(dir.path(), name, 0).unwrap_err().to_string();
        assert!(refused.contains("only the newest segment"), "{refused}");
    }

    /// 300 records of property 0 (LSNs 1 to 300) in one segment, committed ten at a time;
    /// the segment and where each frame starts.
    fn three_hundred_records(dir: &Path) -> (PathBuf, Vec<usize>) {
        let store = open(dir).unwrap();
        for round in 0..30 {
            let records: Vec<(u32, u64)> = (1..=10).map(|i| (0, round * 10 + i)).collect();
            store.commit(&mut batch(&records, vec![])).unwrap();
        }
        drop(store);
        let segment = newest_segment(dir);
        let bytes = fs::read(&segment).unwrap();
        let mut starts = vec![0];
        while let Ok(Some((_, len))) = next_frame(&bytes[*starts.last().unwrap()..]) {
            starts.push(starts.last().unwrap() + len);
        }
        starts.pop(); // where the zeros start
        (segment, starts)
    }

    #[test]
    fn one_flipped_byte_with_whole_frames_after_it_is_refused_naming_file_and_byte() {
        let dir = tempfile::tempdir().unwrap();
        let (segment, starts) = three_hundred_records(dir.path());
        // A byte a third of the way into the written frames, inside a record's payload.
        let third = starts[starts.len() - 1] / 3;
        let i = starts.iter().rposition(|&s| s <= third).unwrap();
        let (frame, end) = (starts[i], starts[i + 1]);
        let mut bytes = fs::read(&segment).unwrap();
        bytes[(frame + 8 + end) / 2] ^= 0x10;
        fs::write(&segment, &bytes).unwrap();
        let err = open(dir.path())
            .expect_err("a damaged frame with whole frames after it must be refused")
            .to_string();
        assert!(
            err.contains(&format!("{} is damaged at byte {frame}", segment.display()))
                && err.contains(&format!("whole frame after it at byte {end}"))
                && err.contains("gsm state cut"),
            "{err}"
        );
        assert_eq!(fs::read(&segment).unwrap(), bytes, "nothing was cut");
        // So is a header zeroed, which reads as the end of the log.
        bytes[(frame + 8 + end) / 2] ^= 0x10;
        bytes[frame..frame + 8].fill(0);
        fs::write(&segment, &bytes).unwrap();
        let err = open(dir.path()).unwrap_err().to_string();
        assert!(err.contains(&format!("damaged at byte {frame}")), "{err}");
    }

    #[test]
    fn a_last_frame_failing_its_crc_with_only_zeros_after_it_is_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let (segment, starts) = three_hundred_records(dir.path());
        let last = starts[starts.len() - 1];
        let mut bytes = fs::read(&segment).unwrap();
        // A commit of several frames cut inside its last one: its end never landed.
        let end = written_len(&segment);
        bytes[(last + end) / 2..end].fill(0);
        fs::write(&segment, &bytes).unwrap();
        let store = open(dir.path()).unwrap();
        assert_eq!(lsns(&store, 0), (1..300).collect::<Vec<u64>>());
        assert_eq!(store.last_lsn, 299, "the lost record was never answered");
        assert_eq!(
            fs::metadata(&segment).unwrap().len(),
            last as u64,
            "cut at it"
        );
    }

    #[test]
    fn a_knowing_cut_gives_up_the_rest_and_lsns_are_not_given_out_again() {
        let dir = tempfile::tempdir().unwrap();
        let (segment, starts) = three_hundred_records(dir.path());
        let name = segment.file_name().unwrap().to_str().unwrap();
        let frame = starts[100]; // the header, then records 1 to 99: this is record 100
        let mut bytes = fs::read(&segment).unwrap();
        bytes[frame + 9] ^= 1;
        fs::write(&segment, &bytes).unwrap();
        assert!(open(dir.path()).is_err(), "refused before the cut");
        let wrong = cut(dir.path(), name, frame as u64 + 1)
            .unwrap_err()
            .to_string();
        assert!(
            wrong.contains(&format!("its first bad frame is at byte {frame}")),
            "{wrong}"
        );
        let report = cut(dir.path(), name, frame as u64).unwrap();
        assert!(
            report.contains("200 records, LSNs 101 to 300")
                && report.contains(&format!("after {}", 300 + CUT_MARGIN)),
            "{report}"
        );
        let store = open(dir.path()).unwrap();
        assert_eq!(lsns(&store, 0), (1..100).collect::<Vec<u64>>());
        assert_eq!(
            store.last_lsn,
            300 + CUT_MARGIN,
            "LSNs continue past every one read, and the damaged one's"
        );
        drop(store);
        // Still so once the cut segment is older and the next one holds nothing.
        let store = open(dir.path()).unwrap();
        assert_eq!(store.last_lsn, 300 + CUT_MARGIN);
        let in_use = cut(dir.path(), name, frame as u64).unwrap_err();
        assert!(matches!(in_use, DurableError::InUse { .. }), "{in_use}");
        drop(store);
        let dump = inspect(dir.path()).unwrap();
        assert!(
            dump.contains(&format!("cut knowingly: {name} at byte {frame}")),
            "{dump}"
        );
    }

    #[test]
    fn an_unreadable_newer_snapshot_is_returned_as_why_beside_the_older_one() {
        let dir = tempfile::tempdir().unwrap();
        let snapshot = |lsn| Write::Snapshot {
            property: 0,
            lsn,
            bytes: vec![lsn as u8; 16],
        };
        let store = open(dir.path()).unwrap();
        store
            .commit(&mut batch(&[(0, 1)], vec![snapshot(2)]))
            .unwrap();
        store
            .commit(&mut batch(&[(0, 3)], vec![snapshot(4)]))
            .unwrap();
        store.commit(&mut batch(&[(0, 5)], vec![])).unwrap();
        drop(store);
        let newer = snapshot_path(dir.path(), 0, 4);
        let mut bytes = fs::read(&newer).unwrap();
        bytes[12] ^= 1;
        fs::write(&newer, &bytes).unwrap();
        let store = open(dir.path()).unwrap();
        let stored = store.load(0).unwrap();
        assert_eq!(stored.snapshots[0].0, 4);
        let why = stored.snapshots[0].1.as_ref().unwrap_err();
        assert!(why.contains("CRC") && why.contains(".snap"), "{why}");
        assert_eq!(stored.snapshots[1], (2, Ok(vec![2; 16])));
        assert_eq!(
            lsns(&store, 0),
            vec![3, 5],
            "the records after the older one"
        );
        assert_eq!(stored.cut, 0);
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

    #[test]
    fn the_search_for_a_whole_frame_tries_every_offset_and_skips_zeros() {
        let mut entry = Vec::new();
        append_frame(&mut entry, |out| {
            format::encode_into(
                out,
                &Entry::Segment {
                    first_lsn: 7,
                    build: "b".into(),
                },
            )
        });
        let mut bytes = vec![9, 1, 2];
        bytes.extend_from_slice(&[0; 10_000]);
        bytes.push(5);
        let at = bytes.len();
        bytes.extend_from_slice(&entry);
        bytes.extend_from_slice(&[0; 100]);
        assert_eq!(whole_frame_from(&bytes, 1), Some(at));
        assert_eq!(whole_frame_from(&bytes, at + 1), None);
        // A payload that does not start as an entry is not a frame found after damage.
        let mut other = Vec::new();
        append_frame(&mut other, |out| out.extend_from_slice(b"hello"));
        assert_eq!(whole_frame_from(&[&[1][..], &other].concat(), 1), None);
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
