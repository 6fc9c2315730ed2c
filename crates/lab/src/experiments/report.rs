//! `baton lab --report FILE.html`: one self-contained page (no script, font or link) with each
//! experiment's table, a chart of its main figure (ours beside the paper's as grouped bars, or
//! a sweep as lines), and its notes.

use std::fmt::Write as _;

use serde_json::Value;

use crate::rig::Lab;
use crate::table::{Chart, Table};

pub fn render(tables: &[Table], lab: &Lab) -> String {
    let mut o = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>baton lab</title><style>\
         body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}\
         td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}\
         th{background:#eef}li{margin:.2em 0}</style></head><body><h1>baton lab</h1>",
    );
    let _ = write!(
        o,
        "<p>{} CPUs; servers capped at {}% of a core ({:?}); RTT {}; {} runs.</p>",
        crate::rig::cap::available_cores(),
        lab.quota,
        lab.cap,
        lab.rtt
            .map_or("none".into(), |d| format!("{} ms", d.as_millis())),
        if lab.quick { "quick" } else { "full" }
    );
    for t in tables {
        let _ = write!(
            o,
            "<h2>{}</h2><p>{}</p><table><tr>",
            esc(&t.experiment),
            esc(&t.title)
        );
        for (_, h) in &t.columns {
            let _ = write!(o, "<th>{}</th>", esc(h));
        }
        o.push_str("</tr>");
        for r in &t.rows {
            o.push_str("<tr>");
            for (k, _) in &t.columns {
                let _ = write!(o, "<td>{}</td>", esc(&text(r.get(k))));
            }
            o.push_str("</tr>");
        }
        o.push_str("</table>");
        if let Some(c) = &t.chart {
            o.push_str(&chart(t, c));
        }
        if !t.notes.is_empty() {
            o.push_str("<ul>");
            for n in &t.notes {
                let _ = write!(o, "<li>{}</li>", esc(n));
            }
            o.push_str("</ul>");
        }
    }
    o.push_str("</body></html>\n");
    o
}

/// Colours: ours, then the paper (grouped bars); one per line in a sweep.
const PALETTE: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];

fn heading<'a>(t: &'a Table, col: &'a str) -> &'a str {
    t.columns
        .iter()
        .find(|(k, _)| k == col)
        .map_or(col, |(_, h)| h.as_str())
}

fn chart(t: &Table, c: &Chart) -> String {
    match c {
        Chart::Beside { ours, paper } => beside(t, ours, paper.as_deref()),
        Chart::Lines {
            x,
            y,
            series,
            log_x,
        } => lines(t, x, y, series, *log_x),
    }
}

/// Grouped horizontal bars: per row (labelled by its first two columns) ours and, where the
/// row has one, the paper's figure in the same unit below it; one colour per system.
fn beside(t: &Table, ours: &str, paper: Option<&str>) -> String {
    let rows: Vec<(String, Option<f64>, Option<f64>)> = t
        .rows
        .iter()
        .map(|r| {
            let label = t
                .columns
                .iter()
                .take(2)
                .map(|(k, _)| text(r.get(k)))
                .collect::<Vec<_>>()
                .join(" / ");
            let get = |k: Option<&str>| k.and_then(|k| r.get(k)).and_then(Value::as_f64);
            (label, get(Some(ours)), get(paper))
        })
        .filter(|(_, o, p)| o.is_some() || p.is_some())
        .collect();
    let max = rows
        .iter()
        .flat_map(|(_, o, p)| [*o, *p])
        .flatten()
        .fold(0.0f64, f64::max);
    if rows.is_empty() || max <= 0.0 {
        return String::new();
    }
    let (w, bar_h, left) = (720.0, 12.0, 260.0);
    let group_h = |p: bool| if p { 2.0 * bar_h + 8.0 } else { bar_h + 8.0 };
    let body: f64 = rows.iter().map(|r| group_h(r.2.is_some())).sum();
    let h = body + 44.0;
    let title = match paper {
        Some(p) => format!(
            "{} (this machine) beside {}",
            heading(t, ours),
            heading(t, p)
        ),
        None => heading(t, ours).to_string(),
    };
    let mut o = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" role=\"img\">\
         <text x=\"0\" y=\"14\" font-size=\"13\" font-weight=\"bold\">{}</text>",
        esc(&title)
    );
    // the legend: one colour per system
    let systems = [("this machine", PALETTE[0])]
        .into_iter()
        .chain(paper.map(|_| ("paper", PALETTE[1])));
    for (i, (name, colour)) in systems.enumerate() {
        let x = left + i as f64 * 140.0;
        let _ = write!(
            o,
            "<rect x=\"{x}\" y=\"22\" width=\"12\" height=\"12\" fill=\"{colour}\"/>\
             <text x=\"{:.0}\" y=\"32\" font-size=\"12\">{name}</text>",
            x + 16.0
        );
    }
    let mut y = 42.0;
    for (label, ours, theirs) in &rows {
        let _ = write!(
            o,
            "<text x=\"0\" y=\"{:.0}\" font-size=\"12\">{}</text>",
            y + bar_h,
            esc(label)
        );
        for (i, v) in [ours, theirs].into_iter().enumerate() {
            if i == 1 && theirs.is_none() {
                continue;
            }
            let by = y + i as f64 * (bar_h + 2.0);
            let Some(v) = v else { continue };
            let bw = (w - left - 80.0) * v / max;
            let _ = write!(
                o,
                "<rect x=\"{left}\" y=\"{by:.0}\" width=\"{bw:.1}\" height=\"{bar_h}\" fill=\"{}\"/>\
                 <text x=\"{:.1}\" y=\"{:.0}\" font-size=\"11\">{}</text>",
                PALETTE[i],
                left + bw + 4.0,
                by + bar_h - 2.0,
                esc(&text(Some(&serde_json::json!(v))))
            );
        }
        y += group_h(theirs.is_some());
    }
    o.push_str("</svg>");
    o
}

/// A sweep as lines: `y` over `x`, one line per distinct value of the `series` columns.
fn lines(t: &Table, x: &str, y: &str, series: &[String], log_x: bool) -> String {
    use baton_bench::svg::{self, Scale, Series};
    let mut names: Vec<String> = Vec::new();
    let mut points: Vec<Vec<(f64, f64)>> = Vec::new();
    for r in &t.rows {
        let (Some(a), Some(b)) = (
            r.get(x).and_then(Value::as_f64),
            r.get(y).and_then(Value::as_f64),
        ) else {
            continue;
        };
        let name = series
            .iter()
            .map(|k| format!("{} {}", heading(t, k), text(r.get(k))))
            .collect::<Vec<_>>()
            .join(", ");
        let i = match names.iter().position(|n| *n == name) {
            Some(i) => i,
            None => {
                names.push(name);
                points.push(Vec::new());
                names.len() - 1
            }
        };
        points[i].push((a, b));
    }
    let all = || points.iter().flatten();
    let (x_max, y_max) = (
        all().map(|p| p.0).fold(0.0f64, f64::max),
        all().map(|p| p.1).fold(0.0f64, f64::max),
    );
    if names.is_empty() || x_max <= 0.0 || y_max <= 0.0 {
        return String::new();
    }
    let x_scale = if log_x {
        let x_min = all()
            .map(|p| p.0)
            .filter(|v| *v > 0.0)
            .fold(x_max, f64::min);
        Scale::Log {
            min: x_min,
            max: x_max,
        }
    } else {
        Scale::Linear { max: x_max * 1.05 }
    };
    let lines: Vec<Series<'_>> = names
        .iter()
        .zip(points)
        .enumerate()
        .map(|(i, (name, mut pts))| {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series {
                name,
                colour: PALETTE[i % PALETTE.len()],
                points: pts,
            }
        })
        .collect();
    svg::chart(
        &format!("{} over {}", heading(t, y), heading(t, x)),
        None,
        &lines,
        (x_scale, Scale::Linear { max: y_max * 1.1 }),
        &|v| svg::label(v),
        heading(t, y),
    )
}

fn text(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(f) if n.is_f64() && f.abs() < 10.0 => format!("{f:.2}"),
            Some(f) if n.is_f64() => format!("{f:.0}"),
            _ => n.to_string(),
        },
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| text(Some(x)))
            .collect::<Vec<_>>()
            .join("/"),
        Some(other) => other.to_string(),
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row;

    fn table(chart: Chart) -> Table {
        let mut t = Table::new("x", "t")
            .column("config", "config")
            .column("auth", "auth")
            .column("connections", "connections")
            .column("seconds", "seconds")
            .column("paper", "paper s");
        for (auth, n, s, p) in [
            ("server", 1000, 1.0, Some(2.0)),
            ("server", 2000, 2.1, None),
            ("mutual", 1000, 1.5, Some(3.0)),
            ("mutual", 2000, 3.2, None),
        ] {
            t.push(row![
                ("config", "two agents"),
                ("auth", auth),
                ("connections", n),
                ("seconds", s),
                ("paper", p)
            ]);
        }
        t.chart = Some(chart);
        t
    }

    #[test]
    fn ours_beside_the_paper_one_colour_per_system() {
        let t = table(Chart::beside("seconds", Some("paper")));
        let svg = chart(&t, t.chart.as_ref().unwrap());
        let bars = |colour: &str| svg.matches(&format!("fill=\"{colour}\"/>")).count();
        // a legend swatch each, then one bar per row for ours and one per paper figure
        assert_eq!(bars(PALETTE[0]), 1 + 4, "{svg}");
        assert_eq!(bars(PALETTE[1]), 1 + 2, "{svg}");
        assert!(svg.contains(">this machine</text>") && svg.contains(">paper</text>"));
        // without a paper column: ours alone, no paper in the legend
        let t = table(Chart::beside("seconds", None));
        let svg = chart(&t, t.chart.as_ref().unwrap());
        assert!(!svg.contains(">paper</text>"));
    }

    #[test]
    fn a_sweep_is_one_line_per_series() {
        let t = table(Chart::lines("connections", "seconds", &["auth"], false));
        let svg = chart(&t, t.chart.as_ref().unwrap());
        assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
        assert!(
            svg.contains("auth server") && svg.contains("auth mutual"),
            "{svg}"
        );
        // a table without numbers draws nothing rather than an empty frame
        let mut empty = table(Chart::lines("connections", "seconds", &["auth"], true));
        empty.rows.clear();
        assert_eq!(chart(&empty, empty.chart.as_ref().unwrap()), "");
    }
}
