//! The two accounts of one run side by side (sans-IO): the agent's metering
//! (`baton_crypto_seconds_total{op}` over the process's CPU seconds) and perf's samples.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::classify::{Attribution, Family, OpGroup, Profile};

/// What the agent said about itself at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// `baton_crypto_seconds_total{op}` by op label.
    pub crypto: BTreeMap<String, f64>,
    /// The process's user + system CPU seconds, from `/proc/PID/stat`.
    pub cpu_seconds: f64,
}

/// Ops of `baton_crypto_seconds_total` that are time spent waiting, not CPU: `sign_remote` is
/// the agent waiting for `baton signer` (`--key-signer`), whose CPU is the signer's.
pub const WAITING_OPS: [&str; 1] = ["sign_remote"];

/// `baton_crypto_seconds_total{op="..."} V` samples of a metrics page, by op.
pub fn crypto_seconds(metrics: &str) -> BTreeMap<String, f64> {
    let samples = baton_bench::scrape::samples(metrics);
    baton_bench::scrape::by_label(&samples, "baton_crypto_seconds_total", "op")
}

/// One run as both accounts saw it.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// Crypto seconds per op metered during the run.
    pub metered: BTreeMap<String, f64>,
    /// CPU seconds the agent used during the run.
    pub cpu_seconds: f64,
    pub profile: Profile,
    pub attribution: Attribution,
}

impl Comparison {
    pub fn new(
        before: &Snapshot,
        after: &Snapshot,
        profile: Profile,
        attribution: Attribution,
    ) -> Comparison {
        let metered = after
            .crypto
            .iter()
            .map(|(op, v)| {
                let was = before.crypto.get(op).copied().unwrap_or(0.0);
                (op.clone(), (v - was).max(0.0))
            })
            .collect();
        Comparison {
            metered,
            cpu_seconds: (after.cpu_seconds - before.cpu_seconds).max(0.0),
            profile,
            attribution,
        }
    }

    /// Metered CPU seconds in crypto (without [`WAITING_OPS`]).
    pub fn metered_seconds(&self) -> f64 {
        self.metered
            .iter()
            .filter(|(op, _)| !WAITING_OPS.contains(&op.as_str()))
            .map(|(_, v)| v)
            .sum()
    }

    /// Crypto's share of the agent's CPU according to the metering.
    pub fn metered_share(&self) -> f64 {
        ratio(self.metered_seconds(), self.cpu_seconds)
    }

    /// Share of the agent's samples inside metered calls (perf's view of the same thing the
    /// metering times).
    pub fn perf_share(&self) -> f64 {
        ratio(
            self.profile.in_any_call() as f64,
            self.profile.total() as f64,
        )
    }

    /// Share of the agent's samples whose leaf is crypto code (a narrower thing: no buffer
    /// copies, allocation or glue inside the calls; the random generator outside them).
    pub fn perf_leaf_share(&self) -> f64 {
        ratio(self.profile.crypto() as f64, self.profile.total() as f64)
    }

    /// `metered - perf` (inside metered calls), in percentage points.
    pub fn difference_points(&self) -> f64 {
        100.0 * (self.metered_share() - self.perf_share())
    }

    /// How far apart the two accounts may be in this run ([`super::margin_points`]).
    pub fn margin_points(&self) -> f64 {
        super::margin_points(self.profile.total(), self.perf_share())
    }

    pub fn metered_op_share(&self, op: &str) -> f64 {
        ratio(
            self.metered.get(op).copied().unwrap_or(0.0),
            self.cpu_seconds,
        )
    }

    pub fn perf_op_share(&self, op: &str) -> f64 {
        let n = self.profile.in_calls.get(op).copied().unwrap_or(0);
        ratio(n as f64, self.profile.total() as f64)
    }

    /// Leaf-symbol share of one group of ops.
    pub fn perf_leaf_group_share(&self, g: OpGroup) -> f64 {
        let n: u64 = Family::ALL
            .iter()
            .filter(|f| OpGroup::of_family(**f, self.attribution) == Some(g))
            .map(|f| self.profile.get(*f))
            .sum();
        ratio(n as f64, self.profile.total() as f64)
    }

    /// Both accounts: per op the metered share and perf's samples inside that op's calls,
    /// the totals, then perf's narrower leaf-symbol view.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let pct = |x: f64| format!("{:5.1}%", 100.0 * x);
        let p = &self.profile;
        let _ = writeln!(
            out,
            "agent CPU {:.2}s; perf {} samples ({:.0}% unwound to the thread start)",
            self.cpu_seconds,
            p.total(),
            100.0 * ratio(p.unwound as f64, p.total() as f64)
        );
        let _ = writeln!(
            out,
            "  {:<13} {:>8} {:>14}",
            "op", "metered", "perf in calls"
        );
        for op in self.metered.keys() {
            if WAITING_OPS.contains(&op.as_str()) {
                let _ = writeln!(
                    out,
                    "  {op:<13} {:>7.3}s waiting (not CPU)",
                    self.metered[op]
                );
                continue;
            }
            let _ = writeln!(
                out,
                "  {:<13} {:>8} {:>14}",
                op,
                pct(self.metered_op_share(op)),
                pct(self.perf_op_share(op))
            );
        }
        let _ = writeln!(
            out,
            "  {:<13} {:>8} {:>14}   (difference {:+.1} points)",
            "crypto",
            pct(self.metered_share()),
            pct(self.perf_share()),
            self.difference_points()
        );
        let groups: Vec<String> = OpGroup::ALL
            .iter()
            .map(|g| {
                format!(
                    "{} {}",
                    g.label(),
                    pct(self.perf_leaf_group_share(*g)).trim()
                )
            })
            .collect();
        let unattributed = ratio(
            (p.get(Family::Rng) + p.get(Family::Glue)) as f64,
            p.total() as f64,
        );
        let _ = writeln!(
            out,
            "  crypto code by leaf symbol: {} ({}, rng+glue {})",
            pct(self.perf_leaf_share()).trim(),
            groups.join(", "),
            pct(unattributed).trim()
        );
        out
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_crypto_seconds_from_a_metrics_page() {
        let page = "# TYPE baton_crypto_seconds_total counter\n\
                    baton_crypto_seconds_total{op=\"sign\"} 1.500000000\n\
                    baton_crypto_seconds_total{op=\"hash\"} 0.25\n\
                    baton_crypto_operations_total{op=\"sign\"} 7\n";
        let m = crypto_seconds(page);
        assert_eq!(m.len(), 2);
        assert_eq!(m["sign"], 1.5);
        assert_eq!(m["hash"], 0.25);
    }

    #[test]
    fn shares_from_both_accounts() {
        let before = Snapshot {
            crypto: [("sign".to_string(), 1.0), ("hash".to_string(), 0.5)].into(),
            cpu_seconds: 10.0,
        };
        let after = Snapshot {
            crypto: [
                ("sign".to_string(), 2.0),
                ("hash".to_string(), 1.0),
                ("bulk_encrypt".to_string(), 0.5),
                ("sign_remote".to_string(), 7.0),
            ]
            .into(),
            cpu_seconds: 14.0,
        };
        let signer = "<baton_agent::metering::MeteredSigner as rustls::crypto::signer::Signer>::sign (baton)";
        let mut text = String::new();
        // 100 samples: 30 signing (25 in ECDSA code, 5 in malloc), 10 AES-GCM in a record's
        // encryption, 5 of the random generator outside any call, 55 in the kernel
        let mut add = |n: usize, leaf: &str, caller: &str| {
            for _ in 0..n {
                text.push_str(&format!("1 \n\tabc {leaf}\n\tdef {caller}\n\n"));
            }
        };
        add(25, "ecp_nistz256_ord_sqr_montx (baton)", signer);
        add(5, "malloc (libc.so.6)", signer);
        add(10, "_aesni_ctr32_ghash_6x (baton)", "<baton_agent::metering::MeteredEncrypter as rustls::crypto::cipher::MessageEncrypter>::encrypt (baton)");
        add(
            5,
            "aws_lc_0_47_0_RAND_bytes (baton)",
            "rustls::rand::random_array (baton)",
        );
        add(
            55,
            "tcp_sendmsg ([kernel.kallsyms])",
            "baton_agent::conn::serve (baton)",
        );
        let profile = Profile::from_script(&text).unwrap();
        let c = Comparison::new(&before, &after, profile, Attribution { p256_kx: false });
        assert_eq!(c.cpu_seconds, 4.0);
        assert_eq!(c.metered_seconds(), 2.0);
        assert_eq!(c.metered_share(), 0.5);
        assert!((c.perf_share() - 0.40).abs() < 1e-9);
        assert!((c.perf_leaf_share() - 0.40).abs() < 1e-9);
        assert!((c.difference_points() - 10.0).abs() < 1e-9);
        assert_eq!(c.metered_op_share("sign"), 0.25);
        assert!((c.perf_op_share("sign") - 0.30).abs() < 1e-9);
        assert!((c.perf_op_share("bulk_encrypt") - 0.10).abs() < 1e-9);
        assert!((c.perf_leaf_group_share(OpGroup::PublicKey) - 0.25).abs() < 1e-9);
        let table = c.table();
        assert!(table.contains("difference +10.0 points"), "{table}");
        assert!(
            table.contains("crypto code by leaf symbol: 40.0%"),
            "{table}"
        );
    }
}
