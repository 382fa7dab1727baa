//! TCP listener and stream whose blocking calls suspend only the calling fiber.

use std::fmt;
use std::future::poll_fn;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::task::{Context, Poll};

use mio::Interest;

use super::reactor::{Direction, Registered};
use crate::fiber;

/// A TCP socket server, listening for connections.
///
/// [`accept`](TcpListener::accept) suspends only the calling fiber (off a worker, the calling
/// thread). The listener binds to the reactor of the thread of its first `accept`; see the
/// [module docs](crate::net) for where it may be used after that.
///
/// # Examples
///
/// ```
/// use std::io::{Read, Write};
/// use std::net::Shutdown;
/// use trust::net::{TcpListener, TcpStream};
///
/// let listener = TcpListener::bind("127.0.0.1:0")?;
/// let addr = listener.local_addr()?;
/// let client = std::thread::spawn(move || -> std::io::Result<Vec<u8>> {
///     let stream = TcpStream::connect(addr)?;
///     stream.write_all(b"ping")?;
///     stream.shutdown(Shutdown::Write)?;
///     let mut reply = Vec::new();
///     (&stream).read_to_end(&mut reply)?;
///     Ok(reply)
/// });
///
/// let (stream, _peer) = listener.accept()?;
/// let mut request = Vec::new();
/// (&stream).read_to_end(&mut request)?;
/// stream.write_all(&request)?;
/// drop(stream);
/// assert_eq!(client.join().unwrap()?, b"ping");
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct TcpListener {
    inner: Registered<mio::net::TcpListener>,
}

impl TcpListener {
    /// Creates a listener bound to `addr` (the first of its addresses that binds), with
    /// `SO_REUSEADDR` set and a backlog of 1024.
    ///
    /// Name resolution, if `addr` needs it, blocks the calling thread.
    ///
    /// # Examples
    ///
    /// ```
    /// use trust::net::TcpListener;
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// assert!(listener.local_addr()?.ip().is_loopback());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn bind<A: ToSocketAddrs>(addr: A) -> io::Result<TcpListener> {
        each_addr(addr, mio::net::TcpListener::bind).map(TcpListener::from_mio)
    }

    /// Wraps a listener made elsewhere (for example with `socket2`, for options `bind` does
    /// not set), switching it to non-blocking mode.
    ///
    /// # Examples
    ///
    /// ```
    /// use trust::net::TcpListener;
    ///
    /// let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    /// let addr = std_listener.local_addr()?;
    /// let listener = TcpListener::from_std(std_listener)?;
    /// assert_eq!(listener.local_addr()?, addr);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn from_std(listener: std::net::TcpListener) -> io::Result<TcpListener> {
        listener.set_nonblocking(true)?;
        Ok(TcpListener::from_mio(mio::net::TcpListener::from_std(
            listener,
        )))
    }

    fn from_mio(listener: mio::net::TcpListener) -> TcpListener {
        TcpListener {
            inner: Registered::new(listener, Interest::READABLE),
        }
    }

    /// Waits for a connection and returns it with the peer's address. Suspends only the
    /// calling fiber.
    ///
    /// The new stream is not bound to any reactor yet: it may be handed to a fiber on another
    /// worker before its first read or write.
    ///
    /// # Examples
    ///
    /// ```
    /// use trust::net::{TcpListener, TcpStream};
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let client = TcpStream::connect(listener.local_addr()?)?;
    /// let (server, peer) = listener.accept()?;
    /// assert_eq!(peer, client.local_addr()?);
    /// assert_eq!(server.peer_addr()?, client.local_addr()?);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        block_on_io(|cx| self.poll_accept(cx))
    }

    /// Accepts a connection if one is waiting; otherwise arranges for `cx`'s waker to be woken
    /// when one may be, and returns `Pending`.
    ///
    /// Connections that the peer aborted before they were accepted are skipped.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::task::{Context, Waker};
    /// use trust::net::{TcpListener, TcpStream};
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let mut cx = Context::from_waker(Waker::noop());
    /// assert!(listener.poll_accept(&mut cx).is_pending());
    ///
    /// let _client = TcpStream::connect(listener.local_addr()?)?;
    /// let (_server, _peer) = listener.accept()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(TcpStream, SocketAddr)>> {
        self.inner
            .poll_io(cx, Direction::Read, |listener| {
                loop {
                    match listener.accept() {
                        // The peer gave up while the connection waited in the backlog.
                        Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                        result => return result,
                    }
                }
            })
            .map_ok(|(stream, peer)| (TcpStream::from_mio(stream), peer))
    }

    /// The address this listener is bound to.
    ///
    /// # Examples
    ///
    /// ```
    /// use trust::net::TcpListener;
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// assert_ne!(listener.local_addr()?.port(), 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.get_ref().local_addr()
    }
}

impl fmt::Debug for TcpListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpListener")
            .field("inner", &self.inner)
            .finish()
    }
}

/// A TCP connection whose blocking calls suspend only the calling fiber.
///
/// Methods take `&self`, and `Read` and `Write` are implemented for `&TcpStream` too, so one
/// fiber may read while another writes (several readers or writers at once are allowed but
/// interleave unpredictably, as with `std::net::TcpStream`). The stream binds to a reactor at
/// its first I/O; see the [module docs](crate::net).
///
/// Dropping the stream closes the connection (sending a reset if unread data remains).
///
/// # Examples
///
/// ```
/// use std::io::Read;
/// use trust::net::{TcpListener, TcpStream};
///
/// let listener = TcpListener::bind("127.0.0.1:0")?;
/// let client = TcpStream::connect(listener.local_addr()?)?;
/// let (server, _) = listener.accept()?;
///
/// client.write_all(b"hello")?;
/// let mut buf = [0; 5];
/// (&server).read_exact(&mut buf)?;
/// assert_eq!(&buf, b"hello");
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct TcpStream {
    inner: Registered<mio::net::TcpStream>,
}

impl TcpStream {
    /// Opens a connection to `addr`, trying each of its addresses in turn. Suspends only the
    /// calling fiber while the handshake runs.
    ///
    /// The stream is bound to the calling thread's reactor (it waited there for the
    /// handshake). Name resolution, if `addr` needs it, blocks the calling thread.
    ///
    /// # Examples
    ///
    /// ```
    /// use trust::net::{TcpListener, TcpStream};
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let stream = TcpStream::connect(listener.local_addr()?)?;
    /// assert_eq!(stream.peer_addr()?, listener.local_addr()?);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn connect<A: ToSocketAddrs>(addr: A) -> io::Result<TcpStream> {
        each_addr(addr, |addr| {
            let stream = TcpStream::start_connect(addr)?;
            block_on_io(|cx| stream.poll_connect(cx))?;
            Ok(stream)
        })
    }

    /// Starts a non-blocking connect and binds the socket to the current thread's reactor.
    /// Complete it with [`poll_connect`](TcpStream::poll_connect).
    pub(crate) fn start_connect(addr: SocketAddr) -> io::Result<TcpStream> {
        let stream = TcpStream::from_mio(mio::net::TcpStream::connect(addr)?);
        stream.inner.bind()?;
        Ok(stream)
    }

    /// Ready once a connect begun by `start_connect` has succeeded or failed.
    pub(crate) fn poll_connect(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let event = match self.inner.poll_ready(cx, Direction::Write) {
                Poll::Ready(Ok(event)) => event,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            let stream = self.inner.get_ref();
            if let Some(e) = stream.take_error()? {
                return Poll::Ready(Err(e));
            }
            match stream.peer_addr() {
                Ok(_) => return Poll::Ready(Ok(())),
                // Hung up without a pending error: report it rather than wait for an edge
                // that will not come.
                Err(e) if e.kind() == io::ErrorKind::NotConnected && event.is_closed_or_error() => {
                    return Poll::Ready(Err(e));
                }
                // Still connecting (the readiness was assumed or spurious).
                Err(e) if e.kind() == io::ErrorKind::NotConnected => {
                    self.inner.clear_readiness(event)
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Wraps a connected stream made elsewhere, switching it to non-blocking mode.
    ///
    /// # Examples
    ///
    /// ```
    /// use trust::net::{TcpListener, TcpStream};
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let std_stream = std::net::TcpStream::connect(listener.local_addr()?)?;
    /// let stream = TcpStream::from_std(std_stream)?;
    /// stream.write_all(b"x")?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn from_std(stream: std::net::TcpStream) -> io::Result<TcpStream> {
        stream.set_nonblocking(true)?;
        Ok(TcpStream::from_mio(mio::net::TcpStream::from_std(stream)))
    }

    fn from_mio(stream: mio::net::TcpStream) -> TcpStream {
        TcpStream {
            inner: Registered::new(stream, Interest::READABLE | Interest::WRITABLE),
        }
    }

    /// Reads into `buf`, waiting (suspending only this fiber) until at least one byte is
    /// available. Returns 0 at end of stream (the peer shut down its writing side or closed)
    /// or if `buf` is empty; a reset connection is an error (`ConnectionReset`).
    ///
    /// # Examples
    ///
    /// ```
    /// use trust::net::{TcpListener, TcpStream};
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let client = TcpStream::connect(listener.local_addr()?)?;
    /// let (server, _) = listener.accept()?;
    /// client.write_all(b"abc")?;
    /// drop(client);
    ///
    /// let mut received = Vec::new();
    /// let mut buf = [0; 2];
    /// loop {
    ///     match server.read(&mut buf)? {
    ///         0 => break,
    ///         n => received.extend_from_slice(&buf[..n]),
    ///     }
    /// }
    /// assert_eq!(received, b"abc");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        block_on_io(|cx| self.poll_read(cx, buf))
    }

    /// Reads into `buf` if data (or end of stream, or an error) is waiting; otherwise
    /// arranges for `cx`'s waker to be woken when it may be, and returns `Pending`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::task::{Context, Waker};
    /// use trust::net::{TcpListener, TcpStream};
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let _client = TcpStream::connect(listener.local_addr()?)?;
    /// let (server, _) = listener.accept()?;
    /// let mut cx = Context::from_waker(Waker::noop());
    /// assert!(server.poll_read(&mut cx, &mut [0; 8]).is_pending());
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

    /// Writes some of `buf`, waiting (suspending only this fiber) until the socket can take at
    /// least one byte. Returns how many bytes were written. Writing to a connection the peer
    /// has closed fails (`BrokenPipe` or `ConnectionReset`); it never raises `SIGPIPE`.
    ///
    /// # Examples
    ///
    /// ```
    /// use trust::net::{TcpListener, TcpStream};
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let client = TcpStream::connect(listener.local_addr()?)?;
    /// assert_eq!(client.write(b"abc")?, 3);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        block_on_io(|cx| self.poll_write(cx, buf))
    }

    /// Writes some of `buf` if the socket can take it; otherwise arranges for `cx`'s waker to
    /// be woken when it may, and returns `Pending`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::task::{Context, Poll, Waker};
    /// use trust::net::{TcpListener, TcpStream};
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let client = TcpStream::connect(listener.local_addr()?)?;
    /// let mut cx = Context::from_waker(Waker::noop());
    /// assert!(matches!(client.poll_write(&mut cx, b"abc"), Poll::Ready(Ok(3))));
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
    /// use std::io::Read;
    /// use trust::net::{TcpListener, TcpStream};
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let client = TcpStream::connect(listener.local_addr()?)?;
    /// let (server, _) = listener.accept()?;
    /// client.write_all(&[7; 1000])?;
    /// drop(client);
    /// let mut all = Vec::new();
    /// (&server).read_to_end(&mut all)?;
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

    /// Does nothing: the stream keeps no buffer of its own (the kernel sends what `write`
    /// accepted). Present so the stream reads like any `Write`.
    ///
    /// # Examples
    ///
    /// ```
    /// use trust::net::{TcpListener, TcpStream};
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let client = TcpStream::connect(listener.local_addr()?)?;
    /// client.flush()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    /// Shuts down the reading side, the writing side, or both. After `Shutdown::Write` the
    /// peer reads end of stream while this side can still read what the peer sends
    /// (half-close).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::net::Shutdown;
    /// use trust::net::{TcpListener, TcpStream};
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let client = TcpStream::connect(listener.local_addr()?)?;
    /// let (server, _) = listener.accept()?;
    /// client.shutdown(Shutdown::Write)?;
    /// assert_eq!(server.read(&mut [0; 8])?, 0);
    /// server.write_all(b"still open")?;
    /// let mut buf = [0; 10];
    /// std::io::Read::read_exact(&mut &client, &mut buf)?;
    /// assert_eq!(&buf, b"still open");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.inner.get_ref().shutdown(how)
    }

    /// The address of the remote end.
    ///
    /// # Examples
    ///
    /// ```
    /// use trust::net::{TcpListener, TcpStream};
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let client = TcpStream::connect(listener.local_addr()?)?;
    /// assert_eq!(client.peer_addr()?, listener.local_addr()?);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.inner.get_ref().peer_addr()
    }

    /// The address of the local end.
    ///
    /// # Examples
    ///
    /// ```
    /// use trust::net::{TcpListener, TcpStream};
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let client = TcpStream::connect(listener.local_addr()?)?;
    /// assert!(client.local_addr()?.ip().is_loopback());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.get_ref().local_addr()
    }

    /// Sets `TCP_NODELAY`: when `true`, small writes go out at once instead of being
    /// coalesced (Nagle's algorithm), which request/response protocols usually want.
    ///
    /// # Examples
    ///
    /// ```
    /// use trust::net::{TcpListener, TcpStream};
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let client = TcpStream::connect(listener.local_addr()?)?;
    /// client.set_nodelay(true)?;
    /// assert!(client.nodelay()?);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.inner.get_ref().set_nodelay(nodelay)
    }

    /// Whether `TCP_NODELAY` is set.
    ///
    /// # Examples
    ///
    /// ```
    /// use trust::net::{TcpListener, TcpStream};
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let client = TcpStream::connect(listener.local_addr()?)?;
    /// client.set_nodelay(false)?;
    /// assert!(!client.nodelay()?);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn nodelay(&self) -> io::Result<bool> {
        self.inner.get_ref().nodelay()
    }
}

impl Read for TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        TcpStream::read(self, buf)
    }
}

impl Read for &TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        TcpStream::read(self, buf)
    }
}

impl Write for TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        TcpStream::write(self, buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        TcpStream::write_all(self, buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        TcpStream::flush(self)
    }
}

impl Write for &TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        TcpStream::write(self, buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        TcpStream::write_all(self, buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        TcpStream::flush(self)
    }
}

impl fmt::Debug for TcpStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpStream")
            .field("inner", &self.inner)
            .finish()
    }
}

/// Calls `f` on each address of `addr` until one succeeds; returns the last error otherwise.
fn each_addr<A: ToSocketAddrs, T>(
    addr: A,
    mut f: impl FnMut(SocketAddr) -> io::Result<T>,
) -> io::Result<T> {
    let mut last = None;
    for addr in addr.to_socket_addrs()? {
        match f(addr) {
            Ok(value) => return Ok(value),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "could not resolve to any address",
        )
    }))
}

/// Runs a non-blocking operation to completion, suspending only the current fiber (off a
/// worker, the current thread) while it returns `Pending`. The one place this module calls
/// into the scheduler.
fn block_on_io<T>(op: impl FnMut(&mut Context<'_>) -> Poll<io::Result<T>>) -> io::Result<T> {
    fiber::wait(poll_fn(op))
}
