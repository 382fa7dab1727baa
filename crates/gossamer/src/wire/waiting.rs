//! The requests a side waits on: each request it sends waits under its id until the one
//! answer that names it arrives. Answers come in any order — a deferred request is answered
//! when its trustee decides, long after later ones — but an answer naming an id that does not
//! wait (never sent, or answered already) breaks the protocol: it is a bad frame, and nothing
//! runs for it.
//!
//! A link numbers its requests 0, 1, 2, …, and nearly all are answered before a window's
//! worth of later ones is sent; so request `id` waits in slot `id mod S` of a table of `S`
//! slots (no hashing), and only a request still waiting when a later one needs its slot — a
//! long wait, as a deferred request's — moves to a map of stragglers. Any ids work (the
//! checks use arbitrary ones); sequential ids are what make the table fast.

use crate::hash::ByNumber;

/// Slots when no size is given: few, so that the checks exercise the stragglers too.
const DEFAULT_SLOTS: usize = 64;

/// What waits for each outstanding request's answer, by id.
pub(crate) struct Waiting<V> {
    /// Request `id` waits at `slots[id & mask]`, unless a later request took that slot.
    /// Allocated at the first request: many links never call.
    slots: Vec<Option<(u64, V)>>,
    mask: u64,
    /// Requests moved out of their slot by a later one while they still waited.
    stragglers: ByNumber<V>,
}

impl<V> Default for Waiting<V> {
    fn default() -> Self {
        Waiting::with_slots(DEFAULT_SLOTS)
    }
}

impl<V> Waiting<V> {
    /// A table of `slots` slots (rounded up to a power of two): about as many as requests
    /// are usually outstanding (a link's window).
    pub(crate) fn with_slots(slots: usize) -> Self {
        Waiting {
            slots: Vec::new(),
            mask: slots.max(1).next_power_of_two() as u64 - 1,
            stragglers: ByNumber::default(),
        }
    }

    /// Request `id` was sent and waits with `v` (replacing what waited under the same id).
    #[inline]
    pub(crate) fn insert(&mut self, id: u64, v: V) {
        match self.slots.get_mut((id & self.mask) as usize) {
            Some(slot) if slot.is_none() && self.stragglers.is_empty() => *slot = Some((id, v)),
            _ => self.insert_displacing(id, v),
        }
    }

    /// [`Waiting::insert`] when the table is not allocated yet, the slot is taken, or `id`
    /// may be a straggler's.
    #[cold]
    fn insert_displacing(&mut self, id: u64, v: V) {
        if self.slots.is_empty() {
            self.slots.resize_with(self.mask as usize + 1, || None);
        }
        self.stragglers.remove(&id);
        let slot = &mut self.slots[(id & self.mask) as usize];
        if let Some((older, w)) = slot.replace((id, v))
            && older != id
        {
            self.stragglers.insert(older, w);
        }
    }

    /// The answer to request `id` arrived: what waited for it, which no longer waits.
    #[inline]
    pub(crate) fn answer(&mut self, id: u64) -> Result<V, String> {
        if let Some(slot) = self.slots.get_mut((id & self.mask) as usize)
            && slot.as_ref().is_some_and(|(waiting, _)| *waiting == id)
            && let Some((_, v)) = slot.take()
        {
            return Ok(v);
        }
        self.stragglers
            .remove(&id)
            .ok_or_else(|| format!("answer to unknown request {id}"))
    }

    /// Everything that waits, taken out: the peer is gone and no answer will come.
    pub(crate) fn drain(&mut self) -> Vec<V> {
        let slots = self
            .slots
            .iter_mut()
            .filter_map(|s| s.take().map(|(_, v)| v));
        let mut all: Vec<V> = slots.collect();
        all.extend(self.stragglers.drain().map(|(_, v)| v));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a map, with ids that collide in the slots, repeat, and are answered late,
    /// twice or never: the same answers and refusals.
    #[test]
    fn it_answers_exactly_as_a_map_would() {
        let mut rng = crate::splitmix::Rng(0x0a11_5eed);
        for slots in [1, 4, 64] {
            let mut waiting = Waiting::with_slots(slots);
            let mut model = std::collections::HashMap::new();
            let mut next = 0u64;
            for step in 0..20_000u64 {
                match rng.below(4) {
                    0 | 1 => {
                        // Mostly the next id; now and then a repeat or a far one.
                        let id = match rng.below(8) {
                            0 => rng.below(next as usize + 1) as u64,
                            1 => next + 1_000 * rng.below(5) as u64,
                            _ => {
                                next += 1;
                                next
                            }
                        };
                        waiting.insert(id, step);
                        model.insert(id, step);
                    }
                    _ => {
                        let id = next.saturating_sub(rng.below(3 * slots + 2) as u64);
                        assert_eq!(waiting.answer(id).ok(), model.remove(&id), "id {id}");
                    }
                }
            }
            let mut left = waiting.drain();
            let mut expected: Vec<u64> = model.into_values().collect();
            left.sort_unstable();
            expected.sort_unstable();
            assert_eq!(left, expected);
            assert!(waiting.answer(next).is_err(), "drained");
        }
    }
}
