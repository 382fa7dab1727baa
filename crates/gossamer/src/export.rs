//! The export table: the properties of one trustee worker that other nodes hold handles to.
//!
//! A remote handle names its property by `(slot, generation)` in the table of its trustee
//! worker, never by address. A slot is reused once its export is released, with the next
//! generation, so a request carrying a stale handle finds a mismatch and is refused instead of
//! reaching whatever lives in the slot now.
//!
//! An export lives while its set of *tickets* is not empty. Every handle that leaves a node
//! carries a fresh ticket: the sender toggles it into the set, the node that ends up holding
//! it toggles it out when its last handle drops. Toggling (symmetric difference) commutes, so
//! the two may arrive in either order (seed 000, 3.2.6). Each worker's table sits behind its
//! own mutex: the worker takes it once per request it serves; other workers take it only to
//! export a handle they send.

use std::any::Any;
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

/// A property as the table holds it: its `trust::Trust<T>`, type-erased, and the tickets of
/// the handles other nodes hold. A request being run holds a share of the property, so
/// releasing the export meanwhile cannot pull it away.
pub(crate) struct Export {
    pub(crate) property: Arc<dyn Any + Send + Sync>,
    pub(crate) type_name: &'static str,
    tickets: HashSet<u64>,
}

impl Export {
    pub(crate) fn new<T: Send + 'static>(trust: trust::Trust<T>, ticket: u64) -> Export {
        Export {
            property: Arc::new(trust),
            type_name: std::any::type_name::<T>(),
            tickets: HashSet::from([ticket]),
        }
    }

    /// Another share of the same property, holding no tickets.
    pub(crate) fn share(&self) -> Export {
        Export {
            property: self.property.clone(),
            type_name: self.type_name,
            tickets: HashSet::new(),
        }
    }
}

impl fmt::Debug for Export {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Export")
            .field("type", &self.type_name)
            .finish()
    }
}

/// Why a `(slot, generation)` names no export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ExportError {
    /// The slot was never used.
    Unknown { slot: u32 },
    /// The slot's export was released (and maybe reused): the handle is stale.
    Stale {
        slot: u32,
        generation: u32,
        now: u32,
    },
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExportError::Unknown { slot } => write!(f, "no export in slot {slot}"),
            ExportError::Stale {
                slot,
                generation,
                now,
            } => write!(
                f,
                "stale export: slot {slot} generation {generation} was released (now {now})"
            ),
        }
    }
}

#[derive(Debug, Default)]
struct Slot {
    generation: u32,
    export: Option<Export>,
}

/// One worker's exports.
#[derive(Debug, Default)]
pub(crate) struct ExportTable {
    slots: Vec<Slot>,
    free: Vec<u32>,
}

impl ExportTable {
    /// Adds an export; returns its `(slot, generation)`.
    pub(crate) fn insert(&mut self, export: Export) -> (u32, u32) {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(Slot::default());
                (self.slots.len() - 1) as u32
            }
        };
        let entry = &mut self.slots[slot as usize];
        entry.export = Some(export);
        (slot, entry.generation)
    }

    /// The export `(slot, generation)` names.
    pub(crate) fn get(&self, slot: u32, generation: u32) -> Result<&Export, ExportError> {
        let entry = self
            .slots
            .get(slot as usize)
            .ok_or(ExportError::Unknown { slot })?;
        match &entry.export {
            Some(export) if entry.generation == generation => Ok(export),
            _ => Err(ExportError::Stale {
                slot,
                generation,
                now: entry.generation,
            }),
        }
    }

    /// Toggles `ticket` in the export's set. When the set becomes empty the export is removed
    /// and returned, for the caller to drop outside the lock (dropping a property runs user
    /// code).
    pub(crate) fn toggle(
        &mut self,
        slot: u32,
        generation: u32,
        ticket: u64,
    ) -> Result<Option<Export>, ExportError> {
        self.get(slot, generation)?;
        let export = self.slots[slot as usize]
            .export
            .as_mut()
            .expect("checked by get");
        if !export.tickets.remove(&ticket) {
            export.tickets.insert(ticket);
        }
        if export.tickets.is_empty() {
            return self.remove(slot, generation).map(Some);
        }
        Ok(None)
    }

    /// Removes an export and retires its generation; the caller drops it (which drops the
    /// property once no request for it is left on this worker's channels).
    fn remove(&mut self, slot: u32, generation: u32) -> Result<Export, ExportError> {
        self.get(slot, generation)?;
        let entry = &mut self.slots[slot as usize];
        entry.generation = entry.generation.wrapping_add(1);
        self.free.push(slot);
        Ok(entry.export.take().expect("checked by get"))
    }

    /// Takes every export out, for the end of the job.
    pub(crate) fn drain(&mut self) -> Vec<Export> {
        self.free.clear();
        let exports = self
            .slots
            .iter_mut()
            .filter_map(|s| s.export.take())
            .collect();
        self.slots.clear();
        exports
    }

    /// How many exports are live.
    pub(crate) fn live(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export(v: u64) -> Export {
        Export {
            property: Arc::new(v),
            type_name: "u64",
            tickets: HashSet::from([v]),
        }
    }

    #[test]
    fn a_released_slot_is_reused_with_a_new_generation() {
        let mut table = ExportTable::default();
        let (a, ga) = table.insert(export(1));
        let (b, _) = table.insert(export(2));
        assert_ne!(a, b);
        assert_eq!(table.live(), 2);
        assert!(
            table.toggle(a, ga, 1).unwrap().is_some(),
            "its only ticket is gone"
        );
        assert_eq!(
            table.get(a, ga).unwrap_err(),
            ExportError::Stale {
                slot: a,
                generation: ga,
                now: ga + 1
            }
        );
        let (c, gc) = table.insert(export(3));
        assert_eq!((c, gc), (a, ga + 1));
        assert!(
            table.get(a, ga).is_err(),
            "the stale handle must not reach the new export"
        );
        assert_eq!(
            table.get(c, gc).unwrap().property.downcast_ref::<u64>(),
            Some(&3)
        );
        assert!(
            table
                .toggle(a, ga, 1)
                .unwrap_err()
                .to_string()
                .contains("stale")
        );
        assert_eq!(
            table.get(99, 0).unwrap_err(),
            ExportError::Unknown { slot: 99 }
        );
        // Toggles commute: out before in leaves the export alive, in then cancels it.
        assert!(table.toggle(c, gc, 40).unwrap().is_none());
        assert!(table.toggle(c, gc, 40).unwrap().is_none());
        assert!(table.toggle(c, gc, 3).unwrap().is_some());
        assert_eq!(table.drain().len(), 1);
        assert_eq!(table.live(), 0);
    }
}
