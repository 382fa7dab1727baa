//! Composable distributed objects on one-sided regions (the seed's LOCO).
//!
//! An object's state is spread over its members' nodes in [regions](gossamer::region):
//! arrays of words any member reads and writes without running code on the node they live
//! on. Every member opens its *endpoint* of an object by the same name, type and
//! parameters; opening returns once every member has, each knowing where the others'
//! regions are. Objects compose: a [`Barrier`] is a [`SharedArray`] of counts, a [`Ring`] is
//! regions plus two shared arrays, and a user's own object declares its regions and
//! sub-objects the same way ([`Object`]).
//!
//! ```
//! use objects::{Barrier, SharedArray, Work};
//!
//! let code = gossamer::Rack::from_env().run(|| {
//!     let members: Vec<_> = gossamer::nodes().collect();
//!     // `main` runs on rank 0: start each member's part on its node.
//!     objects::on_members(&members, |members| {
//!         let mut barrier = objects::open::<Barrier>("example/barrier", &(), &members).unwrap();
//!         let n = members.len();
//!         let slots = objects::open::<SharedArray>("example/slots", &n, &members).unwrap();
//!         let me = slots.me();
//!         slots.store(me, 42);
//!         slots.send_to((me + 1) % n, me, &Work::new()); // a put to the next member, not awaited
//!         barrier.wait().unwrap(); // every node fenced: every put has landed
//!         assert_eq!(slots.load((me + n - 1) % n), 42);
//!     });
//! });
//! assert_eq!(code, std::process::ExitCode::SUCCESS);
//! ```
//!
//! `examples/barrier.rs` and `examples/ring.rs` run on any number of nodes (`gsm run -n 3 --
//! cargo run -p objects --example ring`).
//!
//! # What objects rely on
//! The memory model of [`gossamer::region`], and nothing more: word-sized accesses are atomic
//! and larger ones may tear; a completed put has read its words, not landed them; from one
//! worker to one node operations take effect in issue order; nothing is ordered across
//! nodes; a fence to a node completes once this worker's earlier operations to it landed.
//! The objects are written against [`Fabric`], the seam to that memory; the crate's tests run
//! them, and the litmus tests of the seed, on an adversary fabric that does everything the
//! model allows (delays puts, reorders them across nodes, tears them, completes them before
//! they land) and nothing more, with the same code as on a rack.
//!
//! # Where the seed differs
//! - A put reads its words when it is issued (gossamer copies them into the request or into
//!   UCX's operation, or stores them through shared memory at once), never later: the seed's outcomes where a NIC
//!   reads a local word after the CPU changed it (its Figures 2 and 9c) cannot happen here.
//! - A join that arrives before the member has opened the object waits for it, up to
//!   `GSM_OBJECT_TIMEOUT`, instead of being dropped; a member that never opens it, or opens it
//!   as another object, fails every other member's `open`, naming it.
//! - A role that does not fit is a type error (only a [`RingWriter`] can send), never the
//!   seed's endless loop.
//! - Completions ([`Work`]) run in the worker's loop, with no polling thread.
//!
//! # Layers
//! Each file imports only from files listed before it here: `error`, `work` (completions),
//! `signature` (what members agree on), `directory` (how members find each other on a rack),
//! `fabric` (the memory seam), `object` (declaring, opening, parts); then the objects, each
//! built on those before it: `var`, `msw`, `barrier`, `ring`, `mutex`, `dmap`, and `shardmap` (the map's delegated
//! twin). The tests' `sim` (the
//! adversary fabric), `litmus` and `loom_model` sit on top.

mod barrier;
mod directory;
mod dmap;
mod error;
mod fabric;
mod msw;
mod mutex;
mod object;
mod ring;
mod shardmap;
mod signature;
mod var;
mod work;

#[cfg(all(test, not(loom)))]
mod litmus;
#[cfg(all(test, loom))]
mod loom_model;
#[cfg(all(test, not(loom)))]
mod sim;

pub use barrier::Barrier;
pub use dmap::{DMap, DMapParams, MapError};
pub use error::{OpenError, SendError};
pub use fabric::{Fabric, Rack};
pub use msw::{Msw, TooLarge};
pub use mutex::{LockArray, Mutex, MutexGuard};
pub use object::{Declare, Object, On, Parts, Regions, on_members, open, open_on};
pub use ring::{Ring, RingParams, RingReader, RingWriter};
pub use shardmap::ShardMap;
pub use signature::Signature;
pub use var::{Owned, OwnedReader, OwnedVar, OwnedWriter, Pod, SharedArray, SharedVar};
pub use work::{Then, Work};
