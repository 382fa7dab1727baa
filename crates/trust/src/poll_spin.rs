//! How a future of this crate waits when it is polled outside the runtime (by tokio or another
//! executor, or a plain thread's `block_on`): for a while it asks to be polled again at once
//! instead of waiting to be woken, so that an answer that comes back within microseconds costs
//! the executor's thread no sleep and the trustee no cross-thread wake-up.
//!
//! The executor runs its other ready tasks between two polls, so a spinning future delays
//! nobody; it only keeps its thread from sleeping, and takes a core the trustee may need.
//! Three rules bound what that costs:
//!
//! * A future spins only for a request to a trustee that was awake when it was sent, and for at
//!   most the runtime's spin time (`Builder::spin`; zero turns spinning off) or `MAX_SPIN`,
//!   whichever is shorter. An awake trustee that has a core answers within a few
//!   microseconds; one that takes longer waits for a core, and spinning longer would only
//!   keep it waiting.
//! * It spins only while it is the one request its thread awaits. A thread with many requests
//!   in flight (many tasks awaiting at once) gets their answers as wake-ups, which the trustee
//!   sends in bursts; spinning there only competes with the trustee for a core.
//! * A spin that ends without the answer makes the thread's next futures skip spinning, for
//!   twice as many futures as the last time (up to `MAX_SKIP`); a spin that gets its answer
//!   halves that. Where the trustee waits for a core, spinning only delays it further, and
//!   the misses turn spinning (mostly) off there.
//!
//! The count of requests in flight belongs to the thread that sent them; a future that moves
//! to another thread between polls (a work-stealing executor) still counts itself out of it.
//! The count is a hint, not a synchronization: relaxed atomics suffice.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Longest spin of one future.
pub(crate) const MAX_SPIN: Duration = Duration::from_micros(20);
/// Most futures a thread lets go by without spinning after spins that missed.
const MAX_SKIP: u32 = 64;
/// Polls of a spinning future per reading of the clock (reading it costs more than a poll).
const CLOCK_EVERY: u32 = 16;

/// A thread's requests in flight and its backoff.
struct Thread {
    in_flight: Arc<AtomicUsize>,
    /// Futures still to let go by without spinning.
    skip: Cell<u32>,
    /// How many to skip after the next miss; a hit halves it.
    backoff: Cell<u32>,
}

thread_local! {
    static THREAD: Thread = Thread {
        in_flight: Arc::new(AtomicUsize::new(0)),
        skip: Cell::new(0),
        backoff: Cell::new(0),
    };
}

/// The spin of one future (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct PollSpin {
    /// The count of the thread that sent the request, while it is in flight.
    in_flight: Option<Arc<AtomicUsize>>,
    /// Set while this future spins.
    until: Option<Instant>,
    polls: u32,
}

impl PollSpin {
    /// The request was just sent from this thread: counts it in flight, and spins for up to
    /// `spin` if it is the only one and the thread is not backing off.
    pub(crate) fn start(&mut self, spin: Duration) {
        let _ = THREAD.try_with(|thread| {
            let alone = thread.in_flight.fetch_add(1, Ordering::Relaxed) == 0;
            self.in_flight = Some(thread.in_flight.clone());
            if !alone || spin.is_zero() {
                return;
            }
            match thread.skip.get() {
                0 => self.until = Some(Instant::now() + spin.min(MAX_SPIN)),
                n => thread.skip.set(n - 1),
            }
        });
    }

    /// The answer is not there yet: whether the future should ask to be polled again at once
    /// (otherwise it registers its waker).
    pub(crate) fn again(&mut self) -> bool {
        let Some(until) = self.until else {
            return false;
        };
        if self
            .in_flight
            .as_ref()
            .is_some_and(|n| n.load(Ordering::Relaxed) > 1)
        {
            // Other requests went out meanwhile: their answers will wake this thread.
            self.until = None;
            return false;
        }
        self.polls = self.polls.wrapping_add(1);
        if !self.polls.is_multiple_of(CLOCK_EVERY) || Instant::now() < until {
            return true;
        }
        self.until = None;
        let _ = THREAD.try_with(|thread| {
            let backoff = (thread.backoff.get() * 2).clamp(1, MAX_SKIP);
            thread.backoff.set(backoff);
            thread.skip.set(backoff);
        });
        false
    }

    /// The answer is there: the request is no longer in flight, and a spin got its answer.
    pub(crate) fn answered(&mut self) {
        if self.until.take().is_some() {
            let _ = THREAD.try_with(|thread| thread.backoff.set(thread.backoff.get() / 2));
        }
        self.leave();
    }

    fn leave(&mut self) {
        if let Some(n) = self.in_flight.take() {
            n.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for PollSpin {
    fn drop(&mut self) {
        // A future dropped before its answer: it no longer waits for it.
        self.leave();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const SPIN: Duration = Duration::from_secs(60);

    #[test]
    fn only_a_lone_request_spins() {
        let (mut first, mut second) = (PollSpin::default(), PollSpin::default());
        first.start(SPIN);
        assert!(first.again(), "the one request in flight spins");
        second.start(SPIN);
        assert!(!second.again(), "a second one in flight waits to be woken");
        assert!(!first.again(), "and the first stops spinning");
        first.answered();
        second.answered();
        let mut third = PollSpin::default();
        third.start(SPIN);
        assert!(third.again(), "alone again after both were answered");
        drop(third);
        let mut fourth = PollSpin::default();
        fourth.start(SPIN);
        assert!(fourth.again(), "a dropped future is no longer in flight");
        fourth.answered();
    }

    #[test]
    fn misses_back_off_and_hits_halve_the_backoff() {
        let spins = |n: usize| {
            (0..n)
                .map(|_| {
                    let mut f = PollSpin::default();
                    f.start(Duration::from_nanos(1));
                    let spun = f.until.is_some();
                    // Past the deadline: the next clock reading ends the spin as a miss.
                    while f.again() {}
                    f.answered();
                    spun
                })
                .collect::<Vec<_>>()
        };
        // Miss, skip 1, miss, skip 2, miss, skip 4.
        let pattern = spins(10);
        assert_eq!(
            pattern,
            [
                true, false, true, false, false, true, false, false, false, false
            ]
        );
        let mut hit = PollSpin::default();
        hit.start(SPIN);
        while hit.until.is_none() {
            hit = PollSpin::default();
            hit.start(SPIN);
        }
        hit.answered();
        // The hit halved the backoff from 4 to 2: the next miss skips 4, not 8.
        assert_eq!(spins(6), [true, false, false, false, false, true]);
        let mut off = PollSpin::default();
        off.start(Duration::ZERO);
        assert!(!off.again(), "a zero spin time turns spinning off");
    }
}
