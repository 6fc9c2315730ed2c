//! What a connection does next, decided from plain facts; the loops in `accept` and `http1`
//! do what these say. Between two HTTP/1.1 requests: serve, wait, park (`park` decides
//! whether it can), end, close for a drain, or ask the dispatcher to move the connection
//! (a drain's Leave), and what then, when the move left it here. Before the handshake: how
//! its writes go.

use std::time::Duration;

use tokio::time::Instant;

/// How a wait for a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// Request bytes are there, or the peer closed (hyper sees to that).
    Request,
    /// The agent drains (only a `later` wait): the connection is idle between requests.
    Drain,
    /// The connection should end: idle timeout, I/O error, or `until` passed.
    End,
    /// Nothing came by the wait's park time (and `until` is later): the connection may park
    /// (`park`) and wait on from there.
    Park,
}

/// What an HTTP/1.1 connection does next, between requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Serve the request that has come (or the bytes already read).
    Serve,
    /// Wait for the next request (serving at once what was already read, if anything).
    Wait,
    /// Ask the dispatcher to move it to another agent (Leave), once.
    Leave,
    /// close_notify, then FIN.
    Close,
    /// close_notify, then FIN, counted as a connection a drain closed.
    DrainClose,
    /// Counted as a connection a drain closed; gone already (nothing more to send).
    DrainEnd,
    /// Ends: nothing more to send.
    End,
}

/// After a wait for a request. Idle between requests while the agent drains (or is drained
/// at a dispatcher): the dispatcher moves a `movable` connection to another agent (its client
/// notices nothing); a drain ends any other one here (a dispatcher's drain wakes only movable
/// ones).
pub(crate) fn after_wait(waited: Waited, movable: bool) -> Next {
    match waited {
        Waited::Request => Next::Serve,
        Waited::End | Waited::Park => Next::End,
        Waited::Drain if movable => Next::Leave,
        Waited::Drain => Next::DrainClose,
    }
}

/// How a Leave left the connection (what `migration::export::Exported` says, without what it
/// carries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Left {
    /// Another agent has it.
    Migrated,
    /// Lost on the way.
    Closed,
    /// Extracted, but it stays: served here from the record layer.
    ServeHere,
    /// Not extracted: rustls goes on; `ahead`: request bytes came meanwhile.
    Kept { ahead: bool },
}

/// After a Leave. A connection that stays serves what came meanwhile; with nothing come, it
/// waits again (the dispatcher's drain let it be) or, while the agent drains, ends as a drain
/// ends the connections that cannot move. It is not offered again.
pub(crate) fn after_leave(left: Left, draining: bool) -> Next {
    match left {
        Left::Migrated => Next::End,
        Left::Closed => Next::DrainEnd,
        // whatever the layer holds is served at the next wait, then the drain ends it
        Left::ServeHere => Next::Wait,
        Left::Kept { ahead: true } => Next::Serve,
        Left::Kept { ahead: false } if draining => Next::DrainClose,
        Left::Kept { ahead: false } => Next::Wait,
    }
}

/// After hyper served a request: the connection waits for the next one only if the request
/// was served without error and its keep-alive response was handed to hyper whole.
pub(crate) fn after_request(ok: bool, whole: bool) -> Next {
    match ok && whole {
        true => Next::Wait,
        false => Next::Close,
    }
}

/// Whether an HTTP/1.1 connection keeps its hyper connection from one request to the next,
/// and if so how long hyper waits for the next request before the stream goes back for the
/// usual wait (to park, move or end): the park time, when there is one. A wait in hyper is
/// shorter than any bound on it by far (a tenth at most): the next request's head bounds count
/// from the last response there (hyper's `header_timeout`, the `--min-header-rate` grace),
/// not from its first bytes, so they lose at most that; and neither ends a wait before it
/// goes back, nor does the idle timeout.
pub(crate) fn keep_for(
    park_after: Duration,
    header_timeout: Duration,
    idle_timeout: Duration,
    grace: Duration,
) -> Option<Duration> {
    let bound = header_timeout.min(idle_timeout).min(grace);
    (!park_after.is_zero() && park_after.saturating_mul(10) <= bound).then_some(park_after)
}

/// In a kept hyper connection: whether the stream goes back now, with its wait for the next
/// request over already (`Drain`, `Park`), or hyper waits on. Only while `idle` (the last
/// response sent, nothing of the next request read): a request under way is served first,
/// and a drain met at its end, as a wait meets it. `drain`: the agent drains (or a
/// dispatcher's drain sheds the connection); `park_time`: the wait has lasted the park time.
pub(crate) fn hand_back(idle: bool, drain: bool, park_time: bool) -> Option<Waited> {
    match (idle, drain, park_time) {
        (false, _, _) => None,
        (true, true, _) => Some(Waited::Drain),
        (true, false, true) => Some(Waited::Park),
        (true, false, false) => None,
    }
}

/// When a wait for a request gives up: the first request is due by `first`; each later one
/// within the idle timeout of the wait's start, however its bytes trickle in (a park keeps the
/// deadline).
pub(crate) fn wait_until(first: Option<Instant>, now: Instant, idle_timeout: Duration) -> Instant {
    first.unwrap_or(now + idle_timeout)
}

/// The longest park time for which a new connection's TLS 1.3 tickets wait for its first
/// request (see `transport`): a longer one would keep them from a client that sends nothing.
pub(crate) const TICKETS_WAIT_MAX: Duration = Duration::from_millis(200);

/// Whether a new HTTP/1.1 connection's tickets wait for its first request, to leave with its
/// response (one send fewer: `transport`): TLS 1.3 only, and only if its park time bounds that
/// wait (a park sends them).
pub(crate) fn tickets_wait(tls13: bool, park_after: Duration) -> bool {
    tls13 && park_after <= TICKETS_WAIT_MAX
}

/// How a connection's writes go during its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandshakeWrites {
    /// Flight, tickets, response and close_notify share system calls: the built-in responder
    /// waits on nothing but the client (see `transport`).
    pub(crate) coalesce: bool,
    /// Held until the migration frame that follows them: a link stream offered for a move
    /// (`migration::export::hand_off` sends both and stops holding).
    pub(crate) hold: bool,
}

/// `proxy`: requests go to an upstream; `offered`: the dispatcher offered the connection for
/// a move; `on_link`: it came on the agent link.
pub(crate) fn handshake_writes(proxy: bool, offered: bool, on_link: bool) -> HandshakeWrites {
    HandshakeWrites {
        coalesce: !proxy && !offered,
        hold: offered && on_link,
    }
}

/// Whether a connection can still move after its handshake: a link stream the dispatcher
/// follows, unless it was kept here after an Offer (it is not followed for a move any more;
/// one served from the record layer can: the layer knows where its records stand).
pub(crate) fn moves_later(movable: bool, offered: bool) -> bool {
    movable && !offered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_ends_in_serving_ending_or_a_drain() {
        assert_eq!(after_wait(Waited::Request, false), Next::Serve);
        assert_eq!(after_wait(Waited::Request, true), Next::Serve);
        for movable in [false, true] {
            assert_eq!(after_wait(Waited::End, movable), Next::End);
            assert_eq!(after_wait(Waited::Park, movable), Next::End);
        }
        assert_eq!(after_wait(Waited::Drain, true), Next::Leave);
        assert_eq!(after_wait(Waited::Drain, false), Next::DrainClose);
    }

    #[test]
    fn after_a_leave_a_connection_that_stays_serves_what_came() {
        for draining in [false, true] {
            assert_eq!(after_leave(Left::Migrated, draining), Next::End);
            assert_eq!(after_leave(Left::Closed, draining), Next::DrainEnd);
            assert_eq!(after_leave(Left::ServeHere, draining), Next::Wait);
            assert_eq!(
                after_leave(Left::Kept { ahead: true }, draining),
                Next::Serve
            );
        }
        // nothing came: the agent's drain ends it, a dispatcher's lets it wait on
        assert_eq!(
            after_leave(Left::Kept { ahead: false }, true),
            Next::DrainClose
        );
        assert_eq!(after_leave(Left::Kept { ahead: false }, false), Next::Wait);
    }

    #[test]
    fn only_a_whole_keep_alive_response_waits_for_another_request() {
        assert_eq!(after_request(true, true), Next::Wait);
        assert_eq!(after_request(true, false), Next::Close);
        assert_eq!(after_request(false, true), Next::Close);
        assert_eq!(after_request(false, false), Next::Close);
    }

    #[test]
    fn hyper_is_kept_only_for_a_park_time_short_beside_every_bound() {
        let ms = Duration::from_millis;
        let (header, idle, grace) = (ms(10_000), ms(60_000), ms(2_000));
        // the defaults: 50 ms
        assert_eq!(keep_for(ms(50), header, idle, grace), Some(ms(50)));
        assert_eq!(keep_for(ms(200), header, idle, grace), Some(ms(200)));
        // no park time: request at a time, each wait parks at once
        assert_eq!(keep_for(Duration::ZERO, header, idle, grace), None);
        // past a tenth of any bound: request at a time
        assert_eq!(keep_for(ms(201), header, idle, grace), None);
        assert_eq!(keep_for(ms(50), ms(499), idle, grace), None);
        assert_eq!(keep_for(ms(50), header, ms(499), grace), None);
        assert_eq!(keep_for(ms(50), header, idle, ms(499)), None);
        assert_eq!(keep_for(ms(50), ms(500), ms(500), ms(500)), Some(ms(50)));
        assert_eq!(keep_for(Duration::MAX, header, idle, grace), None);
    }

    #[test]
    fn a_kept_connection_goes_back_only_between_requests() {
        // a request under way is served on, whatever is pending
        for (drain, park_time) in [(false, false), (true, false), (false, true), (true, true)] {
            assert_eq!(hand_back(false, drain, park_time), None);
        }
        // idle: a drain wins over the park time; neither, hyper waits on
        assert_eq!(hand_back(true, true, false), Some(Waited::Drain));
        assert_eq!(hand_back(true, true, true), Some(Waited::Drain));
        assert_eq!(hand_back(true, false, true), Some(Waited::Park));
        assert_eq!(hand_back(true, false, false), None);
    }

    #[test]
    fn the_first_request_keeps_its_deadline_later_ones_get_the_idle_timeout() {
        let now = Instant::now();
        let idle = Duration::from_secs(5);
        let first = now + Duration::from_secs(1);
        assert_eq!(wait_until(Some(first), now, idle), first);
        assert_eq!(wait_until(None, now, idle), now + idle);
    }

    #[test]
    fn tickets_wait_only_for_tls13_with_a_short_park_time() {
        assert!(tickets_wait(true, TICKETS_WAIT_MAX));
        assert!(tickets_wait(true, Duration::ZERO));
        assert!(!tickets_wait(
            true,
            TICKETS_WAIT_MAX + Duration::from_millis(1)
        ));
        assert!(!tickets_wait(false, Duration::ZERO));
    }

    #[test]
    fn handshake_writes_coalesce_for_the_responder_and_hold_for_an_offer_on_the_link() {
        let w = handshake_writes(false, false, true);
        assert!(w.coalesce && !w.hold);
        let w = handshake_writes(true, false, true);
        assert!(!w.coalesce && !w.hold);
        let w = handshake_writes(false, true, true);
        assert!(!w.coalesce && w.hold);
        let w = handshake_writes(false, true, false);
        assert!(!w.coalesce && !w.hold);
    }

    #[test]
    fn a_connection_kept_after_an_offer_does_not_move_later() {
        assert!(moves_later(true, false));
        assert!(!moves_later(true, true));
        assert!(!moves_later(false, false));
    }
}
