//! What every system's client measures, and the load loops the async clients (tarpc, tonic)
//! share: one call at a time, a fixed number in flight, and an open loop at a fixed rate.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use anyhow::ensure;
use futures::FutureExt as _;
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use hdrhistogram::Histogram;

/// How long answers still in flight at the end of a window may take to arrive.
pub(crate) const DRAIN: Duration = Duration::from_secs(20);

/// Most requests an open loop keeps unanswered; past it, requests fall due without being sent
/// (and are sent, late, as answers come back), and the run counts as saturated.
pub(crate) const OPEN_CAP: u64 = 16 << 10;

/// The `x` of the `i`-th request of a client: 1 to 1000, so sums are checked, not counts.
pub(crate) fn x_of(i: u64) -> u64 {
    1 + i % 1000
}

/// A latency histogram in nanoseconds, 1 ns to 100 s, 3 significant digits.
pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid histogram bounds")
}

/// One measured run of one system.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Measured {
    /// Calls answered within the window.
    pub(crate) ops: u64,
    /// The window, seconds.
    pub(crate) secs: f64,
    /// Median latency, microseconds (0 when not measured).
    pub(crate) p50_us: f64,
    /// 99th percentile latency, microseconds (0 when not measured).
    pub(crate) p99_us: f64,
    /// Open loop: calls that fell due within the window.
    pub(crate) offered: u64,
    /// Every call the run made, those answered after the window included (the divisor of
    /// system calls per call).
    pub(crate) calls: u64,
}

impl Measured {
    /// A closed-loop run: `ops` calls in `elapsed`, latencies in `hist`.
    pub(crate) fn closed(ops: u64, elapsed: Duration, hist: &Histogram<u64>) -> Measured {
        Measured {
            ops,
            secs: elapsed.as_secs_f64(),
            p50_us: hist.value_at_quantile(0.5) as f64 / 1e3,
            p99_us: hist.value_at_quantile(0.99) as f64 / 1e3,
            offered: 0,
            calls: ops,
        }
    }

    /// Calls per second.
    pub(crate) fn rate(&self) -> f64 {
        self.ops as f64 / self.secs
    }

    /// Open loop: fewer than 90% of the calls due in the window were answered in it.
    pub(crate) fn saturated(&self) -> bool {
        (self.ops as f64) < 0.9 * self.offered as f64
    }

    /// As words for a child's answer line.
    pub(crate) fn words(&self) -> String {
        format!(
            "{} {} {} {} {} {}",
            self.ops, self.secs, self.p50_us, self.p99_us, self.offered, self.calls
        )
    }

    /// From the words of a child's answer line.
    pub(crate) fn parse(words: &[String]) -> anyhow::Result<Measured> {
        ensure!(words.len() == 6, "a measurement is 6 words: {words:?}");
        Ok(Measured {
            ops: words[0].parse()?,
            secs: words[1].parse()?,
            p50_us: words[2].parse()?,
            p99_us: words[3].parse()?,
            offered: words[4].parse()?,
            calls: words[5].parse()?,
        })
    }
}

/// The schedule of an open loop: request `i` falls due at `t0 + i / rate`.
#[derive(Debug)]
pub(crate) struct Tally {
    t0: Instant,
    end: Instant,
    interval_ns: f64,
    /// Requests due within the window: those with `t0 + i / rate < end`.
    total: u64,
    issued: u64,
    in_window: u64,
}

impl Tally {
    /// A schedule starting now.
    pub(crate) fn new(rate: f64, window: Duration) -> Tally {
        let t0 = Instant::now();
        let interval_ns = 1e9 / rate;
        Tally {
            t0,
            end: t0 + window,
            interval_ns,
            total: (window.as_nanos() as f64 / interval_ns).ceil() as u64,
            issued: 0,
            in_window: 0,
        }
    }

    /// The indices of the requests to send at `now`: those due and not yet sent, as far as
    /// [`OPEN_CAP`] allows with `in_flight` unanswered.
    pub(crate) fn due(&mut self, now: Instant, in_flight: u64) -> std::ops::Range<u64> {
        let due = self.due_by(now);
        let end = due.min(self.issued + OPEN_CAP.saturating_sub(in_flight));
        let range = self.issued..end.max(self.issued);
        self.issued = range.end;
        range
    }

    /// How many requests fall due by `t`, none after the window.
    fn due_by(&self, t: Instant) -> u64 {
        let since = t.saturating_duration_since(self.t0).as_nanos() as f64;
        ((since / self.interval_ns) as u64 + 1).min(self.total)
    }

    /// When request `i` fell due.
    /// Spins until the next call falls due: with nothing in flight the client has nothing to
    /// wait for, and a timer could wake it up to a millisecond late.
    pub(crate) fn spin_until_next_due(&self) {
        let next = self.next_due();
        while Instant::now() < next {
            std::hint::spin_loop();
        }
    }

    pub(crate) fn due_time(&self, i: u64) -> Instant {
        self.t0 + Duration::from_nanos((i as f64 * self.interval_ns) as u64)
    }

    /// When the next request not yet sent falls due (the window's end once none is left).
    pub(crate) fn next_due(&self) -> Instant {
        self.due_time(self.issued).min(self.end)
    }

    /// Counts an answer arriving at `now`.
    pub(crate) fn answered(&mut self, now: Instant) {
        if now < self.end {
            self.in_window += 1;
        }
    }

    /// Whether the window is over at `now`.
    pub(crate) fn over(&self, now: Instant) -> bool {
        now >= self.end
    }

    /// Requests sent so far.
    pub(crate) fn issued(&self) -> u64 {
        self.issued
    }

    /// The run's figures.
    pub(crate) fn finish(&self, hist: &Histogram<u64>) -> Measured {
        Measured {
            ops: self.in_window,
            secs: (self.end - self.t0).as_secs_f64(),
            p50_us: hist.value_at_quantile(0.5) as f64 / 1e3,
            p99_us: hist.value_at_quantile(0.99) as f64 / 1e3,
            offered: self.total,
            calls: self.issued,
        }
    }
}

/// `f`, failed if it takes longer than `limit` (tokio clients: every wait has a deadline).
pub(crate) async fn within<T>(
    limit: Duration,
    f: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r,
        Err(_) => anyhow::bail!("no answer within {limit:?}"),
    }
}

/// How long an async client's run may take: the window, the drain and a margin.
pub(crate) fn patience(window: Duration) -> Duration {
    window + DRAIN + Duration::from_secs(10)
}

/// One call of an async client: adds `x`, returns the counter's new value.
pub(crate) type Call = Pin<Box<dyn Future<Output = anyhow::Result<u64>>>>;

/// What the tarpc and tonic clients share: a runtime to run the load loops on, a call to make,
/// and the count of what they sent (for the final check of the counter).
pub(crate) trait AsyncClient {
    fn runtime(&self) -> &tokio::runtime::Runtime;

    /// One call, `add(x)`, as the load loops make it.
    fn caller(&self) -> Box<dyn Fn(u64) -> Call>;

    /// Calls sent so far: the first `x_of` index of the next run.
    fn sent(&self) -> u64;

    /// Adds a run's calls to the count.
    fn count(&mut self, sent: Sent);

    fn run<T>(
        &mut self,
        window: Duration,
        load: impl AsyncFnOnce(&dyn Fn(u64) -> Call, u64) -> anyhow::Result<(T, Sent)>,
    ) -> anyhow::Result<T> {
        let call = self.caller();
        let first = self.sent();
        let (out, sent) = self
            .runtime()
            .block_on(within(patience(window), load(&*call, first)))?;
        self.count(sent);
        Ok(out)
    }

    /// E1: one call at a time.
    fn latency(&mut self, window: Duration) -> anyhow::Result<Measured> {
        self.run(window, async |call, first| {
            latency_loop(call, first, window).await
        })
    }

    /// E2: `depth` calls in flight on the one connection.
    fn pipelined(&mut self, depth: u64, window: Duration) -> anyhow::Result<Measured> {
        self.run(window, async |call, first| {
            closed_loop(call, first, depth, window).await
        })
    }

    /// E3: calls issued at `rate` per second.
    fn open(&mut self, rate: f64, window: Duration) -> anyhow::Result<Measured> {
        self.run(window, async |call, first| {
            open_loop(call, first, rate, window).await
        })
    }
}

/// What a load loop sent: how many calls and the sum of their `x`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Sent {
    pub(crate) calls: u64,
    pub(crate) added: u64,
}

impl Sent {
    /// Counts one more call, the `first + calls`-th of the client; returns its `x`.
    pub(crate) fn next(&mut self, first: u64) -> u64 {
        let x = x_of(first + self.calls);
        self.calls += 1;
        self.added += x;
        x
    }
}

/// E1 for an async client: one call at a time for `window`; the `i`-th call adds
/// `x_of(first + i)`.
pub(crate) async fn latency_loop(
    call: &dyn Fn(u64) -> Call,
    first: u64,
    window: Duration,
) -> anyhow::Result<(Measured, Sent)> {
    let mut hist = new_histogram();
    let mut sent = Sent::default();
    let t0 = Instant::now();
    let mut last = 0;
    while t0.elapsed() < window {
        let x = sent.next(first);
        let start = Instant::now();
        let v = call(x).await?;
        hist.record(start.elapsed().as_nanos() as u64)?;
        ensure!(v > last, "answers went backwards: {v} after {last}");
        last = v;
    }
    Ok((Measured::closed(sent.calls, t0.elapsed(), &hist), sent))
}

/// E2 for an async client: `depth` calls in flight for `window`, then the last ones drained.
pub(crate) async fn closed_loop(
    call: &dyn Fn(u64) -> Call,
    first: u64,
    depth: u64,
    window: Duration,
) -> anyhow::Result<(Measured, Sent)> {
    let mut sent = Sent::default();
    let mut in_flight = FuturesUnordered::new();
    let t0 = Instant::now();
    for _ in 0..depth {
        in_flight.push(call(sent.next(first)));
    }
    let mut ops = 0;
    let mut stopped = None;
    while let Some(answer) = in_flight.next().await {
        answer?;
        if stopped.is_none() {
            let now = t0.elapsed();
            if now < window {
                ops += 1;
                in_flight.push(call(sent.next(first)));
            } else {
                stopped = Some(now);
            }
        }
    }
    let secs = stopped.unwrap_or_else(|| t0.elapsed());
    Ok((
        Measured {
            ops,
            secs: secs.as_secs_f64(),
            calls: sent.calls,
            ..Measured::default()
        },
        sent,
    ))
}

/// E3 for an async client: calls sent as they fall due at `rate` per second; latency runs
/// from each call's due time. While calls are unanswered the task waits for the next answer
/// (the runtime may park in `epoll_wait`), and spins until the next due time when none is —
/// the policy of every E3 client (see `node::open`); a timer would wake it up to a
/// millisecond late.
pub(crate) async fn open_loop(
    call: &dyn Fn(u64) -> Call,
    first: u64,
    rate: f64,
    window: Duration,
) -> anyhow::Result<(Measured, Sent)> {
    let mut hist = new_histogram();
    let mut sent = Sent::default();
    let mut tally = Tally::new(rate, window);
    let mut in_flight = FuturesUnordered::new();
    let deadline = Instant::now() + window + DRAIN;
    loop {
        let now = Instant::now();
        for i in tally.due(now, in_flight.len() as u64) {
            let due = tally.due_time(i);
            let answer = call(sent.next(first));
            in_flight.push(async move { (answer.await, due) });
        }
        if in_flight.is_empty() {
            if tally.over(now) {
                break;
            }
            tally.spin_until_next_due();
            continue;
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        let Ok(first_answer) = tokio::time::timeout(remaining, in_flight.next()).await else {
            anyhow::bail!(
                "open loop: {} answers missing {DRAIN:?} after the window",
                in_flight.len()
            );
        };
        let mut answers = first_answer.into_iter().chain(std::iter::from_fn(|| {
            in_flight.next().now_or_never().flatten()
        }));
        for (answer, due) in &mut answers {
            answer?;
            let now = Instant::now();
            hist.record(now.saturating_duration_since(due).as_nanos() as u64)?;
            tally.answered(now);
        }
    }
    debug_assert_eq!(tally.issued(), sent.calls);
    Ok((tally.finish(&hist), sent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_offers_rate_times_window() {
        let mut t = Tally::new(1000.0, Duration::from_millis(10));
        assert_eq!(t.due(t.t0, 0), 0..1, "request 0 is due at once");
        assert_eq!(t.due(t.t0 + Duration::from_micros(2500), 0), 1..3);
        // Past the window: the rest of the 10 requests, and no more.
        let late = t.t0 + Duration::from_secs(1);
        assert_eq!(t.due(late, 0), 3..10);
        assert_eq!(t.due(late, 0), 10..10);
        assert_eq!(t.due_time(4) - t.t0, Duration::from_millis(4));
        assert_eq!(t.next_due(), t.end);
        t.answered(t.t0);
        t.answered(late);
        let m = t.finish(&new_histogram());
        assert_eq!((m.offered, m.ops, m.calls), (10, 1, 10));
        assert!(m.saturated());
    }

    #[test]
    fn the_cap_holds_back_requests_until_answers_come() {
        let mut t = Tally::new(1e9, Duration::from_millis(10));
        let late = t.t0 + Duration::from_secs(1);
        assert_eq!(t.due(late, 0).count() as u64, OPEN_CAP);
        assert_eq!(t.due(late, OPEN_CAP).count(), 0);
        assert_eq!(t.due(late, OPEN_CAP - 5).count(), 5);
    }

    #[test]
    fn measurements_survive_the_answer_line() {
        let m = Measured {
            ops: 12,
            secs: 0.25,
            p50_us: 17.5,
            p99_us: 80.0,
            offered: 13,
            calls: 14,
        };
        let words: Vec<String> = m.words().split(' ').map(str::to_owned).collect();
        assert_eq!(Measured::parse(&words).unwrap(), m);
        assert!(Measured::parse(&words[1..]).is_err());
    }
}
