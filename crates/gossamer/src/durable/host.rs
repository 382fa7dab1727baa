//! A rank's durable host: its store, the properties open in this process, and the commit of
//! what their trustees log, after which the answers waiting on it are released.
//!
//! # Output commit
//! A trustee logs a call by *staging* its record in its worker's buffer, with the next LSN
//! of the rank (one atomic counter; a property's records are all staged by its trustee, so
//! they are in LSN order in that buffer). The first record of a round of the worker's loop
//! defers a *flush* to the end of that round, so that one flush carries every record of the
//! round. A trustee answers a call by *holding* the answer until its worker's *durable mark*
//! reaches the LSN it depends on — the call's record, a retry's earlier record, or for a read
//! the newest record of the property — which its own worker staged; LSN 0 stands for
//! "durable already" (what was replayed, or committed when the property was created).
//!
//! - Under `GSM_DURABILITY=os` the flush writes the buffer to the log itself, on the worker,
//!   raises the worker's durable mark and sends what waited: no other thread is involved.
//! - Under `sync` the flush hands the buffer to the syncer thread and returns. The syncer
//!   takes every buffer handed over since its last commit, writes them in one `write`, flushes
//!   once (`fdatasync`), and starts a release fiber on each worker whose buffer it committed,
//!   which raises that worker's mark and sends what waited.
//!
//! Everything that reads or moves a worker's mark and its waiting answers runs on that worker
//! (its closures, its deferred flush, its release fibers), so no answer can be missed: a hold
//! either sees the mark past its LSN or is waiting before the flush (or release fiber) that
//! covers the LSN runs, since those run on the same worker, after the closure that held it.
//! The only state two threads share is the handoff to the syncer; a loom model (`loom_tests`)
//! checks it with the worker's own steps: every answer leaves once, after its commit, and
//! closing loses no buffer handed over.
//!
//! # Leases
//! A *sweeper* thread keeps the host's lease clock (milliseconds since the host opened) and,
//! every quarter of the shorter lease, sends each open property a [`Sweep`]: the clock and
//! the lives of the ranks that are up. The property drops the records of the clients whose
//! lease ran out, and logs that it did (see the `cell` module).

use std::any::Any;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::DurableError;
use super::crash;
use super::format::Answer;
use super::registry;
use super::store::{Batch, Store, Write};
use crate::env::Durability;
use crate::loom::sync;
use crate::state;
use trust::Reply;

/// A rank's durable host.
pub(crate) struct Host {
    pub(crate) dir: PathBuf,
    pub(crate) store: Store,
    durability: Durability,
    /// The newest LSN given out.
    lsn: AtomicU64,
    /// Buffers handed to the syncer (under `Sync`).
    handoff: Handoff,
    /// Properties open in this process, by name.
    pub(crate) open: Mutex<HashMap<String, OpenProperty>>,
    handle: trust::Handle,
    syncer: Mutex<Option<JoinHandle<()>>>,
    /// The lease clock: milliseconds from `started`, as of the last sweep.
    clock: AtomicU64,
    started: Instant,
    leases: Leases,
    sweeper: Mutex<Option<JoinHandle<()>>>,
    /// Set when the host closes: the sweeper stops.
    closing: (Mutex<bool>, Condvar),
}

/// A property open in this process: its type's name, its `Trust<Cell<T>>`, and what makes
/// a job that sends it a lease sweep.
pub(crate) struct OpenProperty {
    pub(crate) type_name: &'static str,
    pub(crate) trust: Box<dyn Any + Send>,
    pub(crate) sweep: Box<dyn Fn(Sweep) -> SweepJob + Send>,
}

/// A lease sweep of one property, run on the sweeper thread: it waits for the trustee.
pub(crate) type SweepJob = Box<dyn FnOnce() + Send>;

/// How long clients' records outlive them, in milliseconds of the lease clock.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Leases {
    /// After the life of a thread's process is over (`GSM_CLIENT_LEASE`).
    pub(crate) client: u64,
    /// After a session's last call (`GSM_SESSION_LEASE`).
    pub(crate) session: u64,
}

/// What a property's lease sweep goes by.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Sweep {
    /// The lease clock.
    pub(crate) now: u64,
    /// The lives of the ranks that are up, sorted (`state::life_tag`).
    pub(crate) lives: Vec<u64>,
    pub(crate) leases: Leases,
}

/// What waits for its LSN to be durable: a call's answer (one per call, so kept unboxed),
/// or anything else to run then.
pub(crate) enum Held {
    Answer(Reply<Answer>, Answer),
    Run(Box<dyn FnOnce()>),
}

impl Held {
    /// Sends the answer, or runs what waited.
    fn release(self) {
        match self {
            Held::Answer(reply, answer) => {
                // Err: the caller is gone (its process ended); the record stays for a retry.
                drop(reply.send(answer));
                crash::point("replied");
            }
            Held::Run(run) => run(),
        }
    }
}

/// A worker's buffer handed to the syncer: the worker that staged it, its newest LSN and its
/// writes.
type Handed = (usize, u64, Batch);

/// The buffers workers hand to the syncer (under `Sync`), which takes all of them at once.
/// Its lock and condition variable are loom's in the model (`loom_tests`).
struct Handoff {
    state: sync::Mutex<HandoffState>,
    wake: sync::Condvar,
}

#[derive(Default)]
struct HandoffState {
    buffers: Vec<Handed>,
    stop: bool,
}

impl Handoff {
    fn new() -> Handoff {
        Handoff {
            state: sync::Mutex::new(HandoffState::default()),
            wake: sync::Condvar::new(),
        }
    }

    fn lock(&self) -> sync::MutexGuard<'_, HandoffState> {
        // Each critical section is a push or a take: a panic leaves nothing half-done.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands over a worker's buffer.
    fn hand(&self, buffer: Handed) {
        self.lock().buffers.push(buffer);
        self.wake.notify_one();
    }

    /// Every buffer handed over since the last take, once there is one; `None` once the
    /// handoff is stopped and every buffer taken.
    fn take(&self) -> Option<Vec<Handed>> {
        let mut state = self.lock();
        while state.buffers.is_empty() && !state.stop {
            state = self.wake.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        (!state.buffers.is_empty()).then(|| std::mem::take(&mut state.buffers))
    }

    /// No more buffers will come: the syncer ends once it took the last.
    fn stop(&self) {
        self.lock().stop = true;
        self.wake.notify_all();
    }
}

/// Buffers taken from the handoff as one commit: their writes, and the mark each worker
/// reaches once it is durable (the newest LSN among its buffers).
fn merge(buffers: Vec<Handed>) -> (Batch, Vec<(usize, u64)>) {
    let mut writes = Batch::default();
    let mut marks: Vec<(usize, u64)> = Vec::new();
    for (worker, lsn, w) in buffers {
        writes.extend(w);
        match marks.iter_mut().find(|(w, _)| *w == worker) {
            Some((_, mark)) => *mark = (*mark).max(lsn),
            None => marks.push((worker, lsn)),
        }
    }
    (writes, marks)
}

static HOST: Mutex<Option<Arc<Host>>> = Mutex::new(None);

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks leaves nothing half-done (each critical section is a
    // push or a take), so a poisoned lock is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// This rank's host, opened at first use.
pub(crate) fn host() -> Result<Arc<Host>, DurableError> {
    let mut slot = lock(&HOST);
    if let Some(h) = slot.as_ref() {
        return Ok(h.clone());
    }
    registry::check().map_err(DurableError::Registry)?;
    let state = state::current().expect("durable properties are used inside Rack::run");
    let s = &state.settings;
    let dir = s
        .state_dir
        .join(&s.job_name)
        .join(format!("rank-{}", state.rank));
    let build = match crate::handshake::build_id() {
        Ok(id) => format!("gossamer {} (executable {id:?})", env!("CARGO_PKG_VERSION")),
        Err(_) => format!(
            "gossamer {} (executable unreadable)",
            env!("CARGO_PKG_VERSION")
        ),
    };
    let store = Store::open(&dir, s.durability, &build)?;
    let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let leases = Leases {
        client: millis(s.recovery.client_lease),
        session: millis(s.recovery.session_lease),
    };
    let host = Arc::new(Host {
        dir,
        lsn: AtomicU64::new(store.last_lsn),
        store,
        durability: s.durability,
        handoff: Handoff::new(),
        open: Mutex::new(HashMap::new()),
        handle: state.handle.clone(),
        syncer: Mutex::new(None),
        clock: AtomicU64::new(0),
        started: Instant::now(),
        leases,
        sweeper: Mutex::new(None),
        closing: (Mutex::new(false), Condvar::new()),
    });
    let started = host
        .start(&host.sweeper, "leases", state.rank, Host::sweep_leases)
        .and_then(|()| match s.durability {
            Durability::Sync => host.start(&host.syncer, "syncer", state.rank, Host::sync),
            Durability::Os => Ok(()),
        });
    if let Err(e) = started {
        host.stop_threads();
        return Err(e);
    }
    *slot = Some(host.clone());
    Ok(host)
}

/// Ends this rank's host at the end of its job: commits what was handed over, stops the
/// syncer and lets the store close once the last property is dropped. Call while the runtime
/// still runs.
pub(crate) fn close() {
    let Some(host) = lock(&HOST).take() else {
        return;
    };
    host.stop_threads();
    lock(&host.open).clear();
}

/// What a worker staged and not yet flushed, its durable mark, and its waiting answers.
#[derive(Default)]
struct Worker {
    staged: Batch,
    newest: u64,
    flush_due: bool,
    durable: u64,
    /// Answers by the LSN they wait for, nearly always in staging order: one behind a newer
    /// LSN (a retry's, a read's) leaves with it, which is never early, since a worker's LSNs
    /// become durable in the order it staged them.
    waiting: VecDeque<(u64, Held)>,
}

impl Worker {
    /// Stages what `add` adds at `lsn`; whether it is the first of its round (which then
    /// defers the round's flush).
    fn stage(&mut self, lsn: u64, add: impl FnOnce(u64, &mut Batch)) -> bool {
        add(lsn, &mut self.staged);
        self.newest = lsn;
        !std::mem::replace(&mut self.flush_due, true)
    }

    /// The round's buffer, to hand to the syncer: its newest LSN and its writes (`None` when
    /// nothing was staged).
    fn take_round(&mut self) -> Option<(u64, Batch)> {
        self.flush_due = false;
        (!self.staged.is_empty()).then(|| (self.newest, std::mem::take(&mut self.staged)))
    }

    /// `held` back if `lsn` is durable already, else kept until it is; `make` makes what
    /// is kept (so that nothing is boxed when it leaves at once).
    fn hold<H>(&mut self, lsn: u64, held: H, make: impl FnOnce(H) -> Held) -> Option<H> {
        if self.durable >= lsn {
            return Some(held);
        }
        self.waiting.push_back((lsn, make(held)));
        None
    }

    /// Raises the durable mark to `mark`.
    fn raise(&mut self, mark: u64) {
        self.durable = self.durable.max(mark);
    }

    /// The next waiting answer the durable mark covers.
    fn next_released(&mut self) -> Option<Held> {
        match self.waiting.front() {
            Some(&(lsn, _)) if lsn <= self.durable => self.waiting.pop_front().map(|(_, s)| s),
            _ => None,
        }
    }
}

thread_local! {
    static WORKER: RefCell<Worker> = RefCell::new(Worker::default());
}

/// Stops the process as a crash would: what was executed but not committed must not be
/// answered, and a restart replays what was.
fn fail(e: DurableError) -> ! {
    eprintln!("gossamer: {e}; stopping this rank");
    std::process::abort();
}

impl Host {
    /// Starts `body` on a thread of the host's (`gossamer-<what>-<rank>`), kept in `slot`.
    fn start(
        self: &Arc<Self>,
        slot: &Mutex<Option<JoinHandle<()>>>,
        what: &str,
        rank: u32,
        body: fn(&Host),
    ) -> Result<(), DurableError> {
        let host = self.clone();
        let thread = std::thread::Builder::new()
            .name(format!("gossamer-{what}-{rank}"))
            .spawn(move || body(&host))
            .map_err(|e| DurableError::Store {
                dir: self.dir.clone(),
                why: format!("starting the {what} thread: {e}"),
            })?;
        *lock(slot) = Some(thread);
        Ok(())
    }

    /// Stops the syncer once it committed what was handed over, and the sweeper.
    fn stop_threads(&self) {
        self.handoff.stop();
        if let Some(syncer) = lock(&self.syncer).take() {
            syncer.join().ok();
        }
        *lock(&self.closing.0) = true;
        self.closing.1.notify_all();
        if let Some(sweeper) = lock(&self.sweeper).take() {
            sweeper.join().ok();
        }
    }

    /// The lease clock: milliseconds since the host opened, as of the last sweep.
    pub(crate) fn clock(&self) -> u64 {
        self.clock.load(Ordering::Relaxed)
    }

    /// The sweeper thread: every quarter of the shorter lease, advances the lease clock and
    /// sends every open property a sweep, until the host closes.
    fn sweep_leases(&self) {
        let every =
            Duration::from_millis((self.leases.client.min(self.leases.session) / 4).max(10));
        loop {
            let closing = lock(&self.closing.0);
            let (closing, _) = self
                .closing
                .1
                .wait_timeout_while(closing, every, |closing| !*closing)
                .unwrap_or_else(|p| p.into_inner());
            if *closing {
                return;
            }
            drop(closing);
            let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
            self.clock.store(now, Ordering::Relaxed);
            let Some(lives) = state::with_current(|s| s.lives()) else {
                continue;
            };
            let sweep = Sweep {
                now,
                lives,
                leases: self.leases,
            };
            // Made under the lock, run outside it (each waits for its trustee, which may take
            // the lock itself).
            let jobs: Vec<SweepJob> = lock(&self.open)
                .values()
                .map(|p| (p.sweep)(sweep.clone()))
                .collect();
            jobs.into_iter().for_each(|job| job());
        }
    }

    /// Stages a call's record of property `property` in this worker's buffer: `encode`
    /// writes it with the LSN it is given, which is returned. Call on a trustee.
    pub(crate) fn stage_record(
        self: &Arc<Self>,
        property: u32,
        encode: impl FnOnce(u64, &mut Vec<u8>),
    ) -> u64 {
        self.staging(|lsn, batch| batch.record(property, lsn, |out| encode(lsn, out)))
    }

    /// Stages `write` (made with its LSN) in this worker's buffer and returns the LSN. Call
    /// on a trustee.
    pub(crate) fn stage(self: &Arc<Self>, write: impl FnOnce(u64) -> Write) -> u64 {
        self.staging(|lsn, batch| batch.push(write(lsn)))
    }

    fn staging(self: &Arc<Self>, add: impl FnOnce(u64, &mut Batch)) -> u64 {
        let lsn = self.lsn.fetch_add(1, Ordering::Relaxed) + 1;
        let first = WORKER.with(|w| w.borrow_mut().stage(lsn, add));
        if first {
            let host = self.clone();
            trust::defer(move || host.flush());
        }
        lsn
    }

    /// The next LSN, for writes committed with [`Host::commit_now`].
    pub(crate) fn next_lsn(&self) -> u64 {
        self.lsn.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Commits `writes` at once, from a fiber that may wait: a property's creation, which
    /// is durable before its first call.
    pub(crate) fn commit_now(&self, writes: Vec<Write>) -> Result<(), DurableError> {
        let mut batch = Batch::default();
        writes.into_iter().for_each(|w| batch.push(w));
        self.store.commit(&mut batch)
    }

    /// The end of a round of this worker: its buffer goes to the log (under `Os`, here) or
    /// to the syncer (under `Sync`).
    fn flush(&self) {
        let newest = WORKER.with(|w| {
            let mut w = w.borrow_mut();
            match self.durability {
                // Written here; the emptied buffer keeps its capacity for the next round.
                Durability::Os => {
                    w.flush_due = false;
                    if w.staged.is_empty() {
                        return None;
                    }
                    if let Err(e) = self.store.commit(&mut w.staged) {
                        fail(e);
                    }
                    Some(w.newest)
                }
                Durability::Sync => {
                    if let Some((newest, batch)) = w.take_round() {
                        let worker = trust::current_worker().expect("a flush runs on its worker");
                        self.handoff.hand((worker, newest, batch));
                    }
                    None
                }
            }
        });
        if let Some(newest) = newest {
            crash::point("synced");
            release(newest);
        }
    }

    /// Runs `send` once this worker's durable mark reaches `lsn` (0: at once). Call on the
    /// trustee's worker, with an LSN it staged.
    pub(crate) fn hold(&self, lsn: u64, send: impl FnOnce() + 'static) {
        let now = WORKER.with(|w| {
            w.borrow_mut()
                .hold(lsn, send, |send| Held::Run(Box::new(send)))
        });
        if let Some(send) = now {
            send();
        }
    }

    /// Sends `answer` with `reply` once this worker's durable mark reaches `lsn`, as
    /// [`Host::hold`] does.
    pub(crate) fn answer(&self, lsn: u64, reply: Reply<Answer>, answer: Answer) {
        let now = WORKER.with(|w| {
            w.borrow_mut()
                .hold(lsn, (reply, answer), |(r, a)| Held::Answer(r, a))
        });
        if let Some((reply, answer)) = now {
            Held::Answer(reply, answer).release();
        }
    }

    /// The syncer thread (under `Sync`): commits what was handed over, flushes, releases.
    fn sync(&self) {
        while let Some(buffers) = self.handoff.take() {
            let (mut writes, marks) = merge(buffers);
            if let Err(e) = self.store.commit(&mut writes) {
                fail(e);
            }
            crash::point("synced");
            for (worker, mark) in marks {
                drop(self.handle.spawn_on(worker, move || release(mark)));
            }
        }
    }
}

/// Raises this worker's durable mark to `mark` and sends the answers it covers.
fn release(mark: u64) {
    WORKER.with(|w| w.borrow_mut().raise(mark));
    // One at a time, the worker's state not borrowed: an answer may stage or hold again.
    while let Some(held) = WORKER.with(|w| w.borrow_mut().next_released()) {
        held.release();
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use loom::sync::atomic::{AtomicU64, Ordering};
    use loom::sync::{Arc, Mutex};

    use super::{Handoff, Held, Worker, merge};

    /// A worker's two rounds under `Sync`, each staging a record and holding its answer, against
    /// the syncer; the host closes after the last hand-over. Each answer leaves exactly once,
    /// and never before the commit that covers its record; no buffer handed over is left
    /// uncommitted when the syncer ends.
    #[test]
    fn loom_answers_leave_once_after_their_commit_and_none_is_lost() {
        loom::model(|| {
            let handoff = Arc::new(Handoff::new());
            // The newest LSN committed, and the releases spawned on worker 0.
            let committed = Arc::new(AtomicU64::new(0));
            let releases = Arc::new(Mutex::new(Vec::new()));
            let syncer = {
                let (handoff, committed, releases) =
                    (handoff.clone(), committed.clone(), releases.clone());
                loom::thread::spawn(move || {
                    while let Some(buffers) = handoff.take() {
                        let (writes, marks) = merge(buffers);
                        assert!(!writes.is_empty());
                        for (worker, mark) in marks {
                            assert_eq!(worker, 0);
                            committed.fetch_max(mark, Ordering::SeqCst);
                            releases.lock().unwrap().push(mark);
                        }
                    }
                })
            };
            // The worker: its own thread's state, and its fibers' runs of `release`.
            let mut worker = Worker::default();
            let sent = Rc::new(Cell::new([0u32; 3]));
            let run_releases = |w: &mut Worker| {
                let marks = std::mem::take(&mut *releases.lock().unwrap());
                for mark in marks {
                    w.raise(mark);
                    while let Some(held) = w.next_released() {
                        held.release();
                    }
                }
            };
            for lsn in 1..=2u64 {
                let first = worker.stage(lsn, |lsn, batch| {
                    batch.record(0, lsn, |out| out.push(lsn as u8));
                });
                assert!(first);
                let (committed, sent) = (committed.clone(), sent.clone());
                let answer = move || {
                    assert!(
                        committed.load(Ordering::SeqCst) >= lsn,
                        "the answer of LSN {lsn} left before its commit"
                    );
                    let mut counts = sent.get();
                    counts[lsn as usize] += 1;
                    sent.set(counts);
                };
                if let Some(now) = worker.hold(lsn, answer, |a| Held::Run(Box::new(a))) {
                    now();
                }
                let (newest, batch) = worker.take_round().expect("a record was staged");
                handoff.hand((0, newest, batch));
                run_releases(&mut worker);
            }
            handoff.stop();
            syncer.join().unwrap();
            run_releases(&mut worker);
            assert_eq!(sent.get(), [0, 1, 1], "each answer once");
            assert!(worker.waiting.is_empty());
        });
    }
}
