//! Type-erased records stored byte for byte in word buffers.
//!
//! A record is `[length in words][header H][payload P]`, every part a whole number of 8-byte
//! words. The header is plain data (`Copy`, typically a trampoline function pointer); the payload
//! is a value — usually a closure — *moved* into the buffer with a bitwise copy. Whoever takes a
//! record out must consume its payload exactly once (read it, or drop it in place); the buffer
//! itself never drops payloads, because it does not know their types.
//!
//! Records are used for requests (staged by a client, copied into a request slot, run by the
//! trustee) and for completions (kept by the client until the answer arrives).
//!
//! Payloads larger than [`MAX_INLINE`] bytes, or aligned to more than 8, are boxed
//! transparently: [`RecordBuf::push`] stores the box and [`take`] unboxes it.

use std::marker::PhantomData;
use std::mem::{MaybeUninit, align_of, size_of};
use std::ptr;

/// Bytes per word.
pub(crate) const WORD: usize = 8;

/// Largest payload stored inline; larger values are boxed by the caller.
pub(crate) const MAX_INLINE: usize = 256;

/// Whether a value of type `P` is stored inline in a record (otherwise it is boxed).
pub(crate) const fn fits_inline<P>() -> bool {
    size_of::<P>() <= MAX_INLINE && align_of::<P>() <= WORD
}

/// Bytes a payload of type `P` occupies in a record.
const fn stored_size<P>() -> usize {
    if fits_inline::<P>() {
        size_of::<P>()
    } else {
        size_of::<Box<P>>()
    }
}

/// Moves a payload of type `P` out of a record.
///
/// # Safety
/// `at` is the payload address of a record whose payload was pushed as a `P` and not yet
/// consumed; afterwards it is consumed.
pub(crate) unsafe fn take<P>(at: *mut u8) -> P {
    // SAFETY: per the caller, `at` holds a `P` (inline) or a `Box<P>` written by `push`.
    unsafe {
        if fits_inline::<P>() {
            at.cast::<P>().read()
        } else {
            *at.cast::<Box<P>>().read()
        }
    }
}

/// Words needed for `bytes` bytes.
pub(crate) const fn words_for(bytes: usize) -> usize {
    bytes.div_ceil(WORD)
}

/// Words one record with header `H` and payload `P` occupies.
pub(crate) const fn record_words<H, P>() -> usize {
    1 + words_for(size_of::<H>()) + words_for(stored_size::<P>())
}

type Word = MaybeUninit<u64>;

/// Consumed words at the front of a buffer that trigger compaction.
const COMPACT_WORDS: usize = 1024;

/// A growable buffer of records with header `H`, consumed from the front.
pub(crate) struct RecordBuf<H> {
    words: Vec<Word>,
    /// Index of the first unconsumed record.
    head: usize,
    /// Number of unconsumed records.
    count: usize,
    _header: PhantomData<H>,
}

impl<H: Copy> RecordBuf<H> {
    pub(crate) fn new() -> Self {
        const { assert!(align_of::<H>() <= WORD) };
        RecordBuf {
            words: Vec::new(),
            head: 0,
            count: 0,
            _header: PhantomData,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Appends a record, moving `payload` into the buffer (boxed if it is too large).
    pub(crate) fn push<P>(&mut self, header: H, payload: P) {
        let total = record_words::<H, P>();
        let at = self.words.len();
        self.words.reserve(total);
        // SAFETY: `reserve` made room for `total` words after `at`; we write the length word,
        // the header and the payload (or its box) inside that room, each at a word boundary
        // with an alignment of at most 8, then publish the words with `set_len`.
        unsafe {
            let base = self.words.as_mut_ptr().add(at);
            base.cast::<u64>().write(total as u64);
            base.add(1).cast::<H>().write(header);
            let slot = base.add(1 + words_for(size_of::<H>()));
            if fits_inline::<P>() {
                slot.cast::<P>().write(payload);
            } else {
                slot.cast::<Box<P>>().write(Box::new(payload));
            }
            self.words.set_len(at + total);
        }
        self.count += 1;
    }

    /// The header and payload address of the first record, if any. The payload stays owned by
    /// the buffer until [`RecordBuf::pop_consumed`].
    pub(crate) fn front(&mut self) -> Option<(H, *mut u8, usize)> {
        if self.count == 0 {
            return None;
        }
        // SAFETY: `head` is the start of a complete record written by `push`.
        unsafe {
            let base = self.words.as_mut_ptr().add(self.head);
            let total = base.cast::<u64>().read() as usize;
            let header = base.add(1).cast::<H>().read();
            let payload = base.add(1 + words_for(size_of::<H>())).cast::<u8>();
            Some((header, payload, total))
        }
    }

    /// Removes the first record, whose payload the caller has consumed (or moved elsewhere).
    pub(crate) fn pop_consumed(&mut self, total_words: usize) {
        debug_assert!(self.count > 0);
        self.head += total_words;
        self.count -= 1;
        if self.count == 0 {
            self.words.clear();
            self.head = 0;
        } else if self.head >= COMPACT_WORDS && self.head * 2 >= self.words.len() {
            // A buffer that never empties (a client that keeps staging) would otherwise grow
            // without bound: move the live records to the front.
            let live = self.words.len() - self.head;
            self.words.copy_within(self.head.., 0);
            self.words.truncate(live);
            self.head = 0;
        }
    }

    /// The raw words of the first `n` records, for copying into a slot, and their word count.
    pub(crate) fn front_words(&self, n: usize) -> (*const u64, usize) {
        let mut at = self.head;
        for _ in 0..n {
            // SAFETY: `at` walks record boundaries written by `push`, at most `count` of them.
            at += unsafe { self.words.as_ptr().add(at).cast::<u64>().read() } as usize;
        }
        // SAFETY: `head` is in bounds (or equal to the length when empty).
        (
            unsafe { self.words.as_ptr().add(self.head).cast::<u64>() },
            at - self.head,
        )
    }

    /// Calls `f` with the header and word count of each record from the front, in order, until
    /// it returns false.
    pub(crate) fn scan(&self, mut f: impl FnMut(&H, usize) -> bool) {
        let mut at = self.head;
        for _ in 0..self.count {
            // SAFETY: `at` walks record boundaries written by `push`.
            let (header, total) = unsafe {
                let base = self.words.as_ptr().add(at);
                (
                    &*base.add(1).cast::<H>(),
                    base.cast::<u64>().read() as usize,
                )
            };
            if !f(header, total) {
                return;
            }
            at += total;
        }
    }

    /// Forgets the first `n` records after their bytes were moved elsewhere.
    pub(crate) fn forget_front(&mut self, n: usize) {
        for _ in 0..n {
            let (_, _, total) = self.front().expect("forgetting more records than stored");
            self.pop_consumed(total);
        }
    }

    /// Moves the first `n` records into `other`, preserving their order.
    pub(crate) fn move_front_into(&mut self, n: usize, other: &mut RecordBuf<H>) {
        let (src, words) = self.front_words(n);
        let at = other.words.len();
        other.words.reserve(words);
        // SAFETY: `src` points at `words` initialized words owned by `self`; `other` has room.
        // Ownership of the payloads moves with the bytes: `self` forgets them right after.
        unsafe {
            ptr::copy_nonoverlapping(src.cast::<Word>(), other.words.as_mut_ptr().add(at), words);
            other.words.set_len(at + words);
        }
        other.count += n;
        self.forget_front(n);
    }
}

impl<H> Drop for RecordBuf<H> {
    fn drop(&mut self) {
        // Payloads are owned values of unknown type: whoever owns the buffer must drain it first.
        // Leaking is the only safe fallback if that did not happen (e.g. during a panic).
        debug_assert!(
            self.count == 0 || std::thread::panicking(),
            "RecordBuf dropped with {} records",
            self.count
        );
    }
}

/// Walks the records in a raw word region written by [`RecordBuf`] and calls `f` with each
/// header and payload address, in order.
///
/// # Safety
/// `words` must point at `len` words holding complete records with header `H`, and the caller
/// must own their payloads; `f` must consume each payload exactly once.
pub(crate) unsafe fn for_each_raw<H: Copy>(
    words: *mut u64,
    len: usize,
    mut f: impl FnMut(H, *mut u8),
) {
    let mut at = 0;
    while at < len {
        // SAFETY: the caller guarantees complete records; `at` walks their boundaries.
        unsafe {
            let base = words.add(at);
            let total = base.read() as usize;
            let header = base.add(1).cast::<H>().read();
            f(header, base.add(1 + words_for(size_of::<H>())).cast::<u8>());
            at += total;
        }
    }
}
