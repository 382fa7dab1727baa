//! The calling side of a durable call: which client makes it and with which seq.
//!
//! Every thread that calls (a rack worker, or a plain thread) is a *volatile* client: its id
//! is made when it first calls from its process's *life* (the run of the job, the rank and
//! its incarnation: `state::life_tag`) and a count, so no two processes, and no two runs,
//! share one, a restarted process never collides with the completion records its
//! predecessor left, and every rank can tell when the life a client belongs to is over (its
//! lease, `GSM_CLIENT_LEASE`, then runs out). Its seqs count from 1; its first unfinished seq
//! travels with every call, which acknowledges every call before it. A call leaves only
//! within the client's [`WINDOW`] of its first unfinished one; a later call waits.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Poll, Waker};

use super::blob::{self, Blob};
use super::format::{Bytes, CallArgs, Passing};
use super::{Op, registry};
use crate::codec::{self, Wire};
use crate::state::{self, LIFE_BITS};

// A client id's top bits give its kind:
// - `1`, a thread's volatile client: then its process's life (`LIFE_BITS`), then a count of
//   the process's calling threads (`COUNT_BITS`);
// - `010`, a durable property calling others: its calls are kept until answered, so the
//   records of its calls never lapse;
// - `011`, a session: its records lapse `GSM_SESSION_LEASE` after its last call.
const VOLATILE: u64 = 1 << 63;
const PERSISTENT: u64 = 1 << 62;
const SESSION: u64 = 1 << 61;
const COUNT_BITS: u32 = 24;

/// Who a client is, as its id tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A call without a completion record ([`NO_DEDUP`]).
    NoDedup,
    /// A thread of the process whose life is `life`.
    Volatile {
        life: u64,
    },
    /// A durable property (its calls to others, or their continuations).
    Property,
    Session,
}

/// The kind of client `id`.
pub(crate) fn kind(id: u64) -> Kind {
    if id == NO_DEDUP {
        Kind::NoDedup
    } else if id & VOLATILE != 0 {
        Kind::Volatile {
            life: (id >> COUNT_BITS) & ((1 << LIFE_BITS) - 1),
        }
    } else if id & SESSION != 0 {
        Kind::Session
    } else {
        Kind::Property
    }
}

/// The client id of a durable property's calls: fixed by what names it (its rank, and
/// whether they are its calls or their continuations, and its id).
pub(crate) fn property_id(parts: &[&[u8]]) -> u64 {
    PERSISTENT | named_bits(parts)
}

/// A session's client id: fixed by its rank and name.
pub(crate) fn session_id(parts: &[&[u8]]) -> u64 {
    PERSISTENT | SESSION | named_bits(parts)
}

/// 61 bits from a hash of `parts`.
fn named_bits(parts: &[&[u8]]) -> u64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in parts {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    let digest = h.finalize();
    let bits = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"));
    bits & (SESSION - 1)
}

/// How far past its first unfinished call a client's call may be when it leaves (RIFL's
/// window): a later one waits until the calls before it are answered. So a property keeps at
/// most this many completion records per client, and it refuses a call from further out. A
/// durable property's own calls ([`Cx::call`](super::Cx::call)) have no window: an op cannot
/// wait.
pub const WINDOW: u64 = 1024;

/// Whether a call of seq `seq` may leave when its client's first unfinished call is `first`.
pub(crate) fn within_window(seq: u64, first: u64) -> bool {
    seq < first.saturating_add(WINDOW)
}

/// The client of a call made without its exactly-once record (the benchmark's baseline):
/// the property runs and logs it, and keeps no outcome for a retry.
pub(crate) const NO_DEDUP: u64 = 0;

struct Client {
    /// The life it was made in: a thread that outlives its rack (tests run several in one
    /// process) gets a new client in the next.
    life: u64,
    id: u64,
    next: u64,
    /// Calls started and not answered, in seq order (answers mostly come in that order).
    unfinished: VecDeque<u64>,
    /// Calls past the window, in seq order: each leaves, given the first unfinished seq as
    /// its acknowledgement, once it is within.
    held: VecDeque<(u64, Leave)>,
}

/// What a held call does when it comes within the window, given the first unfinished seq.
type Leave = Box<dyn FnOnce(u64)>;

impl Client {
    fn first_unfinished(&self) -> u64 {
        self.unfinished.front().copied().unwrap_or(self.next)
    }
}

thread_local! {
    static CLIENT: RefCell<Option<Client>> = const { RefCell::new(None) };
}

/// A fresh volatile client id of life `life`.
fn new_client_id(life: u64) -> u64 {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    assert!(
        n < 1 << COUNT_BITS,
        "more than 2^24 calling threads in one process"
    );
    VOLATILE | life << COUNT_BITS | n
}

/// Ends the client's part of a call when dropped: the call is no longer unfinished.
#[derive(Debug)]
pub(crate) struct Started {
    seq: u64,
    /// Whether the call was within its client's window when it started: it may leave at
    /// once (checked before this thread lets anything else run).
    within: bool,
}

impl Started {
    /// The answer arrived.
    pub(crate) fn finish(self) {}

    /// Whether the call may leave now (it was within its client's window when it started).
    pub(crate) fn within(&self) -> bool {
        self.within
    }

    /// Runs `leave(args)` once the call is within its client's [`WINDOW`]: now, or when
    /// an earlier call is answered (then on this thread, in delegated context). `args.ack` is
    /// the client's first unfinished seq by then.
    pub(crate) fn when_within(
        self,
        mut args: CallArgs,
        leave: impl FnOnce(CallArgs, Started) + 'static,
    ) {
        within(self.seq, move |first| {
            args.ack = first;
            leave(args, self);
        });
    }

    /// Waits, in this fiber or thread, until the call is within its client's [`WINDOW`];
    /// sets `args.ack` to the client's first unfinished seq by then.
    pub(crate) fn wait_within(&self, args: &mut CallArgs) {
        let first: Rc<Cell<Option<u64>>> = Rc::default();
        let waker: Rc<RefCell<Option<Waker>>> = Rc::default();
        {
            let (first, waker) = (first.clone(), waker.clone());
            within(self.seq, move |f| {
                first.set(Some(f));
                if let Some(w) = waker.take() {
                    w.wake();
                }
            });
        }
        args.ack = trust::block_on(std::future::poll_fn(|cx| match first.get() {
            Some(f) => Poll::Ready(f),
            None => {
                *waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        }));
    }
}

/// Runs `leave(first unfinished seq)` once call `seq` of this thread's client is within the
/// window: now, or from the [`Started`] whose end brings it within.
fn within(seq: u64, leave: impl FnOnce(u64) + 'static) {
    let mut leave = Some(leave);
    let now = CLIENT.with(|c| {
        let mut c = c.borrow_mut();
        let c = match c.as_mut() {
            Some(c) if seq != 0 => c,
            _ => return Some(0), // a call without dedup has no window
        };
        let first = c.first_unfinished();
        if within_window(seq, first) {
            return Some(first);
        }
        let at = c.held.partition_point(|(s, _)| *s < seq);
        c.held
            .insert(at, (seq, Box::new(leave.take().expect("taken once"))));
        None
    });
    if let (Some(first), Some(leave)) = (now, leave) {
        leave(first);
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let seq = self.seq;
        if seq == 0 {
            return; // a call without dedup is never unfinished
        }
        let leaving = CLIENT.with(|c| {
            let mut c = c.borrow_mut();
            let c = c.as_mut()?;
            if c.unfinished.front() == Some(&seq) {
                c.unfinished.pop_front();
            } else if let Some(i) = c.unfinished.iter().position(|&s| s == seq) {
                c.unfinished.remove(i);
            }
            if c.held.is_empty() {
                return None;
            }
            let first = c.first_unfinished();
            let within = c.held.partition_point(|(s, _)| within_window(*s, first));
            Some((first, c.held.drain(..within).collect::<Vec<_>>()))
        });
        // Outside the borrow: a call leaving may start or finish others.
        if let Some((first, leaving)) = leaving {
            for (_, leave) in leaving {
                leave(first);
            }
        }
    }
}

/// `op`'s bytes as a call carries and a log keeps them, and the blobs it carries.
///
/// # Panics
/// When `O` is not registered for `T`, or does not serialize; both messages say what to do.
pub(crate) fn encode_op<T: Wire, O: Op<T>>(op: &O) -> (Bytes, Vec<Blob>) {
    if let Err(why) = registry::entry_of::<T, O>() {
        panic!("{why}");
    }
    let (encoded, blobs) = blob::collecting(|| codec::encode_here(op));
    let encoded = encoded.unwrap_or_else(|e| not_logged::<O>("durable op", e));
    (encoded.into(), blobs)
}

/// A value a log keeps (an op, a continuation), encoded.
///
/// # Panics
/// When it does not serialize.
pub(crate) fn encode_logged<V: Wire>(what: &str, value: &V) -> Vec<u8> {
    let mut bytes = Vec::new();
    codec::append(&mut bytes, value).unwrap_or_else(|e| not_logged::<V>(what, e));
    bytes
}

/// The panic of a value `V` that a log cannot keep.
fn not_logged<V>(what: &str, e: postcard::Error) -> ! {
    panic!(
        "the {what} {} does not serialize (it is logged as it is, so it can hold no volatile \
         gossamer::Trust; hold a Durable<T> instead): {e}",
        std::any::type_name::<V>()
    )
}

/// Starts a call of `op` on a `T` by this thread's client (`dedup == false`: as
/// [`NO_DEDUP`]).
///
/// # Panics
/// As [`encode_op`].
pub(crate) fn start<T: Wire, O: Op<T>>(op: &O, dedup: bool) -> (CallArgs, Started) {
    let (argument, blobs) = encode_op(op);
    if !dedup {
        let args = CallArgs {
            client: NO_DEDUP,
            seq: 0,
            ack: 0,
            argument,
            passing: Passing::of(blobs, None),
        };
        let started = Started {
            seq: 0,
            within: true,
        };
        return (args, started);
    }
    let life = state::life();
    CLIENT.with(|c| {
        let mut c = c.borrow_mut();
        if c.as_ref().is_none_or(|c| c.life != life) {
            *c = Some(Client {
                life,
                id: new_client_id(life),
                next: 1,
                unfinished: VecDeque::new(),
                held: VecDeque::new(),
            });
        }
        let c = c.as_mut().expect("made above");
        let seq = c.next;
        c.next += 1;
        c.unfinished.push_back(seq);
        let ack = *c.unfinished.front().expect("seq was just added");
        let within = within_window(seq, ack);
        (
            CallArgs {
                client: c.id,
                seq,
                ack,
                argument,
                passing: Passing::of(blobs, None),
            },
            Started { seq, within },
        )
    })
}

/// How many of this thread's calls wait for its window.
#[cfg(test)]
pub(crate) fn held_calls() -> usize {
    CLIENT.with(|c| c.borrow().as_ref().map_or(0, |c| c.held.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_id_tells_its_kind_and_life() {
        let life = state::life_tag(7, 2, 1);
        let (a, b) = (new_client_id(life), new_client_id(life));
        assert_ne!(a, b);
        assert_eq!(kind(a), Kind::Volatile { life });
        assert_eq!(kind(b), Kind::Volatile { life });
        let other = new_client_id(state::life_tag(7, 2, 2));
        assert_ne!(kind(other), kind(a), "the next incarnation is another life");
        assert_eq!(kind(session_id(&[b"s"])), Kind::Session);
        assert_eq!(kind(property_id(&[b"p"])), Kind::Property);
        assert_ne!(session_id(&[b"s"]), property_id(&[b"s"]));
        assert_eq!(kind(NO_DEDUP), Kind::NoDedup);
    }
}
