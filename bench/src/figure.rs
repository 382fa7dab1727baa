//! What an experiment produces, and how its numbers are printed.
//!
//! A [`Figure`] holds one or more [`Panel`]s (one per access pattern, thread count or metric); a panel
//! holds one [`Series`] per system; a series holds one [`Point`] per x value with the samples of every
//! run. Medians, minima and maxima are computed here, once, so the CSV, markdown and PNG agree. A
//! [`Table`] is a result that is not plotted (`instructions`); [`RunInfo`] heads every result file.

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
    /// Whole counts (processes): as `Count`, and other values (axis ticks between them) left
    /// unlabelled.
    Whole,
    /// The load beside the measurement, x being its busy loops: `idle` at 0, `loaded: N busy
    /// loops` at N, one per allowed CPU (see [`crate::busy`]); other values (axis ticks)
    /// unlabelled.
    Condition,
}

impl XFormat {
    /// Formats `x` for tables and axis labels.
    pub fn format(self, x: f64) -> String {
        match self {
            XFormat::Count => count(x),
            XFormat::Percent => format!("{x:.0}%"),
            XFormat::Rate => tick(x),
            // Ticks are computed in floating point: 2.0000000001 is 2.
            XFormat::Whole if (x - x.round()).abs() < 1e-6 => count(x),
            XFormat::Whole => String::new(),
            XFormat::Condition => {
                let loaded = crate::busy::Condition::both()[1].busy_loops();
                match x.round() as usize {
                    n if (x - x.round()).abs() < 1e-6 && (n == 0 || n == loaded) => {
                        crate::busy::label(n)
                    }
                    _ => String::new(),
                }
            }
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

    /// The median of `system` at `x` in panel `panel`, if the figure has that point.
    pub fn median(&self, panel: &str, system: &str, x: f64) -> Option<f64> {
        let p = self.panels.iter().find(|p| p.id == panel)?;
        Some(
            p.series
                .iter()
                .find(|s| s.system == system)?
                .at(x)?
                .median(),
        )
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
