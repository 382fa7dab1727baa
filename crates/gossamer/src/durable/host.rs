//! A rank's durable host: its store, the properties open in this process, and the syncer that
//! commits what their trustees log and then releases the answers waiting on it.
//!
//! # Output commit
//! A trustee logs a call by *staging* its record: under the host's lock it takes the next LSN
//! and appends the write, so staged LSNs are in order. The syncer thread takes everything
//! staged, commits it in one transaction, and then, under the lock again, publishes the last
//! LSN it covered as `durable` and takes the *waiters* that LSN satisfies. A trustee answers
//! a call by *holding* the answer until `durable` reaches the LSN it depends on (the call's
//! record, or for a read the property's newest write): at once if it has, else the answer
//! goes to its worker's waiting list and the worker becomes a waiter for that LSN — after a
//! second look at `durable` under the lock. Publishing and that look are both under the lock,
//! so a waiter is either seen by the commit that covers its LSN or sees that commit's
//! `durable` itself. The syncer starts a release fiber on each worker it takes as a waiter;
//! the fiber runs on the worker that holds the answers, after the closure that held them.

use std::any::Any;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::DurableError;
use super::registry;
use super::store::{Store, Write};
use crate::state;

/// A rank's durable host.
pub(crate) struct Host {
    pub(crate) dir: PathBuf,
    pub(crate) store: Store,
    staged: Mutex<Staged>,
    wake: Condvar,
    /// Every LSN up to this one is committed.
    durable: AtomicU64,
    /// Properties open in this process, by name.
    pub(crate) open: Mutex<HashMap<String, OpenProperty>>,
    handle: trust::Handle,
    syncer: Mutex<Option<JoinHandle<()>>>,
}

/// A property open in this process: its type's name and its `Trust<Cell<T>>`.
pub(crate) type OpenProperty = (&'static str, Box<dyn Any + Send>);

/// An answer waiting for its LSN to be durable.
type Held = Box<dyn FnOnce()>;

#[derive(Default)]
struct Staged {
    writes: Vec<Write>,
    last: u64,
    /// Workers holding answers, each with the newest LSN it waits for.
    waiters: Vec<(usize, u64)>,
    stop: bool,
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
    let host = Arc::new(Host {
        dir,
        durable: AtomicU64::new(store.last_lsn),
        staged: Mutex::new(Staged {
            last: store.last_lsn,
            ..Staged::default()
        }),
        store,
        wake: Condvar::new(),
        open: Mutex::new(HashMap::new()),
        handle: state.handle.clone(),
        syncer: Mutex::new(None),
    });
    let h = host.clone();
    let syncer = std::thread::Builder::new()
        .name(format!("gossamer-syncer-{}", state.rank))
        .spawn(move || h.sync())
        .map_err(|e| DurableError::Store {
            dir: host.dir.clone(),
            why: format!("starting the syncer thread: {e}"),
        })?;
    *lock(&host.syncer) = Some(syncer);
    *slot = Some(host.clone());
    Ok(host)
}

/// Ends this rank's host at the end of its job: commits what is staged, stops the syncer and
/// lets the store close once the last property is dropped. Call while the runtime still runs.
pub(crate) fn close() {
    let Some(host) = lock(&HOST).take() else {
        return;
    };
    lock(&host.staged).stop = true;
    host.wake.notify_all();
    if let Some(syncer) = lock(&host.syncer).take() {
        syncer.join().ok();
    }
    lock(&host.open).clear();
}

thread_local! {
    /// This worker's answers waiting for their LSN to be durable: (LSN, count) → send.
    static WAITING: RefCell<BTreeMap<(u64, u64), Held>> =
        const { RefCell::new(BTreeMap::new()) };
    static HELD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl Host {
    /// Stages `write` (made with its LSN) and returns the LSN.
    pub(crate) fn stage(&self, write: impl FnOnce(u64) -> Write) -> u64 {
        let mut s = lock(&self.staged);
        s.last += 1;
        let lsn = s.last;
        s.writes.push(write(lsn));
        let first = s.writes.len() == 1;
        drop(s);
        if first {
            self.wake.notify_one();
        }
        lsn
    }

    /// Runs `send` once every LSN up to `lsn` is durable: now, or from a release fiber of
    /// this worker. Call on the trustee's worker.
    pub(crate) fn hold(&self, lsn: u64, send: impl FnOnce() + 'static) {
        if self.durable.load(Ordering::Acquire) >= lsn {
            return send();
        }
        let worker = trust::current_worker().expect("answers are held on their trustee");
        {
            let mut s = lock(&self.staged);
            if self.durable.load(Ordering::Acquire) >= lsn {
                drop(s);
                return send();
            }
            match s.waiters.iter_mut().find(|(w, _)| *w == worker) {
                Some((_, newest)) => *newest = (*newest).max(lsn),
                None => s.waiters.push((worker, lsn)),
            }
        }
        let n = HELD.get();
        HELD.set(n + 1);
        WAITING.with(|w| w.borrow_mut().insert((lsn, n), Box::new(send)));
    }

    /// The syncer thread: commit what is staged, publish it, release what waited on it.
    fn sync(&self) {
        loop {
            let (writes, last) = {
                let mut s = lock(&self.staged);
                while s.writes.is_empty() && !s.stop {
                    s = self.wake.wait(s).unwrap_or_else(|p| p.into_inner());
                }
                if s.writes.is_empty() {
                    return;
                }
                (std::mem::take(&mut s.writes), s.last)
            };
            if let Err(e) = self.store.commit(&writes, last) {
                // The records of this round are executed in memory but not durable: nothing
                // may answer from them. Stop the process as a crash would; a restart replays
                // what was committed.
                eprintln!("gossamer: {e}; stopping this rank");
                std::process::abort();
            }
            let mut released = Vec::new();
            {
                let mut s = lock(&self.staged);
                self.durable.store(last, Ordering::Release);
                s.waiters.retain(|&(w, lsn)| {
                    let due = lsn <= last;
                    if due {
                        released.push(w);
                    }
                    !due
                });
            }
            for w in released {
                drop(self.handle.spawn_on(w, move || release(last)));
            }
        }
    }
}

/// Sends this worker's answers waiting on LSNs up to `durable`.
fn release(durable: u64) {
    loop {
        let next = WAITING.with(|w| {
            let mut w = w.borrow_mut();
            match w.first_key_value() {
                Some((&(lsn, _), _)) if lsn <= durable => w.pop_first().map(|(_, send)| send),
                _ => None,
            }
        });
        match next {
            Some(send) => send(),
            None => return,
        }
    }
}
