//! Where a rank's durable state lives: one redb database, `state.redb`, in the rank's state
//! directory, next to the `lock` file that fences it.
//!
//! redb is the store because it commits a batch of writes atomically (its commit either
//! happened or did not, whatever a crash tears), checks its pages, and lets gossamer supply
//! the file underneath: [`Disk`] writes with `pwrite` and flushes with `fdatasync` only under
//! [`Durability::Sync`], which is how [`Durability::Os`] is built (a commit reaches the
//! kernel and survives `kill -9`, but is never flushed). One commit carries every record of a
//! round of the syncer, of every property of the rank: that is the group commit.
//!
//! Tables: `properties` (name → id and type), `log` ((property, LSN) → record), `snapshots`
//! ((property, LSN) → snapshot), `builds` (index → the build that wrote), `meta` (the next
//! property id, the last LSN).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use redb::{Database, ReadableDatabase, ReadableTable, StorageBackend, TableDefinition};

use super::DurableError;
use super::format::{self, PropertyMeta};
use crate::env::Durability;

const PROPERTIES: TableDefinition<&str, &[u8]> = TableDefinition::new("properties");
const LOG: TableDefinition<(u32, u64), &[u8]> = TableDefinition::new("log");
const SNAPSHOTS: TableDefinition<(u32, u64), &[u8]> = TableDefinition::new("snapshots");
const BUILDS: TableDefinition<u32, &str> = TableDefinition::new("builds");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

const NEXT_PROPERTY: &str = "next_property";
const LAST_LSN: &str = "last_lsn";

/// `fdatasync`s made by durable stores in this process: the benchmark's count.
pub(crate) static SYNCS: AtomicU64 = AtomicU64::new(0);

/// The file under the database: flushed only under [`Durability::Sync`].
#[derive(Debug)]
struct Disk {
    file: File,
    flush: bool,
}

impl StorageBackend for Disk {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.file.metadata()?.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.file.read_exact_at(out, offset)
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        if self.flush {
            SYNCS.fetch_add(1, Ordering::Relaxed);
            self.file.sync_data()?;
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.file.write_all_at(data, offset)
    }
}

/// A write the syncer commits with others.
#[derive(Debug)]
pub(crate) enum Write {
    Property {
        name: String,
        meta: Vec<u8>,
    },
    Record {
        property: u32,
        lsn: u64,
        bytes: Vec<u8>,
    },
    /// A snapshot; older ones but the newest before it go, with the records they cover.
    Snapshot {
        property: u32,
        lsn: u64,
        bytes: Vec<u8>,
    },
}

/// A property as stored: the newest snapshots (newest first, at most two) and the records
/// after the older one, in LSN order, all still encoded.
#[derive(Debug, Default)]
pub(crate) struct Stored {
    pub(crate) snapshots: Vec<(u64, Vec<u8>)>,
    pub(crate) records: Vec<(u64, Vec<u8>)>,
}

/// A rank's open store.
pub(crate) struct Store {
    db: Database,
    dir: PathBuf,
    /// Held for the store's life: another process opening this rank's state is refused.
    _lock: File,
    /// This build's index in the `builds` table.
    pub(crate) build: u32,
    /// The last LSN committed before this process opened the store.
    pub(crate) last_lsn: u64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn io(dir: &Path, what: &str, e: impl std::fmt::Display) -> DurableError {
    DurableError::Store {
        dir: dir.to_path_buf(),
        why: format!("{what}: {e}"),
    }
}

impl Store {
    /// Opens (or creates) the store in `dir`, taking its lock; `build` describes this build
    /// for the `builds` table.
    pub(crate) fn open(
        dir: &Path,
        durability: Durability,
        build: &str,
    ) -> Result<Store, DurableError> {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, "creating the state directory", e))?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))
            .map_err(|e| io(dir, "opening its lock file", e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(DurableError::InUse {
                    dir: dir.to_path_buf(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(dir, "locking it", e)),
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(dir.join("state.redb"))
            .map_err(|e| io(dir, "opening state.redb", e))?;
        let disk = Disk {
            file,
            flush: durability == Durability::Sync,
        };
        let db = Database::builder()
            .create_with_backend(disk)
            .map_err(|e| io(dir, "opening state.redb", e))?;
        let mut store = Store {
            db,
            dir: dir.to_path_buf(),
            _lock: lock,
            build: 0,
            last_lsn: 0,
        };
        store.register_build(build)?;
        Ok(store)
    }

    fn err(&self, what: &str, e: impl std::fmt::Display) -> DurableError {
        io(&self.dir, what, e)
    }

    /// Adds this build to the `builds` table (if it is not the last one there) and reads the
    /// last LSN.
    fn register_build(&mut self, build: &str) -> Result<(), DurableError> {
        let tx = self
            .db
            .begin_write()
            .map_err(|e| self.err("beginning a write", e))?;
        {
            let mut builds = tx
                .open_table(BUILDS)
                .map_err(|e| self.err("opening builds", e))?;
            let last = builds
                .last()
                .map_err(|e| self.err("reading builds", e))?
                .map(|(k, v)| (k.value(), v.value().to_string()));
            self.build = match last {
                Some((index, ref b)) if b == build => index,
                Some((index, _)) => index + 1,
                None => 0,
            };
            builds
                .insert(self.build, build)
                .map_err(|e| self.err("writing builds", e))?;
            let meta = tx
                .open_table(META)
                .map_err(|e| self.err("opening meta", e))?;
            self.last_lsn = meta
                .get(LAST_LSN)
                .map_err(|e| self.err("reading meta", e))?
                .map_or(0, |v| v.value());
            for t in [LOG, SNAPSHOTS] {
                tx.open_table(t)
                    .map_err(|e| self.err("creating a table", e))?;
            }
            tx.open_table(PROPERTIES)
                .map_err(|e| self.err("creating a table", e))?;
        }
        tx.commit().map_err(|e| self.err("committing", e))
    }

    /// The build that wrote with index `index`, for error messages.
    pub(crate) fn build_name(&self, index: u32) -> String {
        let read = || -> Result<Option<String>, Box<dyn std::error::Error>> {
            let tx = self.db.begin_read()?;
            let builds = tx.open_table(BUILDS)?;
            Ok(builds.get(index)?.map(|v| v.value().to_string()))
        };
        match read() {
            Ok(Some(name)) => name,
            _ => format!("build #{index} (not recorded)"),
        }
    }

    /// The property named `name`, if the store has it.
    pub(crate) fn property(&self, name: &str) -> Result<Option<PropertyMeta>, DurableError> {
        let tx = self
            .db
            .begin_read()
            .map_err(|e| self.err("beginning a read", e))?;
        let table = tx
            .open_table(PROPERTIES)
            .map_err(|e| self.err("opening properties", e))?;
        let Some(bytes) = table
            .get(name)
            .map_err(|e| self.err("reading properties", e))?
        else {
            return Ok(None);
        };
        format::decode(bytes.value())
            .map(Some)
            .map_err(|e| self.err(&format!("the entry of property \"{name}\""), e))
    }

    /// Assigns the next property id (committed with the property's first write).
    pub(crate) fn next_property_id(&self) -> Result<u32, DurableError> {
        let tx = self
            .db
            .begin_write()
            .map_err(|e| self.err("beginning a write", e))?;
        let id = {
            let mut meta = tx
                .open_table(META)
                .map_err(|e| self.err("opening meta", e))?;
            let id = meta
                .get(NEXT_PROPERTY)
                .map_err(|e| self.err("reading meta", e))?
                .map_or(0, |v| v.value());
            meta.insert(NEXT_PROPERTY, id + 1)
                .map_err(|e| self.err("writing meta", e))?;
            id
        };
        tx.commit().map_err(|e| self.err("committing", e))?;
        u32::try_from(id).map_err(|_| self.err("assigning a property id", "out of ids"))
    }

    /// Everything stored of property `id`.
    pub(crate) fn load(&self, id: u32) -> Result<Stored, DurableError> {
        let tx = self
            .db
            .begin_read()
            .map_err(|e| self.err("beginning a read", e))?;
        let snapshots = tx
            .open_table(SNAPSHOTS)
            .map_err(|e| self.err("opening snapshots", e))?;
        let log = tx
            .open_table(LOG)
            .map_err(|e| self.err("opening the log", e))?;
        let mut stored = Stored::default();
        for entry in snapshots
            .range((id, 0)..=(id, u64::MAX))
            .map_err(|e| self.err("reading snapshots", e))?
            .rev()
            .take(2)
        {
            let (k, v) = entry.map_err(|e| self.err("reading a snapshot", e))?;
            stored.snapshots.push((k.value().1, v.value().to_vec()));
        }
        let from = stored.snapshots.last().map_or(0, |(lsn, _)| lsn + 1);
        for entry in log
            .range((id, from)..=(id, u64::MAX))
            .map_err(|e| self.err("reading the log", e))?
        {
            let (k, v) = entry.map_err(|e| self.err("reading a record", e))?;
            stored.records.push((k.value().1, v.value().to_vec()));
        }
        Ok(stored)
    }

    /// Commits `writes` atomically, with `last_lsn` as the newest LSN among them; flushed to
    /// disk under [`Durability::Sync`].
    pub(crate) fn commit(&self, writes: &[Write], last_lsn: u64) -> Result<(), DurableError> {
        let tx = self
            .db
            .begin_write()
            .map_err(|e| self.err("beginning a commit", e))?;
        {
            let mut log = tx
                .open_table(LOG)
                .map_err(|e| self.err("opening the log", e))?;
            let mut snapshots = tx
                .open_table(SNAPSHOTS)
                .map_err(|e| self.err("opening snapshots", e))?;
            let mut properties = tx
                .open_table(PROPERTIES)
                .map_err(|e| self.err("opening properties", e))?;
            for w in writes {
                match w {
                    Write::Property { name, meta } => {
                        properties
                            .insert(name.as_str(), meta.as_slice())
                            .map_err(|e| self.err("writing a property", e))?;
                    }
                    Write::Record {
                        property,
                        lsn,
                        bytes,
                    } => {
                        log.insert((*property, *lsn), bytes.as_slice())
                            .map_err(|e| self.err("writing a record", e))?;
                    }
                    Write::Snapshot {
                        property,
                        lsn,
                        bytes,
                    } => {
                        snapshots
                            .insert((*property, *lsn), bytes.as_slice())
                            .map_err(|e| self.err("writing a snapshot", e))?;
                        compact(&mut snapshots, &mut log, *property)
                            .map_err(|e| self.err("compacting", e))?;
                    }
                }
            }
            let mut meta = tx
                .open_table(META)
                .map_err(|e| self.err("opening meta", e))?;
            meta.insert(LAST_LSN, last_lsn)
                .map_err(|e| self.err("writing meta", e))?;
        }
        tx.commit().map_err(|e| self.err("committing", e))
    }
}

/// Keeps property `id`'s two newest snapshots and the records after the older one.
fn compact(
    snapshots: &mut redb::Table<(u32, u64), &[u8]>,
    log: &mut redb::Table<(u32, u64), &[u8]>,
    id: u32,
) -> Result<(), redb::StorageError> {
    let kept: Vec<u64> = snapshots
        .range((id, 0)..=(id, u64::MAX))?
        .rev()
        .take(2)
        .map(|e| e.map(|(k, _)| k.value().1))
        .collect::<Result<_, _>>()?;
    if kept.len() < 2 {
        return Ok(());
    }
    let older = kept[1];
    if older > 0 {
        snapshots.retain_in((id, 0)..(id, older), |_, _| false)?;
    }
    log.retain_in((id, 0)..=(id, older), |_, _| false)?;
    Ok(())
}
