//! Which launcher started this process, and what it says: rank and size, job id, coordinator,
//! the ranks on this host and the workers they leave each rank.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};

use super::error::EnvError;
use super::vars::*;
use crate::hash::fnv1a;

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

/// The first rank/size pair present, checked against every other pair present.
pub(super) fn rank_and_size(
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
pub(super) fn positive_var(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
) -> Result<Option<usize>, EnvError> {
    get(var)
        .map(|value| count(var, value, "a whole number such as 4", 1))
        .transpose()
}

pub(super) fn job_id(
    get: &impl Fn(&str) -> Option<String>,
    launcher: Launcher,
) -> Result<u64, EnvError> {
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

pub(super) fn coordinator(
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

pub(super) fn default_listen_host(coordinator: Option<SocketAddr>) -> IpAddr {
    match coordinator {
        None => Ipv4Addr::LOCALHOST.into(),
        Some(addr) if addr.ip().is_loopback() => addr.ip(),
        Some(SocketAddr::V4(_)) => Ipv4Addr::UNSPECIFIED.into(),
        Some(SocketAddr::V6(_)) => Ipv6Addr::UNSPECIFIED.into(),
    }
}

pub(super) fn workers(
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

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

    use super::*;
    use crate::env::tests::*;

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
}
