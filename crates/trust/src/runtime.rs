//! The runtime: its builder, the state its workers share, and shutdown.
//!
//! # Which channels a trustee scans
//!
//! Client ids are the workers, then external threads (see `external`), then one shared
//! external channel. A trustee scans the channels of ids below `external_high`, plus the shared
//! one while `shared_external_busy` is set ([`Shared::active_clients`]). A thread that claims
//! an id raises `external_high` to cover it (`fetch_max`, so the bound only grows), or sets
//! `shared_external_busy`, *before* it publishes its first request; then it wakes the trustee. If the trustee is awake, its next scan loads the bound
//! after the client's store (`Release`/`Acquire`) or, at worst, one scan later; if it is
//! about to sleep, the park handshake (`park`) orders the client's stores before the
//! trustee's last check, which therefore sees the new bound and the request. The bounds only
//! grow while the runtime runs (a released id keeps its channel scanned), so no request is
//! missed.
//!
//! # Unsafe code here
//!
//! * `pin_workers` calls `sched_getaffinity`/`sched_setaffinity` on the worker threads.
//! * [`Runtime::block_on`] runs a closure that borrows from the caller's stack in a fiber. It
//!   erases the closure's lifetime to hand it to a worker, which is sound for the reason
//!   `std::thread::scope` is: it returns only after the fiber has finished with the closure
//!   (its `join` waits, or re-raises the fiber's panic after the fiber is gone), and the
//!   runtime cannot shut down meanwhile since `block_on` borrows it.

use std::fmt;
use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle as ThreadHandle;

use crate::channel::{Channel, Panic};
use crate::fiber::{self, JoinHandle};
use crate::inject::{Injected, Injector};
use crate::loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use crate::park::Parker;
use crate::trust::{Trust, TrusteeRef};
use crate::worker;

/// Default fiber stack size: 256 KiB (plus a guard page).
const DEFAULT_STACK_SIZE: usize = 256 * 1024;
/// Default number of plain OS threads that may use trusts at the same time with a channel of
/// their own; more threads take turns on one shared channel.
const DEFAULT_EXTERNAL_CLIENTS: usize = 16;

type PanicHandler = dyn Fn(Panic) + Send + Sync;

/// Configures and starts a [`Runtime`].
///
/// ```
/// let rt = trust::Runtime::builder().workers(2).stack_size(64 * 1024).build().unwrap();
/// assert_eq!(rt.block_on(|| 6 * 7), 42);
/// ```
pub struct Builder {
    workers: Option<usize>,
    dedicated: usize,
    pin: bool,
    stack_size: usize,
    external_clients: usize,
    panic_handler: Option<Arc<PanicHandler>>,
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("workers", &self.workers)
            .field("dedicated_trustees", &self.dedicated)
            .field("pin", &self.pin)
            .field("stack_size", &self.stack_size)
            .field("external_clients", &self.external_clients)
            .finish_non_exhaustive()
    }
}

/// Why a [`Runtime`] could not be built.
#[derive(Debug)]
pub struct BuildError {
    message: String,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BuildError {}

impl Builder {
    fn new() -> Self {
        Builder {
            workers: None,
            dedicated: 0,
            pin: false,
            stack_size: DEFAULT_STACK_SIZE,
            external_clients: DEFAULT_EXTERNAL_CLIENTS,
            panic_handler: None,
        }
    }

    /// Number of worker threads (default: the number of available cores).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = Some(n);
        self
    }

    /// Number of workers that only serve as trustees (the "dedicated" mode of the seed). With
    /// the default, 0, every worker runs fibers and is a trustee too ("shared" mode). Dedicated
    /// trustees are the last `k` workers; properties entrusted to the pool go to them.
    pub fn dedicated_trustees(mut self, k: usize) -> Self {
        self.dedicated = k;
        self
    }

    /// Pin worker `i` to the `i`-th CPU this process may run on, wrapping around (default:
    /// off). Pinned workers cannot be stacked on one CPU by the OS scheduler, which matters for
    /// spinning hand-overs on a busy machine; unpinned workers can move away from a CPU that
    /// another process keeps busy. `build` fails if a worker cannot be pinned.
    pub fn pin(mut self, pin: bool) -> Self {
        self.pin = pin;
        self
    }

    /// Stack size of each fiber, in bytes (default 256 KiB). Each stack has a guard page, so
    /// an overflow faults instead of corrupting memory.
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.stack_size = bytes;
        self
    }

    /// Number of plain OS threads that get a channel of their own when they use trusts
    /// (default 16). Further threads share one channel, one call at a time.
    pub fn external_clients(mut self, n: usize) -> Self {
        self.external_clients = n;
        self
    }

    /// Handles panics that have nobody to go to: a panic in an `apply_then` callback, or in a
    /// delegated closure whose caller did not wait for it. Without a handler such a panic
    /// aborts the process after printing it, since ignoring it would hide a bug.
    pub fn panic_handler(
        mut self,
        handler: impl Fn(Box<dyn std::any::Any + Send>) + Send + Sync + 'static,
    ) -> Self {
        self.panic_handler = Some(Arc::new(handler));
        self
    }

    /// Starts the workers.
    pub fn build(self) -> Result<Runtime, BuildError> {
        let workers = match self.workers {
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        let fail = |message: String| Err(BuildError { message });
        if workers == 0 {
            return fail("a runtime needs at least one worker".into());
        }
        if workers > u32::MAX as usize / 2 {
            return fail(format!(
                "{workers} workers is more than the runtime supports"
            ));
        }
        if self.dedicated >= workers {
            return fail(format!(
                "dedicated_trustees({}) must leave at least one of the {workers} workers to run fibers",
                self.dedicated
            ));
        }
        if self.stack_size < 16 * 1024 {
            return fail(format!(
                "stack_size({}) is below the 16 KiB minimum",
                self.stack_size
            ));
        }
        let clients = workers + self.external_clients + 1;
        let trustees: Vec<usize> = if self.dedicated == 0 {
            (0..workers).collect()
        } else {
            (workers - self.dedicated..workers).collect()
        };
        let shared = Arc::new(Shared {
            workers,
            client_workers: workers - self.dedicated,
            trustees,
            clients,
            channels: (0..clients * workers).map(|_| Channel::new()).collect(),
            parkers: (0..clients).map(|_| Parker::new()).collect(),
            injected: (0..workers).map(|_| Injector::new()).collect(),
            free_external: Mutex::new((workers..workers + self.external_clients).rev().collect()),
            external_high: AtomicUsize::new(workers),
            shared_external: Mutex::new(()),
            shared_external_busy: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            torn_down: AtomicBool::new(false),
            next_trustee: AtomicUsize::new(0),
            next_client: AtomicUsize::new(0),
            stack_size: self.stack_size,
            panic_handler: self.panic_handler,
            barrier: Barrier::new(workers),
        });
        crate::overflow::install();
        let mut threads = Vec::with_capacity(workers);
        for index in 0..workers {
            let shared = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("gossamer-worker-{index}"))
                .spawn(move || worker::run(shared, index));
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    // Workers wait for each other at shutdown; without all of them the runtime
                    // cannot start or stop cleanly, so this is fatal.
                    eprintln!("gossamer: could not start worker thread {index}: {e}");
                    std::process::abort();
                }
            }
        }
        let runtime = Runtime {
            handle: Handle { shared },
            threads,
        };
        if self.pin {
            // On failure `runtime` is dropped here, which stops the workers again.
            pin_workers(&runtime.threads)?;
        }
        Ok(runtime)
    }
}

/// Pins each worker thread to one of the CPUs the process is allowed to use.
fn pin_workers(threads: &[ThreadHandle<()>]) -> Result<(), BuildError> {
    use std::os::unix::thread::JoinHandleExt;
    let fail = |message: String| Err(BuildError { message });
    // SAFETY: a zeroed `cpu_set_t` is a valid empty set; the calls only read and fill it.
    let allowed: Vec<usize> = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return fail(format!(
                "cannot read the allowed CPUs to pin workers: {}",
                std::io::Error::last_os_error()
            ));
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
            .collect()
    };
    if allowed.is_empty() {
        return fail("no CPU is allowed for pinning workers".into());
    }
    for (index, thread) in threads.iter().enumerate() {
        let cpu = allowed[index % allowed.len()];
        // SAFETY: the thread is alive (joined only at shutdown); the set is a valid mask.
        let rc = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::pthread_setaffinity_np(thread.as_pthread_t(), size_of::<libc::cpu_set_t>(), &set)
        };
        if rc != 0 {
            return fail(format!(
                "cannot pin worker {index} to CPU {cpu}: {}",
                std::io::Error::from_raw_os_error(rc)
            ));
        }
    }
    Ok(())
}

/// State shared by the workers of one runtime and by every trust and handle into it.
pub(crate) struct Shared {
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
    pub(crate) injected: Box<[Injector]>,
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
    panic_handler: Option<Arc<PanicHandler>>,
    pub(crate) barrier: Barrier,
}

impl Shared {
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

    /// Delivers a panic that has no waiting caller (see [`Builder::panic_handler`]).
    pub(crate) fn unhandled_panic(&self, panic: Panic) {
        match &self.panic_handler {
            Some(handler) => handler(panic),
            None => {
                eprintln!(
                    "gossamer: a panic in an apply_then callback or an unawaited delegated closure had no \
                     handler (set Builder::panic_handler); aborting"
                );
                std::process::abort();
            }
        }
    }

    pub(crate) fn entrust<T: Send + 'static>(
        self: &Arc<Self>,
        trustee: usize,
        value: T,
    ) -> Trust<T> {
        Trust::new(self.clone(), trustee, value)
    }
}

/// A cloneable, `Send` handle to a runtime, usable from any thread while the runtime runs.
#[derive(Clone)]
pub struct Handle {
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handle")
            .field("workers", &self.shared.workers)
            .finish_non_exhaustive()
    }
}

impl Handle {
    /// The handle of the runtime whose worker runs the caller, if any.
    ///
    /// ```
    /// let rt = trust::Runtime::builder().workers(1).build().unwrap();
    /// assert!(trust::Handle::current().is_none());
    /// assert!(rt.block_on(|| trust::Handle::current().is_some()));
    /// ```
    pub fn current() -> Option<Handle> {
        worker::current_shared().map(|shared| Handle { shared })
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.shared.workers
    }

    /// Number of workers that run application fibers (all of them in shared mode).
    pub fn client_workers(&self) -> usize {
        self.shared.client_workers
    }

    /// The trustee of worker `worker`.
    ///
    /// # Panics
    /// If `worker` is out of range or is not a trustee (in dedicated mode only the last
    /// `dedicated_trustees` workers are).
    pub fn trustee(&self, worker: usize) -> TrusteeRef {
        assert!(
            self.shared.trustees.contains(&worker),
            "worker {worker} is not a trustee of this runtime (trustees: {:?})",
            self.shared.trustees
        );
        TrusteeRef {
            shared: self.shared.clone(),
            worker,
        }
    }

    /// Every trustee of the runtime.
    pub fn trustees(&self) -> Vec<TrusteeRef> {
        self.shared
            .trustees
            .iter()
            .map(|&worker| TrusteeRef {
                shared: self.shared.clone(),
                worker,
            })
            .collect()
    }

    /// Entrusts `value` to a trustee of the pool, chosen round-robin.
    pub fn entrust<T: Send + 'static>(&self, value: T) -> Trust<T> {
        self.shared.entrust(self.shared.next_trustee(), value)
    }

    /// Starts a fiber on a client worker chosen round-robin.
    pub fn spawn<F, R>(&self, f: F) -> JoinHandle<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        self.spawn_on(self.shared.next_client_worker(), f)
    }

    /// Starts a fiber on worker `worker`.
    ///
    /// # Panics
    /// If `worker` is out of range.
    pub fn spawn_on<F, R>(&self, worker: usize, f: F) -> JoinHandle<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        assert!(
            worker < self.shared.workers,
            "worker {worker} out of range (the runtime has {})",
            self.shared.workers
        );
        let (handle, body) = fiber::task(f);
        match worker::current_on(&self.shared) {
            Some(w) if w.index == worker => w.spawn_local(body),
            _ => self.shared.injected[worker].push(&self.shared, worker, Injected::Spawn(body)),
        }
        handle
    }
}

/// A Gossamer runtime: worker threads, each running fibers and a trustee.
///
/// Dropping the runtime shuts it down: fibers that have not finished are unwound (their
/// destructors run), requests that never ran are dropped, and properties whose trusts are
/// gone are dropped.
///
/// ```
/// let rt = trust::Runtime::builder().workers(2).build().unwrap();
/// let counter = rt.entrust(0u64);
/// let total = rt.block_on(|| {
///     let fibers: Vec<_> = (0..8)
///         .map(|_| {
///             let c = counter.clone();
///             trust::spawn(move || for _ in 0..100 { c.apply(|n| *n += 1) })
///         })
///         .collect();
///     fibers.into_iter().for_each(|f| f.join());
///     counter.apply(|n| *n)
/// });
/// assert_eq!(total, 800);
/// ```
pub struct Runtime {
    handle: Handle,
    threads: Vec<ThreadHandle<()>>,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("workers", &self.handle.shared.workers)
            .finish_non_exhaustive()
    }
}

impl std::ops::Deref for Runtime {
    type Target = Handle;
    fn deref(&self) -> &Handle {
        &self.handle
    }
}

impl Runtime {
    /// A builder with the defaults: one worker per core, shared trustees, no pinning.
    pub fn builder() -> Builder {
        Builder::new()
    }

    /// A runtime with the defaults.
    pub fn new() -> Result<Runtime, BuildError> {
        Builder::new().build()
    }

    /// A handle that can be cloned and sent to other threads.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Runs `f` in a fiber on worker 0 and waits for it. `f` may borrow from the caller.
    /// A panic in `f` is re-raised here.
    ///
    /// # Panics
    /// When called from inside a worker of any runtime (a fiber must not block its worker
    /// thread; spawn a fiber and `join` it instead).
    pub fn block_on<F, R>(&self, f: F) -> R
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        assert!(
            !worker::on_any_worker(),
            "Runtime::block_on called from inside a runtime worker; use spawn(..).join() instead"
        );
        let mut out: Option<R> = None;
        let slot = SendAddr(&mut out as *mut Option<R> as usize);
        let body: Box<dyn FnOnce() + Send + '_> = Box::new(move || {
            let r = f();
            // SAFETY: `slot` points at `out` on the caller's stack, which outlives the fiber
            // (see below); nothing else touches it until `join` returns.
            unsafe { *(slot.0 as *mut Option<R>) = Some(r) };
        });
        // SAFETY: we erase the lifetime of `body` only to move it to a worker. `join` below
        // returns (or re-raises a panic) only after the fiber finished running `body`, and the
        // runtime cannot shut down meanwhile because `self` stays borrowed, so everything `body`
        // borrows (including `out`) outlives its use.
        let body: Box<dyn FnOnce() + Send + 'static> = unsafe { std::mem::transmute(body) };
        self.handle.spawn_on(0, body).join();
        out.expect("block_on's fiber finished without a result")
    }
}

/// An address moved to another thread (see `Runtime::block_on`).
struct SendAddr(usize);

impl Drop for Runtime {
    fn drop(&mut self) {
        let shared = &self.handle.shared;
        assert!(
            worker::current_on(shared).is_none(),
            "a Runtime was dropped on one of its own workers, which would wait for itself; drop it from another thread"
        );
        shared.stopping.store(true, Ordering::SeqCst);
        for w in 0..shared.workers {
            shared.parkers[w].wake();
        }
        let mut worker_panicked = false;
        for t in self.threads.drain(..) {
            worker_panicked |= t.join().is_err();
        }
        shared.torn_down.store(true, Ordering::SeqCst);
        for p in shared.parkers.iter().skip(shared.workers) {
            p.wake();
        }
        if worker_panicked && !std::thread::panicking() {
            panic!("a gossamer worker thread panicked");
        }
    }
}
