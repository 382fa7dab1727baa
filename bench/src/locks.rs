//! The lock-based systems: an array of counters, each behind its own lock (or an atomic).
//!
//! Every critical section increments the counter, executes one `std::hint::spin_loop()` (the seed's
//! `pause`), and returns the new value. Counters are padded to a cache line each, which is the most
//! favourable layout for locks (no false sharing between neighbouring locks).

use std::hint::spin_loop;
use std::sync::atomic::{AtomicU64, Ordering};

/// A value alone on its cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct Padded<T>(pub T);

/// An array of lock-protected counters.
pub trait Counters: Send + Sync + Sized {
    /// Per-thread state a lock needs (the queue node of an MCS lock); `()` for most.
    type Local: Default;
    /// Name in plots and tables.
    const NAME: &'static str;
    /// `n` counters, all zero.
    fn new(n: usize) -> Self;
    /// Increments counter `i` inside its critical section and returns the new value.
    fn fetch_add(&self, local: &mut Self::Local, i: usize) -> u64;
    /// Reads counter `i` (used for verification after the threads have stopped).
    fn get(&self, i: usize) -> u64;
    /// Number of counters.
    fn len(&self) -> usize;
    /// Whether there are no counters.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Sum of all counters.
    fn total(&self) -> u64 {
        (0..self.len()).map(|i| self.get(i)).sum()
    }
}

macro_rules! lock_counters {
    ($(#[$doc:meta])* $name:ident, $label:expr, $lock:ty, |$m:ident| $acquire:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name(Box<[Padded<$lock>]>);

        impl Counters for $name {
            type Local = ();
            const NAME: &'static str = $label;
            fn new(n: usize) -> Self {
                $name((0..n).map(|_| Padded(<$lock>::new(0))).collect())
            }
            #[inline]
            fn fetch_add(&self, _: &mut (), i: usize) -> u64 {
                let $m = &self.0[i].0;
                let mut guard = $acquire;
                *guard += 1;
                spin_loop();
                *guard
            }
            fn get(&self, i: usize) -> u64 {
                let $m = &self.0[i].0;
                let guard = $acquire;
                *guard
            }
            fn len(&self) -> usize {
                self.0.len()
            }
        }
    };
}

lock_counters!(
    /// `std::sync::Mutex` (futex-based on Linux).
    StdMutex,
    "std Mutex",
    std::sync::Mutex<u64>,
    |m| m.lock().unwrap_or_else(|e| e.into_inner())
);
lock_counters!(
    /// `parking_lot::Mutex` (spin briefly, then park).
    ParkingLot,
    "parking_lot Mutex",
    parking_lot::Mutex<u64>,
    |m| m.lock()
);
lock_counters!(
    /// `spin::mutex::TicketMutex` (FIFO ticket lock, spins).
    SpinTicket,
    "spin ticket",
    spin::mutex::TicketMutex<u64>,
    |m| m.lock()
);
lock_counters!(
    /// `spin::mutex::SpinMutex` (test-and-set lock, spins).
    SpinTas,
    "spin TAS",
    spin::mutex::SpinMutex<u64>,
    |m| m.lock()
);

/// `mcslock::raw::spins::Mutex`: the MCS queue lock, each thread spinning on its own node.
#[derive(Debug)]
pub struct Mcs(Box<[Padded<mcslock::raw::spins::Mutex<u64>>]>);

/// A thread's MCS queue node.
#[derive(Debug, Default)]
pub struct McsNode(mcslock::raw::MutexNode);

impl Counters for Mcs {
    type Local = McsNode;
    const NAME: &'static str = "MCS (mcslock)";
    fn new(n: usize) -> Self {
        Mcs((0..n)
            .map(|_| Padded(mcslock::raw::spins::Mutex::new(0)))
            .collect())
    }
    #[inline]
    fn fetch_add(&self, node: &mut McsNode, i: usize) -> u64 {
        self.0[i].0.lock_with_then(&mut node.0, |c| {
            *c += 1;
            spin_loop();
            *c
        })
    }
    fn get(&self, i: usize) -> u64 {
        self.0[i].0.lock_then(|c| *c)
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// `AtomicU64::fetch_add`: no critical section and no pause; the hardware ceiling for one counter.
#[derive(Debug)]
pub struct Atomic(Box<[Padded<AtomicU64>]>);

impl Counters for Atomic {
    type Local = ();
    const NAME: &'static str = "atomic fetch_add";
    fn new(n: usize) -> Self {
        Atomic((0..n).map(|_| Padded(AtomicU64::new(0))).collect())
    }
    #[inline]
    fn fetch_add(&self, _: &mut (), i: usize) -> u64 {
        self.0[i].0.fetch_add(1, Ordering::Relaxed) + 1
    }
    fn get(&self, i: usize) -> u64 {
        self.0[i].0.load(Ordering::Relaxed)
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// The lock kinds, for iteration; dispatch to the generic code with the `with_counters!` macro.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// [`StdMutex`].
    Std,
    /// [`ParkingLot`].
    ParkingLot,
    /// [`SpinTicket`].
    SpinTicket,
    /// [`SpinTas`].
    SpinTas,
    /// [`Mcs`].
    Mcs,
    /// [`Atomic`].
    Atomic,
}

impl LockKind {
    /// The real locks (everything but the atomic ceiling).
    pub const LOCKS: [LockKind; 5] = [
        LockKind::Std,
        LockKind::ParkingLot,
        LockKind::SpinTicket,
        LockKind::SpinTas,
        LockKind::Mcs,
    ];

    /// Name in plots and tables.
    pub fn name(self) -> &'static str {
        match self {
            LockKind::Std => StdMutex::NAME,
            LockKind::ParkingLot => ParkingLot::NAME,
            LockKind::SpinTicket => SpinTicket::NAME,
            LockKind::SpinTas => SpinTas::NAME,
            LockKind::Mcs => Mcs::NAME,
            LockKind::Atomic => Atomic::NAME,
        }
    }
}

/// Runs `$body` with the type alias `$t` bound to the [`Counters`] type of `$kind`.
macro_rules! with_counters {
    ($kind:expr, $t:ident => $body:expr) => {
        match $kind {
            $crate::locks::LockKind::Std => {
                type $t = $crate::locks::StdMutex;
                $body
            }
            $crate::locks::LockKind::ParkingLot => {
                type $t = $crate::locks::ParkingLot;
                $body
            }
            $crate::locks::LockKind::SpinTicket => {
                type $t = $crate::locks::SpinTicket;
                $body
            }
            $crate::locks::LockKind::SpinTas => {
                type $t = $crate::locks::SpinTas;
                $body
            }
            $crate::locks::LockKind::Mcs => {
                type $t = $crate::locks::Mcs;
                $body
            }
            $crate::locks::LockKind::Atomic => {
                type $t = $crate::locks::Atomic;
                $body
            }
        }
    };
}
pub(crate) use with_counters;

#[cfg(test)]
mod tests {
    use super::*;

    fn hammer<C: Counters>() {
        let c = C::new(3);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let mut l = C::Local::default();
                    for k in 0..1000 {
                        assert!(c.fetch_add(&mut l, k % 3) >= 1);
                    }
                });
            }
        });
        assert_eq!(c.total(), 4000);
    }

    #[test]
    fn all_counters_count() {
        for k in [
            LockKind::Std,
            LockKind::ParkingLot,
            LockKind::SpinTicket,
            LockKind::SpinTas,
            LockKind::Mcs,
            LockKind::Atomic,
        ] {
            with_counters!(k, C => hammer::<C>());
        }
    }
}
