//! What every experiment shares: options, the progress bar, starting and stopping threads together.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Options and progress reporting for one experiment.
#[derive(Debug)]
pub struct Ctx {
    /// Smoke-run mode: few points, short windows.
    pub quick: bool,
    /// Run only the experiments' correctness checks (`--check`; `rangelock` has one).
    pub check: bool,
    /// Runs per point (the median is reported).
    pub runs: usize,
    /// Measurement window of one run.
    pub window: Duration,
    /// Logical CPUs.
    pub cores: usize,
    /// Only systems whose name contains one of these (all systems when empty).
    pub only: Vec<String>,
    /// This executable, which experiments that measure in a child process run again.
    pub self_exe: Option<PathBuf>,
    bar: ProgressBar,
}

/// This executable, when it is the benchmark binary: `args` are all of this process's arguments
/// (not so in a unit test calling [`crate::cli`]). Experiments that measure in a child process
/// run it again with hidden arguments.
pub fn self_exe(args: &[String]) -> Option<PathBuf> {
    std::env::args()
        .skip(1)
        .eq(args.iter().cloned())
        .then(std::env::current_exe)?
        .ok()
}

impl Ctx {
    /// A context with a hidden progress bar.
    pub fn new(quick: bool, runs: usize, window: Duration) -> Self {
        Ctx {
            quick,
            check: false,
            runs,
            window,
            cores: crate::machine::cores(),
            only: Vec::new(),
            self_exe: None,
            bar: ProgressBar::hidden(),
        }
    }

    /// Whether the system called `name` is to be measured (see `--only`).
    pub fn selected(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| name.contains(o.as_str()))
    }

    /// Starts a progress bar for `name` with `total` runs.
    pub fn begin(&mut self, name: &str, total: u64) {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:>10} [{elapsed_precise}] {bar:32.cyan/blue} {pos}/{len} ETA {eta} {msg}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar.set_prefix(name.to_owned());
        self.bar = bar;
    }

    /// Announces the run about to start.
    pub fn status(&self, msg: impl Into<std::borrow::Cow<'static, str>>) {
        self.bar.set_message(msg);
    }

    /// Counts one finished run.
    pub fn tick(&self) {
        self.bar.inc(1);
    }

    /// Grows the expected total (when the number of runs is only known as the experiment goes).
    pub fn add_total(&self, n: u64) {
        self.bar.inc_length(n);
    }

    /// Shrinks the expected total (runs skipped, for example beyond saturation).
    pub fn skip(&self, n: u64) {
        let len = self.bar.length().unwrap_or(0);
        self.bar.set_length(len.saturating_sub(n));
    }

    /// Removes the progress bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    /// Prints a line above the progress bar.
    pub fn println(&self, line: impl AsRef<str>) {
        if self.bar.is_hidden() {
            eprintln!("{}", line.as_ref());
        } else {
            self.bar.println(line);
        }
    }
}

/// How long a gate waits for its threads to arrive, and they for it to open: a thread that
/// failed before arriving would otherwise leave the others waiting forever.
const GATE_PATIENCE: Duration = Duration::from_secs(60);

/// Start and stop signals for a group of threads measured together.
#[derive(Debug, Default)]
pub struct Gate {
    ready: AtomicUsize,
    go: AtomicBool,
    stop: AtomicBool,
    opened: OnceLock<Instant>,
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Called by each measured thread: announces readiness and waits for [`Gate::open_when`].
    pub fn arrive_and_wait(&self) {
        // Yield rather than spin: with more threads than cores the opener needs a CPU.
        self.arrive_and_wait_with(std::thread::yield_now);
    }

    /// Like [`Gate::arrive_and_wait`], calling `pause` while waiting (a fiber passes its
    /// runtime's `yield_now`, so the other fibers of its worker can arrive too).
    ///
    /// # Panics
    /// When the gate has not opened after a minute.
    pub fn arrive_and_wait_with(&self, mut pause: impl FnMut()) {
        self.ready.fetch_add(1, Ordering::AcqRel);
        let deadline = Instant::now() + GATE_PATIENCE;
        while !self.go.load(Ordering::Acquire) {
            assert!(
                Instant::now() < deadline,
                "gave up after {GATE_PATIENCE:?} waiting for the gate to open"
            );
            pause();
        }
    }

    /// Waits until `n` threads have arrived, opens the gate and returns the start time.
    ///
    /// # Panics
    /// When fewer than `n` threads have arrived after a minute.
    pub fn open_when(&self, n: usize) -> Instant {
        let deadline = Instant::now() + GATE_PATIENCE;
        while self.ready.load(Ordering::Acquire) < n {
            assert!(
                Instant::now() < deadline,
                "gave up after {GATE_PATIENCE:?} waiting for {n} threads at the gate"
            );
            std::thread::yield_now();
        }
        let t0 = Instant::now();
        let _ = self.opened.set(t0);
        self.go.store(true, Ordering::Release);
        t0
    }

    /// When the gate opened.
    ///
    /// # Panics
    /// Before [`Gate::open_when`] returned.
    pub fn opened_at(&self) -> Instant {
        *self.opened.get().expect("gate not open yet")
    }

    /// Tells the measured threads to stop.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Whether the measured threads should stop. Measuring loops test it after each batch, not
    /// before the first: a thread that the OS did not run until the window closed still does
    /// one batch, so every system reports work and the window's time covers it.
    #[inline]
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// The CPUs this process may run on, in order (Linux; elsewhere `0..cores`).
pub fn allowed_cpus() -> Vec<usize> {
    static CPUS: OnceLock<Vec<usize>> = OnceLock::new();
    CPUS.get_or_init(|| {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: `set` is a plain bit mask of the size we pass; the kernel writes at most that
            // many bytes, and CPU_ISSET only reads it.
            let cpus: Vec<usize> = unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) == 0 {
                    (0..libc::CPU_SETSIZE as usize)
                        .filter(|&c| libc::CPU_ISSET(c, &set))
                        .collect()
                } else {
                    Vec::new()
                }
            };
            if !cpus.is_empty() {
                return cpus;
            }
        }
        (0..crate::machine::cores()).collect()
    })
    .clone()
}

static PINNING: AtomicBool = AtomicBool::new(true);

/// Turns pinning of benchmark threads and runtime workers on or off (`--no-pin`).
pub fn set_pinning(on: bool) {
    PINNING.store(on, Ordering::Relaxed);
}

/// Whether benchmark threads and runtime workers are pinned to cores.
pub fn pinning() -> bool {
    PINNING.load(Ordering::Relaxed)
}

/// The sentence the reports use to say how threads were placed.
pub fn pinning_note() -> String {
    if pinning() {
        "Benchmark threads are pinned round-robin to the allowed CPUs, and the runtime's workers with \
         `Builder::pin(true)`."
            .to_owned()
    } else {
        "Threads and runtime workers are left to the OS scheduler (`--no-pin`).".to_owned()
    }
}

/// Pins the calling thread to the `i`-th allowed CPU (modulo their number), as the delegation
/// runtime pins its workers, so that no system gets its threads stacked on one core by chance.
/// Does nothing with `--no-pin` or where pinning is unsupported.
pub fn pin_to_core(i: usize) {
    if !pinning() {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        let cpus = allowed_cpus();
        let cpu = cpus[i % cpus.len()];
        // SAFETY: `set` is a plain bit mask of the size we pass; the kernel only reads it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = i;
}

/// Sleeps for the measurement window, then raises the stop flag.
pub fn run_window(gate: &Gate, window: Duration) {
    std::thread::sleep(window);
    gate.stop();
}

/// Current UTC time as `YYYY-MM-DD HH:MM`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// Held by a test while it runs a rack: a process runs one rack at a time, and the test
/// harness runs tests on several threads.
#[cfg(test)]
pub(crate) fn one_rack_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static RACK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    RACK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_now_has_shape() {
        let s = super::utc_now();
        assert_eq!(s.len(), 16, "{s}");
        assert!(s.starts_with("20"), "{s}");
    }
}
