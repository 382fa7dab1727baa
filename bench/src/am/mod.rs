//! `am`: the seed's active messages (003, Two-Chains) — Server-Side Sum and Indirect Put — as
//! a closure (`apply_with`), a function by name (`apply_named`) and a signed code package's
//! export (`PkgTrust::call`), on a rack of two ranks over TCP and through shared memory.
//!
//! - P1: one call at a time, p50 and p99, payloads 8 B to 1 MiB, against a raw blocking TCP
//!   client and server doing the same sum (`--rack-role am-raw`).
//! - P2: injection rate, 8 B Server-Side Sum issued as fast as the link's window lets
//!   (`GSM_AM_BANKS` × `GSM_AM_SLOTS`, the seed's M banks × N slots: 1×1, 2×16, 4×64, 8×128).
//! - P3: a package's first call on a node (`entrust_package`: shipped, verified, loaded, its
//!   state built), against the package's size (the demo library padded to 2, 8 and 32 MiB
//!   more); beside it, loading on the calling node (no transfer) and verifying alone.
//!
//! The instructions a named call adds at the receiver are counted by `bench instructions`;
//! `am-ship` (`ship.rs`) redraws the seed's Figures 7 and 8, a package shipped with every call.

pub(crate) mod client;
pub(crate) mod raw;
pub(crate) mod ship;

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use gossamer::env;
use gossamer::package::{Package, Policy, SecretKey, hex};

use crate::figure::{Figure, Panel, sig};
use crate::harness::Ctx;
use crate::rack::child::Child;
use crate::rack::load::{Measured, new_histogram};
use crate::rack::{PATIENCE, start_rack_with};

const KINDS: [&str; 3] = ["closure", "named", "package"];
/// P3's series: the checks alone, in the benchmark's process.
const VERIFY: &str = "verify alone (signature, hashes, ELF)";
/// P3's series: loading on the calling node itself (no transfer).
const LOCAL: &str = "load on the calling node (no transfer)";
const RAW: &str = "raw blocking TCP";

/// A rack of two ranks on one transport, paused (SIGSTOP) when not measured.
struct Rack {
    label: String,
    ranks: Vec<Child>,
}

impl Rack {
    /// Starts a rack whose links have a window of `banks` × `slots`, with its servers (see
    /// `am-setup`), and pauses it until measured.
    fn start(
        me: &Path,
        transport: &str,
        package: &Path,
        key: &SecretKey,
        (banks, slots): (usize, usize),
    ) -> anyhow::Result<Rack> {
        let label = format!("am ({transport}, window {banks}×{slots})");
        let env = vec![
            ("GSM_TRUSTED_KEYS".to_owned(), hex(&key.public())),
            ("GSM_AM_BANKS".to_owned(), banks.to_string()),
            ("GSM_AM_SLOTS".to_owned(), slots.to_string()),
        ];
        let ranks = start_rack_with(me, &label, 2, transport, &env)?;
        let mut rack = Rack { label, ranks };
        rack.call(&format!("am-setup {}", package.display()), PATIENCE)?;
        rack.ranks.iter_mut().try_for_each(Child::pause)?;
        Ok(rack)
    }

    fn call(&mut self, command: &str, patience: Duration) -> anyhow::Result<Vec<String>> {
        self.ranks[0]
            .call(command, patience)
            .with_context(|| format!("{}: `{command}`", self.label))
    }

    fn turn(
        &mut self,
        warmup: Duration,
        window: Duration,
        measure: &dyn Fn(Duration) -> String,
    ) -> anyhow::Result<Measured> {
        self.ranks.iter_mut().try_for_each(Child::resume)?;
        let result = (|| {
            self.call(&measure(warmup), warmup + PATIENCE)?;
            let m = Measured::parse(&self.call(&measure(window), window + PATIENCE)?)?;
            self.call("am-check", PATIENCE)?;
            Ok(m)
        })();
        self.ranks.iter_mut().try_for_each(Child::pause)?;
        result
    }

    /// P3: the `am-first` of the package at `path`; its times on rank 0 and on the last rank
    /// (µs).
    fn first(&mut self, path: &Path) -> anyhow::Result<(f64, f64)> {
        self.ranks.iter_mut().try_for_each(Child::resume)?;
        let words = self.call(&format!("am-first {}", path.display()), PATIENCE);
        self.ranks.iter_mut().try_for_each(Child::pause)?;
        match words?.as_slice() {
            [local, remote] => Ok((local.parse()?, remote.parse()?)),
            other => bail!("am-first answered {other:?}"),
        }
    }

    fn finish(mut self) -> anyhow::Result<()> {
        self.ranks.iter_mut().try_for_each(Child::resume)?;
        for r in self.ranks {
            r.finish(PATIENCE)?;
        }
        Ok(())
    }
}

/// The demo package's library beside this executable, built first if missing.
fn demo_library(me: &Path) -> anyhow::Result<Vec<u8>> {
    let lib = me.with_file_name("libdemo_package.so");
    if !lib.exists() {
        let cargo = std::env::var_os("CARGO").with_context(|| {
            format!(
                "{} is missing: `cargo build --release -p demo-package`",
                lib.display()
            )
        })?;
        let release = me.parent().is_some_and(|d| d.ends_with("release"));
        let mut build = std::process::Command::new(cargo);
        build.args(["build", "-p", "demo-package"]);
        if release {
            build.arg("--release");
        }
        ensure!(
            build.status()?.success(),
            "building the demo package failed"
        );
    }
    std::fs::read(&lib).with_context(|| format!("reading {}", lib.display()))
}

/// Runs the experiment (see the module docs).
pub fn run(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let me = ctx.self_exe.clone().context(
        "`am` starts its ranks by running this executable again: run it as `cargo run --release -p bench -- am`",
    )?;
    let window = ctx.window;
    let warmup = (window / 4).max(Duration::from_millis(5));
    let sizes: &[usize] = if ctx.quick {
        &[8, 1 << 20]
    } else {
        &[8, 1 << 10, 64 << 10, 1 << 20]
    };
    // The default window's racks are those of P1 and P3; the others start racks of their own.
    let default_window = (env::DEFAULT_AM_BANKS, env::DEFAULT_AM_SLOTS);
    let windows: &[(usize, usize)] = if ctx.quick {
        &[default_window]
    } else {
        &[(1, 1), (2, 16), (4, 64), default_window]
    };
    let transports = ["tcp", "shm"];

    let scratch = std::env::temp_dir().join(format!("gsm-bench-am-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    let key = SecretKey::generate()?;
    let library = demo_library(&me)?;
    let package = gossamer::package::build(library.clone(), &key)?;
    let package_path = scratch.join("demo.gpkg");
    std::fs::write(&package_path, package.to_bytes())?;
    let package_bytes = package.to_bytes().len() as f64;
    // P3's packages: the demo library with zero bytes appended (the loader reads only what the
    // headers name, every check reads it all), and one byte more per run, so that each run's
    // package is one no node has loaded.
    let pads: &[usize] = if ctx.quick {
        &[0]
    } else {
        &[0, 2 << 20, 8 << 20, 32 << 20]
    };

    let mut p1: Vec<Panel> = ["sum", "put"]
        .iter()
        .flat_map(|f| {
            [("p50", 50.0), ("p99", 99.0)].map(|(q, _)| {
                let mut p = Panel::new(
                    format!("p1-{f}-{q}"),
                    format!(
                        "P1: {} one call at a time, {q} latency",
                        if *f == "sum" {
                            "Server-Side Sum"
                        } else {
                            "Indirect Put"
                        }
                    ),
                );
                p.x_label = "payload (bytes)".into();
                p.y_label = format!("{q} latency (µs)");
                p
            })
        })
        .collect();
    let mut p2 = Panel::new(
        "p2-rate",
        "P2: Server-Side Sum of 8 B as the window lets (M banks × N slots)",
    );
    p2.x_label = "window M × N (calls unrun at most)".into();
    p2.y_label = "throughput (k calls/s)".into();
    let mut p3 = Panel::new("p3-first", "P3: a package's first call, against its size");
    p3.x_label = "package file (bytes)".into();
    p3.y_label = "ms".into();

    let own_windows = windows.iter().filter(|&&w| w != default_window).count();
    let racks_started = (1 + own_windows) * transports.len();
    ctx.begin(
        "am",
        (racks_started
            + ctx.runs * transports.len() * KINDS.len() * (2 * sizes.len() + windows.len())
            + ctx.runs * sizes.len()
            + ctx.runs * pads.len() * (1 + transports.len())) as u64,
    );
    let mut racks = Vec::new();
    for t in transports {
        ctx.status(format!("starting the rack ({t})"));
        let rack = Rack::start(&me, t, &package_path, &key, default_window)?;
        racks.push((t, rack));
        ctx.tick();
    }
    let policy = Policy {
        trusted: vec![key.public()],
        max_package: usize::MAX,
        min_versions: Vec::new(),
    };
    for &pad in pads {
        for run in 0..ctx.runs {
            let mut padded = library.clone();
            padded.resize(library.len() + pad + run + 1, 0);
            let p = Package::signed(package.manifest().clone(), padded, &key);
            let bytes = p.to_bytes();
            // Sizes as the first run's: one point per size.
            let x = (package_bytes as usize + pad) as f64;
            ctx.status(format!(
                "P3 verify, {} KiB, run {}",
                bytes.len() >> 10,
                run + 1
            ));
            let t0 = Instant::now();
            Package::from_bytes(&bytes)?.verify(&policy)?;
            p3.add(VERIFY, x, t0.elapsed().as_secs_f64() * 1e3);
            ctx.tick();
            let path = scratch.join(format!("padded-{pad}-{run}.gpkg"));
            std::fs::write(&path, &bytes)?;
            for (t, rack) in racks.iter_mut() {
                ctx.status(format!(
                    "P3 first call, {} KiB ({t}), run {}",
                    bytes.len() >> 10,
                    run + 1
                ));
                let (local_us, remote_us) = rack.first(&path)?;
                if *t == transports[0] {
                    p3.add(LOCAL, x, local_us / 1e3);
                }
                p3.add(&format!("first call ({t})"), x, remote_us / 1e3);
                ctx.tick();
            }
            std::fs::remove_file(&path)?;
        }
    }
    let (raw, raw_addr) = start_raw(&me)?;
    let measured = (|| -> anyhow::Result<()> {
        for &bytes in sizes {
            for run in 0..ctx.runs {
                ctx.status(format!("P1 {bytes} B {RAW}, run {}", run + 1));
                let m = raw_latency(raw_addr, bytes, warmup, window * 2)?;
                p1[0].add(RAW, bytes as f64, m.p50_us);
                p1[1].add(RAW, bytes as f64, m.p99_us);
                ctx.tick();
                for (t, rack) in racks.iter_mut() {
                    for kind in KINDS {
                        for (f, fun) in ["sum", "put"].iter().enumerate() {
                            ctx.status(format!("P1 {fun} {bytes} B {kind} ({t}), run {}", run + 1));
                            let m = rack.turn(warmup, window * 2, &|w| {
                                format!("am-lat {kind} {fun} {bytes} {}", w.as_millis())
                            })?;
                            let system = format!("{kind} ({t})");
                            p1[2 * f].add(&system, bytes as f64, m.p50_us);
                            p1[2 * f + 1].add(&system, bytes as f64, m.p99_us);
                            ctx.tick();
                        }
                    }
                }
            }
        }
        for &(banks, slots) in windows {
            let mut own = Vec::new();
            if (banks, slots) != default_window {
                for t in transports {
                    ctx.status(format!(
                        "P2 window {banks}×{slots} ({t}): starting its rack"
                    ));
                    let rack = Rack::start(&me, t, &package_path, &key, (banks, slots))?;
                    own.push((t, rack));
                    ctx.tick();
                }
            }
            let here = if own.is_empty() { &mut racks } else { &mut own };
            for run in 0..ctx.runs {
                for (t, rack) in here.iter_mut() {
                    for kind in KINDS {
                        ctx.status(format!(
                            "P2 window {banks}×{slots} {kind} ({t}), run {}",
                            run + 1
                        ));
                        let m = rack.turn(warmup, window, &|w| {
                            format!("am-rate {kind} sum 8 {}", w.as_millis())
                        })?;
                        p2.add(
                            &format!("{kind} ({t})"),
                            (banks * slots) as f64,
                            m.rate() / 1e3,
                        );
                        ctx.tick();
                    }
                }
            }
            for (_, rack) in own {
                rack.finish()?;
            }
        }
        Ok(())
    })();
    drop(raw);
    for (_, rack) in racks {
        rack.finish()?;
    }
    let _ = std::fs::remove_dir_all(&scratch);
    measured?;
    ctx.finish();
    let extra = summary(&p1, &p2, &p3, sizes, windows, package_bytes);
    let mut panels = p1;
    panels.push(p2);
    panels.push(p3);
    Ok(Figure {
        name: "am".into(),
        title: "Active messages: a closure, a function by name and a package export (seed 003)"
            .into(),
        notes: notes(ctx, window, warmup),
        panels,
        columns: 2,
        extra_markdown: extra,
    })
}

fn notes(ctx: &Ctx, window: Duration, warmup: Duration) -> Vec<String> {
    vec![
        format!(
            "Two ranks of one worker each on this machine (`GSM_WORKERS=1`), over loopback TCP \
             or shared memory; rank 0 calls a `Server` on rank 1 (an array of 64 sums and an \
             indirect-put table of 16 slots of 1 MiB). *closure*: `apply_with` of the host's \
             function; *named*: `apply_named` of the same function registered as \
             `bench.am.server_sum` / `bench.am.indirect_put`; *package*: `PkgTrust::call` of \
             the demo package's export (`packages/demo`, built and signed by the run, shipped \
             to rank 1 by its first call). Every payload byte is 1, so a sum of n bytes is n, \
             which every answer is checked against. {} runs per point, taking turns (the \
             racks not measured are stopped with SIGSTOP), median with min–max; windows of \
             {} ms (P1: twice that) after {} ms unmeasured.",
            ctx.runs,
            window.as_millis(),
            warmup.as_millis()
        ),
        format!(
            "*{RAW}*: a client and a server process of this executable, the server reading a \
             length and the payload, summing its bytes and writing the sum, one at a time, \
             `TCP_NODELAY` on both ends: the floor of a call carrying a payload."
        ),
        "P3: the time of `entrust_package` on a node that has not seen the package: the \
         package goes whole as the argument of a named call (in chunks of `GSM_FRAME`), rank 1 \
         verifies it (signature, BLAKE3, ELF), writes it to a sealed memfd, `dlopen`s it, \
         checks the descriptor, runs `on_load`, builds the state. The packages are the demo \
         library with zero bytes appended (2, 8 and 32 MiB; the loader maps only what the \
         headers name, the checks read every byte), one byte more per run so that each run's \
         is new to both ranks. *load on the calling node*: the same on rank 0 itself, just \
         before (no transfer; the difference to *first call* is the transfer); *verify \
         alone*: `Package::verify` in the benchmark's process."
            .to_owned(),
    ]
}

/// The goals of the issue beside what this run measured.
fn summary(
    p1: &[Panel],
    p2: &Panel,
    p3: &Panel,
    sizes: &[usize],
    windows: &[(usize, usize)],
    package_bytes: f64,
) -> String {
    let mut out = String::from(
        "\n## Goals (this run)\n\n| goal | transport | figure | met |\n| --- | --- | --- | --- |\n",
    );
    let med = |p: &Panel, s: &str, x: f64| crate::rack::median(p, s, x);
    for t in ["tcp", "shm"] {
        for kind in ["named", "package"] {
            for (f, fun) in ["sum", "put"].iter().enumerate() {
                for &bytes in sizes {
                    let x = bytes as f64;
                    let (Some(k), Some(c)) = (
                        med(&p1[2 * f], &format!("{kind} ({t})"), x),
                        med(&p1[2 * f], &format!("closure ({t})"), x),
                    ) else {
                        continue;
                    };
                    let ratio = k / c;
                    out += &format!(
                        "| P1 {kind} {fun} p50 ≤ 1.015 × closure, {bytes} B | {t} | {} µs vs {} µs (×{:.3}) | {} |\n",
                        sig(k),
                        sig(c),
                        ratio,
                        if ratio <= 1.015 { "yes" } else { "no" }
                    );
                }
            }
            for &(banks, slots) in windows {
                let x = (banks * slots) as f64;
                let (Some(k), Some(c)) = (
                    med(p2, &format!("{kind} ({t})"), x),
                    med(p2, &format!("closure ({t})"), x),
                ) else {
                    continue;
                };
                let ratio = k / c;
                out += &format!(
                    "| P2 {kind} rate ≥ 0.985 × closure, window {banks}×{slots} | {t} | {} vs {} k/s (×{:.3}) | {} |\n",
                    sig(k),
                    sig(c),
                    ratio,
                    if ratio >= 0.985 { "yes" } else { "no" }
                );
            }
        }
        let mib = (1 << 20) as f64;
        if let (Some(pkg), Some(raw)) = (
            med(&p1[0], &format!("package ({t})"), mib),
            med(&p1[0], RAW, mib),
        ) {
            // Bandwidth is payload over one call's time: raw's over the package's.
            let ratio = raw / pkg;
            out += &format!(
                "| 1 MiB bandwidth ≥ 0.8 × raw TCP (package sum) | {t} | {} µs vs raw {} µs (×{:.2}) | {} |\n",
                sig(pkg),
                sig(raw),
                ratio,
                if ratio >= 0.8 { "yes" } else { "no" }
            );
        }
        if let Some(first) = med(p3, &format!("first call ({t})"), package_bytes) {
            out += &format!(
                "| first call ≤ 20 ms ({} KiB package) | {t} | {} ms | {} |\n",
                (package_bytes / 1024.0).round(),
                sig(first),
                if first <= 20.0 { "yes" } else { "no" }
            );
        }
    }
    out
}

/// Starts the raw TCP server: a child of this executable.
fn start_raw(me: &Path) -> anyhow::Result<(Child, SocketAddr)> {
    let mut server = Child::start(me, RAW, "am-raw", &[], &[])?;
    let words = server.answer(PATIENCE)?;
    let port: u16 = words.first().context("no port")?.parse()?;
    Ok((server, SocketAddr::from((Ipv4Addr::LOCALHOST, port))))
}

/// The raw client: one request at a time for `window`, after `warmup` unmeasured.
fn raw_latency(
    addr: SocketAddr,
    bytes: usize,
    warmup: Duration,
    window: Duration,
) -> anyhow::Result<Measured> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut request = (bytes as u32).to_le_bytes().to_vec();
    request.extend(std::iter::repeat_n(1u8, bytes));
    let mut answer = [0u8; 8];
    let mut one = |s: &mut TcpStream| -> anyhow::Result<()> {
        s.write_all(&request)?;
        s.read_exact(&mut answer)?;
        let sum = u64::from_le_bytes(answer);
        if sum != bytes as u64 {
            bail!("raw TCP summed {bytes} ones as {sum}");
        }
        Ok(())
    };
    let t0 = Instant::now();
    while t0.elapsed() < warmup {
        one(&mut s)?;
    }
    let mut hist = new_histogram();
    let (t0, mut ops) = (Instant::now(), 0u64);
    while t0.elapsed() < window {
        let start = Instant::now();
        one(&mut s)?;
        hist.record(start.elapsed().as_nanos() as u64)?;
        ops += 1;
    }
    Ok(Measured::closed(ops, t0.elapsed(), &hist))
}
