//! An experiment's result: rows of named cells, printed as a text table, written as JSON, and
//! drawn in the lab's HTML report. Each row can carry the paper's figure for the same
//! configuration; the printed table puts ours beside it as ratios, because absolute figures
//! from 2006 hardware mean nothing today while ratios and counts do.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::{Map, Value};

#[derive(Debug, Clone, Serialize)]
pub struct Table {
    /// Experiment name (`scenario-a`).
    pub experiment: String,
    pub title: String,
    /// Columns in print order: (key, heading).
    #[serde(skip)]
    pub columns: Vec<(String, String)>,
    pub rows: Vec<Map<String, Value>>,
    /// How the run was set up and what to read into it (caps, client headroom, caveats).
    pub notes: Vec<String>,
    /// Rows that measured something else than they claim (e.g. a CSSL-SF row where nothing
    /// migrated): printed and kept like the others, and the lab run fails.
    pub failed: Vec<String>,
    /// How the report draws the table.
    #[serde(skip)]
    pub chart: Option<Chart>,
}

/// A table's chart in the HTML report.
#[derive(Debug, Clone, PartialEq)]
pub enum Chart {
    /// Grouped bars, one group per row (labelled by its first columns): our column `ours`
    /// beside the paper's figure for the same configuration (`paper`, same unit), one colour
    /// per system and a legend.
    Beside { ours: String, paper: Option<String> },
    /// A sweep: `y` over `x`, one line per distinct value of the `series` columns (log x for
    /// sizes that double).
    Lines {
        x: String,
        y: String,
        series: Vec<String>,
        log_x: bool,
    },
}

impl Chart {
    pub fn beside(ours: &str, paper: Option<&str>) -> Chart {
        Chart::Beside {
            ours: ours.into(),
            paper: paper.map(String::from),
        }
    }

    pub fn lines(x: &str, y: &str, series: &[&str], log_x: bool) -> Chart {
        Chart::Lines {
            x: x.into(),
            y: y.into(),
            series: series.iter().map(|s| s.to_string()).collect(),
            log_x,
        }
    }
}

impl Table {
    pub fn new(experiment: &str, title: impl Into<String>) -> Table {
        Table {
            experiment: experiment.into(),
            title: title.into(),
            columns: Vec::new(),
            rows: Vec::new(),
            notes: Vec::new(),
            failed: Vec::new(),
            chart: None,
        }
    }

    pub fn column(mut self, key: &str, heading: &str) -> Table {
        self.columns.push((key.into(), heading.into()));
        self
    }

    pub fn push(&mut self, row: Map<String, Value>) {
        self.rows.push(row);
    }

    pub fn note(&mut self, n: impl Into<String>) {
        self.notes.push(n.into());
    }

    /// The table as text: headings, one line per row, then the notes.
    pub fn render(&self) -> String {
        let cells: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                self.columns
                    .iter()
                    .map(|(k, _)| r.get(k).map(cell).unwrap_or_else(|| "-".into()))
                    .collect()
            })
            .collect();
        let widths: Vec<usize> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, (_, h))| {
                cells
                    .iter()
                    .map(|r| r[i].chars().count())
                    .chain([h.chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut o = format!("\n{} — {}\n\n", self.experiment, self.title);
        let line = |o: &mut String, vals: Vec<&str>| {
            o.push(' ');
            for (i, v) in vals.iter().enumerate() {
                // first column left-aligned (names), the rest right-aligned (numbers)
                if i == 0 {
                    let _ = write!(o, " {v:<w$}", w = widths[i]);
                } else {
                    let _ = write!(o, "  {v:>w$}", w = widths[i]);
                }
            }
            o.push('\n');
        };
        line(
            &mut o,
            self.columns.iter().map(|(_, h)| h.as_str()).collect(),
        );
        for r in &cells {
            line(&mut o, r.iter().map(String::as_str).collect());
        }
        if !self.notes.is_empty() {
            o.push('\n');
            for n in &self.notes {
                let _ = writeln!(o, "  * {n}");
            }
        }
        o
    }
}

/// A cell as text: integers plain, other numbers with precision that suits their size.
fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.to_string(),
            (_, Some(i), _) => i.to_string(),
            (_, _, Some(f)) if f.abs() >= 100.0 => format!("{f:.0}"),
            (_, _, Some(f)) if f.abs() >= 10.0 => format!("{f:.1}"),
            (_, _, Some(f)) => format!("{f:.2}"),
            _ => n.to_string(),
        },
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(cell).collect::<Vec<_>>().join("/"),
        other => other.to_string(),
    }
}

/// Builds a row: `row![("config", "LB-IP"), ("tps", 180.2)]`.
#[macro_export]
macro_rules! row {
    ($(($k:expr, $v:expr)),* $(,)?) => {{
        let mut m = serde_json::Map::new();
        $( m.insert($k.to_string(), serde_json::json!($v)); )*
        m
    }};
}

/// `ours / theirs` when both are known and the paper's is not zero.
pub fn ratio(ours: f64, theirs: f64) -> Option<f64> {
    (theirs != 0.0 && ours.is_finite()).then(|| ours / theirs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_aligned_with_missing_cells_as_dashes() {
        let mut t = Table::new("x", "demo")
            .column("config", "config")
            .column("tps", "TPS")
            .column("paper", "paper");
        t.push(row![("config", "LB-IP"), ("tps", 181.25)]);
        t.push(row![("config", "one"), ("tps", 9.5), ("paper", 100.5)]);
        t.note("capped");
        let s = t.render();
        assert!(s.contains("LB-IP"), "{s}");
        assert!(s.contains("181"), "{s}");
        assert!(s.contains("9.50"), "{s}");
        assert!(s.contains(" -\n") || s.contains("  -"), "{s}");
        assert!(s.contains("* capped"), "{s}");
        let json = serde_json::to_value(&t).unwrap();
        assert_eq!(json["rows"][0]["config"], "LB-IP");
    }

    #[test]
    fn ratio_of_zero_paper_is_none() {
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
    }
}
