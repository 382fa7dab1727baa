//! The shared-memory transport: ranks on one host exchange a link's bytes through two rings
//! in a mapping both processes share.
//!
//! A link's mapping (see `mapping`) holds ring 0, which the dialer writes and the acceptor
//! reads, and ring 1 the other way. The link's writer fiber copies each batch of frames into
//! its outgoing ring and publishes it with one release store; the reader fiber copies what
//! was published into its own buffer and decodes it there, as it decodes what a socket read
//! (see `ring` for the protocol and why nothing read from the mapping is trusted).
//!
//! # Waiting
//! A reader that finds its ring empty spins first, yielding to the worker's other fibers,
//! for `GSM_SPIN` (the same spin-then-block as the TCP reactor's: an answer that comes within
//! it costs no system call at either end); then it announces that it sleeps and waits for its
//! *doorbell*. A writer that finds no room does the same. The doorbell is a byte on the
//! link's Unix socket (the one the setup passed the mapping over), sent by the other side
//! only when it sees the sleeper's flag, so a busy link rings no bells; a fiber of its own
//! ([`ShmChannel::serve`]) waits on that socket in the worker's reactor and wakes both the
//! reader and the writer, each of which looks again (a wake-up that was not for it costs a
//! look). Idle links therefore cost nothing: the worker sleeps in its reactor with everything
//! else it waits for.
//!
//! Why a socket and not a futex on a word of the mapping: a worker sleeps in one place, its
//! reactor's `epoll_wait`, which also hears its TCP links, its other sockets and work from
//! its own process; a futex cannot be waited on there. A byte on a socket costs a system call
//! like `FUTEX_WAKE`, and is only sent when the peer sleeps.
//!
//! # Death
//! When the peer exits or is killed, the kernel closes its end of the Unix socket: the serving
//! fiber reads the end at once and the reader, once it has read what the peer published
//! before, reports the link closed, as a TCP link would. A peer that stops without exiting
//! (`SIGSTOP`, a hang) stops beating the heartbeat counter in its outgoing ring, which the
//! watchdog reads: after `GSM_PEER_TIMEOUT` it is lost, as on TCP.

pub(crate) mod mapping;
pub(crate) mod ring;
pub(crate) mod setup;

use std::cell::{Cell, RefCell};
use std::io::{self, Write as _};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use super::{ChannelError, Probe, Watched};
use mapping::{Mapping, RingArea};
use ring::{Area, Consumer, Corrupt, Producer};

/// A shared-memory link set up by bootstrap, not yet bound to its worker.
#[derive(Debug)]
pub(crate) struct NewShm {
    map: Arc<Mapping>,
    socket: UnixStream,
    /// The dialer writes ring 0 and reads ring 1; the acceptor the other way.
    dialer: bool,
}

impl NewShm {
    /// Maps the link's `file` (created by the dialer, checked by the acceptor); the descriptor
    /// may be closed afterwards.
    pub(crate) fn new(file: &OwnedFd, socket: UnixStream, dialer: bool) -> io::Result<NewShm> {
        Ok(NewShm {
            map: Arc::new(Mapping::map(file)?),
            socket,
            dialer,
        })
    }

    pub(super) fn open(self, probe: &Arc<Probe>, spin: Duration) -> ShmChannel {
        let (out, inc) = if self.dialer { (0, 1) } else { (1, 0) };
        let (outgoing, incoming) = (self.map.ring(out), self.map.ring(inc));
        probe.set(Watched::SharedMemory(Watch {
            incoming: incoming.clone(),
            outgoing: outgoing.clone(),
        }));
        let bell = self
            .socket
            .try_clone()
            .and_then(|bell| bell.set_nonblocking(true).map(|()| bell))
            .expect("a Unix socket duplicates");
        let doorbell =
            trust::net::UnixStream::from_std(self.socket).expect("a Unix socket registers");
        ShmChannel {
            producer: RefCell::new(Producer::new(outgoing)),
            consumer: RefCell::new(Consumer::new(incoming)),
            doorbell,
            bell,
            reader: Wake::default(),
            writer: Wake::default(),
            closed: Cell::new(false),
            spin,
        }
    }
}

/// The watchdog's view of a shared-memory link.
#[derive(Debug)]
pub(crate) struct Watch {
    incoming: RingArea,
    outgoing: RingArea,
}

impl Watch {
    pub(super) fn unread(&self) -> bool {
        self.incoming.control().unread()
    }

    pub(super) fn peer_heartbeat(&self) -> u64 {
        self.incoming.control().heartbeat()
    }

    pub(super) fn beat(&self) {
        self.outgoing.control().beat()
    }
}

/// A fiber of this worker waiting for a doorbell, and whether one rang since it last looked.
#[derive(Debug, Default)]
struct Wake {
    rung: Cell<bool>,
    waiter: RefCell<Option<Waker>>,
}

impl Wake {
    fn ring(&self) {
        self.rung.set(true);
        if let Some(waker) = self.waiter.take() {
            waker.wake();
        }
    }

    /// Forgets earlier rings: called before announcing a sleep, after which only new rings
    /// matter.
    fn clear(&self) {
        self.rung.set(false);
    }

    fn wait(&self) {
        trust::block_on(std::future::poll_fn(|cx| {
            if self.rung.replace(false) {
                return Poll::Ready(());
            }
            *self.waiter.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        }));
    }
}

/// One shared-memory link, on its worker.
#[derive(Debug)]
pub(crate) struct ShmChannel {
    producer: RefCell<Producer<RingArea>>,
    consumer: RefCell<Consumer<RingArea>>,
    /// The Unix socket, in the worker's reactor: the peer's doorbells and its end.
    doorbell: trust::net::UnixStream,
    /// The same socket, non-blocking, for ringing the peer's doorbell.
    bell: UnixStream,
    reader: Wake,
    writer: Wake,
    /// The Unix socket ended: the peer closed the link or died.
    closed: Cell<bool>,
    spin: Duration,
}

fn corrupt(e: Corrupt) -> ChannelError {
    ChannelError::Corrupt(e.to_string())
}

impl ShmChannel {
    /// Rings the peer's doorbell. A full socket means doorbells are already waiting for the
    /// peer, which wake it as well as this one would; a closed one is the reader's to find.
    fn ring_bell(&self) {
        let _ = (&self.bell).write(&[1]);
    }

    /// Spins (yielding) until `until`, then returns `false`: time to announce a sleep.
    fn spin(&self, until: &mut Option<Instant>) -> bool {
        let until = *until.get_or_insert_with(|| Instant::now() + self.spin);
        if Instant::now() < until {
            trust::yield_now();
            return true;
        }
        false
    }

    pub(super) fn read(&self, buf: &mut [u8]) -> Result<usize, ChannelError> {
        let mut spin_until = None;
        loop {
            let moved = self.consumer.borrow_mut().pop(buf).map_err(corrupt)?;
            if moved.wake {
                self.ring_bell();
            }
            if moved.bytes > 0 {
                return Ok(moved.bytes);
            }
            // Set only while this fiber was suspended, so the pop above saw everything the
            // peer published before it closed.
            if self.closed.get() {
                return Ok(0);
            }
            if self.spin(&mut spin_until) {
                continue;
            }
            self.reader.clear();
            if !self
                .consumer
                .borrow_mut()
                .prepare_sleep()
                .map_err(corrupt)?
            {
                self.reader.wait();
            }
        }
    }

    pub(super) fn write_all(&self, mut bytes: &[u8]) -> Result<(), ChannelError> {
        let mut spin_until = None;
        while !bytes.is_empty() {
            if self.closed.get() {
                return Err(ChannelError::Io(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the peer closed the link",
                )));
            }
            let moved = self.producer.borrow_mut().push(bytes).map_err(corrupt)?;
            if moved.wake {
                self.ring_bell();
            }
            if moved.bytes > 0 {
                bytes = &bytes[moved.bytes..];
                spin_until = None;
                continue;
            }
            if self.spin(&mut spin_until) {
                continue;
            }
            self.writer.clear();
            if !self.producer.borrow_mut().prepare_wait().map_err(corrupt)? {
                self.writer.wait();
            }
        }
        Ok(())
    }

    /// Hears the peer's doorbells until the Unix socket ends; returns why it ended.
    pub(super) fn serve(&self) -> String {
        let mut buf = [0u8; 64];
        let why = loop {
            match self.doorbell.read(&mut buf) {
                Ok(0) => break "connection closed".to_string(),
                Ok(_) => {
                    self.reader.ring();
                    self.writer.ring();
                }
                Err(e) => break format!("its Unix socket failed: {e}"),
            }
        };
        self.closed.set(true);
        self.reader.ring();
        self.writer.ring();
        why
    }

    /// Test hook: publishes a position past the ring's capacity, as a broken peer would, and
    /// rings the peer.
    #[cfg(feature = "fuzzing")]
    pub(super) fn corrupt(&self) {
        self.producer.borrow_mut().scribble();
        self.ring_bell();
    }
}
