//! [`Work`]: the completion group of a fiber's one-sided operations (the seed's work id).

use std::cell::{Cell, RefCell};
use std::fmt;
use std::rc::Rc;

use gossamer::RegionError;

/// What an operation's completion is handed: its result.
pub type Then<T> = Box<dyn FnOnce(Result<T, RegionError>)>;

/// A group of one-sided operations to wait for together: what an object's methods that issue
/// operations take (`var.broadcast(&work)`), as the seed's work identifiers.
///
/// [`wait`](Work::wait) suspends only the calling fiber until every operation tracked so far
/// has completed and returns the first error among them; [`then`](Work::then) runs a callback
/// then instead, which is allowed in delegated context. Completions run in the worker's loop
/// (no polling thread). A completed put means its words were read, not that they landed
/// (the memory model of [`gossamer::region`]); fences and barriers make them land.
///
/// A `Work` belongs to its worker (neither `Send` nor `Sync`); clones share one group.
///
/// ```
/// let code = gossamer::Rack::from_env().run(|| {
///     let members: Vec<_> = gossamer::nodes().collect();
///     objects::on_members(&members, |members| {
///         let mut count = objects::open::<objects::SharedVar<u64>>("doc-work", &(), &members).unwrap();
///         let work = objects::Work::new();
///         count.store(3);
///         count.broadcast(&work);
///         work.wait().unwrap();
///     });
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
#[derive(Clone, Default)]
pub struct Work {
    inner: Rc<Inner>,
}

#[derive(Default)]
struct Inner {
    group: trust::Group,
    pending: Cell<usize>,
    error: RefCell<Option<RegionError>>,
    then: RefCell<Vec<Then<()>>>,
}

impl Work {
    /// An empty group.
    pub fn new() -> Work {
        Work::default()
    }

    /// Counts an operation: the returned completion runs `done` with its result, records the
    /// first error, and runs the group's callbacks when it was the last one pending.
    pub(crate) fn track<T: 'static>(
        &self,
        done: impl FnOnce(Result<T, RegionError>) + 'static,
    ) -> Then<T> {
        let inner = self.inner.clone();
        inner.pending.set(inner.pending.get() + 1);
        let tracked = self
            .inner
            .group
            .track(move |result: Result<T, RegionError>| {
                if let Err(e) = &result {
                    inner.error.borrow_mut().get_or_insert_with(|| e.clone());
                }
                done(result);
                inner.pending.set(inner.pending.get() - 1);
                if inner.pending.get() == 0 {
                    let then = std::mem::take(&mut *inner.then.borrow_mut());
                    for f in then {
                        f(inner.error.borrow().clone().map_or(Ok(()), Err));
                    }
                }
            });
        Box::new(tracked)
    }

    /// A completion that only counts (for puts and fences).
    pub(crate) fn count<T: 'static>(&self) -> Then<T> {
        self.track(|_| {})
    }

    /// Keeps the outcome of an operation that completed at issue, as if it had been tracked:
    /// its error, if any, is the group's (when it is the first).
    pub(crate) fn record(&self, result: Result<(), RegionError>) {
        if let Err(e) = result {
            self.inner.error.borrow_mut().get_or_insert(e);
        }
    }

    /// How many tracked operations have not completed.
    pub fn pending(&self) -> usize {
        self.inner.pending.get()
    }

    /// Whether every tracked operation has completed.
    pub fn is_done(&self) -> bool {
        self.pending() == 0
    }

    /// Suspends the calling fiber until every operation tracked so far has completed; the
    /// first error since the last `wait` (a region gone, a word out of bounds), if any.
    ///
    /// # Panics
    /// In delegated context while operations are pending: use [`then`](Work::then) there.
    pub fn wait(&self) -> Result<(), RegionError> {
        self.inner.group.wait();
        self.take_error()
    }

    /// Runs `f` with the group's outcome once nothing is pending: at once if nothing is.
    /// Allowed in delegated context.
    pub fn then(&self, f: impl FnOnce(Result<(), RegionError>) + 'static) {
        if self.is_done() {
            f(self.take_error());
        } else {
            self.inner.then.borrow_mut().push(Box::new(f));
        }
    }

    fn take_error(&self) -> Result<(), RegionError> {
        self.inner.error.borrow_mut().take().map_or(Ok(()), Err)
    }
}

impl fmt::Debug for Work {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Work")
            .field("pending", &self.pending())
            .finish()
    }
}

/// Where a tracked operation's value lands, to be taken after its `Work` completed.
pub(crate) struct Landing<T>(Rc<RefCell<Option<Result<T, RegionError>>>>);

impl<T: 'static> Landing<T> {
    pub(crate) fn new() -> Landing<T> {
        Landing(Rc::new(RefCell::new(None)))
    }

    /// The completion that fills it, tracked in `work`.
    pub(crate) fn fill(&self, work: &Work) -> Then<T> {
        let slot = self.0.clone();
        work.track(move |r| *slot.borrow_mut() = Some(r))
    }

    /// The value, once the operation completed.
    pub(crate) fn take(&self) -> Option<Result<T, RegionError>> {
        self.0.borrow_mut().take()
    }
}
