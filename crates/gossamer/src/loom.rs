//! The atomics and locks of the protocols that loom models check (the shared-memory ring's,
//! the durable host's handoff to its syncer): `std`'s normally, loom's under `--cfg loom`, so
//! that the same code runs in the program and in the model.

#[cfg(not(loom))]
pub(crate) mod sync {
    pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

    pub(crate) mod atomic {
        pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
    }
}

#[cfg(loom)]
pub(crate) mod sync {
    pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

    pub(crate) mod atomic {
        pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
    }
}
