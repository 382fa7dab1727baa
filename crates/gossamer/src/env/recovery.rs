//! The settings of recovery: whether a failed rank is restarted (`gsm run --recover`), which
//! life of its rank this process is, and how long calls wait for a restarted rank.

use std::time::Duration;

use super::TransportChoice;
use super::error::EnvError;
use super::values::duration_var;
use super::vars::*;

/// How this node takes part in recovery (see the `durable` module).
///
/// ```
/// use gossamer::env::Settings;
///
/// let s = Settings::from_vars(|_| None)?;
/// assert!(!s.recovery.recover);
/// assert_eq!(s.recovery.incarnation, 0);
/// assert_eq!(s.recovery.timeout, gossamer::env::DEFAULT_RECOVERY_TIMEOUT);
/// assert_eq!(s.recovery.session_lease, std::time::Duration::from_secs(3600));
/// // Only `gsm run --recover` can restart a rank:
/// let mpi = |n: &str| match n {
///     "OMPI_COMM_WORLD_RANK" => Some("0".into()),
///     "OMPI_COMM_WORLD_SIZE" => Some("1".into()),
///     "GSM_RECOVER" => Some("1".into()),
///     _ => None,
/// };
/// assert!(Settings::from_vars(mpi).unwrap_err().to_string().contains("gsm run --recover"));
/// # Ok::<(), gossamer::env::EnvError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    /// A failed rank other than 0 is restarted and the job goes on (`GSM_RECOVER`, set by
    /// `gsm run --recover`); otherwise a failed rank ends the job.
    pub recover: bool,
    /// Which life of this rank the process is: 0 at the start of the job, one more at each
    /// restart (`GSM_INCARNATION`).
    pub incarnation: u32,
    /// How long a durable call waits for a lost rank to come back before it fails with
    /// `CallError::Unavailable` (`GSM_RECOVERY_TIMEOUT`).
    pub timeout: Duration,
    /// Rank 0 under `gsm run --recover`: the descriptor it asks the supervisor to kill a lost
    /// rank's process on (`GSM_SUPERVISOR`).
    pub supervisor: Option<i32>,
    /// How long after a rank's life ends durable properties keep the call records of its
    /// threads (`GSM_CLIENT_LEASE`).
    pub client_lease: Duration,
    /// How long after a session's last call to a durable property the property keeps its
    /// records (`GSM_SESSION_LEASE`).
    pub session_lease: Duration,
}

/// UCX's configuration of its transports, read here only to refuse what recovery cannot use.
const UCX_TLS: &str = "UCX_TLS";

/// Whether a `UCX_TLS` names only UCX's shared-memory transports, none of which detects a
/// peer's failure (UCX 1.13).
fn shared_memory_only(tls: &str) -> bool {
    const SHARED_MEMORY: [&str; 8] = ["sm", "shm", "posix", "sysv", "cma", "knem", "xpmem", "self"];
    !tls.trim_start().starts_with('^')
        && tls
            .split(',')
            .all(|t| SHARED_MEMORY.contains(&t.trim().to_ascii_lowercase().as_str()))
}

pub(super) fn recovery(
    get: &impl Fn(&str) -> Option<String>,
    launcher: Launcher,
    transport: &mut TransportChoice,
) -> Result<Recovery, EnvError> {
    let recover = match get(RECOVER).as_deref().map(str::trim) {
        None | Some("" | "0") => false,
        Some("1") => true,
        Some(other) => {
            return Err(EnvError::Invalid {
                var: RECOVER,
                value: other.to_string(),
                expected: "1 (restart failed ranks; set by `gsm run --recover`) or 0",
            });
        }
    };
    if recover && !matches!(launcher, Launcher::Gsm | Launcher::None) {
        return Err(EnvError::Invalid {
            var: RECOVER,
            value: format!("1 under {launcher}"),
            expected: "unset: only `gsm run --recover` restarts a failed rank \
                       (mpirun and srun cannot restart one)",
        });
    }
    if recover {
        // A restarted rank rejoins over TCP or UCX: shared-memory links are set up once, at
        // the start, so `auto` (which takes shared memory on one host) means TCP.
        match transport {
            TransportChoice::Shm => {
                return Err(EnvError::Invalid {
                    var: TRANSPORT,
                    value: format!("{transport} with GSM_RECOVER=1"),
                    expected: "auto, tcp or ucx: a restarted rank rejoins over TCP or UCX",
                });
            }
            TransportChoice::Auto => *transport = TransportChoice::Tcp,
            TransportChoice::Ucx => {
                if let Some(tls) = get(UCX_TLS).filter(|tls| shared_memory_only(tls)) {
                    return Err(EnvError::Invalid {
                        var: UCX_TLS,
                        value: format!("{tls} with GSM_TRANSPORT=ucx and GSM_RECOVER=1"),
                        expected: "a list with a transport that detects a peer's failure \
                                   (tcp, or an RDMA one such as rc), which a job that recovers \
                                   lost ranks needs: UCX's shared memory cannot",
                    });
                }
            }
            TransportChoice::Tcp => {}
        }
    }
    let incarnation = match get(INCARNATION) {
        None => 0,
        Some(v) => v.trim().parse().map_err(|_| EnvError::Invalid {
            var: INCARNATION,
            value: v,
            expected: "a whole number (0 at the start of a job, one more at each restart)",
        })?,
    };
    let timeout = duration_var(get, RECOVERY_TIMEOUT, DEFAULT_RECOVERY_TIMEOUT)?;
    let supervisor = match get(SUPERVISOR) {
        None => None,
        Some(v) => Some(v.trim().parse().map_err(|_| EnvError::Invalid {
            var: SUPERVISOR,
            value: v,
            expected: "a file descriptor number (set by `gsm run --recover`)",
        })?),
    };
    Ok(Recovery {
        recover,
        incarnation,
        timeout,
        supervisor,
        client_lease: duration_var(get, CLIENT_LEASE, DEFAULT_CLIENT_LEASE)?,
        session_lease: duration_var(get, SESSION_LEASE, DEFAULT_SESSION_LEASE)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// UCX with only its shared memory cannot detect a lost peer: refused with recovery.
    #[test]
    fn recovery_over_ucx_needs_a_transport_that_detects_failure() {
        for (tls, refused) in [
            (None, false),
            (Some("tcp"), false),
            (Some("sm,tcp"), false),
            (Some("rc,sm,self"), false),
            (Some("^sm"), false),
            (Some("sm"), true),
            (Some("posix, CMA,self"), true),
        ] {
            let get = |name: &str| match name {
                RECOVER => Some("1".to_string()),
                UCX_TLS => tls.map(str::to_string),
                _ => None,
            };
            let mut transport = TransportChoice::Ucx;
            let got = recovery(&get, Launcher::None, &mut transport);
            match got {
                Ok(_) => assert!(!refused, "{tls:?} was taken"),
                Err(e) => {
                    assert!(refused, "{tls:?}: {e}");
                    assert!(e.to_string().contains("UCX_TLS"), "{e}");
                }
            }
        }
        // Without recovery, shared memory alone is UCX's business.
        let get = |name: &str| (name == UCX_TLS).then(|| "sm".to_string());
        assert!(recovery(&get, Launcher::None, &mut TransportChoice::Ucx).is_ok());
    }

    /// A restarted rank rejoins over TCP or UCX: shared memory is refused with
    /// `GSM_RECOVER=1`, and `auto` becomes TCP.
    #[test]
    fn recovery_runs_links_over_tcp_or_ucx() {
        use TransportChoice::{Auto, Shm, Tcp, Ucx};
        let get = |name: &str| (name == RECOVER).then(|| "1".to_string());
        for (choice, expected) in [
            (Shm, None),
            (Ucx, Some(Ucx)),
            (Auto, Some(Tcp)),
            (Tcp, Some(Tcp)),
        ] {
            let mut transport = choice;
            match recovery(&get, Launcher::None, &mut transport) {
                Ok(_) => assert_eq!(Some(transport), expected, "{choice}"),
                Err(e) => {
                    assert_eq!(expected, None, "{choice}: {e}");
                    assert!(
                        e.to_string()
                            .contains(&format!("{choice} with GSM_RECOVER=1")),
                        "{e}"
                    );
                }
            }
        }
    }
}
