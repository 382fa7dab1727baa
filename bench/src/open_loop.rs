//! The open-loop load generator of the latency experiment: each client's schedule of request
//! times, what a client measured against it, and the summary of a run.
//!
//! A request's latency runs from its *scheduled* time to its completion, so queueing behind a slow
//! system counts (no coordinated omission). A client that falls behind issues late requests back to
//! back; if it is still behind at twice the window it stops, and its remaining requests are recorded
//! with the latency they had reached by then (a lower bound). A run is *saturated* when it completed
//! less than 90% of the offered load.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use hdrhistogram::Histogram;

use crate::harness::Gate;

/// The outcome of one run at one offered load.
#[derive(Debug, Clone, Copy)]
pub struct LatRun {
    /// Mean latency, µs.
    pub mean_us: f64,
    /// 99.9th percentile latency, µs.
    pub p999_us: f64,
    /// Completed operations per second until the last completion, Mops/s.
    pub achieved_mops: f64,
    /// Whether the system fell behind the offered load.
    pub saturated: bool,
}

/// The request schedule of one client.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// Time between this client's requests, ns.
    pub interval_ns: f64,
    /// Offset of this client's first request, ns.
    pub phase_ns: f64,
    /// Requests are scheduled in `[0, window_ns)`.
    pub window_ns: u64,
}

impl Schedule {
    /// Schedules for `clients` clients sharing `offered_mops`.
    pub fn split(clients: usize, offered_mops: f64, window: Duration) -> Vec<Schedule> {
        let interval_ns = clients as f64 * 1e3 / offered_mops;
        (0..clients)
            .map(|c| Schedule {
                interval_ns,
                phase_ns: interval_ns * c as f64 / clients as f64,
                window_ns: window.as_nanos() as u64,
            })
            .collect()
    }

    /// Scheduled time of request `k`, ns after start; `None` past the window.
    #[inline]
    pub fn at(&self, k: u64) -> Option<u64> {
        let t = (self.phase_ns + k as f64 * self.interval_ns) as u64;
        (t < self.window_ns).then_some(t)
    }

    /// Time after which a client that is behind gives up.
    pub fn give_up_ns(&self) -> u64 {
        2 * self.window_ns + 50_000_000
    }
}

/// What one client measured.
#[derive(Debug)]
pub struct ClientResult {
    /// Latencies in ns.
    pub hist: Histogram<u64>,
    /// Requests completed.
    pub completed: u64,
    /// Requests never issued because the client gave up.
    pub abandoned: u64,
    /// Time of the last completion, ns after start.
    pub last_done_ns: u64,
}

impl ClientResult {
    /// An empty result.
    pub fn new() -> Self {
        ClientResult {
            hist: Histogram::new_with_bounds(1, 600_000_000_000, 3)
                .expect("valid histogram bounds"),
            completed: 0,
            abandoned: 0,
            last_done_ns: 0,
        }
    }

    /// Records that the client gave up at `now` with requests `k..` unissued.
    pub fn abandon(&mut self, sched: &Schedule, mut k: u64, now: u64) {
        while let Some(t) = sched.at(k) {
            self.hist.saturating_record(now.saturating_sub(t).max(1));
            self.abandoned += 1;
            k += 1;
        }
    }

    /// Drives one client through its schedule, which starts 1 ms after `gate` opens: `op`
    /// performs one request; `pause` is called while waiting (for the gate, for the next
    /// scheduled time).
    pub fn drive(
        sched: &Schedule,
        gate: &Gate,
        mut op: impl FnMut(),
        mut pause: impl FnMut(),
    ) -> Self {
        let mut r = ClientResult::new();
        gate.arrive_and_wait_with(&mut pause);
        let start = gate.opened_at() + Duration::from_millis(1);
        let clock = || Instant::now().saturating_duration_since(start).as_nanos() as u64;
        let give_up = sched.give_up_ns();
        let mut k = 0;
        while let Some(t) = sched.at(k) {
            let mut now = clock();
            while now < t {
                pause();
                now = clock();
            }
            if now > give_up {
                r.abandon(sched, k, now);
                break;
            }
            op();
            let done = clock();
            r.hist.saturating_record(done.saturating_sub(t).max(1));
            r.completed += 1;
            r.last_done_ns = done;
            k += 1;
        }
        r
    }
}

impl Default for ClientResult {
    fn default() -> Self {
        Self::new()
    }
}

/// Merges client results into a run summary for `offered_mops`.
pub fn summarize(results: Vec<ClientResult>, offered_mops: f64) -> anyhow::Result<(LatRun, u64)> {
    let mut hist = ClientResult::new().hist;
    let (mut completed, mut abandoned, mut last) = (0, 0, 1);
    for r in results {
        hist.add(&r.hist).context("merging histograms")?;
        completed += r.completed;
        abandoned += r.abandoned;
        last = last.max(r.last_done_ns);
    }
    let achieved_mops = completed as f64 / last as f64 * 1e3;
    let run = LatRun {
        mean_us: hist.mean() / 1e3,
        p999_us: hist.value_at_quantile(0.999) as f64 / 1e3,
        achieved_mops,
        saturated: abandoned > 0 || achieved_mops < 0.9 * offered_mops,
    };
    Ok((run, completed))
}
