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

use crate::hash::fnv1a;

/// `GSM_RANK`: this node's rank, `0..GSM_SIZE`.
///
/// ```
/// assert_eq!(gossamer::env::RANK, "GSM_RANK");
/// ```
pub const RANK: &str = "GSM_RANK";
/// `GSM_SIZE`: the number of nodes (ranks) in the job.
///
/// ```
/// assert_eq!(gossamer::env::SIZE, "GSM_SIZE");
/// ```
pub const SIZE: &str = "GSM_SIZE";
/// `GSM_COORD`: `host:port` where rank 0 listens and every other rank registers.
///
/// ```
/// assert_eq!(gossamer::env::COORD, "GSM_COORD");
/// ```
pub const COORD: &str = "GSM_COORD";
/// `GSM_JOB`: the job id, 1 to 16 hex digits with an optional `0x`.
///
/// ```
/// assert_eq!(gossamer::env::JOB, "GSM_JOB");
/// ```
pub const JOB: &str = "GSM_JOB";
/// `GSM_SECRET`: the job secret; without it, `~/.gossamer/cookie`.
///
/// ```
/// assert_eq!(gossamer::env::SECRET, "GSM_SECRET");
/// ```
pub const SECRET: &str = "GSM_SECRET";
/// `GSM_WORKERS`: worker threads of this node.
///
/// ```
/// assert_eq!(gossamer::env::WORKERS, "GSM_WORKERS");
/// ```
pub const WORKERS: &str = "GSM_WORKERS";
/// `GSM_LOCAL_SIZE`: how many ranks of the job run on this host.
///
/// ```
/// assert_eq!(gossamer::env::LOCAL_SIZE, "GSM_LOCAL_SIZE");
/// ```
pub const LOCAL_SIZE: &str = "GSM_LOCAL_SIZE";
/// `GSM_HOST`: the IP address this rank listens on.
///
/// ```
/// assert_eq!(gossamer::env::HOST, "GSM_HOST");
/// ```
pub const HOST: &str = "GSM_HOST";
/// `GSM_CONNECT_TIMEOUT`: how long to wait for the coordinator and the other ranks.
///
/// ```
/// assert_eq!(gossamer::env::CONNECT_TIMEOUT, "GSM_CONNECT_TIMEOUT");
/// ```
pub const CONNECT_TIMEOUT: &str = "GSM_CONNECT_TIMEOUT";
/// `GSM_HEARTBEAT`: how often an idle connection sends a heartbeat.
///
/// ```
/// assert_eq!(gossamer::env::HEARTBEAT, "GSM_HEARTBEAT");
/// ```
pub const HEARTBEAT: &str = "GSM_HEARTBEAT";
/// `GSM_PEER_TIMEOUT`: silence after which a peer is lost.
///
/// ```
/// assert_eq!(gossamer::env::PEER_TIMEOUT, "GSM_PEER_TIMEOUT");
/// ```
pub const PEER_TIMEOUT: &str = "GSM_PEER_TIMEOUT";
/// `GSM_FRAME`: the largest frame body.
///
/// ```
/// assert_eq!(gossamer::env::FRAME, "GSM_FRAME");
/// ```
pub const FRAME: &str = "GSM_FRAME";
/// `GSM_MAX_MESSAGE`: the largest argument or result of one call.
///
/// ```
/// assert_eq!(gossamer::env::MAX_MESSAGE, "GSM_MAX_MESSAGE");
/// ```
pub const MAX_MESSAGE: &str = "GSM_MAX_MESSAGE";

/// The rank and size variables of the other launchers (`srun`, `mpirun`, PMI).
///
/// `gsm run` removes them from its ranks' environment: inside a Slurm allocation or an
/// `mpirun`, they describe `gsm` itself, not its ranks, and would conflict with `GSM_RANK`.
///
/// ```
/// assert!(gossamer::env::LAUNCHER_VARS.contains(&"SLURM_PROCID"));
/// ```
pub const LAUNCHER_VARS: [&str; 6] = [
    OMPI_RANK, OMPI_SIZE, SLURM_RANK, SLURM_SIZE, PMI_RANK, PMI_SIZE,
];

/// Default of `GSM_CONNECT_TIMEOUT`.
///
/// ```
/// assert_eq!(gossamer::env::DEFAULT_CONNECT_TIMEOUT.as_secs(), 30);
/// ```
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of `GSM_HEARTBEAT`.
///
/// ```
/// assert_eq!(gossamer::env::DEFAULT_HEARTBEAT.as_millis(), 250);
/// ```
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_millis(250);
/// Default of `GSM_PEER_TIMEOUT`.
///
/// ```
/// assert_eq!(gossamer::env::DEFAULT_PEER_TIMEOUT.as_secs(), 3);
/// ```
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(3);
/// Default of `GSM_FRAME`: 64 KiB.
///
/// ```
/// assert_eq!(gossamer::env::DEFAULT_FRAME, 65536);
/// ```
pub const DEFAULT_FRAME: usize = 64 << 10;
/// Smallest `GSM_FRAME` accepted: 4 KiB, room for a handshake.
///
/// ```
/// assert_eq!(gossamer::env::MIN_FRAME, 4096);
/// ```
pub const MIN_FRAME: usize = 4 << 10;
/// Largest `GSM_FRAME` accepted: 16 MiB.
///
/// ```
/// assert_eq!(gossamer::env::MAX_FRAME, 16 << 20);
/// ```
pub const MAX_FRAME: usize = 16 << 20;
/// Default of `GSM_MAX_MESSAGE`: 1 GiB.
///
/// ```
/// assert_eq!(gossamer::env::DEFAULT_MAX_MESSAGE, 1 << 30);
/// ```
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

/// Which launcher started this process, as told by the variables it set.
///
/// ```
/// use gossamer::env::{Launcher, Settings};
///
/// let s = Settings::from_vars(|name| match name {
///     "SLURM_PROCID" => Some("1".into()),
///     "SLURM_NTASKS" => Some("2".into()),
///     "SLURM_NNODES" => Some("1".into()),
///     "GSM_SECRET" => Some("s3cret".into()),
///     _ => None,
/// })?;
/// assert_eq!(s.launcher, Launcher::Slurm);
/// assert_eq!(s.launcher.to_string(), "srun (Slurm)");
/// # Ok::<(), gossamer::env::EnvError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Launcher {
    /// No launcher: a one-node rack.
    None,
    /// `gsm run` (or anything that sets `GSM_RANK` and `GSM_SIZE`).
    Gsm,
    /// Slurm's `srun`: `SLURM_PROCID` and `SLURM_NTASKS`.
    Slurm,
    /// Open MPI's `mpirun`: `OMPI_COMM_WORLD_RANK` and `OMPI_COMM_WORLD_SIZE`.
    OpenMpi,
    /// Another PMI launcher (MPICH's Hydra, Intel MPI): `PMI_RANK` and `PMI_SIZE`.
    Pmi,
}

impl Launcher {
    /// The variables this launcher gives rank and size in, `None` for [`Launcher::None`].
    ///
    /// ```
    /// use gossamer::env::Launcher;
    ///
    /// assert_eq!(Launcher::Gsm.rank_vars(), Some(("GSM_RANK", "GSM_SIZE")));
    /// assert_eq!(Launcher::None.rank_vars(), None);
    /// ```
    pub fn rank_vars(self) -> Option<(&'static str, &'static str)> {
        match self {
            Launcher::None => None,
            Launcher::Gsm => Some((RANK, SIZE)),
            Launcher::Slurm => Some((SLURM_RANK, SLURM_SIZE)),
            Launcher::OpenMpi => Some((OMPI_RANK, OMPI_SIZE)),
            Launcher::Pmi => Some((PMI_RANK, PMI_SIZE)),
        }
    }
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::None => "no launcher",
            Launcher::Gsm => "gsm run",
            Launcher::Slurm => "srun (Slurm)",
            Launcher::OpenMpi => "mpirun (Open MPI)",
            Launcher::Pmi => "a PMI launcher",
        })
    }
}

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

/// A fresh random job id, as `gsm run` makes one per job.
///
/// ```
/// let a = gossamer::env::random_job_id()?;
/// let b = gossamer::env::random_job_id()?;
/// assert_ne!(a, b);
/// # Ok::<(), gossamer::env::EnvError>(())
/// ```
pub fn random_job_id() -> Result<u64, EnvError> {
    getrandom::u64().map_err(|e| EnvError::Random {
        error: e.to_string(),
    })
}

/// The coordinator port used without `GSM_COORD` when all ranks share a host: a stable hash
/// of the job id into `20000..32768`, the same in every rank and every build.
///
/// The range ends where Linux's ephemeral ports begin (32768 to 60999 by default), the ports
/// the system gives outgoing connections and listeners on port 0, such as every rank's data
/// listener: a coordinator port in there could be taken by any of them, and the job would fail
/// to start.
///
/// ```
/// let port = gossamer::env::job_port(0x3fa9);
/// assert!((20000..32768).contains(&port));
/// assert_eq!(port, gossamer::env::job_port(0x3fa9));
/// ```
pub fn job_port(job: u64) -> u16 {
    const BASE: u64 = 20_000;
    const SPAN: u64 = 12_768;
    // BASE + SPAN fits in a u16, so the cast cannot truncate.
    (BASE + fnv1a(&job.to_le_bytes()) % SPAN) as u16
}

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
/// use gossamer::env::{Launcher, Settings};
///
/// // No launcher at all: a one-node rack, no coordinator, no secret.
/// let s = Settings::from_vars(|_| None)?;
/// assert_eq!((s.rank, s.size, s.launcher), (0, 1, Launcher::None));
/// assert!(s.coordinator.is_none() && s.secret.is_empty());
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
    /// use gossamer::env::{Launcher, Settings};
    ///
    /// let vars: HashMap<&str, &str> = HashMap::from([
    ///     ("GSM_RANK", "2"),
    ///     ("GSM_SIZE", "4"),
    ///     ("GSM_COORD", "127.0.0.1:7000"),
    ///     ("GSM_JOB", "3fa9"),
    ///     ("GSM_SECRET", "s3cret"),
    ///     ("GSM_WORKERS", "2"),
    ///     ("GSM_HEARTBEAT", "100ms"),
    /// ]);
    /// let s = Settings::from_vars(|name| vars.get(name).map(|v| v.to_string()))?;
    /// assert_eq!((s.rank, s.size, s.job, s.workers), (2, 4, 0x3fa9, 2));
    /// assert_eq!(s.coordinator, Some("127.0.0.1:7000".parse().unwrap()));
    /// assert_eq!(s.listen_host.to_string(), "127.0.0.1");
    /// assert_eq!(s.heartbeat, Duration::from_millis(100));
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

/// The first rank/size pair present, checked against every other pair present.
fn rank_and_size(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<(Launcher, usize, usize), EnvError> {
    const ORDER: [Launcher; 4] = [
        Launcher::Gsm,
        Launcher::OpenMpi,
        Launcher::Slurm,
        Launcher::Pmi,
    ];
    let mut found: Option<(Launcher, usize, usize)> = None;
    for launcher in ORDER {
        let Some((rank_var, size_var)) = launcher.rank_vars() else {
            continue;
        };
        let (rank, size) = match (get(rank_var), get(size_var)) {
            (None, None) => continue,
            (Some(_), None) => {
                return Err(EnvError::HalfPair {
                    present: rank_var,
                    missing: size_var,
                });
            }
            (None, Some(_)) => {
                return Err(EnvError::HalfPair {
                    present: size_var,
                    missing: rank_var,
                });
            }
            (Some(rank), Some(size)) => (rank, size),
        };
        let size = count(size_var, size, "a number of ranks such as 4", 1)?;
        let rank = count(rank_var, rank, "a rank such as 0", 0)?;
        if rank >= size {
            return Err(EnvError::RankNotBelowSize {
                launcher,
                rank,
                size,
            });
        }
        match found {
            None => found = Some((launcher, rank, size)),
            Some((first, r, s)) if (r, s) != (rank, size) => {
                return Err(EnvError::Conflict {
                    first,
                    first_rank_size: (r, s),
                    second: launcher,
                    second_rank_size: (rank, size),
                });
            }
            Some(_) => {}
        }
    }
    Ok(found.unwrap_or((Launcher::None, 0, 1)))
}

/// Parses a whole number of at least `min`.
fn count(
    var: &'static str,
    value: String,
    expected: &'static str,
    min: usize,
) -> Result<usize, EnvError> {
    match value.trim().parse::<usize>() {
        Ok(n) if n >= min => Ok(n),
        Ok(_) => Err(EnvError::OutOfRange {
            var,
            value,
            allowed: if min == 1 { "at least 1" } else { "at least 0" },
        }),
        Err(_) => Err(EnvError::Invalid {
            var,
            value,
            expected,
        }),
    }
}

/// Parses a count variable of at least 1, `None` when unset.
fn positive_var(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
) -> Result<Option<usize>, EnvError> {
    get(var)
        .map(|value| count(var, value, "a whole number such as 4", 1))
        .transpose()
}

fn job_id(get: &impl Fn(&str) -> Option<String>, launcher: Launcher) -> Result<u64, EnvError> {
    if let Some(value) = get(JOB) {
        let trimmed = value.trim();
        let digits = trimmed
            .strip_prefix("0x")
            .or_else(|| trimmed.strip_prefix("0X"))
            .unwrap_or(trimmed);
        return match u64::from_str_radix(digits, 16) {
            // from_str_radix accepts a leading '+'; a job id is hex digits only.
            Ok(job) if !digits.starts_with('+') => Ok(job),
            _ => Err(EnvError::Invalid {
                var: JOB,
                value,
                expected: "1 to 16 hex digits such as 3fa9c2d41b7e6a05",
            }),
        };
    }
    let id = match launcher {
        Launcher::Slurm => get(SLURM_JOB).map(|job| match get(SLURM_STEP) {
            Some(step) => format!("slurm:{job}.{step}"),
            None => format!("slurm:{job}"),
        }),
        Launcher::OpenMpi | Launcher::Pmi => get(PMIX_NAMESPACE)
            .map(|ns| format!("pmix:{ns}"))
            .or_else(|| get(OMPI_JOB).map(|job| format!("ompi:{job}"))),
        Launcher::Gsm | Launcher::None => None,
    };
    Ok(id.map_or(0, |id| fnv1a(id.as_bytes())))
}

fn coordinator(
    get: &impl Fn(&str) -> Option<String>,
    size: usize,
    job: u64,
) -> Result<SocketAddr, EnvError> {
    if let Some(value) = get(COORD) {
        let bad = |reason: String| EnvError::BadCoordinator {
            value: value.clone(),
            reason,
        };
        let addr = value
            .trim()
            .to_socket_addrs()
            .map_err(|e| bad(e.to_string()))?
            .next()
            .ok_or_else(|| bad("it resolves to no address".into()))?;
        if addr.port() == 0 {
            return Err(bad(
                "port 0 means any port, which the other ranks cannot know".into(),
            ));
        }
        return Ok(addr);
    }
    if one_host(get, size)? {
        return Ok(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), job_port(job)));
    }
    Err(EnvError::NoCoordinator { size })
}

/// Whether the launcher says every rank runs on this host.
fn one_host(get: &impl Fn(&str) -> Option<String>, size: usize) -> Result<bool, EnvError> {
    if positive_var(get, LOCAL_SIZE)? == Some(size)
        || positive_var(get, OMPI_LOCAL_SIZE)? == Some(size)
    {
        return Ok(true);
    }
    let nodes = match positive_var(get, SLURM_STEP_NODES)? {
        Some(n) => Some(n),
        None => positive_var(get, SLURM_NODES)?,
    };
    Ok(nodes == Some(1))
}

fn default_listen_host(coordinator: Option<SocketAddr>) -> IpAddr {
    match coordinator {
        None => Ipv4Addr::LOCALHOST.into(),
        Some(addr) if addr.ip().is_loopback() => addr.ip(),
        Some(SocketAddr::V4(_)) => Ipv4Addr::UNSPECIFIED.into(),
        Some(SocketAddr::V6(_)) => Ipv6Addr::UNSPECIFIED.into(),
    }
}

fn workers(
    get: &impl Fn(&str) -> Option<String>,
    size: usize,
    coordinator: Option<SocketAddr>,
) -> Result<usize, EnvError> {
    if let Some(n) = positive_var(get, WORKERS)? {
        return Ok(n);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Ok((cores / local_ranks(get, size, coordinator)?).max(1))
}

/// How many ranks of the job share this host, as well as the launcher tells.
fn local_ranks(
    get: &impl Fn(&str) -> Option<String>,
    size: usize,
    coordinator: Option<SocketAddr>,
) -> Result<usize, EnvError> {
    for var in [LOCAL_SIZE, OMPI_LOCAL_SIZE, SLURM_TASKS_PER_NODE] {
        if let Some(n) = positive_var(get, var)? {
            return Ok(n);
        }
    }
    if let (Some(tasks), Some(nodes)) = (
        positive_var(get, SLURM_SIZE)?,
        positive_var(get, SLURM_NODES)?,
    ) {
        return Ok(tasks.div_ceil(nodes));
    }
    Ok(match coordinator {
        Some(addr) if addr.ip().is_loopback() => size,
        _ => 1,
    })
}

fn heartbeat_and_peer_timeout(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<(Duration, Duration), EnvError> {
    let heartbeat = duration_var(get, HEARTBEAT, DEFAULT_HEARTBEAT)?;
    let peer_timeout = duration_var(get, PEER_TIMEOUT, DEFAULT_PEER_TIMEOUT)?;
    if peer_timeout <= heartbeat {
        return Err(EnvError::PeerTimeoutTooShort {
            heartbeat,
            peer_timeout,
        });
    }
    Ok((heartbeat, peer_timeout))
}

/// Splits `"64KiB"` into `("64", "KiB")`, `None` without leading digits.
fn number_and_unit(value: &str) -> Option<(u64, &str)> {
    let value = value.trim();
    let end = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let number = value[..end].parse().ok()?;
    Some((number, value[end..].trim()))
}

fn parse_duration(value: &str) -> Option<Duration> {
    let (n, unit) = number_and_unit(value)?;
    match unit {
        "" | "s" => Some(Duration::from_secs(n)),
        "ms" => Some(Duration::from_millis(n)),
        _ => None,
    }
}

fn parse_size(value: &str) -> Option<usize> {
    let (n, unit) = number_and_unit(value)?;
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        _ => return None,
    };
    usize::try_from(n.checked_mul(scale)?).ok()
}

/// A positive duration, or `default` when unset.
fn duration_var(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
    default: Duration,
) -> Result<Duration, EnvError> {
    let Some(value) = get(var) else {
        return Ok(default);
    };
    match parse_duration(&value) {
        Some(d) if !d.is_zero() => Ok(d),
        Some(_) => Err(EnvError::OutOfRange {
            var,
            value,
            allowed: "longer than 0",
        }),
        None => Err(EnvError::Invalid {
            var,
            value,
            expected: "a duration such as 250ms, 3s or 30 (seconds)",
        }),
    }
}

/// A size in bytes, or `default` when unset.
fn size_var(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
    default: usize,
) -> Result<usize, EnvError> {
    let Some(value) = get(var) else {
        return Ok(default);
    };
    parse_size(&value).ok_or(EnvError::Invalid {
        var,
        value,
        expected: "a size such as 65536, 64KiB, 1MiB or 1GiB",
    })
}

fn secret(get: &impl Fn(&str) -> Option<String>) -> Result<Secret, EnvError> {
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
    let cookie_error = |action, error| EnvError::Cookie {
        path: path.to_owned(),
        action,
        error,
    };
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(cookie_error("open", error)),
    };
    let meta = file.metadata().map_err(|e| cookie_error("inspect", e))?;
    if !meta.is_file() {
        return Err(cookie_error(
            "read",
            io::Error::other("it is not a regular file"),
        ));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(EnvError::CookieMode {
            path: path.to_owned(),
            mode,
        });
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| cookie_error("read", e))?;
    while bytes.last().is_some_and(u8::is_ascii_whitespace) {
        bytes.pop();
    }
    if bytes.is_empty() {
        return Err(EnvError::CookieEmpty {
            path: path.to_owned(),
        });
    }
    Ok(Some(Secret(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::AtomicUsize;

    fn with(vars: &[(&str, &str)]) -> Result<Settings, EnvError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_vars(|name| map.get(name).cloned())
    }

    /// A multi-rank job on loopback with a secret: the base most tests vary.
    const JOB2: [(&str, &str); 4] = [
        (RANK, "1"),
        (SIZE, "2"),
        (COORD, "127.0.0.1:7000"),
        (SECRET, "s"),
    ];

    fn job2_with(extra: &[(&'static str, &'static str)]) -> Result<Settings, EnvError> {
        let mut vars = JOB2.to_vec();
        vars.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
        vars.extend_from_slice(extra);
        with(&vars)
    }

    fn cores() -> usize {
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
    fn each_launcher_gives_rank_and_size() {
        for (launcher, rank_var, size_var) in [
            (Launcher::Gsm, RANK, SIZE),
            (Launcher::Slurm, SLURM_RANK, SLURM_SIZE),
            (Launcher::OpenMpi, OMPI_RANK, OMPI_SIZE),
            (Launcher::Pmi, PMI_RANK, PMI_SIZE),
        ] {
            let s = with(&[
                (rank_var, "2"),
                (size_var, "3"),
                (COORD, "127.0.0.1:7000"),
                (SECRET, "s"),
            ])
            .unwrap();
            assert_eq!((s.launcher, s.rank, s.size), (launcher, 2, 3));
        }
    }

    #[test]
    fn agreeing_launchers_are_fine() {
        // mpirun inside a Slurm allocation: both say rank 1 of 2; mpirun is the launcher.
        let s = with(&[
            (SLURM_RANK, "1"),
            (SLURM_SIZE, "2"),
            (OMPI_RANK, "1"),
            (OMPI_SIZE, "2"),
            (COORD, "127.0.0.1:7000"),
            (SECRET, "s"),
        ])
        .unwrap();
        assert_eq!((s.launcher, s.rank, s.size), (Launcher::OpenMpi, 1, 2));
    }

    #[test]
    fn disagreeing_launchers_are_an_error_naming_both() {
        let err = job2_with(&[(SLURM_RANK, "0"), (SLURM_SIZE, "2")]).unwrap_err();
        assert!(matches!(
            err,
            EnvError::Conflict {
                first: Launcher::Gsm,
                first_rank_size: (1, 2),
                second: Launcher::Slurm,
                second_rank_size: (0, 2),
            }
        ));
        let msg = err.to_string();
        assert!(
            msg.contains("GSM_RANK=1") && msg.contains("SLURM_PROCID=0"),
            "{msg}"
        );
        let err = job2_with(&[(PMI_RANK, "1"), (PMI_SIZE, "3")]).unwrap_err();
        assert!(err.to_string().contains("PMI_SIZE=3"), "{err}");
    }

    #[test]
    fn half_pairs_are_errors() {
        for (present, missing) in [
            (RANK, SIZE),
            (SIZE, RANK),
            (SLURM_RANK, SLURM_SIZE),
            (OMPI_SIZE, OMPI_RANK),
            (PMI_RANK, PMI_SIZE),
        ] {
            let err = with(&[(present, "1")]).unwrap_err();
            assert!(
                matches!(err, EnvError::HalfPair { present: p, missing: m } if p == present && m == missing),
                "{err}"
            );
            assert!(err.to_string().contains(missing));
        }
    }

    #[test]
    fn bad_rank_and_size_are_errors() {
        let err = job2_with(&[(RANK, "one")]).unwrap_err();
        assert!(matches!(err, EnvError::Invalid { var: RANK, .. }), "{err}");
        assert!(err.to_string().contains("GSM_RANK=\"one\""), "{err}");
        let err = job2_with(&[(SIZE, "-2")]).unwrap_err();
        assert!(matches!(err, EnvError::Invalid { var: SIZE, .. }), "{err}");
        let err = with(&[(RANK, "0"), (SIZE, "0")]).unwrap_err();
        assert!(
            matches!(err, EnvError::OutOfRange { var: SIZE, .. }),
            "{err}"
        );
        let err = job2_with(&[(RANK, "2")]).unwrap_err();
        assert!(
            matches!(
                err,
                EnvError::RankNotBelowSize {
                    launcher: Launcher::Gsm,
                    rank: 2,
                    size: 2
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("GSM_RANK=2 is not below GSM_SIZE=2")
        );
        let err = with(&[(SLURM_RANK, "5"), (SLURM_SIZE, "5")]).unwrap_err();
        assert!(err.to_string().contains("SLURM_PROCID=5"), "{err}");
    }

    #[test]
    fn coordinator_from_gsm_coord() {
        let s = job2_with(&[(COORD, "localhost:7001")]).unwrap();
        let addr = s.coordinator.unwrap();
        assert!(addr.ip().is_loopback());
        assert_eq!(addr.port(), 7001);
        assert_eq!(s.listen_host, addr.ip());
        let s = job2_with(&[(COORD, "10.1.2.3:7000")]).unwrap();
        assert_eq!(s.coordinator, Some("10.1.2.3:7000".parse().unwrap()));
        assert_eq!(s.listen_host, IpAddr::from(Ipv4Addr::UNSPECIFIED));
        let s = job2_with(&[(COORD, "[fd00::1]:7000")]).unwrap();
        assert_eq!(s.listen_host, IpAddr::from(Ipv6Addr::UNSPECIFIED));
    }

    #[test]
    fn bad_coordinators_are_errors() {
        for bad in ["no-port", "127.0.0.1:0", "127.0.0.1:99999", ""] {
            let err = job2_with(&[(COORD, bad)]).unwrap_err();
            assert!(
                matches!(err, EnvError::BadCoordinator { .. }),
                "{bad}: {err}"
            );
            assert!(err.to_string().starts_with("GSM_COORD="), "{err}");
        }
    }

    #[test]
    fn loopback_coordinator_when_all_ranks_share_a_host() {
        let base = [(RANK, "0"), (SIZE, "3"), (SECRET, "s"), (JOB, "abc")];
        for local in [
            vec![(LOCAL_SIZE, "3")],
            vec![(OMPI_LOCAL_SIZE, "3")],
            vec![(SLURM_STEP_NODES, "1")],
            vec![(SLURM_NODES, "1")],
        ] {
            let mut vars = base.to_vec();
            vars.extend(local.iter().copied());
            let s = with(&vars).unwrap();
            let addr = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), job_port(0xabc));
            assert_eq!(s.coordinator, Some(addr), "{local:?}");
            assert_eq!(s.listen_host, IpAddr::from(Ipv4Addr::LOCALHOST));
        }
        // The step's node count wins over the allocation's.
        let mut vars = base.to_vec();
        vars.extend([(SLURM_STEP_NODES, "2"), (SLURM_NODES, "1")]);
        assert!(matches!(
            with(&vars),
            Err(EnvError::NoCoordinator { size: 3 })
        ));
    }

    #[test]
    fn several_hosts_without_gsm_coord_is_an_error() {
        for extra in [
            vec![],
            vec![(LOCAL_SIZE, "2")],
            vec![(OMPI_LOCAL_SIZE, "1")],
            vec![(SLURM_NODES, "2")],
        ] {
            let mut vars = vec![(RANK, "0"), (SIZE, "3"), (SECRET, "s")];
            vars.extend(extra);
            let err = with(&vars).unwrap_err();
            assert!(matches!(err, EnvError::NoCoordinator { size: 3 }), "{err}");
            assert!(err.to_string().contains("set GSM_COORD"), "{err}");
        }
        let err = with(&[(RANK, "0"), (SIZE, "2"), (SLURM_NODES, "x")]).unwrap_err();
        assert!(
            matches!(
                err,
                EnvError::Invalid {
                    var: SLURM_NODES,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn job_port_is_stable_and_in_range() {
        // Pinned: a port that changed between builds would split one job in two.
        assert_eq!(job_port(0), 22245);
        assert_eq!(job_port(0x3fa9), 32089);
        let ports: std::collections::HashSet<u16> = (0..1000).map(job_port).collect();
        // Below Linux's default ephemeral ports (32768..61000), which other sockets take.
        assert!(ports.iter().all(|p| (20_000..32_768).contains(p)));
        assert!(
            ports.len() > 950,
            "job ports collide too often: {}",
            ports.len()
        );
    }

    #[test]
    fn job_id_from_gsm_job() {
        for (value, job) in [
            ("0", 0),
            ("3fa9", 0x3fa9),
            ("0x3FA9", 0x3fa9),
            ("ffffffffffffffff", u64::MAX),
        ] {
            assert_eq!(job2_with(&[(JOB, value)]).unwrap().job, job, "{value}");
        }
        for bad in ["", "xyz", "+1", "1ffffffffffffffff", "0x"] {
            let err = job2_with(&[(JOB, bad)]).unwrap_err();
            assert!(
                matches!(err, EnvError::Invalid { var: JOB, .. }),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn job_id_from_the_launcher() {
        assert_eq!(job2_with(&[]).unwrap().job, 0);
        let slurm = |extra: &[(&'static str, &'static str)]| {
            let mut vars = vec![
                (SLURM_RANK, "0"),
                (SLURM_SIZE, "2"),
                (SLURM_NODES, "1"),
                (SECRET, "s"),
            ];
            vars.extend_from_slice(extra);
            with(&vars).unwrap().job
        };
        let step0 = slurm(&[(SLURM_JOB, "42"), (SLURM_STEP, "0")]);
        assert_eq!(step0, fnv1a(b"slurm:42.0"));
        assert_ne!(step0, slurm(&[(SLURM_JOB, "42"), (SLURM_STEP, "1")]));
        assert_eq!(slurm(&[(SLURM_JOB, "42")]), fnv1a(b"slurm:42"));
        // GSM_JOB wins over the launcher's.
        assert_eq!(slurm(&[(SLURM_JOB, "42"), (JOB, "7")]), 7);

        let ompi = |extra: &[(&'static str, &'static str)]| {
            let mut vars = vec![
                (OMPI_RANK, "0"),
                (OMPI_SIZE, "2"),
                (OMPI_LOCAL_SIZE, "2"),
                (SECRET, "s"),
            ];
            vars.extend_from_slice(extra);
            with(&vars).unwrap().job
        };
        assert_eq!(ompi(&[(OMPI_JOB, "123")]), fnv1a(b"ompi:123"));
        assert_eq!(
            ompi(&[(OMPI_JOB, "123"), (PMIX_NAMESPACE, "prterun-h-1@1")]),
            fnv1a(b"pmix:prterun-h-1@1")
        );
        // The launcher's job id picks the loopback port.
        let s = with(&[
            (OMPI_RANK, "0"),
            (OMPI_SIZE, "2"),
            (OMPI_LOCAL_SIZE, "2"),
            (SECRET, "s"),
            (OMPI_JOB, "123"),
        ])
        .unwrap();
        assert_eq!(s.coordinator.unwrap().port(), job_port(fnv1a(b"ompi:123")));
    }

    #[test]
    fn listen_host_from_gsm_host() {
        let s = job2_with(&[(HOST, "10.0.0.5")]).unwrap();
        assert_eq!(s.listen_host, "10.0.0.5".parse::<IpAddr>().unwrap());
        let err = job2_with(&[(HOST, "my-host")]).unwrap_err();
        assert!(matches!(err, EnvError::Invalid { var: HOST, .. }), "{err}");
    }

    #[test]
    fn workers_from_gsm_workers_or_cores_per_local_rank() {
        assert_eq!(job2_with(&[(WORKERS, "3")]).unwrap().workers, 3);
        for bad in ["0", "many", "-1"] {
            let err = job2_with(&[(WORKERS, bad)]).unwrap_err();
            assert!(err.to_string().starts_with("GSM_WORKERS="), "{err}");
        }
        let per = |local: usize| (cores() / local).max(1);
        // Loopback coordinator: every rank is here.
        assert_eq!(job2_with(&[]).unwrap().workers, per(2));
        // Remote coordinator, nothing else known: this rank alone.
        assert_eq!(
            job2_with(&[(COORD, "10.0.0.1:7000")]).unwrap().workers,
            per(1)
        );
        let remote = (COORD, "10.0.0.1:7000");
        for (extra, local) in [
            (vec![(LOCAL_SIZE, "3")], 3),
            (vec![(OMPI_LOCAL_SIZE, "4")], 4),
            (vec![(SLURM_TASKS_PER_NODE, "5")], 5),
            (
                vec![(SLURM_SIZE, "2"), (SLURM_RANK, "1"), (SLURM_NODES, "2")],
                1,
            ),
            (vec![(LOCAL_SIZE, "1000000")], 1_000_000),
        ] {
            let mut vars = vec![remote];
            vars.extend(extra.iter().copied());
            assert_eq!(job2_with(&vars).unwrap().workers, per(local), "{extra:?}");
        }
        let err = job2_with(&[(SLURM_TASKS_PER_NODE, "2(x3)")]).unwrap_err();
        assert!(err.to_string().contains("SLURM_NTASKS_PER_NODE"), "{err}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("3s"), Some(Duration::from_secs(3)));
        assert_eq!(parse_duration(" 30 "), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("2 s"), Some(Duration::from_secs(2)));
        for bad in ["", "ms", "1.5s", "3m", "-1s", "99999999999999999999999"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        let s = job2_with(&[
            (CONNECT_TIMEOUT, "5"),
            (HEARTBEAT, "100ms"),
            (PEER_TIMEOUT, "1s"),
        ])
        .unwrap();
        assert_eq!(s.connect_timeout, Duration::from_secs(5));
        assert_eq!(s.heartbeat, Duration::from_millis(100));
        assert_eq!(s.peer_timeout, Duration::from_secs(1));
        for var in [CONNECT_TIMEOUT, HEARTBEAT, PEER_TIMEOUT] {
            let err = job2_with(&[(var, "soon")]).unwrap_err();
            assert!(
                matches!(err, EnvError::Invalid { var: v, .. } if v == var),
                "{err}"
            );
            assert!(err.to_string().contains("250ms, 3s or 30"), "{err}");
            let err = job2_with(&[(var, "0ms")]).unwrap_err();
            assert!(
                matches!(err, EnvError::OutOfRange { var: v, .. } if v == var),
                "{err}"
            );
        }
    }

    #[test]
    fn peer_timeout_must_exceed_heartbeat() {
        for (hb, pt) in [("3s", "3s"), ("1s", "500ms"), ("4", "3s")] {
            let err = job2_with(&[(HEARTBEAT, hb), (PEER_TIMEOUT, pt)]).unwrap_err();
            assert!(matches!(err, EnvError::PeerTimeoutTooShort { .. }), "{err}");
            assert!(
                err.to_string()
                    .contains("must be longer than GSM_HEARTBEAT")
            );
        }
        // The same check holds in a one-node rack, and in peer_timeout().
        assert!(with(&[(HEARTBEAT, "5s")]).is_err());
        let get = |name: &str| (name == PEER_TIMEOUT).then(|| "200ms".to_string());
        assert!(matches!(
            peer_timeout(get),
            Err(EnvError::PeerTimeoutTooShort { .. })
        ));
        let get = |name: &str| (name == PEER_TIMEOUT).then(|| "300ms".to_string());
        assert_eq!(peer_timeout(get).unwrap(), Duration::from_millis(300));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("65536"), Some(65536));
        assert_eq!(parse_size("64KiB"), Some(65536));
        assert_eq!(parse_size("64kib"), Some(65536));
        assert_eq!(parse_size("1MiB"), Some(1 << 20));
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("12B"), Some(12));
        for bad in ["", "KiB", "64KB", "1.5MiB", "-1", "99999999999GiB"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
        let s = job2_with(&[(FRAME, "4KiB"), (MAX_MESSAGE, "1MiB")]).unwrap();
        assert_eq!((s.frame, s.max_message), (4096, 1 << 20));
        assert_eq!(job2_with(&[(FRAME, "16MiB")]).unwrap().frame, 16 << 20);
        for bad in ["4095", "17MiB", "0"] {
            let err = job2_with(&[(FRAME, bad)]).unwrap_err();
            assert!(
                matches!(err, EnvError::OutOfRange { var: FRAME, .. }),
                "{err}"
            );
            assert!(err.to_string().contains("between 4KiB and 16MiB"));
        }
        let err = job2_with(&[(FRAME, "big")]).unwrap_err();
        assert!(matches!(err, EnvError::Invalid { var: FRAME, .. }), "{err}");
        for size in ["0", "4GiB"] {
            let err = job2_with(&[(MAX_MESSAGE, size)]).unwrap_err();
            assert!(
                matches!(
                    err,
                    EnvError::OutOfRange {
                        var: MAX_MESSAGE,
                        ..
                    }
                ),
                "{err}"
            );
        }
        let s = job2_with(&[(MAX_MESSAGE, "4294967295")]).unwrap();
        assert_eq!(s.max_message, u32::MAX as usize);
        let err = job2_with(&[(MAX_MESSAGE, "lots")]).unwrap_err();
        assert!(
            matches!(
                err,
                EnvError::Invalid {
                    var: MAX_MESSAGE,
                    ..
                }
            ),
            "{err}"
        );
    }

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

    #[test]
    fn launcher_vars_are_the_rank_pairs_of_other_launchers() {
        for launcher in [Launcher::Slurm, Launcher::OpenMpi, Launcher::Pmi] {
            let (rank, size) = launcher.rank_vars().unwrap();
            assert!(LAUNCHER_VARS.contains(&rank) && LAUNCHER_VARS.contains(&size));
        }
        assert!(!LAUNCHER_VARS.contains(&RANK));
    }
}
