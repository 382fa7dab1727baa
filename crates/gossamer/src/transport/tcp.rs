//! The TCP transport: one socket per link, registered with the worker's reactor.
//!
//! The watchdog reaches the socket from its own thread (see [`Probe`]): it writes a link's
//! heartbeats itself, straight to the socket, when the link has been quiet for a heartbeat
//! (the worker's writer fiber cannot run while the worker is busy), and it looks for bytes
//! that have arrived but not been read: while some wait, the worker is the one not reading,
//! and the peer counts as heard from. (A peer that dies meanwhile is found when the worker
//! reads again, at the end of its data.) The worker's writer holds the probe's write lock
//! for each write, and the watchdog for a heartbeat, so a heartbeat never lands inside
//! another frame.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use super::{Probe, Watched};
use crate::wire;

/// A link's socket, on its worker.
#[derive(Debug)]
pub(crate) struct TcpChannel {
    stream: trust::net::TcpStream,
    probe: Arc<Probe>,
}

impl TcpChannel {
    pub(super) fn open(stream: std::net::TcpStream, probe: &Arc<Probe>) -> TcpChannel {
        probe.set(Watched::Tcp(stream.as_raw_fd()));
        let stream = trust::net::TcpStream::from_std(stream).expect("a connected stream registers");
        TcpChannel {
            stream,
            probe: probe.clone(),
        }
    }

    pub(super) fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.read(buf)
    }

    pub(super) fn shutdown(&self) {
        // An error means the socket is already shut or broken: either way it is done.
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    pub(super) fn write_all(&self, bytes: &[u8]) -> io::Result<()> {
        // Under the write lock, so the watchdog's heartbeats fall between frames.
        let _writing = self.probe.lock_writes();
        self.stream.write_all(bytes)
    }
}

/// Whether bytes received on socket `fd` wait unread; `None` if it cannot tell.
/// The caller holds the probe's read lock, so `fd` is open.
pub(super) fn unread(fd: RawFd) -> Option<bool> {
    let mut count: libc::c_int = 0;
    // SAFETY: `fd` is open while the probe's lock is held (see `Probe`); FIONREAD writes one
    // c_int through a pointer to a live, aligned c_int.
    let r = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut count) };
    (r == 0).then_some(count > 0)
}

/// Writes a heartbeat frame on socket `fd` if it has nothing queued to send; returns whether
/// it did. With an empty send queue the kernel takes all 16 bytes at once, so a heartbeat is
/// never cut in two. The caller holds the probe's read lock and its write lock.
pub(super) fn heartbeat(fd: RawFd) -> bool {
    let mut queued: libc::c_int = 0;
    // SAFETY: as in `unread`; TIOCOUTQ writes one c_int, the bytes not yet acknowledged.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut queued) };
    if r != 0 || queued != 0 {
        return false;
    }
    let mut frame = Vec::with_capacity(wire::HEADER);
    wire::encode_heartbeat(&mut frame, 0); // heartbeats are outside the sequence
    let mut written = 0;
    while written < frame.len() {
        let rest = &frame[written..];
        // SAFETY: `fd` is open while the lock is held; `rest` is a live buffer of
        // `rest.len()` bytes. MSG_DONTWAIT: never block the watchdog; MSG_NOSIGNAL: a closed
        // peer is an error return, not SIGPIPE.
        let sent = unsafe {
            libc::send(
                fd,
                rest.as_ptr().cast(),
                rest.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        match sent {
            // Nothing went out: an error (the peer closed, the buffer is full) is the
            // reader's to find.
            ..=0 if written == 0 => return false,
            // A heartbeat cut in two would break the stream: finish it. With an empty queue
            // this does not happen; if it does, the rest goes as soon as it fits.
            ..=0 => std::thread::sleep(std::time::Duration::from_millis(1)),
            n => written += n as usize,
        }
    }
    true
}
