//! Migration under faults, in memory: each named case is one schedule; the property test runs
//! random schedules, fault points and client behaviour against the protocol's invariants.

use std::time::Duration;

use baton_migrate::{Outcome, RefuseReason};
use proptest::prelude::*;

use crate::migration::harness::{run, ClientStep, Fault, Report, Schedule};

const MS: Duration = Duration::from_millis(1);

fn summary(r: &Report) -> String {
    format!(
        "outcome {:?}, sent {} received {}, executed by A {} by H {}, extracted {}, \
         records from the extracted keys by A {} by H {}, client error {:?}, client closed {}, \
         errors {:?}, {} events in {:?}, partial record at the cut {}, after the cut at A {}",
        r.outcome,
        r.sent.len(),
        r.received.len(),
        r.executed_a.len(),
        r.executed_h.len(),
        r.extracted,
        r.layer_records_a,
        r.layer_records_h,
        r.client_error,
        r.client_closed,
        r.errors,
        r.events,
        r.elapsed,
        r.partial_at_cut,
        r.after_cut_a,
    )
}

/// What must hold whatever the schedule and the fault. Returns the run's summary.
fn check(s: &Schedule, r: &Report) -> Result<(), String> {
    let fail = |what: &str| Err(format!("{what}\n  {s:?}\n  {}", summary(r)));
    // Both agents start from the extracted key and sequence number: if both sent a record,
    // two records went out under one nonce.
    if r.layer_records_a > 0 && r.layer_records_h > 0 {
        return fail("both agents encrypted under the extracted keys");
    }
    if !r.extracted && r.layer_records_h > 0 {
        return fail("the home agent encrypted without an extraction");
    }
    // Every client byte acted on by exactly one agent, once, in order.
    if !r.executed_a.is_empty() && !r.executed_h.is_empty() {
        return fail("both agents acted on the client's bytes");
    }
    let executed = if r.executed_a.is_empty() {
        &r.executed_h
    } else {
        &r.executed_a
    };
    if !r.sent.starts_with(executed) {
        return fail("an agent acted on bytes the client did not send, or out of order");
    }
    if !executed.starts_with(&r.received) {
        return fail("the client got back what no agent acted on");
    }
    if let Some(e) = &r.client_error {
        return fail(&format!("the client saw a TLS error: {e}"));
    }
    // Nothing lost unless a process that held the connection died.
    if !s.fault.may_lose_connection() && (r.received != r.sent || r.client_closed) {
        return fail("the client lost data or its connection");
    }
    let never_migrates = matches!(
        s.fault,
        Fault::HomeDead
            | Fault::HomeWrongKey
            | Fault::HomeRestarted
            | Fault::HomeHung(None)
            | Fault::SealFails
    );
    if never_migrates && r.outcome == Some(Outcome::Migrated) {
        return fail("migrated to a home agent that could not take it");
    }
    Ok(())
}

fn run_checked(s: &Schedule) -> Report {
    let r = run(s);
    if let Err(e) = check(s, &r) {
        panic!("{e}");
    }
    r
}

fn requests(n: usize, pause: Duration, len: usize) -> Vec<(Duration, ClientStep)> {
    (0..n).map(|_| (pause, ClientStep::Send(len))).collect()
}

#[test]
fn migrates_tls13_and_tls12() {
    for tls13 in [true, false] {
        let s = Schedule::new(tls13, Fault::None, requests(3, 2 * MS, 700));
        let r = run_checked(&s);
        assert_eq!(r.outcome, Some(Outcome::Migrated), "{}", summary(&r));
        assert_eq!(r.executed_h, r.sent);
        assert!(r.layer_records_h > 0 && r.layer_records_a == 0);
    }
}

#[test]
fn a_request_riding_with_finished_and_longer_than_one_read() {
    // rustls reads the link in 4 KiB pieces while the handshake runs: the handshake ends with
    // part of this record inside rustls and the rest still to come.
    let s = Schedule::new(
        true,
        Fault::None,
        vec![(Duration::ZERO, ClientStep::Send(10_000))],
    );
    let r = run_checked(&s);
    assert_eq!(r.outcome, Some(Outcome::Migrated), "{}", summary(&r));
    assert_eq!(r.executed_h, r.sent);
    assert!(
        r.partial_at_cut,
        "the cut falls before a record rustls read part of: {}",
        summary(&r)
    );
}

#[test]
fn client_bytes_after_the_cut_reach_the_home_agent_not_the_handshake_agent() {
    // The second request leaves the client after its Finished and reaches the dispatcher
    // while the handshake agent's Switch is on its way: the dispatcher forwards it to the
    // handshake agent (it has not seen the cut), which discards it, and the home agent gets
    // it from the dispatcher's copy. (TLS 1.3 only: in TLS 1.2 the client writes only once
    // the server's Finished, sent with the Switch, has reached it.)
    {
        let tls13 = true;
        let steps = vec![
            (Duration::ZERO, ClientStep::Send(300)),
            (Duration::from_micros(50), ClientStep::Send(400)),
            (Duration::from_micros(50), ClientStep::Send(5_000)),
        ];
        let r = run_checked(&Schedule::new(tls13, Fault::None, steps));
        assert_eq!(r.outcome, Some(Outcome::Migrated), "{}", summary(&r));
        assert_eq!(r.executed_h, r.sent);
        assert!(r.after_cut_a > 0, "{}", summary(&r));
    }
}

#[test]
fn an_object_that_cannot_be_sealed_is_served_here_from_the_cut() {
    for tls13 in [true, false] {
        let steps = vec![
            (Duration::ZERO, ClientStep::Send(10_000)),
            (MS, ClientStep::Send(300)),
        ];
        let r = run_checked(&Schedule::new(tls13, Fault::SealFails, steps));
        assert_eq!(r.outcome, Some(Outcome::Aborted), "{}", summary(&r));
        assert_eq!(r.executed_a, r.sent);
        assert!(r.layer_records_a > 0 && r.layer_records_h == 0);
    }
}

#[test]
fn home_dead_falls_back() {
    let r = run_checked(&Schedule::new(true, Fault::HomeDead, requests(2, MS, 300)));
    assert_eq!(r.outcome, Some(Outcome::FellBack(None)), "{}", summary(&r));
    assert_eq!(r.executed_a, r.sent);
}

#[test]
fn home_hung_falls_back_at_the_timeout() {
    let r = run_checked(&Schedule::new(
        true,
        Fault::HomeHung(None),
        requests(2, MS, 300),
    ));
    assert_eq!(r.outcome, Some(Outcome::FellBack(None)), "{}", summary(&r));
    assert_eq!(r.layer_records_h, 0);
    assert!(r.elapsed >= Duration::from_millis(50), "{}", summary(&r));
}

#[test]
fn home_stopped_past_the_timeout_then_continued_acts_on_nothing() {
    for stop in [60, 100, 200] {
        let fault = Fault::HomeHung(Some(Duration::from_millis(stop)));
        let r = run_checked(&Schedule::new(true, fault, requests(3, 20 * MS, 300)));
        assert_eq!(r.outcome, Some(Outcome::FellBack(None)), "{}", summary(&r));
        assert!(r.executed_h.is_empty() && r.layer_records_h == 0);
        assert_eq!(r.executed_a, r.sent);
    }
}

#[test]
fn home_refusing_falls_back_with_its_reason() {
    for fault in [Fault::HomeWrongKey, Fault::HomeRestarted] {
        let r = run_checked(&Schedule::new(false, fault, requests(2, MS, 300)));
        let reason = match fault {
            Fault::HomeWrongKey => RefuseReason::Seal,
            _ => RefuseReason::Expired,
        };
        assert_eq!(
            r.outcome,
            Some(Outcome::FellBack(Some(reason))),
            "{}",
            summary(&r)
        );
        assert_eq!(r.executed_a, r.sent);
    }
}

#[test]
fn home_accepting_after_the_timeout_is_aborted() {
    let fault = Fault::HomeLate(Duration::from_millis(80));
    let r = run_checked(&Schedule::new(true, fault, requests(3, 10 * MS, 300)));
    assert_eq!(r.outcome, Some(Outcome::FellBack(None)), "{}", summary(&r));
    assert!(r.executed_h.is_empty() && r.layer_records_h == 0);
}

#[test]
fn home_crashing_between_ready_and_commit_loses_the_connection_only() {
    let r = run_checked(&Schedule::new(
        true,
        Fault::HomeCrashAfterReady,
        requests(2, MS, 300),
    ));
    assert_eq!(r.outcome, Some(Outcome::Migrated), "{}", summary(&r));
    assert!(r.client_closed, "{}", summary(&r));
    assert!(r.executed_a.is_empty() && r.layer_records_a == 0);
}

#[test]
fn handshake_agent_crashing_after_switch_loses_the_connection_only() {
    let r = run_checked(&Schedule::new(
        true,
        Fault::AgentCrashAfterSwitch,
        requests(2, MS, 300),
    ));
    assert!(r.client_closed, "{}", summary(&r));
    assert_eq!(r.layer_records_h, 0);
}

#[test]
fn client_key_update_at_the_cut() {
    let ku = |d: Duration| (d, ClientStep::KeyUpdate);
    // before the cut (read with the Finished): rustls at the handshake agent answers it, so
    // the session stays there
    let early = vec![
        (Duration::ZERO, ClientStep::Send(50)),
        ku(Duration::ZERO),
        (Duration::ZERO, ClientStep::Send(50)),
    ];
    let r = run_checked(&Schedule::new(true, Fault::None, early));
    assert_eq!(r.outcome, Some(Outcome::Aborted), "{}", summary(&r));
    // after the cut: the home agent's record layer takes it
    let late = vec![
        (Duration::ZERO, ClientStep::Send(50)),
        ku(3 * MS),
        (MS, ClientStep::Send(50)),
        ku(MS),
        (MS, ClientStep::Send(50)),
    ];
    let r = run_checked(&Schedule::new(true, Fault::None, late));
    assert_eq!(r.outcome, Some(Outcome::Migrated), "{}", summary(&r));
    assert_eq!(r.executed_h, r.sent);
}

#[test]
fn more_plaintext_than_the_cap_keeps_the_connection_here() {
    // The handshake agent carries only what rustls read with the Finished (a few KiB at
    // most); a small cap stands in for a large read.
    for tls13 in [true, false] {
        let mut s = Schedule::new(
            tls13,
            Fault::None,
            vec![
                (Duration::ZERO, ClientStep::Send(3_000)),
                (MS, ClientStep::Send(500)),
            ],
        );
        s.cap = 1_000;
        let r = run_checked(&s);
        let expect = match tls13 {
            true => Outcome::Aborted,
            // the request comes after the server's Finished: nothing to carry
            false => Outcome::Migrated,
        };
        assert_eq!(r.outcome, Some(expect), "{}", summary(&r));
        assert!(!r.extracted || !tls13);
    }
}

#[test]
fn a_large_pipelined_upload_migrates_past_the_cut() {
    // Far more than a session object carries, sent with the Finished: the handshake agent
    // cuts after what rustls read, and the home agent gets the rest from the dispatcher.
    let s = Schedule::new(
        true,
        Fault::None,
        vec![(Duration::ZERO, ClientStep::Send(40_000))],
    );
    let r = run_checked(&s);
    assert_eq!(r.outcome, Some(Outcome::Migrated), "{}", summary(&r));
    assert_eq!(r.executed_h, r.sent);
}

fn fault() -> impl Strategy<Value = Fault> {
    let ms = Duration::from_millis;
    prop_oneof![
        4 => Just(Fault::None),
        1 => Just(Fault::HomeDead),
        1 => proptest::option::of(0u64..200).prop_map(move |d| Fault::HomeHung(d.map(ms))),
        1 => Just(Fault::HomeWrongKey),
        1 => Just(Fault::HomeRestarted),
        1 => (0u64..150).prop_map(move |d| Fault::HomeLate(ms(d))),
        1 => Just(Fault::HomeCrashAfterReady),
        1 => Just(Fault::AgentCrashAfterSwitch),
        1 => Just(Fault::SealFails),
    ]
}

fn step() -> impl Strategy<Value = (Duration, ClientStep)> {
    let pause = prop_oneof![Just(0u64), 0u64..5_000].prop_map(Duration::from_micros);
    let step = prop_oneof![
        4 => (1usize..9_000).prop_map(ClientStep::Send),
        1 => Just(ClientStep::KeyUpdate),
    ];
    (pause, step)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Whatever the message delays, the fault and when the client writes or updates its keys:
    /// every client byte reaches exactly one agent, in order, and no two agents ever encrypt
    /// under the same key and sequence number.
    #[test]
    fn random_schedules_keep_the_invariants(
        tls13 in any::<bool>(),
        fault in fault(),
        client in proptest::collection::vec(step(), 0..7),
        delays in proptest::collection::vec(0u64..3_000, 1..12),
    ) {
        let s = Schedule {
            tls13,
            fault,
            client,
            delays: delays.into_iter().map(Duration::from_micros).collect(),
            timeouts: baton_migrate::Timeouts::new(Duration::from_millis(50)),
            cap: baton_session::migration::MAX_CARRIED_PLAINTEXT,
        };
        let r = run(&s);
        if let Err(e) = check(&s, &r) {
            return Err(TestCaseError::fail(e));
        }
    }
}
