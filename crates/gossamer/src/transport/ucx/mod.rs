//! The UCX transport: a link's bytes travel as UCX active messages, over whatever UCX finds
//! (RDMA on InfiniBand or RoCE, shared memory, TCP), chosen by UCX's own configuration
//! (`UCX_TLS`, `UCX_NET_DEVICES`).
//!
//! # Setup
//! Bootstrap makes one UCX worker per gossamer worker ([`UcxNode`]) before any link is dialed.
//! A link's dialer and acceptor prove each other over TCP with the handshake first; only then
//! does each send the other, over that proven connection, its UCX worker's address and the
//! *token* it gave the link (see [`Offer`](super::Offer) and [`Plan`](super::Plan)). Each side
//! then connects an endpoint to the other's worker when the link opens on its gossamer worker,
//! and flushes it: the flush completes once UCX's own wireup of the endpoint is done, and the
//! job starts only then (or after `GSM_PEER_TIMEOUT`), as UCX 1.13 aborts the process when an
//! endpoint without peer-failure handling fails while its wireup is under way (below).
//! The offers also carry each node's region heap (its address, length and UCX key): a worker's
//! link to another node's worker 0 is its way to that node's regions (`rma`).
//!
//! # Messages
//! Every message carries an 8-byte header, the token the receiver gave the link and the
//! message's sequence number on it, then a piece of the link's byte stream (at most
//! [`MESSAGE`] bytes). All links of a worker share one active-message handler, which finds the
//! link by its token and appends the piece to the link's inbox, in sequence order: UCX does
//! not promise that active messages arrive in the order they were sent (several lanes may
//! carry one endpoint's messages), so one that comes early waits for the ones before it. A
//! piece whose number was seen before, or that runs more than [`OUT_OF_ORDER`] messages
//! ahead, is a broken peer: the link's reader reports it as a bad frame naming the peer, as it
//! does what the decoder refuses. Messages are sent eager only (never rendezvous, which would
//! have the receiver fetch the data), and one that arrives by rendezvous is refused the same way.
//!
//! A message for a token this worker gave but whose link has not opened yet (the peer's side
//! opened first) waits for it, up to [`EARLY_BYTES`]. A message for a token never given comes
//! from no link: it is logged and dropped.
//!
//! # Progress and sleep
//! UCX moves messages only when its worker is progressed: the gossamer worker registers a
//! [`trust::net::Watch`] whose `poll` runs `ucp_worker_progress` every round of its loop and
//! every turn of its idle spin; the handler wakes a waiting reader at once, and writers
//! waiting for a send to complete look again after any progress. Before the worker blocks,
//! the watch arms UCX's event descriptor (`ucp_worker_arm`; if events already wait it
//! progresses instead), which a fiber of the worker waits on in the reactor
//! ([`trust::net::Readable`]): an idle rank sleeps in `epoll_wait` with everything else it
//! waits for.
//!
//! # Liveness
//! The bootstrap's TCP connection stays open beside the endpoint, as shared memory keeps its
//! Unix socket: when the peer exits or is killed, the kernel closes it and the link ends at
//! once; the watchdog writes the link's heartbeats on it when the link is quiet, and reads
//! there whether the peer is alive while the worker is busy (`Probe`). A peer that stops
//! without exiting (`SIGSTOP`, a cut cable) stops its heartbeats: after `GSM_PEER_TIMEOUT` it
//! is lost, as on TCP. An endpoint UCX reports failed ends its link too.
//!
//! In a job that does not recover lost ranks, endpoints are made without UCX's own
//! peer-failure handling, which its shared-memory transports lack: a lost peer ends the job. In
//! one that does (`gsm run --recover`), they ask for it (`UcxNode::peer_failure` says why and
//! what it costs), and UCX fails what is under way to a lost rank. A restarted rank's links are
//! made as at the start, over the proven TCP connection, and its region heap is reached
//! through a route of the new life (`rma`). A send UCX has not finished when its link ends
//! keeps its writer waiting until UCX fails it, so that UCX never reads a buffer given back.

pub(crate) mod rma;
pub(crate) mod sys;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{ChannelError, HeapMemory, Probe, UcxHeap, Wake, Watched};

/// The most bytes of the stream one message carries: bigger writes are cut.
const MESSAGE: usize = 256 * 1024;
/// How many messages a link's inbox holds ahead of one still missing.
const OUT_OF_ORDER: usize = 1024;
/// How many bytes may wait for a link that has not opened yet.
const EARLY_BYTES: usize = 64 << 20;
/// The header: the receiver's token for the link, and the message's sequence number.
const HEADER: usize = 8;

/// Whether this host has an RDMA device (InfiniBand or RoCE), which `GSM_TRANSPORT=auto`
/// uses UCX for between hosts.
pub(crate) fn rdma_here() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut devices| devices.next().is_some())
}

/// This node's UCX workers, one per gossamer worker, from bootstrap until each is taken by
/// its gossamer worker.
#[derive(Debug)]
pub(crate) struct UcxNode {
    /// Kept for good (see [`sys`]).
    context: sys::Context,
    /// This node's region heap when it is the node's own memory, registered with the
    /// context: kept as long as the node (the workers, kept for good, keep the node).
    registered: OnceLock<HeapMemory>,
    /// This node's region heap as peers reach it, once allocated or registered.
    heap: OnceLock<UcxHeap>,
    addresses: Vec<Vec<u8>>,
    workers: Mutex<Vec<Option<sys::Worker>>>,
    /// The next token each worker gives a link.
    tokens: Vec<AtomicU32>,
    /// Whether endpoints ask UCX to detect their peer's failure (UCX's PEER error mode): in a
    /// job that recovers lost ranks. There a rank must see its operations to a lost rank
    /// fail, not wait for good; and UCX 1.13 aborts the process when a TCP endpoint without it
    /// fails before its wireup is done (a rank killed while it rejoins). The cost: UCX then
    /// carries links within a host over TCP (or RDMA), as its shared memory cannot detect a
    /// peer's failure; `UCX_TLS` naming shared memory alone is refused (`env`).
    peer_failure: bool,
}

impl UcxNode {
    /// Initialises UCX (reading its configuration from the environment) and makes `workers`
    /// workers, for a job that `recovers` lost ranks or not.
    pub(crate) fn new(workers: u32, recovers: bool) -> Result<UcxNode, String> {
        let context = sys::Context::new().map_err(|e| format!("initialising UCX: {e}"))?;
        let workers = (0..workers)
            .map(|_| context.worker())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("making a UCX worker: {e}"))?;
        Ok(UcxNode {
            context,
            registered: OnceLock::new(),
            heap: OnceLock::new(),
            addresses: workers.iter().map(|w| w.address().to_vec()).collect(),
            tokens: workers.iter().map(|_| AtomicU32::new(0)).collect(),
            workers: Mutex::new(workers.into_iter().map(Some).collect()),
            peer_failure: recovers,
        })
    }

    /// Whether this node's endpoints ask UCX to detect their peer's failure.
    pub(crate) fn peer_failure(&self) -> bool {
        self.peer_failure
    }

    /// Connects `worker` to the UCX worker at `address`, asking UCX to detect the peer's
    /// failure in a job that recovers lost ranks (see `peer_failure`).
    fn connect(&self, worker: &sys::Worker, address: &[u8]) -> Result<sys::Endpoint, String> {
        let detect = self.peer_failure;
        worker.connect(address, detect).map_err(|e| {
            if detect && e == sys::Status::from_raw(sys::UNREACHABLE) {
                format!(
                    "connecting a UCX endpoint: {e}: UCX reaches the peer by no transport that \
                     detects a peer's failure, which a job that recovers lost ranks needs (see \
                     UCX_TLS), or the peer's host is cut off"
                )
            } else {
                format!("connecting a UCX endpoint: {e}")
            }
        })
    }

    /// Allocates this node's region heap of `bytes` through UCX; returns where it is and
    /// its length (page-aligned, zeroed, kept for good).
    pub(crate) fn allocate_heap(&self, bytes: usize) -> Result<(*mut u8, usize), String> {
        let (address, length, key) = self
            .context
            .allocate(bytes)
            .map_err(|e| format!("allocating the region heap through UCX: {e}"))?;
        if !(address as usize).is_multiple_of(4096) || length < bytes {
            return Err(format!(
                "UCX allocated {length} bytes at {address:?} for a region heap of {bytes}: \
                 not page-aligned, or short"
            ));
        }
        self.set_heap(address, length, key);
        Ok((address, length))
    }

    /// Registers this node's own region heap with UCX.
    pub(crate) fn register_heap(&self, memory: HeapMemory) -> Result<(), String> {
        // SAFETY: `HeapMemory`'s promise: the bytes stay mapped while its owner lives, which
        // this node keeps as long as the registration (both for good).
        let key = unsafe { self.context.register(memory.address, memory.bytes) }
            .map_err(|e| format!("registering the region heap with UCX: {e}"))?;
        self.set_heap(memory.address, memory.bytes, key);
        let _ = self.registered.set(memory);
        Ok(())
    }

    fn set_heap(&self, address: *mut u8, bytes: usize, key: Vec<u8>) {
        let _ = self.heap.set(UcxHeap {
            address: address as u64,
            words: (bytes / 8) as u64,
            key,
        });
    }

    /// This node's region heap, as peers reach it.
    pub(crate) fn heap(&self) -> Option<&UcxHeap> {
        self.heap.get()
    }

    /// How many gossamer workers this node has.
    pub(crate) fn workers(&self) -> u32 {
        self.addresses.len() as u32
    }

    /// The address of worker `worker`'s UCX worker.
    pub(crate) fn address(&self, worker: u32) -> &[u8] {
        &self.addresses[worker as usize]
    }

    /// Gives a new link of worker `worker` its token.
    pub(crate) fn give_token(&self, worker: u32) -> u32 {
        self.tokens[worker as usize].fetch_add(1, Ordering::Relaxed)
    }

    fn given(&self, worker: u32, token: u32) -> bool {
        token < self.tokens[worker as usize].load(Ordering::Relaxed)
    }
}

/// A UCX link set up by bootstrap, not yet bound to its worker.
#[derive(Debug)]
pub(crate) struct NewUcx {
    pub(crate) node: Arc<UcxNode>,
    /// The gossamer worker the link belongs to.
    pub(crate) worker: u32,
    /// What the peer's messages carry: the token this side gave the link.
    pub(crate) token: u32,
    /// What this side's messages carry.
    pub(crate) peer_token: u32,
    pub(crate) peer_address: Vec<u8>,
    /// The peer's rank and worker.
    pub(crate) peer: (u32, u32),
    /// The peer's life (its incarnation, from the handshake).
    pub(crate) peer_incarnation: u32,
    /// The peer's region heap: its worker 0's links are this worker's way to its regions.
    pub(crate) peer_heap: Option<UcxHeap>,
    /// The proven TCP connection: heartbeats and the peer's end.
    pub(crate) side: std::net::TcpStream,
}

impl NewUcx {
    /// Binds the link to the worker this runs on (which must be gossamer worker
    /// `self.worker`).
    pub(super) fn open(self, probe: &Arc<Probe>) -> UcxChannel {
        let worker = Worker::current(&self.node, self.worker);
        let beats = Arc::new(AtomicU64::new(0));
        probe.set(Watched::Ucx(Watch {
            side: self.side.as_raw_fd(),
            beats: beats.clone(),
        }));
        let link = worker.open(self.token);
        // Settled at once when there is no endpoint to wait for.
        let wired = Rc::new(Cell::new(true));
        let endpoint = match self.node.connect(&worker.ucx, &self.peer_address) {
            Ok(endpoint) => {
                worker
                    .endpoints
                    .borrow_mut()
                    .insert(endpoint.id(), self.token);
                wired.set(false);
                let settled = wired.clone();
                rma::connected(&endpoint, Box::new(move |_| settled.set(true)));
                let endpoint = Rc::new(endpoint);
                let (rank, peer_worker) = self.peer;
                let life = (rank, self.peer_incarnation);
                if peer_worker == 0
                    && let Some(heap) = &self.peer_heap
                    && let Err(e) = rma::add_route(&worker.ucx, endpoint.clone(), life, heap)
                {
                    // Regions there are reached by requests over the link instead.
                    eprintln!("gossamer: rank {rank}'s region heap is not reachable over UCX: {e}");
                }
                Some(endpoint)
            }
            Err(why) => {
                link.fail(why);
                None
            }
        };
        let side =
            trust::net::TcpStream::from_std(self.side).expect("a connected stream registers");
        UcxChannel {
            worker,
            link,
            token: self.token,
            endpoint,
            wired,
            peer_token: self.peer_token,
            next: Cell::new(0),
            side,
            beats,
        }
    }
}

/// The watchdog's view of a UCX link: its TCP connection.
#[derive(Debug)]
pub(crate) struct Watch {
    side: RawFd,
    /// How many heartbeat bytes the link's serving fiber has read.
    beats: Arc<AtomicU64>,
}

impl Watch {
    /// Whether heartbeats wait unread (the worker is busy, not the peer silent). The caller
    /// holds the probe's read lock, so the descriptor is open.
    pub(super) fn unread(&self) -> Option<bool> {
        super::tcp::unread(self.side)
    }

    pub(super) fn peer_heartbeat(&self) -> u64 {
        self.beats.load(Ordering::Relaxed)
    }

    /// Writes a heartbeat on the TCP connection; the caller holds the probe's locks.
    pub(super) fn beat(&self) -> bool {
        super::tcp::heartbeat(self.side)
    }
}

/// What a link's incoming messages become: its stream's bytes, in order.
#[derive(Debug, Default)]
struct Inbox {
    bytes: Vec<u8>,
    /// How many of `bytes` were read.
    read: usize,
    /// The sequence number the stream goes on with.
    expected: u32,
    /// Messages that came before one they follow.
    ahead: BTreeMap<u32, Vec<u8>>,
    /// Why the peer's messages cannot be a stream (it is broken): the reader's bad frame.
    broken: Option<String>,
}

impl Inbox {
    fn push(&mut self, sequence: u32, data: &[u8], limit: usize) {
        if self.broken.is_some() {
            return;
        }
        let distance = sequence.wrapping_sub(self.expected);
        if distance == 0 {
            if self.bytes.len() - self.read + data.len() > limit {
                self.broken = Some(format!(
                    "more than {limit} bytes over UCX before the link opened"
                ));
                return;
            }
            self.bytes.extend_from_slice(data);
            self.expected = self.expected.wrapping_add(1);
            while let Some(next) = self.ahead.remove(&self.expected) {
                self.bytes.extend_from_slice(&next);
                self.expected = self.expected.wrapping_add(1);
            }
        } else if distance as usize > OUT_OF_ORDER || self.ahead.len() >= OUT_OF_ORDER {
            self.broken = Some(format!(
                "UCX message {sequence} where {} was next: repeated, or more than \
                 {OUT_OF_ORDER} ahead",
                self.expected
            ));
        } else if self.ahead.insert(sequence, data.to_vec()).is_some() {
            self.broken = Some(format!("UCX message {sequence} came twice"));
        }
    }

    /// Moves what is readable into `buf`.
    fn take(&mut self, buf: &mut [u8]) -> usize {
        let n = buf.len().min(self.bytes.len() - self.read);
        buf[..n].copy_from_slice(&self.bytes[self.read..self.read + n]);
        self.read += n;
        if self.read == self.bytes.len() {
            self.bytes.clear();
            self.read = 0;
        }
        n
    }
}

/// One link's state on its worker, shared by the channel and the worker's handler.
#[derive(Debug, Default)]
struct Link {
    inbox: RefCell<Inbox>,
    reader: Wake,
    writer: Wake,
    /// Why the endpoint failed, if it did.
    failed: RefCell<Option<String>>,
    /// The TCP connection ended: the peer closed the link or died.
    closed: Cell<bool>,
}

impl Link {
    fn fail(&self, why: String) {
        self.failed.borrow_mut().get_or_insert(why);
        self.reader.ring();
        self.writer.ring();
    }
}

/// A gossamer worker's UCX worker and its links; one per worker thread, kept for good (the
/// UCX handler's argument).
#[derive(Debug)]
struct Worker {
    ucx: sys::Worker,
    node: Arc<UcxNode>,
    index: u32,
    /// Open links, by the token this worker gave them.
    links: RefCell<HashMap<u32, Rc<Link>>>,
    /// Messages for links given a token but not open yet.
    early: RefCell<HashMap<u32, Inbox>>,
    /// Links closed: what still comes for them is dropped.
    closed: RefCell<HashSet<u32>>,
    /// Endpoints, for their failures: to the token of their link.
    endpoints: RefCell<HashMap<usize, u32>>,
}

thread_local! {
    static WORKER: Cell<Option<&'static Worker>> = const { Cell::new(None) };
}

impl Worker {
    /// This thread's UCX worker, taken from `node` (worker `index`) at its first link: its
    /// handlers installed, its progress watched and its event descriptor waited on.
    fn current(node: &Arc<UcxNode>, index: u32) -> &'static Worker {
        if let Some(worker) = WORKER.get() {
            assert_eq!(worker.index, index, "a UCX link opens on its own worker");
            return worker;
        }
        let ucx = node.workers.lock().unwrap_or_else(|p| p.into_inner())[index as usize]
            .take()
            .expect("each UCX worker is taken by one gossamer worker");
        // Kept for good: the handlers' argument (see `sys`).
        let worker: &'static Worker = Box::leak(Box::new(Worker {
            ucx,
            node: node.clone(),
            index,
            links: RefCell::default(),
            early: RefCell::default(),
            closed: RefCell::default(),
            endpoints: RefCell::default(),
        }));
        let arg = (worker as *const Worker).cast_mut().cast();
        // SAFETY: `arg` is the leaked worker, valid for good; `arrived` and `failed` take it
        // back as a shared `&Worker`, on this thread, inside `progress`.
        unsafe { worker.ucx.set_handlers(arrived, failed, arg) }
            .unwrap_or_else(|e| panic!("installing the UCX message handler: {e}"));
        WORKER.set(Some(worker));
        // Never unregistered: the worker keeps its UCX worker until the thread ends.
        std::mem::forget(trust::net::watch(Rc::new(Progress(worker))));
        match worker.ucx.event_fd().map(|fd| fd.try_clone_to_owned()) {
            Ok(Ok(fd)) => {
                let readable = trust::net::Readable::new(fd).expect("a descriptor to wait on");
                // Wakes the worker's loop, which progresses UCX through the watch.
                trust::spawn(move || while readable.wait().is_ok() {});
            }
            Ok(Err(e)) => panic!("duplicating UCX's event descriptor: {e}"),
            Err(e) => panic!("UCX gave no event descriptor: {e}"),
        }
        worker
    }

    /// Opens the link this worker gave `token`, with what came for it already.
    fn open(&self, token: u32) -> Rc<Link> {
        let link = Rc::new(Link::default());
        if let Some(early) = self.early.borrow_mut().remove(&token) {
            *link.inbox.borrow_mut() = early;
        }
        self.links.borrow_mut().insert(token, link.clone());
        link
    }

    /// Forgets the link of `token` (its endpoint stays open: see `sys`).
    fn close(&self, token: u32) {
        self.links.borrow_mut().remove(&token);
        self.closed.borrow_mut().insert(token);
    }

    /// A message arrived (UCX's handler, inside `progress`).
    fn arrived(&self, header: &[u8], data: Option<&[u8]>) {
        let Ok(header) = <[u8; HEADER]>::try_from(header) else {
            eprintln!(
                "gossamer: dropped a UCX message with a {}-byte header: no link sends those",
                header.len()
            );
            return;
        };
        let token = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
        let sequence = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
        let links = self.links.borrow();
        if let Some(link) = links.get(&token) {
            match data {
                Some(data) => link.inbox.borrow_mut().push(sequence, data, usize::MAX),
                None => {
                    link.inbox.borrow_mut().broken =
                        Some("a UCX message by rendezvous, which links never send".into())
                }
            }
            link.reader.ring();
        } else if self.closed.borrow().contains(&token) {
            // The link closed while the peer was still sending: nobody reads it any more.
        } else if self.node.given(self.index, token) {
            let mut early = self.early.borrow_mut();
            let inbox = early.entry(token).or_default();
            match data {
                Some(data) => inbox.push(sequence, data, EARLY_BYTES),
                None => inbox.broken = Some("a UCX message by rendezvous".into()),
            }
        } else {
            eprintln!(
                "gossamer: dropped a UCX message for link {token}, which this worker never opened"
            );
        }
    }

    /// An endpoint failed (UCX's handler, inside `progress`).
    fn failed(&self, endpoint: usize, status: sys::Status) {
        let Some(token) = self.endpoints.borrow().get(&endpoint).copied() else {
            return;
        };
        if let Some(link) = self.links.borrow().get(&token) {
            link.fail(format!("its UCX endpoint failed: {status}"));
        }
    }

    /// Progresses UCX once; after anything happened, wakes the writers waiting for their
    /// sends. Returns whether anything did.
    fn progress(&self) -> bool {
        let progressed = self.ucx.progress();
        // A send may complete in a progress UCX counts as idle (one that waited for room).
        let sent = self.ucx.sends_completed();
        rma::run_completed();
        if !progressed && !sent {
            return false;
        }
        for link in self.links.borrow().values() {
            if link.writer.waited_for() {
                link.writer.ring();
            }
        }
        true
    }
}

/// UCX's message handler: `arg` is the worker (see [`Worker::current`]).
unsafe extern "C" fn arrived(
    arg: *mut std::ffi::c_void,
    header: *const std::ffi::c_void,
    header_length: usize,
    data: *const std::ffi::c_void,
    length: usize,
    rendezvous: std::ffi::c_int,
) {
    // SAFETY: `arg` is the leaked `Worker` (valid for good); UCX passes a header and data
    // of the given lengths, valid for this call (data null for a rendezvous message).
    let (worker, header, data) = unsafe {
        let worker = &*arg.cast::<Worker>();
        let header = slice(header, header_length);
        let data = (rendezvous == 0).then(|| slice(data, length));
        (worker, header, data)
    };
    worker.arrived(header, data);
}

/// UCX's endpoint-failure handler: `arg` is the worker (see [`Worker::current`]).
unsafe extern "C" fn failed(
    arg: *mut std::ffi::c_void,
    endpoint: *mut std::ffi::c_void,
    status: std::ffi::c_int,
) {
    // SAFETY: as in `arrived`.
    let worker = unsafe { &*arg.cast::<Worker>() };
    worker.failed(endpoint as usize, sys::Status::from_raw(status));
}

/// A slice from a pointer and length UCX passed; empty for a null pointer.
///
/// # Safety
/// `ptr` is null or valid for `len` bytes for the returned lifetime.
unsafe fn slice<'a>(ptr: *const std::ffi::c_void, len: usize) -> &'a [u8] {
    if ptr.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: the caller's promise.
    unsafe { std::slice::from_raw_parts(ptr.cast(), len) }
}

/// The worker's watch: progresses UCX every round, arms its event descriptor before sleep.
struct Progress(&'static Worker);

impl trust::net::Watch for Progress {
    fn poll(&self) -> bool {
        self.0.progress()
    }

    fn before_sleep(&self) -> bool {
        // Region handles held for operations under way are let go once they completed.
        if rma::flush_held() {
            self.0.progress();
            return true;
        }
        match self.0.ucx.arm() {
            Ok(true) => false,
            // Events wait: handle them instead of sleeping.
            Ok(false) => {
                self.0.progress();
                true
            }
            Err(e) => {
                eprintln!("gossamer: arming UCX's event descriptor: {e}");
                self.0.progress();
                true
            }
        }
    }
}

/// One UCX link, on its worker.
#[derive(Debug)]
pub(crate) struct UcxChannel {
    worker: &'static Worker,
    link: Rc<Link>,
    /// The token this worker gave the link.
    token: u32,
    endpoint: Option<Rc<sys::Endpoint>>,
    /// Whether the endpoint's connection settled: UCX connected it (its wireup is done) or
    /// found it failed.
    wired: Rc<Cell<bool>>,
    /// The token the peer gave the link, which this side's messages carry.
    peer_token: u32,
    /// The next message's sequence number.
    next: Cell<u32>,
    /// The TCP connection, in the worker's reactor: the heartbeats and the peer's end.
    side: trust::net::TcpStream,
    beats: Arc<AtomicU64>,
}

fn io_error(why: String) -> ChannelError {
    ChannelError::Io(io::Error::other(why))
}

impl UcxChannel {
    pub(super) fn read(&self, buf: &mut [u8]) -> Result<usize, ChannelError> {
        loop {
            let n = self.link.inbox.borrow_mut().take(buf);
            if n > 0 {
                return Ok(n);
            }
            if let Some(why) = self.link.inbox.borrow().broken.clone() {
                return Err(ChannelError::Corrupt(why));
            }
            if let Some(why) = self.link.failed.borrow().clone() {
                return Err(io_error(why));
            }
            // Set only while this fiber was suspended, so the look above saw every message
            // progress had delivered before the connection ended.
            if self.link.closed.get() {
                return Ok(0);
            }
            self.link.reader.wait();
        }
    }

    pub(super) fn write_all(&self, bytes: &[u8]) -> Result<(), ChannelError> {
        let endpoint = self.endpoint.as_ref();
        for piece in bytes.chunks(MESSAGE) {
            if let Some(why) = self.link.failed.borrow().clone() {
                return Err(io_error(why));
            }
            if self.link.closed.get() {
                return Err(ChannelError::Io(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the peer closed the link",
                )));
            }
            let endpoint = endpoint.expect("a link without an endpoint has failed");
            let mut header = [0u8; HEADER];
            header[..4].copy_from_slice(&self.peer_token.to_le_bytes());
            header[4..].copy_from_slice(&self.next.get().to_le_bytes());
            self.next.set(self.next.get().wrapping_add(1));
            let request = endpoint
                .send(&header, piece)
                .map_err(|e| io_error(format!("sending over UCX: {e}")))?;
            // The header and the piece stay put until the send completes: this fiber waits.
            if let Some(request) = request {
                let done = loop {
                    if let Some(done) = request.status() {
                        break done;
                    }
                    self.link.writer.wait();
                };
                done.map_err(|e| io_error(format!("sending over UCX: {e}")))?;
            }
        }
        Ok(())
    }

    /// Waits, for at most `limit`, until the endpoint's connection settled (see `wired`).
    /// A rank waits for this before its job starts: UCX 1.13 aborts the process when an
    /// endpoint without peer-failure detection fails while its wireup is under way, which a
    /// peer ending the job at once (a bad frame) would otherwise bring about.
    pub(super) fn await_wired(&self, limit: Duration) {
        let start = Instant::now();
        // Polled: the flush completes through the worker's progress, which runs between
        // fibers; this happens once per link, when the job starts.
        while !self.wired.get() && start.elapsed() < limit {
            trust::sleep(Duration::from_micros(200));
        }
    }

    /// Shuts the TCP connection, so that both sides' links end.
    pub(super) fn shutdown(&self) {
        let _ = self.side.shutdown(std::net::Shutdown::Both);
    }

    /// Reads the peer's heartbeats on the TCP connection until it ends; returns why.
    pub(super) fn serve(&self) -> String {
        let mut buf = [0u8; 256];
        let why = loop {
            match self.side.read(&mut buf) {
                Ok(0) => break "connection closed".to_string(),
                Ok(n) => {
                    self.beats.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) => break format!("its TCP connection failed: {e}"),
            }
        };
        self.link.closed.set(true);
        self.link.reader.ring();
        self.link.writer.ring();
        why
    }

    /// Test hook: sends a message that repeats the previous one's sequence number, as a
    /// broken peer would.
    #[cfg(feature = "fuzzing")]
    pub(super) fn corrupt(&self) {
        if let Some(endpoint) = &self.endpoint {
            let mut header = [0u8; HEADER];
            header[..4].copy_from_slice(&self.peer_token.to_le_bytes());
            header[4..].copy_from_slice(&self.next.get().wrapping_sub(1).to_le_bytes());
            // Sent eagerly at once or not at all: a broken peer needs no completion.
            if let Ok(Some(request)) = endpoint.send(&header, b"garbage") {
                while request.status().is_none() {
                    self.worker.ucx.progress();
                }
            }
        }
    }
}

impl Drop for UcxChannel {
    fn drop(&mut self) {
        self.worker.close(self.token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(inbox: &mut Inbox) -> Vec<u8> {
        let mut buf = [0u8; 64];
        let mut out = Vec::new();
        loop {
            let n = inbox.take(&mut buf);
            if n == 0 {
                return out;
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    #[test]
    fn messages_out_of_order_are_read_in_order() {
        let mut inbox = Inbox::default();
        inbox.push(1, b"b", usize::MAX);
        inbox.push(3, b"d", usize::MAX);
        assert_eq!(read_all(&mut inbox), b"", "nothing before message 0");
        inbox.push(0, b"a", usize::MAX);
        assert_eq!(read_all(&mut inbox), b"ab");
        inbox.push(2, b"c", usize::MAX);
        assert_eq!(read_all(&mut inbox), b"cd");
        assert!(inbox.broken.is_none());
    }

    #[test]
    fn sequence_numbers_wrap() {
        let mut inbox = Inbox {
            expected: u32::MAX,
            ..Inbox::default()
        };
        inbox.push(0, b"y", usize::MAX);
        inbox.push(u32::MAX, b"x", usize::MAX);
        assert_eq!(read_all(&mut inbox), b"xy");
        assert!(inbox.broken.is_none());
    }

    #[test]
    fn a_repeated_or_far_message_breaks_the_stream() {
        let mut inbox = Inbox::default();
        inbox.push(0, b"a", usize::MAX);
        inbox.push(0, b"a", usize::MAX);
        assert!(inbox.broken.as_deref().unwrap().contains("repeated"));

        let mut inbox = Inbox::default();
        inbox.push(2, b"c", usize::MAX);
        inbox.push(2, b"c", usize::MAX);
        assert!(inbox.broken.as_deref().unwrap().contains("came twice"));

        let mut inbox = Inbox::default();
        inbox.push(OUT_OF_ORDER as u32 + 1, b"z", usize::MAX);
        assert!(inbox.broken.as_deref().unwrap().contains("ahead"));
        // Once broken, it stays broken and takes nothing more.
        inbox.push(0, b"a", usize::MAX);
        assert_eq!(read_all(&mut inbox), b"");
    }

    proptest::proptest! {
        /// Any arrival order of a stream's messages reads as the stream, up to its first gap;
        /// a repeat breaks it instead; nothing panics on any input.
        #[test]
        fn any_arrival_order_reads_as_sent_or_breaks(
            pieces in proptest::collection::vec(proptest::collection::vec(0u8.., 0..5), 64),
            order in proptest::collection::vec(0usize..64, 0..80),
            start in 0u32..,
        ) {
            let mut inbox = Inbox { expected: start, ..Inbox::default() };
            let mut sent = [false; 64];
            let mut repeated = false;
            for &k in &order {
                repeated |= sent[k];
                sent[k] = true;
                inbox.push(start.wrapping_add(k as u32), &pieces[k], usize::MAX);
            }
            let read = read_all(&mut inbox);
            if repeated {
                proptest::prop_assert!(inbox.broken.is_some(), "a repeat went unnoticed");
            } else {
                proptest::prop_assert!(inbox.broken.is_none());
                let upto = sent.iter().position(|s| !s).unwrap_or(sent.len());
                proptest::prop_assert_eq!(read, pieces[..upto].concat());
            }
        }
    }

    #[test]
    fn what_waits_for_a_link_is_bounded() {
        let mut inbox = Inbox::default();
        inbox.push(0, &[0; 10], 16);
        assert!(inbox.broken.is_none());
        inbox.push(1, &[0; 10], 16);
        assert!(
            inbox
                .broken
                .as_deref()
                .unwrap()
                .contains("before the link opened")
        );
    }
}
