//! One facade for the synchronization primitives the runtime's protocols use, so that the
//! same code runs on `std` normally and under the `loom` model checker with `--cfg loom`.
//!
//! Cells are accessed only through closures (`with`, `with_mut`), which loom needs to track
//! who touches which bytes when.

#[cfg(not(loom))]
pub(crate) mod sync {
    pub(crate) mod atomic {
        pub(crate) use std::sync::atomic::{
            AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
        };
    }
}

#[cfg(loom)]
pub(crate) mod sync {
    pub(crate) mod atomic {
        pub(crate) use loom::sync::atomic::{
            AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
        };
    }
}

#[cfg(not(loom))]
pub(crate) mod cell {
    /// `std::cell::UnsafeCell` with loom's closure-scoped access methods.
    #[derive(Debug, Default)]
    #[repr(transparent)]
    pub(crate) struct UnsafeCell<T: ?Sized>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }
    }

    impl<T: ?Sized> UnsafeCell<T> {
        #[inline(always)]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }
        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

#[cfg(loom)]
pub(crate) mod cell {
    pub(crate) use loom::cell::UnsafeCell;
}
