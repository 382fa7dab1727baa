//! The watchdog's view of a link's socket, from its own thread: so that a worker busy in user
//! code for longer than `GSM_PEER_TIMEOUT` neither looks dead to its peers nor takes them for
//! dead.
//!
//! - The watchdog writes a link's heartbeats itself, straight to the socket, when the link has
//!   been quiet for a heartbeat: the worker's writer fiber cannot run while the worker is busy.
//! - It looks for bytes that have arrived but not been read: while some wait, the worker is the
//!   one not reading, and the peer counts as heard from. (A peer that dies meanwhile is found
//!   when the worker reads again, at the end of its data.)
//!
//! # The protocol that makes these calls sound
//! A [`LinkFd`] holds the socket's descriptor number, or nothing once the link is gone. The
//! watchdog uses the number only while holding a read lock on it, and the link clears it under
//! the write lock before it closes the socket, so a number is never used after its socket was
//! closed (and the number perhaps reused for another file). A second lock orders writes: the
//! worker's writer holds it for each of its writes and the watchdog for a heartbeat, so a
//! heartbeat never lands inside another frame.

use std::os::fd::RawFd;
use std::sync::{Mutex, MutexGuard, RwLock};

use crate::wire;

/// A link's socket descriptor, shared by the worker and the watchdog.
#[derive(Debug, Default)]
pub(crate) struct LinkFd {
    fd: RwLock<Option<RawFd>>,
    writing: Mutex<()>,
}

impl LinkFd {
    /// Takes the write lock, for a write by the worker.
    pub(crate) fn lock_writes(&self) -> MutexGuard<'_, ()> {
        self.writing.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_fd(&self, fd: Option<RawFd>) {
        *self.fd.write().unwrap_or_else(|p| p.into_inner()) = fd;
    }

    /// Names the link's socket, once connected.
    pub(crate) fn set(&self, fd: RawFd) {
        self.set_fd(Some(fd));
    }

    /// Forgets the socket; called before it is closed.
    pub(crate) fn clear(&self) {
        self.set_fd(None);
    }

    /// Whether bytes received on the socket wait unread; `None` if the link is gone.
    pub(crate) fn unread(&self) -> Option<bool> {
        let guard = self.fd.read().unwrap_or_else(|p| p.into_inner());
        let fd = (*guard)?;
        let mut count: libc::c_int = 0;
        // SAFETY: `fd` is open while the lock is held (module docs); FIONREAD writes one
        // c_int through a pointer to a live, aligned c_int.
        let r = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut count) };
        (r == 0).then_some(count > 0)
    }

    /// Writes a heartbeat frame if the socket is free and has nothing queued to send; returns
    /// whether it did. With an empty send queue the kernel takes all 16 bytes at once, so a
    /// heartbeat is never cut in two.
    pub(crate) fn heartbeat(&self) -> bool {
        let guard = self.fd.read().unwrap_or_else(|p| p.into_inner());
        let Some(fd) = *guard else { return false };
        let Ok(_writing) = self.writing.try_lock() else {
            return false; // the worker is writing: the link is not idle
        };
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
            // `rest.len()` bytes. MSG_DONTWAIT: never block the watchdog; MSG_NOSIGNAL: a
            // closed peer is an error return, not SIGPIPE.
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
                // A heartbeat cut in two would break the stream: finish it. With an empty
                // queue this does not happen; if it does, the rest goes as soon as it fits.
                ..=0 => std::thread::sleep(std::time::Duration::from_millis(1)),
                n => written += n as usize,
            }
        }
        true
    }
}
