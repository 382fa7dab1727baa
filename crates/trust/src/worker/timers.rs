//! Fibers sleeping until a time ([`crate::sleep`]): each worker keeps the wakers of its
//! sleeping fibers by their deadline, wakes those that are due every round, and, with nothing
//! else to do, parks no longer than the earliest deadline. Only the worker's own thread
//! touches them.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::task::Waker;
use std::time::Instant;

use super::Worker;

/// Wakers by (deadline, a count that keeps equal deadlines apart).
#[derive(Default)]
pub(super) struct Timers {
    due: RefCell<BTreeMap<(Instant, u64), Waker>>,
    count: Cell<u64>,
}

impl Worker {
    /// Wakes `waker` once `at` has passed (at the first round after it).
    pub(crate) fn wake_at(&self, at: Instant, waker: Waker) {
        let n = self.timers.count.get();
        self.timers.count.set(n.wrapping_add(1));
        self.timers.due.borrow_mut().insert((at, n), waker);
    }

    /// Wakes the fibers whose deadline has passed; returns whether there were any.
    pub(super) fn wake_due_timers(&self) -> bool {
        let Some(first) = self.next_timer() else {
            return false;
        };
        let now = Instant::now();
        if first > now {
            // Nothing due: the map stays as it is (a split would move it to a new one).
            return false;
        }
        let due: Vec<Waker> = {
            let mut timers = self.timers.due.borrow_mut();
            let later = timers.split_off(&(now, u64::MAX));
            std::mem::replace(&mut *timers, later)
                .into_values()
                .collect()
        };
        // Outside the borrow: waking only marks the fibers ready.
        let woke = !due.is_empty();
        due.into_iter().for_each(Waker::wake);
        woke
    }

    /// The earliest deadline of a sleeping fiber.
    pub(super) fn next_timer(&self) -> Option<Instant> {
        self.timers
            .due
            .borrow()
            .first_key_value()
            .map(|(&(at, _), _)| at)
    }
}
