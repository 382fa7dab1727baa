//! storechoice — side-by-side measurement of embedded stores for a durable
//! exactly-once log (RIFL-style completion records).
//!
//! Run (total ~2 minutes on 2 vCPUs; writes ≤ ~400 MiB at a time under
//! /var/tmp/storechoice-bench, override with STORECHOICE_DIR, removed at end):
//!
//!     cargo run --release --manifest-path bench/store-choice/Cargo.toml
//!
//! One run measures:
//!
//!   * raw disk: 4 KiB pwrite+fdatasync latency (overwrite-in-place and append)
//!   * group-commit throughput/latency for 5 store configurations x 4 batch sizes
//!       R1  redb 4.6, Durability::Immediate, redb's own FileBackend
//!       R1c same, but redb's FileBackend wrapped in a counter of sync_data()
//!           calls and written bytes (gives the exact fdatasyncs/commit of R1)
//!       R2  redb 4.6, Durability::Immediate, custom "OS mode" backend:
//!           pwrite into the page cache, sync_data() is a no-op (counted)
//!       F3  fjall 3.1, WriteBatch commit + Database::persist(SyncData)
//!       F4  fjall 3.1, WriteBatch commit + Database::persist(Buffer)
//!   * fsync/fdatasync syscalls per commit counted with `strace -f -c` on
//!     short child runs of this same binary (`probe` sub-command), if strace
//!     is installed
//!   * open/recovery time + full LSN-ordered scan after writing 1,000,000
//!     log records (96 B values): clean reopen (warm page cache), clean reopen
//!     after evicting the files from the page cache (posix_fadvise DONTNEED),
//!     and reopen after the writer process was SIGKILLed (crash recovery).
//!
//! Sub-commands (used internally, via std::env::current_exe()):
//!   probe <cfg> <B> <commits> <dir>   fixed number of commits, for strace
//!   crashwrite <redb|fjall> <dir>     write 1M records then SIGKILL itself
//!
//! Workload of one commit ("group commit" of B calls):
//!   * B inserts into "log": key = LSN u64 big-endian (8 B), value = 96 random B
//!   * B upserts into "completions": key = (client u64 BE, seq u64 BE) = 16 B,
//!     value = 16 B; client = random of 1024, seq = per-client counter
//!     (so every upsert creates a new key, as a RIFL completion record does)
//!   * every 64th commit additionally deletes all log records older than the
//!     newest 4096 (compaction-like truncation), in the same atomic commit.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redb::{
    BackendError, Database, Durability, ReadableDatabase, ReadableTable, StorageBackend, TableDefinition,
};

// ---------------------------------------------------------------------------
// Parameters
// ---------------------------------------------------------------------------

/// Wall time per (config, B) cell.
const RUN_SECS: f64 = 2.0;
/// Minimum number of commits per cell (matters for B=1024 with fsync).
const MIN_COMMITS: u64 = 20;
const BATCH_SIZES: [usize; 4] = [1, 16, 128, 1024];
const VALUE_LEN: usize = 96;
const COMPLETION_LEN: usize = 16;
const CLIENTS: usize = 1024;
/// Every COMPACT_EVERY commits, delete log records older than the newest KEEP.
const COMPACT_EVERY: u64 = 64;
const KEEP: u64 = 4096;
/// Records for the recovery / scan test, written in batches of RECOVERY_BATCH.
const RECOVERY_RECORDS: u64 = 1_000_000;
const RECOVERY_BATCH: u64 = 10_000;

// redb tables: fixed-size byte-array keys compare with memcmp, so the
// big-endian LSN gives LSN order (same byte layout as the fjall keys).
const LOG: TableDefinition<&[u8; 8], &[u8; VALUE_LEN]> = TableDefinition::new("log");
const COMPLETIONS: TableDefinition<&[u8; 16], &[u8; COMPLETION_LEN]> =
    TableDefinition::new("completions");

type BoxErr = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BoxErr>;

// ---------------------------------------------------------------------------
// Deterministic PRNG (splitmix64) — no `rand` dependency needed.
// ---------------------------------------------------------------------------

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let r = self.next().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
    }
}

// ---------------------------------------------------------------------------
// Workload generator: produces one commit's worth of operations.
// ---------------------------------------------------------------------------

struct Plan {
    log: Vec<([u8; 8], [u8; VALUE_LEN])>,
    completions: Vec<([u8; 16], [u8; COMPLETION_LEN])>,
    /// If set: delete log keys in [from, to) (LSNs) in this commit.
    delete: Option<(u64, u64)>,
}

struct Workload {
    rng: Rng,
    next_lsn: u64,
    /// Oldest LSN still present in the log table.
    oldest_lsn: u64,
    commits: u64,
    client_seq: Vec<u64>,
}

impl Workload {
    fn new(seed: u64) -> Self {
        Self { rng: Rng(seed), next_lsn: 0, oldest_lsn: 0, commits: 0, client_seq: vec![0; CLIENTS] }
    }

    fn next_plan(&mut self, b: usize) -> Plan {
        let mut log = Vec::with_capacity(b);
        let mut completions = Vec::with_capacity(b);
        for _ in 0..b {
            let mut v = [0u8; VALUE_LEN];
            self.rng.fill(&mut v);
            log.push((self.next_lsn.to_be_bytes(), v));
            self.next_lsn += 1;

            let client = (self.rng.next() % CLIENTS as u64) as usize;
            let seq = self.client_seq[client];
            self.client_seq[client] += 1;
            let mut k = [0u8; 16];
            k[..8].copy_from_slice(&(client as u64).to_be_bytes());
            k[8..].copy_from_slice(&seq.to_be_bytes());
            let mut cv = [0u8; COMPLETION_LEN];
            self.rng.fill(&mut cv);
            completions.push((k, cv));
        }
        self.commits += 1;
        let mut delete = None;
        if self.commits % COMPACT_EVERY == 0 {
            let cutoff = self.next_lsn.saturating_sub(KEEP);
            if cutoff > self.oldest_lsn {
                delete = Some((self.oldest_lsn, cutoff));
                self.oldest_lsn = cutoff;
            }
        }
        Plan { log, completions, delete }
    }
}

// ---------------------------------------------------------------------------
// redb storage backends
// ---------------------------------------------------------------------------

/// Counters shared between a backend and the benchmark.
#[derive(Debug, Default)]
struct Counters {
    /// Calls of StorageBackend::sync_data (real fdatasync for R1c; elided for R2).
    sync_calls: AtomicU64,
    /// Bytes passed to StorageBackend::write.
    bytes_written: AtomicU64,
}

/// "OS mode" backend: a plain std::fs::File. Writes go through pwrite into the
/// kernel page cache, so they survive a process crash (kill -9), but
/// sync_data() does nothing, so they do NOT survive power loss / kernel crash.
///
/// No lock methods are implemented: redb then only allows the default
/// ConcurrencyMode::ExclusiveWriter, and does not stop a second process from
/// opening the same file (the application must ensure single-process use).
#[derive(Debug)]
struct OsModeBackend {
    file: File,
    c: Arc<Counters>,
}

impl StorageBackend for OsModeBackend {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.file.metadata()?.len())
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.file.read_exact_at(out, offset)
    }
    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.file.set_len(len)
    }
    fn sync_data(&self) -> Result<(), io::Error> {
        // Intentionally NOT calling fdatasync: "OS" durability.
        self.c.sync_calls.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.c.bytes_written.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.file.write_all_at(data, offset)
    }
}

/// Wraps redb's own FileBackend (real fdatasync, real file locks) and counts
/// sync_data() calls and written bytes. Every method is delegated, so the
/// behaviour is identical to config R1 (redb's default backend).
#[derive(Debug)]
struct CountingFileBackend {
    inner: redb::backends::FileBackend,
    c: Arc<Counters>,
}

type B = std::ops::Bound<u64>;
impl StorageBackend for CountingFileBackend {
    fn len(&self) -> Result<u64, io::Error> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> Result<(), io::Error> {
        self.c.sync_calls.fetch_add(1, Ordering::Relaxed);
        self.inner.sync_data() // -> File::sync_data -> fdatasync(2)
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.c.bytes_written.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.inner.write(offset, data)
    }
    fn close(&self) -> Result<(), io::Error> {
        self.inner.close()
    }
    fn try_lock_range(&self, s: B, e: B) -> Result<bool, BackendError> {
        self.inner.try_lock_range(s, e)
    }
    fn try_lock_shared_range(&self, s: B, e: B) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(s, e)
    }
    fn lock_range(&self, s: B, e: B) -> Result<(), BackendError> {
        self.inner.lock_range(s, e)
    }
    fn lock_shared_range(&self, s: B, e: B) -> Result<(), BackendError> {
        self.inner.lock_shared_range(s, e)
    }
    fn unlock_range(&self, s: B, e: B) -> Result<(), BackendError> {
        self.inner.unlock_range(s, e)
    }
    fn query_lock_range(&self, s: B, e: B) -> Result<bool, BackendError> {
        self.inner.query_lock_range(s, e)
    }
}

fn open_rw_file(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)
}

// ---------------------------------------------------------------------------
// Store abstraction for the group-commit benchmark
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Cfg {
    R1,
    R1c,
    R2,
    F3,
    F4,
}

impl Cfg {
    fn all() -> [Cfg; 5] {
        [Cfg::R1, Cfg::R1c, Cfg::R2, Cfg::F3, Cfg::F4]
    }
    fn name(self) -> &'static str {
        match self {
            Cfg::R1 => "R1",
            Cfg::R1c => "R1c",
            Cfg::R2 => "R2",
            Cfg::F3 => "F3",
            Cfg::F4 => "F4",
        }
    }
    fn describe(self) -> &'static str {
        match self {
            Cfg::R1 => "redb Immediate, default FileBackend (fdatasync)",
            Cfg::R1c => "redb Immediate, counted FileBackend (fdatasync)",
            Cfg::R2 => "redb Immediate, OS-mode backend (no fdatasync)",
            Cfg::F3 => "fjall batch + persist(SyncData)",
            Cfg::F4 => "fjall batch + persist(Buffer)",
        }
    }
    fn parse(s: &str) -> Option<Cfg> {
        Cfg::all().into_iter().find(|c| c.name() == s)
    }
}

enum Store {
    Redb { db: Database, counters: Option<Arc<Counters>> },
    Fjall { db: fjall::Database, log: fjall::Keyspace, comp: fjall::Keyspace, mode: fjall::PersistMode },
}

impl Store {
    fn open(cfg: Cfg, dir: &Path) -> Res<Store> {
        fs::create_dir_all(dir)?;
        let file = dir.join("redb.db");
        Ok(match cfg {
            Cfg::R1 => Store::Redb { db: Database::create(&file)?, counters: None },
            Cfg::R1c => {
                let c = Arc::new(Counters::default());
                let inner = redb::backends::FileBackend::new(open_rw_file(&file)?)?;
                let be = CountingFileBackend { inner, c: c.clone() };
                Store::Redb { db: Database::builder().create_with_backend(be)?, counters: Some(c) }
            }
            Cfg::R2 => {
                let c = Arc::new(Counters::default());
                let be = OsModeBackend { file: open_rw_file(&file)?, c: c.clone() };
                Store::Redb { db: Database::builder().create_with_backend(be)?, counters: Some(c) }
            }
            Cfg::F3 | Cfg::F4 => {
                let db = fjall::Database::builder(dir.join("fjall")).open()?;
                let log = db.keyspace("log", fjall::KeyspaceCreateOptions::default)?;
                let comp = db.keyspace("completions", fjall::KeyspaceCreateOptions::default)?;
                let mode = if cfg == Cfg::F3 { fjall::PersistMode::SyncData } else { fjall::PersistMode::Buffer };
                Store::Fjall { db, log, comp, mode }
            }
        })
    }

    /// One atomic group commit.
    fn commit(&mut self, p: &Plan) -> Res<()> {
        match self {
            Store::Redb { db, .. } => {
                let mut tx = db.begin_write()?;
                // Immediate is the default; set explicitly for clarity.
                tx.set_durability(Durability::Immediate)?;
                {
                    let mut log = tx.open_table(LOG)?;
                    for (k, v) in &p.log {
                        log.insert(k, v)?;
                    }
                    if let Some((_, to)) = p.delete {
                        // Delete every key < cutoff (range delete in one B-tree walk).
                        let cut = to.to_be_bytes();
                        log.retain_in::<&[u8; 8], _>(..&cut, |_, _| false)?;
                    }
                    let mut comp = tx.open_table(COMPLETIONS)?;
                    for (k, v) in &p.completions {
                        comp.insert(k, v)?;
                    }
                }
                tx.commit()?;
            }
            Store::Fjall { db, log, comp, mode } => {
                // db.batch() = atomic multi-keyspace WriteBatch. With the
                // default config (manual_journal_persist = false) commit()
                // already flushes the journal's BufWriter to the OS
                // (PersistMode::Buffer) before returning.
                let mut batch = db.batch();
                for (k, v) in &p.log {
                    batch.insert(log, &k[..], &v[..]);
                }
                if let Some((from, to)) = p.delete {
                    // An LSM has no range delete in fjall's batch API: one tombstone per key.
                    for lsn in from..to {
                        batch.remove(log, &lsn.to_be_bytes()[..]);
                    }
                }
                for (k, v) in &p.completions {
                    batch.insert(comp, &k[..], &v[..]);
                }
                batch.commit()?;
                // SyncData -> one fdatasync of the active journal file;
                // Buffer   -> nothing left to do (already flushed by commit).
                db.persist(*mode)?;
            }
        }
        Ok(())
    }

    fn counters(&self) -> Option<Arc<Counters>> {
        match self {
            Store::Redb { counters, .. } => counters.clone(),
            Store::Fjall { .. } => None,
        }
    }
}

// ---------------------------------------------------------------------------
// Helpers: /proc/self/io, latency stats, directory size, filesystem info
// ---------------------------------------------------------------------------

/// (wchar, write_bytes) from /proc/self/io (whole process, all threads).
/// wchar = bytes passed to write-type syscalls; write_bytes = bytes of page
/// cache pages dirtied (what the kernel will send to the block layer).
fn proc_io() -> (u64, u64) {
    let s = fs::read_to_string("/proc/self/io").unwrap_or_default();
    let mut w = (0, 0);
    for line in s.lines() {
        if let Some(v) = line.strip_prefix("wchar: ") {
            w.0 = v.trim().parse().unwrap_or(0);
        } else if let Some(v) = line.strip_prefix("write_bytes: ") {
            w.1 = v.trim().parse().unwrap_or(0);
        }
    }
    w
}

struct Lat {
    mean: f64,
    p50: f64,
    p99: f64,
}

fn lat_stats(ns: &mut [u64]) -> Lat {
    ns.sort_unstable();
    let n = ns.len().max(1);
    let pct = |p: f64| -> f64 {
        if ns.is_empty() {
            return 0.0;
        }
        let idx = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
        ns[idx] as f64 / 1000.0
    };
    Lat { mean: ns.iter().sum::<u64>() as f64 / n as f64 / 1000.0, p50: pct(0.50), p99: pct(0.99) }
}

/// Sum of apparent file sizes under a directory.
fn dir_size(p: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = fs::read_dir(p) {
        for e in rd.flatten() {
            let path = e.path();
            if let Ok(md) = fs::symlink_metadata(&path) {
                if md.is_dir() {
                    total += dir_size(&path);
                } else {
                    total += md.len();
                }
            }
        }
    }
    total
}

/// fdatasync + posix_fadvise(DONTNEED) every file under `p`, evicting it from
/// the guest page cache (a "cold" open without dropping all system caches).
fn evict_dir(p: &Path) {
    if let Ok(rd) = fs::read_dir(p) {
        for e in rd.flatten() {
            let path = e.path();
            if path.is_dir() {
                evict_dir(&path);
            } else if let Ok(f) = File::open(&path) {
                let _ = f.sync_data();
                unsafe {
                    libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
                }
            }
        }
    }
}

fn fs_info(p: &Path) -> String {
    // statfs magic to be sure we are not on tmpfs.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    let magic = if unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0 { st.f_type as i64 } else { -1 };
    let kind = match magic {
        0xEF53 => "ext2/3/4",
        0x0102_1994 => "tmpfs",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        _ => "other",
    };
    let df = Command::new("df")
        .args(["-T", p.to_str().unwrap()])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().nth(1).unwrap_or("").to_string())
        .unwrap_or_default();
    format!("statfs magic 0x{magic:X} ({kind}); df -T: {df}")
}

fn cpu_model() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap().trim().to_string()))
        .unwrap_or_else(|| "?".into())
}

fn thread_count() -> usize {
    fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

// ---------------------------------------------------------------------------
// Raw disk: 4 KiB pwrite + fdatasync
// ---------------------------------------------------------------------------

fn raw_disk(dir: &Path) -> Res<Vec<(String, Lat)>> {
    let mut out = vec![];
    let buf = [0xA5u8; 4096];
    // (a) overwrite the same, already-allocated block: pure data flush.
    {
        let path = dir.join("raw_overwrite");
        let f = open_rw_file(&path)?;
        f.write_all_at(&buf, 0)?;
        f.sync_all()?;
        let mut ns = Vec::with_capacity(1000);
        for _ in 0..1000 {
            let t = Instant::now();
            f.write_all_at(&buf, 0)?;
            f.sync_data()?;
            ns.push(t.elapsed().as_nanos() as u64);
        }
        out.push(("4 KiB pwrite(offset 0, overwrite) + fdatasync".to_string(), lat_stats(&mut ns)));
        fs::remove_file(&path)?;
    }
    // (b) append: each write extends the file, so fdatasync must also commit
    // the inode size / block allocation (ext4 journal commit).
    {
        let path = dir.join("raw_append");
        let f = open_rw_file(&path)?;
        f.sync_all()?;
        let mut ns = Vec::with_capacity(1000);
        for i in 0..1000u64 {
            let t = Instant::now();
            f.write_all_at(&buf, i * 4096)?;
            f.sync_data()?;
            ns.push(t.elapsed().as_nanos() as u64);
        }
        out.push(("4 KiB pwrite(append) + fdatasync".to_string(), lat_stats(&mut ns)));
        fs::remove_file(&path)?;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// Group-commit benchmark
// ---------------------------------------------------------------------------

struct CellResult {
    cfg: Cfg,
    b: usize,
    commits: u64,
    secs: f64,
    lat: Lat,
    trunc_mean_us: Option<f64>,
    syncs_per_commit: Option<f64>,
    backend_bytes_per_rec: Option<f64>,
    wchar_per_rec: f64,
    wbytes_per_rec: f64,
    final_size: u64,
    threads: usize,
}

fn run_cell(cfg: Cfg, b: usize, dir: &Path) -> Res<CellResult> {
    let _ = fs::remove_dir_all(dir);
    // Untimed: write back dirty pages left by earlier cells (e.g. the no-fsync
    // configs) so their writeback does not land inside this cell's timing.
    unsafe { libc::sync() };
    let mut store = Store::open(cfg, dir)?;
    let threads = thread_count();
    let counters = store.counters();
    // Counters include the (untimed) create; take a baseline.
    let c0 = counters.as_ref().map(|c| (c.sync_calls.load(Ordering::Relaxed), c.bytes_written.load(Ordering::Relaxed)));
    let mut wl = Workload::new(0x5EED ^ b as u64);
    let mut lat_ns = Vec::new();
    // Latencies of the truncation commits (every 64th), also included in lat_ns.
    let mut trunc_ns = Vec::new();
    let io0 = proc_io();
    let start = Instant::now();
    let deadline = Duration::from_secs_f64(RUN_SECS);
    while start.elapsed() < deadline || (lat_ns.len() as u64) < MIN_COMMITS {
        let plan = wl.next_plan(b); // generation is not part of commit latency
        let t = Instant::now();
        store.commit(&plan)?;
        let ns = t.elapsed().as_nanos() as u64;
        lat_ns.push(ns);
        if plan.delete.is_some() {
            trunc_ns.push(ns);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let io1 = proc_io();
    let commits = lat_ns.len() as u64;
    let recs = (commits * b as u64) as f64;
    let (syncs_per_commit, backend_bytes_per_rec) = match (&counters, c0) {
        (Some(c), Some((s0, b0))) => (
            Some((c.sync_calls.load(Ordering::Relaxed) - s0) as f64 / commits as f64),
            Some((c.bytes_written.load(Ordering::Relaxed) - b0) as f64 / recs),
        ),
        _ => (None, None),
    };
    drop(store);
    let final_size = dir_size(dir);
    let _ = fs::remove_dir_all(dir);
    Ok(CellResult {
        cfg,
        b,
        commits,
        secs,
        lat: lat_stats(&mut lat_ns),
        trunc_mean_us: if trunc_ns.is_empty() { None } else { Some(lat_stats(&mut trunc_ns).mean) },
        syncs_per_commit,
        backend_bytes_per_rec,
        wchar_per_rec: (io1.0 - io0.0) as f64 / recs,
        wbytes_per_rec: (io1.1 - io0.1) as f64 / recs,
        final_size,
        threads,
    })
}

/// `probe` sub-command: fixed number of commits (for strace -c).
fn probe(cfg: Cfg, b: usize, commits: u64, dir: &Path) -> Res<()> {
    let _ = fs::remove_dir_all(dir);
    let mut store = Store::open(cfg, dir)?;
    let mut wl = Workload::new(7);
    for _ in 0..commits {
        let plan = wl.next_plan(b);
        store.commit(&plan)?;
    }
    drop(store);
    let _ = fs::remove_dir_all(dir);
    Ok(())
}

/// Runs `strace -f -c` on a probe child; returns total fsync-family calls.
fn strace_syncs(cfg: Cfg, b: usize, commits: u64, dir: &Path) -> Option<(u64, String)> {
    let exe = std::env::current_exe().ok()?;
    let out = dir.join(format!("strace-{}-{b}-{commits}.txt", cfg.name()));
    let st = Command::new("strace")
        .args(["-f", "-c", "-e", "trace=fsync,fdatasync,sync_file_range,syncfs,msync", "-o"])
        .arg(&out)
        .arg(&exe)
        .args(["probe", cfg.name(), &b.to_string(), &commits.to_string()])
        .arg(dir.join("probe"))
        .status()
        .ok()?;
    if !st.success() {
        return None;
    }
    let text = fs::read_to_string(&out).ok()?;
    let _ = fs::remove_file(&out);
    // strace -c table: "% time  seconds  usecs/call  calls  errors  syscall"
    let mut total = 0;
    let mut detail = vec![];
    for line in text.lines() {
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() >= 5 {
            let name = *t.last().unwrap();
            if ["fsync", "fdatasync", "sync_file_range", "syncfs", "msync"].contains(&name) {
                if let Ok(n) = t[3].parse::<u64>() {
                    total += n;
                    detail.push(format!("{name}={n}"));
                }
            }
        }
    }
    Some((total, detail.join(",")))
}

// ---------------------------------------------------------------------------
// Recovery / scan benchmark (1,000,000 log records)
// ---------------------------------------------------------------------------

fn load_redb(dir: &Path) -> Res<f64> {
    fs::create_dir_all(dir)?;
    let db = Database::create(dir.join("redb.db"))?;
    let mut rng = Rng(42);
    let t = Instant::now();
    let mut lsn = 0u64;
    while lsn < RECOVERY_RECORDS {
        let tx = db.begin_write()?; // Durability::Immediate (default)
        {
            let mut log = tx.open_table(LOG)?;
            for _ in 0..RECOVERY_BATCH {
                let mut v = [0u8; VALUE_LEN];
                rng.fill(&mut v);
                log.insert(&lsn.to_be_bytes(), &v)?;
                lsn += 1;
            }
        }
        tx.commit()?;
    }
    Ok(t.elapsed().as_secs_f64())
}

fn load_fjall(dir: &Path) -> Res<f64> {
    let db = fjall::Database::builder(dir.join("fjall")).open()?;
    let log = db.keyspace("log", fjall::KeyspaceCreateOptions::default)?;
    let mut rng = Rng(42);
    let t = Instant::now();
    let mut lsn = 0u64;
    while lsn < RECOVERY_RECORDS {
        let mut batch = db.batch();
        for _ in 0..RECOVERY_BATCH {
            let mut v = [0u8; VALUE_LEN];
            rng.fill(&mut v);
            batch.insert(&log, &lsn.to_be_bytes()[..], &v[..]);
            lsn += 1;
        }
        batch.commit()?;
        db.persist(fjall::PersistMode::SyncData)?;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Reopen, then scan all log records in LSN order, verifying order & count.
/// Returns (open secs, scan secs, count, note).
fn reopen_scan_redb(dir: &Path) -> Res<(f64, f64, u64, String)> {
    // Builder::open runs crash repair automatically if the file was not closed
    // cleanly; the repair callback tells us whether that happened.
    let repair_calls = Arc::new(AtomicU64::new(0));
    let rc = repair_calls.clone();
    let t = Instant::now();
    let db = Database::builder()
        .set_repair_callback(move |_s| {
            rc.fetch_add(1, Ordering::Relaxed);
        })
        .open(dir.join("redb.db"))?;
    let open = t.elapsed().as_secs_f64();
    let calls = repair_calls.load(Ordering::Relaxed);
    let note = if calls > 0 { format!("full repair ran ({calls} callback calls)") } else { "no repair".to_string() };
    let t = Instant::now();
    let rtx = db.begin_read()?;
    let log = rtx.open_table(LOG)?;
    let (mut n, mut prev, mut sum) = (0u64, None::<u64>, 0u64);
    for item in log.iter()? {
        let (k, v) = item?;
        let lsn = u64::from_be_bytes(*k.value());
        assert!(prev.is_none_or(|p| p < lsn), "LSN order violated");
        prev = Some(lsn);
        sum = sum.wrapping_add(v.value()[0] as u64);
        n += 1;
    }
    std::hint::black_box(sum);
    Ok((open, t.elapsed().as_secs_f64(), n, note))
}

fn reopen_scan_fjall(dir: &Path) -> Res<(f64, f64, u64, String)> {
    // Journal files present before the open = what recovery has to replay.
    let (nj, jb) = journals(&dir.join("fjall"));
    let t = Instant::now();
    // Open replays the journal(s) into memtables (crash or not).
    let db = fjall::Database::builder(dir.join("fjall")).open()?;
    let log = db.keyspace("log", fjall::KeyspaceCreateOptions::default)?;
    let open = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let (mut n, mut prev, mut sum) = (0u64, None::<u64>, 0u64);
    for g in log.iter() {
        let (k, v) = g.into_inner()?;
        let lsn = u64::from_be_bytes(k[..8].try_into()?);
        assert!(prev.is_none_or(|p| p < lsn), "LSN order violated");
        prev = Some(lsn);
        sum = sum.wrapping_add(v[0] as u64);
        n += 1;
    }
    std::hint::black_box(sum);
    let note = format!("journal replay; before open: {nj} .jnl file(s), {:.1} MiB", jb as f64 / 1048576.0);
    Ok((open, t.elapsed().as_secs_f64(), n, note))
}

/// Number and total size of fjall journal files (`<id>.jnl`, in the db root).
fn journals(p: &Path) -> (usize, u64) {
    let mut r = (0, 0);
    if let Ok(rd) = fs::read_dir(p) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().ends_with(".jnl") {
                r.0 += 1;
                r.1 += e.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
    }
    r
}

/// `crashwrite` sub-command: load 1M records in "OS mode" (redb: OsModeBackend,
/// fjall: PersistMode::Buffer — no fsync anywhere on the commit path), then
/// SIGKILL ourselves (no destructors run: `kill -9` right after the last
/// commit returned). The parent then checks that all 1M records are there.
fn crashwrite(store: &str, dir: &Path) -> Res<()> {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir)?;
    match store {
        "redb" => {
            // OS-mode backend (config R2): no fdatasync at all. After the
            // SIGKILL the parent must still find every committed record.
            let be = OsModeBackend { file: open_rw_file(&dir.join("redb.db"))?, c: Arc::new(Counters::default()) };
            let db = Database::builder().create_with_backend(be)?;
            let mut rng = Rng(42);
            let mut lsn = 0u64;
            while lsn < RECOVERY_RECORDS {
                let tx = db.begin_write()?;
                {
                    let mut log = tx.open_table(LOG)?;
                    for _ in 0..RECOVERY_BATCH {
                        let mut v = [0u8; VALUE_LEN];
                        rng.fill(&mut v);
                        log.insert(&lsn.to_be_bytes(), &v)?;
                        lsn += 1;
                    }
                }
                tx.commit()?;
            }
            std::mem::forget(db);
        }
        _ => {
            let db = fjall::Database::builder(dir.join("fjall")).open()?;
            let log = db.keyspace("log", fjall::KeyspaceCreateOptions::default)?;
            let mut rng = Rng(42);
            let mut lsn = 0u64;
            while lsn < RECOVERY_RECORDS {
                let mut batch = db.batch(); // commit flushes to OS (Buffer)
                for _ in 0..RECOVERY_BATCH {
                    let mut v = [0u8; VALUE_LEN];
                    rng.fill(&mut v);
                    batch.insert(&log, &lsn.to_be_bytes()[..], &v[..]);
                    lsn += 1;
                }
                batch.commit()?;
            }
            std::mem::forget(db);
        }
    }
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    unreachable!()
}

struct RecoveryRow {
    store: &'static str,
    scenario: &'static str,
    open_ms: f64,
    scan_recs_per_s: f64,
    count: u64,
    size: u64,
    note: String,
}

fn recovery_bench(base: &Path) -> Res<(Vec<RecoveryRow>, Vec<String>)> {
    let mut rows = vec![];
    let mut notes = vec![];
    for store in ["redb", "fjall"] {
        let dir = base.join(format!("recovery-{store}"));
        let _ = fs::remove_dir_all(&dir);
        let load = if store == "redb" { load_redb(&dir)? } else { load_fjall(&dir)? };
        notes.push(format!(
            "{store}: loaded {RECOVERY_RECORDS} records in {:.2} s ({:.0} rec/s, commits of {RECOVERY_BATCH} with fdatasync), on-disk size {:.1} MiB",
            load,
            RECOVERY_RECORDS as f64 / load,
            dir_size(&dir) as f64 / 1048576.0
        ));
        for scenario in ["clean, warm cache", "clean, evicted cache"] {
            if scenario.contains("evicted") {
                evict_dir(&dir);
            }
            let (open, scan, n, note) = if store == "redb" { reopen_scan_redb(&dir)? } else { reopen_scan_fjall(&dir)? };
            rows.push(RecoveryRow { store, scenario, open_ms: open * 1e3, scan_recs_per_s: n as f64 / scan, count: n, size: dir_size(&dir), note });
        }
        let _ = fs::remove_dir_all(&dir);

        // Crash scenario: child writes the same 1M records and SIGKILLs itself.
        let exe = std::env::current_exe()?;
        let t = Instant::now();
        let st = Command::new(exe).args(["crashwrite", store]).arg(&dir).status()?;
        notes.push(format!("{store}: crash writer exited with {st} after {:.2} s", t.elapsed().as_secs_f64()));
        let (open, scan, n, note) = if store == "redb" { reopen_scan_redb(&dir)? } else { reopen_scan_fjall(&dir)? };
        rows.push(RecoveryRow { store, scenario: "OS-mode writer, then kill -9 (warm cache)", open_ms: open * 1e3, scan_recs_per_s: n as f64 / scan, count: n, size: dir_size(&dir), note });
        let _ = fs::remove_dir_all(&dir);
    }
    Ok((rows, notes))
}

// ---------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------

fn base_dir() -> PathBuf {
    // /tmp could be tmpfs on other machines; /var/tmp is on the root disk here.
    // Override with STORECHOICE_DIR.
    std::env::var_os("STORECHOICE_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/tmp/storechoice-bench"))
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("probe") => {
            let cfg = Cfg::parse(&args[2]).ok_or("bad cfg")?;
            return probe(cfg, args[3].parse()?, args[4].parse()?, Path::new(&args[5]));
        }
        Some("crashwrite") => return crashwrite(&args[2], Path::new(&args[3])),
        _ => {}
    }

    let total = Instant::now();
    let base = base_dir();
    let _ = fs::remove_dir_all(&base);
    fs::create_dir_all(&base)?;

    println!("# storechoice results\n");
    println!("- CPU: {} ({} logical CPUs)", cpu_model(), std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0));
    println!("- kernel: {}", fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim());
    println!("- bench dir: {} — {}", base.display(), fs_info(&base));
    println!("- per cell: >= {RUN_SECS} s and >= {MIN_COMMITS} commits; values {VALUE_LEN} B; completions 16 B key/16 B value; truncation every {COMPACT_EVERY} commits to newest {KEEP}\n");

    // --- raw disk -----------------------------------------------------------
    println!("## Raw disk (1000 iterations each)\n");
    println!("| test | mean µs | p50 µs | p99 µs |\n|---|---:|---:|---:|");
    for (name, l) in raw_disk(&base)? {
        println!("| {name} | {:.0} | {:.0} | {:.0} |", l.mean, l.p50, l.p99);
    }
    println!();

    // --- group commit -------------------------------------------------------
    println!("## Group commit\n");
    for c in Cfg::all() {
        println!("- {}: {}", c.name(), c.describe());
    }
    println!();
    println!("| cfg | B | commits | commits/s | records/s | mean µs | p50 µs | p99 µs | truncation-commit mean µs | sync_data calls/commit (backend counter) | backend bytes/rec | wchar B/rec | write_bytes B/rec | final files MiB | threads after open |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut results = vec![];
    for cfg in Cfg::all() {
        for b in BATCH_SIZES {
            let r = run_cell(cfg, b, &base.join(format!("gc-{}-{b}", cfg.name())))?;
            let recs = r.commits as f64 * r.b as f64;
            println!(
                "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {:.0} | {:.0} | {:.1} | {} |",
                r.cfg.name(),
                r.b,
                r.commits,
                r.commits as f64 / r.secs,
                recs / r.secs,
                r.lat.mean,
                r.lat.p50,
                r.lat.p99,
                r.trunc_mean_us.map_or("-".into(), |v| format!("{v:.0}")),
                r.syncs_per_commit.map_or("-".into(), |s| format!("{s:.3}{}", if r.cfg == Cfg::R2 { " (elided)" } else { "" })),
                r.backend_bytes_per_rec.map_or("-".into(), |s| format!("{s:.0}")),
                r.wchar_per_rec,
                r.wbytes_per_rec,
                r.final_size as f64 / 1048576.0,
                r.threads,
            );
            results.push(r);
        }
    }
    println!();

    // --- strace fsync counts ------------------------------------------------
    println!("## fsync-family syscalls per commit (strace -f -c on a child `probe` run; (N commits − 0 commits)/N)\n");
    let have_strace = Command::new("strace").arg("-V").output().map(|o| o.status.success()).unwrap_or(false);
    if !have_strace {
        println!("strace not available — skipped.\n");
    } else {
        println!("| cfg | B | N | syncs in run of N | syncs in run of 0 (open+close) | per commit |\n|---|---:|---:|---|---|---:|");
        for cfg in [Cfg::R1, Cfg::R2, Cfg::F3, Cfg::F4] {
            let base0 = strace_syncs(cfg, 1, 0, &base);
            // Long enough for B=1024 to include fjall journal rotations / memtable
            // flushes and redb file growth (~300k records).
            for (b, n) in [(1usize, 2000u64), (1024, 300)] {
                let run = strace_syncs(cfg, b, n, &base);
                match (&run, &base0) {
                    (Some((s, d)), Some((s0, d0))) => println!(
                        "| {} | {b} | {n} | {s} ({d}) | {s0} ({d0}) | {:.3} |",
                        cfg.name(),
                        (*s as f64 - *s0 as f64) / n as f64
                    ),
                    _ => println!("| {} | {b} | {n} | strace failed | | |", cfg.name()),
                }
            }
        }
        println!();
    }

    // --- recovery -----------------------------------------------------------
    println!("## Open / recovery and full scan ({RECOVERY_RECORDS} log records × {VALUE_LEN} B)\n");
    let (rows, notes) = recovery_bench(&base)?;
    println!("| store | scenario | open ms | scan records/s | records scanned (of {RECOVERY_RECORDS}) | files MiB | what open did |\n|---|---|---:|---:|---:|---:|---|");
    for r in &rows {
        println!("| {} | {} | {:.1} | {:.0} | {} | {:.1} | {} |", r.store, r.scenario, r.open_ms, r.scan_recs_per_s, r.count, r.size as f64 / 1048576.0, r.note);
    }
    println!();
    for n in notes {
        println!("- {n}");
    }
    let _ = fs::remove_dir_all(&base);
    println!("\nTotal runtime: {:.1} s", total.elapsed().as_secs_f64());
    Ok(())
}
