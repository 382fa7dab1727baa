//! `rack` — a delegated call to another process over loopback against raw TCP, tarpc and tonic.
//!
//! The operation everywhere: add `x` to a `u64` owned by a server process and return the new
//! value. For gossamer that is `t.apply_with(|c, x| { *c += x; *c }, x)` on a property of
//! another rank (`node.rs`), once with the rack's links on loopback TCP and once through shared
//! memory; the baselines are raw `std` TCP, blocking and hand-pipelined
//! (`raw.rs`), tarpc over tokio with a postcard codec (`rpc.rs`), tonic (`grpc.rs`), and, in
//! E1 and E2, Open MPI's point-to-point messages over its TCP and shared-memory transports
//! (`mpi_rack.c`, run under `mpirun` for each measurement).
//!
//! Every server and rank is a child process of this one (`child.rs`), running this executable
//! again with `--rack-role ROLE`. The baselines' clients run on a thread of this process; the
//! rack's client is its rank 0. While one system is measured, the processes of the others are
//! stopped with `SIGSTOP`; the systems take turns run by run. The load loops are in `load.rs`.
//!
//! - E1: latency with one call outstanding (p50, p99);
//! - E2: throughput against calls outstanding (1, 16, 128, 1024) on one connection;
//! - E3: p99 latency against offered load (open loop), and the highest load with p99 ≤ 1 ms;
//! - E4: all-to-all: 2–4 ranks of one worker each, 64 properties spread over them, every rank
//!   applying to random ones; gossamer against tarpc (every rank both client and server).
//! - Idle: the CPU the 4-rank rack (and the tarpc ranks) use in 10 s with nothing to do.
//! - E6: the latency of one call carrying an argument of 4 KiB to 1 MiB, gossamer through
//!   shared memory against gossamer over TCP (large values go in chunks on both).
//! - E5 (SSSP at scale 20) is not part of this figure: it is `crates/gossamer/examples/sssp.rs`.

pub(crate) mod child;
pub(crate) mod grpc;
pub(crate) mod load;
pub(crate) mod node;
pub(crate) mod raw;
pub(crate) mod rpc;

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};

use crate::figure::{Figure, Panel, XFormat, sig};
use crate::harness::Ctx;
use child::Child;
use load::{AsyncClient as _, Measured};

/// Properties of the all-to-all experiment, spread round-robin over the ranks.
pub(crate) const PROPERTIES: usize = 64;

/// Calls each rank keeps unanswered in the all-to-all experiment.
const A2A_DEPTH: u64 = 128;

/// p99 latency an open-loop load must stay within to count as sustained (E3).
const P99_GOAL_US: f64 = 1000.0;

/// p99 latency past which a system is driven no harder in E3: well past the goal, so that one
/// point disturbed by the machine (a descheduled server costs milliseconds) does not end a curve.
const P99_GIVE_UP_US: f64 = 10.0 * P99_GOAL_US;

/// How long a child may take to start, or to answer a command beyond its window.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// A small xorshift generator: the same sequence on every platform, no dependency.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Uniform in `0..n` (modulo bias is irrelevant at these `n`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Runs this process as one of the experiment's children (`--rack-role ROLE`).
pub fn role(role: &str) -> anyhow::Result<()> {
    match role {
        "raw" => raw::serve(),
        "tarpc" => rpc::serve(),
        "tonic" => grpc::serve(),
        "tarpc-rank" => rpc::rank(),
        "gossamer" => node::run(),
        "am-raw" => crate::am::raw::serve_raw(),
        _ => bail!("unknown rack role `{role}`"),
    }
}

/// The port a freshly started server printed.
fn port_of(server: &mut Child) -> anyhow::Result<SocketAddr> {
    let words = server.answer(PATIENCE)?;
    let port = words.first().context("no port")?.parse()?;
    Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
}

/// The `GSM_*` environment of rank `rank` of a rack of `size` on this machine, its links on
/// `transport`: `tcp`, `shm`, or `ucx/T` for UCX over `UCX_TLS=T`.
pub(crate) fn rack_env(
    rank: usize,
    size: usize,
    coord: SocketAddr,
    secret: &str,
    transport: &str,
) -> Vec<(String, String)> {
    let (transport, tls) = match transport.split_once('/') {
        Some((transport, tls)) => (transport, Some(tls)),
        None => (transport, None),
    };
    let ucx = tls.map(|tls| ("UCX_TLS".to_owned(), tls.to_owned()));
    [
        (gossamer::env::TRANSPORT, transport.to_owned()),
        (gossamer::env::RANK, rank.to_string()),
        (gossamer::env::SIZE, size.to_string()),
        (gossamer::env::LOCAL_SIZE, size.to_string()),
        (gossamer::env::COORD, coord.to_string()),
        (gossamer::env::SECRET, secret.to_owned()),
        (gossamer::env::WORKERS, "1".to_owned()),
        // Ranks sit stopped (SIGSTOP) while the other systems are measured: no heartbeat may
        // time out meanwhile.
        (gossamer::env::PEER_TIMEOUT, "3600s".to_owned()),
        (gossamer::env::CONNECT_TIMEOUT, "30s".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .chain(ucx)
    .collect()
}

/// Starts a rack of `size` ranks of one worker on `transport`; rank 0 first. Returns once rank 0
/// reports the rack formed.
pub(crate) fn start_rack(me: &Path, size: usize, transport: &str) -> anyhow::Result<Vec<Child>> {
    start_rack_with(me, &format!("gossamer ({transport})"), size, transport, &[])
}

/// [`start_rack`] with `env` added to every rank's environment (`GSM_DURABILITY`, say); its
/// ranks are named `label rank R/SIZE` in errors and in their log files' names.
pub(crate) fn start_rack_with(
    me: &Path,
    label: &str,
    size: usize,
    transport: &str,
    env: &[(String, String)],
) -> anyhow::Result<Vec<Child>> {
    with_fresh_port(|coord| start_rack_at(me, label, size, transport, env, coord))
}

/// Runs `start` with a free loopback port for a rack's coordinator, again with another port
/// if the first was taken before the rack's rank 0 could bind it (the port is free when
/// picked, but any process's listener, a rank's own among them, may take it meanwhile).
pub(crate) fn with_fresh_port<T>(
    mut start: impl FnMut(SocketAddr) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let mut tries = 0;
    loop {
        tries += 1;
        match start(crate::kvs::free_addr()?) {
            Err(e) if tries < 3 && format!("{e:#}").contains("Address already in use") => {}
            done => return done,
        }
    }
}

fn start_rack_at(
    me: &Path,
    label: &str,
    size: usize,
    transport: &str,
    env: &[(String, String)],
    coord: SocketAddr,
) -> anyhow::Result<Vec<Child>> {
    let secret = format!(
        "{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    );
    let mut ranks = Vec::new();
    for rank in 0..size {
        let mut vars = rack_env(rank, size, coord, &secret, transport);
        vars.extend_from_slice(env);
        ranks.push(Child::start(
            me,
            &format!("{label} rank {rank}/{size}"),
            "gossamer",
            &[],
            &vars,
        )?);
    }
    let ready = ranks[0].answer(PATIENCE).context("starting the rack")?;
    ensure!(ready == ["ready"], "rank 0 said {ready:?} instead of ready");
    for (rank, r) in ranks.iter().enumerate() {
        child::pin(r.pid(), rank)?;
    }
    Ok(ranks)
}

fn start_server(me: &Path, name: &str, role: &str) -> anyhow::Result<(Child, SocketAddr)> {
    let mut server = Child::start(me, name, role, &[], &[])?;
    let addr = port_of(&mut server).with_context(|| format!("starting {name}"))?;
    Ok((server, addr))
}

/// The transport of a gossamer system (see [`rack_env`]).
fn transport_of(name: &str) -> &'static str {
    match name {
        GOSSAMER_SHM => "shm",
        GOSSAMER_UCX_TCP => "ucx/tcp",
        GOSSAMER_UCX_SM => "ucx/sm",
        _ => "tcp",
    }
}

/// The client side of one system of E1–E3.
enum Client {
    Gossamer,
    RawBlocking(raw::RawClient),
    RawPipelined(raw::RawClient),
    Tarpc(rpc::RpcClient),
    Tonic(grpc::GrpcClient),
    /// Open MPI: each measurement is one `mpirun` of `program` with the `--mca` options
    /// `mca`, which warms up for `warmup` before it measures.
    Mpi {
        program: PathBuf,
        mca: &'static [&'static str],
        warmup: Duration,
    },
    /// UCX's `ucx_perftest -t ucp_am_lat` over `UCX_TLS=tls`: E1 only, each measurement a
    /// run of its own.
    UcxPerftest {
        tls: &'static str,
    },
}

/// One system of E1–E3: its processes and its client.
struct System {
    name: &'static str,
    procs: Vec<Child>,
    client: Client,
    /// Established connections between its client and server, counted once measured.
    connections: Option<usize>,
}

const GOSSAMER: &str = "gossamer (tcp)";
const GOSSAMER_SHM: &str = "gossamer (shm)";
const RAW_BLOCKING: &str = "raw TCP blocking";
const RAW_PIPELINED: &str = "raw TCP pipelined";
const TARPC: &str = "tarpc";
const TONIC: &str = "tonic (gRPC)";
const MPI_VADER: &str = "Open MPI (vader)";
const MPI_TCP: &str = "Open MPI (tcp)";
const GOSSAMER_UCX_TCP: &str = "gossamer (ucx tcp)";
const GOSSAMER_UCX_SM: &str = "gossamer (ucx sm)";
const UCX_AM_TCP: &str = "ucx_perftest am (tcp)";
const UCX_AM_SM: &str = "ucx_perftest am (sm)";

/// The Open MPI components of [`MPI_VADER`] and [`MPI_TCP`]: the `ob1` PML over the
/// shared-memory or the TCP BTL.
const MPI_VADER_MCA: &[&str] = &["--mca", "pml", "ob1", "--mca", "btl", "self,vader"];
const MPI_TCP_MCA: &[&str] = &["--mca", "pml", "ob1", "--mca", "btl", "self,tcp"];

/// The Open MPI program of E1 and E2, built once per content.
fn mpi_program() -> anyhow::Result<PathBuf> {
    crate::programs::build_mpi_program("mpi_rack", include_str!("mpi_rack.c")).context(
        "building the Open MPI program (mpicc, from Debian's libopenmpi-dev; run with \
         `--only gossamer` to leave Open MPI out)",
    )
}

impl System {
    fn start(me: &Path, name: &'static str, warmup: Duration) -> anyhow::Result<System> {
        let (procs, client) = match name {
            GOSSAMER | GOSSAMER_SHM | GOSSAMER_UCX_TCP | GOSSAMER_UCX_SM => {
                (start_rack(me, 2, transport_of(name))?, Client::Gossamer)
            }
            UCX_AM_TCP => (Vec::new(), Client::UcxPerftest { tls: "tcp" }),
            UCX_AM_SM => (Vec::new(), Client::UcxPerftest { tls: "sm" }),
            RAW_BLOCKING | RAW_PIPELINED => {
                let (server, addr) = start_server(me, name, "raw")?;
                let c = raw::RawClient::connect(addr)?;
                let client = if name == RAW_BLOCKING {
                    Client::RawBlocking(c)
                } else {
                    Client::RawPipelined(c)
                };
                (vec![server], client)
            }
            TARPC => {
                let (server, addr) = start_server(me, name, "tarpc")?;
                (vec![server], Client::Tarpc(rpc::RpcClient::connect(addr)?))
            }
            TONIC => {
                let (server, addr) = start_server(me, name, "tonic")?;
                (
                    vec![server],
                    Client::Tonic(grpc::GrpcClient::connect(addr)?),
                )
            }
            MPI_VADER | MPI_TCP => {
                let mca = if name == MPI_VADER {
                    MPI_VADER_MCA
                } else {
                    MPI_TCP_MCA
                };
                let program = mpi_program()?;
                (
                    Vec::new(),
                    Client::Mpi {
                        program,
                        mca,
                        warmup,
                    },
                )
            }
            _ => bail!("no system {name}"),
        };
        Ok(System {
            name,
            procs,
            client,
            connections: None,
        })
    }

    /// Open MPI's processes live for one measurement each, under `mpirun`, and so do
    /// `ucx_perftest`'s: their system calls and connections are not counted, and the programs
    /// warm up and check themselves.
    fn measures_itself(&self) -> bool {
        matches!(self.client, Client::Mpi { .. } | Client::UcxPerftest { .. })
    }

    /// E1 of `ucx_perftest -t ucp_am_lat` over `UCX_TLS=tls`: its p50 and p99 one-way
    /// latencies, doubled to round trips as the calls' are.
    #[cfg(feature = "ucx")]
    fn perftest(tls: &str, window: Duration) -> anyhow::Result<Measured> {
        // About the window's worth of iterations at the rates it runs at here.
        let per_sec = if tls == "sm" { 2_000_000.0 } else { 100_000.0 };
        let iterations = (window.as_secs_f64() * per_sec).max(1000.0) as u64;
        let p50 = crate::ucx_perftest::latency("ucp_am_lat", tls, 8, iterations, 50.0)?;
        let p99 = crate::ucx_perftest::latency("ucp_am_lat", tls, 8, iterations, 99.0)?;
        Ok(Measured {
            ops: iterations,
            secs: iterations as f64 * 2.0 * p50 / 1e6,
            p50_us: 2.0 * p50,
            p99_us: 2.0 * p99,
            offered: 0,
            calls: iterations,
        })
    }

    #[cfg(not(feature = "ucx"))]
    fn perftest(_: &str, _: Duration) -> anyhow::Result<Measured> {
        bail!("ucx_perftest rows need the bench's `ucx` feature")
    }

    /// One run of the Open MPI program keeping `depth` requests outstanding for `window`,
    /// after its warm-up.
    fn mpi(&self, depth: u64, window: Duration) -> anyhow::Result<Measured> {
        let Client::Mpi {
            program,
            mca,
            warmup,
        } = &self.client
        else {
            bail!("{} is not Open MPI", self.name);
        };
        let warmup = *warmup;
        let mut cmd = crate::programs::mpirun(2);
        cmd.args(*mca).arg(program).args([
            warmup.as_millis().to_string(),
            window.as_millis().to_string(),
            depth.to_string(),
        ]);
        let lines =
            crate::programs::ok_lines(&mut cmd, self.name, (warmup + window) * 10 + PATIENCE)?;
        let [line] = &lines[..] else {
            bail!("{} printed {lines:?}", self.name);
        };
        let [d, answered, secs, p50, p99, calls] = &line[..] else {
            bail!("{} printed `{}`", self.name, line.join(" "));
        };
        ensure!(*d == depth.to_string(), "{} ran depth {d}", self.name);
        Ok(Measured {
            ops: answered.parse()?,
            secs: secs.parse()?,
            p50_us: p50.parse()?,
            p99_us: p99.parse()?,
            offered: 0,
            calls: calls.parse()?,
        })
    }

    /// The processes whose system calls are counted: the client's and the server's.
    fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.procs.iter().map(Child::pid).collect();
        if !matches!(
            self.client,
            Client::Gossamer | Client::Mpi { .. } | Client::UcxPerftest { .. }
        ) {
            pids.push(std::process::id());
        }
        pids
    }

    fn pause(&mut self) -> anyhow::Result<()> {
        self.procs.iter_mut().try_for_each(Child::pause)
    }

    fn resume(&mut self) -> anyhow::Result<()> {
        self.procs.iter_mut().try_for_each(Child::resume)
    }

    fn rank0(&mut self, command: &str, window: Duration) -> anyhow::Result<Measured> {
        let words = self.procs[0].call(command, window + PATIENCE)?;
        Measured::parse(&words)
    }

    /// E1, or `None` if the system has no such mode.
    fn latency(&mut self, window: Duration) -> anyhow::Result<Option<Measured>> {
        Ok(Some(match &mut self.client {
            Client::Gossamer => self.rank0(&format!("lat {}", window.as_millis()), window)?,
            Client::RawBlocking(c) => c.latency(window)?,
            Client::RawPipelined(_) => return Ok(None),
            Client::Tarpc(c) => c.latency(window)?,
            Client::Tonic(c) => c.latency(window)?,
            Client::Mpi { .. } => self.mpi(1, window)?,
            Client::UcxPerftest { tls } => System::perftest(tls, window)?,
        }))
    }

    /// E2 at `depth`, or `None` if the system has no such mode.
    fn pipelined(&mut self, depth: u64, window: Duration) -> anyhow::Result<Option<Measured>> {
        Ok(Some(match &mut self.client {
            Client::Gossamer => {
                self.rank0(&format!("depth {depth} {}", window.as_millis()), window)?
            }
            Client::RawBlocking(c) if depth == 1 => {
                let mut m = c.latency(window)?;
                (m.p50_us, m.p99_us) = (0.0, 0.0);
                m
            }
            Client::RawBlocking(_) => return Ok(None),
            Client::RawPipelined(c) => c.pipelined(depth, window)?,
            Client::Tarpc(c) => c.pipelined(depth, window)?,
            Client::Tonic(c) => c.pipelined(depth, window)?,
            // The rate only, as the others'.
            Client::Mpi { .. } => Measured {
                p50_us: 0.0,
                p99_us: 0.0,
                ..self.mpi(depth, window)?
            },
            Client::UcxPerftest { .. } => return Ok(None),
        }))
    }

    /// E6 with arguments of `bytes`, or `None` if the system has no such mode (only the
    /// racks: the others would compare codecs, not transports).
    fn large(&mut self, bytes: usize, window: Duration) -> anyhow::Result<Option<Measured>> {
        Ok(match self.client {
            Client::Gossamer => {
                Some(self.rank0(&format!("big {bytes} {}", window.as_millis()), window)?)
            }
            _ => None,
        })
    }

    /// E3 at `rate` calls per second, or `None` if the system has no such mode.
    fn open(&mut self, rate: f64, window: Duration) -> anyhow::Result<Option<Measured>> {
        Ok(Some(match &mut self.client {
            Client::Gossamer => {
                self.rank0(&format!("open {rate} {}", window.as_millis()), window)?
            }
            Client::RawBlocking(_) => return Ok(None),
            Client::RawPipelined(c) => c.open(rate, window)?,
            Client::Tarpc(c) => c.open(rate, window)?,
            Client::Tonic(c) => c.open(rate, window)?,
            Client::Mpi { .. } | Client::UcxPerftest { .. } => return Ok(None),
        }))
    }

    /// The self-check: the server's counter holds exactly what the client added.
    fn check(&mut self) -> anyhow::Result<()> {
        match &mut self.client {
            Client::Gossamer => {
                self.procs[0].call("check", PATIENCE)?;
            }
            // The raw clients check every answer against the sum as they read it.
            Client::RawBlocking(_) | Client::RawPipelined(_) => {}
            Client::Tarpc(c) => c.check()?,
            Client::Tonic(c) => c.check()?,
            // The Open MPI program checks every answer against the running sum itself;
            // `ucx_perftest` checks its own.
            Client::Mpi { .. } | Client::UcxPerftest { .. } => {}
        }
        Ok(())
    }

    /// Runs `measure` once unmeasured (the warm-up) and once measured, with this system's
    /// processes resumed and the system calls of its client and server counted around the
    /// measured run; returns the run and the system calls per call. Open MPI's program warms
    /// up within its one run, and its system calls are not counted (NaN).
    fn turn(
        &mut self,
        warmup: Duration,
        window: Duration,
        mut measure: impl FnMut(&mut System, Duration) -> anyhow::Result<Option<Measured>>,
    ) -> anyhow::Result<Option<(Measured, f64)>> {
        if self.measures_itself() {
            let m = measure(self, window).with_context(|| format!("measuring {}", self.name))?;
            return Ok(m.map(|m| (m, f64::NAN)));
        }
        self.resume()?;
        let result = (|| {
            if measure(self, warmup)?.is_none() {
                return Ok(None);
            }
            let pids = self.pids();
            let counting = count_syscalls(&pids);
            let Some(m) = measure(self, window)? else {
                bail!("{} measured the warm-up but not the run", self.name);
            };
            let per_call = syscalls_per_call(counting, m.calls)?;
            if self.connections.is_none() {
                self.connections = Some(child::connections_between(&pids)?);
            }
            self.check()?;
            Ok(Some((m, per_call)))
        })();
        self.pause()?;
        result.with_context(|| format!("measuring {}", self.name))
    }
}

/// Runs the experiment.
pub fn run(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let me = ctx
        .self_exe
        .clone()
        .context("`rack` starts its servers by running this executable again: run it as `cargo run --release -p bench -- rack`")?;
    let window = ctx.window;
    let warmup = (window / 4).max(Duration::from_millis(5));
    let depths: &[u64] = if ctx.quick {
        &[1, 1024]
    } else {
        &[1, 16, 128, 1024]
    };
    let rates: Vec<f64> = if ctx.quick {
        vec![5e3]
    } else {
        (0..10).map(|i| 5e3 * f64::from(1 << i)).collect()
    };
    let rank_counts: &[usize] = if ctx.quick { &[2, 3] } else { &[2, 3, 4] };
    // E6: below a frame, a frame's worth (64 KiB, in chunks with its header), and many.
    let large_sizes: &[usize] = if ctx.quick {
        &[4096, 1 << 20]
    } else {
        &[4096, 65536, 1 << 20]
    };
    // The idle rack is measured at the largest rank count, after its E4 runs.
    let idle_window = if ctx.quick {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(10)
    };

    let mut fig = Figure {
        name: "rack".into(),
        title: "Rack: a delegated call to another process against raw TCP, tarpc and tonic".into(),
        notes: Vec::new(),
        panels: Vec::new(),
        columns: 2,
        extra_markdown: String::new(),
    };
    let mut e1 = latency_panel(RAW_BLOCKING);
    let mut e2 = throughput_panel(
        "calls outstanding (one connection, one client thread)",
        "throughput (Mops/s)",
        TARPC,
    );
    let mut e3 = Panel::new("e3-p99", "E3: p99 latency against offered load (open loop)");
    e3.x_label = "offered load (Mops/s)".into();
    e3.x_format = XFormat::Rate;
    e3.y_label = "p99 latency (µs)".into();
    e3.log_y = true;
    let mut e4 = Panel::new(
        "e4-all-to-all",
        "E4: all-to-all, 64 properties over the ranks",
    );
    e4.x_label = "ranks (one worker each)".into();
    e4.log_x = false;
    // Plain numbers on the axis (the count format rounds the ticks between 2 and 3 to "2").
    e4.x_format = XFormat::Rate;
    e4.y_label = "throughput (Mops/s)".into();
    e4.baseline = Some(TARPC.into());
    let mut e6 = Panel::new(
        "e6-large",
        "E6: latency of one call carrying a large argument",
    );
    e6.x_label = "argument (bytes)".into();
    e6.y_label = "p50 latency (µs)".into();
    e6.log_y = true;
    e6.baseline = Some(GOSSAMER.into());
    let mut sys_e1 = Panel::new("e1-syscalls", "E1: system calls per call");
    sys_e1.plotted = false;
    sys_e1.y_label = "system calls per call".into();
    let mut sys_e2 = Panel::new("e2-syscalls", "E2: system calls per call");
    sys_e2.plotted = false;
    sys_e2.y_label = "system calls per call".into();
    let mut e3_done = Panel::new("e3-completed", "E3: load completed in the window");
    e3_done.plotted = false;
    e3_done.x_format = XFormat::Rate;
    e3_done.y_label = "completed (Mops/s)".into();
    let mut sys_e4 = Panel::new("e4-syscalls", "E4: system calls per call");
    sys_e4.plotted = false;
    sys_e4.log_x = false;
    sys_e4.y_label = "system calls per call".into();
    let mut conns = Panel::new(
        "e1-connections",
        "E1–E3: TCP connections, client and server",
    );
    conns.plotted = false;
    conns.log_x = false;
    conns.x_label = "processes".into();
    conns.y_label = "connections".into();
    let mut conns_e4 = Panel::new("e4-connections", "E4: TCP connections among the ranks");
    conns_e4.plotted = false;
    conns_e4.log_x = false;
    conns_e4.x_label = "ranks".into();
    conns_e4.y_label = "connections".into();
    let mut idle = Panel::new(
        "idle-cpu",
        format!(
            "Idle: CPU the ranks use in {} s with nothing to do (% of one core, all ranks)",
            idle_window.as_secs()
        ),
    );
    idle.plotted = false;
    idle.log_x = false;
    idle.x_label = "ranks".into();
    idle.y_label = "CPU (% of one core)".into();

    let names = [
        GOSSAMER_SHM,
        GOSSAMER,
        RAW_BLOCKING,
        RAW_PIPELINED,
        TARPC,
        TONIC,
        MPI_VADER,
        MPI_TCP,
    ];
    // UCX's rows, where the bench is built with its `ucx` feature.
    let ucx: &[&str] = if cfg!(feature = "ucx") {
        &[GOSSAMER_UCX_SM, GOSSAMER_UCX_TCP, UCX_AM_SM, UCX_AM_TCP]
    } else {
        &[]
    };
    let names: Vec<&'static str> = names
        .into_iter()
        .chain(ucx.iter().copied())
        .filter(|n| ctx.selected(n))
        .collect();
    let e3_points = rates.len() * 4;
    let racks = names.iter().filter(|n| n.starts_with("gossamer")).count();
    ctx.begin(
        "rack",
        (ctx.runs * (names.len() + depths.len() * names.len() + e3_points)
            + ctx.runs * large_sizes.len() * racks
            + ctx.runs * rank_counts.len() * 3) as u64,
    );

    // E1–E3: every system started once, all but the one measured stopped.
    let mut systems = Vec::new();
    for name in &names {
        ctx.status(format!("starting {name}"));
        let mut s = System::start(&me, name, warmup)?;
        s.pause()?;
        systems.push(s);
    }

    let mut mpi_chosen = Vec::new();
    for s in &systems {
        if let Client::Mpi { program, mca, .. } = &s.client {
            ctx.status(format!("asking {} what it runs with", s.name));
            let chosen = crate::programs::components_chosen(program, 2, mca, &["1", "1", "1"])?;
            mpi_chosen.push(format!("{}: {chosen}", s.name));
        }
    }

    let e1_window = window * 2;
    for run in 0..ctx.runs {
        for s in &mut systems {
            ctx.status(format!("E1 {} run {}", s.name, run + 1));
            if let Some((m, per_call)) = s.turn(warmup, e1_window, |s, w| s.latency(w))? {
                e1.add(s.name, 50.0, m.p50_us);
                e1.add(s.name, 99.0, m.p99_us);
                sys_e1.add(s.name, 1.0, per_call);
            }
            ctx.tick();
        }
    }
    for s in &systems {
        if let Some(c) = s.connections {
            conns.add(s.name, s.pids().len() as f64, c as f64);
        }
    }

    for &depth in depths {
        for run in 0..ctx.runs {
            for s in &mut systems {
                ctx.status(format!("E2 {} depth {depth} run {}", s.name, run + 1));
                if let Some((m, per_call)) = s.turn(warmup, window, |s, w| s.pipelined(depth, w))? {
                    e2.add(s.name, depth as f64, m.rate() / 1e6);
                    sys_e2.add(s.name, depth as f64, per_call);
                }
                ctx.tick();
            }
        }
    }

    // E6: only the racks answer; the other systems are skipped without a turn.
    for &bytes in large_sizes {
        for run in 0..ctx.runs {
            for s in systems
                .iter_mut()
                .filter(|s| matches!(s.client, Client::Gossamer))
            {
                ctx.status(format!("E6 {} {bytes} B run {}", s.name, run + 1));
                if let Some((m, _)) = s.turn(warmup, window, |s, w| s.large(bytes, w))? {
                    e6.add(s.name, bytes as f64, m.p50_us);
                }
                ctx.tick();
            }
        }
    }

    // E3: each system is driven harder until it saturates or its median p99 is far past the goal.
    let mut active: Vec<bool> = systems.iter().map(|_| true).collect();
    for (k, &rate) in rates.iter().enumerate() {
        for run in 0..ctx.runs {
            for (i, s) in systems.iter_mut().enumerate() {
                if !active[i] || matches!(s.client, Client::RawBlocking(_)) {
                    continue;
                }
                ctx.status(format!(
                    "E3 {} {} kops/s run {}",
                    s.name,
                    rate / 1e3,
                    run + 1
                ));
                if let Some((m, _)) = s.turn(warmup, window, |s, w| s.open(rate, w))? {
                    e3.add(s.name, rate / 1e6, m.p99_us);
                    e3_done.add(s.name, rate / 1e6, m.rate() / 1e6);
                    if m.saturated() {
                        e3_done.flag(s.name, rate / 1e6, "saturated");
                    }
                }
                ctx.tick();
            }
        }
        for (i, s) in systems.iter().enumerate() {
            if !active[i] {
                continue;
            }
            let p99 = e3
                .series
                .iter()
                .find(|x| x.system == s.name)
                .and_then(|x| x.at(rate / 1e6))
                .map(|p| p.median());
            let done = e3_done
                .series
                .iter()
                .find(|x| x.system == s.name)
                .and_then(|x| x.at(rate / 1e6))
                .map(|p| p.median());
            if let (Some(p99), Some(done)) = (p99, done) {
                let saturated = done < 0.9 * rate / 1e6;
                if saturated {
                    e3.flag(
                        s.name,
                        rate / 1e6,
                        "saturated: under 90% of the load completed",
                    );
                }
                if saturated || p99 > P99_GIVE_UP_US {
                    active[i] = false;
                    ctx.skip((ctx.runs * (rates.len() - 1 - k)) as u64);
                }
            }
        }
    }
    drop(systems);

    // E4: a fresh set of ranks for each size.
    for &size in rank_counts {
        let mut racks = Vec::new();
        for name in [GOSSAMER_SHM, GOSSAMER] {
            if ctx.selected(name) {
                racks.push((name, start_rack(&me, size, transport_of(name))?));
            }
        }
        let mut tranks = if ctx.selected(TARPC) {
            Some(start_tarpc_ranks(&me, size)?)
        } else {
            None
        };
        for (_, r) in &mut racks {
            r.iter_mut().try_for_each(Child::pause)?;
        }
        if let Some(r) = &mut tranks {
            r.iter_mut().try_for_each(Child::pause)?;
        }
        let mut added = 0u64;
        for run in 0..ctx.runs {
            let seed = 1 + run as u64 * 1000;
            for (name, ranks) in &mut racks {
                ctx.status(format!("E4 {name} {size} ranks run {}", run + 1));
                let (rate, per_call) = a2a_gossamer(ranks, warmup, window, seed)?;
                e4.add(name, size as f64, rate / 1e6);
                sys_e4.add(name, size as f64, per_call);
                ctx.tick();
            }
            if let Some(ranks) = &mut tranks {
                ctx.status(format!("E4 tarpc {size} ranks run {}", run + 1));
                let (rate, per_call) = a2a_tarpc(ranks, warmup, window, seed, &mut added)?;
                e4.add(TARPC, size as f64, rate / 1e6);
                sys_e4.add(TARPC, size as f64, per_call);
                ctx.tick();
            }
        }
        for (name, ranks) in &racks {
            conns_e4.add(name, size as f64, connections_of(ranks)? as f64);
        }
        if let Some(ranks) = &tranks {
            conns_e4.add(TARPC, size as f64, connections_of(ranks)? as f64);
        }
        if Some(&size) == rank_counts.last() {
            let all = racks
                .iter_mut()
                .map(|(name, ranks)| (*name, ranks))
                .chain(tranks.as_mut().map(|r| (TARPC, r)));
            for (name, ranks) in all {
                ctx.status(format!("idle {name} {size} ranks"));
                let used = idle_cpu(ranks, idle_window)?;
                idle.add(name, size as f64, 100.0 * used);
            }
        }
        // The rack ends as a job does: rank 0's `main` returns when its stdin closes, and
        // every rank exits on its own.
        for (_, mut ranks) in racks {
            ranks.iter_mut().try_for_each(Child::resume)?;
            for r in ranks {
                r.finish(PATIENCE)?;
            }
        }
    }
    ctx.finish();

    fig.notes = notes(ctx, window, e1_window, warmup, &mpi_chosen);
    fig.extra_markdown = summary(
        &e1,
        &e2,
        &e3,
        &e4,
        &idle,
        &[&sys_e1, &sys_e2, &sys_e4, &conns, &conns_e4, &idle],
    );
    fig.panels = vec![
        e1, e2, e3, e4, e6, sys_e1, sys_e2, e3_done, sys_e4, conns, conns_e4, idle,
    ];
    Ok(fig)
}

/// The CPU the processes of `ranks` use over `window` while nobody calls them, in cores (1.0
/// is one core kept busy). The ranks run (they are resumed), after a settling second.
fn idle_cpu(ranks: &mut [Child], window: Duration) -> anyhow::Result<f64> {
    ranks.iter_mut().try_for_each(Child::resume)?;
    let result = (|| -> anyhow::Result<f64> {
        std::thread::sleep(Duration::from_secs(1));
        let pids: Vec<u32> = ranks.iter().map(Child::pid).collect();
        let before = child::cpu_time(&pids)?;
        std::thread::sleep(window);
        let used = child::cpu_time(&pids)? - before;
        Ok(used.as_secs_f64() / window.as_secs_f64())
    })();
    ranks.iter_mut().try_for_each(Child::pause)?;
    result.context("measuring an idle rack")
}

/// Why system calls could not be counted, the first time that happened.
static NO_SYSCALLS: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Starts counting the system calls of `pids`, or notes why it cannot.
fn count_syscalls(pids: &[u32]) -> Option<child::Syscalls> {
    match child::Syscalls::start(pids) {
        Ok(c) => Some(c),
        Err(e) => {
            let _ = NO_SYSCALLS.set(format!("{e:#}"));
            None
        }
    }
}

/// System calls per call, NaN (reported as n/a) when they could not be counted.
fn syscalls_per_call(counting: Option<child::Syscalls>, calls: u64) -> anyhow::Result<f64> {
    Ok(match counting {
        Some(c) => c.stop()? as f64 / calls.max(1) as f64,
        None => f64::NAN,
    })
}

fn connections_of(ranks: &[Child]) -> anyhow::Result<usize> {
    child::connections_between(&ranks.iter().map(Child::pid).collect::<Vec<_>>())
}

fn start_tarpc_ranks(me: &Path, size: usize) -> anyhow::Result<Vec<Child>> {
    let mut ranks = Vec::new();
    let mut ports = Vec::new();
    for rank in 0..size {
        let mut r = Child::start(
            me,
            &format!("tarpc rank {rank}/{size}"),
            "tarpc-rank",
            &[],
            &[],
        )?;
        ports.push(port_of(&mut r)?.port().to_string());
        ranks.push(r);
    }
    for (rank, r) in ranks.iter_mut().enumerate() {
        r.send(&format!("peers {rank} {size} {}", ports.join(" ")))?;
    }
    for r in &mut ranks {
        r.answer(PATIENCE)?;
    }
    Ok(ranks)
}

/// One E4 run of the rack: warm-up, then the measured run; returns calls per second (summed
/// over the ranks) and system calls per call.
fn a2a_gossamer(
    ranks: &mut [Child],
    warmup: Duration,
    window: Duration,
    seed: u64,
) -> anyhow::Result<(f64, f64)> {
    ranks.iter_mut().try_for_each(Child::resume)?;
    let result = (|| {
        let depth = A2A_DEPTH;
        ranks[0].call(
            &format!("a2a {depth} {} {seed}", warmup.as_millis()),
            warmup + PATIENCE,
        )?;
        let pids: Vec<u32> = ranks.iter().map(Child::pid).collect();
        let counting = count_syscalls(&pids);
        let words = ranks[0].call(
            &format!("a2a {depth} {} {}", window.as_millis(), seed + 500),
            window + PATIENCE,
        )?;
        ensure!(words.len() == 3, "a2a answered {words:?}");
        let rate: f64 = words[0].parse()?;
        let calls: u64 = words[2].parse()?;
        Ok((rate, syscalls_per_call(counting, calls)?))
    })();
    ranks.iter_mut().try_for_each(Child::pause)?;
    result.context("measuring gossamer all-to-all")
}

/// One E4 run of the tarpc ranks, as [`a2a_gossamer`]; `added` is the sum of every `x` sent
/// to these ranks so far, which their properties must sum to.
fn a2a_tarpc(
    ranks: &mut [Child],
    warmup: Duration,
    window: Duration,
    seed: u64,
    added: &mut u64,
) -> anyhow::Result<(f64, f64)> {
    ranks.iter_mut().try_for_each(Child::resume)?;
    let result = (|| {
        tarpc_round(ranks, warmup, seed, added)?;
        let pids: Vec<u32> = ranks.iter().map(Child::pid).collect();
        let counting = count_syscalls(&pids);
        let (rate, calls) = tarpc_round(ranks, window, seed + 500, added)?;
        let per_call = syscalls_per_call(counting, calls)?;
        let mut sum = 0u64;
        for r in ranks.iter_mut() {
            let w = r.call("sum", PATIENCE)?;
            sum += w.first().context("no sum")?.parse::<u64>()?;
        }
        ensure!(
            sum == *added,
            "tarpc all-to-all: the properties sum to {sum}, {added} was added"
        );
        Ok((rate, per_call))
    })();
    ranks.iter_mut().try_for_each(Child::pause)?;
    result.context("measuring tarpc all-to-all")
}

/// Starts an all-to-all round on every tarpc rank and collects the answers: calls per second
/// summed over the ranks, and every call made (local ones and those drained after the window
/// included).
fn tarpc_round(
    ranks: &mut [Child],
    window: Duration,
    seed: u64,
    added: &mut u64,
) -> anyhow::Result<(f64, u64)> {
    for (i, r) in ranks.iter_mut().enumerate() {
        r.send(&format!(
            "a2a {A2A_DEPTH} {} {}",
            window.as_millis(),
            seed + i as u64
        ))?;
    }
    let (mut rate, mut calls) = (0.0, 0);
    for r in ranks.iter_mut() {
        let w = r.answer(window + PATIENCE)?;
        ensure!(w.len() == 4, "a2a answered {w:?}");
        let (o, secs, a): (u64, f64, u64) = (w[0].parse()?, w[1].parse()?, w[2].parse()?);
        rate += o as f64 / secs;
        calls += w[3].parse::<u64>()?;
        *added += a;
    }
    Ok((rate, calls))
}

fn notes(
    ctx: &Ctx,
    window: Duration,
    e1_window: Duration,
    warmup: Duration,
    mpi_chosen: &[String],
) -> Vec<String> {
    vec![
        format!(
            "The operation: add `x` to a `u64` held by another process on this machine and \
             return the new value. `gossamer`: `t.apply_with(|c, x| {{ *c += x; *c }}, x)` \
             (E1) or `apply_then_with` (E2–E4) from rank 0 of a two-rank rack (`GSM_WORKERS=1`, \
             so each rank is one worker thread) on a property of rank 1; `gossamer (tcp)` with \
             its links on loopback TCP (`GSM_TRANSPORT=tcp`), `gossamer (shm)` through shared \
             memory (`GSM_TRANSPORT=shm`, what `auto` picks between ranks of one host). `raw TCP blocking`: \
             `std::net::TcpStream`, 8-byte request, 8-byte answer, one in flight. `raw TCP \
             pipelined`: the same server, the client keeping N requests in flight and replacing \
             every read's answers with as many requests in one write; the server answers \
             everything one read brought in one write (the ceiling). `tarpc`: tarpc 0.37 over \
             tokio TCP with a postcard codec. `tonic (gRPC)`: tonic 0.14, hand-derived prost \
             messages, one HTTP/2 connection. tarpc and tonic run on current-thread tokio \
             runtimes (one thread each side), their clients on a thread of the benchmark \
             process; the raw clients too. `Open MPI (vader)` and `Open MPI (tcp)` (E1 and E2 \
             only): Open MPI 4.1's point-to-point messages (`mpi_rack.c`, `mpicc -O2`), `mpirun \
             -n 2 --allow-run-as-root --mca pml ob1 --mca btl self,vader` (shared memory) or \
             `self,tcp`; rank 1 keeps as many `MPI_Irecv` posted as requests may be outstanding, \
             completes them oldest first, adds `x` and answers with `MPI_Isend`; rank 0 keeps N \
             requests outstanding (an `MPI_Irecv` for the answer, then an `MPI_Isend` of `x`), \
             waits for the oldest answer and sends the next in its place. Open MPI binds its 2 \
             processes to cores (its default). What it ran with, by its own verbose output \
             (`--mca pml_base_verbose 10 --mca btl_base_verbose 100`): {}. With the bench's \
             `ucx` feature: `gossamer (ucx tcp)` and `gossamer (ucx sm)`, the same rack with its \
             links on UCX (`GSM_TRANSPORT=ucx`, `UCX_TLS=tcp` or `sm`), and beside them (E1 \
             only) UCX's own `ucx_perftest -t ucp_am_lat -s 8` over the same `UCX_TLS`, its \
             server and client bound to the ranks' CPUs, one run of about a window's worth of \
             iterations per point for p50 and one for p99 (`-R 99`): `ucx_perftest` prints half \
             a ping-pong, shown here doubled, as a round trip like every other row.",
            if mpi_chosen.is_empty() {
                "not asked (Open MPI not measured)".to_owned()
            } else {
                mpi_chosen.join("; ")
            }
        ),
        format!(
            "Method: each server (and each rank) is a child process, started by running this \
             executable again; while one system is measured, the processes of the others are \
             stopped with SIGSTOP; the systems take turns run by run. Each run is preceded by an \
             unmeasured warm-up of {} ms (Open MPI: one `mpirun` per run, warming up \
             within it as long, then measuring). Windows: {} ms for E1, {} ms otherwise; {} runs per \
             point, median with min–max. Placement: {} Every run checks itself: the raw \
             clients and Open MPI's check every answer against the running sum; the others read \
             the counter \
             after each run and require it to hold exactly the sum of every `x` sent; E4 requires \
             the 64 properties to sum to every `x` sent by every rank.",
            warmup.as_millis(),
            e1_window.as_millis(),
            window.as_millis(),
            ctx.runs,
            if crate::harness::pinning() {
                "rank i of a gossamer rack is bound to the (i mod CPUs)-th CPU, as `mpirun` binds \
                 ranks to cores by default; unbound, the OS at times stacks the two ranks of a call \
                 on one CPU, where the waiting one spins on the core the answer needs (E1 was then \
                 13 or 123 µs from one run to the next, with `GSM_SPIN` at 50 µs). The baselines' \
                 processes and threads are left to the OS, which serves their blocking hand-overs \
                 best (raw blocking TCP's E1 was 3× slower with client and server bound to two \
                 CPUs)."
            } else {
                "nothing is pinned (`--no-pin`)."
            }
        ),
        format!(
            "System calls per call: every system call (any kind: `read`, `write`, `sendto`, \
             `recvfrom`, `epoll_wait`, `futex`, `sched_yield`, ...) made by the client and server \
             processes during the measured run — the benchmark process itself for the \
             baselines' clients, both ranks for gossamer, every rank in E4 — counted by one perf \
             counter per thread on the `raw_syscalls:sys_enter` tracepoint, divided by the calls \
             made in the run (those answered after the window included).{} Connections: \
             established TCP connections with both ends in those processes, from their socket \
             descriptors and `/proc/net/tcp`; for gossamer they include the rack's connections \
             to its coordinator. Neither is counted for Open MPI, whose processes live for one \
             run under `mpirun` (n/a).",
            match NO_SYSCALLS.get() {
                Some(why) => format!(" **Not counted in this run** ({why}): the tables show n/a."),
                None => String::new(),
            }
        ),
        format!(
            "E2: throughput with N calls outstanding from one client thread (gossamer: \
             `apply_then_with` from one fiber, topping up to N then yielding; tarpc and tonic: \
             N futures in flight on one connection; raw: N requests in flight). E3: an open loop \
             — call i falls due at t0 + i/rate and latency runs from then (no coordinated \
             omission); at most {} calls unanswered, a run that completes under 90% of its \
             load is saturated, and a system is driven no harder once it saturates or its \
             median p99 exceeds {} ms; the load it sustains is the highest with a median p99 \
             ≤ 1 ms, unsaturated. E4: every rank (one worker each; tarpc: a current-thread \
             runtime serving and calling) keeps {A2A_DEPTH} calls unanswered on random \
             properties of the {PROPERTIES} spread round-robin over the ranks; a rank applies \
             to its own properties locally (gossamer: through the local trustee; tarpc: \
             directly). E6: one `apply_with` at a time whose argument is a `Vec<u8>` of the \
             size shown, answered with its length, racks only; a value past a frame (64 KiB \
             with its header) travels in chunks. E5 (SSSP at scale 20) is not part of this \
             figure.",
            load::OPEN_CAP,
            P99_GIVE_UP_US / 1e3
        ),
    ]
}

/// E1's panel: latency (µs, log scale) against percentile, as ratios to `baseline`.
pub(crate) fn latency_panel(baseline: &str) -> Panel {
    let mut e1 = Panel::new("e1-latency", "E1: latency, one call outstanding");
    e1.x_label = "percentile".into();
    e1.x_format = XFormat::Percent;
    e1.y_label = "latency (µs)".into();
    e1.log_x = false;
    e1.log_y = true;
    e1.baseline = Some(baseline.into());
    e1
}

/// E2's panel: throughput (log scale) against calls outstanding, as ratios to `baseline`.
pub(crate) fn throughput_panel(x_label: &str, y_label: &str, baseline: &str) -> Panel {
    let mut e2 = Panel::new("e2-throughput", "E2: throughput against calls outstanding");
    e2.x_label = x_label.into();
    e2.y_label = y_label.into();
    e2.log_y = true;
    e2.baseline = Some(baseline.into());
    e2
}

/// A row of a goals table: the goal, the ratio measured, and whether it is met.
pub(crate) fn goal_row(out: &mut String, name: &str, ratio: Option<f64>, ok: &dyn Fn(f64) -> bool) {
    let measured = ratio
        .filter(|r| r.is_finite())
        .map(|r| (format!("×{}", sig(r)), ok(r)));
    goal_line(out, name, measured, ["yes", "no"]);
}

/// A row of a goals table: the goal, its figure as measured and whether it is met (`None`:
/// not measured), the verdict in `words` (met, missed).
pub(crate) fn goal_line(
    out: &mut String,
    name: &str,
    measured: Option<(String, bool)>,
    [met, missed]: [&str; 2],
) {
    let (v, verdict) = match measured {
        Some((v, ok)) => (v, if ok { met } else { missed }),
        None => ("n/a".to_owned(), "–"),
    };
    let _ = writeln!(out, "| {name} | {v} | {verdict} |");
}

/// The ratio of `a`'s median to `b`'s at `x` in `p`, if both were measured.
pub(crate) fn ratio(p: &Panel, a: &str, b: &str, x: f64) -> Option<f64> {
    Some(median(p, a, x)? / median(p, b, x)?)
}

/// The median of `system` at `x` in `p`, if measured.
pub(crate) fn median(p: &Panel, system: &str, x: f64) -> Option<f64> {
    p.series
        .iter()
        .find(|s| s.system == system)
        .and_then(|s| s.at(x))
        .map(|pt| pt.median())
}

/// The highest offered load (ops/s) whose median p99 stayed within 1 ms without saturating.
fn sustained(e3: &Panel, system: &str) -> Option<f64> {
    let s = e3.series.iter().find(|s| s.system == system)?;
    s.points
        .iter()
        .filter(|p| p.flag.is_none() && p.median() <= P99_GOAL_US)
        .map(|p| p.x * 1e6)
        .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))))
}

/// The markdown after the plotted panels' tables: E3's sustained loads, the unplotted panels
/// (system calls, connections) and the goals.
fn summary(
    e1: &Panel,
    e2: &Panel,
    e3: &Panel,
    e4: &Panel,
    idle: &Panel,
    tables: &[&Panel],
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## E3: highest load with p99 ≤ 1 ms\n");
    let _ = writeln!(out, "| system | sustained (kops/s) |\n| --- | ---: |");
    for s in &e3.series {
        let v = sustained(e3, &s.system).map_or("none".to_owned(), |v| sig(v / 1e3));
        // At the highest load offered, the system may sustain more than was asked of it.
        let at_most = e3
            .xs()
            .last()
            .is_some_and(|&top| sustained(e3, &s.system).is_some_and(|v| v >= top * 1e6));
        let v = if at_most { format!("≥ {v}") } else { v };
        let _ = writeln!(out, "| {} | {v} |", s.system);
    }
    let _ = writeln!(
        out,
        "\n(≥: the highest load offered; the system may sustain more. A ratio involving it is a \
         lower or upper bound accordingly.)"
    );
    out.push('\n');
    for p in tables {
        out.push_str(&crate::report::median_table(p));
    }

    // The goals, reported and not asserted.
    let _ = writeln!(out, "## Goals (reported, not asserted)\n");
    let _ = writeln!(out, "| goal | measured | met |\n| --- | ---: | --- |");
    let mut goal = |name: String, ratio: Option<f64>, ok: &dyn Fn(f64) -> bool| {
        goal_row(&mut out, &name, ratio, ok)
    };
    goal(
        "E1 p50 ≤ 1.5× raw blocking TCP".into(),
        ratio(e1, GOSSAMER, RAW_BLOCKING, 50.0),
        &|r| r <= 1.5,
    );
    goal(
        "E1 p50 ≤ 0.5× tarpc".into(),
        ratio(e1, GOSSAMER, TARPC, 50.0),
        &|r| r <= 0.5,
    );
    goal(
        "E2 at 1024 ≥ 10× tarpc".into(),
        ratio(e2, GOSSAMER, TARPC, 1024.0),
        &|r| r >= 10.0,
    );
    goal(
        "E2 at 1024 ≥ 20× tonic".into(),
        ratio(e2, GOSSAMER, TONIC, 1024.0),
        &|r| r >= 20.0,
    );
    goal(
        "E2 at 1024 ≥ 0.33× hand-pipelined TCP".into(),
        ratio(e2, GOSSAMER, RAW_PIPELINED, 1024.0),
        &|r| r >= 0.33,
    );
    let e3_ratio = sustained(e3, GOSSAMER)
        .zip(sustained(e3, TARPC))
        .map(|(g, t)| g / t);
    goal(
        "E3 load at p99 ≤ 1 ms ≥ 10× tarpc".into(),
        e3_ratio,
        &|r| r >= 10.0,
    );
    for x in e4.xs() {
        goal(
            format!("E4 at {x} ranks ≥ 5× tarpc"),
            ratio(e4, GOSSAMER, TARPC, x),
            &|r| r >= 5.0,
        );
    }
    goal(
        "shm: E1 p50 ≤ 0.3× gossamer on TCP".into(),
        ratio(e1, GOSSAMER_SHM, GOSSAMER, 50.0),
        &|r| r <= 0.3,
    );
    goal(
        "shm: E2 at 1024 ≥ 3× gossamer on TCP".into(),
        ratio(e2, GOSSAMER_SHM, GOSSAMER, 1024.0),
        &|r| r >= 3.0,
    );
    for x in e4.xs() {
        goal(
            format!("shm: E4 at {x} ranks ≥ 10× tarpc"),
            ratio(e4, GOSSAMER_SHM, TARPC, x),
            &|r| r >= 10.0,
        );
    }
    for (ours, mpi) in [(GOSSAMER, MPI_TCP), (GOSSAMER_SHM, MPI_VADER)] {
        goal(
            format!("{ours}: E1 p50 ≤ 1.2× {mpi}"),
            ratio(e1, ours, mpi, 50.0),
            &|r| r <= 1.2,
        );
        goal(
            format!("{ours}: E2 at 1024 ≥ 1× {mpi}"),
            ratio(e2, ours, mpi, 1024.0),
            &|r| r >= 1.0,
        );
    }
    if e1.series.iter().any(|x| x.system == GOSSAMER_UCX_SM) {
        goal(
            format!("{GOSSAMER_UCX_SM}: E1 p50 ≤ 2× {UCX_AM_SM}'s round trip"),
            ratio(e1, GOSSAMER_UCX_SM, UCX_AM_SM, 50.0),
            &|r| r <= 2.0,
        );
        goal(
            format!("{GOSSAMER_UCX_TCP}: E1 p50 ≤ 1.2× {GOSSAMER}"),
            ratio(e1, GOSSAMER_UCX_TCP, GOSSAMER, 50.0),
            &|r| r <= 1.2,
        );
        for ucx in [GOSSAMER_UCX_TCP, GOSSAMER_UCX_SM] {
            goal(
                format!("{ucx}: E2 at 1024 ≥ 1× {GOSSAMER}"),
                ratio(e2, ucx, GOSSAMER, 1024.0),
                &|r| r >= 1.0,
            );
        }
    }
    for name in [GOSSAMER, GOSSAMER_SHM] {
        for x in idle.xs() {
            let percent = median(idle, name, x);
            let _ = writeln!(
                out,
                "| an idle rack of {x} ranks ({name}) uses < 1% of a core | {} | {} |",
                percent.map_or("n/a".to_owned(), |p| format!("{}%", sig(p))),
                match percent {
                    Some(p) if p < 1.0 => "yes",
                    Some(_) => "no",
                    None => "–",
                }
            );
        }
    }
    out.push('\n');
    out
}
