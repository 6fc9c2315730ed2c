//! Sweeps: one run per combination of a few settings, printed as one table (the 2048-bit migration report's data
//! sizes 128 B to 32 KB, by key and suite). `--body-size` on the command line, or a `[sweep]`
//! table in the config file:
//!
//! ```toml
//! url = "https://127.0.0.1:8443/bytes/{size}"
//! [sweep]
//! body-size = ["128", "1k", "4k", "8k", "16k", "32k"]
//! suite = ["TLS13_AES_128_GCM_SHA256", "TLS13_CHACHA20_POLY1305_SHA256"]
//! sigalg = ["ecdsa_secp256r1_sha256", "rsa_pss_rsae_sha256"]  # which server key
//! ```
//!
//! The response size is the server's business: the URL carries `{size}` (in bytes), replaced
//! per run. Making the matrix and the table is pure; the runs are ordinary runs.

use std::fmt::Write as _;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::config::BenchArgs;
use crate::report::Report;

/// The swept settings; each list is one axis (empty: not swept).
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Sweep {
    pub body_size: Vec<String>,
    pub suite: Vec<String>,
    pub group: Vec<String>,
    pub sigalg: Vec<String>,
    pub tls_version: Vec<String>,
    /// Whole URLs (e.g. the same service with a 1024- and a 2048-bit key).
    pub url: Vec<String>,
}

/// One combination: (axis, value) in axis order.
pub type Cell = Vec<(&'static str, String)>;

impl Sweep {
    pub fn is_empty(&self) -> bool {
        self.axes().iter().all(|(_, v)| v.is_empty())
    }

    fn axes(&self) -> [(&'static str, &Vec<String>); 6] {
        [
            ("url", &self.url),
            ("tls-version", &self.tls_version),
            ("suite", &self.suite),
            ("group", &self.group),
            ("sigalg", &self.sigalg),
            ("body-size", &self.body_size),
        ]
    }

    /// Every combination, the last axis varying fastest.
    pub fn cells(&self) -> Vec<Cell> {
        let mut cells: Vec<Cell> = vec![Vec::new()];
        for (name, values) in self.axes() {
            if values.is_empty() {
                continue;
            }
            cells = cells
                .into_iter()
                .flat_map(|c| {
                    values.iter().map(move |v| {
                        let mut c = c.clone();
                        c.push((name, v.clone()));
                        c
                    })
                })
                .collect();
        }
        cells
    }
}

/// `128`, `1k`, `4KB`, `1m` -> bytes (k = 1024, as the 2048-bit migration report's 1 KB .. 32 KB).
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix('b').unwrap_or(&t);
    let (num, mult) = match t.strip_suffix('k') {
        Some(n) => (n, 1024),
        None => match t.strip_suffix('m') {
            Some(n) => (n, 1024 * 1024),
            None => (t, 1),
        },
    };
    let n: u64 = num
        .trim()
        .parse()
        .with_context(|| format!("size `{s}`: like 128, 1k, 32KB"))?;
    Ok(n * mult)
}

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
