//! Running a sweep: each cell's settings (the base settings with the cell's values) and the
//! one table of what each run measured. Plain functions; the runs are ordinary runs.

use std::fmt::Write as _;

use anyhow::bail;

use crate::config::BenchArgs;
use crate::report::Report;
use crate::sweep::{parse_size, Cell};

/// The run settings of one cell: the base settings with the cell's values.
pub fn apply(base: &BenchArgs, cell: &Cell) -> anyhow::Result<BenchArgs> {
    let mut a = base.clone();
    a.sweep = None;
    a.body_size = Vec::new();
    for (axis, v) in cell {
        match *axis {
            "url" => a.url = Some(v.clone()),
            "tls-version" => a.tls_version = Some(v.clone()),
            "suite" => a.suite = vec![v.clone()],
            "group" => a.group = vec![v.clone()],
            "sigalg" => a.sigalg = vec![v.clone()],
            "body-size" => {}
            other => bail!("unknown sweep axis {other}"),
        }
    }
    if let Some((_, size)) = cell.iter().find(|(axis, _)| *axis == "body-size") {
        let bytes = parse_size(size)?;
        let url = a.url.clone().unwrap_or_default();
        if !url.contains("{size}") {
            bail!("a body-size sweep needs `{{size}}` in the URL (e.g. https://HOST:PORT/bytes/{{size}}): the server decides what it sends");
        }
        a.url = Some(url.replace("{size}", &bytes.to_string()));
    }
    Ok(a)
}

/// The one table: the swept values, then what each run measured.
pub fn table(cells: &[(Cell, Report)]) -> String {
    let mut o = String::new();
    let Some((first, _)) = cells.first() else {
        return o;
    };
    let widths: Vec<usize> = first
        .iter()
        .enumerate()
        .map(|(i, (axis, _))| {
            cells
                .iter()
                .map(|(c, _)| c[i].1.len())
                .chain([axis.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    for ((axis, _), w) in first.iter().zip(&widths) {
        let _ = write!(o, "  {axis:<w$}");
    }
    let _ = writeln!(
        o,
        "  {:>10} {:>7} {:>8} {:>7} {:>7} {:>9} {:>9}",
        "TPS", "full", "resumed", "failed", "errors", "p50 ms", "p99 ms"
    );
    for (cell, r) in cells {
        for ((_, v), w) in cell.iter().zip(&widths) {
            let _ = write!(o, "  {v:<w$}");
        }
        let total = r.latency_ms.get("total");
        let _ = writeln!(
            o,
            "  {:>10.1} {:>7} {:>8} {:>7} {:>7} {:>9.3} {:>9.3}",
            r.tps,
            r.handshakes.full,
            r.handshakes.resumed,
            r.handshakes.failed,
            r.errors.values().sum::<u64>(),
            total.map_or(0.0, |s| s.p50),
            total.map_or(0.0, |s| s.p99),
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::Sweep;

    #[test]
    fn matrix_and_urls() {
        let s = Sweep {
            body_size: vec!["128".into(), "1k".into(), "32KB".into()],
            suite: vec!["A".into(), "B".into()],
            ..Default::default()
        };
        let cells = s.cells();
        assert_eq!(cells.len(), 6);
        assert_eq!(
            cells[1],
            vec![("suite", "A".to_string()), ("body-size", "1k".to_string())]
        );
        let base = BenchArgs {
            url: Some("https://h:1/bytes/{size}".into()),
            suite: vec!["X".into(), "Y".into()],
            ..Default::default()
        };
        let a = apply(&base, &cells[5]).unwrap();
        assert_eq!(a.url.as_deref(), Some("https://h:1/bytes/32768"));
        assert_eq!(a.suite, vec!["B".to_string()]);
        let no_placeholder = BenchArgs {
            url: Some("https://h:1/".into()),
            ..Default::default()
        };
        assert!(apply(&no_placeholder, &cells[0]).is_err());
        assert!(Sweep::default().is_empty());
        assert_eq!(Sweep::default().cells(), vec![Vec::new()]);
        assert_eq!(parse_size("16k").unwrap(), 16384);
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn read_from_the_config_file() {
        let a: BenchArgs = toml::from_str(
            "url = \"https://h:1/b/{size}\"\n[sweep]\nbody-size = [\"128\", \"4k\"]\ntls-version = [\"1.2\", \"1.3\"]\n",
        )
        .unwrap();
        let s = a.sweep.unwrap();
        assert_eq!(s.cells().len(), 4);
        assert!(toml::from_str::<BenchArgs>("[sweep]\nsizes = [1]\n").is_err());
    }
}
