//! `--report FILE.html`: a run as one self-contained page (the SSL benchmark tool paper's future work: results a
//! person reads, not only numbers): the summary table, throughput over time, latency
//! percentiles per phase, full vs resumed handshakes, errors. CSS and SVG are inline and
//! nothing is fetched (no script, font, image or link), so the file renders offline, in a mail
//! or an archive, years later. Pure: a report in, a string out.

use std::fmt::Write as _;

use crate::report::Report;
use crate::stats::{RawHistogram, PHASES};
use crate::svg::{chart, esc, hbars, label, stacked, Bars, Scale, Series};

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:760px;color:#222}\
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;margin:6px 0}td,th{padding:3px 10px;text-align:right;border-bottom:1px solid #eee}\
td:first-child,th:first-child{text-align:left}.url{font-family:monospace;color:#555}\
svg text{font:12px system-ui,sans-serif;fill:#333}svg .tick{fill:#777}.none{color:#777}";

const PHASE_COLOURS: [&str; 4] = ["#7570b3", "#d95f02", "#1b9e77", "#222222"];
const FULL: &str = "#d95f02";
const REFUSED: &str = "#e6ab02";
const RESUMED: &str = "#1b9e77";
const FAILED: &str = "#c0392b";
/// Most points a throughput line gets (intervals are added up beyond that).
const MAX_POINTS: usize = 150;
/// The percentile curves go to 99.999 %.
const MAX_NINES: f64 = 5.0;

pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let title = format!("baton bench {}", r.url);
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head><body>",
        esc(&title)
    );
    let runs = r
        .merged
        .as_ref()
        .map_or(String::new(), |m| format!(" ({} runs merged)", m.runs));
    let _ = write!(
        o,
        "<h1>baton bench{runs}</h1><div class=\"url\">{}</div>",
        esc(&r.url)
    );
    summary(&mut o, r);
    throughput(&mut o, r);
    latency(&mut o, r);
    handshakes(&mut o, r);
    errors(&mut o, r);
    o.push_str("</body></html>\n");
    o
}

fn table(o: &mut String, head: &[&str], rows: &[Vec<String>]) {
    o.push_str("<table><tr>");
    for h in head {
        let _ = write!(o, "<th>{}</th>", esc(h));
    }
    o.push_str("</tr>");
    for row in rows {
        o.push_str("<tr>");
        for c in row {
            let _ = write!(o, "<td>{}</td>", esc(c));
        }
        o.push_str("</tr>");
    }
    o.push_str("</table>");
}

fn summary(o: &mut String, r: &Report) {
    let c = &r.config;
    let h = &r.handshakes;
    let errors: u64 = r.errors.values().sum();
    let mode = match c.rate {
        Some(rate) => format!("open loop, {rate} transactions/s"),
        None => "closed loop".into(),
    };
    let list = |v: &[String]| {
        if v.is_empty() {
            "default".to_string()
        } else {
            v.join(", ")
        }
    };
    let rows = [
        ("SSL TPS (transactions/s)", format!("{:.1}", r.tps)),
        ("requests/s", format!("{:.1}", r.rps)),
        ("connections", r.connections.to_string()),
        ("duration", format!("{:.2} s", r.duration_s)),
        (
            "handshakes full / resumed / failed",
            format!("{} / {} / {}", h.full, h.resumed, h.failed),
        ),
        ("resumptions refused", h.resume_refused.to_string()),
        (
            "requests ok / failed",
            format!("{} / {}", r.requests.ok, r.requests.failed),
        ),
        ("failed transactions", errors.to_string()),
        ("received", format!("{:.2} MB", r.bytes as f64 / 1e6)),
        ("client CPU", format!("{:.3} s", r.client_cpu_s)),
        ("virtual clients", c.clients.to_string()),
        ("load", mode),
        ("requests per connection", crate::report::req_per_conn(c)),
        (
            "TLS version",
            c.tls_version.clone().unwrap_or_else(|| "1.2 + 1.3".into()),
        ),
        ("suites offered", list(&c.suites)),
        ("groups offered", list(&c.groups)),
        (
            "resumption",
            format!(
                "{}, 1 full every {}",
                serde_json::to_value(c.resume)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default(),
                c.full_every
            ),
        ),
        ("request", format!("{} {}", c.method, c.path)),
    ];
    o.push_str("<h2>Summary</h2>");
    let rows: Vec<Vec<String>> = rows.into_iter().map(|(k, v)| vec![k.into(), v]).collect();
    table(o, &["", ""], &rows);
    if let Some(m) = &r.merged {
        let _ = write!(o, "<p>Merged from {} runs against:</p><ul>", m.runs);
        for u in &m.urls {
            let _ = write!(o, "<li class=\"url\">{}</li>", esc(u));
        }
        o.push_str("</ul>");
    }
}

fn throughput(o: &mut String, r: &Report) {
    o.push_str("<h2>Throughput over time</h2>");
    let t = &r.timeline;
    if t.completed.is_empty() || t.interval_ms == 0 {
        o.push_str("<p class=\"none\">no transaction ended</p>");
        return;
    }
    let group = t.completed.len().div_ceil(MAX_POINTS);
    let bin_s = group as f64 * t.interval_ms as f64 / 1000.0;
    let rates = |v: &[u64]| -> Vec<(f64, f64)> {
        v.chunks(group)
            .enumerate()
            .map(|(i, c)| (i as f64 * bin_s, c.iter().sum::<u64>() as f64 / bin_s))
            .collect()
    };
    let done = rates(&t.completed);
    let failed = rates(&t.failed);
    // a step line: each bin's rate held across the bin
    let steps: Vec<(f64, f64)> = done
        .iter()
        .flat_map(|&(x, y)| [(x, y), (x + bin_s, y)])
        .collect();
    let y_max = done
        .iter()
        .chain(&failed)
        .map(|p| p.1)
        .fold(1.0f64, f64::max)
        * 1.1;
    let x_max = done.len() as f64 * bin_s;
    o.push_str(&chart(
        "Transactions per second over time",
        Some(&Bars {
            series: Series {
                name: "failed/s",
                colour: FAILED,
                points: failed,
            },
            width: bin_s,
        }),
        &[Series {
            name: "completed/s",
            colour: "#2c7fb8",
            points: steps,
        }],
        (Scale::Linear { max: x_max }, Scale::Linear { max: y_max }),
        &|s| format!("{}s", label(s)),
        "per s",
    ));
    let _ = write!(
        o,
        "<p>Each point: transactions that ended in {} s, per second.</p>",
        label(bin_s)
    );
}

/// (nines, ms) points of a phase's percentile curve: x = -log10(1 - q), so 1 is p90, 2 p99.
fn curve(h: &RawHistogram) -> Vec<(f64, f64)> {
    let total: u64 = h.counts.iter().map(|p| p[1]).sum();
    let mut seen = 0u64;
    let mut pts = Vec::new();
    for &[v, c] in &h.counts {
        let ms = v as f64 / 1000.0;
        // the bucket spans from the previous quantile to this one
        let before = seen as f64 / total as f64;
        seen += c;
        let after = seen as f64 / total as f64;
        for q in [before, after] {
            let x = (-(1.0 - q).max(10f64.powf(-MAX_NINES)).log10()).min(MAX_NINES);
            pts.push((x, ms));
        }
    }
    pts
}

fn latency(o: &mut String, r: &Report) {
    o.push_str("<h2>Latency per phase</h2>");
    let mut rows = Vec::new();
    for p in PHASES {
        if let Some(s) = r.latency_ms.get(p) {
            let f = |v: f64| format!("{v:.3}");
            rows.push(vec![
                p.to_string(),
                s.count.to_string(),
                f(s.p50),
                f(s.p90),
                f(s.p99),
                f(s.p999),
                f(s.max),
                f(s.mean),
            ]);
        }
    }
    table(
        o,
        &["ms", "count", "p50", "p90", "p99", "p99.9", "max", "mean"],
        &rows,
    );
    let series: Vec<Series<'_>> = PHASES
        .iter()
        .zip(PHASE_COLOURS)
        .filter_map(|(p, colour)| {
            let h = r.histograms.get(*p)?;
            let points = curve(h);
            (!points.is_empty()).then_some(Series {
                name: p,
                colour,
                points,
            })
        })
        .collect();
    if series.is_empty() {
        o.push_str("<p class=\"none\">no latency recorded</p>");
        return;
    }
    let values = || series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let lo = values().fold(f64::INFINITY, f64::min).max(0.001);
    let hi = values().fold(0.0, f64::max).max(lo * 10.0);
    let nines = |x: f64| {
        let pct = 100.0 * (1.0 - 10f64.powf(-x));
        format!("{}%", label(pct))
    };
    o.push_str(&chart(
        "Latency by percentile, per phase",
        None,
        &series,
        (
            Scale::Linear { max: MAX_NINES },
            Scale::Log {
                min: 10f64.powf(lo.log10().floor()),
                max: 10f64.powf(hi.log10().ceil()),
            },
        ),
        &nines,
        "ms",
    ));
    o.push_str(
        "<p>connect: TCP; handshake: TLS; ttfb: request to first response byte; total: from \
         when the transaction was due to its close (open loop: includes waiting behind a slow \
         server).</p>",
    );
}

fn handshakes(o: &mut String, r: &Report) {
    o.push_str("<h2>Handshakes</h2>");
    let h = &r.handshakes;
    o.push_str(&stacked(
        "Full vs resumed handshakes",
        &[
            ("full", FULL, h.full - h.resume_refused.min(h.full)),
            ("full, resumption refused", REFUSED, h.resume_refused),
            ("resumed", RESUMED, h.resumed),
            ("failed", FAILED, h.failed),
        ],
    ));
    if !r.negotiated.is_empty() {
        let rows: Vec<Vec<String>> = r
            .negotiated
            .iter()
            .map(|(k, v)| vec![k.clone(), v.to_string()])
            .collect();
        table(
            o,
            &["negotiated (version suite group)", "handshakes"],
            &rows,
        );
    }
}

fn errors(o: &mut String, r: &Report) {
    o.push_str("<h2>Errors</h2>");
    let rows: Vec<(String, u64)> = r
        .errors
        .iter()
        .map(|(k, v)| (format!("{k:?}").to_lowercase(), *v))
        .collect();
    o.push_str(&hbars("Failed transactions by class", FAILED, &rows));
    if !r.error_examples.is_empty() {
        let rows: Vec<Vec<String>> = r
            .error_examples
            .iter()
            .map(|(k, v)| vec![format!("{k:?}").to_lowercase(), v.clone()])
            .collect();
        table(o, &["class", "first cause"], &rows);
    }
    let statuses: Vec<Vec<String>> = r
        .requests
        .by_status
        .iter()
        .map(|(k, v)| vec![k.to_string(), v.to_string()])
        .collect();
    if !statuses.is_empty() {
        table(o, &["HTTP status", "responses"], &statuses);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::accounting::ErrorClass;
    use crate::accounting::Handshake;
    use crate::config::BenchArgs;
    use crate::stats::Stats;

    #[test]
    fn self_contained_and_escaped() {
        let cfg = BenchArgs {
            url: Some("https://evil.test:1/<script>".into()),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        let mut s = Stats::default();
        for i in 0..100u64 {
            s.handshake(Handshake::Full);
            s.status(200);
            s.latency(3, Duration::from_micros(500 + i * 10));
            s.latency(0, Duration::from_micros(50 + i));
            s.ended(Duration::from_millis(i * 20), i % 10 != 0);
        }
        s.error(ErrorClass::Tls);
        s.example(ErrorClass::Tls, "alert <b>\"bad\"</b> & gone".into());
        let r = crate::report::build(&Arc::new(cfg), &s, 2.0, 0.1, BTreeMap::new());
        let html = render(&r);
        for banned in ["<script", "src=", "href=", "@import", "url(", "http://"] {
            assert!(!html.contains(banned), "{banned}");
        }
        assert_eq!(
            html.matches("https://").count(),
            2,
            "title and heading only"
        );
        assert!(html.contains("alert &lt;b&gt;&quot;bad&quot;&lt;/b&gt; &amp; gone"));
        assert_eq!(html.matches("<svg").count(), 4);
        assert!(html.ends_with("</html>\n"));
    }

    #[test]
    fn percentile_curve_climbs_to_the_max() {
        let h = RawHistogram {
            format: crate::stats::RAW_FORMAT.into(),
            unit: "us".into(),
            lowest: 1,
            highest: 3_600_000_000,
            significant_figures: 3,
            counts: vec![[1000, 90], [2000, 9], [9000, 1]],
        };
        let c = curve(&h);
        assert_eq!(c.first(), Some(&(0.0, 1.0)));
        assert!((c[1].0 - 1.0).abs() < 1e-9, "p90 at one nine: {c:?}");
        assert_eq!(c.last(), Some(&(MAX_NINES, 9.0)));
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
    }
}
