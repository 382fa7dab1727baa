//! Sessions: persistent clients, whose calls are exactly once across restarts of the caller
//! too.
//!
//! A volatile client (a thread) forgets its calls when its process ends: a call it sent
//! either took effect or not, and nothing tells which. A [`Session`] keeps its calls in its
//! rank's durable state, as a durable property of its own (`gossamer.session/<name>`):
//! before a call leaves, the session logs it (the seed's checkpoint a1); when the answer
//! arrives, the session logs the answer (a2) and only then returns it. A session reopened
//! after its process ended finds the calls logged without an answer in [`Session::pending`],
//! and [`Session::resume`] sends each again under the same (client, seq): the property
//! answers from its completion record if the call ran, and runs it if it did not. Either
//! way it takes effect once.

use std::any::type_name;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::task::{Poll, Waker};

use serde::{Deserialize, Serialize};

use super::blob::{self, Blob, BlobError, Holder, Kept};
use super::cell;
use super::client;
use super::crash;
use super::fetch;
use super::format::{Answer, Bytes, CallArgs, Passing};
use super::registry::Resend;
use super::{CallError, Cx, Durable, DurableError, Missed, Op, until_answered};
use crate::codec::Wire;
use crate::node::{Node, spawn_on, this_node};

/// A call a session logged: where it went and what it carried, and its answer once it came.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionCall {
    seq: u64,
    rank: u32,
    property: String,
    state_type: String,
    op: String,
    argument: Bytes,
    /// The blobs it carried, kept as data: logging the call passes none.
    blobs: Vec<Kept>,
    answer: Option<Answer>,
}

impl SessionCall {
    /// The call's sequence number in its session.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The property called: its rank and name.
    pub fn property(&self) -> (u32, &str) {
        (self.rank, &self.property)
    }

    /// The op's name.
    pub fn op(&self) -> &str {
        &self.op
    }

    /// The op the call carried, decoded as an `O`; `None` if it is not one.
    pub fn argument_as<O: Wire>(&self) -> Option<O> {
        postcard::from_bytes(&self.argument).ok()
    }

    /// The op's output once the call was answered (`None` while unanswered), or
    /// [`CallError::Expired`] when the session's lease at the property ended first.
    ///
    /// # Panics
    /// When the op panicked, or its output is not an `R`.
    pub fn output<R: Wire>(&self) -> Option<Result<R, CallError>> {
        self.answer
            .clone()
            .map(|a| cell::output::<R>(&self.property, &self.op, a))
    }
}

/// A session's durable state.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct SessionState {
    id: u64,
    next_seq: u64,
    /// Calls not yet acknowledged to their property, by seq.
    calls: BTreeMap<u64, SessionCall>,
}

/// a1: a call is about to leave. Acknowledges the answered calls before `ack`.
#[derive(Serialize, Deserialize)]
struct Begin {
    call: SessionCall,
    ack: u64,
}

impl Op<SessionState> for Begin {
    const NAME: &'static str = "gossamer.session.begin";
    type Output = ();
    fn apply(self, s: &mut SessionState, _: &mut Cx<SessionState>) {
        s.calls
            .retain(|&seq, c| seq >= self.ack || c.answer.is_none());
        s.next_seq = s.next_seq.max(self.call.seq + 1);
        s.calls.insert(self.call.seq, self.call);
    }
}

/// a2: a call's answer arrived.
#[derive(Serialize, Deserialize)]
struct Finish {
    seq: u64,
    answer: Answer,
}

impl Op<SessionState> for Finish {
    const NAME: &'static str = "gossamer.session.finish";
    type Output = ();
    fn apply(self, s: &mut SessionState, _: &mut Cx<SessionState>) {
        if let Some(c) = s.calls.get_mut(&self.seq) {
            c.answer = Some(self.answer);
        }
    }
}

/// The session's id, fixed by its first open.
#[derive(Serialize, Deserialize)]
struct Init(u64);

impl Op<SessionState> for Init {
    const NAME: &'static str = "gossamer.session.init";
    type Output = u64;
    fn apply(self, s: &mut SessionState, _: &mut Cx<SessionState>) -> u64 {
        if s.id == 0 {
            s.id = self.0;
            s.next_seq = 1;
        }
        s.id
    }
}

/// A blob the session wrote the bytes of is made.
#[derive(Serialize, Deserialize)]
struct Adopt {
    len: u64,
    hash: [u8; 32],
}

impl Op<SessionState> for Adopt {
    const NAME: &'static str = "gossamer.session.blob";
    type Output = Blob;
    fn apply(self, _: &mut SessionState, cx: &mut Cx<SessionState>) -> Blob {
        cx.adopt(self.len, self.hash)
    }
}

crate::durable_ops!(SessionState: Begin, Finish, Init, Adopt);

/// A persistent client: its calls take effect exactly once even when the process making
/// them ends in the middle, since the session logs each call before it leaves and each
/// answer before it returns it.
///
/// A session is open at most once in a process: a second [`Session::open`] of its name while
/// the first handle lives is refused ([`DurableError::SessionOpen`]), since two handles would
/// number their calls alike and the properties would answer the second's calls from the
/// first's records. To call from many fibers or threads, share the one handle (it is `Send`
/// and `Sync`; `&Session` is enough): its calls are numbered in the order they start, and
/// each waits only for itself (and for the [`WINDOW`](client::WINDOW)). Dropping it lets the
/// name be opened again. Two processes of one rank never hold its state at once (the store
/// is locked), so the name is unique across processes too.
///
/// ```no_run
/// # use gossamer::durable::{Cx, Op, Session};
/// # #[derive(serde::Serialize, serde::Deserialize, Default)] struct Account { balance: i64 }
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Deposit(i64);
/// # impl Op<Account> for Deposit {
/// #     const NAME: &'static str = "doc.deposit"; type Output = i64;
/// #     fn apply(self, a: &mut Account, _: &mut Cx<Account>) -> i64 { a.balance += self.0; a.balance }
/// # }
/// # gossamer::durable_ops!(Account: Deposit);
/// let code = gossamer::Rack::from_env().run(|| {
///     let acct = gossamer::this_node().durable("alice", Account::default).unwrap();
///     let driver = Session::open("driver").unwrap();
///     // Calls an earlier run of this program sent, whose answers it never saw:
///     for call in driver.resume().unwrap() {
///         println!("call {} came to {:?}", call.seq(), call.output::<i64>());
///     }
///     driver.call(&acct, Deposit(5)).unwrap();
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
#[derive(Debug)]
pub struct Session {
    id: u64,
    /// The name and rack life it is open under (see [`Session::open`]).
    name: String,
    life: u64,
    state: Durable<SessionState>,
    mirror: Mutex<Mirror>,
}

/// What the session's calls need at once, kept beside the durable state.
#[derive(Debug)]
struct Mirror {
    next_seq: u64,
    unfinished: BTreeSet<u64>,
    /// The unfinished calls nobody is sending (an earlier process's, or one whose call
    /// failed), with the property each went to: only [`Session::resume`] finishes them.
    unsettled: BTreeMap<u64, String>,
    /// Calls waiting to come within the session's window.
    waiting: Vec<Waker>,
}

/// The sessions open in this process, by the life of the rack they were opened in and
/// their name.
static OPEN: Mutex<BTreeSet<(u64, String)>> = Mutex::new(BTreeSet::new());

fn open_sessions() -> std::sync::MutexGuard<'static, BTreeSet<(u64, String)>> {
    OPEN.lock().unwrap_or_else(|p| p.into_inner())
}

impl Session {
    /// Opens the session `name` of this node, creating it if its rank's state has none.
    ///
    /// # Errors
    /// [`DurableError::SessionOpen`] while this process holds the session already (share
    /// that handle instead); the session's state cannot be opened (see [`DurableError`]).
    pub fn open(name: &str) -> Result<Session, DurableError> {
        let key = (crate::state::life(), name.to_string());
        if !open_sessions().insert(key.clone()) {
            return Err(DurableError::SessionOpen { name: name.into() });
        }
        let opened = Session::open_state(name);
        if opened.is_err() {
            open_sessions().remove(&key);
        }
        opened
    }

    /// [`Session::open`] once the name is this handle's.
    fn open_state(name: &str) -> Result<Session, DurableError> {
        let rank = this_node().rank();
        let state =
            this_node().durable(&format!("gossamer.session/{name}"), SessionState::default)?;
        let on_own_node = |e: CallError| match e {
            CallError::Open(e) => e,
            other => unreachable!("a session's state is on its own node: {other}"),
        };
        let id = state
            .call(Init(session_id(rank, name)))
            .map_err(on_own_node)?;
        let (next_seq, unsettled) = state
            .read(|s: &SessionState| {
                let unanswered = s
                    .calls
                    .values()
                    .filter(|c| c.answer.is_none())
                    .map(|c| (c.seq, c.property.clone()))
                    .collect::<BTreeMap<u64, String>>();
                (s.next_seq, unanswered)
            })
            .map_err(on_own_node)?;
        Ok(Session {
            id,
            name: name.into(),
            life: crate::state::life(),
            state,
            mirror: Mutex::new(Mirror {
                next_seq,
                unfinished: unsettled.keys().copied().collect(),
                unsettled,
                waiting: Vec::new(),
            }),
        })
    }

    fn mirror(&self) -> std::sync::MutexGuard<'_, Mirror> {
        self.mirror.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Calls `op` on `target` as this session and waits for its output; only the calling
    /// fiber waits. The call is logged before it leaves and its answer before this returns.
    ///
    /// # Errors
    /// As [`Durable::call`]. A call that fails unanswered ([`CallError::Unavailable`]) stays
    /// [`pending`](Session::pending) until [`resume`](Session::resume) settles it, and holds
    /// the session's [`WINDOW`](client::WINDOW): a call a window past such a call fails at
    /// once with [`CallError::Unsettled`] (and does not run).
    ///
    /// # Panics
    /// In delegated context; when the op panicked; when `O` is not registered.
    pub fn call<T: Wire, O: Op<T>>(
        &self,
        target: &Durable<T>,
        op: O,
    ) -> Result<O::Output, CallError> {
        if let Err(Missed::Open(e)) = target.resolve() {
            return Err(CallError::Open(e));
        }
        let args = self.begin(target, &op)?;
        crash::point("a1-logged");
        let seq = args.seq;
        let answer = match target.send(cell::run::<T, O>, args) {
            Ok(answer) => answer,
            Err(e) => {
                // Logged and unanswered: it stays pending until `resume` settles it.
                self.unsettled(seq, target.name());
                return Err(e);
            }
        };
        crash::point("a2-received");
        self.finish(seq, answer.clone())?;
        crash::point("a2-logged");
        cell::output(target.name(), O::NAME, answer)
    }

    /// a1: gives `op` its seq, waits for it to come within the session's
    /// [`WINDOW`](client::WINDOW), logs it as about to leave, and returns what the call
    /// carries.
    fn begin<T: Wire, O: Op<T>>(&self, target: &Durable<T>, op: &O) -> Result<CallArgs, CallError> {
        let (argument, blobs) = client::encode_op(op);
        let seq = {
            let mut m = self.mirror();
            let seq = m.next_seq;
            m.next_seq += 1;
            m.unfinished.insert(seq);
            seq
        };
        let ack = trust::block_on(std::future::poll_fn(|cx| {
            let mut m = self.mirror();
            let first = *m.unfinished.first().expect("seq is unfinished");
            if client::within_window(seq, first) {
                return Poll::Ready(Ok(first));
            }
            // Nobody sends the call that holds the window: waiting would never end.
            if let Some(property) = m.unsettled.get(&first) {
                let held = CallError::Unsettled {
                    seq: first,
                    property: property.clone(),
                };
                return Poll::Ready(Err(held));
            }
            m.waiting.push(cx.waker().clone());
            Poll::Pending
        }));
        let ack = match ack {
            Ok(ack) => ack,
            Err(held) => {
                self.finished(seq);
                return Err(held);
            }
        };
        let call = SessionCall {
            seq,
            rank: target.node().rank(),
            property: target.name().into(),
            state_type: type_name::<T>().into(),
            op: O::NAME.into(),
            argument: argument.clone(),
            blobs: blobs.iter().cloned().map(Kept::from).collect(),
            answer: None,
        };
        if let Err(e) = self.state.call(Begin { call, ack }) {
            self.finished(seq);
            return Err(e);
        }
        Ok(CallArgs {
            client: self.id,
            seq,
            ack,
            argument,
            passing: Passing::of(blobs, Some(self.holder())),
        })
    }

    /// The session as a holder of blobs: its property.
    fn holder(&self) -> Holder {
        Holder {
            rank: self.state.node().rank(),
            property: self.state.name().into(),
        }
    }

    /// Makes a blob of `bytes`, controlled by this session: its bytes are kept in this
    /// rank's directory before it exists. Pass it by reference in calls' ops (each property
    /// called leases it until its snapshot covers the call), read it anywhere
    /// ([`Blob::read`]), and free it when done ([`Session::free`]).
    ///
    /// # Errors
    /// [`BlobError::Store`] when the bytes cannot be written; [`BlobError::Unavailable`] when the session's state cannot be
    /// reached.
    pub fn blob(&self, bytes: &[u8]) -> Result<Blob, BlobError> {
        let hash = fetch::write_for(self.state.name(), bytes)?;
        let made = self.state.call(Adopt {
            len: bytes.len() as u64,
            hash,
        });
        made.map_err(|e| BlobError::Unavailable {
            blob: format!("a new blob of {}", self.holder()),
            why: e.to_string(),
        })
    }

    /// Frees `blob`, which this session controls (it made it, or an op returned it to it).
    ///
    /// # Errors
    /// [`BlobError::Leased`] while a call that carried it may still be replayed (a lease
    /// ends once the called property's snapshot covers the call: try again later);
    /// [`BlobError::NotController`]; [`BlobError::Unavailable`].
    pub fn free(&self, blob: &Blob) -> Result<(), BlobError> {
        let change = blob::Change::Free {
            id: blob.id(),
            by: self.holder(),
        };
        fetch::ask_maker(blob, change)
    }

    /// Logs call `seq`'s answer: it is finished.
    fn finish(&self, seq: u64, answer: Answer) -> Result<(), CallError> {
        self.state.call(Finish { seq, answer })?;
        self.finished(seq);
        Ok(())
    }

    /// Call `seq` is no longer unfinished: the calls waiting for the window look again.
    fn finished(&self, seq: u64) {
        let waiting = {
            let mut m = self.mirror();
            m.unfinished.remove(&seq);
            m.unsettled.remove(&seq);
            std::mem::take(&mut m.waiting)
        };
        waiting.into_iter().for_each(Waker::wake);
    }

    /// Call `seq` to `property` failed unanswered: it stays unfinished (its property keeps
    /// its record for `resume`), and the calls waiting for the window look again.
    fn unsettled(&self, seq: u64, property: &str) {
        let waiting = {
            let mut m = self.mirror();
            m.unsettled.insert(seq, property.into());
            std::mem::take(&mut m.waiting)
        };
        waiting.into_iter().for_each(Waker::wake);
    }

    /// The calls this session logged but never saw answered: sent by a process that ended
    /// before their answer came, or before they left at all, or whose call failed
    /// ([`CallError::Unavailable`]).
    pub fn pending(&self) -> Vec<SessionCall> {
        self.read_own(|s: &SessionState| {
            s.calls
                .values()
                .filter(|c| c.answer.is_none())
                .cloned()
                .collect()
        })
    }

    /// Reads the session's own state, which is on this node.
    fn read_own<R: Wire>(&self, f: impl FnOnce(&SessionState) -> R + Send + 'static) -> R {
        self.state
            .read(f)
            .unwrap_or_else(|e| panic!("session state on this node: {e}"))
    }

    /// The calls answered (and logged so) whose acknowledgement has not left yet, in seq
    /// order: the answers a process that ended right after a call returned may never have
    /// used. The session's next call acknowledges them, and they are gone from here.
    pub fn answered(&self) -> Vec<SessionCall> {
        self.read_own(|s: &SessionState| {
            s.calls
                .values()
                .filter(|c| c.answer.is_some())
                .cloned()
                .collect()
        })
    }

    /// Sends every pending call again under its own id and returns them answered, in seq
    /// order: each took effect exactly once, whether its first sending reached its property
    /// or not.
    ///
    /// # Errors
    /// A property could not be opened where it lives.
    pub fn resume(&self) -> Result<Vec<SessionCall>, CallError> {
        let mut done = Vec::new();
        for mut call in self.pending() {
            let ack = *self.mirror().unfinished.first().unwrap_or(&call.seq);
            let resend = Resend {
                property: call.property.clone(),
                op: call.op.clone(),
                args: CallArgs {
                    client: self.id,
                    seq: call.seq,
                    ack: ack.min(call.seq),
                    argument: call.argument.clone(),
                    passing: Passing::of(
                        call.blobs.iter().cloned().map(Blob::from).collect(),
                        Some(self.holder()),
                    ),
                },
            };
            let node = Node { rank: call.rank };
            let answer = until_answered(call.rank, || {
                let state_type = call.state_type.clone();
                let resent = spawn_on(node, cell::resend_by_type, (state_type, resend.clone()));
                Ok(resent.join_or_failure()??)
            })?;
            self.finish(call.seq, answer.clone())?;
            call.answer = Some(answer);
            done.push(call);
        }
        Ok(done)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        open_sessions().remove(&(self.life, std::mem::take(&mut self.name)));
    }
}

#[cfg(test)]
impl Session {
    /// What `call` does up to a process's end after a1 (and, with `sent`, after the property
    /// ran the call), without a2.
    pub(crate) fn begin_for_test<T: Wire, O: Op<T>>(&self, target: &Durable<T>, op: O, sent: bool) {
        let args = self.begin(target, &op).unwrap();
        if sent {
            target.send(cell::run::<T, O>, args).unwrap().unwrap();
        }
    }
}

/// A session's client id: fixed by its rank and name.
fn session_id(rank: u32, name: &str) -> u64 {
    client::session_id(&[b"session", &rank.to_le_bytes(), name.as_bytes()])
}
