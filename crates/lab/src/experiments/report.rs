//! `baton lab --report FILE.html`: one self-contained page (no script, font or link) with each
//! experiment's table, a bar chart of its main figure, and its notes.

use std::fmt::Write as _;

use serde_json::Value;

use crate::rig::Lab;
use crate::table::Table;

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
        if let Some(col) = &t.chart {
            o.push_str(&bars(t, col));
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

/// Horizontal bars of column `col`, one per row, labelled with the row's first columns.
fn bars(t: &Table, col: &str) -> String {
    let vals: Vec<(String, f64)> = t
        .rows
        .iter()
        .filter_map(|r| {
            let v = r.get(col)?.as_f64()?;
            let label = t
                .columns
                .iter()
                .take(2)
                .map(|(k, _)| text(r.get(k)))
                .collect::<Vec<_>>()
                .join(" / ");
            Some((label, v))
        })
        .collect();
    let max = vals.iter().map(|v| v.1).fold(0.0f64, f64::max);
    if vals.is_empty() || max <= 0.0 {
        return String::new();
    }
    let heading = t
        .columns
        .iter()
        .find(|(k, _)| k == col)
        .map_or(col, |(_, h)| h.as_str());
    let (w, row_h, left) = (720.0, 22.0, 260.0);
    let h = row_h * vals.len() as f64 + 30.0;
    let mut o = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" role=\"img\">\
         <text x=\"0\" y=\"14\" font-size=\"13\" font-weight=\"bold\">{}</text>",
        esc(heading)
    );
    let palette = [
        "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
    ];
    for (i, (label, v)) in vals.iter().enumerate() {
        let y = 24.0 + i as f64 * row_h;
        let bw = (w - left - 80.0) * v / max;
        let _ = write!(
            o,
            "<text x=\"0\" y=\"{:.0}\" font-size=\"12\">{}</text>\
             <rect x=\"{left}\" y=\"{y:.0}\" width=\"{bw:.1}\" height=\"{:.0}\" fill=\"{}\"/>\
             <text x=\"{:.1}\" y=\"{:.0}\" font-size=\"12\">{}</text>",
            y + 14.0,
            esc(label),
            row_h - 6.0,
            palette[i % palette.len()],
            left + bw + 4.0,
            y + 14.0,
            esc(&text(Some(&serde_json::json!(v))))
        );
    }
    o.push_str("</svg>");
    o
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
