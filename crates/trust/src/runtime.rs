//! The public runtime API: the [`Builder`], the [`Runtime`] (which starts and stops the
//! worker threads) and its [`Handle`]. The state they share is the registry (`registry`).
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
use std::sync::Arc;
use std::thread::JoinHandle as ThreadHandle;
use std::time::Duration;

use crate::fiber::{self, JoinHandle};
use crate::home::MigrateError;
use crate::inject::Injected;
use crate::loom::sync::atomic::Ordering;
use crate::rebalance::Rebalance;
use crate::registry::{Layout, PanicHandler, Registry};
use crate::trust::{Trust, TrusteeRef};
use crate::worker;

/// Default fiber stack size: 256 KiB (plus a guard page).
const DEFAULT_STACK_SIZE: usize = 256 * 1024;
/// Default number of plain OS threads that may use trusts at the same time with a channel of
/// their own; more threads take turns on one shared channel.
const DEFAULT_EXTERNAL_CLIENTS: usize = 16;

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
    /// `None`: adaptive.
    spin: Option<Duration>,
    panic_handler: Option<Arc<PanicHandler>>,
    rebalance: Option<Rebalance>,
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("workers", &self.workers)
            .field("dedicated_trustees", &self.dedicated)
            .field("pin", &self.pin)
            .field("stack_size", &self.stack_size)
            .field("external_clients", &self.external_clients)
            .field("spin", &self.spin)
            .field("rebalance", &self.rebalance)
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
            spin: None,
            panic_handler: None,
            rebalance: None,
        }
    }

    /// Moves hot properties off overloaded trustees while the runtime runs, by `policy`
    /// (off by default): a thread looks at the counters each period and moves properties
    /// with [`Trust::migrate_to`]'s guarantees (see [`Rebalance`] for how it decides).
    pub fn rebalance(mut self, policy: Rebalance) -> Self {
        self.rebalance = Some(policy);
        self
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

    /// Fixes how long a waiting thread spins before it blocks: a worker with nothing to do
    /// checking for work (its queues, and its sockets without blocking), and a plain thread
    /// checking for its answer. `Duration::ZERO` blocks after one check.
    ///
    /// Without it (the default) the spin adapts, up to [`DEFAULT_SPIN`](crate::DEFAULT_SPIN) (50 µs) for a worker
    /// and [`PLAIN_THREAD_SPIN`](crate::PLAIN_THREAD_SPIN) (500 µs) for a plain thread: spins that pay on idle cores keep the ceiling, a run of
    /// spins that did not pay shortens it, and a spin that lost its core to another thread (a
    /// shared core) stops spinning for a cool-down of 1 to 64 ms. The policy and why it does
    /// not oscillate are in the source, `spin.rs`.
    ///
    /// An answer or request that arrives within the spin is taken at once; one that arrives
    /// later costs a wake-up, tens of microseconds on a virtual machine. The spin only follows
    /// work: a runtime that stays idle blocks after one spin and uses no CPU. Longer spins
    /// trade CPU for latency, which pays while every thread has a core of its own and costs
    /// when the machine is oversubscribed: a spinning worker holds the core that the thread it
    /// waits for needs. Either way, a worker from which a property has just moved (see
    /// `Trust::migrate_to`) parks at once in its next idle wait, leaving the core to the
    /// property's new home. The gossamer rack sets it from `GSM_SPIN` when that is set;
    /// bench/README ("The spin before blocking") has the measurements behind the ceiling.
    ///
    /// ```
    /// use std::time::Duration;
    /// let rt = trust::Runtime::builder().workers(2).spin(Duration::ZERO).build().unwrap();
    /// let counter = rt.entrust(0u64);
    /// counter.apply(|c| *c += 1);
    /// assert_eq!(counter.apply(|c| *c), 1);
    /// ```
    pub fn spin(mut self, spin: Duration) -> Self {
        self.spin = Some(spin);
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
        let layout = Layout {
            workers,
            dedicated: self.dedicated,
            external_clients: self.external_clients,
            stack_size: self.stack_size,
            spin: self.spin,
        };
        let registry = Arc::new(Registry::new(layout, self.panic_handler));
        crate::registry::enlist(&registry);
        crate::overflow::install();
        let mut threads = Vec::with_capacity(workers);
        for index in 0..workers {
            let registry = registry.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("trust-worker-{index}"))
                .spawn(move || worker::run(registry, index));
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    // Workers wait for each other at shutdown; without all of them the runtime
                    // cannot start or stop cleanly, so this is fatal.
                    eprintln!("trust: could not start worker thread {index}: {e}");
                    std::process::abort();
                }
            }
        }
        let rebalancer = self.rebalance.map(|policy| {
            let (stop, stopped) = std::sync::mpsc::channel();
            let registry = registry.clone();
            let thread = std::thread::Builder::new()
                .name("trust-rebalance".into())
                .spawn(move || crate::rebalance::run(registry, policy, stopped))
                .map_err(|e| BuildError {
                    message: format!("cannot start the rebalancing thread: {e}"),
                });
            (stop, thread)
        });
        let mut runtime = Runtime {
            handle: Handle { registry },
            threads,
            rebalancer: None,
        };
        if let Some((stop, thread)) = rebalancer {
            // On failure `runtime` is dropped here, which stops the workers again.
            runtime.rebalancer = Some((stop, thread?));
        }
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

/// A cloneable, `Send` handle to a runtime, usable from any thread while the runtime runs.
#[derive(Clone)]
pub struct Handle {
    pub(crate) registry: Arc<Registry>,
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handle")
            .field("workers", &self.registry.workers)
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
        worker::current_registry().map(|registry| Handle { registry })
    }

    /// A snapshot of the runtime's counters: per worker, per property type and for the
    /// hottest properties (see [`Stats`](crate::Stats), also for how fresh it is). The
    /// counters are always on; reading them takes each worker's sample lock briefly and costs
    /// the workers nothing else.
    ///
    /// ```
    /// let rt = trust::Runtime::builder().workers(1).build().unwrap();
    /// let c = rt.entrust(0u64);
    /// c.apply(|c| *c += 1);
    /// let stats = rt.stats();
    /// assert_eq!(stats.workers.len(), 1);
    /// assert_eq!(stats.workers[0].properties, 1);
    /// ```
    pub fn stats(&self) -> crate::Stats {
        let r = &self.registry;
        crate::stats::snapshot(&r.counters, &r.trustees, r.started)
    }

    /// Moves the property that [`Stats::hottest`](crate::Stats::hottest) lists as `id` on
    /// trustee `from` to trustee `to`, as the rebalancer would: by hand (`gsm top`'s `m` key
    /// asks a rank for this). The move runs in `from`'s loop, and only if the property is among
    /// `from`'s hottest there, which is what makes an id from anywhere safe to act on: one that
    /// names no such property (freed or moved since, or never hot) moves nothing and gets
    /// [`MigrateError::NotHot`]. `then` runs in `from`'s loop with the outcome, once the move
    /// is made or refused; it must not block.
    ///
    /// ```
    /// let rt = trust::Runtime::builder().workers(2).build().unwrap();
    /// let hot = rt.trustee(0).entrust(0u64);
    /// // Called until sampled batches list it among worker 0's hottest (each call from a
    /// // plain thread is a batch).
    /// while !rt.stats().hottest.iter().any(|p| p.id == hot.id()) {
    ///     (0..1024).for_each(|_| hot.apply(|n| *n += 1));
    /// }
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// rt.handle().move_hot(hot.id(), 0, 1, move |moved| tx.send(moved).unwrap()).unwrap();
    /// assert_eq!(rx.recv().unwrap(), Ok(()));
    /// assert_eq!(hot.trustee(), 1);
    /// // Nothing of that id is hot on worker 0 any more.
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// rt.handle().move_hot(hot.id(), 0, 1, move |moved| tx.send(moved).unwrap()).unwrap();
    /// assert!(matches!(rx.recv().unwrap(), Err(trust::MigrateError::NotHot { .. })));
    /// ```
    ///
    /// # Errors
    /// [`MigrateError::NotATrustee`] at once if `from` or `to` is not a trustee of this
    /// runtime (then `then` never runs). A move to where the property is, is `Ok`.
    pub fn move_hot(
        &self,
        id: usize,
        from: usize,
        to: usize,
        then: impl FnOnce(Result<(), MigrateError>) + Send + 'static,
    ) -> Result<(), MigrateError> {
        let trustees = &self.registry.trustees;
        if let Some(&worker) = [from, to].iter().find(|w| !trustees.contains(w)) {
            return Err(MigrateError::NotATrustee {
                worker,
                trustees: trustees.clone(),
            });
        }
        let m = crate::rebalance::Move { id, from, to };
        self.registry.inject(
            from,
            Injected::Run(Box::new(move || then(crate::rebalance::move_hot(m)))),
        );
        Ok(())
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.registry.workers
    }

    /// Number of workers that run application fibers (all of them in shared mode).
    pub fn client_workers(&self) -> usize {
        self.registry.client_workers
    }

    /// The trustee of worker `worker`.
    ///
    /// # Panics
    /// If `worker` is out of range or is not a trustee (in dedicated mode only the last
    /// `dedicated_trustees` workers are).
    #[track_caller]
    pub fn trustee(&self, worker: usize) -> TrusteeRef {
        assert!(
            self.registry.trustees.contains(&worker),
            "worker {worker} is not a trustee of this runtime (trustees: {:?})",
            self.registry.trustees
        );
        TrusteeRef {
            registry: self.registry.clone(),
            worker,
        }
    }

    /// Every trustee of the runtime.
    pub fn trustees(&self) -> Vec<TrusteeRef> {
        self.registry
            .trustees
            .iter()
            .map(|&worker| TrusteeRef {
                registry: self.registry.clone(),
                worker,
            })
            .collect()
    }

    /// Entrusts `value` to a trustee of the pool, chosen round-robin.
    pub fn entrust<T: Send + 'static>(&self, value: T) -> Trust<T> {
        Trust::new(self.registry.clone(), self.registry.next_trustee(), value)
    }

    /// Starts a fiber on a client worker chosen round-robin.
    pub fn spawn<F, R>(&self, f: F) -> JoinHandle<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        self.spawn_on(self.registry.next_client_worker(), f)
    }

    /// Starts a fiber on worker `worker`.
    ///
    /// # Panics
    /// If `worker` is out of range.
    #[track_caller]
    pub fn spawn_on<F, R>(&self, worker: usize, f: F) -> JoinHandle<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        assert!(
            worker < self.registry.workers,
            "worker {worker} out of range (the runtime has {})",
            self.registry.workers
        );
        let (handle, body) = fiber::task(f);
        match worker::current_on(&self.registry) {
            Some(w) if w.index == worker => w.spawn_local(body),
            _ => self.registry.inject(worker, Injected::Spawn(body)),
        }
        handle
    }
}

/// A runtime: worker threads, each running fibers and a trustee.
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
    /// The rebalancing thread, which stops when its sender is dropped.
    rebalancer: Option<(std::sync::mpsc::Sender<()>, ThreadHandle<()>)>,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("workers", &self.handle.registry.workers)
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
    #[track_caller]
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
        let registry = &self.handle.registry;
        assert!(
            worker::current_on(registry).is_none(),
            "a Runtime was dropped on one of its own workers, which would wait for itself; drop it from another thread"
        );
        if let Some((stop, thread)) = self.rebalancer.take() {
            drop(stop);
            let _ = thread.join();
        }
        registry.stopping.store(true, Ordering::SeqCst);
        for w in 0..registry.workers {
            registry.parkers[w].wake();
        }
        let mut worker_panicked = false;
        for t in self.threads.drain(..) {
            worker_panicked |= t.join().is_err();
        }
        registry.torn_down.store(true, Ordering::SeqCst);
        for p in registry.parkers.iter().skip(registry.workers) {
            p.wake();
        }
        if worker_panicked && !std::thread::panicking() {
            panic!("a trust worker thread panicked");
        }
    }
}
