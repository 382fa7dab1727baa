//! Fate sharing: how a rank ends the job when a peer is lost or broken.
//!
//! A rank that dies, goes silent for `GSM_PEER_TIMEOUT` (links send a heartbeat every
//! `GSM_HEARTBEAT` when idle, from a watchdog thread, so a worker busy in user code for longer
//! still looks alive, and still hears its peers), or sends a bad frame ends the job: each rank
//! that notices prints one line naming the rank and why, and exits at once with
//! [`EXIT_PEER_LOST`] or [`EXIT_BAD_FRAME`]. Before it exits, a rank that lost a peer tells
//! rank 0 which (rank 0 tells every other rank), so that the others name that peer, not the
//! rank that noticed first. Links close in any order at the end of a job, so a closed link only
//! counts as a loss if the job is not ending a moment later.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::bootstrap::{self, Boot};
use crate::error::{EXIT_BAD_FRAME, EXIT_PEER_LOST};
use crate::state::{Health, RackState, current, now_ms};

/// Ends this process because a peer is gone. It first tells the other end of its coordinator
/// connections which one: rank 0 tells every other rank, another rank tells rank 0 (which
/// tells the rest). Ranks notice a silent peer at about the same time, and each exits as soon
/// as it does; told first, the others name the rank that was lost rather than the one that
/// noticed first and closed its connections by exiting.
pub(crate) fn lost(state: &RackState, rank: u32, why: &str) -> ! {
    let line = if rank == state.rank {
        format!("the job lost this rank, which {why}")
    } else {
        format!("lost rank {rank}: {why}")
    };
    end_for(Some(state), rank, why, &line, EXIT_PEER_LOST)
}

/// Prints this rank's one line about the end, tells the coordinator which rank ended the job
/// and why (so that rank 0 names the right one), and exits with `code`.
fn end_for(state: Option<&RackState>, rank: u32, why: &str, line: &str, code: u8) -> ! {
    end_once();
    let me = state.map_or(0, |s| s.rank);
    eprintln!("gossamer: rank {me}: {line}; ending the job");
    if let Some(state) = state {
        let incarnation = state.incarnation(rank);
        for (_, stream) in state.lock_coordination().iter_mut() {
            stream
                .set_write_timeout(Some(Duration::from_millis(200)))
                .ok();
            let why = why.to_string();
            bootstrap::send(
                stream,
                &Boot::Lost {
                    rank,
                    incarnation,
                    why,
                },
            )
            .ok();
        }
    }
    std::process::exit(code.into())
}

/// Lets one thread end the process: the watchdog, the coordinator connections and the links
/// may each notice the end at once, and the process prints one line about it and exits once.
/// Any later caller waits for that exit.
fn end_once() {
    static ENDING: AtomicBool = AtomicBool::new(false);
    if ENDING.swap(true, Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
}

/// Ends this process because a peer sent a bad frame.
pub(crate) fn bad_frame(peer: (u32, u32), why: &str) -> ! {
    let line = format!("bad frame from rank {} (worker {}): {why}", peer.0, peer.1);
    let why = format!("sent a bad frame (worker {}): {why}", peer.1);
    end_for(current().as_deref(), peer.0, &why, &line, EXIT_BAD_FRAME)
}

/// Every link's health, checked every half heartbeat, from a thread of its own so that a
/// worker busy in user code changes nothing: the watchdog writes idle links' heartbeats itself,
/// and a peer counts as heard from when the link's reader read from it or when bytes from it
/// wait unread (see `transport::Probe`).
pub(crate) fn start_watchdog(state: Arc<RackState>, on_lost: OnLost) {
    std::thread::Builder::new()
        .name("gossamer-watchdog".into())
        .spawn(move || {
            let heartbeat = state.settings.heartbeat;
            let heartbeat_ms = heartbeat.as_millis() as u64;
            let timeout = state.settings.peer_timeout.as_millis() as u64;
            // When each ended link was first seen ended, by its health's address.
            let mut ended_since: HashMap<usize, Instant> = HashMap::new();
            // The reads and writes counted on each link at the last look, by its address.
            let mut seen: HashMap<usize, (u64, u64)> = HashMap::new();
            let mut previous = now_ms();
            loop {
                std::thread::sleep(heartbeat / 2);
                if state.ending.load(Ordering::SeqCst) {
                    return;
                }
                let now = now_ms();
                let healths = state.healths();
                ended_since.retain(|&key, _| healths.iter().any(|h| key == health_key(h)));
                seen.retain(|&key, _| healths.iter().any(|h| key == health_key(h)));
                for health in &healths {
                    // Activity since the last look happened between it and now: a read is
                    // dated now (a loss is declared late rather than early), a write at the
                    // last look (a heartbeat goes early rather than late).
                    let counts = (
                        health.reads.load(Ordering::Relaxed),
                        health.writes.load(Ordering::Relaxed),
                    );
                    let before = seen.insert(health_key(health), counts).unwrap_or((0, 0));
                    if counts.0 != before.0 {
                        health.last_read.store(now, Ordering::Relaxed);
                    }
                    if counts.1 != before.1 {
                        health.last_write.fetch_max(previous, Ordering::Relaxed);
                    }
                }
                previous = now;
                for health in &healths {
                    let ended = health
                        .ended
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone();
                    let (rank, incarnation) = (health.peer.0, health.incarnation);
                    if let Some(why) = ended {
                        // At the end of a job peers close their links as they go: a close
                        // is a loss only if no `Exit` follows within a heartbeat or two.
                        let since = *ended_since
                            .entry(health_key(health))
                            .or_insert_with(Instant::now);
                        if since.elapsed() > 2 * heartbeat {
                            on_lost(&state, rank, incarnation, &why);
                        }
                        continue;
                    }
                    if health.probe.heard() {
                        health.last_read.store(now, Ordering::Relaxed);
                    }
                    // Bytes waiting unread: the worker is busy, not the peer silent.
                    let waiting = health.probe.unread() == Some(true);
                    let heard = health.last_read.load(Ordering::Relaxed);
                    if !waiting && now.saturating_sub(heard) > timeout {
                        let why = format!("silent for {timeout} ms (GSM_PEER_TIMEOUT)");
                        on_lost(&state, rank, incarnation, &why);
                    }
                    let quiet = now.saturating_sub(health.last_write.load(Ordering::Relaxed));
                    // Heartbeats are outside the frames' sequence: they carry 0.
                    if quiet >= heartbeat_ms && health.probe.heartbeat() {
                        health.last_write.store(now, Ordering::Relaxed);
                    }
                }
            }
        })
        .expect("start the watchdog");
}

/// What the watchdog does about a lost peer: (state, rank, its incarnation, why). It ends the
/// job, unless the job recovers lost ranks (see `recovery`).
pub(crate) type OnLost = fn(&Arc<RackState>, u32, u32, &str);

fn health_key(health: &Arc<Health>) -> usize {
    Arc::as_ptr(health) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_caller_goes_on_to_end_the_process() {
        end_once();
        let (tx, rx) = std::sync::mpsc::channel();
        // Parks for good: the process would be exiting.
        std::thread::spawn(move || {
            end_once();
            tx.send(()).ok();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "a second caller went on to end the process too"
        );
    }
}
