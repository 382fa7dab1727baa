//! A Unix stream socket whose blocking calls suspend only the calling fiber.

use std::fmt;
use std::future::poll_fn;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::task::{Context, Poll};

use mio::Interest;

use super::reactor::{Direction, Registered};
use crate::fiber;

/// A connected Unix stream socket. Like [`TcpStream`](super::TcpStream), a `read` or `write`
/// that would block suspends only the calling fiber (off a worker, the calling thread); the
/// stream binds to the reactor of the thread of its first I/O (see the
/// [module docs](crate::net)).
///
/// Made from a connected `std` socket, so that its setup (connecting, passing descriptors,
/// checking peer credentials) stays with the `std` and `libc` calls made for it.
///
/// # Examples
///
/// ```
/// use trust::net::UnixStream;
///
/// let (a, b) = std::os::unix::net::UnixStream::pair()?;
/// let (a, b) = (UnixStream::from_std(a)?, UnixStream::from_std(b)?);
/// a.write_all(b"ring")?;
/// let mut buf = [0; 4];
/// std::io::Read::read_exact(&mut &b, &mut buf)?;
/// assert_eq!(&buf, b"ring");
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct UnixStream {
    inner: Registered<mio::net::UnixStream>,
}

impl UnixStream {
    /// Wraps a connected stream made elsewhere, switching it to non-blocking mode (which a
    /// descriptor duplicated from it shares).
    ///
    /// # Examples
    ///
    /// ```
    /// let (a, _b) = std::os::unix::net::UnixStream::pair()?;
    /// let a = trust::net::UnixStream::from_std(a)?;
    /// assert_eq!(a.write(b"x")?, 1);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn from_std(stream: std::os::unix::net::UnixStream) -> io::Result<UnixStream> {
        stream.set_nonblocking(true)?;
        Ok(UnixStream {
            inner: Registered::new(
                mio::net::UnixStream::from_std(stream),
                Interest::READABLE | Interest::WRITABLE,
            ),
        })
    }

    /// Reads into `buf`, waiting (suspending only this fiber) until at least one byte is
    /// available. Returns 0 at end of stream (the peer closed, or exited) or if `buf` is empty.
    ///
    /// # Examples
    ///
    /// ```
    /// let (a, b) = std::os::unix::net::UnixStream::pair()?;
    /// let b = trust::net::UnixStream::from_std(b)?;
    /// drop(a);
    /// assert_eq!(b.read(&mut [0; 8])?, 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        fiber::wait(poll_fn(|cx| self.poll_read(cx, buf)))
    }

    /// Reads into `buf` if data (or end of stream, or an error) is waiting; otherwise
    /// arranges for `cx`'s waker to be woken when it may be, and returns `Pending`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::task::{Context, Waker};
    ///
    /// let (_a, b) = std::os::unix::net::UnixStream::pair()?;
    /// let b = trust::net::UnixStream::from_std(b)?;
    /// let mut cx = Context::from_waker(Waker::noop());
    /// assert!(b.poll_read(&mut cx, &mut [0; 8]).is_pending());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn poll_read(&self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let len = buf.len();
        self.inner
            .poll_transfer(cx, Direction::Read, len, |mut stream| stream.read(buf))
    }

    /// Writes some of `buf`, waiting (suspending only this fiber) until the socket can take
    /// at least one byte. Writing to a socket the peer closed fails; it never raises `SIGPIPE`
    /// (the standard library ignores that signal in Rust programs).
    ///
    /// # Examples
    ///
    /// ```
    /// let (a, _b) = std::os::unix::net::UnixStream::pair()?;
    /// let a = trust::net::UnixStream::from_std(a)?;
    /// assert_eq!(a.write(b"abc")?, 3);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        fiber::wait(poll_fn(|cx| self.poll_write(cx, buf)))
    }

    /// Writes some of `buf` if the socket can take it; otherwise arranges for `cx`'s waker to
    /// be woken when it may, and returns `Pending`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::task::{Context, Poll, Waker};
    ///
    /// let (a, _b) = std::os::unix::net::UnixStream::pair()?;
    /// let a = trust::net::UnixStream::from_std(a)?;
    /// let mut cx = Context::from_waker(Waker::noop());
    /// assert!(matches!(a.poll_write(&mut cx, b"abc"), Poll::Ready(Ok(3))));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn poll_write(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        self.inner
            .poll_transfer(cx, Direction::Write, buf.len(), |mut stream| {
                stream.write(buf)
            })
    }

    /// Writes all of `buf`, suspending only this fiber whenever the socket is full.
    ///
    /// # Examples
    ///
    /// ```
    /// let (a, b) = std::os::unix::net::UnixStream::pair()?;
    /// let a = trust::net::UnixStream::from_std(a)?;
    /// a.write_all(&[7; 1000])?;
    /// drop(a);
    /// let mut all = Vec::new();
    /// std::io::Read::read_to_end(&mut &b, &mut all)?;
    /// assert_eq!(all, [7; 1000]);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn write_all(&self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self.write(buf)? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => buf = &buf[n..],
            }
        }
        Ok(())
    }
}

impl AsFd for UnixStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor is owned by `self.inner` and stays open while `self` is
        // borrowed.
        unsafe { BorrowedFd::borrow_raw(self.inner.get_ref().as_raw_fd()) }
    }
}

impl AsRawFd for UnixStream {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.get_ref().as_raw_fd()
    }
}

impl Read for &UnixStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        UnixStream::read(self, buf)
    }
}

impl Write for &UnixStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        UnixStream::write(self, buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        UnixStream::write_all(self, buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl fmt::Debug for UnixStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UnixStream")
            .field("inner", &self.inner)
            .finish()
    }
}
