//! One-sided access to other nodes' region heaps over UCX: what `region` uses on a UCX link.
//!
//! # Setup
//! A node registers its whole region heap with UCX when UCX starts (`UcxNode::new`),
//! and its UCX offer carries the heap's address, length and packed key. On the link of each
//! of this node's workers to another node's worker 0 (which owns that node's regions), the key
//! is unpacked on the link's endpoint: that endpoint and key are this worker's [`Route`] to
//! the node's heap, looked up by [`route`].
//!
//! # Operations
//! An operation is a UCX put, get or atomic on the route's endpoint at the heap's address plus
//! the word's offset; `region` checks the words lie in the region, and [`Route`] that they lie
//! in the heap the peer registered. UCX may carry one worker's operations in any order, so
//! each operation after another of this worker is preceded by `ucp_worker_fence`: one
//! worker's operations take effect in the order they were issued (`region`'s memory model).
//! An operation either completes at once (its callback runs before the call returns) or later,
//! when UCX's progress reports it: its buffers live in a [`Pending`] box that UCX's completion
//! hands back, and the callback runs after `ucp_worker_progress` has returned (never inside
//! it), on the worker's thread.
//!
//! # What a completion means
//! A put completes once UCX has read its words (they were copied at issue); a get or an atomic
//! once it took effect. [`Route::flush`] completes once every earlier operation on the route
//! took effect at the peer: it is `fence`, and what releases the regions' handles the route
//! holds (below). The same flush on a link's new endpoint tells when UCX has connected it
//! ([`connected`]), which a job waits for before it starts.
//!
//! # Keeping regions alive
//! A region is freed once its last handle is gone, but an operation issued before that may
//! still be under way. So the route holds a handle to every region it operated on since its
//! last flush ([`Route::hold`]), and lets them go when a flush completes; the worker flushes
//! every route holding handles before it sleeps, so an idle worker never keeps a region alive.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::rc::Rc;

use super::sys::{self, Atomic, Completion, Started, Status};
use crate::transport::UcxHeap;

/// A worker's way to one node's region heap: its endpoint to the node's worker 0 and the
/// heap's key unpacked there.
#[derive(Debug)]
pub(crate) struct Route {
    worker: &'static sys::Worker,
    /// The node's rank, and the life of it the route reaches.
    rank: u32,
    incarnation: u32,
    endpoint: Rc<sys::Endpoint>,
    key: sys::RemoteKey,
    address: u64,
    words: u64,
    /// Where this process maps the peer's heap, when UCX maps it (its shared memory, for a
    /// heap UCX allocated): then `region` reaches it as a mapped heap, with this CPU's loads,
    /// stores and atomics, and the operations below are not used.
    mapped: Option<*mut u8>,
    /// Handles to the regions operated on since the last flush began.
    held: RefCell<HashMap<u64, Box<dyn Any + Send>>>,
    /// Flushes under way.
    flushing: Cell<u32>,
    /// The first put that failed since the last flush, reported by the next.
    error: RefCell<Option<Failure>>,
}

/// Why an operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// UCX's status.
    Ucx(Status),
    /// The life of the node the route reached was lost before the operation completed.
    Lost { rank: u32, incarnation: u32 },
}

impl From<Status> for Failure {
    fn from(status: Status) -> Failure {
        Failure::Ucx(status)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Ucx(status) => write!(f, "over UCX: {status}"),
            Failure::Lost { rank, incarnation } => write!(
                f,
                "rank {rank} (incarnation {incarnation}) was lost before the operation completed"
            ),
        }
    }
}

/// The buffers of an operation under way, and what to do with them when it completes. Boxed:
/// UCX's completion carries its address back.
struct Pending {
    completion: Completion,
    words: Vec<u64>,
    operand: u64,
    reply: u64,
    then: Box<dyn FnOnce(Result<Pending, Failure>)>,
}

impl Pending {
    fn new(words: Vec<u64>, operand: u64, reply: u64, then: Then<Pending>) -> *mut Pending {
        let pending = Box::into_raw(Box::new(Pending {
            completion: Completion::new(completed, std::ptr::null_mut()),
            words,
            operand,
            reply,
            then,
        }));
        // SAFETY: just made, and the only pointer to it.
        unsafe { (*pending).completion = Completion::new(completed, pending.cast()) };
        pending
    }
}

/// What an operation's completion calls.
pub(crate) type Then<T> = Box<dyn FnOnce(Result<T, Failure>)>;

thread_local! {
    /// Completions UCX reported during the current progress, run once it returned.
    static COMPLETED: RefCell<Vec<(*mut Pending, c_int)>> = const { RefCell::new(Vec::new()) };
    /// Whether this worker issued an operation since its last fence.
    static UNFENCED: Cell<bool> = const { Cell::new(false) };
    /// This worker's routes, by node.
    static ROUTES: RefCell<HashMap<u32, Rc<Route>>> = RefCell::default();
    /// The operations under way (UCX holds their `Pending`), with the node's rank and life.
    static UNDER_WAY: RefCell<HashMap<usize, (u32, u32)>> = RefCell::default();
}

/// UCX's completion of an operation that did not complete at once (inside `progress`).
unsafe extern "C" fn completed(arg: *mut c_void, status: c_int) {
    COMPLETED.with_borrow_mut(|c| c.push((arg.cast(), status)));
}

/// Runs the callbacks of the operations the last progress completed. Called by the worker
/// after each `ucp_worker_progress`.
pub(super) fn run_completed() {
    loop {
        // In the order UCX reported them; callbacks may start operations, which report into
        // the emptied list.
        let completed = COMPLETED.with_borrow_mut(std::mem::take);
        if completed.is_empty() {
            return;
        }
        for (pending, status) in completed {
            UNDER_WAY.with_borrow_mut(|u| u.remove(&(pending as usize)));
            // SAFETY: `pending` came from `Box::into_raw` in `Pending::new`, and UCX reports
            // each operation's completion once: the box is taken back once.
            let pending = unsafe { Box::from_raw(pending) };
            let status = if status == 0 {
                Ok(())
            } else {
                Err(Status::from_raw(status).into())
            };
            finish(pending, status);
        }
    }
}

fn finish(mut pending: Box<Pending>, status: Result<(), Failure>) {
    let then = std::mem::replace(&mut pending.then, Box::new(|_| {}));
    then(status.map(|()| *pending));
}

/// Registers this worker's route to the heap of life `incarnation` of node `rank` (on the
/// link to its worker 0).
pub(super) fn add_route(
    worker: &'static sys::Worker,
    endpoint: Rc<sys::Endpoint>,
    (rank, incarnation): (u32, u32),
    heap: &UcxHeap,
) -> Result<(), Status> {
    if !heap.address.is_multiple_of(8) || heap.words == 0 {
        // Every heap starts on a page: an atomic on a misaligned word would be the peer's
        // undoing.
        return Err(Status::from_raw(OUT_OF_RANGE));
    }
    let key = endpoint.unpack(&heap.key)?;
    // Mapped only if UCX maps the whole heap, in one piece, word-aligned.
    let last = heap.words.saturating_sub(1) * 8;
    let mapped = key.local(heap.address).filter(|&base| {
        (base as usize).is_multiple_of(8)
            && key.local(heap.address + last) == Some(base.wrapping_add(last as usize))
    });
    let route = Rc::new(Route {
        worker,
        rank,
        incarnation,
        endpoint,
        key,
        address: heap.address,
        words: heap.words,
        mapped,
        held: RefCell::default(),
        flushing: Cell::new(0),
        error: RefCell::default(),
    });
    ROUTES.with_borrow_mut(|r| r.insert(rank, route));
    Ok(())
}

/// This worker's route to the region heap of life `incarnation` of node `rank`, if its
/// link there is UCX.
pub(crate) fn route(rank: u32, incarnation: u32) -> Option<Rc<Route>> {
    route_to(rank).filter(|r| r.incarnation == incarnation)
}

/// This worker's route to node `rank`'s region heap, whichever life it reaches.
pub(crate) fn route_to(rank: u32) -> Option<Rc<Route>> {
    ROUTES.with_borrow(|r| r.get(&rank).cloned())
}

/// Life `incarnation` of node `rank` is lost (and any older one): this worker forgets its
/// route there, fails its operations under way there with [`Failure::Lost`] (UCX keeps their
/// buffers until it completes them, if ever), and lets the region handles it held go.
pub(crate) fn lose(rank: u32, incarnation: u32) {
    let route = ROUTES.with_borrow_mut(|routes| {
        let lost = routes
            .get(&rank)
            .is_some_and(|r| r.incarnation <= incarnation);
        if lost { routes.remove(&rank) } else { None }
    });
    let Some(route) = route else { return };
    let failed: Vec<usize> = UNDER_WAY.with_borrow_mut(|under_way| {
        let failed: Vec<usize> = under_way
            .iter()
            .filter(|(_, (r, life))| *r == rank && *life <= incarnation)
            .map(|(&pending, _)| pending)
            .collect();
        for pending in &failed {
            under_way.remove(pending);
        }
        failed
    });
    let lost = Failure::Lost {
        rank,
        incarnation: route.incarnation,
    };
    for pending in failed {
        let pending = pending as *mut Pending;
        // SAFETY: the box is alive until UCX completes it, which `UNDER_WAY` says it has
        // not; UCX uses only its completion and buffers, never `then`, which this thread
        // alone touches: the reference is to that field alone. The completion, when UCX
        // gives it, runs the empty callback left here.
        let then = unsafe { std::mem::replace(&mut (*pending).then, Box::new(|_| {})) };
        then(Err(lost.clone()));
    }
    let held = std::mem::take(&mut *route.held.borrow_mut());
    if !held.is_empty() && trust::current_worker().is_some() {
        trust::spawn(move || drop(held));
    }
}

/// Flushes every route that holds region handles, so that they are let go: the worker is
/// about to sleep. Returns whether any flush began.
pub(super) fn flush_held() -> bool {
    let routes: Vec<Rc<Route>> = ROUTES.with_borrow(|r| {
        r.values()
            .filter(|r| r.flushing.get() == 0 && !r.held.borrow().is_empty())
            .cloned()
            .collect()
    });
    for route in &routes {
        route.flush(Box::new(|_| {}));
    }
    !routes.is_empty()
}

impl Route {
    /// The heap's length in words.
    pub(crate) fn words(&self) -> u64 {
        self.words
    }

    /// Where this process maps the peer's heap, and its length in words, when UCX maps it
    /// (its shared memory, for a heap UCX allocated): the whole heap, in one piece,
    /// word-aligned, for as long as the route's key (for good).
    pub(crate) fn mapped(&self) -> Option<(*mut u8, usize)> {
        Some((self.mapped?, self.words as usize))
    }

    /// Keeps `handle` (the region `key` names) until the next flush completes: the region
    /// stays alive while an operation on it may be under way.
    pub(crate) fn hold(&self, key: u64, handle: impl FnOnce() -> Box<dyn Any + Send>) {
        self.held.borrow_mut().entry(key).or_insert_with(handle);
    }

    /// Where word `word` of the heap is in the owner, after checking that `len` words from it
    /// lie in the heap.
    fn address_of(&self, word: u64, len: u64) -> Result<u64, Status> {
        if word.checked_add(len).is_none_or(|end| end > self.words) {
            // A region's words are checked against its place before; this is a broken name.
            return Err(Status::from_raw(OUT_OF_RANGE));
        }
        Ok(self.address + word * 8)
    }

    /// Starts an operation with `start`, after a fence if this worker issued one before.
    fn start(
        &self,
        pending: *mut Pending,
        start: impl FnOnce(&mut Pending) -> Result<Started, Status>,
    ) {
        let ordered = if UNFENCED.replace(true) {
            self.worker.fence()
        } else {
            Ok(())
        };
        // SAFETY: `pending` came from `Pending::new` and nobody else has it yet. On
        // `UnderWay` it is UCX's until the completion, which hands it back to
        // `run_completed`; otherwise it is taken back here at once. Its buffers are in the
        // box, which does not move.
        unsafe {
            match ordered.and_then(|()| start(&mut *pending)) {
                Ok(Started::UnderWay) => self.under_way(pending),
                Ok(Started::Done) => finish(Box::from_raw(pending), Ok(())),
                Err(e) => finish(Box::from_raw(pending), Err(e.into())),
            }
        }
    }

    /// Notes an operation UCX holds, for [`lose`].
    fn under_way(&self, pending: *mut Pending) {
        UNDER_WAY.with_borrow_mut(|u| u.insert(pending as usize, (self.rank, self.incarnation)));
    }

    /// Writes `words` at word `word` of the heap. Complete when this returns (the words were
    /// copied); a failure is reported by the next flush.
    pub(crate) fn put(self: &Rc<Self>, word: u64, words: &[u64]) {
        let remote = match self.address_of(word, words.len() as u64) {
            Ok(remote) => remote,
            Err(e) => return self.failed(e.into()),
        };
        let route = self.clone();
        let pending = Pending::new(
            words.to_vec(),
            0,
            0,
            Box::new(move |r| {
                if let Err(e) = r {
                    route.failed(e);
                }
            }),
        );
        self.start(pending, |p| {
            let done = &raw mut p.completion;
            // SAFETY: the key was unpacked on this endpoint; `remote` and the words lie in
            // the registered heap (checked above); the box keeps the words and the completion
            // (see `start`).
            unsafe {
                self.endpoint
                    .put(&raw const *p.words, remote, &self.key, done)
            }
        });
    }

    fn failed(&self, e: Failure) {
        self.error.borrow_mut().get_or_insert(e);
    }

    /// Reads `len` words from word `word` of the heap.
    pub(crate) fn get(&self, word: u64, len: u64, then: Then<Vec<u64>>) {
        let remote = match self.address_of(word, len) {
            Ok(remote) => remote,
            Err(e) => return then(Err(e.into())),
        };
        let pending = Pending::new(
            vec![0; len as usize],
            0,
            0,
            Box::new(move |r| then(r.map(|p| p.words))),
        );
        self.start(pending, |p| {
            let done = &raw mut p.completion;
            // SAFETY: as in `put`; nobody reads the words until the completion.
            unsafe {
                self.endpoint
                    .get(&raw mut *p.words, remote, &self.key, done)
            }
        });
    }

    /// Adds `x` to word `word` of the heap; the callback gets its value before.
    pub(crate) fn fetch_add(&self, word: u64, x: u64, then: Then<u64>) {
        self.atomic(Atomic::FetchAdd, word, x, 0, then);
    }

    /// Stores `new` in word `word` of the heap if it holds `current`; the callback gets its
    /// value before.
    pub(crate) fn compare_exchange(&self, word: u64, current: u64, new: u64, then: Then<u64>) {
        self.atomic(Atomic::CompareSwap, word, current, new, then);
    }

    fn atomic(&self, kind: Atomic, word: u64, operand: u64, reply: u64, then: Then<u64>) {
        let remote = match self.address_of(word, 1) {
            Ok(remote) => remote,
            Err(e) => return then(Err(e.into())),
        };
        let pending = Pending::new(
            Vec::new(),
            operand,
            reply,
            Box::new(move |r| then(r.map(|p| p.reply))),
        );
        self.start(pending, |p| {
            let done = &raw mut p.completion;
            // SAFETY: as in `put`; `remote` is word-aligned (`add_route` refuses a heap that
            // is not).
            unsafe {
                self.endpoint.atomic(
                    kind,
                    &raw const p.operand,
                    &raw mut p.reply,
                    remote,
                    &self.key,
                    done,
                )
            }
        });
    }

    /// Completes once every operation issued on the route before it took effect at the peer,
    /// with the first put failure since the last flush; then lets the regions held go.
    pub(crate) fn flush(self: &Rc<Self>, then: Then<()>) {
        let held = std::mem::take(&mut *self.held.borrow_mut());
        self.flushing.set(self.flushing.get() + 1);
        let route = self.clone();
        let under_way = start_flush(
            &self.endpoint,
            Box::new(move |r| {
                route.flushing.set(route.flushing.get() - 1);
                let failed = route.error.borrow_mut().take();
                // Released from a fiber of their own: letting a handle go sends a message.
                if !held.is_empty() && trust::current_worker().is_some() {
                    trust::spawn(move || drop(held));
                }
                then(r.and_then(|()| failed.map_or(Ok(()), Err)));
            }),
        );
        if let Some(pending) = under_way {
            self.under_way(pending);
        }
    }
}

/// Runs `then` once UCX has connected `endpoint` (a flush of a new endpoint completes once
/// its wireup is done), or failed to.
pub(super) fn connected(endpoint: &sys::Endpoint, then: Then<()>) {
    start_flush(endpoint, then);
}

/// Starts a flush of `endpoint` that runs `then` when it completes; returns the operation if
/// UCX holds it (it completes through progress).
fn start_flush(endpoint: &sys::Endpoint, then: Then<()>) -> Option<*mut Pending> {
    let pending = Pending::new(Vec::new(), 0, 0, Box::new(move |r| then(r.map(drop))));
    // SAFETY: as in `Route::start`, without a fence: a flush waits for everything before it.
    unsafe {
        match endpoint.flush(&raw mut (*pending).completion) {
            Ok(Started::UnderWay) => return Some(pending),
            Ok(Started::Done) => finish(Box::from_raw(pending), Ok(())),
            Err(e) => finish(Box::from_raw(pending), Err(e.into())),
        }
    }
    None
}

/// UCX's `UCS_ERR_INVALID_PARAM`: what an operation outside the registered heap, or a heap
/// that cannot be one, fails with.
const OUT_OF_RANGE: c_int = -5;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    unsafe extern "C" fn arrived(
        _: *mut c_void,
        _: *const c_void,
        _: usize,
        _: *const c_void,
        _: usize,
        _: c_int,
    ) {
    }

    unsafe extern "C" fn failed(_: *mut c_void, _: *mut c_void, status: c_int) {
        panic!("an endpoint failed: {}", Status::from_raw(status));
    }

    /// Two workers of one process, one the other's route to a heap of 64 words: every
    /// operation, completed at once or through progress, and a flush that lets the handles
    /// held go.
    #[test]
    fn a_route_reads_writes_and_updates_a_registered_heap() {
        let context = sys::Context::new().expect("UCX starts");
        let (from, to): (&'static sys::Worker, &'static sys::Worker) = (
            Box::leak(Box::new(context.worker().unwrap())),
            Box::leak(Box::new(context.worker().unwrap())),
        );
        for worker in [from, to] {
            // SAFETY: the handlers ignore their argument, and panic only on a failure.
            unsafe { worker.set_handlers(arrived, failed, std::ptr::null_mut()) }.unwrap();
        }
        let heap: &'static mut [u64] = Box::leak(vec![0u64; 64].into_boxed_slice());
        heap[3] = 40;
        // SAFETY: the heap is leaked: mapped as long as the process.
        let key = unsafe { context.register(heap.as_mut_ptr().cast(), heap.len() * 8) }.unwrap();
        let address = heap.as_ptr() as u64;
        let endpoint = Rc::new(from.connect(to.address(), false).unwrap());
        let heap_key = UcxHeap {
            address,
            words: 64,
            key,
        };
        add_route(from, endpoint, (7, 0), &heap_key).unwrap();
        let route = route(7, 0).expect("the route was added");
        assert!(super::route(8, 0).is_none() && super::route(7, 1).is_none());

        let progress_until = |what: &str, done: &dyn Fn() -> bool| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !done() {
                assert!(Instant::now() < deadline, "{what} never completed");
                from.progress();
                to.progress();
                run_completed();
            }
        };
        let seen: Rc<RefCell<Vec<String>>> = Rc::default();
        let log = |what: &'static str| {
            let seen = seen.clone();
            move |r: Result<String, Failure>| seen.borrow_mut().push(format!("{what} {r:?}"))
        };
        route.hold(1, || Box::new(42u32));
        route.put(10, &[1, 2, 3]);
        let get = log("get");
        route.get(10, 3, Box::new(move |r| get(r.map(|w| format!("{w:?}")))));
        let add = log("add");
        route.fetch_add(3, 2, Box::new(move |r| add(r.map(|v| v.to_string()))));
        let swap = log("swap");
        route.compare_exchange(3, 42, 7, Box::new(move |r| swap(r.map(|v| v.to_string()))));
        let lost = log("lost");
        route.compare_exchange(3, 42, 9, Box::new(move |r| lost(r.map(|v| v.to_string()))));
        let flushed = log("flush");
        route.flush(Box::new(move |r| flushed(r.map(|()| String::new()))));
        assert!(
            route.held.borrow().is_empty(),
            "a flush takes what was held"
        );
        progress_until("the operations", &|| seen.borrow().len() == 5);
        // Completions come in any order; the values show the operations took effect in
        // issue order (the fences between them).
        seen.borrow_mut().sort();
        assert_eq!(
            *seen.borrow(),
            [
                "add Ok(\"40\")",
                "flush Ok(\"\")",
                "get Ok(\"[1, 2, 3]\")",
                "lost Ok(\"7\")",
                "swap Ok(\"42\")",
            ]
        );
        assert_eq!(heap[10..13], [1, 2, 3]);
        assert_eq!(heap[3], 7);
        // Memory UCX allocates for a heap: page-aligned, as long as asked or longer, zeroed.
        let (base, length, packed) = context.allocate(1 << 20).unwrap();
        assert!((base as usize).is_multiple_of(4096) && length >= 1 << 20);
        assert!(!packed.is_empty());
        // SAFETY: UCX allocated `length` bytes at `base`, kept for good; nothing else uses them.
        let bytes = unsafe { std::slice::from_raw_parts(base, length) };
        assert!(
            bytes.iter().all(|&b| b == 0),
            "UCX's heap memory reads as zeros"
        );
        // Past the heap: refused before UCX sees it.
        let past = log("past");
        route.get(63, 2, Box::new(move |r| past(r.map(|w| format!("{w:?}")))));
        assert!(
            seen.borrow()[5].starts_with("past Err"),
            "{:?}",
            seen.borrow()
        );
        // The node's life is lost with a get under way: the get fails at once, the route is
        // forgotten, and UCX's later completion calls nobody.
        let get = log("orphan");
        route.get(10, 3, Box::new(move |r| get(r.map(|w| format!("{w:?}")))));
        assert_eq!(
            seen.borrow().len(),
            6,
            "the get is under way until progress"
        );
        lose(7, 0);
        assert!(
            super::route_to(7).is_none(),
            "a lost life's route is forgotten"
        );
        assert_eq!(
            seen.borrow()[6],
            "orphan Err(Lost { rank: 7, incarnation: 0 })"
        );
        progress_until("UCX's completion of the orphan", &|| {
            UNDER_WAY.with_borrow(|u| u.is_empty()) && COMPLETED.with_borrow(|c| c.is_empty())
        });
        for _ in 0..100 {
            from.progress();
            to.progress();
            run_completed();
        }
        assert_eq!(seen.borrow().len(), 7, "{:?}", seen.borrow());
    }
}
