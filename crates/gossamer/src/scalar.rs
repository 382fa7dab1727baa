//! The scalars most calls carry — `u64`, `u32`, `usize`, `i64`, `i32`, `u8`, `bool` and
//! `()` — encoded and decoded here, without serde, into exactly the bytes postcard uses for
//! them: one wire format, and a call that carries a counter pays for a varint, not for a
//! serializer. Unsigned integers wider than a byte are LEB128 varints (signed ones zigzagged
//! first); `u8` and `bool` are one byte; `()` is nothing. Decoding accepts and refuses
//! exactly what postcard does (non-shortest varints included; bytes after the value are
//! ignored), which the tests check against postcard itself.
//!
//! Which type a value is, is a chain of [`TypeId`](std::any::TypeId) comparisons between
//! constants of each monomorphized call, which the optimiser can fold; every other type takes
//! postcard's path. On the instructions benchmark's remote call of a `u64` (a callgrind run of
//! its scenario, 100,000 calls), this path took the caller's rank from 1,107 to 1,047
//! instructions per call and the callee's from 963 to 894.

use std::any::{Any, TypeId};

/// The most bytes a scalar takes (a 64-bit varint).
pub(crate) const MAX_LEN: usize = 10;

/// Writes the bytes of `value` at the start of `out` and returns how many, if `value` is one
/// of this module's scalars.
#[inline]
pub(crate) fn encode_into<A: 'static>(value: &A, out: &mut [u8; MAX_LEN]) -> Option<usize> {
    let id = TypeId::of::<A>();
    let mut out = Writer { out, len: 0 };
    if id == TypeId::of::<u64>() {
        out.varint(*cast_ref::<A, u64>(value));
    } else if id == TypeId::of::<u32>() {
        out.varint((*cast_ref::<A, u32>(value)).into());
    } else if id == TypeId::of::<usize>() {
        out.varint(*cast_ref::<A, usize>(value) as u64);
    } else if id == TypeId::of::<i64>() {
        let v = *cast_ref::<A, i64>(value);
        out.varint(((v << 1) ^ (v >> 63)) as u64);
    } else if id == TypeId::of::<i32>() {
        let v = *cast_ref::<A, i32>(value);
        out.varint(u64::from(((v << 1) ^ (v >> 31)) as u32));
    } else if id == TypeId::of::<u8>() {
        out.push(*cast_ref::<A, u8>(value));
    } else if id == TypeId::of::<bool>() {
        out.push(u8::from(*cast_ref::<A, bool>(value)));
    } else if id != TypeId::of::<()>() {
        return None;
    }
    Some(out.len)
}

/// The bytes of `value` if it is one of this module's scalars (for the checks).
#[cfg(any(test, feature = "fuzzing"))]
fn encode<A: 'static>(value: &A) -> Option<Vec<u8>> {
    let mut out = [0; MAX_LEN];
    encode_into(value, &mut out).map(|len| out[..len].to_vec())
}

/// The value of type `R` that `bytes` hold, or postcard's error for them, if `R` is one of
/// this module's scalars.
#[inline]
pub(crate) fn decode<R: 'static>(bytes: &[u8]) -> Option<Result<R, postcard::Error>> {
    let id = TypeId::of::<R>();
    let decoded = if id == TypeId::of::<u64>() {
        varint(bytes, 10).map(cast::<u64, R>)
    } else if id == TypeId::of::<u32>() {
        varint(bytes, 5).map(|v| cast::<u32, R>(v as u32))
    } else if id == TypeId::of::<usize>() {
        // usize travels as a u64; a value this platform cannot hold is refused, as serde does.
        varint(bytes, 10).and_then(|v| {
            usize::try_from(v)
                .map(cast::<usize, R>)
                .map_err(|_| postcard::Error::SerdeDeCustom)
        })
    } else if id == TypeId::of::<i64>() {
        varint(bytes, 10).map(|v| cast::<i64, R>(((v >> 1) as i64) ^ -((v & 1) as i64)))
    } else if id == TypeId::of::<i32>() {
        varint(bytes, 5).map(|v| {
            let v = v as u32;
            cast::<i32, R>(((v >> 1) as i32) ^ -((v & 1) as i32))
        })
    } else if id == TypeId::of::<u8>() {
        first(bytes).map(cast::<u8, R>)
    } else if id == TypeId::of::<bool>() {
        first(bytes).and_then(|b| match b {
            0 => Ok(cast::<bool, R>(false)),
            1 => Ok(cast::<bool, R>(true)),
            _ => Err(postcard::Error::DeserializeBadBool),
        })
    } else if id == TypeId::of::<()>() {
        Ok(cast::<(), R>(()))
    } else {
        return None;
    };
    Some(decoded)
}

/// `v` as a `&T`, which the caller checked `A` is.
fn cast_ref<A: 'static, T: 'static>(v: &A) -> &T {
    (v as &dyn Any)
        .downcast_ref::<T>()
        .expect("the caller checked the type")
}

/// `v` as an `R`, which the caller checked is `T`.
fn cast<T: 'static, R: 'static>(v: T) -> R {
    let mut v = Some(v);
    (&mut v as &mut dyn Any)
        .downcast_mut::<Option<R>>()
        .and_then(Option::take)
        .expect("the caller checked the type")
}

/// The first byte, as postcard takes one.
fn first(bytes: &[u8]) -> Result<u8, postcard::Error> {
    bytes
        .first()
        .copied()
        .ok_or(postcard::Error::DeserializeUnexpectedEnd)
}

/// A LEB128 varint of at most `max` bytes (10 for 64 bits, 5 for 32), read as postcard reads
/// one: the last byte may carry only the bits the type has left.
fn varint(bytes: &[u8], max: usize) -> Result<u64, postcard::Error> {
    let last_max: u8 = if max == 10 { 0x01 } else { 0x0f };
    let mut out = 0u64;
    for i in 0..max {
        let byte = *bytes
            .get(i)
            .ok_or(postcard::Error::DeserializeUnexpectedEnd)?;
        out |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            if i == max - 1 && byte > last_max {
                return Err(postcard::Error::DeserializeBadVarint);
            }
            return Ok(out);
        }
    }
    Err(postcard::Error::DeserializeBadVarint)
}

/// A scalar's bytes being written.
struct Writer<'a> {
    out: &'a mut [u8; MAX_LEN],
    len: usize,
}

impl Writer<'_> {
    fn push(&mut self, byte: u8) {
        self.out[self.len] = byte;
        self.len += 1;
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.push(v as u8);
    }
}

/// Checks this module against postcard on `bytes`, for every scalar: decoding gives the same
/// value or the same error, and what decodes encodes to postcard's bytes. Panics on a
/// difference (the `scalar_value` fuzz target and the tests below).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn check_against_postcard(bytes: &[u8]) {
    fn one<T>(bytes: &[u8])
    where
        T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug + 'static,
    {
        let ours = decode::<T>(bytes).expect("a scalar");
        let theirs = postcard::from_bytes::<T>(bytes);
        assert_eq!(
            ours,
            theirs,
            "{bytes:02x?} decoded as a {}",
            std::any::type_name::<T>()
        );
        if let Ok(v) = ours {
            let encoded = encode(&v).expect("a scalar");
            assert_eq!(
                encoded,
                postcard::to_allocvec(&v).expect("postcard encodes a scalar"),
                "{v:?} encoded"
            );
        }
    }
    one::<u64>(bytes);
    one::<u32>(bytes);
    one::<usize>(bytes);
    one::<i64>(bytes);
    one::<i32>(bytes);
    one::<u8>(bytes);
    one::<bool>(bytes);
    one::<()>(bytes);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde::Serialize;
    use serde::de::DeserializeOwned;

    use super::*;

    /// The fast path writes postcard's bytes and reads any bytes as postcard does.
    fn agrees<T>(value: T, bytes: &[u8]) -> Result<(), TestCaseError>
    where
        T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug + 'static,
    {
        let ours = encode(&value).expect("a scalar");
        let theirs = postcard::to_allocvec(&value).unwrap();
        prop_assert_eq!(&ours, &theirs);
        prop_assert_eq!(decode::<T>(ours.as_slice()).expect("a scalar"), Ok(value));
        check_against_postcard(bytes);
        Ok(())
    }

    /// Bytes that postcard's decoders find interesting: short, long, with continuation bits.
    fn wire_bytes() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(
            prop_oneof![
                any::<u8>(),
                Just(0x80),
                Just(0xff),
                Just(0x00),
                Just(0x01),
                Just(0x7f)
            ],
            0..12,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn scalars_match_postcard(
            (a, b, c, d, e, f, g) in (any::<u64>(), any::<u32>(), any::<usize>(), any::<i64>(),
                any::<i32>(), any::<u8>(), any::<bool>()),
            bytes in wire_bytes(),
        ) {
            agrees(a, &bytes)?;
            agrees(b, &bytes)?;
            agrees(c, &bytes)?;
            agrees(d, &bytes)?;
            agrees(e, &bytes)?;
            agrees(f, &bytes)?;
            agrees(g, &bytes)?;
            agrees((), &bytes)?;
        }
    }

    #[test]
    fn the_edges_of_each_width_match_postcard() {
        for v in [0, 1, 127, 128, 16_383, 16_384, u64::MAX >> 1, u64::MAX] {
            agrees(v, &[]).unwrap();
        }
        for v in [i64::MIN, -65, -64, -1, 0, 63, 64, i64::MAX] {
            agrees(v, &[0xff; 10]).unwrap();
        }
        for v in [i32::MIN, -1, 0, i32::MAX] {
            agrees(v, &[0x80, 0x80, 0x80, 0x80, 0x10]).unwrap();
        }
        agrees(u32::MAX, &[0xff, 0xff, 0xff, 0xff, 0x0f]).unwrap();
        agrees(
            7u64,
            &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02],
        )
        .unwrap();
    }

    #[test]
    fn other_types_take_postcards_path() {
        assert!(encode(&String::from("x")).is_none());
        assert!(encode(&(1u64, 2u64)).is_none());
        assert!(encode(&1u16).is_none());
        assert!(decode::<String>(b"\x01x").is_none());
        assert!(decode::<Option<u64>>(b"\x00").is_none());
    }
}
