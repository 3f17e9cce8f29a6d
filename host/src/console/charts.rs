//! Charts drawn on the server as inline SVG: readable without JavaScript, with nothing
//! fetched from elsewhere. A [`LineChart`] is a time series (axes with ticks, the unit, a
//! legend); a [`Histogram`] is counts per latency bucket. Colours are SVG presentation
//! attributes, so the page's style policy (no inline style) leaves them alone. Every text
//! goes through `maud`, which escapes it.

use maud::{html, Markup};

use crate::metrics::latency;

const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 250.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 30.0;
const PLOT_HEIGHT: f64 = 150.0;
const TICKS: usize = 4;

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Its name in the legend.
    pub label: String,
    /// Its colour (an SVG colour).
    pub color: &'static str,
    /// Drawn dashed (for a second line of the same colour, such as a p99).
    pub dashed: bool,
    /// One value per step, oldest first; `None` leaves a gap.
    pub points: Vec<Option<f64>>,
}

/// A time series chart over the last `span_s` seconds, one point per `step_s`.
#[derive(Debug, Clone)]
pub struct LineChart {
    /// The chart's id in the page (for links and tests).
    pub id: &'static str,
    /// Its title.
    pub title: String,
    /// The unit of the vertical axis (`msg/s`, `ms`, `messages`).
    pub unit: &'static str,
    /// Seconds between two points.
    pub step_s: u64,
    /// Its lines.
    pub series: Vec<Series>,
}

/// A "nice" upper end of an axis (1, 2, 2.5 or 5 times a power of ten, times [`TICKS`]) at
/// or above `max`.
pub fn axis_top(max: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return TICKS as f64;
    }
    let raw = max / TICKS as f64;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    step * TICKS as f64
}

/// A tick's label: as many decimals as small numbers need, `k` for thousands.
pub fn number(v: f64) -> String {
    let text = if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.1}k", v / 1000.0)
    } else if v >= 10.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    match text.contains('.') {
        true => {
            let (digits, suffix) = text.split_at(text.trim_end_matches('k').len());
            format!(
                "{}{suffix}",
                digits.trim_end_matches('0').trim_end_matches('.')
            )
        }
        false => text,
    }
}

/// The horizontal grid, the vertical axis' ticks and its unit.
fn y_axis(top: f64, unit: &str) -> Markup {
    html! {
        @for i in 0..=TICKS {
            @let v = top * i as f64 / TICKS as f64;
            @let y = TOP + PLOT_HEIGHT - PLOT_HEIGHT * i as f64 / TICKS as f64;
            line x1=(LEFT) x2=(WIDTH - RIGHT) y1=(y) y2=(y) stroke="#ddd" stroke-width="1" {}
            text.tick x=(LEFT - 6.0) y=(y + 4.0) text-anchor="end" font-size="11" fill="#444" { (number(v)) }
        }
        text.unit x="14" y=(TOP + PLOT_HEIGHT / 2.0) text-anchor="middle" font-size="12" fill="#222"
            transform=(format!("rotate(-90 14 {})", TOP + PLOT_HEIGHT / 2.0)) { (unit) }
        line x1=(LEFT) x2=(LEFT) y1=(TOP) y2=(TOP + PLOT_HEIGHT) stroke="#888" {}
        line x1=(LEFT) x2=(WIDTH - RIGHT) y1=(TOP + PLOT_HEIGHT) y2=(TOP + PLOT_HEIGHT) stroke="#888" {}
    }
}

/// The legend under the chart: a swatch and a label per series.
fn legend(entries: &[(String, &'static str, bool)]) -> Markup {
    let y = HEIGHT - 10.0;
    let mut x = LEFT;
    let placed: Vec<_> = entries
        .iter()
        .map(|(label, color, dashed)| {
            let at = x;
            x += 34.0 + 7.0 * label.chars().count() as f64;
            (at, label, *color, *dashed)
        })
        .collect();
    html! {
        g.legend {
            @for (at, label, color, dashed) in placed {
                line x1=(at) x2=(at + 18.0) y1=(y - 4.0) y2=(y - 4.0) stroke=(color) stroke-width="3"
                    stroke-dasharray=[dashed.then_some("5 3")] {}
                text x=(at + 23.0) y=(y) font-size="12" fill="#222" { (label) }
            }
        }
    }
}

/// The SVG path of `points` over `count` steps scaled to `top`, a gap at each `None`.
fn path(points: &[Option<f64>], count: usize, top: f64) -> String {
    let dx = (WIDTH - LEFT - RIGHT) / (count.max(2) - 1) as f64;
    let mut d = String::new();
    let mut drawing = false;
    for (i, p) in points.iter().enumerate() {
        match p {
            Some(v) => {
                let x = LEFT + dx * i as f64;
                let y = TOP + PLOT_HEIGHT - PLOT_HEIGHT * (v / top).min(1.0);
                d.push_str(&format!(
                    "{}{x:.1},{y:.1} ",
                    if drawing { 'L' } else { 'M' }
                ));
                drawing = true;
            }
            None => drawing = false,
        }
    }
    d.trim_end().to_string()
}

/// A chart's frame around its `body` (lines or bars): title, the y axis from 0 to `top` in
/// `unit`, the x axis's `caption` and the legend of `entries`.
fn frame(
    id: &str,
    title: &str,
    (top, unit): (f64, &str),
    caption: &str,
    body: Markup,
    entries: &[(String, &'static str, bool)],
) -> Markup {
    html! {
        figure.chart-box {
            svg.chart-big id=(id) viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img"
                width=(WIDTH) height=(HEIGHT) xmlns="http://www.w3.org/2000/svg" {
                title { (title) }
                text.title x=(LEFT) y="18" font-size="14" font-weight="bold" fill="#111" { (title) }
                (y_axis(top, unit))
                (body)
                text x=((LEFT + WIDTH - RIGHT) / 2.0) y=(TOP + PLOT_HEIGHT + 33.0) text-anchor="middle" font-size="11" fill="#666" {
                    (caption)
                }
                (legend(entries))
            }
        }
    }
}

impl LineChart {
    /// The chart as an inline `<svg>` in a `<figure>` with its title.
    pub fn render(&self) -> Markup {
        let count = self
            .series
            .iter()
            .map(|s| s.points.len())
            .max()
            .unwrap_or(0);
        let max = (self.series.iter())
            .flat_map(|s| s.points.iter().flatten())
            .fold(0.0f64, |m, v| m.max(*v));
        let top = axis_top(max);
        let span_min = self.step_s * count as u64 / 60;
        let entries: Vec<_> = (self.series.iter())
            .map(|s| (s.label.clone(), s.color, s.dashed))
            .collect();
        let dx = (WIDTH - LEFT - RIGHT) / (count.max(2) - 1) as f64;
        // A label every 5 minutes, counted back from now at the right edge.
        let every = (300 / self.step_s.max(1)) as usize;
        let caption = format!(
            "time (last {span_min} min, one point per {} s)",
            self.step_s
        );
        let body = html! {
                    @for i in (0..count).rev().step_by(every.max(1)) {
                        @let x = LEFT + dx * i as f64;
                        @let ago = (count - 1 - i) as u64 * self.step_s / 60;
                        line x1=(x) x2=(x) y1=(TOP + PLOT_HEIGHT) y2=(TOP + PLOT_HEIGHT + 4.0) stroke="#888" {}
                        text.tick x=(x) y=(TOP + PLOT_HEIGHT + 17.0) text-anchor="middle" font-size="11" fill="#444" {
                            @if ago == 0 { "now" } @else { "-" (ago) " min" }
                        }
                    }
                    @for s in &self.series {
                        path.series data-label=(s.label) d=(path(&s.points, count, top)) fill="none"
                            stroke=(s.color) stroke-width="2" stroke-dasharray=[s.dashed.then_some("5 3")] {}
                    }
        };
        frame(
            self.id,
            &self.title,
            (top, self.unit),
            &caption,
            body,
            &entries,
        )
    }
}

/// Counts per latency bucket of several distributions, drawn as grouped bars.
#[derive(Debug, Clone)]
pub struct Histogram {
    /// The chart's id in the page.
    pub id: &'static str,
    /// Its title.
    pub title: String,
    /// Each distribution: its label, colour and counts per bucket of
    /// [`latency::BOUNDS_US`].
    pub series: Vec<(String, &'static str, Vec<u64>)>,
}

/// A bucket's upper bound as a short label (`500µs`, `2ms`, `>30s`; the axis says they
/// are upper bounds).
pub fn bucket_label(i: usize) -> String {
    let Some(us) = latency::BOUNDS_US.get(i) else {
        let last = latency::BOUNDS_US[latency::BOUNDS_US.len() - 1];
        return format!(">{}s", last / 1_000_000);
    };
    match us {
        us if *us < 1000 => format!("{us}µs"),
        us if *us < 1_000_000 => format!("{}ms", us / 1000),
        us => format!("{}s", us / 1_000_000),
    }
}

impl Histogram {
    /// The histogram as an inline `<svg>` in a `<figure>`; the buckets shown run from the
    /// first to the last one that counted anything (at least six).
    pub fn render(&self) -> Markup {
        let used = |i: usize| {
            self.series
                .iter()
                .any(|(_, _, c)| c.get(i).is_some_and(|n| *n > 0))
        };
        let first = (0..latency::BUCKETS).find(|i| used(*i)).unwrap_or(4);
        let last = (0..latency::BUCKETS)
            .rev()
            .find(|i| used(*i))
            .unwrap_or(first);
        let last = last.max((first + 5).min(latency::BUCKETS - 1));
        let first = first.min(last.saturating_sub(5));
        let shown: Vec<usize> = (first..=last).collect();
        let max = (self.series.iter())
            .flat_map(|(_, _, c)| shown.iter().map(|i| c.get(*i).copied().unwrap_or(0)))
            .max()
            .unwrap_or(0);
        let top = axis_top(max as f64);
        let slot = (WIDTH - LEFT - RIGHT) / shown.len() as f64;
        let bar = (slot - 6.0) / self.series.len().max(1) as f64;
        let entries: Vec<_> = (self.series.iter())
            .map(|(label, color, _)| (label.clone(), *color, false))
            .collect();
        let body = html! {
                    @for (k, i) in shown.iter().enumerate() {
                        @let x = LEFT + slot * k as f64 + 3.0;
                        @for (j, (label, color, counts)) in self.series.iter().enumerate() {
                            @let n = counts.get(*i).copied().unwrap_or(0);
                            @let h = PLOT_HEIGHT * (n as f64 / top).min(1.0);
                            rect.bar data-label=(label) data-bucket=(i) data-count=(n)
                                x=(format!("{:.1}", x + bar * j as f64)) y=(format!("{:.1}", TOP + PLOT_HEIGHT - h))
                                width=(format!("{:.1}", bar)) height=(format!("{h:.1}")) fill=(color) {
                                title { (label) " " (bucket_label(*i)) ": " (n) }
                            }
                        }
                        text.tick x=(format!("{:.1}", x + (slot - 6.0) / 2.0)) y=(TOP + PLOT_HEIGHT + 17.0)
                            text-anchor="middle" font-size="10" fill="#444" { (bucket_label(*i)) }
                    }
        };
        let caption = "latency, upper bound of each bucket";
        frame(
            self.id,
            &self.title,
            (top, "messages"),
            caption,
            body,
            &entries,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_end_on_round_numbers_and_ticks_read_short() {
        assert_eq!(axis_top(0.0), 4.0);
        assert_eq!(axis_top(7.0), 8.0);
        assert_eq!(axis_top(37.0), 40.0);
        assert_eq!(axis_top(0.33), 0.4);
        assert_eq!(axis_top(9_000.0), 10_000.0);
        assert_eq!(number(2.5), "2.5");
        assert_eq!(number(0.1), "0.1");
        assert_eq!(number(2000.0), "2k");
        assert_eq!(number(1500.0), "1.5k");
        assert_eq!(number(40.0), "40");
    }

    #[test]
    fn a_chart_has_its_axes_unit_legend_and_gaps_and_escapes_its_texts() {
        let chart = LineChart {
            id: "c",
            title: "<script>alert(1)</script> per second".into(),
            unit: "msg/s",
            step_s: 15,
            series: vec![Series {
                label: "<img src=x onerror=alert(2)>".into(),
                color: "#2a9d4b",
                dashed: false,
                points: vec![Some(1.0), None, Some(3.0), Some(2.0)],
            }],
        };
        let svg = chart.render().into_string();
        assert!(!svg.contains("<script") && !svg.contains("<img"), "{svg}");
        assert!(
            svg.contains("&lt;script&gt;") && svg.contains("&lt;img"),
            "{svg}"
        );
        assert!(
            svg.contains(">msg/s</text>") && svg.contains(">now</text>"),
            "{svg}"
        );
        // The gap starts a new segment.
        let d = svg
            .split(" d=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert_eq!(d.matches('M').count(), 2, "{d}");
        let h = Histogram {
            id: "h",
            title: "latency".into(),
            series: vec![("guest <b>".into(), "#1f77b4", {
                let mut c = vec![0; latency::BUCKETS];
                c[4] = 9;
                c
            })],
        }
        .render()
        .into_string();
        assert!(
            h.contains("data-count=\"9\"") && h.contains(">1ms</text>"),
            "{h}"
        );
        assert!(!h.contains("<b>") && h.contains("guest &lt;b&gt;"), "{h}");
    }
}
