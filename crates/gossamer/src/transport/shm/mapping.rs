//! Memory shared with peers: sealed `memfd` files mapped by several processes, and the two
//! rings of a link laid out in one of them. (A node's region heap is such a file too; see
//! `region::heap`.)
//!
//! # Why it is safe to share
//! The file is a `memfd`: it has no name in any filesystem, so no other process can open it;
//! it reaches the peer only as a descriptor passed over a Unix socket after the peer proved
//! the job secret and its credentials were checked (see `setup`). It is sealed against
//! shrinking and growing before it is passed, and the receiver checks both seals and the size
//! before it maps it: a peer cannot truncate the file under us, which would turn our next
//! access into `SIGBUS`. Both sides close the descriptor once mapped (a node keeps its heap's
//! to pass it on), so the memory is freed when the last process unmaps it or exits; nothing
//! outlives the job.
//!
//! # Layout
//! Offset 0: the control block of ring 0 (dialer to acceptor), then that of ring 1 (acceptor
//! to dialer); at the next page, ring 0's data, then ring 1's, [`RING_BYTES`] each. Both sides
//! run the same build (the handshake checked it), so the layout is a constant of the build
//! and nothing about it is read from the mapping.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use super::ring::{Area, CONTROL_BYTES, Control};

/// Bytes of each ring's data area: 256 KiB, four default frames.
pub(crate) const RING_BYTES: usize = 256 << 10;

const PAGE: usize = 4096;
/// Where the data areas start.
const DATA: usize = (2 * CONTROL_BYTES).div_ceil(PAGE) * PAGE;
/// The size of a link's mapping.
pub(crate) const MAPPING_BYTES: usize = DATA + 2 * RING_BYTES;

/// Seals a link's file carries before it is passed and mapped: its size is fixed for good.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// Creates a link's file: zeroed, [`MAPPING_BYTES`] long, sealed.
pub(crate) fn create() -> io::Result<OwnedFd> {
    create_file(c"gossamer-link", MAPPING_BYTES)
}

/// Creates a sealed file of `len` zero bytes named `name` (the name shows in
/// `/proc/PID/maps`, nowhere else).
pub(crate) fn create_file(name: &std::ffi::CStr, len: usize) -> io::Result<OwnedFd> {
    // SAFETY: a valid C string; the flags ask for a close-on-exec, sealable file.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain syscalls on a descriptor we own.
    let sized = unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) };
    if sized != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    let sealed = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) };
    if sealed != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Checks a link's file received from a peer before it is mapped: sealed, and of the link's
/// size.
pub(crate) fn check(fd: &OwnedFd) -> Result<(), String> {
    let len = check_file(fd, "the link's shared memory")?;
    if len != MAPPING_BYTES as u64 {
        return Err(format!(
            "the link's shared memory has {len} bytes, not {MAPPING_BYTES}"
        ));
    }
    Ok(())
}

/// Checks a file `what` received from a peer before it is mapped: sealed against resizing;
/// returns its size.
pub(crate) fn check_file(fd: &OwnedFd, what: &str) -> Result<u64, String> {
    // SAFETY: F_GET_SEALS on a descriptor we own reads its seals.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & SEALS != SEALS {
        return Err(format!("{what} is not sealed against resizing"));
    }
    // SAFETY: `stat` is plain data, written whole by fstat before it is read.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a descriptor we own and a pointer to a live `stat`.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
        return Err(format!(
            "cannot stat {what}: {}",
            io::Error::last_os_error()
        ));
    }
    Ok(stat.st_size as u64)
}

/// A shared file, mapped shared, read and write; unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory that every thread may access; the rings' protocol (and
// atomics for every word both sides write) governs who touches which bytes when.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps a link's file (created here, or received and [`check`]ed).
    pub(crate) fn map(fd: &OwnedFd) -> io::Result<Mapping> {
        Mapping::map_len(fd, MAPPING_BYTES)
    }

    /// Maps the first `len` bytes of a sealed file of at least that size (created here, or
    /// received and checked).
    pub(crate) fn map_len(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of a descriptor we own; the kernel picks the address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    /// The mapping's first byte (page-aligned) and its length.
    pub(crate) fn bytes(&self) -> (*mut u8, usize) {
        (self.ptr, self.len)
    }

    /// Ring `index` (0: dialer to acceptor, 1: acceptor to dialer) of this mapping.
    pub(crate) fn ring(self: &Arc<Self>, index: usize) -> RingArea {
        RingArea {
            map: self.clone(),
            control: index * CONTROL_BYTES,
            data: DATA + index * RING_BYTES,
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` is the start of a mapping of `len` bytes made by `map_len`, and every
        // user (a `RingArea`, a region heap) holds this by `Arc` or owns it, so nothing uses
        // the memory after this.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// One ring of a mapping.
#[derive(Debug, Clone)]
pub(crate) struct RingArea {
    map: Arc<Mapping>,
    control: usize,
    data: usize,
}

impl Area for RingArea {
    fn control(&self) -> &Control {
        // SAFETY: `control` is a multiple of CONTROL_BYTES (a multiple of 128) within the
        // page-aligned mapping, so the pointer is aligned for `Control`; the bytes are
        // initialized (a file's pages read as zeros until written) and every bit pattern is
        // a valid `Control` (atomic integers only); the mapping lives as long as `self`.
        // Shared references to atomics are what both processes use.
        unsafe { &*self.map.ptr.add(self.control).cast::<Control>() }
    }

    fn capacity(&self) -> usize {
        RING_BYTES
    }

    unsafe fn copy_in(&self, at: usize, src: &[u8]) {
        debug_assert!(at + src.len() <= RING_BYTES);
        // SAFETY: in bounds of this ring's data area (the caller's contract); the bytes are
        // the producer's under the ring protocol, so this process writes them alone.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.map.ptr.add(self.data + at), src.len())
        }
    }

    unsafe fn copy_out(&self, at: usize, dst: &mut [u8]) {
        debug_assert!(at + dst.len() <= RING_BYTES);
        // SAFETY: in bounds (the caller's contract). The bytes are the consumer's under the
        // protocol; a broken peer may still write them meanwhile, which can change only the
        // bytes copied, all of which the decoder checks (see `ring`'s docs).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.ptr.add(self.data + at),
                dst.as_mut_ptr(),
                dst.len(),
            )
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::transport::shm::ring::{Consumer, Producer};

    /// Two mappings of one file, as two processes have: a megabyte goes through ring 0 from
    /// one thread to another, in chunks of every size, across the wrap many times.
    #[test]
    fn bytes_cross_between_two_mappings_of_one_file() {
        let file = create().unwrap();
        check(&file).unwrap();
        let (one, two) = (
            Arc::new(Mapping::map(&file).unwrap()),
            Arc::new(Mapping::map(&file).unwrap()),
        );
        drop(file); // the mappings keep the memory
        let total: usize = if cfg!(debug_assertions) {
            1 << 20
        } else {
            8 << 20
        };
        let byte = |i: usize| (i * 7 + i / 251) as u8;
        let sender = std::thread::spawn(move || {
            let mut p = Producer::new(one.ring(0));
            let chunk: Vec<u8> = (0..total).map(byte).collect();
            let (mut sent, mut size) = (0, 1);
            while sent < total {
                let end = (sent + size).min(total);
                match p.push(&chunk[sent..end]).unwrap().bytes {
                    0 => std::thread::yield_now(),
                    n => sent += n,
                }
                size = size % 70_000 + 997;
            }
        });
        let mut c = Consumer::new(two.ring(0));
        let mut buf = vec![0u8; 50_000];
        let mut got = 0;
        while got < total {
            match c.pop(&mut buf[..(got % 49_999) + 1]).unwrap().bytes {
                0 => std::thread::yield_now(),
                n => {
                    for (k, &b) in buf[..n].iter().enumerate() {
                        assert_eq!(b, byte(got + k), "byte {}", got + k);
                    }
                    got += n;
                }
            }
        }
        sender.join().unwrap();
    }
}
