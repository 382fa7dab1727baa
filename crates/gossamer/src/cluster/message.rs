//! What `gsm run`, `gsm ps` and `gsm kill` ask a daemon, and what it answers.
//!
//! A connection carries one conversation: a job (a [`Request::Start`], the program's pieces if
//! the daemon asks for them, then signals and heartbeats until the job ends), a listing
//! ([`Request::List`]) or a kill ([`Request::KillJob`]).

use serde::{Deserialize, Serialize};

/// From a client to a daemon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Start some ranks of a job on this host.
    Start(Start),
    /// The next piece of the program, after [`Reply::NeedProgram`]; an empty piece ends it.
    Program(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Send this signal to every rank of the job on this host.
    Signal(i32),
    /// Kill every rank of the job on this host (SIGKILL).
    Kill,
    /// Every rank has ended: kill what is left in their process groups, send what they wrote
    /// and answer [`Reply::Finished`].
    Finish,
    /// The client is alive.
    Heartbeat,
    /// List the jobs running here.
    List,
    /// Kill every rank of this job on this host.
    KillJob(u64),
}

/// The ranks of a job a daemon is asked to start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Start {
    /// The job id (`GSM_JOB`).
    pub job: u64,
    /// The program's absolute path on the launching host.
    #[serde(with = "serde_bytes")]
    pub program: Vec<u8>,
    /// Its SHA-256.
    pub hash: [u8; 32],
    /// Its length in bytes.
    pub len: u64,
    /// Its arguments.
    pub args: Vec<serde_bytes::ByteBuf>,
    /// Variables every rank gets, besides `GSM_RANK` (and `GSM_COORD` on the coordinator's
    /// host).
    pub env: Vec<(serde_bytes::ByteBuf, serde_bytes::ByteBuf)>,
    /// The launching directory, the ranks' working directory where it exists on this host.
    #[serde(with = "serde_bytes")]
    pub cwd: Vec<u8>,
    /// The ranks to start here.
    pub ranks: Vec<u32>,
    /// Whether rank 0 is among them: the daemon then picks the coordinator's port and answers
    /// it in [`Reply::Started`].
    pub coordinator: bool,
    /// How often the client sends heartbeats, in milliseconds.
    pub heartbeat_ms: u64,
    /// The silence after which the daemon kills the job's ranks here, in milliseconds.
    pub peer_timeout_ms: u64,
}

/// From a daemon to a client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// This host lacks the program (no file at its path with its hash, none stored): send it.
    NeedProgram,
    /// The ranks run.
    Started {
        /// The coordinator's port, on the host that runs rank 0.
        coordinator_port: Option<u16>,
        /// `(rank, pid)` of each.
        pids: Vec<(u32, u32)>,
    },
    /// A line a rank wrote.
    Output {
        /// The rank.
        rank: u32,
        /// Whether it wrote it to stderr.
        stderr: bool,
        /// The line, with its newline if it had one.
        #[serde(with = "serde_bytes")]
        line: Vec<u8>,
    },
    /// A rank ended.
    Exited {
        /// The rank.
        rank: u32,
        /// Its process id.
        pid: u32,
        /// Its wait status, as `waitpid` gives it.
        status: i32,
    },
    /// The daemon will not do what was asked, and why.
    Refused(String),
    /// The daemon is alive.
    Heartbeat,
    /// After [`Request::Finish`]: everything the ranks wrote has been sent.
    Finished,
    /// The jobs running on this host.
    Jobs(Vec<JobInfo>),
    /// How many ranks [`Request::KillJob`] killed.
    Killed(u32),
}

/// A job as `gsm ps` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobInfo {
    /// The job id.
    pub job: u64,
    /// The program it runs.
    pub program: String,
    /// `(rank, pid)` of its ranks still running on this host.
    pub ranks: Vec<(u32, u32)>,
    /// Who started it: the client's address.
    pub client: String,
    /// When, in seconds since the Unix epoch.
    pub started: u64,
}
