//! Entry points for the cargo-fuzz targets in `fuzz/` that exercise the link (each target is
//! one line calling a function here), so the fuzzed code and its invariants are built and
//! type-checked with the crate. Unlike the rest of the crate these functions panic on purpose:
//! a panic is a finding.

use crate::seal::{Opener, Sealer};

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
        }
    }
}
