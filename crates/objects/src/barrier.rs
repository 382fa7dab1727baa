//! [`Barrier`]: the seed's barrier (§4), on a [`SharedArray`] of counts.

use std::fmt;

use gossamer::RegionError;

use crate::error::OpenError;
use crate::fabric::{Fabric, Rack};
use crate::object::{Declare, Object, Parts};
use crate::var::{SharedArray, fence_all};
use crate::work::Work;

/// A barrier among an object's members. Opening one makes this node a member, and only a
/// member holds one: the type is the role (`Send`, never `Clone`).
///
/// [`wait`](Barrier::wait): every operation each member issued before its `wait` has landed
/// when any member leaves it, on whichever node it went to. It fences *every* node of the
/// job, not only the members (§4.3 of the seed: fencing only the members would not make the
/// barrier transitive: a put to a third node could still be in flight), bumps this member's
/// count, broadcasts it, and waits until every member's count has reached its own.
///
/// [`wait_unfenced`](Barrier::wait_unfenced) skips the fence: MPI_Barrier's meaning (every
/// member arrived), with no promise about operations in flight.
///
/// ```
/// let code = gossamer::Rack::from_env().run(|| {
///     let members: Vec<_> = gossamer::nodes().collect();
///     objects::on_members(&members, |members| {
///         let mut barrier = objects::open::<objects::Barrier>("doc-barrier", &(), &members).unwrap();
///         let slot = objects::open::<objects::SharedArray>("doc-barrier-data", &1, &members).unwrap();
///         if slot.me() == 0 {
///             // Put 42 in every other member's replica, and do not wait for it.
///             slot.store(0, 42);
///             slot.broadcast(0, &objects::Work::new());
///         }
///         barrier.wait().unwrap();
///         assert_eq!(slot.load(0), 42, "the put landed before anyone left the barrier");
///     });
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
pub struct Barrier<F: Fabric = Rack> {
    counts: SharedArray<F>,
    count: u64,
}

impl<F: Fabric> Object<F> for Barrier<F> {
    type Params = ();

    fn declare(d: &mut Declare, (): &()) {
        let members = d.members();
        d.object::<F, SharedArray<F>>("sst", &members);
    }

    fn build(parts: Parts<F>, (): &()) -> Result<Self, OpenError> {
        let members = parts.members().len();
        Ok(Barrier {
            counts: parts.object("sst", &members)?,
            count: 0,
        })
    }
}

/// What a barrier fences before it counts itself in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fence {
    /// Every node of the job: [`Barrier::wait`].
    All,
    /// Only the members: the seed's §4.1 barrier, not transitive (tests only).
    #[cfg(all(test, not(loom)))]
    Members,
    /// Nothing: [`Barrier::wait_unfenced`]; as the seed's first bug (App. D), a fenced barrier
    /// made this way synchronises only pairs of nodes.
    Nothing,
}

impl<F: Fabric> Barrier<F> {
    /// Waits until every member has reached its matching `wait`, with every operation issued
    /// before it by any member landed (see the type's docs).
    ///
    /// # Errors
    /// A fence or the count's broadcast failed (a member's region is gone: it left).
    pub fn wait(&mut self) -> Result<(), RegionError> {
        self.enter(Fence::All)
    }

    /// Waits until every member has reached its matching `wait_unfenced`; operations in
    /// flight may still be (MPI_Barrier's meaning).
    ///
    /// # Errors
    /// As [`wait`](Barrier::wait).
    pub fn wait_unfenced(&mut self) -> Result<(), RegionError> {
        self.enter(Fence::Nothing)
    }

    /// This member's index.
    pub fn me(&self) -> usize {
        self.counts.me()
    }

    /// How many times this member has passed the barrier.
    pub fn passed(&self) -> u64 {
        self.count
    }

    pub(crate) fn enter(&mut self, fence: Fence) -> Result<(), RegionError> {
        let fabric = self.counts.regions().fabric().clone();
        let work = Work::new();
        match fence {
            Fence::All => fence_all(&fabric, &work),
            #[cfg(all(test, not(loom)))]
            Fence::Members => {
                let regions = self.counts.regions();
                for m in 0..regions.members() {
                    fabric.fence_in(fabric.node_of(regions.of(m)), &work);
                }
            }
            Fence::Nothing => {}
        }
        work.wait()?;
        self.count += 1;
        let me = self.me();
        self.counts.store(me, self.count);
        self.counts.broadcast(me, &work);
        // No need to wait for the broadcast before waiting for the others (§4.2): a member
        // may leave before the others know it arrived.
        for m in 0..self.counts.members() {
            while self.counts.load(m) < self.count {
                fabric.relax();
            }
        }
        work.wait()
    }
}

impl<F: Fabric> fmt::Debug for Barrier<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Barrier")
            .field("me", &self.me())
            .field("passed", &self.count)
            .finish()
    }
}
