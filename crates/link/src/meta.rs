//! A stream's metadata: who the client is, in the request headers of its stream.

use std::net::SocketAddr;

use http::{HeaderMap, HeaderValue};

const SOURCE: &str = "baton-source";
const DESTINATION: &str = "baton-destination";
const TOKEN: &str = "baton-token";
const MOVE: &str = "baton-move";
const SHED: &str = "baton-shed";
const FOLLOWS: &str = "baton-follows";

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
}

impl StreamMeta {
    pub fn write(&self, headers: &mut HeaderMap) {
        let v = |s: String| HeaderValue::from_str(&s).expect("addresses and hex are header-safe");
        headers.insert(SOURCE, v(self.source.to_string()));
        headers.insert(DESTINATION, v(self.destination.to_string()));
        if let Some(t) = self.token {
            headers.insert(TOKEN, v(t.iter().map(|b| format!("{b:02x}")).collect()));
        }
        if self.drain {
            headers.insert(MOVE, HeaderValue::from_static("drain"));
        }
        if self.follows {
            headers.insert(FOLLOWS, HeaderValue::from_static("1"));
        }
        if let Some(shed) = self.shed {
            headers.insert(SHED, HeaderValue::from_static(if shed { "1" } else { "0" }));
        }
    }

    /// `None` if an address is missing or malformed, or the token is not 32 hex digits.
    pub fn read(headers: &HeaderMap) -> Option<Self> {
        let addr = |name: &str| headers.get(name)?.to_str().ok()?.parse().ok();
        let token = match headers.get(TOKEN) {
            None => None,
            Some(v) => Some(hex16(v.to_str().ok()?)?),
        };
        Some(Self {
            source: addr(SOURCE)?,
            destination: addr(DESTINATION)?,
            token,
            drain: headers.get(MOVE).is_some_and(|v| v == "drain"),
            follows: headers.get(FOLLOWS).is_some_and(|v| v == "1"),
            shed: match headers.get(SHED).map(|v| v.as_bytes()) {
                None => None,
                Some(b"1") => Some(true),
                Some(b"0") => Some(false),
                Some(_) => return None,
            },
        })
    }
}

fn hex16(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 || !s.is_ascii() {
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
        };
        let mut h = HeaderMap::new();
        m.write(&mut h);
        assert_eq!(StreamMeta::read(&h), Some(m));
        let plain = StreamMeta {
            token: None,
            drain: false,
            shed: None,
            follows: false,
            ..m
        };
        let mut h = HeaderMap::new();
        plain.write(&mut h);
        assert_eq!(StreamMeta::read(&h), Some(plain));
        h.insert(TOKEN, HeaderValue::from_static("abc"));
        assert_eq!(StreamMeta::read(&h), None);
        h.remove(TOKEN);
        h.insert(SOURCE, HeaderValue::from_static("not an address"));
        assert_eq!(StreamMeta::read(&h), None);
        assert_eq!(StreamMeta::read(&HeaderMap::new()), None);
    }
}
