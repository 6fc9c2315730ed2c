//! Entry points for the cargo-fuzz targets in `fuzz/` that exercise the link (each target is
//! one line calling a function here: `link_records`, the sealed records; `link_frames`, the
//! frames inside them and a connection's streams), so the fuzzed code and its invariants are built and
//! type-checked with the crate. Unlike the rest of the crate these functions panic on purpose:
//! a panic is a finding.

use bytes::BytesMut;

use crate::frame::{self, Frame};
use crate::mux::{Conn, Role};
use crate::seal::{Opener, Sealer};
use crate::StreamMeta;

/// Feeds hostile bytes to the link's record reader, in pieces the first byte sizes, as records
/// (nothing may come out: no record of them opens, nor any after a refused one) and as the
/// plaintext a peer seals (all of it comes out, in order, in any pieces), and flips the byte
/// the second names in what was sealed (refused, or waiting for more: never opened).
/// Also offers the bytes as a handshake's first message (refused). Checks: nothing panics,
/// the reader never holds more than one record.
pub fn link_records(data: &[u8]) {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let step = 1 + usize::from(cut) * 257;
    let (dispatcher, agent) = crate::seal::pair();

    let mut o = Opener::new(agent.clone());
    let got = feed(&mut o, rest, step);
    assert!(got.as_ref().is_err() || got.as_ref().is_ok_and(Vec::is_empty));

    let mut wire = Vec::new();
    Sealer::new(dispatcher)
        .seal(rest, &mut wire)
        .expect("a fresh sealer seals");
    let mut o = Opener::new(agent.clone());
    assert_eq!(feed(&mut o, &wire, step).as_deref(), Ok(rest));
    assert!(!o.partial());

    if let Some((&at, _)) = rest.split_first() {
        if !wire.is_empty() {
            let i = usize::from(at) * 131 % wire.len();
            wire[i] ^= 1 << (at % 8);
            let mut o = Opener::new(agent.clone());
            let fed = feed(&mut o, &wire, step);
            // the records before the flipped one open; nothing from it or after
            if let Ok(got) = fed {
                assert!(got.len() < rest.len() && o.partial());
            }
        }
    }

    let ring = baton_session::ticket::KeyRing::parse_key_file(
        "00000001 4242424242424242424242424242424242424242424242424242424242424242",
        std::time::Instant::now(),
    )
    .expect("a fixed key");
    let hello = crate::auth::AgentHello {
        agent_id: 1,
        link_id: [0; 16],
    };
    assert!(crate::auth::respond(&crate::auth::psks(&ring), rest, &hello).is_err());
}

/// Decodes hostile bytes as the frames inside the link's records and applies them to a
/// link connection's state at either end (the dispatcher's with a few streams open). Checks:
/// nothing panics, what decodes encodes back to the same bytes, a refused frame stops the
/// decoding for good, and what the streams hold stays within their windows.
pub fn link_frames(data: &[u8]) {
    let mut buf = BytesMut::from(data);
    let mut frames = Vec::new();
    loop {
        let before = buf.clone();
        match frame::decode(&mut buf) {
            Ok(Some(f)) => {
                let mut again = BytesMut::new();
                frame::put(&mut again, &f);
                let used = before.len() - buf.len();
                assert_eq!(&again[..], &before[..used], "{f:?} encodes back");
                frames.push(f);
            }
            Ok(None) => break,
            Err(_) => {
                // refused from its head on: the same error however much more comes
                let mut more = before.clone();
                more.extend_from_slice(&[0u8; 32]);
                assert!(frame::decode(&mut more).is_err());
                break;
            }
        }
    }
    for role in [Role::Agent, Role::Dispatcher] {
        let mut conn = Conn::new(role);
        if role == Role::Dispatcher {
            let meta = StreamMeta::followed(
                "192.0.2.1:1000".parse().expect("an address"),
                "192.0.2.2:443".parse().expect("an address"),
            );
            for _ in 0..4 {
                conn.open(&meta).expect("a fresh link opens streams");
            }
        }
        let (mut wakers, mut events) = (Vec::new(), Vec::new());
        for f in frames.iter().cloned() {
            if conn.receive(f, &mut wakers, &mut events).is_err() {
                break;
            }
            let (total, most) = conn.buffered();
            assert!(total <= crate::CONNECTION_WINDOW as usize);
            assert!(most <= crate::STREAM_WINDOW as usize);
        }
    }
}

/// Frames for the fuzz target's seed corpus and the tests: a dispatcher's stream opened,
/// fed, ended and reset, as the agent receives them.
pub fn sample_frames() -> Vec<u8> {
    let mut meta = Vec::new();
    StreamMeta::followed(
        "192.0.2.1:1000".parse().expect("an address"),
        "192.0.2.2:443".parse().expect("an address"),
    )
    .encode(&mut meta);
    let mut out = BytesMut::new();
    for f in [
        Frame::Open(1, meta.into()),
        Frame::Data(1, bytes::Bytes::from_static(b"client hello")),
        Frame::Window(0, 1000),
        Frame::Window(1, 1000),
        Frame::End(1, frame::End::Handover([7; 16])),
        Frame::Reset(1, frame::Reason::Cancel),
    ] {
        frame::put(&mut out, &f);
    }
    out.to_vec()
}

/// Everything `o` gives out for `wire` received in pieces of `step`, or its error (the
/// record reader's own tests use it too).
pub(crate) fn feed(
    o: &mut Opener,
    wire: &[u8],
    step: usize,
) -> Result<Vec<u8>, crate::seal::Integrity> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    let mut rest = wire;
    loop {
        loop {
            let n = o.read(&mut buf)?;
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        if rest.is_empty() {
            return Ok(got);
        }
        let spare = o.spare();
        assert!(
            !spare.is_empty(),
            "the reader asked for bytes it has no room for"
        );
        let n = step.min(rest.len()).min(spare.len());
        spare[..n].copy_from_slice(&rest[..n]);
        o.filled(n);
        rest = &rest[n..];
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_fuzz_entry_point_runs_on_samples() {
        for data in [
            &b""[..],
            b"\x00",
            b"\x00hello",
            b"\x03\x00\x10aaaaaaaaaaaaaaaaaaaaaaaa",
            &[0xff; 70_000],
        ] {
            super::link_records(data);
            super::link_frames(data);
        }
        let wire = super::sample_frames();
        super::link_frames(&wire);
        for cut in 0..wire.len() {
            super::link_frames(&wire[..cut]);
            let mut flipped = wire.clone();
            flipped[cut] ^= 0x41;
            super::link_frames(&flipped);
        }
    }
}
