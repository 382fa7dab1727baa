//! Stopping a worker: after every worker has left its loop, three barrier-separated phases
//! hand every request, completion and fiber its drop, on the thread that owns it.

use std::sync::atomic::Ordering;

use super::Worker;
use super::fibers::Fiber;
use crate::request::drop_raw_requests;

impl Worker {
    /// Runs after every worker left its loop. Three phases, separated by barriers so that no
    /// channel is touched by both sides at once:
    /// 1. trustees drop the requests of unanswered batches and answer them as cancelled, and
    ///    free the properties they were waiting to free;
    /// 2. clients drop staged requests, all completions and the answers awaited from other
    ///    runtimes without running callbacks, and dispose of injected work;
    /// 3. every worker unwinds its fibers (running their destructors) on its own thread.
    pub(super) fn shutdown(&self) {
        let shared = &self.shared;
        // From here on nothing staged would ever be published: `stage` drops at once.
        self.tearing_down.set(true);
        shared.barrier.wait();
        if self.index == 0 {
            shared.closed.store(true, Ordering::SeqCst);
        }
        shared.barrier.wait();
        if self.is_trustee {
            for client in 0..shared.clients {
                // SAFETY: every worker has left its loop, so no client publishes and no other
                // trustee serves this channel; the records are requests.
                unsafe {
                    shared
                        .channel(client, self.index)
                        .cancel(|words, len| drop_raw_requests(words, len))
                };
            }
            let frees: Vec<_> = self.pending_frees.borrow_mut().drain().collect();
            frees.into_iter().for_each(|p| self.free_now(p));
        }
        shared.barrier.wait();
        for parker in shared.parkers.iter().skip(shared.workers) {
            parker.wake();
        }
        for &t in &shared.trustees {
            self.discard_lane(t);
        }
        self.run_callbacks(false);
        self.discard_foreign();
        for item in shared.injected[self.index].take() {
            item.discard();
        }
        shared.barrier.wait();
        let fibers: Vec<Box<Fiber>> = {
            self.sched.with(|sched| {
                sched.ready.clear();
                sched
                    .fibers
                    .iter_mut()
                    .filter_map(|slot| slot.fiber.take())
                    .collect()
            })
        };
        // Dropping a suspended coroutine unwinds its stack on this thread.
        drop(fibers);
    }
}
