//! A type's serde shape, and fingerprints made of shapes: how two builds agree that they mean
//! the same bytes. Durable logs and named functions both check them.

use std::any::type_name;

use serde::de::DeserializeOwned;
use serde_reflection::{Samples, Tracer, TracerConfig};
use sha2::{Digest, Sha256};

/// A type's serde shape as text: its format and every container it names, traced through
/// its `Deserialize`. A type that cannot be traced (a hand-written `Deserialize` that rejects
/// the tracer's samples) is described by its name alone.
pub(crate) fn shape<T: DeserializeOwned>() -> String {
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
pub(crate) fn fingerprint(parts: &[&[u8]]) -> u64 {
    let mut h = Sha256::new();
    for part in parts {
        h.update(part);
    }
    let digest = h.finalize();
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    struct A {
        x: u64,
    }
    #[derive(Serialize, Deserialize)]
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
}
