//! A property on another rank, as this rank's handles name it: its export's [`Target`], and
//! the [`Remote`] share of one ticket that all of this process's handles under it hold.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::export::{Target, Ticket};
use crate::link::{self, Control};
use crate::op::Op;
use crate::redirect::{self, Route};
use crate::state;

/// The handles of one process to one remote property under one ticket. Dropping it releases
/// the ticket.
#[derive(Debug)]
pub(crate) struct Remote {
    /// The export the handles name: on the property's first home.
    pub(crate) target: Target,
    pub(crate) ticket: Ticket,
    /// Where calls through them go (see `redirect`).
    route: Arc<Route>,
}

impl Remote {
    /// The handles under `ticket` to the property `target` names. A ticket a third node
    /// minted (not the property's home) is noted among those this node holds, until the
    /// handles drop: what this node answers a home that asks whether it holds it (see
    /// `export`). `marker` does nothing on the property (`call::marker_op`).
    pub(crate) fn new(target: Target, ticket: Ticket, marker: &'static Op) -> Remote {
        Remote::with_route(target, ticket, Route::of(target, marker))
    }

    /// The handles under `ticket` to a property that is not the type they were sent as:
    /// refused on arrival, held only to release the ticket, and never told of moves.
    pub(crate) fn mistyped(target: Target, ticket: Ticket, marker: &'static Op) -> Remote {
        Remote::with_route(target, ticket, Route::detached(target, marker))
    }

    fn with_route(target: Target, ticket: Ticket, route: Arc<Route>) -> Remote {
        if ticket.minter.rank != target.node
            && let Some(state) = state::current()
        {
            lock_held(&state).insert(ticket);
        }
        Remote {
            target,
            ticket,
            route,
        }
    }

    /// Where this worker's next call through the handles goes: the export, or straight to
    /// where its property moved (see `redirect`). A fiber may wait here for room on that
    /// link, so that it stages right after, with no yield in between.
    #[inline]
    pub(crate) fn call_target(&self) -> Target {
        self.route.target()
    }
}

/// The tickets of remote handles this node holds that a third node minted.
pub(crate) fn lock_held(
    state: &state::RackState,
) -> std::sync::MutexGuard<'_, std::collections::HashSet<Ticket>> {
    state.held_tickets.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for Remote {
    fn drop(&mut self) {
        let Some(state) = state::current() else {
            return;
        };
        if self.ticket.minter.rank != self.target.node {
            lock_held(&state).remove(&self.ticket);
        }
        if state.ending.load(Ordering::SeqCst) {
            return; // every node drops its exports at the end
        }
        if Arc::strong_count(&self.route) == 1 {
            redirect::drain(self.route.clone());
        }
        // Read the counts here, after every use of the handle.
        let (t, ticket) = (self.target, self.ticket);
        let sent = state.sent_to(t.node, t.worker);
        let release = move || {
            // A fiber spawned below may run after its worker left the rack at the job's end:
            // every node drops its exports then, and nobody is left to tell.
            if !link::is_rack_worker() {
                return;
            }
            let message = Control::Release {
                slot: t.slot,
                generation: t.generation,
                ticket,
                sent,
            };
            link::control(t.node, t.worker, t.incarnation, &message)
        };
        if link::is_rack_worker() {
            release();
        } else {
            drop(state.handle.spawn(release));
        }
    }
}
