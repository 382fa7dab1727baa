//! How long a waiting thread spins before it blocks: an idle worker waiting for work, and a
//! plain thread waiting for its answer.
//!
//! Spinning pays when the awaited event comes within the spin and the core is the waiter's
//! own: the event is taken at once instead of after a wake-up (tens of microseconds on a
//! virtual machine). It costs when the core is shared: the spinning thread holds the core that
//! the thread it waits for may need, and a thread that never sleeps loses the scheduler's
//! wake-up preference, so it then runs only in turns of whole time slices (milliseconds) with
//! the other threads of its core. A fixed spin is right for one case and wrong for the other,
//! so the spin is a [`SpinPolicy`] that learns from what the waits it ran observed.
//!
//! # What a wait observes
//!
//! A wait spins for the policy's budget, reading the clock every turn, then parks. It reports
//! one [`Episode`]: how long it spun, the largest gap between two clock reads of its spin
//! loop, how long the thread has waited for a CPU (sampled at most once per
//! [`SAMPLE_INTERVAL`]), and whether the event came during the spin or, after how long a
//! sleep, during the park.
//!
//! * **Contention: a gap.** One turn of a spin loop takes well under a microsecond (a turn
//!   that polls a worker's sockets, about two). A gap of [`PREEMPTED_GAP`] or more means the
//!   thread lost its core in the middle of its spin for about a time slice: another thread
//!   wanted that core (or the hypervisor took the virtual CPU). The signal is free (the loop
//!   reads the clock anyway). Shorter gaps are no sign: on the 2-vCPU VM the project is
//!   measured on, idle spin loops see gaps of 20–23 µs many times a second (interrupts), and
//!   a threshold of 20 µs stopped an idle rack's spin often enough to raise its p99 from 1.5
//!   to 17–28 µs (bench/README, "The adaptive spin"). But a gap is rare under contention
//!   too: a thread that sleeps often is favoured by the scheduler and is seldom preempted
//!   while it spins.
//! * **Contention: a crowded core.** That is the case that costs: the waiter holds a core
//!   while another runnable thread (perhaps the one it waits for) has none. The scheduler
//!   counts, for each thread, the time it spent runnable but waiting for a CPU — after a
//!   preemption, and after a wake-up until a CPU takes it (the run delay of
//!   `/proc/thread-self/schedstat`, one `pread` of 0.5 µs in a one-off loop, at most once per
//!   [`SAMPLE_INTERVAL`] per thread, only after waits that spun). A thread that waited for a
//!   CPU a [`CROWDED_SHARE`]th of the time since its previous sample, with a spin that ran
//!   out in between, in [`CROWDED_SAMPLES`] samples in a row, counts as contended. The signal
//!   is the thread's own, so it does not mistake the other spinning workers of an idle rack
//!   (each on a core of its own) for crowding, as a machine-wide count of runnable threads
//!   did; and a sleeper that seldom loses its core still counts the waits after its wake-ups
//!   (beside one busy loop per core, `gsm demo`'s dedicated trustee kept the figures it had
//!   with the machine-wide count; bench/README, "The signal, revised"). In a one-off program
//!   on the 2-vCPU VM (2026-11-29, not kept), two threads passing a value back and forth with
//!   a 50 µs spin waited for a CPU about half their time beside one busy loop per core; idle,
//!   a rack's worker waited about 3 % (read from `/proc/PID/task/*/schedstat` during `bench
//!   rack`), with single 4 ms windows at 25–50 % now and then, which the two samples in a row
//!   filter out. Spins that pay on a crowded core are
//!   left alone: the event came, and the thread would have run for it anyway.
//! * **Payment.** The event came during the spin: spinning paid. The event came during the
//!   park, but spin and sleep together were within the ceiling: a longer spin would have
//!   paid. Otherwise the spin was a miss: it burnt its budget and the thread slept anyway.
//!
//! # The policy
//!
//! The budget lies between a floor (a sixteenth of the ceiling) and the ceiling, and starts
//! at the ceiling (the user's `Builder::spin` or `GSM_SPIN` with adaptation off is a
//! [`SpinSetting::Fixed`] spin that none of this touches).
//!
//! 1. A spin that paid, or a park that a longer spin would have saved, doubles the budget (up
//!    to the ceiling) and clears the count of misses.
//! 2. [`MISS_LIMIT`] misses in a row halve the budget (down to the floor).
//! 3. Contention (a gap, or a crowded core) stops spinning for a cool-down: the budget is
//!    zero until it ends, then the next spin is a probe with the floor budget, which grows
//!    back by (1). The cool-down starts at [`MIN_COOLDOWN`]; contention seen again within
//!    [`MAX_COOLDOWN`] of the previous cool-down's end doubles it, up to [`MAX_COOLDOWN`];
//!    contention seen later starts again at the minimum. While cooling down, waits teach
//!    nothing (they did not spin).
//!
//! # Why it does not oscillate
//!
//! * Each episode changes the budget by at most a factor of two, within `[floor, ceiling]`.
//!   A shrink needs [`MISS_LIMIT`] misses in a row, a growth one success, so any pattern with
//!   a success at least every `MISS_LIMIT` episodes keeps the budget where it is or raises it:
//!   an alternating pattern of hits and misses holds the ceiling (hysteresis), and only a run
//!   of misses walks it down, one halving per `MISS_LIMIT` misses.
//! * Under lasting contention the cool-downs double to [`MAX_COOLDOWN`] and stay there: the
//!   waiter then spins only between a cool-down's end and the next sign of contention (on a
//!   crowded core where spins run out, [`CROWDED_SAMPLES`] sample intervals) per
//!   cool-down, a bounded share of its core, however long the contention lasts. It never
//!   switches between spinning and not faster than once per [`MIN_COOLDOWN`].
//! * One crowded sample does not count: a thread on an otherwise idle core still waits for it
//!   now and then (a kernel thread, another program's short burst), and [`CROWDED_SAMPLES`]
//!   in a row filter that out.
//! * When the contention ends the probes stop seeing gaps and run delay, and the budget is back at the
//!   ceiling after at most one cool-down and `log2(16) = 4` paying episodes.
//!
//! The policy never reads the clock: every input carries its `Instant`, so the tests below
//! drive it with a fake clock.

use std::time::{Duration, Instant};

/// The longest an idle worker spins before it blocks when [`Builder::spin`] is not set: the
/// ceiling of its adaptive spin. Fifty microseconds catch the answers of remote calls on
/// loopback (bench/README, "The spin before blocking", has the measurements).
///
/// [`Builder::spin`]: crate::Builder::spin
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);
/// The longest a plain thread spins for its answer before it blocks when [`Builder::spin`] is
/// not set. Longer than a worker's: a plain thread has nothing else to do, and its answer
/// often waits for a trustee's wake-up first. (It replaces a fixed 20 000 checks, which took
/// 0.47 ms on the 2-core EPYC machine the project is measured on.)
///
/// [`Builder::spin`]: crate::Builder::spin
pub const PLAIN_THREAD_SPIN: Duration = Duration::from_micros(500);
/// A gap between two clock reads of a spin loop at least this long means the thread lost its
/// core during the spin.
pub(crate) const PREEMPTED_GAP: Duration = Duration::from_micros(200);
/// The shortest time between two samples of a thread's wait for a CPU.
pub(crate) const SAMPLE_INTERVAL: Duration = Duration::from_millis(4);
/// A thread that waited for a CPU at least this share (1/N) of the time between two samples
/// found its core crowded.
pub(crate) const CROWDED_SHARE: u32 = 4;
/// Crowded samples in a row, each after a spin that ran out, that count as contention.
pub(crate) const CROWDED_SAMPLES: u32 = 2;
/// Misses in a row that halve the budget.
pub(crate) const MISS_LIMIT: u32 = 4;
/// The first cool-down after contention.
pub(crate) const MIN_COOLDOWN: Duration = Duration::from_millis(1);
/// The longest cool-down, which repeated contention reaches.
pub(crate) const MAX_COOLDOWN: Duration = Duration::from_millis(64);
/// The floor budget is the ceiling divided by this.
const FLOOR_DIVISOR: u32 = 16;

/// How a runtime's waits spin: for a fixed time, or as the policy learns, up to a ceiling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SpinSetting {
    /// Always spin this long (`Duration::ZERO`: never spin). What the user asked for.
    Fixed(Duration),
    /// Spin as [`SpinPolicy`] decides, never longer than the ceiling.
    Adaptive { ceiling: Duration },
}

impl SpinSetting {
    /// The user's fixed spin if there is one, else an adaptive spin up to `ceiling`.
    pub(crate) fn new(fixed: Option<Duration>, ceiling: Duration) -> Self {
        match fixed {
            Some(spin) => SpinSetting::Fixed(spin),
            None => SpinSetting::Adaptive { ceiling },
        }
    }
}

/// How one wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The event came during the spin.
    Paid,
    /// The spin ran out; the thread parked and was woken after `slept`.
    Parked { slept: Duration },
}

/// What one wait observed, reported to [`SpinPolicy::learn`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Episode {
    /// When the wait ended.
    pub(crate) ended: Instant,
    /// How long it spun.
    pub(crate) spun: Duration,
    /// The largest gap between two clock reads of its spin loop.
    pub(crate) largest_gap: Duration,
    /// The thread's whole wait for a CPU ([`waited_for_cpu`]), read after it when a sample
    /// was due (see [`SpinPolicy::sample_due`]); `None` when none was taken.
    pub(crate) waited: Option<Duration>,
    pub(crate) outcome: Outcome,
}

/// One waiting thread's spin policy; see the module docs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SpinPolicy {
    setting: SpinSetting,
    /// How long the next spin may last once any cool-down is over.
    budget: Duration,
    /// Misses in a row since the last success or halving.
    misses: u32,
    /// The last cool-down's length (zero before any contention).
    cooldown: Duration,
    /// When the last cool-down ends (ended); `None` before any contention.
    cool_until: Option<Instant>,
    /// The last sample: when, and the thread's whole wait for a CPU then.
    last_waited: Option<(Instant, Duration)>,
    /// Crowded samples in a row, each after a wasted spin.
    crowded: u32,
    /// Whether a spin ran out (the thread parked after spinning) since the last sample.
    wasted: bool,
}

impl SpinPolicy {
    pub(crate) fn new(setting: SpinSetting) -> Self {
        let budget = match setting {
            SpinSetting::Fixed(spin) => spin,
            SpinSetting::Adaptive { ceiling } => ceiling,
        };
        SpinPolicy {
            setting,
            budget,
            misses: 0,
            cooldown: Duration::ZERO,
            cool_until: None,
            last_waited: None,
            crowded: 0,
            wasted: false,
        }
    }

    /// Follows `setting`, starting afresh if it differs from the one followed so far (a plain
    /// thread keeps one policy for every runtime it calls).
    pub(crate) fn follow(&mut self, setting: SpinSetting) {
        if self.setting != setting {
            *self = SpinPolicy::new(setting);
        }
    }

    /// How long a wait that starts at `now` may spin.
    pub(crate) fn budget(&self, now: Instant) -> Duration {
        match self.cool_until {
            Some(until) if now < until => Duration::ZERO,
            _ => self.budget,
        }
    }

    /// Whether a wait that ended at `now` after spinning for `spun` should sample the thread's
    /// wait for a CPU ([`waited_for_cpu`]): adaptive, it spun, and the last sample is at least
    /// [`SAMPLE_INTERVAL`] old. (Where the file cannot be read no sample is ever taken and
    /// one stays due; where it could not be opened, trying costs no system call.)
    pub(crate) fn sample_due(&self, now: Instant, spun: Duration) -> bool {
        matches!(self.setting, SpinSetting::Adaptive { .. })
            && !spun.is_zero()
            && self
                .last_waited
                .is_none_or(|(at, _)| now - at >= SAMPLE_INTERVAL)
    }

    /// Learns from one wait (nothing with a fixed setting).
    pub(crate) fn learn(&mut self, episode: Episode) {
        let SpinSetting::Adaptive { ceiling } = self.setting else {
            return;
        };
        self.wasted |= !episode.spun.is_zero() && episode.outcome != Outcome::Paid;
        if let Some(waited) = episode.waited {
            let crowded = self.last_waited.is_some_and(|(at, before)| {
                waited.saturating_sub(before) * CROWDED_SHARE >= episode.ended - at
            });
            self.last_waited = Some((episode.ended, waited));
            // Spins that pay on a crowded machine cost nobody anything: the event came, and
            // the thread would have run for it anyway. Spins that ran out held a core that a
            // runnable thread lacked.
            self.crowded = if crowded && self.wasted {
                self.crowded + 1
            } else {
                0
            };
            self.wasted = false;
        }
        if episode.largest_gap >= PREEMPTED_GAP || self.crowded >= CROWDED_SAMPLES {
            return self.contended(episode.ended, ceiling);
        }
        // A wait in a cool-down did not spin: it tells nothing about spinning.
        let cooling = self.cool_until.is_some_and(|until| episode.ended < until);
        if cooling && episode.spun.is_zero() {
            return;
        }
        let floor = ceiling / FLOOR_DIVISOR;
        let paid = match episode.outcome {
            Outcome::Paid => true,
            Outcome::Parked { slept } => episode.spun + slept <= ceiling,
        };
        if paid {
            self.budget = (self.budget * 2).clamp(floor, ceiling);
            self.misses = 0;
        } else {
            self.misses += 1;
            if self.misses >= MISS_LIMIT {
                self.budget = (self.budget / 2).max(floor);
                self.misses = 0;
            }
        }
    }

    /// Stops spinning for a cool-down, longer if the last one ended only just before.
    fn contended(&mut self, now: Instant, ceiling: Duration) {
        let repeated = self
            .cool_until
            .is_some_and(|until| now < until + MAX_COOLDOWN);
        self.cooldown = if repeated {
            (self.cooldown * 2).min(MAX_COOLDOWN)
        } else {
            MIN_COOLDOWN
        };
        self.cool_until = Some(now + self.cooldown);
        self.budget = ceiling / FLOOR_DIVISOR;
        self.misses = 0;
        self.crowded = 0;
    }
}

/// One wait as the module docs describe it: spins while `policy` allows, calling `ready` with
/// the clock of each turn until it says the event came, else parks (`park` returns once the
/// event came), then tells `policy` how the wait went. Returns how long it spun and how long
/// it slept.
pub(crate) fn wait(
    policy: &mut SpinPolicy,
    mut ready: impl FnMut(Instant) -> bool,
    park: impl FnOnce(),
) -> (Duration, Duration) {
    let started = Instant::now();
    let budget = policy.budget(started);
    let mut last = started;
    let mut largest_gap = Duration::ZERO;
    let paid = loop {
        let now = Instant::now();
        largest_gap = largest_gap.max(now - last);
        last = now;
        if ready(now) {
            break true;
        }
        if now - started >= budget {
            break false;
        }
        std::hint::spin_loop();
    };
    let spun = last - started;
    let (ended, slept) = if paid {
        (last, Duration::ZERO)
    } else {
        park();
        let woken = Instant::now();
        (woken, woken - last)
    };
    let outcome = if paid {
        Outcome::Paid
    } else {
        Outcome::Parked { slept }
    };
    let waited = policy
        .sample_due(ended, spun)
        .then(waited_for_cpu)
        .flatten();
    policy.learn(Episode {
        ended,
        spun,
        largest_gap,
        waited,
        outcome,
    });
    (spun, slept)
}

/// How long the calling thread has waited, in all, for a CPU while it was runnable (the
/// scheduler's run delay, see [`SchedStat`]): a preempted thread waits there for its next
/// turn, and a woken one until a CPU takes it. `None` where that cannot be read: without the
/// signal the policy still sees gaps.
pub(crate) fn waited_for_cpu() -> Option<Duration> {
    thread_local! {
        // Opened by the thread that reads it, so it names that thread for good.
        static SCHEDSTAT: Option<std::fs::File> = SchedStat::open_own();
    }
    let stat = SCHEDSTAT
        .try_with(|f| f.as_ref().and_then(SchedStat::read))
        .ok()??;
    Some(stat.run_delay)
}

/// A thread's totals in the scheduler's accounting, `/proc/thread-self/schedstat` ("on-CPU
/// ns, run delay ns, time slices").
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SchedStat {
    /// Time it ran on a CPU.
    pub(crate) on_cpu: Duration,
    /// Time it waited for a CPU while runnable.
    pub(crate) run_delay: Duration,
}

impl SchedStat {
    /// The calling thread's schedstat file: the open file keeps naming this thread, whoever
    /// reads it later. `None` where there is none (not Linux, no `/proc`).
    pub(crate) fn open_own() -> Option<std::fs::File> {
        std::fs::File::open("/proc/thread-self/schedstat").ok()
    }

    /// The totals now, from a file [`SchedStat::open_own`] opened.
    pub(crate) fn read(file: &std::fs::File) -> Option<SchedStat> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 96];
        let len = file.read_at(&mut buf, 0).ok()?;
        SchedStat::parse(&buf[..len])
    }

    fn parse(text: &[u8]) -> Option<SchedStat> {
        let text = std::str::from_utf8(text).ok()?;
        let mut fields = text.split_ascii_whitespace();
        let mut next =
            || -> Option<Duration> { Some(Duration::from_nanos(fields.next()?.parse().ok()?)) };
        Some(SchedStat {
            on_cpu: next()?,
            run_delay: next()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CEILING: Duration = Duration::from_micros(50);
    const FLOOR: Duration = Duration::from_nanos(3125);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// A policy with the default ceiling and a fake clock that only the test moves.
    struct Fake {
        policy: SpinPolicy,
        now: Instant,
        /// The thread's whole wait for a CPU, and when it was last sampled.
        waited: Duration,
        last_sample: Option<Instant>,
    }

    impl Fake {
        fn new() -> Self {
            Fake {
                policy: SpinPolicy::new(SpinSetting::Adaptive { ceiling: CEILING }),
                now: Instant::now(),
                waited: Duration::ZERO,
                last_sample: None,
            }
        }

        fn budget(&self) -> Duration {
            self.policy.budget(self.now)
        }

        /// A wait that spins as the policy allows, on its core all the time: the event comes
        /// after `wait`.
        fn wait(&mut self, wait: Duration) {
            self.episode(wait, None);
        }

        /// A wait as [`Fake::wait`] that then samples the thread's wait for a CPU: half the
        /// time since the last sample if `crowded`, else nothing more.
        fn sampled(&mut self, wait: Duration, crowded: bool) {
            self.episode(wait, Some(crowded));
        }

        fn episode(&mut self, wait: Duration, crowded: Option<bool>) {
            let budget = self.budget();
            let (spun, outcome) = if wait < budget {
                (wait, Outcome::Paid)
            } else {
                let slept = wait - budget;
                (budget, Outcome::Parked { slept })
            };
            self.now += wait;
            let waited = crowded.map(|crowded| {
                assert!(self.policy.sample_due(self.now, spun), "a sample is due");
                let since = self.now - self.last_sample.unwrap_or(self.now);
                if crowded {
                    self.waited += since / 2;
                }
                self.last_sample = Some(self.now);
                self.waited
            });
            self.policy.learn(Episode {
                ended: self.now,
                spun,
                largest_gap: Duration::from_nanos(200).min(spun),
                waited,
                outcome,
            });
        }

        /// A wait whose spin lost its core for `gap` (a time slice of another thread), after
        /// which the event was there.
        fn preempted(&mut self, gap: Duration) {
            let spun = self.budget() + gap;
            self.now += spun;
            self.policy.learn(Episode {
                ended: self.now,
                spun,
                largest_gap: gap,
                waited: None,
                outcome: Outcome::Paid,
            });
        }

        fn idle(&mut self, d: Duration) {
            self.now += d;
        }
    }

    #[test]
    fn spins_that_pay_on_idle_cores_keep_the_ceiling() {
        let mut f = Fake::new();
        assert_eq!(f.budget(), CEILING);
        for wait in [5, 30, 49, 1, 12].repeat(20) {
            f.wait(us(wait));
            assert_eq!(f.budget(), CEILING, "after a paying wait of {wait} µs");
        }
    }

    #[test]
    fn misses_in_a_row_shrink_the_spin_to_the_floor_and_paying_waits_grow_it_back() {
        let mut f = Fake::new();
        let mut budgets = Vec::new();
        for _ in 0..5 * MISS_LIMIT {
            f.wait(us(500));
            budgets.push(f.budget());
        }
        // One halving per MISS_LIMIT misses: 25, 12.5, 6.25, then the floor.
        let at_limits: Vec<_> = budgets
            .chunks(MISS_LIMIT as usize)
            .map(|c| *c.last().unwrap())
            .collect();
        let ns = Duration::from_nanos;
        assert_eq!(at_limits, [us(25), ns(12_500), ns(6250), FLOOR, FLOOR]);
        assert!(budgets.iter().all(|&b| b >= FLOOR));
        // A park that a longer spin would have saved (spin and sleep within the ceiling)
        // doubles the budget, without spinning longer first.
        let mut grown = Vec::new();
        for _ in 0..5 {
            f.wait(us(40));
            grown.push(f.budget());
        }
        assert_eq!(grown, [ns(6250), ns(12_500), us(25), CEILING, CEILING]);
    }

    #[test]
    fn hits_among_misses_hold_the_ceiling() {
        let mut f = Fake::new();
        for round in 0..100 {
            for _ in 0..MISS_LIMIT - 1 {
                f.wait(us(900));
            }
            f.wait(us(10));
            assert_eq!(f.budget(), CEILING, "round {round}");
        }
    }

    #[test]
    fn contention_stops_spinning_then_probes_after_the_cool_down() {
        let mut f = Fake::new();
        f.wait(us(10));
        f.preempted(Duration::from_millis(3));
        let cooled = f.now;
        assert_eq!(f.budget(), Duration::ZERO, "no spin in the cool-down");
        // Waits in the cool-down do not spin and teach nothing, however long they sleep.
        for wait in [5, 300, 5, 600] {
            f.wait(us(wait));
            assert_eq!(f.budget(), Duration::ZERO);
        }
        f.now = cooled + MIN_COOLDOWN;
        assert_eq!(f.budget(), FLOOR, "a probe with the floor budget");
        // Probes that pay without a gap grow the spin back to the ceiling.
        let ns = Duration::from_nanos;
        for want in [ns(6250), ns(12_500), us(25), CEILING, CEILING] {
            f.wait(us(2));
            assert_eq!(f.budget(), want);
        }
    }

    /// Moves the clock to the end of the cool-down; returns how long it was.
    fn sit_out(f: &mut Fake) -> Duration {
        let start = f.now;
        while f.budget().is_zero() {
            f.idle(us(100));
        }
        f.now - start
    }

    #[test]
    fn repeated_contention_doubles_the_cool_down_up_to_its_bound() {
        let mut f = Fake::new();
        let mut cooldowns = Vec::new();
        for _ in 0..10 {
            // The probe that ends each cool-down is preempted again.
            f.preempted(us(500));
            cooldowns.push(sit_out(&mut f));
        }
        let ms = Duration::from_millis;
        let want = [1, 2, 4, 8, 16, 32, 64, 64, 64, 64].map(ms);
        assert_eq!(cooldowns, want);
    }

    #[test]
    fn contention_long_after_the_last_starts_again_at_the_shortest_cool_down() {
        let mut f = Fake::new();
        for _ in 0..4 {
            f.preempted(us(500));
            sit_out(&mut f);
        }
        f.idle(Duration::from_secs(1));
        f.preempted(PREEMPTED_GAP);
        assert_eq!(sit_out(&mut f), MIN_COOLDOWN);
    }

    #[test]
    fn a_gap_below_the_threshold_is_no_contention() {
        let mut f = Fake::new();
        f.preempted(PREEMPTED_GAP - Duration::from_nanos(1));
        assert_eq!(f.budget(), CEILING);
        f.preempted(PREEMPTED_GAP);
        assert_eq!(f.budget(), Duration::ZERO);
    }

    #[test]
    fn lasting_contention_spins_a_bounded_share_of_the_time() {
        // Events come every 10 µs; every 50th spin loses its core for a 3 ms time slice.
        let mut f = Fake::new();
        let start = f.now;
        let (mut spun, mut spins, mut switches) = (Duration::ZERO, 0, 0);
        let mut was_spinning = true;
        while f.now - start < Duration::from_secs(10) {
            let budget = f.budget();
            if budget.is_zero() == was_spinning {
                switches += 1;
                was_spinning = !budget.is_zero();
            }
            if budget.is_zero() {
                f.wait(us(10));
                continue;
            }
            spins += 1;
            if spins % 50 == 0 {
                spun += budget;
                f.preempted(Duration::from_millis(3));
            } else {
                spun += budget.min(us(10));
                f.wait(us(10));
            }
        }
        // The cool-downs reach 64 ms and stay there: under 1% of the time spent spinning, and
        // two switches per cool-down.
        assert!(spun < Duration::from_millis(100), "spun {spun:?} in 10 s");
        assert!(switches <= 2 * (10_000 / 64 + 8), "{switches} switches");
    }

    #[test]
    fn crowded_samples_after_wasted_spins_stop_spinning_and_one_alone_does_not() {
        let mut f = Fake::new();
        // Waits of 500 µs: every spin runs out.
        f.sampled(us(500), true);
        assert!(!f.budget().is_zero(), "one crowded sample");
        f.idle(SAMPLE_INTERVAL);
        f.sampled(us(500), false);
        f.idle(SAMPLE_INTERVAL);
        f.sampled(us(500), true);
        assert!(
            !f.budget().is_zero(),
            "a clear sample in between starts the count again"
        );
        // Waits without a sample between two crowded samples leave the count alone.
        f.wait(us(10));
        f.idle(SAMPLE_INTERVAL);
        f.sampled(us(500), true);
        assert_eq!(
            f.budget(),
            Duration::ZERO,
            "{CROWDED_SAMPLES} crowded samples in a row"
        );
        assert_eq!(sit_out(&mut f), MIN_COOLDOWN);
    }

    #[test]
    fn spins_that_pay_on_a_crowded_machine_keep_the_ceiling() {
        let mut f = Fake::new();
        for sample in 0..100 {
            f.idle(SAMPLE_INTERVAL);
            f.sampled(us(10), true);
            assert_eq!(f.budget(), CEILING, "sample {sample}");
        }
        // A wasted spin since the last sample makes the next crowded sample count.
        f.wait(us(900));
        f.idle(SAMPLE_INTERVAL);
        f.sampled(us(10), true);
        f.wait(us(900));
        f.idle(SAMPLE_INTERVAL);
        f.sampled(us(10), true);
        assert_eq!(f.budget(), Duration::ZERO);
    }

    #[test]
    fn samples_are_due_at_most_once_per_interval_and_only_after_a_spin() {
        let mut f = Fake::new();
        assert!(f.policy.sample_due(f.now, us(5)), "the first is due");
        f.sampled(us(5), false);
        assert!(!f.policy.sample_due(f.now + SAMPLE_INTERVAL - us(1), us(5)));
        assert!(!f.policy.sample_due(f.now + SAMPLE_INTERVAL, Duration::ZERO));
        assert!(f.policy.sample_due(f.now + SAMPLE_INTERVAL, us(5)));
        let fixed = SpinPolicy::new(SpinSetting::Fixed(us(50)));
        assert!(
            !fixed.sample_due(f.now, us(50)),
            "a fixed spin samples nothing"
        );
    }

    #[test]
    fn a_crowded_sample_spent_a_quarter_of_its_time_waiting_for_a_cpu() {
        let mut policy = SpinPolicy::new(SpinSetting::Adaptive { ceiling: CEILING });
        let start = Instant::now();
        let mut sample = |ms: u64, waited_us: u64| {
            let ended = start + Duration::from_millis(ms);
            assert!(policy.sample_due(ended, CEILING));
            policy.learn(Episode {
                ended,
                spun: CEILING,
                largest_gap: us(1),
                waited: Some(us(waited_us)),
                outcome: Outcome::Parked { slept: us(900) },
            });
            !policy.budget(ended).is_zero()
        };
        // The first sample has nothing to compare with; then 4 ms with 999 µs of waiting
        // (under a quarter), twice: no contention.
        assert!(sample(10, 7_000));
        assert!(sample(14, 7_999));
        assert!(sample(18, 8_998));
        // 1 ms in 4 ms, twice in a row, after spins that ran out: contention.
        assert!(sample(22, 9_998));
        assert!(
            !sample(26, 10_998),
            "{CROWDED_SAMPLES} crowded samples in a row"
        );
    }

    #[test]
    fn the_wait_for_a_cpu_is_read_from_schedstat() {
        let ns = Duration::from_nanos;
        let parsed = |text: &[u8]| SchedStat::parse(text).map(|s| (s.on_cpu, s.run_delay));
        assert_eq!(
            parsed(b"328266394 147138 42\n"),
            Some((ns(328_266_394), ns(147_138)))
        );
        assert_eq!(parsed(b"0 0 0"), Some((Duration::ZERO, Duration::ZERO)));
        assert_eq!(parsed(b"328266394"), None);
        assert_eq!(parsed(b"1 x 2"), None);
        // The live file parses, on this thread and on another.
        assert!(waited_for_cpu().is_some(), "/proc/thread-self/schedstat");
        let other = std::thread::spawn(waited_for_cpu).join().unwrap();
        assert!(other.is_some());
    }

    #[test]
    fn a_fixed_setting_never_changes() {
        for spin in [Duration::ZERO, us(50), Duration::from_millis(1)] {
            let mut policy = SpinPolicy::new(SpinSetting::Fixed(spin));
            let now = Instant::now();
            for gap in [us(1), Duration::from_millis(5)] {
                policy.learn(Episode {
                    ended: now,
                    spun: spin,
                    largest_gap: gap,
                    waited: Some(us(900)),
                    outcome: Outcome::Parked { slept: us(900) },
                });
                assert_eq!(policy.budget(now), spin);
            }
        }
    }

    #[test]
    fn following_another_setting_starts_afresh() {
        let mut policy = SpinPolicy::new(SpinSetting::Adaptive { ceiling: CEILING });
        let now = Instant::now();
        policy.learn(Episode {
            ended: now,
            spun: CEILING,
            largest_gap: PREEMPTED_GAP,
            waited: None,
            outcome: Outcome::Paid,
        });
        assert_eq!(policy.budget(now), Duration::ZERO);
        policy.follow(SpinSetting::Adaptive { ceiling: CEILING });
        assert_eq!(policy.budget(now), Duration::ZERO, "same setting: kept");
        policy.follow(SpinSetting::Fixed(us(7)));
        assert_eq!(policy.budget(now), us(7));
    }
}
