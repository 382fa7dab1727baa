//! The job secret: `GSM_SECRET`, or the cookie file `~/.gossamer/cookie`, made private on first
//! use.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::EnvError;
use super::vars::*;

/// The job secret: bytes every connection of the job proves it knows.
///
/// Its `Debug` shows only the length, so settings can be logged.
///
/// ```
/// use gossamer::env::Secret;
///
/// let s = Secret::new("hunter2");
/// assert_eq!(s.as_bytes(), b"hunter2");
/// assert_eq!(format!("{s:?}"), "Secret(7 bytes)");
/// ```
#[derive(Clone, Default)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// A secret of these bytes.
    ///
    /// ```
    /// assert!(!gossamer::env::Secret::new(vec![1, 2, 3]).is_empty());
    /// ```
    pub fn new(bytes: impl Into<Vec<u8>>) -> Secret {
        Secret(bytes.into())
    }

    /// A fresh secret: 32 random bytes from the operating system, hex-encoded (64 ASCII
    /// characters, so it can be put in `GSM_SECRET` as it is).
    ///
    /// ```
    /// let s = gossamer::env::Secret::random()?;
    /// assert_eq!(s.as_bytes().len(), 64);
    /// assert!(s.as_bytes().iter().all(u8::is_ascii_hexdigit));
    /// # Ok::<(), gossamer::env::EnvError>(())
    /// ```
    pub fn random() -> Result<Secret, EnvError> {
        let mut raw = [0u8; SECRET_BYTES];
        getrandom::fill(&mut raw).map_err(|e| EnvError::Random {
            error: e.to_string(),
        })?;
        let mut hex = Vec::with_capacity(2 * SECRET_BYTES);
        for byte in raw {
            hex.extend_from_slice(format!("{byte:02x}").as_bytes());
        }
        Ok(Secret(hex))
    }

    /// The secret's bytes.
    ///
    /// ```
    /// assert_eq!(gossamer::env::Secret::new("k").as_bytes(), b"k");
    /// ```
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The token that asks this job's ranks to move a property by hand (`gsm top`'s `m` key:
    /// `POST /move` on a rank's counters address, in an `X-Gsm-Control` header): derived from
    /// the secret (an HMAC-SHA256 of a fixed text, hex), so that it proves the secret without
    /// showing it. `gsm run` keeps it in the job's private directory for `gsm top`.
    ///
    /// ```
    /// use gossamer::env::Secret;
    /// let token = Secret::new("hunter2").control_token();
    /// assert_eq!(token.as_bytes().len(), 64);
    /// assert_ne!(token.as_bytes(), Secret::new("hunter3").control_token().as_bytes());
    /// ```
    pub fn control_token(&self) -> Secret {
        use hmac::{Hmac, KeyInit, Mac};
        // HMAC takes keys of any length, the empty one included.
        let mut mac = <Hmac<sha2::Sha256>>::new_from_slice(&self.0).expect("any key length");
        mac.update(b"gossamer: moves by hand");
        let digest = mac.finalize().into_bytes();
        Secret(
            digest
                .iter()
                .flat_map(|b| format!("{b:02x}").into_bytes())
                .collect(),
        )
    }

    /// Whether the secret is empty, as it is in a one-node rack.
    ///
    /// ```
    /// assert!(gossamer::env::Secret::default().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

pub(super) fn secret(get: &impl Fn(&str) -> Option<String>) -> Result<Secret, EnvError> {
    if let Some(value) = get(SECRET) {
        if value.is_empty() {
            return Err(EnvError::Invalid {
                var: SECRET,
                value,
                expected: "a non-empty string, the same in every rank",
            });
        }
        return Ok(Secret(value.into_bytes()));
    }
    let home = get(HOME)
        .filter(|h| !h.is_empty())
        .ok_or(EnvError::NoHome)?;
    cookie(&Path::new(&home).join(".gossamer"))
}

/// Reads `dir/cookie`, making it first if it is missing.
fn cookie(dir: &Path) -> Result<Secret, EnvError> {
    let path = dir.join("cookie");
    if let Some(secret) = read_cookie(&path)? {
        return Ok(secret);
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|error| EnvError::Cookie {
            path: dir.to_owned(),
            action: "create the directory",
            error,
        })?;
    let secret = Secret::random()?;
    // Written whole under a private name, then linked into place: ranks starting together
    // on one host race here, and a loser must never read a half-written cookie. `hard_link`
    // fails if the cookie exists, so the first one linked wins and the others read it.
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let tmp = dir.join(format!(
        "cookie.{}.{}.tmp",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let cookie_error = |action, error| EnvError::Cookie {
        path: path.clone(),
        action,
        error,
    };
    let _ = fs::remove_file(&tmp);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(secret.as_bytes()).and_then(|()| f.sync_all()));
    if let Err(error) = written {
        let _ = fs::remove_file(&tmp);
        return Err(cookie_error("write", error));
    }
    let linked = fs::hard_link(&tmp, &path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(secret),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            read_cookie(&path)?.ok_or_else(|| cookie_error("read", io::ErrorKind::NotFound.into()))
        }
        Err(error) => Err(cookie_error("create", error)),
    }
}

/// The cookie at `path`, `None` if there is no such file.
fn read_cookie(path: &Path) -> Result<Option<Secret>, EnvError> {
    match read_private(path) {
        Ok(bytes) => Ok(Some(Secret(bytes))),
        Err(PrivateFileError::Io { error, .. }) if error.kind() == io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(PrivateFileError::Io { action, error }) => Err(EnvError::Cookie {
            path: path.to_owned(),
            action,
            error,
        }),
        Err(PrivateFileError::Mode(mode)) => Err(EnvError::CookieMode {
            path: path.to_owned(),
            mode,
        }),
        Err(PrivateFileError::Empty) => Err(EnvError::CookieEmpty {
            path: path.to_owned(),
        }),
    }
}

/// Why a file holding a secret (the cookie, a cluster key) could not be used.
#[derive(Debug)]
pub(crate) enum PrivateFileError {
    /// The system refused `action` ("open", "read"...).
    Io {
        action: &'static str,
        error: io::Error,
    },
    /// Its permission bits let its group or others in.
    Mode(u32),
    /// It holds nothing but white space.
    Empty,
}

/// The bytes of a regular file only its owner may read or write, trailing white space cut.
pub(crate) fn read_private(path: &Path) -> Result<Vec<u8>, PrivateFileError> {
    let io = |action| move |error| PrivateFileError::Io { action, error };
    let mut file = File::open(path).map_err(io("open"))?;
    let meta = file.metadata().map_err(io("inspect"))?;
    if !meta.is_file() {
        return Err(io("read")(io::Error::other("it is not a regular file")));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(PrivateFileError::Mode(mode));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(io("read"))?;
    while bytes.last().is_some_and(u8::is_ascii_whitespace) {
        bytes.pop();
    }
    if bytes.is_empty() {
        return Err(PrivateFileError::Empty);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {

    use std::path::{Path, PathBuf};

    use crate::env::*;
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::env::tests::*;

    #[test]
    fn secret_from_gsm_secret() {
        let s = job2_with(&[(SECRET, "hunter2")]).unwrap();
        assert_eq!(s.secret.as_bytes(), b"hunter2");
        let debug = format!("{s:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains("Secret(7 bytes)"), "{debug}");
        let err = job2_with(&[(SECRET, "")]).unwrap_err();
        assert!(
            matches!(err, EnvError::Invalid { var: SECRET, .. }),
            "{err}"
        );
    }

    #[test]
    fn random_secrets_are_hex_and_differ() {
        let a = Secret::random().unwrap();
        let b = Secret::random().unwrap();
        assert_eq!(a.as_bytes().len(), 64);
        assert!(a.as_bytes().iter().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a.as_bytes(), b.as_bytes());
    }

    /// A fresh directory to be `HOME`, removed on drop.
    struct TempHome(PathBuf);

    impl TempHome {
        fn new() -> TempHome {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "gossamer-env-test-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            TempHome(dir)
        }

        fn home(&self) -> &str {
            self.0.to_str().unwrap()
        }

        fn cookie(&self) -> PathBuf {
            self.0.join(".gossamer/cookie")
        }

        fn settings(&self) -> Result<Settings, EnvError> {
            with(&[
                (RANK, "0"),
                (SIZE, "2"),
                (COORD, "127.0.0.1:7000"),
                (HOME, self.home()),
            ])
        }
    }

    impl Drop for TempHome {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn cookie_is_made_private_and_then_reused() {
        let home = TempHome::new();
        let first = home.settings().unwrap().secret;
        assert_eq!(first.as_bytes().len(), 64);
        assert!(first.as_bytes().iter().all(u8::is_ascii_hexdigit));
        assert_eq!(fs::read(home.cookie()).unwrap(), first.as_bytes());
        assert_eq!(mode(&home.cookie()), 0o600);
        assert_eq!(mode(&home.0.join(".gossamer")), 0o700);
        let again = home.settings().unwrap().secret;
        assert_eq!(again.as_bytes(), first.as_bytes());
        // Nothing but the cookie is left in the directory.
        let names: Vec<_> = fs::read_dir(home.0.join(".gossamer"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["cookie"]);
    }

    #[test]
    fn cookie_written_by_hand_is_read_without_trailing_newline() {
        let home = TempHome::new();
        fs::create_dir_all(home.0.join(".gossamer")).unwrap();
        fs::write(home.cookie(), "my secret\n").unwrap();
        fs::set_permissions(home.cookie(), fs::Permissions::from_mode(0o400)).unwrap();
        assert_eq!(home.settings().unwrap().secret.as_bytes(), b"my secret");
    }

    #[test]
    fn cookie_open_to_others_is_refused() {
        let home = TempHome::new();
        home.settings().unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620] {
            fs::set_permissions(home.cookie(), fs::Permissions::from_mode(mode)).unwrap();
            let err = home.settings().unwrap_err();
            assert!(
                matches!(err, EnvError::CookieMode { mode: m, .. } if m == mode),
                "{err}"
            );
            let msg = err.to_string();
            assert!(
                msg.contains("chmod 600") && msg.contains(".gossamer/cookie"),
                "{msg}"
            );
        }
    }

    #[test]
    fn empty_cookie_is_refused() {
        let home = TempHome::new();
        fs::create_dir_all(home.0.join(".gossamer")).unwrap();
        fs::write(home.cookie(), " \n").unwrap();
        fs::set_permissions(home.cookie(), fs::Permissions::from_mode(0o600)).unwrap();
        let err = home.settings().unwrap_err();
        assert!(matches!(err, EnvError::CookieEmpty { .. }), "{err}");
        assert!(err.to_string().contains("is empty"), "{err}");
    }

    #[test]
    fn cookie_that_is_a_directory_is_refused() {
        let home = TempHome::new();
        fs::create_dir_all(home.cookie()).unwrap();
        fs::set_permissions(home.cookie(), fs::Permissions::from_mode(0o700)).unwrap();
        let err = home.settings().unwrap_err();
        assert!(matches!(err, EnvError::Cookie { .. }), "{err}");
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    #[test]
    fn gsm_secret_wins_over_the_cookie_and_size_one_needs_neither() {
        let home = TempHome::new();
        let s = with(&[
            (RANK, "0"),
            (SIZE, "2"),
            (COORD, "127.0.0.1:7000"),
            (HOME, home.home()),
            (SECRET, "x"),
        ])
        .unwrap();
        assert_eq!(s.secret.as_bytes(), b"x");
        let s = with(&[(HOME, home.home())]).unwrap();
        assert!(s.secret.is_empty());
        assert!(!home.0.join(".gossamer").exists(), "the cookie was touched");
    }

    #[test]
    fn no_home_and_no_secret_is_an_error() {
        for vars in [
            vec![(RANK, "0"), (SIZE, "2"), (COORD, "127.0.0.1:7000")],
            vec![
                (RANK, "0"),
                (SIZE, "2"),
                (COORD, "127.0.0.1:7000"),
                (HOME, ""),
            ],
        ] {
            let err = with(&vars).unwrap_err();
            assert!(matches!(err, EnvError::NoHome), "{err}");
            assert!(err.to_string().contains("set GSM_SECRET"), "{err}");
        }
    }

    #[test]
    fn ranks_racing_for_a_new_cookie_agree() {
        let home = TempHome::new();
        let secrets: Vec<Vec<u8>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| home.settings().unwrap().secret.as_bytes().to_vec()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(secrets.windows(2).all(|w| w[0] == w[1]), "{secrets:?}");
    }
}
