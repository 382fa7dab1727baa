//! The cluster: what `gsm run --hosts` and the per-host daemons (`gsm daemon`) say to each
//! other, and the key that lets them.
//!
//! Every host of a cluster runs one daemon, which starts ranks when a holder of the
//! *cluster key* asks. The key is a file of random bytes, the same on every host, readable by
//! its owner only ([`ClusterKey::load`] refuses any other mode; [`ClusterKey::create`] makes
//! one). A connection to a daemon proves both ends hold it before any request is read, the
//! way a rack's own connections prove the job secret, and then every frame carries a MAC, so
//! nothing can be injected, replayed or reordered on the way.
//!
//! # What the key allows
//!
//! A daemon runs whatever program a key holder sends it, as the daemon's own user, and stores
//! programs it was sent. **Whoever holds the cluster key can run any code on every host of the
//! cluster**, as that user. Keep the key as private as an SSH key to those accounts, run the
//! daemons as an unprivileged user, and make a new key (and restart the daemons) if it leaks.
//! The channel authenticates but does not encrypt: programs, arguments, the job's environment
//! (its `GSM_SECRET` too) and output cross the network in the clear, so run the cluster on a
//! network you trust.
//!
//! # Protocol (version 2: a job that recovers lost ranks, with restarts and fences)
//!
//! Both sides write a *hello* at once, then read the peer's: magic `b"GSMCLUST"` (8 bytes),
//! protocol version (`u16`, little-endian), a fresh random nonce (32 bytes): 42 bytes. Then
//! both write a *proof* and read the peer's: `HMAC-SHA256(key, label(side) ‖ dialer hello ‖
//! acceptor hello)`, with different labels for the dialer and the acceptor, so that a proof
//! cannot be reflected; the nonces make every transcript fresh, so none can be replayed. The
//! whole exchange must finish within [`HANDSHAKE_LIMIT`]; a stranger is refused after its
//! first 8 bytes, a peer of another protocol version after 10, with errors naming them.
//!
//! Then each direction is a stream of frames:
//!
//! | bytes | field |
//! |------:|-------|
//! | 4 | payload length `n`, `u32` little-endian, at most [`MAX_PAYLOAD`] |
//! | `n` | the message, postcard-encoded ([`Request`] from the dialer, [`Reply`] from the acceptor) |
//! | 32 | `HMAC-SHA256(direction key, frame number ‖ n ‖ payload)` |
//!
//! where each direction's key is `HMAC-SHA256(key, direction label ‖ both hellos)` and frame
//! numbers count from 0 in each direction. A length over the bound is refused before anything
//! is allocated for it; a frame whose MAC fails ends the connection.
//!
//! # Where things are
//! - `channel`: the handshake and the framed, authenticated streams;
//! - `message`: what is said;
//! - `error`: [`ClusterError`].

mod channel;
mod error;
mod message;

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

pub use channel::{Channel, FrameReader, FrameWriter};
pub use error::ClusterError;
pub use message::{JobInfo, Reply, Request, Start};

use crate::env::{PrivateFileError, Secret, read_private};

/// The protocol between `gsm run` and the daemons that this build speaks.
pub const PROTOCOL_VERSION: u16 = 2;

/// The port a daemon listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 7420;

/// How long the handshake of a daemon connection may take, end to end.
pub const HANDSHAKE_LIMIT: Duration = Duration::from_secs(5);

/// The largest message a frame carries: a program is sent in pieces of [`PROGRAM_PIECE`].
pub const MAX_PAYLOAD: usize = 2 << 20;

/// The size of the pieces a program is sent in.
pub const PROGRAM_PIECE: usize = 1 << 20;

/// The shortest cluster key accepted: 16 bytes, 128 bits if they are random.
pub const MIN_KEY: usize = 16;

/// The SHA-256 of a file, read in pieces: how a daemon names and checks the programs it stores.
///
/// This is a content hash, not the build id a rack's handshake compares (which comes from the
/// executable's build-id note where it has one, so that a rank need not read its whole file).
///
/// # Errors
///
/// The file cannot be read; the error names it.
pub fn file_hash(path: &Path) -> std::io::Result<[u8; 32]> {
    crate::handshake::hash_file(path)
}

/// A hash as 64 lowercase hex digits.
///
/// ```
/// assert_eq!(&gossamer::cluster::hex(&[0xab; 32])[..4], "abab");
/// ```
pub fn hex(hash: &[u8; 32]) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key every daemon of a cluster and everyone who starts jobs on it share.
///
/// Its `Debug` shows only the length.
#[derive(Clone)]
pub struct ClusterKey(Secret);

impl ClusterKey {
    /// Reads the key in `path`: a regular file readable and writable by its owner only (mode
    /// `0600` or `0400`), of at least [`MIN_KEY`] bytes; trailing white space is not part of
    /// it.
    ///
    /// ```
    /// use std::os::unix::fs::PermissionsExt;
    /// use gossamer::cluster::ClusterKey;
    ///
    /// let dir = std::env::temp_dir().join(format!("gsm-key-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir)?;
    /// let path = dir.join("cluster.key");
    /// ClusterKey::create(&path)?;
    /// assert!(ClusterKey::load(&path).is_ok());
    /// std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    /// let refused = ClusterKey::load(&path).unwrap_err().to_string();
    /// assert!(refused.contains("chmod 600"), "{refused}");
    /// std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ClusterError::Key`] naming the file and what is wrong with it.
    pub fn load(path: &Path) -> Result<ClusterKey, ClusterError> {
        let refuse = |why: String| ClusterError::Key {
            path: path.to_owned(),
            why,
        };
        match read_private(path) {
            Ok(bytes) if bytes.len() < MIN_KEY => Err(refuse(format!(
                "it holds {} bytes, fewer than the {MIN_KEY} a key needs; make one with \
                 `gsm cluster-key FILE`",
                bytes.len()
            ))),
            Ok(bytes) => Ok(ClusterKey(Secret::new(bytes))),
            Err(PrivateFileError::Io { action, error }) => {
                Err(refuse(format!("cannot {action} it: {error}")))
            }
            Err(PrivateFileError::Mode(mode)) => Err(refuse(format!(
                "it has mode {mode:04o}, open to group or others, and whoever reads it can run \
                 code on every host: run `chmod 600 {}`",
                path.display()
            ))),
            Err(PrivateFileError::Empty) => Err(refuse("it is empty".into())),
        }
    }

    /// Writes a fresh key (32 random bytes, as 64 hex digits) to `path`, a new file of mode
    /// `0600`, and returns it. An existing file is never overwritten.
    ///
    /// # Errors
    ///
    /// [`ClusterError::Key`] if the file exists or cannot be written.
    pub fn create(path: &Path) -> Result<ClusterKey, ClusterError> {
        let refuse = |why: String| ClusterError::Key {
            path: path.to_owned(),
            why,
        };
        let secret = Secret::random().map_err(|e| refuse(e.to_string()))?;
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| refuse(format!("cannot create it: {e}")))?;
        file.write_all(secret.as_bytes())
            .and_then(|()| file.write_all(b"\n"))
            .and_then(|()| file.sync_all())
            .map_err(|e| refuse(format!("cannot write it: {e}")))?;
        Ok(ClusterKey(secret))
    }

    /// A key of these bytes (tests; a real key comes from a file).
    pub fn new(bytes: impl Into<Vec<u8>>) -> ClusterKey {
        ClusterKey(Secret::new(bytes))
    }

    fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterKey({} bytes)", self.as_bytes().len())
    }
}

/// Checks the frame layer against `data` (the `cluster_frame` fuzz target): `data` read as
/// frames from a peer never panics nor allocates past the bound, and each message read from
/// it, framed again, is read back the same. Panics when a check fails.
#[cfg(feature = "fuzzing")]
pub(crate) fn check_frames(data: &[u8]) {
    channel::check_frames(data);
}
