//! Static segmentation (seed 002 §3.1, after Yoon et al., SIGMOD'18, "DSLR"): a client-side
//! range lock on one-sided regions. The server node only holds the words; clients do all the
//! work with `fetch_add`, `get` and `compare_exchange`.
//!
//! # Layout
//! The units are cut into fixed segments of 2⁸ units (the seed's size), and segment `s` has
//! word `s` of one region. A word packs two bakeries (seed §2.4), one for readers and one for
//! writers, as four 16-bit counters:
//!
//! ```text
//!  63          48 47          32 31          16 15           0
//! | write serving | write ticket | read serving |  read ticket |
//! ```
//!
//! so one `fetch_add` on a ticket field both draws a ticket and returns a snapshot of all four.
//!
//! # Locking one segment
//! A request adds 1 to its kind's ticket field; the snapshot `d` it gets back is its draw.
//! - A reader may go once `write serving == d.write ticket`: every writer that drew before it
//!   has left. Later writers cannot have left first (they wait for this reader), so the
//!   counter reaches that value exactly while the reader waits.
//! - A writer may go once `write serving == d.write ticket` (its own ticket) and
//!   `read serving == d.read ticket`: every reader and writer that drew before it has left.
//!
//! Until then it backs off and re-reads the word with `get`. Unlock adds 1 to its kind's
//! serving field. Readers share a segment; each bakery is FIFO, so nobody starves.
//!
//! **Backoff** (seed §5.2.2): `2 µs × writers ahead`, plus `1 µs × readers ahead` when the
//! request waits for readers (a writer, or the resetter below). "Ahead" is counted from the
//! latest word read: `d.write ticket − write serving` and `d.read ticket − read serving`. A
//! reader ignores the readers ahead of it (it does not wait for them), so readers retry faster
//! than writers, as in DSLR. A pause yields the fiber until its deadline passes (never a
//! busy-wait: at least one `yield_now` per poll).
//!
//! # Ranges, and why the segments are taken one at a time
//! A range takes every segment it touches, in ascending order, each *granted* before the next
//! ticket is drawn (hold and wait, in one global order). A request waits only for requests with
//! earlier tickets at the same segment; take the waiting request at the highest segment with the
//! earliest ticket there: whatever it waits for holds that segment and, by maximality, waits at
//! no higher one, so it is in its critical section and will leave. So no deadlock.
//! Drawing all the tickets of a range at once (one batch, one round trip) could deadlock: two
//! ranges over segments 1 and 2 may draw in opposite orders at the two words (nothing orders
//! operations on different words), each then waiting at one segment for the other, and a
//! ticket cannot be handed back. That is why this lock pays one round trip per segment.
//!
//! # Overflow: epochs and a reset
//! A field at `0xFFFF` would carry into its neighbour on the next `fetch_add`, so no field may
//! ever be incremented past `0xFFFF`. Each word lives through *epochs* of at most `T`
//! (the threshold, 2¹⁵) tickets of each kind:
//! - A word is *open* while both ticket fields are below `T`, *closed* otherwise.
//! - A draw whose snapshot is open is a *valid* ticket. The valid draw that takes ticket `T − 1`
//!   of its kind closes the word (its field becomes `T`): it is the *resetter*. Exactly one draw
//!   per epoch is (the only one moving the word from open to closed).
//! - A draw whose snapshot is closed is *void*: no ticket, nobody waits for it. Its client
//!   polls with `get` (2 µs between polls) until the word is open again, then draws again. Its
//!   increment stays in the ticket field until the reset wipes it.
//! - The resetter waits until `read serving == d.read ticket` and `write serving ==
//!   d.write ticket`: every valid request (all drew before it, since later draws are void) has
//!   left; this implies its own grant, whatever its kind. Then it swaps the word, with
//!   `compare_exchange`, for a fresh epoch in which it holds ticket 0 of its kind (its ticket
//!   field 1, every other field 0). A failed swap can only be a void draw arriving meanwhile
//!   (no one else may move a serving field: nobody else holds the segment); it retries with the
//!   word it got back. Its unlock later adds 1 to the fresh epoch's serving field.
//!
//! *No grant lost or doubled*: at the swap the resetter is the only valid request left (every
//! other valid one was served and left), void requests hold nothing and draw again, and the
//! fresh word records exactly the one holder there is, ahead of every later draw.
//! *No carry*: within an epoch a ticket field rises by at most `T` valid draws plus one void
//! draw per client (a client with a void draw does not draw again before it has seen the reset),
//! and a serving field never passes its ticket field; so a field stays at or below `0xFFFF`
//! while at most `0xFFFF − T` (32767) clients draw at one segment at once. Counters never
//! wrap inside an epoch, so plain comparisons are right.
//!
//! FIFO holds within an epoch; the void requests of a closed word re-draw after the reset in the
//! order they next poll, not in their arrival order. With `T = 2¹⁵` that happens once per 32767
//! tickets of a segment.
//!
//! # Round trips (`trips`)
//! Every operation waited on counts 1. A lock: per segment, 1 draw plus 1 per poll (`get`); a
//! reset adds 1 per `compare_exchange` (the first guesses the word from the last one seen, so
//! an uncontended reset costs 1); a void draw costs its draw and polls, then the draw again.
//! Uncontended, a lock costs 1 per segment. An unlock issues the serving increments of all its
//! segments together and waits for them together: 1 round trip (waited, so errors surface and
//! the release has taken effect when `unlock` returns).

use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use gossamer::{Done, Node, Region};
use rangelock::Mode;
use serde::{Deserialize, Serialize};

/// Units per segment, as a power of two (the seed's 2⁸).
const SEGMENT_BITS: u32 = 8;

/// Bit offsets of the four 16-bit counters in a segment's word.
const READ_TICKET: u32 = 0;
const READ_SERVING: u32 = 16;
const WRITE_TICKET: u32 = 32;
const WRITE_SERVING: u32 = 48;
const FIELD: u64 = 0xFFFF;
/// The serving counters of a word: only holders' unlocks move them.
const SERVING: u64 = (FIELD << READ_SERVING) | (FIELD << WRITE_SERVING);

/// Tickets of each kind per epoch: see "Overflow" in the module docs.
const THRESHOLD: u16 = 1 << 15;

/// Backoff per writer ahead of a waiting request.
const PER_WRITER_AHEAD: Duration = Duration::from_micros(2);
/// Backoff per reader ahead of a waiting writer (or resetter).
const PER_READER_AHEAD: Duration = Duration::from_micros(1);
/// Backoff between polls of a void request waiting for its segment's reset.
const CLOSED_POLL: Duration = Duration::from_micros(2);

/// Resets done, for the tests to see the path taken.
#[cfg(test)]
static RESETS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The lock's words, on the server node.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct Segments {
    words: Region,
    /// Words in `words`: one per segment.
    count: usize,
    units: u64,
    /// `T`: a draw of ticket `T − 1` closes the epoch (2 ≤ T ≤ 0xFFFF).
    threshold: u64,
}

/// What a client holds: enough to release it.
pub(crate) struct SegmentsHeld {
    segments: Range<usize>,
    mode: Mode,
}

/// A segment's word, unpacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Counters {
    read_ticket: u64,
    read_serving: u64,
    write_ticket: u64,
    write_serving: u64,
}

impl Counters {
    fn of(word: u64) -> Counters {
        let field = |shift: u32| (word >> shift) & FIELD;
        Counters {
            read_ticket: field(READ_TICKET),
            read_serving: field(READ_SERVING),
            write_ticket: field(WRITE_TICKET),
            write_serving: field(WRITE_SERVING),
        }
    }

    fn ticket(&self, mode: Mode) -> u64 {
        match mode {
            Mode::Read => self.read_ticket,
            Mode::Write => self.write_ticket,
        }
    }

    /// Whether valid tickets are still drawn from this word.
    fn is_open(&self, threshold: u64) -> bool {
        self.read_ticket < threshold && self.write_ticket < threshold
    }

    fn is_balanced(&self) -> bool {
        self.read_ticket == self.read_serving && self.write_ticket == self.write_serving
    }
}

fn ticket_shift(mode: Mode) -> u32 {
    match mode {
        Mode::Read => READ_TICKET,
        Mode::Write => WRITE_TICKET,
    }
}

fn serving_shift(mode: Mode) -> u32 {
    match mode {
        Mode::Read => READ_SERVING,
        Mode::Write => WRITE_SERVING,
    }
}

/// What a draw turned out to be (module docs, "Overflow").
enum Draw {
    Valid,
    /// Valid, and it closed the epoch: it resets the word once everyone before it left.
    Resetter,
    /// The word was closed: no ticket; draw again after the reset.
    Void,
}

fn classify(drawn: Counters, mode: Mode, threshold: u64) -> Draw {
    if !drawn.is_open(threshold) {
        Draw::Void
    } else if drawn.ticket(mode) == threshold - 1 {
        Draw::Resetter
    } else {
        Draw::Valid
    }
}

/// Whether the request that drew `drawn` may go now that the word reads `now`: every writer
/// before it has left and, if `readers_too`, every reader before it.
fn may_go(drawn: Counters, now: Counters, readers_too: bool) -> bool {
    now.write_serving == drawn.write_ticket
        && (!readers_too || now.read_serving == drawn.read_ticket)
}

/// How long to wait before polling again (module docs, "Backoff").
fn backoff(drawn: Counters, now: Counters, readers_too: bool) -> Duration {
    let writers = drawn.write_ticket.saturating_sub(now.write_serving);
    let readers = if readers_too {
        drawn.read_ticket.saturating_sub(now.read_serving)
    } else {
        0
    };
    PER_WRITER_AHEAD * writers as u32 + PER_READER_AHEAD * readers as u32
}

/// Lets the worker's other fibers run for `d` (at least once).
fn pause(d: Duration) {
    let until = Instant::now() + d;
    loop {
        gossamer::yield_now();
        if Instant::now() >= until {
            return;
        }
    }
}

/// Waits for one operation on segment `s`, counting its round trip. Region errors here are
/// bugs of the benchmark (a lost region, an index out of bounds).
fn waited<T>(done: Done<T>, trips: &mut u64, s: usize, what: &str) -> T {
    *trips += 1;
    done.wait()
        .unwrap_or_else(|e| panic!("static segmentation: {what} on segment {s} failed: {e}"))
}

impl Segments {
    /// A lock over `0..units` whose words live in a region on `node`.
    pub(crate) fn new(node: Node, units: u64) -> anyhow::Result<Segments> {
        Segments::with_threshold(node, units, THRESHOLD)
    }

    /// `new` with epochs of `threshold` tickets (the tests make it small to reset often).
    fn with_threshold(node: Node, units: u64, threshold: u16) -> anyhow::Result<Segments> {
        ensure!(threshold >= 2, "an epoch needs at least 2 tickets");
        let count = usize::try_from(units.div_ceil(1 << SEGMENT_BITS).max(1))?;
        let words = node
            .region(count)
            .with_context(|| format!("a region of {count} segment words"))?;
        Ok(Segments {
            words,
            count,
            units,
            threshold: threshold.into(),
        })
    }

    /// Takes `range` in `mode`, waiting (this fiber only) until granted. `trips` counts the
    /// round trips the client waited on.
    pub(crate) fn lock(&self, range: Range<u64>, mode: Mode, trips: &mut u64) -> SegmentsHeld {
        let segments = self.segments_of(&range);
        for s in segments.clone() {
            self.lock_segment(s, mode, trips);
        }
        SegmentsHeld { segments, mode }
    }

    /// Releases what `lock` took.
    pub(crate) fn unlock(&self, held: SegmentsHeld, trips: &mut u64) {
        let shift = serving_shift(held.mode);
        // Issued together, waited together: one round trip.
        let dones: Vec<(usize, Done<u64>)> = held
            .segments
            .map(|s| (s, self.words.fetch_add(s, 1 << shift)))
            .collect();
        if !dones.is_empty() {
            *trips += 1;
        }
        for (s, done) in dones {
            done.wait().unwrap_or_else(|e| {
                panic!("static segmentation: releasing segment {s} failed: {e}")
            });
        }
    }

    /// After every client has released: an error unless every segment is free and balanced.
    pub(crate) fn check_idle(&self) -> anyhow::Result<()> {
        let words = self
            .words
            .get(0, self.count)
            .wait()
            .context("reading the segments' words")?;
        for (s, &word) in words.iter().enumerate() {
            let c = Counters::of(word);
            let first = (s as u64) << SEGMENT_BITS;
            ensure!(
                c.is_balanced() && c.is_open(self.threshold),
                "segment {s} (units {first}..{}) is not idle: {c:?}",
                first + (1 << SEGMENT_BITS)
            );
        }
        Ok(())
    }

    /// The segments `range` touches.
    fn segments_of(&self, range: &Range<u64>) -> Range<usize> {
        assert!(
            range.start <= range.end && range.end <= self.units,
            "range {range:?} is not within the lock's 0..{}",
            self.units
        );
        if range.is_empty() {
            return 0..0;
        }
        let first = (range.start >> SEGMENT_BITS) as usize;
        let last = ((range.end - 1) >> SEGMENT_BITS) as usize;
        first..last + 1
    }

    /// Takes segment `s`: returns once granted.
    fn lock_segment(&self, s: usize, mode: Mode, trips: &mut u64) {
        let mine = 1u64 << ticket_shift(mode);
        loop {
            let before = waited(self.words.fetch_add(s, mine), trips, s, "drawing a ticket");
            let drawn = Counters::of(before);
            // The word right after the draw: the first guess of what it holds now.
            let after = before.wrapping_add(mine);
            match classify(drawn, mode, self.threshold) {
                Draw::Valid => {
                    self.await_turn(s, drawn, after, mode == Mode::Write, trips);
                    return;
                }
                Draw::Resetter => {
                    // Waiting for every reader and writer before it both grants it and
                    // drains the epoch.
                    let seen = self.await_turn(s, drawn, after, true, trips);
                    self.reset(s, mode, seen, trips);
                    return;
                }
                Draw::Void => self.await_reset(s, trips),
            }
        }
    }

    /// Polls segment `s` until the request that drew `drawn` may go (`may_go`), starting from
    /// `word`, a value it held after the draw. Returns the last word read.
    fn await_turn(
        &self,
        s: usize,
        drawn: Counters,
        mut word: u64,
        readers_too: bool,
        trips: &mut u64,
    ) -> u64 {
        loop {
            let now = Counters::of(word);
            if may_go(drawn, now, readers_too) {
                return word;
            }
            pause(backoff(drawn, now, readers_too));
            word = waited(self.words.get(s, 1), trips, s, "polling")[0];
        }
    }

    /// The resetter's swap: segment `s`, drained but for this request, starts a fresh epoch in
    /// which this request holds ticket 0 of its kind. `seen` is the last word read.
    fn reset(&self, s: usize, mode: Mode, seen: u64, trips: &mut u64) {
        let fresh = 1u64 << ticket_shift(mode);
        let mut expected = seen;
        loop {
            let swap = self.words.compare_exchange(s, expected, fresh);
            match waited(swap, trips, s, "resetting") {
                Ok(_) => break,
                Err(actual) => {
                    // Only void draws may land meanwhile: they move ticket fields alone.
                    assert_eq!(
                        actual & SERVING,
                        expected & SERVING,
                        "segment {s}: a serving counter moved while the segment was drained \
                         for its reset ({:?} then {:?})",
                        Counters::of(expected),
                        Counters::of(actual)
                    );
                    expected = actual;
                }
            }
        }
        #[cfg(test)]
        RESETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// A void draw's wait: polls segment `s` until its word is open again (reset).
    fn await_reset(&self, s: usize, trips: &mut u64) {
        loop {
            pause(CLOSED_POLL);
            let word = waited(self.words.get(s, 1), trips, s, "polling a closed segment")[0];
            if Counters::of(word).is_open(self.threshold) {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
    use std::sync::{LazyLock, Mutex};

    use rand::rngs::SmallRng;
    use rand::{RngExt, SeedableRng};

    use super::*;

    /// The benchmark's shape: 2¹⁶ units, ranges of 1..=2¹¹.
    const UNITS: u64 = 1 << 16;
    const LONGEST: u64 = 1 << 11;
    const CLIENTS: usize = 16;
    const LOCKS: usize = 300;
    const PATIENCE: Duration = Duration::from_secs(60);
    /// A shadow word held by a writer: this bit, the client in bits 32.., its lock number below.
    const WRITER_BIT: u64 = 1 << 63;

    /// One word per unit: a writer's tag, or the number of readers in it. Statics, since the
    /// client fibers are started with `spawn_on` (spread over the workers) and capture nothing.
    static SHADOW: LazyLock<Vec<AtomicU64>> =
        LazyLock::new(|| (0..UNITS).map(|_| AtomicU64::new(0)).collect());
    /// What each client is doing, for the timeout's message.
    static DOING: LazyLock<Vec<Mutex<String>>> =
        LazyLock::new(|| (0..CLIENTS).map(|_| Mutex::new(String::new())).collect());
    /// Clients finished (or panicked) in the current run.
    static FINISHED: AtomicUsize = AtomicUsize::new(0);

    #[test]
    fn grants_exclude_and_counters_reset() {
        let _turn = crate::harness::one_rack_at_a_time();
        let status = gossamer::Rack::from_env()
            .workers(2)
            .try_run(|| {
                let node = gossamer::this_node();
                let one = Segments::new(node, 1 << 9).unwrap();
                FINISHED.store(0, SeqCst);
                let crossing = gossamer::spawn_on(node, crosses_16_bits, one);
                await_clients(vec![crossing], "crossing 16 bits");
                stress(Segments::new(node, UNITS).unwrap(), 1, "threshold 2^15");
                let before = RESETS.load(SeqCst);
                let low = Segments::with_threshold(node, UNITS, 3).unwrap();
                stress(low, 2, "threshold 3");
                let resets = RESETS.load(SeqCst) - before;
                assert!(resets > 100, "threshold 3: only {resets} resets");
            })
            .expect("a one-node rack starts");
        assert_eq!(
            status, 0,
            "the rack's main panicked (see its message above)"
        );
    }

    /// One client, the production threshold: 70 000 locks of each kind on one word cross the
    /// 16-bit range twice (a carry would corrupt the word); uncontended trips are as documented.
    fn crosses_16_bits(lock: Segments) {
        let _finished = Finished;
        let n = 70_000u64;
        let resets = RESETS.load(SeqCst);
        let mut trips = 0;
        for i in 0..n {
            *DOING[0].lock().unwrap() = format!("lock {i} of {n} (read, then write)");
            for mode in [Mode::Read, Mode::Write] {
                let held = lock.lock(0..1, mode, &mut trips);
                lock.unlock(held, &mut trips);
            }
        }
        let resets = RESETS.load(SeqCst) - resets;
        // Read tickets close the epochs (drawn first): after 2¹⁵, then every 2¹⁵ − 1.
        assert_eq!(resets, 2, "resets in {n} locks of each kind");
        // A lock is 1 trip (a resetter's adds its swap), an unlock 1.
        assert_eq!(trips, 4 * n + resets);
        let word = Counters::of(lock.words.get(0, 1).wait().unwrap()[0]);
        let reads_in_epoch = (n - (1 << 15)) % ((1 << 15) - 1) + 1;
        assert_eq!(word.read_ticket, reads_in_epoch, "{word:?}");
        lock.check_idle().unwrap();

        // Two segments: 2 trips to lock, 1 to unlock.
        let mut trips = 0;
        let held = lock.lock(255..257, Mode::Write, &mut trips);
        assert_eq!((trips, held.segments.clone()), (2, 0..2));
        lock.unlock(held, &mut trips);
        assert_eq!(trips, 3);
        lock.check_idle().unwrap();
        *DOING[0].lock().unwrap() = "done".into();
    }

    /// `CLIENTS` fibers on the workers, each `LOCKS` random locks, checked on `SHADOW`.
    fn stress(lock: Segments, seed: u64, what: &str) {
        FINISHED.store(0, SeqCst);
        let node = gossamer::this_node();
        let clients: Vec<_> = (0..CLIENTS)
            .map(|me| gossamer::spawn_on(node, client, (lock.clone(), me, seed)))
            .collect();
        await_clients(clients, what);
        lock.check_idle()
            .unwrap_or_else(|e| panic!("{what}: after every release: {e:#}"));
    }

    /// Joins `clients` (counted from `FINISHED` = 0), or panics after `PATIENCE` with what
    /// the unfinished ones were doing.
    fn await_clients(clients: Vec<gossamer::RemoteJoinHandle<()>>, what: &str) {
        let n = clients.len();
        let deadline = Instant::now() + PATIENCE;
        while FINISHED.load(SeqCst) < n {
            if Instant::now() > deadline {
                let doing: Vec<String> = DOING
                    .iter()
                    .take(n)
                    .enumerate()
                    .map(|(c, d)| format!("client {c}: {}", d.lock().unwrap()))
                    .filter(|d| !d.ends_with("done"))
                    .collect();
                panic!("{what}: clients still awaiting grants after {PATIENCE:?}: {doing:?}");
            }
            pause(Duration::from_millis(1));
        }
        for c in clients {
            c.join();
        }
    }

    /// Counts a client finished even when it panics, so the wait above ends at once.
    struct Finished;

    impl Drop for Finished {
        fn drop(&mut self) {
            FINISHED.fetch_add(1, SeqCst);
        }
    }

    fn client((lock, me, seed): (Segments, usize, u64)) {
        let _finished = Finished;
        let mut rng = SmallRng::seed_from_u64(seed * 1000 + me as u64);
        let mut trips = 0;
        for i in 0..LOCKS {
            let len = rng.random_range(1..=LONGEST);
            let start = rng.random_range(0..=UNITS - len);
            let range = start..start + len;
            let mode = if rng.random_bool(0.3) {
                Mode::Write
            } else {
                Mode::Read
            };
            *DOING[me].lock().unwrap() = format!("lock {i}, {mode:?} {range:?}");
            let held = lock.lock(range.clone(), mode, &mut trips);
            let tag = WRITER_BIT | (me as u64) << 32 | i as u64;
            enter(&range, mode, tag);
            for _ in 0..rng.random_range(1..=3) {
                gossamer::yield_now();
            }
            leave(&range, mode, tag);
            *DOING[me].lock().unwrap() = format!("unlock {i}, {mode:?} {range:?}");
            lock.unlock(held, &mut trips);
        }
        *DOING[me].lock().unwrap() = "done".into();
    }

    fn holder(word: u64) -> String {
        if word & WRITER_BIT != 0 {
            let client = (word & !WRITER_BIT) >> 32;
            format!(
                "client {client} writes it (its lock {})",
                word & 0xFFFF_FFFF
            )
        } else {
            format!("{word} readers hold it")
        }
    }

    /// Marks the granted `range` in the shadow, panicking on a conflict.
    fn enter(range: &Range<u64>, mode: Mode, tag: u64) {
        for u in range.clone() {
            let unit = &SHADOW[u as usize];
            match mode {
                Mode::Write => {
                    if let Err(now) = unit.compare_exchange(0, tag, SeqCst, SeqCst) {
                        panic!(
                            "unit {u}: granted to writer {} while {}",
                            holder(tag),
                            holder(now)
                        );
                    }
                }
                Mode::Read => {
                    let before = unit.fetch_add(1, SeqCst);
                    assert!(
                        before & WRITER_BIT == 0,
                        "unit {u}: granted to a reader while {}",
                        holder(before)
                    );
                }
            }
        }
    }

    /// Undoes `enter`, checking nobody else changed the units meanwhile.
    fn leave(range: &Range<u64>, mode: Mode, tag: u64) {
        for u in range.clone() {
            let unit = &SHADOW[u as usize];
            match mode {
                Mode::Write => {
                    if let Err(now) = unit.compare_exchange(tag, 0, SeqCst, SeqCst) {
                        panic!("unit {u}: {} held it, but {}", holder(tag), holder(now));
                    }
                }
                Mode::Read => {
                    let before = unit.fetch_sub(1, SeqCst);
                    assert!(
                        before & WRITER_BIT == 0 && before > 0,
                        "unit {u}: a reader leaves while {}",
                        holder(before)
                    );
                }
            }
        }
    }
}
