//! The calling side of a durable call: which client makes it and with which seq.
//!
//! Every thread that calls (a rack worker, or a plain thread) is a *volatile* client: its id
//! is drawn when it first calls — random bits fixed per process and a count — so no two
//! processes, and no two runs, share one, and a restarted process never collides with the
//! completion records its predecessor left. Its seqs count from 1; its first unfinished seq
//! travels with every call, which acknowledges every call before it.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use super::format::CallArgs;
use super::{Op, registry};
use crate::codec::Wire;

/// Volatile client ids have the top bit set (sessions, later, will not).
const VOLATILE: u64 = 1 << 63;

/// Persistent client ids (sessions, and durable properties calling others) have the top bit
/// clear and the next one set.
const PERSISTENT: u64 = 1 << 62;

/// A persistent client's id: fixed by what names it (its rank, kind and name or id).
pub(crate) fn persistent_id(parts: &[&[u8]]) -> u64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in parts {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    let digest = h.finalize();
    let bits = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"));
    PERSISTENT | (bits & (PERSISTENT - 1))
}

/// The client of a call made without its exactly-once record (the benchmark's baseline):
/// the property runs and logs it, and keeps no outcome for a retry.
pub(crate) const NO_DEDUP: u64 = 0;

struct Client {
    id: u64,
    next: u64,
    /// Calls sent and not answered, in seq order (answers mostly come in that order).
    unfinished: VecDeque<u64>,
}

thread_local! {
    static CLIENT: RefCell<Option<Client>> = const { RefCell::new(None) };
}

/// A fresh volatile client id: this process's random prefix and a count.
fn new_client_id() -> u64 {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).expect("the OS random source");
        (u64::from_le_bytes(bytes) << 24) & !VOLATILE
    });
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    assert!(n < 1 << 24, "more than 2^24 calling threads in one process");
    VOLATILE | prefix | n
}

/// Ends the client's part of a call when dropped: the call is no longer unfinished.
#[derive(Debug)]
pub(crate) struct Started {
    seq: u64,
}

impl Started {
    /// The answer arrived.
    pub(crate) fn finish(self) {}
}

impl Drop for Started {
    fn drop(&mut self) {
        let seq = self.seq;
        CLIENT.with(|c| {
            if let Some(c) = c.borrow_mut().as_mut() {
                match c.unfinished.front() {
                    Some(&first) if first == seq => {
                        c.unfinished.pop_front();
                    }
                    _ => {
                        if let Some(i) = c.unfinished.iter().position(|&s| s == seq) {
                            c.unfinished.remove(i);
                        }
                    }
                }
            }
        });
    }
}

/// `op`'s bytes as a call carries and a log keeps them.
///
/// # Panics
/// When `O` is not registered for `T`, or does not serialize; both messages say what to do.
pub(crate) fn encode_op<T: Wire, O: Op<T>>(op: &O) -> Vec<u8> {
    if let Err(why) = registry::entry_of::<T, O>() {
        panic!("{why}");
    }
    encode_logged("durable op", op)
}

/// A value a log keeps (an op, a continuation), encoded.
///
/// # Panics
/// When it does not serialize.
pub(crate) fn encode_logged<V: Wire>(what: &str, value: &V) -> Vec<u8> {
    postcard::to_allocvec(value).unwrap_or_else(|e| {
        panic!(
            "the {what} {} does not serialize (it is logged as it is, so it can hold no \
             volatile gossamer::Trust; hold a Durable<T> instead): {e}",
            std::any::type_name::<V>()
        )
    })
}

/// Starts a call of `op` on a `T` by this thread's client (`dedup == false`: as
/// [`NO_DEDUP`]).
///
/// # Panics
/// As [`encode_op`].
pub(crate) fn start<T: Wire, O: Op<T>>(op: &O, dedup: bool) -> (CallArgs, Started) {
    let argument = encode_op(op);
    if !dedup {
        let args = CallArgs {
            client: NO_DEDUP,
            seq: 0,
            ack: 0,
            argument,
        };
        return (args, Started { seq: 0 });
    }
    CLIENT.with(|c| {
        let mut c = c.borrow_mut();
        let c = c.get_or_insert_with(|| Client {
            id: new_client_id(),
            next: 1,
            unfinished: VecDeque::new(),
        });
        let seq = c.next;
        c.next += 1;
        c.unfinished.push_back(seq);
        let ack = *c.unfinished.front().expect("seq was just added");
        (
            CallArgs {
                client: c.id,
                seq,
                ack,
                argument,
            },
            Started { seq },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_are_volatile_and_distinct() {
        let (a, b) = (new_client_id(), new_client_id());
        assert_ne!(a, b);
        assert!(a & VOLATILE != 0 && b & VOLATILE != 0);
        assert_eq!(a >> 24, b >> 24, "one prefix per process");
    }
}
