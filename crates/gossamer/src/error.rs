//! How a node fails: [`RackError`] when it cannot start or join its job, and the exit statuses
//! a rank ends with.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use crate::env::EnvError;

/// The exit status of a rank that lost a peer (it died, went silent or closed its links).
pub const EXIT_PEER_LOST: u8 = 69;
/// The exit status of a rank that received a bad frame from a peer after its handshake.
pub const EXIT_BAD_FRAME: u8 = 76;
/// The exit status of a rank that could not join the job (see [`RackError`]).
pub const EXIT_SETUP: u8 = 78;
/// The exit status of a job whose `main` panicked.
pub const EXIT_PANIC: u8 = 101;

/// Why a node could not start or join its job.
#[derive(Debug)]
#[non_exhaustive]
pub enum RackError {
    /// A `GSM_*` setting or launcher variable is wrong.
    Env(EnvError),
    /// The settings do not make a job.
    Config {
        /// What is wrong.
        why: String,
    },
    /// A peer could not be reached before `GSM_CONNECT_TIMEOUT`.
    Unreachable {
        /// The rank that was dialed.
        rank: u32,
        /// Where.
        addr: SocketAddr,
        /// For how long.
        waited: Duration,
        /// The last error.
        why: String,
    },
    /// Ranks that did not show up before `GSM_CONNECT_TIMEOUT`.
    MissingRanks {
        /// Their numbers.
        ranks: Vec<u32>,
        /// For how long they were awaited.
        waited: Duration,
    },
    /// The link to a rank could not be set up on the transport `GSM_TRANSPORT` asks for.
    Transport {
        /// The other rank.
        rank: u32,
        /// What went wrong.
        why: String,
    },
    /// A peer failed the handshake (the message names the peer and the fix).
    Handshake(String),
    /// A peer broke the bootstrap protocol.
    Protocol {
        /// The peer's address.
        peer: String,
        /// What it did.
        why: String,
    },
    /// A system call failed.
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The runtime could not start.
    Runtime(trust::BuildError),
}

impl RackError {
    pub(crate) fn io(what: &str, source: std::io::Error) -> RackError {
        RackError::Io {
            what: what.into(),
            source,
        }
    }
}

impl fmt::Display for RackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RackError::Env(e) => write!(f, "{e}"),
            RackError::Config { why } => write!(f, "{why}"),
            RackError::Unreachable {
                rank,
                addr,
                waited,
                why,
            } => write!(
                f,
                "cannot reach rank {rank} at {addr} for {} s: {why}",
                waited.as_secs()
            ),
            RackError::MissingRanks { ranks, waited } => {
                let list: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
                write!(
                    f,
                    "rank{} {} did not join within {} s (GSM_CONNECT_TIMEOUT): did they start, \
                     with the same GSM_COORD and secret?",
                    if ranks.len() == 1 { "" } else { "s" },
                    list.join(", "),
                    waited.as_secs()
                )
            }
            RackError::Transport { rank, why } => {
                write!(f, "cannot set up the link to rank {rank}: {why}")
            }
            RackError::Handshake(e) => write!(f, "{e}"),
            RackError::Protocol { peer, why } => write!(f, "peer {peer}: {why}"),
            RackError::Io { what, source } => write!(f, "{what}: {source}"),
            RackError::Runtime(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for RackError {}

impl From<EnvError> for RackError {
    fn from(e: EnvError) -> Self {
        RackError::Env(e)
    }
}
