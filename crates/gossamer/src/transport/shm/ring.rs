//! A single-producer, single-consumer byte ring in memory shared with another process: one
//! direction of a shared-memory link.
//!
//! # Layout
//! A ring is a [`Control`] block of three 128-byte lines (so that no two words written by
//! different sides share a cache line, nor an adjacent-line prefetch pair) and a data area of
//! `capacity` bytes, a power of two. The `tail` word holds the count of bytes the producer has
//! ever published, shifted left by one, and in its low bit whether the consumer sleeps; the
//! `head` word the count of bytes the consumer has ever taken, shifted, and whether the
//! producer waits for room. Byte position `p` lives at `p % capacity`.
//!
//! # Protocol
//! *Ownership.* Positions `[head, tail)` hold bytes published and not yet taken: they are the
//! consumer's to read. Every other byte of the data area is the producer's to write.
//!
//! - The producer copies new bytes to `[tail, tail + n)` (at most `capacity - (tail - head)`
//!   of them), then adds `n << 1` to the `tail` word (`fetch_add`, `Release`). The consumer's
//!   `Acquire` load of the word that sees the new position also sees the bytes.
//! - The consumer copies `[head, tail)` out to private memory, then adds to the `head` word
//!   (`Release`). The producer's `Acquire` load that sees it orders the producer's later
//!   overwrite of those bytes after the consumer's copy.
//!
//! *Sleeping and waking.* A consumer that found nothing sets the sleep bit with a
//! compare-and-swap from the very word value it found empty ([`Consumer::prepare_sleep`]): if
//! the producer published meanwhile the word changed, the swap fails, and the consumer reads
//! again instead of sleeping. The producer's `fetch_add` returns the word as it was: if the
//! sleep bit is set, the consumer sleeps or is about to, and the producer clears the bit
//! (`fetch_and`) and, if it was the one to clear it, rings the consumer's doorbell
//! ([`Producer::push`] says so). Both sides change the one word with read-modify-writes, so
//! they are ordered in its modification order: either the swap comes first (and the add sees
//! the bit) or the add does (and the swap fails). No wake-up is lost, and no fence is needed.
//! A doorbell that finds the consumer awake is a spurious wake-up, which the consumer
//! tolerates by looking again. A producer out of room does the same with the `head` word
//! ([`Producer::prepare_wait`]; [`Consumer::pop`] says when to ring). The doorbell itself (a
//! byte on the link's Unix socket) is the caller's; this module only says when to ring it.
//! The protocol, doorbells included, is checked with loom (the `loom` tests below).
//!
//! *Cost.* Publishing costs one `fetch_add` on a line the other side reads; the sleeping side's
//! bit rides in the same word, so checking it costs nothing more.
//!
//! # Nothing read from the mapping is trusted
//! The other process may be buggy or crash half-way through a write. Positions are loaded once
//! into private variables and checked before they are used: `tail` may only move forward and
//! never more than `capacity` past `head`; `head` may only move forward and never past
//! `tail`. A position that breaks these rules is [`Corrupt`], which the link reports as a bad
//! frame from the peer. Data bytes are copied out to private memory, and only that copy is
//! decoded, so a peer that changes bytes while they are read changes what we decode (which the
//! decoder checks like any frame) but never what we have already checked. The copy uses
//! `ptr::copy_nonoverlapping` on memory another process may write: the compiler cannot see
//! that process, and the copy is the only access to those bytes, so there is nothing it could
//! assume about them. A flag bit may hold anything: a wrong one costs a spurious doorbell or
//! a sleep that the peer's next publication ends.
//!
//! # Memory
//! The ring reads and writes through an [`Area`]: the mapping (see `mapping`) in the
//! program, cells loom can follow in the model.

use std::fmt;

use crate::loom::sync::atomic::{AtomicU64, Ordering};

/// One cache-line pair of its own for each word.
#[repr(C, align(128))]
#[derive(Debug, Default)]
struct Line<T>(T);

/// The low bit of the `tail` and `head` words: the side that does not write the word sleeps.
const ASLEEP: u64 = 1;

/// The words of one ring that both processes read and write. In the program it lives in the
/// mapping, zeroed by the kernel: every field is valid when all bits are zero, and for any
/// bits the other process may store.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct Control {
    /// `published << 1 | consumer sleeps`.
    tail: Line<AtomicU64>,
    /// `taken << 1 | producer waits for room`.
    head: Line<AtomicU64>,
    /// Bumped by the producer's process every heartbeat, whatever its worker is doing.
    heartbeat: Line<AtomicU64>,
}

/// The bytes one [`Control`] block takes in the mapping.
pub(crate) const CONTROL_BYTES: usize = std::mem::size_of::<Control>();

impl Control {
    /// Whether bytes wait that the consumer has not taken: for the watchdog, from any thread.
    /// Not checked: only compared.
    pub(crate) fn unread(&self) -> bool {
        self.tail.0.load(Ordering::Relaxed) >> 1 != self.head.0.load(Ordering::Relaxed) >> 1
    }

    /// The producer's heartbeat count (any value; only its changes mean anything).
    pub(crate) fn heartbeat(&self) -> u64 {
        self.heartbeat.0.load(Ordering::Relaxed)
    }

    /// Bumps the heartbeat: called by the producer's side.
    pub(crate) fn beat(&self) {
        self.heartbeat.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Where a ring's words and bytes are.
pub(crate) trait Area {
    fn control(&self) -> &Control;
    /// The data area's size: a power of two, the same on both sides (checked at setup).
    fn capacity(&self) -> usize;
    /// Copies `src` into the data area at `at..at + src.len()` (`at + len <= capacity`).
    ///
    /// # Safety
    /// Those bytes are the producer's under the protocol, and the caller is the producer.
    unsafe fn copy_in(&self, at: usize, src: &[u8]);
    /// Copies the data area's `at..at + dst.len()` into `dst` (`at + len <= capacity`).
    ///
    /// # Safety
    /// Those bytes are the consumer's under the protocol, and the caller is the consumer.
    unsafe fn copy_out(&self, at: usize, dst: &mut [u8]);
}

/// A position read from the mapping that breaks the protocol: the peer is broken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Corrupt(pub(crate) String);

impl fmt::Display for Corrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shared-memory ring: {}", self.0)
    }
}

/// Splits a transfer of `len` bytes at position `pos` into its parts before and after the end
/// of the data area: `(offset, first part's length)`.
fn wrap(pos: u64, len: usize, capacity: usize) -> (usize, usize) {
    let at = (pos % capacity as u64) as usize;
    (at, len.min(capacity - at))
}

/// Adds `n` to the position in `word` and says whether the other side slept and this call
/// took its sleep bit: then its doorbell must be rung.
fn advance(word: &AtomicU64, n: u64) -> bool {
    let before = word.fetch_add(n << 1, Ordering::Release);
    before & ASLEEP != 0 && word.fetch_and(!ASLEEP, Ordering::Relaxed) & ASLEEP != 0
}

/// What [`Producer::push`] and [`Consumer::pop`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Moved {
    /// Bytes published or taken (0: none could be).
    pub(crate) bytes: usize,
    /// The other side sleeps: ring its doorbell.
    pub(crate) wake: bool,
}

/// The writing side of a ring.
#[derive(Debug)]
pub(crate) struct Producer<A: Area> {
    area: A,
    /// What this side has published (the mapping's `tail` position is only ever this).
    tail: u64,
    /// The consumer's `head` as last loaded, checked.
    head: u64,
    /// Test hook: this side has scribbled on the ring and publishes nothing more.
    #[cfg(feature = "fuzzing")]
    broken: bool,
}

impl<A: Area> Producer<A> {
    /// The producer of a fresh ring (both positions 0).
    pub(crate) fn new(area: A) -> Self {
        Producer {
            area,
            tail: 0,
            head: 0,
            #[cfg(feature = "fuzzing")]
            broken: false,
        }
    }

    /// Test hook: publishes a position far past anything written, as a broken producer
    /// would, and swallows everything after it (publishing would cover it up).
    #[cfg(feature = "fuzzing")]
    pub(crate) fn scribble(&mut self) {
        self.broken = true;
        let tail = &self.area.control().tail.0;
        tail.fetch_add(1 << 41, Ordering::Release);
    }

    fn room(&self) -> usize {
        self.area.capacity() - (self.tail - self.head) as usize
    }

    /// Checks the consumer's `head` word: forward, and not past what was published.
    fn check_head(&mut self, word: u64) -> Result<(), Corrupt> {
        let head = word >> 1;
        if head.wrapping_sub(self.head) > self.tail - self.head {
            return Err(Corrupt(format!(
                "the consumer's position {head} is not between {} and the {} bytes published",
                self.head, self.tail
            )));
        }
        self.head = head;
        Ok(())
    }

    fn load_head(&mut self) -> Result<u64, Corrupt> {
        let word = self.area.control().head.0.load(Ordering::Acquire);
        self.check_head(word)?;
        Ok(word)
    }

    /// Copies as much of `bytes` as there is room for and publishes it.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Result<Moved, Corrupt> {
        #[cfg(feature = "fuzzing")]
        if self.broken {
            let bytes = bytes.len(); // swallowed
            return Ok(Moved { bytes, wake: false });
        }
        if self.room() < bytes.len() {
            self.load_head()?;
        }
        let n = self.room().min(bytes.len());
        if n == 0 {
            return Ok(Moved {
                bytes: 0,
                wake: false,
            });
        }
        let capacity = self.area.capacity();
        let (at, first) = wrap(self.tail, n, capacity);
        // SAFETY: `[tail, tail + n)` is outside `[head, tail)` and `n <= capacity - (tail -
        // head)`, so those bytes are the producer's (module docs); `at + first <= capacity`
        // and the rest starts at 0 with `n - first <= at`.
        unsafe {
            self.area.copy_in(at, &bytes[..first]);
            self.area.copy_in(0, &bytes[first..n]);
        }
        self.tail += n as u64;
        let wake = advance(&self.area.control().tail.0, n as u64);
        Ok(Moved { bytes: n, wake })
    }

    /// Whether there is room, or the consumer's position is broken (which `push` then
    /// reports): for a watch deciding whether to wake the writer.
    pub(crate) fn writable(&mut self) -> bool {
        if self.room() > 0 {
            return true;
        }
        // Loading refreshes the cached `head`.
        self.load_head().is_err() || self.room() > 0
    }

    /// Out of room: sets the wait bit unless the consumer made room meanwhile. `true` means
    /// room appeared (do not wait); `false`, wait for the doorbell.
    pub(crate) fn prepare_wait(&mut self) -> Result<bool, Corrupt> {
        loop {
            let word = self.load_head()?;
            if self.room() > 0 {
                return Ok(true);
            }
            let head = &self.area.control().head.0;
            let bit =
                head.compare_exchange(word, word | ASLEEP, Ordering::AcqRel, Ordering::Relaxed);
            if bit.is_ok() {
                return Ok(false);
            }
        }
    }
}

/// The reading side of a ring.
#[derive(Debug)]
pub(crate) struct Consumer<A: Area> {
    area: A,
    /// What this side has taken (the mapping's `head` position is only ever this).
    head: u64,
    /// The producer's `tail` as last loaded, checked.
    tail: u64,
}

impl<A: Area> Consumer<A> {
    /// The consumer of a fresh ring (both positions 0).
    pub(crate) fn new(area: A) -> Self {
        Consumer {
            area,
            head: 0,
            tail: 0,
        }
    }

    /// Checks the producer's `tail` word: forward, and at most `capacity` past `head`.
    fn check_tail(&mut self, word: u64) -> Result<(), Corrupt> {
        let tail = word >> 1;
        let room = self.area.capacity() as u64 - (self.tail - self.head);
        if tail.wrapping_sub(self.tail) > room {
            return Err(Corrupt(format!(
                "the producer's position {tail} is not between {} and {} (capacity {})",
                self.tail,
                self.head + self.area.capacity() as u64,
                self.area.capacity()
            )));
        }
        self.tail = tail;
        Ok(())
    }

    fn load_tail(&mut self) -> Result<u64, Corrupt> {
        let word = self.area.control().tail.0.load(Ordering::Acquire);
        self.check_tail(word)?;
        Ok(word)
    }

    /// Takes up to `buf.len()` published bytes into `buf`.
    pub(crate) fn pop(&mut self, buf: &mut [u8]) -> Result<Moved, Corrupt> {
        if self.tail == self.head {
            self.load_tail()?;
        }
        let n = ((self.tail - self.head) as usize).min(buf.len());
        if n == 0 {
            return Ok(Moved {
                bytes: 0,
                wake: false,
            });
        }
        let (at, first) = wrap(self.head, n, self.area.capacity());
        // SAFETY: `[head, head + n)` is within `[head, tail)`, published and the consumer's
        // (module docs); the parts are in bounds as in `Producer::push`.
        unsafe {
            self.area.copy_out(at, &mut buf[..first]);
            self.area.copy_out(0, &mut buf[first..n]);
        }
        self.head += n as u64;
        let wake = advance(&self.area.control().head.0, n as u64);
        Ok(Moved { bytes: n, wake })
    }

    /// Whether bytes are published, or the producer's position is broken (which `pop` then
    /// reports): for a watch deciding whether to wake the reader.
    pub(crate) fn readable(&mut self) -> bool {
        if self.tail != self.head {
            return true;
        }
        // Loading refreshes the cached `tail`.
        self.load_tail().is_err() || self.tail != self.head
    }

    /// Found nothing: sets the sleep bit unless bytes arrived meanwhile. `true` means bytes
    /// arrived (do not sleep); `false`, sleep until the doorbell.
    pub(crate) fn prepare_sleep(&mut self) -> Result<bool, Corrupt> {
        loop {
            let word = self.load_tail()?;
            if self.tail != self.head {
                return Ok(true);
            }
            let tail = &self.area.control().tail.0;
            let bit =
                tail.compare_exchange(word, word | ASLEEP, Ordering::AcqRel, Ordering::Relaxed);
            if bit.is_ok() {
                return Ok(false);
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::cell::UnsafeCell;

    /// A ring in ordinary memory, for one thread.
    struct Local {
        control: Control,
        data: Box<[UnsafeCell<u8>]>,
    }

    impl Local {
        fn new(capacity: usize) -> std::rc::Rc<Local> {
            std::rc::Rc::new(Local {
                control: Control::default(),
                data: (0..capacity).map(|_| UnsafeCell::new(0)).collect(),
            })
        }
    }

    impl Area for std::rc::Rc<Local> {
        fn control(&self) -> &Control {
            &self.control
        }
        fn capacity(&self) -> usize {
            self.data.len()
        }
        unsafe fn copy_in(&self, at: usize, src: &[u8]) {
            for (i, &b) in src.iter().enumerate() {
                // SAFETY: one thread; in bounds by the caller's contract.
                unsafe { *self.data[at + i].get() = b };
            }
        }
        unsafe fn copy_out(&self, at: usize, dst: &mut [u8]) {
            for (i, d) in dst.iter_mut().enumerate() {
                // SAFETY: as in `copy_in`.
                *d = unsafe { *self.data[at + i].get() };
            }
        }
    }

    #[test]
    fn bytes_come_out_in_order_across_the_wrap() {
        let area = Local::new(8);
        let (mut p, mut c) = (Producer::new(area.clone()), Consumer::new(area));
        let mut out = Vec::new();
        let mut next = 0u8;
        for round in 0..50 {
            let chunk: Vec<u8> = (0..(round % 7 + 1))
                .map(|_| {
                    next = next.wrapping_add(1);
                    next
                })
                .collect();
            let mut sent = 0;
            while sent < chunk.len() {
                sent += p.push(&chunk[sent..]).unwrap().bytes;
                let mut buf = [0; 3];
                let n = c.pop(&mut buf).unwrap().bytes;
                out.extend_from_slice(&buf[..n]);
            }
        }
        loop {
            let mut buf = [0; 8];
            match c.pop(&mut buf).unwrap().bytes {
                0 => break,
                n => out.extend_from_slice(&buf[..n]),
            }
        }
        let expected: Vec<u8> = (1..=out.len()).map(|i| i as u8).collect();
        assert_eq!(out, expected);
    }

    #[test]
    fn a_full_ring_takes_nothing_more() {
        let area = Local::new(4);
        let mut p = Producer::new(area);
        assert_eq!(p.push(b"abcdef").unwrap().bytes, 4);
        assert_eq!(p.push(b"g").unwrap().bytes, 0);
        assert!(!p.prepare_wait().unwrap(), "no room appeared");
    }

    #[test]
    fn positions_that_break_the_protocol_are_corrupt() {
        // A tail more than the capacity ahead.
        let area = Local::new(4);
        area.control.tail.0.store(5 << 1, Ordering::Relaxed);
        let mut c = Consumer::new(area);
        let e = c.pop(&mut [0; 8]).unwrap_err();
        assert!(e.to_string().contains("producer's position 5"), "{e}");

        // A tail that moves backwards.
        let area = Local::new(4);
        let (mut p, mut c) = (Producer::new(area.clone()), Consumer::new(area.clone()));
        p.push(b"ab").unwrap();
        c.pop(&mut [0; 1]).unwrap();
        area.control.tail.0.store(0, Ordering::Relaxed);
        c.pop(&mut [0; 1]).unwrap(); // the second byte was already loaded
        assert!(
            c.pop(&mut [0; 1]).is_err(),
            "a tail that moved back is corrupt"
        );

        // A head past the bytes published.
        let area = Local::new(4);
        let mut p = Producer::new(area.clone());
        p.push(b"abcd").unwrap();
        area.control.head.0.store(9 << 1, Ordering::Relaxed);
        let e = p.push(b"e").unwrap_err();
        assert!(e.to_string().contains("consumer's position 9"), "{e}");
    }

    #[test]
    fn sleeping_and_waiting_are_announced_and_taken_once() {
        let area = Local::new(4);
        let (mut p, mut c) = (Producer::new(area.clone()), Consumer::new(area));
        assert!(!c.prepare_sleep().unwrap(), "nothing to read: sleep");
        assert!(p.push(b"x").unwrap().wake, "the sleeper is woken");
        assert!(!p.push(b"y").unwrap().wake, "once");
        assert!(c.prepare_sleep().unwrap(), "bytes wait: no sleep");
        assert!(
            !p.push(b"z").unwrap().wake,
            "an awake consumer costs no doorbell"
        );

        p.push(b"w").unwrap();
        assert!(!p.prepare_wait().unwrap(), "full: wait");
        assert!(
            c.pop(&mut [0; 2]).unwrap().wake,
            "the waiting producer is woken"
        );
        assert!(!c.pop(&mut [0; 1]).unwrap().wake, "once");
        assert!(p.prepare_wait().unwrap(), "room: no wait");
    }

    #[test]
    fn a_sleep_announced_against_a_stale_position_is_refused() {
        let area = Local::new(4);
        let (mut p, mut c) = (Producer::new(area.clone()), Consumer::new(area.clone()));
        // The consumer read the word empty; the producer publishes before the consumer's
        // compare-and-swap: the swap must fail and the consumer see the byte.
        let seen = area.control.tail.0.load(Ordering::Relaxed);
        p.push(b"x").unwrap();
        let swapped = area.control.tail.0.compare_exchange(
            seen,
            seen | ASLEEP,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        assert!(swapped.is_err());
        assert!(c.prepare_sleep().unwrap());
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::{Arc, Condvar, Mutex};

    struct Cells {
        control: Control,
        data: Vec<UnsafeCell<u8>>,
    }

    #[derive(Clone)]
    struct Shared(Arc<Cells>);

    impl Area for Shared {
        fn control(&self) -> &Control {
            &self.0.control
        }
        fn capacity(&self) -> usize {
            self.0.data.len()
        }
        unsafe fn copy_in(&self, at: usize, src: &[u8]) {
            for (i, &b) in src.iter().enumerate() {
                // SAFETY: loom checks that the protocol makes these bytes ours.
                self.0.data[at + i].with_mut(|p| unsafe { *p = b });
            }
        }
        unsafe fn copy_out(&self, at: usize, dst: &mut [u8]) {
            for (i, d) in dst.iter_mut().enumerate() {
                // SAFETY: as in `copy_in`.
                *d = self.0.data[at + i].with(|p| unsafe { *p });
            }
        }
    }

    /// A doorbell: rings accumulate, a wait takes one (a stale ring is a spurious wake-up).
    #[derive(Default)]
    struct Bell {
        rings: Mutex<u32>,
        rung: Condvar,
    }

    impl Bell {
        fn ring(&self) {
            *self.rings.lock().unwrap() += 1;
            self.rung.notify_one();
        }
        fn wait(&self) {
            let mut rings = self.rings.lock().unwrap();
            while *rings == 0 {
                rings = self.rung.wait(rings).unwrap();
            }
            *rings -= 1;
        }
    }

    /// A producer sends more bytes than the ring holds; the consumer sleeps whenever it finds
    /// nothing and the producer waits whenever it finds no room. Every byte arrives in order,
    /// loom finds no data race on the bytes, and no wake-up is lost (a lost one deadlocks,
    /// which loom reports).
    #[test]
    fn loom_bytes_arrive_and_no_wake_up_is_lost() {
        loom::model(|| {
            let shared = Shared(Arc::new(Cells {
                control: Control::default(),
                data: (0..2).map(|_| UnsafeCell::new(0)).collect(),
            }));
            let bells = Arc::new((Bell::default(), Bell::default())); // (consumer's, producer's)
            let producer = {
                let (shared, bells) = (shared.clone(), bells.clone());
                loom::thread::spawn(move || {
                    let mut p = Producer::new(shared);
                    let message = [1u8, 2, 3];
                    let mut sent = 0;
                    while sent < message.len() {
                        let moved = p.push(&message[sent..]).unwrap();
                        if moved.wake {
                            bells.0.ring();
                        }
                        if moved.bytes > 0 {
                            sent += moved.bytes;
                        } else if !p.prepare_wait().unwrap() {
                            bells.1.wait();
                        }
                    }
                })
            };
            let mut c = Consumer::new(shared);
            let mut got = Vec::new();
            while got.len() < 3 {
                let mut buf = [0; 2];
                let moved = c.pop(&mut buf).unwrap();
                if moved.wake {
                    bells.1.ring();
                }
                if moved.bytes > 0 {
                    got.extend_from_slice(&buf[..moved.bytes]);
                } else if !c.prepare_sleep().unwrap() {
                    bells.0.wait();
                }
            }
            assert_eq!(got, [1, 2, 3]);
            producer.join().unwrap();
        });
    }
}
