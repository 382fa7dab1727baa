//! The cost of a contended hand-over between two cores, measured as part of `faa`.
//!
//! Two threads, pinned to different cores, take strict turns: each waits until a turn counter
//! shows its turn, then (under the lock, for the lock kinds) increments the protected counter and
//! advances the turn. Every turn therefore moves the cache line holding the turn, the lock and the
//! data from one core to the other, and the waiter starts acquiring while the holder still holds
//! the lock: the hand-over a serializing lock pays per critical section once several cores want
//! it. The result, nanoseconds per turn, is the input (b) of the model in `bench/README.md`.

use std::fmt::Write as _;
use std::hint::spin_loop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::ensure;

use crate::figure::{Figure, Panel, sig};
use crate::harness::{Ctx, Gate, pin_to_core, run_window};

/// What is handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The bare cache line: the turn is advanced with a plain store, no lock.
    Line,
    /// A `parking_lot::Mutex` in the same line as the turn.
    ParkingLot,
    /// An `mcslock` MCS lock in the same line as the turn (each thread's queue node on its stack).
    Mcs,
}

impl Kind {
    /// Every kind, in table order.
    pub const ALL: [Kind; 3] = [Kind::Line, Kind::ParkingLot, Kind::Mcs];

    /// Name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Line => "cache line (atomic store)",
            Kind::ParkingLot => "parking_lot Mutex",
            Kind::Mcs => "MCS (mcslock)",
        }
    }
}

/// The turn, the lock and its counter, all in one cache line.
#[derive(Default)]
#[repr(align(64))]
struct Slot {
    turn: AtomicU64,
    parking_lot: parking_lot::Mutex<u64>,
    mcs: mcslock::raw::spins::Mutex<u64>,
}

const _: () = assert!(size_of::<Slot>() == 64, "the slot must fit one cache line");

/// Runs the two threads for one window; returns nanoseconds per hand-over after checking that the
/// lock's counter saw every turn.
pub fn measure(kind: Kind, window: Duration) -> anyhow::Result<f64> {
    let slot = Slot::default();
    let gate = Gate::new();
    let elapsed = std::thread::scope(|s| {
        for me in 0..2u64 {
            let (slot, gate) = (&slot, &gate);
            s.spawn(move || {
                pin_to_core(me as usize);
                let mut node = mcslock::raw::MutexNode::default();
                gate.arrive_and_wait();
                let mut mine = me;
                loop {
                    while slot.turn.load(Ordering::Acquire) != mine {
                        if gate.stopped() {
                            return;
                        }
                        spin_loop();
                    }
                    // Advance the turn inside the critical section, so the other thread starts
                    // acquiring while this one still holds the lock.
                    let next = mine + 1;
                    match kind {
                        Kind::Line => slot.turn.store(next, Ordering::Release),
                        Kind::ParkingLot => {
                            let mut g = slot.parking_lot.lock();
                            *g += 1;
                            slot.turn.store(next, Ordering::Release);
                        }
                        Kind::Mcs => slot.mcs.lock_with_then(&mut node, |c| {
                            *c += 1;
                            slot.turn.store(next, Ordering::Release);
                        }),
                    }
                    mine += 2;
                }
            });
        }
        let t0 = gate.open_when(2);
        run_window(&gate, window);
        t0.elapsed()
    });
    let turns = slot.turn.load(Ordering::Acquire);
    let counted = match kind {
        Kind::Line => turns,
        Kind::ParkingLot => *slot.parking_lot.lock(),
        Kind::Mcs => slot.mcs.lock_then(|c| *c),
    };
    ensure!(turns > 0, "{}: no hand-over happened", kind.name());
    ensure!(
        counted == turns,
        "{}: the lock's counter saw {counted} of {turns} turns",
        kind.name()
    );
    Ok(elapsed.as_secs_f64() * 1e9 / turns as f64)
}

/// Panel id of the hand-over samples in the CSV.
const PANEL: &str = "handover/2-cores";

/// Measures every kind `ctx.runs` times and adds them to `fig`: a CSV-only panel (x = 2 cores,
/// y = ns per hand-over) and a table in the markdown. Needs two cores; says so otherwise.
pub fn append(ctx: &mut Ctx, fig: &mut Figure) -> anyhow::Result<()> {
    fig.extra_markdown
        .push_str("## Contended hand-over between two cores\n\n");
    if ctx.cores < 2 {
        fig.extra_markdown
            .push_str("Not measured: this machine has one core.\n\n");
        return Ok(());
    }
    let mut p = Panel::new(PANEL, "contended hand-over between two cores");
    p.x_label = "cores".into();
    p.y_label = "ns per hand-over".into();
    p.plotted = false;
    ctx.begin("handover", (Kind::ALL.len() * ctx.runs) as u64);
    for rep in 0..ctx.runs {
        for kind in Kind::ALL {
            ctx.status(format!("{} run {}", kind.name(), rep + 1));
            p.add(kind.name(), 2.0, measure(kind, ctx.window)?);
            ctx.tick();
        }
    }
    ctx.finish();
    let out = &mut fig.extra_markdown;
    out.push_str(
        "Two threads pinned to different cores take strict turns on one cache line holding a turn \
         counter, the lock and its counter: each waits for its turn, then increments the counter under \
         the lock and advances the turn inside the critical section (so the other thread is already \
         acquiring when the lock is released). Nanoseconds per turn, median (min–max) of the runs. A \
         lock that passes to another core at every acquisition, as it does when many cores queue for \
         it, runs at most 1000/ns Mops/s on one object; on two cores the barging locks (`std`, \
         `parking_lot`) mostly reacquire on the same core and exceed that. Input (b) of the model in \
         `bench/README.md`.\n\n\
         | hand-over of | ns per hand-over | at most, Mops/s on one object |\n| --- | ---: | ---: |\n",
    );
    for s in &p.series {
        let pt = &s.points[0];
        let _ = writeln!(
            out,
            "| {} | {} ({}–{}) | {} |",
            s.system,
            sig(pt.median()),
            sig(pt.min()),
            sig(pt.max()),
            sig(1e3 / pt.median())
        );
    }
    out.push('\n');
    fig.panels.push(p);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_hands_over() {
        for kind in Kind::ALL {
            let ns = measure(kind, Duration::from_millis(5)).unwrap();
            assert!(ns > 0.0, "{}", kind.name());
        }
    }
}
