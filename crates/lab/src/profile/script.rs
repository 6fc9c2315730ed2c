//! `perf script -F tid,ip,sym,dso --no-inline` text of a `--call-graph dwarf` recording, read
//! into samples (sans-IO).
//!
//! Each sample is a header line (the thread id) and its call chain, leaf first, one frame a
//! line: `\t<address> <symbol> (<shared object>)`; a blank line ends it. Symbols hold spaces
//! and parentheses of their own (`<A as B>::f`, `{{closure}}`), so the object is the last
//! ` (...)` of the line.

use anyhow::{bail, Context};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub symbol: String,
    pub dso: String,
}

impl Frame {
    pub fn kernel(&self) -> bool {
        self.dso == "[kernel.kallsyms]" || self.dso.starts_with("[kernel")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub tid: u32,
    /// Leaf first.
    pub frames: Vec<Frame>,
}

/// Calls `each` with every sample of the text, in order (a long recording need not be held
/// in memory as samples).
pub fn for_each_sample(text: &str, mut each: impl FnMut(&Sample)) -> anyhow::Result<u64> {
    let mut count = 0;
    let mut current: Option<Sample> = None;
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            if let Some(s) = current.take() {
                each(&s);
                count += 1;
            }
            continue;
        }
        if line.starts_with('\t') {
            let s = current.as_mut().with_context(|| {
                format!("perf script line {}: a frame before any sample", n + 1)
            })?;
            s.frames
                .push(frame(line).with_context(|| format!("perf script line {}", n + 1))?);
        } else {
            if let Some(s) = current.take() {
                each(&s);
                count += 1;
            }
            let tid = line
                .split_whitespace()
                .next()
                .and_then(|t| t.parse().ok())
                .with_context(|| {
                    format!(
                        "perf script line {}: {line:?} is not a sample header (run perf script \
                         with -F tid,ip,sym,dso)",
                        n + 1
                    )
                })?;
            current = Some(Sample {
                tid,
                frames: Vec::new(),
            });
        }
    }
    if let Some(s) = current.take() {
        each(&s);
        count += 1;
    }
    Ok(count)
}

fn frame(line: &str) -> anyhow::Result<Frame> {
    let line = line.trim();
    let (addr, rest) = line
        .split_once(' ')
        .context("no symbol after the address")?;
    if !addr.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("{addr:?} is not an address");
    }
    let rest = rest.trim_start();
    let (symbol, dso) = match rest.rsplit_once(" (") {
        Some((sym, dso)) if dso.ends_with(')') => (sym, &dso[..dso.len() - 1]),
        _ => bail!("no (shared object) at the end of {line:?}"),
    };
    Ok(Frame {
        symbol: symbol.to_string(),
        dso: dso.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(text: &str) -> anyhow::Result<Vec<Sample>> {
        let mut v = Vec::new();
        for_each_sample(text, |s| v.push(s.clone()))?;
        Ok(v)
    }

    #[test]
    fn reads_samples_and_frames() {
        let text = "25839 \n\
\tffffffff820a0854 raw_local_deliver ([kernel.kallsyms])\n\
\t           fde9d __GI___writev (/usr/lib/x86_64-linux-gnu/libc.so.6)\n\
\t          6bb7be baton_agent::conn::serve::{{closure}} (/work/target/release/baton)\n\
\n\
25840 \n\
\t          6fcff6 <baton_agent::metering::MeteredExpander as rustls::crypto::tls13::HkdfExpander>::expand_slice (/work/target/release/baton)\n\
\tffffffffffffffff [unknown] ([unknown])\n";
        let s = all(text).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].tid, 25839);
        assert_eq!(s[0].frames.len(), 3);
        assert!(s[0].frames[0].kernel());
        assert_eq!(
            s[0].frames[2].symbol,
            "baton_agent::conn::serve::{{closure}}"
        );
        assert_eq!(s[1].frames[0].dso, "/work/target/release/baton");
        assert_eq!(
            s[1].frames[0].symbol,
            "<baton_agent::metering::MeteredExpander as rustls::crypto::tls13::HkdfExpander>::expand_slice"
        );
        assert_eq!(s[1].frames[1].symbol, "[unknown]");
    }

    #[test]
    fn refuses_other_text() {
        assert!(all("# Samples: 10 of event 'cpu-clock'\n").is_err());
        assert!(all("\tffff f (x)\n").is_err());
        assert!(all("1 \n\tnot-an-address f (x)\n").is_err());
        assert!(all("1 \n\tffff f without object\n").is_err());
        assert_eq!(all("").unwrap().len(), 0);
    }
}
