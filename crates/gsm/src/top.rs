//! `gsm top`: a live view of a job started by `gsm run` on this machine.
//!
//! It finds the job's directory (see [`jobs`]), reads where each rank serves its
//! counters, and once per interval fetches every rank's Prometheus text over HTTP, turns two
//! successive snapshots into rates ([`RankView`]) and draws one screen: ranks × workers (busy
//! share, requests per second, mean batch, fibers, properties), the busiest property types
//! and properties, and each rank's link traffic. The same screen, drawn into a buffer, is what
//! `--once` prints and what `gsm run --stats` prints at the job's end.
//!
//! The `m` key moves one hot property by hand: in the rank whose workers are furthest apart in
//! busy share, the hottest property of its busiest worker that lists one goes to the least busy
//! other worker ([`planned_move`]). `gsm top` asks the rank with `POST /move`, carrying the
//! job's control token from its directory (so only for a job `gsm run` started on this
//! machine), and the rank moves it as its rebalancer would; the outcome shows in the title.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ratatui::Frame;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table};

use crate::jobs::{self, Job};
use crate::metrics::{RankSnapshot, RankView};

/// Options of `gsm top`.
#[derive(clap::Args, Debug)]
pub(crate) struct Options {
    /// The job to watch, by (a prefix of) its id; needed only when several are running.
    #[arg(value_name = "JOB")]
    job: Option<String>,
    /// Watch the ranks serving their counters at these addresses (`GSM_METRICS`), separated
    /// by commas, instead of a job `gsm run` started on this machine: a job started with
    /// --hosts, by mpirun or by srun.
    #[arg(
        long,
        value_name = "ADDRS",
        conflicts_with = "job",
        value_delimiter = ','
    )]
    metrics: Vec<String>,
    /// Milliseconds between two refreshes.
    #[arg(long, value_name = "MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(100..=60_000))]
    interval_ms: u64,
    /// Print one screen as text (the rates over one interval) and exit.
    #[arg(long)]
    once: bool,
    /// With --once: first move a hot property, as the `m` key does, and print the outcome.
    #[arg(long = "move", requires = "once")]
    move_one: bool,
}

/// How long a rank may take to answer.
const FETCH_DEADLINE: Duration = Duration::from_millis(800);
/// The largest answer read from a rank.
const MAX_ANSWER: u64 = 16 << 20;
/// Rows of the type and property tables.
const TOP_ROWS: usize = 8;

/// Runs `gsm top`.
pub(crate) fn run(options: &Options) -> anyhow::Result<()> {
    let source = if options.metrics.is_empty() {
        Source::Job(jobs::find(options.job.as_deref())?)
    } else {
        Source::Addresses(options.metrics.clone())
    };
    let interval = Duration::from_millis(options.interval_ms);
    let mut watch = Watch::new(source);
    if options.once {
        watch.refresh();
        std::thread::sleep(interval);
        watch.refresh();
        if options.move_one {
            watch.move_one();
            // On a line of its own: the title is cut to the screen's width.
            println!("{}", watch.moved.as_deref().unwrap_or_default());
        }
        print!("{}", watch.screen().text(120));
        return Ok(());
    }
    let mut terminal = ratatui::try_init().context("cannot take over the terminal")?;
    let result = (|| -> anyhow::Result<()> {
        loop {
            let started = Instant::now();
            watch.refresh();
            let screen = watch.screen();
            terminal.draw(|frame| screen.draw(frame))?;
            if let Source::Job(job) = &watch.source
                && !job.dir.exists()
            {
                return Ok(());
            }
            let mut left = interval.saturating_sub(started.elapsed());
            while !left.is_zero() {
                let waited = Instant::now();
                if event::poll(left)?
                    && let Event::Key(key) = event::read()?
                    && key.kind == KeyEventKind::Press
                {
                    let quit = matches!(key.code, KeyCode::Char('q') | KeyCode::Esc)
                        || (key.code == KeyCode::Char('c')
                            && key.modifiers.contains(KeyModifiers::CONTROL));
                    if quit {
                        return Ok(());
                    }
                    if key.code == KeyCode::Char('m') {
                        watch.move_one();
                        let screen = watch.screen();
                        terminal.draw(|frame| screen.draw(frame))?;
                    }
                }
                left = left.saturating_sub(waited.elapsed());
            }
        }
    })();
    ratatui::restore();
    result
}

/// Where the ranks' counters are.
enum Source {
    /// A job `gsm run` started here: its directory says where each rank serves them.
    Job(Job),
    /// Addresses given on the command line.
    Addresses(Vec<String>),
}

impl Source {
    /// Each rank's name (for a rank not answering) and address, as far as known; and the
    /// names of those not serving yet.
    fn addresses(&self) -> (Vec<(String, String)>, Vec<String>) {
        match self {
            Source::Job(job) => {
                let known = job.addresses();
                let waiting = (0..job.ranks)
                    .filter(|r| !known.iter().any(|(k, _)| k == r))
                    .map(|r| format!("rank {r}"))
                    .collect();
                let named = known.into_iter().map(|(r, a)| (format!("rank {r}"), a));
                (named.collect(), waiting)
            }
            Source::Addresses(list) => (
                list.iter().map(|a| (a.clone(), a.clone())).collect(),
                vec![],
            ),
        }
    }

    /// The job's control token, which moves by hand need.
    fn control(&self) -> Option<String> {
        match self {
            Source::Job(job) => job.control(),
            Source::Addresses(_) => None,
        }
    }

    fn title(&self) -> String {
        match self {
            Source::Job(job) => format!("job {} · {} · {} ranks", job.id, job.program, job.ranks),
            Source::Addresses(list) => format!("{} ranks at the addresses given", list.len()),
        }
    }
}

/// The ranks watched and each one's last snapshot.
struct Watch {
    source: Source,
    /// By address.
    last: BTreeMap<String, RankSnapshot>,
    views: Vec<RankView>,
    /// Where each rank of `views` serves its counters, by rank.
    addresses: BTreeMap<u32, String>,
    /// Ranks that did not answer, and why.
    silent: Vec<(String, String)>,
    /// What the last move by hand came to.
    moved: Option<String>,
}

impl Watch {
    fn new(source: Source) -> Watch {
        Watch {
            source,
            last: BTreeMap::new(),
            views: Vec::new(),
            addresses: BTreeMap::new(),
            silent: Vec::new(),
            moved: None,
        }
    }

    /// Moves one hot property by hand (the `m` key; see [`planned_move`]) and keeps what came
    /// of it for the title.
    fn move_one(&mut self) {
        let outcome = (|| -> anyhow::Result<String> {
            let Some(token) = self.source.control() else {
                bail!("moves by hand need a job started by gsm run on this machine");
            };
            let Some(planned) = planned_move(&self.views) else {
                bail!("no rank has two workers and a hot property to move");
            };
            let Some(addr) = self.addresses.get(&planned.rank) else {
                bail!("rank {} is not answering", planned.rank);
            };
            ask_move(addr, &token, &planned)
        })();
        self.moved = Some(match outcome {
            Ok(done) => done,
            Err(e) => format!("no move: {e:#}"),
        });
    }

    /// Fetches every rank's counters and computes the rates since the last refresh.
    fn refresh(&mut self) {
        let (addresses, waiting) = self.source.addresses();
        self.views.clear();
        self.addresses.clear();
        self.silent = waiting
            .into_iter()
            .map(|name| (name, "not serving yet".to_string()))
            .collect();
        // Every rank at once: a silent one costs the refresh one deadline, not one each.
        let fetched: Vec<(String, String, anyhow::Result<RankSnapshot>)> =
            std::thread::scope(|scope| {
                let fetches: Vec<_> = addresses
                    .into_iter()
                    .map(|(name, addr)| {
                        let fetch = scope.spawn({
                            let addr = addr.clone();
                            move || snapshot_of(&addr)
                        });
                        (name, addr, fetch)
                    })
                    .collect();
                fetches
                    .into_iter()
                    .map(|(name, addr, fetch)| {
                        let got = fetch
                            .join()
                            .unwrap_or_else(|_| Err(anyhow::anyhow!("fetch panicked")));
                        (name, addr, got)
                    })
                    .collect()
            });
        for (name, addr, fetched) in fetched {
            match fetched {
                Ok(snap) => {
                    self.views
                        .push(RankView::between(self.last.get(&addr), &snap));
                    self.addresses.insert(snap.rank, addr.clone());
                    self.last.insert(addr, snap);
                }
                Err(e) => self.silent.push((name, format!("{e:#}"))),
            }
        }
        self.views.sort_by_key(|v| v.rank);
        self.silent.sort();
    }

    fn screen(&self) -> Screen {
        let uptime = self.views.iter().map(|v| v.uptime).fold(0.0, f64::max);
        let moved = self
            .moved
            .as_deref()
            .map(|m| format!(" · {m}"))
            .unwrap_or_default();
        Screen {
            title: format!(
                "gsm top · {} · up {:.0} s · q quits, m moves a hot property{moved}",
                self.source.title(),
                uptime
            ),
            views: self.views.clone(),
            silent: self.silent.clone(),
        }
    }
}

/// A property to move by hand: the one rank `rank` lists as `id` among worker `from`'s
/// hottest, to worker `to`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PlannedMove {
    pub(crate) rank: u32,
    pub(crate) id: String,
    pub(crate) from: u32,
    pub(crate) to: u32,
}

/// The move the `m` key makes: in each rank, the hottest property of the busiest worker that
/// lists one, to the least busy other worker of that rank; of the ranks, the one whose two
/// workers are furthest apart in busy share. `None` when no rank has two workers and a hot
/// property.
pub(crate) fn planned_move(views: &[RankView]) -> Option<PlannedMove> {
    let mut best: Option<(f64, PlannedMove)> = None;
    for v in views {
        let busy = |worker: u32| {
            v.workers
                .iter()
                .find(|w| w.worker == worker)
                .map_or(0.0, |w| w.busy)
        };
        let Some((from, id)) = v
            .hot
            .iter()
            .max_by(|a, b| {
                (busy(a.0), a.3)
                    .partial_cmp(&(busy(b.0), b.3))
                    .unwrap_or(std::cmp::Ordering::Equal)
            })
            .map(|(w, _, id, _)| (*w, id.clone()))
        else {
            continue;
        };
        let Some(to) = v
            .workers
            .iter()
            .filter(|w| w.worker != from)
            .min_by(|a, b| a.busy.total_cmp(&b.busy))
        else {
            continue;
        };
        let gap = busy(from) - to.busy;
        if best.as_ref().is_none_or(|(g, _)| gap > *g) {
            let planned = PlannedMove {
                rank: v.rank,
                id,
                from,
                to: to.worker,
            };
            best = Some((gap, planned));
        }
    }
    best.map(|(_, planned)| planned)
}

/// Asks the rank at `addr` to make `planned` (`POST /move` with the job's control token);
/// what it answered, or why not.
fn ask_move(addr: &str, token: &str, planned: &PlannedMove) -> anyhow::Result<String> {
    let PlannedMove { rank, id, from, to } = planned;
    let at: SocketAddr = addr.parse().context("not an address")?;
    let mut stream = TcpStream::connect_timeout(&at, FETCH_DEADLINE)?;
    // The rank waits for its worker to make the move up to 2 s.
    stream.set_read_timeout(Some(FETCH_DEADLINE + Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(FETCH_DEADLINE))?;
    let request = format!(
        "POST /move?id={id}&from={from}&to={to} HTTP/1.1\r\nHost: gsm\r\n\
         X-Gsm-Control: {token}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes())?;
    let mut answer = Vec::new();
    stream.take(64 * 1024).read_to_end(&mut answer)?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.lines().next().unwrap_or_default();
    if !status.starts_with("HTTP/1.1 200") {
        bail!("rank {rank} answered {status:?}: {}", body.trim());
    }
    Ok(format!("rank {rank}: {}", body.trim()))
}

/// A rank's counters, fetched from `addr` and read.
fn snapshot_of(addr: &str) -> anyhow::Result<RankSnapshot> {
    RankSnapshot::from_text(&fetch(addr)?).map_err(|e| anyhow::anyhow!("{addr}: {e}"))
}

/// Fetches a rank's counters: `GET /metrics` on `addr`, with deadlines.
fn fetch(addr: &str) -> anyhow::Result<String> {
    let ask = || -> anyhow::Result<String> {
        let at: SocketAddr = addr.parse().context("not an address")?;
        let mut stream = TcpStream::connect_timeout(&at, FETCH_DEADLINE)?;
        stream.set_read_timeout(Some(FETCH_DEADLINE))?;
        stream.set_write_timeout(Some(FETCH_DEADLINE))?;
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: gsm\r\nConnection: close\r\n\r\n")?;
        let mut answer = Vec::new();
        stream.take(MAX_ANSWER).read_to_end(&mut answer)?;
        let answer = String::from_utf8(answer).context("an answer that is not UTF-8")?;
        let Some((head, body)) = answer.split_once("\r\n\r\n") else {
            bail!("an answer without a body");
        };
        if !head.starts_with("HTTP/1.1 200") {
            bail!("answered {:?}", head.lines().next().unwrap_or_default());
        }
        Ok(body.to_string())
    };
    ask().with_context(|| addr.to_string())
}

/// One screen's content.
pub(crate) struct Screen {
    pub(crate) title: String,
    pub(crate) views: Vec<RankView>,
    /// Ranks not answering, by name, and why.
    pub(crate) silent: Vec<(String, String)>,
}

impl Screen {
    /// Rows of each table, for the layout.
    fn heights(&self) -> [u16; 5] {
        let workers: usize = self.views.iter().map(|v| v.workers.len()).sum();
        let types = self.types().len().min(TOP_ROWS);
        let hot = self.hot().len().min(TOP_ROWS);
        let links: usize = self.views.iter().map(|v| v.links.len()).sum();
        // Each table: its rows, a header and two border lines.
        let h = |rows: usize| (rows.max(1) + 3) as u16;
        // Ranks that did not answer: a line each, between borders; nothing when all did.
        let silent = match self.silent.len() {
            0 => 0,
            n => n as u16 + 2,
        };
        [h(workers), silent, h(types), h(hot), h(links)]
    }

    /// The busiest types over every rank: name, requests per second, mean time.
    fn types(&self) -> Vec<(String, f64, f64)> {
        let mut by_name: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
        for (name, rate, mean) in self.views.iter().flat_map(|v| &v.types) {
            let e = by_name.entry(name).or_default();
            e.0 += rate;
            e.1 += rate * mean;
        }
        let mut types: Vec<_> = by_name
            .into_iter()
            .map(|(n, (rate, time))| {
                (
                    short_type(n),
                    rate,
                    if rate > 0.0 { time / rate } else { 0.0 },
                )
            })
            .collect();
        types.sort_by(|a, b| b.1.total_cmp(&a.1));
        types
    }

    /// The busiest properties over every rank.
    fn hot(&self) -> Vec<(u32, u32, String, String, f64)> {
        let mut hot: Vec<_> = self
            .views
            .iter()
            .flat_map(|v| {
                v.hot
                    .iter()
                    .map(|(w, t, id, rate)| (v.rank, *w, short_type(t), id.clone(), *rate))
            })
            .collect();
        hot.sort_by(|a, b| b.4.total_cmp(&a.4));
        hot
    }

    /// Draws the screen into `frame`.
    pub(crate) fn draw(&self, frame: &mut Frame) {
        let [w, s, t, h, l] = self.heights();
        let areas = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(w),
            Constraint::Length(s),
            Constraint::Length(t),
            Constraint::Length(h),
            Constraint::Length(l),
            Constraint::Min(0),
        ])
        .split(frame.area());
        frame.render_widget(Line::from(self.title.as_str()).style(bold()), areas[0]);
        self.draw_workers(frame, areas[1]);
        self.draw_silent(frame, areas[2]);
        self.draw_types(frame, areas[3]);
        self.draw_hot(frame, areas[4]);
        self.draw_links(frame, areas[5]);
    }

    fn draw_workers(&self, frame: &mut Frame, area: Rect) {
        let mut rows: Vec<Row> = Vec::new();
        for v in &self.views {
            for w in &v.workers {
                rows.push(Row::new(vec![
                    v.rank.to_string(),
                    w.worker.to_string(),
                    format!("{:.0}%", w.busy * 100.0),
                    rate(w.requests_per_second),
                    format!("{:.1}", w.batch),
                    format!("{:.0}", w.runnable),
                    format!("{:.0}", w.fibers),
                    format!("{:.0}", w.properties),
                ]));
            }
        }
        let widths = [4, 6, 6, 10, 7, 9, 7, 11].map(Constraint::Length);
        let header = [
            "rank",
            "worker",
            "busy",
            "requests/s",
            "batch",
            "runnable",
            "fibers",
            "properties",
        ];
        frame.render_widget(table(rows, &widths, &header, "workers"), area);
    }

    fn draw_silent(&self, frame: &mut Frame, area: Rect) {
        if self.silent.is_empty() {
            return;
        }
        let lines: Vec<Line> = self
            .silent
            .iter()
            .map(|(name, why)| Line::from(format!("{name}: {why}")))
            .collect();
        let block = Block::bordered().title("ranks not answering");
        frame.render_widget(Paragraph::new(lines).block(block), area);
    }

    fn draw_types(&self, frame: &mut Frame, area: Rect) {
        let rows = self
            .types()
            .into_iter()
            .take(TOP_ROWS)
            .map(|(name, r, mean)| Row::new(vec![name, rate(r), format!("{:.2}", mean * 1e6)]));
        let widths = [
            Constraint::Min(30),
            Constraint::Length(11),
            Constraint::Length(8),
        ];
        let header = ["property type (sampled)", "requests/s", "mean µs"];
        frame.render_widget(table(rows.collect(), &widths, &header, "types"), area);
    }

    fn draw_hot(&self, frame: &mut Frame, area: Rect) {
        let rows = self
            .hot()
            .into_iter()
            .take(TOP_ROWS)
            .map(|(rank, w, t, id, r)| {
                Row::new(vec![
                    rank.to_string(),
                    w.to_string(),
                    t,
                    format!("{:#x}", id.parse::<u64>().unwrap_or(0)),
                    rate(r),
                ])
            });
        let widths = [
            Constraint::Length(4),
            Constraint::Length(6),
            Constraint::Min(24),
            Constraint::Length(16),
            Constraint::Length(11),
        ];
        let header = [
            "rank",
            "worker",
            "hottest properties (sampled)",
            "id",
            "requests/s",
        ];
        frame.render_widget(table(rows.collect(), &widths, &header, "properties"), area);
    }

    fn draw_links(&self, frame: &mut Frame, area: Rect) {
        let rows = self.views.iter().flat_map(|v| {
            v.links.iter().map(move |l| {
                Row::new(vec![
                    format!("{} → {}", v.rank, l.peer),
                    l.transport.clone(),
                    bytes(l.bytes_out),
                    bytes(l.bytes_in),
                ])
            })
        });
        let widths = [8, 5, 12, 12].map(Constraint::Length);
        let header = ["link", "via", "out/s", "in/s"];
        frame.render_widget(table(rows.collect(), &widths, &header, "links"), area);
    }

    /// The screen as text, `width` columns wide, trailing blanks trimmed.
    pub(crate) fn text(&self, width: u16) -> String {
        let height = 1 + self.heights().iter().sum::<u16>();
        let mut terminal =
            ratatui::Terminal::new(TestBackend::new(width, height)).expect("a buffer terminal");
        terminal
            .draw(|frame| self.draw(frame))
            .expect("drawing into a buffer");
        let buffer = terminal.backend().buffer();
        let mut text = String::new();
        for y in 0..buffer.area.height {
            let line: String = (0..buffer.area.width)
                .map(|x| buffer[(x, y)].symbol())
                .collect();
            text.push_str(line.trim_end());
            text.push('\n');
        }
        text
    }
}

fn bold() -> Style {
    Style::default().add_modifier(Modifier::BOLD)
}

fn table<'a>(
    rows: Vec<Row<'a>>,
    widths: &[Constraint],
    header: &[&'a str],
    title: &'a str,
) -> Table<'a> {
    Table::new(rows, widths.to_vec())
        .header(Row::new(header.to_vec()).style(bold()))
        .block(Block::bordered().title(title))
}

/// A rate, short.
fn rate(per_second: f64) -> String {
    match per_second {
        r if r >= 1e6 => format!("{:.2}M", r / 1e6),
        r if r >= 1e4 => format!("{:.1}k", r / 1e3),
        r => format!("{r:.0}"),
    }
}

/// Bytes per second, short.
fn bytes(per_second: f64) -> String {
    match per_second {
        b if b >= 1e6 => format!("{:.1} MB", b / 1e6),
        b if b >= 1e3 => format!("{:.1} kB", b / 1e3),
        b => format!("{b:.0} B"),
    }
}

/// A type name without its module paths: `alloc::vec::Vec<my::T>` reads `Vec<T>`.
pub(crate) fn short_type(name: &str) -> String {
    let mut out = String::new();
    let mut segment = String::new();
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            segment.clear();
        } else if c.is_alphanumeric() || c == '_' {
            segment.push(c);
        } else {
            out.push_str(&segment);
            segment.clear();
            out.push(c);
        }
    }
    out.push_str(&segment);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::WorkerView;

    #[test]
    fn type_names_lose_their_paths() {
        assert_eq!(short_type("alloc::vec::Vec<my::T>"), "Vec<T>");
        assert_eq!(short_type("(u64, std::string::String)"), "(u64, String)");
        assert_eq!(short_type("u8"), "u8");
    }

    #[test]
    fn a_screen_shows_every_table() {
        let text = "gossamer_uptime_seconds{rank=\"0\"} 2\n\
            gossamer_worker_requests_total{rank=\"0\",worker=\"1\"} 2000\n\
            gossamer_worker_batches_total{rank=\"0\",worker=\"1\"} 20\n\
            gossamer_worker_sleeping_seconds_total{rank=\"0\",worker=\"1\"} 1\n\
            gossamer_type_requests_total{rank=\"0\",type=\"app::Counter\"} 2048\n\
            gossamer_type_seconds_total{rank=\"0\",type=\"app::Counter\"} 0.002\n\
            gossamer_hot_property_requests{rank=\"0\",worker=\"1\",type=\"app::Counter\",id=\"4096\"} 2048\n\
            gossamer_link_bytes_out_total{rank=\"0\",worker=\"0\",peer_rank=\"1\",peer_worker=\"0\",transport=\"shm\"} 4000\n";
        let view = RankView::between(None, &RankSnapshot::from_text(text).unwrap());
        let screen = Screen {
            title: "title".into(),
            views: vec![view],
            silent: vec![("rank 1".into(), "not serving yet".into())],
        };
        let shown = screen.text(100);
        for expected in [
            "50%",
            "1000",
            "100.0",
            "Counter",
            "0x1000",
            "0 → 1",
            "shm",
            "2.0 kB",
            "not serving yet",
        ] {
            assert!(
                shown.contains(expected),
                "{expected:?} missing from\n{shown}"
            );
        }
    }

    fn worker(worker: u32, busy: f64) -> WorkerView {
        WorkerView {
            worker,
            busy,
            requests_per_second: 0.0,
            batch: 0.0,
            runnable: 0.0,
            fibers: 0.0,
            properties: 0.0,
        }
    }

    fn view(rank: u32, workers: &[f64], hot: &[(u32, &str, f64)]) -> RankView {
        RankView {
            rank,
            uptime: 1.0,
            seconds: 1.0,
            workers: (0..).zip(workers).map(|(w, &b)| worker(w, b)).collect(),
            types: vec![],
            hot: hot
                .iter()
                .map(|&(w, id, rate)| (w, "T".to_string(), id.to_string(), rate))
                .collect(),
            links: vec![],
        }
    }

    #[test]
    fn the_hottest_property_of_the_busiest_worker_goes_to_the_least_busy() {
        let planned =
            |views: &[RankView]| planned_move(views).map(|m| (m.rank, m.id, m.from, m.to));
        // Rank 1 is the further apart (0.9 against 0.1); its worker 2 is the busiest that
        // lists hot properties, and its hottest there is "8".
        let views = [
            view(0, &[0.6, 0.4], &[(0, "1", 50.0)]),
            view(
                1,
                &[0.95, 0.1, 0.9],
                &[(2, "7", 10.0), (2, "8", 90.0), (1, "9", 500.0)],
            ),
        ];
        assert_eq!(planned(&views), Some((1, "8".to_string(), 2, 1)));
        // A rank with one worker, or none hot: nothing to move.
        assert_eq!(planned(&[view(0, &[1.0], &[(0, "1", 5.0)])]), None);
        assert_eq!(planned(&[view(0, &[1.0, 0.0], &[])]), None);
    }
}
