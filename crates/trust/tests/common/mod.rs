//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

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
