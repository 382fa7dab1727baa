//! Hosts for multi-host tests: network namespaces joined to a switch, made and deleted with
//! `ip` (iproute2).
//!
//! ```text
//!   gsmhosts-<pid>-<tag>-h0  eth0 10.77.0.1/24 fd77::1/64 ──┐
//!   gsmhosts-<pid>-<tag>-h1  eth0 10.77.0.2/24 fd77::2/64 ──┼── p0 p1 p2 in br0,
//!   gsmhosts-<pid>-<tag>-h2  eth0 10.77.0.3/24 fd77::3/64 ──┘   in gsmhosts-<pid>-<tag>-sw
//! ```
//!
//! Every interface is made inside its namespace (the veth pairs are created in the switch
//! namespace with their other end put straight into a host), so the root namespace is never
//! changed. Names carry the test's pid, so concurrent runs do not collide; namespaces left by
//! an earlier run whose process is gone are deleted first ([`remove_leftovers`]).
//!
//! It needs root and working network namespaces. Without them a test prints a loud
//! `skipped:` line and passes, unless `GSM_REQUIRE_NETNS=1` (as in `scripts/test.sh`, which CI
//! runs as root), where it fails naming what is missing ([`required`]). `HOSTS_IP` names the
//! `ip` program to use (default `ip`).

// Each test binary that takes this module uses its own part of it.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Hosts of a topology.
pub(crate) const HOSTS: usize = 3;
/// The prefix of every namespace these tests make.
pub(crate) const PREFIX: &str = "gsmhosts-";

/// Whether tests that need network namespaces can run: `Ok(true)` when they can, `Ok(false)`
/// when they must skip (after a loud line naming `what` and why), `Err` naming what is
/// missing when `GSM_REQUIRE_NETNS=1` demands them.
pub(crate) fn required(what: &str) -> Result<bool, String> {
    remove_leftovers();
    match netns_available() {
        Ok(()) => Ok(true),
        Err(missing) if std::env::var("GSM_REQUIRE_NETNS").as_deref() == Ok("1") => Err(format!(
            "GSM_REQUIRE_NETNS=1 but network namespaces cannot be used: {missing}"
        )),
        Err(missing) => {
            println!(
                "\n*** skipped: {what} did not run: {missing}. It needs root and `ip netns` \
                 (iproute2); set GSM_REQUIRE_NETNS=1 to make this a failure. ***\n"
            );
            Ok(false)
        }
    }
}

/// The `ip` program.
pub(crate) fn ip_program() -> String {
    std::env::var("HOSTS_IP").unwrap_or_else(|_| "ip".into())
}

/// How long one `ip` command may take.
pub(crate) const IP_LIMIT: Duration = Duration::from_secs(10);

/// Runs `ip args`, at most `IP_LIMIT`; its output, or what went wrong.
pub(crate) fn ip(args: &[&str]) -> Result<String, String> {
    let command = format!("`{} {}`", ip_program(), args.join(" "));
    let mut child = Command::new(ip_program())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {command}: {e}"))?;
    let (stdout, out_reader) = collect(child.stdout.take().unwrap());
    let (stderr, err_reader) = collect(child.stderr.take().unwrap());
    let deadline = Instant::now() + IP_LIMIT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Ok(None) => {
                child.kill().ok();
                child.wait().ok();
                return Err(format!(
                    "{command} did not finish within {IP_LIMIT:?} (killed)"
                ));
            }
            Err(e) => return Err(format!("waiting for {command}: {e}")),
        }
    };
    out_reader.join().ok();
    err_reader.join().ok();
    let text = |s: Arc<Mutex<String>>| s.lock().unwrap().clone();
    if !status.success() {
        return Err(format!(
            "{command} failed ({status}): {}",
            text(stderr).trim()
        ));
    }
    Ok(text(stdout))
}

/// Whether these tests can run here; what is missing if not.
pub(crate) fn netns_available() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid != 0 {
        return Err(format!(
            "not running as root (effective uid {uid}), and making network namespaces needs root"
        ));
    }
    ip(&["-V"]).map_err(|e| format!("{e} (Debian: apt-get install iproute2)"))?;
    // The real check: the whole topology, made and deleted.
    Net::new("probe").map(drop)
}

/// The namespaces this process has made, deleted on drop.
pub(crate) struct Net {
    pub(crate) switch: String,
    pub(crate) hosts: Vec<String>,
    /// Every namespace made so far, to delete even after a half-built topology.
    made: Vec<String>,
}

impl Net {
    /// The address of host `h`.
    pub(crate) fn addr(h: usize) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(10, 77, 0, h as u8 + 1)
    }

    /// The IPv6 address of host `h`.
    pub(crate) fn addr6(h: usize) -> std::net::Ipv6Addr {
        std::net::Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, h as u16 + 1)
    }

    /// Builds the switch and the hosts; `tag` tells this topology from the others of the run.
    pub(crate) fn new(tag: &str) -> Result<Net, String> {
        let name = |part: &str| format!("{PREFIX}{}-{tag}-{part}", std::process::id());
        let mut net = Net {
            switch: name("sw"),
            hosts: (0..HOSTS).map(|h| name(&format!("h{h}"))).collect(),
            made: Vec::new(),
        };
        net.build()?;
        Ok(net)
    }

    fn build(&mut self) -> Result<(), String> {
        let sw = self.switch.clone();
        self.add_namespace(&sw)?;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        for (h, host) in self.hosts.clone().iter().enumerate() {
            self.add_namespace(host)?;
            let port = format!("p{h}");
            // Made in the switch, its other end put straight into the host.
            ip(&[
                "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                host,
            ])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &sw, "link", "set", &port, "up"])?;
            let cidr = format!("{}/24", Net::addr(h));
            ip(&["-n", host, "addr", "add", &cidr, "dev", "eth0"])?;
            // No duplicate address detection: the address is usable at once, not in a second.
            let cidr6 = format!("{}/64", Net::addr6(h));
            ip(&["-n", host, "addr", "add", &cidr6, "dev", "eth0", "nodad"])?;
            ip(&["-n", host, "link", "set", "eth0", "up"])?;
        }
        Ok(())
    }

    fn add_namespace(&mut self, ns: &str) -> Result<(), String> {
        ip(&["netns", "add", ns])?;
        self.made.push(ns.to_string());
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        Ok(())
    }

    /// Unplugs host `h`: its port on the switch goes down, so nothing more passes either way
    /// and no end of the link sees a reset or a close.
    pub(crate) fn unplug(&self, h: usize) {
        let port = format!("p{h}");
        ip(&["-n", &self.switch, "link", "set", &port, "down"])
            .unwrap_or_else(|e| panic!("unplugging host {h}: {e}"));
    }

    /// Plugs host `h` back in after [`Net::unplug`].
    pub(crate) fn plug(&self, h: usize) {
        let port = format!("p{h}");
        ip(&["-n", &self.switch, "link", "set", &port, "up"])
            .unwrap_or_else(|e| panic!("plugging host {h} back in: {e}"));
    }

    /// The processes inside namespace `ns`.
    pub(crate) fn pids(ns: &str) -> Vec<i32> {
        ip(&["netns", "pids", ns])
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.made.iter().rev() {
            // Only this test's ranks can be in its namespaces; a namespace is freed only once
            // they are gone.
            for pid in Net::pids(ns) {
                // SAFETY: kill has no memory-safety preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("hosts: could not delete namespace {ns}: {e}");
            }
        }
    }
}

/// Deletes the namespaces of earlier runs whose process is gone (killed before its guards
/// ran), so they do not pile up.
pub(crate) fn remove_leftovers() {
    let Ok(list) = ip(&["netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let Some(ns) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = ns
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            match ip(&["netns", "del", ns]) {
                Ok(_) => eprintln!("hosts: deleted namespace {ns}, left by an earlier run"),
                Err(e) => eprintln!("hosts: could not delete leftover namespace {ns}: {e}"),
            }
        }
    }
}

/// The names of the root namespace's interfaces.
pub(crate) fn root_links() -> BTreeSet<String> {
    ip(&["-o", "link", "show"])
        .expect("listing the root namespace's interfaces")
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|name| name.trim().split('@').next().unwrap_or("").to_string())
        .collect()
}

pub(crate) fn collect(
    mut from: impl std::io::Read + Send + 'static,
) -> (Arc<Mutex<String>>, JoinHandle<()>) {
    let text = Arc::new(Mutex::new(String::new()));
    let into = text.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            into.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    (text, reader)
}
