//! `baton bench merge`: the runs of several load machines as one result (the SSL benchmark tool paper's future
//! work: a distributed tool). Pure: reports in, report out.
//!
//! Exact, not averaged: counts add, latency histograms are rebuilt from their buckets and
//! added, and every percentile is read from the merged histogram. The runs are taken to have
//! run at the same time against the same service (one load test from several machines):
//! rates add (TPS, RPS, `--rate`), the duration is the longest run's, timelines add interval
//! by interval from each run's start.

use std::collections::BTreeMap;

use anyhow::{bail, Context};

use crate::report::{Merged, Report, Timeline};
use crate::stats::{add_histograms, add_timelines, from_raw, raw, summary, PHASES, TIMELINE_MS};

pub fn merge(runs: &[Report]) -> anyhow::Result<Report> {
    let Some(first) = runs.first() else {
        bail!("nothing to merge");
    };
    let mut m = first.clone();
    let mut urls = vec![first.url.clone()];
    let mut histograms = BTreeMap::new();
    let mut timeline: Vec<[u64; 2]> = Vec::new();
    let mut by_second = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        if r.config.requests_per_conn != first.config.requests_per_conn {
            bail!(
                "run {} made {} requests per connection, run 1 made {}: their request counts \
                 do not add up",
                i + 1,
                r.config.requests_per_conn,
                first.config.requests_per_conn
            );
        }
        if r.timeline.interval_ms != TIMELINE_MS && !r.timeline.completed.is_empty() {
            bail!(
                "run {}: timeline intervals of {} ms, expected {TIMELINE_MS}",
                i + 1,
                r.timeline.interval_ms
            );
        }
        for phase in PHASES {
            let h = r
                .histograms
                .get(phase)
                .with_context(|| format!("run {}: no `{phase}` histogram", i + 1))?;
            let h = from_raw(h).with_context(|| format!("run {}: `{phase}`", i + 1))?;
            match histograms.get_mut(phase) {
                None => {
                    histograms.insert(phase, h);
                }
                Some(acc) => acc.add(h)?,
            }
        }
        // TTFB by connection kind, and per request: in the runs that had them
        let optional = crate::accounting::Kind::ALL.map(|k| k.key());
        for kind in optional.into_iter().chain([crate::report::REQUEST]) {
            let Some(h) = r.histograms.get(kind) else {
                continue;
            };
            let h = from_raw(h).with_context(|| format!("run {}: `{kind}`", i + 1))?;
            match histograms.get_mut(kind) {
                None => {
                    histograms.insert(kind, h);
                }
                Some(acc) => acc.add(h)?,
            }
        }
        let pairs: Vec<[u64; 2]> = r
            .timeline
            .completed
            .iter()
            .zip(&r.timeline.failed)
            .map(|(c, f)| [*c, *f])
            .collect();
        add_timelines(&mut timeline, &pairs);
        let seconds = r
            .timeline
            .request_by_second
            .iter()
            .enumerate()
            .map(|(s, h)| from_raw(h).with_context(|| format!("run {}: second {s}", i + 1)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        add_histograms(&mut by_second, &seconds);
        if !urls.contains(&r.url) {
            urls.push(r.url.clone());
        }
        if i == 0 {
            continue;
        }
        let (h, o) = (&mut m.handshakes, &r.handshakes);
        h.full += o.full;
        h.resumed += o.resumed;
        h.resume_refused += o.resume_refused;
        h.failed += o.failed;
        let (e, o) = (&mut m.early_data, &r.early_data);
        e.offered += o.offered;
        e.accepted += o.accepted;
        e.rejected += o.rejected;
        m.requests.ok += r.requests.ok;
        m.requests.failed += r.requests.failed;
        m.requests.unsent += r.requests.unsent;
        m.requests.expected += r.requests.expected;
        add(&mut m.requests.by_status, &r.requests.by_status);
        add(&mut m.errors, &r.errors);
        add(&mut m.negotiated, &r.negotiated);
        for (k, v) in &r.error_examples {
            m.error_examples.entry(*k).or_insert_with(|| v.clone());
        }
        // the same server scraped by several load machines over the same period: its deltas
        // overlap, so one of them (the first) is kept, not their sum
        for (k, v) in &r.server {
            m.server.entry(k.clone()).or_insert_with(|| v.clone());
        }
        m.tps += r.tps;
        m.rps += r.rps;
        m.bytes += r.bytes;
        m.connections += r.connections;
        m.duration_s = m.duration_s.max(r.duration_s);
        m.client_cpu_s += r.client_cpu_s;
        let (c, o) = (&mut m.config, &r.config);
        c.clients += o.clients;
        c.workers += o.workers;
        c.connections = c.connections.zip(o.connections).map(|(a, b)| a + b);
        c.rate = c.rate.zip(o.rate).map(|(a, b)| a + b);
    }
    m.latency_ms = histograms
        .iter()
        .map(|(p, h)| (p.to_string(), summary(h)))
        .collect();
    m.histograms = histograms
        .iter()
        .map(|(p, h)| (p.to_string(), raw(h)))
        .collect();
    m.timeline = Timeline {
        interval_ms: TIMELINE_MS,
        completed: timeline.iter().map(|x| x[0]).collect(),
        failed: timeline.iter().map(|x| x[1]).collect(),
        request_by_second: by_second.iter().map(raw).collect(),
    };
    let runs_before: u64 = runs
        .iter()
        .map(|r| r.merged.as_ref().map_or(1, |m| m.runs))
        .sum();
    m.merged = Some(Merged {
        runs: runs_before,
        urls,
    });
    // the runs' own verdicts are not the merged run's (`bench merge --threshold` makes those)
    m.thresholds = Vec::new();
    Ok(m)
}

fn add<K: Ord + Clone>(a: &mut BTreeMap<K, u64>, b: &BTreeMap<K, u64>) {
    for (k, v) in b {
        *a.entry(k.clone()).or_default() += v;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::accounting::ErrorClass;
    use crate::accounting::Handshake;
    use crate::config::BenchArgs;
    use crate::stats::Stats;

    fn report(stats: &Stats, clients: usize) -> Report {
        let cfg = BenchArgs {
            url: Some("https://127.0.0.1:1/".into()),
            clients: Some(clients),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        crate::report::build(&Arc::new(cfg), stats, 2.0, 0.5, BTreeMap::new())
    }

    fn run(seed: u64, n: u64) -> Stats {
        let mut s = Stats::default();
        for i in 0..n {
            s.handshake(if i % 3 == 0 {
                Handshake::Full
            } else {
                Handshake::Resumed
            });
            s.status(200);
            s.transactions += 1;
            s.requests_expected += 1;
            for p in 0..4 {
                s.latency(p, Duration::from_micros(100 + (i * seed * 37) % 9000));
            }
            s.ended(Duration::from_millis(i * 7), true);
        }
        s.error(ErrorClass::Timeout);
        s
    }

    #[test]
    fn counts_add_and_percentiles_are_those_of_the_union() {
        let (a, b) = (run(3, 500), run(11, 800));
        let mut union = a.clone();
        union.merge(&b);
        let m = merge(&[report(&a, 4), report(&b, 6)]).unwrap();
        let direct = report(&union, 10);
        assert_eq!(m.handshakes.full, direct.handshakes.full);
        assert_eq!(m.handshakes.resumed, 1300 - direct.handshakes.full);
        assert_eq!(m.requests.ok, 1300);
        assert_eq!(m.requests.expected, 1300);
        assert_eq!(m.errors[&ErrorClass::Timeout], 2);
        assert_eq!(m.connections, 1300);
        assert_eq!(m.config.clients, 10);
        assert_eq!(m.merged.as_ref().unwrap().runs, 2);
        for p in PHASES {
            let (x, y) = (&m.latency_ms[p], &direct.latency_ms[p]);
            assert_eq!(
                (x.p50, x.p90, x.p99, x.p999, x.max, x.count),
                (y.p50, y.p90, y.p99, y.p999, y.max, y.count),
                "{p}"
            );
            assert_eq!(m.histograms[p].counts, direct.histograms[p].counts);
        }
        assert_eq!(m.timeline.completed, direct.timeline.completed);
        // a merge of merges counts its runs
        let mm = merge(&[m.clone(), report(&a, 1)]).unwrap();
        assert_eq!(mm.merged.unwrap().runs, 3);
        // and the JSON round-trips
        let back: Report = serde_json::from_slice(&serde_json::to_vec(&m).unwrap()).unwrap();
        assert_eq!(
            back.histograms["total"].counts,
            m.histograms["total"].counts
        );
    }

    #[test]
    fn unsent_and_request_latency_by_second_merge_exactly() {
        let (mut a, mut b) = (run(3, 50), run(5, 70));
        a.requests_unsent = 4;
        b.requests_unsent = 1;
        for i in 0..30u64 {
            a.request_latency(
                Duration::from_millis(i * 100),
                Duration::from_micros(500 + i),
            );
            b.request_latency(
                Duration::from_millis(i * 50),
                Duration::from_micros(900 + i),
            );
        }
        let mut union = a.clone();
        union.merge(&b);
        let m = merge(&[report(&a, 1), report(&b, 1)]).unwrap();
        let direct = report(&union, 2);
        assert_eq!(m.requests.unsent, 5);
        assert_eq!(m.latency_ms["request"].count, 60);
        assert_eq!(
            m.histograms["request"].counts,
            direct.histograms["request"].counts
        );
        assert_eq!(m.timeline.request_by_second.len(), 3);
        for (x, y) in m
            .timeline
            .request_by_second
            .iter()
            .zip(&direct.timeline.request_by_second)
        {
            assert_eq!(x.counts, y.counts);
        }
        // runs without request latencies (older versions) merge with runs that have them
        let mut old = report(&run(1, 10), 1);
        old.timeline.request_by_second.clear();
        old.histograms.remove("request");
        assert!(merge(&[old, report(&a, 1)]).is_ok());
    }

    #[test]
    fn refuses_what_would_not_add_up() {
        let a = report(&run(1, 10), 1);
        let mut b = a.clone();
        b.config.requests_per_conn = 2;
        assert!(merge(&[a.clone(), b]).is_err());
        let mut c = a.clone();
        c.histograms.remove("ttfb");
        assert!(merge(&[a.clone(), c]).is_err());
        assert!(merge(&[]).is_err());
    }
}
