//! Region operations as UCX one-sided operations, on a worker whose link to the region's
//! node is UCX (`transport::ucx::rma` has the protocol): no request, and no code of the
//! target's runs for a put or a get (nor for an atomic where UCX's transport does it in
//! place, as its shared memory does; over TCP, or RDMA under this crate's CPU atomics, the
//! target's worker applies it when it progresses UCX).

use std::borrow::Cow;
use std::rc::Rc;
use std::sync::Arc;

use super::heap::Heap;
use super::heap::TABLE_WORDS;
use super::{Done, Op, Raw, Region, RegionError, Reply};
use crate::state::RackState;
use crate::transport::ucx::rma::{Failure, Route};

fn failed(e: Failure) -> RegionError {
    RegionError::Failed { why: e.to_string() }
}

/// Runs `op` (checked against the region's length) on `region` through `route`.
pub(super) fn run<T: Send + 'static>(
    region: &Region,
    route: &Rc<Route>,
    op: Op<'_>,
    take: fn(Reply) -> Result<T, RegionError>,
) -> Done<T> {
    let (offset, len) = (u64::from(region.offset), u64::from(region.len));
    // The handle's place against the heap the node registered: a handle from a broken peer
    // reaches other regions' words at worst, never outside the heap.
    if offset < TABLE_WORDS as u64 || offset + len > route.words() {
        return Done::ready(Err(RegionError::Corrupt {
            why: format!(
                "a handle places a region of {len} words at word {offset}, in a heap of {} \
                 words",
                route.words()
            ),
        }));
    }
    let name = u64::from(region.slot) << 32 | u64::from(region.generation);
    route.hold(name, || Box::new(region.keep.clone()));
    let word = |index: u64| offset + index;
    match op {
        Op::Put { index, words } => {
            route.put(word(index), &words.0);
            Done::ready(take(Reply::Put))
        }
        Op::Get { index, len } => {
            let (done, fill) = Done::pending();
            route.get(
                word(index),
                len,
                Box::new(move |r| {
                    fill.fill(
                        r.map_err(failed)
                            .and_then(|w| take(Reply::Words(Raw(Cow::Owned(w))))),
                    )
                }),
            );
            done
        }
        Op::FetchAdd { index, x } => {
            let (done, fill) = Done::pending();
            route.fetch_add(
                word(index),
                x,
                Box::new(move |r| fill.fill(r.map_err(failed).and_then(|v| take(Reply::Value(v))))),
            );
            done
        }
        Op::CompareExchange {
            index,
            current,
            new,
        } => {
            let (done, fill) = Done::pending();
            route.compare_exchange(
                word(index),
                current,
                new,
                Box::new(move |r| {
                    fill.fill(r.map_err(failed).and_then(|before| {
                        take(Reply::Exchanged(if before == current {
                            Ok(before)
                        } else {
                            Err(before)
                        }))
                    }))
                }),
            );
            done
        }
    }
}

/// `fence` on a UCX route: a flush of it.
pub(super) fn fence(route: &Rc<Route>) -> Done<()> {
    let (done, fill) = Done::pending();
    route.flush(Box::new(move |r| fill.fill(r.map_err(failed))));
    done
}

/// The heap of life `incarnation` of node `node` where UCX maps it into this process (its
/// route says so): recorded with the heaps this process maps, so that its regions are reached
/// as those of a shared-memory peer, with no UCX call.
pub(super) fn mapped_heap(state: &RackState, node: u32, incarnation: u32) -> Option<Arc<Heap>> {
    let (base, words) = crate::transport::ucx::rma::route(node, incarnation)?.mapped()?;
    // SAFETY: UCX maps the heap's `words` words at `base`, word-aligned, for good (the
    // route's key is kept for good); every access to a heap is atomic (`heap`).
    let heap = unsafe { Heap::peer_at(base, words) }.ok()?;
    state.regions.add_peer(node, incarnation, Arc::new(heap));
    state.regions.heap_of(node, incarnation)
}
