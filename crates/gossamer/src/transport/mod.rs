//! The transport seam: how the bytes of a link travel between two workers of different nodes.
//!
//! Everything above this module — frames and their validating decoder, operation identity,
//! the export table, counting, fate sharing — is one code path over every transport. A
//! transport provides five things, and nothing else:
//!
//! 1. **connect** and 2. **accept after the handshake**: bootstrap opens every link over TCP
//!    and proves the peer with the handshake; then the dialer sends an [`Offer`] and the
//!    acceptor answers with a [`Plan`] naming the transport the link will use, and the
//!    transport's own setup runs ([`shm::setup`] for shared memory). The result is a
//!    [`NewChannel`], which crosses from the bootstrap thread to the link's worker.
//! 3. **a lane's send side**, [`Channel::write_all`], and 4. **its receive side**,
//!    [`Channel::read`]: an ordered byte stream each way, which suspends only the calling
//!    fiber while it waits. The link writes whole batches of frames and decodes what it reads
//!    from its own buffer, so a transport never interprets a frame.
//! 5. **wake-ups and close**: a transport that needs a fiber of its own to hear its peer (the
//!    shared-memory doorbells) runs it in [`Channel::serve`]; the end of a link (the peer closed
//!    or died) shows as a read of 0 bytes, as on a socket. The watchdog's view of a link —
//!    heartbeats, bytes waiting unread — is the transport's [`Probe`].
//!
//! # The transports
//! - **TCP** ([`tcp`]): a socket per link, registered with the worker's reactor; the watchdog
//!   writes heartbeat frames onto it when the link is idle.
//! - **Shared memory** ([`shm`]): a pair of single-producer, single-consumer rings in a sealed
//!   `memfd` mapped by both processes; a sleeping receiver is woken by a byte on a Unix socket
//!   (its *doorbell*), whose end also tells at once that the peer died; heartbeats are a
//!   counter in the mapping. Between processes of one host this saves the two system calls
//!   per write round and the kernel's copies that loopback TCP costs.
//! - **UCX** (`ucx`, with the crate's `ucx` feature): UCX active messages between one UCX
//!   worker per gossamer worker, over whatever UCX is configured to use (`UCX_TLS`): RDMA on
//!   InfiniBand or RoCE, its shared memory, TCP. The worker progresses UCX from its loop and
//!   sleeps on UCX's event descriptor; the proven TCP connection stays open beside it for the
//!   peer's end and the heartbeats.
//!
//! `GSM_TRANSPORT` ([`TransportChoice`]) picks: `auto` (the default) uses shared memory between
//! ranks on the same host ([`HostId`]: the same kernel boot, host name and network namespace),
//! UCX between hosts that both have an RDMA device and UCX, and TCP otherwise; `tcp`, `shm` and
//! `ucx` force one. The acceptor decides from both sides' choices, hosts and UCX ends
//! ([`decide`]), so the two ends never disagree: the two explicit choices must agree, shared
//! memory needs one host, UCX both sides built with it, and anything else is an error naming
//! the pair. Under `auto`, a shared-memory setup that fails before the plan is sent (the
//! peer's Unix socket unreachable, its credentials not the peer's, as across PID namespaces)
//! falls back to TCP with a logged line.
//!
//! # A later transport
//! Raw verbs, or libfabric, fit the same seam: a setup exchanged over the authenticated TCP
//! connection (queue-pair numbers, memory keys, ring addresses) as shared memory exchanges its
//! file and UCX its worker address; lanes written with one-sided RDMA writes and polled as
//! [`shm`]'s rings are; a completion channel's descriptor in the worker's reactor. Only a new
//! variant of [`Channel`], [`NewChannel`] and [`Probe`] and a [`Plan`] case would change;
//! nothing above this module.

pub(crate) mod shm;
pub(crate) mod tcp;
#[cfg(feature = "ucx")]
pub(crate) mod ucx;

use std::cell::{Cell, RefCell};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use serde::{Deserialize, Serialize};

use crate::env::TransportChoice;
pub(crate) use shm::setup::HostId;

/// A fiber of this worker waiting for its transport (a doorbell, a message, a completed
/// send), and whether it was woken since it last looked.
#[derive(Debug, Default)]
pub(crate) struct Wake {
    rung: Cell<bool>,
    waiter: RefCell<Option<Waker>>,
}

impl Wake {
    pub(crate) fn ring(&self) {
        self.rung.set(true);
        if let Some(waker) = self.waiter.take() {
            waker.wake();
        }
    }

    /// Whether a fiber waits for this wake-up.
    pub(crate) fn waited_for(&self) -> bool {
        self.waiter.borrow().is_some()
    }

    pub(crate) fn wait(&self) {
        trust::block_on(std::future::poll_fn(|cx| {
            if self.rung.replace(false) {
                return Poll::Ready(());
            }
            *self.waiter.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        }));
    }
}

/// Which transport a link uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// A TCP connection.
    Tcp,
    /// Rings in memory shared by the two processes, on one host.
    SharedMemory,
    /// UCX active messages.
    Ucx,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Tcp => "tcp",
            Transport::SharedMemory => "shm",
            Transport::Ucx => "ucx",
        })
    }
}

/// What the dialer of a link sends after the handshake and the worker it asks for.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Offer {
    pub(crate) choice: TransportChoice,
    /// `None` if this process cannot tell its host (then only TCP).
    pub(crate) host: Option<HostId>,
    pub(crate) pid: u32,
    /// The dialer's rendezvous name, if it can take shared memory.
    pub(crate) rendezvous: Option<String>,
    /// The dialer's UCX worker for the link, if it can take UCX.
    pub(crate) ucx: Option<UcxOffer>,
}

/// One side's UCX end of a link: its worker's address, the token its messages for the link
/// carry, and whether its host has an RDMA device (for `auto`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct UcxOffer {
    #[serde(with = "serde_bytes")]
    pub(crate) address: Vec<u8>,
    pub(crate) token: u32,
    pub(crate) rdma: bool,
    /// Whether the side's endpoints ask UCX to detect their peer's failure: both must.
    pub(crate) peer_failure: bool,
    /// The side's region heap, for one-sided access (`region`); `None` if UCX could not
    /// register it (regions there are then reached by requests).
    pub(crate) heap: Option<UcxHeap>,
}

/// A node's region heap, as UCX registers it: its bytes, and what keeps them mapped.
pub(crate) struct HeapMemory {
    _owner: Arc<dyn std::any::Any + Send + Sync>,
    address: *mut u8,
    bytes: usize,
}

// SAFETY: the pointer is only read, to register the memory; the memory itself is shared
// between threads (and processes) through atomics alone, and `owner` is `Send + Sync`.
unsafe impl Send for HeapMemory {}
// SAFETY: as for `Send`.
unsafe impl Sync for HeapMemory {}

impl std::fmt::Debug for HeapMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeapMemory")
            .field("address", &self.address)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl HeapMemory {
    /// # Safety
    /// `bytes` bytes at `address` stay mapped, and are only accessed atomically, while
    /// `owner` lives.
    pub(crate) unsafe fn new(
        owner: Arc<dyn std::any::Any + Send + Sync>,
        address: *mut u8,
        bytes: usize,
    ) -> HeapMemory {
        HeapMemory {
            _owner: owner,
            address,
            bytes,
        }
    }
}

/// A node's region heap as peers reach it over UCX: its address in the owner, its length in
/// words, and the key UCX packed for it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct UcxHeap {
    pub(crate) address: u64,
    pub(crate) words: u64,
    #[serde(with = "serde_bytes")]
    pub(crate) key: Vec<u8>,
}

/// The acceptor's answer to an [`Offer`].
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Plan {
    Tcp,
    /// The acceptor (process `pid`) has connected to the dialer's rendezvous.
    SharedMemory {
        pid: u32,
    },
    /// UCX, with the acceptor's end of the link.
    Ucx(UcxOffer),
    /// The two sides' choices cannot be met.
    Refused(String),
}

/// The largest offer or plan: a few names and numbers, and a UCX worker's address (a few
/// hundred bytes per transport it can use).
const MAX_SETUP_MESSAGE: usize = 16 * 1024;

/// Sends a setup message: a `u32` length, then postcard.
pub(crate) fn send_message<T: Serialize>(
    stream: &mut TcpStream,
    message: &T,
) -> std::io::Result<()> {
    let body = postcard::to_allocvec(message).map_err(std::io::Error::other)?;
    let mut bytes = (body.len() as u32).to_le_bytes().to_vec();
    bytes.extend_from_slice(&body);
    stream.write_all(&bytes)
}

/// Receives a setup message, refusing one longer than [`MAX_SETUP_MESSAGE`].
pub(crate) fn receive_message<T: for<'de> Deserialize<'de>>(
    stream: &mut TcpStream,
) -> std::io::Result<T> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_SETUP_MESSAGE {
        return Err(std::io::Error::other(format!(
            "link setup message of {len} bytes > {MAX_SETUP_MESSAGE}"
        )));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    postcard::from_bytes(&body)
        .map_err(|e| std::io::Error::other(format!("bad link setup message: {e}")))
}

/// What a link runs over, as the acceptor decides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Tcp,
    SharedMemory,
    Ucx,
}

/// The acceptor's decision on an offer, given its own choice, host and UCX end (if it can
/// take UCX). Both sides' explicit choices must agree; `auto` takes shared memory on one
/// host, UCX between hosts that both have RDMA, and TCP otherwise.
pub(crate) fn decide(
    offer: &Offer,
    mine: TransportChoice,
    my_host: Option<&HostId>,
    my_ucx: Option<&UcxOffer>,
) -> Result<Decision, String> {
    use TransportChoice::{Auto, Shm, Tcp, Ucx};
    let same_host = my_host.is_some() && offer.host.as_ref() == my_host;
    let shared = same_host && offer.rendezvous.is_some();
    let both_ucx = offer.ucx.is_some() && my_ucx.is_some();
    let wanted = match (offer.choice, mine) {
        (Auto, choice) | (choice, Auto) => choice,
        (a, b) if a == b => a,
        (a, b) => {
            let (a, b) = if a.to_string() <= b.to_string() {
                (a, b)
            } else {
                (b, a)
            };
            return Err(format!(
                "one side asks for GSM_TRANSPORT={a}, the other for {b}"
            ));
        }
    };
    let decided = match wanted {
        Tcp => Ok(Decision::Tcp),
        Shm if shared => Ok(Decision::SharedMemory),
        Shm if same_host => {
            Err("GSM_TRANSPORT=shm, but this host cannot set up shared memory".into())
        }
        Shm => Err(
            "GSM_TRANSPORT=shm, but the two ranks are on different hosts (or network \
                    namespaces)"
                .into(),
        ),
        Ucx if both_ucx => Ok(Decision::Ucx),
        Ucx => Err(format!(
            "GSM_TRANSPORT=ucx, but {} cannot use UCX (built without gossamer's `ucx` \
             feature, or UCX failed to start there)",
            if offer.ucx.is_none() {
                "the dialing rank"
            } else {
                "the accepting rank"
            }
        )),
        Auto if shared => Ok(Decision::SharedMemory),
        Auto if both_ucx
            && offer.ucx.as_ref().is_some_and(|u| u.rdma)
            && my_ucx.is_some_and(|u| u.rdma) =>
        {
            Ok(Decision::Ucx)
        }
        Auto => Ok(Decision::Tcp),
    };
    if decided == Ok(Decision::Ucx)
        && let (Some(theirs), Some(mine)) = (&offer.ucx, my_ucx)
        && theirs.peer_failure != mine.peer_failure
    {
        // UCX itself would refuse the pair, with no word of why.
        return Err(format!(
            "the {} rank's UCX endpoints detect a peer's failure and the other's do not \
             (they do in a job under `gsm run --recover`): give every rank the same \
             GSM_RECOVER",
            if theirs.peer_failure {
                "dialing"
            } else {
                "accepting"
            }
        ));
    }
    decided
}

/// This node's UCX workers, if links may use UCX (always none in a build without UCX).
#[derive(Debug, Clone, Default)]
pub(crate) struct UcxHere {
    #[cfg(feature = "ucx")]
    node: Option<Arc<ucx::UcxNode>>,
}

impl UcxHere {
    /// Starts UCX for `workers` gossamer workers if `choice` may use it: `ucx` always (an
    /// error if it cannot), `auto` where the host has an RDMA device.
    pub(crate) fn start(
        choice: TransportChoice,
        workers: u32,
        recovers: bool,
    ) -> Result<UcxHere, String> {
        #[cfg(feature = "ucx")]
        {
            let wanted = match choice {
                TransportChoice::Ucx => true,
                TransportChoice::Auto => ucx::rdma_here(),
                TransportChoice::Tcp | TransportChoice::Shm => false,
            };
            if !wanted {
                return Ok(UcxHere::default());
            }
            match ucx::UcxNode::new(workers, recovers) {
                Ok(node) => Ok(UcxHere {
                    node: Some(Arc::new(node)),
                }),
                Err(why) if choice == TransportChoice::Ucx => {
                    Err(format!("GSM_TRANSPORT=ucx: {why}"))
                }
                Err(why) => {
                    eprintln!("gossamer: links between hosts use TCP: {why}");
                    Ok(UcxHere::default())
                }
            }
        }
        #[cfg(not(feature = "ucx"))]
        {
            let _ = (workers, recovers);
            if choice == TransportChoice::Ucx {
                return Err(
                    "GSM_TRANSPORT=ucx, but this build of gossamer has no UCX (build it \
                            with its `ucx` feature)"
                        .into(),
                );
            }
            Ok(UcxHere {})
        }
    }

    /// Allocates this node's region heap of `bytes` through UCX, if UCX started: memory its
    /// shared memory maps into peers (see `transport::ucx::rma`). `None` without UCX.
    pub(crate) fn allocate_heap(&self, bytes: usize) -> Result<Option<(*mut u8, usize)>, String> {
        #[cfg(feature = "ucx")]
        if let Some(node) = &self.node {
            return node.allocate_heap(bytes).map(Some);
        }
        let _ = bytes;
        Ok(None)
    }

    /// Registers this node's own region heap with UCX, if UCX started.
    pub(crate) fn register_heap(&self, memory: HeapMemory) -> Result<(), String> {
        #[cfg(feature = "ucx")]
        if let Some(node) = &self.node {
            return node.register_heap(memory);
        }
        let _ = memory;
        Ok(())
    }

    /// This side's end of a new link of worker `worker`, if it can take UCX.
    pub(crate) fn offer(&self, worker: u32) -> Result<Option<UcxOffer>, String> {
        #[cfg(feature = "ucx")]
        if let Some(node) = &self.node {
            if worker >= node.workers() {
                return Err(format!("asks for worker {worker} of {}", node.workers()));
            }
            return Ok(Some(UcxOffer {
                address: node.address(worker).to_vec(),
                token: node.give_token(worker),
                rdma: ucx::rdma_here(),
                peer_failure: node.peer_failure(),
                heap: node.heap().cloned(),
            }));
        }
        let _ = worker;
        Ok(None)
    }

    /// The link of worker `worker` over UCX to worker `peer.1` of rank `peer.0`, between
    /// `mine` (from [`offer`](UcxHere::offer)) and the peer's end; `side` is the proven TCP
    /// connection, kept for liveness.
    pub(crate) fn channel(
        &self,
        worker: u32,
        (peer, peer_incarnation): ((u32, u32), u32),
        mine: &UcxOffer,
        theirs: UcxOffer,
        side: TcpStream,
    ) -> Result<NewChannel, String> {
        #[cfg(feature = "ucx")]
        if let Some(node) = &self.node {
            return Ok(NewChannel::Ucx(ucx::NewUcx {
                node: node.clone(),
                worker,
                token: mine.token,
                peer_token: theirs.token,
                peer_address: theirs.address,
                peer,
                peer_incarnation,
                peer_heap: theirs.heap,
                side,
            }));
        }
        let _ = (worker, peer, peer_incarnation, mine, theirs, side);
        Err("UCX was chosen, but this rank did not start it".into())
    }
}

/// A link's transport, set up by bootstrap and not yet bound to its worker.
#[derive(Debug)]
pub(crate) enum NewChannel {
    Tcp(TcpStream),
    SharedMemory(shm::NewShm),
    #[cfg(feature = "ucx")]
    Ucx(ucx::NewUcx),
}

impl NewChannel {
    /// Binds the channel to the calling worker and shows it to the watchdog through `probe`.
    /// `spin`: how long a shared-memory lane looks for bytes before it sleeps.
    pub(crate) fn open(self, probe: &Arc<Probe>) -> Channel {
        match self {
            NewChannel::Tcp(stream) => Channel::Tcp(tcp::TcpChannel::open(stream, probe)),
            NewChannel::SharedMemory(new) => Channel::SharedMemory(new.open(probe)),
            #[cfg(feature = "ucx")]
            NewChannel::Ucx(new) => Channel::Ucx(new.open(probe)),
        }
    }
}

/// Why a channel could not move bytes.
#[derive(Debug)]
pub(crate) enum ChannelError {
    /// The transport failed (a socket error): the link ends.
    Io(std::io::Error),
    /// The peer broke the transport's protocol (a ring position out of bounds): a bad frame.
    Corrupt(String),
}

impl std::fmt::Display for ChannelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChannelError::Io(e) => e.fmt(f),
            ChannelError::Corrupt(why) => f.write_str(why),
        }
    }
}

/// One link's transport, on its worker.
#[derive(Debug)]
pub(crate) enum Channel {
    Tcp(tcp::TcpChannel),
    SharedMemory(shm::ShmChannel),
    #[cfg(feature = "ucx")]
    Ucx(ucx::UcxChannel),
}

impl Channel {
    pub(crate) fn transport(&self) -> Transport {
        match self {
            Channel::Tcp(_) => Transport::Tcp,
            Channel::SharedMemory(_) => Transport::SharedMemory,
            #[cfg(feature = "ucx")]
            Channel::Ucx(_) => Transport::Ucx,
        }
    }

    /// Reads what has arrived into `buf`, waiting (only this fiber) for at least one byte;
    /// 0 means the peer closed the link. Only the link's reader calls this.
    pub(crate) fn read(&self, buf: &mut [u8]) -> Result<usize, ChannelError> {
        match self {
            Channel::Tcp(c) => c.read(buf).map_err(ChannelError::Io),
            Channel::SharedMemory(c) => c.read(buf),
            #[cfg(feature = "ucx")]
            Channel::Ucx(c) => c.read(buf),
        }
    }

    /// Sends all of `bytes`, waiting (only this fiber) for room. Only the link's writer calls
    /// this.
    pub(crate) fn write_all(&self, bytes: &[u8]) -> Result<(), ChannelError> {
        match self {
            Channel::Tcp(c) => c.write_all(bytes).map_err(ChannelError::Io),
            Channel::SharedMemory(c) => c.write_all(bytes),
            #[cfg(feature = "ucx")]
            Channel::Ucx(c) => c.write_all(bytes),
        }
    }

    /// Waits, for at most `limit`, until the transport has connected to the peer or found
    /// that it cannot: UCX's endpoints (see `UcxChannel::await_wired`); the others connected
    /// during bootstrap.
    pub(crate) fn await_wired(&self, limit: std::time::Duration) {
        #[cfg(feature = "ucx")]
        if let Channel::Ucx(c) = self {
            c.await_wired(limit);
        }
        #[cfg(not(feature = "ucx"))]
        let _ = limit;
    }

    /// Shuts the link's connection, so that its reader and writer stop: its peer was lost.
    /// (Recovery runs links over TCP or UCX.)
    pub(crate) fn shutdown(&self) {
        match self {
            Channel::Tcp(c) => c.shutdown(),
            Channel::SharedMemory(_) => {}
            #[cfg(feature = "ucx")]
            Channel::Ucx(c) => c.shutdown(),
        }
    }

    /// Runs what the transport needs to hear its peer, in a fiber of its own, until the link
    /// ends; returns why. TCP needs nothing and returns `None` at once.
    pub(crate) fn serve(&self) -> Option<String> {
        match self {
            Channel::Tcp(_) => None,
            Channel::SharedMemory(c) => Some(c.serve()),
            #[cfg(feature = "ucx")]
            Channel::Ucx(c) => Some(c.serve()),
        }
    }

    /// Test hook: breaks the transport's protocol from this side, as a buggy peer would.
    #[cfg(feature = "fuzzing")]
    pub(crate) fn corrupt(&self) -> bool {
        match self {
            Channel::Tcp(_) => false,
            Channel::SharedMemory(c) => {
                c.corrupt();
                true
            }
            #[cfg(feature = "ucx")]
            Channel::Ucx(c) => {
                c.corrupt();
                true
            }
        }
    }
}

/// The watchdog's view of a link, from its own thread: so that a worker busy in user code for
/// longer than `GSM_PEER_TIMEOUT` neither looks dead to its peers nor takes them for dead.
///
/// The link sets what it watches when it opens and clears it before it closes, under the
/// write lock; the watchdog uses it only under the read lock, so it never touches a socket
/// after it closed (whose number might already name another file).
#[derive(Debug, Default)]
pub(crate) struct Probe {
    watched: std::sync::RwLock<Option<Watched>>,
    /// Held by the link's writer for each write, and by the watchdog for a heartbeat, so that
    /// a heartbeat never lands inside another frame (TCP).
    writing: Mutex<()>,
    /// The peer's heartbeat count last seen (shared memory).
    last_beat: std::sync::atomic::AtomicU64,
}

#[derive(Debug)]
enum Watched {
    Tcp(std::os::fd::RawFd),
    SharedMemory(shm::Watch),
    #[cfg(feature = "ucx")]
    Ucx(ucx::Watch),
}

impl Probe {
    fn set(&self, watched: Watched) {
        *self.watched.write().unwrap_or_else(|p| p.into_inner()) = Some(watched);
    }

    /// Forgets the link; called before its transport closes.
    pub(crate) fn clear(&self) {
        *self.watched.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn lock_writes(&self) -> MutexGuard<'_, ()> {
        self.writing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The link's transport; `None` if the link is gone.
    pub(crate) fn transport(&self) -> Option<Transport> {
        let watched = self.watched.read().unwrap_or_else(|p| p.into_inner());
        Some(match watched.as_ref()? {
            Watched::Tcp(_) => Transport::Tcp,
            Watched::SharedMemory(_) => Transport::SharedMemory,
            #[cfg(feature = "ucx")]
            Watched::Ucx(_) => Transport::Ucx,
        })
    }

    /// Whether bytes from the peer wait unread (the worker is busy, not the peer silent);
    /// `None` if the link is gone.
    pub(crate) fn unread(&self) -> Option<bool> {
        let watched = self.watched.read().unwrap_or_else(|p| p.into_inner());
        match watched.as_ref()? {
            Watched::Tcp(fd) => tcp::unread(*fd),
            Watched::SharedMemory(watch) => Some(watch.unread()),
            #[cfg(feature = "ucx")]
            Watched::Ucx(watch) => watch.unread(),
        }
    }

    /// Whether the peer showed it is alive since the last call, by a means the link's reader
    /// does not see (a shared-memory heartbeat, one on a UCX link's TCP connection). TCP
    /// heartbeats are frames, which the reader counts.
    pub(crate) fn heard(&self) -> bool {
        let watched = self.watched.read().unwrap_or_else(|p| p.into_inner());
        let beat = match watched.as_ref() {
            Some(Watched::SharedMemory(watch)) => watch.peer_heartbeat(),
            #[cfg(feature = "ucx")]
            Some(Watched::Ucx(watch)) => watch.peer_heartbeat(),
            _ => return false,
        };
        let ordering = std::sync::atomic::Ordering::Relaxed;
        self.last_beat.swap(beat, ordering) != beat
    }

    /// Sends a heartbeat if the link is idle; returns whether it did.
    pub(crate) fn heartbeat(&self) -> bool {
        let watched = self.watched.read().unwrap_or_else(|p| p.into_inner());
        match watched.as_ref() {
            None => false,
            Some(Watched::Tcp(fd)) => {
                let Ok(_writing) = self.writing.try_lock() else {
                    return false; // the worker is writing: the link is not idle
                };
                tcp::heartbeat(*fd)
            }
            Some(Watched::SharedMemory(watch)) => {
                watch.beat();
                true
            }
            #[cfg(feature = "ucx")]
            // Nothing else writes a UCX link's TCP connection.
            Some(Watched::Ucx(watch)) => watch.beat(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TransportChoice::{Auto, Shm, Tcp, Ucx};

    fn host(netns: u64) -> HostId {
        HostId::for_tests(netns)
    }

    fn ucx(rdma: bool) -> UcxOffer {
        UcxOffer {
            address: vec![1, 2, 3],
            token: 0,
            rdma,
            peer_failure: false,
            heap: None,
        }
    }

    fn ucx_detecting_failure() -> UcxOffer {
        UcxOffer {
            peer_failure: true,
            ..ucx(false)
        }
    }

    /// The dialer's offer: its choice, host (network namespace), and UCX end.
    fn offer(choice: TransportChoice, netns: u64, ucx: Option<UcxOffer>) -> Offer {
        Offer {
            choice,
            host: Some(host(netns)),
            pid: 1,
            rendezvous: Some("r".into()),
            ucx,
        }
    }

    #[test]
    fn both_sides_choices_decide_the_transport() {
        let (here, there) = (host(1), host(2));
        let cases = [
            // (dialer, its netns, its UCX, acceptor, its netns, its UCX) -> decision
            (
                (Auto, 1, None),
                (Auto, &here, None),
                Ok(Decision::SharedMemory),
            ),
            ((Auto, 1, None), (Auto, &there, None), Ok(Decision::Tcp)),
            ((Tcp, 1, None), (Auto, &here, None), Ok(Decision::Tcp)),
            (
                (Auto, 1, Some(ucx(false))),
                (Ucx, &there, Some(ucx(false))),
                Ok(Decision::Ucx),
            ),
            (
                (Ucx, 1, Some(ucx(false))),
                (Ucx, &here, Some(ucx(false))),
                Ok(Decision::Ucx),
            ),
            // `auto` takes UCX between hosts only where both have RDMA.
            (
                (Auto, 1, Some(ucx(true))),
                (Auto, &there, Some(ucx(true))),
                Ok(Decision::Ucx),
            ),
            (
                (Auto, 1, Some(ucx(true))),
                (Auto, &there, Some(ucx(false))),
                Ok(Decision::Tcp),
            ),
            // On one host, `auto` keeps its own shared memory.
            (
                (Auto, 1, Some(ucx(true))),
                (Auto, &here, Some(ucx(true))),
                Ok(Decision::SharedMemory),
            ),
            (
                (Ucx, 1, None),
                (Auto, &there, Some(ucx(true))),
                Err("the dialing rank cannot use UCX"),
            ),
            (
                (Auto, 1, Some(ucx(true))),
                (Ucx, &there, None),
                Err("the accepting rank cannot use UCX"),
            ),
            (
                (Ucx, 1, Some(ucx(true))),
                (Tcp, &there, None),
                Err("GSM_TRANSPORT=tcp, the other for ucx"),
            ),
            (
                (Shm, 1, None),
                (Ucx, &here, None),
                Err("GSM_TRANSPORT=shm, the other for ucx"),
            ),
            (
                (Shm, 1, None),
                (Auto, &there, None),
                Err("on different hosts"),
            ),
            // Both ends' endpoints detect a peer's failure, or neither's.
            (
                (Ucx, 1, Some(ucx_detecting_failure())),
                (Ucx, &there, Some(ucx_detecting_failure())),
                Ok(Decision::Ucx),
            ),
            (
                (Ucx, 1, Some(ucx_detecting_failure())),
                (Ucx, &there, Some(ucx(false))),
                Err("the dialing rank's UCX endpoints detect a peer's failure"),
            ),
            (
                (Ucx, 1, Some(ucx(false))),
                (Auto, &there, Some(ucx_detecting_failure())),
                Err("the accepting rank's UCX endpoints detect"),
            ),
        ];
        for ((choice, netns, theirs), (mine, my_host, my_ucx), expected) in cases {
            let offer = offer(choice, netns, theirs);
            let got = decide(&offer, mine, Some(my_host), my_ucx.as_ref());
            match (&got, expected) {
                (Ok(got), Ok(expected)) => assert_eq!(*got, expected, "{offer:?} to {mine}"),
                (Err(why), Err(said)) => assert!(why.contains(said), "{why} lacks {said}"),
                _ => panic!("{offer:?} to {mine}: {got:?}, expected {expected:?}"),
            }
        }
    }
}
