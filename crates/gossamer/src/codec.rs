//! Values on the wire: what may travel ([`Wire`]), how arguments and results are encoded for
//! another node and decoded from one (postcard), and how panic messages and refusals travel.
//!
//! A `gossamer::Trust` serializes only inside [`encode`] and deserializes only inside
//! [`decode_value`]: sending a handle mints a ticket for its receiver, which makes sense only as
//! part of a rack call. The two thread-locals here say when that is.

use std::any::type_name;
use std::cell::Cell;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::export::Life;
use crate::scalar;

/// What may travel between nodes: arguments, results and properties placed on another node.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot travel between nodes",
    label = "not `Wire`",
    note = "arguments and results of rack calls, and values given to `entrust`, must be \
            `serde::Serialize + serde::de::DeserializeOwned + Send + 'static`; derive serde's \
            traits for your types",
    note = "a property that cannot travel can be built on its node instead: \
            `node.entrust_with(build, argument)` runs the capture-free `build(argument)` there \
            and needs only `argument` to travel"
)]
pub trait Wire: Serialize + DeserializeOwned + Send + 'static {}

impl<T: Serialize + DeserializeOwned + Send + 'static> Wire for T {}

thread_local! {
    /// While encoding: the life of the rank the bytes go to. Handles serialize only then.
    static ENCODING_FOR: Cell<Option<Life>> = const { Cell::new(None) };
    /// While decoding bytes from another node. Handles deserialize only then.
    static DECODING: Cell<bool> = const { Cell::new(false) };
    /// Why the value being encoded cannot travel, said by a handle in it: postcard keeps no
    /// message of a serializer's error, so [`encode`] takes it from here.
    static WHY_NOT: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
    /// `GSM_MAX_MESSAGE` on this rack worker (set when its links are installed), so that every
    /// encode need not look up the rack.
    static MAX_MESSAGE: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Sets this worker's `GSM_MAX_MESSAGE`, which [`encode`] checks.
pub(crate) fn set_max_message(limit: usize) {
    MAX_MESSAGE.set(limit);
}

/// The error of a handle (de)serialized outside a rack call.
pub(crate) const NOT_IN_A_CALL: &str = "a gossamer::Trust (de)serializes only as part of the \
                                        argument, result or property of a rack call";

/// The life the value being encoded goes to, while [`encode`] runs; `None` outside it.
pub(crate) fn encoding_for() -> Option<Life> {
    ENCODING_FOR.get()
}

/// Whether [`decode_value`] is running.
pub(crate) fn decoding() -> bool {
    DECODING.get()
}

/// Encoded values of at most this many bytes are kept inline in an [`Encoded`]. Most arguments
/// and results (numbers, ids, short tuples) fit, so a call allocates nothing for them.
const INLINE: usize = 32;

/// A value encoded for the wire: inline when small, on the heap otherwise.
#[derive(Debug, Clone)]
pub(crate) enum Encoded {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Vec<u8>),
}

impl Encoded {
    #[inline]
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Encoded::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Encoded::Heap(v) => v,
        }
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// A copy of `bytes`, inline when they fit.
    pub(crate) fn copy_of(bytes: &[u8]) -> Encoded {
        if bytes.len() <= INLINE {
            let mut inline = [0; INLINE];
            inline[..bytes.len()].copy_from_slice(bytes);
            Encoded::Inline {
                len: bytes.len() as u8,
                bytes: inline,
            }
        } else {
            Encoded::Heap(bytes.to_vec())
        }
    }

    /// The bytes of `buf`: copied inline when they fit, leaving `buf` to be reused; else
    /// `buf` itself, taken.
    pub(crate) fn take_from(buf: &mut Vec<u8>) -> Encoded {
        if buf.len() <= INLINE {
            Encoded::copy_of(buf)
        } else {
            Encoded::Heap(std::mem::take(buf))
        }
    }
}

/// Where [`encode`] writes: inline until the value outgrows [`INLINE`] bytes, then on the
/// heap, in one pass. One pass matters: serializing a handle mints a ticket and tells its home
/// (see `proxy`), so a value must never be serialized twice.
struct Spill(Encoded);

impl Spill {
    /// Moves the inline bytes and `data` to the heap: the value outgrew [`INLINE`].
    #[cold]
    fn spill_to_heap(&mut self, data: &[u8]) {
        let mut heap = Vec::with_capacity(2 * INLINE + data.len());
        heap.extend_from_slice(self.0.as_slice());
        heap.extend_from_slice(data);
        self.0 = Encoded::Heap(heap);
    }
}

impl postcard::ser_flavors::Flavor for Spill {
    type Output = Encoded;

    #[inline]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        // Most writes are one byte (a small varint, a tag): a store, not a `memcpy` call.
        if let [byte] = *data {
            return self.try_push(byte);
        }
        match &mut self.0 {
            Encoded::Inline { len, bytes } if usize::from(*len) + data.len() <= INLINE => {
                let at = usize::from(*len);
                bytes[at..at + data.len()].copy_from_slice(data);
                *len += data.len() as u8;
            }
            Encoded::Inline { .. } => self.spill_to_heap(data),
            Encoded::Heap(heap) => heap.extend_from_slice(data),
        }
        Ok(())
    }

    #[inline]
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        match &mut self.0 {
            Encoded::Inline { len, bytes } if usize::from(*len) < INLINE => {
                bytes[usize::from(*len)] = data;
                *len += 1;
            }
            Encoded::Inline { .. } => self.spill_to_heap(&[data]),
            Encoded::Heap(heap) => heap.push(data),
        }
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Encoded> {
        Ok(self.0)
    }
}

/// A postcard flavor appending to a `Vec`, with [`Spill`]'s fast path for one-byte writes
/// (postcard's `to_io` and `to_extend` call `memcpy` or an iterator for each).
struct Append<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for Append<'_> {
    type Output = ();

    #[inline]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        match *data {
            [byte] => self.0.push(byte),
            _ => self.0.extend_from_slice(data),
        }
        Ok(())
    }

    #[inline]
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Appends `value`'s postcard encoding to `out`; on an error, `out` may hold part of it.
pub(crate) fn append<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) -> postcard::Result<()> {
    postcard::serialize_with_flavor(value, Append(out))
}

/// Encodes a value, inline when small. Outside [`encode`] it is for this node: a handle in
/// it fails to encode.
pub(crate) fn encode_here<A: Serialize>(value: &A) -> postcard::Result<Encoded> {
    let empty = Encoded::Inline {
        len: 0,
        bytes: [0; INLINE],
    };
    postcard::serialize_with_flavor(value, Spill(empty))
}

/// Whether a value of `len` bytes fits this worker's `GSM_MAX_MESSAGE`.
pub(crate) fn fits(len: usize) -> bool {
    len <= MAX_MESSAGE.get()
}

/// Records why a value cannot travel, for [`encode`]'s panic, and returns it for the
/// serializer's error.
pub(crate) fn cannot_travel(why: String) -> String {
    WHY_NOT.with(|w| *w.borrow_mut() = Some(why.clone()));
    why
}

/// Encodes a value for the life `to` of a rank (the handles in it are exported to that life),
/// failing the call (a panic) if it cannot travel.
#[inline]
pub(crate) fn encode<A: Serialize + 'static>(to: Life, value: &A) -> Encoded {
    // Inline, so that a scalar's encoding folds into its caller: a few stores.
    let mut bytes = [0; INLINE];
    let scalar = bytes
        .first_chunk_mut::<{ scalar::MAX_LEN }>()
        .expect("a scalar fits inline");
    let encoded = match scalar::encode_into(value, scalar) {
        Some(len) => Encoded::Inline {
            len: len as u8,
            bytes,
        },
        None => encode_with_serde(to, value),
    };
    let len = encoded.len();
    if len > MAX_MESSAGE.get() {
        too_large::<A>(len);
    }
    encoded
}

/// A scalar's encoding (see `scalar`), within `GSM_MAX_MESSAGE`; `None` for anything else.
#[inline]
pub(crate) fn scalar_bytes<A: 'static>(value: &A) -> Option<Scalar> {
    let mut bytes = [0; scalar::MAX_LEN];
    let len = scalar::encode_into(value, &mut bytes)?;
    (len <= MAX_MESSAGE.get()).then_some(Scalar {
        len: len as u8,
        bytes,
    })
}

/// The few bytes of an encoded scalar.
pub(crate) struct Scalar {
    len: u8,
    bytes: [u8; scalar::MAX_LEN],
}

impl Scalar {
    #[inline]
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// Fails the encoding of an `A` of `len` bytes, past `GSM_MAX_MESSAGE`.
#[cold]
fn too_large<A>(len: usize) -> ! {
    panic!(
        "a value of {len} bytes ({}) exceeds GSM_MAX_MESSAGE = {} bytes: send it in parts, \
         or raise GSM_MAX_MESSAGE in every rank",
        type_name::<A>(),
        MAX_MESSAGE.get(),
    );
}

/// [`encode`] through postcard, for what is not a scalar (see `scalar`).
#[inline(never)]
fn encode_with_serde<A: Serialize>(to: Life, value: &A) -> Encoded {
    let previous = ENCODING_FOR.replace(Some(to));
    let encoded = encode_here(value);
    ENCODING_FOR.set(previous);
    encoded.unwrap_or_else(|e| {
        let why = WHY_NOT.with(|w| w.borrow_mut().take());
        panic!(
            "cannot encode a {} for the wire: {}",
            type_name::<A>(),
            why.unwrap_or_else(|| e.to_string())
        )
    })
}

/// Decodes a value that came from another node.
pub(crate) fn decode_value<R: DeserializeOwned + 'static>(
    bytes: &[u8],
) -> Result<R, postcard::Error> {
    if let Some(decoded) = scalar::decode(bytes) {
        return decoded;
    }
    let previous = DECODING.replace(true);
    let value = postcard::from_bytes(bytes);
    DECODING.set(previous);
    value
}

/// The text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-text payload".into()
    }
}

/// Encodes a panic message or refusal (made short with [`clip`]).
pub(crate) fn encode_message(text: &str) -> Encoded {
    Encoded::Heap(postcard::to_allocvec(text).unwrap_or_default())
}

/// Decodes a panic message or refusal; bytes that are not one are shown as they are.
pub(crate) fn decode_message(bytes: &[u8]) -> String {
    postcard::from_bytes::<String>(bytes)
        .unwrap_or_else(|_| String::from_utf8_lossy(bytes).into_owned())
}

/// A panic message or refusal cut to at most 1 KiB, at a character boundary: a size that
/// always fits a frame and a `GSM_MAX_MESSAGE`.
pub(crate) fn clip(text: &str) -> &str {
    const MAX: usize = 1024;
    if text.len() <= MAX {
        return text;
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_clipped_at_a_character_boundary_and_read_back() {
        let long = "é".repeat(1000); // 2000 bytes
        let back = decode_message(encode_message(clip(&long)).as_slice());
        assert_eq!(back.len(), 1024);
        assert!(long.starts_with(&back));
        assert_eq!(decode_message(encode_message("short").as_slice()), "short");
        assert_eq!(decode_message(b"\xff raw"), "\u{fffd} raw");
    }

    thread_local! {
        /// How many times a [`Counted`] was serialized on this thread.
        static SERIALIZED: Cell<u32> = const { Cell::new(0) };
    }

    /// A value whose `Serialize` has a side effect, as a handle's has (it mints a ticket).
    struct Counted(usize);

    impl Serialize for Counted {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            SERIALIZED.set(SERIALIZED.get() + 1);
            "y".repeat(self.0).serialize(s)
        }
    }

    /// The life values are encoded for.
    const PEER: Life = Life {
        rank: 1,
        incarnation: 0,
    };

    #[test]
    fn a_value_is_serialized_once_whether_it_fits_inline_or_not() {
        for len in [0, INLINE - 1, INLINE, 4 * INLINE] {
            SERIALIZED.set(0);
            let encoded = encode(PEER, &Counted(len));
            let calls = SERIALIZED.get();
            assert_eq!(calls, 1, "{len} bytes serialized {calls} times");
            assert_eq!(
                encoded.as_slice(),
                postcard::to_allocvec(&"y".repeat(len)).unwrap()
            );
        }
    }

    #[test]
    fn small_values_encode_inline_and_large_ones_on_the_heap_with_the_same_bytes() {
        let check = |text: String, inline: bool| {
            let encoded = encode(PEER, &text);
            assert_eq!(
                matches!(encoded, Encoded::Inline { .. }),
                inline,
                "{}",
                text.len()
            );
            assert_eq!(encoded.as_slice(), postcard::to_allocvec(&text).unwrap());
            assert_eq!(decode_value::<String>(encoded.as_slice()).unwrap(), text);
        };
        check(String::new(), true);
        // A length byte and INLINE − 1 bytes: exactly INLINE.
        check("x".repeat(INLINE - 1), true);
        check("x".repeat(INLINE), false);
        check("x".repeat(10_000), false);
    }

    /// One-byte writes (each `u8` of a `Vec<u8>`, small varints) and longer ones, across the
    /// inline limit: both flavors write exactly postcard's bytes.
    #[test]
    fn byte_writes_and_slices_encode_as_postcard_does_inline_on_the_heap_and_appended() {
        for len in [0, 1, INLINE - 2, INLINE - 1, INLINE, INLINE + 1, 3 * INLINE] {
            let value = (
                (0..len).map(|i| i as u8).collect::<Vec<u8>>(),
                u64::MAX,
                300u32,
            );
            let theirs = postcard::to_allocvec(&value).unwrap();
            assert_eq!(encode(PEER, &value).as_slice(), theirs, "{len} bytes");
            let mut out = vec![7];
            append(&mut out, &value).unwrap();
            assert_eq!(out[0], 7, "appending keeps what was there");
            assert_eq!(out[1..], theirs, "{len} bytes appended");
        }
    }
}
