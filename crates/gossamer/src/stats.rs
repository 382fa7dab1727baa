//! A node's counters: its runtime's (`trust::Stats`) and its links' traffic, as a snapshot
//! ([`stats`]), as Prometheus' text format ([`RackStats::prometheus`]), and served over HTTP
//! when `GSM_METRICS` says where ([`MetricsServer`]).
//!
//! The server is one thread blocked in `accept`; each request is read with a deadline and a
//! size limit, answered and closed, so a slow or hostile client holds it for at most
//! [`READ_DEADLINE`]. Only `GET /metrics` (and `/`) is answered with the counters; anything
//! else gets a 4xx status, and nothing a client sends can stop the server or the rank.
//!
//! In a job `gsm run` started, `POST /move?id=ID&from=W&to=W` with the job's control token
//! ([`Secret::control_token`](crate::env::Secret::control_token)) in an `X-Gsm-Control` header
//! moves a hot property of this rank by hand (`gsm top`'s `m` key), as
//! [`trust::Handle::move_hot`] does: only a property the rank lists among worker `from`'s
//! hottest moves, so an id from outside is never taken at its word. Without the token the
//! answer is 403, and nothing moves.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::state::RackState;

/// How long the server waits for a request's head, and for its answer to be taken.
pub(crate) const READ_DEADLINE: Duration = Duration::from_secs(2);
/// The largest request head the server reads.
const MAX_HEAD: usize = 8 * 1024;
/// Properties per rank listed in the Prometheus text (a bound on its labels' cardinality).
const HOT_LISTED: usize = 10;

/// A snapshot of this node's counters.
///
/// ```
/// let code = gossamer::Rack::from_env().run(|| {
///     let c = gossamer::entrust(0u64);
///     c.apply(|c| *c += 1);
///     let stats = gossamer::stats();
///     assert_eq!(stats.rank, 0);
///     assert!(stats.runtime.workers.iter().map(|w| w.properties).sum::<u64>() >= 1);
///     assert!(stats.links.is_empty(), "a one-node rack has no links");
///     assert!(stats.prometheus().contains("gossamer_worker_requests_total{rank=\"0\""));
/// });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RackStats {
    /// This node's rank.
    pub rank: u32,
    /// Its runtime's counters: per worker, per property type, the hottest properties.
    pub runtime: trust::Stats,
    /// Every link that is up, by local worker and peer.
    pub links: Vec<LinkStats>,
    /// Requests from other ranks that this node, the first home of a property that moved
    /// to a third rank, sent on there ([`Trust::migrate_to`](crate::Trust::migrate_to)).
    pub forwarded: u64,
    /// How often one of this node's workers, told by a first home where its property moved,
    /// switched its calls to go there directly.
    pub redirects: u64,
}

/// The traffic of one link, from one of this node's workers to a worker of another node,
/// since the link was made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkStats {
    /// This node's worker.
    pub worker: u32,
    /// The peer's rank.
    pub peer_rank: u32,
    /// The peer's worker.
    pub peer_worker: u32,
    /// How the link travels (`None` once it is closing).
    pub transport: Option<crate::transport::Transport>,
    /// Requests this side sent.
    pub requests_sent: u64,
    /// Bytes written to the link (frames; TCP's heartbeats are written by the watchdog and
    /// not counted).
    pub bytes_out: u64,
    /// Bytes read from the link.
    pub bytes_in: u64,
    /// Writes the link made (bytes out over writes: the mean write).
    pub writes: u64,
    /// Reads the link made.
    pub reads: u64,
}

/// A snapshot of this node's counters (see [`RackStats`]).
///
/// # Panics
/// Outside [`Rack::run`](crate::Rack::run).
#[track_caller]
pub fn stats() -> RackStats {
    let state = crate::state::current().expect("gossamer::stats is called outside Rack::run");
    snapshot(&state)
}

pub(crate) fn snapshot(state: &RackState) -> RackStats {
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let links = state
        .links()
        .into_iter()
        .map(|(worker, health, sent)| LinkStats {
            worker: worker as u32,
            peer_rank: health.peer.0,
            peer_worker: health.peer.1,
            transport: health.probe.transport(),
            requests_sent: sent,
            bytes_out: load(&health.bytes_out),
            bytes_in: load(&health.bytes_in),
            writes: load(&health.writes),
            reads: load(&health.reads),
        })
        .collect();
    RackStats {
        rank: state.rank,
        runtime: state.handle.stats(),
        links,
        forwarded: load(&state.forwarded),
        redirects: load(&state.redirects),
    }
}

impl RackStats {
    /// The counters in Prometheus' text exposition format (version 0.0.4). Per property
    /// type and per property the figures are estimates from sampled batches (see
    /// [`trust::stats`]); only the 10 hottest properties are listed, so the number of
    /// series stays bounded whatever the program does.
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let rank = self.rank;
        let rt = &self.runtime;
        family(
            &mut out,
            "uptime_seconds",
            "gauge",
            "Time since the node's runtime started.",
        );
        sample(
            &mut out,
            "uptime_seconds",
            &[("rank", &rank)],
            rt.uptime.as_secs_f64(),
        );
        for (name, help, value) in [
            (
                "forwarded_requests_total",
                "Requests from other ranks the node, as a moved property's first home, sent on.",
                self.forwarded,
            ),
            (
                "redirects_total",
                "Times a worker switched its calls to a moved property's home, skipping its first.",
                self.redirects,
            ),
        ] {
            family(&mut out, name, "counter", help);
            sample(&mut out, name, &[("rank", &rank)], value as f64);
        }
        type Field = fn(&trust::stats::WorkerStats) -> f64;
        let per_worker: [(&str, &str, &str, Field); 8] = [
            (
                "worker_requests_total",
                "counter",
                "Requests the worker ran as a trustee.",
                |w| w.requests as f64,
            ),
            (
                "worker_inline_requests_total",
                "counter",
                "Of those, requests run without a batch.",
                |w| w.inline as f64,
            ),
            (
                "worker_batches_total",
                "counter",
                "Batches the worker served as a trustee.",
                |w| w.batches as f64,
            ),
            (
                "worker_spinning_seconds_total",
                "counter",
                "Idle time the worker spent spinning for work.",
                |w| w.spinning.as_secs_f64(),
            ),
            (
                "worker_sleeping_seconds_total",
                "counter",
                "Idle time the worker spent asleep.",
                |w| w.sleeping.as_secs_f64(),
            ),
            (
                "worker_runnable_fibers",
                "gauge",
                "Fibers ready to run at the worker's last count.",
                |w| w.runnable_fibers as f64,
            ),
            (
                "worker_fibers",
                "gauge",
                "Fibers alive on the worker.",
                |w| w.fibers as f64,
            ),
            (
                "worker_properties",
                "gauge",
                "Properties the worker's trustee holds.",
                |w| w.properties as f64,
            ),
        ];
        for (name, kind, help, field) in per_worker {
            family(&mut out, name, kind, help);
            for w in &rt.workers {
                sample(
                    &mut out,
                    name,
                    &[("rank", &rank), ("worker", &w.worker)],
                    field(w),
                );
            }
        }
        family(
            &mut out,
            "type_requests_total",
            "counter",
            "Requests to properties of a type (sampled estimate).",
        );
        for t in &rt.types {
            sample(
                &mut out,
                "type_requests_total",
                &[("rank", &rank), ("type", &t.type_name)],
                t.requests as f64,
            );
        }
        family(
            &mut out,
            "type_seconds_total",
            "counter",
            "Time requests to properties of a type ran (sampled estimate).",
        );
        for t in &rt.types {
            sample(
                &mut out,
                "type_seconds_total",
                &[("rank", &rank), ("type", &t.type_name)],
                t.time.as_secs_f64(),
            );
        }
        family(
            &mut out,
            "hot_property_requests",
            "gauge",
            "Requests to one of the hottest properties (sampled estimate).",
        );
        for p in rt.hottest.iter().take(HOT_LISTED) {
            let labels: [(&str, &dyn std::fmt::Display); 4] = [
                ("rank", &rank),
                ("worker", &p.worker),
                ("type", &p.type_name),
                ("id", &p.id),
            ];
            sample(
                &mut out,
                "hot_property_requests",
                &labels,
                p.requests as f64,
            );
        }
        type LinkField = fn(&LinkStats) -> u64;
        let per_link: [(&str, &str, LinkField); 4] = [
            (
                "link_requests_sent_total",
                "Requests sent on a link.",
                |l| l.requests_sent,
            ),
            ("link_bytes_out_total", "Bytes written to a link.", |l| {
                l.bytes_out
            }),
            ("link_bytes_in_total", "Bytes read from a link.", |l| {
                l.bytes_in
            }),
            ("link_writes_total", "Writes made to a link.", |l| l.writes),
        ];
        for (name, help, field) in per_link {
            family(&mut out, name, "counter", help);
            for l in &self.links {
                let transport: &dyn std::fmt::Display = match &l.transport {
                    Some(t) => t,
                    None => &"closing",
                };
                let labels: [(&str, &dyn std::fmt::Display); 5] = [
                    ("rank", &rank),
                    ("worker", &l.worker),
                    ("peer_rank", &l.peer_rank),
                    ("peer_worker", &l.peer_worker),
                    ("transport", transport),
                ];
                sample(&mut out, name, &labels, field(l) as f64);
            }
        }
        out
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(
        out,
        "# HELP gossamer_{name} {help}\n# TYPE gossamer_{name} {kind}"
    );
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &dyn std::fmt::Display)], value: f64) {
    let _ = write!(out, "gossamer_{name}{{");
    for (i, (label, value)) in labels.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(out, "{sep}{label}=\"{}\"", escape(&value.to_string()));
    }
    let _ = writeln!(out, "}} {value}");
}

/// A label value as the text format wants it: backslash, quote and newline escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One sample line: metric name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The metric's name.
    pub name: String,
    /// Its labels, in the order written.
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if it has one.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads Prometheus text as [`RackStats::prometheus`] writes it (`name{label="value",…} number`
/// lines and `#` comments): every sample, or an error naming the first line that is not one.
/// Never panics, whatever the text.
///
/// ```
/// let samples = gossamer::parse_prometheus("# TYPE x gauge\nx{a=\"1\",b=\"q\\\"\"} 2.5\n")?;
/// assert_eq!(samples[0].name, "x");
/// assert_eq!(samples[0].label("b"), Some("q\""));
/// assert_eq!(samples[0].value, 2.5);
/// assert!(gossamer::parse_prometheus("x{a=1} 2").is_err());
/// # Ok::<(), String>(())
/// ```
pub fn parse_prometheus(text: &str) -> Result<Vec<Sample>, String> {
    let mut samples = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let sample = parse_line(line).ok_or_else(|| {
            let shown: String = line.chars().take(80).collect();
            format!("line {}: not a sample: {shown:?}", i + 1)
        })?;
        samples.push(sample);
    }
    Ok(samples)
}

fn parse_line(line: &str) -> Option<Sample> {
    let name_end = line.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))?;
    let (name, mut rest) = line.split_at(name_end);
    if name.is_empty() {
        return None;
    }
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = after;
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = rest.find('=')?;
            let label = rest[..eq].trim_start_matches(',').trim();
            if label.is_empty() || !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return None;
            }
            let (value, after) = quoted(rest[eq + 1..].strip_prefix('"')?)?;
            labels.push((label.to_string(), value));
            rest = after.strip_prefix(',').unwrap_or(after);
        }
    }
    let value = rest.trim().split(' ').next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// A label value up to its closing quote, unescaped, and what follows the quote.
fn quoted(text: &str) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((value, &text[i + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => value.push('\n'),
                c @ ('\\' | '"') => value.push(c),
                _ => return None,
            },
            c => value.push(c),
        }
    }
    None
}

/// A move by hand: the property [`trust::Stats::hottest`] lists as `id` on worker `from`, to
/// worker `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandMove {
    pub(crate) id: usize,
    pub(crate) from: usize,
    pub(crate) to: usize,
}

/// The answer to a request whose head is `head`: the counters (from `render`) for
/// `GET /metrics` or `GET /`; for `POST /move?id=ID&from=W&to=W` carrying `control` in its
/// `X-Gsm-Control` header, what `mover` made of the move (200, or 409 with why it was
/// refused); an error status for anything else. Never panics.
pub(crate) fn respond(
    head: &[u8],
    control: Option<&[u8]>,
    render: impl FnOnce() -> String,
    mover: impl FnOnce(HandMove) -> Result<String, String>,
) -> Vec<u8> {
    let mut lines = head.split(|&b| b == b'\n');
    let line = String::from_utf8_lossy(lines.next().unwrap_or_default());
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (method, target, version) = (parts.next(), parts.next(), parts.next());
    let well_formed = parts.next().is_none()
        && version.is_some_and(|v| v.starts_with("HTTP/1."))
        && target.is_some_and(|t| t.starts_with('/'));
    let (path, query) = target
        .unwrap_or_default()
        .split_once('?')
        .unwrap_or((target.unwrap_or_default(), ""));
    let (status, body) = if !well_formed {
        ("400 Bad Request", "not an HTTP/1 request\n".to_string())
    } else if method == Some("POST") && path == "/move" {
        let token = lines.find_map(|l| header_value(l, "x-gsm-control"));
        match (query_of_move(query), control, token) {
            (None, _, _) => (
                "400 Bad Request",
                "expected /move?id=ID&from=WORKER&to=WORKER\n".to_string(),
            ),
            (Some(_), None, _) => (
                "403 Forbidden",
                "moves by hand are for jobs started by gsm run (no control token here)\n"
                    .to_string(),
            ),
            (Some(asked), Some(control), Some(token)) if same_bytes(control, token) => {
                match mover(asked) {
                    Ok(done) => ("200 OK", done),
                    Err(why) => ("409 Conflict", format!("{why}\n")),
                }
            }
            (Some(_), Some(_), _) => (
                "403 Forbidden",
                "a wrong or missing X-Gsm-Control token\n".to_string(),
            ),
        }
    } else if method != Some("GET") {
        (
            "405 Method Not Allowed",
            "only GET is served (and POST /move)\n".to_string(),
        )
    } else if !matches!(target, Some("/" | "/metrics")) {
        (
            "404 Not Found",
            "the counters are at /metrics\n".to_string(),
        )
    } else {
        ("200 OK", render())
    };
    let content_type = if status.starts_with("200") {
        "text/plain; version=0.0.4; charset=utf-8"
    } else {
        "text/plain; charset=utf-8"
    };
    let mut answer = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(body.as_bytes());
    answer
}

/// Serves this node's counters on `GSM_METRICS`'s address until dropped.
pub(crate) struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr` and serves `state`'s counters from a thread of its own.
    pub(crate) fn start(addr: SocketAddr, state: Arc<RackState>) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("gossamer-metrics".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if stopping.load(Ordering::Acquire) {
                        return;
                    }
                    if let Ok(stream) = stream {
                        answer(stream, &state);
                    }
                }
            })?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the thread from `accept` with a connection of our own.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        if TcpStream::connect_timeout(&wake, READ_DEADLINE).is_ok()
            && let Some(thread) = self.thread.take()
        {
            let _ = thread.join();
        }
    }
}

/// `id=ID&from=W&to=W` (in any order, each once, decimal), or `None`.
fn query_of_move(query: &str) -> Option<HandMove> {
    let (mut id, mut from, mut to) = (None, None, None);
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=')?;
        let value: usize = value.parse().ok()?;
        let slot = match key {
            "id" => &mut id,
            "from" => &mut from,
            "to" => &mut to,
            _ => return None,
        };
        if slot.replace(value).is_some() {
            return None;
        }
    }
    Some(HandMove {
        id: id?,
        from: from?,
        to: to?,
    })
}

/// The value of header `name` (lowercase) if `line` is that header.
fn header_value<'a>(line: &'a [u8], name: &str) -> Option<&'a [u8]> {
    let colon = line.iter().position(|&b| b == b':')?;
    let (key, value) = (&line[..colon], &line[colon + 1..]);
    key.eq_ignore_ascii_case(name.as_bytes())
        .then(|| value.trim_ascii())
}

/// Whether `a` and `b` are the same bytes, in a time that depends on their lengths only: a
/// token is not to be found a byte at a time by timing the answers.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Makes a move by hand on worker `m.from`'s loop and says how it went, waiting for it at
/// most [`READ_DEADLINE`].
fn move_by_hand(state: &RackState, m: HandMove) -> Result<String, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    state
        .handle
        .move_hot(m.id, m.from, m.to, move |moved| {
            let _ = tx.send(moved);
        })
        .map_err(|e| e.to_string())?;
    match rx.recv_timeout(READ_DEADLINE) {
        Ok(Ok(())) => Ok(format!(
            "moved property {} from worker {} to worker {}\n",
            m.id, m.from, m.to
        )),
        Ok(Err(why)) => Err(why.to_string()),
        Err(_) => Err(format!(
            "worker {} did not get to the move within {} s (it may still make it)",
            m.from,
            READ_DEADLINE.as_secs()
        )),
    }
}

/// Reads one request head (bounded in size and time), answers it and closes.
fn answer(mut stream: TcpStream, state: &RackState) {
    // One deadline for the whole head, not per read: a client sending a byte now and then
    // would otherwise hold the server for as long as it likes.
    let deadline = std::time::Instant::now() + READ_DEADLINE;
    let _ = stream.set_write_timeout(Some(READ_DEADLINE));
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while head.len() < MAX_HEAD && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    if head.is_empty() {
        return;
    }
    let control = state.settings.control.as_ref().map(|c| c.as_bytes());
    let answer = respond(
        &head,
        control,
        || snapshot(state).prometheus(),
        |m| move_by_hand(state, m),
    );
    let _ = stream.write_all(&answer);
}

/// The checks of the `metrics_request` fuzz target: whatever the head, the answer is one
/// HTTP/1.1 response whose length header is right, carrying the counters only when asked
/// for them, and moving a property only when asked with the token.
#[cfg(feature = "fuzzing")]
pub(crate) fn check_request(head: &[u8]) {
    const TOKEN: &[u8] = b"0123456789abcdef";
    let (mut rendered, mut moved) = (false, false);
    let answer = respond(
        head,
        Some(TOKEN),
        || {
            rendered = true;
            "counters\n".to_string()
        },
        |_| {
            moved = true;
            Ok("moved\n".to_string())
        },
    );
    let text = String::from_utf8(answer).expect("the answer is UTF-8");
    let (top, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    assert!(top.starts_with("HTTP/1.1 "), "{top}");
    let length = format!("Content-Length: {}\r\n", body.len());
    assert!(top.contains(&length), "{top}");
    let asked = head.starts_with(b"GET /metrics HTTP/1.") || head.starts_with(b"GET / HTTP/1.");
    assert_eq!(top.starts_with("HTTP/1.1 200"), rendered || moved, "{top}");
    if rendered {
        assert!(asked, "counters for {:?}", String::from_utf8_lossy(head));
    }
    if moved {
        assert!(
            head.starts_with(b"POST /move?") && head.windows(TOKEN.len()).any(|w| w == TOKEN),
            "a move for {:?}",
            String::from_utf8_lossy(head)
        );
    }
}

/// The checks of the `metrics_text` fuzz target: reading never panics, and the samples read,
/// written again, read back the same.
#[cfg(feature = "fuzzing")]
pub(crate) fn check_text(text: &str) {
    let Ok(samples) = parse_prometheus(text) else {
        return;
    };
    let mut written = String::new();
    for s in &samples {
        let labels: Vec<String> = s
            .labels
            .iter()
            .map(|(n, v)| format!("{n}=\"{}\"", escape(v)))
            .collect();
        let _ = writeln!(written, "{}{{{}}} {:?}", s.name, labels.join(","), s.value);
    }
    let again = parse_prometheus(&written).expect("written samples read back");
    assert_eq!(again.len(), samples.len());
    for (a, b) in again.iter().zip(&samples) {
        assert_eq!((&a.name, &a.labels), (&b.name, &b.labels));
        assert!(a.value == b.value || (a.value.is_nan() && b.value.is_nan()));
    }
}

#[cfg(test)]
mod tests {
    use super::{HandMove, parse_prometheus, respond};

    #[test]
    fn what_is_not_a_sample_is_refused_by_line() {
        for bad in [
            "x{a=\"1} 2",
            "x{a=1} 2",
            "x{=\"1\"} 2",
            "{a=\"1\"} 2",
            "x{a=\"\\q\"} 1",
            "x y",
            "x",
        ] {
            let text = format!("ok 1\n{bad}\n");
            assert!(
                parse_prometheus(&text).unwrap_err().starts_with("line 2:"),
                "{bad:?}"
            );
        }
    }

    fn status(head: &str) -> String {
        let answer = respond(
            head.as_bytes(),
            Some(b"t0k"),
            || "c\n".into(),
            |_| panic!("no move was asked for"),
        );
        String::from_utf8(answer)
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .to_string()
    }

    /// The status of a move asked with `head`, against a rank whose token is `control`, and
    /// the move the mover was given.
    fn move_status(head: &str, control: Option<&[u8]>) -> (String, Option<HandMove>) {
        let mut asked = None;
        let answer = respond(
            head.as_bytes(),
            control,
            || panic!("no counters were asked for"),
            |m| {
                asked = Some(m);
                if m.id == 7 {
                    Err("no property 7 is among worker 0's hottest now".into())
                } else {
                    Ok("moved\n".into())
                }
            },
        );
        let answer = String::from_utf8(answer).unwrap();
        (answer.lines().next().unwrap().to_string(), asked)
    }

    #[test]
    fn a_move_by_hand_needs_the_token_and_a_whole_query() {
        let asked = |query: &str, token: &str| {
            format!("POST /move?{query} HTTP/1.1\r\nHost: x\r\n{token}\r\n")
        };
        let good = asked("id=42&from=0&to=1", "X-Gsm-Control: t0k\r\n");
        assert_eq!(
            move_status(&good, Some(b"t0k")),
            (
                "HTTP/1.1 200 OK".into(),
                Some(HandMove {
                    id: 42,
                    from: 0,
                    to: 1
                })
            )
        );
        // The header's name in any case, its value trimmed; the query in any order.
        let other = asked("to=1&id=42&from=0", "x-gsm-control:   t0k  \r\n");
        assert_eq!(move_status(&other, Some(b"t0k")).0, "HTTP/1.1 200 OK");
        // Refused by the runtime: 409, with its reason.
        let stale = asked("id=7&from=0&to=1", "X-Gsm-Control: t0k\r\n");
        assert_eq!(move_status(&stale, Some(b"t0k")).0, "HTTP/1.1 409 Conflict");
        // No token, a wrong one, or a rank that has none (not started by gsm run): 403, and
        // the mover is never asked.
        for (token, control) in [
            ("", Some(&b"t0k"[..])),
            ("X-Gsm-Control: t0j\r\n", Some(b"t0k")),
            ("X-Gsm-Control: t0k0\r\n", Some(b"t0k")),
            ("X-Gsm-Control: t0k\r\n", None),
        ] {
            let (status, asked) = move_status(&asked("id=1&from=0&to=1", token), control);
            assert_eq!(
                (status.as_str(), asked),
                ("HTTP/1.1 403 Forbidden", None),
                "{token:?}"
            );
        }
        // A query that is not exactly id, from and to, in decimal: 400.
        for query in [
            "id=1&from=0",
            "id=1&from=0&to=1&to=2",
            "id=1&from=0&to=-1",
            "id=0x1&from=0&to=1",
            "id=1&from=0&to=1&x=2",
            "",
        ] {
            let (status, asked) =
                move_status(&asked(query, "X-Gsm-Control: t0k\r\n"), Some(b"t0k"));
            assert_eq!(
                (status.as_str(), asked),
                ("HTTP/1.1 400 Bad Request", None),
                "{query:?}"
            );
        }
    }

    #[test]
    fn only_a_get_of_the_counters_gets_them() {
        assert_eq!(
            status("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            "HTTP/1.1 200 OK"
        );
        assert_eq!(status("GET / HTTP/1.0\r\n\r\n"), "HTTP/1.1 200 OK");
        assert_eq!(
            status("POST /metrics HTTP/1.1\r\n\r\n"),
            "HTTP/1.1 405 Method Not Allowed"
        );
        assert_eq!(
            status("GET /other HTTP/1.1\r\n\r\n"),
            "HTTP/1.1 404 Not Found"
        );
        for garbage in [
            "",
            "\u{0}\u{1}",
            "GET",
            "GET /metrics",
            "GET metrics HTTP/1.1",
            "GET /metrics HTTP/2 x\r\n",
        ] {
            assert_eq!(status(garbage), "HTTP/1.1 400 Bad Request", "{garbage:?}");
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(super::escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
