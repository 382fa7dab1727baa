//! Nodes and placement: which node a property goes to, and fibers started on another node.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::call::{AnswerCell, Failure, SpawnOp, on_rack};
use crate::capture_free::check;
use crate::codec::{self, Wire};
use crate::link;
use crate::proxy::{self, Trust};
use crate::state::{self, RackState};
use crate::transport::Transport;

/// One node (process) of the rack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    pub(crate) rank: u32,
}

/// The nodes of the rack, rank 0 first.
///
/// # Panics
/// Outside [`Rack::run`](crate::Rack::run).
#[track_caller]
pub fn nodes() -> impl ExactSizeIterator<Item = Node> + Clone {
    (0..state().size()).map(|rank| Node { rank })
}

/// The node running the caller.
///
/// # Panics
/// Outside [`Rack::run`](crate::Rack::run).
#[track_caller]
pub fn this_node() -> Node {
    Node { rank: state().rank }
}

/// Entrusts `value` to a trustee of this node (round-robin over its workers); `T` needs only
/// `Send`, since it never leaves the node.
///
/// ```
/// let code = gossamer::Rack::from_env().workers(2).run(|| {
///     // A channel's sender is `Send` but not `Wire`: it can live only on this node.
///     let (tx, rx) = std::sync::mpsc::channel();
///     let out = gossamer::entrust(tx);
///     out.local().unwrap().apply(|tx| tx.send(7).unwrap());
///     assert_eq!(rx.recv().unwrap(), 7);
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
///
/// # Panics
/// Outside [`Rack::run`](crate::Rack::run).
#[track_caller]
pub fn entrust<T: Send + 'static>(value: T) -> Trust<T> {
    Trust::local_handle(state().handle.entrust(value))
}

/// How many of this node's properties other nodes hold handles to: a diagnostic, 0 once every
/// handle that left this node is gone (and its release has arrived).
///
/// ```
/// let code = gossamer::Rack::from_env().run(|| assert_eq!(gossamer::exported_properties(), 0));
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
#[track_caller]
pub fn exported_properties() -> usize {
    state().live_exports()
}

#[track_caller]
fn state() -> Arc<RackState> {
    state::current().expect("gossamer is used outside Rack::run")
}

impl Node {
    /// The node's rank.
    pub fn rank(self) -> u32 {
        self.rank
    }

    /// How calls from this worker to the node travel: `None` for this node itself (no
    /// transport), else the transport of this worker's link to the node's worker 0 (every link
    /// between two nodes makes the same choice; see `GSM_TRANSPORT` in [`env`](crate::env)).
    ///
    /// # Panics
    /// Off a rack worker (outside [`Rack::run`](crate::Rack::run)'s fibers).
    ///
    /// ```
    /// let code = gossamer::Rack::from_env().run(|| {
    ///     // A one-node rack: no other node, no transport.
    ///     assert_eq!(gossamer::this_node().transport(), None);
    /// });
    /// assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// ```
    #[track_caller]
    pub fn transport(self) -> Option<Transport> {
        if self.rank == state().rank {
            return None;
        }
        Some(link::transport_to(self.rank, 0))
    }

    /// How many workers (trustees) the node runs.
    #[track_caller]
    pub fn workers(self) -> u32 {
        state().workers[self.rank as usize]
    }

    /// One trustee of this node, to place a property on it.
    ///
    /// # Panics
    /// If the node has no worker `worker`.
    #[track_caller]
    pub fn trustee(self, worker: u32) -> Trustee {
        let workers = self.workers();
        assert!(
            worker < workers,
            "rank {} has workers 0..{workers}, not {worker}",
            self.rank
        );
        Trustee { node: self, worker }
    }

    /// Places `value` on a trustee of this node (round-robin over its workers). Only the
    /// calling fiber waits.
    ///
    /// ```
    /// let code = gossamer::Rack::from_env().run(|| {
    ///     let counters: Vec<_> = gossamer::nodes().map(|n| n.entrust(0u64)).collect();
    ///     for c in &counters {
    ///         c.apply_with(|v, x: u64| *v += x, 5);
    ///     }
    ///     assert_eq!(counters.iter().map(|c| c.apply(|v| *v)).sum::<u64>(), 5 * counters.len() as u64);
    /// });
    /// assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// ```
    #[track_caller]
    pub fn entrust<T: Wire>(self, value: T) -> Trust<T> {
        let worker = state().next_trustee(self.rank);
        self.trustee(worker).entrust(value)
    }

    /// Builds a property on a trustee of this node with `build(argument)`, there; `T` needs only
    /// `Send`. `build` must capture nothing.
    ///
    /// ```
    /// let code = gossamer::Rack::from_env().run(|| {
    ///     let node = gossamer::nodes().last().unwrap();
    ///     let table = node.entrust_with(|n: usize| vec![0u8; n], 16);
    ///     assert_eq!(table.apply(|t| t.len()), 16);
    /// });
    /// assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// ```
    #[track_caller]
    pub fn entrust_with<T, A, C>(self, build: C, argument: A) -> Trust<T>
    where
        T: Send + 'static,
        A: Wire,
        C: FnOnce(A) -> T + Send + 'static,
    {
        let worker = state().next_trustee(self.rank);
        self.trustee(worker).entrust_with(build, argument)
    }
}

/// One worker of one node, as a place for properties.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trustee {
    node: Node,
    worker: u32,
}

impl Trustee {
    /// The node.
    pub fn node(self) -> Node {
        self.node
    }

    /// The worker's index on its node.
    pub fn worker(self) -> u32 {
        self.worker
    }

    /// Places `value` on this trustee.
    #[track_caller]
    pub fn entrust<T: Wire>(self, value: T) -> Trust<T> {
        fn same<T>(value: T) -> T {
            value
        }
        self.entrust_with(same::<T>, value)
    }

    /// Builds a property with `build(argument)` on this trustee.
    #[track_caller]
    pub fn entrust_with<T, A, C>(self, build: C, argument: A) -> Trust<T>
    where
        T: Send + 'static,
        A: Wire,
        C: FnOnce(A) -> T + Send + 'static,
    {
        check!(C);
        let state = state();
        if self.node.rank == state.rank {
            let value = build(argument);
            return Trust::local_handle(state.handle.trustee(self.worker as usize).entrust(value));
        }
        std::mem::forget(build);
        proxy::entrust_remote::<T, A, C>(self.node.rank, self.worker, argument)
    }
}

/// Starts `f(argument)` in a fiber on `node`; `f` must capture nothing and may block (it runs
/// in a fiber there). The handle joins it; dropping the handle detaches the fiber.
///
/// ```
/// let code = gossamer::Rack::from_env().run(|| {
///     let last = gossamer::nodes().last().unwrap();
///     let h = gossamer::spawn_on(last, |x: u64| (x * 2, gossamer::this_node().rank()), 21);
///     assert_eq!(h.join(), (42, last.rank()));
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
///
/// A closure that captures is refused when the program is built (`cargo build`, not `cargo
/// check`); the compiler's notes name the closure and this call:
///
/// ```compile_fail,E0080
/// gossamer::Rack::from_env().run(|| {
///     let factor = 2u64;
///     let h = gossamer::spawn_on(gossamer::this_node(), move |x: u64| x * factor, 21);
///     assert_eq!(h.join(), 42);
/// });
/// ```
#[track_caller]
pub fn spawn_on<A, R, F>(node: Node, f: F, argument: A) -> RemoteJoinHandle<R>
where
    A: Wire,
    R: Wire,
    F: FnOnce(A) -> R + Send + 'static,
{
    check!(F);
    let state = state();
    if node.rank == state.rank {
        return RemoteJoinHandle::local(node.rank, state.handle.spawn(move || f(argument)));
    }
    if !link::is_rack_worker() {
        return on_rack(move || spawn_on(node, f, argument));
    }
    std::mem::forget(f);
    let bytes = codec::encode(state.life(node.rank), &argument);
    let worker = state.next_trustee(node.rank);
    let cell = AnswerCell::new();
    let op = SpawnOp::<A, R, F>::OP;
    link::call(
        node.rank,
        worker,
        None,
        op,
        None,
        bytes.as_slice(),
        cell.on_answer(),
    );
    RemoteJoinHandle::remote(node.rank, cell)
}

/// Starts `f(argument)` in a fiber on `node`, another node, and runs `then(result)` on this
/// worker when it ends, without waiting: [`spawn_on`] for delegated context. Off the rack's
/// workers (a plain thread) it waits instead. A remote failure (a panic of `f`, the node
/// lost) is handed to `then`.
pub(crate) fn spawn_on_then<A, R, F, Then>(node: Node, f: F, argument: A, then: Then)
where
    A: Wire,
    R: Wire,
    F: FnOnce(A) -> R + Send + 'static,
    Then: FnOnce(Result<R, Failure>) + 'static,
{
    check!(F);
    let state = state();
    debug_assert_ne!(node.rank, state.rank, "spawn_on_then is for another node");
    if !link::is_rack_worker() {
        return then(spawn_on(node, f, argument).join_or_failure());
    }
    std::mem::forget(f);
    let bytes = codec::encode(state.life(node.rank), &argument);
    let worker = state.next_trustee(node.rank);
    let on_answer: link::OnAnswer = Box::new(move |outcome| {
        let result = crate::call::decode_answer::<R>(outcome);
        trust::defer(move || then(result));
    });
    link::call(
        node.rank,
        worker,
        None,
        SpawnOp::<A, R, F>::OP,
        None,
        bytes.as_slice(),
        on_answer,
    );
}

/// The handle of a fiber started by [`spawn_on`]: [`join`](RemoteJoinHandle::join) it,
/// [`try_join`](RemoteJoinHandle::try_join) it, or await it; dropping it detaches the fiber.
pub struct RemoteJoinHandle<R> {
    /// The node the fiber runs on.
    rank: u32,
    inner: JoinInner<R>,
}

/// Why a fiber started by [`spawn_on`] gave no result ([`RemoteJoinHandle::try_join`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JoinError {
    /// The node was lost (it died or was cut off, `gsm run --recover` restarts it) before the
    /// fiber's result came back: the fiber ran in whole, in part, or not at all, and nothing
    /// tells which. A rank that is down when the fiber is started gives this at once.
    Lost {
        /// The node's rank.
        rank: u32,
        /// What the rack saw.
        why: String,
    },
    /// The node refused to start the fiber (its argument did not decode there, say): it did
    /// not run.
    Refused {
        /// The node's rank.
        rank: u32,
        /// Why.
        why: String,
    },
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Lost { rank, why } => write!(
                f,
                "rank {rank} was lost before the fiber's result came back (it ran in whole, in \
                 part or not at all): {why}"
            ),
            JoinError::Refused { rank, why } => {
                write!(f, "rank {rank} refused to start the fiber: {why}")
            }
        }
    }
}

impl std::error::Error for JoinError {}

enum JoinInner<R> {
    Local(trust::JoinHandle<R>),
    Remote(AnswerCell<R>),
}

impl<R> fmt::Debug for RemoteJoinHandle<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteJoinHandle").finish_non_exhaustive()
    }
}

impl<R> RemoteJoinHandle<R> {
    /// The handle of a fiber on this node (rank `rank`).
    pub(crate) fn local(rank: u32, handle: trust::JoinHandle<R>) -> Self {
        RemoteJoinHandle {
            rank,
            inner: JoinInner::Local(handle),
        }
    }

    /// The handle of a fiber on node `rank`, answering into `cell`.
    pub(crate) fn remote(rank: u32, cell: AnswerCell<R>) -> Self {
        RemoteJoinHandle {
            rank,
            inner: JoinInner::Remote(cell),
        }
    }

    /// Waits for the fiber's result (only the calling fiber waits) and returns it; a panic of
    /// the fiber is raised again here.
    ///
    /// # Panics
    /// When the fiber panicked, and when its node was lost or refused it (see
    /// [`try_join`](RemoteJoinHandle::try_join) for these as errors); in delegated context.
    pub fn join(self) -> R {
        trust::block_on(self)
    }

    /// [`join`](RemoteJoinHandle::join), with the rack's failures as errors: the fiber's node
    /// lost ([`JoinError::Lost`], under `gsm run --recover`; without it a lost node ends the
    /// job) or refusing it ([`JoinError::Refused`]). What a supervisor uses to tell a rank
    /// that is down from a result.
    ///
    /// ```
    /// use gossamer::JoinError;
    /// let code = gossamer::Rack::from_env().run(|| {
    ///     let last = gossamer::nodes().last().unwrap();
    ///     match gossamer::spawn_on(last, |x: u64| x * 2, 21).try_join() {
    ///         Ok(r) => assert_eq!(r, 42),
    ///         Err(JoinError::Lost { rank, .. }) => println!("rank {rank} is down; try later"),
    ///         Err(e) => panic!("{e}"),
    ///     }
    /// });
    /// assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// ```
    ///
    /// # Errors
    /// [`JoinError`]: the node was lost before the result came back, or refused the fiber.
    ///
    /// # Panics
    /// When the fiber panicked (its panic is raised here, as by `join`); in delegated context.
    pub fn try_join(self) -> Result<R, JoinError> {
        let rank = self.rank;
        self.join_or_failure().map_err(|failure| match failure {
            Failure::Lost(why) => JoinError::Lost { rank, why },
            Failure::Refused(why) => JoinError::Refused { rank, why },
            panicked @ Failure::Panicked(_) => crate::call::raise(panicked),
        })
    }

    /// [`join`](RemoteJoinHandle::join), returning every remote failure (a panic too) rather
    /// than raising it.
    pub(crate) fn join_or_failure(self) -> Result<R, Failure> {
        match self.inner {
            JoinInner::Local(h) => Ok(trust::block_on(h)),
            JoinInner::Remote(cell) => {
                trust::block_on(std::future::poll_fn(|cx| cell.poll_try(cx)))
            }
        }
    }
}

impl<R> Future for RemoteJoinHandle<R> {
    type Output = R;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<R> {
        match &mut self.get_mut().inner {
            JoinInner::Local(h) => Pin::new(h).poll(cx),
            JoinInner::Remote(cell) => cell.poll(cx),
        }
    }
}
