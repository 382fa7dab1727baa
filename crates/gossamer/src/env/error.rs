//! Why the settings could not be read.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use super::vars::*;

/// Why the settings could not be read. Each message names the variable, its value and what
/// to do about it.
///
/// ```
/// use gossamer::env::{EnvError, Settings};
///
/// let err = Settings::from_vars(|name| (name == "GSM_RANK").then(|| "1".into())).unwrap_err();
/// assert!(matches!(err, EnvError::HalfPair { present: "GSM_RANK", missing: "GSM_SIZE" }));
/// assert_eq!(err.to_string(), "GSM_RANK is set but GSM_SIZE is not: set both or neither");
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum EnvError {
    /// A value that cannot be parsed.
    Invalid {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What it must be, with an example.
        expected: &'static str,
    },
    /// A value of the right form outside the allowed range.
    OutOfRange {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// The allowed range.
        allowed: &'static str,
    },
    /// One variable of a rank/size pair without the other.
    HalfPair {
        /// The variable that is set.
        present: &'static str,
        /// The one that is missing.
        missing: &'static str,
    },
    /// A rank not below the size.
    RankNotBelowSize {
        /// The launcher whose variables these are.
        launcher: Launcher,
        /// The rank.
        rank: usize,
        /// The size.
        size: usize,
    },
    /// Two launchers' variables disagree about rank or size.
    Conflict {
        /// The launcher read first (the one that would be used).
        first: Launcher,
        /// Its rank and size.
        first_rank_size: (usize, usize),
        /// The launcher that disagrees.
        second: Launcher,
        /// Its rank and size.
        second_rank_size: (usize, usize),
    },
    /// `GSM_COORD` is missing and the ranks may be on several hosts.
    NoCoordinator {
        /// The number of ranks.
        size: usize,
    },
    /// `GSM_COORD` does not name a usable address.
    BadCoordinator {
        /// Its value.
        value: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// `GSM_PEER_TIMEOUT` is not longer than `GSM_HEARTBEAT`.
    PeerTimeoutTooShort {
        /// The heartbeat interval.
        heartbeat: Duration,
        /// The peer timeout.
        peer_timeout: Duration,
    },
    /// Neither `GSM_SECRET` nor `HOME` is set, so no secret can be found.
    NoHome,
    /// The cookie file cannot be read or made.
    Cookie {
        /// The file or directory.
        path: PathBuf,
        /// What was being done, e.g. "read".
        action: &'static str,
        /// What the system said.
        error: io::Error,
    },
    /// The cookie file is open to group or others.
    CookieMode {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The cookie file is empty.
    CookieEmpty {
        /// The file.
        path: PathBuf,
    },
    /// The operating system gave no random bytes.
    Random {
        /// What it said.
        error: String,
    },
}

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvError::Invalid {
                var,
                value,
                expected,
            } => write!(f, "{var}={value:?} is not valid: {var} must be {expected}"),
            EnvError::OutOfRange {
                var,
                value,
                allowed,
            } => write!(f, "{var}={value:?} is out of range: it must be {allowed}"),
            EnvError::HalfPair { present, missing } => {
                write!(
                    f,
                    "{present} is set but {missing} is not: set both or neither"
                )
            }
            EnvError::RankNotBelowSize {
                launcher,
                rank,
                size,
            } => {
                let (rank_var, size_var) = launcher.rank_vars().unwrap_or((RANK, SIZE));
                write!(
                    f,
                    "{rank_var}={rank} is not below {size_var}={size}: ranks count from 0 to \
                     {size_var} - 1"
                )
            }
            EnvError::Conflict {
                first,
                first_rank_size: (r1, s1),
                second,
                second_rank_size: (r2, s2),
            } => {
                let (rv1, sv1) = first.rank_vars().unwrap_or((RANK, SIZE));
                let (rv2, sv2) = second.rank_vars().unwrap_or((RANK, SIZE));
                write!(
                    f,
                    "launchers disagree: {first} says {rv1}={r1} {sv1}={s1} but {second} says \
                     {rv2}={r2} {sv2}={s2}; unset the variables of the launcher that did not \
                     start this process"
                )
            }
            EnvError::NoCoordinator { size } => write!(
                f,
                "{COORD} is not set and the {size} ranks may run on several hosts: set {COORD} \
                 to host:port where rank 0 can listen and every rank can connect, e.g. \
                 {COORD}=10.0.0.1:7000"
            ),
            EnvError::BadCoordinator { value, reason } => write!(
                f,
                "{COORD}={value:?} cannot be used ({reason}): set it to host:port where rank 0 \
                 can listen, e.g. {COORD}=10.0.0.1:7000"
            ),
            EnvError::PeerTimeoutTooShort {
                heartbeat,
                peer_timeout,
            } => write!(
                f,
                "{PEER_TIMEOUT} ({peer_timeout:?}) must be longer than {HEARTBEAT} \
                 ({heartbeat:?}), or every idle peer is lost: raise {PEER_TIMEOUT} or lower \
                 {HEARTBEAT}"
            ),
            EnvError::NoHome => write!(
                f,
                "neither {SECRET} nor {HOME} is set, so there is no job secret: set {SECRET} to \
                 the same string in every rank, or set {HOME} to use ~/.gossamer/cookie"
            ),
            EnvError::Cookie {
                path,
                action,
                error,
            } => write!(
                f,
                "cannot {action} {}: {error}; fix that, or set {SECRET} instead",
                path.display()
            ),
            EnvError::CookieMode { path, mode } => write!(
                f,
                "{} has mode {mode:04o}, open to group or others, so it is not a secret: run \
                 `chmod 600 {}` (or set {SECRET})",
                path.display(),
                path.display()
            ),
            EnvError::CookieEmpty { path } => write!(
                f,
                "{} is empty: delete it to have a new one made, or write the job secret in it \
                 (or set {SECRET})",
                path.display()
            ),
            EnvError::Random { error } => write!(
                f,
                "the operating system gave no random bytes ({error}): set {SECRET} yourself"
            ),
        }
    }
}

impl std::error::Error for EnvError {}
