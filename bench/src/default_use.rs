//! `default-use`: the newcomer's tasks, written as a user first writes them, with the runtime's
//! defaults, idle and beside one busy loop per core.
//!
//! Every task builds its runtime as the README shows (`Runtime::builder().workers(N).build()`,
//! N the cores), pins nothing and sets no window unless the system's name says so:
//!
//! - **word count**: a generated text of Zipf-distributed words counted into 16 sharded
//!   `Trust<HashMap<String, u64>>`, one `apply_then` per word from one fiber per worker (every
//!   callback tracked by a `Group` that the fiber waits for at the end), without a window and
//!   with a `Group` window of 256; `DashMap<String, u64>` and 16 `Mutex<HashMap>` shards with N
//!   threads. Every result must equal the count made beforehand on one thread.
//! - **tokio**: a counter incremented from a multi-thread tokio runtime with N workers, through
//!   `apply_async`, `tokio::sync::Mutex` and `std::sync::Mutex` (locked inside the task):
//!   awaited one at a time from one task, and from 200 tasks joined.
//! - **threads**: N plain threads calling `apply`, against `std::sync::Mutex` and
//!   `parking_lot::Mutex`.
//! - **gsm demo**: the `gsm` binary built beside the benchmark runs `gsm demo --runs 1`, one
//!   invocation per run, and its table is read back (each line's ops/s).
//!
//! The figure's x is the condition (see [`crate::busy`]); y is nanoseconds per operation (per
//! word for the word count). The goals of issue 43 are printed beside it, not asserted.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::ops::Range;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Zipf};
use trust::{Group, Runtime, Trust};

use crate::busy::Condition;
use crate::figure::{Figure, Panel, XFormat, count, sig};
use crate::harness::Ctx;

/// Shards of the word-count maps (trust and `Mutex`).
const SHARDS: usize = 16;
/// The `Group` window of the windowed word count.
const WORD_WINDOW: usize = 256;
/// Distinct words of the generated text.
const VOCABULARY: usize = 100_000;
/// The flag of a point one of whose runs stopped at the time limit.
const TIME_LIMIT: &str = "a run stopped at the time limit (10 windows): per word or operation \
     of those done by then";
/// The flag of a demo line that made no operation in one run's window.
const NO_OPERATION: &str = "a run made no operation in its window (no sample)";
/// Words of the text (`--quick`: [`QUICK_WORDS`]).
const WORDS: usize = 2_000_000;
const QUICK_WORDS: usize = 20_000;
/// Increments awaited one at a time from one tokio task.
const AWAITED: u64 = 20_000;
const QUICK_AWAITED: u64 = 500;
/// Tokio tasks joined, and increments each.
const TASKS: u64 = 200;
const TASK_OPS: u64 = 1_000;
const QUICK_TASKS: u64 = 20;
const QUICK_TASK_OPS: u64 = 100;

const WC_NO_WINDOW: &str = "trust apply_then, no window";
const WC_WINDOW: &str = "trust apply_then, Group window 256";
const WC_DASHMAP: &str = "dashmap";
const WC_MUTEX: &str = "std Mutex ×16 shards";
const APPLY_ASYNC: &str = "trust apply_async";
const TOKIO_MUTEX: &str = "tokio::sync::Mutex";
const STD_MUTEX: &str = "std::sync::Mutex";
const APPLY: &str = "trust apply";
const PARKING_LOT: &str = "parking_lot::Mutex";
/// The demo's line whose goal is ≥ 1× parking_lot's rate.
const DEMO_APPLY_THEN: &str = "Trust apply_then (shared trustees)";

/// The generated text and where each worker's part of it lies.
struct Text {
    text: String,
    parts: Vec<Range<usize>>,
}

impl Text {
    /// `words` words drawn Zipf(1) from [`VOCABULARY`] words, split at spaces into `parts`.
    fn generate(words: usize, parts: usize) -> Text {
        let mut rng = SmallRng::seed_from_u64(43);
        let zipf = Zipf::new(VOCABULARY as f64, 1.0).expect("valid Zipf parameters");
        let mut text = String::with_capacity(words * 6);
        for i in 0..words {
            if i > 0 {
                text.push(' ');
            }
            let rank = (zipf.sample(&mut rng) as usize).clamp(1, VOCABULARY);
            push_word(&mut text, rank);
        }
        let mut bounds = vec![0];
        for k in 1..parts {
            let mut at = text.len() * k / parts;
            while at < text.len() && text.as_bytes()[at] != b' ' {
                at += 1;
            }
            bounds.push(at.max(*bounds.last().expect("starts with 0")));
        }
        bounds.push(text.len());
        let parts = bounds.windows(2).map(|b| b[0]..b[1]).collect();
        Text { text, parts }
    }

    fn part(&self, i: usize) -> &str {
        &self.text[self.parts[i].clone()]
    }

    /// The words of each part.
    fn part_words(&self) -> Vec<usize> {
        (0..self.parts.len())
            .map(|i| self.part(i).split_ascii_whitespace().count())
            .collect()
    }

    /// The count, made on one thread, of the first `counted[i]` words of each part `i`, which
    /// every system's count of them must equal.
    fn reference(&self, counted: &[usize]) -> HashMap<String, u64> {
        let mut counts = HashMap::new();
        for (i, &n) in counted.iter().enumerate() {
            for word in self.part(i).split_ascii_whitespace().take(n) {
                *counts.entry(word.to_owned()).or_insert(0) += 1;
            }
        }
        counts
    }
}

/// Word number `rank` (1 the most frequent): `rank` in bijective base 26, so every rank has its
/// own word and frequent words are short, as in a language.
fn push_word(out: &mut String, mut rank: usize) {
    let mut letters = Vec::new();
    while rank > 0 {
        rank -= 1;
        letters.push(b'a' + (rank % 26) as u8);
        rank /= 26;
    }
    out.extend(letters.iter().rev().map(|&b| char::from(b)));
}

/// The shard of `word`, as a user shards by the standard hasher.
fn shard_of(word: &str) -> usize {
    let mut h = DefaultHasher::new();
    word.hash(&mut h);
    (h.finish() % SHARDS as u64) as usize
}

/// A word count: its time, the counts, and how many words of each part were counted (all of
/// them unless the time limit stopped it).
type Counted = (Duration, HashMap<String, u64>, Vec<usize>);

/// The words of `part` counted before `deadline`: all of them, or those before the first
/// 64-word boundary reached after it. (Beside busy loops a slow system would otherwise run for
/// many minutes.)
fn words_before(part: &str, deadline: Instant) -> impl Iterator<Item = &str> {
    part.split_ascii_whitespace()
        .enumerate()
        .take_while(move |(i, _)| i % 64 != 0 || Instant::now() < deadline)
        .map(|(_, w)| w)
}

/// Counts `text` into 16 entrusted maps, one `apply_then` per word from one fiber per worker;
/// with `window`, a fiber waits while more than that many of its requests are unanswered.
fn count_trust(
    rt: &Runtime,
    text: &Arc<Text>,
    window: Option<usize>,
    deadline: Instant,
) -> Counted {
    let shards: Arc<Vec<Trust<HashMap<String, u64>>>> =
        Arc::new((0..SHARDS).map(|_| rt.entrust(HashMap::new())).collect());
    let t0 = Instant::now();
    let fibers: Vec<_> = (0..rt.client_workers())
        .map(|w| {
            let (shards, text) = (shards.clone(), text.clone());
            rt.spawn_on(w, move || {
                let group = Group::new();
                let mut counted = 0;
                for word in words_before(text.part(w), deadline) {
                    let word = word.to_owned();
                    shards[shard_of(&word)].apply_then(
                        move |counts| *counts.entry(word).or_insert(0) += 1,
                        group.track(|()| {}),
                    );
                    counted += 1;
                    if let Some(window) = window {
                        group.wait_until_pending_at_most(window);
                    }
                }
                group.wait();
                counted
            })
        })
        .collect();
    let counted = fibers.into_iter().map(|f| f.join()).collect();
    let elapsed = t0.elapsed();
    let mut counts = HashMap::new();
    for shard in shards.iter() {
        counts.extend(shard.apply(std::mem::take));
    }
    (elapsed, counts, counted)
}

/// Counts `text` into a `DashMap` from `threads` threads.
fn count_dashmap(text: &Text, threads: usize, deadline: Instant) -> Counted {
    let map = dashmap::DashMap::<String, u64>::new();
    let t0 = Instant::now();
    let counted = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let map = &map;
                s.spawn(move || {
                    let mut counted = 0;
                    for word in words_before(text.part(t), deadline) {
                        *map.entry(word.to_owned()).or_insert(0) += 1;
                        counted += 1;
                    }
                    counted
                })
            })
            .collect();
        joined(handles)
    });
    (t0.elapsed(), map.into_iter().collect(), counted)
}

/// Counts `text` into 16 `Mutex<HashMap>` shards from `threads` threads.
fn count_mutex(text: &Text, threads: usize, deadline: Instant) -> Counted {
    let shards: Vec<Mutex<HashMap<String, u64>>> =
        (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect();
    let t0 = Instant::now();
    let counted = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let shards = &shards;
                s.spawn(move || {
                    let mut counted = 0;
                    for word in words_before(text.part(t), deadline) {
                        let mut shard = shards[shard_of(word)].lock().expect("no thread panicked");
                        *shard.entry(word.to_owned()).or_insert(0) += 1;
                        counted += 1;
                    }
                    counted
                })
            })
            .collect();
        joined(handles)
    });
    let elapsed = t0.elapsed();
    let counts = shards
        .into_iter()
        .flat_map(|m| m.into_inner().expect("no thread panicked"))
        .collect();
    (elapsed, counts, counted)
}

/// Each scoped thread's count of words.
fn joined(handles: Vec<std::thread::ScopedJoinHandle<'_, usize>>) -> Vec<usize> {
    handles
        .into_iter()
        .map(|h| h.join().expect("no thread panicked"))
        .collect()
}

/// The counter a tokio user increments.
#[derive(Clone)]
enum Counter {
    Trust(Trust<u64>),
    Tokio(Arc<tokio::sync::Mutex<u64>>),
    Std(Arc<Mutex<u64>>),
}

impl Counter {
    fn new(system: &str, rt: &Runtime) -> Counter {
        match system {
            APPLY_ASYNC => Counter::Trust(rt.entrust(0)),
            TOKIO_MUTEX => Counter::Tokio(Arc::default()),
            _ => Counter::Std(Arc::default()),
        }
    }

    async fn increment(&self) {
        match self {
            Counter::Trust(t) => t.apply_async(|c| *c += 1).await,
            Counter::Tokio(m) => *m.lock().await += 1,
            Counter::Std(m) => *m.lock().expect("no task panicked") += 1,
        }
    }

    /// `ops` increments one after the other, or those made before `deadline` (looked at every
    /// 64): how many were made.
    async fn increments(&self, ops: u64, deadline: Instant) -> u64 {
        for i in 0..ops {
            if i % 64 == 0 && Instant::now() >= deadline {
                return i;
            }
            self.increment().await;
        }
        ops
    }

    fn value(&self) -> u64 {
        match self {
            Counter::Trust(t) => t.apply(|c| *c),
            Counter::Tokio(m) => *m.try_lock().expect("no task holds the lock"),
            Counter::Std(m) => *m.lock().expect("no task panicked"),
        }
    }
}

/// `ops` increments awaited one at a time from one task; the time per increment.
fn tokio_awaited(
    tokio: &tokio::runtime::Runtime,
    counter: &Counter,
    ops: u64,
    deadline: Instant,
) -> anyhow::Result<(Duration, u64)> {
    let c = counter.clone();
    let t0 = Instant::now();
    let task = tokio.spawn(async move { c.increments(ops, deadline).await });
    let done = tokio.block_on(task).context("the task panicked")?;
    Ok((t0.elapsed(), done))
}

/// `tasks` tasks of `ops` increments each, spawned together and joined.
fn tokio_joined(
    tokio: &tokio::runtime::Runtime,
    counter: &Counter,
    tasks: u64,
    ops: u64,
    deadline: Instant,
) -> anyhow::Result<(Duration, u64)> {
    let t0 = Instant::now();
    let done = tokio.block_on(async {
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let c = counter.clone();
                tokio::spawn(async move { c.increments(ops, deadline).await })
            })
            .collect();
        let mut done = 0;
        for h in handles {
            done += h.await.context("a task panicked")?;
        }
        anyhow::Ok(done)
    })?;
    Ok((t0.elapsed(), done))
}

/// `threads` plain threads incrementing through `increment` until `window` has passed (the
/// stop flag is read before each increment, so a slow one ends the window late by one call):
/// the time from the start until the last thread stopped, and the increments made. (A window rather than a count: beside busy loops an `apply` from a plain
/// thread can take a scheduler time slice, and a count would take minutes.)
fn threads_loop(
    threads: usize,
    window: Duration,
    increment: &(impl Fn() + Sync),
) -> (Duration, u64) {
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    let ops = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut ops = 0;
                    while !stop.load(Ordering::Relaxed) {
                        increment();
                        ops += 1;
                    }
                    ops
                })
            })
            .collect();
        std::thread::sleep(window);
        stop.store(true, Ordering::Relaxed);
        handles
            .into_iter()
            .map(|h| h.join().expect("no thread panicked"))
            .sum()
    });
    (t0.elapsed(), ops)
}

/// One `gsm demo --runs 1` invocation: each line's rate in operations per second.
fn demo_once(gsm: &Path, seconds: f64) -> anyhow::Result<Vec<(String, f64)>> {
    let out = Command::new(gsm)
        .args(["demo", "--runs", "1", "--seconds", &format!("{seconds}")])
        .output()
        .with_context(|| format!("running {} demo", gsm.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "`gsm demo` failed ({}): {}{}",
        out.status,
        text.trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    parse_demo(&text)
}

/// Reads `gsm demo`'s table: after the `system` heading, each line is the system's name
/// (padded to 42 columns) and then its ops/s with thousands separators.
fn parse_demo(out: &str) -> anyhow::Result<Vec<(String, f64)>> {
    const NAME_WIDTH: usize = 42;
    let mut lines = out.lines().skip_while(|l| !l.starts_with("system "));
    lines
        .next()
        .with_context(|| format!("`gsm demo` printed no table: {out}"))?;
    let mut rates = Vec::new();
    for line in lines.take_while(|l| !l.trim().is_empty()) {
        let (Some(name), Some(rest)) = (line.get(..NAME_WIDTH), line.get(NAME_WIDTH..)) else {
            bail!("`gsm demo`'s line `{line}` is not `name ops/s ...`");
        };
        let rate: f64 = rest
            .split_whitespace()
            .next()
            .map(|r| r.replace(',', ""))
            .and_then(|r| r.parse().ok())
            .with_context(|| format!("`gsm demo`'s line `{line}` has no ops/s"))?;
        rates.push((name.trim().to_owned(), rate));
    }
    ensure!(!rates.is_empty(), "`gsm demo`'s table is empty: {out}");
    Ok(rates)
}

/// Runs the experiment and returns its figure.
pub fn run(ctx: &mut Ctx) -> anyhow::Result<Figure> {
    let n = ctx.cores;
    let (words, awaited, tasks, task_ops) = if ctx.quick {
        (QUICK_WORDS, QUICK_AWAITED, QUICK_TASKS, QUICK_TASK_OPS)
    } else {
        (WORDS, AWAITED, TASKS, TASK_OPS)
    };
    let rt = Runtime::builder()
        .workers(n)
        .build()
        .context("building the trust runtime")?;
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(n)
        .build()
        .context("building the tokio runtime")?;
    let gsm = crate::kvs::workspace_binary(ctx, "gsm", "gsm command")?;
    let text = Arc::new(Text::generate(words, rt.client_workers()));
    let part_words = text.part_words();
    let reference = text.reference(&part_words);
    // A system's run stops counting after this long (its point is flagged).
    let limit = 10 * ctx.window;
    // At least 50 ms: in a shorter one a loaded machine may not run a demo line at all.
    let demo_seconds = ctx.window.max(Duration::from_millis(50)).as_secs_f64();

    let mut fig = Figure {
        name: "default-use".into(),
        title: "The newcomer's tasks with the defaults, idle and beside one busy loop per core"
            .into(),
        notes: vec![
            format!(
                "Each task as a user first writes it: the trust runtime is \
                 `Runtime::builder().workers({n}).build()` (the defaults otherwise: shared \
                 trustees, no pinning), tokio's is `Builder::new_multi_thread().worker_threads({n})`, \
                 threads are plain `std::thread`s; nothing is pinned. Each system runs once per run, \
                 in turn; y is the median time per operation (min–max in parentheses)."
            ),
            format!(
                "Conditions: *idle*, and *loaded*: one `sh -c 'while :; do :; done'` process per \
                 core, each pinned to its core, started by the benchmark before the condition's runs \
                 and killed after them."
            ),
            format!(
                "Word count: {} words drawn Zipf(α = 1) from {} generated words, split at spaces \
                 into {n} parts, one per fiber or thread; time from starting the fibers or threads \
                 to the last count done, per word. `{WC_NO_WINDOW}`: 16 \
                 `Trust<HashMap<String, u64>>` (shard by the standard hasher), one fiber per worker \
                 issuing one `apply_then` per word whose callback a `Group` tracks, `group.wait()` at \
                 the end; `{WC_WINDOW}`: the same with `group.wait_until_pending_at_most(256)` after \
                 each call; `{WC_DASHMAP}`: `DashMap<String, u64>` and {n} threads; `{WC_MUTEX}`: \
                 16 `Mutex<HashMap<String, u64>>` and {n} threads. Self-check: every system's \
                 counts equal a count made on one thread.",
                count(words as f64),
                count(VOCABULARY as f64)
            ),
            format!(
                "Tokio: a `u64` counter incremented by `counter.apply_async(|c| *c += 1).await`, \
                 `*m.lock().await += 1` or `*m.lock().unwrap() += 1`; *awaited*: {} increments one \
                 after the other in one spawned task; *joined*: {tasks} tasks of {task_ops} each, \
                 spawned together and joined. Self-check: the counter holds every increment.",
                count(awaited as f64)
            ),
            format!(
                "Time limit: a word count or tokio run stops after {} ms (ten windows): a \
                 fiber, thread or task stops at its next 64-word or 64-increment boundary past \
                 it, the time per word or operation is of those done by then, the self-check is \
                 of those, and the point is flagged †.",
                limit.as_millis()
            ),
            format!(
                "Threads: {n} threads incrementing by `counter.apply(|c| *c += 1)` or under the \
                 lock, until a window of {} ms has passed; time from \
                 the start to the last thread stopped, per increment. Self-check as for tokio.",
                ctx.window.as_millis()
            ),
            format!(
                "gsm demo: `{} demo --runs 1 --seconds {demo_seconds}` once per run (its own \
                 defaults: one thread per core, the seed's pause in each critical section); y is \
                 1/(its ops/s). The demo checks its own counters. A line that made no operation in \
                 its window (possible beside busy loops) gives no sample, and its point is \
                 flagged †.",
                crate::kvs::shown(&gsm)
            ),
        ],
        panels: Vec::new(),
        columns: 2,
        extra_markdown: String::new(),
    };
    for (id, title, baseline) in [
        ("word-count", "word count", WC_DASHMAP),
        ("tokio-awaited", "tokio: awaited one by one", TOKIO_MUTEX),
        ("tokio-joined", "tokio: tasks joined", TOKIO_MUTEX),
        ("threads", "plain threads", STD_MUTEX),
        ("gsm-demo", "gsm demo (one shared counter)", PARKING_LOT),
    ] {
        let mut p = Panel::new(id, title);
        p.x_label = "condition (busy loops beside it)".into();
        p.x_format = XFormat::Condition;
        p.log_x = false;
        p.log_y = true;
        p.y_label = if id == "word-count" {
            "ns per word"
        } else {
            "ns per operation"
        }
        .into();
        p.baseline = Some(baseline.into());
        fig.panels.push(p);
    }

    let word_systems: Vec<&str> = [WC_NO_WINDOW, WC_WINDOW, WC_DASHMAP, WC_MUTEX]
        .into_iter()
        .filter(|s| ctx.selected(s))
        .collect();
    let tokio_systems: Vec<&str> = [APPLY_ASYNC, TOKIO_MUTEX, STD_MUTEX]
        .into_iter()
        .filter(|s| ctx.selected(s))
        .collect();
    let thread_systems: Vec<&str> = [APPLY, STD_MUTEX, PARKING_LOT]
        .into_iter()
        .filter(|s| ctx.selected(s))
        .collect();
    let demo = ctx.selected("gsm demo");
    let per_run = word_systems.len() + 2 * tokio_systems.len() + thread_systems.len();
    let conditions = Condition::both();
    ctx.begin(
        "default-use",
        (conditions.len() * ctx.runs * (per_run + usize::from(demo))) as u64,
    );
    for condition in conditions {
        let x = condition.busy_loops() as f64;
        let label = condition.label();
        let _busy = condition.start()?;
        for rep in 0..ctx.runs {
            for &system in &word_systems {
                ctx.status(format!("{label}: word count, {system}, run {}", rep + 1));
                let deadline = Instant::now() + limit;
                let (elapsed, counts, counted) = match system {
                    WC_NO_WINDOW => count_trust(&rt, &text, None, deadline),
                    WC_WINDOW => count_trust(&rt, &text, Some(WORD_WINDOW), deadline),
                    WC_DASHMAP => count_dashmap(&text, n, deadline),
                    _ => count_mutex(&text, n, deadline),
                };
                let stopped = counted != part_words;
                let partial;
                let expected = if stopped {
                    partial = text.reference(&counted);
                    &partial
                } else {
                    &reference
                };
                let words: usize = counted.iter().sum();
                ensure!(
                    counts == *expected,
                    "default-use: word count by {system} ({label}) differs from the one-thread \
                     count: {} distinct words against {}, {} words against {words}",
                    counts.len(),
                    expected.len(),
                    counts.values().sum::<u64>()
                );
                let panel = fig.panel_mut("word-count");
                panel.add(system, x, per_op(elapsed, words as u64));
                if stopped {
                    panel.flag(system, x, TIME_LIMIT);
                }
                ctx.tick();
            }
            for &system in &tokio_systems {
                for (id, ops) in [
                    ("tokio-awaited", awaited),
                    ("tokio-joined", tasks * task_ops),
                ] {
                    ctx.status(format!("{label}: {id}, {system}, run {}", rep + 1));
                    let counter = Counter::new(system, &rt);
                    let deadline = Instant::now() + limit;
                    let (elapsed, done) = if id == "tokio-awaited" {
                        tokio_awaited(&tokio, &counter, awaited, deadline)?
                    } else {
                        tokio_joined(&tokio, &counter, tasks, task_ops, deadline)?
                    };
                    let value = counter.value();
                    ensure!(
                        value == done,
                        "default-use: {id} by {system} ({label}): the counter holds {value} after \
                         {done} increments"
                    );
                    let panel = fig.panel_mut(id);
                    panel.add(system, x, per_op(elapsed, done));
                    if done < ops {
                        panel.flag(system, x, TIME_LIMIT);
                    }
                    ctx.tick();
                }
            }
            for &system in &thread_systems {
                ctx.status(format!("{label}: threads, {system}, run {}", rep + 1));
                let window = ctx.window;
                let ((elapsed, ops), value) = match system {
                    APPLY => {
                        let c = rt.entrust(0u64);
                        let t = threads_loop(n, window, &|| c.apply(|c| *c += 1));
                        (t, c.apply(|c| *c))
                    }
                    STD_MUTEX => {
                        let m = Mutex::new(0u64);
                        let t = threads_loop(n, window, &|| {
                            *m.lock().expect("no thread panicked") += 1;
                        });
                        (t, m.into_inner().expect("no thread panicked"))
                    }
                    _ => {
                        let m = parking_lot::Mutex::new(0u64);
                        let t = threads_loop(n, window, &|| *m.lock() += 1);
                        (t, m.into_inner())
                    }
                };
                ensure!(
                    value == ops,
                    "default-use: threads, {system} ({label}): the counter holds {value} after \
                     {ops} increments"
                );
                fig.panel_mut("threads")
                    .add(system, x, per_op(elapsed, ops));
                ctx.tick();
            }
            if demo {
                ctx.status(format!("{label}: gsm demo, run {}", rep + 1));
                let mut idle_lines = Vec::new();
                for (system, rate) in demo_once(&gsm, demo_seconds)? {
                    if rate > 0.0 {
                        fig.panel_mut("gsm-demo").add(&system, x, 1e9 / rate);
                    } else {
                        idle_lines.push(system);
                    }
                }
                for system in idle_lines {
                    ctx.println(format!(
                        "gsm demo ({label}): `{system}` made no operation in its window"
                    ));
                    fig.panel_mut("gsm-demo").flag(&system, x, NO_OPERATION);
                }
                ctx.tick();
            }
        }
    }
    ctx.finish();
    fig.panels.retain(|p| !p.series.is_empty());
    fig.extra_markdown = goals(&fig, &conditions);
    Ok(fig)
}

fn per_op(elapsed: Duration, ops: u64) -> f64 {
    elapsed.as_nanos() as f64 / ops as f64
}

/// Issue 43's goals, reported and not asserted: each a ratio of medians from this run.
fn goals(fig: &Figure, conditions: &[Condition]) -> String {
    let median = |panel: &str, system: &str, x: f64| fig.median(panel, system, x);
    // (goal, panel, system, against, bound, whether the ratio is of times (≤ bound) or of
    // rates (≥ bound)).
    let rows: [(&str, &str, &str, &str, f64, bool); 5] = [
        (
            "word count: no window within 1.5× of the windowed one's time",
            "word-count",
            WC_NO_WINDOW,
            WC_WINDOW,
            1.5,
            true,
        ),
        (
            "word count: no window ≤ 1.5× dashmap's time",
            "word-count",
            WC_NO_WINDOW,
            WC_DASHMAP,
            1.5,
            true,
        ),
        (
            "tokio, awaited one by one: apply_async ≤ 2× tokio::sync::Mutex's time per op",
            "tokio-awaited",
            APPLY_ASYNC,
            TOKIO_MUTEX,
            2.0,
            true,
        ),
        (
            "tokio, tasks joined: apply_async ≥ 1× tokio::sync::Mutex's rate",
            "tokio-joined",
            APPLY_ASYNC,
            TOKIO_MUTEX,
            1.0,
            false,
        ),
        (
            "gsm demo: shared apply_then ≥ 1× parking_lot's rate",
            "gsm-demo",
            DEMO_APPLY_THEN,
            PARKING_LOT,
            1.0,
            false,
        ),
    ];
    let mut out = String::from("## Goals of issue 43 (reported, not asserted)\n\n");
    out.push_str(
        "Ratios of this run's medians, in each condition: of times where the goal bounds a time \
         from above, of rates (the inverse) where it bounds a rate from below. The kvs goal is in \
         `kvs-unpipelined.md`.\n\n| goal |",
    );
    for c in conditions {
        let _ = write!(out, " {} |", c.label());
    }
    out.push_str("\n| --- |");
    for _ in conditions {
        out.push_str(" --- |");
    }
    out.push('\n');
    let (mut met, mut total) = (0, 0);
    for (goal, panel, system, against, bound, of_times) in rows {
        let _ = write!(out, "| {goal} |");
        for c in conditions {
            let x = c.busy_loops() as f64;
            let ratio = median(panel, system, x)
                .zip(median(panel, against, x))
                .map(|(a, b)| if of_times { a / b } else { b / a });
            match ratio {
                Some(r) => {
                    let ok = if of_times { r <= bound } else { r >= bound };
                    total += 1;
                    met += usize::from(ok);
                    let _ = write!(
                        out,
                        " ×{} {} |",
                        sig(r),
                        if ok { "met" } else { "**not met**" }
                    );
                }
                None => out.push_str(" – |"),
            }
        }
        out.push('\n');
    }
    let _ = writeln!(out, "\nMet: {met} of {total}.");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_distinct_and_parts_cover_the_text() {
        let mut seen = std::collections::HashSet::new();
        for rank in 1..=2000 {
            let mut w = String::new();
            push_word(&mut w, rank);
            assert!(seen.insert(w.clone()), "word {w} repeats at rank {rank}");
        }
        let mut w = String::new();
        push_word(&mut w, 27);
        assert_eq!(w, "aa");
        let text = Text::generate(1000, 3);
        let words: usize = (0..3)
            .map(|i| text.part(i).split_ascii_whitespace().count())
            .sum();
        assert_eq!(words, 1000);
        let all = text.part_words();
        assert_eq!(text.reference(&all).values().sum::<u64>(), 1000);
        assert_eq!(text.reference(&[1, 0, 0]).values().sum::<u64>(), 1);
    }

    #[test]
    fn reads_the_demo_table() {
        let line = |name: &str, rate: &str| {
            format!(
                "{name:<42} {rate:>14} {:>10} {:>27} {:>13}x {:>10}x\n",
                8.0, "1 .. 2", 1.0, 1.0
            )
        };
        let out = format!(
            "gsm demo: fetch-and-add ...\n(each critical section ...)\n\n{:<42} {:>14} ...\n{}{}{}\nThe ceiling is ...\n",
            "system",
            "ops/s",
            line("1 thread, no lock (ceiling)", "125,000,000"),
            line("parking_lot::Mutex", "41,000,000"),
            line(DEMO_APPLY_THEN, "52,500,000"),
        );
        let out = out.as_str();
        let rates = parse_demo(out).unwrap();
        assert_eq!(
            rates,
            vec![
                ("1 thread, no lock (ceiling)".to_owned(), 125e6),
                ("parking_lot::Mutex".to_owned(), 41e6),
                (DEMO_APPLY_THEN.to_owned(), 52.5e6),
            ]
        );
        assert!(parse_demo("no table here").is_err());
    }
}
