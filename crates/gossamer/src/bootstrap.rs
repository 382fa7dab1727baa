//! Bootstrap: how the nodes of a job find each other and connect.
//!
//! 1. Every rank binds a data listener. Rank 0 also listens at the coordinator address.
//! 2. Every other rank connects to the coordinator (retrying until `GSM_CONNECT_TIMEOUT`),
//!    proves itself with the handshake and registers `{rank, data address, workers}`. Once all
//!    ranks are in, rank 0 sends everyone the table of all nodes; a rank missing at the
//!    deadline fails the job with a message naming it.
//! 3. Every worker of every node gets one link to every worker of every other node: the
//!    lower rank dials, the higher accepts. The dialer sends, after the handshake, the index
//!    of the worker it wants on the other side (4 bytes), so each link lands on the worker
//!    that is the trustee for everything sent on it.
//!
//! The coordinator connections stay open for the life of the job: they carry the end of the
//! job (`Exit`, `Done`), which rank was lost (`Lost`) and, by closing, tell rank 0 that a rank
//! died.
//!
//! A connection that fails its handshake (garbage, another job, another build, a wrong
//! secret) is refused and logged; the job carries on waiting for the real peer.

use std::collections::{BTreeSet, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::env::Settings;
use crate::error::RackError;
use crate::handshake::{self, Identity, Side};
use crate::state::NewLink;

/// The largest coordinator message: a table of 64 Ki nodes fits.
const MAX_BOOT_MESSAGE: usize = 1 << 20;

/// What the coordinator connections carry.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Boot {
    Register {
        addr: SocketAddr,
        workers: u32,
    },
    Table {
        nodes: Vec<(SocketAddr, u32)>,
    },
    /// Rank 0's main returned: end the job with this status.
    Exit {
        code: u8,
    },
    /// This rank has stopped serving and is about to exit.
    Done,
    /// The sender lost this rank and is ending: rank 0 tells every other rank, another rank
    /// tells rank 0 (which tells the rest).
    Lost {
        rank: u32,
        why: String,
    },
}

pub(crate) fn send(stream: &mut TcpStream, message: &Boot) -> std::io::Result<()> {
    let body = postcard::to_allocvec(message).map_err(std::io::Error::other)?;
    let mut bytes = (body.len() as u32).to_le_bytes().to_vec();
    bytes.extend_from_slice(&body);
    stream.write_all(&bytes)
}

pub(crate) fn receive(stream: &mut TcpStream) -> std::io::Result<Boot> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_BOOT_MESSAGE {
        return Err(std::io::Error::other(format!(
            "coordinator message of {len} bytes > {MAX_BOOT_MESSAGE}"
        )));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    postcard::from_bytes(&body)
        .map_err(|e| std::io::Error::other(format!("bad coordinator message: {e}")))
}

/// Every node's data address and worker count, by rank.
type NodeTable = Vec<(SocketAddr, u32)>;

/// What bootstrap hands to the rack: the node table, each local worker's links, and the
/// coordinator connections (rank 0: one per other rank; others: the one to rank 0).
#[derive(Debug)]
pub(crate) struct Connected {
    pub(crate) workers: Vec<u32>,
    pub(crate) links: Vec<Vec<NewLink>>,
    pub(crate) coordination: Vec<(u32, TcpStream)>,
}

fn identity(settings: &Settings, worker: u32) -> Result<Identity, RackError> {
    Ok(Identity {
        job: settings.job,
        rank: settings.rank as u32,
        worker,
        build: handshake::build_id().map_err(|e| RackError::io("reading this executable", e))?,
    })
}

/// Connects this node to the others.
pub(crate) fn connect(settings: &Settings, workers: u32) -> Result<Connected, RackError> {
    let deadline = Instant::now() + settings.connect_timeout;
    let me = settings.rank as u32;
    let listener = TcpListener::bind((settings.listen_host, 0))
        .map_err(|e| RackError::io("binding this rank's listener", e))?;
    let data_addr = listener
        .local_addr()
        .map_err(|e| RackError::io("reading the listener's address", e))?;
    let coordinator = settings.coordinator.ok_or_else(|| RackError::Config {
        why: "a rack of several nodes needs GSM_COORD".into(),
    })?;
    let (nodes, coordination) = if me == 0 {
        coordinate(settings, coordinator, data_addr, workers, deadline)?
    } else {
        register(settings, coordinator, data_addr, workers, deadline)?
    };
    let worker_counts: Vec<u32> = nodes.iter().map(|&(_, w)| w).collect();
    // Every rank has the table about when rank 0 sent it: linking gets a whole timeout of its
    // own, so that a slow registration (a loaded machine) cannot leave it too little.
    let links = link_up(
        settings,
        &listener,
        &nodes,
        workers,
        Instant::now() + settings.connect_timeout,
    )?;
    Ok(Connected {
        workers: worker_counts,
        links,
        coordination,
    })
}

/// Rank 0: accepts every other rank's registration and sends the table.
fn coordinate(
    settings: &Settings,
    at: SocketAddr,
    data_addr: SocketAddr,
    workers: u32,
    deadline: Instant,
) -> Result<(NodeTable, Vec<(u32, TcpStream)>), RackError> {
    let listener =
        TcpListener::bind(at).map_err(|e| RackError::io(&format!("listening at {at}"), e))?;
    let me = identity(settings, Identity::NODE)?;
    let size = settings.size as u32;
    let mut nodes: Vec<Option<(SocketAddr, u32)>> = vec![None; settings.size];
    nodes[0] = Some((data_addr, workers));
    let mut conns = Vec::new();
    while conns.len() + 1 < settings.size {
        let missing = (1..size).filter(|&r| nodes[r as usize].is_none()).collect();
        let (mut stream, addr) =
            accept_until(&listener, deadline).map_err(|_| RackError::MissingRanks {
                ranks: missing,
                waited: settings.connect_timeout,
            })?;
        let accepted = (|| {
            let peer =
                handshake::handshake(&stream, &me, settings.secret.as_bytes(), Side::Acceptor)
                    .map_err(|e| e.to_string())?;
            if peer.worker != Identity::NODE || peer.rank == 0 || peer.rank >= size {
                return Err(format!("registers as rank {} of {size}", peer.rank));
            }
            if nodes[peer.rank as usize].is_some() {
                return Err(format!("registers as rank {} a second time", peer.rank));
            }
            stream
                .set_read_timeout(Some(handshake::HANDSHAKE_LIMIT))
                .map_err(|e| e.to_string())?;
            match receive(&mut stream).map_err(|e| e.to_string())? {
                Boot::Register {
                    addr: their,
                    workers,
                } if workers > 0 => {
                    // A rank listening on all interfaces is reached where it connected from.
                    let reach = if their.ip().is_unspecified() {
                        SocketAddr::new(addr.ip(), their.port())
                    } else {
                        their
                    };
                    Ok((peer.rank, reach, workers))
                }
                other => Err(format!("sent {other:?} instead of its registration")),
            }
        })();
        match accepted {
            Ok((rank, reach, w)) => {
                nodes[rank as usize] = Some((reach, w));
                conns.push((rank, stream));
            }
            Err(why) => eprintln!("gossamer: rank 0: refused a connection from {addr}: {why}"),
        }
    }
    let nodes: Vec<(SocketAddr, u32)> = nodes.into_iter().map(|n| n.expect("all in")).collect();
    for (rank, stream) in &mut conns {
        send(
            stream,
            &Boot::Table {
                nodes: nodes.clone(),
            },
        )
        .map_err(|e| RackError::io(&format!("sending the table to rank {rank}"), e))?;
        stream
            .set_read_timeout(None)
            .map_err(|e| RackError::io("configuring a coordinator connection", e))?;
    }
    Ok((nodes, conns))
}

/// Ranks other than 0: registers with the coordinator and waits for the table.
fn register(
    settings: &Settings,
    coordinator: SocketAddr,
    data_addr: SocketAddr,
    workers: u32,
    deadline: Instant,
) -> Result<(NodeTable, Vec<(u32, TcpStream)>), RackError> {
    let me = identity(settings, Identity::NODE)?;
    let mut stream = dial_until(coordinator, 0, deadline, settings.connect_timeout)?;
    let peer = handshake::handshake(&stream, &me, settings.secret.as_bytes(), Side::Dialer)
        .map_err(|e| RackError::Handshake(e.to_string()))?;
    if peer.rank != 0 || peer.worker != Identity::NODE {
        return Err(RackError::Protocol {
            peer: coordinator.to_string(),
            why: format!("the coordinator claims to be rank {}", peer.rank),
        });
    }
    send(
        &mut stream,
        &Boot::Register {
            addr: data_addr,
            workers,
        },
    )
    .map_err(|e| RackError::io("registering with rank 0", e))?;
    // Rank 0 answers once every rank is in, which may take the rest of the connect timeout.
    let wait = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(1);
    stream
        .set_read_timeout(Some(wait))
        .map_err(|e| RackError::io("configuring the coordinator connection", e))?;
    let nodes = match receive(&mut stream) {
        Ok(Boot::Table { nodes }) if nodes.len() == settings.size => nodes,
        Ok(other) => {
            return Err(RackError::Protocol {
                peer: coordinator.to_string(),
                why: format!(
                    "sent {other:?} instead of the table of {} nodes",
                    settings.size
                ),
            });
        }
        Err(e) => return Err(RackError::io("waiting for the node table from rank 0", e)),
    };
    stream
        .set_read_timeout(None)
        .map_err(|e| RackError::io("configuring the coordinator connection", e))?;
    Ok((nodes, vec![(0, stream)]))
}

/// Opens this node's links: dials every worker of every higher rank from each local worker,
/// and accepts the links of every lower rank's workers.
fn link_up(
    settings: &Settings,
    listener: &TcpListener,
    nodes: &[(SocketAddr, u32)],
    workers: u32,
    deadline: Instant,
) -> Result<Vec<Vec<NewLink>>, RackError> {
    let me = settings.rank as u32;
    let expected: usize = nodes[..me as usize]
        .iter()
        .map(|&(_, w)| w as usize * workers as usize)
        .sum();
    let accepting = {
        let listener = listener
            .try_clone()
            .map_err(|e| RackError::io("sharing the listener", e))?;
        let settings = settings.clone();
        let nodes = nodes.to_vec();
        std::thread::Builder::new()
            .name("gossamer-accept".into())
            .spawn(move || accept_links(&settings, &listener, &nodes, workers, expected, deadline))
            .map_err(|e| RackError::io("starting the accept thread", e))?
    };
    let mut links: Vec<Vec<NewLink>> = (0..workers).map(|_| Vec::new()).collect();
    for (rank, &(addr, their_workers)) in nodes.iter().enumerate().skip(me as usize + 1) {
        for local in 0..workers {
            let id = identity(settings, local)?;
            for remote in 0..their_workers {
                let mut stream = dial_until(addr, rank as u32, deadline, settings.connect_timeout)?;
                let peer =
                    handshake::handshake(&stream, &id, settings.secret.as_bytes(), Side::Dialer)
                        .map_err(|e| RackError::Handshake(e.to_string()))?;
                if peer.rank != rank as u32 {
                    return Err(RackError::Protocol {
                        peer: addr.to_string(),
                        why: format!("answers as rank {} where rank {rank} listens", peer.rank),
                    });
                }
                stream
                    .write_all(&remote.to_le_bytes())
                    .map_err(|e| RackError::io(&format!("attaching to rank {rank}"), e))?;
                stream.set_nodelay(true).ok();
                links[local as usize].push(NewLink {
                    peer: (rank as u32, remote),
                    stream,
                });
            }
        }
    }
    let accepted = accepting
        .join()
        .map_err(|_| RackError::io("accepting links", std::io::Error::other("panicked")))??;
    for (local, link) in accepted {
        links[local as usize].push(link);
    }
    Ok(links)
}

fn accept_links(
    settings: &Settings,
    listener: &TcpListener,
    nodes: &[(SocketAddr, u32)],
    workers: u32,
    expected: usize,
    deadline: Instant,
) -> Result<Vec<(u32, NewLink)>, RackError> {
    let me = settings.rank as u32;
    let mut seen = HashSet::new();
    let mut accepted = Vec::new();
    while accepted.len() < expected {
        let (mut stream, addr) = accept_until(listener, deadline).map_err(|_| {
            let missing: BTreeSet<u32> = (0..me)
                .filter(|&r| {
                    let want = nodes[r as usize].1 as usize * workers as usize;
                    seen.iter().filter(|(p, _, _)| *p == r).count() < want
                })
                .collect();
            RackError::MissingRanks {
                ranks: missing.into_iter().collect(),
                waited: settings.connect_timeout,
            }
        })?;
        let mine = identity(settings, Identity::NODE)?;
        let result = (|| {
            let peer =
                handshake::handshake(&stream, &mine, settings.secret.as_bytes(), Side::Acceptor)
                    .map_err(|e| e.to_string())?;
            if peer.rank >= me || peer.worker >= nodes[peer.rank as usize].1 {
                return Err(format!(
                    "links as rank {} worker {}",
                    peer.rank, peer.worker
                ));
            }
            stream
                .set_read_timeout(Some(handshake::HANDSHAKE_LIMIT))
                .map_err(|e| e.to_string())?;
            let mut target = [0u8; 4];
            stream.read_exact(&mut target).map_err(|e| e.to_string())?;
            let target = u32::from_le_bytes(target);
            if target >= workers {
                return Err(format!("asks for worker {target} of {workers}"));
            }
            if !seen.insert((peer.rank, peer.worker, target)) {
                return Err(format!(
                    "links rank {} worker {} to worker {target} a second time",
                    peer.rank, peer.worker
                ));
            }
            stream.set_read_timeout(None).map_err(|e| e.to_string())?;
            stream.set_nodelay(true).ok();
            Ok((peer, target))
        })();
        match result {
            Ok((peer, target)) => accepted.push((
                target,
                NewLink {
                    peer: (peer.rank, peer.worker),
                    stream,
                },
            )),
            Err(why) => eprintln!("gossamer: rank {me}: refused a connection from {addr}: {why}"),
        }
    }
    Ok(accepted)
}

/// Accepts one connection, or fails at the deadline.
fn accept_until(
    listener: &TcpListener,
    deadline: Instant,
) -> std::io::Result<(TcpStream, SocketAddr)> {
    listener.set_nonblocking(true)?;
    loop {
        match listener.accept() {
            Ok((stream, addr)) => {
                stream.set_nonblocking(false)?;
                return Ok((stream, addr));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(std::io::ErrorKind::TimedOut.into());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Connects to `addr`, retrying while the peer is not up yet, until the deadline.
fn dial_until(
    addr: SocketAddr,
    rank: u32,
    deadline: Instant,
    waited: Duration,
) -> Result<TcpStream, RackError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(1)));
        match attempt {
            Ok(stream) => return Ok(stream),
            Err(e) if Instant::now() >= deadline => {
                return Err(RackError::Unreachable {
                    rank,
                    addr,
                    waited,
                    why: e.to_string(),
                });
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}
