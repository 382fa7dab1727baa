//! Every `GSM_*` setting of a rack node, and how rank, size, coordinator and job are found.
//!
//! A rack program is one binary started once per node. Each node reads its place in the job
//! from the environment, so that `gsm run`, `srun` (Slurm) and `mpirun` (Open MPI, or any
//! PMI launcher) can all start it, and so that `./prog` with none of these runs as a one-node
//! rack: rank 0 of 1, no coordinator, no sockets, no secret.
//!
//! [`Settings::from_env`] reads everything at once and checks it; nothing else in the crate
//! reads the environment.
//!
//! | Variable | Default | Meaning |
//! |---|---|---|
//! | `GSM_RANK`, `GSM_SIZE` | from the launcher, else 0 and 1 | this node's rank and the number of nodes; set by `gsm run` |
//! | `GSM_COORD` | loopback when all ranks share a host, else required | `host:port` where rank 0 listens and every rank registers |
//! | `GSM_JOB` | from the launcher, else 0 | job id, 1 to 16 hex digits (`0x` allowed): the same in every rank of a job, different between jobs |
//! | `GSM_SECRET` | the file `~/.gossamer/cookie` | job secret (any non-empty string) every connection proves it knows |
//! | `GSM_WORKERS` | cores ÷ ranks on this host, at least 1 | worker threads of this node |
//! | `GSM_LOCAL_SIZE` | from the launcher | ranks on this host; set by `gsm run`, used for the `GSM_WORKERS` default |
//! | `GSM_HOST` | the coordinator's IP if loopback, else `0.0.0.0` (`::` for IPv6) | address this rank listens on |
//! | `GSM_CONNECT_TIMEOUT` | `30s` | how long to wait for the coordinator and the other ranks |
//! | `GSM_HEARTBEAT` | `250ms` | an idle connection sends a heartbeat this often |
//! | `GSM_PEER_TIMEOUT` | `3s` | silence after which a peer is lost; must exceed `GSM_HEARTBEAT` |
//! | `GSM_FRAME` | `64KiB` | largest frame body, `4KiB` to `16MiB`; larger payloads go in chunks |
//! | `GSM_MAX_MESSAGE` | `1GiB` | largest argument or result of one call (at most 4GiB - 1); a larger one fails the call, naming its size |
//!
//! Durations are written `250ms`, `3s` or `30` (seconds); sizes `65536`, `64KiB`, `1MiB` or
//! `1GiB` (`B`, `KiB`, `MiB`, `GiB`, any case).
//!
//! # Rank and size
//!
//! Read from the first pair present of `GSM_RANK`/`GSM_SIZE` (`gsm run`),
//! `OMPI_COMM_WORLD_RANK`/`OMPI_COMM_WORLD_SIZE` (`mpirun`), `SLURM_PROCID`/`SLURM_NTASKS`
//! (`srun`) and `PMI_RANK`/`PMI_SIZE` (other PMI launchers); that launcher is
//! [`Settings::launcher`]. Every other pair present must agree with it (as under `mpirun`
//! inside a Slurm allocation), or [`EnvError::Conflict`] names both. Half a pair, a value that
//! is not a number, a size of 0 or a rank not below the size are errors too.
//!
//! # Coordinator
//!
//! `GSM_COORD` is resolved like [`std::net::ToSocketAddrs`] does (the first address wins).
//! Without it, when every rank is on this host (`GSM_LOCAL_SIZE` or
//! `OMPI_COMM_WORLD_LOCAL_SIZE` equals the size, or `SLURM_STEP_NUM_NODES` — else
//! `SLURM_NNODES` — is 1) the coordinator is `127.0.0.1` on a port derived from the job id
//! (a stable hash into `20000..32768`, see [`job_port`]); otherwise it is an error. A one-rank
//! job has no coordinator and does not read `GSM_COORD`.
//!
//! # Job id
//!
//! `GSM_JOB` if set. Else from the launcher that gave the rank: Slurm's `SLURM_JOB_ID` and
//! `SLURM_STEP_ID`; for Open MPI and PMI, `PMIX_NAMESPACE` or else `OMPI_MCA_ess_base_jobid`.
//! Those strings are hashed to a `u64` with 64-bit FNV-1a, the same in every process and
//! every build. With none of these the job id is 0.
//!
//! # Secret
//!
//! `GSM_SECRET` (its bytes) if set. Else the file `~/.gossamer/cookie` (the home directory
//! read from `HOME`): made with 32 random bytes, hex-encoded, mode 0600 in a directory of
//! mode 0700 when missing; refused when group or others have any access to it, like ssh does
//! with its keys, or when it is empty. Trailing whitespace in the file is ignored. Ranks on
//! different hosts need the same cookie: copy it, or share `HOME`. A one-rank job needs no
//! secret and touches neither.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

mod launcher;
mod secret;
mod values;

pub use launcher::{Launcher, job_port, random_job_id};
pub use secret::Secret;

use launcher::{coordinator, default_listen_host, job_id, rank_and_size, workers};
use secret::secret;
use values::{duration_var, heartbeat_and_peer_timeout, size_var};

/// `GSM_RANK`: this node's rank, `0..GSM_SIZE`.
pub const RANK: &str = "GSM_RANK";
/// `GSM_SIZE`: the number of nodes (ranks) in the job.
pub const SIZE: &str = "GSM_SIZE";
/// `GSM_COORD`: `host:port` where rank 0 listens and every other rank registers.
pub const COORD: &str = "GSM_COORD";
/// `GSM_JOB`: the job id, 1 to 16 hex digits with an optional `0x`.
pub const JOB: &str = "GSM_JOB";
/// `GSM_SECRET`: the job secret; without it, `~/.gossamer/cookie`.
pub const SECRET: &str = "GSM_SECRET";
/// `GSM_WORKERS`: worker threads of this node.
pub const WORKERS: &str = "GSM_WORKERS";
/// `GSM_LOCAL_SIZE`: how many ranks of the job run on this host.
pub const LOCAL_SIZE: &str = "GSM_LOCAL_SIZE";
/// `GSM_HOST`: the IP address this rank listens on.
pub const HOST: &str = "GSM_HOST";
/// `GSM_CONNECT_TIMEOUT`: how long to wait for the coordinator and the other ranks.
pub const CONNECT_TIMEOUT: &str = "GSM_CONNECT_TIMEOUT";
/// `GSM_HEARTBEAT`: how often an idle connection sends a heartbeat.
pub const HEARTBEAT: &str = "GSM_HEARTBEAT";
/// `GSM_PEER_TIMEOUT`: silence after which a peer is lost.
pub const PEER_TIMEOUT: &str = "GSM_PEER_TIMEOUT";
/// `GSM_FRAME`: the largest frame body.
pub const FRAME: &str = "GSM_FRAME";
/// `GSM_MAX_MESSAGE`: the largest argument or result of one call.
pub const MAX_MESSAGE: &str = "GSM_MAX_MESSAGE";

/// The rank and size variables of the other launchers (`srun`, `mpirun`, PMI).
///
/// `gsm run` removes them from its ranks' environment: inside a Slurm allocation or an
/// `mpirun`, they describe `gsm` itself, not its ranks, and would conflict with `GSM_RANK`.
pub const LAUNCHER_VARS: [&str; 6] = [
    OMPI_RANK, OMPI_SIZE, SLURM_RANK, SLURM_SIZE, PMI_RANK, PMI_SIZE,
];

/// Default of `GSM_CONNECT_TIMEOUT`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of `GSM_HEARTBEAT`.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_millis(250);
/// Default of `GSM_PEER_TIMEOUT`.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(3);
/// Default of `GSM_FRAME`: 64 KiB.
pub const DEFAULT_FRAME: usize = 64 << 10;
/// Smallest `GSM_FRAME` accepted: 4 KiB, room for a handshake.
pub const MIN_FRAME: usize = 4 << 10;
/// Largest `GSM_FRAME` accepted: 16 MiB.
pub const MAX_FRAME: usize = 16 << 20;
/// Default of `GSM_MAX_MESSAGE`: 1 GiB.
pub const DEFAULT_MAX_MESSAGE: usize = 1 << 30;

const OMPI_RANK: &str = "OMPI_COMM_WORLD_RANK";
const OMPI_SIZE: &str = "OMPI_COMM_WORLD_SIZE";
const OMPI_LOCAL_SIZE: &str = "OMPI_COMM_WORLD_LOCAL_SIZE";
const OMPI_JOB: &str = "OMPI_MCA_ess_base_jobid";
const PMIX_NAMESPACE: &str = "PMIX_NAMESPACE";
const SLURM_RANK: &str = "SLURM_PROCID";
const SLURM_SIZE: &str = "SLURM_NTASKS";
const SLURM_JOB: &str = "SLURM_JOB_ID";
const SLURM_STEP: &str = "SLURM_STEP_ID";
const SLURM_STEP_NODES: &str = "SLURM_STEP_NUM_NODES";
const SLURM_NODES: &str = "SLURM_NNODES";
const SLURM_TASKS_PER_NODE: &str = "SLURM_NTASKS_PER_NODE";
const PMI_RANK: &str = "PMI_RANK";
const PMI_SIZE: &str = "PMI_SIZE";
const HOME: &str = "HOME";

/// Bytes of randomness in a generated secret (before hex encoding).
const SECRET_BYTES: usize = 32;

/// Reads `GSM_HEARTBEAT` and `GSM_PEER_TIMEOUT` through `get` and returns the peer timeout,
/// checked as [`Settings::from_vars`] checks it. `gsm run` uses it to decide how long the
/// other ranks get to stop after one failed.
///
/// ```
/// use std::time::Duration;
///
/// let t = gossamer::env::peer_timeout(|name| (name == "GSM_PEER_TIMEOUT").then(|| "500ms".into()))?;
/// assert_eq!(t, Duration::from_millis(500));
/// assert_eq!(gossamer::env::peer_timeout(|_| None)?, gossamer::env::DEFAULT_PEER_TIMEOUT);
/// # Ok::<(), gossamer::env::EnvError>(())
/// ```
pub fn peer_timeout(get: impl Fn(&str) -> Option<String>) -> Result<Duration, EnvError> {
    Ok(heartbeat_and_peer_timeout(&get)?.1)
}

/// Everything a rack node needs to know about its job, read from the environment.
///
/// ```
/// use gossamer::env::{self, Launcher, Settings};
///
/// // No launcher at all: a one-node rack, no coordinator, no secret, every default.
/// let s = Settings::from_vars(|_| None)?;
/// assert_eq!((s.rank, s.size, s.launcher), (0, 1, Launcher::None));
/// assert!(s.coordinator.is_none() && s.secret.is_empty());
/// assert_eq!(s.connect_timeout, env::DEFAULT_CONNECT_TIMEOUT);
/// assert_eq!((s.heartbeat, s.peer_timeout), (env::DEFAULT_HEARTBEAT, env::DEFAULT_PEER_TIMEOUT));
/// assert_eq!((s.frame, s.max_message), (env::DEFAULT_FRAME, env::DEFAULT_MAX_MESSAGE));
/// # Ok::<(), gossamer::env::EnvError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Settings {
    /// This node's rank, `0..size`. Rank 0 runs the program's main and is the coordinator.
    pub rank: usize,
    /// The number of nodes in the job, at least 1.
    pub size: usize,
    /// Where rank 0 listens; `None` only when `size == 1`.
    pub coordinator: Option<SocketAddr>,
    /// The job id, the same in every rank of one job.
    pub job: u64,
    /// The job secret; empty when `size == 1`.
    pub secret: Secret,
    /// Worker threads of this node, at least 1.
    pub workers: usize,
    /// The address this rank listens on.
    pub listen_host: IpAddr,
    /// How long to wait for the coordinator and the other ranks.
    pub connect_timeout: Duration,
    /// How often an idle connection sends a heartbeat.
    pub heartbeat: Duration,
    /// Silence after which a peer is lost; longer than `heartbeat`.
    pub peer_timeout: Duration,
    /// The largest frame body in bytes, `MIN_FRAME..=MAX_FRAME`.
    pub frame: usize,
    /// The largest argument or result of one call in bytes.
    pub max_message: usize,
    /// The launcher that gave rank and size.
    pub launcher: Launcher,
}

impl Settings {
    /// Reads the settings from this process's environment.
    ///
    /// ```no_run
    /// let settings = gossamer::env::Settings::from_env()?;
    /// println!("rank {} of {}", settings.rank, settings.size);
    /// # Ok::<(), gossamer::env::EnvError>(())
    /// ```
    pub fn from_env() -> Result<Settings, EnvError> {
        Settings::from_vars(|name| std::env::var(name).ok())
    }

    /// Reads the settings through `get`, which returns a variable's value or `None` when it
    /// is unset (or not Unicode). [`Settings::from_env`] passes `std::env::var`; tests pass a
    /// map. `HOME`, for the cookie, is read through `get` too.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use std::time::Duration;
    /// use gossamer::env::{self, Launcher, Settings};
    ///
    /// // The constants name the variables: `env::RANK` is "GSM_RANK", and so on.
    /// let vars: HashMap<&str, &str> = HashMap::from([
    ///     (env::RANK, "2"),
    ///     (env::SIZE, "4"),
    ///     (env::COORD, "127.0.0.1:7000"),
    ///     (env::JOB, "3fa9"),
    ///     (env::SECRET, "s3cret"),
    ///     (env::WORKERS, "2"),
    ///     (env::HEARTBEAT, "100ms"),
    ///     ("GSM_FRAME", "1MiB"),
    /// ]);
    /// let s = Settings::from_vars(|name| vars.get(name).map(|v| v.to_string()))?;
    /// assert_eq!((s.rank, s.size, s.job, s.workers), (2, 4, 0x3fa9, 2));
    /// assert_eq!(s.coordinator, Some("127.0.0.1:7000".parse().unwrap()));
    /// assert_eq!(s.listen_host.to_string(), "127.0.0.1");
    /// assert_eq!(s.heartbeat, Duration::from_millis(100));
    /// assert_eq!(s.frame, 1 << 20);
    /// assert_eq!(s.launcher, Launcher::Gsm);
    /// # Ok::<(), gossamer::env::EnvError>(())
    /// ```
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Settings, EnvError> {
        let get = &get;
        let (launcher, rank, size) = rank_and_size(get)?;
        let job = job_id(get, launcher)?;
        let coordinator = if size == 1 {
            None
        } else {
            Some(coordinator(get, size, job)?)
        };
        let listen_host = match get(HOST) {
            Some(value) => value.trim().parse().map_err(|_| EnvError::Invalid {
                var: HOST,
                value,
                expected: "an IP address such as 10.0.0.5 or ::1",
            })?,
            None => default_listen_host(coordinator),
        };
        let connect_timeout = duration_var(get, CONNECT_TIMEOUT, DEFAULT_CONNECT_TIMEOUT)?;
        let (heartbeat, peer_timeout) = heartbeat_and_peer_timeout(get)?;
        let frame = size_var(get, FRAME, DEFAULT_FRAME)?;
        if !(MIN_FRAME..=MAX_FRAME).contains(&frame) {
            return Err(EnvError::OutOfRange {
                var: FRAME,
                value: get(FRAME).unwrap_or_default(),
                allowed: "between 4KiB and 16MiB",
            });
        }
        let max_message = size_var(get, MAX_MESSAGE, DEFAULT_MAX_MESSAGE)?;
        // Frames carry a large value's length as a u32.
        if max_message == 0 || max_message > u32::MAX as usize {
            return Err(EnvError::OutOfRange {
                var: MAX_MESSAGE,
                value: get(MAX_MESSAGE).unwrap_or_default(),
                allowed: "between 1 byte and 4294967295 bytes (4GiB - 1)",
            });
        }
        let workers = workers(get, size, coordinator)?;
        // Last, so that a job with a bad setting never touches the cookie file.
        let secret = if size == 1 {
            Secret::default()
        } else {
            secret(get)?
        };
        Ok(Settings {
            rank,
            size,
            coordinator,
            job,
            secret,
            workers,
            listen_host,
            connect_timeout,
            heartbeat,
            peer_timeout,
            frame,
            max_message,
            launcher,
        })
    }
}

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

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;

    use super::*;

    pub(super) fn with(vars: &[(&str, &str)]) -> Result<Settings, EnvError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_vars(|name| map.get(name).cloned())
    }

    /// A multi-rank job on loopback with a secret: the base most tests vary.
    pub(super) const JOB2: [(&str, &str); 4] = [
        (RANK, "1"),
        (SIZE, "2"),
        (COORD, "127.0.0.1:7000"),
        (SECRET, "s"),
    ];

    pub(super) fn job2_with(extra: &[(&'static str, &'static str)]) -> Result<Settings, EnvError> {
        let mut vars = JOB2.to_vec();
        vars.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
        vars.extend_from_slice(extra);
        with(&vars)
    }

    pub(super) fn cores() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }

    #[test]
    fn no_launcher_is_a_one_node_rack() {
        let s = with(&[]).unwrap();
        assert_eq!((s.rank, s.size, s.job), (0, 1, 0));
        assert_eq!(s.launcher, Launcher::None);
        assert_eq!(s.coordinator, None);
        assert!(s.secret.is_empty());
        assert_eq!(s.workers, cores());
        assert_eq!(s.listen_host, IpAddr::from(Ipv4Addr::LOCALHOST));
        assert_eq!(s.connect_timeout, Duration::from_secs(30));
        assert_eq!(s.heartbeat, Duration::from_millis(250));
        assert_eq!(s.peer_timeout, Duration::from_secs(3));
        assert_eq!(s.frame, 64 * 1024);
        assert_eq!(s.max_message, 1 << 30);
    }

    #[test]
    fn size_one_ignores_coordinator_and_secret() {
        // A bad GSM_COORD and no HOME: a one-rank job reads neither.
        let s = with(&[(RANK, "0"), (SIZE, "1"), (COORD, "no port")]).unwrap();
        assert_eq!(s.launcher, Launcher::Gsm);
        assert_eq!(s.coordinator, None);
        assert!(s.secret.is_empty());
    }

    #[test]
    fn launcher_vars_are_the_rank_pairs_of_other_launchers() {
        for launcher in [Launcher::Slurm, Launcher::OpenMpi, Launcher::Pmi] {
            let (rank, size) = launcher.rank_vars().unwrap();
            assert!(LAUNCHER_VARS.contains(&rank) && LAUNCHER_VARS.contains(&size));
        }
        assert!(!LAUNCHER_VARS.contains(&RANK));
    }
}
