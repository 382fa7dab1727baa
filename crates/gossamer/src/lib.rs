//! Gossamer: the rack. `Trust<T>` across processes and machines, over TCP or shared memory.
//!
//! A rack program is one binary started once per node (process). Each node runs a `trust`
//! runtime; a property lives on one trustee worker of one node, and any fiber on any node
//! applies closures to it with the same calls, local or remote:
//!
//! ```
//! use gossamer::{Rack, Trust};
//!
//! fn main() -> std::process::ExitCode {
//!     Rack::from_env().run(|| {
//!         // once, in a fiber on rank 0
//!         let counters: Vec<Trust<u64>> = gossamer::nodes().map(|n| n.entrust(0u64)).collect();
//!         for c in &counters {
//!             c.apply_with(|v, x: u64| *v += x, 5); // only this fiber waits
//!         }
//!         let last = gossamer::nodes().last().unwrap();
//!         let rank = gossamer::spawn_on(last, |()| gossamer::this_node().rank(), ()).join();
//!         assert_eq!(rank, last.rank());
//!         assert_eq!(counters.iter().map(|c| c.apply(|v| *v)).sum::<u64>(), 5 * counters.len() as u64);
//!     })
//! }
//! ```
//!
//! Run as it is, that is a one-node rack: no sockets, no configuration. `gsm run -n 4 --
//! ./prog` (or `mpirun`, or `srun`) starts four nodes that find each other (see [`env`](mod@env)).
//!
//! Closures sent to another node capture nothing (checked at compile time); their data
//! travels as the explicit argument of [`Trust::apply_with`], serialized with postcard, and
//! results come back the same way: both must be [`Wire`]. A closure that needs to capture —
//! borrow from the caller, hold an `Rc` — uses the property's `trust::Trust` through
//! [`Trust::local`], on the property's own node.
//!
//! # Where things are
//! - [`env`](mod@env): every `GSM_*` setting and how rank, size and the coordinator are found;
//! - `rack`: starting a node and the normal end of its job; `fate`: the end of a job that lost
//!   a peer (fate sharing, the watchdog); `error`: [`RackError`] and the exit statuses;
//! - `state`: what every worker of a node shares about the job, and each link's health;
//! - `bootstrap`: how nodes find each other and open their links;
//! - [`cluster`]: what `gsm run --hosts` and the per-host daemons say to each other, and the
//!   cluster key (used by the `gsm` command line, not by a rack);
//! - `handshake`: what every connection proves before its first frame; `transport`: how a
//!   link's bytes travel (TCP, shared memory) and the watchdog's view of them; `loom`: the
//!   atomics of the shared-memory ring, swappable for loom's;
//! - `link`: one connection between two workers, its lanes, reader and writer fibers;
//! - `wire`: the frame format, decoded without trusting a byte;
//! - `op`: how a frame names the code a request runs (ASLR-safe descriptor offsets), and the
//!   `Reply` an operation answers through; `function`: code named by name and [`Signature`]
//!   instead, which holds across builds, and the table of a node's [`Function`]s (the serde
//!   shapes signatures and durable logs are checked by come from the `gossamer-schema` crate,
//!   which code packages share);
//! - `call`: a remote call at both ends: the operations a trustee runs for a remote caller, and
//!   the answer cell the caller waits on;
//! - `codec`: values on the wire ([`Wire`], postcard), panic messages and refusals;
//! - `export`: the table that names properties by `(slot, generation)`, never by address;
//! - `remote`: a property on another rank as handles name it; `moved`: where a property that
//!   left its first home lives now, and the calls held while it moves; `migrate`:
//!   [`Trust::migrate_to`] between ranks;
//! - `proxy`: [`Trust`], local or remote; `node`: [`Node`], placement and [`spawn_on`];
//!   `named`: calls by name ([`named`], [`Trust::apply_named`], [`Node::spawn_named`]) and
//!   properties by name ([`export`], [`Node::lookup`]);
//! - [`region`]: one-sided regions ([`Region`], [`fence`]) and their memory model; its
//!   `heap` is the shared memory they live in, `error` what can go wrong;
//! - [`durable`]: durable properties and exactly-once calls; its `format` is what is stored,
//!   `store` where, `registry` the ops by name, `client` the calling side, `cell` a property
//!   on its trustee, `host` a rank's store, syncer and open properties;
//! - `capture_free`: closures with no captures, made on the receiving side; `hash`: FNV-1a and
//!   the number hasher.
//!
//! # Layers
//! Each file imports only from files listed before it here, so imports go one way and there
//! is no circle: `hash`, `env`, `error`, `wire`, `codec`, `export`, `capture_free`
//! (values, settings and formats); `op`, `function` (operation identity and replies); `loom`,
//! `transport`, `region/error`, `region/heap`, `handshake`, `cluster`, `state`, `bootstrap` (connections
//! and the state of a job); `fate` (ending a job); `link` (lanes); `remote`, `moved` (where a
//! property lives); `call` (both ends of a remote call); `proxy`, `node`, `migrate`, `named`,
//! `region`, `durable`, `stats`, `rack` (the API). Within `env/` and
//! `wire/`, `mod.rs` only re-exports its siblings. Where a lower layer must reach a higher one
//! it is handed a function, never an import: a reply carries the function that stages its
//! answer on its link.

// The attributes' output names `::gossamer`, in this crate's own tests and doctests too.
extern crate self as gossamer;

mod bootstrap;
mod call;
mod capture_free;
pub mod cluster;
mod codec;
mod deferred;
pub mod durable;
pub mod env;
mod error;
mod export;
mod fate;
mod function;
mod handshake;
mod hash;
mod link;
mod loom;
mod migrate;
mod moved;
mod named;
mod node;
mod op;
pub mod package;
mod proxy;
mod rack;
mod recovery;
mod redirect;
pub mod region;
mod remote;
mod scalar;
#[cfg(test)]
mod splitmix;
mod state;
mod stats;
mod transport;
mod wire;

/// Entry points for the fuzz targets in `fuzz/`; not part of the API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    /// Decodes `data` as each scalar a call may carry without serde (`u64`, `u32`, `usize`,
    /// `i64`, `i32`, `u8`, `bool`, `()`) and checks the result against postcard's, and the
    /// re-encoding of what decodes against postcard's bytes. Panics on a difference.
    pub fn scalar_value(data: &[u8]) {
        crate::scalar::check_against_postcard(data);
    }

    /// Decodes `data` as a stream of rack frames under small limits (1 KiB frames, 64 KiB
    /// messages) and checks every frame the decoder accepts: a strict prefix of it is
    /// incomplete, and re-encoded it decodes to the same value. Panics when a check fails.
    pub fn rack_frame(data: &[u8]) {
        let limits = crate::wire::Limits {
            frame: 1024,
            max_message: 64 * 1024,
        };
        crate::wire::check_frames(data, &limits);
    }

    /// Sends `bytes` as they are on this worker's link to worker `worker` of `node`, for tests
    /// that play a peer sending a bad frame. Call it from a fiber of a rack worker.
    pub fn send_raw(node: crate::Node, worker: u32, bytes: &[u8]) {
        crate::link::send_raw(node.rank(), worker, bytes);
    }

    /// Checks a region heap's table entry and runs a region request decoded from `data` on a
    /// region of a scratch heap: no panic, an error exactly when it reaches past the region,
    /// and no word outside it written. Panics when a check fails.
    pub fn region_op(data: &[u8]) {
        crate::region::fuzz_op(data);
    }

    /// Decodes `data` as each kind of value a durable store keeps (log record, snapshot,
    /// property entry): no panic, and what decodes re-encodes to a value that decodes the
    /// same. Then reads it as a log segment, frame by frame, searching past each bad frame
    /// for a whole one as recovery does: what the search finds, reading accepts. Panics when
    /// a check fails.
    pub fn durable_record(data: &[u8]) {
        crate::durable::check_decoders(data);
        crate::durable::check_segment(data);
    }

    /// Answers request `id` on this worker's link to worker `worker` of `node` in a
    /// well-formed frame, whether or not that request was made: a test's broken peer. Call it
    /// from a fiber of a rack worker.
    pub fn send_answer(node: crate::Node, worker: u32, id: u64) {
        crate::link::send_answer(node.rank(), worker, id);
    }

    /// Returns a bank's credit of the window on this worker's link to worker `worker` of
    /// `node`, whether or not that bank was asked for: a test's broken peer. Call it from a
    /// fiber of a rack worker.
    pub fn send_credit(node: crate::Node, worker: u32) {
        crate::link::send_credit(node.rank(), worker);
    }

    /// Reads `data` as a code package file and checks it under a policy trusting one fixed
    /// key, loading nothing (see the `package_file` fuzz target). Panics when a check fails.
    pub fn package_file(data: &[u8]) {
        crate::package::check_file(data);
    }

    /// Makes this process believe that `node` has loaded `package` when it may not have: the
    /// next call there names the package's id and meets the `Missing` answer, which the
    /// caller answers by sending the package and calling again. Call it from a rank.
    pub fn pretend_loaded(node: crate::Node, package: &crate::package::Package) {
        crate::package::pretend_loaded(node, package.id());
    }

    /// Reads `data` as frames and messages of a daemon connection (see the `cluster_frame`
    /// fuzz target). Panics when a check fails.
    pub fn cluster_frame(data: &[u8]) {
        crate::cluster::check_frames(data);
    }

    /// Answers `data` as the head of a request to the `GSM_METRICS` server would be (see the
    /// `metrics_request` fuzz target), and checks the answer: a well-formed HTTP/1.1 status
    /// line, and the counters only for `GET /metrics` or `GET /`. Panics when a check fails.
    pub fn metrics_request(data: &[u8]) {
        crate::stats::check_request(data);
    }

    /// Reads `data` as Prometheus text (see the `metrics_text` fuzz target) and checks that
    /// what it read, written again, reads back the same. Panics when a check fails.
    pub fn metrics_text(data: &[u8]) {
        crate::stats::check_text(&String::from_utf8_lossy(data));
    }

    /// Decodes `data` as a control message of a link and checks a named function's
    /// announcement in it as a link would (see the `named_control` fuzz target). Panics when
    /// a check fails.
    pub fn named_control(data: &[u8]) {
        crate::link::check_control(data);
    }

    /// Sends, on this worker's link to worker `worker` of `node`, the control message giving
    /// `name` the index `given` when there is one, then a request calling name index `called`:
    /// a test's peer that numbers names wrongly. Call it from a fiber of a rack worker.
    pub fn send_named(node: crate::Node, worker: u32, given: Option<(u32, &str)>, called: u32) {
        crate::link::send_named(node.rank(), worker, given, called);
    }

    /// Breaks the transport's own protocol on this worker's link to worker `worker` of
    /// `node`, as a broken peer would: on shared memory, publishes a ring position past the
    /// ring's end; on UCX, sends a message whose sequence number was used before. `false` on
    /// TCP, which has no protocol of its own. Call it from a fiber of a rack worker.
    pub fn corrupt_transport(node: crate::Node, worker: u32) -> bool {
        crate::link::corrupt_transport(node.rank(), worker)
    }
}

/// What the attributes' output uses; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::function::Linked;
    pub use inventory;
}

pub use codec::Wire;
pub use error::{EXIT_BAD_FRAME, EXIT_PANIC, EXIT_PEER_LOST, EXIT_SETUP, RackError};
pub use function::{Function, NamedError, Signature, StableType};
pub use gossamer_macros::{function, stable_type};
pub use migrate::MigrateError;
pub use named::{Named, NamedFn, export, named, named_fn, unexport};
pub use node::{
    JoinError, Node, RemoteJoinHandle, Trustee, entrust, exported_properties, nodes, spawn_on,
    this_node,
};
pub use proxy::{ApplyFuture, Trust};
pub use rack::Rack;
pub use region::{Done, Region, RegionError, fence};
pub use stats::{LinkStats, RackStats, Sample, parse_prometheus, stats};
pub use transport::Transport;
pub use trust::{
    Group, JoinHandle, Reply, ReplyId, TimedOut, block_on, in_delegated_context, sleep, spawn,
    yield_now,
};
