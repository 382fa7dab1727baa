//! The fiber table of one worker: which fibers exist, which are ready, and the state machine
//! that blocking, yielding and waking drive. Plain data on the worker's thread; running the
//! fibers is in `fibers`.

use std::collections::VecDeque;
use std::ptr::{self, NonNull};

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, Yielder};

use crate::inject::FiberId;

/// Fiber stacks kept for reuse per worker.
const STACK_POOL: usize = 256;

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

struct FiberSlot {
    /// The coroutine, allocated on its own (a leaked `Box`) so that it stays put while
    /// the table grows: a running fiber is resumed through this pointer (see [`Resumed`]).
    /// Owned by the slot; given back as a box by [`Scheduler::finished`] and
    /// [`Scheduler::take_all`].
    fiber: Option<NonNull<Fiber>>,
    /// The guard page below the fiber's stack, for the overflow report.
    guard: (usize, usize),
    yielder: *const Yielder<(), ()>,
    generation: u32,
    state: FiberState,
}

/// A ready fiber about to run. Its coroutine stays in its slot: `fiber` is the slot's pointer,
/// whose allocation nothing moves or frees while the fiber runs (only [`Scheduler::finished`],
/// after it returned, and [`Scheduler::take_all`], at shutdown outside any fiber, free it).
pub(super) struct Resumed {
    pub(super) id: FiberId,
    pub(super) fiber: NonNull<Fiber>,
    pub(super) guard: (usize, usize),
    pub(super) yielder: *const Yielder<(), ()>,
}

#[derive(Default)]
pub(super) struct Scheduler {
    ready: VecDeque<FiberId>,
    fibers: Vec<FiberSlot>,
    free_slots: Vec<u32>,
    stacks: Vec<DefaultStack>,
}

impl Scheduler {
    /// A pooled stack, if any.
    pub(super) fn pooled_stack(&mut self) -> Option<DefaultStack> {
        self.stacks.pop()
    }

    /// A free slot for a new fiber (see [`Scheduler::start`]).
    pub(super) fn reserve_slot(&mut self) -> u32 {
        match self.free_slots.pop() {
            Some(i) => i,
            None => {
                self.fibers.push(FiberSlot {
                    fiber: None,
                    guard: (0, 0),
                    yielder: ptr::null(),
                    generation: 0,
                    state: FiberState::Free,
                });
                (self.fibers.len() - 1) as u32
            }
        }
    }

    /// Puts a new fiber in slot `index` (from `reserve_slot`) and makes it ready.
    pub(super) fn start(&mut self, index: u32, fiber: Box<Fiber>, guard: (usize, usize)) {
        let slot = &mut self.fibers[index as usize];
        slot.fiber = Some(NonNull::from(Box::leak(fiber)));
        slot.guard = guard;
        slot.state = FiberState::Ready;
        let id = FiberId {
            index,
            generation: slot.generation,
        };
        self.ready.push_back(id);
    }

    /// Records the yielder of the fiber in slot `index` (set by the fiber on its first run).
    pub(super) fn set_yielder(&mut self, index: u32, yielder: *const Yielder<(), ()>) {
        self.fibers[index as usize].yielder = yielder;
    }

    /// Fibers ready to run.
    pub(super) fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// Fibers alive: ready, running or blocked.
    pub(super) fn alive(&self) -> usize {
        self.fibers.len() - self.free_slots.len()
    }

    /// Marks the next ready fiber running: `None` when none is ready, `Some(None)` for a stale
    /// entry.
    pub(super) fn next_ready(&mut self) -> Option<Option<Resumed>> {
        let id = self.ready.pop_front()?;
        let slot = &mut self.fibers[id.index as usize];
        if slot.generation != id.generation || slot.state != FiberState::Ready {
            return Some(None);
        }
        slot.state = FiberState::Running;
        let fiber = slot.fiber.expect("ready fiber without a coroutine");
        Some(Some(Resumed {
            id,
            fiber,
            guard: slot.guard,
            yielder: slot.yielder,
        }))
    }

    /// Frees the slot of a fiber that returned, keeping its stack for reuse.
    pub(super) fn finished(&mut self, id: FiberId) {
        let slot = &mut self.fibers[id.index as usize];
        let fiber = slot.fiber.take().expect("a finished fiber is in its slot");
        // SAFETY: the slot owned this allocation from `Box::leak` in `start`, and the fiber
        // returned, so nothing points into it any more.
        let stack = unsafe { Box::from_raw(fiber.as_ptr()) }.into_stack();
        slot.state = FiberState::Free;
        slot.generation = slot.generation.wrapping_add(1);
        slot.yielder = ptr::null();
        self.free_slots.push(id.index);
        if self.stacks.len() < STACK_POOL {
            self.stacks.push(stack);
        }
    }

    /// The running fiber `id` is about to block: returns false if it was woken meanwhile
    /// (then it must not suspend).
    #[inline]
    pub(super) fn block(&mut self, id: FiberId) -> bool {
        let slot = &mut self.fibers[id.index as usize];
        if slot.state == FiberState::Notified {
            slot.state = FiberState::Running;
            return false;
        }
        slot.state = FiberState::Blocked;
        true
    }

    /// The running fiber `id` yields: it goes to the back of the ready queue.
    pub(super) fn yield_now(&mut self, id: FiberId) {
        self.fibers[id.index as usize].state = FiberState::Ready;
        self.ready.push_back(id);
    }

    /// Makes fiber `id` ready if it is blocked (stale ids are ignored).
    #[inline]
    pub(super) fn wake(&mut self, id: FiberId) {
        let Some(slot) = self.fibers.get_mut(id.index as usize) else {
            return;
        };
        if slot.generation != id.generation {
            return;
        }
        match slot.state {
            FiberState::Blocked => {
                slot.state = FiberState::Ready;
                self.ready.push_back(id);
            }
            FiberState::Running => slot.state = FiberState::Notified,
            FiberState::Ready | FiberState::Notified | FiberState::Free => {}
        }
    }

    /// Whether a fiber is ready.
    pub(super) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Shutdown: takes every fiber out, to be dropped (unwound) by the caller.
    #[allow(clippy::vec_box)] // kept in the boxes they live in: they are only dropped
    pub(super) fn take_all(&mut self) -> Vec<Box<Fiber>> {
        self.ready.clear();
        self.fibers
            .iter_mut()
            .filter_map(|slot| slot.fiber.take())
            // SAFETY: as in `finished`: owned by the slot, and no fiber runs at shutdown.
            .map(|fiber| unsafe { Box::from_raw(fiber.as_ptr()) })
            .collect()
    }
}

/// Frees the fibers still in the table, as the boxes they were would have been freed: a worker's
/// shutdown takes them first (`take_all`), so this only matters to a table dropped without one.
impl Drop for Scheduler {
    fn drop(&mut self) {
        drop(self.take_all());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn dropping_the_table_frees_its_fibers() {
        let held = Rc::new(());
        let inside = held.clone();
        let mut sched = Scheduler::default();
        let index = sched.reserve_slot();
        let fiber = Box::new(Fiber::new(move |_: &Yielder<(), ()>, ()| drop(inside)));
        sched.start(index, fiber, (0, 0));
        assert_eq!(Rc::strong_count(&held), 2, "the fiber holds its closure");
        drop(sched);
        assert_eq!(
            Rc::strong_count(&held),
            1,
            "the fiber was freed with the table"
        );
    }
}
