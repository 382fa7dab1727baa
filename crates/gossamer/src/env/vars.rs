//! The names of the variables a node reads, by launcher, and the defaults of its settings.

use std::fmt;
use std::time::Duration;

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
/// `GSM_OBJECT_TIMEOUT`: how long opening a distributed object waits for its other members.
pub const OBJECT_TIMEOUT: &str = "GSM_OBJECT_TIMEOUT";
/// `GSM_FRAME`: the largest frame body.
pub const FRAME: &str = "GSM_FRAME";
/// `GSM_MAX_MESSAGE`: the largest argument or result of one call.
pub const MAX_MESSAGE: &str = "GSM_MAX_MESSAGE";
/// `GSM_SPIN`: how long an idle worker checks for work before it blocks; unset, the spin
/// adapts (`trust::Builder::spin`).
pub const SPIN: &str = "GSM_SPIN";
/// `GSM_REBALANCE`: `on`, `off` or a period in milliseconds: whether each rank moves hot
/// properties between its own workers (`trust::Builder::rebalance`).
pub const REBALANCE: &str = "GSM_REBALANCE";
/// `GSM_TRANSPORT`: `auto`, `tcp`, `shm` or `ucx`: how ranks talk (see `TransportChoice`).
pub const TRANSPORT: &str = "GSM_TRANSPORT";
/// `GSM_REGION_HEAP`: the bytes a node reserves for its one-sided regions.
pub const REGION_HEAP: &str = "GSM_REGION_HEAP";
/// `GSM_STATE_DIR`: where durable properties keep their state.
pub const STATE_DIR: &str = "GSM_STATE_DIR";
/// `GSM_JOB_NAME`: the name a job's durable state is kept under, the same from run to run.
pub const JOB_NAME: &str = "GSM_JOB_NAME";
/// `GSM_DURABILITY`: `sync` or `os`: when a durable call's record counts as durable.
pub const DURABILITY: &str = "GSM_DURABILITY";
/// `GSM_RECOVER`: `1` when `gsm run --recover` restarts failed ranks.
pub const RECOVER: &str = "GSM_RECOVER";
/// `GSM_INCARNATION`: which life of its rank this process is (0, then one more per restart).
pub const INCARNATION: &str = "GSM_INCARNATION";
/// `GSM_SUPERVISOR`: set by `gsm run --recover` on rank 0: the descriptor on which rank 0 asks
/// it to kill (fence) a rank it lost whose process may still run.
pub const SUPERVISOR: &str = "GSM_SUPERVISOR";
/// `GSM_RECOVERY_TIMEOUT`: how long a durable call waits for a lost rank to come back.
pub const RECOVERY_TIMEOUT: &str = "GSM_RECOVERY_TIMEOUT";
/// `GSM_CLIENT_LEASE`: how long after a rank's life ends its threads' durable call records
/// are kept.
pub const CLIENT_LEASE: &str = "GSM_CLIENT_LEASE";
/// `GSM_TRUSTED_KEYS`: the public keys (hex, comma-separated) whose code packages load.
pub const TRUSTED_KEYS: &str = "GSM_TRUSTED_KEYS";
/// `GSM_MAX_PACKAGE`: the largest code package file a node loads.
pub const MAX_PACKAGE: &str = "GSM_MAX_PACKAGE";
/// `GSM_PACKAGE_MIN_VERSIONS`: `name=MAJOR.MINOR.PATCH,…`, the lowest version of each
/// package name that loads.
pub const PACKAGE_MIN_VERSIONS: &str = "GSM_PACKAGE_MIN_VERSIONS";
/// `GSM_MIXED_BUILDS`: `1` lets this node link with nodes of other builds (named calls only).
pub const MIXED_BUILDS: &str = "GSM_MIXED_BUILDS";
/// `GSM_AM_BANKS`: the banks of a link's window of requests (the seed's M).
pub const AM_BANKS: &str = "GSM_AM_BANKS";
/// `GSM_AM_SLOTS`: the requests of one bank (the seed's N).
pub const AM_SLOTS: &str = "GSM_AM_SLOTS";
/// `GSM_METRICS`: `HOST:PORT`; rank r serves its counters in Prometheus' text format on
/// `HOST:PORT+r` (port 0: a port of the system's choice, printed on stderr, or under `gsm run`
/// written to `GSM_STATS_DIR`).
pub const METRICS: &str = "GSM_METRICS";
/// `GSM_STATS_DIR`: set by `gsm run`: the directory where each rank leaves where it serves
/// its counters (`rank-R.addr`, serving on loopback when `GSM_METRICS` is unset) and, when
/// it ends, its last counters (`rank-R.prom`), for `gsm top` and `gsm run --stats`.
pub const STATS_DIR: &str = "GSM_STATS_DIR";
/// `GSM_SESSION_LEASE`: how long a session's call records are kept after its last call.
pub const SESSION_LEASE: &str = "GSM_SESSION_LEASE";

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
/// Default of `GSM_OBJECT_TIMEOUT`.
pub const DEFAULT_OBJECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of `GSM_RECOVERY_TIMEOUT`.
pub const DEFAULT_RECOVERY_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of `GSM_CLIENT_LEASE`.
pub const DEFAULT_CLIENT_LEASE: Duration = Duration::from_secs(10);
/// Default of `GSM_SESSION_LEASE`: an hour.
pub const DEFAULT_SESSION_LEASE: Duration = Duration::from_secs(3600);
/// Default of `GSM_FRAME`: 64 KiB.
pub const DEFAULT_FRAME: usize = 64 << 10;
/// Smallest `GSM_FRAME` accepted: 4 KiB, room for a handshake.
pub const MIN_FRAME: usize = 4 << 10;
/// Largest `GSM_FRAME` accepted: 16 MiB.
pub const MAX_FRAME: usize = 16 << 20;
/// Default of `GSM_MAX_MESSAGE`: 1 GiB.
pub const DEFAULT_MAX_MESSAGE: usize = 1 << 30;
/// Default of `GSM_REGION_HEAP`: 64 MiB (address space; pages are backed once touched).
pub const DEFAULT_REGION_HEAP: usize = 64 << 20;
/// Smallest `GSM_REGION_HEAP` accepted: 1 MiB (its table takes 64 KiB).
pub const MIN_REGION_HEAP: usize = 1 << 20;
/// Largest `GSM_REGION_HEAP` accepted: 32 GiB (regions are placed by 32-bit word offsets).
pub const MAX_REGION_HEAP: usize = 32 << 30;
/// Default of `GSM_MAX_PACKAGE`: 64 MiB.
pub const DEFAULT_MAX_PACKAGE: usize = 64 << 20;
/// Default of `GSM_AM_BANKS`.
pub const DEFAULT_AM_BANKS: usize = 8;
/// Default of `GSM_AM_SLOTS`: with 8 banks, 1024 requests unrun per link at most.
pub const DEFAULT_AM_SLOTS: usize = 128;
/// Largest window (`GSM_AM_BANKS` × `GSM_AM_SLOTS`) accepted: 2^20 requests.
pub const MAX_AM_WINDOW: usize = 1 << 20;
/// Largest `GSM_SPIN` accepted: 10 ms. A spin is micro- to milliseconds; a bare number means
/// seconds, so `GSM_SPIN=20` is a mistake to report, not 20 s of burnt CPU per idle moment.
pub const MAX_SPIN: Duration = Duration::from_millis(10);

pub(super) const OMPI_RANK: &str = "OMPI_COMM_WORLD_RANK";
pub(super) const OMPI_SIZE: &str = "OMPI_COMM_WORLD_SIZE";
pub(super) const OMPI_LOCAL_SIZE: &str = "OMPI_COMM_WORLD_LOCAL_SIZE";
pub(super) const OMPI_JOB: &str = "OMPI_MCA_ess_base_jobid";
pub(super) const PMIX_NAMESPACE: &str = "PMIX_NAMESPACE";
pub(super) const SLURM_RANK: &str = "SLURM_PROCID";
pub(super) const SLURM_SIZE: &str = "SLURM_NTASKS";
pub(super) const SLURM_JOB: &str = "SLURM_JOB_ID";
pub(super) const SLURM_STEP: &str = "SLURM_STEP_ID";
pub(super) const SLURM_STEP_NODES: &str = "SLURM_STEP_NUM_NODES";
pub(super) const SLURM_NODES: &str = "SLURM_NNODES";
pub(super) const SLURM_TASKS_PER_NODE: &str = "SLURM_NTASKS_PER_NODE";
pub(super) const PMI_RANK: &str = "PMI_RANK";
pub(super) const PMI_SIZE: &str = "PMI_SIZE";
pub(super) const HOME: &str = "HOME";
pub(super) const XDG_STATE_HOME: &str = "XDG_STATE_HOME";

/// Bytes of randomness in a generated secret (before hex encoding).
pub(super) const SECRET_BYTES: usize = 32;

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
