//! The HTML report's charts as inline SVG text: no script, no font, nothing fetched, so the
//! report opens anywhere and can be mailed or archived as one file. Pure: numbers in, markup
//! out.

use std::fmt::Write as _;

pub const WIDTH: f64 = 720.0;
pub const HEIGHT: f64 = 260.0;
/// Room for the axes' labels.
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 40.0;

/// One line of a chart: its name, colour and points in data units.
pub struct Series<'a> {
    pub name: &'a str,
    pub colour: &'a str,
    pub points: Vec<(f64, f64)>,
}

/// How an axis maps data to pixels.
#[derive(Clone, Copy)]
pub enum Scale {
    Linear {
        max: f64,
    },
    /// log10, from `min` to `max` (both > 0).
    Log {
        min: f64,
        max: f64,
    },
}

impl Scale {
    /// 0..1 along the axis.
    fn at(self, v: f64) -> f64 {
        let f = match self {
            Scale::Linear { max } if max > 0.0 => v / max,
            Scale::Linear { .. } => 0.0,
            Scale::Log { min, max } => (v.max(min).log10() - min.log10()) / (max / min).log10(),
        };
        f.clamp(0.0, 1.0)
    }

    /// Where the gridlines go.
    fn ticks(self) -> Vec<f64> {
        match self {
            Scale::Linear { max } => {
                let step = nice_step(max / 5.0);
                (0..=((max / step).floor() as usize))
                    .map(|i| i as f64 * step)
                    .collect()
            }
            Scale::Log { min, max } => {
                let (a, b) = (min.log10().floor() as i32, max.log10().ceil() as i32);
                (a..=b)
                    .map(|e| 10f64.powi(e))
                    .filter(|v| *v >= min * 0.999 && *v <= max * 1.001)
                    .collect()
            }
        }
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if !(raw > 0.0 && raw.is_finite()) {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

/// A number as an axis label: short, no trailing zeros.
pub fn label(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1000.0 {
        format!("{:.0}", v)
    } else if v.abs() >= 1.0 {
        trim(format!("{v:.2}"))
    } else {
        trim(format!("{v:.4}"))
    }
}

fn trim(s: String) -> String {
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Escapes text for HTML and SVG.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// Bars drawn under a chart's lines (e.g. failures per interval): one per point, `width` in x
/// units.
pub struct Bars<'a> {
    pub series: Series<'a>,
    pub width: f64,
}

/// A line chart: series over x, optional bars under them, gridlines and labelled axes.
/// `x_label` formats an x tick.
pub fn chart(
    title: &str,
    bars: Option<&Bars<'_>>,
    series: &[Series<'_>],
    (x, y): (Scale, Scale),
    x_label: &dyn Fn(f64) -> String,
    y_unit: &str,
) -> String {
    let mut o = open(title);
    axes(&mut o, x, y, x_label, y_unit);
    if let Some(b) = bars {
        for &(a, v) in b.series.points.iter().filter(|p| p.1 > 0.0) {
            let (x0, x1) = (px(x, a), px(x, a + b.width));
            let top = py(y, v);
            let _ = write!(
                o,
                r#"<rect x="{x0:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{}"/>"#,
                (x1 - x0).max(1.0),
                (HEIGHT - BOTTOM - top).max(0.0),
                b.series.colour
            );
        }
    }
    for s in series {
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|&(a, b)| format!("{:.1},{:.1}", px(x, a), py(y, b)))
            .collect();
        let _ = write!(
            o,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            s.colour,
            pts.join(" ")
        );
    }
    let bar_key = bars.map(|b| (b.series.name, b.series.colour));
    legend(
        &mut o,
        bar_key
            .into_iter()
            .chain(series.iter().map(|s| (s.name, s.colour))),
    );
    o.push_str("</svg>");
    o
}

/// One horizontal bar split into labelled parts (e.g. full / resumed / failed handshakes).
pub fn stacked(title: &str, parts: &[(&str, &str, u64)]) -> String {
    let h = 90.0;
    let mut o = format!(
        r#"<svg role="img" aria-label="{t}" viewBox="0 0 {WIDTH} {h}" width="{WIDTH}" height="{h}"><title>{t}</title>"#,
        t = esc(title)
    );
    let total: u64 = parts.iter().map(|p| p.2).sum();
    let span = WIDTH - LEFT - RIGHT;
    let mut at = LEFT;
    for (name, colour, n) in parts {
        let w = if total > 0 {
            span * *n as f64 / total as f64
        } else {
            0.0
        };
        let _ = write!(
            o,
            r#"<rect x="{at:.1}" y="10" width="{w:.1}" height="36" fill="{colour}"><title>{}: {n}</title></rect>"#,
            esc(name)
        );
        at += w;
    }
    if total == 0 {
        let _ = write!(
            o,
            r##"<rect x="{LEFT}" y="10" width="{span}" height="36" fill="#eee"/><text x="{:.0}" y="33" text-anchor="middle">none</text>"##,
            LEFT + span / 2.0
        );
    }
    let mut x = LEFT;
    for (name, colour, n) in parts {
        let _ = write!(
            o,
            r#"<rect x="{x:.0}" y="62" width="12" height="12" fill="{colour}"/><text x="{:.0}" y="73">{} {n}</text>"#,
            x + 16.0,
            esc(name)
        );
        x += 40.0 + 8.0 * (name.len() + n.to_string().len()) as f64;
    }
    o.push_str("</svg>");
    o
}

/// Horizontal bars, one per labelled count.
pub fn hbars(title: &str, colour: &str, rows: &[(String, u64)]) -> String {
    let row_h = 26.0;
    let h = TOP + row_h * rows.len().max(1) as f64 + 8.0;
    let mut o = format!(
        r#"<svg role="img" aria-label="{t}" viewBox="0 0 {WIDTH} {h}" width="{WIDTH}" height="{h}"><title>{t}</title>"#,
        t = esc(title)
    );
    let max = rows.iter().map(|r| r.1).max().unwrap_or(0).max(1) as f64;
    let (x0, span) = (140.0, WIDTH - 140.0 - 80.0);
    for (i, (name, n)) in rows.iter().enumerate() {
        let y = TOP + i as f64 * row_h;
        let w = span * *n as f64 / max;
        let _ = write!(
            o,
            r#"<text x="{:.0}" y="{:.0}" text-anchor="end">{}</text><rect x="{x0}" y="{y:.0}" width="{w:.1}" height="18" fill="{colour}"/><text x="{:.0}" y="{:.0}">{n}</text>"#,
            x0 - 8.0,
            y + 14.0,
            esc(name),
            x0 + w + 6.0,
            y + 14.0
        );
    }
    if rows.is_empty() {
        let _ = write!(o, r#"<text x="{x0}" y="{:.0}">none</text>"#, TOP + 14.0);
    }
    o.push_str("</svg>");
    o
}

fn open(title: &str) -> String {
    format!(
        r#"<svg role="img" aria-label="{t}" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}"><title>{t}</title>"#,
        t = esc(title)
    )
}

fn px(x: Scale, v: f64) -> f64 {
    LEFT + x.at(v) * (WIDTH - LEFT - RIGHT)
}

fn py(y: Scale, v: f64) -> f64 {
    HEIGHT - BOTTOM - y.at(v) * (HEIGHT - TOP - BOTTOM)
}

fn axes(o: &mut String, x: Scale, y: Scale, x_label: &dyn Fn(f64) -> String, y_unit: &str) {
    for t in y.ticks() {
        let yy = py(y, t);
        let _ = write!(
            o,
            r##"<line x1="{LEFT}" x2="{:.0}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.0}" y="{:.1}" text-anchor="end" class="tick">{}</text>"##,
            WIDTH - RIGHT,
            LEFT - 6.0,
            yy + 4.0,
            label(t)
        );
    }
    for t in x.ticks() {
        let xx = px(x, t);
        let _ = write!(
            o,
            r##"<line x1="{xx:.1}" x2="{xx:.1}" y1="{TOP}" y2="{:.0}" stroke="#eee"/><text x="{xx:.1}" y="{:.0}" text-anchor="middle" class="tick">{}</text>"##,
            HEIGHT - BOTTOM,
            HEIGHT - BOTTOM + 16.0,
            esc(&x_label(t))
        );
    }
    let _ = write!(
        o,
        r##"<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{b:.0}" stroke="#444"/><line x1="{LEFT}" x2="{:.0}" y1="{b:.0}" y2="{b:.0}" stroke="#444"/><text x="{:.0}" y="{:.0}" class="tick">{}</text>"##,
        WIDTH - RIGHT,
        LEFT + 6.0,
        TOP - 4.0,
        esc(y_unit),
        b = HEIGHT - BOTTOM
    );
}

fn legend<'a>(o: &mut String, items: impl Iterator<Item = (&'a str, &'a str)>) {
    let mut x = LEFT + 8.0;
    let y = HEIGHT - 8.0;
    for (name, colour) in items {
        let _ = write!(
            o,
            r#"<rect x="{x:.0}" y="{:.0}" width="12" height="12" fill="{colour}"/><text x="{:.0}" y="{y:.0}">{}</text>"#,
            y - 10.0,
            x + 16.0,
            esc(name)
        );
        x += 30.0 + 7.5 * name.len() as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_and_ticks() {
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(130.0), 200.0);
        assert_eq!(Scale::Linear { max: 1000.0 }.ticks().len(), 6);
        let log = Scale::Log {
            min: 0.01,
            max: 100.0,
        };
        assert_eq!(log.ticks(), vec![0.01, 0.1, 1.0, 10.0, 100.0]);
        assert_eq!(log.at(1.0), 0.5);
        assert_eq!(log.at(1e9), 1.0);
        assert_eq!(label(0.25), "0.25");
        assert_eq!(label(2500.0), "2500");
    }

    #[test]
    fn text_is_escaped() {
        let s = hbars("a<b", "#000", &[("<script>".into(), 3)]);
        assert!(!s.contains("<script>") && s.contains("&lt;script&gt;"));
    }
}
