//! Serde shapes, and the fingerprints made of them: how two builds — a node and another node,
//! or a node and a code package — agree that they mean the same bytes.
//!
//! A fingerprint is the first 8 bytes of a SHA-256 over names and shapes. A shape is what
//! `serde_reflection` traces of a type through its `Deserialize`: field names and types,
//! variant names, nesting. Two types of one shape read and write the same postcard bytes, so
//! two builds whose fingerprints agree can pass values between them.
//!
//! ```
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! struct Put { key: u64, value: Vec<u8> }
//! #[derive(Deserialize)]
//! struct PutV2 { key: u64, value: Vec<u8>, ttl: u32 }
//!
//! let v1 = gossamer_schema::apply_fingerprint::<Put, u64>("kv.Table/1");
//! assert_eq!(v1, gossamer_schema::apply_fingerprint::<Put, u64>("kv.Table/1"));
//! assert_ne!(v1, gossamer_schema::apply_fingerprint::<PutV2, u64>("kv.Table/1"));
//! assert_ne!(v1, gossamer_schema::apply_fingerprint::<Put, u64>("kv.Table/2"));
//! ```

use std::any::type_name;

use serde::de::DeserializeOwned;
use serde_reflection::{Samples, Tracer, TracerConfig};
use sha2::{Digest, Sha256};

/// A type's serde shape as text: its format and every container it names, traced through
/// its `Deserialize`. A type that cannot be traced (a hand-written `Deserialize` that rejects
/// the tracer's samples) is described by its name alone.
pub fn shape<T: DeserializeOwned>() -> String {
    let mut tracer = Tracer::new(TracerConfig::default());
    let samples = Samples::new();
    match tracer.trace_type::<T>(&samples) {
        Ok((format, _)) => match tracer.registry() {
            Ok(registry) => format!("{format:?}{registry:?}"),
            Err(_) => format!("{format:?}"),
        },
        Err(_) => format!("untraceable {}", type_name::<T>()),
    }
}

/// The first 8 bytes of the SHA-256 of `parts`, one after another. Callers separate parts
/// that could run together (a 0 byte: shapes and names never hold one).
pub fn fingerprint(parts: &[&[u8]]) -> u64 {
    let mut h = Sha256::new();
    for part in parts {
        h.update(part);
    }
    let digest = h.finalize();
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// The fingerprint of a function `fn(&mut P, A) -> R` applied to a property whose stable type
/// name is `property`.
pub fn apply_fingerprint<A: DeserializeOwned, R: DeserializeOwned>(property: &str) -> u64 {
    let (a, r) = (shape::<A>(), shape::<R>());
    fingerprint(&[
        b"apply\0",
        property.as_bytes(),
        &[0],
        a.as_bytes(),
        &[0],
        r.as_bytes(),
    ])
}

/// The fingerprint of a function `fn(A) -> R` with no property.
pub fn free_fingerprint<A: DeserializeOwned, R: DeserializeOwned>() -> u64 {
    let (a, r) = (shape::<A>(), shape::<R>());
    fingerprint(&[b"free\0", a.as_bytes(), &[0], r.as_bytes()])
}

/// The fingerprint of a constructor that builds the property type `property` from an `A`.
pub fn new_fingerprint<A: DeserializeOwned>(property: &str) -> u64 {
    let a = shape::<A>();
    fingerprint(&[b"new\0", property.as_bytes(), &[0], a.as_bytes()])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct A {
        x: u64,
    }
    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Nested {
        a: A,
        list: Vec<(String, Option<i8>)>,
    }

    #[test]
    fn shapes_name_fields_and_fingerprints_hash_the_parts_in_order() {
        assert!(shape::<Nested>().contains("list"), "{}", shape::<Nested>());
        assert_ne!(shape::<A>(), shape::<u64>());
        assert_eq!(fingerprint(&[b"ab", b"c"]), fingerprint(&[b"a", b"bc"]));
        assert_ne!(fingerprint(&[b"ab", b"c"]), fingerprint(&[b"ab", b"d"]));
    }

    #[test]
    fn kinds_of_function_never_share_a_fingerprint() {
        assert_ne!(
            apply_fingerprint::<u64, u64>("u64"),
            free_fingerprint::<u64, u64>()
        );
        assert_ne!(new_fingerprint::<u64>("u64"), free_fingerprint::<u64, ()>());
    }
}
