//! Entry points for the cargo-fuzz targets in `fuzz/` that exercise migration (each target is
//! one line calling a function here), so the fuzzed code and its invariants are built and
//! type-checked with the crate. Unlike the rest of the crate these functions panic on purpose:
//! a panic is a finding.

/// Decodes hostile bytes as hot-restart messages (`crate::restart`). Checks: nothing
/// panics; a message that decodes encodes back to exactly its bytes (one wire form each), and
/// a relay resumed at a decoded position follows the rest of the input without panicking.
pub fn restart(data: &[u8]) {
    use crate::restart::Message;
    let mut buf = data;
    while let Ok((m, used)) = Message::decode(buf) {
        assert_eq!(m.to_bytes(), &buf[..used], "a second wire form");
        if let Message::Conn(c) = &m {
            let mut relay = crate::Relay::resume(c.position.clone());
            let rest = &buf[used..];
            let _ = relay.watch_client(&rest[..rest.len() / 2]);
            let _ = relay.watch_agent(&rest[rest.len() / 2..]);
        }
        buf = &buf[used..];
    }
}

/// Drives the handoff protocol's splitter and the dispatcher's relay with hostile bytes: the
/// first byte splits `data` into what the client, the handshake agent and the home agent
/// send. Checks: nothing panics; the splitter gives the same TLS bytes and frames in chunks as
/// in one push, and after taking over from a tracker mid-stream; the relay never holds more than its bound plus one read.
pub fn migration(data: &[u8]) {
    use crate::{Relay, Splitter, MAX_HELD};

    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let mut one = Splitter::new();
    let whole = drain(&mut one, rest);
    let chunk = 1 + usize::from(cut % 17);
    let mut s = Splitter::new();
    let mut chunked = (Vec::new(), Vec::new(), true);
    for c in rest.chunks(chunk) {
        let (tls, frames, ok) = drain(&mut s, c);
        chunked.0.extend(tls);
        chunked.1.extend(frames);
        if !ok {
            chunked.2 = false;
            break;
        }
    }
    if whole.2 && chunked.2 {
        assert_eq!(whole.0, chunked.0, "TLS bytes differ by chunking");
        assert_eq!(whole.1, chunked.1, "frames differ by chunking");
    }

    // A splitter taking over from a tracker mid-stream (the handshake agent after rustls)
    // passes on exactly the bytes the tracker did not see.
    let k = rest.len() * usize::from(cut) / 256;
    let mut t = Splitter::new();
    if t.track(&rest[..k]).is_ok() {
        let (tls, frames, ok) = drain(&mut t, &rest[k..]);
        if ok && frames.is_empty() && whole.2 && whole.1.is_empty() {
            let got = [&rest[..k], &tls[..]].concat();
            if one.at_boundary() {
                assert_eq!(got, whole.0, "takeover differs");
            } else {
                // The stream ends inside a record header: the one-push splitter still holds
                // those bytes, while the tracker passed them on (rustls had them). The same
                // stream, cut at a different place.
                assert!(got.starts_with(&whole.0), "takeover differs");
            }
        }
    }

    // `pass` (the spliced path: no copies) finds the frames `split` finds, and forwards the
    // same TLS bytes (sooner: a record header as it comes, where `split` waits for all of it).
    let mut p = Splitter::new();
    let (mut passed, mut frames, mut ok) = (Vec::new(), Vec::new(), true);
    'chunks: for c in rest.chunks(chunk) {
        let mut c = c;
        while !c.is_empty() {
            match p.pass(c) {
                Ok(out) => {
                    passed.extend_from_slice(&c[..out.tls]);
                    frames.extend(out.frame);
                    c = &c[out.consumed..];
                }
                Err(_) => {
                    ok = false;
                    break 'chunks;
                }
            }
        }
    }
    if ok && whole.2 {
        assert_eq!(frames, whole.1, "pass finds other frames than split");
        assert!(
            passed.starts_with(&whole.0),
            "pass forwards other bytes than split"
        );
    }

    // A relay serving a spliced connection, moved whenever its agent leaves.
    let mut serving = Relay::serving();
    for (i, c) in rest.chunks(chunk).enumerate() {
        let _ = match i % 3 {
            0 => serving.watch_client(c),
            1 => serving.watch_agent(c).map(drop),
            _ => serving.from_agent(c),
        };
        if i % 5 == 4 {
            serving.move_to(3, [7; crate::BINDING_LEN]);
        } else if i % 7 == 6 {
            serving.stay();
        }
        while serving.poll_action().is_some() {}
    }

    let third = rest.len() / 3;
    let (client, others) = rest.split_at(third);
    let (agent, home) = others.split_at(third);
    let mut relay = Relay::new();
    for (i, c) in client.chunks(chunk).enumerate() {
        let _ = relay.from_client(c);
        if let Some(a) = agent.chunks(chunk).nth(i) {
            let _ = relay.from_agent(a);
        }
        if i == 1 {
            relay.home_connected();
        }
        if let Some(h) = home.chunks(chunk).nth(i) {
            let _ = relay.from_home(h);
        }
        if i == 3 {
            relay.home_failed();
        }
        while relay.poll_action().is_some() {}
        assert!(relay.held_len() <= MAX_HELD + chunk);
    }
}

/// Everything a splitter yields from `data`: TLS bytes, frames, and whether no error came.
fn drain(s: &mut crate::Splitter, mut data: &[u8]) -> (Vec<u8>, Vec<crate::Frame>, bool) {
    let (mut tls, mut frames) = (Vec::new(), Vec::new());
    while !data.is_empty() {
        match s.split(data) {
            Ok(out) => {
                tls.extend(out.tls);
                frames.extend(out.frame);
                data = &data[out.consumed..];
            }
            Err(_) => return (tls, frames, false),
        }
    }
    (tls, frames, true)
}

// The fuzz targets' invariants on structured inputs, run on stable in `cargo test` too.
#[cfg(test)]
mod tests {
    use proptest::collection::vec;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn migration_streams(data in vec(any::<u8>(), 0..1024)) {
            super::migration(&data);
        }

        #[test]
        fn restart_messages(data in vec(any::<u8>(), 0..512)) {
            super::restart(&data);
        }
    }

    /// What libFuzzer found: a stream ending inside a record header that a tracker had
    /// partly passed on (the harness compared it with the held bytes of a one-push split).
    #[test]
    fn a_stream_ending_inside_a_header_after_a_takeover() {
        super::migration(&[0xff, 0x16, 0x03, 0x00, 0x00]);
        // and the same with the record whole: bytes after the takeover point match exactly
        super::migration(&[0xff, 0x16, 0x03, 0x00, 0x00, 0x01, 0x07]);
    }
}
