//! `Latch<T>`: mutual exclusion among the fibers of one worker, without atomics.
//!
//! `launch` runs a closure in a trustee-side fiber that may suspend; the latch keeps other
//! launched fibers out of the property meanwhile. The value lives in its own allocation, so
//! the `&mut Latch<T>` that an ordinary `apply` on the same trust creates never overlaps the
//! `&mut T` a suspended fiber holds, and latch state is only touched through short-lived
//! shared references, never held across a suspension.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::task::{Poll, Waker};

use crate::fiber;

/// A fiber-level lock around a value, for properties used with [`Trust::launch`](crate::Trust::launch).
///
/// It is `Send` (a property moves to its trustee) but not `Sync`: only fibers of one thread
/// ever use it, which is why it needs no atomic instructions.
///
/// ```compile_fail
/// fn assert_sync<T: Sync>() {}
/// assert_sync::<trust::Latch<u32>>();
/// ```
pub struct Latch<T> {
    locked: Cell<bool>,
    waiters: RefCell<VecDeque<Waker>>,
    value: NonNull<T>,
    _owns: PhantomData<T>,
}

// SAFETY: the latch owns its value; moving it to another thread moves the value (`T: Send`).
// No reference into it is shared across threads (`Latch` is not `Sync`).
unsafe impl<T: Send> Send for Latch<T> {}

impl<T: fmt::Debug> fmt::Debug for Latch<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.try_lock() {
            Some(guard) => f.debug_struct("Latch").field("value", &*guard).finish(),
            None => f.debug_struct("Latch").field("value", &"<locked>").finish(),
        }
    }
}

impl<T> Latch<T> {
    /// A new, unlocked latch.
    pub fn new(value: T) -> Self {
        Latch {
            locked: Cell::new(false),
            waiters: RefCell::new(VecDeque::new()),
            value: NonNull::from(Box::leak(Box::new(value))),
            _owns: PhantomData,
        }
    }

    /// Locks the latch if it is free. Inside an ordinary `apply` this is how to reach a
    /// latched value: it fails while a launched fiber holds the latch.
    ///
    /// ```
    /// let latch = trust::Latch::new(5);
    /// *latch.try_lock().unwrap() += 1;
    /// assert_eq!(*latch.try_lock().unwrap(), 6);
    /// ```
    pub fn try_lock(&self) -> Option<LatchGuard<'_, T>> {
        if self.locked.replace(true) {
            return None;
        }
        Some(LatchGuard { latch: self })
    }

    /// Whether a fiber or guard holds the latch.
    pub fn is_locked(&self) -> bool {
        self.locked.get()
    }

    /// The value, consuming the latch.
    pub fn into_inner(self) -> T {
        let value = self.value;
        std::mem::forget(self);
        // SAFETY: the box came from `Latch::new`; `self` is forgotten, so it is freed once.
        *unsafe { Box::from_raw(value.as_ptr()) }
    }

    fn release(&self) {
        self.locked.set(false);
        let next = self.waiters.borrow_mut().pop_front();
        if let Some(waker) = next {
            waker.wake();
        }
    }

    /// Waits, suspending the calling fiber, until the latch is free, then locks it.
    ///
    /// # Safety
    /// `latch` points at a live latch for the whole call, used only by this thread.
    pub(crate) unsafe fn acquire_raw(latch: *const Self) {
        fiber::wait(std::future::poll_fn(|cx| {
            // SAFETY: per the caller; the reference ends before the fiber suspends.
            let latch = unsafe { &*latch };
            if latch.locked.replace(true) {
                latch.waiters.borrow_mut().push_back(cx.waker().clone());
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        }))
    }

    /// The value's address (valid while the latch lives).
    ///
    /// # Safety
    /// `latch` points at a live latch.
    pub(crate) unsafe fn value_raw(latch: *const Self) -> *mut T {
        // SAFETY: per the caller.
        unsafe { (*latch).value.as_ptr() }
    }

    /// Unlocks and wakes the next waiting fiber.
    ///
    /// # Safety
    /// `latch` points at a live latch locked by the caller.
    pub(crate) unsafe fn release_raw(latch: *const Self) {
        // SAFETY: per the caller.
        unsafe { (*latch).release() }
    }
}

impl<T> Drop for Latch<T> {
    fn drop(&mut self) {
        // SAFETY: the box came from `Latch::new` and nothing borrows it: a holder of the latch
        // keeps the property (and so the latch) alive.
        drop(unsafe { Box::from_raw(self.value.as_ptr()) });
    }
}

/// Access to a latched value; unlocks when dropped.
pub struct LatchGuard<'a, T> {
    latch: &'a Latch<T>,
}

impl<T: fmt::Debug> fmt::Debug for LatchGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

impl<T> Deref for LatchGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the latch, so no other access to the value exists.
        unsafe { self.latch.value.as_ref() }
    }
}

impl<T> DerefMut for LatchGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only access through the guard.
        unsafe { &mut *self.latch.value.as_ptr() }
    }
}

impl<T> Drop for LatchGuard<'_, T> {
    fn drop(&mut self) {
        self.latch.release();
    }
}
