//! Why a handshake failed, in words that name the peer and the fix.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use super::{BuildId, HANDSHAKE_LEN};

/// Why a handshake failed. `Display` names the peer and what to do about it.
#[derive(Debug)]
pub(crate) enum HandshakeError {
    /// The secret passed in is empty, which would prove nothing.
    NoSecret,
    /// The stream has no peer address (not connected, or already reset).
    NotConnected {
        /// Why `peer_addr` failed.
        source: io::Error,
    },
    /// The operating system gave no random bytes for the nonce.
    Random {
        /// getrandom's error.
        error: getrandom::Error,
    },
    /// The peer closed (or reset) the connection before the handshake was complete.
    Closed {
        /// The peer's address.
        peer: SocketAddr,
        /// Bytes of the peer's handshake received before it closed.
        received: usize,
    },
    /// The handshake did not complete within the limit.
    Timeout {
        /// The peer's address.
        peer: SocketAddr,
        /// The limit that passed ([`HANDSHAKE_LIMIT`](super::HANDSHAKE_LIMIT) unless a test chose another).
        limit: Duration,
        /// Bytes of the peer's handshake received by then.
        received: usize,
    },
    /// Another socket error.
    Io {
        /// The peer's address.
        peer: SocketAddr,
        /// The error.
        source: io::Error,
    },
    /// The first bytes are not the magic: not a gossamer node at all.
    NotGossamer {
        /// The peer's address.
        peer: SocketAddr,
        /// What it sent instead (shown escaped, never trusted).
        sent: [u8; 8],
    },
    /// The peer speaks another protocol version.
    Version {
        /// The peer's address.
        peer: SocketAddr,
        /// Its version.
        theirs: u16,
        /// Ours.
        ours: u16,
    },
    /// The peer runs another binary.
    Build {
        /// The peer's address.
        peer: SocketAddr,
        /// Its build.
        theirs: BuildId,
        /// Ours.
        ours: BuildId,
        /// Whether the peer and this node allow mixed builds (`GSM_MIXED_BUILDS`).
        mixed: (bool, bool),
    },
    /// The peer's hello has flags this build does not know.
    Flags {
        /// The peer's address.
        peer: SocketAddr,
        /// Its flags byte.
        flags: u8,
    },
    /// The peer belongs to another job.
    Job {
        /// The peer's address.
        peer: SocketAddr,
        /// Its job.
        theirs: u64,
        /// Ours.
        ours: u64,
    },
    /// The peer's proof does not match: it does not hold our secret (or sent garbage where the
    /// proof belongs, which no one can tell apart).
    WrongSecret {
        /// The peer's address.
        peer: SocketAddr,
    },
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandshakeError::NoSecret => f.write_str(
                "the job secret is empty: set GSM_SECRET (or put one in ~/.gossamer/cookie)",
            ),
            HandshakeError::NotConnected { source } => write!(
                f,
                "cannot handshake on a socket without a peer ({source}): connect it first"
            ),
            HandshakeError::Random { error } => write!(
                f,
                "cannot draw a handshake nonce from the operating system ({error}): \
                 is the random device available?"
            ),
            HandshakeError::Closed { peer, received } => write!(
                f,
                "peer {peer} closed the connection during the handshake (after {received} of \
                 {HANDSHAKE_LEN} bytes): see that node's log for why it refused"
            ),
            HandshakeError::Timeout {
                peer,
                limit,
                received,
            } => write!(
                f,
                "no handshake from peer {peer} within {} (got {received} of {HANDSHAKE_LEN} \
                 bytes): is it a gossamer node of this job, and is it alive?",
                Limit(*limit)
            ),
            HandshakeError::Io { peer, source } => {
                write!(f, "handshake with peer {peer} failed: {source}")
            }
            HandshakeError::NotGossamer { peer, sent } => write!(
                f,
                "peer {peer} is not a gossamer peer (it began with \"{}\"): check the address \
                 and port",
                sent.escape_ascii()
            ),
            HandshakeError::Version { peer, theirs, ours } => write!(
                f,
                "peer {peer} speaks protocol v{theirs}, this build v{ours}: start the same \
                 binary everywhere"
            ),
            HandshakeError::Build {
                peer,
                theirs,
                ours,
                mixed,
            } => {
                write!(
                    f,
                    "peer {peer} runs another build ({theirs} ≠ {ours}): start the same binary \
                     everywhere"
                )?;
                match mixed {
                    (false, false) => write!(
                        f,
                        ", or set GSM_MIXED_BUILDS=1 on every node to let builds call each \
                         other's functions by name"
                    ),
                    (true, false) => write!(f, ", or set GSM_MIXED_BUILDS=1 here too"),
                    _ => write!(f, ", or set GSM_MIXED_BUILDS=1 on the peer too"),
                }
            }
            HandshakeError::Flags { peer, flags } => write!(
                f,
                "peer {peer} sent hello flags {flags:#04x}, which this build does not know: \
                 start the same version everywhere"
            ),
            HandshakeError::Job { peer, theirs, ours } => write!(
                f,
                "peer {peer} belongs to job {theirs:#018x}, this is job {ours:#018x}: a stale \
                 process from another run? stop it"
            ),
            HandshakeError::WrongSecret { peer } => write!(
                f,
                "peer {peer} has the wrong secret: set the same GSM_SECRET (or \
                 ~/.gossamer/cookie) on every node"
            ),
        }
    }
}

impl std::error::Error for HandshakeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HandshakeError::NotConnected { source } | HandshakeError::Io { source, .. } => {
                Some(source)
            }
            _ => None,
        }
    }
}

/// Shows a limit as people write it: `5 s`, `300 ms`.
pub(crate) struct Limit(pub(crate) Duration);

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(1000) {
            write!(f, "{} s", ms / 1000)
        } else {
            write!(f, "{ms} ms")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handshake::HANDSHAKE_LIMIT;

    #[test]
    fn default_limit_reads_as_five_seconds() {
        let err = HandshakeError::Timeout {
            peer: "127.0.0.1:41234".parse().expect("an address"),
            limit: HANDSHAKE_LIMIT,
            received: 0,
        };
        assert!(
            err.to_string()
                .starts_with("no handshake from peer 127.0.0.1:41234 within 5 s"),
            "{err}"
        );
    }
}
