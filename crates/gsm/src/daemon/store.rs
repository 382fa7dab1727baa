//! Programs a daemon was sent, stored by content: `<store>/<sha256 in hex>`, mode 0700, in a
//! directory of mode 0700. They are kept until someone deletes them (any one not in use may
//! go: a job that needs it again sends it again).

use std::collections::HashMap;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, bail};
use gossamer::cluster::{file_hash, hex};

/// The directory of stored programs, and the hashes of the programs seen.
pub(crate) struct Store {
    dir: PathBuf,
    hashes: Mutex<HashMap<PathBuf, (Stamp, [u8; 32])>>,
}

/// What changes when a file's content may have: its inode, length and change times.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i64,
    ctime_ns: i64,
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Stamp {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
            ctime_ns: meta.ctime() * 1_000_000_000 + meta.ctime_nsec(),
        }
    }
}

impl Store {
    /// Opens `dir`, making it (mode 0700) if it is missing; refuses one that others may write
    /// to, since whoever can put a file there can have it run.
    pub(crate) fn open(dir: &Path) -> anyhow::Result<Store> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot make the program store {}", dir.display()))?;
        let mode = fs::metadata(dir)
            .with_context(|| format!("cannot inspect the program store {}", dir.display()))?
            .permissions()
            .mode()
            & 0o777;
        if mode & 0o022 != 0 {
            bail!(
                "the program store {} has mode {mode:04o}: others could put programs there for \
                 the daemon to run; run `chmod 700 {}`",
                dir.display(),
                dir.display()
            );
        }
        // Programs a daemon killed mid-transfer left half-received.
        if let Ok(entries) = fs::read_dir(dir) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name.starts_with('.') && name.ends_with(".part") {
                    let _ = fs::remove_file(entry.path());
                }
            }
        }
        Ok(Store {
            dir: dir.to_owned(),
            hashes: Mutex::new(HashMap::new()),
        })
    }

    /// The SHA-256 of the regular file at `path`, hashed again only when its inode, length or
    /// change times differ from the last time (or it had changed within a second of that):
    /// a job's start does not read a large program whole each time.
    pub(crate) fn hash_of(&self, path: &Path) -> io::Result<[u8; 32]> {
        let meta = fs::metadata(path)?;
        if !meta.is_file() {
            return Err(io::Error::other("not a regular file"));
        }
        let stamp = Stamp::of(&meta);
        let known = self.hashes.lock().expect("hashes lock").get(path).copied();
        if let Some((seen, hash)) = known
            && seen == stamp
        {
            return Ok(hash);
        }
        let hash = file_hash(path)?;
        // Remembered only if unchanged while read and changed last more than a second ago: file
        // times move in coarse ticks, so a write within the tick of the last one would leave
        // the stamp as it was (git's "racily clean" files).
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        let settled = now_ns - stamp.ctime_ns.max(stamp.mtime_ns) > 1_000_000_000;
        if settled && fs::metadata(path).is_ok_and(|m| Stamp::of(&m) == stamp) {
            self.hashes
                .lock()
                .expect("hashes lock")
                .insert(path.to_owned(), (stamp, hash));
        }
        Ok(hash)
    }

    /// Where the program with this hash is, if stored and still whole (a copy changed on disk
    /// is deleted, not run).
    pub(crate) fn find(&self, hash: &[u8; 32]) -> Option<PathBuf> {
        let path = self.dir.join(hex(hash));
        match self.hash_of(&path) {
            Ok(found) if found == *hash => Some(path),
            Ok(_) => {
                crate::daemon::log(&format!(
                    "stored program {} does not match its name: deleting it",
                    path.display()
                ));
                let _ = fs::remove_file(&path);
                None
            }
            Err(_) => None,
        }
    }

    /// A new file to receive a program into.
    pub(crate) fn receive(&self, hash: &[u8; 32]) -> io::Result<Incoming> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = self.dir.join(format!(
            ".{}.{}.{}.part",
            hex(hash),
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o700)
            .open(&path)?;
        Ok(Incoming {
            file: Some(file),
            path,
            written: 0,
        })
    }

    /// Checks a received program against its hash and puts it in its place.
    pub(crate) fn keep(&self, mut incoming: Incoming, hash: &[u8; 32]) -> anyhow::Result<PathBuf> {
        let file = incoming.file.take().expect("an incoming file is kept once");
        file.sync_all()
            .context("cannot write the program to disk")?;
        drop(file);
        let found = file_hash(&incoming.path).context("cannot hash the program received")?;
        if found != *hash {
            bail!(
                "the program received has SHA-256 {}, not the {} announced",
                hex(&found),
                hex(hash)
            );
        }
        let path = self.dir.join(hex(hash));
        // Another job may have stored the same program meanwhile: same bytes, same name.
        fs::rename(&incoming.path, &path).context("cannot put the program in the store")?;
        Ok(path)
    }
}

/// A program being received; deleted unless kept.
pub(crate) struct Incoming {
    file: Option<File>,
    path: PathBuf,
    written: u64,
}

impl Incoming {
    /// Appends a piece.
    pub(crate) fn write(&mut self, piece: &[u8]) -> io::Result<()> {
        let file = self.file.as_mut().expect("written before it is kept");
        file.write_all(piece)?;
        self.written += piece.len() as u64;
        Ok(())
    }

    /// Bytes received so far.
    pub(crate) fn written(&self) -> u64 {
        self.written
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        // Kept: renamed away, so this removes nothing.
        let _ = fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_known_hash_is_reused_until_the_file_changes() {
        let dir = std::env::temp_dir().join(format!("gsm-store-{}", std::process::id()));
        let store = Store::open(&dir.join("store")).expect("a store");
        let program = dir.join("program");
        fs::write(&program, b"first").unwrap();
        // Changed a second ago and more: its hash is remembered.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let first = store.hash_of(&program).unwrap();
        assert_eq!(first, file_hash(&program).unwrap());
        assert!(store.hashes.lock().unwrap().contains_key(&program));
        assert_eq!(store.hash_of(&program).unwrap(), first);
        // Same length, other bytes: its change time moves, so it is read again.
        fs::write(&program, b"other").unwrap();
        let second = store.hash_of(&program).unwrap();
        assert_eq!(second, file_hash(&program).unwrap());
        assert_ne!(second, first);
        assert!(store.hash_of(&dir).is_err(), "a directory is not hashed");

        let mut incoming = store.receive(&second).unwrap();
        incoming.write(b"other").unwrap();
        let kept = store.keep(incoming, &second).unwrap();
        assert_eq!(store.find(&second), Some(kept.clone()));
        let mode = fs::metadata(&kept).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let mut wrong = store.receive(&first).unwrap();
        wrong.write(b"not first").unwrap();
        let refused = store.keep(wrong, &first).unwrap_err().to_string();
        assert!(refused.contains("not the"), "{refused}");
        assert_eq!(store.find(&first), None);
        let left: Vec<_> = fs::read_dir(dir.join("store")).unwrap().collect();
        assert_eq!(left.len(), 1, "only the kept program stays");
        let _ = fs::remove_dir_all(&dir);
    }
}
