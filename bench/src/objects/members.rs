//! Rank 0's side of `bench objects`: the commands that run a part on every rank of the rack
//! (each rank a member of the objects measured) and answer with what the members measured.
//!
//! Commands (answers follow `ok`):
//! - `obj-barrier MODE WINDOW_MS`: O1, `Barrier::wait_unfenced` (`MODE` `unfenced`) or
//!   `Barrier::wait` (`fenced`), or the same algorithm on raw regions (`raw-unfenced`,
//!   `raw-fenced`; see [`RawBarrier`]) in a loop: a warm-up doubles the number of barriers in a row
//!   (from 64) until they take a quarter of the window, member 0 puts its time in a
//!   `SharedArray` every member reads after a fenced barrier (so all run the same count), and
//!   the measured loop runs as many as fit the window. Answers `ITERATIONS SECONDS`, member 0's
//!   time from the barrier before the loop; checks that every member passed as many barriers.
//! - `obj-ring K WINDOW_MS`: O2, a `Ring` written by member 0 of capacity `9 K` words, K
//!   messages of 64 bytes (a message takes one word for its length and 8 for its bytes): the
//!   writer sends 64-byte messages for a quarter window of warm-up, then counts the sends of one
//!   window, then sends an 8-byte end marker; each reader receives until the marker, checking
//!   every message's contents and order. Answers `MESSAGES SECONDS`, the sends counted and the
//!   window as the writer timed it; checks that every reader received every message sent.
//!
//! - `obj-lock ...`, `obj-transfer ...`: O3 (`crate::objects::locks::members`);
//!   `obj-map...`: O4 (`crate::objects::map::members`).
//!
//! Every command opens its objects under a fresh name (`bench/objects/N/...`): a name is open
//! once per node.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ::objects::{Barrier, Ring, RingParams, SharedArray, Work};
use anyhow::{bail, ensure};
use gossamer::{Region, Wire};

use crate::objects::parts::{err, members, on_each};
use serde::{Deserialize, Serialize};

/// Bytes of a broadcast message.
pub(crate) const MESSAGE_BYTES: usize = 64;

/// Words a message takes in a ring: its length, then its bytes.
pub(crate) const MESSAGE_WORDS: usize = 1 + MESSAGE_BYTES / 8;

/// Rank 0's state: how many objects it has named.
#[derive(Debug, Default)]
pub(crate) struct Client {
    opened: u64,
    /// `bench objects-map`: the maps open on the rack.
    maps: crate::objects::map::members::Maps,
}

/// What every member of one command's objects is told.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    /// The members' ranks.
    ranks: Vec<u32>,
    /// The prefix of the objects' names.
    name: String,
    /// `true`: `Barrier::wait`; `false`: `wait_unfenced` (O1). Unused by O2.
    fenced: bool,
    /// O1 on raw regions: each member's counts, one word per member (see [`RawBarrier`]);
    /// `None`: `objects::Barrier`.
    raw: Option<Vec<Region>>,
    /// Messages in flight (O2).
    k: u64,
    window: Duration,
}

/// One member's result: O1 `(iterations, seconds, barriers passed)`, O2 `(messages counted,
/// seconds, messages sent or received)`.
type Part = Result<(u64, f64, u64), String>;

impl Client {
    /// Runs one `obj-...` command; the answer's words after `ok`.
    pub(crate) fn command(&mut self, words: &[&str]) -> anyhow::Result<String> {
        self.opened += 1;
        let ranks: Vec<u32> = gossamer::nodes().map(|n| n.rank()).collect();
        let mut job = Job {
            ranks,
            name: format!("bench/objects/{}", self.opened),
            fenced: false,
            raw: None,
            k: 0,
            window: Duration::ZERO,
        };
        let ms = |w: &str| -> anyhow::Result<Duration> { Ok(Duration::from_millis(w.parse()?)) };
        match words {
            ["obj-barrier", mode, window] => {
                let raw;
                (job.fenced, raw) = match *mode {
                    "fenced" => (true, false),
                    "unfenced" => (false, false),
                    "raw-fenced" => (true, true),
                    "raw-unfenced" => (false, true),
                    _ => bail!("obj-barrier: unknown mode `{mode}`"),
                };
                if raw {
                    let n = job.ranks.len();
                    job.raw = Some(
                        members(&job.ranks)
                            .into_iter()
                            .map(|node| node.region(n))
                            .collect::<Result<_, _>>()?,
                    );
                }
                job.window = ms(window)?;
                let parts = on_each(barrier_part, &job, &job.ranks)?;
                let (iterations, secs, _) = parts[0];
                // Each member passed the warm-up's barriers and the loop's: as many as member 0.
                for (m, p) in parts.iter().enumerate() {
                    ensure!(
                        p.2 == parts[0].2,
                        "member {m} passed {} barriers, member 0 {}",
                        p.2,
                        parts[0].2
                    );
                }
                Ok(format!("{iterations} {secs}"))
            }
            ["obj-ring", k, window] => {
                job.k = k.parse()?;
                ensure!(job.k >= 1, "obj-ring: k must be at least 1");
                job.window = ms(window)?;
                let parts = on_each(ring_part, &job, &job.ranks)?;
                let (counted, secs, sent) = parts[0];
                for (m, p) in parts.iter().enumerate().skip(1) {
                    ensure!(
                        p.2 == sent,
                        "reader {m} received {} messages of the {sent} sent",
                        p.2
                    );
                }
                Ok(format!("{counted} {secs}"))
            }
            [m, ..] if m.starts_with("obj-map") => self.maps.command(words, job.name),
            ["obj-lock" | "obj-transfer", ..] => {
                crate::objects::locks::members::command(words, job.name)
            }
            _ => bail!("unknown objects command `{}`", words.join(" ")),
        }
    }
}

/// O1 on one member.
fn barrier_part(job: Job) -> Part {
    let members = members(&job.ranks);
    let mut barrier =
        ::objects::open::<Barrier>(&format!("{}/barrier", job.name), &(), &members).map_err(err)?;
    let plan =
        ::objects::open::<SharedArray>(&format!("{}/plan", job.name), &1, &members).map_err(err)?;
    let fenced = job.fenced;
    // The barrier measured: `barrier` itself, or the same algorithm on raw regions.
    let mut raw = match job.raw {
        Some(counts) => Some(RawBarrier::new(counts, barrier.me())?),
        None => None,
    };
    let mut wait = |b: &mut Barrier| -> Result<(), String> {
        match &mut raw {
            Some(r) => r.wait(fenced),
            None if fenced => b.wait().map_err(err),
            None => b.wait_unfenced().map_err(err),
        }
    };
    let window = job.window.as_secs_f64();
    let mut n = 64u64;
    let iterations = loop {
        barrier.wait_unfenced().map_err(err)?;
        let t = Instant::now();
        for _ in 0..n {
            wait(&mut barrier)?;
        }
        let secs = t.elapsed().as_secs_f64();
        // Member 0's time decides, for every member alike.
        if plan.me() == 0 {
            plan.store(0, secs.to_bits());
            plan.broadcast(0, &Work::new());
        }
        barrier.wait().map_err(err)?; // fenced: member 0's put has landed
        let secs = f64::from_bits(plan.load(0));
        barrier.wait_unfenced().map_err(err)?; // every member read it before it changes
        if secs >= window / 4.0 {
            break ((n as f64 * window / secs) as u64).max(1);
        }
        n *= 2;
    };
    barrier.wait_unfenced().map_err(err)?;
    let t = Instant::now();
    for _ in 0..iterations {
        wait(&mut barrier)?;
    }
    let secs = t.elapsed().as_secs_f64();
    let passed = barrier.passed() + raw.map_or(0, |r| r.count);
    Ok((iterations, secs, passed))
}

/// O1's barrier written on raw gossamer regions, without the objects crate: the algorithm of
/// `objects::Barrier` (fence every node when fenced, bump this member's count, put it to
/// every other member, wait until every member's count has reached it), to measure what
/// building it from objects costs. Its waits relax as the objects' do (`Rack::relax`).
struct RawBarrier {
    /// Member `m`'s counts: word `j` is member `j`'s count as `m` last heard it.
    counts: Vec<Region>,
    me: usize,
    count: u64,
}

impl RawBarrier {
    fn new(counts: Vec<Region>, me: usize) -> Result<RawBarrier, String> {
        if counts[me].words().is_none() {
            return Err("a member's own region is not mapped here".into());
        }
        Ok(RawBarrier {
            counts,
            me,
            count: 0,
        })
    }

    fn wait(&mut self, fenced: bool) -> Result<(), String> {
        if fenced {
            let fences: Vec<_> = gossamer::nodes().map(gossamer::fence).collect();
            for f in fences {
                f.wait().map_err(err)?;
            }
        }
        self.count += 1;
        let mine = self.counts[self.me].words().expect("checked in new");
        mine[self.me].store(self.count, Ordering::Release);
        let puts: Vec<_> = (0..self.counts.len())
            .filter(|&m| m != self.me)
            .map(|m| self.counts[m].put(self.me, &[self.count]))
            .collect();
        for word in mine {
            while word.load(Ordering::Acquire) < self.count {
                ::objects::Fabric::relax(&::objects::Rack);
            }
        }
        for p in puts {
            p.wait().map_err(err)?;
        }
        Ok(())
    }
}

/// Word `j` of message `i`, as `mpi_objects.c` makes it.
fn word(i: u64, j: u64) -> u64 {
    (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ j
}

/// Message `i`: 8 words, `i`, 0 and six made from `i` (the MPI side's layout; its second word
/// carries the total count, which the ring's end marker makes unnecessary here).
fn message(i: u64) -> [u8; MESSAGE_BYTES] {
    let mut m = [0u8; MESSAGE_BYTES];
    for (j, w) in m.chunks_exact_mut(8).enumerate() {
        let v = match j {
            0 => i,
            1 => 0,
            _ => word(i, j as u64),
        };
        w.copy_from_slice(&v.to_le_bytes());
    }
    m
}

/// The end of a ring's messages: 8 bytes, never a message's length.
const END: [u8; 8] = u64::MAX.to_le_bytes();

/// O2 on one member: the writer (member 0) or a reader.
fn ring_part(job: Job) -> Part {
    let members = members(&job.ranks);
    let params = RingParams {
        writer: 0,
        capacity: MESSAGE_WORDS * job.k as usize,
    };
    let ring =
        ::objects::open::<Ring>(&format!("{}/ring", job.name), &params, &members).map_err(err)?;
    let mut done =
        ::objects::open::<Barrier>(&format!("{}/done", job.name), &(), &members).map_err(err)?;
    let out = match ring {
        Ring::Writer(mut w) => {
            let start = Instant::now();
            let mut sent = 0u64;
            while start.elapsed() < job.window / 4 {
                w.send(&message(sent)).map_err(err)?;
                sent += 1;
            }
            let first = sent;
            let from = Instant::now();
            // At least one message, however late this fiber runs.
            loop {
                w.send(&message(sent)).map_err(err)?;
                sent += 1;
                if from.elapsed() >= job.window {
                    break;
                }
            }
            let secs = from.elapsed().as_secs_f64();
            let counted = sent - first;
            w.send(&END).map_err(err)?;
            w.flush().map_err(err)?;
            (counted, secs, sent)
        }
        Ring::Reader(mut r) => {
            let mut received = 0u64;
            loop {
                let m = r.recv().map_err(err)?;
                if m == END {
                    break;
                }
                if m != message(received) {
                    return Err(format!(
                        "message {received}: {} bytes, first word {:?}",
                        m.len(),
                        m.get(..8)
                    ));
                }
                received += 1;
            }
            (0, 0.0, received)
        }
    };
    // Nobody leaves the ring (and frees its regions) while another member still uses it.
    done.wait().map_err(err)?;
    Ok(out)
}

/// `Wire` is what `spawn_on` sends; asserted here so a change of `Job` fails to compile here.
const _: fn() = || {
    fn wire<T: Wire>() {}
    wire::<Job>();
    wire::<Part>();
};
