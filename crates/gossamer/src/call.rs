//! A remote call at both ends, above the lanes: the operations a trustee runs for a remote
//! caller (apply a closure, build a property, start a fiber), and the answer cell the caller
//! waits on.
//!
//! Each operation is a type whose `OP` constant is its descriptor (see `op`); its trampoline
//! decodes the argument ([`decode_argument`], which refuses what does not decode), runs the
//! closure with panics caught, and answers through the request's [`Reply`]. On the calling
//! side, a call stages its request on a link with the callback of an [`AnswerCell`], which a
//! fiber or a future then polls for the decoded result.

use std::any::type_name;
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;

use crate::capture_free::conjure;
use crate::codec::{self, Wire};
use crate::export::{Export, Shared, Target};
use crate::function::NamedError;
use crate::link::{self, OnAnswer, Outcome};
use crate::moved::{self, At};
use crate::op::{self, Op, Reply, Run};
use crate::state;

/// Why a remote call produced no value.
#[derive(Debug)]
pub(crate) enum Failure {
    Panicked(String),
    Refused(String),
    /// The trustee's rank was lost (`gsm run --recover`): whether the call ran is unknown.
    Lost(String),
}

/// Decodes the value of an answer.
pub(crate) fn decode_answer<R: DeserializeOwned + 'static>(
    outcome: Outcome<'_>,
) -> Result<R, Failure> {
    match outcome {
        Outcome::Ok(bytes) => codec::decode_value(bytes).map_err(|e| {
            Failure::Refused(format!(
                "cannot decode a {} from the answer: {e}",
                type_name::<R>()
            ))
        }),
        Outcome::Panicked(m) => Err(Failure::Panicked(m)),
        Outcome::Refused(m) => Err(Failure::Refused(m)),
        Outcome::Lost(m) => Err(Failure::Lost(m)),
        Outcome::Unresolved(_) => Err(Failure::Refused(
            "answered as a named request, which it was not".into(),
        )),
    }
}

/// Decodes the answer to a named request: its value, or why no function ran.
pub(crate) fn decode_named_answer<R: DeserializeOwned + 'static>(
    outcome: Outcome<'_>,
) -> Result<Result<R, NamedError>, Failure> {
    match outcome {
        Outcome::Unresolved(bytes) => match codec::decode_value(bytes) {
            Ok(error) => Ok(Err(error)),
            Err(e) => Err(Failure::Refused(format!(
                "cannot decode why a named call did not run: {e}"
            ))),
        },
        other => decode_answer(other).map(Ok),
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Panicked(m) => write!(f, "the remote call panicked: {m}"),
            Failure::Refused(m) => write!(f, "the remote call was refused: {m}"),
            Failure::Lost(m) => write!(f, "{m}"),
        }
    }
}

/// Raises a remote failure in the caller.
pub(crate) fn raise(failure: Failure) -> ! {
    match failure {
        Failure::Panicked(m) => panic!("remote call panicked: {m}"),
        Failure::Refused(m) => panic!("remote call refused: {m}"),
        Failure::Lost(m) => panic!("remote call lost: {m}"),
    }
}

/// The answer to one call, decoded, for the fiber or future that waits on it. Clones share
/// the cell: the link's callback fills it ([`AnswerCell::on_answer`]), the waiter polls it.
pub(crate) struct AnswerCell<R>(Arc<Mutex<AnswerState<R>>>);

struct AnswerState<R> {
    result: Option<Result<R, Failure>>,
    waker: Option<Waker>,
}

impl<R: Wire> AnswerCell<R> {
    pub(crate) fn new() -> Self {
        AnswerCell(Arc::new(Mutex::new(AnswerState {
            result: None,
            waker: None,
        })))
    }

    /// The callback for [`link::call`] that decodes the answer into this cell.
    pub(crate) fn on_answer(&self) -> OnAnswer {
        self.decoding(decode_answer::<R>)
    }

    /// The callback that decodes an answer with `decode` into this cell.
    pub(crate) fn decoding(&self, decode: fn(Outcome<'_>) -> Result<R, Failure>) -> OnAnswer {
        let cell = self.0.clone();
        Box::new(move |outcome| {
            let mut answer = cell.lock().unwrap_or_else(|p| p.into_inner());
            answer.result = Some(decode(outcome));
            if let Some(waker) = answer.waker.take() {
                waker.wake();
            }
        })
    }
}

impl<R: Wire> AnswerCell<Result<R, NamedError>> {
    /// The callback for [`link::call_named`] that decodes the answer into this cell.
    pub(crate) fn on_named_answer(&self) -> OnAnswer {
        self.decoding(decode_named_answer::<R>)
    }
}

impl<R> AnswerCell<R> {
    /// The result once it is in; a remote panic or refusal is raised here.
    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<R> {
        self.poll_try(cx)
            .map(|result| result.unwrap_or_else(|e| raise(e)))
    }

    /// The result once it is in, a remote failure included.
    pub(crate) fn poll_try(&self, cx: &mut Context<'_>) -> Poll<Result<R, Failure>> {
        let mut answer = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match answer.result.take() {
            Some(result) => Poll::Ready(result),
            None => {
                answer.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Stages a call through `stage` and waits, in this fiber, for its decoded answer.
pub(crate) fn wait_for<R: Wire>(stage: impl FnOnce(OnAnswer)) -> R {
    wait_for_try(stage).unwrap_or_else(|e| raise(e))
}

/// [`wait_for`], returning a remote failure rather than raising it.
pub(crate) fn wait_for_try<R: Wire>(stage: impl FnOnce(OnAnswer)) -> Result<R, Failure> {
    let cell = AnswerCell::new();
    stage(cell.on_answer());
    trust::block_on(std::future::poll_fn(|cx| cell.poll_try(cx)))
}

/// Stages a call through `stage` and waits, in this fiber, for its answer decoded by
/// `decode`, a remote failure included.
pub(crate) fn wait_for_decoded<R: Wire>(
    stage: impl FnOnce(OnAnswer),
    decode: fn(Outcome<'_>) -> Result<R, Failure>,
) -> Result<R, Failure> {
    let cell = AnswerCell::new();
    stage(cell.decoding(decode));
    trust::block_on(std::future::poll_fn(|cx| cell.poll_try(cx)))
}

/// [`wait_for`] for a named request: its value, or why no function ran.
pub(crate) fn wait_for_named<R: Wire>(stage: impl FnOnce(OnAnswer)) -> Result<R, NamedError> {
    let cell = AnswerCell::new();
    stage(cell.on_named_answer());
    trust::block_on(std::future::poll_fn(|cx| cell.poll(cx)))
}

/// Runs `f` in a fiber of the rack and waits for it: how a plain thread, which has no links,
/// makes a remote call.
pub(crate) fn on_rack<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    let state = state::current().expect("a remote trust outlived its rack");
    state.handle.spawn(f).join()
}

/// Decodes the argument of the operation `F`; `None` once the request is refused for it.
fn decode_argument<A: Wire, F>(argument: &[u8], reply: Reply) -> Option<(A, Reply)> {
    match codec::decode_value(argument) {
        Ok(a) => Some((a, reply)),
        Err(e) => {
            reply.refuse(format!(
                "cannot decode the argument of {}: {e}",
                type_name::<F>()
            ));
            None
        }
    }
}

/// The operation "apply `F` with an `A` to a `T`, answering an `R`".
pub(crate) struct ApplyOp<T, A, R, F>(PhantomData<fn(T, A, R, F)>);

impl<T, A, R, F> ApplyOp<T, A, R, F>
where
    T: Send + 'static,
    A: Wire,
    R: Wire,
    F: FnOnce(&mut T, A) -> R + Send + 'static,
{
    pub(crate) const OP: &'static Op = &op::descriptor!(type_name::<F>, Run::Apply(Self::run));

    pub(crate) fn run(export: &Shared, argument: &[u8], reply: Reply) {
        let Some(trust) = op::property::<trust::Trust<T>>(export) else {
            return reply.refuse(op::type_mismatch(type_name::<F>, type_name::<T>(), export));
        };
        let Some((argument, reply)) = decode_argument::<A, F>(argument, reply) else {
            return;
        };
        if let Some(moved) = moved::moved(trust) {
            // The property left this rank: the request follows it (see `moved`), from
            // delegated context, where nothing waits: the link's reader must not.
            let (first, origin) = (trust.clone(), reply.origin());
            return trust::defer(move || {
                moved.call(&first, origin, move |at| match at {
                    At::Here(t) => t.apply_then(Self::closure(argument), |r| answer(reply, r)),
                    At::There(r) => forward(r.target, Self::OP, &argument, reply, answer::<R>),
                })
            });
        }
        // The link's reader runs on the property's trustee: the request runs here and is
        // answered in the same round, unless one of this worker's own requests to its trustee
        // waits, which it must not overtake.
        match trust.try_apply_inline(Self::closure(argument)) {
            Ok(result) => answer(reply, result),
            Err(run) => trust.apply_then(run, move |result| answer(reply, result)),
        }
    }

    /// The request as a closure on the property: `F` made anew, its panic caught.
    fn closure(argument: A) -> impl FnOnce(&mut T) -> Result<R, String> + Send + 'static {
        move |t: &mut T| {
            catch_unwind(AssertUnwindSafe(|| conjure::<F>()(t, argument)))
                .map_err(|p| codec::panic_message(&*p))
        }
    }
}

/// The operation that does nothing on a `T`: a marker call, answered once the calls sent
/// before it on its path ran (see `redirect`).
pub(crate) fn marker_op<T: Send + 'static>() -> &'static Op {
    fn nothing<T>(_: &mut T, (): ()) {}
    fn op_of<T: Send + 'static, F: FnOnce(&mut T, ()) + Send + 'static>(_: F) -> &'static Op {
        ApplyOp::<T, (), (), F>::OP
    }
    op_of::<T, _>(nothing::<T>)
}

/// Sends a request that reached a property's first home on to where its value lives now
/// (`to`): its argument encoded anew for that rank (the handles in it are this rank's now),
/// and the answer decoded here and answered to the caller through `settle`, a failure passed
/// on as it came.
fn forward<A: Wire, R: Wire>(
    to: Target,
    op: &'static Op,
    argument: &A,
    reply: Reply,
    settle: fn(Reply, Result<R, String>),
) {
    if let Some(state) = state::current() {
        state
            .forwarded
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let bytes = codec::encode(to.life(), argument);
    let on_answer: OnAnswer = Box::new(move |outcome| match decode_answer::<R>(outcome) {
        Ok(r) => settle(reply, Ok(r)),
        Err(Failure::Panicked(message)) => reply.panicked(&message),
        Err(Failure::Refused(why) | Failure::Lost(why)) => reply.refuse(why),
    });
    let property = Some((to.slot, to.generation));
    link::call(
        to.node,
        to.worker,
        Some(to.incarnation),
        op,
        property,
        bytes.as_slice(),
        on_answer,
    );
}

/// Answers a request with its operation's result, or the message of its panic.
fn answer<R: Wire>(reply: Reply, result: Result<R, String>) {
    match result {
        Ok(r) => reply.ok(&r),
        Err(message) => reply.panicked(&message),
    }
}

/// The operation "apply the deferred `F` with an `A` to a `T`", answering `Some(R)` whenever
/// its reply is sent, or `None` when its optional deadline passes first (then `E` runs on the
/// property). The argument carries the time left in nanoseconds.
pub(crate) struct DeferredOp<T, A, R, F, E>(PhantomData<fn(T, A, R)>, PhantomData<fn(F, E)>);

impl<T, A, R, F, E> DeferredOp<T, A, R, F, E>
where
    T: Send + 'static,
    A: Wire,
    R: Wire,
    F: FnOnce(&mut T, A, trust::Reply<R>) + Send + 'static,
    E: Fn(&mut T, trust::ReplyId) + Send + 'static,
{
    pub(crate) const OP: &'static Op = &op::descriptor!(type_name::<F>, Run::Apply(Self::run));

    fn run(export: &Shared, argument: &[u8], reply: Reply) {
        let Some(trust) = op::property::<trust::Trust<T>>(export) else {
            return reply.refuse(op::type_mismatch(type_name::<F>, type_name::<T>(), export));
        };
        let Some(((argument, wait), reply)) =
            decode_argument::<(A, Option<u64>), F>(argument, reply)
        else {
            return;
        };
        if let Some(moved) = moved::moved(trust) {
            // The property left this rank: the request follows it (see `moved`), with the
            // time left then.
            let (since, first, origin) = (Instant::now(), trust.clone(), reply.origin());
            return trust::defer(move || {
                moved.call(&first, origin, move |at| match at {
                    At::Here(t) => Self::run_on(&t, argument, wait, reply),
                    At::There(r) => {
                        let spent = since.elapsed().as_nanos() as u64;
                        let left = wait.map(|ns| ns.saturating_sub(spent));
                        forward(
                            r.target,
                            Self::OP,
                            &(argument, left),
                            reply,
                            answer_option::<R>,
                        )
                    }
                })
            });
        }
        Self::run_on(trust, argument, wait, reply)
    }

    /// Makes the request on `trust`, answering whenever its outcome comes.
    fn run_on(trust: &trust::Trust<T>, argument: A, wait: Option<u64>, reply: Reply) {
        // A deadline past what the clock can hold is none at all.
        let deadline = wait
            .and_then(|ns| Instant::now().checked_add(Duration::from_nanos(ns)))
            .map(|at| -> trust::Deadline<T> { (at, expire::<T, E>) });
        trust.apply_deferred_settle(
            move |t, r| conjure::<F>()(t, argument, r),
            deadline,
            move |outcome| match outcome {
                trust::Outcome::Answer(r) => reply.ok(&Some(r)),
                trust::Outcome::TimedOut => reply.ok(&None::<R>),
                trust::Outcome::Panicked(p) => reply.panicked(&codec::panic_message(&*p)),
            },
        );
    }
}

/// Answers a deferred request with what its new home answered (`None`: timed out).
fn answer_option<R: Wire>(reply: Reply, result: Result<Option<R>, String>) {
    match result {
        Ok(r) => reply.ok(&r),
        Err(message) => reply.panicked(&message),
    }
}

/// Runs the capture-free `E` as a deferred request's `on_expire` function.
pub(crate) fn expire<T, E: Fn(&mut T, trust::ReplyId)>(t: &mut T, id: trust::ReplyId) {
    conjure::<E>()(t, id)
}

/// The operation "build a property from an `A` with `C` on the receiving worker", answering
/// its export `(slot, generation, ticket)`.
pub(crate) struct EntrustOp<T, A, C>(PhantomData<fn(T, A, C)>);

impl<T, A, C> EntrustOp<T, A, C>
where
    T: Send + 'static,
    A: Wire,
    C: FnOnce(A) -> T + Send + 'static,
{
    pub(crate) const OP: &'static Op = &op::descriptor!(type_name::<C>, Run::Free(Self::run));

    fn run(argument: &[u8], reply: Reply) {
        let Some((argument, reply)) = decode_argument::<A, C>(argument, reply) else {
            return;
        };
        match catch_unwind(AssertUnwindSafe(|| conjure::<C>()(argument))) {
            Ok(value) => {
                let trust = trust::local_trustee().entrust(value);
                let (rack, worker) = link::with_net(|net| (net.rack.clone(), net.worker));
                let ticket = rack.mint();
                let export = Export::new(trust, ticket, reply.peer());
                match rack.exports(worker).insert(export) {
                    Ok((slot, generation)) => reply.ok(&(slot, generation, ticket)),
                    Err(e) => reply.refuse(e.to_string()),
                }
            }
            Err(p) => reply.panicked(&codec::panic_message(&*p)),
        }
    }
}

/// The operation "run `F` on an `A` in a new fiber, answering its `R`".
pub(crate) struct SpawnOp<A, R, F>(PhantomData<fn(A, R, F)>);

impl<A, R, F> SpawnOp<A, R, F>
where
    A: Wire,
    R: Wire,
    F: FnOnce(A) -> R + Send + 'static,
{
    pub(crate) const OP: &'static Op = &op::descriptor!(type_name::<F>, Run::Free(Self::run));

    pub(crate) fn run(argument: &[u8], reply: Reply) {
        let Some((argument, reply)) = decode_argument::<A, F>(argument, reply) else {
            return;
        };
        // The fiber stays on this worker, where the reply's link is.
        drop(trust::spawn(move || {
            match catch_unwind(AssertUnwindSafe(|| conjure::<F>()(argument))) {
                Ok(r) => reply.ok(&r),
                Err(p) => reply.panicked(&codec::panic_message(&*p)),
            }
        }));
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::export::{ExportTable, Life, Ticket};
    use crate::op::{AnswerLog, AnswerTo};
    use crate::splitmix::{Rng, scaled};
    use crate::wire::{self, Frame, Limits, Payload, Status};

    /// The descriptor of applying `f` to a `T`.
    fn apply_op<T, A, R, F>(_: F) -> &'static op::Op
    where
        T: Send + 'static,
        A: Wire,
        R: Wire,
        F: FnOnce(&mut T, A) -> R + Send + 'static,
    {
        ApplyOp::<T, A, R, F>::OP
    }

    /// A million damaged requests frames go through the decoder and the dispatcher with real
    /// descriptors and a real export table: a request runs only when its op is one of this
    /// build's descriptors, its (slot, generation) is live, the property has the op's type and
    /// the argument decodes. Everything else is refused; the properties' final values prove
    /// that nothing else ran.
    #[test]
    fn mutated_requests_are_refused_never_called() {
        let frames = scaled(1_000_000);
        let rt = trust::Runtime::builder().workers(1).build().unwrap();
        rt.block_on(|| {
            let add = apply_op(|v: &mut u64, x: u64| *v += x);
            let push = apply_op(|s: &mut String, c: char| s.push(c));
            let counter = trust::entrust(0u64);
            let text = trust::entrust(String::new());
            let later = trust::entrust(0u64);
            let peer = Life {
                rank: 1,
                incarnation: 0,
            };
            let mut table = ExportTable::default();
            let (ticket, holder) = (
                Ticket {
                    minter: peer,
                    count: 1,
                },
                peer,
            );
            let c = table
                .insert(Export::new(counter.clone(), ticket, holder))
                .unwrap();
            let t = table
                .insert(Export::new(text.clone(), ticket, holder))
                .unwrap();
            let stale = table
                .insert(Export::new(trust::entrust(0u64), ticket, holder))
                .unwrap();
            drop(table.release(stale.0, stale.1, ticket).unwrap());
            let l = table
                .insert(Export::new(later.clone(), ticket, holder))
                .unwrap();
            assert_eq!(
                (stale.0, l.0, l.1),
                (2, 2, 1),
                "slot 2 reused, generation 1"
            );
            let targets = [
                Some(c),
                Some(t),
                Some(stale),
                Some(l),
                Some((9, 0)),
                Some((0, 5)),
                None,
            ];

            let limits = Limits {
                frame: 1024,
                max_message: 64 * 1024,
            };
            let mut rng = Rng(0x0d15_9a7c_4e55_0001);
            let bases: Vec<Vec<u8>> = (0..300)
                .map(|_| {
                    let mut out = Vec::new();
                    let mut w = wire::RequestsWriter::begin(&mut out, 1, &limits);
                    for id in 0..1 + rng.below(4) as u64 {
                        let op = match rng.below(4) {
                            0 | 1 => add.offset(),
                            2 => push.offset(),
                            _ => add.offset().wrapping_add(8 * (1 + rng.below(8)) as u64),
                        };
                        let arg = match rng.below(3) {
                            0 => postcard::to_allocvec(&(rng.below(1000) as u64)).unwrap(),
                            1 => postcard::to_allocvec(&char::from(b'a' + rng.below(26) as u8))
                                .unwrap(),
                            _ => {
                                let len = rng.below(6);
                                rng.bytes(len)
                            }
                        };
                        let target = targets[rng.below(targets.len())];
                        w.push(&mut out, id, wire::Code::Op(op), target, &arg)
                            .unwrap();
                    }
                    w.finish(&mut out);
                    out
                })
                .collect();

            let log = AnswerLog::default();
            let mut expected = Vec::new();
            let (mut sum_counter, mut sum_later, mut pushed) = (0u64, 0u64, String::new());
            let mut other_descriptors = 0;
            let wait_for_answers = |n: usize| {
                let deadline = Instant::now() + Duration::from_secs(60);
                while log.lock().unwrap().len() < n {
                    assert!(
                        Instant::now() < deadline,
                        "answers to {n} dispatched requests"
                    );
                    trust::yield_now();
                }
            };
            for frame in 0..frames {
                let mut buf = bases[rng.below(bases.len())].clone();
                for _ in 0..1 + rng.below(3) {
                    wire::mutate(&mut rng, &mut buf, &limits);
                }
                let Ok(Some((Frame::Requests { requests, .. }, _))) = wire::decode(&buf, &limits)
                else {
                    continue;
                };
                for request in requests {
                    let Payload::Inline(arg) = request.arg else {
                        continue; // large arguments are reassembled before dispatch
                    };
                    let wire::Code::Op(op) = request.code else {
                        continue; // named requests are resolved by their link
                    };
                    if op != add.offset() && op != push.offset() && op::resolve(op).is_ok() {
                        // A mutation that lands on another real descriptor of this build (they
                        // sit side by side): a call a peer of this build may make, with its own
                        // type checks, not a forgery. Not this test's to run.
                        other_descriptors += 1;
                        continue;
                    }
                    let runs = match request.target {
                        Some(x) if op == add.offset() && (x == c || x == l) => {
                            codec::decode_value::<u64>(arg).ok().map(|v| {
                                *if x == c {
                                    &mut sum_counter
                                } else {
                                    &mut sum_later
                                } += v;
                            })
                        }
                        Some(x) if op == push.offset() && x == t => {
                            codec::decode_value::<char>(arg)
                                .ok()
                                .map(|ch| pushed.push(ch))
                        }
                        _ => None,
                    };
                    expected.push(if runs.is_some() {
                        Status::Ok
                    } else {
                        Status::Refused
                    });
                    let id = expected.len() as u64 - 1;
                    let peer = Life {
                        rank: 1,
                        incarnation: 0,
                    };
                    let to = AnswerTo::Log(log.clone());
                    let reply = Reply::new(id, (peer, 0), (0, 0), request.target, to);
                    let find = |slot, generation| table.get(slot, generation).map(|e| e.share());
                    link::dispatch(op, request.target, arg, reply, find);
                }
                if frame % 4096 == 0 {
                    wait_for_answers(expected.len());
                }
            }
            wait_for_answers(expected.len());

            let mut answers = std::mem::take(&mut *log.lock().unwrap());
            assert_eq!(answers.len(), expected.len(), "one answer per request");
            answers.sort_by_key(|a| a.0);
            let mut reasons = std::collections::BTreeMap::<&str, usize>::new();
            for (id, status, bytes) in &answers {
                let want = expected[*id as usize];
                let text = codec::decode_message(bytes);
                assert_eq!(*status, want, "request {id}: {text}");
                let reason = [
                    "unknown op",
                    "stale export",
                    "no export in slot",
                    "type mismatch",
                    "needs a property",
                    "cannot decode the argument",
                ]
                .into_iter()
                .find(|r| text.contains(r))
                .unwrap_or(if *status == Status::Ok {
                    "ran"
                } else {
                    "other"
                });
                *reasons.entry(reason).or_default() += 1;
            }
            println!(
                "{} requests dispatched: {reasons:?}; {other_descriptors} named other descriptors",
                answers.len()
            );
            assert!(!reasons.contains_key("other"), "{reasons:?}");
            assert_eq!(reasons.len(), 7, "every outcome is reached: {reasons:?}");
            assert_eq!(counter.apply(|v| *v), sum_counter);
            assert_eq!(later.apply(|v| *v), sum_later);
            assert_eq!(text.apply(|s| s.clone()), pushed);
        });
    }
}
