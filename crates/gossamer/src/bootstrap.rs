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
//! # Strangers
//! Every listener (the coordinator's, and each rank's for the links) greets each connection,
//! the handshake and what follows it, on a thread of that connection's own (see [`accept`]):
//! a silent or slow peer costs its own [`HANDSHAKE_LIMIT`], never a real peer's time, and
//! `GSM_CONNECT_TIMEOUT` holds whatever arrives. A connection that fails its handshake
//! (garbage, another job, another build, a wrong secret) is refused and logged; the job
//! carries on waiting for the real peer. A rank that proved itself but cannot join (a rank
//! number that is out of range or already taken) is told why with [`Boot::Refused`] before
//! the coordinator closes its connection.
//!
//! [`HANDSHAKE_LIMIT`]: handshake::HANDSHAKE_LIMIT

pub(crate) mod accept;

use std::collections::{BTreeSet, HashSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::env::{Settings, TransportChoice};
use crate::error::RackError;
use crate::handshake::{self, HandshakeError, Identity, Side};
use crate::region::heap::Heap;
use crate::state::NewLink;
use crate::transport::shm::NewShm;
use crate::transport::shm::setup::{self, HostId, Rendezvous};
use crate::transport::{self, Decision, HeapMemory, NewChannel, Offer, Plan, UcxHere};
use accept::Acceptor;

/// The largest coordinator message: a table of 64 Ki nodes fits.
const MAX_BOOT_MESSAGE: usize = 1 << 20;

/// What the coordinator connections carry.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Boot {
    Register {
        addr: SocketAddr,
        workers: u32,
    },
    /// Every node's data address and workers, and the run: a random id rank 0 draws for this
    /// run of the job, which names the lives of its ranks (durable leases use it).
    Table {
        nodes: Vec<(SocketAddr, u32)>,
        run: u64,
    },
    /// Rank 0's main returned: end the job with this status.
    Exit {
        code: u8,
    },
    /// This rank has stopped serving and is about to exit.
    Done,
    /// The sender lost this rank (this life of it): rank 0 tells every other rank, another
    /// rank tells rank 0 (which tells the rest). When the job recovers lost ranks, rank 0
    /// tells only the lost rank itself, to fence it, and another rank tells rank 0.
    Lost {
        rank: u32,
        incarnation: u32,
        why: String,
    },
    /// Rank 0 will not have the rank it sends this to, and closes: the rank number is out of
    /// range or already taken.
    Refused {
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
pub(crate) type NodeTable = Vec<(SocketAddr, u32)>;

/// What bootstrap hands to the rack: the node table, each local worker's links, and the
/// coordinator connections (rank 0: one per other rank; others: the one to rank 0).
#[derive(Debug)]
pub(crate) struct Connected {
    /// This node's region heap.
    pub(crate) heap: Arc<Heap>,
    pub(crate) workers: Vec<u32>,
    pub(crate) links: Vec<Vec<NewLink>>,
    pub(crate) coordination: Vec<(u32, TcpStream)>,
    /// The run's id, from rank 0 (see [`Boot::Table`]).
    pub(crate) run: u64,
    /// When the job recovers lost ranks: the listeners that stay open for a restarted rank.
    pub(crate) late: Option<Late>,
}

/// The listeners a job that recovers lost ranks keeps open after the start: every rank's for
/// the links of a restarted rank, and rank 0's coordinator for its registration (with the
/// node table, to send it).
#[derive(Debug)]
pub(crate) struct Late {
    pub(crate) links: Acceptor<Attached>,
    pub(crate) registrations: Option<(Acceptor<Joiner>, NodeTable)>,
}

fn identity(settings: &Settings, worker: u32) -> Result<Identity, RackError> {
    Ok(Identity {
        job: settings.job,
        rank: settings.rank as u32,
        worker,
        build: handshake::build_id().map_err(|e| RackError::io("reading this executable", e))?,
        incarnation: settings.recovery.incarnation,
        mixed: settings.mixed_builds,
    })
}

/// Connects this node to the others, and makes its region heap: UCX's memory when every link
/// takes UCX and the job does not recover (so that UCX's shared memory maps it into peers),
/// else a file of its own, which shared-memory links pass (and UCX, if it started, registers).
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
    let host = HostId::this();
    // Bound before any link is dialed; only ranks that may take shared memory listen.
    let rendezvous = match (settings.transport, &host) {
        (TransportChoice::Tcp | TransportChoice::Ucx, _) | (TransportChoice::Auto, None) => None,
        (TransportChoice::Shm, None) => {
            return Err(RackError::Config {
                why: "GSM_TRANSPORT=shm, but this host's boot id, host name or network \
                      namespace cannot be read from /proc"
                    .into(),
            });
        }
        (_, Some(_)) => match Rendezvous::bind(settings.job, me) {
            Ok(r) => Some(r),
            Err(e) if settings.transport == TransportChoice::Shm => {
                return Err(RackError::io("binding this rank's Unix socket", e));
            }
            Err(e) => {
                eprintln!("gossamer: rank {me}: no shared memory (binding a Unix socket: {e})");
                None
            }
        },
    };
    let ucx = UcxHere::start(settings.transport, workers, settings.recovery.recover)
        .map_err(|why| RackError::Config { why })?;
    let heap = make_heap(settings, &ucx)?;
    // Greeting starts at once, so that strangers are drained while the ranks register.
    let mine = identity(settings, Identity::NODE)?;
    let secret = settings.secret.clone();
    let here = Here {
        choice: settings.transport,
        host: host.clone(),
        heap: heap.clone(),
        ucx: ucx.clone(),
    };
    let attaching = Acceptor::start(listener, "gossamer-links", move |stream, _| {
        attachment(stream, &mine, secret.as_bytes(), &here)
    })
    .map_err(|e| RackError::io("starting this rank's accept thread", e))?;
    let (nodes, run, coordination, registrations) = if me == 0 {
        coordinate(settings, coordinator, data_addr, workers, deadline)?
    } else {
        let (nodes, run, coordination) =
            register(settings, coordinator, data_addr, workers, deadline)?;
        (nodes, run, coordination, None)
    };
    let worker_counts: Vec<u32> = nodes.iter().map(|&(_, w)| w).collect();
    // Every rank has the table about when rank 0 sent it: linking gets a whole timeout of its
    // own, so that a slow registration (a loaded machine) cannot leave it too little.
    let here = Here {
        choice: settings.transport,
        host,
        heap: heap.clone(),
        ucx,
    };
    let links = link_up(
        settings,
        (&attaching, &here, rendezvous.as_ref()),
        &nodes,
        workers,
        Instant::now() + link_time(settings),
    )?;
    let late = settings.recovery.recover.then(|| Late {
        links: attaching,
        registrations: registrations.map(|r| (r, nodes)),
    });
    Ok(Connected {
        heap,
        workers: worker_counts,
        links,
        coordination,
        run,
        late,
    })
}

/// This node's region heap (see [`connect`]).
fn make_heap(settings: &Settings, ucx: &UcxHere) -> Result<Arc<Heap>, RackError> {
    let failed = |why: String| RackError::Config {
        why: format!("GSM_TRANSPORT={}: {why}", settings.transport),
    };
    // A job that recovers registers its own heap instead: a key to UCX's shared memory names
    // a segment that dies with its rank, and UCX 1.13 crashes unpacking a key whose segment
    // is gone (it releases the key's parts not yet unpacked). Its regions are then reached
    // with UCX's one-sided operations, never mapped.
    if settings.transport == TransportChoice::Ucx
        && !settings.recovery.recover
        && let Some((address, bytes)) = ucx.allocate_heap(settings.region_heap).map_err(failed)?
    {
        // SAFETY: UCX's allocation is kept for good, zeroed, page-aligned and `bytes` long.
        return Ok(Arc::new(unsafe { Heap::create_at(address, bytes) }));
    }
    let heap = file_heap(settings)?;
    let (address, bytes) = heap.memory();
    // SAFETY: the heap's mapping lives as long as the heap, which the `Arc` keeps.
    let memory = unsafe { HeapMemory::new(heap.clone(), address, bytes) };
    ucx.register_heap(memory).map_err(failed)?;
    Ok(heap)
}

/// A region heap of this node's own: a file, which shared-memory links pass to peers.
pub(crate) fn file_heap(settings: &Settings) -> Result<Arc<Heap>, RackError> {
    Heap::create(settings.region_heap)
        .map(Arc::new)
        .map_err(|e| RackError::io("creating this node's region heap", e))
}

/// How long linking up may take: `GSM_CONNECT_TIMEOUT`, and `GSM_PEER_TIMEOUT` for a restarted
/// rank: a peer it cannot reach by then was restarted too, at another address, and this rank
/// fails so that its supervisor starts it again with a fresh node table.
fn link_time(settings: &Settings) -> Duration {
    if rejoining(settings) {
        settings.peer_timeout
    } else {
        settings.connect_timeout
    }
}

/// Whether this process is a rank restarted into a running job (`gsm run --recover`): it
/// dials every other rank's workers, and none dials it.
fn rejoining(settings: &Settings) -> bool {
    settings.recovery.recover && settings.recovery.incarnation > 0 && settings.rank != 0
}

/// What rank 0's coordination hands on: the node table, the run's id, each rank's
/// connection, and the coordinator's listener, kept when the job recovers lost ranks.
type Coordinated = (
    NodeTable,
    u64,
    Vec<(u32, TcpStream)>,
    Option<Acceptor<Joiner>>,
);

/// What registering with rank 0 hands on: the node table, the run's id, and the connection
/// to rank 0.
type Registered = (NodeTable, u64, Vec<(u32, TcpStream)>);

/// A fresh run id (see [`Boot::Table`]).
pub(crate) fn new_run_id() -> Result<u64, RackError> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes)
        .map_err(|e| RackError::io("drawing the run's id", std::io::Error::other(e.to_string())))?;
    Ok(u64::from_le_bytes(bytes))
}

/// Rank 0: accepts every other rank's registration and sends the table.
fn coordinate(
    settings: &Settings,
    at: SocketAddr,
    data_addr: SocketAddr,
    workers: u32,
    deadline: Instant,
) -> Result<Coordinated, RackError> {
    let listener =
        TcpListener::bind(at).map_err(|e| RackError::io(&format!("listening at {at}"), e))?;
    let me = identity(settings, Identity::NODE)?;
    let secret = settings.secret.clone();
    let registrations = Acceptor::start(listener, "gossamer-coordinator", move |stream, addr| {
        registration(stream, addr, &me, secret.as_bytes())
    })
    .map_err(|e| RackError::io("starting the coordinator's accept thread", e))?;
    let size = settings.size as u32;
    let mut nodes: Vec<Option<(SocketAddr, u32)>> = vec![None; settings.size];
    nodes[0] = Some((data_addr, workers));
    let mut conns = Vec::new();
    while conns.len() + 1 < settings.size {
        let Some((addr, greeted)) = registrations.next(deadline) else {
            return Err(RackError::MissingRanks {
                ranks: (1..size).filter(|&r| nodes[r as usize].is_none()).collect(),
                waited: settings.connect_timeout,
            });
        };
        let why = match greeted {
            Err(why) => why,
            Ok(mut joiner) => {
                let rank = joiner.rank;
                let why = if rank == 0 || rank >= size {
                    format!("rank {rank} is not a rank of this job of {size}")
                } else if nodes[rank as usize].is_some() {
                    format!("rank {rank} has already joined")
                } else {
                    nodes[rank as usize] = Some((joiner.reach, joiner.workers));
                    conns.push((rank, joiner.stream));
                    continue;
                };
                refuse(&mut joiner.stream, &why);
                why
            }
        };
        eprintln!("gossamer: rank 0: refused a connection from {addr}: {why}");
    }
    let registrations = settings.recovery.recover.then_some(registrations);
    let nodes: Vec<(SocketAddr, u32)> = nodes.into_iter().map(|n| n.expect("all in")).collect();
    let run = new_run_id()?;
    for (rank, stream) in &mut conns {
        send(
            stream,
            &Boot::Table {
                nodes: nodes.clone(),
                run,
            },
        )
        .map_err(|e| RackError::io(&format!("sending the table to rank {rank}"), e))?;
        stream
            .set_read_timeout(None)
            .map_err(|e| RackError::io("configuring a coordinator connection", e))?;
    }
    Ok((nodes, run, conns, registrations))
}

/// A rank that proved itself and registered, not yet checked against the others.
#[derive(Debug)]
pub(crate) struct Joiner {
    pub(crate) rank: u32,
    /// Which life of its rank it is.
    pub(crate) incarnation: u32,
    pub(crate) stream: TcpStream,
    /// Where its workers' links reach it.
    pub(crate) reach: SocketAddr,
    pub(crate) workers: u32,
}

/// Greets a connection to the coordinator (on its own thread): the handshake, then the
/// rank's registration, both within the handshake's limit.
fn registration(
    mut stream: TcpStream,
    addr: SocketAddr,
    me: &Identity,
    secret: &[u8],
) -> Result<Joiner, String> {
    let peer =
        handshake::handshake(&stream, me, secret, Side::Acceptor).map_err(|e| e.to_string())?;
    if peer.worker != Identity::NODE {
        let why = format!("rank {} registers from worker {}", peer.rank, peer.worker);
        refuse(&mut stream, &why);
        return Err(why);
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
            Ok(Joiner {
                rank: peer.rank,
                incarnation: peer.incarnation,
                stream,
                reach,
                workers,
            })
        }
        other => {
            let why = format!(
                "rank {} sent {other:?} instead of its registration",
                peer.rank
            );
            refuse(&mut stream, &why);
            Err(why)
        }
    }
}

/// Tells a rank that proved itself why the coordinator will not have it, before closing.
pub(crate) fn refuse(stream: &mut TcpStream, why: &str) {
    // A peer that does not read cannot hold the coordinator up.
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = send(stream, &Boot::Refused { why: why.into() });
}

/// Ranks other than 0: registers with the coordinator and waits for the table.
fn register(
    settings: &Settings,
    coordinator: SocketAddr,
    data_addr: SocketAddr,
    workers: u32,
    deadline: Instant,
) -> Result<Registered, RackError> {
    let me = identity(settings, Identity::NODE)?;
    let (mut stream, peer) = dial(
        settings,
        coordinator,
        0,
        &me,
        deadline,
        settings.connect_timeout,
    )?;
    let refused = |why: String| RackError::Protocol {
        peer: coordinator.to_string(),
        why,
    };
    if peer.rank != 0 || peer.worker != Identity::NODE {
        return Err(refused(format!(
            "the coordinator claims to be rank {}",
            peer.rank
        )));
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
    let (nodes, run) = match receive(&mut stream) {
        Ok(Boot::Table { mut nodes, run }) if nodes.len() == settings.size => {
            // Rank 0 listening on all interfaces is reached where its coordinator was (only
            // a restarted rank dials rank 0's workers).
            if let Some((addr, _)) = nodes.first_mut()
                && addr.ip().is_unspecified()
            {
                addr.set_ip(coordinator.ip());
            }
            (nodes, run)
        }
        Ok(Boot::Refused { why }) => {
            return Err(refused(format!("rank 0 refused this rank: {why}")));
        }
        Ok(other) => {
            return Err(refused(format!(
                "sent {other:?} instead of the table of {} nodes",
                settings.size
            )));
        }
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            return Err(refused(format!(
                "rank 0 sent no node table within {} (GSM_CONNECT_TIMEOUT): is it still \
                 waiting for other ranks? see its log",
                handshake::Limit(settings.connect_timeout)
            )));
        }
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
            return Err(refused(
                "rank 0 closed the connection before it sent the node table: see its log \
                 for why"
                    .into(),
            ));
        }
        Err(e) => return Err(RackError::io("waiting for the node table from rank 0", e)),
    };
    stream
        .set_read_timeout(None)
        .map_err(|e| RackError::io("configuring the coordinator connection", e))?;
    Ok((nodes, run, vec![(0, stream)]))
}

/// Opens this node's links: dials every worker of every higher rank from each local worker,
/// and takes the links of every lower rank's workers from `attaching`.
fn link_up(
    settings: &Settings,
    (attaching, here, rendezvous): (&Acceptor<Attached>, &Here, Option<&Rendezvous>),
    nodes: &[(SocketAddr, u32)],
    workers: u32,
    deadline: Instant,
) -> Result<Vec<Vec<NewLink>>, RackError> {
    let me = settings.rank as u32;
    let rejoining = rejoining(settings);
    let mut links: Vec<Vec<NewLink>> = (0..workers).map(|_| Vec::new()).collect();
    let dialed = nodes
        .iter()
        .enumerate()
        .filter(|&(rank, _)| rank > me as usize || (rejoining && rank != me as usize));
    for (rank, &(addr, their_workers)) in dialed {
        for local in 0..workers {
            let id = identity(settings, local)?;
            for remote in 0..their_workers {
                let waited = link_time(settings);
                let (mut stream, peer) = dial(settings, addr, rank as u32, &id, deadline, waited)?;
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
                let (channel, peer_heap) = offer(
                    stream,
                    (rank as u32, remote, local, peer.incarnation),
                    here,
                    rendezvous,
                    deadline,
                )?;
                links[local as usize].push(NewLink {
                    peer: (rank as u32, remote),
                    incarnation: peer.incarnation,
                    build: peer.build,
                    channel,
                    peer_heap,
                });
            }
        }
    }
    // The lower ranks' links have been greeted meanwhile, each on its own thread. A
    // restarted rank dialed every link itself.
    let lower = if rejoining { 0 } else { me as usize };
    let expected: usize = nodes[..lower]
        .iter()
        .map(|&(_, w)| w as usize * workers as usize)
        .sum();
    let mut seen = HashSet::new();
    let mut accepted = 0;
    while accepted < expected {
        let Some((addr, greeted)) = attaching.next(deadline) else {
            let missing: BTreeSet<u32> = (0..me)
                .filter(|&r| {
                    let want = nodes[r as usize].1 as usize * workers as usize;
                    seen.iter().filter(|(p, _, _)| *p == r).count() < want
                })
                .collect();
            return Err(RackError::MissingRanks {
                ranks: missing.into_iter().collect(),
                waited: settings.connect_timeout,
            });
        };
        let refusal = greeted.and_then(
            |Attached {
                 peer,
                 target,
                 channel,
                 peer_heap,
             }| {
                if peer.rank >= me || peer.worker >= nodes[peer.rank as usize].1 {
                    return Err(format!(
                        "links as rank {} worker {}",
                        peer.rank, peer.worker
                    ));
                }
                if target >= workers {
                    return Err(format!("asks for worker {target} of {workers}"));
                }
                if !seen.insert((peer.rank, peer.worker, target)) {
                    return Err(format!(
                        "links rank {} worker {} to worker {target} a second time",
                        peer.rank, peer.worker
                    ));
                }
                links[target as usize].push(NewLink {
                    peer: (peer.rank, peer.worker),
                    incarnation: peer.incarnation,
                    build: peer.build,
                    channel,
                    peer_heap,
                });
                accepted += 1;
                Ok(())
            },
        );
        if let Err(why) = refusal {
            eprintln!("gossamer: rank {me}: refused a connection from {addr}: {why}");
        }
    }
    Ok(links)
}

/// A link from a worker of a lower rank (or of a restarted one), greeted but not yet checked
/// against the others.
#[derive(Debug)]
pub(crate) struct Attached {
    pub(crate) peer: Identity,
    /// The local worker it asks for.
    pub(crate) target: u32,
    pub(crate) channel: NewChannel,
    pub(crate) peer_heap: Option<Arc<Heap>>,
}

/// What a link's setup needs to know of this rank.
#[derive(Debug, Clone)]
struct Here {
    choice: TransportChoice,
    host: Option<HostId>,
    /// This node's region heap, passed to every peer a link through shared memory joins.
    heap: Arc<Heap>,
    ucx: UcxHere,
}

/// The dialer's side of choosing a link's transport (see `transport`): offers, follows the
/// plan, and for shared memory passes the link's file to the acceptor. The link joins
/// worker `local` of this rank to worker `remote` of rank `rank`.
fn offer(
    mut stream: TcpStream,
    (rank, remote, local, incarnation): (u32, u32, u32, u32),
    here: &Here,
    rendezvous: Option<&Rendezvous>,
    deadline: Instant,
) -> Result<(NewChannel, Option<Arc<Heap>>), RackError> {
    let failed = |why: String| RackError::Transport { rank, why };
    let offer = Offer {
        choice: here.choice,
        host: here.host.clone(),
        pid: std::process::id(),
        rendezvous: rendezvous.map(|r| r.name().to_string()),
        ucx: here.ucx.offer(local).map_err(failed)?,
    };
    stream
        .set_read_timeout(Some(handshake::HANDSHAKE_LIMIT))
        .map_err(|e| RackError::io("configuring a link", e))?;
    transport::send_message(&mut stream, &offer)
        .and_then(|()| transport::receive_message(&mut stream))
        .map_err(|e| failed(format!("choosing the transport: {e}")))
        .and_then(|plan| match (plan, rendezvous) {
            (Plan::Tcp, _) => {
                stream
                    .set_read_timeout(None)
                    .map_err(|e| RackError::io("configuring a link", e))?;
                Ok((NewChannel::Tcp(stream), None))
            }
            (Plan::SharedMemory { pid }, Some(rendezvous)) => {
                let me = offer.pid;
                let (unix, file) = rendezvous
                    .accept_from(pid, deadline, &mut |why| {
                        eprintln!("gossamer: process {me}: refused {why}")
                    })
                    .map_err(failed)?;
                let peer_heap =
                    exchange_heaps(&unix, &here.heap, true, deadline).map_err(failed)?;
                let shm = NewShm::new(&file, unix, true)
                    .map_err(|e| failed(format!("mapping the link's shared memory: {e}")))?;
                Ok((NewChannel::SharedMemory(shm), Some(peer_heap)))
            }
            (Plan::SharedMemory { .. }, None) => Err(failed(
                "the peer chose shared memory, which this rank did not offer".into(),
            )),
            (Plan::Ucx(theirs), _) => {
                let mine = offer.ucx.as_ref().ok_or_else(|| {
                    failed("the peer chose UCX, which this rank did not offer".into())
                })?;
                stream
                    .set_read_timeout(None)
                    .map_err(|e| RackError::io("configuring a link", e))?;
                let channel = here
                    .ucx
                    .channel(local, ((rank, remote), incarnation), mine, theirs, stream)
                    .map_err(failed)?;
                Ok((channel, None))
            }
            (Plan::Refused(why), _) => Err(failed(why)),
        })
}

/// The acceptor's side: decides the link's transport from the dialer's offer and its own
/// choice, and for shared memory receives and maps the link's file.
fn accept_offer(
    stream: &mut TcpStream,
    (peer, target): (&Identity, u32),
    here: &Here,
) -> Result<(NewChannel, Option<Arc<Heap>>), String> {
    let offer: Offer = transport::receive_message(stream)
        .map_err(|e| format!("rank {} sent no transport offer: {e}", peer.rank))?;
    let refuse = |stream: &mut TcpStream, why: String| {
        let _ = transport::send_message(stream, &Plan::Refused(why.clone()));
        Err(format!("rank {}: {why}", peer.rank))
    };
    let mine = match here.ucx.offer(target) {
        Ok(mine) => mine,
        Err(why) => return refuse(stream, why),
    };
    let decision = transport::decide(&offer, here.choice, here.host.as_ref(), mine.as_ref());
    let shared = match decision {
        Ok(Decision::Ucx) => {
            let mine = mine.expect("UCX is decided only with both ends");
            let theirs = offer.ucx.expect("UCX is decided only with both ends");
            transport::send_message(stream, &Plan::Ucx(mine.clone())).map_err(|e| e.to_string())?;
            let side = stream.try_clone().map_err(|e| e.to_string())?;
            let peer = ((peer.rank, peer.worker), peer.incarnation);
            return Ok((here.ucx.channel(target, peer, &mine, theirs, side)?, None));
        }
        Ok(decision) => decision == Decision::SharedMemory,
        Err(why) => return refuse(stream, why),
    };
    let unix = match offer.rendezvous.as_deref().filter(|_| shared) {
        None => None,
        Some(name) => match setup::connect(name, offer.pid, handshake::HANDSHAKE_LIMIT) {
            Ok(unix) => Some(unix),
            Err(why)
                if here.choice == TransportChoice::Shm || offer.choice == TransportChoice::Shm =>
            {
                return refuse(stream, format!("no shared memory with this rank: {why}"));
            }
            Err(why) => {
                eprintln!(
                    "gossamer: the link from rank {} uses TCP: no shared memory ({why})",
                    peer.rank
                );
                None
            }
        },
    };
    let Some(unix) = unix else {
        transport::send_message(stream, &Plan::Tcp).map_err(|e| e.to_string())?;
        return Ok((
            NewChannel::Tcp(stream.try_clone().map_err(|e| e.to_string())?),
            None,
        ));
    };
    let plan = Plan::SharedMemory {
        pid: std::process::id(),
    };
    transport::send_message(stream, &plan).map_err(|e| e.to_string())?;
    let file = setup::receive_file(&unix)?;
    let peer_heap = exchange_heaps(
        &unix,
        &here.heap,
        false,
        Instant::now() + handshake::HANDSHAKE_LIMIT,
    )?;
    unix.set_read_timeout(None).map_err(|e| e.to_string())?;
    let shm = NewShm::new(&file, unix, false)
        .map_err(|e| format!("mapping the link's shared memory: {e}"))?;
    Ok((NewChannel::SharedMemory(shm), Some(peer_heap)))
}

/// Passes this node's region heap to the peer of a shared-memory link and maps the peer's
/// (the dialer sends first), over the link's Unix socket: so that each reaches the other's
/// regions with no message (`region`). Until `deadline`.
fn exchange_heaps(
    unix: &std::os::unix::net::UnixStream,
    heap: &Heap,
    dialer: bool,
    deadline: Instant,
) -> Result<Arc<Heap>, String> {
    let own = heap.file().expect("this node's own heap");
    let send =
        || setup::send_fd(unix, own).map_err(|e| format!("passing this node's region heap: {e}"));
    if dialer {
        send()?;
    }
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    unix.set_read_timeout(Some(left))
        .map_err(|e| e.to_string())?;
    let file =
        setup::receive_fd(unix).map_err(|e| format!("receiving the peer's region heap: {e}"))?;
    unix.set_read_timeout(None).map_err(|e| e.to_string())?;
    if !dialer {
        send()?;
    }
    Ok(Arc::new(Heap::map_peer(&file)?))
}

/// Greets a connection to this rank's listener (on its own thread): the handshake, the
/// worker the link is for and its transport, all within the handshake's limit.
fn attachment(
    mut stream: TcpStream,
    me: &Identity,
    secret: &[u8],
    here: &Here,
) -> Result<Attached, String> {
    let peer =
        handshake::handshake(&stream, me, secret, Side::Acceptor).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(handshake::HANDSHAKE_LIMIT))
        .map_err(|e| e.to_string())?;
    let mut target = [0u8; 4];
    stream
        .read_exact(&mut target)
        .map_err(|e| format!("rank {} sent no worker to link to: {e}", peer.rank))?;
    let target = u32::from_le_bytes(target);
    let (channel, peer_heap) = accept_offer(&mut stream, (&peer, target), here)?;
    stream.set_read_timeout(None).map_err(|e| e.to_string())?;
    stream.set_nodelay(true).ok();
    Ok(Attached {
        peer,
        target,
        channel,
        peer_heap,
    })
}

/// Connects to rank `rank` at `addr` and handshakes as `me`, until the deadline (`waited`
/// after the start, for the error). A handshake
/// the peer closed is tried again: a listener flooded with connections cuts the oldest
/// greetings (see [`accept`]), and a real peer is not refused there, only after its
/// handshake (which it learns from the peer's own checks, or from [`Boot::Refused`]).
fn dial(
    settings: &Settings,
    addr: SocketAddr,
    rank: u32,
    me: &Identity,
    deadline: Instant,
    waited: Duration,
) -> Result<(TcpStream, Identity), RackError> {
    loop {
        let stream = dial_until(addr, rank, deadline, waited)?;
        match handshake::handshake(&stream, me, settings.secret.as_bytes(), Side::Dialer) {
            Ok(peer) => return Ok((stream, peer)),
            Err(HandshakeError::Closed { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(RackError::Handshake(e.to_string())),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(rank: usize) -> Settings {
        let vars = HashMap::from([
            ("GSM_RANK", rank.to_string()),
            ("GSM_SIZE", "2".to_string()),
            ("GSM_COORD", "127.0.0.1:1".to_string()),
            ("GSM_JOB", "7".to_string()),
            ("GSM_SECRET", "bootstrap unit test".to_string()),
            ("GSM_CONNECT_TIMEOUT", "10s".to_string()),
        ]);
        Settings::from_vars(|name| vars.get(name).cloned()).expect("test settings")
    }

    #[test]
    fn a_handshake_cut_by_the_peer_is_dialed_again() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback listener");
        let addr = listener.local_addr().expect("the listener's address");
        let acceptor = settings(0);
        let peer = std::thread::spawn(move || {
            let me = identity(&acceptor, Identity::NODE).expect("rank 0's identity");
            // The first connection is cut once the dialer's hello is in, as a flooded
            // listener cuts its oldest greetings; the second is greeted.
            let (mut first, _) = listener.accept().expect("the first connection");
            first
                .set_read_timeout(Some(Duration::from_secs(5)))
                .expect("set a read timeout");
            let mut magic = [0u8; 8];
            first.read_exact(&mut magic).expect("the dialer's magic");
            first
                .shutdown(std::net::Shutdown::Both)
                .expect("cut the first connection");
            let (second, _) = listener.accept().expect("the second connection");
            handshake::handshake(&second, &me, acceptor.secret.as_bytes(), Side::Acceptor)
        });
        let dialer = settings(1);
        let me = identity(&dialer, Identity::NODE).expect("rank 1's identity");
        let deadline = Instant::now() + Duration::from_secs(10);
        let waited = dialer.connect_timeout;
        let (_, them) = dial(&dialer, addr, 0, &me, deadline, waited).expect("the second dial");
        assert_eq!(them.rank, 0);
        let greeted = peer.join().expect("the accepting thread");
        assert_eq!(greeted.expect("the acceptor's handshake").rank, 1);
    }
}
