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
//! per run. Making the matrix is pure (here), and so are each cell's settings and the table
//! (`sweep_run.rs`); the runs are ordinary runs.

use anyhow::Context;
use serde::{Deserialize, Serialize};

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
