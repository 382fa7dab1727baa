//! Results of one figure and the files they are written to: CSV, markdown and (via [`crate::plot`]) PNG.
//!
//! A [`Figure`] holds one or more [`Panel`]s (one per access pattern, thread count or metric); a panel
//! holds one [`Series`] per system; a series holds one [`Point`] per x value with the samples of every
//! run. Medians, minima and maxima are computed here, once, so the three outputs agree.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::machine::Machine;

/// One x value of one system: the samples of every run.
#[derive(Debug, Clone)]
pub struct Point {
    /// The x coordinate (object count, offered load, write share, ...).
    pub x: f64,
    /// One value per run.
    pub samples: Vec<f64>,
    /// Set when the median run hit a limit (for example a saturated latency run).
    pub flag: Option<&'static str>,
}

impl Point {
    /// Median of the samples (mean of the two middle ones for an even count).
    pub fn median(&self) -> f64 {
        let mut s = self.samples.clone();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        if n == 0 {
            f64::NAN
        } else if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        }
    }

    /// Smallest sample.
    pub fn min(&self) -> f64 {
        self.samples.iter().copied().fold(f64::INFINITY, f64::min)
    }

    /// Largest sample.
    pub fn max(&self) -> f64 {
        self.samples
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max)
    }
}

/// One system's curve in a panel.
#[derive(Debug, Clone)]
pub struct Series {
    /// System name, as in the legend.
    pub system: String,
    /// Points in increasing x.
    pub points: Vec<Point>,
}

impl Series {
    /// The point at `x`, if measured.
    pub fn at(&self, x: f64) -> Option<&Point> {
        self.points.iter().find(|p| p.x == x)
    }
}

/// How x values are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XFormat {
    /// Counts: 1, 10, 1k, 1M.
    Count,
    /// Percentages: 5%.
    Percent,
    /// Rates in Mops/s.
    Rate,
}

impl XFormat {
    /// Formats `x` for tables and axis labels.
    pub fn format(self, x: f64) -> String {
        match self {
            XFormat::Count => count(x),
            XFormat::Percent => format!("{x:.0}%"),
            XFormat::Rate => tick(x),
        }
    }
}

/// One plot panel (and one markdown table).
#[derive(Debug, Clone)]
pub struct Panel {
    /// Short id used in CSV (`uniform/1-thread-per-core`).
    pub id: String,
    /// Panel title.
    pub title: String,
    /// X axis label, with unit.
    pub x_label: String,
    /// How x values are printed.
    pub x_format: XFormat,
    /// Y axis label, with unit.
    pub y_label: String,
    /// Logarithmic x axis.
    pub log_x: bool,
    /// Logarithmic y axis.
    pub log_y: bool,
    /// System the ratios in the table are relative to.
    pub baseline: Option<String>,
    /// One series per system.
    pub series: Vec<Series>,
    /// Whether the panel is drawn in the PNG and tabulated in the markdown (default); when not,
    /// it is written to the CSV only and the experiment summarises it in its extra markdown.
    pub plotted: bool,
}

impl Panel {
    /// An empty panel.
    pub fn new(id: impl Into<String>, title: impl Into<String>) -> Self {
        Panel {
            id: id.into(),
            title: title.into(),
            x_label: String::new(),
            x_format: XFormat::Count,
            y_label: String::new(),
            log_x: true,
            log_y: false,
            baseline: None,
            series: Vec::new(),
            plotted: true,
        }
    }

    /// Adds one run's sample for `system` at `x`.
    pub fn add(&mut self, system: &str, x: f64, sample: f64) {
        let series = match self.series.iter_mut().position(|s| s.system == system) {
            Some(i) => &mut self.series[i],
            None => {
                self.series.push(Series {
                    system: system.to_owned(),
                    points: Vec::new(),
                });
                self.series.last_mut().expect("just pushed")
            }
        };
        match series.points.iter_mut().find(|p| p.x == x) {
            Some(p) => p.samples.push(sample),
            None => {
                series.points.push(Point {
                    x,
                    samples: vec![sample],
                    flag: None,
                });
                series.points.sort_by(|a, b| a.x.total_cmp(&b.x));
            }
        }
    }

    /// Marks the point of `system` at `x`.
    pub fn flag(&mut self, system: &str, x: f64, flag: &'static str) {
        if let Some(p) = self
            .series
            .iter_mut()
            .find(|s| s.system == system)
            .and_then(|s| s.points.iter_mut().find(|p| p.x == x))
        {
            p.flag = Some(flag);
        }
    }

    /// All x values measured by any system, sorted.
    pub fn xs(&self) -> Vec<f64> {
        let mut xs: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.x))
            .collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        xs
    }
}

/// A figure: what one experiment (`cargo run --release -p bench -- NAME`) produces.
#[derive(Debug, Clone)]
pub struct Figure {
    /// File stem and command name.
    pub name: String,
    /// Title for the plot and the markdown heading.
    pub title: String,
    /// How the numbers were measured, one paragraph per entry.
    pub notes: Vec<String>,
    /// Panels, laid out row by row in `columns` columns.
    pub panels: Vec<Panel>,
    /// Number of panel columns in the plot.
    pub columns: usize,
    /// Extra markdown appended after the tables.
    pub extra_markdown: String,
}

impl Figure {
    /// The panel with `id`.
    pub fn panel_mut(&mut self, id: &str) -> &mut Panel {
        self.panels
            .iter_mut()
            .find(|p| p.id == id)
            .unwrap_or_else(|| panic!("no panel {id}"))
    }

    /// Every system of the plotted panels in order of first appearance (the legend order).
    pub fn systems(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for s in self
            .panels
            .iter()
            .filter(|p| p.plotted)
            .flat_map(|p| &p.series)
        {
            if !out.contains(&s.system) {
                out.push(s.system.clone());
            }
        }
        out
    }
}

/// Options recorded in the header of the result files.
#[derive(Debug, Clone)]
pub struct RunInfo {
    /// The command that produced the figure.
    pub command: String,
    /// Runs per point.
    pub runs: usize,
    /// Measurement window per run.
    pub window_ms: u64,
    /// Whether this was a `--quick` smoke run.
    pub quick: bool,
    /// UTC date and time the run started.
    pub started: String,
    /// Wall-clock seconds the figure took.
    pub seconds: f64,
}

/// Writes `NAME.csv`, `NAME.md` and `NAME.png` into `dir`; returns the paths written.
pub fn write_all(
    dir: &Path,
    fig: &Figure,
    machine: &Machine,
    info: &RunInfo,
) -> anyhow::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let csv_path = dir.join(format!("{}.csv", fig.name));
    fs::write(&csv_path, csv(fig, machine, info))
        .with_context(|| format!("writing {}", csv_path.display()))?;
    let png_path = dir.join(format!("{}.png", fig.name));
    crate::plot::render(&png_path, fig, machine, info)?;
    let md_path = dir.join(format!("{}.md", fig.name));
    fs::write(&md_path, markdown(fig, machine, info))
        .with_context(|| format!("writing {}", md_path.display()))?;
    Ok(vec![csv_path, png_path, md_path])
}

/// A result that is a table rather than a plot (`instructions`): written as CSV and markdown.
#[derive(Debug, Clone)]
pub struct Table {
    /// File stem and command name.
    pub name: String,
    /// Markdown heading.
    pub title: String,
    /// How the numbers were measured, one paragraph per entry.
    pub notes: Vec<String>,
    /// Column headings.
    pub columns: Vec<String>,
    /// Rows of cells, one per column.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// The table alone, as markdown.
    pub fn markdown_table(&self) -> String {
        let mut out = format!("| {} |\n|", self.columns.join(" | "));
        for i in 0..self.columns.len() {
            out.push_str(if i == 0 { " --- |" } else { " ---: |" });
        }
        out.push('\n');
        for row in &self.rows {
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        out
    }
}

/// Writes `NAME.csv` and `NAME.md` of a table into `dir`; returns the paths written.
pub fn write_table(
    dir: &Path,
    table: &Table,
    machine: &Machine,
    info: &RunInfo,
) -> anyhow::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut csv = csv_header(&table.title, machine, info);
    let _ = writeln!(csv, "# quick: {}", info.quick);
    let line = |cells: &[String]| cells.iter().map(|c| quote(c)).collect::<Vec<_>>().join(",");
    let _ = writeln!(csv, "{}", line(&table.columns));
    for row in &table.rows {
        let _ = writeln!(csv, "{}", line(row));
    }
    let csv_path = dir.join(format!("{}.csv", table.name));
    fs::write(&csv_path, csv).with_context(|| format!("writing {}", csv_path.display()))?;
    let mut md = markdown_header(&table.title, machine, info);
    let _ = writeln!(
        md,
        "Command: `{}` — started {} UTC, took {:.0} s.\n",
        info.command, info.started, info.seconds
    );
    md.push_str(&table.markdown_table());
    for note in &table.notes {
        let _ = write!(md, "\n{note}\n");
    }
    let md_path = dir.join(format!("{}.md", table.name));
    fs::write(&md_path, md).with_context(|| format!("writing {}", md_path.display()))?;
    Ok(vec![csv_path, md_path])
}

/// The commented lines that head every CSV file: title, command and machine.
fn csv_header(title: &str, machine: &Machine, info: &RunInfo) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# {title}");
    let _ = writeln!(out, "# command: {}", info.command);
    let _ = writeln!(
        out,
        "# started: {} UTC; {:.0} s",
        info.started, info.seconds
    );
    let _ = writeln!(out, "# cpu: {}", machine.cpu);
    let _ = writeln!(out, "# cores: {}", machine.cores);
    let _ = writeln!(out, "# memory_gib: {:.1}", machine.memory_gib);
    let _ = writeln!(out, "# kernel: {}", machine.kernel);
    let _ = writeln!(out, "# rustc: {} ({})", machine.rustc, machine.profile);
    let _ = writeln!(out, "# load at start: {}", machine.load);
    out
}

/// The CSV text: a commented header with the machine, then one row per (panel, system, x).
pub fn csv(fig: &Figure, machine: &Machine, info: &RunInfo) -> String {
    let mut out = csv_header(&fig.title, machine, info);
    let _ = writeln!(
        out,
        "# runs: {}; window_ms: {}; quick: {}",
        info.runs, info.window_ms, info.quick
    );
    out.push_str("panel,system,x,x_label,y_label,median,min,max,runs,flag,samples\n");
    for p in &fig.panels {
        for s in &p.series {
            for pt in &s.points {
                let samples: Vec<String> = pt.samples.iter().map(|v| format!("{v}")).collect();
                let _ = writeln!(
                    out,
                    "{},{},{},{},{},{},{},{},{},{},{}",
                    quote(&p.id),
                    quote(&s.system),
                    pt.x,
                    quote(&p.x_label),
                    quote(&p.y_label),
                    pt.median(),
                    pt.min(),
                    pt.max(),
                    pt.samples.len(),
                    pt.flag.unwrap_or(""),
                    samples.join(";")
                );
            }
        }
    }
    out
}

fn quote(s: &str) -> String {
    if s.contains(',') || s.contains('"') {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// The markdown report: machine table, notes, then one table per panel with ratios.
pub fn markdown(fig: &Figure, machine: &Machine, info: &RunInfo) -> String {
    let mut out = markdown_header(&fig.title, machine, info);
    let _ = writeln!(
        out,
        "Command: `{}` — started {} UTC, took {:.0} s; each cell is the median of {} runs of {} ms \
         (min–max in parentheses), all systems measured in the same invocation.\n",
        info.command, info.started, info.seconds, info.runs, info.window_ms
    );
    let _ = writeln!(out, "![{}]({}.png)\n", fig.title, fig.name);
    for note in &fig.notes {
        let _ = writeln!(out, "{note}\n");
    }
    for p in fig.panels.iter().filter(|p| p.plotted) {
        let _ = writeln!(out, "## {}\n", p.title);
        let _ = write!(out, "{}", ratio_note(p));
        let xs = table_head(&mut out, p);
        let base = p
            .baseline
            .as_ref()
            .and_then(|b| p.series.iter().find(|s| &s.system == b));
        for s in &p.series {
            let _ = write!(out, "| {} |", s.system);
            for x in &xs {
                match s.at(*x) {
                    None => out.push_str(" – |"),
                    Some(pt) => {
                        let mut cell =
                            format!("{} ({}–{})", sig(pt.median()), sig(pt.min()), sig(pt.max()));
                        if let Some(r) = base
                            .and_then(|b| b.at(*x))
                            .map(|b| pt.median() / b.median())
                        {
                            let _ = write!(cell, " **×{}**", sig(r));
                        }
                        if pt.flag.is_some() {
                            cell.push_str(" †");
                        }
                        let _ = write!(out, " {cell} |");
                    }
                }
            }
            out.push('\n');
        }
        if p.series
            .iter()
            .any(|s| s.points.iter().any(|pt| pt.flag.is_some()))
        {
            let flags: Vec<&str> = p
                .series
                .iter()
                .flat_map(|s| s.points.iter().filter_map(|pt| pt.flag))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            let _ = writeln!(out, "\n† {}", flags.join("; "));
        }
        out.push('\n');
    }
    out.push_str(&fig.extra_markdown);
    out
}

/// The heading of every markdown file: title, smoke-run warning and machine table.
/// Writes a panel's table head (`| system | x… |` and its rule); returns the panel's xs.
pub(crate) fn table_head(out: &mut String, p: &Panel) -> Vec<f64> {
    let xs = p.xs();
    out.push_str("| system |");
    for x in &xs {
        let _ = write!(out, " {} |", p.x_format.format(*x));
    }
    out.push_str("\n| --- |");
    for _ in &xs {
        out.push_str(" ---: |");
    }
    out.push('\n');
    xs
}

fn markdown_header(title: &str, machine: &Machine, info: &RunInfo) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# {title}\n");
    if info.quick {
        let _ = writeln!(
            out,
            "**Smoke run (`--quick`): numbers are not meaningful.**\n"
        );
    }
    let _ = writeln!(out, "{machine}");
    out
}

fn ratio_note(p: &Panel) -> String {
    match &p.baseline {
        Some(b) => format!(
            "{} against {}; **×** is the ratio to `{b}` at the same x.\n\n",
            p.y_label, p.x_label
        ),
        None => format!("{} against {}.\n\n", p.y_label, p.x_label),
    }
}

/// Three significant digits, without exponent for everyday magnitudes.
pub fn sig(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".to_owned();
    }
    let a = v.abs();
    if a == 0.0 {
        "0".to_owned()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.001 {
        let digits = (2 - a.log10().floor() as i32) as usize;
        format!("{v:.digits$}")
    } else {
        format!("{v:.2e}")
    }
}

/// Axis tick label: `0.01`, `0.5`, `2`, `250`, without trailing zeros.
pub fn tick(v: f64) -> String {
    let s = sig(v);
    if s.contains('.') && !s.contains('e') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// Counts with k/M suffixes: 1, 10, 1k, 100k, 1M.
pub fn count(x: f64) -> String {
    let r = x.round();
    if r >= 1e6 && (r / 1e6).fract() == 0.0 {
        format!("{}M", r / 1e6)
    } else if r >= 1e3 && (r / 1e3).fract() == 0.0 {
        format!("{}k", r / 1e3)
    } else if r >= 1e6 {
        format!("{:.1}M", r / 1e6)
    } else if r >= 1e4 {
        format!("{:.0}k", r / 1e3)
    } else {
        format!("{r}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_max() {
        let p = Point {
            x: 1.0,
            samples: vec![3.0, 1.0, 2.0],
            flag: None,
        };
        assert_eq!((p.median(), p.min(), p.max()), (2.0, 1.0, 3.0));
        let p = Point {
            x: 1.0,
            samples: vec![4.0, 1.0, 2.0, 3.0],
            flag: None,
        };
        assert_eq!(p.median(), 2.5);
    }

    #[test]
    fn writes_csv_markdown_and_png() {
        let mut p = Panel::new("demo", "demo panel");
        p.x_label = "objects (log)".into();
        p.y_label = "throughput, Mops/s".into();
        p.baseline = Some("a".into());
        for (x, a, b) in [(1.0, 2.0, 4.0), (10.0, 3.0, 3.0), (100.0, 4.0, 2.0)] {
            for k in 0..3 {
                p.add("a", x, a + f64::from(k) * 0.1);
                p.add("b, with comma", x, b);
            }
        }
        p.flag("b, with comma", 100.0, "flagged");
        let mut hidden = Panel::new("demo/csv-only", "csv-only panel");
        hidden.plotted = false;
        hidden.add("c", 1.0, 7.0);
        let fig = Figure {
            name: "demo".into(),
            title: "Demo figure".into(),
            notes: vec!["A note.".into()],
            panels: vec![p, hidden],
            columns: 1,
            extra_markdown: String::new(),
        };
        let info = RunInfo {
            command: "cargo run --release -p bench -- demo".into(),
            runs: 3,
            window_ms: 1,
            quick: true,
            started: "2026-01-01 00:00".into(),
            seconds: 1.0,
        };
        let dir = std::env::temp_dir().join(format!("bench-report-test-{}", std::process::id()));
        let files = write_all(&dir, &fig, &Machine::detect(), &info).unwrap();
        assert_eq!(files.len(), 3);
        let csv = fs::read_to_string(&files[0]).unwrap();
        assert!(csv.contains("demo,\"b, with comma\",100,"), "{csv}");
        let png = fs::read(&files[1]).unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000);
        let md = fs::read_to_string(&files[2]).unwrap();
        assert!(md.contains("| a | 2.10 (2.00–2.20) **×1.00** |"), "{md}");
        assert!(md.contains("**×1.90**"), "{md}");
        assert!(md.contains("† flagged"), "{md}");
        assert!(csv.contains("demo/csv-only,c,1,"), "{csv}");
        assert!(!md.contains("csv-only"), "{md}");
        assert_eq!(fig.systems(), ["a", "b, with comma"]);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn writes_table_csv_and_markdown() {
        let table = Table {
            name: "demo-table".into(),
            title: "Demo table".into(),
            notes: vec!["A note.".into()],
            columns: vec!["operation".into(), "count".into()],
            rows: vec![vec!["a, b".into(), "1.00".into()]],
        };
        let info = RunInfo {
            command: "cargo run --release -p bench -- demo-table".into(),
            runs: 1,
            window_ms: 1,
            quick: false,
            started: "2026-01-01 00:00".into(),
            seconds: 1.0,
        };
        let dir = std::env::temp_dir().join(format!("bench-table-test-{}", std::process::id()));
        let files = write_table(&dir, &table, &Machine::detect(), &info).unwrap();
        assert_eq!(files.len(), 2);
        let csv = fs::read_to_string(&files[0]).unwrap();
        assert!(
            csv.starts_with(
                "# Demo table\n# command: cargo run --release -p bench -- demo-table\n"
            ),
            "{csv}"
        );
        assert!(csv.contains("# cpu: "), "{csv}");
        assert!(csv.ends_with("operation,count\n\"a, b\",1.00\n"), "{csv}");
        let md = fs::read_to_string(&files[1]).unwrap();
        assert!(
            md.contains("| operation | count |\n| --- | ---: |\n| a, b | 1.00 |\n"),
            "{md}"
        );
        assert!(md.contains("| CPU |") && md.contains("A note."), "{md}");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn formats() {
        assert_eq!(count(1.0), "1");
        assert_eq!(count(1000.0), "1k");
        assert_eq!(count(10_000_000.0), "10M");
        assert_eq!(count(3162.0), "3162");
        assert_eq!(sig(12.345), "12.3");
        assert_eq!(sig(0.01234), "0.0123");
        assert_eq!(sig(1234.5), "1234");
    }
}
