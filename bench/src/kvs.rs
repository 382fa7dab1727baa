//! `kvs`: the memcached-compatible server of `apps/kvs` against Debian's `memcached`, over loopback,
//! with the load generator of [`crate::memcache`].
//!
//! Both servers run as child processes on free loopback ports with the same worker count (one per
//! core) and ample memory, memcached with its hash table pre-sized for the largest table
//! (`-o hashpower`), so neither resizes nor evicts while measured (checked with `stats`). Only the
//! server being measured runs: the other is stopped with `SIGSTOP` and resumed with `SIGCONT`. The
//! tables grow in place: for each size the keys beyond the previous size are added with pipelined
//! `set ... noreply`, then every distribution and write share is measured on that table, the two
//! servers taking turns run by run. A [`ServerProcess`] kills its server when dropped, also when the
//! experiment fails.

use std::fmt::Write as _;
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};

use crate::figure::{Figure, Panel, count, sig};
use crate::harness::Ctx;
use crate::memcache::{Client, Load};
use crate::workload::{Dist, Stream};

/// Generator threads (OS threads, each polling its connections).
const GEN_THREADS: usize = 2;
/// Connections per generator thread.
const CONNS_PER_THREAD: usize = 4;
/// Requests in flight per connection.
const DEPTH: usize = 32;
/// Memory given to each server, MB: far more than the largest table needs.
pub(crate) const MEMORY_MB: usize = 4096;
/// The latency percentiles reported, as (panel suffix, label, quantile).
const PERCENTILES: [(&str, &str, f64); 3] = [
    ("p50", "p50", 0.5),
    ("p99", "p99", 0.99),
    ("p999", "p99.9", 0.999),
];

/// The two servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `kvs` from this workspace.
    Kvs,
    /// `memcached` from `PATH`.
    Memcached,
}

/// Makes the process `cmd` starts die with the thread that starts it, so a benchmark killed by
/// a signal (no `Drop`) leaves no child behind.
pub(crate) fn die_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt as _;
        // SAFETY: the closure runs in the forked child before `exec` and only calls `prctl`,
        // which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

/// Sends `sig` to a child process of the benchmark, or fails naming it (with its log) if it has
/// already exited.
pub(crate) fn signal_child(
    child: &mut Child,
    name: &str,
    log: &std::path::Path,
    sig: libc::c_int,
) -> anyhow::Result<()> {
    if let Some(status) = child.try_wait()? {
        bail!(
            "{name} exited ({status}) during the benchmark: {}",
            std::fs::read_to_string(log).unwrap_or_default().trim()
        );
    }
    // SAFETY: `kill` has no memory-safety preconditions; the pid is our own unreaped child, so
    // it cannot have been reused.
    let r = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    ensure!(
        r == 0,
        "signalling {name}: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// A server under test running as a child process; killed (and reaped) when dropped, and on Linux
/// also when the benchmark process dies without dropping it.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
    paused: bool,
    name: String,
}

impl ServerProcess {
    /// Starts `program` with `args` and the variables `env` (which must make it listen on
    /// `addr`) and waits until it accepts connections.
    pub fn start(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        addr: SocketAddr,
    ) -> anyhow::Result<Self> {
        let log = std::env::temp_dir().join(format!(
            "gsm-bench-{}-{}-{}.log",
            name.split_whitespace().next().unwrap_or("server"),
            std::process::id(),
            addr.port()
        ));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        let mut server = ServerProcess {
            child,
            addr,
            log,
            paused: false,
            name: name.to_owned(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = server.child.try_wait()? {
                bail!(
                    "{name} exited ({status}) instead of listening on {addr}: {}\ncommand: {} {}",
                    std::fs::read_to_string(&server.log)
                        .unwrap_or_default()
                        .trim(),
                    program.display(),
                    args.join(" ")
                );
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                return Ok(server);
            }
            ensure!(
                Instant::now() < deadline,
                "{name} did not accept connections on {addr} within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&mut self, sig: libc::c_int) -> anyhow::Result<()> {
        signal_child(&mut self.child, &self.name, &self.log, sig)
    }

    /// Stops the server (`SIGSTOP`), so it takes no CPU while the other one is measured.
    pub fn pause(&mut self) -> anyhow::Result<()> {
        self.signal(libc::SIGSTOP)?;
        self.paused = true;
        Ok(())
    }

    /// Resumes a paused server (`SIGCONT`).
    pub fn resume(&mut self) -> anyhow::Result<()> {
        self.signal(libc::SIGCONT)?;
        self.paused = false;
        Ok(())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        end_child(&mut self.child, self.paused, &self.log);
    }
}

/// Kills and reaps a child of the benchmark (continuing it first if it is stopped) and removes
/// its log.
pub(crate) fn end_child(child: &mut Child, paused: bool, log: &Path) {
    if paused {
        // SAFETY: `kill` has no memory-safety preconditions and the pid is our own unreaped
        // child. A stopped process would still die of SIGKILL; this lets it do so promptly.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGCONT) };
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(log);
}

/// A free loopback port: bind port 0, note what the kernel chose, close.
pub(crate) fn free_addr() -> anyhow::Result<SocketAddr> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("finding a free port")?;
    Ok(l.local_addr()?)
}

/// The `kvs` binary built from this workspace (see [`workspace_binary`]).
pub fn kvs_binary(ctx: &Ctx) -> anyhow::Result<PathBuf> {
    workspace_binary(ctx, "kvs", "the kvs server")
}

/// The binary of workspace package `package` (`what` says what it is): next to the running
/// executable (or in the `release` directory of its target directory); built with cargo when
/// missing.
pub fn workspace_binary(ctx: &Ctx, package: &str, what: &str) -> anyhow::Result<PathBuf> {
    let name = format!("{package}{}", std::env::consts::EXE_SUFFIX);
    let exe = std::env::current_exe().context("locating the running executable")?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let target = dir.parent().map(Path::to_path_buf).unwrap_or_default();
    let release = target.join("release").join(&name);
    for p in [dir.join(&name), release.clone()] {
        if p.is_file() {
            return Ok(p);
        }
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    ctx.println(format!(
        "{package}: {} not found; building it with `cargo build --release -p {package}`",
        release.display()
    ));
    let ok = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .args(["build", "--release", "-p", package, "--manifest-path"])
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", &target)
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ensure!(
        ok && release.is_file(),
        "the {what} binary is missing ({}): build it with `cargo build --release -p {package}` \
         (the benchmark runs the {package} built next to itself)",
        release.display()
    );
    Ok(release)
}

/// `memcached` from `PATH`.
pub fn memcached_binary() -> anyhow::Result<PathBuf> {
    in_path("memcached").context(
        "memcached is not installed (not found in PATH): install it with \
         `apt-get install memcached` (the benchmark compares kvs against it)",
    )
}

/// `program` in one of the directories of `PATH`.
pub(crate) fn in_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// First line of `program --version`-style output, for the notes.
/// How a figure names a binary: relative to the workspace when it was built here (result files
/// should not carry one machine's directories), as found otherwise.
pub(crate) fn shown(program: &Path) -> String {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("/"));
    program
        .strip_prefix(workspace)
        .unwrap_or(program)
        .display()
        .to_string()
}

pub(crate) fn version(program: &Path, flag: &str) -> String {
    Command::new(program)
        .arg(flag)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown version".to_owned())
}

/// Name of the second kvs configuration measured: every shard on one trustee.
pub(crate) const KVS_ONE_TRUSTEE: &str = "kvs --shards 1";

/// The servers of the kvs figures, as (kind, binary, name, options beyond the common ones): kvs
/// as configured by default (one shard per worker, each worker a trustee), kvs with all of its
/// table on one trustee (the other worker only does I/O and forwards), and memcached.
pub(crate) fn systems<'a>(
    kvs: &'a Path,
    memcached: &'a Path,
    memcached_name: &str,
) -> [(Kind, &'a Path, String, &'static [&'static str]); 3] {
    [
        (Kind::Kvs, kvs, "kvs".to_owned(), &[]),
        (
            Kind::Kvs,
            kvs,
            KVS_ONE_TRUSTEE.to_owned(),
            &["--shards", "1"],
        ),
        (Kind::Memcached, memcached, memcached_name.to_owned(), &[]),
    ]
}

/// memcached's `-o hashpower`: a table of 2^p buckets never expands below 1.5 · 2^p items.
pub(crate) fn hashpower(keys: usize) -> u32 {
    (keys.next_power_of_two().trailing_zeros()).clamp(16, 32)
}

/// One server under test with its generator connections and table so far.
pub(crate) struct Sut {
    pub(crate) kind: Kind,
    pub(crate) name: String,
    pub(crate) process: ServerProcess,
    client: Client,
    keys: u32,
    hashpower: Option<u32>,
    prefill_secs: Vec<(usize, f64)>,
}

impl Sut {
    /// Starts a server with `threads` workers (its table sized for `max_keys`, `extra` options
    /// after the common ones) and connects the pipelined generator's connections.
    pub(crate) fn start(
        kind: Kind,
        program: &Path,
        name: &str,
        extra: &[&str],
        threads: usize,
        max_keys: usize,
    ) -> anyhow::Result<Self> {
        let addr = free_addr()?;
        let mut args: Vec<String> = [
            "-t",
            &threads.to_string(),
            "-m",
            &MEMORY_MB.to_string(),
            "-c",
            "1024",
            "-U",
            "0",
            "-l",
            "127.0.0.1",
            "-p",
            &addr.port().to_string(),
        ]
        .map(str::to_owned)
        .to_vec();
        let mut hp = None;
        if kind == Kind::Memcached {
            let p = hashpower(max_keys);
            hp = Some(p);
            args.extend(["-o".to_owned(), format!("hashpower={p}")]);
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } == 0 {
                // memcached refuses to run as root unless told which user to be.
                args.extend(["-u".to_owned(), "root".to_owned()]);
            }
        }
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let process = ServerProcess::start(name, program, &args, &[], addr)?;
        let client = Client::connect(process.addr(), GEN_THREADS, CONNS_PER_THREAD)
            .with_context(|| format!("connecting to {name}"))?;
        Ok(Sut {
            kind,
            name: name.to_owned(),
            process,
            client,
            keys: 0,
            hashpower: hp,
            prefill_secs: Vec::new(),
        })
    }

    /// Checks with `stats` that the server holds exactly `n` items, evicted none and (memcached)
    /// kept its hash table size.
    pub(crate) fn check_table(&self, n: usize) -> anyhow::Result<()> {
        let stats = self.client.stats()?;
        let get = |k: &str| stats.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        let items: u64 = get("curr_items")
            .and_then(|v| v.parse().ok())
            .context("stats has no curr_items")?;
        ensure!(
            items == n as u64,
            "{}: holds {items} items, expected the {n} pre-filled keys",
            self.name
        );
        let evictions = get("evictions").unwrap_or("0");
        ensure!(
            evictions == "0",
            "{}: evicted {evictions} items; give it more memory (-m)",
            self.name
        );
        if let (Some(hp), Some(level)) = (self.hashpower, get("hash_power_level")) {
            ensure!(
                level == hp.to_string(),
                "{}: hash table grew from 2^{hp} to 2^{level} buckets; pre-size it larger",
                self.name
            );
        }
        Ok(())
    }

    /// Adds keys up to `n` and checks the table.
    pub(crate) fn grow(&mut self, n: usize) -> anyhow::Result<()> {
        let t = Instant::now();
        self.client
            .prefill(self.keys, n as u32)
            .with_context(|| format!("{}: pre-filling {n} keys", self.name))?;
        self.prefill_secs.push((n, t.elapsed().as_secs_f64()));
        self.keys = n as u32;
        self.check_table(n)
    }
}

fn panel_id(dist: Dist, writes: u32) -> String {
    format!("{}/{writes}%-writes", dist.name())
}

/// Runs the experiment and returns its figure.
pub fn run(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let (sizes, shares): (Vec<usize>, Vec<u32>) = if ctx.quick {
        (vec![100, 10_000], vec![5])
    } else {
        (
            vec![100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000],
            vec![1, 5, 10],
        )
    };
    let dists = [Dist::Uniform, Dist::Zipf];
    let threads = ctx.cores;
    let max_keys = *sizes.last().expect("sizes");

    let kvs_path = kvs_binary(ctx)?;
    let mc_path = memcached_binary()?;
    let kvs_version = version(&kvs_path, "-V");
    let mc_version = version(&mc_path, "-V");
    let kvs_name = "kvs".to_owned();
    let mc_name = mc_version.clone();
    let hp = hashpower(max_keys);

    let mut suts: Vec<Sut> = Vec::new();
    for (kind, path, name, extra) in systems(&kvs_path, &mc_path, &mc_name) {
        if ctx.selected(&name) {
            let mut s = Sut::start(kind, path, &name, extra, threads, max_keys)?;
            s.process.pause()?;
            suts.push(s);
        }
    }
    ensure!(
        !suts.is_empty(),
        "--only selected none of `{kvs_name}`, `{KVS_ONE_TRUSTEE}` and `{mc_name}`"
    );

    let mut fig = Figure {
        name: "kvs".into(),
        title: "kvs against memcached: throughput against table size".into(),
        notes: vec![
            format!(
                "Servers: `{kvs_version}` ({}) and `{mc_version}` ({}), each with {threads} worker threads \
                 and {MEMORY_MB} MB, on 127.0.0.1 of the same machine as the generator: \
                 `kvs -t {threads} -m {MEMORY_MB} -c 1024 -U 0 -l 127.0.0.1 -p PORT` (one shard per worker, \
                 every worker a trustee; and again with `--shards 1`, the whole table on one trustee, shown \
                 as `{KVS_ONE_TRUSTEE}`) and \
                 `memcached -t {threads} -m {MEMORY_MB} -c 1024 -U 0 -l 127.0.0.1 -p PORT -o hashpower={hp}` \
                 (hash table pre-sized for the largest table). Only the server being measured runs; the others \
                 are stopped with SIGSTOP. They take turns run by run.",
                shown(&kvs_path),
                shown(&mc_path)
            ),
            format!(
                "Generator: {GEN_THREADS} OS threads with {CONNS_PER_THREAD} connections each ({} in all), plain \
                 `std::net::TcpStream` and `poll(2)`, memcached text protocol; each connection keeps {DEPTH} \
                 requests in flight (`get`, or `set` with a reply) and sends a new one for each answer. Keys \
                 are 8 bytes, values 16; tables are pre-filled with keys 0..n (pipelined `set ... noreply`) \
                 before any measurement, and grown in place from one size to the next. Key choice is uniform \
                 or Zipf (α = 1) from a pre-drawn stream. Throughput is answers received in the window \
                 divided by the window, after a warm-up of a quarter window (at most 50 ms); latency runs \
                 from writing a request to reading its answer (HDR histogram). Generator threads and servers \
                 are left to the OS scheduler: the generator shares the {} cores with the server.",
                GEN_THREADS * CONNS_PER_THREAD,
                ctx.cores
            ),
            "Every run checks itself: each `get` must return exactly one 16-byte value written for its key \
             by the pre-fill or by a connection of this generator (the value encodes the key and the writer), \
             each `set` must answer `STORED`, any other answer (a miss, an error, a value of another key) fails \
             the benchmark; after pre-filling and after each size, `stats` must show exactly the pre-filled \
             number of items, no evictions and (memcached) an unchanged hash table size."
                .to_owned(),
        ],
        panels: Vec::new(),
        columns: shares.len(),
        extra_markdown: String::new(),
    };
    let baseline = suts
        .iter()
        .find(|s| s.kind == Kind::Memcached)
        .map(|s| s.name.clone());
    for dist in dists {
        for &w in &shares {
            let mut p = Panel::new(panel_id(dist, w), format!("{}, {w}% writes", dist.label()));
            p.x_label = "keys in the table (log)".into();
            p.y_label = "throughput, Mops/s".into();
            p.baseline = baseline.clone();
            fig.panels.push(p);
            for (suffix, label, _) in PERCENTILES {
                let mut p = Panel::new(
                    format!("{}/{suffix}", panel_id(dist, w)),
                    format!("{}, {w}% writes: {label} latency", dist.label()),
                );
                p.x_label = "keys in the table (log)".into();
                p.y_label = format!("{label} latency, µs");
                p.baseline = baseline.clone();
                p.plotted = false;
                fig.panels.push(p);
            }
        }
    }

    let warmup = (ctx.window / 4).min(Duration::from_millis(50));
    ctx.begin(
        "kvs",
        (sizes.len() * dists.len() * shares.len() * ctx.runs * suts.len()) as u64,
    );
    for &n in &sizes {
        for s in &mut suts {
            ctx.status(format!("{} prefill {}", s.name, count(n as f64)));
            s.process.resume()?;
            s.grow(n)?;
            s.process.pause()?;
        }
        for dist in dists {
            let stream = Stream::new(dist, n, 0x4B5);
            for &w in &shares {
                let id = panel_id(dist, w);
                for rep in 0..ctx.runs {
                    let order: Vec<usize> = if rep % 2 == 0 {
                        (0..suts.len()).collect()
                    } else {
                        (0..suts.len()).rev().collect()
                    };
                    for i in order {
                        let s = &mut suts[i];
                        ctx.status(format!(
                            "{} {dist} n={} writes={w}% run {}",
                            s.name,
                            count(n as f64),
                            rep + 1
                        ));
                        let load = Load {
                            stream: &stream,
                            write_percent: w,
                            depth: DEPTH,
                            warmup,
                            window: ctx.window,
                            seed: rep as u64,
                        };
                        s.process.resume()?;
                        let result = s.client.run(&load);
                        s.process.pause()?;
                        let (tally, elapsed) = result.with_context(|| {
                            format!("kvs experiment: {} {dist} keys={n} writes={w}%", s.name)
                        })?;
                        ensure!(
                            tally.ops > 0,
                            "{}: no answer in the {} ms window ({dist}, {n} keys, {w}% writes)",
                            s.name,
                            ctx.window.as_millis()
                        );
                        let x = n as f64;
                        fig.panel_mut(&id).add(
                            &s.name,
                            x,
                            tally.ops as f64 / elapsed.as_secs_f64() / 1e6,
                        );
                        for (suffix, _, q) in PERCENTILES {
                            let us = tally.hist.value_at_quantile(q) as f64 / 1e3;
                            fig.panel_mut(&format!("{id}/{suffix}")).add(&s.name, x, us);
                        }
                        ctx.tick();
                    }
                }
            }
        }
        for s in &mut suts {
            s.process.resume()?;
            let checked = s.check_table(n);
            s.process.pause()?;
            checked?;
        }
    }
    ctx.finish();
    fig.extra_markdown = summary(&fig, &suts, &shares, baseline.as_deref());
    Ok(fig)
}

/// Latency tables, pre-fill times and the goals of the issue.
fn summary(fig: &Figure, suts: &[Sut], shares: &[u32], baseline: Option<&str>) -> String {
    let mut out = String::new();
    let names: Vec<&str> = suts.iter().map(|s| s.name.as_str()).collect();
    let _ = writeln!(out, "## Latency\n");
    let _ = writeln!(
        out,
        "Median over the runs of each run's latency percentiles, µs, from writing a request to reading \
         its answer (a closed loop with {DEPTH} requests in flight per connection, so latency is mostly \
         queueing behind the pipeline). Every run's percentiles are in the CSV.\n"
    );
    for dist in [Dist::Uniform, Dist::Zipf] {
        for &w in shares {
            let id = panel_id(dist, w);
            let Some(main) = fig.panels.iter().find(|p| p.id == id) else {
                continue;
            };
            let _ = writeln!(out, "### {}, {w}% writes\n", dist.label());
            let _ = write!(out, "| keys |");
            for name in &names {
                for (_, label, _) in PERCENTILES {
                    let _ = write!(out, " {name} {label} |");
                }
            }
            let _ = writeln!(
                out,
                "\n| ---: |{}",
                " ---: |".repeat(names.len() * PERCENTILES.len())
            );
            for x in main.xs() {
                let _ = write!(out, "| {} |", count(x));
                for name in &names {
                    for (suffix, _, _) in PERCENTILES {
                        let cell = fig
                            .panels
                            .iter()
                            .find(|p| p.id == format!("{id}/{suffix}"))
                            .and_then(|p| p.series.iter().find(|s| s.system == *name))
                            .and_then(|s| s.at(x))
                            .map_or("–".to_owned(), |pt| sig(pt.median()));
                        let _ = write!(out, " {cell} |");
                    }
                }
                out.push('\n');
            }
            out.push('\n');
        }
    }
    let _ = writeln!(out, "## Pre-fill\n");
    let _ = writeln!(
        out,
        "Seconds to add the keys from the previous size to this one (pipelined `set ... noreply` on every \
         connection, then a `version` round trip on each).\n"
    );
    let _ = writeln!(out, "| keys | {} |", names.join(" | "));
    let _ = writeln!(out, "| ---: |{}", " ---: |".repeat(names.len()));
    if let Some(first) = suts.first() {
        for (i, (n, _)) in first.prefill_secs.iter().enumerate() {
            let _ = write!(out, "| {} |", count(*n as f64));
            for s in suts {
                let _ = write!(out, " {:.2} |", s.prefill_secs[i].1);
            }
            out.push('\n');
        }
    }
    out.push('\n');
    if let (Some(base), Some(kvs)) = (
        baseline,
        suts.iter()
            .find(|s| s.kind == Kind::Kvs)
            .map(|s| s.name.as_str()),
    ) {
        out.push_str(&goals(fig, kvs, base, shares));
    }
    out
}

/// The goals, reported (not asserted): kvs at least memcached's throughput at every point,
/// and at least twice it with Zipf and 5% writes.
fn goals(fig: &Figure, kvs: &str, base: &str, shares: &[u32]) -> String {
    let mut out = String::new();
    let (mut met, mut total, mut missed) = (0, 0, Vec::new());
    let mut zipf5 = Vec::new();
    for dist in [Dist::Uniform, Dist::Zipf] {
        for &w in shares {
            let Some(p) = fig.panels.iter().find(|p| p.id == panel_id(dist, w)) else {
                continue;
            };
            let (Some(a), Some(b)) = (
                p.series.iter().find(|s| s.system == kvs),
                p.series.iter().find(|s| s.system == base),
            ) else {
                continue;
            };
            for x in p.xs() {
                let (Some(pa), Some(pb)) = (a.at(x), b.at(x)) else {
                    continue;
                };
                let r = pa.median() / pb.median();
                total += 1;
                if r >= 1.0 {
                    met += 1;
                } else {
                    missed.push(format!(
                        "{} {w}% {} keys (×{})",
                        dist.name(),
                        count(x),
                        sig(r)
                    ));
                }
                if dist == Dist::Zipf && w == 5 {
                    zipf5.push((x, r));
                }
            }
        }
    }
    let _ = writeln!(out, "## Goals (reported, not asserted)\n");
    let verdict = |ok: bool| if ok { "**met**" } else { "**missed**" };
    let _ = writeln!(
        out,
        "- At least memcached's throughput at every point (median against median): {}, reached at \
         {met} of {total} points{}.",
        verdict(met == total && total > 0),
        if missed.is_empty() {
            String::new()
        } else {
            format!("; below at {}", missed.join(", "))
        }
    );
    if !zipf5.is_empty() {
        let twice = zipf5.iter().filter(|(_, r)| *r >= 2.0).count();
        let ratios: Vec<String> = zipf5
            .iter()
            .map(|(x, r)| format!("{} keys ×{}", count(*x), sig(*r)))
            .collect();
        let _ = writeln!(
            out,
            "- At least 2× memcached with Zipf (α = 1) and 5% writes: {}, reached at {twice} of {} sizes ({}).",
            verdict(twice == zipf5.len()),
            zipf5.len(),
            ratios.join(", ")
        );
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_name_workspace_binaries_relative_to_it() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        assert_eq!(
            shown(&workspace.join("target/release/kvs")),
            "target/release/kvs"
        );
        assert_eq!(shown(Path::new("/usr/bin/memcached")), "/usr/bin/memcached");
    }

    #[test]
    fn hashpower_fits_the_table() {
        assert_eq!(hashpower(100), 16);
        assert_eq!(hashpower(10_000_000), 24);
        assert!(1.5 * f64::from(1u32 << hashpower(10_000_000)) > 1e7);
    }

    #[test]
    fn a_missing_server_is_named() {
        let e = ServerProcess::start(
            "nothing",
            Path::new("/bin/false"),
            &[],
            &[],
            free_addr().unwrap(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("nothing exited"), "{e}");
    }

    /// Against a real memcached when one is installed: prefill, a short window, the checks.
    #[test]
    fn generator_against_memcached() {
        let Ok(path) = memcached_binary() else {
            eprintln!("memcached not installed; skipped");
            return;
        };
        let ctx = Ctx::new(true, 1, Duration::from_millis(20));
        let mut s = Sut::start(Kind::Memcached, &path, "memcached", &[], 2, 1000).unwrap();
        s.grow(1000).unwrap();
        let stream = Stream::new(Dist::Zipf, 1000, 1);
        let load = Load {
            stream: &stream,
            write_percent: 50,
            depth: 4,
            warmup: Duration::from_millis(5),
            window: ctx.window,
            seed: 0,
        };
        let (tally, elapsed) = s.client.run(&load).unwrap();
        assert!(tally.ops > 0 && tally.writes > 0 && elapsed > Duration::ZERO);
        let (tally, _) = s.client.run(&load).unwrap();
        assert!(tally.ops > 0);
        s.check_table(1000).unwrap();
        s.process.pause().unwrap();
        drop(s);
    }
}
