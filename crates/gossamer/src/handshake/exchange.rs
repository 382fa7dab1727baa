//! The exchange itself: hellos, proofs, and one overall deadline over every read and write.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::{BuildId, HELLO_LEN, HandshakeError, Identity, MAGIC, PROOF_LEN, Side};

type HmacSha256 = Hmac<Sha256>;

/// The hello's flag: this node links with nodes of other builds.
const MIXED: u8 = 0x01;

/// The handshake, with the version to claim as a parameter so that tests can play a node of
/// another protocol version.
pub(super) fn exchange(
    stream: &TcpStream,
    me: &Identity,
    secret: &[u8],
    side: Side,
    limit: Duration,
    version: u16,
) -> Result<Identity, HandshakeError> {
    if secret.is_empty() {
        return Err(HandshakeError::NoSecret);
    }
    // HMAC takes keys of any length, so this cannot fail once the secret is non-empty.
    let key = HmacSha256::new_from_slice(secret).map_err(|_| HandshakeError::NoSecret)?;
    let peer = stream
        .peer_addr()
        .map_err(|source| HandshakeError::NotConnected { source })?;
    let io = |source| HandshakeError::Io { peer, source };

    let saved_read = stream.read_timeout().map_err(io)?;
    let saved_write = stream.write_timeout().map_err(io)?;
    stream.set_nonblocking(false).map_err(io)?;

    let mut link = Handshaking {
        stream,
        peer,
        // A limit too large to add means no overall deadline: the per-call timeouts still apply.
        deadline: Instant::now().checked_add(limit),
        limit,
        received: 0,
    };
    let result = link.run(me, &key, side, version);

    let restored = stream
        .set_read_timeout(saved_read)
        .and_then(|()| stream.set_write_timeout(saved_write));
    let peer_identity = result?;
    restored.map_err(io)?;
    Ok(peer_identity)
}

/// One connection during its handshake: the overall deadline and how much the peer has sent.
struct Handshaking<'a> {
    stream: &'a TcpStream,
    peer: SocketAddr,
    deadline: Option<Instant>,
    limit: Duration,
    received: usize,
}

impl Handshaking<'_> {
    fn run(
        &mut self,
        me: &Identity,
        key: &HmacSha256,
        side: Side,
        version: u16,
    ) -> Result<Identity, HandshakeError> {
        let peer = self.peer;
        let mut nonce = [0u8; 32];
        getrandom::fill(&mut nonce).map_err(|error| HandshakeError::Random { error })?;
        let mine = encode_hello(version, me, &nonce);
        self.write_all(&mine)?;

        let mut theirs = [0u8; HELLO_LEN];
        self.read_exact(&mut theirs[0..8])?;
        if theirs[0..8] != MAGIC {
            return Err(HandshakeError::NotGossamer {
                peer,
                sent: field(&theirs, 0),
            });
        }
        self.read_exact(&mut theirs[8..10])?;
        let their_version = u16::from_le_bytes(field(&theirs, 8));
        if their_version != version {
            return Err(HandshakeError::Version {
                peer,
                theirs: their_version,
                ours: version,
            });
        }
        self.read_exact(&mut theirs[10..HELLO_LEN])?;
        let them = Identity {
            job: u64::from_le_bytes(field(&theirs, 10)),
            rank: u32::from_le_bytes(field(&theirs, 18)),
            worker: u32::from_le_bytes(field(&theirs, 22)),
            build: BuildId(field(&theirs, 26)),
            incarnation: u32::from_le_bytes(field(&theirs, 90)),
            mixed: theirs[94] & MIXED != 0,
        };
        if theirs[94] & !MIXED != 0 {
            return Err(HandshakeError::Flags {
                peer,
                flags: theirs[94],
            });
        }
        if them.build != me.build && !(them.mixed && me.mixed) {
            return Err(HandshakeError::Build {
                peer,
                theirs: them.build,
                ours: me.build,
                mixed: (them.mixed, me.mixed),
            });
        }
        if them.job != me.job {
            return Err(HandshakeError::Job {
                peer,
                theirs: them.job,
                ours: me.job,
            });
        }

        let (dialer_hello, acceptor_hello) = match side {
            Side::Dialer => (&mine, &theirs),
            Side::Acceptor => (&theirs, &mine),
        };
        let proof = transcript(key, side, dialer_hello, acceptor_hello)
            .finalize()
            .into_bytes();
        self.write_all(&proof)?;
        let mut their_proof = [0u8; PROOF_LEN];
        self.read_exact(&mut their_proof)?;
        transcript(key, side.other(), dialer_hello, acceptor_hello)
            .verify_slice(&their_proof)
            .map_err(|_| HandshakeError::WrongSecret { peer })?;
        Ok(them)
    }

    /// Time left until the deadline, or the timeout error once it has passed.
    fn time_left(&self) -> Result<Duration, HandshakeError> {
        let Some(deadline) = self.deadline else {
            return Ok(self.limit);
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HandshakeError::Timeout {
                peer: self.peer,
                limit: self.limit,
                received: self.received,
            });
        }
        // Sockets take microseconds; never hand them a zero, which is refused.
        Ok(left.max(Duration::from_millis(1)))
    }

    fn read_exact(&mut self, mut buf: &mut [u8]) -> Result<(), HandshakeError> {
        while !buf.is_empty() {
            let left = self.time_left()?;
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|source| self.io_error(source))?;
            match (&mut &*self.stream).read(buf) {
                Ok(0) => return Err(self.closed()),
                Ok(n) => {
                    self.received += n;
                    buf = &mut buf[n..];
                }
                Err(e) => self.retry_or_fail(e)?,
            }
        }
        Ok(())
    }

    fn write_all(&mut self, mut buf: &[u8]) -> Result<(), HandshakeError> {
        while !buf.is_empty() {
            let left = self.time_left()?;
            self.stream
                .set_write_timeout(Some(left))
                .map_err(|source| self.io_error(source))?;
            match (&mut &*self.stream).write(buf) {
                Ok(0) => return Err(self.closed()),
                Ok(n) => buf = &buf[n..],
                Err(e) => self.retry_or_fail(e)?,
            }
        }
        Ok(())
    }

    /// Sorts a socket error: a timeout or interruption goes round the loop again (which checks
    /// the deadline), a reset is the peer closing, anything else is an I/O error.
    fn retry_or_fail(&self, e: io::Error) -> Result<(), HandshakeError> {
        use io::ErrorKind::*;
        match e.kind() {
            Interrupted | WouldBlock | TimedOut => Ok(()),
            ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof => Err(self.closed()),
            _ => Err(self.io_error(e)),
        }
    }

    fn closed(&self) -> HandshakeError {
        HandshakeError::Closed {
            peer: self.peer,
            received: self.received,
        }
    }

    fn io_error(&self, source: io::Error) -> HandshakeError {
        HandshakeError::Io {
            peer: self.peer,
            source,
        }
    }
}

/// Lays out a hello as in the module docs' table.
fn encode_hello(version: u16, me: &Identity, nonce: &[u8; 32]) -> [u8; HELLO_LEN] {
    let mut hello = [0u8; HELLO_LEN];
    hello[0..8].copy_from_slice(&MAGIC);
    hello[8..10].copy_from_slice(&version.to_le_bytes());
    hello[10..18].copy_from_slice(&me.job.to_le_bytes());
    hello[18..22].copy_from_slice(&me.rank.to_le_bytes());
    hello[22..26].copy_from_slice(&me.worker.to_le_bytes());
    hello[26..58].copy_from_slice(&me.build.0);
    hello[58..90].copy_from_slice(nonce);
    hello[90..94].copy_from_slice(&me.incarnation.to_le_bytes());
    hello[94] = if me.mixed { MIXED } else { 0 };
    hello
}

/// `N` bytes of a hello from offset `at` (constant offsets inside the fixed-size hello).
fn field<const N: usize>(hello: &[u8; HELLO_LEN], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&hello[at..at + N]);
    out
}

/// The MAC state over what `side` proves: its label, then both hellos, dialer's first.
fn transcript(
    key: &HmacSha256,
    side: Side,
    dialer_hello: &[u8; HELLO_LEN],
    acceptor_hello: &[u8; HELLO_LEN],
) -> HmacSha256 {
    let mut mac = key.clone();
    mac.update(side.label());
    mac.update(dialer_hello);
    mac.update(acceptor_hello);
    mac
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handshake::{HANDSHAKE_LIMIT, PROTOCOL_VERSION, handshake, handshake_within};
    use std::net::{Shutdown, TcpListener};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::thread;

    const SECRET: &[u8] = b"correct horse battery staple";
    /// How long a test waits for a helper thread before failing.
    const TEST_WAIT: Duration = Duration::from_secs(10);

    fn ident(job: u64, rank: u32, worker: u32, build: u8) -> Identity {
        Identity {
            job,
            rank,
            worker,
            build: BuildId([build; 32]),
            incarnation: 0,
            mixed: false,
        }
    }

    fn mixed(id: Identity) -> Identity {
        Identity { mixed: true, ..id }
    }

    /// A connected loopback pair: (dialer end, acceptor end).
    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback listener");
        let addr = listener.local_addr().expect("listener address");
        let dialer = TcpStream::connect(addr).expect("connect to the loopback listener");
        let acceptor = accept_within(&listener, Duration::from_secs(5));
        (dialer, acceptor)
    }

    fn accept_within(listener: &TcpListener, wait: Duration) -> TcpStream {
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let deadline = Instant::now() + wait;
        loop {
            match listener.accept() {
                Ok((stream, _)) => return stream,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(
                        Instant::now() < deadline,
                        "no loopback connection accepted within {wait:?}"
                    );
                    thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("accept failed: {e}"),
            }
        }
    }

    /// Runs `f` on a thread; `wait` collects its result or fails naming `what`.
    fn spawn<T: Send + 'static>(
        what: &'static str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> impl FnOnce() -> T {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let _ = tx.send(f());
        });
        move || match rx.recv_timeout(TEST_WAIT) {
            Ok(v) => v,
            Err(e) => panic!("{what} did not finish within {TEST_WAIT:?}: {e}"),
        }
    }

    /// Both sides over loopback, each with its own identity, secret and version.
    fn both(
        dialer: (Identity, &'static [u8], u16),
        acceptor: (Identity, &'static [u8], u16),
    ) -> (
        Result<Identity, HandshakeError>,
        Result<Identity, HandshakeError>,
    ) {
        let (d, a) = pair();
        let join = spawn("the dialer's handshake", move || {
            exchange(
                &d,
                &dialer.0,
                dialer.1,
                Side::Dialer,
                HANDSHAKE_LIMIT,
                dialer.2,
            )
        });
        let accepted = exchange(
            &a,
            &acceptor.0,
            acceptor.1,
            Side::Acceptor,
            HANDSHAKE_LIMIT,
            acceptor.2,
        );
        (join(), accepted)
    }

    /// The acceptor's handshake on its own thread, so that a handshake which never gives up
    /// fails the test instead of hanging it; returns it with how long it took.
    fn timed_handshake(
        what: &'static str,
        stream: TcpStream,
        limit: Duration,
    ) -> impl FnOnce() -> (Result<Identity, HandshakeError>, Duration) {
        spawn(what, move || {
            let start = Instant::now();
            let result =
                handshake_within(&stream, &ident(7, 0, 0, 3), SECRET, Side::Acceptor, limit);
            (result, start.elapsed())
        })
    }

    fn read_within(stream: &mut TcpStream, buf: &mut [u8], what: &str) {
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("set a read timeout");
        stream
            .read_exact(buf)
            .unwrap_or_else(|e| panic!("reading {what} within 5 s failed: {e}"));
    }

    use crate::splitmix::Rng;

    #[test]
    fn both_sides_learn_each_other_and_the_stream_stays_usable() {
        let dialer_id = ident(7, 1, 0, 3);
        let acceptor_id = ident(7, 0, Identity::NODE, 3);
        let (mut d, mut a) = pair();
        a.set_read_timeout(Some(Duration::from_secs(7)))
            .expect("set a read timeout");
        let join = spawn("the dialer's handshake", move || {
            let peer = handshake(&d, &dialer_id, SECRET, Side::Dialer);
            // The first frame follows the handshake on the same socket.
            d.write_all(b"first frame")
                .expect("write after the handshake");
            (peer, d.read_timeout().expect("read timeout"))
        });
        let from_acceptor = handshake(&a, &acceptor_id, SECRET, Side::Acceptor);
        let (from_dialer, dialer_timeout) = join();

        assert_eq!(from_dialer.expect("dialer's handshake"), acceptor_id);
        assert_eq!(from_acceptor.expect("acceptor's handshake"), dialer_id);
        assert_eq!(
            dialer_timeout, None,
            "the dialer's read timeout is restored"
        );
        assert_eq!(
            a.read_timeout().expect("read timeout"),
            Some(Duration::from_secs(7)),
            "the acceptor's own read timeout is restored"
        );
        assert_eq!(a.write_timeout().expect("write timeout"), None);
        let mut frame = [0u8; 11];
        read_within(&mut a, &mut frame, "the first frame");
        assert_eq!(&frame, b"first frame", "the handshake read past its end");
    }

    #[test]
    fn wrong_secret_is_refused_on_both_sides() {
        let (d, a) = both(
            (ident(7, 1, 0, 3), b"one secret", PROTOCOL_VERSION),
            (ident(7, 0, 0, 3), b"another secret", PROTOCOL_VERSION),
        );
        for (side, result) in [("dialer", d), ("acceptor", a)] {
            let err = result.expect_err("a wrong secret must be refused");
            assert!(
                matches!(err, HandshakeError::WrongSecret { .. }),
                "{side}: {err}"
            );
            let msg = err.to_string();
            assert!(msg.contains("wrong secret"), "{side}: {msg}");
            assert!(msg.contains("set the same GSM_SECRET"), "{side}: {msg}");
        }
    }

    #[test]
    fn other_job_is_refused_on_both_sides() {
        let (d, a) = both(
            (ident(2, 1, 0, 3), SECRET, PROTOCOL_VERSION),
            (ident(0xabc, 0, 0, 3), SECRET, PROTOCOL_VERSION),
        );
        let d = d
            .expect_err("the dialer must refuse another job")
            .to_string();
        let a = a
            .expect_err("the acceptor must refuse another job")
            .to_string();
        assert!(
            d.contains("belongs to job 0x0000000000000abc, this is job 0x0000000000000002"),
            "{d}"
        );
        assert!(
            a.contains("belongs to job 0x0000000000000002, this is job 0x0000000000000abc"),
            "{a}"
        );
        assert!(a.contains("a stale process from another run?"), "{a}");
    }

    #[test]
    fn other_build_is_refused_on_both_sides() {
        let (d, a) = both(
            (ident(7, 1, 0, 0x3f), SECRET, PROTOCOL_VERSION),
            (ident(7, 0, 0, 0x8c), SECRET, PROTOCOL_VERSION),
        );
        let d = d
            .expect_err("the dialer must refuse another build")
            .to_string();
        let a = a
            .expect_err("the acceptor must refuse another build")
            .to_string();
        assert!(
            d.contains("runs another build (8c8c… ≠ 3f3f…): start the same binary everywhere"),
            "{d}"
        );
        assert!(a.contains("runs another build (3f3f… ≠ 8c8c…)"), "{a}");
        assert!(a.contains("or set GSM_MIXED_BUILDS=1 on every node"), "{a}");
    }

    #[test]
    fn other_builds_link_only_when_both_allow_it() {
        let (d, a) = both(
            (mixed(ident(7, 1, 0, 0x3f)), SECRET, PROTOCOL_VERSION),
            (mixed(ident(7, 0, 0, 0x8c)), SECRET, PROTOCOL_VERSION),
        );
        let (d, a) = (d.expect("the dialer links"), a.expect("the acceptor links"));
        assert_eq!((d.build, d.mixed), (BuildId([0x8c; 32]), true));
        assert_eq!((a.build, a.mixed), (BuildId([0x3f; 32]), true));
        let (d, a) = both(
            (mixed(ident(7, 1, 0, 0x3f)), SECRET, PROTOCOL_VERSION),
            (ident(7, 0, 0, 0x8c), SECRET, PROTOCOL_VERSION),
        );
        let d = d.expect_err("one side refuses mixed builds").to_string();
        let a = a.expect_err("so both refuse").to_string();
        assert!(d.contains("set GSM_MIXED_BUILDS=1 on the peer too"), "{d}");
        assert!(a.contains("set GSM_MIXED_BUILDS=1 here too"), "{a}");
        // The same build links whoever allows what.
        let (d, a) = both(
            (mixed(ident(7, 1, 0, 0x3f)), SECRET, PROTOCOL_VERSION),
            (ident(7, 0, 0, 0x3f), SECRET, PROTOCOL_VERSION),
        );
        assert!(d.is_ok() && a.is_ok(), "{d:?} {a:?}");
    }

    #[test]
    fn build_is_checked_before_job() {
        let (_, a) = both(
            (ident(1, 1, 0, 1), SECRET, PROTOCOL_VERSION),
            (ident(2, 0, 0, 2), SECRET, PROTOCOL_VERSION),
        );
        let err = a.expect_err("another build and job must be refused");
        assert!(matches!(err, HandshakeError::Build { .. }), "{err}");
    }

    #[test]
    fn other_protocol_version_is_refused_on_both_sides() {
        let (d, a) = both(
            (ident(7, 1, 0, 3), SECRET, PROTOCOL_VERSION + 1),
            (ident(7, 0, 0, 3), SECRET, PROTOCOL_VERSION),
        );
        let d = d.expect_err("the dialer must refuse").to_string();
        let a = a.expect_err("the acceptor must refuse").to_string();
        let (ours, theirs) = (PROTOCOL_VERSION, PROTOCOL_VERSION + 1);
        assert!(
            a.contains(&format!("speaks protocol v{theirs}, this build v{ours}")),
            "{a}"
        );
        assert!(
            d.contains(&format!("speaks protocol v{ours}, this build v{theirs}")),
            "{d}"
        );
    }

    #[test]
    fn random_bytes_are_not_a_gossamer_peer() {
        let (mut raw, a) = pair();
        let garbage = Rng(42).bytes(64);
        assert_ne!(garbage[..8], MAGIC);
        raw.write_all(&garbage).expect("send garbage");
        let err = handshake(&a, &ident(7, 0, 0, 3), SECRET, Side::Acceptor)
            .expect_err("garbage must be refused");
        assert!(matches!(err, HandshakeError::NotGossamer { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("is not a gossamer peer"), "{msg}");
        let raw_addr = raw.local_addr().expect("raw socket address").to_string();
        assert!(msg.contains(&raw_addr), "the message names the peer: {msg}");
    }

    #[test]
    fn an_http_client_is_shown_what_it_sent() {
        let (mut raw, a) = pair();
        raw.write_all(b"GET / HTTP/1.1\r\n\r\n")
            .expect("send a request");
        let err = handshake(&a, &ident(7, 0, 0, 3), SECRET, Side::Acceptor)
            .expect_err("HTTP must be refused");
        assert!(
            err.to_string().contains("(it began with \"GET / HT\")"),
            "{err}"
        );
    }

    #[test]
    fn truncated_hello_then_close_is_refused() {
        let me = ident(7, 0, 0, 3);
        let hello = encode_hello(PROTOCOL_VERSION, &ident(7, 1, 0, 3), &[9; 32]);
        for cut in [0, 5, 9, 40, HELLO_LEN, HELLO_LEN + 10] {
            let (mut raw, a) = pair();
            let mut sent = hello.to_vec();
            sent.extend_from_slice(&[0; 32]);
            raw.write_all(&sent[..cut]).expect("send a truncated hello");
            raw.shutdown(Shutdown::Write).expect("close the raw side");
            let err = handshake(&a, &me, SECRET, Side::Acceptor)
                .expect_err("a truncated handshake must be refused");
            assert!(
                matches!(err, HandshakeError::Closed { received, .. } if received == cut),
                "cut at {cut}: {err}"
            );
            assert!(
                err.to_string()
                    .contains("closed the connection during the handshake"),
                "{err}"
            );
        }
    }

    #[test]
    fn garbage_after_a_valid_hello_is_a_wrong_secret() {
        let me = ident(7, 0, 0, 3);
        let hello = encode_hello(PROTOCOL_VERSION, &ident(7, 1, 0, 3), &[9; 32]);
        // A proof-sized blob, then an oversized one (64 KiB where 32 bytes belong).
        for tail in [32, 64 * 1024] {
            let (mut raw, a) = pair();
            let mut sent = hello.to_vec();
            sent.extend(Rng(tail as u64).bytes(tail));
            // The acceptor stops reading after the proof, so the writer may block or fail:
            // it runs on its own thread and only lives as long as the socket.
            let writer = spawn("the garbage writer", move || {
                let _ = raw.write_all(&sent);
                raw
            });
            let err = handshake(&a, &me, SECRET, Side::Acceptor)
                .expect_err("garbage after a hello must be refused");
            assert!(
                matches!(err, HandshakeError::WrongSecret { .. }),
                "tail {tail}: {err}"
            );
            drop(a);
            drop(writer());
        }
    }

    #[test]
    fn silent_peer_times_out() {
        let (_raw, a) = pair();
        let limit = Duration::from_millis(300);
        let (result, took) = timed_handshake("the handshake with a silent peer", a, limit)();
        let err = result.expect_err("a silent peer must time out");
        assert!(matches!(err, HandshakeError::Timeout { .. }), "{err}");
        assert!(err.to_string().contains("within 300 ms"), "{err}");
        assert!(took >= limit, "gave up early, after {took:?}");
        assert!(took < limit + Duration::from_secs(2), "took {took:?}");
    }

    #[test]
    fn trickling_peer_hits_the_overall_deadline() {
        let (mut raw, a) = pair();
        let hello = encode_hello(PROTOCOL_VERSION, &ident(7, 1, 0, 3), &[9; 32]);
        let stop = Arc::new(AtomicBool::new(false));
        let stop_writer = Arc::clone(&stop);
        // One byte every 40 ms: each read gets a byte long before its socket timeout, but the
        // hello would take 3.6 s in all.
        let trickler = spawn("the trickling peer", move || {
            for byte in hello {
                if stop_writer.load(Ordering::Relaxed) || raw.write_all(&[byte]).is_err() {
                    return;
                }
                thread::sleep(Duration::from_millis(40));
            }
        });
        let limit = Duration::from_millis(400);
        let (result, took) = timed_handshake("the handshake with a trickling peer", a, limit)();
        stop.store(true, Ordering::Relaxed);
        trickler();
        let err = result.expect_err("a trickling peer must time out");
        assert!(
            matches!(err, HandshakeError::Timeout { received, .. } if received > 0),
            "{err}"
        );
        assert!(took < limit + Duration::from_secs(1), "took {took:?}");
    }

    #[test]
    fn reflected_proof_is_refused() {
        // An attacker without the secret echoes each side's hello and proof back to it.
        for side in [Side::Dialer, Side::Acceptor] {
            let (d, a) = pair();
            let (victim, mut attacker) = match side {
                Side::Dialer => (d, a),
                Side::Acceptor => (a, d),
            };
            let echo = spawn("the reflecting attacker", move || {
                let mut hello = [0u8; HELLO_LEN];
                read_within(&mut attacker, &mut hello, "the victim's hello");
                attacker.write_all(&hello).expect("echo the hello");
                let mut proof = [0u8; PROOF_LEN];
                read_within(&mut attacker, &mut proof, "the victim's proof");
                attacker.write_all(&proof).expect("echo the proof");
                attacker
            });
            let err = handshake(&victim, &ident(7, 0, 0, 3), SECRET, side)
                .expect_err("a reflected proof must be refused");
            drop(echo());
            assert!(
                matches!(err, HandshakeError::WrongSecret { .. }),
                "{side:?}: {err}"
            );
        }
    }

    #[test]
    fn empty_secret_is_refused_before_any_io() {
        let (_d, a) = pair();
        let err = handshake(&a, &ident(7, 0, 0, 3), b"", Side::Acceptor)
            .expect_err("an empty secret proves nothing");
        assert!(matches!(err, HandshakeError::NoSecret), "{err}");
        assert!(err.to_string().contains("set GSM_SECRET"), "{err}");
    }

    #[test]
    fn hello_layout_matches_the_table() {
        let me = Identity {
            job: 0x0102_0304_0506_0708,
            rank: 0x1112_1314,
            worker: Identity::NODE,
            build: BuildId([0xbb; 32]),
            incarnation: 0x2122_2324,
            mixed: true,
        };
        let hello = encode_hello(0x0201, &me, &[0xee; 32]);
        assert_eq!(&hello[0..8], b"GOSSAMER");
        assert_eq!(hello[8..10], [0x01, 0x02]);
        assert_eq!(hello[10..18], [8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(hello[18..22], [0x14, 0x13, 0x12, 0x11]);
        assert_eq!(hello[22..26], [0xff; 4]);
        assert_eq!(hello[26..58], [0xbb; 32]);
        assert_eq!(hello[58..90], [0xee; 32]);
        assert_eq!(hello[90..94], [0x24, 0x23, 0x22, 0x21]);
        assert_eq!(hello[94], MIXED);
        assert_eq!(hello.len(), 95);
    }

    #[test]
    fn random_handshakes_never_succeed_or_panic() {
        let me = ident(7, 0, 0, 3);
        let valid = encode_hello(PROTOCOL_VERSION, &ident(7, 1, 0, 3), &[9; 32]);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback listener");
        let addr = listener.local_addr().expect("listener address");
        let mut rng = Rng(0x5eed);
        for case in 0..3000 {
            let mut sent = match rng.below(4) {
                // Pure noise.
                0 => {
                    let len = rng.below(200);
                    rng.bytes(len)
                }
                // A valid hello with a few bytes flipped, then noise.
                1 => {
                    let mut bytes = valid.to_vec();
                    for _ in 0..=rng.below(3) {
                        let at = rng.below(bytes.len());
                        bytes[at] ^= (rng.next() as u8) | 1;
                    }
                    let tail = rng.below(40);
                    bytes.extend(rng.bytes(tail));
                    bytes
                }
                // A valid hello and a forged proof.
                2 => {
                    let mut bytes = valid.to_vec();
                    bytes.extend(rng.bytes(PROOF_LEN));
                    bytes
                }
                // A valid hello, cut short.
                _ => valid[..rng.below(HELLO_LEN)].to_vec(),
            };
            if rng.below(8) == 0 {
                let n = rng.below(4096);
                sent.extend(rng.bytes(n));
            }
            let side = if case % 2 == 0 {
                Side::Dialer
            } else {
                Side::Acceptor
            };

            let mut raw = TcpStream::connect(addr).expect("connect to the loopback listener");
            let conn = accept_within(&listener, Duration::from_secs(5));
            raw.write_all(&sent).expect("send the case's bytes");
            raw.shutdown(Shutdown::Write).expect("close the raw side");
            // The raw side has said all it will, so every case ends in a refusal, never a wait.
            match handshake_within(&conn, &me, SECRET, side, Duration::from_secs(2)) {
                Ok(peer) => panic!("case {case} was accepted as {peer:?}: {sent:02x?}"),
                Err(e @ (HandshakeError::Timeout { .. } | HandshakeError::Io { .. })) => {
                    panic!("case {case} failed by waiting or I/O, not a refusal: {e}")
                }
                Err(_) => {}
            }
        }
    }
}
