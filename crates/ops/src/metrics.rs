//! Metrics through `prometheus-client`: the OpenMetrics text of a registry, the process's own
//! CPU and memory as a collector, and helpers for collectors that read their values at scrape
//! time (atomics kept on the hot path, state owned elsewhere).
//!
//! Counters on hot paths stay plain atomics (or pre-created [`Counter`]s of a [`Family`],
//! which are the same): a [`Family`] lookup per event would take a lock and hash the labels.
//!
//! [`Counter`]: prometheus_client::metrics::counter::Counter
//! [`Family`]: prometheus_client::metrics::family::Family

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabelSet, EncodeMetric,
    NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The content type of [`encode`]'s text (OpenMetrics 1.0, which Prometheus asks for first).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The registry as OpenMetrics text, `# EOF` last.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::with_capacity(8192);
    // Writing to a String does not fail; a collector's error would leave the text cut short.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// `process_cpu_seconds_total` and `process_resident_memory_bytes`, read at each scrape.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let usage = crate::process::usage();
        counter(
            &mut encoder,
            "process_cpu_seconds",
            "User and system CPU time of the process.",
            usage.cpu_seconds,
        )?;
        gauge(
            &mut encoder,
            "process_resident_memory_bytes",
            "Resident memory of the process.",
            usage.rss_bytes as i64,
        )
    }
}

/// One unlabelled counter (`name` without `_total`: the encoder appends it).
pub fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: impl EncodeCounterValue,
) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(value);
    c.encode(encoder.encode_descriptor(name, help, None, MetricType::Counter)?)
}

/// A counter family, one sample per label set (`name` without `_total`).
pub fn counters<S: EncodeLabelSet, V: EncodeCounterValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (S, V)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in samples {
        ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// One unlabelled gauge.
pub fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: impl EncodeGaugeValue,
) -> Result<(), std::fmt::Error> {
    ConstGauge::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// A gauge family, one sample per label set.
pub fn gauges<S: EncodeLabelSet, V: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (S, V)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in samples {
        ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// An unlabelled histogram from atomics kept on the hot path: `cumulative[i]` observations at
/// or under `bounds[i]`, `count` in all (the `+Inf` bucket), `sum` of the observed values.
pub fn histogram(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    bounds: &[f64],
    cumulative: &[u64],
    count: u64,
    sum: f64,
) -> Result<(), std::fmt::Error> {
    // The encoder takes per-bucket counts and accumulates them; f64::MAX is its `+Inf`.
    let mut buckets = Vec::with_capacity(bounds.len() + 1);
    let mut below = 0;
    for (b, c) in bounds.iter().zip(cumulative) {
        // Buckets are read one by one while observations land: never let one go negative.
        let c = (*c).max(below);
        buckets.push((*b, c - below));
        below = c;
    }
    let count = count.max(below);
    buckets.push((f64::MAX, count - below));
    encoder
        .encode_descriptor(name, help, None, MetricType::Histogram)?
        .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Fixed;

    impl Collector for Fixed {
        fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            counters(
                &mut e,
                "x_requests",
                "Requests.",
                [([("code", "2xx")], 3u64), ([("code", "5xx")], 1)],
            )?;
            gauges(&mut e, "x_up", "Up.", [([("agent", 0usize)], 1i64)])?;
            histogram(
                &mut e,
                "x_seconds",
                "Latency.",
                &[0.001, 1.0],
                &[1, 2],
                3,
                1.5,
            )
        }
    }

    #[test]
    fn encodes_collected_families_and_process_usage() {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Fixed));
        registry.register_collector(Box::new(ProcessCollector));
        let text = encode(&registry);
        for line in [
            "# TYPE x_requests counter",
            "x_requests_total{code=\"2xx\"} 3",
            "x_requests_total{code=\"5xx\"} 1",
            "x_up{agent=\"0\"} 1",
            "x_seconds_bucket{le=\"0.001\"} 1",
            "x_seconds_bucket{le=\"1.0\"} 2",
            "x_seconds_bucket{le=\"+Inf\"} 3",
            "x_seconds_count 3",
            "x_seconds_sum 1.5",
            "# TYPE process_cpu_seconds counter",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
        assert!(text.contains("\nprocess_cpu_seconds_total "), "{text}");
        assert!(text.contains("\nprocess_resident_memory_bytes "), "{text}");
    }
}
