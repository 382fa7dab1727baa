//! The build id: which executable a node runs, so that only nodes of one build talk.

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

/// Identifies the executable a node runs: the SHA-256 of its file.
///
/// Function ids on the wire are offsets inside the binary, so two nodes may only talk if they
/// run the very same build. `Display` shows the first two bytes (`3fa9…`), enough to tell two
/// builds apart in an error message; `Debug` shows all 32.
///
/// ```ignore
/// let mut bytes = [0u8; 32];
/// bytes[..2].copy_from_slice(&[0x3f, 0xa9]);
/// assert_eq!(BuildId(bytes).to_string(), "3fa9…");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct BuildId(pub(crate) [u8; 32]);

impl fmt::Display for BuildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02x}{:02x}…", self.0[0], self.0[1])
    }
}

impl fmt::Debug for BuildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BuildId(")?;
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        f.write_str(")")
    }
}

/// The SHA-256 of the running executable.
///
/// Hashed once per process, streaming the file, and cached; an error is not cached, so a later
/// call tries again. On Linux the running image is read through `/proc/self/exe`, which stays
/// right even if the file on disk has been replaced since the process started (as a rebuild
/// does); elsewhere [`std::env::current_exe`].
///
/// # Errors
///
/// The executable cannot be found or read; the error names its path.
pub(crate) fn build_id() -> io::Result<BuildId> {
    static BUILD_ID: OnceLock<BuildId> = OnceLock::new();
    if let Some(id) = BUILD_ID.get() {
        return Ok(*id);
    }
    let id = hash_running_executable()?;
    // Two threads may both hash the file; they get the same answer, and one of them is kept.
    Ok(*BUILD_ID.get_or_init(|| id))
}

fn hash_running_executable() -> io::Result<BuildId> {
    #[cfg(target_os = "linux")]
    if let Ok(id) = hash_file(Path::new("/proc/self/exe")) {
        return Ok(id);
    }
    let exe = std::env::current_exe().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot find the running executable to hash it: {e}"),
        )
    })?;
    hash_file(&exe)
}

/// SHA-256 of a file, read in chunks so that a large binary does not sit in memory.
pub(crate) fn hash_file(path: &Path) -> io::Result<BuildId> {
    let with_path =
        |e: io::Error| io::Error::new(e.kind(), format!("cannot hash {}: {e}", path.display()));
    let mut file = File::open(path).map_err(with_path)?;
    let mut hasher = Sha256::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => hasher.update(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(with_path(e)),
        }
    }
    Ok(BuildId(hasher.finalize().into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_id_is_stable_and_is_the_executable_hash() {
        let first = build_id().expect("hash the test binary");
        let second = build_id().expect("hash the test binary again");
        assert_eq!(first, second);
        assert_eq!(first.0.len(), 32);
        let exe = std::env::current_exe().expect("the test binary's path");
        let bytes = std::fs::read(&exe).expect("read the test binary");
        assert_eq!(first.0, <[u8; 32]>::from(Sha256::digest(&bytes)));
        assert_ne!(first.0, [0; 32]);
        let shown = first.to_string();
        assert_eq!(shown.chars().count(), 5, "{shown}");
        assert!(shown.ends_with('…'), "{shown}");
        assert_eq!(format!("{first:?}").len(), "BuildId()".len() + 64);
    }
}
