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
//! A reader that finds its ring empty, or a writer that finds no room, blocks; the channel's
//! rings are a [`trust::net::Watch`] of the worker, which looks at them every round of its
//! loop and at every turn of its idle spin (`GSM_SPIN`, the same spin-then-block as for its
//! sockets: an answer that comes within it costs no system call at either end), and wakes the
//! fiber when bytes or room appear. The spin is the worker's, once, however many fibers wait:
//! a fiber spinning by itself would add its spin to the worker's, and would hold the core
//! from the worker's other fibers, which may be the very ones about to send the request it
//! waits for an answer to.
//!
//! Before the worker blocks, the watch announces in the ring that this side sleeps; the other
//! side, finding the flag after publishing, rings the *doorbell*: a byte on the link's Unix
//! socket (the one the setup passed the mapping over), so a busy link rings no bells. A fiber
//! of the link ([`ShmChannel::serve`]) waits on that socket in the worker's reactor and wakes
//! the reader and the writer, each of which looks again (a wake-up that was not for it costs
//! a look). Idle links therefore cost nothing: the worker sleeps in its reactor with
//! everything else it waits for.
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
use std::rc::Rc;
use std::sync::Arc;

use super::{ChannelError, Probe, Wake, Watched};
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

    /// Binds the link to the worker this runs on.
    pub(super) fn open(self, probe: &Arc<Probe>) -> ShmChannel {
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
        let rings = Rc::new(Rings {
            producer: RefCell::new(Producer::new(outgoing)),
            consumer: RefCell::new(Consumer::new(incoming)),
            reader: Wake::default(),
            writer: Wake::default(),
        });
        ShmChannel {
            _watching: trust::net::watch(rings.clone()),
            rings,
            doorbell,
            bell,
            closed: Cell::new(false),
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

/// A link's two rings and the fibers waiting on them: the worker's watch (module docs).
#[derive(Debug)]
struct Rings {
    producer: RefCell<Producer<RingArea>>,
    consumer: RefCell<Consumer<RingArea>>,
    reader: Wake,
    writer: Wake,
}

impl trust::net::Watch for Rings {
    fn poll(&self) -> bool {
        // Loads only: whatever they suggest, the woken fiber checks for itself. A broken
        // position wakes it too, to find the break.
        let mut woke = false;
        if self.reader.waited_for() && self.consumer.borrow_mut().readable() {
            self.reader.ring();
            woke = true;
        }
        if self.writer.waited_for() && self.producer.borrow_mut().writable() {
            self.writer.ring();
            woke = true;
        }
        woke
    }

    fn before_sleep(&self) -> bool {
        let mut woke = false;
        if self.reader.waited_for() && self.consumer.borrow_mut().prepare_sleep() != Ok(false) {
            self.reader.ring();
            woke = true;
        }
        if self.writer.waited_for() && self.producer.borrow_mut().prepare_wait() != Ok(false) {
            self.writer.ring();
            woke = true;
        }
        woke
    }
}

/// One shared-memory link, on its worker.
#[derive(Debug)]
pub(crate) struct ShmChannel {
    rings: Rc<Rings>,
    /// Keeps `rings` watched by the worker while the link is open.
    _watching: trust::net::Watching,
    /// The Unix socket, in the worker's reactor: the peer's doorbells and its end.
    doorbell: trust::net::UnixStream,
    /// The same socket, non-blocking, for ringing the peer's doorbell.
    bell: UnixStream,
    /// The Unix socket ended: the peer closed the link or died.
    closed: Cell<bool>,
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

    pub(super) fn read(&self, buf: &mut [u8]) -> Result<usize, ChannelError> {
        loop {
            let moved = self.rings.consumer.borrow_mut().pop(buf).map_err(corrupt)?;
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
            self.rings.reader.wait();
        }
    }

    pub(super) fn write_all(&self, mut bytes: &[u8]) -> Result<(), ChannelError> {
        while !bytes.is_empty() {
            if self.closed.get() {
                return Err(ChannelError::Io(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the peer closed the link",
                )));
            }
            let moved = self
                .rings
                .producer
                .borrow_mut()
                .push(bytes)
                .map_err(corrupt)?;
            if moved.wake {
                self.ring_bell();
            }
            if moved.bytes > 0 {
                bytes = &bytes[moved.bytes..];
                continue;
            }
            self.rings.writer.wait();
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
                    self.rings.reader.ring();
                    self.rings.writer.ring();
                }
                Err(e) => break format!("its Unix socket failed: {e}"),
            }
        };
        self.closed.set(true);
        self.rings.reader.ring();
        self.rings.writer.ring();
        why
    }

    /// Test hook: publishes a position past the ring's capacity, as a broken peer would, and
    /// rings the peer.
    #[cfg(feature = "fuzzing")]
    pub(super) fn corrupt(&self) {
        self.rings.producer.borrow_mut().scribble();
        self.ring_bell();
    }
}
