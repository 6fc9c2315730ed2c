//! TLS 1.3 0-RTT (`--early-data BYTES`): when early data is accepted, and what HTTP does with a
//! request that came in it (RFC 8446 section 8, RFC 8470). Sans-IO: every decision here is a
//! plain function of its inputs; `early_tls.rs` is the tokio shell that reads the ClientHello,
//! takes the ticket and drives rustls.
//!
//! Early data is accepted only when nobody else in the cluster can accept the same flight:
//! the ticket must be a stateful TLS 1.3 ticket that this agent has just removed from the one
//! place it lived (a Redis GETDEL, or the only agent's memory), and its age as the client
//! reports it must match the age the server knows (RFC 8446 section 8.3). Anything else (the
//! peers store, whose removals reach the other agents only after the fact; stateless tickets;
//! Redis down or slow; a ticket already taken) refuses the early data and the handshake goes
//! on as 1-RTT: rustls tells the client, which sends its request again after the handshake.

use std::sync::atomic::{AtomicBool, Ordering};

use http::Method;

use crate::config::StoreKind;
use baton_session::Taken;

/// Largest difference allowed between the ticket age the client reports and the age the
/// server computes (RFC 8446 section 8.3). The server knows the ticket's creation to the
/// second (rustls stores seconds), so the window must cover that second, the round trip the
/// ticket took to reach the client, and clock drift; 10 s is the order of magnitude RFC 8446
/// section 8.3 suggests for Internet clients.
pub const AGE_TOLERANCE_MS: u64 = 10_000;

/// What the HTTP layer of a connection with accepted early data asks about it.
#[derive(Debug)]
pub struct EarlyState {
    handshaking: AtomicBool,
    methods: Vec<Method>,
}

impl EarlyState {
    /// A connection whose handshake has begun, serving `methods` in early data anyway.
    pub fn new(methods: Vec<Method>) -> Self {
        EarlyState {
            handshaking: AtomicBool::new(true),
            methods,
        }
    }

    /// The client's Finished has arrived: what is read from now on came after the handshake.
    pub fn handshake_done(&self) {
        self.handshaking.store(false, Ordering::Release);
    }

    /// The client's Finished has not arrived yet: what is read now came in early data.
    pub fn handshaking(&self) -> bool {
        self.handshaking.load(Ordering::Acquire)
    }

    /// Unsafe methods served in early data anyway (`--early-data-methods`).
    pub fn allowed_methods(&self) -> &[Method] {
        &self.methods
    }
}

/// Why a configuration cannot accept early data at all (nothing is advertised in tickets).
pub fn configuration(
    early_data: u32,
    store: &StoreKind,
    stateless_tickets: bool,
    session_cache: usize,
    client_auth: bool,
) -> Result<u32, &'static str> {
    if early_data == 0 {
        return Err("--early-data is 0");
    }
    if stateless_tickets {
        // rustls: "early_data with stateless resumption is not allowed" — a sealed ticket can
        // be opened by every agent any number of times.
        return Err("stateless tickets cannot be single-use (run with --tickets false)");
    }
    if session_cache == 0 {
        return Err("no session cache (--session-cache-size 0): no stateful tickets");
    }
    if client_auth {
        return Err("client certificates are verified only after early data (--client-ca)");
    }
    match store {
        StoreKind::Memory | StoreKind::Redis { .. } => Ok(early_data),
        StoreKind::Peers { .. } => Err(
            "the peers store removes a taken ticket from the other agents only after the fact, \
             so two agents could both accept the same early data (use --store redis)",
        ),
    }
}

/// What rustls keeps in an encoded TLS 1.3 session that the age check needs: its last 12
/// bytes are the creation time (u64 seconds since the epoch) and the ticket's `age_add` (u32),
/// both big-endian (`ServerSessionValue` in rustls 0.23; a unit test in `early_tls.rs` reads
/// them back from a real handshake, so a change of format fails there, not in production).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionTimes {
    pub created_unix_s: u64,
    pub age_add: u32,
}

pub fn session_times(encoded: &[u8]) -> Option<SessionTimes> {
    let tail = encoded.get(encoded.len().checked_sub(12)?..)?;
    Some(SessionTimes {
        created_unix_s: u64::from_be_bytes(tail[..8].try_into().ok()?),
        age_add: u32::from_be_bytes(tail[8..].try_into().ok()?),
    })
}

/// RFC 8446 section 8.3: the client's ticket age (`obfuscated_ticket_age - ticket_age_add`
/// mod 2^32) must be within `tolerance_ms` of the time since the ticket was issued. A flight
/// recorded and replayed later fails it even where the ticket would still be there.
pub fn age_ok(
    obfuscated_age: u32,
    times: SessionTimes,
    now_unix_ms: u64,
    tolerance_ms: u64,
) -> bool {
    let client_age_ms = u64::from(obfuscated_age.wrapping_sub(times.age_add));
    let Some(server_age_ms) = now_unix_ms.checked_sub(times.created_unix_s.saturating_mul(1000))
    else {
        return false; // issued in the future: a clock went backwards, or a forged value
    };
    // The creation time is known to the second (rounded down), so the server's age may be up
    // to a second more than the true one.
    let lower = server_age_ms.saturating_sub(1000 + tolerance_ms);
    let upper = server_age_ms.saturating_add(tolerance_ms);
    (lower..=upper).contains(&client_age_ms)
}

/// Why early data offered in a ClientHello was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// This agent gives no single-use guarantee: early data off or impossible in this
    /// configuration, a connection that may migrate, no PSK, or rustls turned it down
    /// (suite or ALPN differ from the ticket's).
    NoGuarantee,
    /// The ticket was found only in a local copy, the shared store being down or slow.
    StoreUnavailable,
    /// The ticket had been taken already (a replay, or a second use).
    Replay,
    /// The ticket's age is outside the window: a flight recorded and replayed later.
    AgeWindow,
}

impl Refusal {
    /// The `result` label of `baton_early_data_total`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Replay | Refusal::AgeWindow => "replay_refused",
            Refusal::NoGuarantee | Refusal::StoreUnavailable => "rejected",
        }
    }
}

/// Whether early data may be accepted with the ticket `taken` from the store for it.
pub fn judge(taken: &Taken, obfuscated_age: u32, now_unix_ms: u64) -> Result<(), Refusal> {
    match taken {
        Taken::Exclusive(value) => match session_times(value) {
            Some(t) if age_ok(obfuscated_age, t, now_unix_ms, AGE_TOLERANCE_MS) => Ok(()),
            Some(_) => Err(Refusal::AgeWindow),
            None => Err(Refusal::NoGuarantee),
        },
        Taken::Local(_) | Taken::Unavailable => Err(Refusal::StoreUnavailable),
        Taken::Reused(_) | Taken::Absent => Err(Refusal::Replay),
    }
}

/// RFC 9110 section 9.2.1: methods whose requests change nothing, so a replayed copy is
/// harmless (beyond the work).
pub fn is_safe(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// RFC 8470 section 5.2: answer `425 Too Early` to a request received in early data unless its
/// method is safe or `--early-data-methods` allows it; the client sends it again after the
/// handshake, when it can no longer be a replay.
pub fn too_early(method: &Method, in_early_data: bool, allowed: &[Method]) -> bool {
    in_early_data && !is_safe(method) && !allowed.contains(method)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn value(created_unix_s: u64, age_add: u32) -> Vec<u8> {
        let mut v = b"rustls session fields".to_vec();
        v.extend_from_slice(&created_unix_s.to_be_bytes());
        v.extend_from_slice(&age_add.to_be_bytes());
        v
    }

    #[test]
    fn reads_the_times_from_the_tail() {
        let t = session_times(&value(1_700_000_000, 0xdead_beef)).unwrap();
        assert_eq!(t.created_unix_s, 1_700_000_000);
        assert_eq!(t.age_add, 0xdead_beef);
        assert_eq!(session_times(&[0; 11]), None);
    }

    proptest! {
        /// An honest client (its age = the true age, minus up to a second of flight, plus a
        /// little drift) is inside the window, whatever age_add and whenever in the second the
        /// ticket was issued.
        #[test]
        fn honest_ages_pass(
            issued_ms in 1_600_000_000_000u64..1_900_000_000_000,
            true_age_ms in 0u64..7 * 86_400_000,
            flight_ms in 0u64..1000,
            age_add: u32,
        ) {
            let times = SessionTimes { created_unix_s: issued_ms / 1000, age_add };
            let now = issued_ms + true_age_ms;
            let client_age = true_age_ms.saturating_sub(flight_ms);
            let obfuscated = (client_age as u32).wrapping_add(age_add);
            prop_assert!(age_ok(obfuscated, times, now, AGE_TOLERANCE_MS));
        }

        /// A flight replayed later than the tolerance (its reported age frozen at capture)
        /// fails, as does a client claiming a ticket older than it is.
        #[test]
        fn late_replays_fail(
            issued_ms in 1_600_000_000_000u64..1_900_000_000_000,
            age_at_capture_ms in 0u64..86_400_000,
            delay_ms in AGE_TOLERANCE_MS + 1001..30 * 86_400_000,
            age_add: u32,
        ) {
            let times = SessionTimes { created_unix_s: issued_ms / 1000, age_add };
            let obfuscated = (age_at_capture_ms as u32).wrapping_add(age_add);
            let now = issued_ms + age_at_capture_ms + delay_ms;
            prop_assert!(!age_ok(obfuscated, times, now, AGE_TOLERANCE_MS));
            // claiming to be older than the ticket by more than the tolerance
            let claimed = ((age_at_capture_ms + delay_ms) as u32).wrapping_add(age_add);
            prop_assert!(!age_ok(claimed, times, issued_ms + age_at_capture_ms, AGE_TOLERANCE_MS));
        }

        /// Only a ticket this agent alone removed (and of the right age) lets early data in.
        #[test]
        fn only_exclusive_fresh_takes_accept(kind in 0usize..5, age_add: u32, age_ms in 0u64..60_000) {
            let issued_ms = 1_800_000_000_000u64;
            let v = value(issued_ms / 1000, age_add);
            let taken = match kind {
                0 => Taken::Exclusive(v),
                1 => Taken::Local(v),
                2 => Taken::Reused(v),
                3 => Taken::Absent,
                _ => Taken::Unavailable,
            };
            let obfuscated = (age_ms as u32).wrapping_add(age_add);
            let verdict = judge(&taken, obfuscated, issued_ms + age_ms);
            // the client's age is the server's exactly: only the kind of take decides
            prop_assert_eq!(verdict.is_ok(), kind == 0);
            match kind {
                1 | 4 => prop_assert_eq!(verdict, Err(Refusal::StoreUnavailable)),
                2 | 3 => prop_assert_eq!(verdict, Err(Refusal::Replay)),
                _ => {}
            }
        }
    }

    #[test]
    fn a_stale_exclusive_take_is_a_replay() {
        let issued_ms = 1_800_000_000_000u64;
        let taken = Taken::Exclusive(value(issued_ms / 1000, 5));
        // the client says the ticket is 1 s old; the server knows it is a minute old
        let verdict = judge(&taken, 1000u32.wrapping_add(5), issued_ms + 60_000);
        assert_eq!(verdict, Err(Refusal::AgeWindow));
        assert_eq!(Refusal::AgeWindow.label(), "replay_refused");
        assert_eq!(Refusal::StoreUnavailable.label(), "rejected");
    }

    #[test]
    fn too_early_only_for_unsafe_methods_in_early_data() {
        let post = Method::POST;
        assert!(too_early(&post, true, &[]));
        assert!(!too_early(&post, false, &[]), "after the handshake: served");
        assert!(
            !too_early(&post, true, &[Method::POST]),
            "allowed by configuration"
        );
        for safe in [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE] {
            assert!(!too_early(&safe, true, &[]), "{safe}");
        }
        for unsafe_ in [Method::PUT, Method::DELETE, Method::PATCH, Method::CONNECT] {
            assert!(too_early(&unsafe_, true, &[Method::POST]), "{unsafe_}");
        }
    }

    #[test]
    fn configurations() {
        let redis = StoreKind::Redis {
            url: "redis://127.0.0.1/".into(),
        };
        assert_eq!(configuration(16384, &redis, false, 100, false), Ok(16384));
        assert_eq!(
            configuration(16384, &StoreKind::Memory, false, 100, false),
            Ok(16384)
        );
        assert!(configuration(0, &redis, false, 100, false).is_err());
        assert!(configuration(16384, &redis, true, 100, false).is_err());
        assert!(configuration(16384, &redis, false, 0, false).is_err());
        assert!(configuration(16384, &redis, false, 100, true).is_err());
        let peers = StoreKind::Peers {
            listen: "127.0.0.1:1".parse().unwrap(),
            peers: vec![],
            allow: vec![],
        };
        assert!(configuration(16384, &peers, false, 100, false).is_err());
    }
}
