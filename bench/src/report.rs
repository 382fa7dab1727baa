//! The text of the result files: CSV (every sample) and markdown (tables with ratios), for a
//! [`Figure`] or a [`Table`].

use std::fmt::Write as _;

use crate::figure::{Figure, Panel, RunInfo, Table, sig};
use crate::machine::Machine;

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
pub fn figure_csv(fig: &Figure, machine: &Machine, info: &RunInfo) -> String {
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
pub fn figure_markdown(fig: &Figure, machine: &Machine, info: &RunInfo) -> String {
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

/// An unplotted panel as markdown: its title, then each system's medians (no ratios).
pub(crate) fn median_table(p: &Panel) -> String {
    let mut out = format!("## {}\n\n", p.title);
    let xs = table_head(&mut out, p);
    for s in &p.series {
        let _ = write!(out, "| {} |", s.system);
        for x in &xs {
            match s.at(*x) {
                Some(pt) => {
                    let _ = write!(out, " {} |", sig(pt.median()));
                }
                None => out.push_str(" – |"),
            }
        }
        out.push('\n');
    }
    out.push('\n');
    out
}

/// The CSV text of a table: the commented header, then the column headings and one line per row.
pub fn table_csv(table: &Table, machine: &Machine, info: &RunInfo) -> String {
    let mut csv = csv_header(&table.title, machine, info);
    let _ = writeln!(csv, "# quick: {}", info.quick);
    let line = |cells: &[String]| cells.iter().map(|c| quote(c)).collect::<Vec<_>>().join(",");
    let _ = writeln!(csv, "{}", line(&table.columns));
    for row in &table.rows {
        let _ = writeln!(csv, "{}", line(row));
    }
    csv
}

/// The markdown text of a table: machine table, command, the table, then its notes.
pub fn table_markdown(table: &Table, machine: &Machine, info: &RunInfo) -> String {
    let mut md = markdown_header(&table.title, machine, info);
    let _ = writeln!(
        md,
        "Command: `{}` — started {} UTC, took {:.0} s.\n",
        info.command, info.started, info.seconds
    );
    md.push_str(&table_body(table));
    for note in &table.notes {
        let _ = write!(md, "\n{note}\n");
    }
    md
}

/// The table alone (no heading, machine or notes), as markdown.
pub fn table_body(table: &Table) -> String {
    let mut out = format!("| {} |\n|", table.columns.join(" | "));
    for i in 0..table.columns.len() {
        out.push_str(if i == 0 { " --- |" } else { " ---: |" });
    }
    out.push('\n');
    for row in &table.rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out
}

/// The heading of every markdown file: title, smoke-run warning and machine table.
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
