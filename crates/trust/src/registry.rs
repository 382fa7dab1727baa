//! The registry: the state the workers of one runtime share with each other and with every
//! trust and handle into it — the channels, the parkers, the injectors, the run state, and
//! the placement counters. It knows workers only by index; the worker loop is in `worker`,
//! and the public API that builds and stops a runtime is in `runtime`.
//!
//! # Which channels a trustee scans
//!
//! Client ids are the workers, then external threads (see `external`), then one shared
//! external channel. A trustee scans the channels of ids below `external_high`, plus the shared
//! one while `shared_external_busy` is set ([`Registry::active_clients`]). A thread that claims
//! an id raises `external_high` to cover it (`fetch_max`, so the bound only grows), or sets
//! `shared_external_busy`, *before* it publishes its first request; then it wakes the trustee.
//! If the trustee is awake, its next scan loads the bound after the client's store
//! (`Release`/`Acquire`) or, at worst, one scan later; if it is about to sleep, the park
//! handshake (`park`) orders the client's stores before the trustee's last check, which
//! therefore sees the new bound and the request. The bounds only grow while the runtime runs
//! (a released id keeps its channel scanned), so no request is missed.

use std::sync::{Arc, Barrier, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::channel::Channel;
use crate::home::Group;
use crate::inject::{Injected, Injector, Mailbox};
use crate::loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use crate::park::Parker;
use crate::request::Panic;
use crate::stats::WorkerCounters;

/// Receives the panics that have no waiting caller (see `Builder::panic_handler`).
pub(crate) type PanicHandler = dyn Fn(Panic) + Send + Sync;

/// How a runtime is laid out; checked by the builder.
pub(crate) struct Layout {
    pub(crate) workers: usize,
    /// Workers that only serve as trustees (the last ones).
    pub(crate) dedicated: usize,
    pub(crate) external_clients: usize,
    pub(crate) stack_size: usize,
    /// How long a waiting thread spins before it blocks: `Some` fixed by the user, `None`
    /// adaptive (`spin`).
    pub(crate) spin: Option<Duration>,
}

/// State shared by the workers of one runtime and by every trust and handle into it.
pub(crate) struct Registry {
    /// Names this runtime among every runtime of the process, ever (see [`find`]).
    pub(crate) serial: u64,
    pub(crate) workers: usize,
    /// Workers `0..client_workers` run application fibers.
    pub(crate) client_workers: usize,
    /// Workers that serve as trustees.
    pub(crate) trustees: Vec<usize>,
    /// Client ids: workers first, then external threads, then the shared external channel.
    pub(crate) clients: usize,
    /// `channels[client * workers + trustee]`.
    channels: Box<[Channel]>,
    /// One per client id.
    pub(crate) parkers: Box<[Parker]>,
    /// One per worker.
    injectors: Box<[Injector]>,
    /// Per worker: groups of forwarded requests for its trustee to run, and its own groups
    /// coming back (see `home`).
    pub(crate) forwards: Box<[Mailbox<Group>]>,
    pub(crate) returns: Box<[Mailbox<Group>]>,
    /// Per worker: what it did (see `stats`).
    pub(crate) counters: Box<[WorkerCounters]>,
    pub(crate) started: Instant,
    pub(crate) free_external: Mutex<Vec<usize>>,
    /// One past the highest external client id ever claimed (ids are handed out lowest
    /// first): trustees scan no channel above it.
    pub(crate) external_high: AtomicUsize,
    pub(crate) shared_external: Mutex<()>,
    /// Set while a thread uses the shared external channel.
    pub(crate) shared_external_busy: AtomicBool,
    /// Set when shutdown begins: workers leave their loops.
    pub(crate) stopping: AtomicBool,
    /// Set once no worker runs requests any more: properties may then be dropped where their
    /// last trust drops.
    pub(crate) closed: AtomicBool,
    /// Set once every worker thread has exited.
    pub(crate) torn_down: AtomicBool,
    next_trustee: AtomicUsize,
    next_client: AtomicUsize,
    pub(crate) stack_size: usize,
    /// How long a waiting thread spins before it blocks (`Builder::spin`): `Some` fixed by
    /// the user, `None` adaptive (`spin`).
    pub(crate) spin: Option<Duration>,
    panic_handler: Option<Arc<PanicHandler>>,
    pub(crate) barrier: Barrier,
}

impl Registry {
    pub(crate) fn new(layout: Layout, panic_handler: Option<Arc<PanicHandler>>) -> Self {
        let Layout {
            workers,
            dedicated,
            external_clients,
            stack_size,
            spin,
        } = layout;
        let clients = workers + external_clients + 1;
        let trustees: Vec<usize> = if dedicated == 0 {
            (0..workers).collect()
        } else {
            (workers - dedicated..workers).collect()
        };
        Registry {
            serial: NEXT_SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            workers,
            client_workers: workers - dedicated,
            trustees,
            clients,
            channels: (0..clients * workers).map(|_| Channel::new()).collect(),
            parkers: (0..clients).map(|_| Parker::new()).collect(),
            injectors: (0..workers).map(|_| Injector::new()).collect(),
            forwards: (0..workers).map(|_| Mailbox::new()).collect(),
            returns: (0..workers).map(|_| Mailbox::new()).collect(),
            counters: (0..workers).map(|_| WorkerCounters::default()).collect(),
            started: Instant::now(),
            free_external: Mutex::new((workers..workers + external_clients).rev().collect()),
            external_high: AtomicUsize::new(workers),
            shared_external: Mutex::new(()),
            shared_external_busy: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            torn_down: AtomicBool::new(false),
            next_trustee: AtomicUsize::new(0),
            next_client: AtomicUsize::new(0),
            stack_size,
            spin,
            panic_handler,
            barrier: Barrier::new(workers),
        }
    }

    pub(crate) fn channel(&self, client: usize, trustee: usize) -> &Channel {
        &self.channels[client * self.workers + trustee]
    }

    /// The clients whose channels a trustee scans: every worker, the external ids claimed so
    /// far, and the shared external channel while it is in use (see the module docs).
    pub(crate) fn active_clients(&self) -> impl Iterator<Item = usize> + use<'_> {
        let high = self.external_high.load(Ordering::Acquire);
        let shared = self
            .shared_external_busy
            .load(Ordering::Acquire)
            .then(|| self.shared_external_id());
        (0..high).chain(shared)
    }

    /// The id of the shared external channel.
    pub(crate) fn shared_external_id(&self) -> usize {
        self.clients - 1
    }

    pub(crate) fn next_trustee(&self) -> usize {
        let i = self.next_trustee.fetch_add(1, Ordering::Relaxed);
        self.trustees[i % self.trustees.len()]
    }

    pub(crate) fn next_client_worker(&self) -> usize {
        self.next_client.fetch_add(1, Ordering::Relaxed) % self.client_workers
    }

    /// Hands `item` to worker `worker` and wakes it. Once the runtime has closed, the item is
    /// disposed of instead (a free runs at once, a spawn is dropped).
    pub(crate) fn inject(&self, worker: usize, item: Injected) {
        if self.injectors[worker].push(item, &self.closed) {
            self.parkers[worker].wake();
        }
    }

    /// Worker `worker`'s queue of injected work.
    pub(crate) fn injector(&self, worker: usize) -> &Injector {
        &self.injectors[worker]
    }

    /// Delivers a panic that has no waiting caller (see `Builder::panic_handler`).
    pub(crate) fn unhandled_panic(&self, panic: Panic) {
        match &self.panic_handler {
            Some(handler) => handler(panic),
            None => {
                eprintln!(
                    "trust: a panic in an apply_then callback or an unawaited delegated closure had no \
                     handler (set Builder::panic_handler); aborting"
                );
                std::process::abort();
            }
        }
    }
}

/// The next runtime's serial number.
static NEXT_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The runtimes of the process, for the rare caller that holds only a serial number (a
/// `Reply` dropped off its trustee's thread). Dead entries are pruned on each enlistment.
static LIVE: Mutex<Vec<Weak<Registry>>> = Mutex::new(Vec::new());

/// Makes a new runtime findable by its serial number.
pub(crate) fn enlist(registry: &Arc<Registry>) {
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.retain(|r| r.strong_count() > 0);
    live.push(Arc::downgrade(registry));
}

/// The runtime with serial number `serial`, if it is still alive.
pub(crate) fn find(serial: u64) -> Option<Arc<Registry>> {
    let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.iter()
        .filter_map(Weak::upgrade)
        .find(|r| r.serial == serial)
}
