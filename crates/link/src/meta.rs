//! A stream's metadata: who the client is, in the request headers of its stream; and the
//! trailers of a dispatcher handover (`baton-handover`).

use std::net::SocketAddr;

use http::{HeaderMap, HeaderName, HeaderValue};

// Names made once, not parsed from a string by every insert and look-up (every stream).
static SOURCE: HeaderName = HeaderName::from_static("baton-source");
static DESTINATION: HeaderName = HeaderName::from_static("baton-destination");
static TOKEN: HeaderName = HeaderName::from_static("baton-token");
static MOVE: HeaderName = HeaderName::from_static("baton-move");
static SHED: HeaderName = HeaderName::from_static("baton-shed");
static FOLLOWS: HeaderName = HeaderName::from_static("baton-follows");
static REATTACH: HeaderName = HeaderName::from_static("baton-reattach");
/// The trailer of a dispatcher handover: the token from the dispatcher, `ack` from the agent.
pub(crate) const HANDOVER: &str = "baton-handover";
const ACK: &str = "ack";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamMeta {
    /// The client's address (what PROXY v2 carried before the link).
    pub source: SocketAddr,
    /// The address the client connected to.
    pub destination: SocketAddr,
    /// A migration's import stream: the token its session object is sealed for.
    pub token: Option<[u8; 16]>,
    /// An import stream for a session whose agent drains (not one after a handshake): for the
    /// home agent's counters only.
    pub drain: bool,
    /// A control stream, not a client's: the dispatcher's operator drained the agent (`true`:
    /// move its idle connections elsewhere) or enabled it again (`false`).
    pub shed: Option<bool>,
    /// The dispatcher follows this stream's records for its whole life, so the agent may ask
    /// to move it when it drains (a handoff Leave). A dispatcher that does not (an older
    /// version, during an upgrade) would pass the Leave to the client.
    pub follows: bool,
    /// A successor dispatcher's stream that continues the agent's stream handed over with
    /// this token (`baton-handover` trailers); never delivered by `LinkListener::accept`.
    pub reattach: Option<[u8; 16]>,
}

impl StreamMeta {
    /// A client's stream whose records the dispatcher follows for its whole life (every
    /// stream today's dispatcher opens for a client); the rest is set per kind of stream.
    pub fn followed(source: SocketAddr, destination: SocketAddr) -> Self {
        Self {
            source,
            destination,
            token: None,
            drain: false,
            shed: None,
            follows: true,
            reattach: None,
        }
    }

    pub fn write(&self, headers: &mut HeaderMap) {
        // the String becomes the value as is (no copy)
        let v = |s: String| HeaderValue::try_from(s).expect("addresses and hex are header-safe");
        headers.insert(&SOURCE, v(self.source.to_string()));
        headers.insert(&DESTINATION, v(self.destination.to_string()));
        if let Some(t) = self.token {
            headers.insert(&TOKEN, v(hex(&t)));
        }
        if let Some(t) = self.reattach {
            headers.insert(&REATTACH, v(hex(&t)));
        }
        if self.drain {
            headers.insert(&MOVE, HeaderValue::from_static("drain"));
        }
        if self.follows {
            headers.insert(&FOLLOWS, HeaderValue::from_static("1"));
        }
        if let Some(shed) = self.shed {
            headers.insert(
                &SHED,
                HeaderValue::from_static(if shed { "1" } else { "0" }),
            );
        }
    }

    /// `None` if an address is missing or malformed, or a token is not 32 hex digits.
    pub fn read(headers: &HeaderMap) -> Option<Self> {
        let addr = |name: &HeaderName| headers.get(name)?.to_str().ok()?.parse().ok();
        let token = |name: &HeaderName| match headers.get(name) {
            None => Some(None),
            Some(v) => Some(Some(hex16(v.to_str().ok()?)?)),
        };
        Some(Self {
            source: addr(&SOURCE)?,
            destination: addr(&DESTINATION)?,
            token: token(&TOKEN)?,
            reattach: token(&REATTACH)?,
            drain: headers.get(&MOVE).is_some_and(|v| v == "drain"),
            follows: headers.get(&FOLLOWS).is_some_and(|v| v == "1"),
            shed: match headers.get(&SHED).map(|v| v.as_bytes()) {
                None => None,
                Some(b"1") => Some(true),
                Some(b"0") => Some(false),
                Some(_) => return None,
            },
        })
    }
}

/// The trailers a dispatcher ends its side with when it hands the stream over.
pub(crate) fn handover_trailers(token: &[u8; 16]) -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert(
        HANDOVER,
        HeaderValue::from_str(&hex(token)).expect("hex is header-safe"),
    );
    t
}

/// The trailers an agent ends its side with when it waits for the dispatcher's successor.
pub(crate) fn ack_trailers() -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert(HANDOVER, HeaderValue::from_static(ACK));
    t
}

/// The token of a handover's trailers: exactly one `baton-handover` of exactly 32 hex digits,
/// else `None` (a plain end of stream).
pub(crate) fn handover_token(trailers: &HeaderMap) -> Option<[u8; 16]> {
    let mut values = trailers.get_all(HANDOVER).iter();
    let v = values.next()?;
    if values.next().is_some() {
        return None;
    }
    hex16(v.to_str().ok()?)
}

/// Whether trailers are an agent's acknowledgement of a handover.
pub(crate) fn is_handover_ack(trailers: &HeaderMap) -> bool {
    let mut values = trailers.get_all(HANDOVER).iter();
    values.next().is_some_and(|v| v == ACK) && values.next().is_none()
}

fn hex(t: &[u8; 16]) -> String {
    t.iter().map(|b| format!("{b:02x}")).collect()
}

/// Exactly 32 hex digits (either case), nothing else (no sign, no space).
fn hex16(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let m = StreamMeta {
            source: "10.0.0.7:5000".parse().unwrap(),
            destination: "[::1]:443".parse().unwrap(),
            token: Some([0xab; 16]),
            drain: true,
            shed: Some(true),
            follows: true,
            reattach: Some([0x5c; 16]),
        };
        let mut h = HeaderMap::new();
        m.write(&mut h);
        assert_eq!(StreamMeta::read(&h), Some(m));
        let plain = StreamMeta {
            token: None,
            drain: false,
            shed: None,
            follows: false,
            reattach: None,
            ..m
        };
        let mut h = HeaderMap::new();
        plain.write(&mut h);
        assert_eq!(StreamMeta::read(&h), Some(plain));
        h.insert(&TOKEN, HeaderValue::from_static("abc"));
        assert_eq!(StreamMeta::read(&h), None);
        h.remove(&TOKEN);
        h.insert(
            &REATTACH,
            HeaderValue::from_static("+bababababababababababababababab"),
        );
        assert_eq!(StreamMeta::read(&h), None, "a sign is not a hex digit");
        h.remove(&REATTACH);
        assert_eq!(StreamMeta::read(&h), Some(plain));
        h.insert(&SOURCE, HeaderValue::from_static("not an address"));
        assert_eq!(StreamMeta::read(&h), None);
        assert_eq!(StreamMeta::read(&HeaderMap::new()), None);
    }

    #[test]
    fn handover_trailers_parse_strictly() {
        let t = [0x0f; 16];
        assert_eq!(handover_token(&handover_trailers(&t)), Some(t));
        assert!(!is_handover_ack(&handover_trailers(&t)));
        assert!(is_handover_ack(&ack_trailers()));
        assert_eq!(handover_token(&ack_trailers()), None);
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(HANDOVER, HeaderValue::from_static(v));
            h
        };
        let upper = with("0F0F0F0F0F0F0F0F0F0F0F0F0F0F0F0F");
        assert_eq!(handover_token(&upper), Some(t));
        for bad in [
            "",
            "0f0f",
            "0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0",
            "0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0",
            "0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0g",
            "+f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f",
            " 0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0",
            "ACK",
            "ack ",
        ] {
            assert_eq!(handover_token(&with(bad)), None, "{bad:?}");
            assert!(!is_handover_ack(&with(bad)), "{bad:?}");
        }
        // not UTF-8, and two values: a plain end
        let mut h = HeaderMap::new();
        h.insert(
            HANDOVER,
            HeaderValue::from_bytes(b"0f0f0f0f0f0f0f0f0f0f0f0f0f0f0\xff0f").unwrap(),
        );
        assert_eq!(handover_token(&h), None);
        let mut h = handover_trailers(&t);
        h.append(HANDOVER, HeaderValue::from_static("ack"));
        assert_eq!(handover_token(&h), None);
        assert!(!is_handover_ack(&h));
        let mut h = ack_trailers();
        h.append(HANDOVER, HeaderValue::from_static("ack"));
        assert!(!is_handover_ack(&h));
        assert_eq!(handover_token(&HeaderMap::new()), None);
        assert!(!is_handover_ack(&HeaderMap::new()));
        let mut other = HeaderMap::new();
        other.insert("baton-other", HeaderValue::from_static("ack"));
        assert!(!is_handover_ack(&other));
    }
}
