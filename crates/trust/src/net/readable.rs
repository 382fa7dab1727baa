//! Waiting for a descriptor that is not read through `trust` (an event descriptor a library
//! hands out) to become readable, suspending only the calling fiber.

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::task::{Context, Poll};

use mio::Interest;

use super::reactor::{Direction, Registered};
use crate::fiber;

/// A descriptor whose readability a fiber can wait for, in the worker's reactor, when
/// something else does the reading: a library's event descriptor (UCX's
/// `ucp_worker_get_efd`, an `eventfd` another library signals) that says "call my progress
/// function", not "read me".
///
/// The reactor reports a descriptor's readiness edge by edge: [`wait`](Readable::wait)
/// returns once per edge reported since the previous call. The caller arms whatever
/// produces the next edge (UCX's `ucp_worker_arm`) before waiting again: an edge that comes
/// between the arming and the wait is kept, not lost. It binds to a reactor at its first
/// wait, like the sockets of this module, and must be waited on there.
///
/// It owns its descriptor: pass a duplicate (`OwnedFd::try_clone`, `dup`) of one the
/// library keeps, so that the registration ends with this value whatever the library does.
///
/// # Examples
///
/// ```
/// use std::io::Write;
/// use std::os::fd::OwnedFd;
/// use trust::net::Readable;
///
/// let (mut tx, rx) = std::os::unix::net::UnixStream::pair()?;
/// let readable = Readable::new(OwnedFd::from(rx.try_clone()?))?;
/// tx.write_all(b"!")?;
/// readable.wait()?; // returns: a byte is waiting, and nobody read it
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Readable {
    inner: Registered<Descriptor>,
}

/// An owned descriptor, as the reactor's registration wants it.
struct Descriptor(OwnedFd);

impl AsRawFd for Descriptor {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl Readable {
    /// Takes `fd` to wait on. Its file status flags are left alone: nothing here reads it.
    pub fn new(fd: OwnedFd) -> io::Result<Readable> {
        Ok(Readable {
            inner: Registered::new(Descriptor(fd), Interest::READABLE),
        })
    }

    /// Waits (suspending only this fiber) until the reactor reports the descriptor readable
    /// (or hung up, or failed) since the previous wait returned.
    pub fn wait(&self) -> io::Result<()> {
        fiber::wait(poll_fn(|cx| self.poll_wait(cx)))
    }

    /// [`wait`](Readable::wait) as a poll: `Ready` once per reported edge.
    pub fn poll_wait(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.inner.poll_ready(cx, Direction::Read) {
            Poll::Ready(Ok(event)) => {
                // This edge is taken: the next wait waits for a newer one.
                self.inner.clear_readiness(event);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl fmt::Debug for Readable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Readable")
            .field("fd", &self.inner.get_ref().as_raw_fd())
            .finish()
    }
}
