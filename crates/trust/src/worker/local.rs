//! [`Local`]: a worker's own state, accessed without run-time borrow checks.
//!
//! The scheduler and the lanes are touched on every request and every fiber switch, where a
//! `RefCell`'s flag checks are a noticeable share of the cost. They belong to one worker
//! thread (a `Worker` is neither `Send` nor `Sync`), and every access goes through
//! [`Local::with`], whose closures only move plain data — records, batches, fiber handles —
//! and never run user code or code that could reach the same state again: fibers are resumed,
//! requests and completions run, and user values dropped only after the closure has returned.
//! So no two mutable references to the same state ever live at once. Debug builds check that
//! accesses do not nest.

#[cfg(debug_assertions)]
use std::cell::Cell;
use std::cell::UnsafeCell;

pub(super) struct Local<T> {
    value: UnsafeCell<T>,
    #[cfg(debug_assertions)]
    in_use: Cell<bool>,
}

impl<T> Local<T> {
    pub(super) fn new(value: T) -> Self {
        Local {
            value: UnsafeCell::new(value),
            #[cfg(debug_assertions)]
            in_use: Cell::new(false),
        }
    }

    /// Runs `f` on the state. `f` must not reach this state again (see the module docs).
    #[inline(always)]
    pub(super) fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        #[cfg(debug_assertions)]
        assert!(
            !self.in_use.replace(true),
            "worker state accessed re-entrantly"
        );
        // SAFETY: the state belongs to this thread, and no other reference to it lives while
        // `f` runs: accesses do not nest (module docs; checked in debug builds).
        let result = f(unsafe { &mut *self.value.get() });
        #[cfg(debug_assertions)]
        self.in_use.set(false);
        result
    }
}
