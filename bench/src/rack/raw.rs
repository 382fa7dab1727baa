//! Raw TCP with `std`: the server (`--rack-role raw`) and its blocking, pipelined and open-loop
//! clients. A request is `x` as 8 little-endian bytes, the answer the counter's new value.
//!
//! The server reads whatever has arrived, adds every whole request in order and answers all of
//! them with one write: one request per read for a blocking client, a batch for a pipelined one.

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};

use super::load::{DRAIN, Measured, Tally, new_histogram, x_of};

/// Serves connections one after another on a loopback port it prints as `ok PORT`.
pub(crate) fn serve() -> anyhow::Result<()> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    println!("ok {}", listener.local_addr()?.port());
    let mut counter = 0u64;
    for stream in listener.incoming() {
        let mut s = stream?;
        s.set_nodelay(true)?;
        let mut buf = vec![0u8; 64 << 10];
        let mut have = 0;
        let mut out = Vec::with_capacity(64 << 10);
        loop {
            let n = match s.read(&mut buf[have..]) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            have += n;
            let whole = have / 8 * 8;
            for req in buf[..whole].chunks_exact(8) {
                let x = u64::from_le_bytes(req.try_into().expect("8 bytes"));
                counter += x;
                out.extend_from_slice(&counter.to_le_bytes());
            }
            if s.write_all(&out).is_err() {
                break;
            }
            out.clear();
            buf.copy_within(whole..have, 0);
            have -= whole;
        }
    }
    Ok(())
}

/// A connection to the raw server, checking every answer: answers come in request order, so
/// each must be the previous one plus the request's `x`.
#[derive(Debug)]
pub(crate) struct RawClient {
    stream: TcpStream,
    /// The counter's value after the last answer read.
    value: u64,
    /// Requests sent so far on this connection (picks the next `x`).
    sent: u64,
    /// `x` of the requests sent and not yet answered, oldest first.
    pending: std::collections::VecDeque<u64>,
}

impl RawClient {
    pub(crate) fn connect(addr: SocketAddr) -> anyhow::Result<RawClient> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
            .with_context(|| format!("connecting to the raw server at {addr}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut c = RawClient {
            stream,
            value: 0,
            sent: 0,
            pending: Default::default(),
        };
        // Learn the counter's current value (another connection may have added to it).
        c.stream.write_all(&0u64.to_le_bytes())?;
        let mut b = [0u8; 8];
        c.stream.read_exact(&mut b)?;
        c.value = u64::from_le_bytes(b);
        Ok(c)
    }

    fn encode(&mut self, n: u64, out: &mut Vec<u8>) {
        for _ in 0..n {
            let x = x_of(self.sent);
            self.sent += 1;
            self.pending.push_back(x);
            out.extend_from_slice(&x.to_le_bytes());
        }
    }

    fn check(&mut self, answer: &[u8]) -> anyhow::Result<()> {
        let v = u64::from_le_bytes(answer.try_into().expect("8 bytes"));
        let x = self
            .pending
            .pop_front()
            .context("raw server answered a request never sent")?;
        ensure!(
            v == self.value + x,
            "raw server answered {v} where {} + {x} was due",
            self.value
        );
        self.value = v;
        Ok(())
    }

    /// E1: one request at a time for `window`.
    pub(crate) fn latency(&mut self, window: Duration) -> anyhow::Result<Measured> {
        let mut hist = new_histogram();
        let mut req = Vec::with_capacity(8);
        let mut ans = [0u8; 8];
        let t0 = Instant::now();
        let mut ops = 0;
        loop {
            let start = Instant::now();
            if start - t0 >= window {
                break;
            }
            req.clear();
            self.encode(1, &mut req);
            self.stream.write_all(&req)?;
            self.stream.read_exact(&mut ans)?;
            hist.record(start.elapsed().as_nanos() as u64)?;
            self.check(&ans)?;
            ops += 1;
        }
        Ok(Measured::closed(ops, t0.elapsed(), &hist))
    }

    /// E2: `depth` requests kept in flight; every read's answers are replaced by as many new
    /// requests in one write.
    pub(crate) fn pipelined(&mut self, depth: u64, window: Duration) -> anyhow::Result<Measured> {
        let mut out = Vec::with_capacity(depth as usize * 8);
        let mut buf = vec![0u8; (depth as usize * 8).max(64 << 10)];
        let mut have = 0;
        let t0 = Instant::now();
        let first = self.sent;
        let mut ops = 0;
        let mut stopping = false;
        let mut stopped_at = None;
        self.encode(depth, &mut out);
        self.stream.write_all(&out)?;
        while !self.pending.is_empty() {
            let n = self.stream.read(&mut buf[have..])?;
            ensure!(n > 0, "raw server closed the connection");
            have += n;
            let whole = have / 8 * 8;
            let answers = (whole / 8) as u64;
            for i in 0..whole / 8 {
                let a: [u8; 8] = buf[i * 8..i * 8 + 8].try_into().expect("8 bytes");
                self.check(&a)?;
            }
            buf.copy_within(whole..have, 0);
            have -= whole;
            if !stopping {
                ops += answers;
                if t0.elapsed() >= window {
                    stopping = true; // drain what is in flight
                    stopped_at = Some(t0.elapsed());
                } else {
                    out.clear();
                    self.encode(answers, &mut out);
                    self.stream.write_all(&out)?;
                }
            }
        }
        Ok(Measured {
            ops,
            secs: stopped_at.unwrap_or_else(|| t0.elapsed()).as_secs_f64(),
            calls: self.sent - first,
            ..Measured::default()
        })
    }

    /// E3: requests due at `rate` per second, written as they fall due (several in one write
    /// when more than one is due); latency runs from each request's due time. While requests
    /// are unanswered the client blocks in `read`, and spins until the next due time when none
    /// is — the policy of every E3 client (see `node::open`).
    pub(crate) fn open(&mut self, rate: f64, window: Duration) -> anyhow::Result<Measured> {
        let mut hist = new_histogram();
        let mut tally = Tally::new(rate, window);
        let mut out: Vec<u8> = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        let mut have = 0;
        let mut due_times = std::collections::VecDeque::new();
        let deadline = Instant::now() + window + DRAIN;
        loop {
            let now = Instant::now();
            let fresh = tally.due(now, self.pending.len() as u64);
            for i in fresh.clone() {
                due_times.push_back(tally.due_time(i));
            }
            out.clear();
            self.encode(fresh.end - fresh.start, &mut out);
            self.stream.write_all(&out)?;
            if self.pending.is_empty() {
                if tally.over(now) {
                    break;
                }
                tally.spin_until_next_due();
                continue;
            }
            // Blocks (the stream's read timeout bounds it) until an answer arrives.
            let n = self.stream.read(&mut buf[have..])?;
            ensure!(n > 0, "raw server closed the connection");
            have += n;
            let now = Instant::now();
            let whole = have / 8 * 8;
            for i in 0..whole / 8 {
                let a: [u8; 8] = buf[i * 8..i * 8 + 8].try_into().expect("8 bytes");
                self.check(&a)?;
                let due: Instant = due_times.pop_front().expect("one per request");
                hist.record(now.saturating_duration_since(due).as_nanos() as u64)?;
                tally.answered(now);
            }
            buf.copy_within(whole..have, 0);
            have -= whole;
            ensure!(
                Instant::now() < deadline,
                "raw open loop: {} answers missing after the drain",
                self.pending.len()
            );
        }
        Ok(tally.finish(&hist))
    }
}
