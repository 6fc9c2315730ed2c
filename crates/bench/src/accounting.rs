//! Exact handshake accounting, as negotiated: what the server did, not what the client hoped.

use std::sync::OnceLock;

use openssl::ssl::{Ssl, SslContext, SslMethod};
use rustls::HandshakeKind;
use serde::{Deserialize, Serialize};

/// Why a transaction failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorClass {
    /// TCP connect refused or unreachable.
    Connect,
    /// The TLS handshake failed (alert, verification, protocol, the server hanging up during
    /// it), or a TLS error after it (a TLS 1.3 server refusing the client's certificate).
    Tls,
    /// A phase took longer than --timeout.
    Timeout,
    /// A malformed HTTP response.
    Http,
    /// The connection broke after the handshake.
    Io,
    /// The server closed a keep-alive connection (or announced `Connection: close`) while the
    /// client still had requests to send on it: between two requests, or crossing the next
    /// request before any byte of its response.
    Closed,
}

/// How one handshake went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handshake {
    Full,
    Resumed,
    /// The client offered a session and the server did a full handshake instead: counted as
    /// full *and* as refused.
    ResumeRefused,
}

pub fn classify(offered_session: bool, kind: HandshakeKind) -> Handshake {
    match kind {
        HandshakeKind::Resumed => Handshake::Resumed,
        HandshakeKind::Full | HandshakeKind::FullWithHelloRetryRequest if offered_session => {
            Handshake::ResumeRefused
        }
        _ => Handshake::Full,
    }
}

/// How far one transaction got and how it ended, as the transaction saw it; [`settle`] turns it
/// into counts. Kept apart from the sockets so the rules below are tested on their own.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct End {
    /// TCP connected, so a TLS handshake was attempted.
    pub handshake_started: bool,
    /// The handshake as negotiated, once the client saw it complete.
    pub handshake: Option<Handshake>,
    /// Some response byte arrived after the handshake.
    pub first_byte: bool,
    /// Responses received, whatever their status.
    pub responses: u32,
    /// Of those, the ones with a success or redirect status (2xx, 3xx).
    pub ok: u32,
    /// Requests never sent because the server had closed the connection (or announced
    /// `Connection: close`) first: a client would send them on a new connection.
    pub unsent: u32,
    /// Why the transaction failed, if it did.
    pub error: Option<ErrorClass>,
    /// What the handshake agreed on, once complete.
    pub negotiated: Option<Negotiated>,
    /// `--early-data`: the first request went as early data; whether the server accepted it.
    pub early: Option<bool>,
    /// When the transaction started (TCP connect included).
    pub began: Option<std::time::Instant>,
    /// Time from `began` to the first response byte.
    pub ttfb: Option<std::time::Duration>,
    /// TLS 1.3 tickets the client had received before this connection's handshake.
    pub tickets_before: Option<u64>,
}

/// What kind of connection a transaction's first response came on, for TTFB by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Full,
    /// Resumed, the request sent after the handshake (1-RTT).
    Resumed,
    /// Resumed, the request accepted as early data (0-RTT).
    Early,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Full, Kind::Resumed, Kind::Early];

    /// The key of its TTFB in the JSON's `latency_ms` and `histograms`.
    pub fn key(self) -> &'static str {
        match self {
            Kind::Full => "ttfb_full",
            Kind::Resumed => "ttfb_resumed",
            Kind::Early => "ttfb_0rtt",
        }
    }

    /// A completed transaction's kind: by its handshake as negotiated and the server's answer
    /// to its early data.
    pub fn of(end: &End) -> Option<Kind> {
        match (end.handshake?, end.early) {
            (Handshake::Resumed, Some(true)) => Some(Kind::Early),
            (Handshake::Resumed, _) => Some(Kind::Resumed),
            _ => Some(Kind::Full),
        }
    }
}

/// A completed handshake's parameters as wire code points (counted per combination, named
/// only in the report).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Negotiated {
    pub version: u16,
    pub suite: u16,
    /// 0: no key exchange (a TLS 1.2 resumption).
    pub group: u16,
}

impl Negotiated {
    pub fn of(conn: &rustls::ClientConnection) -> Option<Self> {
        Some(Self {
            version: u16::from(conn.protocol_version()?),
            suite: u16::from(conn.negotiated_cipher_suite()?.suite()),
            group: conn
                .negotiated_key_exchange_group()
                .map_or(0, |g| u16::from(g.name())),
        })
    }

    /// e.g. `TLSv1_3 TLS13_AES_128_GCM_SHA256 X25519`, `TLSv1_2 TLS_RSA_WITH_AES_128_CBC_SHA -`;
    /// unknown code points print as hex.
    pub fn name(&self) -> String {
        let group = match self.group {
            0 => "-".to_string(),
            g => format!("{:?}", rustls::NamedGroup::from(g)),
        };
        let mut suite = format!("{:?}", rustls::CipherSuite::from(self.suite));
        if suite.starts_with("CipherSuite(") || suite.starts_with("Unknown") {
            // a suite rustls has no name for (`--engine openssl`): its IANA name from libssl
            if let Some(name) = suite_name(self.suite) {
                suite = name.to_string();
            }
        }
        format!(
            "{:?} {suite} {group}",
            rustls::ProtocolVersion::from(self.version),
        )
    }
}

/// A suite's IANA name by its code point, as libssl knows it (whether or not it would offer it).
pub fn suite_name(id: u16) -> Option<&'static str> {
    static SSL: OnceLock<Option<Ssl>> = OnceLock::new();
    let ssl = SSL
        .get_or_init(|| {
            let ctx = SslContext::builder(SslMethod::tls()).ok()?.build();
            Ssl::new(&ctx).ok()
        })
        .as_ref()?;
    let list = ssl.bytes_to_cipher_list(&id.to_be_bytes(), false).ok()?;
    let name = list.suites.iter().next()?.standard_name();
    name
}

/// What one transaction adds to the counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// The parameters of a handshake that counts (not of a refused one).
    pub negotiated: Option<Negotiated>,
    /// The handshake to count as full/resumed/refused; `None` with `handshake_failed` or when
    /// TCP never connected.
    pub handshake: Option<Handshake>,
    pub handshake_failed: bool,
    /// Requests sent that got no response at all (responses with an error status are counted
    /// where they arrive).
    pub unanswered: u64,
    /// Requests not sent: the server closed the keep-alive connection before them.
    pub unsent: u64,
}

/// The counting rules:
/// - every connection that reached TCP is exactly one of full, resumed or failed handshake;
/// - a TLS 1.3 server that refuses the client after the client's Finished (client certificate
///   missing or rejected) answers with an alert before any response byte: the client had
///   already seen "handshake complete", but the server did not accept it, so it is a failed
///   handshake, not a full one;
/// - every one of the `--requests-per-conn` requests is either answered (ok or failed by
///   status), unanswered (failed), or unsent (the server closed the connection between
///   requests, before the client sent it), so ok + failed + unsent = connections x requests
///   per connection. Unsent is not failed: nothing the client asked for was lost, but a real
///   client would have had to connect again (the `closed` error class counts those
///   connections).
pub fn settle(end: &End, requests_per_conn: u32) -> Settled {
    let rejected = end.error == Some(ErrorClass::Tls) && !end.first_byte;
    let handshake = end.handshake.filter(|_| !rejected);
    Settled {
        negotiated: end.negotiated.filter(|_| handshake.is_some()),
        handshake,
        handshake_failed: end.handshake_started && handshake.is_none(),
        unanswered: requests_per_conn
            .saturating_sub(end.responses)
            .saturating_sub(end.unsent) as u64,
        unsent: end
            .unsent
            .min(requests_per_conn.saturating_sub(end.responses)) as u64,
    }
}

/// Which virtual client makes the `m`-th connection of a run of `n` connections shared by `c`
/// clients: connections are dealt in blocks of `k` (the --full-every period), so each client's
/// share is a whole number of periods and exactly `ceil(n / k)` handshakes are full.
/// Returns, for client `client`, how many connections it makes.
pub fn share(n: u64, clients: u64, k: u64, client: u64) -> u64 {
    let blocks = n.div_ceil(k);
    let last_block = blocks.saturating_sub(1);
    // blocks client, client + C, client + 2C, ... up to last_block
    if client > last_block {
        return 0;
    }
    let mine = (last_block - client) / clients + 1;
    let mut count = mine * k;
    if (last_block - client).is_multiple_of(clients) {
        // this client has the last block, which may be short
        count -= blocks * k - n;
    }
    count
}

/// The global position of client `client`'s `m`-th connection in the dealing order (for
/// open-loop schedules: connection `i` is due at `start + i / rate`).
pub fn global_index(clients: u64, k: u64, client: u64, m: u64) -> u64 {
    let block = client + clients * (m / k);
    block * k + m % k
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn libssl_names_suites_rustls_does_not() {
        assert_eq!(suite_name(0x002f), Some("TLS_RSA_WITH_AES_128_CBC_SHA"));
        assert_eq!(suite_name(0x0034), Some("TLS_DH_anon_WITH_AES_128_CBC_SHA"));
        assert_eq!(suite_name(0xfefe), None);
    }

    #[test]
    fn refused_resumptions_are_full_and_flagged() {
        assert_eq!(classify(false, HandshakeKind::Full), Handshake::Full);
        assert_eq!(
            classify(true, HandshakeKind::Full),
            Handshake::ResumeRefused
        );
        assert_eq!(
            classify(true, HandshakeKind::FullWithHelloRetryRequest),
            Handshake::ResumeRefused
        );
        assert_eq!(classify(true, HandshakeKind::Resumed), Handshake::Resumed);
    }

    #[test]
    fn papers_numbers() {
        // -n 300 -c 10 --full-every 3: 30 each, 100 full
        assert!((0..10).all(|c| share(300, 10, 3, c) == 30));
        // -n 3000 -c 30 --full-every 3: shares are whole periods, 1,000 full
        let shares: Vec<u64> = (0..30).map(|c| share(3000, 30, 3, c)).collect();
        assert_eq!(shares.iter().sum::<u64>(), 3000);
        assert_eq!(shares.iter().map(|s| s.div_ceil(3)).sum::<u64>(), 1000);
    }

    #[test]
    fn kinds_for_ttfb() {
        let end = |handshake, early| End {
            handshake: Some(handshake),
            early,
            ..End::default()
        };
        assert_eq!(
            Kind::of(&end(Handshake::Resumed, Some(true))),
            Some(Kind::Early)
        );
        assert_eq!(
            Kind::of(&end(Handshake::Resumed, Some(false))),
            Some(Kind::Resumed)
        );
        assert_eq!(
            Kind::of(&end(Handshake::Resumed, None)),
            Some(Kind::Resumed)
        );
        // early data refused with the ticket: a full handshake
        assert_eq!(
            Kind::of(&end(Handshake::ResumeRefused, Some(false))),
            Some(Kind::Full)
        );
        assert_eq!(Kind::of(&End::default()), None);
    }

    #[test]
    fn every_connection_and_request_is_counted_once() {
        let full = Some(Handshake::Full);
        // refused at TCP: no handshake either way, every request unanswered
        let s = settle(
            &End {
                error: Some(ErrorClass::Connect),
                ..End::default()
            },
            3,
        );
        assert_eq!(
            s,
            Settled {
                negotiated: None,
                handshake: None,
                handshake_failed: false,
                unanswered: 3,
                unsent: 0,
            }
        );
        // TLS alert during the handshake
        let s = settle(
            &End {
                handshake_started: true,
                error: Some(ErrorClass::Tls),
                ..End::default()
            },
            1,
        );
        assert_eq!(
            (s.handshake, s.handshake_failed, s.unanswered),
            (None, true, 1)
        );
        // TLS 1.3 client certificate refused after the client's Finished
        let s = settle(
            &End {
                handshake_started: true,
                handshake: full,
                error: Some(ErrorClass::Tls),
                ..End::default()
            },
            1,
        );
        assert_eq!((s.handshake, s.handshake_failed), (None, true));
        // a bad record in the middle of a response: the handshake stands
        let s = settle(
            &End {
                handshake_started: true,
                handshake: full,
                first_byte: true,
                error: Some(ErrorClass::Tls),
                ..End::default()
            },
            2,
        );
        assert_eq!(
            (s.handshake, s.handshake_failed, s.unanswered),
            (full, false, 2)
        );
        // the server closed keep-alive after 2 of 5, before the third was sent: 3 unsent,
        // none failed
        let s = settle(
            &End {
                handshake_started: true,
                handshake: full,
                first_byte: true,
                responses: 2,
                unsent: 3,
                error: Some(ErrorClass::Closed),
                negotiated: None,
                ..End::default()
            },
            5,
        );
        assert_eq!((s.handshake, s.unanswered, s.unsent), (full, 0, 3));
        // ... after the third was sent (the close crossed it): that one failed, 2 unsent
        let s = settle(
            &End {
                handshake_started: true,
                handshake: full,
                first_byte: true,
                responses: 2,
                unsent: 2,
                error: Some(ErrorClass::Closed),
                ..End::default()
            },
            5,
        );
        assert_eq!((s.unanswered, s.unsent), (1, 2));
        // all served
        let s = settle(
            &End {
                handshake_started: true,
                handshake: Some(Handshake::Resumed),
                first_byte: true,
                responses: 4,
                error: None,
                negotiated: None,
                ..End::default()
            },
            4,
        );
        assert_eq!(
            s,
            Settled {
                negotiated: None,
                handshake: Some(Handshake::Resumed),
                handshake_failed: false,
                unanswered: 0,
                unsent: 0,
            }
        );
    }

    proptest! {
        #[test]
        fn shares_add_up_and_fulls_are_exact(n in 1u64..5000, c in 1u64..64, k in 1u64..10) {
            let shares: Vec<u64> = (0..c).map(|x| share(n, c, k, x)).collect();
            prop_assert_eq!(shares.iter().sum::<u64>(), n);
            prop_assert_eq!(shares.iter().map(|s| s.div_ceil(k)).sum::<u64>(), n.div_ceil(k));
            // the dealing order is a permutation of 0..n
            let mut seen: Vec<u64> = (0..c).flat_map(|x| (0..shares[x as usize]).map(move |m| global_index(c, k, x, m))).collect();
            seen.sort();
            prop_assert_eq!(seen, (0..n).collect::<Vec<_>>());
        }
    }
}
