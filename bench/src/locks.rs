//! The lock-based systems: an array of objects, each behind its own lock (or, for counters, an
//! atomic).
//!
//! Every critical section is a [`Section`]: it updates the object in place, executes one
//! `std::hint::spin_loop()` (the seed's `pause`) and returns a value. Objects are padded to a cache
//! line each, which is the most favourable layout for locks (no false sharing between neighbouring
//! locks).

use std::hint::spin_loop;
use std::sync::Mutex as StdLock;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex as PlMutex;
use spin::mutex::{SpinMutex, TicketMutex};

/// A value alone on its cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct Padded<T>(pub T);

/// The data a critical section updates, and the critical section itself.
pub trait Section: Default + Send + 'static {
    /// The critical section: updates the data in place, executes one `spin_loop()` and returns a
    /// value that is never 0 after it ran.
    fn enter(&mut self) -> u64;
    /// How many critical sections ran on this data, or `None` if its state is one no sequence of
    /// whole critical sections produces (a torn or lost update).
    fn count(&self) -> Option<u64>;
}

/// A counter: increment, pause, return the new value (the seed's fetch-and-add).
impl Section for u64 {
    #[inline]
    fn enter(&mut self) -> u64 {
        *self += 1;
        spin_loop();
        *self
    }
    fn count(&self) -> Option<u64> {
        Some(*self)
    }
}

/// Words in a [`Block`].
pub const BLOCK_WORDS: usize = 32;

/// A small struct of four cache lines (`[u64; 32]`); its critical section adds 1 to every word in
/// place, so the data moves with whoever runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct Block(pub [u64; BLOCK_WORDS]);

impl Default for Block {
    fn default() -> Self {
        Block([0; BLOCK_WORDS])
    }
}

impl Section for Block {
    #[inline]
    fn enter(&mut self) -> u64 {
        for w in &mut self.0 {
            *w += 1;
        }
        spin_loop();
        self.0[BLOCK_WORDS - 1]
    }
    /// Every word counts the sections that ran, so all words must agree.
    fn count(&self) -> Option<u64> {
        let first = self.0[0];
        self.0.iter().all(|&w| w == first).then_some(first)
    }
}

/// An array of lock-protected objects of type `T`.
pub trait Counters<T: Section>: Send + Sync + Sized {
    /// Per-thread state a lock needs (the queue node of an MCS lock); `()` for most.
    type Local: Default;
    /// Name in plots and tables.
    const NAME: &'static str;
    /// `n` objects in their initial state.
    fn new(n: usize) -> Self;
    /// Runs the critical section on object `i` under its lock and returns its value.
    fn enter(&self, local: &mut Self::Local, i: usize) -> u64;
    /// How many critical sections ran on object `i` (read after the threads have stopped).
    fn count(&self, i: usize) -> Option<u64>;
    /// Number of objects.
    fn len(&self) -> usize;
    /// Whether there are no objects.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Critical sections that ran on all objects, or `None` if any object is in an impossible state.
    fn total(&self) -> Option<u64> {
        (0..self.len()).map(|i| self.count(i)).sum()
    }
}

macro_rules! lock_counters {
    ($(#[$doc:meta])* $name:ident, $label:expr, $lock:ident, |$m:ident| $acquire:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name<T>(Box<[Padded<$lock<T>>]>);

        impl<T: Section> Counters<T> for $name<T> {
            type Local = ();
            const NAME: &'static str = $label;
            fn new(n: usize) -> Self {
                $name((0..n).map(|_| Padded($lock::new(T::default()))).collect())
            }
            #[inline]
            fn enter(&self, _: &mut (), i: usize) -> u64 {
                let $m = &self.0[i].0;
                let mut guard = $acquire;
                guard.enter()
            }
            fn count(&self, i: usize) -> Option<u64> {
                let $m = &self.0[i].0;
                let guard = $acquire;
                guard.count()
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
    StdLock,
    |m| m.lock().unwrap_or_else(|e| e.into_inner())
);
lock_counters!(
    /// `parking_lot::Mutex` (spin briefly, then park).
    ParkingLot,
    "parking_lot Mutex",
    PlMutex,
    |m| m.lock()
);
lock_counters!(
    /// `spin::mutex::TicketMutex` (FIFO ticket lock, spins).
    SpinTicket,
    "spin ticket",
    TicketMutex,
    |m| m.lock()
);
lock_counters!(
    /// `spin::mutex::SpinMutex` (test-and-set lock, spins).
    SpinTas,
    "spin TAS",
    SpinMutex,
    |m| m.lock()
);

/// `mcslock::raw::spins::Mutex`: the MCS queue lock, each thread spinning on its own node.
#[derive(Debug)]
pub struct Mcs<T>(Box<[Padded<mcslock::raw::spins::Mutex<T>>]>);

/// A thread's MCS queue node.
#[derive(Debug, Default)]
pub struct McsNode(mcslock::raw::MutexNode);

impl<T: Section> Counters<T> for Mcs<T> {
    type Local = McsNode;
    const NAME: &'static str = "MCS (mcslock)";
    fn new(n: usize) -> Self {
        Mcs((0..n)
            .map(|_| Padded(mcslock::raw::spins::Mutex::new(T::default())))
            .collect())
    }
    #[inline]
    fn enter(&self, node: &mut McsNode, i: usize) -> u64 {
        self.0[i].0.lock_with_then(&mut node.0, T::enter)
    }
    fn count(&self, i: usize) -> Option<u64> {
        self.0[i].0.lock_then(|c| c.count())
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// `AtomicU64::fetch_add`: no critical section and no pause; the hardware ceiling for one counter.
#[derive(Debug)]
pub struct Atomic(Box<[Padded<AtomicU64>]>);

impl Counters<u64> for Atomic {
    type Local = ();
    const NAME: &'static str = "atomic fetch_add";
    fn new(n: usize) -> Self {
        Atomic((0..n).map(|_| Padded(AtomicU64::new(0))).collect())
    }
    #[inline]
    fn enter(&self, _: &mut (), i: usize) -> u64 {
        self.0[i].0.fetch_add(1, Ordering::Relaxed) + 1
    }
    fn count(&self, i: usize) -> Option<u64> {
        Some(self.0[i].0.load(Ordering::Relaxed))
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
}

impl LockKind {
    /// Every lock kind.
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
            LockKind::Std => <StdMutex<u64> as Counters<u64>>::NAME,
            LockKind::ParkingLot => <ParkingLot<u64> as Counters<u64>>::NAME,
            LockKind::SpinTicket => <SpinTicket<u64> as Counters<u64>>::NAME,
            LockKind::SpinTas => <SpinTas<u64> as Counters<u64>>::NAME,
            LockKind::Mcs => <Mcs<u64> as Counters<u64>>::NAME,
        }
    }
}

/// Runs `$body` with the type alias `$t` bound to the [`Counters`] type of `$kind` over objects
/// of the concrete type `$data`.
macro_rules! with_counters {
    ($kind:expr, $data:ty, $t:ident => $body:expr) => {
        match $kind {
            $crate::locks::LockKind::Std => {
                type $t = $crate::locks::StdMutex<$data>;
                $body
            }
            $crate::locks::LockKind::ParkingLot => {
                type $t = $crate::locks::ParkingLot<$data>;
                $body
            }
            $crate::locks::LockKind::SpinTicket => {
                type $t = $crate::locks::SpinTicket<$data>;
                $body
            }
            $crate::locks::LockKind::SpinTas => {
                type $t = $crate::locks::SpinTas<$data>;
                $body
            }
            $crate::locks::LockKind::Mcs => {
                type $t = $crate::locks::Mcs<$data>;
                $body
            }
        }
    };
}
pub(crate) use with_counters;

#[cfg(test)]
mod tests {
    use super::*;

    fn hammer<T: Section, C: Counters<T>>() {
        let c = C::new(3);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let mut l = C::Local::default();
                    for k in 0..1000 {
                        assert!(c.enter(&mut l, k % 3) >= 1);
                    }
                });
            }
        });
        assert_eq!(c.total(), Some(4000));
    }

    #[test]
    fn all_counters_count() {
        for k in LockKind::LOCKS {
            with_counters!(k, u64, C => hammer::<u64, C>());
            with_counters!(k, Block, C => hammer::<Block, C>());
        }
        hammer::<u64, Atomic>();
    }

    #[test]
    fn torn_block_is_detected() {
        let mut b = Block::default();
        assert_eq!(b.enter(), 1);
        assert_eq!(b.count(), Some(1));
        b.0[7] += 1;
        assert_eq!(b.count(), None);
        assert_eq!(size_of::<Block>(), 256);
    }
}
