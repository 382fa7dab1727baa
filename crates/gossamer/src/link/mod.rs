//! One connection between a worker of this node and a worker of another (a *link*), over TCP
//! or shared memory (see `transport`), and the per-worker state that owns the links, the
//! exports and the calls in flight.
//!
//! Each link belongs to one worker and is served by two fibers of that worker:
//! - the *reader* decodes frames as they arrive. Requests run at once: the link's local worker
//!   is the trustee of every property the peer names on it, so the reader runs the operation
//!   on the property in place (`trust::Trust::try_apply_inline`) and stages its answer in the
//!   same round; after each bank of the window (see below) it yields, so the writer sends
//!   those answers and the bank's credit while the rest of the frame runs. Answers
//!   complete the calls waiting for them; their callbacks run in delegated context through
//!   [`trust::defer`]. A bad frame ends the job: the peer runs the same build, so garbage after
//!   the handshake means a broken peer, not a stranger.
//! - the *writer* sleeps until something is staged, yields once if the worker's round has
//!   anything else to do (`trust::yield_if_busy`), so that the round's other requests and
//!   answers go in the same write, then writes everything staged — requests, answers, control
//!   messages — with one write; a call alone on an otherwise idle worker goes out at once. The
//!   reader never waits for the writer, so a peer that stops reading cannot stop this side from
//!   reading. When more than [`BACKLOG_FRAMES`] frames'
//!   worth of bytes are staged, a fiber's new request waits for the writer (backpressure hits
//!   new requests only: answers, control messages and delegated context never wait).
//!
//! Requests ride a window of M banks × N slots (`GSM_AM_BANKS`, `GSM_AM_SLOTS`; see
//! `window`): the peer returns a bank's credit once the last of its N requests ran, and a
//! request past M × N unrun ones waits for a credit, a fiber's in the fiber, one made in
//! delegated context (which cannot wait) held in order on the link. So a peer never has more
//! than M × N of this side's requests to run, however fast this side makes them.
//!
//! A value too large for a frame (an argument or a result) is announced in its frame and its
//! bytes follow in chunk frames, `CHUNKS_PER_ROUND` (see `outgoing`) per write at most, taking turns among
//! the large values in flight; the frames staged meanwhile go out between the chunks, so a
//! 64 MiB argument delays other calls by a few chunks, not by 64 MiB. The receiver collects
//! chunks in order and checks each against its value's announced length. Requests of one lane
//! still run in the order they were sent: one that arrives behind a large argument still in
//! chunks waits for it (a request counts as received, for releases, when it runs).
//!
//! # Why one connection per pair of workers
//! The seed opens one connection per (local worker, remote node); this layer opens one per
//! (local worker, remote worker). The receiving worker is then the trustee of everything it
//! reads, so a request runs inline on arrival; with one connection per node, the receiver
//! would hand W − 1 of every W requests to another worker (a local delegation, about 145
//! instructions with its answer in the `instructions` benchmark) and the answer would come back
//! the same way. The price is connections: W² per pair of nodes instead of W. The benchmark
//! configurations the issue names for this choice (E2, E4: one worker per rank) cannot tell
//! the two apart (with one worker they are the same connection), and two cores cannot run the
//! many-worker ranks where they differ; so this was decided on the hop, not measured. With
//! tens of workers per node and many nodes the connection count wins, and a per-node layout
//! needs the trustee worker named in each request and a different dial policy.
//!
//! Everything here is touched only by the owning worker, so it lives in `RefCell`s and `Rc`s
//! of a thread-local ([`with_net`]); what other threads must see (liveness for the watchdog,
//! counts of requests sent, for releases) is in [`Health`] and atomics.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Poll, Waker};

use serde::{Deserialize, Serialize};

use crate::codec::{self, Encoded};
use crate::export::{Doubt, Export, ExportError, Life, Shared, Ticket};
use crate::fate;
use crate::function::{Functions, Interned, NamedError, Signature, valid_name};
use crate::handshake::{self, BuildId};
use crate::op::{self, AnswerTo, Reply, Run};
use crate::state::{Health, NewLink, RackState};
use crate::transport::{Channel, ChannelError, Transport};
use crate::wire::{self, ChunkOf, Code, Frame, Payload, Status, Waiting};

mod outgoing;
mod window;

use outgoing::Outgoing;
use window::Window;

/// How a call ended, as the caller sees it before decoding the value.
#[derive(Debug)]
pub(crate) enum Outcome<'a> {
    Ok(&'a [u8]),
    /// The operation panicked on the trustee; the message says where.
    Panicked(String),
    /// The trustee refused the request (stale handle, type mismatch, bad argument).
    Refused(String),
    /// The trustee has no function of the name and signature a named request gave: the
    /// encoded `NamedError`.
    Unresolved(&'a [u8]),
    /// The trustee's rank was lost before it answered, or is down (`gsm run --recover`):
    /// whether the request ran is unknown.
    Lost(String),
}

/// What to do with an answer.
pub(crate) type OnAnswer = Box<dyn FnOnce(Outcome<'_>)>;

/// Control messages: postcard-encoded in `Control` frames.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Control {
    /// The sender's handles under `ticket` are gone: toggle it out. `sent[i]` is how many
    /// counted messages (requests and toggles) the sender's worker `i` had sent to this
    /// worker when the last handle dropped; the release applies once that many have arrived
    /// on each link, so it cannot overtake them.
    Release {
        slot: u32,
        generation: u32,
        ticket: Ticket,
        sent: Vec<u64>,
    },
    /// The sender sent a handle to the export to `holder`, a third node, under this new
    /// ticket.
    Toggle {
        slot: u32,
        generation: u32,
        ticket: Ticket,
        holder: Life,
    },
    /// The sender's named requests on this connection call `name`, expecting `ours`, by
    /// `index`: the next index (names are numbered 0, 1, … per connection and direction).
    Name {
        index: u32,
        name: String,
        ours: Signature,
    },
    /// The sender ran the last request of one more bank of this side's window (a request
    /// flagged *credit*): N more requests may go (see `window`).
    Credit,
    /// From a property's home: a life now lost minted `ticket` for the receiver, which it
    /// may never have received. Answered with `NeverHeld` once the receiver can no longer
    /// get it and does not hold it (see `export`, "Lost ranks").
    Doubt {
        slot: u32,
        generation: u32,
        ticket: Ticket,
    },
    /// To a property's home: the sender never held `ticket`, and never will.
    NeverHeld {
        slot: u32,
        generation: u32,
        ticket: Ticket,
    },
}

/// Names a link accepts from its peer at most: a peer cannot grow a link's table without
/// bound.
const MAX_NAMES: usize = 1 << 16;

/// A name the peer gave an index on this link, resolved against this node's functions.
struct NameIn {
    name: String,
    /// The function to run, or the encoded `NamedError` every call of it is answered.
    callee: Result<Run, Encoded>,
}

/// Staged frame bytes a link may hold before a fiber's new request waits for the writer
/// (backpressure: answers and control messages never wait, nor does delegated context).
const BACKLOG_FRAMES: usize = 16;

/// One connection to a worker of another node.
pub(crate) struct Link {
    rack: Arc<RackState>,
    /// The worker of this node that owns the link.
    worker: usize,
    /// Which life of the peer's rank the link reaches.
    incarnation: u32,
    /// The peer's build, when it is not this node's (`GSM_MIXED_BUILDS`): only named calls go
    /// either way then.
    other_build: Option<BuildId>,
    /// Set when the peer's rank is lost (`gsm run --recover`): the link is shut, its calls
    /// failed, and it carries nothing more.
    closed: Cell<bool>,
    pub(crate) health: Arc<Health>,
    channel: Channel,
    limits: wire::Limits,
    out: RefCell<Outgoing>,
    /// The writer fiber, while it sleeps for lack of anything staged.
    writer: RefCell<Option<Waker>>,
    pending: RefCell<Waiting<OnAnswer>>,
    next_id: Cell<u64>,
    /// Requests this side has run from the link, and toggles taken (checked by releases).
    received: Cell<u64>,
    /// Requests staged on this link, counted where every worker of this node can read them.
    sent: Arc<AtomicU64>,
    /// Large values arriving in chunks, by which value they are.
    arriving: RefCell<HashMap<(ChunkOf, u64), Arriving>>,
    /// The peer's requests that wait, in order, for a large argument ahead of them (or their
    /// own) to arrive: requests of one lane run in the order they were sent.
    queued: RefCell<VecDeque<Queued>>,
    /// Fibers waiting for staged bytes to drain or for the window to open (backpressure).
    room_waiters: RefCell<Vec<Waker>>,
    /// Which requests the window lets this side stage.
    window: Window,
    /// Requests made in delegated context (which cannot wait) while the window was shut, in
    /// order: staged as credits come.
    held: RefCell<VecDeque<Held>>,
    /// The index this side gave each name it calls on this link, by the name's process-wide
    /// number (see `function::intern`); `u32::MAX` where not given yet.
    names_out: RefCell<Vec<u32>>,
    /// How many names this side gave indices on this link.
    names_given: Cell<u32>,
    /// The names the peer gave indices, by index.
    names_in: RefCell<Vec<NameIn>>,
}

/// A large value whose chunks are arriving.
struct Arriving {
    total: usize,
    bytes: Vec<u8>,
    /// The answer's status and callback, for an answer; `None` for a request's argument.
    answer: Option<(Status, OnAnswer)>,
}

/// A request of the peer's waiting its turn.
struct Queued {
    id: u64,
    code: Code,
    target: Option<(u32, u32)>,
    /// `None` while its large argument is arriving.
    arg: Option<Vec<u8>>,
    /// Whether its bank's credit is due once it ran.
    credit: bool,
}

/// A request of this side's waiting for the window to open.
struct Held {
    id: u64,
    code: Code,
    target: Option<(u32, u32)>,
    arg: Encoded,
}

impl Drop for Link {
    fn drop(&mut self) {
        // Before the transport closes: the watchdog must not use it afterwards.
        self.health.probe.clear();
    }
}

impl Link {
    fn wake_writer(&self) {
        if let Some(waker) = self.writer.take() {
            waker.wake();
        }
    }

    /// Stages a request; `on_answer` runs when its answer arrives. A fiber waits first while
    /// the link's window is shut (see `window`) or it has more than [`BACKLOG_FRAMES`] frames'
    /// worth of bytes staged. Delegated context cannot wait: its request is held, in order,
    /// until credits open the window.
    pub(crate) fn call(
        &self,
        code: Code,
        target: Option<(u32, u32)>,
        arg: &[u8],
        on_answer: OnAnswer,
    ) {
        if !trust::in_delegated_context() {
            self.wait_for_room();
        }
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        self.pending.borrow_mut().insert(id, on_answer);
        // Held requests go first: one is held exactly when an earlier number is not staged.
        if self.window.next() == id && self.window.admits(id) {
            let credit = self.window.stage();
            self.out
                .borrow_mut()
                .push_request(id, code, target, arg, credit);
        } else {
            self.held.borrow_mut().push_back(Held {
                id,
                code,
                target,
                arg: Encoded::copy_of(arg),
            });
        }
        self.sent.fetch_add(1, Ordering::Release);
        self.wake_writer();
    }

    /// Waits until the next request is within the window and the staged bytes are below
    /// the backlog, or the link or the job ends.
    #[inline]
    fn wait_for_room(&self) {
        if !self.has_room() {
            self.wait_for_room_slow();
        }
    }

    /// Whether the next request is within the window and the staged bytes below the backlog.
    #[inline]
    fn has_room(&self) -> bool {
        let limit = BACKLOG_FRAMES * self.limits.frame;
        self.window.admits(self.next_id.get()) && self.out.borrow().buf.len() <= limit
    }

    #[cold]
    #[inline(never)]
    fn wait_for_room_slow(&self) {
        let room = || self.has_room();
        trust::block_on(std::future::poll_fn(|cx| {
            if room() || self.rack.ending.load(Ordering::SeqCst) || self.closed.get() {
                return Poll::Ready(());
            }
            self.room_waiters.borrow_mut().push(cx.waker().clone());
            Poll::Pending
        }));
    }

    /// A credit came: stages the held requests the window now admits and wakes the fibers
    /// waiting for room.
    fn credited(&self) -> Result<(), String> {
        self.window.credit()?;
        {
            let mut held = self.held.borrow_mut();
            let mut out = self.out.borrow_mut();
            while self.window.open() {
                let Some(h) = held.pop_front() else { break };
                let credit = self.window.stage();
                out.push_request(h.id, h.code, h.target, h.arg.as_slice(), credit);
            }
        }
        self.wake_writer();
        for waker in self.room_waiters.take() {
            waker.wake();
        }
        Ok(())
    }

    /// After a request of the peer's ran: returns its bank's credit if it was the bank's last.
    fn ran(&self, credit: bool) {
        if credit {
            self.control(&Control::Credit);
        }
    }

    /// The life of the rank at the other end.
    fn peer_life(&self) -> Life {
        Life {
            rank: self.health.peer.0,
            incarnation: self.incarnation,
        }
    }

    /// Where the answer to the peer's request `id`, which came on this link (link `index` of
    /// this worker), goes.
    fn reply(&self, index: usize, id: u64, property: Option<(u32, u32)>) -> Reply {
        let here = (self.rack.rank, self.worker as u32);
        let to = AnswerTo::Link {
            index,
            stage: stage_answer,
        };
        let peer = (self.peer_life(), self.health.peer.1);
        Reply::new(id, peer, here, property, to)
    }

    fn answer(&self, id: u64, status: Status, value: &[u8]) {
        self.out.borrow_mut().push_answer(id, status, value);
        self.wake_writer();
    }

    /// The index of `name` on this link, given now (told to the peer ahead of the request
    /// that uses it) if this is its first call here.
    fn name_index(&self, name: &Interned) -> u32 {
        let id = name.id as usize;
        if let Some(&index) = self.names_out.borrow().get(id)
            && index != u32::MAX
        {
            return index;
        }
        let index = self.names_given.get();
        self.names_given.set(index + 1);
        {
            let mut out = self.names_out.borrow_mut();
            if out.len() <= id {
                out.resize(id + 1, u32::MAX);
            }
            out[id] = index;
        }
        self.control(&Control::Name {
            index,
            name: name.name.to_string(),
            ours: name.ours.clone(),
        });
        index
    }

    /// Takes the peer's name for its next index, resolved against this node's functions. An
    /// `Err` (an index out of turn, a bad name, too many) is a protocol violation.
    fn name_in(&self, index: u32, name: String, ours: Signature) -> Result<(), String> {
        let mut names = self.names_in.borrow_mut();
        let next = names.len();
        let resolved = resolve_name(
            &self.rack.functions,
            self.rack.rank,
            next,
            index,
            name,
            &ours,
        )?;
        names.push(resolved);
        Ok(())
    }

    pub(crate) fn control(&self, message: &Control) {
        let body = postcard::to_allocvec(message).expect("control messages serialize");
        self.out.borrow_mut().push_control(&body);
        self.wake_writer();
    }

    /// Shuts the link of a lost peer: every call waiting on it fails with `why`, and its
    /// fibers end. Requests the peer sent are dropped unanswered (it is gone).
    fn close(&self, why: &str) {
        self.closed.set(true);
        self.channel.shutdown();
        let lost = || {
            let (rank, worker) = self.health.peer;
            Outcome::Lost(format!(
                "rank {rank} (worker {worker}, incarnation {}) was lost: {why}",
                self.incarnation
            ))
        };
        let waiting = self.pending.borrow_mut().drain();
        for on_answer in waiting {
            on_answer(lost());
        }
        let arriving: Vec<Arriving> = self.arriving.borrow_mut().drain().map(|(_, v)| v).collect();
        for value in arriving {
            if let Some((_, on_answer)) = value.answer {
                on_answer(lost());
            }
        }
        self.queued.borrow_mut().clear();
        self.held.borrow_mut().clear();
        // The link stays in this worker's list (indices name links), so free what it staged.
        *self.out.borrow_mut() = Outgoing::new(self.limits);
        self.wake_writer();
        for waker in self.room_waiters.take() {
            waker.wake();
        }
    }
}

/// Checks a name the peer gives index `index` when the link expects index `next`, and
/// resolves it against `functions` (this node's, rank `rank`).
fn resolve_name(
    functions: &Functions,
    rank: u32,
    next: usize,
    index: u32,
    name: String,
    ours: &Signature,
) -> Result<NameIn, String> {
    if index as usize != next || next >= MAX_NAMES || !valid_name(&name) {
        return Err(format!(
            "name {name:?} given index {index}: expected index {next} (of at most \
             {MAX_NAMES}) and 1 to 255 printable ASCII characters"
        ));
    }
    let callee = functions
        .resolve(&name, ours, rank)
        .map(|f| f.run)
        .map_err(|e: NamedError| codec::encode_here(&e).expect("errors encode"));
    Ok(NameIn { name, callee })
}

/// Decodes `data` as a control message and, for a name, checks it as a link would against a
/// table of two functions: no panic; a bad name or index is an error; a name resolves exactly
/// when the table has it with that fingerprint, and otherwise answers the right `NamedError`.
/// Panics when a check fails.
#[cfg(feature = "fuzzing")]
pub(crate) fn check_control(data: &[u8]) {
    use crate::function::Function;
    let Ok(control) = postcard::from_bytes::<Control>(data) else {
        return;
    };
    let again = postcard::to_allocvec(&control).expect("a decoded message encodes");
    let twice: Control = postcard::from_bytes(&again).expect("it decodes again");
    assert_eq!(format!("{control:?}"), format!("{twice:?}"));
    let Control::Name { index, name, ours } = control else {
        return;
    };
    static TABLE: std::sync::OnceLock<Functions> = std::sync::OnceLock::new();
    let functions = TABLE.get_or_init(|| {
        let add = Function::apply("fuzz.add", |c: &mut u64, x: u64| *c + x);
        let echo = Function::free("fuzz.echo", |s: String| s);
        Functions::new(&[add, echo]).expect("two names")
    });
    let known = [
        (
            "fuzz.add",
            crate::function::Signature::apply::<u64, u64, u64>(),
        ),
        (
            "fuzz.echo",
            crate::function::Signature::free::<String, String>(),
        ),
    ];
    let valid = index == 0 && valid_name(&name);
    let resolved = resolve_name(functions, 0, 0, index, name.clone(), &ours);
    assert_eq!(resolved.is_ok(), valid, "{name:?} at {index}");
    let Ok(resolved) = resolved else { return };
    let found = known.iter().find(|(n, _)| *n == name);
    match (&resolved.callee, found) {
        (Ok(_), Some((_, sig))) => assert_eq!(sig.fingerprint, ours.fingerprint),
        (Ok(_), None) => panic!("{name:?} resolved, but the table has no such name"),
        (Err(bytes), found) => match (codec::decode_value::<NamedError>(bytes.as_slice()), found) {
            (Ok(NamedError::SignatureMismatch { .. }), Some((_, sig))) => {
                assert_ne!(sig.fingerprint, ours.fingerprint)
            }
            (Ok(NamedError::NoSuchFunction { similar, .. }), None) => {
                assert!(similar.iter().all(|s| known.iter().any(|(n, _)| n == s)))
            }
            (other, _) => panic!("{name:?}: unexpected {other:?}"),
        },
    }
}

/// Stages an answer on link `index` of this worker, if it is still there: how the replies
/// made by [`Link::reply`] answer. An answer made after this worker left the rack — the job
/// is ending, and a deferred request may be answered as late as that — has no one to go to.
fn stage_answer(index: usize, id: u64, status: Status, bytes: &[u8]) {
    NET.with(|net| {
        // Staging runs no user code, so the table stays borrowed meanwhile.
        let net = net.borrow();
        let link = net.as_ref().and_then(|net| net.links.get(index));
        if let Some(link) = link.filter(|l| !l.closed.get()) {
            link.answer(id, status, bytes);
        }
    })
}

/// This worker's part of the rack.
pub(crate) struct WorkerNet {
    pub(crate) rack: Arc<RackState>,
    pub(crate) worker: usize,
    pub(crate) links: Vec<Rc<Link>>,
    /// The index in `links` of the link to `(node, worker)`, at `rack.route(node, worker)`.
    route: Vec<Option<usize>>,
    /// Releases waiting for messages sent before them: `(from node, export, ticket, sent)`.
    held_releases: Vec<HeldRelease>,
}

struct HeldRelease {
    from: Life,
    export: (u32, u32),
    ticket: Ticket,
    sent: Vec<u64>,
}

thread_local! {
    static NET: RefCell<Option<WorkerNet>> = const { RefCell::new(None) };
}

/// Runs `f` on this worker's rack state. Never call user code inside `f`.
///
/// # Panics
/// On a thread that is not a worker of a multi-node rack.
pub(crate) fn with_net<R>(f: impl FnOnce(&mut WorkerNet) -> R) -> R {
    NET.with(|net| {
        let mut net = net.borrow_mut();
        f(net.as_mut().expect("not a rack worker"))
    })
}

/// Whether this thread is a worker of a multi-node rack.
pub(crate) fn is_rack_worker() -> bool {
    NET.with(|net| net.try_borrow().map(|n| n.is_some()).unwrap_or(true))
}

/// The link from this worker to `(node, worker)`, while that rank is up.
pub(crate) fn link_to(node: u32, worker: u32) -> Option<Rc<Link>> {
    with_net(|net| {
        let index = net.route[net.rack.route(node, worker)]?;
        Some(net.links[index].clone())
    })
}

/// Waits (in a fiber) until this worker's link to `(node, worker)` takes a request without
/// waiting: for a caller that must check something and stage with no yield in between.
pub(crate) fn wait_for_room_to(node: u32, worker: u32) {
    if let Some(link) = link_to(node, worker) {
        link.wait_for_room();
    }
}

/// Writes what this worker's link to `(node, worker)` has staged, now, blocking: what a
/// crash point needs sent before it kills the process.
pub(crate) fn flush(node: u32, worker: u32) {
    if let Some(link) = link_to(node, worker) {
        let bytes = link.out.borrow_mut().take();
        let _ = link.channel.write_all(&bytes);
    }
}

/// Installs this worker's links, without starting their fibers: nothing is read until
/// [`start`] runs, once every worker of the node is installed. A request read earlier could
/// hand a property to a worker not yet installed, and a handle dropped there could not send
/// its release. Runs in a fiber on the worker.
pub(crate) fn install(rack: Arc<RackState>, worker: usize, new_links: Vec<NewLink>) {
    codec::set_max_message(rack.limits().max_message);
    NET.with(|net| {
        *net.borrow_mut() = Some(WorkerNet {
            route: vec![None; rack.route_len()],
            rack,
            worker,
            links: Vec::new(),
            held_releases: Vec::new(),
        })
    });
    for new in new_links {
        add(new);
    }
}

/// Starts the fibers of this worker's installed links, once their transports are connected
/// (or `GSM_PEER_TIMEOUT` passed): the job starts with every link wired. Runs in a fiber on
/// the worker.
pub(crate) fn start() {
    let (links, limit) = with_net(|net| (net.links.clone(), net.rack.settings.peer_timeout));
    for link in &links {
        link.channel.await_wired(limit);
    }
    (0..links.len()).for_each(start_fibers);
}

/// Adds a link to this worker's and starts its fibers, for a rank that rejoined (`gsm run
/// --recover`), whose older links are closed first.
pub(crate) fn attach(new: NewLink) {
    let (rank, incarnation) = (new.peer.0, new.incarnation);
    if let Some(older) = incarnation.checked_sub(1) {
        drop_peer(rank, older, "it restarted");
    }
    start_fibers(add(new));
}

/// Adds a link to this worker's table; returns its index.
fn add(new: NewLink) -> usize {
    let incarnation = new.incarnation;
    with_net(|net| {
        let (rack, worker) = (net.rack.clone(), net.worker);
        let health = rack.new_health(worker, new.peer, incarnation);
        let channel = new.channel.open(&health.probe);
        let index = net.links.len();
        net.route[rack.route(new.peer.0, new.peer.1)] = Some(index);
        let ours = handshake::build_id().ok();
        let other_build = (Some(new.build) != ours).then_some(new.build);
        rack.peers[new.peer.0 as usize]
            .other_build
            .store(other_build.is_some(), Ordering::Release);
        net.links.push(Rc::new(Link {
            worker,
            incarnation,
            other_build,
            closed: Cell::new(false),
            health,
            channel,
            limits: rack.limits(),
            out: RefCell::new(Outgoing::new(rack.limits())),
            writer: RefCell::default(),
            // As many slots as the window has requests, up to 1,024 (24 KiB, once the link
            // calls): a deeper window's stragglers wait in the table's map.
            pending: RefCell::new(Waiting::with_slots(
                (rack.settings.am_banks * rack.settings.am_slots).min(1024),
            )),
            next_id: Cell::new(0),
            received: Cell::new(0),
            sent: rack.sent_counter(worker, new.peer),
            arriving: RefCell::default(),
            queued: RefCell::default(),
            room_waiters: RefCell::default(),
            window: Window::new(rack.settings.am_banks, rack.settings.am_slots),
            held: RefCell::default(),
            names_out: RefCell::default(),
            names_given: Cell::new(0),
            names_in: RefCell::default(),
            rack,
        }));
        index
    })
}

/// Starts the reader, writer and transport fibers of link `index`.
fn start_fibers(index: usize) {
    trust::spawn(move || read_loop(index));
    trust::spawn(move || write_loop(index));
    trust::spawn(move || serve_loop(index));
    // Calls waiting for a restarted rank may go once this worker reaches all of it.
    with_net(|net| net.rack.wake_peer_waiters());
}

/// Whether this worker has a link to every worker of rank `node` (a restarted rank's come
/// one by one).
pub(crate) fn reaches(node: u32) -> bool {
    with_net(|net| {
        (0..net.rack.workers[node as usize]).all(|w| net.route[net.rack.route(node, w)].is_some())
    })
}

/// Closes this worker's links to rank `node` up to incarnation `incarnation` (it was lost, or
/// restarted): calls waiting on them fail, naming the rank and `why`. Its tickets of this
/// worker's exports are forgotten (see `export`), with the releases it sent that still wait.
pub(crate) fn drop_peer(node: u32, incarnation: u32, why: &str) {
    let lost = Life {
        rank: node,
        incarnation,
    };
    let (orphans, doubts, here): (Vec<Export>, Vec<Doubt>, (Arc<RackState>, usize)) =
        with_net(|net| {
            net.held_releases
                .retain(|held| held.from.rank != node || held.from.incarnation > incarnation);
            let mut table = net.rack.exports(net.worker);
            // Asked about once, when this worker first forgets the life.
            let fresh = !table.is_forgotten(lost);
            let orphans = table.forget(lost);
            let doubts = if fresh {
                table.in_doubt(lost)
            } else {
                Vec::new()
            };
            (orphans, doubts, (net.rack.clone(), net.worker))
        });
    // Dropped outside every lock and borrow: dropping a property runs user code.
    drop(orphans);
    // Each holder of a ticket the lost life handed out is asked whether it ever got it.
    let (rack, worker) = here;
    for d in doubts {
        let doubt = (d.slot, d.generation, d.ticket);
        if d.holder.rank == rack.rank {
            let home = Life {
                rank: rack.rank,
                incarnation: rack.incarnation(rack.rank),
            };
            drop(trust::spawn(move || {
                answer_doubt(home, worker as u32, doubt)
            }));
            continue;
        }
        let to = worker as u32 % rack.workers[d.holder.rank as usize];
        let (slot, generation, ticket) = doubt;
        let ask = Control::Doubt {
            slot,
            generation,
            ticket,
        };
        control(d.holder.rank, to, d.holder.incarnation, &ask);
    }
    #[cfg(feature = "ucx")]
    crate::transport::ucx::rma::lose(node, incarnation);
    let gone: Vec<Rc<Link>> = with_net(|net| {
        let mut gone = Vec::new();
        for (index, link) in net.links.iter().enumerate() {
            let (rank, worker) = link.health.peer;
            if rank != node || link.incarnation > incarnation || link.closed.get() {
                continue;
            }
            let route = net.rack.route(rank, worker);
            if net.route[route] == Some(index) {
                net.route[route] = None;
            }
            gone.push(link.clone());
        }
        gone
    });
    // Outside the borrow: failing a call runs its callback.
    for link in gone {
        link.close(why);
    }
}

/// Forgets this worker's links at the end of the job (their fibers see `ending` and stop).
pub(crate) fn uninstall() {
    let net = NET.with(|net| net.borrow_mut().take());
    drop(net);
}

fn link(index: usize) -> Rc<Link> {
    with_net(|net| net.links[index].clone())
}

fn write_loop(index: usize) {
    let link = link(index);
    loop {
        trust::block_on(std::future::poll_fn(|cx| {
            if !link.out.borrow().is_empty() || link.closed.get() {
                return Poll::Ready(());
            }
            *link.writer.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        }));
        link.writer.take();
        if link.rack.ending.load(Ordering::SeqCst) || link.closed.get() {
            return;
        }
        // Let the rest of the round stage its requests and answers too: one write for all.
        // When the worker has nothing else to do, write now (a call alone on its link waits
        // no extra round).
        trust::yield_if_busy();
        let bytes = link.out.borrow_mut().take();
        match link.channel.write_all(&bytes) {
            Ok(()) => {}
            Err(_) if link.closed.get() => return,
            Err(ChannelError::Corrupt(why)) => fate::bad_frame(link.health.peer, &why),
            Err(e) => return link_ended(&link, format!("write failed: {e}")),
        }
        count(&link.health.writes);
        count_n(&link.health.bytes_out, bytes.len() as u64);
        for waker in link.room_waiters.take() {
            waker.wake();
        }
        link.out.borrow_mut().recycle(bytes);
    }
}

/// Adds one to a counter that only this fiber writes: no read-modify-write instruction.
fn count(counter: &AtomicU64) {
    count_n(counter, 1);
}

/// Adds `n` to a counter that only this fiber writes.
fn count_n(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

/// Runs what the link's transport needs to hear its peer (shared memory's doorbells), if
/// anything.
fn serve_loop(index: usize) {
    let link = link(index);
    if let Some(why) = link.channel.serve()
        && !link.rack.ending.load(Ordering::SeqCst)
    {
        link_ended(&link, why);
    }
}

fn link_ended(link: &Link, why: String) {
    let mut ended = link.health.ended.lock().unwrap_or_else(|p| p.into_inner());
    ended.get_or_insert(why);
}

fn read_loop(index: usize) {
    let link = link(index);
    let limits = link.limits;
    let mut buf = vec![0u8; limits.frame + wire::HEADER];
    let mut filled = 0;
    let mut sequence = wire::Sequence::default();
    let mut scratch = wire::Scratch::default();
    loop {
        if filled == buf.len() {
            // Only a frame larger than the limit could fill the buffer, and decode refuses
            // those as soon as their header is in.
            unreachable!("a decoded header bounds the frame");
        }
        let read = link.channel.read(&mut buf[filled..]);
        if link.closed.get() {
            return;
        }
        let n = match read {
            Ok(0) => return link_ended(&link, "connection closed".into()),
            Ok(n) => n,
            Err(ChannelError::Corrupt(why)) => fate::bad_frame(link.health.peer, &why),
            Err(e) => return link_ended(&link, format!("read failed: {e}")),
        };
        count(&link.health.reads);
        count_n(&link.health.bytes_in, n as u64);
        if link.rack.ending.load(Ordering::SeqCst) {
            return;
        }
        filled += n;
        let mut start = 0;
        loop {
            match wire::decode_with(&buf[start..filled], &limits, &mut scratch) {
                Ok(Some((frame, used))) => {
                    if let Err(e) = sequence.check(&frame) {
                        fate::bad_frame(link.health.peer, &e.to_string());
                    }
                    if let Err(why) = handle(&link, index, frame, &mut scratch) {
                        fate::bad_frame(link.health.peer, &why);
                    }
                    start += used;
                }
                Ok(None) => break,
                Err(e) => fate::bad_frame(link.health.peer, &e.to_string()),
            }
        }
        buf.copy_within(start..filled, 0);
        filled -= start;
    }
}

/// Acts on one frame, keeping its item list in `scratch`. An `Err` is a protocol violation
/// that ends the job.
fn handle(
    link: &Rc<Link>,
    index: usize,
    frame: Frame<'_>,
    scratch: &mut wire::Scratch,
) -> Result<(), String> {
    match frame {
        Frame::Requests { mut requests, .. } => {
            for request in requests.drain(..) {
                let (id, code, target, credit) =
                    (request.id, request.code, request.target, request.credit);
                if let Code::Name(name) = code
                    && name as usize >= link.names_in.borrow().len()
                {
                    return Err(format!("request {id} calls name index {name}, never given"));
                }
                let arg = match request.arg {
                    // Nothing ahead of it in its lane: run it now, from the frame's bytes.
                    Payload::Inline(arg) if link.queued.borrow().is_empty() => {
                        link.received.set(link.received.get() + 1);
                        run_request(link, code, target, arg, link.reply(index, id, target));
                        link.ran(credit);
                        if credit {
                            // A bank of requests ran and was answered: let the writer send the
                            // answers and the credit now, so the caller refills its window
                            // while this side runs the next bank (read on instead, and a full
                            // window's answers go out at once, the two sides taking turns:
                            // E2 at 1,024 outstanding ran at half the rate).
                            trust::yield_now();
                        }
                        continue;
                    }
                    Payload::Inline(arg) => Some(arg.to_vec()),
                    Payload::Large { total } => {
                        link.expect_large(ChunkOf::Argument, id, total, None)?;
                        None
                    }
                };
                link.queued.borrow_mut().push_back(Queued {
                    id,
                    code,
                    target,
                    arg,
                    credit,
                });
            }
            scratch.keep_requests(requests);
            run_queued(link, index);
            apply_held_releases();
        }
        Frame::Answers { mut answers, .. } => {
            for answer in answers.drain(..) {
                let on_answer = link.pending.borrow_mut().answer(answer.id)?;
                match answer.value {
                    Payload::Inline(bytes) => on_answer(outcome(answer.status, bytes)),
                    Payload::Large { total } => link.expect_large(
                        ChunkOf::Answer,
                        answer.id,
                        total,
                        Some((answer.status, on_answer)),
                    )?,
                }
            }
            scratch.keep_answers(answers);
        }
        Frame::Chunk {
            of,
            id,
            offset,
            bytes,
            ..
        } => {
            let complete = {
                let mut arriving = link.arriving.borrow_mut();
                let Some(value) = arriving.get_mut(&(of, id)) else {
                    return Err(format!("chunk of unknown large value ({of:?} {id})"));
                };
                if offset as usize != value.bytes.len() {
                    return Err(format!(
                        "chunk of large value ({of:?} {id}) at offset {offset}, expected {}",
                        value.bytes.len()
                    ));
                }
                if value.total - value.bytes.len() < bytes.len() {
                    return Err(format!(
                        "chunk of large value ({of:?} {id}) runs past its {} bytes",
                        value.total
                    ));
                }
                value.bytes.extend_from_slice(bytes);
                if value.bytes.len() == value.total {
                    arriving.remove(&(of, id))
                } else {
                    None
                }
            };
            if let Some(value) = complete {
                link.arrived(index, id, value);
                apply_held_releases();
            }
        }
        Frame::Heartbeat { .. } => {}
        Frame::Control { body, .. } => {
            let control: Control =
                postcard::from_bytes(body).map_err(|e| format!("bad control message: {e}"))?;
            match control {
                Control::Release {
                    slot,
                    generation,
                    ticket,
                    sent,
                } => {
                    let from = link.peer_life();
                    with_net(|net| {
                        net.held_releases.push(HeldRelease {
                            from,
                            export: (slot, generation),
                            ticket,
                            sent,
                        })
                    });
                }
                Control::Toggle {
                    slot,
                    generation,
                    ticket,
                    holder,
                } => {
                    link.received.set(link.received.get() + 1);
                    settle(slot, generation, ticket, Some(holder));
                }
                Control::Name { index, name, ours } => link.name_in(index, name, ours)?,
                Control::Credit => link.credited()?,
                Control::Doubt {
                    slot,
                    generation,
                    ticket,
                } => {
                    let (home, worker) = (link.peer_life(), link.health.peer.1);
                    let doubt = (slot, generation, ticket);
                    drop(trust::spawn(move || answer_doubt(home, worker, doubt)));
                }
                Control::NeverHeld {
                    slot,
                    generation,
                    ticket,
                } => never_held(slot, generation, ticket, link.peer_life()),
            }
            apply_held_releases();
        }
    }
    Ok(())
}

impl Link {
    /// Notes a large value announced by the peer; its chunks follow.
    fn expect_large(
        &self,
        of: ChunkOf,
        id: u64,
        total: u32,
        answer: Option<(Status, OnAnswer)>,
    ) -> Result<(), String> {
        let mut arriving = self.arriving.borrow_mut();
        if total == 0 || arriving.contains_key(&(of, id)) {
            return Err(format!(
                "large value ({of:?} {id}) announced twice or with no bytes"
            ));
        }
        // Grown as chunks arrive, not reserved: the total is only a claim.
        let value = Arriving {
            total: total as usize,
            bytes: Vec::new(),
            answer,
        };
        arriving.insert((of, id), value);
        Ok(())
    }

    /// Acts on a large value whose last chunk has arrived.
    fn arrived(&self, index: usize, id: u64, value: Arriving) {
        match value.answer {
            Some((status, on_answer)) => on_answer(outcome(status, &value.bytes)),
            None => {
                if let Some(queued) = self.queued.borrow_mut().iter_mut().find(|q| q.id == id) {
                    queued.arg = Some(value.bytes);
                }
                run_queued(self, index);
            }
        }
    }
}

/// Runs the peer's queued requests from the front until one still waits for its argument.
fn run_queued(link: &Link, index: usize) {
    loop {
        // Not borrowed while the request runs: it may call out on this link.
        let next = {
            let mut queued = link.queued.borrow_mut();
            match queued.front() {
                Some(Queued { arg: Some(_), .. }) => queued.pop_front(),
                _ => None,
            }
        };
        let Some(Queued {
            id,
            code,
            target,
            arg: Some(arg),
            credit,
        }) = next
        else {
            return;
        };
        link.received.set(link.received.get() + 1);
        run_request(link, code, target, &arg, link.reply(index, id, target));
        link.ran(credit);
    }
}

// Inlined into the reader: where the compiler chose otherwise, a call cost 26 instructions.
#[inline]
fn outcome(status: Status, bytes: &[u8]) -> Outcome<'_> {
    match status {
        Status::Ok => Outcome::Ok(bytes),
        Status::Panicked => Outcome::Panicked(codec::decode_message(bytes)),
        Status::Refused => Outcome::Refused(codec::decode_message(bytes)),
        Status::Unresolved => Outcome::Unresolved(bytes),
    }
}

/// Runs one request of the peer on this worker. A named request's index was checked when
/// its frame arrived.
fn run_request(link: &Link, code: Code, target: Option<(u32, u32)>, arg: &[u8], reply: Reply) {
    // A share of the property, so the table is not locked while the operation runs.
    let find = |slot, generation| {
        link.rack
            .exports(link.worker)
            .get(slot, generation)
            .map(|e| e.share())
    };
    match code {
        Code::Op(_) if link.other_build.is_some() => reply.refuse(format!(
            "rank {} runs another build: only named calls cross builds",
            link.rack.rank
        )),
        Code::Op(offset) => dispatch(offset, target, arg, reply, find),
        Code::Name(index) => {
            let callee = link.names_in.borrow()[index as usize].callee.clone();
            match callee {
                Ok(run) => {
                    let name = || link.names_in.borrow()[index as usize].name.clone();
                    run_checked(run, name, target, arg, reply, find)
                }
                Err(error) => reply.unresolved(error),
            }
        }
    }
}

/// Runs a request whose op names a descriptor of this build that fits its target, on the
/// property `find` returns; anything else is refused through `reply`, never called.
pub(crate) fn dispatch(
    op: u64,
    target: Option<(u32, u32)>,
    arg: &[u8],
    reply: Reply,
    find: impl FnOnce(u32, u32) -> Result<Shared, ExportError>,
) {
    match op::resolve(op) {
        Ok(op) => run_checked(op.run, || (op.name)().to_owned(), target, arg, reply, find),
        Err(e) => reply.refuse(e.to_string()),
    }
}

/// Runs `run` if it fits the request's target (a property for an apply, none otherwise), on
/// the property `find` returns; refuses it otherwise, naming it with `name`.
fn run_checked(
    run: Run,
    name: impl FnOnce() -> String,
    target: Option<(u32, u32)>,
    arg: &[u8],
    reply: Reply,
    find: impl FnOnce(u32, u32) -> Result<Shared, ExportError>,
) {
    match (run, target) {
        (Run::Apply(run), Some((slot, generation))) => match find(slot, generation) {
            Ok(export) => run(&export, arg, reply),
            Err(e) => reply.refuse(format!("{}: {e}", name())),
        },
        (Run::Free(run), None) => run(arg, reply),
        (Run::Apply(_), None) => reply.refuse(format!("{} needs a property", name())),
        (Run::Free(_), Some(_)) => reply.refuse(format!("{} takes no property", name())),
    }
}

/// One half of a ticket's round trip (see `export`) on one of this worker's exports: handed
/// out to `Some(holder)`, or released. Drops the export if that was its last ticket.
fn settle(slot: u32, generation: u32, ticket: Ticket, handed_to: Option<Life>) {
    let gone = with_net(|net| {
        let mut table = net.rack.exports(net.worker);
        match handed_to {
            Some(holder) => table.hand_out(slot, generation, ticket, holder),
            None => table.release(slot, generation, ticket),
        }
    });
    match gone {
        // Dropped here, outside every lock: dropping a property runs user code.
        Ok(export) => drop(export),
        // A ticket of a released export, or one half twice: a protocol error of the peer, but
        // harmless here.
        Err(e) => eprintln!("gossamer: ignoring a ticket: {e}"),
    }
}

/// A holder's side of a doubt (`Control::Doubt`) about `ticket` of export (`slot`,
/// `generation`) of worker `worker` of `home`: once no worker of this node can still read
/// anything from the ticket's minter (a lost life), it answers `NeverHeld` unless it holds a
/// handle under the ticket. From a fiber of the worker the doubt came to (or, for a home
/// that is its own holder, the export's worker).
fn answer_doubt(home: Life, worker: u32, (slot, generation, ticket): (u32, u32, Ticket)) {
    let Some(rack) = crate::state::current() else {
        return;
    };
    let minter = ticket.minter;
    // Only a lost life's tickets are doubted, and only rank 0's loss ends the job instead.
    if !rack.settings.recovery.recover || minter.rank == 0 || minter.rank == rack.rank {
        return;
    }
    let why = format!("rank {} says it was lost", home.rank);
    crate::recovery::lose(&rack, minter.rank, minter.incarnation, &why);
    // Every worker closes its links to the minter's life (again, if `lose` did): a handle
    // is decoded on the worker that reads its frame, in the step that reads it, so none
    // from that life is decoded after these.
    let closing: Vec<_> = (0..rack.workers[rack.rank as usize] as usize)
        .map(|w| {
            let why = why.clone();
            rack.handle
                .spawn_on(w, move || drop_peer(minter.rank, minter.incarnation, &why))
        })
        .collect();
    for closed in closing {
        closed.join();
    }
    if crate::remote::lock_held(&rack).contains(&ticket) {
        return; // held: its release comes when its handles drop
    }
    if home.rank == rack.rank {
        let holder = home;
        drop(rack.handle.spawn_on(worker as usize, move || {
            never_held(slot, generation, ticket, holder)
        }));
        return;
    }
    let answer = Control::NeverHeld {
        slot,
        generation,
        ticket,
    };
    control(home.rank, worker, home.incarnation, &answer);
}

/// A holder's answer to a doubt: `holder` never held `ticket` of this worker's export.
fn never_held(slot: u32, generation: u32, ticket: Ticket, holder: Life) {
    let gone = with_net(|net| {
        net.rack
            .exports(net.worker)
            .never_held(slot, generation, ticket, holder)
    });
    // Dropped here, outside every lock: dropping a property runs user code. An export gone
    // meanwhile (its last release came first) is no error: the answer raced it.
    if let Ok(export) = gone {
        drop(export);
    }
}

/// Applies the releases whose earlier messages have all arrived.
fn apply_held_releases() {
    let ready = with_net(|net| {
        if net.held_releases.is_empty() {
            return Vec::new();
        }
        let (rack, links, route) = (&net.rack, &net.links, &net.route);
        let arrived = |node: u32, worker: u32| {
            route[rack.route(node, worker)].map_or(0, |i| links[i].received.get())
        };
        let mut ready = Vec::new();
        net.held_releases.retain(|held| {
            let all_in = held
                .sent
                .iter()
                .enumerate()
                .all(|(w, &count)| arrived(held.from.rank, w as u32) >= count);
            if all_in {
                ready.push((held.export, held.ticket));
            }
            !all_in
        });
        ready
    });
    for ((slot, generation), ticket) in ready {
        settle(slot, generation, ticket, None);
    }
}

/// Stages a call on the link to `(node, worker)` from this worker.
/// `incarnation` names the life of the node the call is for (that of the property it
/// targets); `None` is whichever is up. A call to a rank that is down, or to a property of an
/// earlier life of its rank, fails at once with [`Outcome::Lost`].
pub(crate) fn call(
    node: u32,
    worker: u32,
    incarnation: Option<u32>,
    op: &'static op::Op,
    target: Option<(u32, u32)>,
    arg: &[u8],
    on_answer: OnAnswer,
) {
    call_code(
        node,
        worker,
        incarnation,
        Callee::Op(op),
        target,
        arg,
        on_answer,
    )
}

/// [`call`], calling a function by name: the answer's value is a `Result<R, NamedError>`.
pub(crate) fn call_named(
    node: u32,
    worker: u32,
    incarnation: Option<u32>,
    name: &Interned,
    target: Option<(u32, u32)>,
    arg: &[u8],
    on_answer: OnAnswer,
) {
    call_code(
        node,
        worker,
        incarnation,
        Callee::Named(name),
        target,
        arg,
        on_answer,
    )
}

/// Why a closure (or another operation of this build) cannot run on `node`.
fn other_build(node: u32, theirs: BuildId, op: &op::Op) -> String {
    let ours = handshake::build_id().map_or("?".into(), |b| b.to_string());
    format!(
        "rank {node} runs another build ({theirs} ≠ {ours}), where {} does not exist: only \
         functions by name cross builds (Trust::apply_named, Node::spawn_named)",
        (op.name)()
    )
}

/// What a call runs, before its link numbers it.
enum Callee<'a> {
    Op(&'static op::Op),
    Named(&'a Interned),
}

fn call_code(
    node: u32,
    worker: u32,
    incarnation: Option<u32>,
    callee: Callee<'_>,
    target: Option<(u32, u32)>,
    arg: &[u8],
    on_answer: OnAnswer,
) {
    match link_to(node, worker) {
        Some(link) if incarnation.is_none_or(|i| i == link.incarnation) => {
            let code = match callee {
                Callee::Op(op) if let Some(theirs) = link.other_build => {
                    return on_answer(Outcome::Refused(other_build(node, theirs, op)));
                }
                Callee::Op(op) => Code::Op(op.offset()),
                Callee::Named(name) => Code::Name(link.name_index(name)),
            };
            link.call(code, target, arg, on_answer)
        }
        Some(link) => on_answer(Outcome::Lost(format!(
            "rank {node} restarted (incarnation {} is up): the property of incarnation {} \
             is gone with it",
            link.incarnation,
            incarnation.unwrap_or_default()
        ))),
        None => on_answer(Outcome::Lost(format!(
            "rank {node} is down (lost, and not back yet)"
        ))),
    }
}

/// Stages raw bytes on the link to `(node, worker)` from this worker, after whatever is staged:
/// how a test plays a broken peer.
#[cfg(feature = "fuzzing")]
pub(crate) fn send_raw(node: u32, worker: u32, bytes: &[u8]) {
    let link = link_to(node, worker).expect("a link to the peer");
    {
        let mut out = link.out.borrow_mut();
        out.close_frame();
        out.buf.extend_from_slice(bytes);
    }
    link.wake_writer();
}

/// Answers request `id` on the link to `(node, worker)`, in a well-formed frame, whether or
/// not the peer made that request: how a test plays a peer that answers a late request twice
/// or one it never received.
#[cfg(feature = "fuzzing")]
pub(crate) fn send_answer(node: u32, worker: u32, id: u64) {
    let link = link_to(node, worker).expect("a link to the peer");
    link.answer(
        id,
        Status::Ok,
        codec::encode(link.peer_life(), &0u64).as_slice(),
    );
}

/// Returns a bank's credit on the link to `(node, worker)`, whether or not the peer asked
/// for one: a test's broken peer.
#[cfg(feature = "fuzzing")]
pub(crate) fn send_credit(node: u32, worker: u32) {
    link_to(node, worker)
        .expect("a link to the peer")
        .control(&Control::Credit);
}

/// Sends, on the link to `(node, worker)`, the control message giving `name` the index
/// `given` when there is one, then a request calling name index `called`, as a peer that
/// numbers names wrongly would.
#[cfg(feature = "fuzzing")]
pub(crate) fn send_named(node: u32, worker: u32, given: Option<(u32, &str)>, called: u32) {
    let link = link_to(node, worker).expect("a link to the peer");
    if let Some((index, name)) = given {
        link.control(&Control::Name {
            index,
            name: name.to_owned(),
            ours: crate::function::Signature::free::<(), ()>(),
        });
    }
    link.call(Code::Name(called), None, &[], Box::new(|_| {}));
}

/// Breaks the transport's protocol on the link to `(node, worker)`, as a broken peer would;
/// `false` if that link is on TCP. How a test plays a peer that scribbles on the mapping or
/// sends UCX messages out of sequence.
#[cfg(feature = "fuzzing")]
pub(crate) fn corrupt_transport(node: u32, worker: u32) -> bool {
    link_to(node, worker).is_some_and(|l| l.channel.corrupt())
}

/// The transport of the link from this worker to `(node, worker)`.
pub(crate) fn transport_to(node: u32, worker: u32) -> Transport {
    link_to(node, worker)
        .expect("a link to the peer")
        .channel
        .transport()
}

/// Sends a control message on the link to `(node, worker)` from this worker; `counted`
/// messages (toggles) count towards the sent counts a release waits for. A message about a
/// property of a rank that is down, or of an earlier life of it, is dropped: the property is
/// gone with that life.
pub(crate) fn control(node: u32, worker: u32, incarnation: u32, message: &Control) {
    let Some(link) = link_to(node, worker).filter(|l| l.incarnation == incarnation) else {
        return;
    };
    link.control(message);
    if matches!(message, Control::Toggle { .. }) {
        link.sent.fetch_add(1, Ordering::Release);
    }
}
