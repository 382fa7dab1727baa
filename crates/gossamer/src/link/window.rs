//! A link's window of requests: the seed's M banks × N slots (`GSM_AM_BANKS`,
//! `GSM_AM_SLOTS`).
//!
//! Requests of a lane are numbered 0, 1, 2, … in the order they are staged, and run at the
//! receiver in that order. Request `i` is in bank `i / N`; the last request of each bank
//! carries the wire's *credit* flag, and the receiver returns a credit (a `Credit` control
//! message) once that request *ran*, so once its whole bank ran. The sender stages request
//! `i` only while `i < (credits + M) × N`: at most M × N requests are staged and not yet run.
//!
//! Credits count requests run, never requests answered: a deferred request (a range lock
//! waiting for a release) runs, parks its reply and frees its slot, so the release behind it
//! can come. A window of answers would deadlock there once M × N requests waited.

use std::cell::Cell;

/// The sender's side of one link's window. In `Cell`s: it is read on every call, and a
/// `RefCell`'s borrow checks would cost each call more than the window's own arithmetic.
#[derive(Debug)]
pub(super) struct Window {
    banks: u64,
    slots: u64,
    /// Requests staged so far: the number of the next one.
    staged: Cell<u64>,
    /// The number of the first request not admitted: (credits + M) × N.
    limit: Cell<u64>,
    /// Requests to stage until the last of the current bank, that one included: `staged`
    /// would give it too, at a division per call.
    left_in_bank: Cell<u64>,
}

impl Window {
    /// A window of `banks` × `slots` requests (each at least 1).
    pub(super) fn new(banks: usize, slots: usize) -> Window {
        let (banks, slots) = (banks.max(1) as u64, slots.max(1) as u64);
        Window {
            banks,
            slots,
            staged: Cell::new(0),
            limit: Cell::new(banks * slots),
            left_in_bank: Cell::new(slots),
        }
    }

    /// Whether the request numbered `id` may be staged now.
    pub(super) fn admits(&self, id: u64) -> bool {
        id < self.limit.get()
    }

    /// The number of the next request to stage.
    pub(super) fn next(&self) -> u64 {
        self.staged.get()
    }

    /// Whether the next request may be staged now.
    pub(super) fn open(&self) -> bool {
        self.admits(self.next())
    }

    /// Takes a slot for the next request, which must be admitted; returns whether it is the
    /// last of its bank (it asks for the bank's credit).
    pub(super) fn stage(&self) -> bool {
        debug_assert!(self.open(), "staged past the window");
        self.staged.set(self.staged.get() + 1);
        let left = self.left_in_bank.get() - 1;
        let last = left == 0;
        self.left_in_bank.set(if last { self.slots } else { left });
        last
    }

    /// A bank's credit came back: N more requests may go. An `Err` is a credit for a bank
    /// whose last request was never staged (a protocol violation of the peer).
    pub(super) fn credit(&self) -> Result<(), String> {
        let asked = self.staged.get() / self.slots;
        let returned = self.limit.get() / self.slots - self.banks;
        if returned >= asked {
            return Err(format!(
                "a credit for no bank: {asked} credits asked for, all returned already"
            ));
        }
        self.limit.set(self.limit.get() + self.slots);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Window;

    /// Stages requests while the window admits them; returns how many, and how many asked
    /// for a credit.
    fn fill(w: &Window) -> (u64, u64) {
        let (mut staged, mut asked) = (0, 0);
        while w.open() {
            staged += 1;
            asked += u64::from(w.stage());
        }
        (staged, asked)
    }

    #[test]
    fn at_most_banks_times_slots_are_staged_and_each_credit_frees_one_bank() {
        for (banks, slots) in [(1, 1), (2, 16), (4, 64), (8, 128), (3, 5)] {
            let w = Window::new(banks, slots);
            let m_n = (banks * slots) as u64;
            assert_eq!(fill(&w), (m_n, banks as u64), "{banks}×{slots}");
            for _ in 0..3 {
                w.credit().unwrap();
                assert_eq!(fill(&w), (slots as u64, 1), "{banks}×{slots}");
            }
            assert!(!w.admits(m_n + 3 * slots as u64));
            assert!(w.admits(m_n + 3 * slots as u64 - 1));
        }
    }

    #[test]
    fn a_credit_for_a_bank_never_asked_for_is_an_error() {
        let w = Window::new(2, 4);
        let err = w.credit().unwrap_err();
        assert!(err.contains("credit for no bank"), "{err}");
        // Three requests: bank 0 is not complete, so its credit is not due either.
        for _ in 0..3 {
            assert!(!w.stage());
        }
        assert!(w.credit().is_err());
        assert!(w.stage(), "the fourth request is the last of bank 0");
        w.credit().unwrap();
        assert!(w.credit().is_err(), "bank 0's credit came already");
    }

    #[test]
    fn a_partly_filled_bank_keeps_the_sender_within_the_window() {
        // Credits come only for full banks: 2 × 4 with 6 staged and bank 0 credited leaves
        // room for 6 more (requests 6..12), not 8.
        let w = Window::new(2, 4);
        for _ in 0..6 {
            w.stage();
        }
        w.credit().unwrap();
        assert_eq!(fill(&w).0, 6);
    }
}
