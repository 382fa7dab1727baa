//! PNG plots with `plotters`, using the DejaVu Sans font embedded by the `dejavu` crate (no system
//! fonts, no Python).
//!
//! Layout: the figure title and machine on top, the panels in a grid, one shared legend on the right.
//! Each series is drawn as its medians joined by a line, with a min–max error bar at every point.

use std::path::Path;
use std::sync::Once;

use anyhow::{Context as _, anyhow};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::figure::{Figure, Panel, RunInfo, tick};
use crate::machine::Machine;

const PANEL_W: u32 = 760;
const PANEL_H: u32 = 520;
const LEGEND_W: u32 = 300;
const HEADER_H: u32 = 70;

/// Colours assigned to systems in legend order; distinguishable and print-safe.
const PALETTE: [RGBColor; 16] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(0, 0, 128),
    RGBColor(128, 0, 0),
    RGBColor(0, 100, 0),
    RGBColor(255, 187, 120),
    RGBColor(0, 0, 0),
    RGBColor(152, 223, 138),
];

fn register_fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The bytes are valid TrueType files shipped in the crate; failure would be a packaging bug.
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .unwrap_or_else(|_| panic!("embedded DejaVu Sans is not a valid font"));
        plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold())
            .unwrap_or_else(|_| panic!("embedded DejaVu Sans Bold is not a valid font"));
    });
}

fn color_of(systems: &[String], system: &str) -> RGBColor {
    let i = systems.iter().position(|s| s == system).unwrap_or(0);
    PALETTE[i % PALETTE.len()]
}

/// Renders `fig` to a PNG at `path`.
pub fn render(path: &Path, fig: &Figure, machine: &Machine, info: &RunInfo) -> anyhow::Result<()> {
    register_fonts();
    let cols = fig.columns.max(1);
    let plotted = fig.panels.iter().filter(|p| p.plotted).count();
    let rows = plotted.div_ceil(cols).max(1);
    let width = PANEL_W * cols as u32 + LEGEND_W;
    let height = HEADER_H + PANEL_H * rows as u32;
    let mut pixels = vec![0u8; width as usize * height as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, (width, height)).into_drawing_area();
        draw(&root, fig, machine, info, rows, cols)
            .map_err(|e| anyhow!("plotting {}: {e}", path.display()))?;
        root.present()
            .map_err(|e| anyhow!("plotting {}: {e}", path.display()))?;
    }
    write_png(path, width, height, &pixels).with_context(|| format!("writing {}", path.display()))
}

/// Writes 8-bit RGB pixels as a PNG file, with the `png` crate itself: plotters' own encoder
/// brings the `image` crate, every format's decoder with it (25 CPU-seconds of the smoke run's
/// build, for one format written).
fn write_png(path: &Path, width: u32, height: u32, rgb: &[u8]) -> anyhow::Result<()> {
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut encoder = png::Encoder::new(file, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(rgb)?;
    writer.finish()?;
    Ok(())
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;
type DrawResult<T> = Result<T, Box<dyn std::error::Error + 'static>>;

fn draw(
    root: &Area<'_>,
    fig: &Figure,
    machine: &Machine,
    info: &RunInfo,
    rows: usize,
    cols: usize,
) -> DrawResult<()> {
    root.fill(&WHITE)?;
    let (header, body) = root.split_vertically(HEADER_H);
    let title = if info.quick {
        format!("{} — smoke run (--quick), not meaningful", fig.title)
    } else {
        fig.title.clone()
    };
    header.draw_text(
        &title,
        &("sans-serif", 26)
            .into_font()
            .style(FontStyle::Bold)
            .color(&BLACK),
        (12, 8),
    )?;
    let sub = format!(
        "{} | median of {} runs, bars show min–max | `{}`",
        machine.short(),
        info.runs,
        info.command
    );
    header.draw_text(
        &sub,
        &("sans-serif", 16).into_font().color(&RGBColor(60, 60, 60)),
        (12, 42),
    )?;

    let (plots, legend) = body.split_horizontally(PANEL_W * cols as u32);
    let systems = fig.systems();
    let areas = plots.split_evenly((rows, cols));
    for (area, panel) in areas.iter().zip(fig.panels.iter().filter(|p| p.plotted)) {
        draw_panel(area, panel, &systems)?;
    }
    draw_legend(&legend, &systems)?;
    Ok(())
}

fn draw_legend(area: &Area<'_>, systems: &[String]) -> DrawResult<()> {
    let style = ("sans-serif", 17).into_font().color(&BLACK);
    area.draw_text(
        "Systems",
        &("sans-serif", 19)
            .into_font()
            .style(FontStyle::Bold)
            .color(&BLACK),
        (10, 20),
    )?;
    for (i, s) in systems.iter().enumerate() {
        let y = 56 + 28 * i as i32;
        let c = color_of(systems, s);
        area.draw(&PathElement::new(vec![(10, y), (44, y)], c.stroke_width(3)))?;
        area.draw(&Circle::new((27, y), 4, c.filled()))?;
        area.draw_text(s, &style, (52, y - 9))?;
    }
    Ok(())
}

/// X and y ranges with some headroom, positive for log axes.
fn ranges(panel: &Panel) -> ((f64, f64), (f64, f64)) {
    let xs = panel.xs();
    let (mut x0, mut x1) = (
        xs.first().copied().unwrap_or(0.0),
        xs.last().copied().unwrap_or(1.0),
    );
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    for p in panel.series.iter().flat_map(|s| &s.points) {
        let (a, b) = (p.min(), p.max());
        if a.is_finite() && (!panel.log_y || a > 0.0) {
            lo = lo.min(a);
        }
        if b.is_finite() {
            hi = hi.max(b);
        }
    }
    if !lo.is_finite() || !hi.is_finite() {
        (lo, hi) = (0.1, 1.0);
    }
    if panel.log_x {
        x0 = x0.max(1e-9);
        (x0, x1) = (x0 / 1.5, x1 * 1.5);
    } else {
        let pad = (x1 - x0).max(1.0) * 0.04;
        (x0, x1) = (x0 - pad, x1 + pad);
    }
    let (y0, y1) = if panel.log_y {
        // Whole decades, so the log axis is labelled 0.1, 1, 10, 100 rather than densely.
        let lo = lo.max(hi * 1e-6).max(f64::MIN_POSITIVE);
        let (a, b) = (lo.log10().floor(), hi.log10().ceil());
        (10f64.powf(a), 10f64.powf(if b > a { b } else { a + 1.0 }))
    } else {
        (0.0, if hi > 0.0 { hi * 1.1 } else { 1.0 })
    };
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    ((x0, x1), (y0, y1))
}

fn draw_panel(area: &Area<'_>, panel: &Panel, systems: &[String]) -> DrawResult<()> {
    let ((x0, x1), (y0, y1)) = ranges(panel);
    match (panel.log_x, panel.log_y) {
        (true, true) => chart(
            area,
            panel,
            systems,
            (x0..x1).log_scale(),
            (y0..y1).log_scale(),
        ),
        (true, false) => chart(area, panel, systems, (x0..x1).log_scale(), y0..y1),
        (false, true) => chart(area, panel, systems, x0..x1, (y0..y1).log_scale()),
        (false, false) => chart(area, panel, systems, x0..x1, y0..y1),
    }
}

fn chart<X, Y>(area: &Area<'_>, panel: &Panel, systems: &[String], x: X, y: Y) -> DrawResult<()>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .caption(
            &panel.title,
            ("sans-serif", 20).into_font().style(FontStyle::Bold),
        )
        .margin(12)
        .x_label_area_size(52)
        .y_label_area_size(78)
        .build_cartesian_2d(x, y)?;
    let fmt = panel.x_format;
    let x_fmt = move |v: &f64| fmt.format(*v);
    chart
        .configure_mesh()
        .x_desc(panel.x_label.as_str())
        .y_desc(panel.y_label.as_str())
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&|v: &f64| tick(*v))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .max_light_lines(3)
        .light_line_style(RGBColor(240, 240, 240))
        .bold_line_style(RGBColor(200, 200, 200))
        .draw()?;
    let (ylo, _) = (chart.y_range().start, chart.y_range().end);
    for s in &panel.series {
        let c = color_of(systems, &s.system);
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| p.median().is_finite())
            .map(|p| (p.x, p.median().max(ylo)))
            .collect();
        chart.draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))?;
        chart.draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 3, c.filled())))?;
        chart.draw_series(s.points.iter().filter(|p| p.samples.len() > 1).map(|p| {
            ErrorBar::new_vertical(
                p.x,
                p.min().max(ylo),
                p.median().max(ylo),
                p.max().max(ylo),
                c.stroke_width(1),
                8,
            )
        }))?;
    }
    Ok(())
}
