//! The fiber scheduler of one worker: starting fibers on pooled stacks, running the ready
//! ones, and blocking, yielding and waking them. Fibers never leave their worker's thread.

use std::collections::VecDeque;
use std::ptr;

use corosensei::stack::{DefaultStack, Stack};
use corosensei::{Coroutine, CoroutineResult, Yielder};

use super::{Context, Worker, current};

/// Fibers a trustee worker runs between two serving passes.
const SERVE_EVERY: usize = 8;
/// Fiber stacks kept for reuse per worker.
const STACK_POOL: usize = 256;

/// Identifies a fiber on its worker; the generation makes stale wake-ups harmless.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FiberId {
    index: u32,
    generation: u32,
}

pub(super) type Fiber = Coroutine<(), (), (), DefaultStack>;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FiberState {
    Free,
    Ready,
    Running,
    /// Running, and woken before it blocked: its next `block` returns at once.
    Notified,
    Blocked,
}

pub(super) struct FiberSlot {
    /// Boxed, so that taking it out to resume it moves one pointer.
    pub(super) fiber: Option<Box<Fiber>>,
    /// The guard page below the fiber's stack, for the overflow report.
    guard: (usize, usize),
    yielder: *const Yielder<(), ()>,
    generation: u32,
    state: FiberState,
}

#[derive(Default)]
pub(super) struct Scheduler {
    pub(super) ready: VecDeque<FiberId>,
    pub(super) fibers: Vec<FiberSlot>,
    free_slots: Vec<u32>,
    stacks: Vec<DefaultStack>,
}

impl Worker {
    /// Starts a fiber on this worker.
    pub(crate) fn spawn_local(&self, body: Box<dyn FnOnce() + 'static>) {
        let stack = match self.sched.with(|sched| sched.stacks.pop()) {
            Some(stack) => stack,
            None => DefaultStack::new(self.shared.stack_size)
                .unwrap_or_else(|e| panic!("gossamer: cannot allocate a fiber stack: {e}")),
        };
        let guard = crate::overflow::guard_page(stack.limit().get());
        let index = self.sched.with(|sched| match sched.free_slots.pop() {
            Some(i) => i,
            None => {
                sched.fibers.push(FiberSlot {
                    fiber: None,
                    guard: (0, 0),
                    yielder: ptr::null(),
                    generation: 0,
                    state: FiberState::Free,
                });
                (sched.fibers.len() - 1) as u32
            }
        });
        let fiber = Box::new(Fiber::with_stack(
            stack,
            move |yielder: &Yielder<(), ()>, ()| {
                let w = current().expect("fiber resumed outside its worker");
                w.yielder.set(yielder);
                w.sched
                    .with(|sched| sched.fibers[index as usize].yielder = yielder);
                body();
            },
        ));
        self.sched.with(|sched| {
            let slot = &mut sched.fibers[index as usize];
            slot.fiber = Some(fiber);
            slot.guard = guard;
            slot.state = FiberState::Ready;
            let id = FiberId {
                index,
                generation: slot.generation,
            };
            sched.ready.push_back(id);
        });
    }

    pub(super) fn run_ready(&self) -> bool {
        let n = self.sched.with(|sched| sched.ready.len());
        for ran in 0..n {
            if self.is_trustee && ran > 0 && ran % SERVE_EVERY == 0 {
                // Other clients' requests should not wait for every local fiber to run.
                self.serve();
            }
            let next = self.sched.with(|sched| {
                let id = sched.ready.pop_front()?;
                let slot = &mut sched.fibers[id.index as usize];
                if slot.generation != id.generation || slot.state != FiberState::Ready {
                    return Some(None);
                }
                slot.state = FiberState::Running;
                crate::overflow::set_running(Some(slot.guard));
                let fiber = slot.fiber.take().expect("ready fiber without a coroutine");
                Some(Some((id, fiber, slot.yielder)))
            });
            let Some(next) = next else { break };
            let Some((id, mut fiber, yielder)) = next else {
                continue;
            };
            self.current.set(Some(id));
            self.yielder.set(yielder);
            let result = {
                let _fiber = self.enter(Context::Fiber);
                fiber.resume(())
            };
            crate::overflow::set_running(None);
            self.current.set(None);
            let finished = self.sched.with(|sched| {
                let slot = &mut sched.fibers[id.index as usize];
                match result {
                    CoroutineResult::Yield(()) => {
                        slot.fiber = Some(fiber);
                        None
                    }
                    CoroutineResult::Return(()) => {
                        slot.state = FiberState::Free;
                        slot.generation = slot.generation.wrapping_add(1);
                        slot.yielder = ptr::null();
                        sched.free_slots.push(id.index);
                        Some(fiber)
                    }
                }
            });
            if let Some(fiber) = finished {
                let stack = fiber.into_stack();
                self.sched.with(|sched| {
                    if sched.stacks.len() < STACK_POOL {
                        sched.stacks.push(stack);
                    }
                });
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
        debug_assert_eq!(self.context.get(), Context::Fiber);
        let id = self.current_fiber();
        let notified = self.sched.with(|sched| {
            let slot = &mut sched.fibers[id.index as usize];
            if slot.state == FiberState::Notified {
                slot.state = FiberState::Running;
                return true;
            }
            slot.state = FiberState::Blocked;
            false
        });
        if !notified {
            self.suspend();
        }
    }

    /// Lets the other ready fibers run.
    pub(crate) fn yield_now(&self) {
        let id = self.current_fiber();
        self.sched.with(|sched| {
            sched.fibers[id.index as usize].state = FiberState::Ready;
            sched.ready.push_back(id);
        });
        self.suspend();
    }

    /// Makes fiber `id` of this worker ready if it is blocked.
    pub(crate) fn wake(&self, id: FiberId) {
        self.sched.with(|sched| {
            let Some(slot) = sched.fibers.get_mut(id.index as usize) else {
                return;
            };
            if slot.generation != id.generation {
                return;
            }
            match slot.state {
                FiberState::Blocked => {
                    slot.state = FiberState::Ready;
                    sched.ready.push_back(id);
                }
                FiberState::Running => slot.state = FiberState::Notified,
                FiberState::Ready | FiberState::Notified | FiberState::Free => {}
            }
        });
    }
}
