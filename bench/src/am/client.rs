//! Rank 0's side of `bench am`: the seed's two active messages on the last rank, called three
//! ways — a closure (`apply_with`), a function by name (`apply_named`), a package export
//! (`PkgTrust::call`) — and the commands that measure them.
//!
//! Commands (answers follow `ok`):
//! - `am-setup PACKAGE`: opens the package file and puts a host `Server` and a package
//!   `Server` on the last rank (the package is shipped and loaded there);
//! - `am-first PACKAGE`: P3, loads a package no node has seen on this node, then on the
//!   last (its first call there: shipped, verified, loaded), and answers `LOCAL_US REMOTE_US`;
//! - `am-lat KIND FN BYTES WINDOW_MS`: P1, one call at a time; `Measured::words`;
//! - `am-rate KIND FN BYTES WINDOW_MS`: P2, calls (their `_then` forms) as fast as the link's
//!   window of requests lets; `Measured::words`;
//! - `am-fibers KIND FN BYTES WINDOW_MS FIBERS`: `am-ship`'s rate, FIBERS fibers each making
//!   one call at a time; `Measured::words`;
//! - `am-check`: the host and package servers hold the sums of every payload sent.
//!
//! `KIND` is `closure`, `named`, `package` or `shipped` (a package call that sends the package
//! first, every time: `Node::load_package`, then the call); `FN` is `sum` (Server-Side Sum:
//! the payload's bytes summed into the next slot of an array) or `put` (Indirect Put: the key
//! hashed to a slot, the payload copied there).

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use gossamer::package::{Package, PkgTrust};
use gossamer::{NamedError, Node, Trust};
use serde::{Deserialize, Serialize};

use crate::rack::load::{Measured, new_histogram};

/// The server's memory, as the demo package keeps it: an array of sums and the indirect-put
/// table. A copy of `packages/demo`'s code, not a dependency on it: the package's versions are
/// cargo features, which `--all-features` would turn on here too.
#[gossamer::stable_type("bench.am.Server/1")]
pub(crate) struct Server {
    sums: Vec<u64>,
    next_sum: usize,
    keys: Vec<Option<u64>>,
    data: Vec<u8>,
    width: usize,
}

/// The demo package's `Shape`.
#[derive(Serialize, Deserialize, Clone, Copy)]
pub(crate) struct Shape {
    sums: u64,
    keys: u64,
    width: u64,
}

/// The demo package's `Payload`.
#[derive(Serialize, Deserialize, Clone)]
pub(crate) struct Payload(#[serde(with = "serde_bytes")] Vec<u8>);

/// The demo package's `Put`.
#[derive(Serialize, Deserialize, Clone)]
pub(crate) struct Put {
    key: u64,
    #[serde(with = "serde_bytes")]
    value: Vec<u8>,
}

/// The table: 4096 keys of up to 1 MiB each would be 4 GiB, so the slots are the size of the
/// largest payload measured and few.
const SHAPE: Shape = Shape {
    sums: 64,
    keys: 16,
    width: 1 << 20,
};

fn new_server(shape: Shape) -> Server {
    Server {
        sums: vec![0; shape.sums as usize],
        next_sum: 0,
        keys: vec![None; shape.keys as usize],
        data: vec![0; (shape.keys * shape.width) as usize],
        width: shape.width as usize,
    }
}

/// Server-Side Sum, as the package has it.
fn server_sum(s: &mut Server, payload: Payload) -> u64 {
    let sum = payload.0.iter().map(|&b| u64::from(b)).sum();
    let at = s.next_sum;
    s.sums[at] = sum;
    s.next_sum = (at + 1) % s.sums.len();
    sum
}

/// Indirect Put, as the package has it.
fn indirect_put(s: &mut Server, p: Put) -> u64 {
    let n = s.keys.len();
    let start = (p.key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize % n;
    for probe in 0..n {
        let at = (start + probe) % n;
        if s.keys[at].is_none_or(|k| k == p.key) {
            s.keys[at] = Some(p.key);
            let slot = &mut s.data[at * s.width..(at + 1) * s.width];
            let len = p.value.len().min(s.width);
            slot[..len].copy_from_slice(&p.value[..len]);
            return at as u64;
        }
    }
    u64::MAX
}

#[gossamer::function("bench.am.server_sum")]
fn named_sum(s: &mut Server, payload: Payload) -> u64 {
    server_sum(s, payload)
}

#[gossamer::function("bench.am.indirect_put")]
fn named_put(s: &mut Server, p: Put) -> u64 {
    indirect_put(s, p)
}

/// What rank 0 holds between commands.
#[derive(Default)]
pub(crate) struct Client {
    servers: Option<Arc<Servers>>,
}

struct Servers {
    host: Trust<Server>,
    /// The node the servers are on, and the package its `package` server runs.
    last: Node,
    pkg: Package,
    package: PkgTrust,
    named_sum: gossamer::Named<Server, Payload, u64>,
    named_put: gossamer::Named<Server, Put, u64>,
}

/// One call of a kind and function, answering the function's `u64`.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Closure,
    Named,
    Package,
    /// A package call that sends the package first, every time.
    Shipped,
}

#[derive(Clone, Copy, PartialEq)]
enum Fun {
    Sum,
    Put,
}

/// The payload of a call: `bytes` bytes, all 1 (so a Server-Side Sum is `bytes`).
fn payload(bytes: usize) -> Vec<u8> {
    vec![1; bytes]
}

impl Client {
    pub(crate) fn command(&mut self, words: &[&str]) -> anyhow::Result<String> {
        let ms = |w: &str| -> anyhow::Result<Duration> { Ok(Duration::from_millis(w.parse()?)) };
        match words {
            ["am-setup", path] => {
                let last = gossamer::nodes().last().context("a rack has nodes")?;
                let package = Package::open(path).map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
                let host = last.entrust_with(new_server, SHAPE);
                let pkg = last
                    .entrust_package(&package, "Server", SHAPE)
                    .map_err(|e| anyhow::anyhow!("entrust_package: {e}"))?;
                self.servers = Some(Arc::new(Servers {
                    host,
                    last,
                    pkg: package,
                    package: pkg,
                    named_sum: gossamer::named("bench.am.server_sum")?,
                    named_put: gossamer::named("bench.am.indirect_put")?,
                }));
                Ok(String::new())
            }
            ["am-first", path] => {
                let package = Package::open(path).map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
                let t0 = Instant::now();
                let here = gossamer::this_node()
                    .entrust_package(&package, "Server", SHAPE)
                    .map_err(|e| anyhow::anyhow!("entrust_package here: {e}"))?;
                let local = t0.elapsed();
                let last = gossamer::nodes().last().context("a rack has nodes")?;
                let t0 = Instant::now();
                let there = last
                    .entrust_package(&package, "Server", SHAPE)
                    .map_err(|e| anyhow::anyhow!("entrust_package on rank {}: {e}", last.rank()))?;
                let remote = t0.elapsed();
                for server in [here, there] {
                    let sum: u64 = server
                        .call("server_sum", Payload(payload(5)))
                        .map_err(anyhow::Error::msg)?;
                    ensure!(sum == 5, "a freshly loaded package summed 5 bytes as {sum}");
                }
                Ok(format!("{} {}", local.as_micros(), remote.as_micros()))
            }
            ["am-lat", kind, fun, bytes, window] => {
                let (kind, fun) = (kind_of(kind)?, fun_of(fun)?);
                let s = self.servers.as_ref().context("am-setup first")?;
                Ok(latency(s, kind, fun, bytes.parse()?, ms(window)?)?.words())
            }
            ["am-rate", kind, fun, bytes, window] => {
                let (kind, fun) = (kind_of(kind)?, fun_of(fun)?);
                let s = self.servers.as_ref().context("am-setup first")?;
                Ok(rate(s, kind, fun, bytes.parse()?, ms(window)?)?.words())
            }
            ["am-fibers", kind, fun, bytes, window, fibers] => {
                let (kind, fun) = (kind_of(kind)?, fun_of(fun)?);
                let s = self.servers.clone().context("am-setup first")?;
                let (bytes, window, fibers) = (bytes.parse()?, ms(window)?, fibers.parse()?);
                Ok(in_fibers(s, kind, fun, bytes, window, fibers)?.words())
            }
            ["am-check"] => {
                let s = self.servers.as_ref().context("am-setup first")?;
                let probe = Payload(payload(3));
                let host = s.host.apply_with(server_sum, probe.clone());
                let pkg: u64 = s
                    .package
                    .call("server_sum", probe)
                    .map_err(anyhow::Error::msg)?;
                ensure!(
                    host == 3 && pkg == 3,
                    "the servers summed 3 bytes as {host} and {pkg}"
                );
                Ok(String::new())
            }
            _ => bail!("unknown command {words:?}"),
        }
    }
}

fn kind_of(word: &str) -> anyhow::Result<Kind> {
    Ok(match word {
        "closure" => Kind::Closure,
        "named" => Kind::Named,
        "package" => Kind::Package,
        "shipped" => Kind::Shipped,
        other => bail!("unknown kind {other}"),
    })
}

fn fun_of(word: &str) -> anyhow::Result<Fun> {
    Ok(match word {
        "sum" => Fun::Sum,
        "put" => Fun::Put,
        other => bail!("unknown function {other}"),
    })
}

fn named_error(e: NamedError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// One call, waited for; the answer checked (a sum of `bytes`, or a slot of the table).
fn call(s: &Servers, kind: Kind, fun: Fun, key: u64, bytes: &[u8]) -> anyhow::Result<u64> {
    let value = bytes.to_vec();
    let kind = if kind == Kind::Shipped {
        s.last.load_package(&s.pkg).map_err(anyhow::Error::msg)?;
        Kind::Package
    } else {
        kind
    };
    let answer = match (kind, fun) {
        (Kind::Closure, Fun::Sum) => s.host.apply_with(server_sum, Payload(value)),
        (Kind::Closure, Fun::Put) => s.host.apply_with(indirect_put, Put { key, value }),
        (Kind::Named, Fun::Sum) => s
            .host
            .apply_named(&s.named_sum, Payload(value))
            .map_err(named_error)?,
        (Kind::Named, Fun::Put) => s
            .host
            .apply_named(&s.named_put, Put { key, value })
            .map_err(named_error)?,
        (Kind::Package, Fun::Sum) => s
            .package
            .call("server_sum", Payload(value))
            .map_err(anyhow::Error::msg)?,
        (Kind::Package, Fun::Put) => s
            .package
            .call("indirect_put", Put { key, value })
            .map_err(anyhow::Error::msg)?,
        (Kind::Shipped, _) => unreachable!("a shipped call is a package call once shipped"),
    };
    check(fun, bytes.len(), answer)?;
    Ok(answer)
}

fn check(fun: Fun, bytes: usize, answer: u64) -> anyhow::Result<()> {
    match fun {
        Fun::Sum => ensure!(
            answer == bytes as u64,
            "a sum of {bytes} ones answered {answer}"
        ),
        Fun::Put => ensure!(answer < SHAPE.keys, "a put answered slot {answer}"),
    }
    Ok(())
}

/// P1: one call at a time for `window`.
fn latency(
    s: &Servers,
    kind: Kind,
    fun: Fun,
    bytes: usize,
    window: Duration,
) -> anyhow::Result<Measured> {
    let data = payload(bytes);
    let mut hist = new_histogram();
    let (t0, mut ops) = (Instant::now(), 0u64);
    while t0.elapsed() < window {
        let start = Instant::now();
        call(s, kind, fun, ops % SHAPE.keys, &data)?;
        hist.record(start.elapsed().as_nanos() as u64)?;
        ops += 1;
    }
    let mut m = Measured::closed(ops, t0.elapsed(), &hist);
    m.calls = ops;
    Ok(m)
}

/// P2: calls issued with the `_then` forms for `window`, as fast as the link's window lets:
/// a call past it waits in the fiber for a credit, and answers are taken meanwhile.
fn rate(
    s: &Servers,
    kind: Kind,
    fun: Fun,
    bytes: usize,
    window: Duration,
) -> anyhow::Result<Measured> {
    ensure!(
        kind != Kind::Shipped,
        "a shipped call waits for its package: `am-fibers` measures its rate"
    );
    let data = payload(bytes);
    let group = gossamer::Group::new();
    let failed = Rc::new(Cell::new(0u64));
    let answered = Rc::new(Cell::new(0u64));
    let (t0, mut issued) = (Instant::now(), 0u64);
    let counted = loop {
        // The clock is read once per 64 calls.
        for _ in 0..64 {
            let (failed, answered) = (failed.clone(), answered.clone());
            let done = group.track(move |ok: bool| {
                answered.set(answered.get() + 1);
                if !ok {
                    failed.set(failed.get() + 1);
                }
            });
            let n = bytes;
            let ok = move |answer: u64| check(fun, n, answer).is_ok();
            let (key, value) = (issued % SHAPE.keys, data.clone());
            match (kind, fun) {
                (Kind::Closure, Fun::Sum) => {
                    s.host
                        .apply_then_with(server_sum, Payload(value), move |r| done(ok(r)))
                }
                (Kind::Closure, Fun::Put) => {
                    s.host
                        .apply_then_with(indirect_put, Put { key, value }, move |r| done(ok(r)))
                }
                (Kind::Named, Fun::Sum) => {
                    s.host
                        .apply_then_named(&s.named_sum, Payload(value), move |r| {
                            done(r.is_ok_and(ok))
                        })
                }
                (Kind::Named, Fun::Put) => {
                    s.host
                        .apply_then_named(&s.named_put, Put { key, value }, move |r| {
                            done(r.is_ok_and(ok))
                        })
                }
                (Kind::Package, Fun::Sum) => {
                    s.package
                        .call_then("server_sum", Payload(value), move |r: Result<u64, _>| {
                            done(r.is_ok_and(ok))
                        })
                }
                (Kind::Package, Fun::Put) => s.package.call_then(
                    "indirect_put",
                    Put { key, value },
                    move |r: Result<u64, _>| done(r.is_ok_and(ok)),
                ),
                (Kind::Shipped, _) => unreachable!("refused above"),
            }
            issued += 1;
        }
        if t0.elapsed() >= window {
            break (t0.elapsed(), answered.get());
        }
    };
    group.wait();
    ensure!(failed.get() == 0, "{} calls answered wrongly", failed.get());
    Ok(Measured {
        ops: counted.1,
        secs: counted.0.as_secs_f64(),
        calls: issued,
        ..Measured::default()
    })
}

/// `am-ship`'s rate: `fibers` fibers, each making one call at a time for `window`; a fiber's
/// calls use keys of their own.
fn in_fibers(
    s: Arc<Servers>,
    kind: Kind,
    fun: Fun,
    bytes: usize,
    window: Duration,
    fibers: u64,
) -> anyhow::Result<Measured> {
    let t0 = Instant::now();
    let handles: Vec<_> = (0..fibers)
        .map(|f| {
            let s = s.clone();
            gossamer::spawn(move || -> anyhow::Result<u64> {
                let data = payload(bytes);
                let mut calls = 0u64;
                while t0.elapsed() < window {
                    call(&s, kind, fun, (f + calls * fibers) % SHAPE.keys, &data)?;
                    calls += 1;
                }
                Ok(calls)
            })
        })
        .collect();
    let mut calls = 0;
    for h in handles {
        calls += h.join()?;
    }
    Ok(Measured {
        ops: calls,
        secs: t0.elapsed().as_secs_f64(),
        calls,
        ..Measured::default()
    })
}
