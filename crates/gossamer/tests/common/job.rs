//! Jobs of the test binary itself: each rank is this executable again, with `GSM_*` set and
//! `RACK_SCENARIO` naming what it plays.

use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// The transport the ranks of the tests now running get (see [`on_each_transport`]): a
/// `GSM_TRANSPORT`, and for UCX the `UCX_TLS` after a slash (`ucx/sm`).
static TRANSPORT: Mutex<String> = Mutex::new(String::new());

/// The `GSM_TRANSPORT` of the tests now running.
pub(crate) fn transport() -> String {
    let spec = TRANSPORT.lock().unwrap();
    match spec.split_once('/') {
        Some((transport, _)) => transport.to_string(),
        None if spec.is_empty() => "auto".to_string(),
        None => spec.clone(),
    }
}

/// The transport of the tests now running as `GSM_TEST_TRANSPORTS` names it (`tcp`, `shm`,
/// `ucx/sm`, …); `auto` outside [`on_each_transport`].
#[allow(dead_code)]
pub(crate) fn transport_spec() -> String {
    let spec = TRANSPORT.lock().unwrap();
    if spec.is_empty() {
        "auto".to_string()
    } else {
        spec.clone()
    }
}

/// Sets the transport of the tests now running on a rank's command.
fn set_transport(cmd: &mut Command) {
    let spec = TRANSPORT.lock().unwrap().clone();
    cmd.env("GSM_TRANSPORT", transport());
    if let Some((_, tls)) = spec.split_once('/') {
        cmd.env("UCX_TLS", tls);
    }
}

/// Runs the selected tests of `tests` once on each transport, each named with it (`calls
/// [shm]`), and returns how many passed and failed. The transports are TCP and shared memory,
/// or those `GSM_TEST_TRANSPORTS` lists: `tcp`, `shm`, and `ucx/T` for UCX with `UCX_TLS=T`
/// (the test command runs `ucx/tcp` and `ucx/sm` in a step of their own).
pub(crate) fn on_each_transport(tests: &[(&str, fn())]) -> (usize, usize) {
    let filters = super::filters();
    let (mut passed, mut failed) = (0, 0);
    let listed = std::env::var("GSM_TEST_TRANSPORTS").unwrap_or_else(|_| "tcp shm".into());
    for transport in listed.split_whitespace() {
        assert!(
            matches!(transport, "tcp" | "shm") || transport.starts_with("ucx/"),
            "GSM_TEST_TRANSPORTS lists {transport}: tcp, shm or ucx/<UCX_TLS> were expected"
        );
        *TRANSPORT.lock().unwrap() = transport.to_string();
        for &(name, test) in tests {
            let name = format!("{name} [{transport}]");
            if !super::selected(&filters, &name) {
                continue;
            }
            if super::run_one(&name, test) {
                passed += 1;
            } else {
                failed += 1;
            }
        }
    }
    TRANSPORT.lock().unwrap().clear();
    (passed, failed)
}

/// Starts one job of `size` ranks of this binary playing `scenario`.
pub(crate) struct Job {
    pub(crate) children: Vec<Child>,
}

/// A loopback port free now, for a rank to bind later: below Linux's ephemeral range
/// (32768–60999), so that no outgoing connection is given it meanwhile (a port that
/// `bind(0)` handed out was, once, the local port of a rank's own connection attempt by the
/// time rank 0 bound it, and the job never formed). Only another explicit bind can take it.
pub(crate) fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Spread over 10000..32000 by process and call, so parallel test processes rarely meet.
    let start = std::process::id().wrapping_mul(7919);
    loop {
        let n = start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed).wrapping_mul(104_729));
        let port = 10_000 + (n % 22_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// The command that runs one rank of a job.
pub(crate) fn rank(
    scenario: &str,
    rank: usize,
    size: usize,
    coord: &str,
    job: &str,
    secret: &str,
) -> Command {
    rank_of(
        &std::env::current_exe().unwrap(),
        scenario,
        rank,
        size,
        coord,
        job,
        secret,
    )
}

/// [`rank`], running `program` (another build of this test, say).
pub(crate) fn rank_of(
    program: &std::path::Path,
    scenario: &str,
    rank: usize,
    size: usize,
    coord: &str,
    job: &str,
    secret: &str,
) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("RACK_SCENARIO", scenario)
        .env("GSM_RANK", rank.to_string())
        .env("GSM_SIZE", size.to_string())
        .env("GSM_COORD", coord)
        .env("GSM_JOB", job)
        .env("GSM_SECRET", secret)
        .env("GSM_WORKERS", "2")
        .env("GSM_CONNECT_TIMEOUT", "20s")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    set_transport(&mut cmd);
    cmd
}

/// A command running `program` without the launcher variables of the test's own environment
/// (for a launcher to set: `mpirun`, Slurm's), with this binary's ranks set to play `scenario`
/// on the transport of the tests now running.
pub(crate) fn bare(program: &std::path::Path, scenario: &str) -> Command {
    let mut cmd = Command::new(program);
    for (k, _) in std::env::vars() {
        let launcher = ["GSM_", "OMPI_", "SLURM_", "PMI_", "PMIX_"];
        if launcher.iter().any(|p| k.starts_with(p)) {
            cmd.env_remove(k);
        }
    }
    cmd.env("RACK_SCENARIO", scenario)
        .env("GSM_SECRET", "test-secret")
        .env("GSM_WORKERS", "2")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    set_transport(&mut cmd);
    cmd
}

pub(crate) fn start(size: usize, scenario: &str, extra: &[(&str, String)]) -> Job {
    let coord = format!("127.0.0.1:{}", free_port());
    let job = format!("{}", std::process::id() as u64 * 1000 + size as u64);
    let children = (0..size)
        .map(|r| {
            let mut cmd = rank(scenario, r, size, &coord, &job, "test-secret");
            for (k, v) in extra {
                cmd.env(k, v);
            }
            cmd.spawn().expect("start a rank")
        })
        .collect();
    Job { children }
}

/// Waits for every rank, at most `limit`; returns each one's status and output.
pub(crate) fn finish(job: Job, limit: Duration) -> Vec<(ExitStatus, String, String)> {
    super::finish(job.children, limit, "the job")
}
