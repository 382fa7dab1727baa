//! What `gsm run`, `gsm ps` and `gsm kill` ask a daemon, and what it answers.
//!
//! A connection carries one conversation: a job (a [`Request::Start`], the program's pieces if
//! the daemon asks for them, then signals, heartbeats and — in a job that recovers lost
//! ranks — restarts and fences until the job ends), a listing
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
    /// In a job that recovers lost ranks ([`Start::recover`]): start `incarnation` of `rank`
    /// here, as one more rank of the job. `state_from` names the job's host (its
    /// [`Start::host`]) whose rank this was when the rank moves here from a lost host: the
    /// daemon first checks that the job's shared state directory holds that host's mark
    /// ([`Start::shared_state`]), and refuses otherwise. Answered by [`Reply::Restarted`] or
    /// [`Reply::RestartRefused`].
    Restart {
        /// The rank.
        rank: u32,
        /// Its new life (`GSM_INCARNATION`).
        incarnation: u32,
        /// The host the rank's state was written on, when that is another host.
        state_from: Option<u32>,
    },
    /// Kill `incarnation` of `rank` here (its process group, SIGKILL) if it still runs: rank 0
    /// lost it ([`Reply::Fence`]).
    Fence {
        /// The rank.
        rank: u32,
        /// The life to kill; a newer one is left alone.
        incarnation: u32,
    },
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
    /// The ranks to start here. Empty only in a job that recovers lost ranks: the host is a
    /// spare, which runs ranks moved from lost hosts.
    pub ranks: Vec<u32>,
    /// Whether rank 0 is among them: the daemon then picks the coordinator's port and answers
    /// it in [`Reply::Started`].
    pub coordinator: bool,
    /// How often the client sends heartbeats, in milliseconds.
    pub heartbeat_ms: u64,
    /// The silence after which the daemon kills the job's ranks here, in milliseconds.
    pub peer_timeout_ms: u64,
    /// Whether the job recovers lost ranks (`gsm run --recover`): each rank gets
    /// `GSM_RECOVER=1` and `GSM_INCARNATION`, rank 0 a pipe to ask for fences on
    /// (`GSM_SUPERVISOR`, forwarded as [`Reply::Fence`]), and the client may restart ranks
    /// ([`Request::Restart`]).
    pub recover: bool,
    /// This host's index among the job's hosts.
    pub host: u32,
    /// Whether the job's state directory is on storage every host of the job shares
    /// (`gsm run --shared-state`): the daemon leaves a mark of this host there for the job's
    /// life, which a host taking over a rank of this one checks for.
    pub shared_state: bool,
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
    /// After [`Request::Restart`]: the rank's new life runs.
    Restarted {
        /// The rank.
        rank: u32,
        /// Its life.
        incarnation: u32,
        /// Its process id.
        pid: u32,
    },
    /// After [`Request::Restart`]: the rank was not started here, and why.
    RestartRefused {
        /// The rank.
        rank: u32,
        /// Why not.
        why: String,
    },
    /// Rank 0 lost `incarnation` of `rank` and asks that it be killed wherever it runs
    /// (a process that was only silent or stopped would not end itself).
    Fence {
        /// The rank.
        rank: u32,
        /// The life.
        incarnation: u32,
    },
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
