//! What every worker of this node shares about the job ([`RackState`], made current for the
//! life of [`Rack::run`](crate::Rack::run)), and the per-link pieces it holds: each link's
//! [`Health`], seen by the watchdog thread, and its count of requests sent, read by releases.

use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;

use crate::env::Settings;
use crate::export::{Export, ExportTable, Life, Ticket};
use crate::function::Functions;
use crate::handshake::BuildId;
use crate::region::heap::{Heap, Heaps};
use crate::transport::{NewChannel, Probe};
use crate::wire;

/// A connected, authenticated channel to `peer` (rank, worker), for one worker of this node:
/// what bootstrap hands to the links.
#[derive(Debug)]
pub(crate) struct NewLink {
    pub(crate) peer: (u32, u32),
    pub(crate) channel: NewChannel,
    /// Which life of the peer's rank it reaches (from its handshake).
    pub(crate) incarnation: u32,
    /// The build the peer runs (from its handshake).
    pub(crate) build: BuildId,
    /// The peer's region heap, mapped, when the link uses shared memory.
    pub(crate) peer_heap: Option<Arc<Heap>>,
}

/// What a watchdog thread needs to see of a link.
#[derive(Debug)]
pub(crate) struct Health {
    pub(crate) peer: (u32, u32),
    /// The life of the peer's rank the link reaches.
    pub(crate) incarnation: u32,
    /// Reads and writes the link's fibers made, counted by them (each counter has one
    /// writer): the watchdog dates them, so that a call costs no clock read.
    pub(crate) reads: AtomicU64,
    pub(crate) writes: AtomicU64,
    /// Bytes those reads and writes carried (for `gossamer::stats`), counted the same way.
    pub(crate) bytes_in: AtomicU64,
    pub(crate) bytes_out: AtomicU64,
    /// Milliseconds since the rack started when the watchdog last found the peer heard from
    /// (a read, or bytes waiting) and last knew a write, by its own clock (see `fate`).
    pub(crate) last_read: AtomicU64,
    pub(crate) last_write: AtomicU64,
    /// The transport, for the watchdog's heartbeats and its look at unread bytes.
    pub(crate) probe: Arc<Probe>,
    /// Why the link ended, once it has (EOF or an error): the watchdog decides whether that
    /// loses the peer, since at the end of a job links close in any order.
    pub(crate) ended: Mutex<Option<String>>,
}

impl Health {
    pub(crate) fn new(peer: (u32, u32), incarnation: u32, now_ms: u64) -> Health {
        Health {
            peer,
            incarnation,
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            last_read: AtomicU64::new(now_ms),
            last_write: AtomicU64::new(now_ms),
            probe: Arc::default(),
            ended: Mutex::new(None),
        }
    }
}

/// What this node knows of another rank's life: which incarnation its links are for (or are
/// awaited from), and whether they are up. Only a job under `gsm run --recover` ever sees a
/// rank go down and come back (see `recovery`).
#[derive(Debug, Default)]
pub(crate) struct Peer {
    pub(crate) incarnation: AtomicU32,
    pub(crate) up: AtomicBool,
    /// Set when the rank runs another build than this node (`GSM_MIXED_BUILDS`): nothing but
    /// named calls may go there.
    pub(crate) other_build: AtomicBool,
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
    /// This run of the job's id, the same on every rank (see `bootstrap::Boot::Table`).
    pub(crate) run: u64,
    pub(crate) settings: Settings,
    /// Workers of each node.
    pub(crate) workers: Vec<u32>,
    /// `route(node, worker)` = `base[node] + worker`.
    base: Vec<usize>,
    /// Per local worker and route: the health of the link there, while it is up (`None` for
    /// this node's own workers and for a rank that is down).
    health: Vec<Mutex<Option<Arc<Health>>>>,
    /// Per rank: its incarnation and whether it is up (this node's own entry too).
    pub(crate) peers: Vec<Peer>,
    /// Fibers waiting for a lost rank to come back: woken when one does, and every
    /// `recovery::POLL` so that they see their deadlines.
    peer_waiters: Mutex<Vec<std::task::Waker>>,
    /// Per local worker and route: requests sent on that link.
    sent: Vec<Arc<AtomicU64>>,
    /// Round-robin placement per node.
    next_trustee: Vec<AtomicUsize>,
    /// Each local worker's export table.
    pub(crate) exports: Vec<Mutex<ExportTable>>,
    /// The tickets of the remote handles this node holds that a third node minted (see
    /// `export`, "Lost ranks"): what it answers a home's doubt from.
    pub(crate) held_tickets: Mutex<std::collections::HashSet<Ticket>>,
    /// Requests of other ranks this node forwarded as a moved property's first home, and
    /// switches of its workers to a moved property's home (see `stats`).
    pub(crate) forwarded: AtomicU64,
    pub(crate) redirects: AtomicU64,
    /// How many tickets this life of the node minted.
    tickets: AtomicU64,
    /// Rank 0: the coordinator connection of every other rank; others: the one to rank 0;
    /// by rank.
    coordination: Mutex<Vec<(u32, TcpStream)>>,
    pub(crate) ending: AtomicBool,
    pub(crate) handle: trust::Handle,
    /// The heaps of this node's regions and of the peers it maps.
    pub(crate) regions: Heaps,
    /// The functions this node runs by name.
    pub(crate) functions: Functions,
    /// This node's properties exported by name (`gossamer::export`), by name.
    pub(crate) directory: Mutex<HashMap<String, Published>>,
}

/// A property exported by name.
#[derive(Debug)]
pub(crate) struct Published {
    /// Its type's stable name, which a lookup must name too.
    pub(crate) stable: &'static str,
    /// Its trustee.
    pub(crate) worker: usize,
    /// A share of the property (no tickets): what a lookup exports again under a new ticket.
    pub(crate) property: Export,
}

impl RackState {
    pub(crate) fn new(
        settings: Settings,
        run: u64,
        workers: Vec<u32>,
        handle: trust::Handle,
        heap: Arc<Heap>,
        functions: Functions,
    ) -> Arc<RackState> {
        let rank = settings.rank as u32;
        let mut base = Vec::with_capacity(workers.len());
        let mut total = 0;
        for &w in &workers {
            base.push(total);
            total += w as usize;
        }
        let local = workers[rank as usize] as usize;
        let health = (0..local * total).map(|_| Mutex::new(None)).collect();
        now_ms();
        let workers_len = workers.len();
        let peers = (0..workers_len)
            .map(|_| Peer {
                incarnation: AtomicU32::new(0),
                up: AtomicBool::new(true),
                other_build: AtomicBool::new(false),
            })
            .collect::<Vec<_>>();
        peers[rank as usize]
            .incarnation
            .store(settings.recovery.incarnation, Ordering::Relaxed);
        Arc::new(RackState {
            rank,
            run,
            sent: (0..local * total).map(|_| Arc::default()).collect(),
            next_trustee: workers.iter().map(|_| AtomicUsize::new(0)).collect(),
            settings,
            workers,
            base,
            health,
            peers,
            peer_waiters: Mutex::default(),
            exports: (0..local).map(|_| Mutex::default()).collect(),
            held_tickets: Mutex::default(),
            forwarded: AtomicU64::new(0),
            redirects: AtomicU64::new(0),
            tickets: AtomicU64::new(0),
            coordination: Mutex::default(),
            ending: AtomicBool::new(false),
            handle,
            regions: Heaps::new(heap, rank, workers_len),
            functions,
            directory: Mutex::default(),
        })
    }

    pub(crate) fn lock_coordination(&self) -> std::sync::MutexGuard<'_, Vec<(u32, TcpStream)>> {
        self.coordination.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A ticket no other handle of the job carries.
    pub(crate) fn mint(&self) -> Ticket {
        Ticket {
            minter: self.life(self.rank),
            count: self.tickets.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The life of rank `node` this node knows.
    pub(crate) fn life(&self, node: u32) -> Life {
        Life {
            rank: node,
            incarnation: self.incarnation(node),
        }
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

    fn slot(&self, local: usize, peer: (u32, u32)) -> usize {
        local * self.route_len() + self.route(peer.0, peer.1)
    }

    /// A fresh health for a new link from local worker `local` to `peer`, watched from now.
    pub(crate) fn new_health(
        &self,
        local: usize,
        peer: (u32, u32),
        incarnation: u32,
    ) -> Arc<Health> {
        let health = Arc::new(Health::new(peer, incarnation, now_ms()));
        *lock(&self.health[self.slot(local, peer)]) = Some(health.clone());
        health
    }

    /// Stops watching every link to rank `node` (it is down).
    pub(crate) fn forget_health(&self, node: u32) {
        let local = self.workers[self.rank as usize] as usize;
        for l in 0..local {
            for w in 0..self.workers[node as usize] {
                lock(&self.health[self.slot(l, (node, w))]).take();
            }
        }
    }

    /// The health of every link that is up, for the watchdog.
    pub(crate) fn healths(&self) -> Vec<Arc<Health>> {
        self.health.iter().filter_map(|h| lock(h).clone()).collect()
    }

    /// Every link that is up: the local worker, its health and the requests it sent there.
    pub(crate) fn links(&self) -> Vec<(usize, Arc<Health>, u64)> {
        let routes = self.route_len();
        let mut links = Vec::new();
        for (slot, health) in self.health.iter().enumerate() {
            if let Some(health) = lock(health).clone() {
                let sent = self.sent[slot].load(Ordering::Relaxed);
                links.push((slot / routes, health, sent));
            }
        }
        links
    }

    /// The count of requests local worker `local` sent to `peer` on its link, from 0 for a
    /// new link.
    pub(crate) fn sent_counter(&self, local: usize, peer: (u32, u32)) -> Arc<AtomicU64> {
        let counter = self.sent[self.slot(local, peer)].clone();
        counter.store(0, Ordering::Release);
        counter
    }

    /// The incarnation of rank `node` this node knows.
    pub(crate) fn incarnation(&self, node: u32) -> u32 {
        self.peers[node as usize]
            .incarnation
            .load(Ordering::Acquire)
    }

    /// Whether rank `node` is up.
    pub(crate) fn peer_up(&self, node: u32) -> bool {
        self.peers[node as usize].up.load(Ordering::Acquire)
    }

    /// The [`life_tag`]s of the ranks' lives that are up (this one's too), sorted.
    pub(crate) fn lives(&self) -> Vec<u64> {
        let mut lives: Vec<u64> = (0..self.size())
            .filter(|&r| self.peer_up(r))
            .map(|r| life_tag(self.run, r, self.incarnation(r)))
            .collect();
        lives.sort_unstable();
        lives
    }

    /// Wakes `waker` at the next change of a rank's life, or within `recovery::POLL`.
    pub(crate) fn wait_for_peers(&self, waker: std::task::Waker) {
        lock(&self.peer_waiters).push(waker);
    }

    /// Wakes every fiber waiting for a rank to come back.
    pub(crate) fn wake_peer_waiters(&self) {
        let waiting = std::mem::take(&mut *lock(&self.peer_waiters));
        waiting.into_iter().for_each(std::task::Waker::wake);
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
        RECOVERING.store(state.settings.recovery.recover, Ordering::Relaxed);
        SEVERAL_RANKS.store(state.workers.len() > 1, Ordering::Relaxed);
        LIFE.store(
            life_tag(state.run, state.rank, state.settings.recovery.incarnation),
            Ordering::Relaxed,
        );
        *CURRENT.write().unwrap_or_else(|p| p.into_inner()) = Some(state);
        Current
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        *CURRENT.write().unwrap_or_else(|p| p.into_inner()) = None;
        RECOVERING.store(false, Ordering::Relaxed);
        SEVERAL_RANKS.store(false, Ordering::Relaxed);
        LIFE.store(0, Ordering::Relaxed);
    }
}

/// Whether the running rack has more than one rank (set before its workers start).
static SEVERAL_RANKS: AtomicBool = AtomicBool::new(false);

/// Whether the running rack has more than one rank: one load, for the local call path.
#[inline(always)]
pub(crate) fn several_ranks() -> bool {
    SEVERAL_RANKS.load(Ordering::Relaxed)
}

/// Bits of a [`life_tag`].
pub(crate) const LIFE_BITS: u32 = 39;

/// A life of a rank — its run of the job, rank and incarnation — in [`LIFE_BITS`] bits, which
/// every rank computes alike: durable properties keep the records of a process's threads
/// under it, and drop them once that life is over.
pub(crate) fn life_tag(run: u64, rank: u32, incarnation: u32) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&run.to_le_bytes());
    bytes[8..12].copy_from_slice(&rank.to_le_bytes());
    bytes[12..].copy_from_slice(&incarnation.to_le_bytes());
    crate::hash::fnv1a(&bytes) & ((1 << LIFE_BITS) - 1)
}

/// This process's life in the running rack ([`life_tag`]), read without a lock on every
/// durable call; 0 outside a rack.
static LIFE: AtomicU64 = AtomicU64::new(0);

/// This process's life in the running rack, 0 outside one.
pub(crate) fn life() -> u64 {
    LIFE.load(Ordering::Relaxed)
}

/// The running rack's `GSM_RECOVER`, where a durable call can read it without taking the
/// lock of [`current`] (it asks on every call).
static RECOVERING: AtomicBool = AtomicBool::new(false);

/// Whether the running rack recovers lost ranks (`gsm run --recover`).
pub(crate) fn recovering() -> bool {
    RECOVERING.load(Ordering::Relaxed)
}
