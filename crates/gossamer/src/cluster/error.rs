//! What can go wrong on a daemon connection, each with the fix where there is one.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::PROTOCOL_VERSION;

/// Why a cluster key or a daemon connection failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClusterError {
    /// The cluster key file cannot be used.
    Key {
        /// The file.
        path: PathBuf,
        /// What is wrong with it, and the fix.
        why: String,
    },
    /// No connection to the daemon.
    Connect {
        /// The daemon's address.
        addr: SocketAddr,
        /// What the system said.
        source: io::Error,
    },
    /// The connection failed.
    Io {
        /// The peer, when known.
        peer: Option<SocketAddr>,
        /// What the system said.
        source: io::Error,
    },
    /// The peer closed the connection.
    Closed {
        /// The peer.
        peer: SocketAddr,
    },
    /// The peer said nothing in time.
    Silent {
        /// The peer.
        peer: SocketAddr,
        /// How long it was given (zero: the stream's read timeout).
        after: Duration,
    },
    /// The peer does not speak this protocol at all.
    NotCluster {
        /// The peer.
        peer: SocketAddr,
        /// Its first 8 bytes.
        sent: [u8; 8],
    },
    /// The peer speaks another version of it.
    Version {
        /// The peer.
        peer: SocketAddr,
        /// Its version.
        theirs: u16,
    },
    /// The peer does not hold this cluster key.
    WrongKey {
        /// The peer.
        peer: SocketAddr,
    },
    /// A frame longer than [`super::MAX_PAYLOAD`].
    TooLarge {
        /// The peer.
        peer: SocketAddr,
        /// The length it claimed or that was to be sent.
        len: usize,
    },
    /// A frame whose MAC fails: altered, replayed or out of order on the way.
    BadMac {
        /// The peer.
        peer: SocketAddr,
    },
    /// A frame that does not hold the message expected.
    Decode {
        /// The peer.
        peer: SocketAddr,
        /// What the decoder said.
        error: String,
    },
}

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterError::Key { path, why } => {
                write!(f, "cluster key {}: {why}", path.display())
            }
            ClusterError::Connect { addr, source } => write!(
                f,
                "cannot connect to the daemon at {addr}: {source}; is `gsm daemon` running \
                 there, and listening on that port?"
            ),
            ClusterError::Io {
                peer: Some(peer),
                source,
            } => write!(f, "connection with {peer} failed: {source}"),
            ClusterError::Io { peer: None, source } => write!(f, "connection failed: {source}"),
            ClusterError::Closed { peer } => write!(f, "{peer} closed the connection"),
            ClusterError::Silent { peer, after } if after.is_zero() => {
                write!(f, "{peer} said nothing in time")
            }
            ClusterError::Silent { peer, after } => {
                write!(f, "{peer} said nothing in time (limit {after:?})")
            }
            ClusterError::NotCluster { peer, sent } => write!(
                f,
                "{peer} is not a gsm client or daemon (it opened with {:?})",
                String::from_utf8_lossy(sent)
            ),
            ClusterError::Version { peer, theirs } => write!(
                f,
                "{peer} speaks cluster protocol version {theirs}, this gsm speaks \
                 {PROTOCOL_VERSION}: run the same gsm release on every host"
            ),
            ClusterError::WrongKey { peer } => write!(
                f,
                "{peer} does not hold this cluster key: give every host and every `gsm run` \
                 the same key file"
            ),
            ClusterError::TooLarge { peer, len } => write!(
                f,
                "a frame of {len} bytes with {peer}, over the bound of {}",
                super::MAX_PAYLOAD
            ),
            ClusterError::BadMac { peer } => write!(
                f,
                "a frame from {peer} failed its check: it was altered, replayed or reordered \
                 on the way"
            ),
            ClusterError::Decode { peer, error } => {
                write!(f, "a message from {peer} does not decode: {error}")
            }
        }
    }
}

impl std::error::Error for ClusterError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClusterError::Connect { source, .. } | ClusterError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
