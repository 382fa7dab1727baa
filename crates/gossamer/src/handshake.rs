//! What every rack connection proves before its first frame.
//!
//! Each TCP connection of a rack, the coordinator's included, opens with [`handshake`]. Both
//! ends learn who the other is (job, rank, worker), check that it runs the same protocol and the
//! same binary, and prove to each other that they know the job's secret. Only then does the
//! connection carry frames; a peer that fails any check is refused with an error naming it and
//! the fix, and the caller closes that socket and nothing else.
//!
//! # Protocol (version 3)
//!
//! Both sides write a *hello* at once, then read the peer's. Integers are little-endian.
//!
//! | offset | bytes | field                                                          |
//! |-------:|------:|----------------------------------------------------------------|
//! |      0 |     8 | magic `b"GOSSAMER"`                                            |
//! |      8 |     2 | protocol version, `u16` (this build: [`PROTOCOL_VERSION`])     |
//! |     10 |     8 | job id, `u64`                                                  |
//! |     18 |     4 | rank, `u32`                                                    |
//! |     22 |     4 | worker, `u32` ([`Identity::NODE`] for the node itself)         |
//! |     26 |    32 | build id of the running executable ([`build_id`])              |
//! |     58 |    32 | nonce: fresh random bytes from the operating system            |
//! |     90 |     4 | incarnation, `u32`: which life of its rank the node is         |
//! |     94 |     1 | flags: bit 0 = links with other builds (`GSM_MIXED_BUILDS`); other bits 0 |
//! |     95 |       | end of the hello                                               |
//!
//! Then both sides write a *proof* at once, then read the peer's:
//!
//! | offset | bytes | field                                                           |
//! |-------:|------:|-----------------------------------------------------------------|
//! |      0 |    32 | `HMAC-SHA256(secret, label(side) ‖ dialer hello ‖ acceptor hello)` |
//!
//! where `label(Dialer)` = `b"gossamer handshake v1: dialer proof"` and `label(Acceptor)` =
//! `b"gossamer handshake v1: acceptor proof"`. The labels differ so that a proof cannot be
//! reflected back to the side that made it; the nonces make every transcript fresh, so a
//! recorded proof cannot be replayed. Proofs are checked in constant time.
//!
//! A side reads the peer's hello in three steps and refuses at the first failed check, in this
//! order: magic (after 8 bytes), protocol version (after 10), build id, job id (after 95), proof
//! (after 127). Two builds link only when both set the mixed-builds flag; then requests between
//! them name functions, never descriptor offsets (see `link`). Reading the magic first means a stranger is refused as soon as it has sent 8
//! bytes; reading the version before the rest means a later protocol may change the hello's size
//! and still get a clear "speaks protocol vN" error here.
//!
//! Every message has a fixed size (127 bytes per direction in all, far under the 4 KiB bound):
//! nothing is allocated from a length read off the wire, and nothing past the proof is read, so
//! the first frame stays in the socket for the wire layer.
//!
//! The whole exchange must finish within [`HANDSHAKE_LIMIT`] (5 s): every read and write gets a
//! socket timeout of the time left until one overall deadline, so a peer that trickles a byte
//! every few seconds fails as surely as a silent one.
//!
//! # What the handshake does not do
//!
//! It authenticates the opening of a connection, not the bytes after it: there is no
//! encryption and no per-frame MAC, so someone who can rewrite packets on the path can still
//! hijack an established connection. The peer's rank and worker are proven to come from a
//! holder of the secret, but whether they make sense (rank below the job's size, not already
//! connected) is for the caller to check. The hello is sent before the peer is authenticated,
//! so anyone who connects learns the job id, rank and build id; none of them is a secret.
//!
//! # Where things are
//! - `build`: [`BuildId`], from the executable's build-id note (else its cached SHA-256);
//! - `error`: [`HandshakeError`], what went wrong and the fix;
//! - `exchange`: the hellos, the proofs and the deadline.

mod build;
mod error;
mod exchange;

use std::net::TcpStream;
use std::time::Duration;

pub(crate) use build::{BuildId, build_id, hash_file};
pub(crate) use error::{HandshakeError, Limit};

/// The first 8 bytes of every hello.
pub(crate) const MAGIC: [u8; 8] = *b"GOSSAMER";

/// The handshake and wire protocol spoken by this build.
pub(crate) const PROTOCOL_VERSION: u16 = 3;

/// How long [`handshake`] waits for the whole exchange.
pub(crate) const HANDSHAKE_LIMIT: Duration = Duration::from_secs(5);

/// Size of a hello (see the module docs' table).
const HELLO_LEN: usize = 95;
/// Size of a proof: one HMAC-SHA256 tag.
const PROOF_LEN: usize = 32;
/// Everything one side reads; the issue bounds it by 4 KiB.
const HANDSHAKE_LEN: usize = HELLO_LEN + PROOF_LEN;
const _: () = assert!(HANDSHAKE_LEN <= 4096);

const LABEL_DIALER: &[u8] = b"gossamer handshake v1: dialer proof";
const LABEL_ACCEPTOR: &[u8] = b"gossamer handshake v1: acceptor proof";

/// Who one end of a connection is. Each side sends its own and gets the peer's back from
/// [`handshake`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    /// The job (one run of `gsm run`, `srun` or `mpirun`); nodes of two jobs never talk.
    pub(crate) job: u64,
    /// The node's rank in the job.
    pub(crate) rank: u32,
    /// The worker on that node that owns the connection, or [`Identity::NODE`].
    pub(crate) worker: u32,
    /// The build the node runs ([`build_id`]).
    pub(crate) build: BuildId,
    /// Which life of its rank the node is: 0, then one more at each restart under
    /// `gsm run --recover`. Peers refuse links from an incarnation older than one they know.
    pub(crate) incarnation: u32,
    /// Whether the node links with nodes of other builds (`GSM_MIXED_BUILDS`).
    pub(crate) mixed: bool,
}

impl Identity {
    /// The `worker` of a connection owned by the node itself rather than by one of its workers
    /// (the coordinator's connections, for one).
    pub(crate) const NODE: u32 = u32::MAX;
}

/// Which end of the connection this side is: the one that called `connect` or the one that
/// called `accept`. The two sides prove different things (see the module docs), so they must
/// not both claim the same side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// This side connected.
    Dialer,
    /// This side accepted.
    Acceptor,
}

impl Side {
    fn label(self) -> &'static [u8] {
        match self {
            Side::Dialer => LABEL_DIALER,
            Side::Acceptor => LABEL_ACCEPTOR,
        }
    }

    fn other(self) -> Side {
        match self {
            Side::Dialer => Side::Acceptor,
            Side::Acceptor => Side::Dialer,
        }
    }
}

/// Opens a rack connection: exchanges identities with the peer, checks that it speaks this
/// protocol, runs this build and belongs to this job, and that both hold `secret`. Returns the
/// peer's identity once it has proven itself, within [`HANDSHAKE_LIMIT`].
///
/// `side` says whether this end connected or accepted; the other end must say the opposite.
/// The stream is left in blocking mode with the read and write timeouts it had before (on
/// success, and as far as possible on failure). No byte past the handshake is read.
///
/// ```ignore
/// let stream = TcpStream::connect(coordinator)?;
/// let me = Identity { job, rank, worker: Identity::NODE, build: build_id()?, incarnation: 0 };
/// let peer = handshake(&stream, &me, &secret, Side::Dialer)?;
/// assert_eq!(peer.rank, 0);
/// ```
///
/// # Errors
///
/// A [`HandshakeError`] that names the peer, what was wrong and the fix. The caller should
/// close this socket and carry on: garbage before a handshake harms nothing else.
pub(crate) fn handshake(
    stream: &TcpStream,
    me: &Identity,
    secret: &[u8],
    side: Side,
) -> Result<Identity, HandshakeError> {
    handshake_within(stream, me, secret, side, HANDSHAKE_LIMIT)
}

/// [`handshake`] with another time limit (tests use short ones).
pub(crate) fn handshake_within(
    stream: &TcpStream,
    me: &Identity,
    secret: &[u8],
    side: Side,
    limit: Duration,
) -> Result<Identity, HandshakeError> {
    exchange::exchange(stream, me, secret, side, limit, PROTOCOL_VERSION)
}
