//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

/// How long a test waits for any one thing before it fails. Far above what any wait here
/// takes, even under valgrind on a busy 2-core machine: it exists so that a hang fails the
/// test with a message naming what it waited for, rather than eating CI's time limit.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// Waits until `done()` holds. Between checks a fiber yields to the other fibers of its
/// worker; a plain thread sleeps, leaving the cores to the workers.
///
/// # Panics
/// Naming `what`, when [`PATIENCE`] runs out first.
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "gave up after {PATIENCE:?} waiting for {what}"
        );
        if trust::current_worker().is_some() {
            trust::yield_now();
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Runs `f`, which blocks until something else happens (a join, the runtime's shutdown), on a
/// thread of its own, and returns its result; re-raises its panic.
///
/// # Panics
/// Naming `what`, when `f` has not returned after [`PATIENCE`] (its thread is left behind).
pub fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(PATIENCE) {
        Ok(value) => {
            thread.join().expect("the thread sent its result");
            value
        }
        // The sender was dropped without a result: `f` panicked.
        Err(mpsc::RecvTimeoutError::Disconnected) => match thread.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the thread ended without a result"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("gave up after {PATIENCE:?} waiting for {what}")
        }
    }
}

/// Scales a test's size: `GOSSAMER_TEST_SCALE` divides it (the valgrind run sets it).
pub fn scaled(n: usize) -> usize {
    let div: usize = std::env::var("GOSSAMER_TEST_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    (n / div.max(1)).max(1)
}

/// Counts how many times values it made were dropped, and where.
#[derive(Clone, Default)]
pub struct Drops(Arc<AtomicUsize>);

impl Drops {
    pub fn track<T>(&self, value: T) -> Tracked<T> {
        Tracked {
            value,
            drops: self.0.clone(),
        }
    }
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A value whose drop is counted.
pub struct Tracked<T> {
    pub value: T,
    drops: Arc<AtomicUsize>,
}

impl<T> Drop for Tracked<T> {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

/// The panic message of a caught panic.
pub fn message(panic: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        return s.to_string();
    }
    if let Some(s) = panic.downcast_ref::<String>() {
        return s.clone();
    }
    "<non-string panic>".into()
}

pub fn runtime(workers: usize) -> trust::Runtime {
    trust::Runtime::builder()
        .workers(workers)
        .stack_size(64 * 1024)
        .build()
        .unwrap()
}
