//! Moving a property to a trustee of another rank: [`Trust::migrate_to`].
//!
//! The property's first home (the rank it was made on) runs every move of it and forwards
//! to it afterwards (see `moved` for the forwarding and why calls keep their order). A move,
//! in a fiber there:
//!
//! 1. holds the calls of every worker of the first home ([`Moved::begin`]);
//! 2. makes a marker call from each worker to where the value lives, and waits for them: what
//!    each worker sent there before has run; meanwhile revokes the switches of the callers
//!    on other ranks it told where the value lives (see `redirect`), which waits until
//!    their direct calls ran;
//! 3. takes the value out: [`trust::Trust::withdraw`] where it lives on this rank, or
//!    [`WithdrawOp`] on the rank that holds it, which answers it;
//! 4. places it on the trustee asked for: entrusted there (`EntrustOp`, exported to this rank
//!    under a ticket the forward holds), or here;
//! 5. points the forward there and releases each worker, which sends the calls it held on
//!    first ([`Moved::end`]). The old place's export goes with the old forward.
//!
//! A move from another rank asks the first home to make it ([`MigrateOp`]). A value that
//! could not be placed where asked (that rank was lost or refused it) is placed back on this
//! rank, and the move fails: nothing is lost but the handles its encoding minted for the
//! lost destination. A value that cannot be taken out (pinned, fixed) stays where it is.

use std::any::type_name;
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::call::{self, EntrustOp, Failure, on_rack};
use crate::codec::{self, Wire};
use crate::export::Target;
use crate::export::{Shared, Ticket};
use crate::link::{self, OnAnswer};
use crate::moved::{At, Moved};
use crate::node::Trustee;
use crate::op::{self, Op, Reply, Run};
use crate::proxy::{BLOCKING, Trust};
use crate::redirect;
use crate::remote::Remote;
use crate::state;

/// Why a property did not move ([`Trust::migrate_to`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MigrateError {
    /// A fiber started by `launch` works on it, or a deferred request on it waits for its
    /// reply: it stays until they end.
    Pinned {
        /// How many hold it.
        pins: u32,
    },
    /// It is fixed to its trustee for good: a durable property, whose log is written there,
    /// stays with its log.
    Fixed,
    /// The move failed on its way: the destination was lost or refused the value (which is
    /// then back on the property's first home), or the rank holding it was lost (with it).
    Failed(String),
}

impl std::fmt::Display for MigrateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MigrateError::Pinned { pins } => write!(
                f,
                "cannot move the property now: it is pinned to its trustee by {pins} launched \
                 fiber(s) or deferred request(s) waiting for a reply"
            ),
            MigrateError::Fixed => f.write_str(
                "cannot move the property: it is fixed to its trustee (a durable property \
                 stays where its log is)",
            ),
            MigrateError::Failed(why) => write!(f, "the property did not move: {why}"),
        }
    }
}

impl std::error::Error for MigrateError {}

impl From<trust::MigrateError> for MigrateError {
    fn from(e: trust::MigrateError) -> Self {
        match e {
            trust::MigrateError::Pinned { pins } => MigrateError::Pinned { pins },
            trust::MigrateError::Fixed => MigrateError::Fixed,
            other => MigrateError::Failed(other.to_string()),
        }
    }
}

impl<T: Wire> Trust<T> {
    /// Moves the property to trustee `to` (of this rank or another), and returns once it
    /// lives there. Handles to it anywhere keep working: calls through them go to the rank
    /// the property was made on, which forwards them, at most one hop, to wherever it lives
    /// now, and tells the calling worker of another rank where that is; the worker's later
    /// calls go there directly, once those it sent through the first home have run. Calls
    /// made before the move, during it and after it are neither lost nor run twice, and
    /// each client's (a fiber's, or a rank's worker's) keep their order.
    ///
    /// ```
    /// let code = gossamer::Rack::from_env().workers(2).run(|| {
    ///     let total = gossamer::entrust(0u64);
    ///     total.apply_with(|t, x: u64| *t += x, 5);
    ///     let last = gossamer::nodes().last().unwrap();
    ///     total.migrate_to(last.trustee(1)).unwrap();
    ///     assert_eq!(total.node(), last);
    ///     assert_eq!(total.apply(|t| *t), 5);
    /// });
    /// assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// ```
    ///
    /// A property moved to another rank is not on this one any more: [`Trust::local`] is
    /// `None` then, and the `trust::Trust` it gave before panics when called (the value left
    /// it). A call from outside the rack's workers, in a rack of several ranks, goes through
    /// a fiber of the rack.
    ///
    /// # Errors
    /// [`MigrateError::Pinned`] while a fiber started by `launch` works on it or a deferred
    /// request waits for its reply, [`MigrateError::Fixed`] for a durable property (it stays
    /// with its log), [`MigrateError::Failed`] if a rank was lost on the way.
    ///
    /// # Panics
    /// In delegated context, where waiting would stall a trustee.
    #[track_caller]
    pub fn migrate_to(&self, to: Trustee) -> Result<(), MigrateError> {
        if trust::in_delegated_context() {
            panic!("{BLOCKING}");
        }
        let (rank, worker) = (to.node().rank(), to.worker());
        if let Some(first) = self.first_property() {
            if state::several_ranks() && !link::is_rack_worker() {
                let this = self.clone();
                return on_rack(move || this.migrate_to(to));
            }
            return migrate(first, rank, worker);
        }
        let Some(home) = self.remote_target() else {
            unreachable!("a handle is local or remote")
        };
        if !link::is_rack_worker() {
            let this = self.clone();
            return on_rack(move || this.migrate_to(to));
        }
        // The first home makes the move.
        let bytes = codec::encode(home.life(), &(rank, worker));
        let op = MigrateOp::<T>::OP;
        let answer: Result<Result<(), MigrateError>, Failure> = call::wait_for_try(|on_answer| {
            let property = Some((home.slot, home.generation));
            link::call(
                home.node,
                home.worker,
                Some(home.incarnation),
                op,
                property,
                bytes.as_slice(),
                on_answer,
            )
        });
        answer.unwrap_or_else(|e| Err(MigrateError::Failed(e.to_string())))
    }
}

/// Moves the property `first` (made on this rank) to `(rank, worker)`, in a fiber of this
/// rank's rack (see the module docs).
fn migrate<T: Wire>(first: &trust::Trust<T>, rank: u32, worker: u32) -> Result<(), MigrateError> {
    let state = state::current().expect("a property outlived its rack");
    let workers = state.workers[rank as usize];
    if worker >= workers {
        return Err(MigrateError::Failed(format!(
            "rank {rank} has workers 0..{workers}, not {worker}"
        )));
    }
    let moved = crate::moved::moved(first);
    if rank == state.rank && moved.is_none() {
        // It never left: a move between this rank's trustees.
        return first
            .migrate_to(worker as usize)
            .map_err(MigrateError::from);
    }
    let moved = moved.unwrap_or_else(|| Moved::of(first, state.handle.workers()));
    let (at, first_move, told) = moved.begin(first);
    let handle = &state.handle;
    let markers: Vec<_> = (0..handle.workers())
        .map(|w| {
            let at = at.clone();
            handle.spawn_on(w, move || marker(at))
        })
        .chain(told.into_iter().map(|o| {
            // Waits until the told worker's direct calls ran; a lost rank has none to run.
            let revoke = move || {
                let _: Result<(), Failure> =
                    call::wait_for_try(|on_answer| redirect::revoke(o, on_answer));
            };
            handle.spawn_on(o.via as usize, revoke)
        }))
        .collect();
    markers.into_iter().for_each(|m| m.join());
    let value = match &at {
        At::Here(t) if rank == state.rank => {
            // Back on this rank already: a move between its trustees.
            let moved_here = t.migrate_to(worker as usize).map_err(MigrateError::from);
            moved.end(None, first_move, handle);
            return moved_here;
        }
        At::Here(t) => t.withdraw().map_err(MigrateError::from),
        At::There(remote) => withdraw_there::<T>(remote.target),
    };
    let value = match value {
        Ok(value) => value,
        Err(e) => {
            moved.end(None, first_move, handle);
            return Err(e);
        }
    };
    let (placed, result) = if rank == state.rank {
        let here = handle.trustee(worker as usize).entrust(value);
        (At::Here(here), Ok(()))
    } else {
        match place_there(rank, worker, value) {
            Ok(there) => (At::There(Arc::new(there)), Ok(())),
            Err((e, value)) => {
                // Back here, so that nothing is lost; the move failed.
                let here = handle.trustee(first.trustee()).entrust(value);
                (At::Here(here), Err(e))
            }
        }
    };
    moved.end(Some(placed), first_move, handle);
    result
}

/// A call from this worker to where the value lives, answered once what this worker sent
/// there before has run. A failure (a lost rank) is left for the withdrawal to meet.
fn marker<T: Wire>(at: At<T>) {
    match at {
        At::Here(t) => t.apply(|_| ()),
        At::There(_) => {
            let there = Trust::at(at);
            let _ = catch_unwind(AssertUnwindSafe(|| there.apply(|_: &mut T| ())));
        }
    }
}

/// Takes the value out on the rank that holds it (`at`), which answers it.
fn withdraw_there<T: Wire>(at: Target) -> Result<T, MigrateError> {
    let answer: Result<Result<T, MigrateError>, Failure> = call::wait_for_try(|on_answer| {
        link::call(
            at.node,
            at.worker,
            Some(at.incarnation),
            WithdrawOp::<T>::OP,
            Some((at.slot, at.generation)),
            &[],
            on_answer,
        )
    });
    answer.unwrap_or_else(|failure| Err(MigrateError::Failed(failure.to_string())))
}

/// Entrusts `value` to `(rank, worker)`, exported to this rank; gives the value back if that
/// failed (encoded from a reference, it is still here).
fn place_there<T: Wire>(rank: u32, worker: u32, value: T) -> Result<Remote, (MigrateError, T)> {
    fn same<T>(value: T) -> T {
        value
    }
    fn entrust_op<T: Wire, C: FnOnce(T) -> T + Send + 'static>(_: C) -> &'static Op {
        EntrustOp::<T, T, C>::OP
    }
    let state = state::current().expect("a property outlived its rack");
    let life = state.life(rank);
    let bytes = codec::encode(life, &value);
    let op = entrust_op::<T, _>(same::<T>);
    let placed: Result<(u32, u32, Ticket), Failure> = call::wait_for_try(|on_answer: OnAnswer| {
        link::call(
            rank,
            worker,
            Some(life.incarnation),
            op,
            None,
            bytes.as_slice(),
            on_answer,
        )
    });
    match placed {
        Ok((slot, generation, ticket)) => {
            let target = Target {
                node: rank,
                worker,
                slot,
                generation,
                incarnation: life.incarnation,
            };
            Ok(Remote::new(target, ticket, call::marker_op::<T>()))
        }
        Err(failure) => Err((MigrateError::Failed(failure.to_string()), value)),
    }
}

/// The operation "take the `T` out and answer it" (step 3 of a move, on the rank that holds
/// the value), answering `Result<T, MigrateError>`.
struct WithdrawOp<T>(PhantomData<fn(T)>);

impl<T: Wire> WithdrawOp<T> {
    const OP: &'static Op = &op::descriptor!(type_name::<Self>, Run::Apply(Self::run));

    fn run(export: &Shared, _: &[u8], reply: Reply) {
        let Some(trust) = op::property::<trust::Trust<T>>(export).cloned() else {
            return reply.refuse(op::type_mismatch(
                type_name::<Self>,
                type_name::<T>(),
                export,
            ));
        };
        // A fiber of this worker, where the reply's link is: withdrawing waits.
        drop(trust::spawn(move || {
            let out = trust.withdraw().map_err(MigrateError::from);
            reply.ok(&out)
        }));
    }
}

/// The operation "move this property to `(rank, worker)`", run on its first home for a handle
/// on another rank, answering `Result<(), MigrateError>`.
struct MigrateOp<T>(PhantomData<fn(T)>);

impl<T: Wire> MigrateOp<T> {
    const OP: &'static Op = &op::descriptor!(type_name::<Self>, Run::Apply(Self::run));

    fn run(export: &Shared, argument: &[u8], reply: Reply) {
        let Some(trust) = op::property::<trust::Trust<T>>(export).cloned() else {
            return reply.refuse(op::type_mismatch(
                type_name::<Self>,
                type_name::<T>(),
                export,
            ));
        };
        let (rank, worker): (u32, u32) = match codec::decode_value(argument) {
            Ok(to) => to,
            Err(e) => return reply.refuse(format!("cannot decode where to move: {e}")),
        };
        let state = state::current().expect("a request outlived its rack");
        if rank as usize >= state.workers.len() {
            let ranks = state.workers.len();
            return reply.ok(&Err::<(), _>(MigrateError::Failed(format!(
                "the job has ranks 0..{ranks}, not {rank}"
            ))));
        }
        drop(trust::spawn(move || {
            reply.ok(&migrate(&trust, rank, worker))
        }));
    }
}
