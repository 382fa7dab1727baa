//! The system under test: a node of a gossamer rack (`--rack-role gossamer`, started with
//! `GSM_*` variables). Rank 0 runs the client and takes commands from the parent on stdin; the
//! other ranks hold the properties and serve.
//!
//! Commands (answers are `ok ...`, see [`Measured::words`]):
//! - `lat WINDOW_MS`: E1, `apply_with` one call at a time on a counter on the last rank;
//! - `depth DEPTH WINDOW_MS`: E2, `apply_then_with` with `DEPTH` calls unanswered;
//! - `open RATE WINDOW_MS`: E3, `apply_then_with` issued at `RATE` per second;
//! - `check`: the counter must hold exactly what was added to it;
//! - `a2a DEPTH WINDOW_MS SEED`: E4, every rank applies to random properties of the
//!   [`super::PROPERTIES`] spread over the ranks, `DEPTH` calls unanswered each; answers
//!   `ok RATE OPS` after checking that the properties sum to every `x` sent;
//! - `rl-...`: `bench rangelock` (see `crate::rangelock::Server`);
//! - `dur-...`: `bench durable` (see `crate::durable::Client`);
//! - `obj-...`: `bench objects` (see `crate::objects::members::Client`);
//! - `mig-lat RATE WINDOW_MS`: `bench migrate`'s calls while a counter made on this rank
//!   moves between ranks 1 and 2 at `RATE` moves a second; `check-moved` checks that counter.
//! - `far-lat WINDOW_MS`: `bench migrate`'s calls from rank 1 to a counter on rank 2, made
//!   there, and made on this rank and moved there.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use futures::StreamExt as _;
use gossamer::Trust;

use super::Rng;
use super::load::{Measured, OPEN_CAP, Sent, Tally, new_histogram, x_of};

/// The operation measured: add `x`, return the new value.
fn add(c: &mut u64, x: u64) -> u64 {
    *c += x;
    *c
}

/// Runs this process as one node of the rack its `GSM_*` variables describe.
pub(crate) fn run() -> anyhow::Result<()> {
    let code = gossamer::Rack::from_env()
        .try_run(|| {
            if let Err(e) = commands() {
                println!("err {e:#}");
            }
        })
        .map_err(|e| anyhow::anyhow!("gossamer: {e}"))?;
    ensure!(code == 0, "the rack ended with status {code}");
    Ok(())
}

/// Rank 0: reads commands until stdin closes, which ends the job.
fn commands() -> anyhow::Result<()> {
    let (tx, mut rx) = futures::channel::mpsc::unbounded::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.unbounded_send(line).is_err() {
                break;
            }
        }
    });
    let last = gossamer::nodes().last().context("a rack has nodes")?;
    let counter = last.entrust(0u64);
    // E6: the property large arguments are sent to.
    let mut sink: Option<Trust<u64>> = None;
    let mut sent = Sent::default();
    let mut props: Option<(Vec<Trust<u64>>, u64)> = None;
    // `bench regions`: a region on the last rank, and what was added to its counter.
    let mut board: Option<(gossamer::Region, u64)> = None;
    // `bench rangelock`: the lock of one system, on this rank.
    let mut range_lock = crate::rangelock::Server::default();
    // `bench durable`: durable properties on the last rank, and what was sent to them.
    let mut durable = crate::durable::Client::default();
    // `bench am`: the servers of the active messages.
    let mut am = crate::am::client::Client::default();
    // `bench objects`: names the objects it opens.
    let mut objects = crate::objects::members::Client::default();
    // `bench migrate`: the counter it moves between ranks, and what was added to it.
    let moving = gossamer::this_node().trustee(0).entrust(0u64);
    let mut moving_sent = Sent::default();
    println!("ok ready");
    while let Some(line) = gossamer::block_on(rx.next()) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let ms = |w: &str| -> anyhow::Result<Duration> { Ok(Duration::from_millis(w.parse()?)) };
        let answer = match words.as_slice() {
            ["lat", window] => latency(&counter, &mut sent, ms(window)?)?.words(),
            ["depth", depth, window] => {
                closed(&counter, &mut sent, depth.parse()?, ms(window)?)?.words()
            }
            ["open", rate, window] => {
                open(&counter, &mut sent, rate.parse()?, ms(window)?)?.words()
            }
            ["big", bytes, window] => {
                let sink = sink.get_or_insert_with(|| last.entrust(0u64));
                large(sink, bytes.parse()?, ms(window)?)?.words()
            }
            ["mig-lat", rate, window] => {
                moving_latency(&moving, &mut moving_sent, rate.parse()?, ms(window)?)?
            }
            ["far-lat", window] => far_latency(ms(window)?)?,
            ["check-moved"] => {
                let v = moving.apply(|c| *c);
                ensure!(
                    v == moving_sent.added,
                    "the moved counter holds {v}, {} was added",
                    moving_sent.added
                );
                String::new()
            }
            ["check"] => {
                let v = counter.apply(|c| *c);
                ensure!(
                    v == sent.added,
                    "the counter holds {v}, {} was added",
                    sent.added
                );
                String::new()
            }
            ["a2a", depth, window, seed] => {
                let (props, added) = props.get_or_insert_with(|| {
                    let nodes: Vec<_> = gossamer::nodes().collect();
                    let ps = (0..super::PROPERTIES)
                        .map(|i| nodes[i % nodes.len()].entrust(0u64))
                        .collect();
                    (ps, 0)
                });
                let depth: u64 = depth.parse()?;
                let window: u64 = window.parse()?;
                let seed: u64 = seed.parse()?;
                let handles: Vec<_> = gossamer::nodes()
                    .map(|n| {
                        let arg = (props.clone(), depth, window, seed + u64::from(n.rank()));
                        gossamer::spawn_on(n, all_to_all, arg)
                    })
                    .collect();
                let (mut rate, mut ops, mut calls) = (0.0, 0, 0);
                for h in handles {
                    let (o, secs, sent) = h.join();
                    rate += o as f64 / secs;
                    ops += o;
                    calls += sent.0;
                    *added += sent.1;
                }
                let sum: u64 = props.iter().map(|p| p.apply(|v| *v)).sum();
                ensure!(
                    sum == *added,
                    "the properties sum to {sum}, {added} was added"
                );
                format!("{rate} {ops} {calls}")
            }
            [op @ ("rfaa" | "rput" | "rget"), x, window] => {
                let (region, added) = match &mut board {
                    Some(b) => b,
                    None => board.insert((
                        last.region(BOARD_WORDS + 1)
                            .map_err(|e| anyhow::anyhow!("making a region: {e}"))?,
                        0,
                    )),
                };
                region_op(region, added, op, x.parse()?, ms(window)?)?.words()
            }
            ["rcheck"] => {
                let (region, added) = board.as_ref().context("no region yet")?;
                let v = region
                    .get(BOARD_WORDS, 1)
                    .wait()
                    .map_err(|e| anyhow::anyhow!("{e}"))?[0];
                ensure!(
                    v == *added,
                    "the region's counter holds {v}, {added} was added"
                );
                String::new()
            }
            [rl, ..] if rl.starts_with("rl-") => range_lock.command(&words)?,
            [d, ..] if d.starts_with("dur-") => durable.command(&words)?,
            [a, ..] if a.starts_with("am-") => am.command(&words)?,
            [o, ..] if o.starts_with("obj-") => objects.command(&words)?,
            _ => bail!("unknown command `{line}`"),
        };
        println!("ok {answer}");
    }
    Ok(())
}

/// Words of the `bench regions` region for puts and gets (64 KiB); its counter follows them.
const BOARD_WORDS: usize = 8192;

/// `bench regions` on the region of the last rank, from this one: `rfaa DEPTH` (fetch_add on
/// the counter, `DEPTH` at a time; latency per batch), `rput BYTES` (a put and the fence that
/// waits for it to land), `rget BYTES`.
fn region_op(
    region: &gossamer::Region,
    added: &mut u64,
    op: &str,
    x: usize,
    window: Duration,
) -> anyhow::Result<Measured> {
    let fail = |e: gossamer::RegionError| anyhow::anyhow!("{op} {x}: {e}");
    ensure!((1..=BOARD_WORDS * 8).contains(&x), "{op} {x}: out of range");
    let words = (x / 8).max(1);
    let source: Vec<u64> = (0..words as u64).collect();
    let node = region.node();
    let group = gossamer::Group::new();
    // Timed as `mpi_regions.c` times Open MPI: one clock read per operation (or batch), the
    // samples kept in memory and sorted afterwards.
    let mut samples: Vec<u64> = Vec::with_capacity(1 << 20);
    let (t0, mut ops) = (Instant::now(), 0);
    let mut t = t0;
    while t - t0 < window {
        match op {
            "rfaa" => {
                for _ in 0..x {
                    region
                        .fetch_add(BOARD_WORDS, 1)
                        .then(group.track(|v: Result<u64, _>| {
                            v.expect("fetch_add on the benchmark's region");
                        }));
                }
                group.wait();
                *added += x as u64;
                ops += x as u64;
            }
            "rput" => {
                region.put(0, &source).wait().map_err(fail)?;
                gossamer::fence(node).wait().map_err(fail)?;
                ops += 1;
            }
            _ => {
                let got = region.get(0, words).wait().map_err(fail)?;
                ensure!(
                    got.len() == words,
                    "{op} {x}: {} words came back",
                    got.len()
                );
                ops += 1;
            }
        }
        let after = Instant::now();
        if samples.len() < samples.capacity() {
            samples.push((after - t).as_nanos() as u64);
        }
        t = after;
    }
    let mut hist = new_histogram();
    for s in samples {
        hist.record(s.max(1))?;
    }
    Ok(Measured::closed(ops, t - t0, &hist))
}

/// Bytes that serialize as one byte string (as `serde_bytes` would make them), not as a
/// sequence of `u8`s, which would measure serde's per-element calls instead of the transport.
struct Blob(Vec<u8>);

impl serde::Serialize for Blob {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Blob {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = Blob;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<Blob, E> {
                Ok(Blob(bytes.to_vec()))
            }
        }
        deserializer.deserialize_bytes(Visit)
    }
}

/// E6: one `apply_with` at a time carrying `bytes` bytes; each answer must be their count.
fn large(sink: &Trust<u64>, bytes: usize, window: Duration) -> anyhow::Result<Measured> {
    let data: Vec<u8> = (0..bytes).map(|i| i as u8).collect();
    let mut hist = new_histogram();
    let (t0, mut ops) = (Instant::now(), 0);
    while t0.elapsed() < window {
        let start = Instant::now();
        let got = sink.apply_with(
            |seen, data: Blob| {
                *seen += data.0.len() as u64;
                data.0.len() as u64
            },
            Blob(data.clone()),
        );
        hist.record(start.elapsed().as_nanos() as u64)?;
        ensure!(got == bytes as u64, "{bytes} bytes arrived as {got}");
        ops += 1;
    }
    Ok(Measured::closed(ops, t0.elapsed(), &hist))
}

/// E1: one `apply_with` at a time; each answer must be the previous value plus `x`.
fn latency(c: &Trust<u64>, sent: &mut Sent, window: Duration) -> anyhow::Result<Measured> {
    latency_of(sent, window, |x| Ok(c.apply_with(add, x)))
}

/// Rank 0 of `bench migrate`'s rack panel (`mig-lat RATE WINDOW_MS`): puts
/// `counter` (made on this rank) on rank 1, then calls it one call at a time for `window`
/// while a fiber moves it between rank 1 and rank 2 at `rate` moves per second (none at 0).
/// Answers the measurement's words and the number of moves.
fn moving_latency(
    counter: &Trust<u64>,
    sent: &mut Sent,
    rate: u64,
    window: Duration,
) -> anyhow::Result<String> {
    let nodes: Vec<_> = gossamer::nodes().collect();
    ensure!(nodes.len() == 3, "the rack panel runs on three ranks");
    let (one, two) = (nodes[1].trustee(0), nodes[2].trustee(0));
    counter.migrate_to(one)?;
    let stop = Arc::new(AtomicBool::new(false));
    let mover = (rate > 0).then(|| {
        let (counter, stop) = (counter.clone(), stop.clone());
        gossamer::spawn(move || -> Result<u64, gossamer::MigrateError> {
            let gap = Duration::from_secs_f64(1.0 / rate as f64);
            let (mut next, mut moves) = (Instant::now(), 0u64);
            while !stop.load(Ordering::Relaxed) {
                let to = if moves % 2 == 0 { two } else { one };
                counter.migrate_to(to)?;
                moves += 1;
                next += gap;
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    gossamer::sleep(wait);
                }
            }
            Ok(moves)
        })
    });
    let add = |c: &mut u64, x: u64| {
        *c += x;
        *c
    };
    let measured = latency_of(sent, window, |x| Ok(counter.apply_with(add, x)));
    stop.store(true, Ordering::Relaxed);
    let moves = match mover {
        Some(mover) => mover.join()?,
        None => 0,
    };
    ensure!(rate == 0 || moves > 0, "no move happened during the run");
    Ok(format!("{} {moves}", measured?.words()))
}

/// Rank 0 of `bench migrate`'s redirect panel (`far-lat WINDOW_MS`): a fiber of rank 1 calls,
/// one call at a time for `window` each, a counter made on rank 2, and one made on this rank
/// and moved to rank 2 (whose calls skip this rank once rank 1 is told where it went).
/// Answers the two measurements' words.
fn far_latency(window: Duration) -> anyhow::Result<String> {
    let nodes: Vec<_> = gossamer::nodes().collect();
    ensure!(nodes.len() == 3, "the redirect panel runs on three ranks");
    let there = nodes[2].trustee(0);
    let made_there = there.entrust(0u64);
    let moved_there = gossamer::entrust(0u64);
    moved_there.migrate_to(there)?;
    let mut words = Vec::new();
    for counter in [made_there, moved_there] {
        let measured = gossamer::spawn_on(
            nodes[1],
            |(counter, ms): (Trust<u64>, u64)| -> Result<String, String> {
                let window = Duration::from_millis(ms);
                let mut sent = Sent::default();
                latency_of(&mut sent, window, |x| Ok(counter.apply_with(add, x)))
                    .map(|m| m.words())
                    .map_err(|e| format!("{e:#}"))
            },
            (counter, window.as_millis() as u64),
        )
        .join();
        words.push(measured.map_err(anyhow::Error::msg)?);
    }
    Ok(words.join(" "))
}

/// E1 of any call that adds `x` to a counter and answers the new value: `call(x)` one at a
/// time for `window`; each answer must be the previous value plus `x`.
pub(crate) fn latency_of(
    sent: &mut Sent,
    window: Duration,
    mut call: impl FnMut(u64) -> anyhow::Result<u64>,
) -> anyhow::Result<Measured> {
    let mut hist = new_histogram();
    let t0 = Instant::now();
    let mut ops = 0;
    while t0.elapsed() < window {
        let x = x_of(sent.calls);
        let start = Instant::now();
        let v = call(x)?;
        hist.record(start.elapsed().as_nanos() as u64)?;
        sent.calls += 1;
        sent.added += x;
        ensure!(
            v == sent.added,
            "the call answered {v}, {} was added",
            sent.added
        );
        ops += 1;
    }
    let mut m = Measured::closed(ops, t0.elapsed(), &hist);
    m.calls = ops;
    Ok(m)
}

/// Completions of `apply_then_with` calls, counted by their callbacks.
#[derive(Default)]
pub(crate) struct Pending {
    unanswered: Cell<u64>,
    answered: Cell<u64>,
    /// The largest value answered: no answer may exceed what was added.
    max: Cell<u64>,
}

impl Pending {
    fn answer(&self, v: u64) {
        self.unanswered.set(self.unanswered.get() - 1);
        self.answered.set(self.answered.get() + 1);
        self.max.set(self.max.get().max(v));
    }

    /// The callback of one call: counts its answer, the counter's new value.
    pub(crate) fn then(self: &Rc<Self>) -> impl FnOnce(u64) + 'static {
        let p = self.clone();
        move |v| p.answer(v)
    }
}

/// Keeps `depth` calls unanswered, topping them up and then blocking until one is answered,
/// for `window`; returns the time taken and the calls answered in it, once every call made
/// has been answered. `issue(x, group, pending)` makes one call adding `x`, its callback
/// `group.track(pending.then())` (`apply_then_with` on a trust, say).
pub(crate) fn keep_unanswered(
    depth: u64,
    window: Duration,
    sent: &mut Sent,
    pending: &Rc<Pending>,
    mut issue: impl FnMut(u64, &gossamer::Group, &Rc<Pending>),
) -> (Duration, u64) {
    let group = gossamer::Group::new();
    let t0 = Instant::now();
    let result = loop {
        while pending.unanswered.get() < depth {
            let x = sent.next(0);
            pending.unanswered.set(pending.unanswered.get() + 1);
            issue(x, &group, pending);
        }
        group.wait_until_pending_at_most(depth as usize - 1);
        let now = t0.elapsed();
        if now >= window {
            break (now, pending.answered.get());
        }
    };
    group.wait();
    result
}

/// What [`keep_unanswered`] measured, once its answers are checked: none may exceed the sum
/// added.
pub(crate) fn closed_result(
    pending: &Pending,
    sent: &Sent,
    first: u64,
    (secs, counted): (Duration, u64),
) -> anyhow::Result<Measured> {
    ensure!(
        pending.max.get() <= sent.added,
        "an answer ({}) exceeds the sum added ({})",
        pending.max.get(),
        sent.added
    );
    Ok(Measured {
        ops: counted,
        secs: secs.as_secs_f64(),
        calls: sent.calls - first,
        ..Measured::default()
    })
}

/// E2: `apply_then_with` keeping `depth` calls unanswered, issued from this fiber, which tops
/// them up and then blocks until one is answered (`Group::wait_until_pending_at_most`).
///
/// Blocking, not polling: a blocked fiber lets its worker give up the core (spin, then
/// yield, then park) when the machine has more runnable threads than cores. A fiber polling
/// with `yield_now` never lets it, and a rank sharing that core — here the rank holding the
/// property, on 2 cores shared with other work — then waits for whole time slices: about
/// 1,100 calls/s at depth 1 on a loaded machine, against tens of thousands blocking (both
/// reach tens of thousands on an idle one).
fn closed(
    c: &Trust<u64>,
    sent: &mut Sent,
    depth: u64,
    window: Duration,
) -> anyhow::Result<Measured> {
    let first = sent.calls;
    let pending = Rc::new(Pending::default());
    let run = keep_unanswered(depth, window, sent, &pending, |x, group, p| {
        c.apply_then_with(add, x, group.track(p.then()));
    });
    closed_result(&pending, sent, first, run)
}

/// E3: `apply_then_with` issued as calls fall due at `rate` per second; latency runs from each
/// call's due time to its callback. Between issues the fiber blocks until an answer arrives
/// while calls are unanswered (see [`closed`] for why it does not poll), and spins until the
/// next due time when none is (nothing is then waiting for the core); a call that falls due while the fiber is blocked is sent late,
/// and its latency still runs from its due time.
fn open(c: &Trust<u64>, sent: &mut Sent, rate: f64, window: Duration) -> anyhow::Result<Measured> {
    let first = sent.calls;
    let group = gossamer::Group::new();
    let pending = Rc::new(Pending::default());
    let hist = Rc::new(RefCell::new(new_histogram()));
    let tally = Rc::new(RefCell::new(Tally::new(rate, window)));
    loop {
        let now = Instant::now();
        let due = tally.borrow_mut().due(now, pending.unanswered.get());
        for i in due {
            let x = sent.next(0);
            let due_at = tally.borrow().due_time(i);
            pending.unanswered.set(pending.unanswered.get() + 1);
            let (p, h, t) = (pending.clone(), hist.clone(), tally.clone());
            let then = group.track(move |v| {
                let now = Instant::now();
                p.answer(v);
                let _ = h
                    .borrow_mut()
                    .record(now.saturating_duration_since(due_at).as_nanos() as u64);
                t.borrow_mut().answered(now);
            });
            c.apply_then_with(add, x, then);
        }
        if tally.borrow().over(now) {
            break;
        }
        match group.pending() {
            // Nothing in flight, so nothing for the worker to do: spin until the next call
            // falls due rather than yield.
            0 => tally.borrow().spin_until_next_due(),
            n => group.wait_until_pending_at_most(n - 1),
        }
    }
    group.wait();
    debug_assert!(pending.unanswered.get() <= OPEN_CAP);
    let mut m = tally.borrow().finish(&hist.borrow());
    m.calls = sent.calls - first;
    Ok(m)
}

/// E4, on every rank: `apply_then_with` on random properties, `depth` unanswered, for the
/// window; returns the calls answered in the window, the window in seconds, and the calls made
/// and the sum of their `x` (the drained ones too).
fn all_to_all(
    (props, depth, window_ms, seed): (Vec<Trust<u64>>, u64, u64, u64),
) -> (u64, f64, (u64, u64)) {
    let window = Duration::from_millis(window_ms);
    let mut rng = Rng::new(seed);
    let pending = Rc::new(Pending::default());
    let mut sent = Sent::default();
    let (secs, counted) = keep_unanswered(depth, window, &mut sent, &pending, |x, group, p| {
        let t = &props[rng.below(props.len() as u64) as usize];
        t.apply_then_with(add, x, group.track(p.then()));
    });
    (counted, secs.as_secs_f64(), (sent.calls, sent.added))
}
