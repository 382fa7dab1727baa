//! Rank 0's side of `bench durable`: durable properties on the last rank of the rack, the
//! calls made to them, and what was sent, to check them against.
//!
//! Commands (answers follow `ok`):
//! - `dur-setup`: opens (creating them the first time) the counters `once` and `nodedup`
//!   (`Durable<u64>`) and `big` (a `Durable<Vec<u64>>` of [`BIG`] entries);
//! - `dur-lat SYSTEM WINDOW_MS`: E1 on counter `SYSTEM` (`once`: blocking `call`; `nodedup`:
//!   `call_then_without_dedup`, waited for), one call at a time;
//! - `dur-depth SYSTEM DEPTH WINDOW_MS`: E2, `call_then` (or `call_then_without_dedup`) with
//!   `DEPTH` calls unanswered; both answer `Measured::words`;
//! - `dur-check`: each counter, read with `Durable::read`, holds exactly the sum of every `x`
//!   sent to it;
//! - `dur-syncs`: the `fdatasync`s the last rank's process has made so far, and the bytes
//!   it appended to its log;
//! - `dur-snap CALLS`: the snapshot pause: `Set`s on `big`, pipelined until `CALLS / 2` calls
//!   before its next snapshot, then `CALLS` one at a time; answers `P50_US P999_US MAX_US
//!   SNAPSHOTS STATE_BYTES` (the snapshots among the timed calls, the state's encoded size);
//! - `dur-fill PROPS PER`: creates properties `replay-0` … and makes `PER` calls on each;
//! - `dur-reopen PROPS PER`: opens them again (the first open reads the rank's log, each
//!   replays its records) and makes one call; answers `OPEN_US FIRST_OPEN_US FIRST_CALL_US`
//!   (all of them opened, the first opened, the call) once every property holds what
//!   `dur-fill` added.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use gossamer::durable::{CallError, Cx, Durable, Op, SNAPSHOT_RECORDS};
use serde::{Deserialize, Serialize};

use crate::rack::load::{Sent, new_histogram, x_of};
use crate::rack::node::{Pending, closed_result, keep_unanswered, latency_of};

/// Entries of the `big` property (1 Mi `u64`s, 8 MiB in memory).
pub(crate) const BIG: usize = 1 << 20;

/// Calls kept unanswered while filling a property (`dur-snap`'s run-up, `dur-fill`).
const FILL_DEPTH: usize = 1024;

/// The operation measured: add `x` to the counter and answer its new value.
#[derive(Serialize, Deserialize)]
pub(crate) struct Add(pub(crate) u64);

impl Op<u64> for Add {
    const NAME: &'static str = "bench.add";
    type Output = u64;
    fn apply(self, c: &mut u64, _: &mut Cx<u64>) -> u64 {
        *c += self.0;
        *c
    }
}

/// The snapshot pause's op: sets one entry of `big` and answers the value it replaces.
#[derive(Serialize, Deserialize)]
struct Set {
    index: u64,
    value: u64,
}

impl Op<Vec<u64>> for Set {
    const NAME: &'static str = "bench.set";
    type Output = u64;
    fn apply(self, v: &mut Vec<u64>, _: &mut Cx<Vec<u64>>) -> u64 {
        std::mem::replace(&mut v[self.index as usize], self.value)
    }
}

gossamer::durable_ops!(u64: Add);
gossamer::durable_ops!(Vec<u64>: Set);

/// `big`'s first state: full-width values, so that its encoding (postcard varints) is not
/// shrunk by small numbers.
fn big_init() -> Vec<u64> {
    (0..BIG as u64).map(spread).collect()
}

/// A well-mixed 64-bit value of `i` (splitmix64's finaliser).
fn spread(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A counter and what was sent to it.
struct Counter {
    target: Target,
    sent: Sent,
}

/// How a counter is called.
enum Target {
    /// `Durable::call_then` (E1: `call`).
    Once(Durable<u64>),
    /// `Durable::call_then_without_dedup`.
    NoDedup(Durable<u64>),
    /// A plain property answered the way a durable one is, after its trustee's loop round,
    /// through a deferred reply, with no log: what deferred answering alone costs.
    Deferred(gossamer::Trust<u64>),
}

thread_local! {
    /// On the counter's trustee: the deferred answers of this round, sent at its end.
    static HELD: RefCell<Vec<(gossamer::Reply<u64>, u64)>> = const { RefCell::new(Vec::new()) };
}

/// The deferred counter's operation: adds `x` and answers at the end of the round, as a
/// durable property's flush would.
fn add_later(c: &mut u64, x: u64, reply: gossamer::Reply<u64>) {
    *c += x;
    let first = HELD.with(|h| {
        let mut h = h.borrow_mut();
        h.push((reply, *c));
        h.len() == 1
    });
    if first {
        trust::defer(|| {
            for (reply, value) in HELD.with(|h| std::mem::take(&mut *h.borrow_mut())) {
                let _ = reply.send(value);
            }
        });
    }
}

impl Target {
    /// Adds `x`; `done` gets the answer.
    fn call_then(&self, x: u64, done: impl FnOnce(Result<u64, CallError>) + 'static) {
        match self {
            Target::Once(p) => p.call_then(Add(x), done),
            Target::NoDedup(p) => p.call_then_without_dedup(Add(x), done),
            Target::Deferred(t) => t.apply_deferred_then_with(add_later, x, move |v| done(Ok(v))),
        }
    }

    /// What the counter holds.
    fn held(&self) -> anyhow::Result<u64> {
        Ok(match self {
            Target::Once(p) | Target::NoDedup(p) => p.read(|c: &u64| *c)?,
            Target::Deferred(t) => t.apply(|c| *c),
        })
    }
}

/// `big`, the calls made on it and the state they should have made (to check the answers).
struct Big {
    property: Durable<Vec<u64>>,
    calls: u64,
    shadow: Vec<u64>,
}

impl Big {
    /// The next call's `Set`, applied to the shadow; returns it and the value it replaces.
    fn next(&mut self) -> (Set, u64) {
        self.calls += 1;
        let index = spread(self.calls) % BIG as u64;
        let value = spread(self.calls ^ (1 << 63));
        let old = std::mem::replace(&mut self.shadow[index as usize], value);
        (Set { index, value }, old)
    }
}

/// Rank 0's durable properties (none until `dur-setup`).
#[derive(Default)]
pub(crate) struct Client {
    once: Option<Counter>,
    nodedup: Option<Counter>,
    deferred: Option<Counter>,
    big: Option<Big>,
}

/// The rank the properties live on: the last.
fn home() -> anyhow::Result<gossamer::Node> {
    gossamer::nodes().last().context("a rack has nodes")
}

fn ms(word: &str) -> anyhow::Result<Duration> {
    Ok(Duration::from_millis(word.parse()?))
}

/// The answer of a call made in a callback, where it cannot be returned: a call fails only
/// when its property cannot be opened, which would end the measurement anyway.
fn answered(r: Result<u64, CallError>) -> u64 {
    r.unwrap_or_else(|e| panic!("a durable call failed: {e}"))
}

impl Client {
    /// Runs one `dur-...` command; returns its answer's words.
    pub(crate) fn command(&mut self, words: &[&str]) -> anyhow::Result<String> {
        Ok(match words {
            ["dur-setup"] => {
                let home = home()?;
                let counter = |name: &str| -> anyhow::Result<Durable<u64>> {
                    let property = home.durable(name, u64::default)?;
                    // A reopened counter starts from what it holds.
                    let held = property.read(|c: &u64| *c)?;
                    ensure!(held == 0, "counter {name} starts at {held}, not 0");
                    Ok(property)
                };
                let with = |target| Counter {
                    target,
                    sent: Sent::default(),
                };
                self.once = Some(with(Target::Once(counter("once")?)));
                self.nodedup = Some(with(Target::NoDedup(counter("nodedup")?)));
                self.deferred = Some(with(Target::Deferred(home.entrust(0u64))));
                self.big = Some(Big {
                    property: home.durable("big", big_init)?,
                    calls: 0,
                    shadow: big_init(),
                });
                String::new()
            }
            ["dur-lat", system, window] => {
                let c = self.counter(system)?;
                let group = gossamer::Group::new();
                let got: Rc<Cell<Option<Result<u64, CallError>>>> = Rc::default();
                let (target, sent) = (&c.target, &mut c.sent);
                latency_of(sent, ms(window)?, |x| {
                    if let Target::Once(p) = target {
                        return Ok(p.call(Add(x))?);
                    }
                    let slot = got.clone();
                    target.call_then(x, group.track(move |r| slot.set(Some(r))));
                    group.wait();
                    Ok(got
                        .take()
                        .context("a call's callback ran without an answer")??)
                })?
                .words()
            }
            ["dur-depth", system, depth, window] => {
                let depth: u64 = depth.parse()?;
                ensure!(depth > 0, "at least one call outstanding");
                let c = self.counter(system)?;
                let first = c.sent.calls;
                let pending = Rc::new(Pending::default());
                let (target, sent) = (&c.target, &mut c.sent);
                let run = keep_unanswered(depth, ms(window)?, sent, &pending, |x, group, p| {
                    let then = p.then();
                    target.call_then(x, group.track(move |r| then(answered(r))));
                });
                closed_result(&pending, &c.sent, first, run)?.words()
            }
            ["dur-check"] => {
                let counters = [
                    ("once", &self.once),
                    ("nodedup", &self.nodedup),
                    ("deferred", &self.deferred),
                ];
                for (name, c) in counters {
                    let c = c.as_ref().context("no counters: dur-setup first")?;
                    let held = c.target.held()?;
                    ensure!(
                        held == c.sent.added,
                        "counter {name} holds {held}, {} was added to it in {} calls{}",
                        c.sent.added,
                        c.sent.calls,
                        if held > c.sent.added {
                            " (a call ran twice)"
                        } else {
                            ""
                        }
                    );
                }
                String::new()
            }
            ["dur-syncs"] => {
                let (syncs, bytes) =
                    gossamer::spawn_on(home()?, |()| gossamer::durable::store_counts(), ()).join();
                format!("{syncs} {bytes}")
            }
            ["dur-snap", calls] => self.snapshot_pause(calls.parse()?)?,
            ["dur-fill", props, per] => {
                let props = replay_properties(0..props.parse()?)?;
                ensure!(!props.is_empty(), "at least one property");
                let per: u64 = per.parse()?;
                let group = gossamer::Group::new();
                for i in 0..per {
                    for p in &props {
                        p.call_then(
                            Add(x_of(i)),
                            group.track(|r| {
                                answered(r);
                            }),
                        );
                        group.wait_until_pending_at_most(FILL_DEPTH - 1);
                    }
                }
                group.wait();
                check_replayed(&props, per)?;
                String::new()
            }
            ["dur-reopen", props, per] => {
                let t0 = Instant::now();
                // The first open also reads the rank's whole log.
                let mut opened = replay_properties(0..1)?;
                let first_open = t0.elapsed();
                opened.extend(replay_properties(1..props.parse()?)?);
                let props = opened;
                let open = t0.elapsed();
                let t1 = Instant::now();
                let first = props[0].call(Add(0))?;
                let first_call = t1.elapsed();
                let per: u64 = per.parse()?;
                ensure!(
                    first == added_by_fill(per),
                    "the first call after reopening answered {first}, not {}",
                    added_by_fill(per)
                );
                check_replayed(&props, per)?;
                format!(
                    "{} {} {}",
                    open.as_secs_f64() * 1e6,
                    first_open.as_secs_f64() * 1e6,
                    first_call.as_secs_f64() * 1e6
                )
            }
            _ => bail!("unknown command `{}`", words.join(" ")),
        })
    }

    fn counter(&mut self, system: &str) -> anyhow::Result<&mut Counter> {
        match system {
            "once" => self.once.as_mut(),
            "nodedup" => self.nodedup.as_mut(),
            "deferred" => self.deferred.as_mut(),
            other => bail!("no durable system `{other}`"),
        }
        .context("no counters: dur-setup first")
    }

    /// `dur-snap`: `Set`s on `big` pipelined up to `calls / 2` before the call that snapshots
    /// it (every [`SNAPSHOT_RECORDS`]-th), then `calls` one at a time, each timed and its
    /// answer checked; at the end the whole state is checked.
    fn snapshot_pause(&mut self, calls: u64) -> anyhow::Result<String> {
        let big = self.big.as_mut().context("no `big`: dur-setup first")?;
        let every = SNAPSHOT_RECORDS as u64;
        let snapshotting = (big.calls / every + 1) * every;
        let run_up = snapshotting
            .saturating_sub(calls / 2 + 1)
            .saturating_sub(big.calls);
        let group = gossamer::Group::new();
        for _ in 0..run_up {
            let (set, _) = big.next();
            big.property.call_then(
                set,
                group.track(|r| {
                    answered(r);
                }),
            );
            group.wait_until_pending_at_most(FILL_DEPTH - 1);
        }
        group.wait();
        let mut hist = new_histogram();
        let first = big.calls + 1;
        for _ in 0..calls {
            let (set, old) = big.next();
            let start = Instant::now();
            let got = big.property.call(set)?;
            hist.record(start.elapsed().as_nanos() as u64)?;
            ensure!(
                got == old,
                "Set #{} answered {got}, the entry held {old}",
                big.calls
            );
        }
        let snapshots = (first..=big.calls).filter(|n| n % every == 0).count();
        let held = big
            .property
            .read(|v: &Vec<u64>| v.iter().fold(0u64, |a, &x| a.wrapping_mul(31) ^ x))?;
        let expected = big.shadow.iter().fold(0u64, |a, &x| a.wrapping_mul(31) ^ x);
        ensure!(held == expected, "`big` does not hold what was set in it");
        let state_bytes = postcard::to_allocvec(&big.shadow)?.len();
        let us = |q: f64| hist.value_at_quantile(q) as f64 / 1e3;
        Ok(format!(
            "{} {} {} {snapshots} {state_bytes}",
            us(0.5),
            us(0.999),
            hist.max() as f64 / 1e3
        ))
    }
}

/// The properties `dur-fill` fills and `dur-reopen` reopens (those of `range`), opened (or
/// created).
fn replay_properties(range: std::ops::Range<usize>) -> anyhow::Result<Vec<Durable<u64>>> {
    let home = home()?;
    range
        .map(|i| Ok(home.durable(&format!("replay-{i}"), u64::default)?))
        .collect()
}

/// What `dur-fill` adds to each property with `per` calls.
fn added_by_fill(per: u64) -> u64 {
    (0..per).map(x_of).sum()
}

/// Every property holds what `dur-fill` added to it.
fn check_replayed(props: &[Durable<u64>], per: u64) -> anyhow::Result<()> {
    let expected = added_by_fill(per);
    for p in props {
        let held = p.read(|c: &u64| *c)?;
        ensure!(
            held == expected,
            "{} holds {held}, {expected} was added to it",
            p.name()
        );
    }
    Ok(())
}
