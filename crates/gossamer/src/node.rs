//! Nodes and placement: which node a property goes to, and fibers started on another node.

use std::any::type_name;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use crate::capture_free::{check, conjure};
use crate::link::{self, Reply};
use crate::op::{self, Op, Run};
use crate::proxy::{self, Answer, Trust, Wire};
use crate::rack::{self, RackState};

/// One node (process) of the rack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    pub(crate) rank: u32,
}

/// The nodes of the rack, rank 0 first.
///
/// # Panics
/// Outside [`Rack::run`](crate::Rack::run).
pub fn nodes() -> impl ExactSizeIterator<Item = Node> + Clone {
    (0..state().size()).map(|rank| Node { rank })
}

/// The node running the caller.
///
/// # Panics
/// Outside [`Rack::run`](crate::Rack::run).
pub fn this_node() -> Node {
    Node { rank: state().rank }
}

/// Entrusts `value` to a trustee of this node (round-robin over its workers); `T` needs only
/// `Send`, since it never leaves the node.
///
/// ```
/// gossamer::Rack::from_env().workers(2).run(|| {
///     // A channel's sender is `Send` but not `Wire`: it can live only on this node.
///     let (tx, rx) = std::sync::mpsc::channel();
///     let out = gossamer::entrust(tx);
///     out.local().unwrap().apply(|tx| tx.send(7).unwrap());
///     assert_eq!(rx.recv().unwrap(), 7);
/// });
/// ```
///
/// # Panics
/// Outside [`Rack::run`](crate::Rack::run).
pub fn entrust<T: Send + 'static>(value: T) -> Trust<T> {
    Trust::local_handle(state().handle.entrust(value))
}

/// How many of this node's properties other nodes hold handles to: a diagnostic, 0 once every
/// handle that left this node is gone (and its release has arrived).
///
/// ```
/// gossamer::Rack::from_env().run(|| assert_eq!(gossamer::exported_properties(), 0));
/// ```
pub fn exported_properties() -> usize {
    state().live_exports()
}

fn state() -> Arc<RackState> {
    rack::current().expect("gossamer is used outside Rack::run")
}

impl Node {
    /// The node's rank.
    pub fn rank(self) -> u32 {
        self.rank
    }

    /// How many workers (trustees) the node runs.
    pub fn workers(self) -> u32 {
        state().workers[self.rank as usize]
    }

    /// One trustee of this node, to place a property on it.
    ///
    /// # Panics
    /// If the node has no worker `worker`.
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
    /// gossamer::Rack::from_env().run(|| {
    ///     let counters: Vec<_> = gossamer::nodes().map(|n| n.entrust(0u64)).collect();
    ///     for c in &counters {
    ///         c.apply_with(|v, x: u64| *v += x, 5);
    ///     }
    ///     assert_eq!(counters.iter().map(|c| c.apply(|v| *v)).sum::<u64>(), 5 * counters.len() as u64);
    /// });
    /// ```
    pub fn entrust<T: Wire>(self, value: T) -> Trust<T> {
        let worker = state().next_trustee(self.rank);
        self.trustee(worker).entrust(value)
    }

    /// Builds a property on a trustee of this node with `build(argument)`, there; `T` needs only
    /// `Send`. `build` must capture nothing.
    ///
    /// ```
    /// gossamer::Rack::from_env().run(|| {
    ///     let node = gossamer::nodes().last().unwrap();
    ///     let table = node.entrust_with(|n: usize| vec![0u8; n], 16);
    ///     assert_eq!(table.apply(|t| t.len()), 16);
    /// });
    /// ```
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
    /// The worker's index on its node.
    pub fn worker(self) -> u32 {
        self.worker
    }

    /// Places `value` on this trustee.
    pub fn entrust<T: Wire>(self, value: T) -> Trust<T> {
        fn same<T>(value: T) -> T {
            value
        }
        self.entrust_with(same::<T>, value)
    }

    /// Builds a property with `build(argument)` on this trustee.
    pub fn entrust_with<T, A, C>(self, build: C, argument: A) -> Trust<T>
    where
        T: Send + 'static,
        A: Wire,
        C: FnOnce(A) -> T + Send + 'static,
    {
        check::<C>();
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
/// gossamer::Rack::from_env().run(|| {
///     let last = gossamer::nodes().last().unwrap();
///     let h = gossamer::spawn_on(last, |x: u64| (x * 2, gossamer::this_node().rank()), 21);
///     assert_eq!(h.join(), (42, last.rank()));
/// });
/// ```
pub fn spawn_on<A, R, F>(node: Node, f: F, argument: A) -> RemoteJoinHandle<R>
where
    A: Wire,
    R: Wire,
    F: FnOnce(A) -> R + Send + 'static,
{
    check::<F>();
    let state = state();
    if node.rank == state.rank {
        return RemoteJoinHandle {
            inner: JoinInner::Local(state.handle.spawn(move || f(argument))),
        };
    }
    if !link::is_rack_worker() {
        return proxy::on_rack(move || spawn_on(node, f, argument));
    }
    std::mem::forget(f);
    let bytes = proxy::encode(node.rank, &argument);
    let worker = state.next_trustee(node.rank);
    let op = SpawnOp::<A, R, F>::OP;
    let cell: Arc<Mutex<Answer<R>>> = Arc::default();
    let filled = cell.clone();
    let stage = move || {
        link::call(
            node.rank,
            worker,
            op,
            None,
            bytes,
            Box::new(move |outcome| {
                let mut answer = filled.lock().unwrap_or_else(|p| p.into_inner());
                answer.result = Some(proxy::decode::<R>(outcome));
                if let Some(waker) = answer.waker.take() {
                    waker.wake();
                }
            }),
        )
    };
    stage();
    RemoteJoinHandle {
        inner: JoinInner::Remote(cell),
    }
}

/// The handle of a fiber started by [`spawn_on`]: [`join`](RemoteJoinHandle::join) it or
/// await it; dropping it detaches the fiber.
pub struct RemoteJoinHandle<R> {
    inner: JoinInner<R>,
}

enum JoinInner<R> {
    Local(trust::JoinHandle<R>),
    Remote(Arc<Mutex<Answer<R>>>),
}

impl<R> fmt::Debug for RemoteJoinHandle<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteJoinHandle").finish_non_exhaustive()
    }
}

impl<R> RemoteJoinHandle<R> {
    /// Waits for the fiber's result (only the calling fiber waits) and returns it; a panic of
    /// the fiber is raised again here.
    pub fn join(self) -> R {
        trust::block_on(self)
    }
}

impl<R> Future for RemoteJoinHandle<R> {
    type Output = R;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<R> {
        match &mut self.get_mut().inner {
            JoinInner::Local(h) => Pin::new(h).poll(cx),
            JoinInner::Remote(cell) => {
                let mut answer = cell.lock().unwrap_or_else(|p| p.into_inner());
                match answer.result.take() {
                    Some(Ok(r)) => Poll::Ready(r),
                    Some(Err(failure)) => proxy::raise(failure),
                    None => {
                        answer.waker = Some(cx.waker().clone());
                        Poll::Pending
                    }
                }
            }
        }
    }
}

/// The operation "run `F` on an `A` in a new fiber, answering its `R`".
struct SpawnOp<A, R, F>(PhantomData<fn(A, R, F)>);

impl<A, R, F> SpawnOp<A, R, F>
where
    A: Wire,
    R: Wire,
    F: FnOnce(A) -> R + Send + 'static,
{
    const OP: &'static Op = &op::descriptor!(type_name::<F>, Run::Free(Self::run));

    fn run(argument: &[u8], reply: Reply) {
        let argument: A = match proxy::decode_value(argument) {
            Ok(a) => a,
            Err(e) => {
                return reply.refuse(format!(
                    "cannot decode the argument of {}: {e}",
                    type_name::<F>()
                ));
            }
        };
        // The fiber stays on this worker, where the reply's link is.
        drop(trust::spawn(move || {
            match catch_unwind(AssertUnwindSafe(|| conjure::<F>()(argument))) {
                Ok(r) => reply.ok(&r),
                Err(p) => reply.panicked(&proxy::panic_message(&*p)),
            }
        }));
    }
}
