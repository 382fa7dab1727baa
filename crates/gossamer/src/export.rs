//! The export table: the properties of one trustee worker that other nodes hold handles to.
//!
//! A remote handle names its property by `(slot, generation)` in the table of its trustee
//! worker, never by address. A slot is reused once its export is released, with the next
//! generation, so a request carrying a stale handle finds a mismatch and is refused instead of
//! reaching whatever lives in the slot now.
//!
//! # Tickets
//! An export lives while it has tickets. Every handle that leaves a node carries a fresh
//! [`Ticket`], minted by the sending life of its rank; the node that ends up holding it hands
//! it back (a release) when its last handle under it drops. A ticket is *handed out* to its
//! holder in one of two ways: the home node exports the property with it as it sends the
//! handle, or a third node sending the handle on tells the home (a toggle naming the holder).
//! The toggle and the release travel different paths and may arrive in either order (seed 000,
//! 3.2.6), so each ticket in the table remembers which half it still waits for:
//! [`Awaits::Release`] from its holder, or [`Awaits::HandOut`] from its minter.
//!
//! # Lost ranks
//! When a life of a rank is lost (`gsm run --recover`), nothing it held will be released and
//! nothing it minted will be handed out. [`ExportTable::forget`] drops both kinds of tickets,
//! and the table remembers the life, so that a half arriving later about it is ignored.
//! Tickets name the life that minted them, so a restarted rank, which counts from 0 again,
//! never mints a ticket an earlier life minted. A handle is exported to the life its bytes
//! go to (an answer's, to the life that asked), and [`ExportTable::insert`] refuses a life
//! already lost: an answer to a rank that died while its request ran leaves no export behind.
//!
//! # Doubts: a handle lost on its way
//! A life may die after its toggle reached the home and before the handle it sent reached
//! the holder, which then never releases what it never got. So the home asks: when a worker
//! first forgets a life, each ticket that life minted and handed out to a holder not lost
//! ([`ExportTable::in_doubt`]) is sent to its holder as a *doubt* (a control message; a
//! holder that is the home itself asks itself). The holder
//!
//! 1. marks the minter's life lost, if it had not noticed (every rank's loss of a life
//!    ends with rank 0 fencing it, so the home's word suffices), and has each of its
//!    workers close its links to that life, waiting for all of them;
//! 2. then answers *never held* unless it holds a handle under the ticket: every node
//!    notes the tickets of the remote handles it holds that a third node minted, from the
//!    handle's decoding to its drop;
//! 3. and the home drops the ticket if it still waits for that holder's release and its
//!    minter is lost ([`ExportTable::never_held`]); otherwise nothing changes.
//!
//! Why this is sound: the ticket's handle could only come from the minter's life (a node
//! that passes a handle on mints a ticket of its own), in a frame on a link from that
//! life. A handle is decoded on the worker that reads its frame, in the fiber step that
//! reads it; a worker whose link to the minter's life is closed reads nothing more from it
//! (the link's reader stops, and what it buffered or queued is dropped). So after step 1
//! the holder either holds the handle (noted: no answer, and its release comes when the
//! handle drops) or never will. If it held it and dropped it already, its release and the
//! answer both end the ticket: whichever comes second finds it gone, and a half about a
//! lost minter's ticket that is not in the table is ignored. No toggle from the lost life
//! is taken after its tickets were doubted: a toggle travels on a link to the export's
//! worker, which closes its links to the life in the same step (no yield between) as it
//! forgets the life and lists the doubts. A doubt or an answer lost with a
//! holder that dies meanwhile is not needed: the holder's loss drops the tickets it held.
//! Only the holder's answer counts (the home checks that the ticket awaits that holder),
//! and a ticket another node holds is never asked about.
//!
//! Each worker's table sits behind its own mutex: the worker takes it once per request it
//! serves; other workers take it only to export a handle they send.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// One life of a rank: the rank and its incarnation (`GSM_INCARNATION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct Life {
    pub(crate) rank: u32,
    pub(crate) incarnation: u32,
}

/// Where a remote property lives: an export of another rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) node: u32,
    pub(crate) worker: u32,
    pub(crate) slot: u32,
    pub(crate) generation: u32,
    /// The life of the node's rank the property belongs to: it is gone when the rank restarts.
    pub(crate) incarnation: u32,
}

impl Target {
    /// The life of the rank the property is on.
    pub(crate) fn life(&self) -> Life {
        Life {
            rank: self.node,
            incarnation: self.incarnation,
        }
    }
}

/// A ticket no other handle of the job carries: the life that minted it and its count there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct Ticket {
    pub(crate) minter: Life,
    pub(crate) count: u64,
}

/// The half of a ticket's round trip the table still waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Awaits {
    /// Handed out to `holder`, which releases it when its handles drop.
    Release { holder: Life },
    /// Released (or come home) before the minter's toggle handing it out arrived.
    HandOut,
}

/// A property as the table holds it: its `trust::Trust<T>`, type-erased, and the tickets of
/// the handles other nodes hold. A request being run holds a share of the property, so
/// releasing the export meanwhile cannot pull it away.
pub(crate) struct Export {
    pub(crate) shared: Shared,
    tickets: HashMap<Ticket, Awaits>,
}

impl Export {
    /// An export whose first ticket is handed out to `holder`.
    pub(crate) fn new<T: Send + 'static>(
        trust: trust::Trust<T>,
        ticket: Ticket,
        holder: Life,
    ) -> Export {
        Export::of(trust).with_ticket(ticket, holder)
    }

    /// A property no ticket holds yet.
    pub(crate) fn of<T: Send + 'static>(trust: trust::Trust<T>) -> Export {
        Export {
            shared: Shared {
                property: Arc::new(trust),
                type_name: std::any::type_name::<T>(),
            },
            tickets: HashMap::new(),
        }
    }

    /// Another share of the same property, with one ticket handed out to `holder`.
    pub(crate) fn with_ticket(&self, ticket: Ticket, holder: Life) -> Export {
        Export {
            shared: self.share(),
            tickets: HashMap::from([(ticket, Awaits::Release { holder })]),
        }
    }

    /// A share of the property to run a request on outside the table's lock: no tickets, so
    /// no map to make and drop on every request.
    pub(crate) fn share(&self) -> Shared {
        self.shared.clone()
    }
}

/// An export's property and its type's name; a request runs on a share of it
/// ([`Export::share`]).
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) property: Arc<dyn Any + Send + Sync>,
    pub(crate) type_name: &'static str,
}

impl fmt::Debug for Export {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Export")
            .field("type", &self.shared.type_name)
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
    /// The same half of a ticket's round trip came twice: a peer's protocol error.
    Twice {
        slot: u32,
        ticket: Ticket,
        awaits: Awaits,
    },
    /// The handle was to go to a life already lost: nothing would ever release its ticket.
    Lost { holder: Life },
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
            ExportError::Twice {
                slot,
                ticket,
                awaits,
            } => write!(
                f,
                "ticket {ticket:?} of the export in slot {slot} came twice; it awaits {awaits:?}"
            ),
            ExportError::Lost { holder } => write!(
                f,
                "rank {} (incarnation {}) was lost before a handle could reach it",
                holder.rank, holder.incarnation
            ),
        }
    }
}

/// A ticket a lost life minted and handed out, which its holder may never have received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Doubt {
    pub(crate) slot: u32,
    pub(crate) generation: u32,
    pub(crate) ticket: Ticket,
    pub(crate) holder: Life,
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
    /// Per rank, the newest of its lives this table forgot (see [`ExportTable::forget`]).
    forgotten: HashMap<u32, u32>,
}

impl ExportTable {
    /// Adds an export; returns its `(slot, generation)`. Refused if a ticket's holder is a
    /// life already lost (its handle would never come back, so the export would never go).
    pub(crate) fn insert(&mut self, export: Export) -> Result<(u32, u32), ExportError> {
        let lost = export.tickets.values().find_map(|awaits| match *awaits {
            Awaits::Release { holder } if self.is_forgotten(holder) => Some(holder),
            _ => None,
        });
        if let Some(holder) = lost {
            return Err(ExportError::Lost { holder });
        }
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(Slot::default());
                (self.slots.len() - 1) as u32
            }
        };
        let entry = &mut self.slots[slot as usize];
        entry.export = Some(export);
        Ok((slot, entry.generation))
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

    /// The minter's half: `ticket` was handed out to `holder`. Returns the export if that
    /// was its last ticket, for the caller to drop outside the lock (dropping a property runs
    /// user code).
    pub(crate) fn hand_out(
        &mut self,
        slot: u32,
        generation: u32,
        ticket: Ticket,
        holder: Life,
    ) -> Result<Option<Export>, ExportError> {
        let awaits = Awaits::Release { holder };
        let keep = !self.is_forgotten(holder);
        self.half(slot, generation, ticket, awaits, keep)
    }

    /// The holder's half: `ticket`'s handles were released, or came back home.
    pub(crate) fn release(
        &mut self,
        slot: u32,
        generation: u32,
        ticket: Ticket,
    ) -> Result<Option<Export>, ExportError> {
        let keep = !self.is_forgotten(ticket.minter);
        self.half(slot, generation, ticket, Awaits::HandOut, keep)
    }

    /// One half of `ticket`'s round trip: it completes the other half, or waits for it (if
    /// `wait`: not when the other half can never come).
    fn half(
        &mut self,
        slot: u32,
        generation: u32,
        ticket: Ticket,
        other: Awaits,
        wait: bool,
    ) -> Result<Option<Export>, ExportError> {
        self.get(slot, generation)?;
        let export = self.slots[slot as usize]
            .export
            .as_mut()
            .expect("checked by get");
        match export.tickets.get(&ticket) {
            None if wait => {
                export.tickets.insert(ticket, other);
            }
            None => {}
            Some(&awaits) if std::mem::discriminant(&awaits) == std::mem::discriminant(&other) => {
                return Err(ExportError::Twice {
                    slot,
                    ticket,
                    awaits,
                });
            }
            Some(_) => {
                export.tickets.remove(&ticket);
            }
        }
        if export.tickets.is_empty() {
            return self.remove(slot, generation).map(Some);
        }
        Ok(None)
    }

    /// `life` is lost: drops the tickets it held and those it minted but never handed out,
    /// and ignores any later half about them. Returns the exports left without tickets.
    pub(crate) fn forget(&mut self, life: Life) -> Vec<Export> {
        let newest = self.forgotten.entry(life.rank).or_insert(life.incarnation);
        *newest = (*newest).max(life.incarnation);
        let gone = |l: Life| l.rank == life.rank && l.incarnation <= life.incarnation;
        let mut dropped = Vec::new();
        for slot in 0..self.slots.len() {
            let entry = &mut self.slots[slot];
            let Some(export) = entry.export.as_mut() else {
                continue;
            };
            export.tickets.retain(|ticket, awaits| match awaits {
                Awaits::Release { holder } => !gone(*holder),
                Awaits::HandOut => !gone(ticket.minter),
            });
            if export.tickets.is_empty() {
                let generation = entry.generation;
                dropped.push(self.remove(slot as u32, generation).expect("a live export"));
            }
        }
        dropped
    }

    /// The tickets `life`, now lost, minted and handed out to a holder that is not lost:
    /// tickets its holder may never have received (see the module docs), each to be asked
    /// about.
    pub(crate) fn in_doubt(&self, life: Life) -> Vec<Doubt> {
        let mut doubts = Vec::new();
        for (slot, entry) in self.slots.iter().enumerate() {
            let Some(export) = &entry.export else {
                continue;
            };
            for (ticket, awaits) in &export.tickets {
                if let Awaits::Release { holder } = *awaits
                    && ticket.minter == life
                    && !self.is_forgotten(holder)
                {
                    doubts.push(Doubt {
                        slot: slot as u32,
                        generation: entry.generation,
                        ticket: *ticket,
                        holder,
                    });
                }
            }
        }
        doubts
    }

    /// The holder's answer to a doubt: `holder` never held `ticket`, and never will (its
    /// minter is lost). The ticket goes if it still waits for `holder`'s release and its
    /// minter is lost; otherwise (released meanwhile, or not a doubt) nothing changes.
    /// Returns the export if that was its last ticket.
    pub(crate) fn never_held(
        &mut self,
        slot: u32,
        generation: u32,
        ticket: Ticket,
        holder: Life,
    ) -> Result<Option<Export>, ExportError> {
        if !self.is_forgotten(ticket.minter) {
            return Ok(None);
        }
        self.get(slot, generation)?;
        let export = self.slots[slot as usize]
            .export
            .as_mut()
            .expect("checked by get");
        if export.tickets.get(&ticket) != Some(&Awaits::Release { holder }) {
            return Ok(None);
        }
        export.tickets.remove(&ticket);
        if export.tickets.is_empty() {
            return self.remove(slot, generation).map(Some);
        }
        Ok(None)
    }

    /// Whether `life` was lost (its tickets forgotten).
    pub(crate) fn is_forgotten(&self, life: Life) -> bool {
        self.forgotten
            .get(&life.rank)
            .is_some_and(|&newest| life.incarnation <= newest)
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

    fn life(rank: u32, incarnation: u32) -> Life {
        Life { rank, incarnation }
    }

    /// Ticket `count` minted by `minter`.
    fn ticket(minter: Life, count: u64) -> Ticket {
        Ticket { minter, count }
    }

    /// An export of `v` on rank 0, handed out to `holder` under ticket `v`.
    fn held(v: u64, holder: Life) -> Export {
        let awaits = Awaits::Release { holder };
        Export {
            shared: Shared {
                property: Arc::new(v),
                type_name: "u64",
            },
            tickets: HashMap::from([(ticket(life(0, 0), v), awaits)]),
        }
    }

    fn export(v: u64) -> Export {
        held(v, life(1, 0))
    }

    #[test]
    fn a_released_slot_is_reused_with_a_new_generation() {
        let mut table = ExportTable::default();
        let (a, ga) = table.insert(export(1)).unwrap();
        let (b, _) = table.insert(export(2)).unwrap();
        assert_ne!(a, b);
        assert_eq!(table.live(), 2);
        let one = ticket(life(0, 0), 1);
        assert!(
            table.release(a, ga, one).unwrap().is_some(),
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
        let (c, gc) = table.insert(export(3)).unwrap();
        assert_eq!((c, gc), (a, ga + 1));
        assert!(
            table.get(a, ga).is_err(),
            "the stale handle must not reach the new export"
        );
        assert_eq!(
            table
                .get(c, gc)
                .unwrap()
                .shared
                .property
                .downcast_ref::<u64>(),
            Some(&3)
        );
        assert!(
            table
                .release(a, ga, one)
                .unwrap_err()
                .to_string()
                .contains("stale")
        );
        assert_eq!(
            table.get(99, 0).unwrap_err(),
            ExportError::Unknown { slot: 99 }
        );
        assert_eq!(table.drain().len(), 2);
        assert_eq!(table.live(), 0);
    }

    #[test]
    fn the_halves_of_a_ticket_meet_in_either_order() {
        let mut table = ExportTable::default();
        let (c, gc) = table.insert(export(3)).unwrap();
        // Rank 2 sends the handle to rank 3: its toggle first, then rank 3's release.
        let sent = ticket(life(2, 0), 0);
        assert!(table.hand_out(c, gc, sent, life(3, 0)).unwrap().is_none());
        assert!(table.release(c, gc, sent).unwrap().is_none());
        // The release first, then the toggle.
        let early = ticket(life(2, 0), 1);
        assert!(table.release(c, gc, early).unwrap().is_none());
        assert!(table.hand_out(c, gc, early, life(3, 0)).unwrap().is_none());
        // The same half twice is refused and changes nothing.
        let twice = ticket(life(2, 0), 2);
        assert!(table.release(c, gc, twice).unwrap().is_none());
        assert!(matches!(
            table.release(c, gc, twice),
            Err(ExportError::Twice {
                awaits: Awaits::HandOut,
                ..
            })
        ));
        assert!(table.hand_out(c, gc, twice, life(3, 0)).unwrap().is_none());
        assert!(
            table
                .release(c, gc, ticket(life(0, 0), 3))
                .unwrap()
                .is_some(),
            "the first ticket was the last"
        );
    }

    #[test]
    fn a_lost_life_loses_what_it_held_and_what_it_minted() {
        let mut table = ExportTable::default();
        let insert =
            |table: &mut ExportTable, v: u64, holder: Life| table.insert(held(v, holder)).unwrap();
        // Held only by rank 1's first life; held by it and by rank 2.
        let (a, ga) = insert(&mut table, 1, life(1, 0));
        let (b, gb) = insert(&mut table, 2, life(1, 0));
        let by_2 = ticket(life(1, 0), 0);
        assert!(table.hand_out(b, gb, by_2, life(2, 0)).unwrap().is_none());
        // Released by rank 2 before the toggle of rank 1, which minted it, arrived.
        let (c, gc) = insert(&mut table, 3, life(2, 0));
        let early = ticket(life(1, 0), 1);
        assert!(table.release(c, gc, early).unwrap().is_none());
        // Rank 1's next life minted and holds tickets the old one's count reused.
        let (d, gd) = insert(&mut table, 4, life(1, 1));
        let again = ticket(life(1, 1), 0);
        assert!(table.hand_out(d, gd, again, life(2, 0)).unwrap().is_none());

        let dropped = table.forget(life(1, 0));
        assert_eq!(dropped.len(), 1, "only a had nothing but rank 1's ticket");
        assert!(table.get(a, ga).is_err());
        assert_eq!(table.live(), 3);
        // b lives on rank 2's ticket; c on its first one; d on both of rank 1's next life.
        assert!(table.release(b, gb, by_2).unwrap().is_some());
        assert!(
            table
                .release(c, gc, ticket(life(0, 0), 3))
                .unwrap()
                .is_some(),
            "the early release waited for a toggle that can never come"
        );
        // A half about the lost life that arrives late is ignored.
        let (e, ge) = insert(&mut table, 5, life(3, 0));
        let late = ticket(life(1, 0), 7);
        assert!(table.release(e, ge, late).unwrap().is_none());
        assert!(table.hand_out(e, ge, late, life(1, 0)).unwrap().is_none());
        assert!(
            table
                .release(e, ge, ticket(life(0, 0), 5))
                .unwrap()
                .is_some(),
            "nothing about the lost life was kept"
        );
        assert!(table.release(d, gd, again).unwrap().is_none());
        assert!(
            table
                .release(d, gd, ticket(life(0, 0), 4))
                .unwrap()
                .is_some()
        );
        assert_eq!(table.live(), 0);
    }

    #[test]
    fn a_ticket_a_lost_life_handed_out_goes_once_its_holder_never_held_it() {
        let mut table = ExportTable::default();
        // Held by rank 2, which handed it on to rank 1 (its toggle arrived) and to rank 3.
        let (a, ga) = table.insert(held(1, life(2, 0))).unwrap();
        let (to_1, to_3) = (ticket(life(2, 0), 0), ticket(life(2, 0), 1));
        assert!(table.hand_out(a, ga, to_1, life(1, 0)).unwrap().is_none());
        assert!(table.hand_out(a, ga, to_3, life(3, 0)).unwrap().is_none());
        // Before rank 2 is lost, an answer changes nothing.
        assert!(table.never_held(a, ga, to_1, life(1, 0)).unwrap().is_none());
        assert!(
            table.forget(life(2, 0)).is_empty(),
            "its handed-out tickets keep it"
        );
        let mut doubts = table.in_doubt(life(2, 0));
        doubts.sort_by_key(|d| d.ticket.count);
        let doubt = |ticket, holder| Doubt {
            slot: a,
            generation: ga,
            ticket,
            holder,
        };
        assert_eq!(doubts, [doubt(to_1, life(1, 0)), doubt(to_3, life(3, 0))]);
        // Only the holder's answer counts.
        assert!(table.never_held(a, ga, to_1, life(3, 0)).unwrap().is_none());
        assert!(table.never_held(a, ga, to_1, life(1, 0)).unwrap().is_none());
        // Rank 3 held it and released it: its answer after that changes nothing.
        assert!(
            table.release(a, ga, to_3).unwrap().is_some(),
            "its last ticket"
        );
        assert!(table.get(a, ga).is_err());
        assert!(table.never_held(a, ga, to_3, life(3, 0)).is_err(), "stale");
        assert_eq!(table.live(), 0);
    }

    #[test]
    fn a_handle_for_a_lost_life_is_not_exported() {
        let mut table = ExportTable::default();
        table.forget(life(1, 0));
        assert_eq!(
            table.insert(held(1, life(1, 0))).unwrap_err(),
            ExportError::Lost { holder: life(1, 0) },
            "rank 1's lost life would never release it"
        );
        assert_eq!(table.live(), 0);
        let (a, ga) = table.insert(held(2, life(1, 1))).unwrap();
        assert!(table.get(a, ga).is_ok(), "rank 1's next life holds handles");
    }
}
