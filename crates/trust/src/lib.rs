//! Delegation-based concurrency: instead of locking shared data, entrust it to one owner
//! thread — its *trustee* — and ship closures to it.
//!
//! ```
//! use trust::Runtime;
//!
//! let rt = Runtime::builder().workers(2).build().unwrap();
//! let counter = rt.entrust(0u64); // the property now lives on a trustee
//! rt.block_on(|| {
//!     let fibers: Vec<_> = (0..100)
//!         .map(|_| {
//!             let c = counter.clone();
//!             trust::spawn(move || c.apply(|n| *n += 1)) // runs on the trustee
//!         })
//!         .collect();
//!     fibers.into_iter().for_each(|f| f.join());
//! });
//! assert_eq!(counter.apply(|n| *n), 100);
//! ```
//!
//! # The model
//! * A [`Runtime`] runs worker threads. Each worker runs many light *fibers* and serves as
//!   the *trustee* of the properties entrusted to it (or, with
//!   [`Builder::dedicated_trustees`], some workers only serve).
//! * [`Trust<T>`] is a counted handle to a property. [`Trust::apply`] runs a closure on it and
//!   waits (only the fiber waits); [`Trust::apply_then`] does not wait and runs a callback with
//!   the result later; [`Trust::apply_async`] returns a future. Requests from one worker to one
//!   trustee are batched and run in order (to one property, also while it moves).
//! * [`Trust::apply_deferred`] hands the closure a [`Reply`] instead of taking its result: the
//!   trustee answers now or keeps the reply in the property and answers from a later request
//!   (a lock granted when it frees), with `_then`, `_async` and deadline (`_until`) forms.
//! * Code running on a trustee on behalf of a request is in *delegated context*: it must not
//!   block. Blocking calls there panic with a message naming the alternatives:
//!   [`Trust::apply_then`], or [`Trust::launch`] on a `Trust<Latch<T>>`, which runs the closure
//!   in a trustee-side fiber that may block.
//! * Plain threads may use trusts too; they wait by spinning, then parking.
//! * [`Trust::migrate_to`] moves a property to another trustee while it is in use: requests
//!   on their way are sent on, and each client's requests keep their order.
//!   [`Trust::withdraw`] takes the value out of the runtime altogether (the way out to another
//!   process): requests after it panic, none is lost or run on a value that has left.
//! * [`sleep`] suspends only the calling fiber (a plain thread sleeps); [`yield_now`] lets
//!   the worker's other fibers run.
//!
//! # Where things are
//! * `channel`: the delegation protocol between one client and one trustee (who owns which
//!   bytes when); `request`: the request format the channel carries, one record per request
//!   written in place into a batch, holding the request, its completion and then its answer;
//!   `record`: moving values in and out of word buffers byte for byte, and the buffer of
//!   deferred callbacks.
//! * `home`: where a property lives and how it moves (the header, the route table of a moved
//!   property, pins, forwarded groups).
//! * `free`: when a dead property may be dropped (the watermark protocol); `late`: the cell a
//!   late answer of a deferred request travels through; `inject`: work other threads hand to
//!   a worker; `park`: the sleep and wake-up handshake; `spin`: how long a waiting thread
//!   spins before it parks (the adaptive policy); `overflow`: the
//!   stack-overflow report; `loom`: the sync primitives the protocols use, swappable for loom's.
//! * `registry`: the state a runtime's workers share with each other and with every trust and
//!   handle (channels, parkers, injectors, run state).
//! * `worker`: the worker loop; its state is plain data in `worker/scheduler` (the fiber
//!   table), `worker/lane` (the lanes to each trustee, and answers awaited from trustees of
//!   other runtimes) and `worker/local`, and its work is split by concern into `worker/fibers`
//!   (running fibers), `worker/client` (staging, publishing, completions), `worker/serve` (the
//!   trustee side), `worker/forward` (the trustee side of moved properties: parked batches and
//!   forwarded groups), `worker/timers` (fibers in [`sleep`]) and `worker/shutdown`.
//! * `fiber`: fibers and blocking; `external`: plain threads as clients; `latch`: the fiber
//!   lock; `group`: waiting for many `apply_then` callbacks; `net` (feature `net`): the
//!   per-worker I/O reactor (`net/reactor`) and the TCP types (`net/tcp`).
//! * `trust`: the `Trust` API and its trampolines; `deferred`: deferred requests and theirs;
//!   `reply`: the `Reply` a deferred request's closure answers through; `runtime`: the
//!   builder, the runtime and its handle; `rebalance`: the thread that moves hot properties.
//!
//! Layers, each importing only from the ones before it: (1) the protocols and primitives —
//! `loom`, `record`, `park`, `spin`, `request`, `channel`, `free`, `late`, `inject`, `home`, `overflow`,
//! `net/reactor`; (2) `registry`; (3) `worker`, which reads the registry every round; (4)
//! what blocks or waits on a worker — `fiber`, `external`, `latch`, `group`, `net`, `reply`;
//! (5) the API — `trust`, `deferred`, `runtime`, `rebalance` and this file. The registry sits below the worker because it is
//! only data the workers share and knows them by index alone.
//!
//! Unsafe code lives in `record`, `request`, `channel`, `park`, `free`, `late`, `inject`, `home`,
//! `worker` (every file but `scheduler`), `trust`, `deferred`, `reply`, `external`, `latch`,
//! `spin` (one `sysconf` call), `runtime` (pinning, and `block_on`'s borrowed closure) and
//! `overflow`; each module's docs
//! state its protocol, and the cross-thread ones (`channel`, `park`, `free`, `late`, `home`)
//! are checked with loom.
//! `net` has none.

#![deny(unsafe_op_in_unsafe_fn)]

mod async_call;
mod channel;
mod deferred;
mod external;
mod fiber;
mod free;
mod group;
mod home;
mod inject;
mod latch;
mod late;
mod loom;
#[cfg(feature = "net")]
pub mod net;
mod overflow;
mod park;
mod poll_spin;
mod rebalance;
mod record;
mod registry;
mod reply;
mod request;
mod runtime;
mod spin;
pub mod stats;
mod trust;
mod worker;

pub use async_call::ApplyFuture;
pub use deferred::{Deadline, Outcome};
pub use fiber::{JoinHandle, sleep, spawn, yield_if_busy, yield_now};
pub use group::Group;
pub use home::MigrateError;
pub use latch::{Latch, LatchGuard};
pub use rebalance::Rebalance;
pub use reply::{Reply, ReplyId, TimedOut};
pub use runtime::{BuildError, Builder, Handle, Runtime};
pub use spin::{DEFAULT_SPIN, PLAIN_THREAD_SPIN};
pub use stats::Stats;
pub use trust::{Attachment, Trust, TrusteeRef, entrust, local_trustee};

/// Waits for a future: in a fiber only the fiber is suspended between polls; on a plain
/// thread the thread parks.
///
/// ```
/// let rt = trust::Runtime::builder().workers(1).build().unwrap();
/// let ct = rt.entrust(2);
/// assert_eq!(trust::block_on(ct.apply_async(|c| *c * 21)), 42);
/// ```
///
/// # Panics
/// In delegated context, where blocking is not allowed.
#[track_caller]
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    fiber::wait(future)
}

/// The index of the worker running the caller, if the caller runs on a runtime worker.
///
/// ```
/// let rt = trust::Runtime::builder().workers(2).build().unwrap();
/// assert_eq!(trust::current_worker(), None);
/// assert_eq!(rt.spawn_on(1, trust::current_worker).join(), Some(1));
/// ```
pub fn current_worker() -> Option<usize> {
    worker::current().map(|w| w.index)
}

/// Runs `f` later on the calling worker, in delegated context (where blocking calls panic),
/// the way an `apply_then` callback runs: after the current fiber or closure gives the worker
/// back. A panic in `f` goes to the runtime's panic handler. This is the hook a transport
/// layer uses to run the callbacks of answers it receives.
///
/// ```
/// use std::{cell::Cell, rc::Rc};
/// let rt = trust::Runtime::builder().workers(1).build().unwrap();
/// rt.block_on(|| {
///     let ran = Rc::new(Cell::new(false));
///     let r = ran.clone();
///     trust::defer(move || r.set(trust::in_delegated_context()));
///     assert!(!ran.get());
///     trust::yield_now();
///     assert!(ran.get());
/// });
/// ```
///
/// # Panics
/// When called from a thread that is not a runtime worker.
#[track_caller]
pub fn defer<F: FnOnce() + 'static>(f: F) {
    let w = worker::current().expect("trust::defer called outside a runtime worker");
    w.defer_callback(f);
}

/// Whether the caller runs in delegated context (a closure running on a trustee, or an
/// `apply_then` callback), where blocking calls are not allowed.
pub fn in_delegated_context() -> bool {
    worker::current().is_some_and(|w| w.running() != worker::Running::Fiber)
}
