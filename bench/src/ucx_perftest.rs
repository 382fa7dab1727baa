//! UCX's own benchmark, `ucx_perftest` (Debian's `ucx-utils`), as the baseline of the UCX rows
//! of `rack` and `regions`: the same UCX, over the same `UCX_TLS`, between two processes of
//! this machine pinned as the ranks are.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};

/// How long one `ucx_perftest` run may take, warm-up and connection included.
const LIMIT: Duration = Duration::from_secs(120);

/// Runs `ucx_perftest -t test` with messages of `size` bytes for `iterations` iterations (after
/// its own warm-up), over `UCX_TLS=tls`, and returns the latency at `percentile` in µs, as
/// `ucx_perftest` prints it: for its latency tests (`ucp_am_lat`, `ucp_put_lat`,
/// `ucp_get`, `ucp_add`), the time of one operation, which for the ping-pong tests is half a
/// round trip.
pub(crate) fn latency(
    test: &str,
    tls: &str,
    size: usize,
    iterations: u64,
    percentile: f64,
) -> anyhow::Result<f64> {
    let what = format!("ucx_perftest -t {test} (UCX_TLS={tls})");
    let port = crate::kvs::free_addr()?.port();
    let cpus = crate::harness::allowed_cpus();
    let args = |cmd: &mut Command, cpu: usize| {
        cmd.args(["-t", test, "-p", &port.to_string(), "-s", &size.to_string()])
            .args(["-n", &iterations.to_string(), "-R", &percentile.to_string()])
            .env("UCX_TLS", tls);
        if crate::harness::pinning() {
            cmd.args(["-c", &cpus[cpu % cpus.len()].to_string()]);
        }
    };
    let mut server = Command::new("ucx_perftest");
    args(&mut server, 0);
    let server = crate::programs::spawn_piped(&mut server)
        .with_context(|| format!("starting {what} (Debian: ucx-utils)"))?;
    // The client connects to the server's port: tried until the server listens.
    let mut tries = 0;
    let out = loop {
        std::thread::sleep(Duration::from_millis(100));
        let mut client = Command::new("ucx_perftest");
        client.arg("127.0.0.1");
        args(&mut client, 1);
        let out = crate::programs::output_within(&mut client, LIMIT)?;
        tries += 1;
        if out.status.success() || tries == 50 {
            break out;
        }
    };
    let served = crate::programs::wait_within(server, LIMIT)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !served.status.success() {
        bail!(
            "{what} failed ({}, server {}): {stdout}{}{}",
            out.status,
            served.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&served.stderr)
        );
    }
    let fin = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Final:"))
        .with_context(|| format!("{what} printed no final line: {stdout}"))?;
    let fields: Vec<&str> = fin.split_whitespace().collect();
    fields
        .get(1)
        .with_context(|| format!("{what}: a short final line `{fin}`"))?
        .parse()
        .with_context(|| format!("{what}: a final line `{fin}`"))
}
