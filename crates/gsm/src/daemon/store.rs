//! Programs a daemon was sent, stored by content: `<store>/<sha256 in hex>`, mode 0700, in a
//! directory of mode 0700. They are kept until someone deletes them (any one not in use may
//! go: a job that needs it again sends it again).

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, bail};
use gossamer::cluster::{file_hash, hex};

/// The directory of stored programs.
pub(crate) struct Store {
    dir: PathBuf,
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
        })
    }

    /// Where the program with this hash is, if stored and still whole (hashed again: a copy
    /// damaged on disk is deleted, not run).
    pub(crate) fn find(&self, hash: &[u8; 32]) -> Option<PathBuf> {
        let path = self.dir.join(hex(hash));
        match file_hash(&path) {
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
