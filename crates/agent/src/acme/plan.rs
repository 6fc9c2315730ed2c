//! The ACME decisions, as plain functions of what an agent knows: who orders a name, when a
//! certificate is renewed, and how long to wait after a failed attempt. No clock, no store,
//! no network: the caller passes times in, so every rule is tested here.

use std::time::{Duration, SystemTime};

/// How long without a sign of life before an agent counts as gone (for the order rule).
pub const ALIVE_FOR: Duration = Duration::from_secs(10);

/// The first wait after a failure, doubled by each further failure up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(2);
pub const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// The longest a CA's Retry-After is followed: a longer one (a mistake, or days) is cut to this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);
/// The wait after a rate-limit error that names no time (the CAs' windows are hours long).
pub const RATE_LIMITED_WAIT: Duration = Duration::from_secs(3600);

/// Whether agent `me` is the one that orders: the lowest agent id among those alive. Every
/// agent computes the same answer from the same heartbeats, so one orders at a time; an agent
/// that just started (within `settling` of its start) orders nothing: it has not heard its
/// peers yet, nor read a certificate another may already have issued.
pub fn orders(me: u16, alive: &[u16], since_start: Duration, settling: Duration) -> bool {
    since_start >= settling && alive.iter().all(|&other| other >= me)
}

/// Whether an order in flight elsewhere stands in the way of this agent's (`me`) ordering the
/// same certificate: a claim (the id of the agent ordering it, as posted) from an agent still
/// alive. Leadership can pass back to a lower id (an agent restarted) while a higher one is
/// mid-order: the newcomer waits for that order instead of starting a second one. A claim of
/// `me`'s own is an order this agent left when it stopped: it is ordered again.
pub fn claimed_elsewhere(me: u16, claimers: &[u16], alive: &[u16]) -> bool {
    claimers.iter().any(|c| *c != me && alive.contains(c))
}

/// The agents alive at `now`: those whose last heartbeat (agent id, unix time it was sent) is
/// newer than [`ALIVE_FOR`]. A heartbeat from the future (clocks apart) counts as alive.
pub fn alive(heartbeats: &[(u16, SystemTime)], now: SystemTime) -> Vec<u16> {
    heartbeats
        .iter()
        .filter(|(_, at)| now.duration_since(*at).map_or(true, |age| age < ALIVE_FOR))
        .map(|(id, _)| *id)
        .collect()
}

/// When a certificate valid from `not_before` to `not_after` is renewed: at two thirds of its
/// lifetime, earlier by up to a twentieth of the lifetime (`jitter` in [0, 1)), so that
/// certificates issued together are not all renewed in the same second.
pub fn renew_at(not_before: SystemTime, not_after: SystemTime, jitter: f64) -> SystemTime {
    let lifetime = not_after
        .duration_since(not_before)
        .unwrap_or(Duration::ZERO);
    let jitter = jitter.clamp(0.0, 1.0);
    let early = lifetime.mul_f64(jitter / 20.0);
    not_before + lifetime * 2 / 3 - early
}

/// When to renew a certificate valid from `not_before` to `not_after` within the window a CA
/// suggests (RFC 9773): a time picked uniformly (`pick` in [0, 1)) between its start and its
/// end, so that a fleet renewing the same day spreads over the window. A window already over,
/// or inverted, says: now. Never later than three quarters of the lifetime: a window that
/// runs to the certificate's end would leave no time to retry a failed order.
pub fn ari_renew_at(
    (start, end): (SystemTime, SystemTime),
    (not_before, not_after): (SystemTime, SystemTime),
    pick: f64,
    now: SystemTime,
) -> SystemTime {
    let lifetime = not_after
        .duration_since(not_before)
        .unwrap_or(Duration::ZERO);
    let latest = not_before + lifetime * 3 / 4;
    let at = match end.duration_since(start) {
        Ok(span) if end > now => start + span.mul_f64(pick.clamp(0.0, 1.0)),
        _ => now,
    };
    at.min(latest).max(now)
}

/// The shortest and longest waits before asking a CA's renewal information again.
pub const ARI_MIN_ASK: Duration = Duration::from_secs(60);
pub const ARI_MAX_ASK: Duration = Duration::from_secs(24 * 3600);

/// How long until the renewal information of a certificate (`lifetime` long) is asked again:
/// what the CA's Retry-After says, within a minute and a day (RFC 9773 section 4.3.2), and no
/// longer than a tenth of the lifetime, so that a short-lived certificate hears of a window
/// moved earlier (a revocation, an incident) well before it ends.
pub fn ari_ask_again(retry_after: Duration, lifetime: Duration) -> Duration {
    retry_after
        .min(lifetime / 10)
        .clamp(ARI_MIN_ASK, ARI_MAX_ASK)
}

/// What to do about a name now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Order (or renew) now.
    Now,
    /// Nothing until then.
    At(SystemTime),
}

/// Whether the certificate held (its validity, if any) is due for renewal at `now`, given the
/// earliest time a retry is allowed (after a failure). `suggested`: the time picked in the CA's
/// renewal window ([`ari_renew_at`]), which replaces two thirds of the lifetime when there is
/// one.
pub fn due(
    held: Option<(SystemTime, SystemTime)>,
    suggested: Option<SystemTime>,
    retry_not_before: Option<SystemTime>,
    jitter: f64,
    now: SystemTime,
) -> Due {
    let renew = match (held, suggested) {
        (Some(_), Some(at)) => at,
        (Some((nb, na)), None) => renew_at(nb, na, jitter),
        (None, _) => now,
    };
    let when = match retry_not_before {
        Some(r) => renew.max(r),
        None => renew,
    };
    if when <= now {
        Due::Now
    } else {
        Due::At(when)
    }
}

/// The wait after the `failures`-th failure in a row (1 for the first): exponential from
/// [`FIRST_BACKOFF`], capped at [`MAX_BACKOFF`], and never shorter than what the CA asked
/// for (`retry_after`, from a rate-limit error's Retry-After).
pub fn backoff(failures: u32, retry_after: Option<Duration>) -> Duration {
    let exp = failures.saturating_sub(1).min(20);
    let wait = FIRST_BACKOFF.saturating_mul(1u32 << exp).min(MAX_BACKOFF);
    match retry_after {
        Some(r) => wait.max(r),
        None => wait,
    }
}

/// The wait after the `failures`-th failed attempt in a row: what the CA asked for when it
/// said (its `Retry-After`, on a rate-limit error or any other), within [`FIRST_BACKOFF`] and
/// [`MAX_RETRY_AFTER`]; otherwise the [`backoff`], and at least [`RATE_LIMITED_WAIT`] after
/// a rate-limit error.
pub fn retry_wait(failures: u32, retry_after: Option<Duration>, rate_limited: bool) -> Duration {
    match retry_after {
        Some(r) => r.clamp(FIRST_BACKOFF, MAX_RETRY_AFTER),
        None if rate_limited => backoff(failures, Some(RATE_LIMITED_WAIT)),
        None => backoff(failures, None),
    }
}

/// Whether a certificate (valid until `not_after`) read from the store replaces the one held:
/// only a newer one does, so agents never go back to an older certificate whatever order
/// the copies arrive in.
pub fn adopt(held: Option<SystemTime>, offered: SystemTime, now: SystemTime) -> bool {
    offered > now && held.is_none_or(|h| offered > h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SETTLED: Duration = Duration::from_secs(60);
    const SETTLING: Duration = Duration::from_secs(6);

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn the_lowest_live_agent_orders_once_settled() {
        assert!(orders(0, &[0, 1, 2], SETTLED, SETTLING));
        assert!(!orders(1, &[0, 1, 2], SETTLED, SETTLING));
        assert!(orders(1, &[1, 2], SETTLED, SETTLING));
        assert!(orders(3, &[], SETTLED, SETTLING));
        // not before it has heard its peers
        assert!(!orders(0, &[0], Duration::from_secs(1), SETTLING));
    }

    #[test]
    fn an_order_in_flight_elsewhere_is_waited_for_while_its_agent_lives() {
        assert!(!claimed_elsewhere(0, &[], &[0, 1]));
        assert!(claimed_elsewhere(0, &[1], &[0, 1]));
        // its agent gone: the order is abandoned, and ordered again
        assert!(!claimed_elsewhere(0, &[1], &[0]));
        // one's own claim, from before a restart
        assert!(!claimed_elsewhere(0, &[0], &[0, 1]));
    }

    #[test]
    fn silent_agents_are_not_alive() {
        let now = t(1000);
        let beats = [(0, t(980)), (1, t(995)), (2, t(1001))];
        assert_eq!(alive(&beats, now), vec![1, 2]);
    }

    #[test]
    fn renewal_at_two_thirds_with_a_bounded_jitter() {
        assert_eq!(renew_at(t(0), t(90), 0.0), t(60));
        let early = renew_at(t(0), t(100), 0.999);
        assert!(early < t(67) && early >= t(61));
        // a certificate that ended before it began is due at once
        assert_eq!(renew_at(t(50), t(10), 0.0), t(50));
    }

    #[test]
    fn due_now_without_a_certificate_unless_backing_off() {
        assert_eq!(due(None, None, None, 0.5, t(10)), Due::Now);
        assert_eq!(due(None, None, Some(t(20)), 0.5, t(10)), Due::At(t(20)));
        assert_eq!(
            due(Some((t(0), t(90))), None, None, 0.0, t(10)),
            Due::At(t(60))
        );
        assert_eq!(due(Some((t(0), t(90))), None, None, 0.0, t(61)), Due::Now);
        // a failed renewal waits its backoff, the old certificate still held
        assert_eq!(
            due(Some((t(0), t(90))), None, Some(t(70)), 0.0, t(65)),
            Due::At(t(70))
        );
    }

    #[test]
    fn the_ca_s_renewal_window_replaces_two_thirds() {
        let held = Some((t(0), t(90)));
        assert_eq!(due(held, Some(t(20)), None, 0.0, t(10)), Due::At(t(20)));
        assert_eq!(due(held, Some(t(80)), None, 0.0, t(70)), Due::At(t(80)));
        assert_eq!(due(held, Some(t(20)), None, 0.0, t(20)), Due::Now);
        // a backoff still holds
        assert_eq!(
            due(held, Some(t(20)), Some(t(30)), 0.0, t(25)),
            Due::At(t(30))
        );
        // the pick spreads over the window; a window over (or upside down) is now
        let life = (t(0), t(1000));
        let w = (t(100), t(200));
        assert_eq!(ari_renew_at(w, life, 0.0, t(10)), t(100));
        assert_eq!(ari_renew_at(w, life, 0.5, t(10)), t(150));
        assert_eq!(ari_renew_at(w, life, 0.5, t(170)), t(170));
        assert_eq!(ari_renew_at(w, life, 0.5, t(300)), t(300));
        assert_eq!(ari_renew_at((t(200), t(100)), life, 0.5, t(10)), t(10));
        // a window to the very end: three quarters of the lifetime at the latest
        assert_eq!(ari_renew_at((t(0), t(1000)), life, 0.99, t(10)), t(750));
        assert_eq!(ari_renew_at((t(900), t(990)), life, 0.0, t(10)), t(750));
    }

    #[test]
    fn renewal_information_is_asked_again_within_bounds() {
        let s = Duration::from_secs;
        let ninety_days = s(90 * 86400);
        assert_eq!(ari_ask_again(s(6 * 3600), ninety_days), s(6 * 3600));
        assert_eq!(ari_ask_again(s(7 * 86400), ninety_days), ARI_MAX_ASK);
        assert_eq!(ari_ask_again(s(0), ninety_days), ARI_MIN_ASK);
        // six-day certificates: every 14.4 hours at most
        assert_eq!(ari_ask_again(s(86400), s(6 * 86400)), s(51840));
        assert_eq!(ari_ask_again(s(6 * 3600), s(900)), s(90));
        assert_eq!(ari_ask_again(s(6 * 3600), s(300)), ARI_MIN_ASK);
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_and_honours_retry_after() {
        assert_eq!(backoff(1, None), Duration::from_secs(2));
        assert_eq!(backoff(2, None), Duration::from_secs(4));
        assert_eq!(backoff(5, None), Duration::from_secs(32));
        assert_eq!(backoff(40, None), MAX_BACKOFF);
        assert_eq!(
            backoff(1, Some(Duration::from_secs(300))),
            Duration::from_secs(300)
        );
        assert_eq!(backoff(5, Some(Duration::from_secs(1))), backoff(5, None));
    }

    #[test]
    fn the_ca_s_retry_after_is_waited_within_bounds() {
        let s = Duration::from_secs;
        // what the CA says, shorter or longer than the backoff would be
        assert_eq!(retry_wait(9, Some(s(90)), true), s(90));
        assert_eq!(retry_wait(1, Some(s(7200)), false), s(7200));
        // within bounds
        assert_eq!(retry_wait(1, Some(s(0)), true), FIRST_BACKOFF);
        assert_eq!(retry_wait(1, Some(s(30 * 86400)), true), MAX_RETRY_AFTER);
        // no word from the CA: an hour after a rate limit, else the backoff
        assert_eq!(retry_wait(1, None, true), RATE_LIMITED_WAIT);
        assert_eq!(retry_wait(3, None, false), backoff(3, None));
    }

    #[test]
    fn only_a_newer_valid_certificate_is_adopted() {
        assert!(adopt(None, t(100), t(10)));
        assert!(adopt(Some(t(50)), t(100), t(10)));
        assert!(!adopt(Some(t(100)), t(50), t(10)));
        assert!(!adopt(Some(t(100)), t(100), t(10)));
        assert!(!adopt(None, t(5), t(10)));
    }

    proptest! {
        #[test]
        fn at_most_one_orderer(ids in proptest::collection::btree_set(0u16..64, 0..10)) {
            let alive: Vec<u16> = ids.iter().copied().collect();
            let n = alive.iter().filter(|&&me| orders(me, &alive, SETTLED, SETTLING)).count();
            prop_assert_eq!(n, usize::from(!alive.is_empty()));
        }

        #[test]
        fn a_window_pick_is_never_past_nor_late(
            start in 0u64..10_000, span in 0u64..10_000, life in 60u64..10_000,
            pick in 0.0f64..1.0, now in 0u64..20_000
        ) {
            let at = ari_renew_at((t(start), t(start + span)), (t(0), t(life)), pick, t(now));
            prop_assert!(at >= t(now));
            prop_assert!(at <= t(now).max(t(life * 3 / 4 + 1)));
        }

        #[test]
        fn backoff_is_monotonic_and_capped(n in 1u32..100) {
            prop_assert!(backoff(n, None) <= backoff(n + 1, None));
            prop_assert!(backoff(n, None) <= MAX_BACKOFF);
            prop_assert!(backoff(n, None) >= FIRST_BACKOFF);
        }

        #[test]
        fn renewal_falls_in_the_second_half_before_expiry(
            start in 0u64..1_000_000, life in 60u64..10_000_000, jitter in 0.0f64..1.0
        ) {
            let at = renew_at(t(start), t(start + life), jitter);
            prop_assert!(at > t(start + life / 2));
            prop_assert!(at < t(start + life));
        }
    }
}
