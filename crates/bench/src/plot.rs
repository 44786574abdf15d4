//! PNG plots of a bench.sh run, drawn with plotters into an RGB buffer and
//! encoded with `png`. Text is rendered by ab_glyph from a TrueType file
//! (pure Rust: no fontconfig or freetype needed), DejaVu Sans by default.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::report::{CONNS50, CONTENDED, ECHO, PINGPONG, PIPELINED, Results};

const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// The font, registered with plotters as "sans-serif".
#[derive(Clone, Copy)]
pub(crate) struct Font;

pub(crate) fn load_font(path: Option<&Path>) -> crate::Result<Font> {
    let path = match path {
        Some(p) => p.to_path_buf(),
        None => FONT_PATHS
            .iter()
            .map(Path::new)
            .find(|p| p.exists())
            .ok_or(
                "no font for the plots: install fonts-dejavu-core (Debian) or pass --font FILE.ttf",
            )?
            .to_path_buf(),
    };
    let bytes: &'static [u8] = Box::leak(std::fs::read(&path)?.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| format!("{}: not a usable font", path.display()))?;
    Ok(Font)
}

const W: u32 = 1000;
const H: u32 = 640;

fn color(i: usize) -> RGBColor {
    const PALETTE: [RGBColor; 8] = [
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0x7f, 0x7f, 0x7f),
        RGBColor(0xff, 0x7f, 0x0e),
        RGBColor(0x94, 0x67, 0xbd),
        RGBColor(0x8c, 0x56, 0x4b),
        RGBColor(0x17, 0xbe, 0xcf),
    ];
    PALETTE[i % PALETTE.len()]
}

/// Labels in a stable order: ringlock ones first, then the others.
fn labels(r: &Results) -> Vec<String> {
    let mut labels: Vec<String> = Vec::new();
    for g in &r.groups {
        if !labels.contains(&g.label) {
            labels.push(g.label.clone());
        }
    }
    labels.sort_by_key(|l| (!l.starts_with("ringlock"), l.clone()));
    labels
}

fn save_png(buf: &[u8], w: u32, h: u32, path: &Path) -> crate::Result<()> {
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut encoder = png::Encoder::new(file, w, h);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(buf)?;
    writer.finish()?;
    Ok(())
}

/// Cycles/s against connections (ping-pong, 1 in flight per connection);
/// the echo floor as round trips/s / 2, i.e. in cycles.
#[expect(clippy::too_many_lines)]
pub(crate) fn throughput(r: &Results, path: &Path, _font: Font) -> crate::Result<()> {
    let mut buf = vec![0u8; (W * H * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (W, H)).into_drawing_area();
        root.fill(&WHITE)?;
        let series: Vec<(String, Vec<(f64, f64)>)> = labels(r)
            .into_iter()
            .map(|label| {
                let mut pts: Vec<(f64, f64)> = r
                    .groups
                    .iter()
                    .filter(|g| {
                        g.label == label
                            && g.scenario.starts_with("conns-")
                            && g.pipeline == 1
                            && g.mode == "uncontended"
                    })
                    .filter_map(|g| {
                        let v = if label == ECHO || label.starts_with("echo") {
                            g.get("round_trips_per_s")? / 2.0
                        } else {
                            g.get("cycles_per_s")?
                        };
                        Some((f64::from(g.conns), v))
                    })
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                let name = if label.starts_with("echo") {
                    format!("{label} floor (round trips/s ÷ 2)")
                } else {
                    label
                };
                (name, pts)
            })
            .filter(|(_, pts)| !pts.is_empty())
            .collect();
        let xmax = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|x| x.0))
            .fold(1.0, f64::max);
        let ymax = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|x| x.1))
            .fold(1.0, f64::max);
        let mut conns: Vec<f64> = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|x| x.0))
            .collect();
        conns.sort_by(f64::total_cmp);
        conns.dedup();
        let title = format!(
            "Lock cycles/s vs connections (1 in flight each) — {} {}",
            meta(r, "date"),
            meta(r, "commit")
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(
                (0.8..xmax * 1.25).log_scale().with_key_points(conns),
                0.0..ymax * 1.15,
            )?;
        chart
            .configure_mesh()
            .x_desc("connections (log scale)")
            .light_line_style(WHITE)
            .y_desc("cycles per second")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{:.0}k", y / 1000.0))
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 18))
            .draw()?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let c = color(i);
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(3)))?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(3))
                });
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 5, c.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 16))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
    }
    save_png(&buf, W, H, path)
}

fn meta(r: &Results, key: &str) -> String {
    r.meta
        .get(key)
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_string()
}

/// Latency percentiles (log scale), one panel per scenario: the cycle for
/// ping-pong, 50 connections and pipelined; the hand-off for contended.
#[expect(clippy::too_many_lines)]
pub(crate) fn latency(r: &Results, path: &Path, _font: Font) -> crate::Result<()> {
    let (w, h) = (1200u32, 900u32);
    let mut buf = vec![0u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(
            &format!(
                "Latency percentiles, µs (log scale) — {} {}",
                meta(r, "date"),
                meta(r, "commit")
            ),
            ("sans-serif", 24),
        )?;
        let panels = root.split_evenly((2, 2));
        let all_labels = labels(r);
        let specs = [
            (PINGPONG, "cycle", "1 connection, ping-pong: cycle"),
            (CONNS50, "cycle", "50 connections: cycle"),
            (PIPELINED, "cycle", "4 connections x 32 in flight: cycle"),
            (
                CONTENDED,
                "handoff",
                "64 clients, 1 key: release-to-next-grant hand-off",
            ),
        ];
        for (panel, (scenario, hist, title)) in panels.iter().zip(specs) {
            let mut series: Vec<Series> = Vec::new();
            for (i, label) in all_labels.iter().enumerate() {
                if let Some(g) = r.group(scenario, label) {
                    series.push((i, label.clone(), percentiles(g, hist)));
                } else if scenario == CONTENDED && label == ECHO {
                    // Echo has no hand-off: in the contended panel its
                    // single round trip (1 connection) is the reference.
                    if let Some(g) = r.group(PINGPONG, label) {
                        series.push((
                            i,
                            format!("{label} round trip (1 conn)"),
                            percentiles(g, "rt"),
                        ));
                    }
                }
            }
            series.retain(|s| !s.2.is_empty());
            let ymin = series
                .iter()
                .flat_map(|s| s.2.iter().map(|p| p.1))
                .fold(f64::MAX, f64::min)
                .max(0.1);
            let ymax = series
                .iter()
                .flat_map(|s| s.2.iter().map(|p| p.1))
                .fold(1.0, f64::max);
            let mut chart = ChartBuilder::on(panel)
                .caption(title, ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(35)
                .y_label_area_size(60)
                .build_cartesian_2d(
                    -0.2..4.2,
                    (ymin * 0.7..ymax * 1.6)
                        .log_scale()
                        .with_key_points(one_two_five(ymin * 0.7, ymax * 1.6)),
                )?;
            chart
                .configure_mesh()
                .light_line_style(WHITE)
                .x_labels(5)
                .x_label_formatter(&|x: &f64| {
                    let i = x.round() as usize;
                    if (x - x.round()).abs() < 0.01 && i < PCTS.len() {
                        PCTS[i].1.to_string()
                    } else {
                        String::new()
                    }
                })
                .y_label_formatter(&|y| {
                    if *y >= 10.0 {
                        format!("{y:.0}")
                    } else {
                        format!("{y:.1}")
                    }
                })
                .label_style(("sans-serif", 14))
                .draw()?;
            for (i, name, pts) in &series {
                let c = color(*i);
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))?
                    .label(name.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3))
                    });
                chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
            }
            if !series.is_empty() {
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperLeft)
                    .label_font(("sans-serif", 13))
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .draw()?;
            }
        }
        root.present()?;
    }
    save_png(&buf, w, h, path)
}

/// A line of a latency panel: colour index, name, (percentile, µs) points.
type Series = (usize, String, Vec<(f64, f64)>);

/// The percentiles drawn: figure suffix and axis label.
const PCTS: [(&str, &str); 5] = [
    ("p50", "p50"),
    ("p90", "p90"),
    ("p99", "p99"),
    ("p999", "p99.9"),
    ("max", "max"),
];

/// The (x, µs) points of histogram `hist` of a group.
fn percentiles(g: &crate::report::Group, hist: &str) -> Vec<(f64, f64)> {
    PCTS.iter()
        .enumerate()
        .filter_map(|(x, (p, _))| Some((x as f64, g.get(&format!("{hist}_{p}_us"))?)))
        .collect()
}

/// 1, 2, 5, 10, 20, 50... between `lo` and `hi`: the labels of a log axis.
fn one_two_five(lo: f64, hi: f64) -> Vec<f64> {
    let mut points = Vec::new();
    let mut decade = 10f64.powf(lo.log10().floor());
    while decade <= hi {
        for m in [1.0, 2.0, 5.0] {
            let v = m * decade;
            if v >= lo && v <= hi {
                points.push(v);
            }
        }
        decade *= 10.0;
    }
    points
}
