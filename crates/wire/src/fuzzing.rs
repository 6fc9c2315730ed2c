//! Entry points for the cargo-fuzz targets in `fuzz/` (each target is one line calling a
//! function here), so the fuzzed code and its invariants are built and type-checked with the
//! crate. Unlike the rest of the crate these functions panic on purpose: a panic is a finding.

use std::mem::discriminant;

use crate::hello::{ClientHello, HelloReader, Progress};
use crate::message::FirstMessage;
use crate::server_hello::{ServerHello, ServerHelloReader};
use crate::DEFAULT_MESSAGE_LIMIT;

/// Feeds `data` to every parser, as a handshake message and as a stream of records, and checks:
/// nothing panics; a parsed hello encodes to bytes that parse back to the same hello; the
/// streaming reader never holds more than its limit, consumes what it says, and reaches the
/// same outcome in chunks as in one push.
pub fn client_hello(data: &[u8]) {
    if let Ok(hello) = ClientHello::read_message(data) {
        let mut again = Vec::new();
        hello.encode_message(&mut again);
        assert_eq!(
            ClientHello::read_message(&again).as_ref(),
            Ok(&hello),
            "ClientHello round trip"
        );
    }
    if let Ok(hello) = ServerHello::read_message(data) {
        let mut again = Vec::new();
        hello.encode_message(&mut again);
        assert_eq!(
            ServerHello::read_message(&again).as_ref(),
            Ok(&hello),
            "ServerHello round trip"
        );
    }
    let _ = ServerHelloReader::new().push(data);

    // The last two bytes choose the chunk size and the limit, so the input still starts with a
    // record header the fuzzer can learn from the corpus.
    let n = data.len();
    let chunk = 1 + usize::from(data.last().copied().unwrap_or(0) % 64);
    let limit = match n.checked_sub(2).and_then(|i| data.get(i)) {
        Some(&b) if b < 128 => usize::from(b) * 32,
        _ => DEFAULT_MESSAGE_LIMIT,
    };
    let whole = HelloReader::with_limit(limit).push(data);
    assert!(
        !matches!(whole, Ok(Progress::Done(_, used)) if used > n),
        "consumed more than given"
    );

    let mut reader = HelloReader::with_limit(limit);
    let mut fed = 0;
    let mut last = Ok(Progress::NeedMore);
    for piece in data.chunks(chunk) {
        last = reader.push(piece);
        assert!(
            reader.buffered() <= limit,
            "held {} over limit {limit}",
            reader.buffered()
        );
        match &last {
            Ok(Progress::NeedMore) => fed += piece.len(),
            Ok(Progress::Done(_, used)) => {
                assert!(*used <= piece.len());
                fed += used;
                break;
            }
            Err(_) => break,
        }
    }
    match (&whole, &last) {
        (Ok(Progress::Done(a, used)), Ok(Progress::Done(b, _))) => {
            assert_eq!(a, b, "chunked parse differs");
            assert_eq!(*used, fed, "chunked consumption differs");
            assert_eq!(reader.consumed(), fed);
        }
        (Ok(Progress::NeedMore), Ok(Progress::NeedMore)) => assert_eq!(fed, n),
        (Err(a), Err(b)) => assert_eq!(discriminant(a), discriminant(b), "{a} vs {b}"),
        (a, b) => panic!("one push gave {a:?}, chunks gave {b:?}"),
    }
}

/// Decodes hostile bytes as dispatcher-handover messages (`crate::handover`). Checks: nothing
/// panics; a message that decodes encodes back to exactly its bytes (one wire form each), and
/// a relay resumed at a decoded position follows the rest of the input without panicking.
pub fn handover(data: &[u8]) {
    use crate::handover::Message;
    let mut buf = data;
    while let Ok((m, used)) = Message::decode(buf) {
        assert_eq!(m.to_bytes(), &buf[..used], "a second wire form");
        if let Message::Conn(c) = &m {
            let mut relay = crate::handoff::Relay::resume(c.position.clone());
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
pub fn handoff(data: &[u8]) {
    use crate::handoff::{Relay, Splitter, MAX_HELD};

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
            serving.move_to(3, [7; crate::handoff::BINDING_LEN]);
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
fn drain(
    s: &mut crate::handoff::Splitter,
    mut data: &[u8],
) -> (Vec<u8>, Vec<crate::handoff::Frame>, bool) {
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

/// A PROXY protocol v2 header from an L4 balancer, read the way the agent reads it: the
/// length from the fixed part, then the whole header. Checks: the length stays within its
/// bound; a decoded header encodes to one that decodes to the same addresses and whose length
/// the fixed part announces.
pub fn proxy_v2(data: &[u8]) {
    use crate::proxy_v2::{decode, encode, header_len, FIXED_LEN, MAX_BLOCK};

    let _ = decode(data);
    let Ok(Some(len)) = header_len(&data[..data.len().min(FIXED_LEN)]) else {
        return;
    };
    assert!((FIXED_LEN..=FIXED_LEN + MAX_BLOCK).contains(&len));
    let Some(Ok(header)) = data.get(..len).map(decode) else {
        return;
    };
    let mut again = Vec::new();
    encode(&header, &mut again);
    assert_eq!(header_len(&again), Ok(Some(again.len())));
    assert_eq!(decode(&again), Ok(header), "PROXY v2 round trip");
}

// The fuzz targets' invariants on structured inputs, run on stable in `cargo test` too.
#[cfg(test)]
mod tests {
    use proptest::collection::vec;
    use proptest::prelude::*;

    use crate::proxy_v2::SIGNATURE;

    proptest! {
        #[test]
        fn proxy_v2_headers(
            command in prop::sample::select(vec![0x20u8, 0x21, 0x22, 0x11]),
            family in prop::sample::select(vec![0x11u8, 0x21, 0x12, 0x31, 0x00]),
            block in vec(any::<u8>(), 0..64),
            claimed in prop::option::of(0u16..600),
            trailing in vec(any::<u8>(), 0..8),
        ) {
            let len = claimed.unwrap_or(block.len() as u16);
            let mut data = SIGNATURE.to_vec();
            data.extend_from_slice(&[command, family]);
            data.extend_from_slice(&len.to_be_bytes());
            data.extend_from_slice(&block);
            data.extend_from_slice(&trailing);
            super::proxy_v2(&data);
        }

        #[test]
        fn handoff_streams(data in vec(any::<u8>(), 0..1024)) {
            super::handoff(&data);
        }

        #[test]
        fn handover_messages(data in vec(any::<u8>(), 0..512)) {
            super::handover(&data);
        }
    }

    /// What libFuzzer found: a stream ending inside a record header that a tracker had
    /// partly passed on (the harness compared it with the held bytes of a one-push split).
    #[test]
    fn a_stream_ending_inside_a_header_after_a_takeover() {
        super::handoff(&[0xff, 0x16, 0x03, 0x00, 0x00]);
        // and the same with the record whole: bytes after the takeover point match exactly
        super::handoff(&[0xff, 0x16, 0x03, 0x00, 0x00, 0x01, 0x07]);
    }
}
