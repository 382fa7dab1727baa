//! A memcached text-protocol load generator on plain `std::net::TcpStream`s and OS threads, so it
//! depends on nothing of the system under test.
//!
//! A [`Client`] holds a few generator threads' worth of connections ([`Conn`]); in a measurement
//! window ([`Client::run`]) each generator thread keeps a window of `depth` requests in flight on
//! every one of its connections (pipelining), waits for answers with `poll(2)`, parses them
//! incrementally, checks each one and sends a new request for every answer it got.
//!
//! Keys are 8 bytes (`00000042`: the key index in decimal), values 16 bytes: an 8-hex-digit *stamp*
//! (0 for the pre-filled value; the writing connection and its write count otherwise) and 8 hex
//! digits derived from the key index and the stamp ([`value`]). Every answer is checked: a `get`
//! must return one value whose stamp names a connection of this client and whose check digits fit its
//! key ([`check_value`]) — so a value stored under another key, a torn or stale-format value, a miss
//! or an error all fail the run — and a `set` must answer `STORED`. Latency runs from the moment the
//! request was handed to the kernel to the moment its answer was read, into an HDR histogram.

use std::collections::VecDeque;
use std::io::{self, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail, ensure};
use hdrhistogram::Histogram;

use crate::harness::Gate;
use crate::workload::{Cursor, Stream, mix};

/// Length of every key, bytes.
pub const KEY_LEN: usize = 8;
/// Length of every value, bytes.
pub const VALUE_LEN: usize = 16;
/// A stamp holds the writing connection's number plus one above this bit, its write count below
/// (so a client may have up to 4,095 connections).
const STAMP_CONN_SHIFT: u32 = 20;
/// Connections one [`Client`] may have, so that each is named by its stamps.
pub const MAX_CONNS: usize = (1 << (32 - STAMP_CONN_SHIFT)) - 1;
/// Largest key index an 8-byte decimal key can name.
pub const MAX_KEYS: u32 = 100_000_000;

/// The key of index `idx`: its eight decimal digits.
///
/// ```
/// assert_eq!(&bench::memcache::key(42), b"00000042");
/// ```
pub fn key(idx: u32) -> [u8; KEY_LEN] {
    debug_assert!(idx < MAX_KEYS);
    let mut k = [b'0'; KEY_LEN];
    let mut x = idx;
    for b in k.iter_mut().rev() {
        *b = b'0' + (x % 10) as u8;
        x /= 10;
    }
    k
}

fn hex8(x: u32) -> [u8; 8] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 8];
    for (i, b) in out.iter_mut().enumerate() {
        *b = DIGITS[(x >> (28 - 4 * i) & 0xf) as usize];
    }
    out
}

fn unhex8(s: &[u8]) -> Option<u32> {
    if s.len() != 8 {
        return None;
    }
    s.iter().try_fold(0u32, |acc, &c| {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        Some(acc << 4 | u32::from(d))
    })
}

fn check_digits(idx: u32, stamp: u32) -> u32 {
    (mix(u64::from(idx) << 32 | u64::from(stamp)) >> 32) as u32
}

/// The value a writer with `stamp` stores under the key of index `idx`.
///
/// ```
/// use bench::memcache::{check_value, value};
/// let v = value(42, 7);
/// assert_eq!(check_value(42, &v), Some(7));
/// assert_eq!(check_value(43, &v), None);
/// ```
pub fn value(idx: u32, stamp: u32) -> [u8; VALUE_LEN] {
    let mut v = [0u8; VALUE_LEN];
    v[..8].copy_from_slice(&hex8(stamp));
    v[8..].copy_from_slice(&hex8(check_digits(idx, stamp)));
    v
}

/// The stamp of `v` if it is a value written for the key of index `idx`, `None` otherwise.
pub fn check_value(idx: u32, v: &[u8]) -> Option<u32> {
    if v.len() != VALUE_LEN {
        return None;
    }
    let stamp = unhex8(&v[..8])?;
    (unhex8(&v[8..])? == check_digits(idx, stamp)).then_some(stamp)
}

/// Appends `get KEY\r\n`.
pub fn encode_get(out: &mut Vec<u8>, idx: u32) {
    out.extend_from_slice(b"get ");
    out.extend_from_slice(&key(idx));
    out.extend_from_slice(b"\r\n");
}

/// Appends `set KEY 0 0 16[ noreply]\r\nVALUE\r\n`.
pub fn encode_set(out: &mut Vec<u8>, idx: u32, stamp: u32, noreply: bool) {
    out.extend_from_slice(b"set ");
    out.extend_from_slice(&key(idx));
    out.extend_from_slice(if noreply {
        b" 0 0 16 noreply\r\n".as_slice()
    } else {
        b" 0 0 16\r\n".as_slice()
    });
    out.extend_from_slice(&value(idx, stamp));
    out.extend_from_slice(b"\r\n");
}

/// One request waiting for its answer.
#[derive(Debug, Clone, Copy)]
struct Req {
    idx: u32,
    write: bool,
    sent: Instant,
}

/// What parsing the front of the input found.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Not all of the answer has arrived.
    Incomplete,
    /// A valid answer of this many bytes; for a `get`, with the stamp of the value.
    Answer {
        /// Bytes the answer took.
        len: usize,
        /// Stamp of the value a `get` returned (0 for a `set`).
        stamp: u32,
    },
}

fn line(buf: &[u8]) -> Option<&[u8]> {
    buf.windows(2).position(|w| w == b"\r\n").map(|p| &buf[..p])
}

fn show(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(120)];
    format!("{:?}", String::from_utf8_lossy(cut))
}

/// Parses the answer to a `set` (`write`) or `get` of key `idx` at the start of `buf`, checking it.
///
/// # Errors
/// When the answer is not `STORED` for a set, or not exactly one value written for the key followed
/// by `END` for a get (a miss is an error: every key is pre-filled and nothing is evicted).
pub fn parse_answer(buf: &[u8], idx: u32, write: bool) -> anyhow::Result<Parsed> {
    let Some(first) = line(buf) else {
        ensure!(
            buf.len() < 4096,
            "answer line longer than 4096 bytes: {}",
            show(buf)
        );
        return Ok(Parsed::Incomplete);
    };
    let k = key(idx);
    if write {
        ensure!(
            first == b"STORED",
            "set {}: expected STORED, got {}",
            show(&k),
            show(first)
        );
        return Ok(Parsed::Answer {
            len: first.len() + 2,
            stamp: 0,
        });
    }
    if first == b"END" {
        bail!(
            "get {}: miss (END), but every key was pre-filled and the server must not evict",
            show(&k)
        );
    }
    let mut words = first.split(|&b| b == b' ');
    let (tag, got_key, _flags, bytes) = (words.next(), words.next(), words.next(), words.next());
    ensure!(
        tag == Some(b"VALUE".as_slice()) && words.next().is_none(),
        "get {}: expected VALUE or END, got {}",
        show(&k),
        show(first)
    );
    ensure!(
        got_key == Some(k.as_slice()),
        "get {}: answer is for another key: {}",
        show(&k),
        show(first)
    );
    let bytes: usize = bytes
        .and_then(|b| std::str::from_utf8(b).ok()?.parse().ok())
        .with_context(|| format!("get {}: bad VALUE line {}", show(&k), show(first)))?;
    ensure!(
        bytes == VALUE_LEN,
        "get {}: value of {bytes} bytes, every value written has {VALUE_LEN}",
        show(&k)
    );
    let data = first.len() + 2;
    let total = data + VALUE_LEN + 2 + 5;
    if buf.len() < total {
        return Ok(Parsed::Incomplete);
    }
    let v = &buf[data..data + VALUE_LEN];
    ensure!(
        &buf[data + VALUE_LEN..total] == b"\r\nEND\r\n",
        "get {}: value not followed by \\r\\nEND\\r\\n: {}",
        show(&k),
        show(&buf[data..total])
    );
    let stamp = check_value(idx, v).ok_or_else(|| {
        anyhow!(
            "get {}: returned {}, which was never written for this key",
            show(&k),
            show(v)
        )
    })?;
    Ok(Parsed::Answer { len: total, stamp })
}

/// Counts and latencies of one generator thread (or of a whole run, merged).
#[derive(Debug)]
pub struct Tally {
    /// Answers received inside the measurement window.
    pub ops: u64,
    /// Of which `set`s.
    pub writes: u64,
    /// Latency of each request answered inside the window, ns.
    pub hist: Histogram<u64>,
}

impl Tally {
    /// Nothing counted yet.
    pub fn new() -> Self {
        Tally {
            ops: 0,
            writes: 0,
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds"),
        }
    }

    /// Adds another tally.
    pub fn merge(&mut self, o: &Tally) -> anyhow::Result<()> {
        self.ops += o.ops;
        self.writes += o.writes;
        self.hist.add(&o.hist).context("merging histograms")
    }
}

impl Default for Tally {
    fn default() -> Self {
        Self::new()
    }
}

/// One connection to the server, with its pipeline.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    /// Number of this connection in its client (stamps name it, plus one).
    id: u32,
    writes: u32,
    input: Vec<u8>,
    consumed: usize,
    output: Vec<u8>,
    flushed: usize,
    inflight: VecDeque<Req>,
}

impl Conn {
    fn connect(addr: SocketAddr, id: u32) -> anyhow::Result<Self> {
        let stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            id,
            writes: 0,
            input: Vec::with_capacity(1 << 16),
            consumed: 0,
            output: Vec::with_capacity(1 << 12),
            flushed: 0,
            inflight: VecDeque::new(),
        })
    }

    fn stamp(&mut self) -> u32 {
        self.writes = self.writes.wrapping_add(1);
        (self.id + 1) << STAMP_CONN_SHIFT | (self.writes & ((1 << STAMP_CONN_SHIFT) - 1))
    }

    /// Queues requests until `depth` are in flight, then writes what the kernel takes.
    fn fill(
        &mut self,
        depth: usize,
        cursor: &mut Cursor,
        write_percent: u32,
    ) -> anyhow::Result<()> {
        if self.inflight.len() >= depth {
            return Ok(());
        }
        let sent = Instant::now();
        while self.inflight.len() < depth {
            let idx = cursor.next_index() as u32;
            let write = cursor.is_write(write_percent);
            if write {
                let stamp = self.stamp();
                encode_set(&mut self.output, idx, stamp, false);
            } else {
                encode_get(&mut self.output, idx);
            }
            self.inflight.push_back(Req { idx, write, sent });
        }
        self.flush()
    }

    /// Writes queued requests until done or the socket would block.
    fn flush(&mut self) -> anyhow::Result<()> {
        while self.flushed < self.output.len() {
            match self.stream.write(&self.output[self.flushed..]) {
                Ok(0) => bail!("the server closed the connection"),
                Ok(n) => self.flushed += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("sending requests"),
            }
        }
        self.output.clear();
        self.flushed = 0;
        Ok(())
    }

    fn wants_write(&self) -> bool {
        self.flushed < self.output.len()
    }

    /// Reads what has arrived (non-blocking socket).
    fn read_available(&mut self) -> anyhow::Result<()> {
        if self.consumed == self.input.len() {
            self.input.clear();
            self.consumed = 0;
        } else if self.consumed > 1 << 15 {
            self.input.drain(..self.consumed);
            self.consumed = 0;
        }
        const CHUNK: usize = 1 << 16;
        loop {
            let old = self.input.len();
            self.input.resize(old + CHUNK, 0);
            match self.stream.read(&mut self.input[old..]) {
                Ok(0) => {
                    self.input.truncate(old);
                    bail!(
                        "the server closed the connection with {} requests unanswered",
                        self.inflight.len()
                    );
                }
                Ok(n) => {
                    self.input.truncate(old + n);
                    if n < CHUNK {
                        return Ok(());
                    }
                }
                Err(e) => {
                    self.input.truncate(old);
                    match e.kind() {
                        io::ErrorKind::WouldBlock => return Ok(()),
                        io::ErrorKind::Interrupted => {}
                        _ => return Err(e).context("reading answers"),
                    }
                }
            }
        }
    }

    /// Consumes every complete answer, checking it; counts those `now` inside the window.
    fn take_answers(
        &mut self,
        now: Instant,
        counting: bool,
        max_stamp_conn: u32,
        tally: &mut Tally,
    ) -> anyhow::Result<()> {
        while let Some(req) = self.inflight.front().copied() {
            let buf = &self.input[self.consumed..];
            match parse_answer(buf, req.idx, req.write)? {
                Parsed::Incomplete => break,
                Parsed::Answer { len, stamp } => {
                    ensure!(
                        stamp >> STAMP_CONN_SHIFT <= max_stamp_conn,
                        "get {}: returned a value stamped by connection {}, which does not exist",
                        show(&key(req.idx)),
                        stamp >> STAMP_CONN_SHIFT
                    );
                    self.consumed += len;
                    self.inflight.pop_front();
                    if counting {
                        tally.ops += 1;
                        tally.writes += u64::from(req.write);
                        let ns = now.saturating_duration_since(req.sent).as_nanos() as u64;
                        tally.hist.saturating_record(ns.max(1));
                    }
                }
            }
        }
        ensure!(
            !self.inflight.is_empty() || self.consumed == self.input.len(),
            "the server sent bytes no request asked for: {}",
            show(&self.input[self.consumed..])
        );
        Ok(())
    }

    /// Sends `text` (blocking) and reads until a line equal to or starting with `until`; returns
    /// everything read.
    fn roundtrip(&mut self, text: &[u8], until: &[u8]) -> anyhow::Result<Vec<u8>> {
        ensure!(
            self.inflight.is_empty(),
            "roundtrip with requests in flight"
        );
        self.stream.set_nonblocking(false)?;
        // Bounded, so a server that never answers fails the experiment instead of hanging it.
        // With a timeout set, Linux never restarts an interrupted read: retry it here.
        self.stream.set_read_timeout(Some(DRAIN_TIMEOUT))?;
        self.stream.write_all(text)?;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = match self.stream.read(&mut buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                read => read?,
            };
            ensure!(n > 0, "the server closed the connection");
            got.extend_from_slice(&buf[..n]);
            let ends = got
                .split(|&b| b == b'\n')
                .any(|l| l.starts_with(until) && l.ends_with(b"\r"));
            if ends {
                return Ok(got);
            }
        }
    }
}

/// Waits until one of `fds` is ready or `timeout` passes.
fn poll(fds: &mut [libc::pollfd], timeout: Duration) -> anyhow::Result<()> {
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `fds` is a valid, exclusively borrowed slice of `pollfd` of the length we pass.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e).context("poll");
        }
    }
    Ok(())
}

/// How the generator loads the server in one window.
#[derive(Debug, Clone, Copy)]
pub struct Load<'a> {
    /// Pre-drawn key indices.
    pub stream: &'a Stream,
    /// Percentage of requests that are `set`s; the rest are `get`s.
    pub write_percent: u32,
    /// Requests in flight per connection.
    pub depth: usize,
    /// Load before the window starts (not counted).
    pub warmup: Duration,
    /// Measurement window.
    pub window: Duration,
    /// Varies the cursors' starting points between runs.
    pub seed: u64,
}

/// How long to wait for outstanding answers after the window before declaring the server stuck.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// Connections to one server, split among generator threads.
#[derive(Debug)]
pub struct Client {
    addr: SocketAddr,
    groups: Vec<Vec<Conn>>,
}

impl Client {
    /// Opens `threads × per_thread` connections to `addr`.
    pub fn connect(addr: SocketAddr, threads: usize, per_thread: usize) -> anyhow::Result<Self> {
        ensure!(
            threads * per_thread <= MAX_CONNS,
            "at most {MAX_CONNS} connections per client"
        );
        let mut id = 0;
        let mut groups = Vec::new();
        for _ in 0..threads {
            let mut g = Vec::new();
            for _ in 0..per_thread {
                g.push(Conn::connect(addr, id)?);
                id += 1;
            }
            groups.push(g);
        }
        Ok(Client { addr, groups })
    }

    fn conns(&self) -> usize {
        self.groups.iter().map(Vec::len).sum()
    }

    /// Stores the pre-filled value (stamp 0) under every key of `from..to`, with pipelined
    /// `set ... noreply` spread over all connections, and waits until the server has processed
    /// them (a `version` round trip on every connection).
    pub fn prefill(&mut self, from: u32, to: u32) -> anyhow::Result<()> {
        ensure!(
            to <= MAX_KEYS,
            "at most {MAX_KEYS} keys fit in 8 decimal digits"
        );
        let conns: Vec<&mut Conn> = self.groups.iter_mut().flatten().collect();
        let n = conns.len() as u32;
        let span = (to - from).div_ceil(n);
        std::thread::scope(|s| {
            let handles: Vec<_> = conns
                .into_iter()
                .enumerate()
                .map(|(i, c)| {
                    let lo = (from + span * i as u32).min(to);
                    let hi = (lo + span).min(to);
                    s.spawn(move || -> anyhow::Result<()> {
                        c.stream.set_nonblocking(false)?;
                        let mut buf = Vec::with_capacity(1 << 16);
                        for idx in lo..hi {
                            encode_set(&mut buf, idx, 0, true);
                            if buf.len() > (1 << 16) - 64 {
                                c.stream.write_all(&buf).context("prefill")?;
                                buf.clear();
                            }
                        }
                        c.stream.write_all(&buf).context("prefill")?;
                        let got = c.roundtrip(b"version\r\n", b"VERSION ")?;
                        ensure!(
                            got.starts_with(b"VERSION "),
                            "prefill: the server answered {} to `set ... noreply`",
                            show(&got)
                        );
                        Ok(())
                    })
                })
                .collect();
            for h in handles {
                h.join()
                    .map_err(|_| anyhow!("a prefill thread panicked"))??;
            }
            Ok(())
        })
    }

    /// The server's `stats` as name–value pairs (on a fresh connection).
    pub fn stats(&self) -> anyhow::Result<Vec<(String, String)>> {
        let mut c = Conn::connect(self.addr, u32::MAX - 1)?;
        let got = c.roundtrip(b"stats\r\n", b"END")?;
        let text = String::from_utf8_lossy(&got);
        Ok(text
            .lines()
            .filter_map(|l| {
                let mut w = l.strip_prefix("STAT ")?.splitn(2, ' ');
                Some((w.next()?.to_owned(), w.next()?.trim().to_owned()))
            })
            .collect())
    }

    /// One measurement: every generator thread loads its connections for `load.warmup +
    /// load.window`, then waits for every outstanding answer. Returns the answers received in the
    /// window, with their latencies, and the window's length.
    pub fn run(&mut self, load: &Load<'_>) -> anyhow::Result<(Tally, Duration)> {
        let gate = Gate::new();
        let max_conn = self.conns() as u32;
        let threads = self.groups.len();
        let (results, elapsed) = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .groups
                .iter_mut()
                .enumerate()
                .map(|(t, conns)| {
                    let gate = &gate;
                    s.spawn(move || drive(conns, t, gate, load, max_conn))
                })
                .collect();
            let t0 = gate.open_when(threads);
            std::thread::sleep(load.warmup + load.window);
            let elapsed = t0.elapsed().saturating_sub(load.warmup);
            gate.stop();
            let results: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
            (results, elapsed)
        });
        let mut total = Tally::new();
        for r in results {
            let tally = r.map_err(|_| anyhow!("a generator thread panicked"))??;
            total.merge(&tally)?;
        }
        Ok((total, elapsed))
    }
}

/// One generator thread: keeps `load.depth` requests in flight on each of `conns` until the gate
/// stops, then drains.
fn drive(
    conns: &mut [Conn],
    thread: usize,
    gate: &Gate,
    load: &Load<'_>,
    max_conn: u32,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::new();
    let mut cursors: Vec<Cursor> = conns
        .iter()
        .map(|c| {
            load.stream
                .cursor(c.id as usize + load.seed as usize * 1024 + thread * 64)
        })
        .collect();
    for c in conns.iter_mut() {
        c.stream.set_nonblocking(true)?;
    }
    let mut fds: Vec<libc::pollfd> = conns
        .iter()
        .map(|c| libc::pollfd {
            fd: c.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    gate.arrive_and_wait();
    let start = gate.opened_at() + load.warmup;
    for (c, cur) in conns.iter_mut().zip(&mut cursors) {
        c.fill(load.depth, cur, load.write_percent)?;
    }
    let mut drain_deadline = None;
    loop {
        let stopping = gate.stopped();
        if stopping {
            if conns.iter().all(|c| c.inflight.is_empty()) {
                break;
            }
            let deadline = *drain_deadline.get_or_insert_with(|| Instant::now() + DRAIN_TIMEOUT);
            ensure!(
                Instant::now() < deadline,
                "the server left {} requests unanswered for {} s after the window",
                conns.iter().map(|c| c.inflight.len()).sum::<usize>(),
                DRAIN_TIMEOUT.as_secs()
            );
        }
        for (fd, c) in fds.iter_mut().zip(conns.iter()) {
            fd.events = libc::POLLIN | if c.wants_write() { libc::POLLOUT } else { 0 };
            fd.revents = 0;
        }
        poll(&mut fds, Duration::from_millis(2))?;
        let now = Instant::now();
        let counting = now >= start && !gate.stopped();
        for ((fd, c), cur) in fds.iter().zip(conns.iter_mut()).zip(&mut cursors) {
            if fd.revents == 0 {
                continue;
            }
            if fd.revents & libc::POLLOUT != 0 {
                c.flush()?;
            }
            if fd.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0 {
                c.read_available()?;
                c.take_answers(now, counting, max_conn, &mut tally)?;
                if !stopping {
                    c.fill(load.depth, cur, load.write_percent)?;
                }
            }
        }
    }
    Ok(tally)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values() {
        assert_eq!(&key(0), b"00000000");
        assert_eq!(&key(99_999_999), b"99999999");
        for (idx, stamp) in [(0, 0), (5, 1 << 24 | 3), (9_999_999, u32::MAX)] {
            let v = value(idx, stamp);
            assert_eq!(check_value(idx, &v), Some(stamp));
            assert_eq!(check_value(idx + 1, &v), None);
            let mut w = v;
            w[3] ^= 1;
            assert_eq!(check_value(idx, &w), None);
        }
        assert_eq!(unhex8(b"0000001f"), Some(31));
        assert_eq!(unhex8(b"0000001F"), None);
    }

    #[test]
    fn parses_and_checks_answers() {
        let mut a = b"VALUE 00000042 0 16\r\n".to_vec();
        a.extend_from_slice(&value(42, 9));
        a.extend_from_slice(b"\r\nEND\r\nSTORED\r\n");
        let p = parse_answer(&a, 42, false).unwrap();
        assert_eq!(p, Parsed::Answer { len: 44, stamp: 9 });
        assert_eq!(
            parse_answer(&a[44..], 1, true).unwrap(),
            Parsed::Answer { len: 8, stamp: 0 }
        );
        for cut in [0, 5, 21, 30, 40, 43] {
            assert_eq!(
                parse_answer(&a[..cut], 42, false).unwrap(),
                Parsed::Incomplete
            );
        }
        assert!(parse_answer(&a, 43, false).is_err(), "other key");
        assert!(parse_answer(b"END\r\n", 1, false).is_err(), "miss");
        assert!(parse_answer(b"NOT_STORED\r\n", 1, true).is_err());
        assert!(parse_answer(b"SERVER_ERROR out of memory\r\n", 1, false).is_err());
        let mut bad = b"VALUE 00000042 0 16\r\n".to_vec();
        bad.extend_from_slice(&value(41, 9));
        bad.extend_from_slice(b"\r\nEND\r\n");
        let e = parse_answer(&bad, 42, false).unwrap_err().to_string();
        assert!(e.contains("never written for this key"), "{e}");
    }

    #[test]
    fn requests_encode() {
        let mut out = Vec::new();
        encode_get(&mut out, 7);
        encode_set(&mut out, 7, 0, true);
        encode_set(&mut out, 7, 0, false);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "get 00000007\r\nset 00000007 0 0 16 noreply\r\n0000000000000000\r\n".replace(
                "0000000000000000",
                std::str::from_utf8(&value(7, 0)).unwrap()
            ) + "set 00000007 0 0 16\r\n"
                + std::str::from_utf8(&value(7, 0)).unwrap()
                + "\r\n"
        );
    }
}
