//! The renewal metrics: `baton_certificate_renewals_total{name,outcome}` (outcome `ok`,
//! `failed` or `rate_limited`) and `baton_certificate_renewal_failing_since_timestamp_seconds
//! {name}` (unix time of the first failure of the current failing run, 0 once an attempt
//! succeeds). Counted by the agent that ordered; every agent shows 0 for a name it serves.
//! `baton_certificate_renewal_scheduled_timestamp_seconds{name,key}`: when the agent that
//! orders means to renew (the time picked in the CA's renewal window, or two thirds of the
//! lifetime when the CA publishes none).

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Failed,
    RateLimited,
}

impl Outcome {
    const ALL: [Outcome; 3] = [Outcome::Ok, Outcome::Failed, Outcome::RateLimited];
    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::RateLimited => "rate_limited",
        }
    }
}

#[derive(Debug, Default, Clone)]
struct PerName {
    counts: [u64; 3],
    failing_since: u64,
    scheduled: BTreeMap<&'static str, u64>,
}

#[derive(Debug, Default)]
pub struct AcmeMetrics {
    names: Mutex<BTreeMap<String, PerName>>,
}

impl AcmeMetrics {
    pub fn new(names: &[String]) -> Self {
        let m = AcmeMetrics::default();
        if let Ok(mut map) = m.names.lock() {
            for n in names {
                map.insert(n.clone(), PerName::default());
            }
        }
        m
    }

    /// One attempt's outcome, at `unix` seconds.
    pub fn attempt(&self, name: &str, outcome: Outcome, unix: u64) {
        let Ok(mut map) = self.names.lock() else {
            return;
        };
        let e = map.entry(name.to_string()).or_default();
        e.counts[outcome as usize] += 1;
        match outcome {
            Outcome::Ok => e.failing_since = 0,
            _ if e.failing_since == 0 => e.failing_since = unix,
            _ => {}
        }
    }

    /// The renewal of `name`'s `key` certificate is planned for `unix` seconds.
    pub fn scheduled(&self, name: &str, key: &'static str, unix: u64) {
        if let Ok(mut map) = self.names.lock() {
            map.entry(name.to_string())
                .or_default()
                .scheduled
                .insert(key, unix);
        }
    }

    /// A certificate for `name` issued elsewhere in the cluster: nothing is failing here.
    pub fn renewed_elsewhere(&self, name: &str) {
        if let Ok(mut map) = self.names.lock() {
            map.entry(name.to_string()).or_default().failing_since = 0;
        }
    }
}

/// The metrics as a collector of the agent's registry (the ACME task keeps counting).
#[derive(Debug)]
pub struct Collected(pub std::sync::Arc<AcmeMetrics>);

impl Collector for Collected {
    fn encode(&self, e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(e)
    }
}

impl Collector for AcmeMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let map = match self.names.lock() {
            Ok(m) => m.clone(),
            Err(_) => return Ok(()),
        };
        let mut renewals = e.encode_descriptor(
            "baton_certificate_renewals",
            "ACME orders of a certificate by this agent, by outcome",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (name, per) in &map {
            for o in Outcome::ALL {
                let labels = [("name", name.as_str()), ("outcome", o.label())];
                ConstCounter::new(per.counts[o as usize])
                    .encode(renewals.encode_family(&labels)?)?;
            }
        }
        let mut enc = e.encode_descriptor(
            "baton_certificate_renewal_failing_since_timestamp_seconds",
            "Unix time of the first failure of the current run of failed ACME attempts (0: the last succeeded)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (name, per) in &map {
            let labels = [("name", name.as_str())];
            ConstGauge::new(per.failing_since as i64).encode(enc.encode_family(&labels)?)?;
        }
        let mut enc = e.encode_descriptor(
            "baton_certificate_renewal_scheduled_timestamp_seconds",
            "Unix time the agent that orders means to renew the certificate (in the CA's renewal window, else at two thirds of its lifetime)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (name, per) in &map {
            for (key, at) in &per.scheduled {
                let labels = [("name", name.as_str()), ("key", key)];
                ConstGauge::new(*at as i64).encode(enc.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(m: AcmeMetrics) -> String {
        let mut r = prometheus_client::registry::Registry::default();
        r.register_collector(Box::new(m));
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &r).unwrap();
        s
    }

    #[test]
    fn outcomes_counted_and_the_failing_run_dated_by_its_first_failure() {
        let m = AcmeMetrics::new(&["a.test".into()]);
        m.attempt("a.test", Outcome::Failed, 100);
        m.attempt("a.test", Outcome::RateLimited, 200);
        let t = text(m);
        assert!(
            t.contains(r#"baton_certificate_renewals_total{name="a.test",outcome="failed"} 1"#),
            "{t}"
        );
        assert!(t.contains(
            r#"baton_certificate_renewals_total{name="a.test",outcome="rate_limited"} 1"#
        ));
        assert!(t.contains(
            r#"baton_certificate_renewal_failing_since_timestamp_seconds{name="a.test"} 100"#
        ));
        let m = AcmeMetrics::new(&[]);
        m.attempt("b.test", Outcome::Failed, 100);
        m.attempt("b.test", Outcome::Ok, 300);
        let t = text(m);
        assert!(t.contains(
            r#"baton_certificate_renewal_failing_since_timestamp_seconds{name="b.test"} 0"#
        ));
        assert!(t.contains(r#"baton_certificate_renewals_total{name="b.test",outcome="ok"} 1"#));
    }
}
