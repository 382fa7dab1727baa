//! Running a worker's fibers: starting them on pooled stacks, resuming the ready ones, and
//! blocking, yielding and waking them (the fiber table itself is in `scheduler`). Fibers never
//! leave their worker's thread.

use corosensei::stack::{DefaultStack, Stack};
use corosensei::{CoroutineResult, Yielder};

use super::scheduler::{Fiber, Resumed};
use super::{Running, Worker, current};
use crate::inject::FiberId;

/// Fibers a trustee worker runs between two serving passes.
const SERVE_EVERY: usize = 8;

impl Worker {
    /// Starts a fiber on this worker.
    pub(crate) fn spawn_local(&self, body: Box<dyn FnOnce() + 'static>) {
        let stack = match self.sched.with(|sched| sched.pooled_stack()) {
            Some(stack) => stack,
            None => DefaultStack::new(self.registry.stack_size)
                .unwrap_or_else(|e| panic!("trust: cannot allocate a fiber stack: {e}")),
        };
        let guard = crate::overflow::guard_page(stack.limit().get());
        let index = self.sched.with(|sched| sched.reserve_slot());
        let fiber = Box::new(Fiber::with_stack(
            stack,
            move |yielder: &Yielder<(), ()>, ()| {
                let w = current().expect("fiber resumed outside its worker");
                w.yielder.set(yielder);
                w.sched.with(|sched| sched.set_yielder(index, yielder));
                body();
            },
        ));
        self.sched.with(|sched| sched.start(index, fiber, guard));
    }

    pub(super) fn run_ready(&self) -> bool {
        let n = self.sched.with(|sched| sched.ready_len());
        for ran in 0..n {
            if self.is_trustee && ran > 0 && ran % SERVE_EVERY == 0 {
                // Other clients' requests should not wait for every local fiber to run.
                self.serve();
            }
            let Some(next) = self.sched.with(|sched| sched.next_ready()) else {
                break;
            };
            let Some(Resumed {
                id,
                fiber,
                guard,
                yielder,
            }) = next
            else {
                continue;
            };
            crate::overflow::set_running(Some(guard));
            self.current.set(Some(id));
            self.yielder.set(yielder);
            let result = {
                let _fiber = self.enter(Running::Fiber);
                // SAFETY: the slot's coroutine stays allocated and in place while it runs
                // (see `Resumed`); only this worker's thread uses it, and nothing else
                // references it during the resume.
                unsafe { (*fiber.as_ptr()).resume(()) }
            };
            crate::overflow::set_running(None);
            self.current.set(None);
            match result {
                CoroutineResult::Yield(()) => {}
                CoroutineResult::Return(()) => self.sched.with(|sched| sched.finished(id)),
            }
        }
        n > 0
    }

    /// The fiber running now.
    ///
    /// # Panics
    /// Outside a fiber.
    pub(crate) fn current_fiber(&self) -> FiberId {
        self.current.get().expect("not inside a fiber")
    }

    fn suspend(&self) {
        let yielder = self.yielder.get();
        debug_assert!(!yielder.is_null());
        // SAFETY: `yielder` belongs to the running fiber (set by `run_ready` before resuming
        // it, or by the fiber itself on its first run) and lives on that fiber's stack.
        unsafe { (*yielder).suspend(()) };
    }

    /// Suspends the current fiber until [`Worker::wake`]. May return early; callers re-check
    /// their condition in a loop.
    pub(crate) fn block(&self) {
        debug_assert_eq!(self.running.get(), Running::Fiber);
        let id = self.current_fiber();
        if self.sched.with(|sched| sched.block(id)) {
            self.suspend();
        }
    }

    /// Lets the other ready fibers run.
    pub(crate) fn yield_now(&self) {
        let id = self.current_fiber();
        self.sched.with(|sched| sched.yield_now(id));
        self.suspend();
    }

    /// Makes fiber `id` of this worker ready if it is blocked.
    pub(crate) fn wake(&self, id: FiberId) {
        self.sched.with(|sched| sched.wake(id));
    }
}
