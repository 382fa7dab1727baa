//! Memory a worker watches while it spins: see [`Watch`].

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Memory a worker watches while it spins: for fibers that wait on something no file
/// descriptor reports, such as a ring in memory another process writes.
///
/// A fiber waiting on such memory cannot spin by itself without adding its spin to the
/// worker's (an idle worker spins for `Builder::spin` before it blocks) or starving the
/// worker's other fibers. Instead it registers a watch with its worker ([`watch`]) and blocks on an
/// ordinary waker. The worker then checks the watch:
///
/// - every round of its loop, so a busy worker notices the memory too;
/// - at every turn of its idle spin, so an idle one notices it within a few nanoseconds;
/// - once before it blocks, through [`Watch::before_sleep`], where the watch arranges to be
///   woken through the worker's reactor (for a ring: it sets a flag the writer checks after
///   publishing, and the writer then writes a byte to a socket the worker listens on).
///
/// ```
/// use std::cell::Cell;
/// use std::io::Write;
/// use std::rc::Rc;
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
/// use std::task::{Poll, Waker};
///
/// /// A flag another thread raises, and whether the worker went to sleep without seeing it.
/// #[derive(Default)]
/// struct Shared {
///     up: AtomicBool,
///     asleep: AtomicBool,
/// }
///
/// /// Wakes the fiber waiting for the flag.
/// struct Flag {
///     shared: Arc<Shared>,
///     waiter: Cell<Option<Waker>>,
/// }
///
/// impl trust::net::Watch for Flag {
///     fn poll(&self) -> bool {
///         match self.waiter.take() {
///             Some(w) if self.shared.up.load(SeqCst) => {
///                 w.wake();
///                 true
///             }
///             w => {
///                 self.waiter.set(w);
///                 false
///             }
///         }
///     }
///
///     fn before_sleep(&self) -> bool {
///         // Announce the sleep, then look once more: the raiser either sees the announcement
///         // (and rings the socket) or raised the flag before it, which this look sees.
///         self.shared.asleep.store(true, SeqCst);
///         self.poll()
///     }
/// }
///
/// let rt = trust::Runtime::builder().workers(1).build()?;
/// let shared = Arc::new(Shared::default());
/// let (bell, doorbell) = std::os::unix::net::UnixStream::pair()?;
/// let raiser = {
///     let shared = shared.clone();
///     std::thread::spawn(move || {
///         // Late enough that the worker has gone to sleep.
///         std::thread::sleep(std::time::Duration::from_millis(50));
///         shared.up.store(true, SeqCst);
///         if shared.asleep.swap(false, SeqCst) {
///             (&bell).write_all(&[1]).unwrap();
///         }
///     })
/// };
/// rt.block_on(move || {
///     // The doorbell's reader keeps the socket in the worker's reactor, where it sleeps.
///     let doorbell = trust::net::UnixStream::from_std(doorbell).unwrap();
///     let _bell = trust::spawn(move || doorbell.read(&mut [0]));
///     let flag = Rc::new(Flag { shared, waiter: Cell::new(None) });
///     let _watching = trust::net::watch(flag.clone());
///     trust::block_on(std::future::poll_fn(|cx| {
///         if flag.shared.up.load(SeqCst) {
///             return Poll::Ready(());
///         }
///         flag.waiter.set(Some(cx.waker().clone()));
///         Poll::Pending
///     }));
/// });
/// raiser.join().unwrap();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Watch {
    /// Checks the memory and wakes the fibers it lets go on; returns whether it woke any.
    /// Called very often: it should cost a few loads. It must not register or drop watches.
    fn poll(&self) -> bool;

    /// The worker is about to block in its reactor: arrange to be woken through it (a
    /// readable socket), or, if the memory changed meanwhile, wake the fibers and return
    /// `true` (the worker then does not block).
    fn before_sleep(&self) -> bool;
}

/// Keeps a watch registered with its worker; dropping it unregisters the watch.
#[derive(Debug)]
#[must_use = "the watch is unregistered when this is dropped"]
pub struct Watching {
    id: u64,
}

/// Registers `watch` with the worker this fiber runs on, until the returned guard drops.
///
/// # Panics
/// Off a worker of a runtime: there is no worker loop to check the watch.
pub fn watch(watch: Rc<dyn Watch>) -> Watching {
    let worker = crate::worker::current().expect("trust::net::watch is called on a worker");
    let id = worker.watches.add(watch);
    Watching { id }
}

impl Drop for Watching {
    fn drop(&mut self) {
        // Off the worker (a guard dropped after its runtime) there is nothing left to remove.
        if let Some(worker) = crate::worker::current() {
            worker.watches.remove(self.id);
        }
    }
}

/// Names every watch of the process: a guard dropped on another worker than its own then
/// removes nothing there.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A worker's watches.
#[derive(Default)]
pub(crate) struct Watches {
    list: RefCell<Vec<(u64, Rc<dyn Watch>)>>,
}

impl Watches {
    fn add(&self, watch: Rc<dyn Watch>) -> u64 {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        self.list.borrow_mut().push((id, watch));
        id
    }

    fn remove(&self, id: u64) {
        self.list.borrow_mut().retain(|(i, _)| *i != id);
    }

    /// Polls every watch; returns whether any woke a fiber.
    #[inline]
    pub(crate) fn poll(&self) -> bool {
        let list = self.list.borrow();
        let mut woke = false;
        for (_, w) in list.iter() {
            woke |= w.poll();
        }
        woke
    }

    /// Prepares every watch for the worker's sleep; returns whether any woke a fiber instead.
    pub(crate) fn before_sleep(&self) -> bool {
        let list = self.list.borrow();
        let mut woke = false;
        for (_, w) in list.iter() {
            woke |= w.before_sleep();
        }
        woke
    }
}
