//! The three systems of the `ycsb` experiment, each as `servers` processes of one thread on
//! 127.0.0.1 or spread over hosts in network namespaces, stopped (`SIGSTOP`) while another is
//! measured:
//!
//! * kvs as a rack job: `servers` ranks, each `kvs -t 1 --spin-us 0 -p <one port per rank>`, started with
//!   the variables `gsm run` gives its ranks (so that the benchmark holds each rank's process
//!   to stop it), links through shared memory as `gsm run` picks on one host, TCP between
//!   hosts;
//! * Redis Cluster: `servers` `redis-server --cluster-enabled yes` processes, no replicas, no
//!   persistence; the 16,384 slots split into equal contiguous ranges as `redis-cli --cluster
//!   create` splits them, assigned with `CLUSTER ADDSLOTSRANGE` and joined with `CLUSTER MEET`
//!   (redis-cli refuses to create a cluster of fewer than 3 masters, and this runs 1 and 2);
//! * memcached: `servers` independent `memcached -t 1` instances, the client hashing keys over
//!   them with ketama.

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};

use super::client::{
    Protocol, Resp, Routing, Target, VALUE_LEN, cluster_slots, ketama, resp_command,
};
use super::hosts::Hosts;
use crate::kvs::{ServerProcess, free_addr, hashpower, in_path};

/// Which system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// kvs across a rack.
    Kvs,
    /// Redis Cluster.
    Redis,
    /// memcached instances with ketama.
    Memcached,
}

/// The programs the systems run.
#[derive(Debug, Clone)]
pub struct Programs {
    /// `kvs` from this workspace.
    pub kvs: PathBuf,
    /// `redis-server`.
    pub redis: PathBuf,
    /// `memcached`.
    pub memcached: PathBuf,
}

impl Programs {
    /// Finds them: kvs beside the benchmark, the others in `PATH`.
    pub fn find(ctx: &crate::harness::Ctx) -> anyhow::Result<Programs> {
        Ok(Programs {
            kvs: crate::kvs::kvs_binary(ctx)?,
            redis: in_path("redis-server").context(
                "redis-server is not installed (not found in PATH): install it with \
                 `apt-get install redis-server` (the ycsb benchmark compares kvs with Redis Cluster)",
            )?,
            memcached: crate::kvs::memcached_binary()?,
        })
    }
}

/// One running system: its processes and how its clients reach them.
#[derive(Debug)]
pub struct System {
    /// Which.
    pub kind: Kind,
    /// Its name in the figure.
    pub name: String,
    processes: Vec<ServerProcess>,
    /// A directory of its own (Redis's cluster files), removed with it.
    scratch: Option<PathBuf>,
    /// Its servers, protocol and routing.
    pub target: Target,
}

/// Item memory per server, MB: the records' share with room for workload D's inserts and
/// each server's per-item overhead (under 200 bytes per item in all three).
fn memory_mb(records: u64, servers: usize) -> u64 {
    let per_server = records.div_ceil(servers as u64) * (VALUE_LEN as u64 + 200);
    64 + per_server * 2 / (1 << 20)
}

impl System {
    /// Starts `kind` as `servers` processes sized for `records` records, and pauses it.
    ///
    /// On `hosts`, server `i` runs on host `i mod hosts` (through `ip netns exec`); call it
    /// from [`Hosts::run_as_client`]. Otherwise every server runs on 127.0.0.1.
    pub fn start(
        kind: Kind,
        name: &str,
        programs: &Programs,
        servers: usize,
        records: u64,
        hosts: Option<&Hosts>,
    ) -> anyhow::Result<System> {
        let ip = |i: usize| -> IpAddr {
            hosts.map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |h| {
                IpAddr::V4(Hosts::addr(i % h.count()))
            })
        };
        let addrs: Vec<SocketAddr> = (0..servers)
            .map(|i| Ok(SocketAddr::new(ip(i), free_addr()?.port())))
            .collect::<anyhow::Result<_>>()?;
        let start = |i: usize,
                     label: String,
                     program: &Path,
                     mut args: Vec<String>,
                     env: &[(String, String)]| {
            match hosts {
                None => ServerProcess::start(&label, program, &args, env, addrs[i]),
                Some(h) => {
                    let host = h.host(i % h.count());
                    let exec = ["netns", "exec", &host, &program.display().to_string()];
                    args.splice(0..0, exec.map(str::to_owned));
                    ServerProcess::start(&label, Path::new("ip"), &args, env, addrs[i])
                }
            }
        };
        let mem = memory_mb(records, servers).to_string();
        let mut processes = Vec::new();
        let mut scratch = None;
        let target = match kind {
            Kind::Kvs => {
                let ports: Vec<String> = addrs.iter().map(|a| a.port().to_string()).collect();
                let coord = SocketAddr::new(ip(0), free_addr()?.port());
                let secret = format!("{:016x}", rand::random::<u64>());
                for (rank, addr) in addrs.iter().enumerate() {
                    let mut env = crate::rack::rack_env(
                        rank,
                        servers,
                        coord,
                        &secret,
                        if hosts.is_some() { "tcp" } else { "auto" },
                    );
                    if hosts.is_some() {
                        // One rank per host, listening on the host's address.
                        env.push((gossamer::env::LOCAL_SIZE.to_owned(), "1".to_owned()));
                        env.push((gossamer::env::HOST.to_owned(), addr.ip().to_string()));
                    }
                    let args: Vec<String> = [
                        "-l",
                        &addr.ip().to_string(),
                        "-p",
                        &ports.join(","),
                        "-t",
                        "1",
                        "-m",
                        &mem,
                        "-c",
                        "4096",
                        // Idle workers block at once, as Redis's and memcached's event loops
                        // do: with N single-threaded servers and the client on a few cores, a
                        // polling rank takes the core from the rank it waits for.
                        "--spin-us",
                        "0",
                    ]
                    .map(str::to_owned)
                    .to_vec();
                    processes.push(start(
                        rank,
                        format!("{name} rank {rank}"),
                        &programs.kvs,
                        args,
                        &env,
                    )?);
                }
                Target {
                    addrs: addrs.clone(),
                    protocol: Protocol::Memcached,
                    routing: Routing::Any,
                }
            }
            Kind::Redis => {
                let dir = std::env::temp_dir().join(format!(
                    "gsm-bench-ycsb-redis-{}-{}",
                    std::process::id(),
                    addrs[0].port()
                ));
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                scratch = Some(dir.clone());
                for (i, addr) in addrs.iter().enumerate() {
                    let port = addr.port().to_string();
                    let args: Vec<String> = [
                        "--port",
                        &port,
                        "--bind",
                        &addr.ip().to_string(),
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &dir.join(format!("nodes-{port}.conf")).display().to_string(),
                        "--dir",
                        &dir.display().to_string(),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--protected-mode",
                        "no",
                        "--maxclients",
                        "4096",
                    ]
                    .map(str::to_owned)
                    .to_vec();
                    processes.push(start(
                        i,
                        format!("{name} {addr}"),
                        &programs.redis,
                        args,
                        &[],
                    )?);
                }
                form_cluster(&addrs)?;
                Target {
                    addrs: addrs.clone(),
                    protocol: Protocol::Resp,
                    routing: Routing::Slots(cluster_slots(&addrs)?),
                }
            }
            Kind::Memcached => {
                for (i, addr) in addrs.iter().enumerate() {
                    let port = addr.port().to_string();
                    let mut args: Vec<String> = [
                        "-t",
                        "1",
                        "-m",
                        &mem,
                        "-c",
                        "4096",
                        "-U",
                        "0",
                        "-l",
                        &addr.ip().to_string(),
                        "-p",
                        &port,
                    ]
                    .map(str::to_owned)
                    .to_vec();
                    let hp = hashpower(records.div_ceil(servers as u64) as usize * 2);
                    args.extend(["-o".to_owned(), format!("hashpower={hp}")]);
                    // SAFETY: geteuid has no preconditions.
                    if unsafe { libc::geteuid() } == 0 {
                        // memcached refuses to run as root unless told which user to be.
                        args.extend(["-u".to_owned(), "root".to_owned()]);
                    }
                    processes.push(start(
                        i,
                        format!("{name} {addr}"),
                        &programs.memcached,
                        args,
                        &[],
                    )?);
                }
                Target {
                    addrs: addrs.clone(),
                    protocol: Protocol::Memcached,
                    routing: Routing::Ketama(ketama(&addrs)),
                }
            }
        };
        if target.protocol == Protocol::Memcached {
            wait_serving(&target.addrs)?;
        }
        let mut system = System {
            kind,
            name: name.to_owned(),
            processes,
            scratch,
            target,
        };
        system.pause()?;
        Ok(system)
    }

    /// Stops every process of the system.
    pub fn pause(&mut self) -> anyhow::Result<()> {
        self.processes.iter_mut().try_for_each(ServerProcess::pause)
    }

    /// Continues every process of the system.
    pub fn resume(&mut self) -> anyhow::Result<()> {
        self.processes
            .iter_mut()
            .try_for_each(ServerProcess::resume)
    }

    /// The CPU time all threads of all its processes have run, ns (the kernel's
    /// `/proc/PID/task/TID/schedstat`).
    pub fn cpu_ns(&self) -> anyhow::Result<u64> {
        let mut total = 0;
        for p in &self.processes {
            let dir = format!("/proc/{}/task", p.pid());
            for task in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
                let path = task?.path().join("schedstat");
                // A thread that ended since the directory was read counts no more.
                if let Ok(text) = std::fs::read_to_string(&path) {
                    total += text
                        .split_whitespace()
                        .next()
                        .and_then(|ns| ns.parse::<u64>().ok())
                        .with_context(|| format!("{}: {text:?}", path.display()))?;
                }
            }
        }
        Ok(total)
    }
}

/// Makes the Redis servers at `addrs` one cluster: equal contiguous slot ranges in order, every
/// node introduced to the first, then waits until every node reports the cluster ok.
fn form_cluster(addrs: &[SocketAddr]) -> anyhow::Result<()> {
    let n = addrs.len();
    let expect_ok = |addr: SocketAddr, args: &[&str]| -> anyhow::Result<()> {
        let answer = resp_command(addr, args)?;
        ensure!(
            answer == Resp::Text("OK".into()),
            "{addr}: {args:?} answered {answer:?}"
        );
        Ok(())
    };
    for (i, addr) in addrs.iter().enumerate() {
        let (start, end) = (16384 * i / n, 16384 * (i + 1) / n - 1);
        let range = [start.to_string(), end.to_string()];
        expect_ok(*addr, &["CLUSTER", "ADDSLOTSRANGE", &range[0], &range[1]])?;
        if i > 0 {
            let first = [addrs[0].ip().to_string(), addrs[0].port().to_string()];
            expect_ok(*addr, &["CLUSTER", "MEET", &first[0], &first[1]])?;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for addr in addrs {
        loop {
            let info = resp_command(*addr, &["CLUSTER", "INFO"])?;
            if let Resp::Text(text) = &info
                && text.contains("cluster_state:ok")
                && text.contains(&format!("cluster_known_nodes:{n}\r\n"))
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("{addr}: the cluster of {n} did not form within 30 s: {info:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

/// Waits until every memcached-protocol server at `addrs` answers `version` (a kvs rank
/// serves only once the whole rack is up).
fn wait_serving(addrs: &[SocketAddr]) -> anyhow::Result<()> {
    for addr in addrs {
        let mut s = std::net::TcpStream::connect_timeout(addr, Duration::from_secs(30))
            .with_context(|| format!("connecting to {addr}"))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        s.write_all(b"version\r\n")?;
        let mut answer = [0u8; 7];
        s.read_exact(&mut answer)
            .with_context(|| format!("{addr} did not answer `version` within 30 s"))?;
        ensure!(
            &answer == b"VERSION",
            "{addr} answered `version` with {answer:?}"
        );
    }
    Ok(())
}

impl Drop for System {
    fn drop(&mut self) {
        self.processes.clear();
        if let Some(dir) = &self.scratch {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
