//! What reaches a blob's bytes or its maker: writing the bytes to a property's store,
//! fetching them from the maker's rank, and asking the maker for a change (see `blob` for
//! the protocol). Apart from `blob`, which holds only what blobs are, so that the stored
//! formats can name them.

use std::fmt;
use std::sync::Arc;

use super::blob::{Blob, BlobError, Change};
use super::{DurableError, host, registry, store, until_answered};
use crate::node::{Node, spawn_on};

impl Blob {
    /// Fetches its bytes from its maker, checked against its hash; only the calling fiber
    /// waits.
    ///
    /// # Errors
    /// [`BlobError::Gone`] once it is freed; [`BlobError::Unavailable`] when its maker's
    /// rank stayed lost for `GSM_RECOVERY_TIMEOUT`; [`BlobError::Damaged`] when the bytes
    /// its maker sends are not the blob's.
    ///
    /// # Panics
    /// In delegated context (an op reads the blobs its call carries with
    /// [`Cx::read`](super::Cx::read)).
    pub fn read(&self) -> Result<Vec<u8>, BlobError> {
        ask_maker(self, Change::Check { id: self.id() })?;
        fetch(self).map(|bytes| bytes.to_vec())
    }
}

/// Keeps `bytes` as a blob file of property `property` (its id in the store) and returns
/// their SHA-256: durable before this returns, under `Sync`. Any length: a blob travels in
/// pieces ([`fetch`]).
pub(crate) fn write_bytes(property: u32, bytes: &[u8]) -> Result<[u8; 32], BlobError> {
    let store = |e: DurableError| BlobError::Store { why: e.to_string() };
    let host = host::host().map_err(store)?;
    let hash = store::sha256(bytes);
    host.store
        .write_blob(property, &hash, bytes)
        .map_err(store)?;
    super::crash::point("blob-written");
    Ok(hash)
}

/// [`write_bytes`] for the property named `name` of this rank.
pub(crate) fn write_for(name: &str, bytes: &[u8]) -> Result<[u8; 32], BlobError> {
    let host = host::host().map_err(|e| BlobError::Store { why: e.to_string() })?;
    let id = host
        .store
        .property(name)
        .ok_or_else(|| BlobError::Store {
            why: format!("no durable property \"{name}\" here"),
        })?
        .id;
    write_bytes(id, bytes)
}

/// A fetch asks for at most this many bytes in one message.
const MAX_PIECE: u64 = 4 << 20;

/// The bytes a fetch asks for in one message: half of this node's `GSM_MAX_MESSAGE` (the
/// answer's framing fits in the other half), at most [`MAX_PIECE`], at least 1.
fn piece_len() -> u64 {
    let limit = crate::state::with_current(|s| s.settings.max_message).unwrap_or(usize::MAX);
    (limit as u64 / 2).clamp(1, MAX_PIECE)
}

/// What a fetch asks the maker's node: property `name`'s blob file of `hash`, which holds
/// `len` bytes, from byte `at`, at most `count` bytes.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Piece {
    name: String,
    hash: [u8; 32],
    len: u64,
    at: u64,
    count: u64,
}

/// Runs on a blob's maker's node: the bytes [`Piece`] asks for, at most its own piece
/// length (whatever is asked); `None` when the file is gone or not `len` bytes long. The
/// fetcher checks the whole against the hash.
fn read_here(piece: Piece) -> Option<serde_bytes::ByteBuf> {
    let host = host::host().ok()?;
    let id = host.store.property(&piece.name)?.id;
    let count = piece.count.min(piece_len());
    host.store
        .read_blob_piece(id, &piece.hash, piece.len, piece.at, count)
        .map(serde_bytes::ByteBuf::from)
}

/// Fetches `blob`'s bytes from its maker's node, in pieces of at most half a message each,
/// and checks the whole against its hash.
pub(crate) fn fetch(blob: &Blob) -> Result<Arc<[u8]>, BlobError> {
    let maker = blob.maker_holder();
    let node = Node { rank: maker.rank };
    let (name, hash, len) = (maker.property.clone(), blob.hash(), blob.len());
    let bytes = assemble(blob, piece_len(), |at, count| {
        let ask = Piece {
            name: name.clone(),
            hash,
            len,
            at,
            count,
        };
        until_answered(maker.rank, || {
            Ok(spawn_on(node, read_here, ask.clone()).join_or_failure()?)
        })
        .map(|piece| piece.map(serde_bytes::ByteBuf::into_vec))
        .map_err(|e| unavailable(blob, e))
    })?;
    Ok(bytes.into())
}

/// Puts `blob`'s bytes together from the pieces `ask(at, count)` answers (`None`: the blob
/// is gone), asking for `piece` bytes at a time: each answer must hold between 1 and
/// `count` bytes, and the whole must be the blob's length and hash.
fn assemble(
    blob: &Blob,
    piece: u64,
    mut ask: impl FnMut(u64, u64) -> Result<Option<Vec<u8>>, BlobError>,
) -> Result<Vec<u8>, BlobError> {
    let len = blob.len();
    let damaged = |why: String| BlobError::Damaged {
        blob: blob.to_string(),
        why,
    };
    let mut bytes: Vec<u8> = Vec::new();
    let mut at = 0;
    loop {
        let count = piece.min(len - at);
        let got = ask(at, count)?.ok_or_else(|| BlobError::Gone {
            blob: blob.to_string(),
        })?;
        if got.len() as u64 > count || (count > 0 && got.is_empty()) {
            return Err(damaged(format!(
                "its maker answered {} bytes for the piece of at most {count} from byte {at}",
                got.len()
            )));
        }
        if at == 0 {
            // The maker found a file of `len` bytes: the whole may be allocated now.
            bytes.reserve_exact(
                usize::try_from(len)
                    .map_err(|_| damaged(format!("{len} bytes do not fit this node's memory")))?,
            );
        }
        bytes.extend_from_slice(&got);
        at += got.len() as u64;
        if at == len {
            break;
        }
    }
    if store::sha256(&bytes) != blob.hash() {
        return Err(damaged(
            "the bytes fetched do not match its SHA-256 (the maker's file is damaged)".into(),
        ));
    }
    Ok(bytes)
}

fn unavailable(blob: &Blob, why: impl fmt::Display) -> BlobError {
    BlobError::Unavailable {
        blob: blob.to_string(),
        why: why.to_string(),
    }
}

/// Asks `blob`'s maker to make `change`, and waits for it to be durable there.
pub(crate) fn ask_maker(blob: &Blob, change: Change) -> Result<(), BlobError> {
    let maker = blob.maker_holder();
    let node = Node { rank: maker.rank };
    let ask = (
        blob.state_type().to_string(),
        maker.property.clone(),
        change,
    );
    until_answered(maker.rank, || {
        Ok(spawn_on(node, change_here, ask.clone()).join_or_failure()?)
    })
    .map_err(|e| unavailable(blob, e))?
}

/// Runs on the maker's node: finds its state type's entry and makes the change.
fn change_here((state_type, property, change): (String, String, Change)) -> Result<(), BlobError> {
    let Some(entry) = registry::any_of(&state_type) else {
        return Err(BlobError::Unavailable {
            blob: format!("a blob of \"{property}\""),
            why: format!("this build registers no op on {state_type}"),
        });
    };
    (entry.change)(property, change)
}

#[cfg(test)]
mod tests {
    use super::super::blob::{Blobs, Holder};
    use super::*;

    /// A blob of `bytes` and a maker answering from them, as `answer` changes each piece.
    fn serve(
        bytes: &[u8],
        piece: u64,
        answer: impl Fn(u64, Vec<u8>) -> Option<Vec<u8>>,
    ) -> Result<Vec<u8>, BlobError> {
        let me = Holder {
            rank: 0,
            property: "p".into(),
        };
        let blob = Blobs::default().make(&me, "T", bytes.len() as u64, store::sha256(bytes));
        assemble(&blob, piece, |at, count| {
            let end = (at + count).min(bytes.len() as u64);
            Ok(answer(at, bytes[at as usize..end as usize].to_vec()))
        })
    }

    #[test]
    fn pieces_make_the_whole_and_bad_answers_are_errors_not_panics() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
        let asked = std::cell::Cell::new(0);
        let whole = serve(&bytes, 1000, |_, p| {
            asked.set(asked.get() + 1);
            Some(p)
        });
        assert_eq!(whole.unwrap(), bytes);
        assert_eq!(asked.get(), 10, "ten pieces of 1000");
        // A maker whose piece length is shorter answers less: the fetch goes on from there.
        let short = serve(&bytes, 1000, |_, mut p| {
            p.truncate(300);
            Some(p)
        });
        assert_eq!(short.unwrap(), bytes);
        assert_eq!(serve(&[], 1000, |_, p| Some(p)).unwrap(), Vec::<u8>::new());
        let damaged = |r: Result<Vec<u8>, BlobError>| match r {
            Err(BlobError::Damaged { why, .. }) => why,
            other => panic!("not refused as damaged: {other:?}"),
        };
        let empty = damaged(serve(&bytes, 1000, |at, p| {
            Some(if at == 3000 { Vec::new() } else { p })
        }));
        assert!(empty.contains("answered 0 bytes"), "{empty}");
        let long = damaged(serve(&bytes, 1000, |_, mut p| {
            p.push(0);
            Some(p)
        }));
        assert!(long.contains("answered 1001 bytes"), "{long}");
        let flipped = damaged(serve(&bytes, 1000, |at, mut p| {
            if at == 5000 {
                p[7] ^= 1;
            }
            Some(p)
        }));
        assert!(flipped.contains("SHA-256"), "{flipped}");
        let gone = serve(&bytes, 1000, |at, p| (at < 4000).then_some(p));
        assert!(matches!(gone, Err(BlobError::Gone { .. })), "{gone:?}");
    }
}
