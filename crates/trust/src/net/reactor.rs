//! The readiness reactor: one `mio::Poll` per worker, a cross-thread unparker, and the slab of
//! registrations whose readiness it tracks.
//!
//! # Protocol
//!
//! **Ownership.** A [`Reactor`] owns an epoll instance (`mio::Poll`) and is polled only by the
//! thread that owns it: its worker, or the `trust-net` thread. The rest of it is shared
//! through an `Arc`: a clone of the `mio::Registry` (`epoll_ctl` is thread-safe, so sockets
//! register and deregister from any thread, even after the reactor is dropped), the eventfd
//! waker, the unpark state, and a mutex-protected slab of *slots*, one per registered socket.
//! A slot is shared by `Arc` between the slab and its socket.
//!
//! **Readiness.** Sources are registered edge-triggered for readable and writable. A slot's
//! readiness word holds the bits readable, writable, read-closed, write-closed, error and
//! shutdown, plus a tick. [`Reactor::poll`] ORs each event's bits in and increments the tick
//! (one CAS), then takes the wakers of the directions concerned (under the slot's mutex) and
//! wakes them after releasing it. An operation runs its syscall when a bit of its direction is
//! set; on `WouldBlock` it clears the bits it acted on *only if the tick is unchanged*, so an
//! edge that arrived between the syscall and the clear survives; closed and shutdown bits are
//! never cleared. `Interrupted` retries at once. A new slot starts readable and writable, so
//! the first operation tries its syscall before waiting.
//!
//! **No lost wake-ups.** A waiting operation stores its waker (deduplicated with `will_wake`)
//! under the slot's mutex and loads readiness again before unlocking. The reactor sets bits,
//! then locks that mutex to take the wakers. If the reactor locks second, it finds the waker;
//! if it locks first, its bit-setting happened before its unlock, which the waiter's lock
//! acquires, so the waiter's second load sees the bits. Each direction keeps a list of wakers
//! (at most 64; a 65th wakes and drops the older ones, which re-register if still waiting), so
//! concurrent readers or writers are all woken; a waker of an abandoned future costs one
//! spurious wake-up.
//!
//! **Unpark.** [`Unparker::unpark`] and [`Reactor::poll`] share a state word: `AWAKE`,
//! `SLEEPING` or `NOTIFIED`. `poll` moves `AWAKE` to `SLEEPING` before `epoll_wait`; if it
//! finds `NOTIFIED` it polls without blocking instead. `unpark` swaps in `NOTIFIED` and writes
//! the eventfd only if it replaced `SLEEPING`, so a burst of unparks costs one syscall. After
//! `epoll_wait` returns, `poll` swaps `AWAKE` back (acquire-release), consuming the
//! notification and seeing everything the unparking threads published before their swap. The
//! runtime therefore publishes work first, then unparks; and after `poll` returns it checks
//! its queues before polling again. An unpark at any moment after the previous `poll` returned
//! makes the next `poll` return promptly.
//!
//! **Dropping.** A socket's drop deregisters it from epoll and removes its slot. An event for a
//! removed slot still in flight (a `trust-net` poll racing a drop on another thread) carries
//! a token whose generation no longer matches, and is ignored. Dropping a `Reactor` sets the
//! shutdown bit on every slot and wakes every waiter: operations on its sockets then fail with
//! an error instead of waiting forever, and new registrations with it are refused.
//!
//! # Integration with the runtime
//!
//! - A worker's [`Reactor`] may be created anywhere (it is `Send`) and moved to its thread,
//!   which holds the guard of [`enter`] for as long as it runs fibers and drops the reactor
//!   after its last fiber (operations still waiting then fail with a shutdown error). Only
//!   that thread polls it, and never from inside a waker that `poll` is running (nor while
//!   the scheduler state that a fiber's waker touches is borrowed).
//! - While busy, the worker loop calls `reactor.poll(Some(Duration::ZERO))` each round (or
//!   every few rounds) when [`Reactor::has_registrations`]. To sleep, after its last check for
//!   work, it parks in `reactor.poll(None)` instead of its futex when the reactor has
//!   registrations; whoever publishes work to a worker sleeping there calls
//!   [`Unparker::unpark`] after publishing (for example from the parker's slow wake path).
//! - A fiber's waker makes the fiber ready; on the worker's own thread (where the reactor
//!   runs wakers) it need not unpark anything.
//! - Blocking calls go through `fiber::wait`, which suspends the current fiber (off a
//!   worker, parks the thread) until the waker fires, then polls again; spurious wake-ups
//!   must be tolerated (a stale waker may fire once after its wait ended). Off a worker
//!   nothing else is needed: those sockets use the `trust-net` reactor.

use std::cell::RefCell;
use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::mem;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::AtomicU8;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Token};

/// Token of the `mio::Waker` behind [`Unparker`]. Registration tokens never take this value.
const WAKER_TOKEN: Token = Token(usize::MAX);
/// How many events one `poll` call collects at most; the rest wait for the next call.
const EVENTS_CAPACITY: usize = 256;
/// Wakers kept per direction of one socket before the oldest are woken and dropped.
const MAX_WAITERS: usize = 64;

// Readiness bits of a `Slot`. The bits above `TICK_SHIFT` hold the tick (see `Slot`).
const READABLE: usize = 1 << 0;
const WRITABLE: usize = 1 << 1;
const READ_CLOSED: usize = 1 << 2;
const WRITE_CLOSED: usize = 1 << 3;
const ERROR: usize = 1 << 4;
/// Set when the reactor is dropped: every later operation fails instead of waiting forever.
const SHUTDOWN: usize = 1 << 5;
/// Bits that stay set once seen: a closed direction or a dead reactor never becomes open again.
const STICKY: usize = READ_CLOSED | WRITE_CLOSED | SHUTDOWN;
const BITS: usize = (1 << TICK_SHIFT) - 1;
const TICK_SHIFT: u32 = 8;

// States of the unpark protocol (`ReactorCore::state`).
/// The owner is not blocked in (and not about to block in) `epoll_wait`.
const AWAKE: u8 = 0;
/// The owner is blocked in `epoll_wait`, or about to be: an unpark must write the eventfd.
const SLEEPING: u8 = 1;
/// Unpark was called since the owner's last `poll` returned; the next `poll` must not block.
const NOTIFIED: u8 = 2;

/// Registration indices use the low half of a token, generations the high half.
const INDEX_BITS: u32 = usize::BITS / 2;
const INDEX_MASK: usize = (1 << INDEX_BITS) - 1;

/// The direction an I/O operation waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Reading or accepting.
    Read,
    /// Writing or connecting.
    Write,
}

impl Direction {
    /// The readiness bits that let an operation in this direction make progress (or fail).
    fn mask(self) -> usize {
        match self {
            Direction::Read => READABLE | READ_CLOSED | ERROR | SHUTDOWN,
            Direction::Write => WRITABLE | WRITE_CLOSED | ERROR | SHUTDOWN,
        }
    }
}

/// A readiness observation: the bits seen and the tick they were seen at, so that
/// [`Slot::clear`] clears them only if the reactor has not reported anything since.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadyEvent {
    tick: usize,
    ready: usize,
}

impl ReadyEvent {
    fn observe(word: usize, mask: usize) -> Self {
        ReadyEvent {
            tick: word >> TICK_SHIFT,
            ready: word & mask,
        }
    }

    /// The I/O source reported an error or a hang-up in this direction.
    pub(crate) fn is_closed_or_error(self) -> bool {
        self.ready & (READ_CLOSED | WRITE_CLOSED | ERROR) != 0
    }
}

/// Per-registration state shared by the reactor (which sets readiness and wakes) and the I/O
/// object (which clears readiness and waits).
///
/// `readiness` holds the readiness bits in its low byte and a tick counter above them. The
/// reactor ORs new bits in and increments the tick in one CAS; an I/O object that saw
/// `WouldBlock` clears the bits it acted on only if the tick is unchanged, so an edge that
/// arrives between its syscall and its clear is never erased.
struct Slot {
    token: Token,
    readiness: AtomicUsize,
    waiters: Mutex<Waiters>,
}

#[derive(Default)]
struct Waiters {
    read: Vec<Waker>,
    write: Vec<Waker>,
}

impl Waiters {
    fn list(&mut self, dir: Direction) -> &mut Vec<Waker> {
        match dir {
            Direction::Read => &mut self.read,
            Direction::Write => &mut self.write,
        }
    }
}

impl Slot {
    fn new(token: Token) -> Self {
        Slot {
            token,
            // A new registration is assumed ready: the first operation tries its syscall and
            // clears the bit on `WouldBlock`. This costs at most one syscall and saves a trip
            // through the reactor when data is already waiting (as on a freshly accepted socket).
            readiness: AtomicUsize::new(READABLE | WRITABLE),
            waiters: Mutex::new(Waiters::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Waiters> {
        // Nothing panics while the lock is held except allocation or a foreign `Waker::clone`;
        // the waiter lists stay consistent either way.
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ready if some bit of `dir` is set; otherwise stores the waker and returns `Pending`.
    ///
    /// The waker is stored *before* readiness is checked a second time. The reactor sets bits
    /// before it takes the wakers, under the same mutex: either it finds this waker, or the
    /// second check sees its bits.
    fn poll_ready(&self, cx: &mut Context<'_>, dir: Direction) -> Poll<ReadyEvent> {
        let mask = dir.mask();
        let word = self.readiness.load(Acquire);
        if word & mask != 0 {
            return Poll::Ready(ReadyEvent::observe(word, mask));
        }
        let mut evicted = Vec::new();
        let result = {
            let mut waiters = self.lock();
            let list = waiters.list(dir);
            if !list.iter().any(|w| w.will_wake(cx.waker())) {
                if list.len() >= MAX_WAITERS {
                    // Bound the list: wakers of abandoned futures would otherwise pile up on a
                    // quiet socket. The evicted ones are woken, and re-register if still waiting.
                    evicted = mem::take(list);
                }
                list.push(cx.waker().clone());
            }
            // A waker left behind when this returns `Ready` costs one spurious wake-up later.
            let word = self.readiness.load(Acquire);
            if word & mask != 0 {
                Poll::Ready(ReadyEvent::observe(word, mask))
            } else {
                Poll::Pending
            }
        };
        evicted.into_iter().for_each(Waker::wake);
        result
    }

    /// Clears the bits of `event` unless the reactor reported readiness after it was observed.
    fn clear(&self, event: ReadyEvent) {
        let clear = event.ready & !STICKY;
        let mut word = self.readiness.load(Acquire);
        loop {
            if word >> TICK_SHIFT != event.tick || word & clear == 0 {
                return;
            }
            match self
                .readiness
                .compare_exchange_weak(word, word & !clear, AcqRel, Acquire)
            {
                Ok(_) => return,
                Err(actual) => word = actual,
            }
        }
    }

    /// Adds readiness bits (with a new tick) and wakes the waiters they concern.
    /// Returns whether any waker was woken.
    fn set_readiness(&self, bits: usize) -> bool {
        let mut word = self.readiness.load(Acquire);
        loop {
            let tick = (word >> TICK_SHIFT).wrapping_add(1);
            let new = (tick << TICK_SHIFT) | (word & BITS) | bits;
            match self
                .readiness
                .compare_exchange_weak(word, new, AcqRel, Acquire)
            {
                Ok(_) => break,
                Err(actual) => word = actual,
            }
        }
        let (read, write) = {
            let mut waiters = self.lock();
            let read = if bits & Direction::Read.mask() != 0 {
                mem::take(&mut waiters.read)
            } else {
                Vec::new()
            };
            let write = if bits & Direction::Write.mask() != 0 {
                mem::take(&mut waiters.write)
            } else {
                Vec::new()
            };
            (read, write)
        };
        // Woken outside the lock: a waker may run arbitrary code, even drop this source.
        let woke = !read.is_empty() || !write.is_empty();
        read.into_iter().chain(write).for_each(Waker::wake);
        woke
    }
}

fn event_bits(event: &mio::event::Event) -> usize {
    let mut bits = 0;
    if event.is_readable() {
        bits |= READABLE;
    }
    if event.is_writable() {
        bits |= WRITABLE;
    }
    if event.is_read_closed() {
        bits |= READ_CLOSED;
    }
    if event.is_write_closed() {
        bits |= WRITE_CLOSED;
    }
    if event.is_error() {
        bits |= ERROR;
    }
    bits
}

/// The registrations of one reactor, addressed by token: `index | generation << INDEX_BITS`.
/// The generation makes an event for a dropped registration miss a later one at the same index.
#[derive(Default)]
struct Slab {
    entries: Vec<Option<Arc<Slot>>>,
    free: Vec<usize>,
    generation: usize,
    len: usize,
    shut_down: bool,
}

impl Slab {
    fn insert(&mut self) -> io::Result<Arc<Slot>> {
        let index = match self.free.pop() {
            Some(index) => index,
            None if self.entries.len() < INDEX_MASK => {
                self.entries.push(None);
                self.entries.len() - 1
            }
            None => {
                return Err(io::Error::other(
                    "trust net: too many sockets registered with one reactor",
                ));
            }
        };
        self.generation = self.generation.wrapping_add(1) & (usize::MAX >> INDEX_BITS);
        let token = Token(index | (self.generation << INDEX_BITS));
        debug_assert_ne!(token, WAKER_TOKEN);
        let slot = Arc::new(Slot::new(token));
        self.entries[index] = Some(slot.clone());
        self.len += 1;
        Ok(slot)
    }

    fn get(&self, token: Token) -> Option<&Arc<Slot>> {
        match self.entries.get(token.0 & INDEX_MASK) {
            Some(Some(slot)) if slot.token == token => Some(slot),
            _ => None,
        }
    }

    fn remove(&mut self, slot: &Arc<Slot>) {
        let index = slot.token.0 & INDEX_MASK;
        if let Some(entry) = self.entries.get_mut(index)
            && entry.as_ref().is_some_and(|s| Arc::ptr_eq(s, slot))
        {
            *entry = None;
            self.free.push(index);
            self.len -= 1;
        }
    }
}

/// The part of a reactor that other threads and the I/O objects reach through an `Arc`.
struct ReactorCore {
    /// A clone of the poll's registry (a dup of the epoll fd): `epoll_ctl` is thread-safe, so
    /// sources register and deregister from any thread, even after the `Reactor` is gone.
    registry: mio::Registry,
    waker: mio::Waker,
    /// The unpark protocol: `AWAKE`, `SLEEPING` or `NOTIFIED`.
    state: AtomicU8,
    slab: Mutex<Slab>,
    /// `slab.len`, readable without the lock (written under it).
    registered: AtomicUsize,
}

impl ReactorCore {
    fn slab(&self) -> MutexGuard<'_, Slab> {
        // The slab is consistent at every point where a panic could occur (allocation).
        self.slab.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn register(self: &Arc<Self>, fd: RawFd, interest: Interest) -> io::Result<Registration> {
        // Into the slab first, so that an event arriving right after `epoll_ctl` finds the slot.
        let slot = {
            let mut slab = self.slab();
            if slab.shut_down {
                return Err(shutdown_error());
            }
            let slot = slab.insert()?;
            self.registered.store(slab.len, Relaxed);
            slot
        };
        if let Err(e) = self
            .registry
            .register(&mut SourceFd(&fd), slot.token, interest)
        {
            self.remove(&slot);
            return Err(e);
        }
        Ok(Registration {
            core: self.clone(),
            slot,
        })
    }

    fn remove(&self, slot: &Arc<Slot>) {
        let mut slab = self.slab();
        slab.remove(slot);
        self.registered.store(slab.len, Relaxed);
    }

    fn unpark(&self) {
        // Only the thread that moves the state from SLEEPING pays for the eventfd write; any
        // other caller finds NOTIFIED or AWAKE, and the owner's next `poll` will not block.
        if self.state.swap(NOTIFIED, AcqRel) == SLEEPING {
            // The eventfd write fails only if the descriptor is broken; the owner then wakes
            // at its timeout at the latest. Nothing better can be done from here.
            let _ = self.waker.wake();
        }
    }
}

/// Whether the current thread's home reactor is `core` (see [`with_home`]).
fn is_home(core: &Arc<ReactorCore>) -> bool {
    CURRENT
        .try_with(|current| match &*current.borrow() {
            Some(current) => Arc::ptr_eq(current, core),
            None => GLOBAL.get().is_some_and(|g| Arc::ptr_eq(g, core)),
        })
        .unwrap_or(false)
}

/// A readiness reactor: owned by one thread, which alone calls [`Reactor::poll`].
///
/// Each worker creates one, makes it current with [`enter`] while it runs fibers, and polls it
/// from its loop. Dropping it fails every operation still waiting on one of its sockets.
pub(crate) struct Reactor {
    poll: RefCell<mio::Poll>,
    events: RefCell<Events>,
    /// Reused buffer of `(slot, bits)` gathered under the slab lock and dispatched after it.
    ready: RefCell<Vec<(Arc<Slot>, usize)>>,
    core: Arc<ReactorCore>,
}

impl Reactor {
    /// Creates a reactor (an epoll instance and an eventfd).
    pub(crate) fn new() -> io::Result<Reactor> {
        let poll = mio::Poll::new()?;
        let registry = poll.registry().try_clone()?;
        let waker = mio::Waker::new(poll.registry(), WAKER_TOKEN)?;
        Ok(Reactor {
            poll: RefCell::new(poll),
            events: RefCell::new(Events::with_capacity(EVENTS_CAPACITY)),
            ready: RefCell::new(Vec::new()),
            core: Arc::new(ReactorCore {
                registry,
                waker,
                state: AtomicU8::new(AWAKE),
                slab: Mutex::new(Slab::default()),
                registered: AtomicUsize::new(0),
            }),
        })
    }

    /// A handle that other threads use to interrupt [`Reactor::poll`].
    pub(crate) fn unparker(&self) -> Unparker {
        Unparker {
            core: self.core.clone(),
        }
    }

    /// Waits until a registered source is ready, an [`Unparker::unpark`] arrives, or `timeout`
    /// passes (`None`: no limit; `Some(Duration::ZERO)`: do not block), then wakes the wakers of
    /// every registration that became ready. Returns whether any waker was woken.
    ///
    /// An `unpark` that happens at any time after the previous `poll` returned makes this call
    /// return without blocking (or promptly, if it is already blocked), so the caller can check
    /// its queues, then call `poll`, without losing a wake-up. Returning `Ok(false)` early is
    /// allowed (unpark, signal, timeout): callers loop.
    ///
    /// # Panics
    ///
    /// If called re-entrantly (from a waker that this call is running).
    pub(crate) fn poll(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let result = {
            let mut poll = self.poll.borrow_mut();
            let mut events = self.events.borrow_mut();
            let timeout = if timeout == Some(Duration::ZERO) {
                timeout
            } else {
                match self
                    .core
                    .state
                    .compare_exchange(AWAKE, SLEEPING, AcqRel, Acquire)
                {
                    Ok(_) => timeout,
                    // NOTIFIED: an unpark is pending, so only collect what is ready now.
                    Err(_) => Some(Duration::ZERO),
                }
            };
            let result = poll.poll(&mut events, timeout);
            // Consumes a pending notification. The acquire half pairs with the release half of
            // `unpark`'s swap: whatever the unparking thread published before is visible now.
            self.core.state.swap(AWAKE, AcqRel);
            match result {
                Ok(()) => {
                    let mut ready = self.ready.borrow_mut();
                    let slab = self.core.slab();
                    for event in events.iter() {
                        if event.token() == WAKER_TOKEN {
                            continue;
                        }
                        if let Some(slot) = slab.get(event.token()) {
                            ready.push((slot.clone(), event_bits(event)));
                        }
                    }
                    Ok(mem::take(&mut *ready))
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Vec::new()),
                Err(e) => Err(e),
            }
        };
        let mut ready = result?;
        let mut woke = false;
        for (slot, bits) in ready.drain(..) {
            woke |= slot.set_readiness(bits);
        }
        *self.ready.borrow_mut() = ready;
        Ok(woke)
    }

    /// Whether any socket is registered with this reactor. One relaxed load: cheap enough to
    /// ask every round of a worker loop, to skip `poll` on workers that do no I/O.
    ///
    /// Sockets register with a worker's reactor only on that worker's thread, so a worker that
    /// sees `false` and then sleeps elsewhere (a futex) misses no I/O; drops on other threads
    /// only ever turn `true` into `false`.
    pub(crate) fn has_registrations(&self) -> bool {
        self.core.registered.load(Relaxed) != 0
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        let slots: Vec<Arc<Slot>> = {
            let mut slab = self.core.slab();
            slab.shut_down = true;
            slab.entries.iter().flatten().cloned().collect()
        };
        for slot in slots {
            slot.set_readiness(SHUTDOWN);
        }
        // Leave the current-reactor slot if this reactor is still entered, so that sockets
        // created later on this thread bind elsewhere instead of to a dead reactor.
        let _ = CURRENT.try_with(|current| {
            let mut current = current.borrow_mut();
            if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &self.core)) {
                *current = None;
            }
        });
    }
}

impl fmt::Debug for Reactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reactor")
            .field("registrations", &self.core.slab().len)
            .finish_non_exhaustive()
    }
}

/// Wakes a thread blocked in [`Reactor::poll`], from any thread.
///
/// Calls that find an unpark already pending cost one atomic swap and no syscall.
#[derive(Clone)]
pub(crate) struct Unparker {
    core: Arc<ReactorCore>,
}

impl Unparker {
    /// Makes the reactor's current or next `poll` return promptly.
    pub(crate) fn unpark(&self) {
        self.core.unpark();
    }
}

impl fmt::Debug for Unparker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Unparker").finish_non_exhaustive()
    }
}

thread_local! {
    /// The reactor entered on this thread (a worker's), if any.
    static CURRENT: RefCell<Option<Arc<ReactorCore>>> = const { RefCell::new(None) };
}

/// The reactor of threads that are not workers, served by the `trust-net` thread.
static GLOBAL: OnceLock<Arc<ReactorCore>> = OnceLock::new();
static GLOBAL_INIT: Mutex<()> = Mutex::new(());

/// Makes `reactor` the current thread's home reactor until the guard drops.
///
/// Sockets that first do I/O on this thread while the guard lives register with `reactor`.
/// Guards nest and must be dropped in reverse order (they restore the previous reactor).
pub(crate) fn enter(reactor: &Reactor) -> EnterGuard {
    let previous = CURRENT.with(|current| current.replace(Some(reactor.core.clone())));
    EnterGuard {
        previous,
        _not_send: PhantomData,
    }
}

/// Restores the previous home reactor of this thread when dropped. Returned by [`enter`].
pub(crate) struct EnterGuard {
    previous: Option<Arc<ReactorCore>>,
    _not_send: PhantomData<*const ()>,
}

impl Drop for EnterGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        let _ = CURRENT.try_with(|current| *current.borrow_mut() = previous);
    }
}

impl fmt::Debug for EnterGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnterGuard").finish_non_exhaustive()
    }
}

/// Runs `f` with the current thread's home reactor: the entered one on a worker, otherwise the
/// process-wide one (started on first use).
fn with_home<R>(f: impl FnOnce(&Arc<ReactorCore>) -> R) -> io::Result<R> {
    let entered = CURRENT
        .try_with(|current| current.borrow().clone())
        .ok()
        .flatten();
    match entered {
        Some(core) => Ok(f(&core)),
        None => Ok(f(global()?)),
    }
}

fn global() -> io::Result<&'static Arc<ReactorCore>> {
    match GLOBAL.get() {
        Some(core) => Ok(core),
        None => start_global(),
    }
}

#[cold]
fn start_global() -> io::Result<&'static Arc<ReactorCore>> {
    let _init = GLOBAL_INIT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(core) = GLOBAL.get() {
        return Ok(core);
    }
    let reactor = Reactor::new()?;
    let core = reactor.core.clone();
    std::thread::Builder::new()
        .name("trust-net".into())
        .spawn(move || {
            loop {
                if reactor.poll(None).is_err() {
                    // epoll_wait fails only on a broken descriptor; do not spin on it.
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        })?;
    Ok(GLOBAL.get_or_init(|| core))
}

fn shutdown_error() -> io::Error {
    io::Error::other(
        "trust net: the worker that owns this socket has shut down its reactor; \
         sockets cannot outlive the runtime they were first used in",
    )
}

fn wrong_reactor_error() -> io::Error {
    io::Error::other(
        "trust net: socket used on another thread than the one it is bound to; a socket \
         binds to its thread's worker (or, off-worker, to the shared reactor) at its first \
         I/O and must stay there: create or accept it where it is used, or move it there \
         before its first read, write or accept",
    )
}

/// A source registered with one reactor.
struct Registration {
    core: Arc<ReactorCore>,
    slot: Arc<Slot>,
}

impl Registration {
    fn deregister(&self, fd: RawFd) {
        // May fail if the fd was closed behind our back; the slot goes away regardless.
        let _ = self.core.registry.deregister(&mut SourceFd(&fd));
        self.core.remove(&self.slot);
    }
}

/// An I/O source that binds to its home reactor at first use and deregisters when dropped.
pub(crate) struct Registered<S: AsRawFd> {
    io: S,
    interest: Interest,
    registration: OnceLock<Registration>,
}

impl<S: AsRawFd> Registered<S> {
    /// Wraps a non-blocking source; it registers at its first operation.
    pub(crate) fn new(io: S, interest: Interest) -> Self {
        Registered {
            io,
            interest,
            registration: OnceLock::new(),
        }
    }

    /// The wrapped source.
    pub(crate) fn get_ref(&self) -> &S {
        &self.io
    }

    /// Registers now (if not yet registered) with the current thread's home reactor.
    pub(crate) fn bind(&self) -> io::Result<()> {
        self.registration().map(drop)
    }

    fn registration(&self) -> io::Result<&Registration> {
        match self.registration.get() {
            Some(registration) if is_home(&registration.core) => Ok(registration),
            Some(registration) if registration.slot.readiness.load(Acquire) & SHUTDOWN != 0 => {
                Err(shutdown_error())
            }
            Some(_) => Err(wrong_reactor_error()),
            None => self.bind_cold(),
        }
    }

    #[cold]
    fn bind_cold(&self) -> io::Result<&Registration> {
        let fd = self.io.as_raw_fd();
        match with_home(|home| home.register(fd, self.interest))? {
            Ok(ours) => {
                if let Err(ours) = self.registration.set(ours) {
                    // Another thread bound it first (the source was shared before first use).
                    ours.deregister(fd);
                }
            }
            // The same race, lost at `epoll_ctl` (both threads have the same home).
            Err(e)
                if e.kind() == io::ErrorKind::AlreadyExists
                    && self.registration.get().is_some() => {}
            Err(e) => return Err(e),
        }
        self.registration()
    }

    /// Waits until the source may be ready in `dir` (or failed, or was hung up on).
    pub(crate) fn poll_ready(
        &self,
        cx: &mut Context<'_>,
        dir: Direction,
    ) -> Poll<io::Result<ReadyEvent>> {
        let registration = match self.registration() {
            Ok(registration) => registration,
            Err(e) => return Poll::Ready(Err(e)),
        };
        match registration.slot.poll_ready(cx, dir) {
            Poll::Ready(event) if event.ready & SHUTDOWN != 0 => Poll::Ready(Err(shutdown_error())),
            Poll::Ready(event) => Poll::Ready(Ok(event)),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Forgets the readiness in `event` unless newer readiness arrived (call on `WouldBlock`).
    pub(crate) fn clear_readiness(&self, event: ReadyEvent) {
        if let Some(registration) = self.registration.get() {
            registration.slot.clear(event);
        }
    }

    /// Runs the non-blocking `op` when the source is ready in `dir`: retries on `Interrupted`,
    /// and on `WouldBlock` clears the readiness and waits for the next edge.
    pub(crate) fn poll_io<R>(
        &self,
        cx: &mut Context<'_>,
        dir: Direction,
        op: impl FnMut(&S) -> io::Result<R>,
    ) -> Poll<io::Result<R>> {
        self.poll_op(cx, dir, op, |_| false)
    }

    /// Like [`poll_io`](Registered::poll_io) for an `op` that moves up to `len` bytes: a
    /// transfer shorter than asked for means the socket is drained (or full) right now, so
    /// the readiness is cleared at once, saving the syscall that would only return
    /// `WouldBlock`. An edge that arrived since the readiness was observed survives (the tick).
    pub(crate) fn poll_transfer(
        &self,
        cx: &mut Context<'_>,
        dir: Direction,
        len: usize,
        op: impl FnMut(&S) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        self.poll_op(cx, dir, op, |&n| n > 0 && n < len)
    }

    /// [`poll_io`](Registered::poll_io), also clearing the readiness after a success for
    /// which `drained` holds.
    fn poll_op<R>(
        &self,
        cx: &mut Context<'_>,
        dir: Direction,
        mut op: impl FnMut(&S) -> io::Result<R>,
        drained: impl Fn(&R) -> bool,
    ) -> Poll<io::Result<R>> {
        loop {
            let event = match self.poll_ready(cx, dir) {
                Poll::Ready(Ok(event)) => event,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            match op(&self.io) {
                Ok(value) => {
                    if drained(&value) {
                        self.clear_readiness(event);
                    }
                    return Poll::Ready(Ok(value));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.clear_readiness(event),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl<S: AsRawFd> Drop for Registered<S> {
    fn drop(&mut self) {
        if let Some(registration) = self.registration.take() {
            registration.deregister(self.io.as_raw_fd());
        }
    }
}

impl<S: AsRawFd + fmt::Debug> fmt::Debug for Registered<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registered")
            .field("io", &self.io)
            .field("bound", &self.registration.get().is_some())
            .finish()
    }
}
