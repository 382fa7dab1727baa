//! What every worker of this node shares about the job ([`RackState`], made current for the
//! life of [`Rack::run`](crate::Rack::run)), and the per-link pieces it holds: each link's
//! [`Health`], seen by the watchdog thread, and its count of requests sent, read by releases.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;

use crate::env::Settings;
use crate::export::ExportTable;
use crate::region::heap::{Heap, Heaps};
use crate::transport::{NewChannel, Probe};
use crate::wire;

/// A connected, authenticated channel to `peer` (rank, worker), for one worker of this node:
/// what bootstrap hands to the links.
#[derive(Debug)]
pub(crate) struct NewLink {
    pub(crate) peer: (u32, u32),
    pub(crate) channel: NewChannel,
    /// The peer's region heap, mapped, when the link uses shared memory.
    pub(crate) peer_heap: Option<Arc<Heap>>,
}

/// What a watchdog thread needs to see of a link.
#[derive(Debug)]
pub(crate) struct Health {
    pub(crate) peer: (u32, u32),
    /// Milliseconds since the rack started, at the last byte read and written.
    pub(crate) last_read: AtomicU64,
    pub(crate) last_write: AtomicU64,
    /// The transport, for the watchdog's heartbeats and its look at unread bytes.
    pub(crate) probe: Arc<Probe>,
    /// Why the link ended, once it has (EOF or an error): the watchdog decides whether that
    /// loses the peer, since at the end of a job links close in any order.
    pub(crate) ended: Mutex<Option<String>>,
}

impl Health {
    pub(crate) fn new(peer: (u32, u32), now_ms: u64) -> Health {
        Health {
            peer,
            last_read: AtomicU64::new(now_ms),
            last_write: AtomicU64::new(now_ms),
            probe: Arc::default(),
            ended: Mutex::new(None),
        }
    }
}

/// Milliseconds since the first call, for link liveness.
pub(crate) fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// What every worker of this node shares about the job.
#[derive(Debug)]
pub(crate) struct RackState {
    pub(crate) rank: u32,
    pub(crate) settings: Settings,
    /// Workers of each node.
    pub(crate) workers: Vec<u32>,
    /// `route(node, worker)` = `base[node] + worker`.
    base: Vec<usize>,
    /// Per local worker and route: the link's health (`None` for this node's own workers).
    pub(crate) health: Vec<Option<Arc<Health>>>,
    /// Per local worker and route: requests sent on that link.
    sent: Vec<Arc<AtomicU64>>,
    /// Round-robin placement per node.
    next_trustee: Vec<AtomicUsize>,
    /// Each local worker's export table.
    pub(crate) exports: Vec<Mutex<ExportTable>>,
    /// Tickets minted by this node: `rank << 48 | count`.
    tickets: AtomicU64,
    /// Rank 0: the coordinator connection of every other rank; others: the one to rank 0.
    coordination: Mutex<Vec<TcpStream>>,
    pub(crate) ending: AtomicBool,
    pub(crate) handle: trust::Handle,
    /// The heaps of this node's regions and of the peers it maps.
    pub(crate) regions: Heaps,
}

impl RackState {
    pub(crate) fn new(
        settings: Settings,
        workers: Vec<u32>,
        handle: trust::Handle,
        heap: Arc<Heap>,
    ) -> Arc<RackState> {
        let rank = settings.rank as u32;
        let mut base = Vec::with_capacity(workers.len());
        let mut total = 0;
        for &w in &workers {
            base.push(total);
            total += w as usize;
        }
        let local = workers[rank as usize] as usize;
        let mut health = Vec::with_capacity(local * total);
        for _ in 0..local {
            for (node, &w) in workers.iter().enumerate() {
                for worker in 0..w {
                    health.push(
                        (node as u32 != rank)
                            .then(|| Arc::new(Health::new((node as u32, worker), now_ms()))),
                    );
                }
            }
        }
        now_ms();
        let workers_len = workers.len();
        Arc::new(RackState {
            rank,
            sent: (0..local * total).map(|_| Arc::default()).collect(),
            next_trustee: workers.iter().map(|_| AtomicUsize::new(0)).collect(),
            settings,
            workers,
            base,
            health,
            exports: (0..local).map(|_| Mutex::default()).collect(),
            tickets: AtomicU64::new(u64::from(rank) << 48),
            coordination: Mutex::default(),
            ending: AtomicBool::new(false),
            handle,
            regions: Heaps::new(heap, rank, workers_len),
        })
    }

    pub(crate) fn lock_coordination(&self) -> std::sync::MutexGuard<'_, Vec<TcpStream>> {
        self.coordination.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A ticket no other handle of the job carries.
    pub(crate) fn mint(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::Relaxed)
    }

    /// Worker `worker`'s export table.
    pub(crate) fn exports(&self, worker: usize) -> std::sync::MutexGuard<'_, ExportTable> {
        self.exports[worker]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// How many properties of this node other nodes hold handles to.
    pub(crate) fn live_exports(&self) -> usize {
        (0..self.exports.len())
            .map(|w| self.exports(w).live())
            .sum()
    }

    pub(crate) fn size(&self) -> u32 {
        self.workers.len() as u32
    }

    pub(crate) fn route(&self, node: u32, worker: u32) -> usize {
        self.base[node as usize] + worker as usize
    }

    pub(crate) fn route_len(&self) -> usize {
        self.workers.iter().map(|&w| w as usize).sum()
    }

    pub(crate) fn health(&self, local: usize, peer: (u32, u32)) -> Arc<Health> {
        self.health[local * self.route_len() + self.route(peer.0, peer.1)]
            .clone()
            .expect("a link to another node")
    }

    pub(crate) fn sent_counter(&self, local: usize, peer: (u32, u32)) -> Arc<AtomicU64> {
        self.sent[local * self.route_len() + self.route(peer.0, peer.1)].clone()
    }

    /// How many requests each local worker has sent to `(node, worker)`.
    pub(crate) fn sent_to(&self, node: u32, worker: u32) -> Vec<u64> {
        let local = self.workers[self.rank as usize] as usize;
        (0..local)
            .map(|l| {
                self.sent[l * self.route_len() + self.route(node, worker)].load(Ordering::Acquire)
            })
            .collect()
    }

    pub(crate) fn limits(&self) -> wire::Limits {
        wire::Limits {
            frame: self.settings.frame,
            max_message: self.settings.max_message,
        }
    }

    /// The worker of `node` that gets the next property placed there without a choice.
    pub(crate) fn next_trustee(&self, node: u32) -> u32 {
        let n = self.next_trustee[node as usize].fetch_add(1, Ordering::Relaxed);
        (n % self.workers[node as usize] as usize) as u32
    }
}

static CURRENT: RwLock<Option<Arc<RackState>>> = RwLock::new(None);

/// The running rack of this process.
pub(crate) fn current() -> Option<Arc<RackState>> {
    CURRENT.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Runs `f` on the running rack of this process, if any, without taking a share of it.
pub(crate) fn with_current<R>(f: impl FnOnce(&RackState) -> R) -> Option<R> {
    CURRENT
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .as_deref()
        .map(f)
}

/// Makes a rack current for as long as the guard lives.
pub(crate) struct Current;

impl Current {
    pub(crate) fn set(state: Arc<RackState>) -> Current {
        *CURRENT.write().unwrap_or_else(|p| p.into_inner()) = Some(state);
        Current
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        *CURRENT.write().unwrap_or_else(|p| p.into_inner()) = None;
    }
}
