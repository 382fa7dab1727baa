//! [`Settings`]: everything read at once, and checked.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use super::error::EnvError;
use super::launcher::{
    coordinator, default_listen_host, job_id, positive_var, rank_and_size, workers,
};
use super::recovery::{Recovery, recovery};
use super::secret::{Secret, secret};
use super::state::{Durability, durability, job_name, state_dir};
use super::values::{duration_var, heartbeat_and_peer_timeout, size_var, spin_var};
use super::vars::*;

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
/// assert_eq!(s.spin, None); // an adaptive spin
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
    /// How long an idle worker checks for work before it blocks (`trust::Builder::spin`),
    /// at most [`MAX_SPIN`]; `None` (`GSM_SPIN` unset): the spin adapts, up to
    /// [`trust::DEFAULT_SPIN`].
    pub spin: Option<Duration>,
    /// Whether, and how often, the rank moves hot properties between its workers
    /// (`GSM_REBALANCE`; `trust::Builder::rebalance`): `None` (unset, `off`) for never.
    pub rebalance: Option<trust::Rebalance>,
    /// How this rank talks to the others (`GSM_TRANSPORT`).
    pub transport: TransportChoice,
    /// Bytes reserved for this node's one-sided regions (`GSM_REGION_HEAP`).
    pub region_heap: usize,
    /// The launcher that gave rank and size.
    pub launcher: Launcher,
    /// Where durable properties keep their state (`GSM_STATE_DIR`); each rank's is under
    /// `<state_dir>/<job_name>/rank-<rank>/`.
    pub state_dir: PathBuf,
    /// The name this job's durable state is kept under (`GSM_JOB_NAME`).
    pub job_name: String,
    /// When a durable call's record counts as durable (`GSM_DURABILITY`).
    pub durability: Durability,
    /// Whether failed ranks are restarted, and which life of its rank this process is.
    pub recovery: Recovery,
    /// Whether this node links with nodes of other builds (`GSM_MIXED_BUILDS`): only named
    /// calls cross between them, and both ends must allow it.
    pub mixed_builds: bool,
    /// The public keys whose code packages this node loads (`GSM_TRUSTED_KEYS`); none:
    /// loading is off.
    pub trusted_keys: Vec<[u8; 32]>,
    /// The largest code package file this node loads (`GSM_MAX_PACKAGE`).
    pub max_package: usize,
    /// The lowest version (major, minor, patch) of each package name that loads
    /// (`GSM_PACKAGE_MIN_VERSIONS`).
    pub min_versions: Vec<(String, [u32; 3])>,
    /// The banks of each link's window of requests (`GSM_AM_BANKS`): a link has at most
    /// `am_banks × am_slots` requests its peer has not run yet.
    pub am_banks: usize,
    /// The requests of one bank (`GSM_AM_SLOTS`): the peer returns a bank's credit once its
    /// last request ran.
    pub am_slots: usize,
    /// Where this rank serves its counters in Prometheus' text format (`GSM_METRICS`, with
    /// the rank added to its port); `None`: nowhere.
    pub metrics: Option<SocketAddr>,
    /// Where `gsm run` collects its ranks' counters (`GSM_STATS_DIR`); `None`: not started
    /// by `gsm run`.
    pub stats_dir: Option<PathBuf>,
    /// The token that lets `gsm top` move a hot property (`POST /move` on the counters'
    /// address): in a job `gsm run` started (`GSM_STATS_DIR` and `GSM_SECRET` set), the
    /// secret's [`Secret::control_token`]; `None` elsewhere, where moves by hand are refused.
    pub control: Option<Secret>,
}

/// `GSM_TRANSPORT`: which transport links between ranks use.
///
/// ```
/// use gossamer::env::{Settings, TransportChoice};
///
/// let s = Settings::from_vars(|name| (name == "GSM_TRANSPORT").then(|| "tcp".to_string()))?;
/// assert_eq!(s.transport, TransportChoice::Tcp);
/// assert_eq!(Settings::from_vars(|_| None)?.transport, TransportChoice::Auto);
/// assert!(Settings::from_vars(|n| (n == "GSM_TRANSPORT").then(|| "rdma".into())).is_err());
/// # Ok::<(), gossamer::env::EnvError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TransportChoice {
    /// Shared memory between ranks on the same host; between hosts, UCX where both ranks were
    /// built with it and have an RDMA device, TCP otherwise (the default).
    Auto,
    /// TCP between every pair of ranks, even on one host.
    Tcp,
    /// Shared memory between every pair of ranks; ranks on different hosts are an error.
    Shm,
    /// UCX between every pair of ranks, over whatever `UCX_TLS` lets it use (RDMA, shared
    /// memory, TCP); needs gossamer built with its `ucx` feature.
    Ucx,
}

impl std::fmt::Display for TransportChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TransportChoice::Auto => "auto",
            TransportChoice::Tcp => "tcp",
            TransportChoice::Shm => "shm",
            TransportChoice::Ucx => "ucx",
        })
    }
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
    ///     (env::SPIN, "50us"),
    /// ]);
    /// let s = Settings::from_vars(|name| vars.get(name).map(|v| v.to_string()))?;
    /// assert_eq!((s.rank, s.size, s.job, s.workers), (2, 4, 0x3fa9, 2));
    /// assert_eq!(s.coordinator, Some("127.0.0.1:7000".parse().unwrap()));
    /// assert_eq!(s.listen_host.to_string(), "127.0.0.1");
    /// assert_eq!(s.heartbeat, Duration::from_millis(100));
    /// assert_eq!(s.frame, 1 << 20);
    /// assert_eq!(s.spin, Some(Duration::from_micros(50)));
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
        let spin = spin_var(get)?;
        let rebalance = match get(REBALANCE) {
            None => None,
            Some(value) => trust::Rebalance::parse(&value).map_err(|_| EnvError::Invalid {
                var: REBALANCE,
                value: value.clone(),
                expected: "on, off or a period in milliseconds such as 100",
            })?,
        };
        let mut transport = match get(TRANSPORT).as_deref().map(str::trim) {
            None | Some("auto") => TransportChoice::Auto,
            Some("tcp") => TransportChoice::Tcp,
            Some("shm") => TransportChoice::Shm,
            Some("ucx") => TransportChoice::Ucx,
            Some(other) => {
                return Err(EnvError::Invalid {
                    var: TRANSPORT,
                    value: other.to_string(),
                    expected: "auto, tcp, shm or ucx",
                });
            }
        };
        let region_heap = size_var(get, REGION_HEAP, DEFAULT_REGION_HEAP)?;
        if !(MIN_REGION_HEAP..=MAX_REGION_HEAP).contains(&region_heap) {
            return Err(EnvError::OutOfRange {
                var: REGION_HEAP,
                value: get(REGION_HEAP).unwrap_or_default(),
                allowed: "between 1MiB and 32GiB",
            });
        }
        let workers = workers(get, size, coordinator)?;
        let state_dir = state_dir(get);
        let job_name = job_name(get)?;
        let durability = durability(get)?;
        let recovery = recovery(get, launcher, &mut transport)?;
        let mixed_builds = match get(MIXED_BUILDS).as_deref().map(str::trim) {
            None | Some("" | "0") => false,
            Some("1") => true,
            Some(other) => {
                return Err(EnvError::Invalid {
                    var: MIXED_BUILDS,
                    value: other.to_string(),
                    expected: "1 (link with nodes of other builds, by name only) or 0",
                });
            }
        };
        // Last, so that a job with a bad setting never touches the cookie file.
        let secret = if size == 1 {
            Secret::default()
        } else {
            secret(get)?
        };
        let trusted_keys = trusted_keys(get)?;
        // Unset, the default shrinks to a smaller GSM_MAX_MESSAGE; set, it must fit one.
        let max_package = size_var(get, MAX_PACKAGE, DEFAULT_MAX_PACKAGE.min(max_message))?;
        if max_package == 0 || max_package > max_message {
            return Err(EnvError::OutOfRange {
                var: MAX_PACKAGE,
                value: get(MAX_PACKAGE).unwrap_or_default(),
                allowed: "between 1 byte and GSM_MAX_MESSAGE (a package travels as a message)",
            });
        }
        let min_versions = min_versions(get)?;
        let (am_banks, am_slots) = window(get)?;
        let stats_dir = get(STATS_DIR)
            .filter(|d| !d.trim().is_empty())
            .map(PathBuf::from);
        // From the variable itself: a one-node job ignores the secret for its links.
        let control = stats_dir
            .as_ref()
            .and(get(SECRET))
            .filter(|s| !s.is_empty())
            .map(|s| Secret::new(s).control_token());
        let metrics = match (metrics(get, rank, size)?, &stats_dir) {
            // Started by gsm run: serve on loopback, so that `gsm top` can attach.
            (None, Some(_)) => Some(SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0))),
            (metrics, _) => metrics,
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
            spin,
            rebalance,
            transport,
            region_heap,
            launcher,
            state_dir,
            job_name,
            durability,
            recovery,
            mixed_builds,
            trusted_keys,
            max_package,
            min_versions,
            am_banks,
            am_slots,
            metrics,
            stats_dir,
            control,
        })
    }
}

/// `GSM_METRICS`: `HOST:PORT`, rank r serving on `PORT + r` (port 0: each rank's own choice).
///
/// ```
/// use gossamer::env::{self, Settings};
///
/// let vars = |metrics: &'static str| {
///     move |n: &str| match n {
///         env::RANK => Some("2".into()),
///         env::SIZE => Some("4".into()),
///         env::COORD => Some("127.0.0.1:7000".into()),
///         env::JOB => Some("1".into()),
///         env::SECRET => Some("s".into()),
///         env::METRICS => Some(metrics.into()),
///         _ => None,
///     }
/// };
/// let s = Settings::from_vars(vars("127.0.0.1:9100"))?;
/// assert_eq!(s.metrics, Some("127.0.0.1:9102".parse().unwrap()));
/// assert!(Settings::from_vars(vars("9100")).is_err(), "a host is needed");
/// assert!(Settings::from_vars(vars("127.0.0.1:65533")).is_err(), "rank 3's port overflows");
/// # Ok::<(), gossamer::env::EnvError>(())
/// ```
fn metrics(
    get: &impl Fn(&str) -> Option<String>,
    rank: usize,
    size: usize,
) -> Result<Option<SocketAddr>, EnvError> {
    let Some(value) = get(METRICS) else {
        return Ok(None);
    };
    let mut addr: SocketAddr = value.trim().parse().map_err(|_| EnvError::Invalid {
        var: METRICS,
        value: value.clone(),
        expected: "an address and port such as 127.0.0.1:9100 or [::1]:9100",
    })?;
    if addr.port() != 0 {
        // Checked for the last rank, so that every rank accepts or refuses alike.
        if usize::from(addr.port()) + size - 1 > usize::from(u16::MAX) {
            return Err(EnvError::OutOfRange {
                var: METRICS,
                value,
                allowed: "a port that leaves room for every rank's (rank r serves on PORT + r, at most 65535)",
            });
        }
        addr.set_port(addr.port() + rank as u16);
    }
    Ok(Some(addr))
}

/// `GSM_AM_BANKS` and `GSM_AM_SLOTS`: each at least 1, their product at most
/// [`MAX_AM_WINDOW`].
fn window(get: &impl Fn(&str) -> Option<String>) -> Result<(usize, usize), EnvError> {
    let banks = positive_var(get, AM_BANKS)?.unwrap_or(DEFAULT_AM_BANKS);
    let slots = positive_var(get, AM_SLOTS)?.unwrap_or(DEFAULT_AM_SLOTS);
    if banks.saturating_mul(slots) > MAX_AM_WINDOW {
        let var = if get(AM_SLOTS).is_some() {
            AM_SLOTS
        } else {
            AM_BANKS
        };
        return Err(EnvError::OutOfRange {
            var,
            value: get(var).unwrap_or_default(),
            allowed: "such that GSM_AM_BANKS × GSM_AM_SLOTS is at most 1048576",
        });
    }
    Ok((banks, slots))
}

/// `GSM_TRUSTED_KEYS`: 64 hex digits per key, separated by commas or spaces.
fn trusted_keys(get: &impl Fn(&str) -> Option<String>) -> Result<Vec<[u8; 32]>, EnvError> {
    let Some(text) = get(TRUSTED_KEYS) else {
        return Ok(Vec::new());
    };
    text.split([',', ' '])
        .filter(|k| !k.is_empty())
        .map(|k| {
            hex32(k).ok_or_else(|| EnvError::Invalid {
                var: TRUSTED_KEYS,
                value: k.to_string(),
                expected: "public keys of 64 hex digits each (`gsm package keygen` prints one), \
                           separated by commas",
            })
        })
        .collect()
}

/// 32 bytes from 64 hex digits.
fn hex32(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// `GSM_PACKAGE_MIN_VERSIONS`: `name=MAJOR.MINOR.PATCH`, comma-separated.
fn min_versions(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, [u32; 3])>, EnvError> {
    let Some(text) = get(PACKAGE_MIN_VERSIONS) else {
        return Ok(Vec::new());
    };
    text.split(',')
        .filter(|e| !e.trim().is_empty())
        .map(|entry| {
            let parsed = entry.split_once('=').and_then(|(name, version)| {
                let parts: Vec<u32> = version
                    .trim()
                    .split('.')
                    .map(|p| p.parse().ok())
                    .collect::<Option<_>>()?;
                let v: [u32; 3] = parts.try_into().ok()?;
                Some((name.trim().to_string(), v))
            });
            parsed.ok_or_else(|| EnvError::Invalid {
                var: PACKAGE_MIN_VERSIONS,
                value: entry.to_string(),
                expected: "name=MAJOR.MINOR.PATCH entries, comma-separated",
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::tests::job2_with;

    #[test]
    fn the_window_is_banks_times_slots_within_its_limit() {
        let s = job2_with(&[]).unwrap();
        assert_eq!(
            (s.am_banks, s.am_slots),
            (DEFAULT_AM_BANKS, DEFAULT_AM_SLOTS)
        );
        let s = job2_with(&[(AM_BANKS, "2"), (AM_SLOTS, "16")]).unwrap();
        assert_eq!((s.am_banks, s.am_slots), (2, 16));
        for (var, bad) in [(AM_BANKS, "0"), (AM_SLOTS, "many")] {
            let err = job2_with(&[(var, bad)]).unwrap_err();
            assert!(err.to_string().starts_with(var), "{err}");
        }
        let err = job2_with(&[(AM_BANKS, "1024"), (AM_SLOTS, "2048")]).unwrap_err();
        assert!(err.to_string().contains("at most 1048576"), "{err}");
        assert!(job2_with(&[(AM_BANKS, "1024"), (AM_SLOTS, "1024")]).is_ok());
    }
}
