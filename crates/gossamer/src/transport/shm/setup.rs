//! Setting up a shared-memory link, after the TCP handshake proved the peer knows the job
//! secret.
//!
//! 1. The dialer binds a Unix listener in the abstract namespace (no file anywhere) under a
//!    random name, once per node, and sends the name and its process id over the
//!    authenticated TCP connection ([`Offer`](crate::transport::Offer)).
//! 2. The acceptor connects to that name and checks the listener's credentials (`SO_PEERCRED`):
//!    the same user as itself and the process id the dialer announced. Only then does it
//!    agree to shared memory, sending its own process id over TCP.
//! 3. The dialer accepts on its listener, refusing any connection whose credentials are not
//!    the acceptor's announced process id and our user, creates the link's sealed `memfd`,
//!    maps it, and passes the descriptor with `SCM_RIGHTS` over the accepted socket.
//! 4. The acceptor receives it, checks its seals and size, and maps it.
//!
//! The file thus reaches only a process that proved the secret, through a socket whose other
//! end the kernel vouches for. The Unix socket then stays open for the life of the link: it
//! carries the doorbells, and its end tells at once that the peer exited or was killed.
//!
//! Everything here runs on bootstrap threads with blocking sockets and a deadline.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// What tells two processes they run on the same host: the same kernel boot, host name and
/// network namespace. The namespace matters because the abstract Unix names the setup uses
/// are per network namespace (and network namespaces are how one machine plays several
/// hosts in tests).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HostId {
    boot: String,
    hostname: String,
    netns: u64,
}

impl HostId {
    /// This process's host; `None` if the kernel does not tell (then no shared memory).
    pub(crate) fn this() -> Option<HostId> {
        use std::os::unix::fs::MetadataExt;
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
        let netns = std::fs::metadata("/proc/self/ns/net").ok()?.ino();
        Some(HostId {
            boot: boot.trim().to_string(),
            hostname: hostname.trim().to_string(),
            netns,
        })
    }
}

#[cfg(test)]
impl HostId {
    /// A host of this machine in network namespace `netns`.
    pub(crate) fn for_tests(netns: u64) -> HostId {
        HostId {
            boot: "boot".into(),
            hostname: "host".into(),
            netns,
        }
    }
}

/// This node's rendezvous listener, bound under a random abstract name.
#[derive(Debug)]
pub(crate) struct Rendezvous {
    listener: UnixListener,
    name: String,
}

impl Rendezvous {
    pub(crate) fn bind(job: u64, rank: u32) -> io::Result<Rendezvous> {
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).map_err(|e| io::Error::other(e.to_string()))?;
        let name = format!("gossamer-{job:x}-{rank}-{:016x}", u64::from_le_bytes(nonce));
        let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
        let listener = UnixListener::bind_addr(&addr)?;
        listener.set_nonblocking(true)?;
        Ok(Rendezvous { listener, name })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Step 3: accepts the acceptor's connection (process `pid`, our user) and passes it the
    /// link's file; returns the socket and the mapping's file. Connections from anyone else
    /// are refused (logged by the caller) while the deadline allows.
    pub(crate) fn accept_from(
        &self,
        pid: u32,
        deadline: Instant,
        refused: &mut dyn FnMut(String),
    ) -> Result<(UnixStream, OwnedFd), String> {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => match peer(&stream) {
                    Ok(cred) if cred.pid == pid as i32 && cred.uid == my_uid() => {
                        stream
                            .set_nonblocking(false)
                            .map_err(|e| format!("configuring the link's Unix socket: {e}"))?;
                        let file = super::mapping::create()
                            .map_err(|e| format!("creating the link's shared memory: {e}"))?;
                        send_fd(&stream, &file)
                            .map_err(|e| format!("passing the link's shared memory: {e}"))?;
                        return Ok((stream, file));
                    }
                    Ok(cred) => refused(format!(
                        "a Unix connection from process {} (user {}) where process {pid} was \
                         expected",
                        cred.pid, cred.uid
                    )),
                    Err(e) => refused(format!("a Unix connection without credentials: {e}")),
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(format!(
                            "process {pid} did not connect to this rank's Unix socket in time"
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(format!("accepting on this rank's Unix socket: {e}")),
            }
        }
    }
}

/// Step 2: connects to the dialer's rendezvous `name` and checks that the dialer (process
/// `pid`, our user) is listening there.
pub(crate) fn connect(name: &str, pid: u32, limit: Duration) -> Result<UnixStream, String> {
    let addr = SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| format!("a bad Unix socket name: {e}"))?;
    let stream = UnixStream::connect_addr(&addr)
        .map_err(|e| format!("cannot reach the peer's Unix socket: {e}"))?;
    let cred = peer(&stream).map_err(|e| format!("no credentials on the Unix socket: {e}"))?;
    if cred.pid != pid as i32 || cred.uid != my_uid() {
        return Err(format!(
            "the Unix socket is held by process {} (user {}), not the peer's process {pid}",
            cred.pid, cred.uid
        ));
    }
    stream
        .set_read_timeout(Some(limit))
        .map_err(|e| e.to_string())?;
    Ok(stream)
}

/// Step 4: receives the link's file on `stream` and checks it.
pub(crate) fn receive_file(stream: &UnixStream) -> Result<OwnedFd, String> {
    let file =
        receive_fd(stream).map_err(|e| format!("receiving the link's shared memory: {e}"))?;
    super::mapping::check(&file)?;
    Ok(file)
}

fn my_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// The credentials the kernel recorded for the other end of `stream`.
fn peer(stream: &UnixStream) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes at most `len` bytes into the live `cred`.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred)
}

/// Room for one descriptor's control message (`CMSG_SPACE` of one `int`), aligned for it.
#[repr(C, align(8))]
struct OneFd([u8; 24]);

/// Sends one byte carrying `fd` as `SCM_RIGHTS`.
pub(crate) fn send_fd(stream: &UnixStream, fd: &OwnedFd) -> io::Result<()> {
    let byte = [1u8];
    let iov = [IoSlice::new(&byte)];
    let mut control = OneFd([0; 24]);
    // SAFETY: an all-zero msghdr is valid; the pointers set below stay live for the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is arithmetic.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as _;
    assert!(msg.msg_controllen <= control.0.len());
    // SAFETY: `msg` has a control buffer of msg_controllen bytes, so CMSG_FIRSTHDR is a
    // valid, aligned header inside it, and CMSG_DATA has room for one int.
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&msg);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), fd.as_raw_fd());
    }
    // SAFETY: `msg` points at live buffers; MSG_NOSIGNAL: a closed peer is an error.
    let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent != 1 {
        return Err(if sent < 0 {
            io::Error::last_os_error()
        } else {
            io::Error::other("the descriptor's byte was not sent")
        });
    }
    Ok(())
}

/// Receives one byte carrying exactly one descriptor as `SCM_RIGHTS`.
pub(crate) fn receive_fd(stream: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut control = OneFd([0; 24]);
    // SAFETY: as in `send_fd`.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr().cast();
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len() as _;
    // SAFETY: `msg` points at live buffers of the lengths given. MSG_CMSG_CLOEXEC: the
    // received descriptor is not inherited by programs this process starts.
    let got = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    if got == 0 {
        return Err(io::Error::other("the peer closed the Unix socket"));
    }
    // Whatever descriptors arrived are ours to close; take them all before judging.
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `msg`'s control buffer (msg_controllen says how much);
    // CMSG_FIRSTHDR/NXTHDR walk only within it, and an SCM_RIGHTS payload is ints.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(header);
                let len = (*header).cmsg_len as usize - (data as usize - header as usize);
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            header = libc::CMSG_NXTHDR(&msg, header);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 || fds.len() != 1 {
        return Err(io::Error::other(format!(
            "expected one descriptor, got {}{}",
            fds.len(),
            if msg.msg_flags & libc::MSG_CTRUNC != 0 {
                " and a truncated control message"
            } else {
                ""
            }
        )));
    }
    Ok(fds.remove(0))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_file_passed_over_a_unix_socket_maps_to_the_same_memory() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = super::super::mapping::create().unwrap();
        send_fd(&a, &file).unwrap();
        let got = receive_file(&b).unwrap();
        let (one, two) = (
            std::sync::Arc::new(super::super::mapping::Mapping::map(&file).unwrap()),
            std::sync::Arc::new(super::super::mapping::Mapping::map(&got).unwrap()),
        );
        use super::super::ring::Area;
        one.ring(1).control().beat();
        assert_eq!(two.ring(1).control().heartbeat(), 1);
    }

    #[test]
    fn an_unsealed_or_wrong_sized_file_is_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        // SAFETY: a valid C string and flags.
        let fd = unsafe { libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: just created, owned by nobody else.
        let file = unsafe { OwnedFd::from_raw_fd(fd) };
        send_fd(&a, &file).unwrap();
        let e = receive_file(&b).unwrap_err();
        assert!(e.contains("not sealed"), "{e}");
    }

    #[test]
    fn the_rendezvous_refuses_a_stranger_and_accepts_the_peer() {
        let rendezvous = Rendezvous::bind(0xabc, 1).unwrap();
        let me = std::process::id();
        // A connection whose process is not the expected one is refused; then ours comes.
        let name = rendezvous.name().to_string();
        let peer = std::thread::spawn(move || {
            let stream = connect(&name, me, Duration::from_secs(5)).unwrap();
            receive_file(&stream).map(drop)
        });
        let mut refusals = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        let wrong = rendezvous.accept_from(
            me + 1,
            Instant::now() + Duration::from_millis(300),
            &mut |why| refusals.push(why),
        );
        assert!(
            wrong.is_err(),
            "a connection from another process is not the peer"
        );
        assert!(
            refusals[0].contains(&format!("from process {me}")),
            "{refusals:?}"
        );
        // The peer's connection was consumed by the refusal: it sees the socket close.
        assert!(peer.join().unwrap().is_err());
        let name = rendezvous.name().to_string();
        let peer = std::thread::spawn(move || {
            let stream = connect(&name, me, Duration::from_secs(5)).unwrap();
            receive_file(&stream).map(drop)
        });
        rendezvous
            .accept_from(me, deadline, &mut |why| panic!("refused: {why}"))
            .unwrap();
        peer.join().unwrap().unwrap();
        assert!(
            connect(
                &rendezvous.name().replace("gossamer", "x"),
                me,
                Duration::from_secs(1)
            )
            .is_err(),
            "no listener under another name"
        );
    }
}
