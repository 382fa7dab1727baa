//! Type-erased records stored byte for byte in word buffers.
//!
//! A record is `[length in words][header H][payload P]`, every part a whole number of 8-byte
//! words. The header is plain data (`Copy`, typically a trampoline function pointer); the payload
//! is a value — usually a closure — *moved* into the buffer with a bitwise copy. Whoever takes a
//! record out must consume its payload exactly once (read it, or drop it in place); the buffer
//! itself never drops payloads, because it does not know their types.
//!
//! A worker keeps the callbacks of `apply_then` requests that ran inline in such a buffer;
//! requests themselves use the batch format of `request`, which shares the payload helpers
//! below.
//!
//! Payloads larger than [`MAX_INLINE`] bytes, or aligned to more than 8, are boxed
//! transparently: [`RecordBuf::push`] stores the box and [`take`] unboxes it.

use std::marker::PhantomData;
use std::mem::{MaybeUninit, align_of, size_of};

/// Bytes per word.
pub(crate) const WORD: usize = 8;

/// Largest payload stored inline; larger values are boxed by the caller.
pub(crate) const MAX_INLINE: usize = 256;

/// Whether a value of type `P` is stored inline in a record (otherwise it is boxed).
pub(crate) const fn fits_inline<P>() -> bool {
    size_of::<P>() <= MAX_INLINE && align_of::<P>() <= WORD
}

/// Bytes a payload of type `P` occupies in a record.
pub(crate) const fn stored_size<P>() -> usize {
    if fits_inline::<P>() {
        size_of::<P>()
    } else {
        size_of::<Box<P>>()
    }
}

/// Moves `value` into the record words at `at`, boxed if it does not fit inline.
///
/// # Safety
/// `at` has room for `stored_size::<P>()` bytes that hold no live value, at a word boundary.
#[inline(always)]
pub(crate) unsafe fn store<P>(at: *mut u64, value: P) {
    // SAFETY: per the caller; an inline `P` is aligned to at most a word.
    unsafe {
        if fits_inline::<P>() {
            at.cast::<P>().write(value);
        } else {
            at.cast::<Box<P>>().write(Box::new(value));
        }
    }
}

/// Moves a value of type `P` stored by [`store`] out of the record words at `at`.
///
/// # Safety
/// `at` holds a `P` written by `store` and not yet taken; afterwards it holds none.
#[inline(always)]
pub(crate) unsafe fn take<P>(at: *mut u64) -> P {
    // SAFETY: per the caller, `at` holds a `P` (inline) or a `Box<P>`.
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

/// A growable buffer of records with header `H`, consumed from the front.
pub(crate) struct RecordBuf<H> {
    words: Vec<Word>,
    /// Index of the first unconsumed record (`words.len()` when there is none).
    head: usize,
    _header: PhantomData<H>,
}

impl<H: Copy> RecordBuf<H> {
    pub(crate) fn new() -> Self {
        Self::with_capacity(0)
    }

    pub(crate) fn with_capacity(words: usize) -> Self {
        const { assert!(align_of::<H>() <= WORD) };
        RecordBuf {
            words: Vec::with_capacity(words),
            head: 0,
            _header: PhantomData,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.head == self.words.len()
    }

    /// Appends a record, moving `payload` into the buffer (boxed if it is too large).
    pub(crate) fn push<P>(&mut self, header: H, payload: P) {
        let total = record_words::<H, P>();
        let at = self.words.len();
        if self.words.capacity() - at < total {
            self.words.reserve(total);
        }
        // SAFETY: `reserve` made room for `total` words after `at`; we write the length word,
        // the header and the payload (or its box) inside that room, each at a word boundary
        // with an alignment of at most 8, then publish the words with `set_len`.
        unsafe {
            let base = self.words.as_mut_ptr().add(at);
            base.cast::<u64>().write(total as u64);
            base.add(1).cast::<H>().write(header);
            store(
                base.add(1 + words_for(size_of::<H>())).cast::<u64>(),
                payload,
            );
            self.words.set_len(at + total);
        }
    }

    /// The header and payload address of the first record, if any. The payload stays owned by
    /// the buffer until [`RecordBuf::pop_consumed`].
    pub(crate) fn front(&mut self) -> Option<(H, *mut u64, usize)> {
        if self.is_empty() {
            return None;
        }
        // SAFETY: `head` is the start of a complete record written by `push`.
        unsafe {
            let base = self.words.as_mut_ptr().add(self.head);
            let total = base.cast::<u64>().read() as usize;
            let header = base.add(1).cast::<H>().read();
            let payload = base.add(1 + words_for(size_of::<H>())).cast::<u64>();
            Some((header, payload, total))
        }
    }

    /// Removes the first record, whose payload the caller has consumed (or moved elsewhere).
    pub(crate) fn pop_consumed(&mut self, total_words: usize) {
        debug_assert!(!self.is_empty());
        self.head += total_words;
        if self.is_empty() {
            self.words.clear();
            self.head = 0;
        }
    }
}

impl<H> Drop for RecordBuf<H> {
    fn drop(&mut self) {
        // Payloads are owned values of unknown type: whoever owns the buffer must drain it first.
        // Leaking is the only safe fallback if that did not happen (e.g. during a panic).
        debug_assert!(
            self.head == self.words.len() || std::thread::panicking(),
            "RecordBuf dropped with {} words of records",
            self.words.len() - self.head
        );
    }
}
