//! `gsm daemon`: the per-host daemon that starts ranks for `gsm run --hosts`.
//!
//! It runs in the foreground (for a service manager, or a terminal), listens on `--listen`
//! (default `0.0.0.0:7420`) and serves each connection on a thread of its own. A connection
//! first proves it holds the cluster key (`--key`, see [`gossamer::cluster`]); at most
//! [`MAX_HANDSHAKES`] may be at that step at once, each for at most
//! [`gossamer::cluster::HANDSHAKE_LIMIT`], and one that fails is logged and closed: garbage, a
//! wrong key or silence at the port costs one thread for five seconds and touches no job.
//! Then it makes one request within [`FIRST_REQUEST`]: start a job's ranks here
//! ([`job`]), list the jobs (`gsm ps`) or kill one (`gsm kill`).
//!
//! The program a job names is run from its path if the file there has the hash the client
//! sent, else from the store (`--store`, programs kept by hash, see [`store`]), else the
//! daemon asks the client for it, checks its hash and stores it.
//!
//! Each job's ranks are guarded like those of `gsm run` on one host: if the daemon dies, even
//! by SIGKILL, the job's guardian kills their process groups. Stopping the daemon therefore
//! stops every job it runs.

pub(crate) mod job;
pub(crate) mod store;

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use anyhow::Context;
use gossamer::cluster::{
    Channel, ClusterError, ClusterKey, HANDSHAKE_LIMIT, JobInfo, Reply, Request,
};

use crate::cluster::{default_key, gossamer_dir};
use store::Store;

/// Options of `gsm daemon`.
#[derive(clap::Args, Debug)]
pub(crate) struct Options {
    /// The address and port to listen on.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:7420")]
    listen: SocketAddr,
    /// The cluster key, mode 0600 [default: ~/.gossamer/cluster.key].
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// Where programs sent by clients are kept [default: ~/.gossamer/programs].
    #[arg(long, value_name = "DIR")]
    store: Option<PathBuf>,
    /// The largest program a client may send, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    max_program_mib: u64,
}

/// How many connections may be proving the key at once; more are closed at once.
pub(crate) const MAX_HANDSHAKES: usize = 64;
/// How long a connection that has proven the key may take to make its request (and to take
/// each answer).
pub(crate) const FIRST_REQUEST: Duration = Duration::from_secs(5);

/// What every connection's thread shares.
pub(crate) struct Daemon {
    pub(crate) store: Store,
    pub(crate) max_program: u64,
    /// The jobs running here, by job id.
    pub(crate) jobs: Mutex<HashMap<u64, JobInfo>>,
}

/// Runs the daemon until it is killed.
pub(crate) fn serve(options: &Options) -> anyhow::Result<()> {
    let key_path = match &options.key {
        Some(path) => path.clone(),
        None => default_key()?,
    };
    let key = ClusterKey::load(&key_path)?;
    let store_dir = match &options.store {
        Some(dir) => dir.clone(),
        None => gossamer_dir()?.join("programs"),
    };
    let daemon = Arc::new(Daemon {
        store: Store::open(&store_dir)?,
        max_program: options.max_program_mib.saturating_mul(1 << 20),
        jobs: Mutex::new(HashMap::new()),
    });
    let listener = TcpListener::bind(options.listen)
        .with_context(|| format!("cannot listen on {}", options.listen))?;
    log(&format!(
        "listening on {}, key {}, program store {}",
        listener.local_addr()?,
        key_path.display(),
        store_dir.display()
    ));
    let handshaking = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                // Out of descriptors, most likely: wait for some to close.
                log(&format!("cannot accept a connection: {e}"));
                thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if handshaking.fetch_add(1, Ordering::AcqRel) >= MAX_HANDSHAKES {
            handshaking.fetch_sub(1, Ordering::AcqRel);
            log(&format!(
                "refused {}: {MAX_HANDSHAKES} connections are proving the key already",
                peer_of(&stream)
            ));
            continue;
        }
        let (key, daemon, handshaking) = (key.clone(), daemon.clone(), handshaking.clone());
        thread::spawn(move || {
            let peer = peer_of(&stream);
            let channel = Channel::accept(stream, &key, HANDSHAKE_LIMIT);
            handshaking.fetch_sub(1, Ordering::AcqRel);
            match channel {
                Ok(channel) => converse(channel, &daemon),
                Err(e) => log(&format!("refused {peer}: {e}")),
            }
        });
    }
    Ok(())
}

/// One authenticated connection: its first request says what it is.
fn converse(channel: Channel, daemon: &Daemon) {
    let peer = channel.peer();
    let local = channel.local();
    let stream = channel.stream();
    let split = stream
        .set_read_timeout(Some(FIRST_REQUEST))
        .and_then(|()| stream.set_write_timeout(Some(FIRST_REQUEST)))
        .map_err(|e| ClusterError::Io {
            peer: Some(peer),
            source: e,
        })
        .and_then(|()| channel.split());
    let (mut from, mut to) = match split {
        Ok(halves) => halves,
        Err(e) => return log(&format!("{peer}: {e}")),
    };
    let answer = match from.recv::<Request>() {
        Ok(Request::List) => {
            let jobs = daemon
                .jobs
                .lock()
                .expect("jobs lock")
                .values()
                .cloned()
                .collect();
            Reply::Jobs(jobs)
        }
        Ok(Request::KillJob(id)) => Reply::Killed(kill_job(daemon, id, &peer)),
        Ok(Request::Start(start)) => {
            let local = match local {
                Ok(local) => local,
                Err(e) => return log(&format!("{peer}: {e}")),
            };
            return job::run(daemon, start, from, to, local);
        }
        Ok(other) => Reply::Refused(format!(
            "a connection opens with a start, a listing or a kill, not {other:?}"
        )),
        Err(e) => return log(&format!("{peer}: no request: {e}")),
    };
    if let Err(e) = to.send(&answer) {
        log(&format!("{peer}: cannot answer: {e}"));
    }
}

/// Kills every rank of job `id` here (`gsm kill`); how many.
fn kill_job(daemon: &Daemon, id: u64, peer: &SocketAddr) -> u32 {
    let jobs = daemon.jobs.lock().expect("jobs lock");
    let Some(info) = jobs.get(&id) else {
        return 0;
    };
    log(&format!(
        "killing job {id:016x} ({} ranks here), as {peer} asked",
        info.ranks.len()
    ));
    for &(_, pid) in &info.ranks {
        crate::run::signal_group(pid, libc::SIGKILL);
    }
    u32::try_from(info.ranks.len()).unwrap_or(u32::MAX)
}

fn peer_of(stream: &TcpStream) -> String {
    stream
        .peer_addr()
        .map_or_else(|_| "an unknown peer".into(), |a| a.to_string())
}

/// Writes one `gsm daemon: ...` line to stderr.
pub(crate) fn log(message: &str) {
    let line = format!("gsm daemon: {message}\n");
    // Nothing more can be done if stderr is gone.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
