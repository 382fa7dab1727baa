//! The client side towards trustees of *other* runtimes, which have no channel from this
//! worker: `apply_then` hands such a request to the trustee's injector and keeps a cell that
//! the answer completes, from the other runtime's thread, at any time.
//!
//! The worker keeps one queue of pending answers per foreign trustee, in request order, and
//! delivers strictly from the front: an answer that arrives early waits until every answer
//! before it has been delivered. So the `then`s of one (worker, trustee) pair run in the order
//! the requests were made, as they do over the worker's own lanes. Only the front cell of a
//! queue holds the worker's waker: its completion makes the worker drain the queue (through
//! its own injector), in its loop, in the context `then` callbacks run in everywhere else.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Wake, Waker};

use super::{Worker, current};
use crate::inject::Injected;
use crate::runtime::Shared;

/// A pending answer: polled with the worker's waker, it delivers the answer (runs `then`) and
/// returns `Ready` once the answer has arrived.
pub(crate) type PendingAnswer = Box<dyn FnMut(&mut TaskContext<'_>) -> Poll<()>>;

/// The pending answers from one trustee of another runtime, oldest first.
struct ForeignQueue {
    /// The trustee's runtime, which the queue keeps alive so that its address stays unique.
    runtime: Arc<Shared>,
    trustee: usize,
    pending: VecDeque<PendingAnswer>,
}

/// A worker's queues of answers from foreign trustees.
pub(super) struct ForeignAnswers {
    queues: Vec<ForeignQueue>,
    waker: Waker,
}

impl ForeignAnswers {
    /// The queues of worker `worker` of `shared`'s runtime.
    pub(super) fn new(shared: Arc<Shared>, worker: usize) -> Self {
        ForeignAnswers {
            queues: Vec::new(),
            waker: Waker::from(Arc::new(DrainWaker { shared, worker })),
        }
    }
}

/// Makes its worker drain its foreign queues, from any thread.
struct DrainWaker {
    shared: Arc<Shared>,
    worker: usize,
}

impl Wake for DrainWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let drain = || {
            current()
                .expect("injected work outside its worker")
                .drain_foreign()
        };
        self.shared.injected[self.worker].push(
            &self.shared,
            self.worker,
            Injected::Run(Box::new(drain)),
        );
    }
}

impl Worker {
    /// Queues `answer`, the answer of a request just handed to `trustee` of `runtime`, behind
    /// that trustee's earlier ones. It is delivered later, in this worker's loop, never here.
    pub(crate) fn await_foreign(
        &self,
        runtime: &Arc<Shared>,
        trustee: usize,
        answer: PendingAnswer,
    ) {
        let mut foreign = self.foreign.borrow_mut();
        let found = foreign
            .queues
            .iter()
            .position(|q| q.trustee == trustee && Arc::ptr_eq(&q.runtime, runtime));
        match found {
            Some(q) => foreign.queues[q].pending.push_back(answer),
            None => {
                foreign.queues.push(ForeignQueue {
                    runtime: runtime.clone(),
                    trustee,
                    pending: VecDeque::from([answer]),
                });
                // The new front must hold the waker: a drain polls it (and may find it
                // answered already).
                foreign.waker.wake_by_ref();
            }
        }
    }

    /// Delivers, queue by queue, every answer that has arrived and has no undelivered one
    /// before it; the first one still missing in a queue holds the waker.
    pub(super) fn drain_foreign(&self) {
        let waker = self.foreign.borrow().waker.clone();
        let mut cx = TaskContext::from_waker(&waker);
        let mut q = 0;
        loop {
            // No borrow is held while an answer is delivered: its `then` may queue more.
            let front = {
                let mut foreign = self.foreign.borrow_mut();
                let Some(queue) = foreign.queues.get_mut(q) else {
                    return;
                };
                match queue.pending.pop_front() {
                    Some(front) => front,
                    None => {
                        foreign.queues.swap_remove(q);
                        continue;
                    }
                }
            };
            let mut front = front;
            if front(&mut cx).is_pending() {
                // Not answered yet (and nothing ran): it stays first.
                self.foreign.borrow_mut().queues[q]
                    .pending
                    .push_front(front);
                q += 1;
            }
        }
    }

    /// Shutdown: drops the pending answers without delivering them.
    pub(super) fn discard_foreign(&self) {
        let queues = std::mem::take(&mut self.foreign.borrow_mut().queues);
        drop(queues);
    }
}
