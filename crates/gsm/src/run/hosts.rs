//! `gsm run --hosts a,b,c -n N -- prog args...`: the ranks started by the hosts' daemons.
//!
//! gsm places the ranks (round-robin, or `--per-host K` in blocks), connects to the daemon
//! of every host that gets one (proving the cluster key, see [`gossamer::cluster`]), and asks
//! the host of rank 0 to start its ranks first: that daemon picks the coordinator's port, and
//! `GSM_COORD` for the others is that host's address with it. Each daemon runs the program
//! from its path if the file there is the same (by SHA-256), else from its store, else asks
//! gsm for it and stores it (gsm says `sent ... to HOST` when it does).
//!
//! The ranks get what they get on one host (`GSM_RANK`, `GSM_SIZE`, `GSM_COORD`, `GSM_JOB`,
//! a fresh `GSM_SECRET`, `GSM_LOCAL_SIZE` = the ranks on their host, `GSM_WORKERS` with
//! `--workers`) and every other `GSM_*` setting of gsm's environment, none of the daemon's;
//! gsm's `UCX_*` settings (UCX's configuration, for `GSM_TRANSPORT=ucx`) too, over the
//! daemon's; the rest of their environment is the daemon's. Their working directory is gsm's if it
//! exists on their host, else `/`.
//!
//! Output arrives line by line and is printed with the prefix `[rank] `, as on one host.
//! SIGINT and SIGTERM are forwarded to every rank. Fate sharing as on one host: once a rank
//! fails, the others get `GSM_PEER_TIMEOUT` + 2 s, then gsm has them killed. gsm and each
//! daemon send each other a heartbeat every `GSM_HEARTBEAT`; a daemon silent for
//! `GSM_PEER_TIMEOUT` is a lost host, which fails its ranks (named with it) and ends the job;
//! a daemon that hears nothing from gsm that long kills the job's ranks on its host, so a job
//! never outlives its `gsm run`.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use gossamer::cluster::{
    ClusterError, FrameReader, FrameWriter, PROGRAM_PIECE, Reply, Request, Start, file_hash,
};
use gossamer::env;
use serde_bytes::ByteBuf;

use super::{
    Cause, DRAIN, Error, Failure, Options, POLL, STRAGGLER_GRACE, Stream, catch_signals,
    caught_signals, cause, describe, failure_code, job_status, report, write_line,
};
use crate::cluster::{Host, connect_all, load_key, parse_hosts};

/// How long a daemon may take to start its ranks, hashing the program and storing it.
const START_LIMIT: Duration = Duration::from_secs(120);

/// The variables gsm sets for each job itself; the rest of its `GSM_*` are passed on.
const SET_BY_GSM: [&str; 10] = [
    env::RANK,
    env::SIZE,
    env::COORD,
    env::JOB,
    env::SECRET,
    env::LOCAL_SIZE,
    env::HOST,
    env::SUPERVISOR,
    env::RECOVER,
    env::INCARNATION,
];

type Writer = Arc<Mutex<FrameWriter<TcpStream>>>;

/// Runs a job on the daemons of `list`.
pub(super) fn run(options: &Options, list: &str) -> Result<ExitCode, Error> {
    let get = |name: &str| std::env::var(name).ok();
    let (heartbeat, peer_timeout) =
        env::heartbeat_and_peer_timeout(&get).map_err(|e| Error::Usage(e.to_string()))?;
    let hosts = parse_hosts(list).map_err(Error::Usage)?;
    let placement = place(usize::from(options.ranks), hosts.len(), options.per_host)?;
    let Some((program, args)) = options.command.split_first() else {
        return Err(Error::Usage("no program to run given".into()));
    };
    let path = resolve(program)?;
    // Hashed while the daemons are reached.
    let hashing = thread::spawn({
        let path = path.clone();
        move || file_hash(&path).with_context(|| format!("cannot read {}", path.display()))
    });
    let len = path
        .metadata()
        .context("cannot read the program's size")?
        .len();
    let key = load_key(options.key.as_ref())?;
    let job = env::random_job_id().context("cannot make a job id")?;
    let secret = env::Secret::random().context("cannot make a job secret")?;
    catch_signals().context("cannot install the SIGINT and SIGTERM handlers")?;

    let used: Vec<(Host, Vec<u32>)> = hosts
        .into_iter()
        .zip(placement)
        .filter(|(_, ranks)| !ranks.is_empty())
        .collect();
    let names: Vec<Host> = used.iter().map(|(h, _)| h.clone()).collect();
    let mut conversations = connect_all(&names, &key)?;
    let hash = hashing.join().expect("the hashing thread panicked")?;
    report(&format!(
        "job {job:016x}: {} ranks on {} hosts",
        options.ranks,
        used.len()
    ));

    let mut common: Vec<(ByteBuf, ByteBuf)> = std::env::vars_os()
        .filter(|(name, _)| {
            let name = name.as_bytes();
            (name.starts_with(b"GSM_") && !SET_BY_GSM.iter().any(|v| name == v.as_bytes()))
                || name.starts_with(b"UCX_")
        })
        .map(|(name, value)| bytes(&name, &value))
        .collect();
    common.push(bytes(env::SIZE, options.ranks.to_string()));
    common.push(bytes(env::JOB, format!("{job:016x}")));
    common.push(bytes(env::SECRET, OsStr::from_bytes(secret.as_bytes())));
    if let Some(workers) = options.workers {
        common.retain(|(name, _)| &name[..] != env::WORKERS.as_bytes());
        common.push(bytes(env::WORKERS, workers.to_string()));
    }
    let cwd = std::env::current_dir().unwrap_or_default();
    let start_for = |ranks: &[u32], coord: Option<SocketAddr>| {
        let mut env = common.clone();
        env.push(bytes(env::LOCAL_SIZE, ranks.len().to_string()));
        if let Some(coord) = coord {
            env.push(bytes(env::COORD, coord.to_string()));
        }
        Start {
            job,
            program: path.as_os_str().as_bytes().to_vec(),
            hash,
            len,
            args: args.iter().map(|a| ByteBuf::from(a.as_bytes())).collect(),
            env,
            cwd: cwd.as_os_str().as_bytes().to_vec(),
            ranks: ranks.to_vec(),
            coordinator: coord.is_none(),
            heartbeat_ms: millis(heartbeat),
            peer_timeout_ms: millis(peer_timeout),
        }
    };

    // Rank 0's host first: its daemon picks the coordinator's port.
    let (first, others) = conversations.split_at_mut(1);
    let port = begin(
        &mut first[0],
        &start_for(&used[0].1, None),
        &path,
        &used[0].0,
    )?
    .ok_or_else(|| anyhow!("host {} gave no port for rank 0", used[0].0.name))?;
    let coord = SocketAddr::new(used[0].0.addr.ip(), port);
    thread::scope(|scope| {
        let starts: Vec<_> = others
            .iter_mut()
            .zip(&used[1..])
            .map(|(conversation, (host, ranks))| {
                let start = start_for(ranks, Some(coord));
                let path = &path;
                scope.spawn(move || begin(conversation, &start, path, host))
            })
            .collect();
        starts
            .into_iter()
            .try_for_each(|s| s.join().expect("a start thread panicked").map(drop))
    })?;

    let grace = peer_timeout + STRAGGLER_GRACE;
    let ranks: Vec<Remote> = used
        .iter()
        .enumerate()
        .flat_map(|(h, (_, ranks))| {
            ranks.iter().map(move |&rank| Remote {
                rank,
                host: h,
                ended: false,
            })
        })
        .collect();
    Ok(supervise(
        conversations,
        names,
        ranks,
        heartbeat,
        peer_timeout,
        grace,
    ))
}

fn bytes(name: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> (ByteBuf, ByteBuf) {
    (
        ByteBuf::from(name.as_ref().as_bytes()),
        ByteBuf::from(value.as_ref().as_bytes()),
    )
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Which ranks each host runs: round-robin, or blocks of `per_host`.
fn place(ranks: usize, hosts: usize, per_host: Option<u16>) -> Result<Vec<Vec<u32>>, Error> {
    let mut placement = vec![Vec::new(); hosts];
    for rank in 0..ranks {
        let host = match per_host {
            None => rank % hosts,
            Some(k) => rank / usize::from(k),
        };
        let Some(on) = placement.get_mut(host) else {
            let k = per_host.unwrap_or(1);
            return Err(Error::Usage(format!(
                "{ranks} ranks at --per-host {k} need {} hosts; {hosts} given",
                ranks.div_ceil(usize::from(k))
            )));
        };
        on.push(rank as u32);
    }
    Ok(placement)
}

/// The program's absolute path: as given when it names a directory, else found on `PATH`.
fn resolve(program: &OsStr) -> Result<PathBuf, Error> {
    let name = program.to_string_lossy();
    let given = Path::new(program);
    let found = if program.as_bytes().contains(&b'/') {
        std::path::absolute(given).ok().filter(|p| p.is_file())
    } else {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(given))
                .find(|p| {
                    p.metadata()
                        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                })
                .and_then(|p| std::path::absolute(p).ok())
        })
    };
    found.ok_or_else(|| {
        Error::Usage(format!(
            "program '{name}' not found: give a path to it or a program on PATH"
        ))
    })
}

/// Asks one daemon to start its ranks, sending the program if it asks; the coordinator's port
/// if it runs rank 0.
fn begin(
    (from, to): &mut (FrameReader<TcpStream>, FrameWriter<TcpStream>),
    start: &Start,
    path: &Path,
    host: &Host,
) -> anyhow::Result<Option<u16>> {
    let on = |e: ClusterError| anyhow!("host {}: {e}", host.name);
    from.get_ref().set_read_timeout(Some(START_LIMIT))?;
    to.send(&Request::Start(start.clone())).map_err(on)?;
    loop {
        match from.recv::<Reply>().map_err(on)? {
            Reply::NeedProgram => send_program(to, path, start.len, host)?,
            Reply::Started {
                coordinator_port, ..
            } => return Ok(coordinator_port),
            Reply::Refused(why) => {
                return Err(anyhow!("host {} refused the job: {why}", host.name));
            }
            Reply::Heartbeat => {}
            other => {
                return Err(anyhow!(
                    "host {} answered a start with {other:?}",
                    host.name
                ));
            }
        }
    }
}

/// Sends the program in pieces, then an empty piece.
fn send_program(
    to: &mut FrameWriter<TcpStream>,
    path: &Path,
    len: u64,
    host: &Host,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut piece = vec![0u8; PROGRAM_PIECE];
    let mut sent = 0u64;
    loop {
        let n = match file.read(&mut piece) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        to.send(&Request::Program(piece[..n].to_vec()))
            .map_err(|e| anyhow!("host {}: {e}", host.name))?;
        if n == 0 {
            break;
        }
        sent += n as u64;
    }
    if sent != len {
        return Err(anyhow!(
            "{} changed while it was being sent",
            path.display()
        ));
    }
    report(&format!(
        "sent {} ({sent} bytes) to {} in {:.2} s",
        path.display(),
        host.name,
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// One rank, on its host.
struct Remote {
    rank: u32,
    host: usize,
    ended: bool,
}

/// What a host's reader thread hands the supervisor.
type Event = (usize, Result<Reply, ClusterError>);

/// Waits for every rank as `run::supervise` does on one host, over the daemons' connections;
/// returns gsm's status.
fn supervise(
    conversations: Vec<(FrameReader<TcpStream>, FrameWriter<TcpStream>)>,
    hosts: Vec<Host>,
    mut ranks: Vec<Remote>,
    heartbeat: Duration,
    peer_timeout: Duration,
    grace: Duration,
) -> ExitCode {
    let (tx, events) = mpsc::channel::<Event>();
    let mut writers: Vec<Writer> = Vec::with_capacity(hosts.len());
    for (h, (mut from, to)) in conversations.into_iter().enumerate() {
        // A host silent this long is lost; a send that long blocked, too.
        let timeouts = from
            .get_ref()
            .set_read_timeout(Some(peer_timeout))
            .and_then(|()| to.get_ref().set_write_timeout(Some(peer_timeout)));
        let tx = tx.clone();
        thread::spawn(move || {
            if let Err(e) = timeouts {
                let _ = tx.send((
                    h,
                    Err(ClusterError::Io {
                        peer: None,
                        source: e,
                    }),
                ));
                return;
            }
            loop {
                let reply = from.recv::<Reply>();
                let end = reply.is_err();
                if tx.send((h, reply)).is_err() || end {
                    return;
                }
            }
        });
        writers.push(Arc::new(Mutex::new(to)));
    }
    drop(tx);
    let done = Arc::new(AtomicBool::new(false));
    let beating = {
        let (writers, done) = (writers.clone(), done.clone());
        thread::spawn(move || {
            // A host whose send failed gets no more (its reader reports it lost), so that one
            // host's full socket cannot hold up the heartbeats of the others.
            let mut failed = vec![false; writers.len()];
            while !done.load(Ordering::Acquire) {
                thread::sleep(heartbeat);
                for (w, failed) in writers.iter().zip(&mut failed).filter(|(_, f)| !**f) {
                    *failed = w
                        .lock()
                        .expect("writer lock")
                        .send(&Request::Heartbeat)
                        .is_err();
                }
            }
        })
    };
    let mut live = vec![true; hosts.len()];
    let mut finished = vec![false; hosts.len()];
    let tell = |live: &[bool], request: &Request| {
        for (w, _) in writers.iter().zip(live).filter(|(_, live)| **live) {
            let _ = w.lock().expect("writer lock").send(request);
        }
    };
    let mut failures: Vec<Failure> = Vec::new();
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    // The first signal gsm forwarded: the reason of every end that follows.
    let mut stopped_by: Option<libc::c_int> = None;
    let mut finish_by: Option<Instant> = None;
    loop {
        for sig in caught_signals() {
            tell(&live, &Request::Signal(sig));
            stopped_by.get_or_insert(sig);
            kill_at.get_or_insert(Instant::now() + grace);
        }
        match next(&events) {
            Some((_, Ok(Reply::Output { rank, stderr, line }))) => {
                let mut prefixed = format!("[{rank}] ").into_bytes();
                prefixed.extend_from_slice(&line);
                let stream = if stderr { Stream::Err } else { Stream::Out };
                let _ = write_line(stream, &prefixed);
            }
            Some((h, Ok(Reply::Exited { rank, pid, status }))) => {
                if let Some(r) = ranks
                    .iter_mut()
                    .find(|r| r.rank == rank && r.host == h && !r.ended)
                {
                    r.ended = true;
                    let status = ExitStatus::from_raw(status);
                    if let Some(code) = failure_code(status) {
                        let what = format!(
                            "rank {rank} (pid {pid}) on host {} {}",
                            hosts[h].name,
                            describe(status)
                        );
                        report(&what);
                        failures.push(Failure {
                            cause: cause(status, killed, stopped_by),
                            rank: rank as usize,
                            code,
                            what,
                        });
                        kill_at.get_or_insert(Instant::now() + grace);
                    }
                }
            }
            Some((h, Ok(Reply::Finished))) => finished[h] = true,
            Some((_, Ok(Reply::Heartbeat))) | None => {}
            Some((h, Ok(other))) => {
                lose(
                    h,
                    &format!("it sent {other:?}"),
                    &hosts,
                    &mut ranks,
                    &mut live,
                    &mut failures,
                );
                kill_at.get_or_insert(Instant::now() + grace);
            }
            Some((h, Err(e))) if live[h] => {
                let why = match e {
                    ClusterError::Silent { .. } => {
                        format!("no word from its daemon in {peer_timeout:?}")
                    }
                    e => e.to_string(),
                };
                if !finished[h] {
                    lose(h, &why, &hosts, &mut ranks, &mut live, &mut failures);
                    kill_at.get_or_insert(Instant::now() + grace);
                }
                live[h] = false;
            }
            Some((_, Err(_))) => {}
        }
        if ranks.iter().all(|r| r.ended) {
            let by = *finish_by.get_or_insert_with(|| {
                tell(&live, &Request::Finish);
                Instant::now() + DRAIN + peer_timeout
            });
            let all_finished = live
                .iter()
                .zip(&finished)
                .all(|(live, done)| !live || *done);
            if all_finished || Instant::now() >= by {
                break;
            }
        } else if !killed && kill_at.is_some_and(|at| Instant::now() >= at) {
            tell(&live, &Request::Kill);
            killed = true;
        }
    }
    done.store(true, Ordering::Release);
    let _ = beating.join();
    job_status(&failures)
}

/// The next event, or `None` after a poll interval without one.
fn next(events: &Receiver<Event>) -> Option<Event> {
    match events.recv_timeout(POLL) {
        Ok(event) => Some(event),
        Err(RecvTimeoutError::Timeout) => None,
        // Every host's reader has ended: nothing more will come, but the deadlines run on.
        Err(RecvTimeoutError::Disconnected) => {
            thread::sleep(POLL);
            None
        }
    }
}

/// Host `h` is lost: its ranks still running fail with it, in one report naming them.
fn lose(
    h: usize,
    why: &str,
    hosts: &[Host],
    ranks: &mut [Remote],
    live: &mut [bool],
    failures: &mut Vec<Failure>,
) {
    live[h] = false;
    let lost: Vec<u32> = ranks
        .iter_mut()
        .filter(|r| r.host == h && !r.ended)
        .map(|r| {
            r.ended = true;
            r.rank
        })
        .collect();
    let Some(&first) = lost.first() else {
        return;
    };
    let list: Vec<String> = lost.iter().map(u32::to_string).collect();
    let what = format!(
        "host {} lost ({why}): rank{} {} ended with it",
        hosts[h].name,
        if lost.len() > 1 { "s" } else { "" },
        list.join(", ")
    );
    report(&what);
    failures.push(Failure {
        cause: Cause::HostLost,
        rank: first as usize,
        code: gossamer::EXIT_PEER_LOST,
        what,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_go_round_robin_or_in_blocks() {
        let round = place(8, 3, None).unwrap();
        assert_eq!(round, vec![vec![0, 3, 6], vec![1, 4, 7], vec![2, 5]]);
        let blocks = place(5, 3, Some(2)).unwrap();
        assert_eq!(blocks, vec![vec![0, 1], vec![2, 3], vec![4]]);
        let Err(Error::Usage(why)) = place(8, 3, Some(2)) else {
            panic!("8 ranks at 2 per host fit on 4 hosts, not 3");
        };
        assert!(why.contains("need 4 hosts; 3 given"), "{why}");
    }

    #[test]
    fn a_program_is_found_by_path_or_on_path() {
        let sh = resolve(OsStr::new("sh")).unwrap_or_else(|_| panic!("sh is on PATH"));
        assert!(sh.is_absolute(), "{}", sh.display());
        let Err(Error::Usage(why)) = resolve(OsStr::new("./no-such-program")) else {
            panic!("a missing program is a usage error");
        };
        assert!(why.contains("not found"), "{why}");
    }
}
