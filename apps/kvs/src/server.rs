//! The network server: a trust runtime, shards entrusted to trustees, one fiber per
//! connection.
//!
//! * The runtime has `-t` workers (`--dedicated-trustees` of them serve only as trustees).
//!   Shard `i` is entrusted to trustee `i % trustees`, so shards spread round-robin.
//! * One accept fiber per listening address hands each connection to a fiber on a client
//!   worker (round-robin). Over `-c` connections, a new one gets memcached's
//!   `ERROR Too many open connections` and is closed.
//! * A connection fiber reads what the client sent and plans every complete request with
//!   [`Round`], which hands each shard command to the fiber's [`Host`]: it ships the command to
//!   its shard with `apply_then`, without waiting, so all requests of one read are in flight at
//!   once. The `then` callbacks (run on this worker) file the replies in the flight; when every
//!   reply of the read is in, [`Round::render`] gives the answers in request order (with
//!   memcached's rules for aborts and `stats reset`, shared with [`Engine`](crate::conn::Engine))
//!   and the fiber writes them in one go.
//!   A shard whose trustee is the fiber's own worker is served inline by the runtime itself
//!   (`apply_then` on an idle own trustee runs the closure at once and defers only the callback).
//! * Values are copied out of the shard by the trustee (small ones) or shared by reference
//!   count (large ones), see [`store::Value`](crate::store::Value).
//!
//! Server-wide counters (connections, bytes) are atomics that connections add to after each
//! read; per-command counters live in the shards and are summed on `stats`.

use std::cell::RefCell;
use std::io;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{SystemTime, UNIX_EPOCH};

use trust::net::{TcpListener, TcpStream};
use trust::{Group, Handle, Runtime, Trust};

use crate::config::{Config, ServerStats, StatsEnv};
use crate::conn::{End, Host, Input, Round, StatsSource};
use crate::store::{Shard, ShardCommand, ShardReply, execute};

/// Server-wide counters shared by all connections.
#[derive(Debug, Default)]
struct Counters {
    curr_connections: AtomicU64,
    total_connections: AtomicU64,
    rejected_connections: AtomicU64,
    cmd_flush: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> ServerStats {
        ServerStats {
            curr_connections: self.curr_connections.load(Relaxed),
            total_connections: self.total_connections.load(Relaxed),
            rejected_connections: self.rejected_connections.load(Relaxed),
            cmd_flush: self.cmd_flush.load(Relaxed),
            bytes_read: self.bytes_read.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
        }
    }

    fn add(&self, s: &ServerStats) {
        self.cmd_flush.fetch_add(s.cmd_flush, Relaxed);
        self.bytes_read.fetch_add(s.bytes_read, Relaxed);
        self.bytes_written.fetch_add(s.bytes_written, Relaxed);
    }

    fn reset(&self) {
        for c in [
            &self.rejected_connections,
            &self.cmd_flush,
            &self.bytes_read,
            &self.bytes_written,
        ] {
            c.store(0, Relaxed);
        }
    }
}

/// A shard as a connection reaches it: by its trust, in this process or across the rack.
pub(crate) trait ShardHandle: Send + Sync + 'static {
    /// Runs `cmd` on the shard without waiting; `then` gets the reply on this worker.
    fn ship(&self, cmd: ShardCommand, now: u64, then: impl FnOnce(ShardReply) + 'static);
}

impl ShardHandle for Trust<Shard> {
    fn ship(&self, cmd: ShardCommand, now: u64, then: impl FnOnce(ShardReply) + 'static) {
        self.apply_then(move |s| execute(s, cmd, now), then);
    }
}

/// A shard of a rack job: local ones take the same path as above; remote ones travel as
/// their command, encoded, and come back as their reply.
impl ShardHandle for gossamer::Trust<Shard> {
    fn ship(&self, cmd: ShardCommand, now: u64, then: impl FnOnce(ShardReply) + 'static) {
        self.apply_then_with(
            |s, (cmd, now): (ShardCommand, u64)| execute(s, cmd, now),
            (cmd, now),
            then,
        );
    }
}

/// What every connection shares.
#[derive(Debug)]
pub(crate) struct Server<S> {
    config: Config,
    shards: Vec<S>,
    counters: Counters,
    started: u64,
}

impl<S: ShardHandle> Server<S> {
    /// A server of `shards` (the whole table, in shard order) under `config`.
    pub(crate) fn new(config: Config, shards: Vec<S>) -> Server<S> {
        Server {
            config,
            shards,
            counters: Counters::default(),
            started: unix_now(),
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A connection's view of the server while it plans and renders one read.
struct Conn<'a, S> {
    server: &'a Server<S>,
    flight: &'a Rc<RefCell<Flight>>,
    /// The shard requests of this read not answered yet.
    pending: &'a Group,
    now: u64,
}

impl<S> StatsSource for Conn<'_, S> {
    fn stats_env(&self) -> StatsEnv<'_> {
        StatsEnv {
            config: &self.server.config,
            server: self.server.counters.snapshot(),
            started: self.server.started,
            now: self.now,
        }
    }
}

impl<S: ShardHandle> Host for Conn<'_, S> {
    /// Ships each command to its shard without waiting; the `then` callbacks (run on this
    /// worker) file the replies in the flight.
    fn ship(&mut self, request: usize, ops: Vec<(usize, ShardCommand)>) {
        {
            let mut f = self.flight.borrow_mut();
            if f.replies.len() <= request {
                f.replies.resize_with(request + 1, Vec::new);
            }
            f.replies[request].clear();
            f.replies[request].resize(ops.len(), None);
        }
        let now = self.now;
        for (j, (shard, cmd)) in ops.into_iter().enumerate() {
            let flight = self.flight.clone();
            self.server.shards[shard].ship(
                cmd,
                now,
                self.pending.track(move |reply| {
                    flight.borrow_mut().replies[request][j] = Some(reply);
                }),
            );
        }
    }

    fn reset_stats(&mut self) {
        self.server.counters.reset();
    }

    fn add_counters(&mut self, counters: &ServerStats) {
        self.server.counters.add(counters);
    }
}

/// The server as one process: binds the listening sockets, then serves forever (or until
/// accepting fails). [`crate::rack::run`] is the same server as a rack job.
///
/// # Errors
/// If the runtime cannot start, `-p` lists several ports, or an address cannot be bound.
pub fn run(config: Config) -> Result<(), Box<dyn std::error::Error>> {
    let config = config.for_rank(0, 1)?;
    let mut rt = Runtime::builder()
        .workers(config.threads)
        .dedicated_trustees(config.dedicated_trustees);
    if let Some(us) = config.spin_us {
        rt = rt.spin(std::time::Duration::from_micros(us));
    }
    let rt = rt.build()?;
    let handle = rt.handle().clone();
    let trustees = handle.trustees();
    let shards = (0..config.shards)
        .map(|i| trustees[i % trustees.len()].entrust(Shard::new(config.shard(i))))
        .collect();
    let listeners = bind(&config)?;
    if config.verbose > 0 {
        eprintln!(
            "kvs: listening on {} with {} workers and {} shards",
            config.bind_addresses().join(", "),
            config.threads,
            config.shards
        );
    }
    let server = Arc::new(Server::new(config, shards));
    rt.block_on(move || serve_forever(listeners, &server, &handle))?;
    Ok(())
}

/// Binds the listening sockets of `config` (its `-l` addresses on its port).
///
/// # Errors
/// Names the address that cannot be bound.
pub(crate) fn bind(config: &Config) -> Result<Vec<std::net::TcpListener>, String> {
    config
        .bind_addresses()
        .into_iter()
        .map(|addr| {
            std::net::TcpListener::bind(&addr).map_err(|e| format!("cannot listen on {addr}: {e}"))
        })
        .collect()
}

/// Accepts on every listener, in a fiber each, and serves each connection in a fiber of its
/// own on `handle`'s client workers, until accepting fails. Call it from a fiber.
pub(crate) fn serve_forever<S: ShardHandle>(
    listeners: Vec<std::net::TcpListener>,
    server: &Arc<Server<S>>,
    handle: &Handle,
) -> io::Result<()> {
    let accepters: Vec<_> = listeners
        .into_iter()
        .map(|l| {
            let (server, handle) = (server.clone(), handle.clone());
            trust::spawn(move || accept_loop(l, server, handle))
        })
        .collect();
    accepters.into_iter().try_for_each(trust::JoinHandle::join)
}

fn accept_loop<S: ShardHandle>(
    listener: std::net::TcpListener,
    server: Arc<Server<S>>,
    handle: Handle,
) -> io::Result<()> {
    let listener = TcpListener::from_std(listener)?;
    loop {
        let (stream, _) = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Out of file descriptors and the like: report and keep serving.
                eprintln!("kvs: accept failed: {e}");
                trust::yield_now();
                continue;
            }
        };
        let c = &server.counters;
        if c.curr_connections.load(Relaxed) >= server.config.max_connections as u64 {
            c.rejected_connections.fetch_add(1, Relaxed);
            let _ = stream.write_all(b"ERROR Too many open connections\r\n");
            continue;
        }
        c.curr_connections.fetch_add(1, Relaxed);
        c.total_connections.fetch_add(1, Relaxed);
        let server = server.clone();
        drop(handle.spawn(move || {
            if let Err(e) = serve(&stream, &server)
                && server.config.verbose > 0
            {
                eprintln!("kvs: connection closed: {e}");
            }
            server.counters.curr_connections.fetch_sub(1, Relaxed);
        }));
    }
}

/// The requests of one read in flight: their shard replies as they arrive.
#[derive(Default)]
struct Flight {
    replies: Vec<Vec<Option<ShardReply>>>,
}

fn serve<S: ShardHandle>(stream: &TcpStream, server: &Server<S>) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let limits = server.config.limits();
    let nshards = server.shards.len();
    let mut input = Input::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = Vec::with_capacity(64 * 1024);
    let flight = Rc::new(RefCell::new(Flight::default()));
    let pending = Group::new();
    let mut round = Round::new();
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        input.extend(&buf[..n]);
        let mut conn = Conn {
            server,
            flight: &flight,
            pending: &pending,
            now: unix_now(),
        };
        let end = round.plan(&mut input, &limits, nshards, &mut conn);
        // Wait for every reply of this read.
        pending.wait();
        out.clear();
        let replies = |i: usize| -> Vec<ShardReply> {
            flight.borrow_mut().replies[i]
                .drain(..)
                .map(|r| r.expect("reply filed"))
                .collect()
        };
        round.render(end, &mut input, &mut conn, replies, &mut out);
        if !out.is_empty() {
            stream.write_all(&out)?;
            server
                .counters
                .bytes_written
                .fetch_add(out.len() as u64, Relaxed);
        }
        if end != End::Open {
            return Ok(());
        }
        if out.capacity() > 1 << 20 {
            out = Vec::with_capacity(64 * 1024);
        }
    }
}
