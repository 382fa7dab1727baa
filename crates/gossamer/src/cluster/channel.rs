//! The handshake of a daemon connection and its framed, authenticated streams.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use hmac::{Hmac, KeyInit, Mac};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::Sha256;

use super::{ClusterError, ClusterKey, MAX_PAYLOAD, PROTOCOL_VERSION};

type HmacSha256 = Hmac<Sha256>;

const MAGIC: [u8; 8] = *b"GSMCLUST";
const HELLO_LEN: usize = 42;
const TAG_LEN: usize = 32;
const DIALER_PROOF: &[u8] = b"gossamer cluster v1: dialer proof";
const ACCEPTOR_PROOF: &[u8] = b"gossamer cluster v1: acceptor proof";
const DIALER_FRAMES: &[u8] = b"gossamer cluster v1: dialer frames";
const ACCEPTOR_FRAMES: &[u8] = b"gossamer cluster v1: acceptor frames";

/// A daemon connection whose two ends have proven they hold the cluster key.
///
/// ```no_run
/// use std::time::Duration;
/// use gossamer::cluster::{Channel, ClusterKey, Reply, Request};
///
/// let key = ClusterKey::load("cluster.key".as_ref())?;
/// let channel = Channel::dial("10.0.0.2:7420".parse()?, &key, Duration::from_secs(5))?;
/// let (mut from_daemon, mut to_daemon) = channel.split()?;
/// to_daemon.send(&Request::List)?;
/// let jobs: Reply = from_daemon.recv()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Channel {
    stream: TcpStream,
    peer: SocketAddr,
    /// Keys of the frames this side sends and of those it receives.
    sending: HmacSha256,
    receiving: HmacSha256,
}

impl Channel {
    /// Connects to the daemon at `addr` and runs the handshake, all within `limit`.
    ///
    /// # Errors
    ///
    /// [`ClusterError`] naming the daemon and what failed: no connection, another protocol,
    /// another key, silence.
    pub fn dial(
        addr: SocketAddr,
        key: &ClusterKey,
        limit: Duration,
    ) -> Result<Channel, ClusterError> {
        let started = Instant::now();
        let stream = TcpStream::connect_timeout(&addr, limit)
            .map_err(|source| ClusterError::Connect { addr, source })?;
        let left = limit.saturating_sub(started.elapsed());
        Channel::handshake(stream, key, true, left)
    }

    /// Runs the handshake on a connection a daemon accepted, within `limit`.
    ///
    /// # Errors
    ///
    /// [`ClusterError`] naming the peer and what failed; the caller drops the connection.
    pub fn accept(
        stream: TcpStream,
        key: &ClusterKey,
        limit: Duration,
    ) -> Result<Channel, ClusterError> {
        Channel::handshake(stream, key, false, limit)
    }

    fn handshake(
        stream: TcpStream,
        key: &ClusterKey,
        dialer: bool,
        limit: Duration,
    ) -> Result<Channel, ClusterError> {
        let peer = stream
            .peer_addr()
            .map_err(|source| ClusterError::Io { peer: None, source })?;
        // HMAC takes keys of any length.
        let mac = HmacSha256::new_from_slice(key.as_bytes()).expect("HMAC takes any key");
        let mut io = Deadline {
            stream: &stream,
            peer,
            at: Instant::now() + limit,
            limit,
        };
        let mut mine = [0u8; HELLO_LEN];
        mine[..8].copy_from_slice(&MAGIC);
        mine[8..10].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        getrandom::fill(&mut mine[10..]).map_err(|e| ClusterError::Io {
            peer: Some(peer),
            source: io::Error::other(format!("no random bytes for a nonce: {e}")),
        })?;
        io.write_all(&mine)?;
        let mut theirs = [0u8; HELLO_LEN];
        io.read_exact(&mut theirs[..8])?;
        if theirs[..8] != MAGIC {
            let mut sent = [0u8; 8];
            sent.copy_from_slice(&theirs[..8]);
            return Err(ClusterError::NotCluster { peer, sent });
        }
        io.read_exact(&mut theirs[8..10])?;
        let version = u16::from_le_bytes([theirs[8], theirs[9]]);
        if version != PROTOCOL_VERSION {
            return Err(ClusterError::Version {
                peer,
                theirs: version,
            });
        }
        io.read_exact(&mut theirs[10..])?;
        let (dialer_hello, acceptor_hello) = if dialer {
            (&mine, &theirs)
        } else {
            (&theirs, &mine)
        };
        let keyed = |label: &[u8]| {
            let mut m = mac.clone();
            m.update(label);
            m.update(dialer_hello);
            m.update(acceptor_hello);
            m
        };
        let (my_proof, their_proof) = if dialer {
            (DIALER_PROOF, ACCEPTOR_PROOF)
        } else {
            (ACCEPTOR_PROOF, DIALER_PROOF)
        };
        io.write_all(&keyed(my_proof).finalize().into_bytes())?;
        let mut proof = [0u8; TAG_LEN];
        io.read_exact(&mut proof)?;
        keyed(their_proof)
            .verify_slice(&proof)
            .map_err(|_| ClusterError::WrongKey { peer })?;
        let frames_key = |label| {
            let derived = keyed(label).finalize().into_bytes();
            HmacSha256::new_from_slice(&derived).expect("HMAC takes any key")
        };
        let (sending, receiving) = if dialer {
            (frames_key(DIALER_FRAMES), frames_key(ACCEPTOR_FRAMES))
        } else {
            (frames_key(ACCEPTOR_FRAMES), frames_key(DIALER_FRAMES))
        };
        stream
            .set_read_timeout(None)
            .and_then(|()| stream.set_write_timeout(None))
            .map_err(|source| ClusterError::Io {
                peer: Some(peer),
                source,
            })?;
        Ok(Channel {
            stream,
            peer,
            sending,
            receiving,
        })
    }

    /// The other end's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// This end's address: on a daemon, the address the client reached this host by.
    ///
    /// # Errors
    ///
    /// The socket is no longer connected.
    pub fn local(&self) -> io::Result<SocketAddr> {
        self.stream.local_addr()
    }

    /// The stream, for its timeouts. A read that times out fails with
    /// [`ClusterError::Silent`], after which the connection is unusable.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Splits the connection into its two directions, for a reading and a writing thread.
    ///
    /// # Errors
    ///
    /// The socket cannot be duplicated.
    pub fn split(self) -> Result<(FrameReader<TcpStream>, FrameWriter<TcpStream>), ClusterError> {
        let peer = self.peer;
        let write = self.stream.try_clone().map_err(|source| ClusterError::Io {
            peer: Some(peer),
            source,
        })?;
        Ok((
            FrameReader::new(self.stream, self.receiving, peer),
            FrameWriter::new(write, self.sending, peer),
        ))
    }
}

/// Reads and writes of the handshake, each given the time left until one deadline.
struct Deadline<'a> {
    stream: &'a TcpStream,
    peer: SocketAddr,
    at: Instant,
    limit: Duration,
}

impl Deadline<'_> {
    fn time_left(&self) -> Result<Duration, ClusterError> {
        let left = self.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ClusterError::Silent {
                peer: self.peer,
                after: self.limit,
            });
        }
        // A zero timeout is refused by the socket.
        Ok(left.max(Duration::from_millis(1)))
    }

    fn read_exact(&mut self, mut buf: &mut [u8]) -> Result<(), ClusterError> {
        while !buf.is_empty() {
            self.stream
                .set_read_timeout(Some(self.time_left()?))
                .map_err(|e| io_error(self.peer, e))?;
            match (&mut &*self.stream).read(buf) {
                Ok(0) => return Err(ClusterError::Closed { peer: self.peer }),
                Ok(n) => buf = &mut buf[n..],
                Err(e) => retry(self.peer, e)?,
            }
        }
        Ok(())
    }

    fn write_all(&mut self, mut buf: &[u8]) -> Result<(), ClusterError> {
        while !buf.is_empty() {
            self.stream
                .set_write_timeout(Some(self.time_left()?))
                .map_err(|e| io_error(self.peer, e))?;
            match (&mut &*self.stream).write(buf) {
                Ok(0) => return Err(ClusterError::Closed { peer: self.peer }),
                Ok(n) => buf = &buf[n..],
                Err(e) => retry(self.peer, e)?,
            }
        }
        Ok(())
    }
}

/// A timeout or an interruption goes round the loop again (which checks the deadline); a
/// reset is the peer closing; anything else an I/O error.
fn retry(peer: SocketAddr, e: io::Error) -> Result<(), ClusterError> {
    use io::ErrorKind::*;
    match e.kind() {
        Interrupted | WouldBlock | TimedOut => Ok(()),
        ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof => {
            Err(ClusterError::Closed { peer })
        }
        _ => Err(io_error(peer, e)),
    }
}

fn io_error(peer: SocketAddr, source: io::Error) -> ClusterError {
    ClusterError::Io {
        peer: Some(peer),
        source,
    }
}

/// The MAC of frame number `number` carrying `payload`.
fn tag(key: &HmacSha256, number: u64, payload: &[u8]) -> HmacSha256 {
    let mut mac = key.clone();
    mac.update(&number.to_le_bytes());
    // MAX_PAYLOAD fits in a u32, so the length does too.
    mac.update(&(payload.len() as u32).to_le_bytes());
    mac.update(payload);
    mac
}

/// The receiving direction of a [`Channel`]: reads frames, checks their MACs and decodes them.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    key: HmacSha256,
    next: u64,
    peer: SocketAddr,
    buf: Vec<u8>,
}

impl<R: Read> FrameReader<R> {
    fn new(inner: R, key: HmacSha256, peer: SocketAddr) -> FrameReader<R> {
        FrameReader {
            inner,
            key,
            next: 0,
            peer,
            buf: Vec::new(),
        }
    }

    /// The next message.
    ///
    /// # Errors
    ///
    /// The peer closed the connection ([`ClusterError::Closed`]), said nothing within the
    /// stream's read timeout ([`ClusterError::Silent`]), sent a frame over [`MAX_PAYLOAD`], one
    /// whose MAC fails, or one that does not decode as a `T`. After any error the connection
    /// is unusable.
    pub fn recv<T: DeserializeOwned>(&mut self) -> Result<T, ClusterError> {
        let peer = self.peer;
        let mut len = [0u8; 4];
        self.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_PAYLOAD {
            return Err(ClusterError::TooLarge { peer, len });
        }
        self.buf.resize(len + TAG_LEN, 0);
        let mut buf = std::mem::take(&mut self.buf);
        let read = self.read_exact(&mut buf);
        self.buf = buf;
        read?;
        let (payload, mac) = self.buf.split_at(len);
        tag(&self.key, self.next, payload)
            .verify_slice(mac)
            .map_err(|_| ClusterError::BadMac { peer })?;
        self.next += 1;
        postcard::from_bytes(payload).map_err(|e| ClusterError::Decode {
            peer,
            error: e.to_string(),
        })
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    fn read_exact(&mut self, mut buf: &mut [u8]) -> Result<(), ClusterError> {
        let peer = self.peer;
        while !buf.is_empty() {
            match self.inner.read(buf) {
                Ok(0) => return Err(ClusterError::Closed { peer }),
                Ok(n) => buf = &mut buf[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(ClusterError::Silent {
                        peer,
                        after: Duration::ZERO,
                    });
                }
                Err(e) => return retry(peer, e).and(Err(ClusterError::Closed { peer })),
            }
        }
        Ok(())
    }
}

/// The sending direction of a [`Channel`]: encodes messages into frames with their MACs.
#[derive(Debug)]
pub struct FrameWriter<W> {
    inner: W,
    key: HmacSha256,
    next: u64,
    peer: SocketAddr,
}

impl<W: Write> FrameWriter<W> {
    fn new(inner: W, key: HmacSha256, peer: SocketAddr) -> FrameWriter<W> {
        FrameWriter {
            inner,
            key,
            next: 0,
            peer,
        }
    }

    /// Sends `message` in one frame.
    ///
    /// # Errors
    ///
    /// It encodes to more than [`MAX_PAYLOAD`] bytes ([`ClusterError::TooLarge`], nothing
    /// sent), or the connection failed.
    pub fn send<T: Serialize>(&mut self, message: &T) -> Result<(), ClusterError> {
        let peer = self.peer;
        let payload = postcard::to_stdvec(message).map_err(|e| ClusterError::Decode {
            peer,
            error: format!("cannot encode: {e}"),
        })?;
        if payload.len() > MAX_PAYLOAD {
            return Err(ClusterError::TooLarge {
                peer,
                len: payload.len(),
            });
        }
        let mac = tag(&self.key, self.next, &payload).finalize().into_bytes();
        let mut frame = Vec::with_capacity(4 + payload.len() + TAG_LEN);
        frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        frame.extend_from_slice(&payload);
        frame.extend_from_slice(&mac);
        self.inner.write_all(&frame).map_err(|e| match e.kind() {
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
                ClusterError::Closed { peer }
            }
            _ => io_error(peer, e),
        })?;
        self.inner.flush().map_err(|e| io_error(peer, e))?;
        self.next += 1;
        Ok(())
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }
}

/// See [`super::check_frames`].
#[cfg(any(test, feature = "fuzzing"))]
pub(super) fn check_frames(data: &[u8]) {
    use super::{Reply, Request};
    let key = HmacSha256::new_from_slice(b"fuzz").expect("HMAC takes any key");
    let peer: SocketAddr = ([127, 0, 0, 1], 1).into();
    // As they arrive: almost all fail their MAC, and must fail cleanly.
    let mut raw = FrameReader::new(data, key.clone(), peer);
    while let Ok(request) = raw.recv::<Request>() {
        drop(request);
    }
    // As messages: each payload that decodes goes through a writer and a reader unchanged.
    for message in [data, data.get(1..).unwrap_or_default()] {
        if let Ok(request) = postcard::from_bytes::<Request>(message) {
            assert_eq!(round_trip(&request, &key, peer), request);
        }
        if let Ok(reply) = postcard::from_bytes::<Reply>(message) {
            assert_eq!(round_trip(&reply, &key, peer), reply);
        }
    }
}

#[cfg(any(test, feature = "fuzzing"))]
fn round_trip<T: Serialize + DeserializeOwned>(
    message: &T,
    key: &HmacSha256,
    peer: SocketAddr,
) -> T {
    let mut framed = Vec::new();
    FrameWriter::new(&mut framed, key.clone(), peer)
        .send(message)
        .expect("a decoded message encodes within the bound");
    let mut reader = FrameReader::new(&framed[..], key.clone(), peer);
    let back = reader.recv().expect("a frame just written reads back");
    assert!(matches!(
        reader.recv::<T>(),
        Err(ClusterError::Closed { .. })
    ));
    back
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{Reply, Request};
    use std::net::TcpListener;
    use std::thread;

    const LIMIT: Duration = Duration::from_secs(10);

    fn listener() -> (TcpListener, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback listener");
        let addr = listener.local_addr().expect("its address");
        (listener, addr)
    }

    #[test]
    fn both_ends_with_the_key_talk_and_frames_check() {
        let (listener, addr) = listener();
        let key = ClusterKey::new("a cluster key of some length");
        let daemon_key = key.clone();
        let daemon = thread::spawn(move || {
            let (stream, _) = listener.accept().expect("accept");
            let (mut from, mut to) = Channel::accept(stream, &daemon_key, LIMIT)
                .expect("handshake")
                .split()
                .expect("split");
            let request: Request = from.recv().expect("a request");
            assert_eq!(request, Request::List);
            to.send(&Reply::Killed(3)).expect("reply");
        });
        let (mut from, mut to) = Channel::dial(addr, &key, LIMIT)
            .expect("handshake")
            .split()
            .expect("split");
        to.send(&Request::List).expect("send");
        assert_eq!(from.recv::<Reply>().expect("reply"), Reply::Killed(3));
        daemon.join().expect("the daemon's side");
    }

    #[test]
    fn a_wrong_key_garbage_and_another_version_are_named() {
        let (listener, addr) = listener();
        let daemon = thread::spawn(move || {
            let key = ClusterKey::new("the daemon's key, which differs");
            (0..3)
                .map(|_| {
                    let (stream, _) = listener.accept().expect("accept");
                    Channel::accept(stream, &key, LIMIT)
                        .unwrap_err()
                        .to_string()
                })
                .collect::<Vec<_>>()
        });
        let err = Channel::dial(addr, &ClusterKey::new("the client's own key"), LIMIT).unwrap_err();
        assert!(matches!(err, ClusterError::WrongKey { .. }), "{err}");
        let mut garbage = TcpStream::connect(addr).expect("connect");
        garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").expect("write");
        let mut old = TcpStream::connect(addr).expect("connect");
        old.write_all(&MAGIC)
            .and_then(|()| old.write_all(&[9, 0]))
            .expect("write");
        let said = daemon.join().expect("the daemon's side");
        assert!(said[0].contains("cluster key"), "{}", said[0]);
        assert!(said[1].contains("not a gsm client"), "{}", said[1]);
        assert!(said[2].contains("protocol version 9"), "{}", said[2]);
    }

    #[test]
    fn a_silent_peer_is_refused_in_time() {
        let (listener, addr) = listener();
        let _silent = TcpStream::connect(addr).expect("connect");
        let (stream, _) = listener.accept().expect("accept");
        let started = Instant::now();
        let err = Channel::accept(
            stream,
            &ClusterKey::new("k".repeat(16)),
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert!(matches!(err, ClusterError::Silent { .. }), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn oversized_tampered_and_replayed_frames_are_refused() {
        let key = HmacSha256::new_from_slice(b"k").unwrap();
        let peer: SocketAddr = ([127, 0, 0, 1], 1).into();
        let mut framed = Vec::new();
        let mut writer = FrameWriter::new(&mut framed, key.clone(), peer);
        writer.send(&Request::Signal(2)).unwrap();
        let one = writer.get_ref().len();
        writer.send(&Request::Kill).unwrap();

        let mut tampered = framed.clone();
        tampered[5] ^= 1;
        let err = FrameReader::new(&tampered[..], key.clone(), peer).recv::<Request>();
        assert!(matches!(err, Err(ClusterError::BadMac { .. })), "{err:?}");

        // The first frame again where the second belongs.
        let mut replayed = framed[..one].to_vec();
        replayed.extend_from_slice(&framed[..one]);
        let mut reader = FrameReader::new(&replayed[..], key.clone(), peer);
        assert_eq!(reader.recv::<Request>().unwrap(), Request::Signal(2));
        assert!(matches!(
            reader.recv::<Request>(),
            Err(ClusterError::BadMac { .. })
        ));

        let huge = u32::MAX.to_le_bytes();
        let err = FrameReader::new(&huge[..], key.clone(), peer).recv::<Request>();
        assert!(matches!(err, Err(ClusterError::TooLarge { .. })), "{err:?}");

        check_frames(&framed);
        check_frames(b"\x02\x09\x00");
    }

    /// What the fuzz target checks, over mutations of every kind of message: a few bytes
    /// changed, cut or added.
    #[test]
    fn mutated_messages_never_panic_and_what_decodes_round_trips() {
        use crate::cluster::{JobInfo, Start};
        use crate::splitmix::Rng;
        let start = Start {
            job: 0x3fa9,
            program: b"/usr/bin/prog".to_vec(),
            hash: [7; 32],
            len: 12345,
            args: vec![serde_bytes::ByteBuf::from(&b"--flag"[..])],
            env: vec![(
                serde_bytes::ByteBuf::from(&b"GSM_SIZE"[..]),
                serde_bytes::ByteBuf::from(&b"3"[..]),
            )],
            cwd: b"/tmp".to_vec(),
            ranks: vec![1, 4],
            coordinator: false,
            heartbeat_ms: 250,
            peer_timeout_ms: 3000,
            recover: true,
            host: 2,
            shared_state: true,
        };
        let requests = [
            Request::Start(start),
            Request::Program(vec![1, 2, 3]),
            Request::Signal(15),
            Request::KillJob(u64::MAX),
            Request::Restart {
                rank: 3,
                incarnation: 2,
                state_from: Some(1),
            },
            Request::Fence {
                rank: 3,
                incarnation: 1,
            },
        ];
        let replies = [
            Reply::Started {
                coordinator_port: Some(4242),
                pids: vec![(1, 100)],
            },
            Reply::Output {
                rank: 2,
                stderr: true,
                line: b"hello\n".to_vec(),
            },
            Reply::Exited {
                rank: 1,
                pid: 7,
                status: 9,
            },
            Reply::Refused("no".into()),
            Reply::Restarted {
                rank: 3,
                incarnation: 2,
                pid: 99,
            },
            Reply::RestartRefused {
                rank: 3,
                why: "no mark".into(),
            },
            Reply::Fence {
                rank: 3,
                incarnation: 1,
            },
            Reply::Jobs(vec![JobInfo {
                job: 1,
                program: "p".into(),
                ranks: vec![(0, 1)],
                client: "c".into(),
                started: 5,
            }]),
        ];
        let mut seeds: Vec<Vec<u8>> = requests
            .iter()
            .map(|r| postcard::to_stdvec(r).unwrap())
            .chain(replies.iter().map(|r| postcard::to_stdvec(r).unwrap()))
            .collect();
        let key = HmacSha256::new_from_slice(b"fuzz").unwrap();
        let peer: SocketAddr = ([127, 0, 0, 1], 1).into();
        let mut framed = Vec::new();
        let mut writer = FrameWriter::new(&mut framed, key, peer);
        requests.iter().for_each(|r| writer.send(r).unwrap());
        seeds.push(framed);
        let mut rng = Rng(0x5eed);
        for _ in 0..crate::splitmix::scaled(3000) {
            let mut input = seeds[rng.below(seeds.len())].clone();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(input.len() + 1);
                match rng.below(3) {
                    0 if at < input.len() => input[at] = rng.next() as u8,
                    1 => input.truncate(at),
                    _ => input.insert(at, rng.next() as u8),
                }
            }
            check_frames(&input);
        }
    }
}
