//! The soak's report: one function per table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::account::{self, CheckTally, Outcome, Tally, Window};
use super::attacker;
use super::sample::{self, Span};
use super::schedule::{Fault, Plan, Side};
use super::{Counters, Slot, SoakRun};
use crate::row;
use crate::table::Table;

/// Every table of a run (any `failed` entry fails it).
pub(super) fn report(plan: &Plan, dir: &Path, o: SoakRun) -> Vec<Table> {
    let windows: Vec<Window> = o
        .windows
        .iter()
        .filter_map(|(_, w)| w.as_ref().ok().cloned())
        .collect();
    let tally = account::account(&o.requests, &windows);
    let checks = account::account_checks(&o.checks, &windows);
    vec![
        faults(&o, &windows),
        requests(&o, &tally),
        listeners(&o, &tally, &checks),
        attacks(&o),
        counters(&o),
        processes(plan, dir, &o),
    ]
}

/// Lines with "panicked at" in every log under `dir`: (file, count, first line).
fn panics(dir: &Path) -> Vec<(String, usize, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in rd.flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "log") {
                let text =
                    String::from_utf8_lossy(&std::fs::read(&p).unwrap_or_default()).into_owned();
                let hits: Vec<&str> = text.lines().filter(|l| l.contains("panicked at")).collect();
                if let Some(first) = hits.first() {
                    let name = p.strip_prefix(dir).unwrap_or(&p).display().to_string();
                    out.push((name, hits.len(), first.to_string()));
                }
            }
        }
    }
    out.sort();
    out
}

fn side_name(side: Side) -> &'static str {
    match side {
        Side::A => "A: dispatcher handoff + redis",
        Side::B => "B: haproxy + peers",
    }
}

fn join_counts(m: &BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "-".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Requests, per side: every failure explained by a fault on its path, or not.
fn requests(o: &SoakRun, tally: &BTreeMap<Side, Tally>) -> Table {
    let mut req = Table::new(
        "soak",
        "requests: every failure explained by a fault on its path, or not",
    )
    .column("side", "side")
    .column("sent", "sent")
    .column("ok", "ok")
    .column("failed", "failed")
    .column("explained", "explained")
    .column("unexplained", "unexplained")
    .column("full", "full (new)")
    .column("resumed", "resumed")
    .column("missed", "offered, got full")
    .column("server_full", "srv full")
    .column("server_resumed", "srv resumed");
    let mut total_unexplained = 0;
    for (side, t) in tally {
        let agents: Vec<&Slot> = o
            .watch
            .slots
            .iter()
            .filter(|s| s.name.starts_with(&format!("{side} agent")))
            .collect();
        let srv = agents.iter().fold(Counters::default(), |mut a, s| {
            a.add(&s.totals());
            a
        });
        let missed: u64 = t.misses.values().sum();
        req.push(row![
            ("side", side_name(*side)),
            ("sent", t.sent),
            ("ok", t.ok),
            ("failed", t.failed),
            ("explained", t.explained_total()),
            ("unexplained", t.unexplained_total()),
            ("full", t.full_new),
            ("resumed", t.resumed),
            ("missed", missed),
            ("server_full", srv.full),
            ("server_resumed", srv.resumed),
        ]);
        for (kind, errs) in &t.explained {
            req.note(format!(
                "{side}: {} failures explained by {kind}: {}",
                errs.values().sum::<u64>(),
                join_counts(errs)
            ));
        }
        if t.unexplained_total() > 0 {
            req.note(format!(
                "{side}: UNEXPLAINED failures: {}; first ones (start s, end s, error): {:?}",
                join_counts(&t.unexplained),
                t.unexplained_examples
            ));
            req.failed.push(format!(
                "side {side}: {} unexplained failures ({})",
                t.unexplained_total(),
                join_counts(&t.unexplained)
            ));
        }
        req.note(format!(
            "{side}: offered resumptions that came back full, by fault (within {} s after it): {}; \
             server-side extra full handshakes (srv full - client's new): {}",
            account::MISS_TAIL.as_secs(),
            join_counts(&t.misses),
            srv.full as i64 - t.full_new as i64
        ));
        if !t.stray_misses.is_empty() {
            req.note(format!(
                "{side}: resumptions lost outside every fault started at (s): {:.1?}",
                t.stray_misses
            ));
        }
        let skipped = o.skipped.get(side).copied().unwrap_or(0);
        if skipped > 0 {
            req.note(format!(
                "{side}: {skipped} ticks not sent: the client had 2000 requests open"
            ));
        }
        if t.ok == 0 {
            req.failed
                .push(format!("side {side}: no request succeeded"));
        }
        total_unexplained += t.unexplained_total();
    }
    for (side, t) in tally {
        if !t.attributed.is_empty() {
            req.note(format!(
                "{side}: failures tied to the process that served them: {}",
                join_counts(&t.attributed)
            ));
        }
    }
    req.note(format!("unexplained failures: {total_unexplained}"));
    req.note(format!(
        "attribution: a fault excuses only a request its process served: on B the agent \
         HAProxy's log names; on A the dispatcher (every request), or an agent within the \
         connections the dispatcher's counters put on it (open at the signal, plus routed to it \
         until noticed); and only at the time: an agent SIGKILL explains requests in flight at \
         the kill or started within {:.1} s after (health checks); a SIGSTOP those overlapping \
         the stop or the {:.1} s after; a dispatcher restart those in flight at the kill or \
         started before the new one was ready + {:.1} s; Redis and attacks explain no failure",
        account::DETECT.as_secs_f64(),
        account::DETECT.as_secs_f64(),
        account::RESTART_GRACE.as_secs_f64()
    ));
    let named = o
        .requests
        .iter()
        .filter(|r| r.side == Side::B && r.served_by.is_some())
        .count();
    let b_sent = o.requests.iter().filter(|r| r.side == Side::B).count();
    req.note(format!(
        "B: HAProxy's log named the agent of {named} of {b_sent} requests"
    ));
    req
}

/// The faults as they happened, and what each explains.
fn faults(o: &SoakRun, windows: &[Window]) -> Table {
    let mut faults = Table::new(
        "soak-faults",
        "faults as carried out (times from the start of the load)",
    )
    .column("at", "at s")
    .column("fault", "fault")
    .column("len", "planned s")
    .column("done", "done at s")
    .column("back", "back at s")
    .column("failures", "failures it explains")
    .column("misses", "misses it explains")
    .column("budget", "A agent: dispatcher's conns on it");
    let by = account::attribute(&o.requests, windows);
    let mut j = 0;
    for (e, w) in &o.windows {
        match w {
            Ok(w) => {
                let failures = by.iter().filter(|b| **b == Some(j)).count();
                j += 1;
                let misses = o
                    .requests
                    .iter()
                    .filter(|r| {
                        matches!(
                            r.outcome,
                            Outcome::Ok {
                                offered: true,
                                resumed: false
                            }
                        )
                    })
                    .filter(|r| {
                        windows
                            .iter()
                            .filter(|x| x.explains_miss(r))
                            .max_by_key(|x| x.at)
                            == Some(w)
                    })
                    .count();
                let mut r = row![
                    ("at", e.at.as_secs_f64()),
                    ("fault", e.fault.to_string()),
                    ("len", e.len.as_secs_f64()),
                    ("done", w.at.as_secs_f64()),
                    ("back", w.back.as_secs_f64()),
                    ("failures", failures),
                    ("misses", misses),
                ];
                if let Some(b) = w.budget {
                    r.insert("budget".into(), serde_json::json!(b));
                }
                faults.push(r);
            }
            Err(err) => {
                faults.push(row![
                    ("at", e.at.as_secs_f64()),
                    ("fault", e.fault.to_string()),
                    ("len", e.len.as_secs_f64()),
                ]);
                faults
                    .failed
                    .push(format!("{} could not be carried out: {err}", e.fault));
            }
        }
    }
    for (e, _) in &o.attacks {
        faults.push(row![
            ("at", e.at.as_secs_f64()),
            ("fault", e.fault.to_string()),
            ("len", e.len.as_secs_f64()),
            ("done", e.at.as_secs_f64()),
            ("back", e.end().as_secs_f64()),
            ("failures", 0),
            ("misses", 0),
        ]);
    }
    let kinds: BTreeSet<&str> = o
        .windows
        .iter()
        .filter(|(_, w)| w.is_ok())
        .map(|(e, _)| e.fault.kind())
        .chain(o.attacks.iter().map(|(e, _)| e.fault.kind()))
        .collect();
    faults.note(format!(
        "fault kinds carried out: {}",
        kinds.iter().copied().collect::<Vec<_>>().join(", ")
    ));
    faults
}

/// Who a listener's legitimate peer is, for the report; `None`: it has none.
fn legitimate_peer(listener: &str) -> Option<&'static str> {
    match listener.split(' ').next().unwrap_or(listener) {
        "dispatcher" => Some("the load of A"),
        "haproxy" => Some("the load of B"),
        "admin" => Some("GET /agents with the token"),
        "metrics" => Some("a scrape"),
        "tls" => Some("PROXY, TLS, GET /"),
        "link" if listener.contains(" A") => Some("the dispatcher's links up"),
        "peer" => Some("sessions from its peers"),
        // side B's agents have no dispatcher: nobody else opens their links
        _ => None,
    }
}

/// Per listener: what the attacker did to it, and what its legitimate peer saw meanwhile (a
/// check once a second, or the load's requests). Fails on a failure no fault on the
/// listener's process explains, a listener whose peer was never served, or one the attacker
/// never reached.
fn listeners(
    o: &SoakRun,
    tally: &BTreeMap<Side, Tally>,
    checks: &BTreeMap<String, CheckTally>,
) -> Table {
    let mut t = Table::new(
        "soak-listeners",
        "per listener: the attacker's flood, and its legitimate peer meanwhile",
    )
    .column("listener", "listener")
    .column("sent", "attack sends")
    .column("opened", "attack conns")
    .column("peak", "peak open")
    .column("closed", "closed by server")
    .column("refused", "refused")
    .column("peer", "legitimate peer")
    .column("ok", "ok")
    .column("excused", "failed, excused")
    .column("unexplained", "failed, unexplained")
    .column("verdict", "verdict");
    for target in &o.targets {
        let name = &target.name;
        let mut stats = attacker::Stats::default();
        let mut sent = BTreeSet::new();
        for (e, by) in &o.attacks {
            if let (Fault::Attack(kind), Some(s)) = (e.fault, by.get(name)) {
                stats.add(s);
                sent.insert(attacker::behaviour(kind, target.proto).name());
            }
        }
        let peer = legitimate_peer(name);
        let (ok, excused, unexplained, examples) = match name.as_str() {
            "dispatcher" | "haproxy" => {
                let side = if name == "dispatcher" {
                    Side::A
                } else {
                    Side::B
                };
                let s = tally.get(&side).cloned().unwrap_or_default();
                let examples = format!("{:?}", s.unexplained_examples);
                (s.ok, s.explained_total(), s.unexplained_total(), examples)
            }
            _ => {
                let c = checks.get(name).cloned().unwrap_or_default();
                let examples = format!("{:?}", c.examples);
                (c.ok, c.excused, c.unexplained_total(), examples)
            }
        };
        let mut verdict = Vec::new();
        if unexplained > 0 {
            verdict.push(format!("{unexplained} unexplained failures: {examples}"));
        }
        if peer.is_some() && ok == 0 {
            verdict.push("its legitimate peer was never served".to_string());
        }
        if !o.attacks.is_empty() && stats.opened == 0 {
            verdict.push("the attacker never got a connection".to_string());
        }
        for v in &verdict {
            t.failed.push(format!("{name}: {v}"));
        }
        t.push(row![
            ("listener", name.clone()),
            ("sent", sent.into_iter().collect::<Vec<_>>().join(", ")),
            ("opened", stats.opened),
            ("peak", stats.peak_open),
            ("closed", stats.closed_by_server),
            ("refused", stats.refused),
            ("peer", peer.unwrap_or("-")),
            ("ok", ok),
            ("excused", excused),
            ("unexplained", unexplained),
            (
                "verdict",
                if verdict.is_empty() {
                    "ok".to_string()
                } else {
                    verdict.join("; ")
                }
            ),
        ]);
    }
    t.note(format!(
        "checks once a second, each within {} s; a failure is excused only by a kill or stop of \
         a process it depends on (the listener's own; for links also the dispatcher; for \
         replication every agent of B) up to {} s after it was back",
        super::probe::CHECK_TIMEOUT.as_secs(),
        account::CHECK_GRACE.as_secs()
    ));
    t.note(
        "`link B*`: side B's agents have no dispatcher, so no legitimate peer opens their links",
    );
    t
}

/// The attacker, per attack and listener kind: what the servers did.
fn attacks(o: &SoakRun) -> Table {
    let mut att = Table::new(
        "soak-attacks",
        "the attacker, per listener kind: what the servers did",
    )
    .column("attack", "attack")
    .column("listener", "listener")
    .column("opened", "opened")
    .column("refused", "refused")
    .column("closed", "closed by server")
    .column("held", "open at end")
    .column("longest", "longest closed s");
    for (e, stats) in &o.attacks {
        let Fault::Attack(kind) = e.fault else {
            continue;
        };
        let mut by: BTreeMap<String, attacker::Stats> = BTreeMap::new();
        for (target, s) in stats {
            let k = target.split(' ').next().unwrap_or(target).to_string();
            by.entry(k).or_default().add(s);
        }
        for (listener, s) in by {
            att.push(row![
                ("attack", kind.name()),
                ("listener", listener),
                ("opened", s.opened),
                ("refused", s.refused),
                ("closed", s.closed_by_server),
                ("held", s.open_at_end),
                ("longest", s.longest_closed_ms as f64 / 1e3),
            ]);
        }
    }
    att.note(format!(
        "{} connections per listener at a time ({} per metrics endpoint; {} listeners), each \
         replaced when the server closes it, from {} sources of 127.0.0.0/8, only to 127.0.0.0/8",
        attacker::FLOOD,
        attacker::METRICS_FLOOD,
        o.targets.len(),
        attacker::SOURCES.len(),
    ));
    att
}

/// The servers' own counters, summed over each side's processes and their restarts.
fn counters(o: &SoakRun) -> Table {
    let mut counters = Table::new(
        "soak-counters",
        "the servers' own counters over the run (agents and dispatcher, summed over restarts)",
    )
    .column("side", "side")
    .column("counter", "counter")
    .column("value", "value");
    for side in [Side::A, Side::B] {
        let mut sum = Counters::default();
        for s in &o.watch.slots {
            if s.name.starts_with(&side.to_string()) {
                sum.add(&s.totals());
            }
        }
        for (k, v) in sum.other.iter().filter(|(_, v)| **v > 0) {
            counters.push(row![
                ("side", side.to_string()),
                ("counter", k.clone()),
                ("value", *v)
            ]);
        }
    }
    counters.note(
        "each process is scraped once a second and just before it is killed; what it counted \
         in the last moment before a kill is not seen",
    );
    counters
}

/// Descriptors and RSS of every process, and panics in the logs.
fn processes(plan: &Plan, dir: &Path, o: &SoakRun) -> Table {
    let panics = panics(dir);
    let mut procs = Table::new(
        "soak-processes",
        "descriptors and RSS: after the warm-up, peak, and after the quiet period",
    )
    .column("process", "process")
    .column("pids", "pids")
    .column("fds_start", "fds start")
    .column("fds_peak", "peak")
    .column("fds_end", "end")
    .column("rss_start", "RSS MiB start")
    .column("rss_peak", "peak")
    .column("rss_end", "end")
    .column("verdict", "verdict");
    for s in &o.watch.slots {
        match Span::of(&s.samples, o.warmup) {
            Some(sp) => {
                let growth = sp.growth();
                procs.push(row![
                    ("process", s.name.clone()),
                    ("pids", sp.pids),
                    ("fds_start", sp.fds_start),
                    ("fds_peak", sp.fds_peak),
                    ("fds_end", sp.fds_end),
                    ("rss_start", sample::mib(sp.rss_start)),
                    ("rss_peak", sample::mib(sp.rss_peak)),
                    ("rss_end", sample::mib(sp.rss_end)),
                    ("verdict", growth.clone().unwrap_or_else(|| "ok".into())),
                ]);
                if let Some(g) = growth {
                    procs.failed.push(format!("{} grew: {g}", s.name));
                }
            }
            None => {
                procs.push(row![("process", s.name.clone()), ("verdict", "no samples")]);
                procs.failed.push(format!("{}: no samples", s.name));
            }
        }
    }
    procs.note(format!(
        "tolerance: end <= start + {} fds, RSS end <= start + max({:.0}%, {} MiB); start is the \
         first sample after the {} s warm-up, end is 3 s after the load stopped ({} s of quiet \
         before that)",
        sample::FD_TOLERANCE,
        sample::RSS_TOLERANCE * 100.0,
        sample::RSS_TOLERANCE_BYTES >> 20,
        o.warmup.as_secs(),
        (plan.duration - plan.faults_end).as_secs()
    ));
    if panics.is_empty() {
        procs.note("panics in logs: 0");
    } else {
        for (file, n, first) in &panics {
            procs.note(format!("PANIC in {file} ({n}): {first}"));
            procs.failed.push(format!("{n} panics in {file}"));
        }
    }
    procs
}
