//! Network I/O that suspends only the calling fiber: TCP and Unix stream types over a
//! per-worker readiness reactor.
//!
//! [`TcpListener`] and [`TcpStream`] look like their `std::net` namesakes, but a call that
//! would block (`accept`, `connect`, `read`, `write`) suspends only the calling fiber while the
//! worker runs its other fibers. Off a worker, on a plain thread, the same calls park the
//! thread. Each also has a `poll_*` twin taking a [`Context`](std::task::Context), for code
//! that composes futures.
//!
//! ```
//! use std::io::Read;
//! use trust::net::{TcpListener, TcpStream};
//!
//! let listener = TcpListener::bind("127.0.0.1:0")?;
//! let addr = listener.local_addr()?;
//! let client = std::thread::spawn(move || TcpStream::connect(addr)?.write_all(b"hi"));
//! let (stream, _) = listener.accept()?;
//! let mut buf = [0; 2];
//! (&stream).read_exact(&mut buf)?;
//! assert_eq!(&buf, b"hi");
//! client.join().unwrap()?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # Where a socket may be used
//!
//! A socket *binds* to a reactor at its first I/O (for a stream from `connect`, during the
//! handshake; for an accepted stream, at its first read or write; for a listener, at its first
//! `accept`):
//!
//! - on a worker, to that worker's reactor;
//! - on any other thread, to one process-wide reactor served by a background thread named
//!   `trust-net`, started on first use.
//!
//! From then on it must be used where it is bound: on that worker, or on non-worker threads.
//! Using it elsewhere fails with an `io::Error` (kind `Other`) that says so; it never hangs or
//! misbehaves. The types are `Send` and `Sync` so that an accepted stream can be handed to a
//! fiber on another worker *before* its first I/O (the usual accept-and-dispatch pattern), and
//! so that two fibers of one worker, or two plain threads, can read and write one stream at
//! the same time. Dropping a socket is allowed anywhere.
//!
//! How the reactor works (ownership, readiness, wake-ups, shutdown) is written down in the
//! doc of the private `reactor` module.
//!
//! A fiber may also wait on memory that no descriptor reports (a ring that another process
//! writes): it registers a [`Watch`], which its worker checks as it checks its sockets; and
//! on a descriptor that a library reads itself (an event descriptor): [`Readable`].
//!
//! Unix only (the sources register by file descriptor).

pub(crate) mod reactor;
mod readable;
mod tcp;
mod unix;
pub(crate) mod watch;

#[cfg(all(test, not(miri)))]
mod tests;

pub use readable::Readable;
pub use tcp::{TcpListener, TcpStream};
pub use unix::UnixStream;
pub use watch::{Watch, Watching, watch};
