//! Stopping a worker: after every worker has left its loop, three barrier-separated phases
//! hand every request, completion and fiber its drop, on the thread that owns it.

use std::sync::atomic::Ordering;

use super::Worker;

impl Worker {
    /// Runs after every worker left its loop. Three phases, separated by barriers so that no
    /// channel is touched by both sides at once:
    /// 1. trustees drop the requests of unanswered batches and answer them as cancelled, send
    ///    back unrun the forwarded groups they hold, end the deferred requests still waiting
    ///    as cancelled, and free the properties they were waiting to free; then, once every
    ///    group is back with its forwarder, answer their parked batches, whose records that
    ///    did not run are flagged cancelled (see `forward`);
    /// 2. clients drop staged requests, all completions, the answers awaited from other
    ///    runtimes and the late answers awaited without running callbacks, and dispose of
    ///    injected work;
    /// 3. every worker unwinds its fibers (running their destructors) on its own thread.
    pub(super) fn shutdown(&self) {
        let registry = &self.registry;
        // From here on nothing staged would ever be published: `stage` drops at once.
        self.tearing_down.set(true);
        registry.barrier.wait();
        if self.index == 0 {
            registry.closed.store(true, Ordering::SeqCst);
        }
        registry.barrier.wait();
        if self.is_trustee {
            for client in 0..registry.clients {
                if self.forwarding.is_parked(client) {
                    continue;
                }
                // SAFETY: every worker has left its loop, so no client publishes and no other
                // trustee serves this channel; the records are requests, none of them run.
                unsafe { registry.channel(client, self.index).cancel() };
            }
            self.return_groups_unrun();
            self.cancel_waiting();
            let frees: Vec<_> = self.pending_frees.borrow_mut().drain().collect();
            frees.into_iter().for_each(|d| self.free_now(d.property));
        }
        registry.barrier.wait();
        if self.is_trustee {
            self.cancel_parked();
        }
        registry.barrier.wait();
        for parker in registry.parkers.iter().skip(registry.workers) {
            parker.wake();
        }
        for &t in &registry.trustees {
            self.discard_lane(t);
        }
        self.run_callbacks(false);
        self.discard_foreign();
        self.discard_awaiting();
        for item in registry.injector(self.index).take() {
            item.discard();
        }
        registry.barrier.wait();
        let fibers = self.sched.with(|sched| sched.take_all());
        // Dropping a suspended coroutine unwinds its stack on this thread.
        drop(fibers);
    }
}
