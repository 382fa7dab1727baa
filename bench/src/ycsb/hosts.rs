//! Hosts in network namespaces for the `ycsb` experiment's multi-host run: a switch (a bridge
//! in a namespace of its own), `n` hosts each with one port on it (`10.78.0.1`…), and a client
//! host (`10.78.0.254`). The benchmark's own namespace is left untouched: the thread that runs
//! the measurement joins the client host ([`Hosts::run_as_client`]), so every socket it opens
//! and every server it starts (through `ip netns exec`) lives on the switch.
//!
//! Needs root and `ip` (iproute2); everything made is deleted on drop.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail, ensure};

/// A switch, its hosts and a client host.
#[derive(Debug)]
pub struct Hosts {
    prefix: String,
    hosts: usize,
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| {
            format!(
                "running `ip {}` (Debian: apt-get install iproute2)",
                args.join(" ")
            )
        })?;
    ensure!(
        out.status.success(),
        "`ip {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

impl Hosts {
    /// Builds the switch, `hosts` hosts and the client host.
    pub fn new(hosts: usize) -> anyhow::Result<Hosts> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            bail!(
                "the multi-host run needs root (network namespaces); run without it as `--only` a loopback system or as root"
            );
        }
        let made = Hosts {
            prefix: format!("gsmycsb{}", std::process::id()),
            hosts,
        };
        let sw = made.switch();
        made.namespace(&sw)?;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        for h in 0..=hosts {
            let (ns, addr) = if h == hosts {
                (made.client(), Ipv4Addr::new(10, 78, 0, 254))
            } else {
                (made.host(h), Hosts::addr(h))
            };
            made.namespace(&ns)?;
            let port = format!("p{h}");
            ip(&[
                "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &sw, "link", "set", &port, "up"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        }
        Ok(made)
    }

    fn switch(&self) -> String {
        format!("{}-sw", self.prefix)
    }

    fn client(&self) -> String {
        format!("{}-c", self.prefix)
    }

    /// The namespace of host `h`.
    pub fn host(&self, h: usize) -> String {
        format!("{}-h{h}", self.prefix)
    }

    /// The address of host `h`.
    pub fn addr(h: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 78, 0, h as u8 + 1)
    }

    /// The number of hosts.
    pub fn count(&self) -> usize {
        self.hosts
    }

    fn namespace(&self, ns: &str) -> anyhow::Result<()> {
        ip(&["netns", "add", ns])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])
    }

    /// Runs `f` on a thread of its own that has joined the client host's network namespace,
    /// and returns what it returns. Servers it starts die with that thread.
    pub fn run_as_client<T: Send>(
        &self,
        f: impl FnOnce() -> anyhow::Result<T> + Send,
    ) -> anyhow::Result<T> {
        let path = format!("/var/run/netns/{}", self.client());
        let file = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
        std::thread::scope(|s| {
            s.spawn(move || {
                use std::os::fd::AsRawFd as _;
                // SAFETY: `setns` with an open namespace file; it moves only this thread (network
                // namespaces are per thread), which then opens its sockets there.
                let joined = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                ensure!(
                    joined == 0,
                    "joining {path}: {}",
                    std::io::Error::last_os_error()
                );
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for h in 0..self.hosts {
            let _ = ip(&["netns", "del", &self.host(h)]);
        }
        let _ = ip(&["netns", "del", &self.client()]);
        let _ = ip(&["netns", "del", &self.switch()]);
    }
}
