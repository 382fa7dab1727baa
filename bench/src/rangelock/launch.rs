//! `launch`: each waiting request a fiber on the server, parked until its range is granted.
//! The client's lock call starts a fiber on the server node (`spawn_on`), which takes the
//! range from the trustee's table there and keeps the guard; the fiber's result answers the
//! client. This is what a program would write without deferred answers: the grant waits in a
//! fiber (a stack and a start per waiter) where `Deferred` keeps only a reply record.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::Range;

use gossamer::{Node, Trust};
use rangelock::{Guard, Mode, RangeLock};
use serde::{Deserialize, Serialize};

thread_local! {
    /// The guards the server's fibers hold, by id (the server has one worker).
    static HELD: RefCell<(u64, HashMap<u64, Guard>)> = RefCell::default();
}

/// The server-side lock, and a property on the same worker through which releases arrive.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct Launch {
    lock: RangeLock,
    releases: Trust<()>,
}

/// What a client holds: the id of the guard its server fiber keeps.
pub(crate) struct LaunchHeld(u64);

/// Runs in a fiber on the server: waits for the grant, keeps the guard.
fn take((lock, range, mode): (RangeLock, Range<u64>, Mode)) -> u64 {
    let guard = lock
        .lock(range, mode)
        .unwrap_or_else(|e| panic!("a workload's range: {e}"));
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        h.0 += 1;
        let id = h.0;
        h.1.insert(id, guard);
        id
    })
}

fn release(_: &mut (), id: u64) {
    let guard = HELD.with(|h| h.borrow_mut().1.remove(&id));
    drop(guard.unwrap_or_else(|| panic!("launch: release of {id}, which is not held")));
}

fn held(_: &mut (), (): ()) -> usize {
    HELD.with(|h| h.borrow().1.len())
}

impl Launch {
    /// A lock over `0..units` on `node`, which must have one worker (the guards live in
    /// that worker's thread).
    pub(crate) fn new(node: Node, units: u64) -> anyhow::Result<Launch> {
        anyhow::ensure!(node.workers() == 1, "launch wants a server of one worker");
        Ok(Launch {
            lock: RangeLock::entrust_on(node, units),
            releases: node.entrust(()),
        })
    }

    /// One round trip: the server fiber answers once granted.
    pub(crate) fn lock(&self, range: Range<u64>, mode: Mode, trips: &mut u64) -> LaunchHeld {
        *trips += 1;
        let id =
            gossamer::spawn_on(self.releases.node(), take, (self.lock.clone(), range, mode)).join();
        LaunchHeld(id)
    }

    /// Releases, not waiting.
    pub(crate) fn unlock(&self, held: LaunchHeld) {
        self.releases.apply_then_with(release, held.0, |()| {});
    }

    /// After every client has released: an error unless no guard is kept and the table is
    /// empty.
    pub(crate) fn check_idle(&self) -> anyhow::Result<()> {
        let guards = self.releases.apply_with(held, ());
        anyhow::ensure!(guards == 0, "launch: {guards} guards still kept");
        anyhow::ensure!(self.lock.requests() == 0, "launch: the table is not empty");
        Ok(())
    }
}
