//! Every `GSM_*` setting of a rack node, and how rank, size, coordinator and job are found.
//!
//! A rack program is one binary started once per node. Each node reads its place in the job
//! from the environment, so that `gsm run`, `srun` (Slurm) and `mpirun` (Open MPI, or any
//! PMI launcher) can all start it, and so that `./prog` with none of these runs as a one-node
//! rack: rank 0 of 1, no coordinator, no sockets, no secret. Such a rack says so in one line on
//! stderr when it starts (once per process); `GSM_RANK=0 GSM_SIZE=1` asks for one node without
//! that line.
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
//! | `GSM_OBJECT_TIMEOUT` | `10s` | how long opening a distributed object (the `objects` crate) waits for its other members to open it too, before it fails naming those missing |
//! | `GSM_FRAME` | `64KiB` | largest frame body, `4KiB` to `16MiB`; larger payloads go in chunks |
//! | `GSM_MAX_MESSAGE` | `1GiB` | largest argument or result of one call (at most 4GiB - 1); a larger one fails the call, naming its size (a durable blob is fetched in pieces of at most half of it) |
//! | `GSM_TRANSPORT` | `auto` | how two ranks talk: `auto` uses shared memory between ranks on the same host (same kernel boot, host name and network namespace) and TCP otherwise; `tcp` always TCP; `shm` shared memory, and a job whose ranks are on several hosts fails at start naming the pair (see the `transport` module) |
//! | `GSM_REGION_HEAP` | `64MiB` | bytes this node reserves for its one-sided regions (`Node::region`), `1MiB` to `32GiB`; address space only until the words are used |
//! | `GSM_STATE_DIR` | `$XDG_STATE_HOME/gossamer`, else `~/.local/state/gossamer` | where durable properties keep their state: `<dir>/<job name>/rank-<r>/` |
//! | `GSM_JOB_NAME` | the executable's file name | the name a job's durable state is kept under, the same from run to run (the job id is new each run) |
//! | `GSM_DURABILITY` | `sync` | `sync`: a durable call answers once its record is flushed to disk (one flush per commit round); `os`: once it is written to the kernel (survives `kill -9`, not a power loss) |
//! | `GSM_RECOVER` | unset | `1` (set by `gsm run --recover`): a failed rank other than 0 is restarted and the job goes on; refused under `mpirun` and `srun`, which cannot restart a rank; links use TCP |
//! | `GSM_INCARNATION` | `0` | which life of its rank this process is: `gsm run --recover` adds one at each restart, and peers refuse links from an older one |
//! | `GSM_RECOVERY_TIMEOUT` | `30s` | how long a durable call waits for a lost rank to come back before it fails with `CallError::Unavailable` |
//! | `GSM_CLIENT_LEASE` | `10s` | a durable property keeps the call records of a thread this long after the life of its rank ended (a lost or ended process), then drops them: a call of that thread arriving later fails with `CallError::Expired` |
//! | `GSM_SESSION_LEASE` | `3600s` | a durable property keeps a session's call records this long after the session's last call to it: `Session::resume` of a call older than that gets `CallError::Expired` |
//! | `GSM_MIXED_BUILDS` | unset | `1`: this node links with nodes that run another build when they set it too; only named calls (`apply_named`, `spawn_named`) and properties looked up by name (`Node::lookup`) cross between builds, and a closure call or a `Trust` sent to another build fails at the sender, saying so |
//! | `GSM_TRUSTED_KEYS` | unset | public keys (64 hex digits each, comma-separated) whose signed code packages this node loads; unset: it loads none (see `gossamer::package`) |
//! | `GSM_MAX_PACKAGE` | `64MiB`, or `GSM_MAX_MESSAGE` if smaller | the largest code package file this node loads (at most `GSM_MAX_MESSAGE`) |
//! | `GSM_PACKAGE_MIN_VERSIONS` | unset | `name=1.2.0,…`: the lowest version of each package name that loads, so that an old signed build cannot come back |
//! | `GSM_AM_BANKS`, `GSM_AM_SLOTS` | `8`, `128` | each link's window of requests, the seed's M banks × N slots: a caller holds its next request while M × N it sent are not run yet, and the peer returns a bank's credit once the last of its N requests ran (answered or not: a deferred answer holds no credit); product at most 1048576 |
//! | `GSM_METRICS` | unset (loopback, port of the system's choice, under `gsm run`) | `host:port`: rank r serves its counters (`gossamer::stats`) in Prometheus' text format on `host:port+r` (`GET /metrics`; under `gsm run` also `POST /move` with the job's control token, `gsm top`'s `m` key); port `0`: each rank's own choice, printed on stderr (under `gsm run`, written to `GSM_STATS_DIR` instead) |
//! | `GSM_STATS_DIR` | set by `gsm run` | a directory where each rank says where it serves its counters (`rank-R.addr`) and leaves its last ones when it ends (`rank-R.prom`), for `gsm top` and `gsm run --stats` |
//! | `GSM_REBALANCE` | `off` | `on` or a period in milliseconds: each rank moves hot properties between its own workers by their load (`trust::Builder::rebalance`; durable properties stay) |
//! | `GSM_SPIN` | unset: adaptive, up to `50us` | how long an idle worker checks for work (and its sockets) before it blocks, `0` to `10ms`: longer answers sooner and burns more CPU. Unset, the spin adapts: spins that pay keep 50 µs, spins that do not shorten it, and a core shared with another thread stops it for a while; set, it is fixed (`trust::Builder::spin`) |
//!
//! Durations are written `20us`, `250ms`, `3s` or `30` (seconds); sizes `65536`, `64KiB`, `1MiB` or
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

mod error;
mod launcher;
mod recovery;
mod secret;
mod settings;
mod state;
mod values;
mod vars;

pub use error::EnvError;
pub use launcher::{job_port, random_job_id};
pub use recovery::Recovery;
pub use secret::Secret;
pub(crate) use secret::{PrivateFileError, read_private};
pub use settings::{Settings, TransportChoice};
pub use state::{Durability, MAX_JOB_NAME, default_job_name, job_state_dir};
pub use values::{heartbeat_and_peer_timeout, object_timeout, peer_timeout};
pub use vars::*;

#[cfg(test)]
pub(crate) mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use std::time::Duration;

    use crate::env::*;
    use std::collections::HashMap;

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
