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
    /// rank stayed lost for `GSM_RECOVERY_TIMEOUT`.
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
/// their SHA-256: durable before this returns, under `Sync`.
pub(crate) fn write_bytes(property: u32, bytes: &[u8]) -> Result<[u8; 32], BlobError> {
    // A blob travels whole to the properties it is passed to: it must fit a message (with
    // room for the answer's framing).
    let limit = crate::state::with_current(|s| s.settings.max_message).unwrap_or(usize::MAX);
    if bytes.len().saturating_add(64) > limit {
        let len = bytes.len();
        return Err(BlobError::TooLarge { len, limit });
    }
    let store = |e: DurableError| BlobError::Store { why: e.to_string() };
    let host = host::host().map_err(store)?;
    let hash = store::sha256(bytes);
    host.store
        .write_blob(property, &hash, bytes)
        .map_err(store)?;
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

/// Runs on a blob's maker's node: the bytes of property `name`'s blob of `hash`.
fn read_here((name, hash, len): (String, [u8; 32], u64)) -> Option<Vec<u8>> {
    let host = host::host().ok()?;
    let id = host.store.property(&name)?.id;
    host.store.read_blob(id, &hash, len)
}

/// Fetches `blob`'s bytes from its maker's node (which checks them against its hash).
pub(crate) fn fetch(blob: &Blob) -> Result<Arc<[u8]>, BlobError> {
    let maker = blob.maker_holder();
    let node = Node { rank: maker.rank };
    let ask = (maker.property.clone(), blob.hash(), blob.len());
    let bytes = until_answered(maker.rank, || {
        Ok(spawn_on(node, read_here, ask.clone()).join_or_failure()?)
    })
    .map_err(|e| unavailable(blob, e))?;
    // The maker's node checked them against the hash as it read them.
    let bytes = bytes.ok_or_else(|| BlobError::Gone {
        blob: blob.to_string(),
    })?;
    Ok(bytes.into())
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
