//! PNG charts of benchmark results, drawn with plotters into memory and
//! written with the png crate. The font (DejaVu Sans) is compiled in, so a
//! machine without fonts or fontconfig draws the same pictures.
//!
//! Two kinds: [`sizes`] (latency and bandwidth over bytes per rank, one
//! line per algorithm, the table's pick marked) and [`bars`] (horizontal
//! bars per label, e.g. ibcoll/MPI ratios).

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

const FONT: &str = "sans-serif";

/// Distinct on white and for most colour-blind readers (matplotlib's tab10).
const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// One measured size: latency in us and, where known, its spread (e.g.
/// the fastest and slowest rank's average).
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub bytes: usize,
    pub us: f64,
    pub spread: Option<(f64, f64)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<Point>,
}

/// A [`sizes`] chart.
#[derive(Debug, Clone, PartialEq)]
pub struct SizeChart {
    pub title: String,
    pub series: Vec<Series>,
    /// (bytes, index into `series`): what the table picked at each size.
    pub picked: Vec<(usize, usize)>,
}

/// A [`bars`] chart: panels stacked top to bottom, in each a group of bars
/// (one per series) for every label.
#[derive(Debug, Clone, PartialEq)]
pub struct BarChart {
    pub title: String,
    pub x_desc: String,
    pub series: Vec<String>,
    pub panels: Vec<Panel>,
    /// Bars start at this value (1 for ratios: faster left, slower right)
    /// and a line marks it; `None`: at the axis' left end.
    pub anchor: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    pub title: String,
    pub labels: Vec<String>,
    /// `values[label][series]`; `None` draws no bar.
    pub values: Vec<Vec<Option<f64>>>,
}

fn fonts() -> Result<(), String> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
                .map_err(|_| "the compiled-in font does not load".to_string())
        })
        .clone()
}

fn fail<E: std::fmt::Display>(e: E) -> String {
    format!("drawing: {e}")
}

/// Draws `w` x `h` pixels with `draw` and writes them to `path` as PNG.
fn draw_png<F>(path: &Path, (w, h): (u32, u32), draw: F) -> Result<(), String>
where
    F: FnOnce(&DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>) -> Result<(), String>,
{
    fonts()?;
    let mut rgb = vec![0u8; w as usize * h as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(fail)?;
        draw(&root)?;
        root.present().map_err(fail)?;
    }
    let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut enc = ::png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(::png::ColorType::Rgb);
    enc.set_depth(::png::BitDepth::Eight);
    enc.write_header()
        .and_then(|mut wr| wr.write_image_data(&rgb))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// 1, 4 KiB, 1 MiB: the sizes the axes show.
pub fn bytes_label(v: f64) -> String {
    let (d, unit) = if v >= (1 << 30) as f64 {
        ((1 << 30) as f64, "GiB")
    } else if v >= (1 << 20) as f64 {
        ((1 << 20) as f64, "MiB")
    } else if v >= 1024.0 {
        (1024.0, "KiB")
    } else {
        (1.0, "B")
    };
    format!("{} {unit}", short_num(v / d))
}

/// A number in at most three significant digits, no trailing zeros.
fn short_num(v: f64) -> String {
    let s = if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// The range of positive values, widened so that no mark sits on a border.
fn log_range(vals: impl Iterator<Item = f64>) -> Option<std::ops::Range<f64>> {
    let (lo, hi) = vals
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    (hi > 0.0).then(|| lo / 1.6..hi * 1.6)
}

type SizeCtx<'a, 'b, Y> = ChartContext<'a, BitMapBackend<'b>, Cartesian2d<LogCoord<f64>, Y>>;

/// Axes and grid of a panel over bytes per rank.
fn size_mesh<'a, Y>(ch: &mut SizeCtx<'a, 'a, Y>, y_desc: &str) -> Result<(), String>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    ch.configure_mesh()
        .max_light_lines(3)
        .x_labels(12)
        .x_label_formatter(&|v| bytes_label(*v))
        .y_label_formatter(&|v| short_num(*v))
        .y_desc(y_desc)
        .x_desc("bytes per rank (log)")
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 16))
        .draw()
        .map_err(fail)
}

/// The table's path, every series and the legend on one panel; `y` gives
/// the value drawn for a point.
fn size_lines<'a, Y: Ranged<ValueType = f64>>(
    ch: &mut SizeCtx<'a, 'a, Y>,
    c: &SizeChart,
    y: impl Fn(&Point) -> f64,
    rings: bool,
) -> Result<(), String> {
    let at = |bytes: usize, i: usize| {
        c.series
            .get(i)
            .and_then(|s| s.points.iter().find(|p| p.bytes == bytes))
    };
    let path: Vec<(f64, f64)> = c
        .picked
        .iter()
        .filter(|(b, _)| *b > 0)
        .filter_map(|&(b, i)| at(b, i).map(|p| (b as f64, y(p))))
        .collect();
    let wide = BLACK.mix(0.22).stroke_width(10);
    if !path.is_empty() {
        ch.draw_series(LineSeries::new(path.iter().copied(), wide))
            .map_err(fail)?
            .label("picked by the table (circled)")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], wide));
    }
    for (i, s) in c.series.iter().enumerate() {
        let col = color(i);
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| p.bytes > 0)
            .map(|p| (p.bytes as f64, y(p)))
            .collect();
        ch.draw_series(LineSeries::new(pts.iter().copied(), col.stroke_width(2)).point_size(3))
            .map_err(fail)?
            .label(&s.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], col.stroke_width(3)));
        if rings {
            let bars = s.points.iter().filter(|p| p.bytes > 0).filter_map(|p| {
                let (lo, hi) = p.spread?;
                let x = p.bytes as f64;
                Some(PathElement::new(
                    vec![(x, lo), (x, hi)],
                    col.stroke_width(1),
                ))
            });
            ch.draw_series(bars).map_err(fail)?;
        }
    }
    if rings {
        ch.draw_series(
            path.iter()
                .map(|&p| Circle::new(p, 8, BLACK.stroke_width(2))),
        )
        .map_err(fail)?;
        ch.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font((FONT, 16))
            .draw()
            .map_err(fail)?;
    }
    Ok(())
}

/// Latency (log) over bytes per rank (log) above, bandwidth (bytes per
/// rank / latency, linear, so that a dip stands out) below. Sizes of 0
/// bytes have no place on a log axis; a chart of nothing but 0-byte points
/// (barrier) becomes bars of the latencies.
pub fn sizes(path: &Path, c: &SizeChart) -> Result<(), String> {
    let positive = || {
        c.series
            .iter()
            .flat_map(|s| &s.points)
            .filter(|p| p.bytes > 0)
    };
    let Some(xr) = log_range(positive().map(|p| p.bytes as f64)) else {
        return bars(path, &zero_bytes_bars(c));
    };
    let yr = log_range(positive().flat_map(|p| {
        let (lo, hi) = p.spread.unwrap_or((p.us, p.us));
        [p.us, lo, hi]
    }))
    .unwrap_or(0.1..10.0);
    let bw = |p: &Point| p.bytes as f64 / p.us.max(1e-9);
    let bw_max = positive().map(bw).fold(0f64, f64::max).max(1e-9) * 1.1;
    draw_png(path, (1200, 960), |root| {
        let (top, bottom) = root.split_vertically(600);
        let mut ch = ChartBuilder::on(&top)
            .caption(&c.title, (FONT, 24))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(72)
            .build_cartesian_2d(xr.clone().log_scale().base(2.0), yr.log_scale())
            .map_err(fail)?;
        size_mesh(&mut ch, "latency (us, log)")?;
        size_lines(&mut ch, c, |p| p.us, true)?;
        let mut ch = ChartBuilder::on(&bottom)
            .caption(
                if c.picked.is_empty() {
                    "bandwidth: bytes per rank / latency (MB/s); a dip is a hole"
                } else {
                    "bandwidth: bytes per rank / latency (MB/s); a dip of the grey path is a hole"
                },
                (FONT, 18),
            )
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(72)
            .build_cartesian_2d(xr.log_scale().base(2.0), RangedCoordf64::from(0f64..bw_max))
            .map_err(fail)?;
        size_mesh(&mut ch, "MB/s")?;
        size_lines(&mut ch, c, bw, false)
    })
}

/// A barrier's chart: one bar per algorithm, the pick named.
fn zero_bytes_bars(c: &SizeChart) -> BarChart {
    let picked: Vec<usize> = c.picked.iter().map(|&(_, i)| i).collect();
    let (labels, values) = c
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mark = if picked.contains(&i) { " (picked)" } else { "" };
            (
                format!("{}{mark}", s.name),
                vec![s.points.first().map(|p| p.us)],
            )
        })
        .unzip();
    BarChart {
        title: c.title.clone(),
        x_desc: "latency (us, log)".into(),
        series: vec!["latency".into()],
        panels: vec![Panel {
            title: String::new(),
            labels,
            values,
        }],
        anchor: None,
    }
}

/// The series' colours in the top right corner, above every panel (a
/// legend inside a panel would cover bars).
fn legend(
    root: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    series: &[String],
) -> Result<(), String> {
    let style = TextStyle::from((FONT, 15).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    let mut x = root.dim_in_pixel().0 as i32 - 12;
    for (i, name) in series.iter().enumerate().rev() {
        let w = root.estimate_text_size(name, &style).map_err(fail)?.0 as i32;
        x -= w + 28;
        root.draw(&Rectangle::new([(x, 32), (x + 16, 46)], color(i).filled()))
            .map_err(fail)?;
        root.draw(&Text::new(name.clone(), (x + 20, 39), style.clone()))
            .map_err(fail)?;
        x -= 12;
    }
    Ok(())
}

/// Horizontal bars on a log axis, one panel per [`Panel`].
pub fn bars(path: &Path, c: &BarChart) -> Result<(), String> {
    let all = c
        .panels
        .iter()
        .flat_map(|p| p.values.iter().flatten().flatten());
    let xr = log_range(all.copied().chain(c.anchor)).unwrap_or(0.5..2.0);
    let ns = c.series.len().max(1);
    let row = (10 * ns).max(20) as u32;
    let heights: Vec<u32> = c
        .panels
        .iter()
        .map(|p| 90 + row * p.labels.len().max(1) as u32)
        .collect();
    let label_w = c
        .panels
        .iter()
        .flat_map(|p| &p.labels)
        .map(|l| l.chars().count() as u32 * 9 + 24)
        .max()
        .unwrap_or(40)
        .max(60);
    let total = 60 + heights.iter().sum::<u32>();
    draw_png(path, (1100, total.min(16_000)), |root| {
        if c.series.len() > 1 {
            legend(root, &c.series)?;
        }
        let mut rest = root.titled(&c.title, (FONT, 24)).map_err(fail)?;
        for (p, h) in c.panels.iter().zip(&heights) {
            let (area, below) = rest.split_vertically(*h);
            rest = below;
            let n = p.labels.len();
            let mut ch = ChartBuilder::on(&area)
                .caption(&p.title, (FONT, 18))
                .margin(10)
                .x_label_area_size(40)
                .y_label_area_size(label_w)
                .build_cartesian_2d(xr.clone().log_scale(), -0.5f64..n as f64 - 0.5)
                .map_err(fail)?;
            let label = |y: &f64| {
                let i = y.round();
                if (y - i).abs() > 0.01 || i < 0.0 {
                    return String::new();
                }
                n.checked_sub(1 + i as usize)
                    .and_then(|k| p.labels.get(k))
                    .cloned()
                    .unwrap_or_default()
            };
            ch.configure_mesh()
                .disable_y_mesh()
                .y_labels(n + 1)
                .y_label_formatter(&label)
                .x_label_formatter(&|v| short_num(*v))
                .x_desc(c.x_desc.as_str())
                .label_style((FONT, 14))
                .axis_desc_style((FONT, 15))
                .draw()
                .map_err(fail)?;
            let from = c.anchor.unwrap_or(xr.start);
            let h = 0.8 / ns as f64;
            for s in 0..c.series.len() {
                let col = color(s);
                let rects = p.values.iter().enumerate().filter_map(|(k, v)| {
                    let v = (*v.get(s)?)?;
                    let y0 = (n - 1 - k) as f64 + 0.4 - h * (s + 1) as f64;
                    Some(Rectangle::new([(from, y0), (v, y0 + h)], col.filled()))
                });
                ch.draw_series(rects).map_err(fail)?;
                let texts = p.values.iter().enumerate().filter_map(|(k, v)| {
                    let v = (*v.get(s)?)?;
                    let y = (n - 1 - k) as f64 + 0.4 - h * (s as f64 + 0.5);
                    Some(Text::new(
                        format!(" {}", short_num(v)),
                        (v.max(from), y),
                        TextStyle::from((FONT, 12).into_font())
                            .pos(Pos::new(HPos::Left, VPos::Center)),
                    ))
                });
                ch.draw_series(texts).map_err(fail)?;
            }
            if let Some(a) = c.anchor {
                ch.draw_series(std::iter::once(PathElement::new(
                    vec![(a, -0.5), (a, n as f64 - 0.5)],
                    BLACK.stroke_width(1),
                )))
                .map_err(fail)?;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png_size(path: &Path) -> (u32, u32) {
        let dec = ::png::Decoder::new(std::fs::File::open(path).unwrap());
        let r = dec.read_info().unwrap();
        (r.info().width, r.info().height)
    }

    fn series(name: &str, f: impl Fn(usize) -> f64) -> Series {
        Series {
            name: name.into(),
            points: [0, 8, 64, 4096, 1 << 20]
                .into_iter()
                .map(|b| Point {
                    bytes: b,
                    us: f(b),
                    spread: Some((f(b) * 0.9, f(b) * 1.2)),
                })
                .collect(),
        }
    }

    #[test]
    fn size_and_bar_charts_are_pngs() {
        let dir = std::env::temp_dir().join(format!("ibcoll-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = SizeChart {
            title: "allreduce, 2 ranks".into(),
            series: vec![
                series("ring", |b| 5.0 + b as f64 / 2000.0),
                series("recursive_doubling", |b| 1.0 + b as f64 / 1000.0),
            ],
            picked: vec![(0, 1), (8, 1), (64, 1), (4096, 0), (1 << 20, 0)],
        };
        let f = dir.join("sizes.png");
        sizes(&f, &c).unwrap();
        assert_eq!(png_size(&f), (1200, 960));
        // Only 0 bytes (barrier): bars instead.
        let mut b = c.clone();
        for s in &mut b.series {
            s.points.truncate(1);
        }
        let f = dir.join("barrier.png");
        sizes(&f, &b).unwrap();
        assert_eq!(png_size(&f).0, 1100);
        let r = BarChart {
            title: "ratios".into(),
            x_desc: "ibcoll / MPI".into(),
            series: vec!["Open MPI".into(), "MPICH".into()],
            panels: vec![Panel {
                title: "2 ranks".into(),
                labels: vec!["bcast 8".into(), "scan 8".into()],
                values: vec![vec![Some(0.5), None], vec![Some(2.0), Some(1.1)]],
            }],
            anchor: Some(1.0),
        };
        let f = dir.join("bars.png");
        bars(&f, &r).unwrap();
        assert_eq!(png_size(&f), (1100, 60 + 90 + 2 * 20));
        let e = sizes(&dir.join("no/such/dir.png"), &c).unwrap_err();
        assert!(e.contains("no/such/dir.png"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn labels() {
        assert_eq!(bytes_label(1.0), "1 B");
        assert_eq!(bytes_label(4096.0), "4 KiB");
        assert_eq!(bytes_label(1536.0), "1.5 KiB");
        assert_eq!(bytes_label((4 << 20) as f64), "4 MiB");
        assert_eq!(short_num(0.25), "0.25");
        assert_eq!(short_num(12.0), "12");
        assert_eq!(short_num(1234.4), "1234");
    }
}
