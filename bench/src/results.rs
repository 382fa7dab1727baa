//! Writing an experiment's result files into the output directory: a figure's CSV, markdown
//! ([`crate::report`]) and PNG ([`crate::plot`]), a table's CSV and markdown.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::figure::{Figure, RunInfo, Table};
use crate::machine::Machine;
use crate::{plot, report};

/// Writes `NAME.csv`, `NAME.md` and `NAME.png` of a figure into `dir`; returns the paths written.
pub fn write_figure(
    dir: &Path,
    fig: &Figure,
    machine: &Machine,
    info: &RunInfo,
) -> anyhow::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let csv_path = dir.join(format!("{}.csv", fig.name));
    fs::write(&csv_path, report::figure_csv(fig, machine, info))
        .with_context(|| format!("writing {}", csv_path.display()))?;
    let png_path = dir.join(format!("{}.png", fig.name));
    plot::render(&png_path, fig, machine, info)?;
    let md_path = dir.join(format!("{}.md", fig.name));
    fs::write(&md_path, report::figure_markdown(fig, machine, info))
        .with_context(|| format!("writing {}", md_path.display()))?;
    Ok(vec![csv_path, png_path, md_path])
}

/// Writes `NAME.csv` and `NAME.md` of a table into `dir`; returns the paths written.
pub fn write_table(
    dir: &Path,
    table: &Table,
    machine: &Machine,
    info: &RunInfo,
) -> anyhow::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let csv_path = dir.join(format!("{}.csv", table.name));
    fs::write(&csv_path, report::table_csv(table, machine, info))
        .with_context(|| format!("writing {}", csv_path.display()))?;
    let md_path = dir.join(format!("{}.md", table.name));
    fs::write(&md_path, report::table_markdown(table, machine, info))
        .with_context(|| format!("writing {}", md_path.display()))?;
    Ok(vec![csv_path, md_path])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::figure::Panel;

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
        let files = write_figure(&dir, &fig, &Machine::detect(), &info).unwrap();
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
}
