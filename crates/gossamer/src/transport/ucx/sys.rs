//! The UCX calls the rack makes, through `shim.c`, and who owns what they hand out.
//!
//! The shim fills UCX's parameter structures in C, against the system's own headers, so that
//! nothing here repeats a UCX structure's layout. What this module declares is the shim's
//! plain functions, and the two structures the shim and this module share (`Handlers`).
//!
//! # Ownership
//! - The **context** ([`Context`]) is made once per process, the first time a link asks for
//!   UCX, and lives until the process exits (it is never cleaned up: the workers it made are
//!   used until then).
//! - A **worker** ([`Worker`]) is made by bootstrap for one gossamer worker and used from then
//!   on by that gossamer worker's thread alone (UCX's `SERIALIZED` mode: one thread at a time,
//!   the hand-over ordered by the channel that carries the link to the worker). It is never
//!   destroyed, for the same reason as the context. Its address is copied out when it is made.
//! - The **handlers** of a worker (what UCX calls when a message arrives or an endpoint fails)
//!   are a `Handlers` leaked for good, whose `arg` points at a value also kept for good: UCX
//!   calls them from `ucp_worker_progress`, on the worker's thread, until the process exits.
//! - An **endpoint** ([`Endpoint`]) belongs to one link, and is never closed: a UCX link ends
//!   when its peer is lost or the job is over, and closing an endpoint to a peer that has
//!   exited only waits for UCX to time out flushing it (and would destroy the remote keys
//!   unpacked on it, whose mappings regions may still point into). A job that restarts lost
//!   ranks keeps one endpoint and key per link of each lost life.
//! - A **request** ([`Request`]) from a send is the caller's until it completes;
//!   [`Request::status`] polls it and the request is freed when dropped. A send's data must
//!   stay unchanged until its request completes, which the caller guarantees by waiting.
//! - The **registration** of a node's region heap ([`Context::register`], or the heap UCX
//!   allocated, [`Context::allocate`]) is kept for good, as the heap is; peers' **remote keys** ([`RemoteKey`]), unpacked on the endpoint they are
//!   used with, are kept as long as it (for good).
//! - A **one-sided operation** ([`Endpoint::put`] and the others) either completes at once,
//!   or is under way, and then UCX frees its request and calls its [`Completion`] once, from
//!   `progress`; its buffers and its `Completion` stay the caller's, unmoved and unread by
//!   anyone else, until then. The caller's contract, stated on each function.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::os::fd::{BorrowedFd, RawFd};

/// `UCS_OK`.
const OK: c_int = 0;
/// `UCS_INPROGRESS`.
const IN_PROGRESS: c_int = 1;
/// What the shim's one-sided operations return when under way.
const UNDER_WAY: c_int = 1;
/// What the shim's `gsm_ucx_worker_arm` returns when events wait (UCX's `UCS_ERR_BUSY`).
const BUSY: c_int = 1;

#[repr(C)]
struct ContextHandle(c_void);
#[repr(C)]
struct WorkerHandle(c_void);
#[repr(C)]
struct EndpointHandle(c_void);

/// What UCX calls a worker's handler with when a message arrives: (arg, header, its length,
/// data, its length, whether it came by rendezvous, which this transport never sends).
pub(super) type Arrived =
    unsafe extern "C" fn(*mut c_void, *const c_void, usize, *const c_void, usize, c_int);
/// What UCX calls when an endpoint fails: (arg, the endpoint, the status).
pub(super) type Failed = unsafe extern "C" fn(*mut c_void, *mut c_void, c_int);

/// What UCX calls when a one-sided operation completes after it started: (arg, status).
pub(crate) type Done = unsafe extern "C" fn(*mut c_void, c_int);

/// `struct gsm_handler`, `struct gsm_failure` and `struct gsm_done` of the shim: a function
/// and its argument.
#[repr(C)]
pub(crate) struct Handler<F> {
    call: F,
    arg: *mut c_void,
}

unsafe extern "C" {
    fn gsm_ucx_status_string(status: c_int) -> *const c_char;
    fn gsm_ucx_init(context: *mut *mut ContextHandle) -> c_int;
    fn gsm_ucx_worker_create(context: *mut ContextHandle, worker: *mut *mut WorkerHandle) -> c_int;
    fn gsm_ucx_worker_address(
        worker: *mut WorkerHandle,
        address: *mut *mut c_void,
        length: *mut usize,
    ) -> c_int;
    fn gsm_ucx_worker_release_address(worker: *mut WorkerHandle, address: *mut c_void);
    fn gsm_ucx_worker_efd(worker: *mut WorkerHandle, fd: *mut c_int) -> c_int;
    fn gsm_ucx_worker_arm(worker: *mut WorkerHandle) -> c_int;
    fn gsm_ucx_worker_progress(worker: *mut WorkerHandle) -> u32;
    fn gsm_ucx_set_handler(worker: *mut WorkerHandle, handler: *mut Handler<Arrived>) -> c_int;
    fn gsm_ucx_ep_create(
        worker: *mut WorkerHandle,
        address: *const c_void,
        peer_failure: c_int,
        failure: *mut Handler<Failed>,
        ep: *mut *mut EndpointHandle,
    ) -> c_int;
    fn gsm_ucx_send(
        ep: *mut EndpointHandle,
        header: *const c_void,
        header_length: usize,
        data: *const c_void,
        length: usize,
        request: *mut *mut c_void,
    ) -> c_int;
    fn gsm_ucx_request_status(request: *mut c_void) -> c_int;
    fn gsm_ucx_take_sends_completed() -> c_int;
    fn gsm_ucx_request_free(request: *mut c_void);
    fn gsm_ucx_mem_map(
        context: *mut ContextHandle,
        address: *mut *mut c_void,
        length: *mut usize,
        packed: *mut *mut c_void,
        packed_length: *mut usize,
    ) -> c_int;
    fn gsm_ucx_rkey_ptr(rkey: *mut RemoteKeyHandle, remote: u64, local: *mut *mut c_void) -> c_int;
    fn gsm_ucx_rkey_release(packed: *mut c_void);
    fn gsm_ucx_rkey_unpack(
        ep: *mut EndpointHandle,
        packed: *const c_void,
        rkey: *mut *mut RemoteKeyHandle,
    ) -> c_int;
    fn gsm_ucx_put(
        ep: *mut EndpointHandle,
        buffer: *const c_void,
        length: usize,
        remote: u64,
        rkey: *mut RemoteKeyHandle,
        done: *mut Completion,
    ) -> c_int;
    fn gsm_ucx_get(
        ep: *mut EndpointHandle,
        buffer: *mut c_void,
        length: usize,
        remote: u64,
        rkey: *mut RemoteKeyHandle,
        done: *mut Completion,
    ) -> c_int;
    fn gsm_ucx_atomic(
        ep: *mut EndpointHandle,
        compare_swap: c_int,
        operand: *const u64,
        reply: *mut u64,
        remote: u64,
        rkey: *mut RemoteKeyHandle,
        done: *mut Completion,
    ) -> c_int;
    fn gsm_ucx_worker_fence(worker: *mut WorkerHandle) -> c_int;
    fn gsm_ucx_ep_flush(ep: *mut EndpointHandle, done: *mut Completion) -> c_int;
}

#[repr(C)]
struct RemoteKeyHandle(c_void);

/// What a one-sided operation's completion calls: see [`Done`].
pub(crate) type Completion = Handler<Done>;

impl Completion {
    pub(crate) fn new(call: Done, arg: *mut c_void) -> Completion {
        Handler { call, arg }
    }
}

/// Which atomic [`Endpoint::atomic`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Atomic {
    FetchAdd,
    CompareSwap,
}

/// How a one-sided operation started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Started {
    /// It completed: its `Completion` will not be called.
    Done,
    /// It is under way: its `Completion` will be called once, from `progress`.
    UnderWay,
}

fn started(status: c_int) -> Result<Started, Status> {
    match status {
        OK => Ok(Started::Done),
        UNDER_WAY => Ok(Started::UnderWay),
        status => Err(Status(status)),
    }
}

/// A UCX status other than success, with UCX's name for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Status(c_int);

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: ucs_status_string returns a static NUL-terminated string for any value.
        let name = unsafe { CStr::from_ptr(gsm_ucx_status_string(self.0)) };
        write!(f, "{} (UCX status {})", name.to_string_lossy(), self.0)
    }
}

impl Status {
    /// A status UCX passed to a handler.
    pub(crate) fn from_raw(status: c_int) -> Status {
        Status(status)
    }
}

fn check(status: c_int) -> Result<(), Status> {
    if status == OK {
        Ok(())
    } else {
        Err(Status(status))
    }
}

/// The process's UCX context (see the module docs: kept for good).
#[derive(Debug)]
pub(crate) struct Context(*mut ContextHandle);

// SAFETY: a UCP context may be used from any thread; the rack only makes workers with it,
// on the bootstrap thread that made it, and otherwise only keeps it.
unsafe impl Send for Context {}
// SAFETY: as for `Send`: shared references to it call nothing.
unsafe impl Sync for Context {}

impl Context {
    /// Reads UCX's configuration from the environment (`UCX_TLS`, `UCX_NET_DEVICES`, …) and
    /// initialises UCX for active messages with wake-ups.
    pub(crate) fn new() -> Result<Context, Status> {
        let mut handle = std::ptr::null_mut();
        // SAFETY: writes the new context through a valid pointer on success.
        check(unsafe { gsm_ucx_init(&mut handle) })?;
        Ok(Context(handle))
    }

    /// Makes a worker, and copies its address out.
    pub(crate) fn worker(&self) -> Result<Worker, Status> {
        let mut handle = std::ptr::null_mut();
        // SAFETY: the context is live (kept for good); writes the worker on success.
        check(unsafe { gsm_ucx_worker_create(self.0, &mut handle) })?;
        let (mut address, mut length) = (std::ptr::null_mut(), 0usize);
        // SAFETY: `handle` is the live worker just made; the address is copied below and
        // released at once, as UCX asks.
        let address = unsafe {
            check(gsm_ucx_worker_address(handle, &mut address, &mut length))?;
            let copy = std::slice::from_raw_parts(address.cast::<u8>(), length).to_vec();
            gsm_ucx_worker_release_address(handle, address);
            copy
        };
        Ok(Worker {
            handle,
            address,
            failure: std::cell::Cell::new(std::ptr::null_mut()),
        })
    }
}

impl Context {
    /// Registers `length` bytes at `address` (a node's region heap) for peers' one-sided
    /// access, for good, and returns the packed key they reach it with.
    ///
    /// # Safety
    /// The bytes must stay mapped as long as the process (peers write them at any time).
    pub(crate) unsafe fn register(
        &self,
        address: *mut u8,
        length: usize,
    ) -> Result<Vec<u8>, Status> {
        // SAFETY: the caller's promise.
        unsafe { self.map(address, length) }.map(|(_, _, key)| key)
    }

    /// Allocates `length` zeroed bytes (or more) through UCX, in memory its transports can
    /// reach most directly (its shared memory maps it into peers), registered for peers'
    /// one-sided access; kept for good. Returns where they are, how many, and the packed key.
    pub(crate) fn allocate(&self, length: usize) -> Result<(*mut u8, usize, Vec<u8>), Status> {
        // SAFETY: with a null address UCX allocates the memory itself, and it is never
        // released (kept for good).
        unsafe { self.map(std::ptr::null_mut(), length) }
    }

    /// # Safety
    /// As [`register`](Context::register) for a non-null `address`.
    unsafe fn map(
        &self,
        address: *mut u8,
        length: usize,
    ) -> Result<(*mut u8, usize, Vec<u8>), Status> {
        let (mut address, mut length) = (address.cast::<c_void>(), length);
        let (mut packed, mut packed_length) = (std::ptr::null_mut(), 0usize);
        // SAFETY: the context is live; the memory is mapped for good (the caller's promise,
        // or UCX's own allocation); the packed key is copied out and released at once, as UCX
        // asks. The registration is never released: the heap lives until the process exits.
        unsafe {
            check(gsm_ucx_mem_map(
                self.0,
                &mut address,
                &mut length,
                &mut packed,
                &mut packed_length,
            ))?;
            let copy = std::slice::from_raw_parts(packed.cast::<u8>(), packed_length).to_vec();
            gsm_ucx_rkey_release(packed);
            Ok((address.cast(), length, copy))
        }
    }
}

/// A UCX worker: made on a bootstrap thread, then used by one gossamer worker's thread alone
/// (module docs).
#[derive(Debug)]
pub(crate) struct Worker {
    handle: *mut WorkerHandle,
    address: Vec<u8>,
    /// The endpoints' failure handler, once [`set_handlers`](Worker::set_handlers) ran.
    failure: std::cell::Cell<*mut Handler<Failed>>,
}

// SAFETY: the worker is SERIALIZED: any thread may use it, one at a time. It moves once,
// from bootstrap to its gossamer worker, and is used only there afterwards.
unsafe impl Send for Worker {}

impl Worker {
    /// The address peers create endpoints to this worker with.
    pub(crate) fn address(&self) -> &[u8] {
        &self.address
    }

    /// The descriptor that becomes readable when the worker has events, once armed. It is
    /// the worker's: valid as long as the worker, which is kept for good.
    pub(crate) fn event_fd(&self) -> Result<BorrowedFd<'static>, Status> {
        let mut fd: c_int = -1;
        // SAFETY: the worker is live; writes the descriptor on success.
        check(unsafe { gsm_ucx_worker_efd(self.handle, &mut fd) })?;
        // SAFETY: the descriptor stays open as long as the worker, which is never destroyed.
        Ok(unsafe { BorrowedFd::borrow_raw(fd as RawFd) })
    }

    /// Arms the event descriptor; `Ok(false)` if events already wait (progress instead of
    /// sleeping).
    pub(crate) fn arm(&self) -> Result<bool, Status> {
        // SAFETY: the worker is live and used on this thread alone.
        match unsafe { gsm_ucx_worker_arm(self.handle) } {
            BUSY => Ok(false),
            status => check(status).map(|()| true),
        }
    }

    /// Orders the one-sided operations issued on this worker before it before those issued
    /// after it.
    pub(crate) fn fence(&self) -> Result<(), Status> {
        // SAFETY: the worker is live and used on this thread alone.
        check(unsafe { gsm_ucx_worker_fence(self.handle) })
    }

    /// Runs UCX's progress once: calls the handlers of what arrived and completes requests.
    /// Returns whether anything happened.
    pub(crate) fn progress(&self) -> bool {
        // SAFETY: the worker is live and used on this thread alone.
        unsafe { gsm_ucx_worker_progress(self.handle) > 0 }
    }

    /// Whether a send of this thread that did not complete at once has completed since the
    /// last call: UCX's progress may complete one without counting it as progress.
    pub(crate) fn sends_completed(&self) -> bool {
        // SAFETY: reads and clears a flag of this thread's; no argument.
        unsafe { gsm_ucx_take_sends_completed() != 0 }
    }

    /// Installs the worker's handlers: `arrived(arg, …)` for every message, `failed(arg, …)`
    /// when an endpoint fails.
    ///
    /// # Safety
    /// `arg` must stay valid, and the functions safe to call with it, as long as the worker
    /// (for good); they run inside [`progress`](Worker::progress), on this thread.
    pub(crate) unsafe fn set_handlers(
        &self,
        arrived: Arrived,
        failed: Failed,
        arg: *mut c_void,
    ) -> Result<(), Status> {
        let arrived = Box::leak(Box::new(Handler { call: arrived, arg }));
        // SAFETY: the handler is leaked, so valid for good, as UCX needs it.
        check(unsafe { gsm_ucx_set_handler(self.handle, arrived) })?;
        self.failure
            .set(Box::leak(Box::new(Handler { call: failed, arg })));
        Ok(())
    }

    /// Connects to the worker at `address` (another rank's, sent over the proven TCP
    /// connection). With `peer_failure`, UCX detects the peer's failure itself, fails the
    /// endpoint's operations under way and reports it to the failure handler (UCX's PEER
    /// mode), using only the transports that can: [`UNREACHABLE`] if none reaches the peer.
    /// Call after [`set_handlers`](Worker::set_handlers).
    pub(crate) fn connect(&self, address: &[u8], peer_failure: bool) -> Result<Endpoint, Status> {
        let failure = self.failure.get();
        assert!(
            !failure.is_null(),
            "a UCX worker connects after its handlers are set"
        );
        let mut ep = std::ptr::null_mut();
        // SAFETY: the worker is live; UCX reads `address` during the call only (it unpacks
        // it); `failure` is a leaked handler, valid for good.
        check(unsafe {
            gsm_ucx_ep_create(
                self.handle,
                address.as_ptr().cast(),
                c_int::from(peer_failure),
                failure,
                &mut ep,
            )
        })?;
        Ok(Endpoint(ep))
    }
}

/// `UCS_ERR_UNREACHABLE`: no transport of this UCX reaches the peer as asked.
pub(crate) const UNREACHABLE: c_int = -6;

/// One link's endpoint (module docs).
#[derive(Debug)]
pub(crate) struct Endpoint(*mut EndpointHandle);

impl Endpoint {
    /// The handle UCX passes to the failure handler for this endpoint.
    pub(crate) fn id(&self) -> usize {
        self.0 as usize
    }

    /// Sends `header` and `data` as one active message. `Ok(None)`: sent (the buffers may be
    /// reused); `Ok(Some(request))`: under way, and the buffers must stay unchanged until the
    /// request completes.
    pub(crate) fn send(&self, header: &[u8], data: &[u8]) -> Result<Option<Request>, Status> {
        let mut request = std::ptr::null_mut();
        // SAFETY: the endpoint is live (never closed: module docs); the buffers
        // are live for the call, and for as long as the request runs by this function's
        // contract.
        check(unsafe {
            gsm_ucx_send(
                self.0,
                header.as_ptr().cast(),
                header.len(),
                data.as_ptr().cast(),
                data.len(),
                &mut request,
            )
        })?;
        Ok((!request.is_null()).then(|| Request(request)))
    }
}

/// A peer's region heap key, unpacked on the endpoint it is used with (module docs: kept for
/// good).
#[derive(Debug)]
pub(crate) struct RemoteKey(*mut RemoteKeyHandle);

impl RemoteKey {
    /// A pointer this process reaches the peer's `remote` address through, where UCX maps
    /// the peer's memory (its shared memory), valid as long as the key (for good).
    pub(crate) fn local(&self, remote: u64) -> Option<*mut u8> {
        let mut local = std::ptr::null_mut();
        // SAFETY: the key is live (kept for good); UCX only writes `local`.
        let status = unsafe { gsm_ucx_rkey_ptr(self.0, remote, &mut local) };
        (status == OK && !local.is_null()).then_some(local.cast())
    }
}

impl Endpoint {
    /// Unpacks a key the peer packed with [`Context::register`] (sent over the proven
    /// connection: UCX checks its format, and trusts what it describes).
    pub(crate) fn unpack(&self, packed: &[u8]) -> Result<RemoteKey, Status> {
        let mut rkey = std::ptr::null_mut();
        // SAFETY: the endpoint is live; UCX reads `packed` during the call only.
        check(unsafe { gsm_ucx_rkey_unpack(self.0, packed.as_ptr().cast(), &mut rkey) })?;
        Ok(RemoteKey(rkey))
    }

    /// Writes `words` to the peer's `remote` address.
    ///
    /// # Safety
    /// `rkey` was unpacked on this endpoint; `remote` lies, with `words`, inside the memory it
    /// describes. On [`Started::UnderWay`], `words` and `done` stay valid and unchanged until
    /// `done` is called.
    pub(crate) unsafe fn put(
        &self,
        words: *const [u64],
        remote: u64,
        rkey: &RemoteKey,
        done: *mut Completion,
    ) -> Result<Started, Status> {
        // SAFETY: the caller's promises; the endpoint is live.
        started(unsafe { gsm_ucx_put(self.0, words.cast(), words.len() * 8, remote, rkey.0, done) })
    }

    /// Reads the peer's words at `remote` into `words`.
    ///
    /// # Safety
    /// As [`put`](Endpoint::put); `words` is written by UCX until the operation completes, and
    /// read by nobody else until then.
    pub(crate) unsafe fn get(
        &self,
        words: *mut [u64],
        remote: u64,
        rkey: &RemoteKey,
        done: *mut Completion,
    ) -> Result<Started, Status> {
        // SAFETY: the caller's promises; the endpoint is live.
        started(unsafe { gsm_ucx_get(self.0, words.cast(), words.len() * 8, remote, rkey.0, done) })
    }

    /// An atomic on the peer's word at `remote`: adds `*operand` to it, or stores `*reply`
    /// (the new value, on entry) if it holds `*operand`; `*reply` receives its value before.
    ///
    /// # Safety
    /// As [`get`](Endpoint::get), for `operand` and `reply`; `remote` is 8-byte aligned.
    pub(crate) unsafe fn atomic(
        &self,
        kind: Atomic,
        operand: *const u64,
        reply: *mut u64,
        remote: u64,
        rkey: &RemoteKey,
        done: *mut Completion,
    ) -> Result<Started, Status> {
        let compare_swap = c_int::from(kind == Atomic::CompareSwap);
        // SAFETY: the caller's promises; the endpoint is live.
        started(unsafe {
            gsm_ucx_atomic(self.0, compare_swap, operand, reply, remote, rkey.0, done)
        })
    }

    /// Completes once every operation issued on this endpoint before has completed at the
    /// peer.
    ///
    /// # Safety
    /// On [`Started::UnderWay`], `done` stays valid until it is called.
    pub(crate) unsafe fn flush(&self, done: *mut Completion) -> Result<Started, Status> {
        // SAFETY: the caller's promise; the endpoint is live.
        started(unsafe { gsm_ucx_ep_flush(self.0, done) })
    }
}

/// A send under way (module docs); freed when dropped, which the owner does only
/// once it completed.
#[derive(Debug)]
pub(crate) struct Request(*mut c_void);

impl Request {
    /// `None` while under way, then its result.
    pub(crate) fn status(&self) -> Option<Result<(), Status>> {
        // SAFETY: the request is live until dropped.
        match unsafe { gsm_ucx_request_status(self.0) } {
            IN_PROGRESS => None,
            status => Some(check(status)),
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        // SAFETY: the request is live and freed once, here. (Freed before it completed, UCX
        // still completes it and releases it then; the owners here wait for completion.)
        unsafe { gsm_ucx_request_free(self.0) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// What a test worker's handlers saw: messages (header, data) and failures.
    #[derive(Default)]
    struct Seen {
        messages: RefCell<Vec<(Vec<u8>, Vec<u8>)>>,
    }

    unsafe extern "C" fn arrived(
        arg: *mut c_void,
        header: *const c_void,
        header_length: usize,
        data: *const c_void,
        length: usize,
        _rendezvous: c_int,
    ) {
        // SAFETY: `arg` is the test's leaked `Seen`; UCX passes valid buffers of these lengths.
        unsafe {
            let seen = &*arg.cast::<Seen>();
            let header = std::slice::from_raw_parts(header.cast::<u8>(), header_length);
            let data = std::slice::from_raw_parts(data.cast::<u8>(), length);
            seen.messages
                .borrow_mut()
                .push((header.to_vec(), data.to_vec()));
        }
    }

    unsafe extern "C" fn failed(_: *mut c_void, _: *mut c_void, status: c_int) {
        panic!("an endpoint failed: {}", Status(status));
    }

    /// Two workers of one process: one sends the other messages of several sizes, each
    /// through UCX and back out of the handler, as a link's would.
    #[test]
    fn a_worker_sends_another_messages_through_the_shim() {
        let context = Context::new().expect("UCX starts");
        let (sender, receiver) = (context.worker().unwrap(), context.worker().unwrap());
        let seen: &'static Seen = Box::leak(Box::default());
        let arg = (seen as *const Seen).cast_mut().cast();
        for worker in [&sender, &receiver] {
            // SAFETY: `seen` is leaked, and the handlers take it back as `&Seen` on this thread.
            unsafe { worker.set_handlers(arrived, failed, arg) }.unwrap();
        }
        assert!(receiver.event_fd().is_ok());
        let endpoint = sender.connect(receiver.address(), false).unwrap();
        let sizes = [0usize, 1, 100, 70_000];
        for (i, &size) in sizes.iter().enumerate() {
            let data: Vec<u8> = (0..size).map(|b| (b * 7 + i) as u8).collect();
            let header = (i as u64).to_le_bytes();
            if let Some(request) = endpoint.send(&header, &data).unwrap() {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while request.status().is_none() {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "send {i} never completed"
                    );
                    sender.progress();
                    receiver.progress();
                }
                request.status().unwrap().unwrap();
            }
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while seen.messages.borrow().len() < sizes.len() {
            assert!(
                std::time::Instant::now() < deadline,
                "the messages never all arrived"
            );
            sender.progress();
            receiver.progress();
        }
        // Sorted by header: UCX does not promise one endpoint's messages arrive in order.
        let mut messages = seen.messages.take();
        messages.sort();
        for (i, (header, data)) in messages.iter().enumerate() {
            assert_eq!(header, &(i as u64).to_le_bytes());
            assert_eq!(data.len(), sizes[i]);
            assert!(
                data.iter()
                    .enumerate()
                    .all(|(b, &v)| v == (b * 7 + i) as u8)
            );
        }
    }
}
