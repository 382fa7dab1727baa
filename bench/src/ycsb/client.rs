//! The `ycsb` experiment's client: YCSB's records and operations over memcached's text protocol
//! or Redis's RESP, routed as each system's own clients route them.
//!
//! * A record is YCSB's: key `user<fnvhash64(n)>`, ten fields of 100 letters, stored as one
//!   1,000-byte value (as YCSB's memcached binding stores a record as one item). The bytes are
//!   a function of the record's number, so every read is checked against the value it must
//!   find.
//! * Routing: kvs takes any request on any rank (each client has one connection, to rank
//!   `client % ranks`); memcached instances are picked by the key's point on a ketama
//!   continuum (libketama's: 40 MD5 digests of `ip:port-i` per server, four points each);
//!   Redis Cluster by the key's hash slot (CRC16 of the key or its `{tag}`, mod 16384) and the
//!   slot table `CLUSTER SLOTS` gives. Those clients hold a connection to every server.
//! * [`Client::run`]: every logical client keeps exactly one request in flight (YCSB's client
//!   threads, each waiting for its answer), all driven by one thread through epoll. Latency
//!   runs from writing a request to reading its whole answer.

use std::io::{ErrorKind, Read as _, Write as _};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use hdrhistogram::Histogram;
use md5::{Digest as _, Md5};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use rand::rngs::SmallRng;
use rand::{RngExt as _, SeedableRng as _};

use super::generators::{AcknowledgedCounter, ScrambledZipfian, SkewedLatest, key_name};

/// YCSB's default record: 10 fields of 100 bytes.
pub const FIELDS: usize = 10;
/// Bytes of one field.
pub const FIELD_LEN: usize = 100;
/// Bytes of one stored record.
pub const VALUE_LEN: usize = FIELDS * FIELD_LEN;
/// How long any one answer may take before the run fails naming it.
const PATIENCE: Duration = Duration::from_secs(30);

/// The bytes of record `keynum`: field `f` is 100 letters (`a` to `p`) drawn from
/// `(keynum, f)`.
pub fn record(keynum: u64, out: &mut [u8; VALUE_LEN]) {
    for (f, field) in out.chunks_exact_mut(FIELD_LEN).enumerate() {
        let mut x = keynum.wrapping_mul(FIELDS as u64).wrapping_add(f as u64);
        for chunk in field.chunks_mut(8) {
            // splitmix64: every byte a function of the record and the field.
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            for (b, byte) in chunk.iter_mut().zip(z.to_le_bytes()) {
                *b = b'a' + (byte >> 4);
            }
        }
    }
}

/// The wire protocol a system speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// memcached's text protocol (kvs, memcached).
    Memcached,
    /// RESP (Redis).
    Resp,
}

/// How a request finds its server.
#[derive(Debug, Clone)]
pub enum Routing {
    /// Any server takes any key (kvs: the rank forwards to the key's shard).
    Any,
    /// A ketama continuum: sorted `(point, server)`.
    Ketama(Vec<(u32, usize)>),
    /// Redis Cluster: the server of each of the 16,384 slots.
    Slots(Box<[u8]>),
}

/// The servers of one system and how to reach them.
#[derive(Debug, Clone)]
pub struct Target {
    /// Its servers.
    pub addrs: Vec<SocketAddr>,
    /// Its protocol.
    pub protocol: Protocol,
    /// Its clients' routing.
    pub routing: Routing,
}

impl Target {
    /// The server of `key` for client `client`.
    fn server(&self, key: &[u8], client: usize) -> usize {
        match &self.routing {
            Routing::Any => client % self.addrs.len(),
            Routing::Ketama(points) => ketama_server(points, key),
            Routing::Slots(slots) => usize::from(slots[usize::from(slot(key))]),
        }
    }
}

/// libketama's continuum for `addrs`, equal weights: 160 points per server.
pub fn ketama(addrs: &[SocketAddr]) -> Vec<(u32, usize)> {
    let mut points = Vec::with_capacity(addrs.len() * 160);
    for (server, addr) in addrs.iter().enumerate() {
        for i in 0..40 {
            let digest = Md5::digest(format!("{}:{}-{i}", addr.ip(), addr.port()).as_bytes());
            for h in 0..4 {
                let p = u32::from_le_bytes(digest[h * 4..h * 4 + 4].try_into().expect("4 bytes"));
                points.push((p, server));
            }
        }
    }
    points.sort_unstable();
    points
}

/// The server at the first point at or after the key's hash, wrapping.
fn ketama_server(points: &[(u32, usize)], key: &[u8]) -> usize {
    let digest = Md5::digest(key);
    let h = u32::from_le_bytes(digest[..4].try_into().expect("4 bytes"));
    let i = points.partition_point(|&(p, _)| p < h);
    points[if i == points.len() { 0 } else { i }].1
}

/// Redis Cluster's hash slot of `key`: CRC16 (XMODEM) of the key, or of the text between its
/// first `{` and the next `}` when that is not empty, mod 16384.
pub fn slot(key: &[u8]) -> u16 {
    let mut hashed = key;
    if let Some(open) = key.iter().position(|&b| b == b'{')
        && let Some(len) = key[open + 1..].iter().position(|&b| b == b'}')
        && len > 0
    {
        hashed = &key[open + 1..open + 1 + len];
    }
    let mut crc: u16 = 0;
    for &b in hashed {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// One operation of a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read(u64),
    Insert(u64),
}

/// A YCSB workload's operation mix and key choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// C: 100% reads, scrambled Zipfian keys.
    C,
    /// D: 95% reads of the latest records (skewed latest), 5% inserts.
    D,
}

impl Workload {
    /// YCSB's share of inserts.
    fn insert_proportion(self) -> f64 {
        match self {
            Workload::C => 0.0,
            Workload::D => 0.05,
        }
    }
}

/// One system's records and YCSB's key choosers over them, kept across its runs (workload D's
/// inserts grow the table).
#[derive(Debug)]
pub struct KeySpace {
    inserts: AcknowledgedCounter,
    zipfian: ScrambledZipfian,
    latest: SkewedLatest,
}

impl KeySpace {
    /// The table after YCSB's load phase of `records` records (numbers `0..records`).
    pub fn loaded(records: u64) -> KeySpace {
        let inserts = AcknowledgedCounter::new(records);
        KeySpace {
            // CoreWorkload's range: `insertstart + insertcount + expectednewkeys` with no `- 1`
            // (expectednewkeys is 0 for workload C); the draw past the table is redrawn.
            zipfian: ScrambledZipfian::new(0, records),
            latest: SkewedLatest::new(inserts.last()),
            inserts,
        }
    }

    /// The records stored and acknowledged so far.
    pub fn records(&self) -> u64 {
        self.inserts.last() + 1
    }

    fn next(&mut self, workload: Workload, rng: &mut SmallRng) -> Op {
        if rng.random::<f64>() < workload.insert_proportion() {
            return Op::Insert(self.inserts.next());
        }
        let last = self.inserts.last();
        match workload {
            // CoreWorkload.nextKeynum: draw again past the last acknowledged insert.
            Workload::C => loop {
                let k = self.zipfian.next(rng);
                if k <= last {
                    return Op::Read(k);
                }
            },
            Workload::D => Op::Read(self.latest.next(last, rng)),
        }
    }
}

/// What one run measured.
#[derive(Debug)]
pub struct Outcome {
    /// Operations answered within the window.
    pub ops: u64,
    /// Their latencies, ns.
    pub hist: Histogram<u64>,
    /// The window's length as measured.
    pub elapsed: Duration,
    /// Every answer of the run, warm-up and the last requests in flight included.
    pub answered: u64,
}

/// A request's encoding into `out`.
fn encode(protocol: Protocol, op: Op, key: &[u8], value: &[u8; VALUE_LEN], out: &mut Vec<u8>) {
    out.clear();
    match (protocol, op) {
        (Protocol::Memcached, Op::Read(_)) => {
            out.extend_from_slice(b"get ");
            out.extend_from_slice(key);
            out.extend_from_slice(b"\r\n");
        }
        (Protocol::Memcached, Op::Insert(_)) => {
            out.extend_from_slice(b"set ");
            out.extend_from_slice(key);
            out.extend_from_slice(format!(" 0 0 {VALUE_LEN}\r\n").as_bytes());
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        (Protocol::Resp, Op::Read(_)) => {
            out.extend_from_slice(format!("*2\r\n$3\r\nGET\r\n${}\r\n", key.len()).as_bytes());
            out.extend_from_slice(key);
            out.extend_from_slice(b"\r\n");
        }
        (Protocol::Resp, Op::Insert(_)) => {
            out.extend_from_slice(format!("*3\r\n$3\r\nSET\r\n${}\r\n", key.len()).as_bytes());
            out.extend_from_slice(key);
            out.extend_from_slice(format!("\r\n${VALUE_LEN}\r\n").as_bytes());
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// An answer, parsed.
#[derive(Debug, PartialEq, Eq)]
enum Answer<'a> {
    Value(&'a [u8]),
    Miss,
    Stored,
}

fn line(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

/// Parses one whole answer at the start of `buf`: the answer and its length, `None` while it
/// is incomplete, an error for anything else.
fn parse(protocol: Protocol, buf: &[u8]) -> anyhow::Result<Option<(Answer<'_>, usize)>> {
    let Some(end) = line(buf) else {
        return Ok(None);
    };
    let first = &buf[..end];
    let rest = end + 2;
    match protocol {
        Protocol::Memcached => {
            if first == b"END" {
                return Ok(Some((Answer::Miss, rest)));
            }
            if first == b"STORED" {
                return Ok(Some((Answer::Stored, rest)));
            }
            if let Some(header) = first.strip_prefix(b"VALUE ") {
                let len: usize = std::str::from_utf8(header)
                    .ok()
                    .and_then(|h| h.rsplit(' ').next())
                    .and_then(|n| n.parse().ok())
                    .with_context(|| format!("bad VALUE line {:?}", show(first)))?;
                let total = rest + len + 2 + 5;
                if buf.len() < total {
                    return Ok(None);
                }
                ensure!(
                    &buf[rest + len..total] == b"\r\nEND\r\n",
                    "a VALUE not followed by END: {:?}",
                    show(&buf[rest + len..total])
                );
                return Ok(Some((Answer::Value(&buf[rest..rest + len]), total)));
            }
            bail!("unexpected answer {:?}", show(first))
        }
        Protocol::Resp => match first.first() {
            Some(b'+') if first == b"+OK" => Ok(Some((Answer::Stored, rest))),
            Some(b'$') if first == b"$-1" => Ok(Some((Answer::Miss, rest))),
            Some(b'$') => {
                let len: usize = std::str::from_utf8(&first[1..])
                    .ok()
                    .and_then(|n| n.parse().ok())
                    .with_context(|| format!("bad bulk header {:?}", show(first)))?;
                if buf.len() < rest + len + 2 {
                    return Ok(None);
                }
                Ok(Some((
                    Answer::Value(&buf[rest..rest + len]),
                    rest + len + 2,
                )))
            }
            _ => bail!("unexpected answer {:?}", show(first)),
        },
    }
}

fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned()
}

/// One connection of the run and its request in flight.
#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    server: usize,
    inbuf: Vec<u8>,
    in_flight: Option<(Op, Instant)>,
    /// The logical client this connection belongs to.
    client: usize,
}

/// A YCSB client of one system: its connections, one request in flight per logical client.
#[derive(Debug)]
pub struct Client {
    target: Target,
    poll: Poll,
    conns: Vec<Conn>,
    /// Per logical client: its connection to each server (one, for [`Routing::Any`]).
    clients: Vec<Vec<usize>>,
}

impl Client {
    /// Opens the connections of `clients` logical clients.
    pub fn connect(target: &Target, clients: usize) -> anyhow::Result<Client> {
        let poll = Poll::new()?;
        let mut conns = Vec::new();
        let mut owned = Vec::new();
        for c in 0..clients {
            let servers: Vec<usize> = match target.routing {
                Routing::Any => vec![c % target.addrs.len()],
                _ => (0..target.addrs.len()).collect(),
            };
            let mut mine = Vec::new();
            for server in servers {
                let std = std::net::TcpStream::connect_timeout(&target.addrs[server], PATIENCE)
                    .with_context(|| format!("connecting to {}", target.addrs[server]))?;
                std.set_nodelay(true)?;
                std.set_nonblocking(true)?;
                let mut stream = TcpStream::from_std(std);
                poll.registry()
                    .register(&mut stream, Token(conns.len()), Interest::READABLE)?;
                mine.push(conns.len());
                conns.push(Conn {
                    stream,
                    server,
                    inbuf: Vec::with_capacity(2 * VALUE_LEN),
                    in_flight: None,
                    client: c,
                });
            }
            owned.push(mine);
        }
        Ok(Client {
            target: target.clone(),
            poll,
            conns,
            clients: owned,
        })
    }

    /// The connection of client `c` to the server of `key`.
    fn conn_for(&self, c: usize, key: &[u8]) -> usize {
        let server = self.target.server(key, c);
        let mine = &self.clients[c];
        if mine.len() == 1 {
            mine[0]
        } else {
            mine[server]
        }
    }

    /// Runs `workload` for `warmup`, then measures for `window`, every client with one request
    /// in flight; then waits for every answer still in flight. Every answer is checked.
    pub fn run(
        &mut self,
        keys: &mut KeySpace,
        workload: Workload,
        warmup: Duration,
        window: Duration,
        seed: u64,
    ) -> anyhow::Result<Outcome> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
        let mut events = Events::with_capacity(1024);
        let mut out = Vec::with_capacity(VALUE_LEN + 128);
        let mut value = [0u8; VALUE_LEN];
        let mut expected = [0u8; VALUE_LEN];
        let start = Instant::now();
        let measure_from = start + warmup;
        let stop_at = measure_from + window;
        for c in 0..self.clients.len() {
            self.issue(c, keys, workload, &mut rng, &mut out, &mut value)?;
        }
        let (mut ops, mut answered) = (0u64, 0u64);
        let mut in_flight = self.clients.len();
        let mut last_answer = Instant::now();
        while in_flight > 0 {
            self.poll
                .poll(&mut events, Some(Duration::from_millis(5)))?;
            let now = Instant::now();
            if events.is_empty() {
                ensure!(
                    now - last_answer < PATIENCE,
                    "no answer from {:?} within {PATIENCE:?} ({in_flight} requests in flight)",
                    self.target.addrs
                );
                continue;
            }
            for event in &events {
                let t = event.token().0;
                let Some((op, sent, consumed)) = self.read_answer(t, keys, &mut expected)? else {
                    continue;
                };
                let done = Instant::now();
                last_answer = done;
                answered += 1;
                let conn = &mut self.conns[t];
                conn.inbuf.drain(..consumed);
                ensure!(
                    conn.inbuf.is_empty(),
                    "{}: bytes after the answer: {:?}",
                    self.target.addrs[conn.server],
                    show(&conn.inbuf)
                );
                if let Op::Insert(n) = op {
                    keys.inserts.acknowledge(n);
                }
                if sent >= measure_from && done <= stop_at {
                    ops += 1;
                    hist.record((done - sent).as_nanos().max(1) as u64)?;
                }
                let c = conn.client;
                if done < stop_at {
                    self.issue(c, keys, workload, &mut rng, &mut out, &mut value)?;
                } else {
                    in_flight -= 1;
                }
            }
        }
        Ok(Outcome {
            ops,
            hist,
            elapsed: window,
            answered,
        })
    }

    /// Sends client `c`'s next request.
    fn issue(
        &mut self,
        c: usize,
        keys: &mut KeySpace,
        workload: Workload,
        rng: &mut SmallRng,
        out: &mut Vec<u8>,
        value: &mut [u8; VALUE_LEN],
    ) -> anyhow::Result<()> {
        let op = keys.next(workload, rng);
        let (Op::Read(n) | Op::Insert(n)) = op;
        let key = key_name(n);
        if let Op::Insert(n) = op {
            record(n, value);
        }
        encode(self.target.protocol, op, key.as_bytes(), value, out);
        let t = self.conn_for(c, key.as_bytes());
        let conn = &mut self.conns[t];
        debug_assert!(conn.in_flight.is_none());
        conn.in_flight = Some((op, Instant::now()));
        write_all(&mut conn.stream, out)
            .with_context(|| format!("writing to {}", self.target.addrs[conn.server]))
    }

    /// Reads what connection `t` has; its whole answer, checked, when it is in.
    fn read_answer(
        &mut self,
        t: usize,
        keys: &KeySpace,
        expected: &mut [u8; VALUE_LEN],
    ) -> anyhow::Result<Option<(Op, Instant, usize)>> {
        let conn = &mut self.conns[t];
        let addr = self.target.addrs[conn.server];
        let mut buf = [0u8; 16 * 1024];
        // Until the answer is whole or the socket is empty. A whole answer leaves the socket
        // empty (one request is in flight), so the next answer is a new edge for epoll: that
        // saves the read that would only say so.
        loop {
            match conn.stream.read(&mut buf) {
                Ok(0) => bail!("{addr} closed the connection"),
                Ok(n) => {
                    conn.inbuf.extend_from_slice(&buf[..n]);
                    if parse(self.target.protocol, &conn.inbuf)
                        .with_context(|| format!("from {addr}"))?
                        .is_some()
                    {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e).with_context(|| format!("reading from {addr}")),
            }
        }
        let Some((op, sent)) = conn.in_flight else {
            ensure!(
                conn.inbuf.is_empty(),
                "{addr} answered what was not asked: {:?}",
                show(&conn.inbuf)
            );
            return Ok(None);
        };
        let Some((answer, consumed)) =
            parse(self.target.protocol, &conn.inbuf).with_context(|| format!("from {addr}"))?
        else {
            return Ok(None);
        };
        match (op, answer) {
            (Op::Read(n), Answer::Value(v)) => {
                record(n, expected);
                ensure!(
                    v == &expected[..],
                    "{addr}: the value of record {n} ({}) is not the one stored",
                    key_name(n)
                );
            }
            (Op::Read(n), Answer::Miss) => bail!(
                "{addr}: record {n} ({}) is missing, of {} stored",
                key_name(n),
                keys.records()
            ),
            (Op::Insert(_), Answer::Stored) => {}
            (op, answer) => bail!("{addr}: {answer:?} answered {op:?}"),
        }
        conn.in_flight = None;
        Ok(Some((op, sent, consumed)))
    }
}

/// Writes all of `bytes` to a non-blocking stream, waiting (within [`PATIENCE`]) while its
/// buffer is full.
fn write_all(stream: &mut TcpStream, mut bytes: &[u8]) -> anyhow::Result<()> {
    let deadline = Instant::now() + PATIENCE;
    while !bytes.is_empty() {
        match stream.write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                ensure!(
                    Instant::now() < deadline,
                    "the server took no bytes for {PATIENCE:?}"
                );
                std::thread::sleep(Duration::from_micros(50));
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// YCSB's load phase: stores records `0..records` through blocking connections, one per
/// server, `batch` requests in flight on each.
pub fn load(target: &Target, records: u64, batch: usize) -> anyhow::Result<()> {
    let mut streams = Vec::new();
    for addr in &target.addrs {
        let s = std::net::TcpStream::connect_timeout(addr, PATIENCE)
            .with_context(|| format!("connecting to {addr}"))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(PATIENCE))?;
        streams.push(s);
    }
    let mut value = [0u8; VALUE_LEN];
    let mut out = Vec::new();
    let mut requests: Vec<Vec<u8>> = vec![Vec::new(); streams.len()];
    let mut counts = vec![0usize; streams.len()];
    let mut inbuf = Vec::new();
    let mut next = 0u64;
    while next < records {
        let end = (next + batch as u64).min(records);
        for n in next..end {
            let key = key_name(n);
            record(n, &mut value);
            encode(
                target.protocol,
                Op::Insert(n),
                key.as_bytes(),
                &value,
                &mut out,
            );
            // Loading spreads kvs's records over its ranks as well.
            let server = target.server(key.as_bytes(), n as usize);
            requests[server].extend_from_slice(&out);
            counts[server] += 1;
        }
        for (s, stream) in streams.iter_mut().enumerate() {
            if counts[s] == 0 {
                continue;
            }
            stream
                .write_all(&requests[s])
                .with_context(|| format!("loading into {}", target.addrs[s]))?;
            inbuf.clear();
            let mut answered = 0;
            let mut buf = [0u8; 16 * 1024];
            while answered < counts[s] {
                let n = stream
                    .read(&mut buf)
                    .with_context(|| format!("loading into {}", target.addrs[s]))?;
                ensure!(
                    n > 0,
                    "{} closed the connection while loading",
                    target.addrs[s]
                );
                inbuf.extend_from_slice(&buf[..n]);
                while let Some((answer, used)) = parse(target.protocol, &inbuf)? {
                    ensure!(
                        answer == Answer::Stored,
                        "{}: {answer:?} answered a store",
                        target.addrs[s]
                    );
                    inbuf.drain(..used);
                    answered += 1;
                }
            }
            requests[s].clear();
            counts[s] = 0;
        }
        next = end;
    }
    Ok(())
}

/// A RESP value, as the cluster's setup reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    /// `:n`.
    Int(i64),
    /// A simple or bulk string.
    Text(String),
    /// A nil bulk string.
    Nil,
    /// `*n` and its items.
    Array(Vec<Resp>),
}

/// Sends one RESP command to `addr` and returns its answer, parsed; an error answer (`-ERR …`)
/// is an error (for the cluster's setup: `CLUSTER …` commands, whose answers are short).
pub fn resp_command(addr: SocketAddr, args: &[&str]) -> anyhow::Result<Resp> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, PATIENCE)
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(PATIENCE))?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(req.as_bytes())?;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s
            .read(&mut buf)
            .with_context(|| format!("{args:?} to {addr}"))?;
        ensure!(n > 0, "{addr} closed the connection after {args:?}");
        out.extend_from_slice(&buf[..n]);
        if let Some((answer, _)) =
            resp_parse(&out).with_context(|| format!("{args:?} to {addr}"))?
        {
            return Ok(answer);
        }
    }
}

/// Parses the RESP value at the start of `buf`: the value and its length, `None` while it is
/// incomplete.
fn resp_parse(buf: &[u8]) -> anyhow::Result<Option<(Resp, usize)>> {
    let Some(end) = line(buf) else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[1..end]).context("a RESP line that is not text")?;
    let number = || -> anyhow::Result<i64> {
        head.parse()
            .with_context(|| format!("bad RESP number {head:?}"))
    };
    Ok(Some(match buf[0] {
        b'+' => (Resp::Text(head.to_owned()), end + 2),
        b'-' => bail!("the server answered an error: {head}"),
        b':' => (Resp::Int(number()?), end + 2),
        b'$' if number()? < 0 => (Resp::Nil, end + 2),
        b'$' => {
            let n = number()? as usize;
            let total = end + 2 + n + 2;
            if buf.len() < total {
                return Ok(None);
            }
            let text = String::from_utf8_lossy(&buf[end + 2..end + 2 + n]).into_owned();
            (Resp::Text(text), total)
        }
        b'*' => {
            let mut at = end + 2;
            let mut items = Vec::new();
            for _ in 0..number()?.max(0) {
                let Some((item, len)) = resp_parse(&buf[at..])? else {
                    return Ok(None);
                };
                items.push(item);
                at += len;
            }
            (Resp::Array(items), at)
        }
        other => bail!("not a RESP value: starts with {:?}", other as char),
    }))
}

/// The slot table of a Redis Cluster from one node's `CLUSTER SLOTS`: the server (index into
/// `addrs`, matched by the master's port) of every slot; every slot must have one.
pub fn cluster_slots(addrs: &[SocketAddr]) -> anyhow::Result<Box<[u8]>> {
    let Resp::Array(ranges) = resp_command(addrs[0], &["CLUSTER", "SLOTS"])? else {
        bail!("CLUSTER SLOTS: not an array");
    };
    let mut table = vec![u8::MAX; 16384];
    for range in ranges {
        // [start, end, [ip, port, id, …] of the master, replicas…]
        let Resp::Array(fields) = range else {
            bail!("CLUSTER SLOTS: a range that is not an array");
        };
        let (Some(Resp::Int(start)), Some(Resp::Int(end)), Some(Resp::Array(master))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            bail!("CLUSTER SLOTS: a range without start, end and master: {fields:?}");
        };
        let Some(Resp::Int(port)) = master.get(1) else {
            bail!("CLUSTER SLOTS: a master without a port: {master:?}");
        };
        let owner = addrs
            .iter()
            .position(|a| i64::from(a.port()) == *port)
            .with_context(|| format!("CLUSTER SLOTS names port {port}, not started here"))?;
        ensure!(
            (0..16384).contains(start) && (*start..16384).contains(end),
            "CLUSTER SLOTS: a range {start}..={end} outside the slots"
        );
        for s in *start..=*end {
            table[s as usize] = owner as u8;
        }
    }
    ensure!(
        table.iter().all(|&s| s != u8::MAX),
        "CLUSTER SLOTS leaves slots without a server"
    );
    Ok(table.into_boxed_slice())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_clusters() {
        // From the Redis Cluster specification: the slot of "123456789" is CRC16 0x31C3.
        assert_eq!(slot(b"123456789"), 0x31C3);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
    }

    #[test]
    fn ketama_spreads_keys_over_every_server() {
        let addrs: Vec<SocketAddr> = (0..4)
            .map(|i| format!("127.0.0.1:{}", 11211 + i).parse().unwrap())
            .collect();
        let points = ketama(&addrs);
        assert_eq!(points.len(), 640);
        let mut per = [0usize; 4];
        for n in 0..40_000 {
            per[ketama_server(&points, key_name(n).as_bytes())] += 1;
        }
        assert!(per.iter().all(|&c| c > 5_000), "{per:?}");
        // Adding a server moves only the keys it takes.
        let more = ketama(&[addrs.clone(), vec!["127.0.0.1:11300".parse().unwrap()]].concat());
        for n in 0..2_000 {
            let k = key_name(n);
            let (a, b) = (
                ketama_server(&points, k.as_bytes()),
                ketama_server(&more, k.as_bytes()),
            );
            assert!(a == b || b == 4);
        }
    }

    #[test]
    fn answers_parse_whole_or_not_at_all() {
        let mut v = [0u8; VALUE_LEN];
        record(7, &mut v);
        let mut mc = format!("VALUE user1 0 {VALUE_LEN}\r\n").into_bytes();
        mc.extend_from_slice(&v);
        mc.extend_from_slice(b"\r\nEND\r\n");
        for cut in 0..mc.len() {
            assert_eq!(parse(Protocol::Memcached, &mc[..cut]).unwrap(), None);
        }
        assert_eq!(
            parse(Protocol::Memcached, &mc).unwrap(),
            Some((Answer::Value(&v[..]), mc.len()))
        );
        let mut resp = format!("${VALUE_LEN}\r\n").into_bytes();
        resp.extend_from_slice(&v);
        resp.extend_from_slice(b"\r\n");
        assert_eq!(
            parse(Protocol::Resp, &resp).unwrap(),
            Some((Answer::Value(&v[..]), resp.len()))
        );
        assert_eq!(
            parse(Protocol::Resp, b"$-1\r\n").unwrap(),
            Some((Answer::Miss, 5))
        );
        assert!(parse(Protocol::Resp, b"-MOVED 3999 127.0.0.1:6381\r\n").is_err());
        assert!(parse(Protocol::Memcached, b"SERVER_ERROR out of memory\r\n").is_err());
    }

    #[test]
    fn resp_values_nest() {
        // Redis 7.0's CLUSTER SLOTS of one node that has not learnt its own address yet.
        let slots = b"*1\r\n*3\r\n:0\r\n:16383\r\n*4\r\n$0\r\n\r\n:7311\r\n$2\r\nab\r\n*0\r\n";
        for cut in 0..slots.len() {
            assert_eq!(resp_parse(&slots[..cut]).unwrap(), None, "cut at {cut}");
        }
        let (value, len) = resp_parse(slots).unwrap().unwrap();
        assert_eq!(len, slots.len());
        let master = Resp::Array(vec![
            Resp::Text(String::new()),
            Resp::Int(7311),
            Resp::Text("ab".into()),
            Resp::Array(Vec::new()),
        ]);
        let range = Resp::Array(vec![Resp::Int(0), Resp::Int(16383), master]);
        assert_eq!(value, Resp::Array(vec![range]));
        assert!(resp_parse(b"-ERR no\r\n").is_err());
    }

    #[test]
    fn records_differ_and_are_letters() {
        let (mut a, mut b) = ([0u8; VALUE_LEN], [0u8; VALUE_LEN]);
        record(1, &mut a);
        record(2, &mut b);
        assert_ne!(a, b);
        assert!(a.iter().all(u8::is_ascii_lowercase));
    }
}
