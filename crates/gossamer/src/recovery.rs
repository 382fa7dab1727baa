//! Losing a rank and taking it back, in a job that recovers lost ranks (`gsm run --recover`,
//! `GSM_RECOVER=1`). Without recovery a lost rank ends the job (`fate`).
//!
//! # Protocol
//! 1. A rank other than 0 that dies, goes silent for `GSM_PEER_TIMEOUT`, or whose links break
//!    is *lost*. Each rank that notices ([`lose`]) marks that life of it (its incarnation)
//!    down, stops watching its links and closes them on every worker: calls waiting on them
//!    fail with `Lost`, naming the rank. Rank 0 also *fences* it: it tells the lost rank so on
//!    its coordinator connection and shuts that connection, so that a process that was only
//!    silent ends itself as soon as it runs again (and `gsm run --recover` kills it). Any other
//!    rank tells rank 0, which fences.
//! 2. `gsm run --recover` starts the rank again with `GSM_INCARNATION` one more. The new
//!    process registers with rank 0 like any rank; rank 0 ([`serve_rejoins`]) takes it only
//!    if its incarnation is newer than the one it knows and its worker count unchanged, sends
//!    it the node table and watches its new coordinator connection.
//! 3. The restarted rank dials every worker of every other rank from each of its workers.
//!    Every rank keeps its listener open for these links ([`serve_late_links`]): a link from
//!    an incarnation older than the one it knows is refused; a newer one first loses the
//!    older life (if that was not noticed yet), then joins the worker it asks for.
//! 4. What the lost process held in memory is gone: its volatile properties and fibers. A call
//!    on a handle to one of them fails at once (`Lost`, naming the incarnation); so does a
//!    call to a rank that is down. Durable properties reopen from the rank's store on their
//!    next call, and durable callers resend their unanswered calls under the same ids, so that
//!    each runs once (see `durable`).
//!
//! Rank 0 is the coordinator and runs `main`: its loss ends the job, and a rerun reopens the
//! durable state. Recovery runs links over TCP or UCX, not shared memory (the settings enforce
//! it). Regions of a lost life fail, through every path (`region`).

use std::cell::{Cell, RefCell};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::bootstrap::{self, Attached, Boot, Joiner, NodeTable, accept::Acceptor};
use crate::fate;
use crate::link;
use crate::state::{NewLink, RackState, current};

/// How often the threads that wait for a restarted rank look for the end of the job, and
/// the fibers waiting for it at their deadlines.
const POLL: Duration = Duration::from_millis(200);

/// Serializes the changes of a rank's life (lost, back), which several threads make.
static CHANGES: Mutex<()> = Mutex::new(());

/// Loses `incarnation` of rank `rank` for `why` (see the module docs); ends the job instead
/// when it does not recover lost ranks, or when the rank is 0 or this one. Losing a life that
/// is already lost, or that a newer one replaced, does nothing.
pub(crate) fn lose(state: &Arc<RackState>, rank: u32, incarnation: u32, why: &str) {
    if !state.settings.recovery.recover || rank == 0 || rank == state.rank {
        fate::lost(state, rank, why);
    }
    {
        let _changing = CHANGES.lock().unwrap_or_else(|p| p.into_inner());
        let peer = &state.peers[rank as usize];
        if peer.incarnation.load(Ordering::Acquire) != incarnation
            || !peer.up.swap(false, Ordering::AcqRel)
        {
            return;
        }
    }
    eprintln!(
        "gossamer: rank {}: lost rank {rank} (incarnation {incarnation}): {why}; waiting for \
         its restart",
        state.rank
    );
    state.forget_health(rank);
    state.regions.lose(rank, incarnation);
    for worker in 0..state.workers[state.rank as usize] as usize {
        let why = why.to_string();
        drop(
            state
                .handle
                .spawn_on(worker, move || link::drop_peer(rank, incarnation, &why)),
        );
    }
    if state.rank == 0 {
        fence(state, rank, incarnation, why);
    } else {
        for (_, stream) in state.lock_coordination().iter_mut() {
            tell(stream, rank, incarnation, why.to_string());
        }
    }
}

/// Rank 0: tells the lost rank it is out and shuts its coordinator connection.
fn fence(state: &RackState, rank: u32, incarnation: u32, why: &str) {
    let stream = {
        let mut coordination = state.lock_coordination();
        let at = coordination.iter().position(|(r, _)| *r == rank);
        at.map(|i| coordination.remove(i).1)
    };
    if let Some(mut stream) = stream {
        tell(
            &mut stream,
            rank,
            incarnation,
            format!("was fenced by rank 0: {why}"),
        );
        let _ = stream.shutdown(Shutdown::Both);
    }
    if let Some(fd) = state.settings.recovery.supervisor {
        ask_supervisor(fd, rank, incarnation);
    }
}

/// Asks `gsm run --recover` to kill `incarnation` of rank `rank` (a process that was only
/// silent, or stopped, would not end itself): one line on the descriptor it gave rank 0.
fn ask_supervisor(fd: i32, rank: u32, incarnation: u32) {
    let line = format!("fence {rank} {incarnation}\n");
    // SAFETY: write(2) reads `line.len()` bytes from a live buffer. `fd` is the pipe the
    // supervisor passed in `GSM_SUPERVISOR` for this purpose; if it is not open the call fails
    // with EBADF, which is reported. One write under PIPE_BUF bytes is never split.
    let written = unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
    if written != line.len() as isize {
        let e = std::io::Error::last_os_error();
        eprintln!("gossamer: rank 0: cannot ask the supervisor to fence rank {rank}: {e}");
    }
}

fn tell(stream: &mut TcpStream, rank: u32, incarnation: u32, why: String) {
    // A peer that does not read cannot hold this thread up.
    stream
        .set_write_timeout(Some(Duration::from_millis(200)))
        .ok();
    let lost = Boot::Lost {
        rank,
        incarnation,
        why,
    };
    // Best effort: a coordinator connection that fails is found by its own reader.
    let _ = bootstrap::send(stream, &lost);
}

/// Watches a rank's coordinator connection: how rank 0 calls [`serve_rejoins`]'s watcher.
pub(crate) type Monitor = fn(Arc<RackState>, u32, u32, TcpStream);

/// Rank 0: takes the registrations of restarted ranks until the job ends (see the module
/// docs), on a thread of its own.
pub(crate) fn serve_rejoins(
    state: Arc<RackState>,
    registrations: Acceptor<Joiner>,
    mut table: NodeTable,
    monitor: Monitor,
) {
    let spawned = std::thread::Builder::new()
        .name("gossamer-rejoins".into())
        .spawn(move || {
            while !state.ending.load(Ordering::SeqCst) {
                let Some((addr, greeted)) = registrations.next(Instant::now() + POLL) else {
                    continue;
                };
                let refused =
                    greeted.and_then(|joiner| rejoin(&state, &mut table, joiner, monitor));
                if let Err(why) = refused {
                    eprintln!("gossamer: rank 0: refused a connection from {addr}: {why}");
                }
            }
        });
    spawned.expect("start the thread that takes restarted ranks");
}

/// Rank 0: takes one restarted rank back, or says why not.
fn rejoin(
    state: &Arc<RackState>,
    table: &mut NodeTable,
    mut joiner: Joiner,
    monitor: Monitor,
) -> Result<(), String> {
    let (rank, incarnation, size) = (joiner.rank, joiner.incarnation, state.size());
    let refusal = if rank == 0 || rank >= size {
        Some(format!("rank {rank} is not a rank of this job of {size}"))
    } else if incarnation <= state.incarnation(rank) {
        Some(format!(
            "rank {rank} comes back as incarnation {incarnation}, not newer than incarnation \
             {}, which this job has",
            state.incarnation(rank)
        ))
    } else if joiner.workers != table[rank as usize].1 {
        Some(format!(
            "rank {rank} comes back with {} workers, not {}",
            joiner.workers, table[rank as usize].1
        ))
    } else {
        None
    };
    if let Some(why) = refusal {
        bootstrap::refuse(&mut joiner.stream, &why);
        return Err(why);
    }
    renew(state, rank, incarnation);
    table[rank as usize].0 = joiner.reach;
    let nodes = table.clone();
    bootstrap::send(
        &mut joiner.stream,
        &Boot::Table {
            nodes,
            run: state.run,
        },
    )
    .and_then(|()| joiner.stream.set_read_timeout(None))
    .map_err(|e| format!("rank {rank}: sending the node table: {e}"))?;
    let copy = joiner
        .stream
        .try_clone()
        .map_err(|e| format!("rank {rank}: {e}"))?;
    state.lock_coordination().push((rank, copy));
    eprintln!("gossamer: rank 0: rank {rank} rejoined the job as incarnation {incarnation}");
    monitor(state.clone(), rank, incarnation, joiner.stream);
    Ok(())
}

/// Rank `rank` is back as `incarnation`: its older life is lost if that was not noticed yet.
fn renew(state: &Arc<RackState>, rank: u32, incarnation: u32) {
    let known = state.incarnation(rank);
    if incarnation > known {
        lose(
            state,
            rank,
            known,
            &format!("it restarted as incarnation {incarnation}"),
        );
        let _changing = CHANGES.lock().unwrap_or_else(|p| p.into_inner());
        let peer = &state.peers[rank as usize];
        if peer.incarnation.load(Ordering::Acquire) < incarnation {
            peer.incarnation.store(incarnation, Ordering::Release);
            peer.up.store(false, Ordering::Release);
        }
    }
}

/// Every rank: takes the links of restarted ranks until the job ends (see the module docs),
/// on a thread of its own.
pub(crate) fn serve_late_links(state: Arc<RackState>, links: Acceptor<Attached>) {
    let spawned = std::thread::Builder::new()
        .name("gossamer-late-links".into())
        .spawn(move || {
            while !state.ending.load(Ordering::SeqCst) {
                state.wake_peer_waiters();
                let Some((addr, greeted)) = links.next(Instant::now() + POLL) else {
                    continue;
                };
                if let Err(why) = greeted.and_then(|a| attach(&state, a)) {
                    eprintln!(
                        "gossamer: rank {}: refused a connection from {addr}: {why}",
                        state.rank
                    );
                }
            }
        });
    spawned.expect("start the thread that takes restarted ranks' links");
}

/// Attaches one link of a restarted rank to the worker it asks for, or says why not.
fn attach(state: &Arc<RackState>, attached: Attached) -> Result<(), String> {
    let Attached {
        peer,
        target,
        channel,
        ..
    } = attached;
    let (rank, worker, incarnation) = (peer.rank, peer.worker, peer.incarnation);
    let local = state.workers[state.rank as usize];
    if rank >= state.size() || rank == state.rank || worker >= state.workers[rank as usize] {
        return Err(format!("links as rank {rank} worker {worker}"));
    }
    if target >= local {
        return Err(format!("asks for worker {target} of {local}"));
    }
    let known = state.incarnation(rank);
    if incarnation < known {
        return Err(format!(
            "rank {rank} links as incarnation {incarnation}, older than incarnation {known}, \
             which this rank knows"
        ));
    }
    renew(state, rank, incarnation);
    state.peers[rank as usize].up.store(true, Ordering::Release);
    state.wake_peer_waiters();
    let new = NewLink {
        peer: (rank, worker),
        incarnation,
        build: peer.build,
        channel,
        peer_heap: None,
    };
    drop(
        state
            .handle
            .spawn_on(target as usize, move || link::attach(new)),
    );
    Ok(())
}

/// Waits, in this fiber, until rank `rank` is up or `deadline` passes; returns whether it is
/// up. A job that does not recover lost ranks never waits: its lost ranks stay lost.
pub(crate) fn wait_for_rank(rank: u32, deadline: Instant) -> bool {
    let Some(state) = current().filter(|s| s.settings.recovery.recover) else {
        return false;
    };
    trust::block_on(std::future::poll_fn(|cx| {
        if reachable(&state, rank) {
            return Poll::Ready(true);
        }
        if Instant::now() >= deadline || state.ending.load(Ordering::SeqCst) {
            return Poll::Ready(false);
        }
        state.wait_for_peers(cx.waker().clone());
        Poll::Pending
    }))
}

/// Whether rank `rank` is up and this thread can reach all of it: a worker once its links to
/// every worker of the rank are in.
fn reachable(state: &RackState, rank: u32) -> bool {
    state.peer_up(rank) && (!link::is_rack_worker() || link::reaches(rank))
}

/// [`wait_for_rank`] without waiting, for delegated context: `then(up)` runs on this worker,
/// in delegated context, once rank `rank` is up or `deadline` has passed.
pub(crate) fn when_rank_up(rank: u32, deadline: Instant, then: impl FnOnce(bool) + 'static) {
    WAITING.with(|w| w.borrow_mut().push((rank, deadline, Box::new(then))));
    if !SWEEPING.replace(true) {
        drop(trust::spawn(sweep));
    }
}

type WhenUp = Box<dyn FnOnce(bool)>;

thread_local! {
    /// This worker's continuations waiting for a rank: (rank, deadline, continuation).
    static WAITING: RefCell<Vec<(u32, Instant, WhenUp)>> = const { RefCell::new(Vec::new()) };
    /// Whether this worker's [`sweep`] fiber runs.
    static SWEEPING: Cell<bool> = const { Cell::new(false) };
}

/// This worker's fiber that runs the continuations of [`when_rank_up`] when they are due,
/// until none is left.
fn sweep() {
    let state = current().filter(|s| s.settings.recovery.recover);
    loop {
        let due: Vec<(bool, WhenUp)> = WAITING.with(|w| {
            let mut due = Vec::new();
            let now = Instant::now();
            let waiting = std::mem::take(&mut *w.borrow_mut());
            for (rank, deadline, then) in waiting {
                let up = state.as_ref().is_some_and(|s| reachable(s, rank));
                let ending = state
                    .as_ref()
                    .is_none_or(|s| s.ending.load(Ordering::SeqCst));
                if up || now >= deadline || ending {
                    due.push((up, then));
                } else {
                    w.borrow_mut().push((rank, deadline, then));
                }
            }
            due
        });
        for (up, then) in due {
            trust::defer(move || then(up));
        }
        if WAITING.with(|w| w.borrow().is_empty()) {
            SWEEPING.set(false);
            return;
        }
        let Some(state) = &state else { continue };
        let mut parked = false;
        trust::block_on(std::future::poll_fn(|cx| {
            if std::mem::replace(&mut parked, true) {
                return Poll::Ready(());
            }
            state.wait_for_peers(cx.waker().clone());
            Poll::Pending
        }));
    }
}
