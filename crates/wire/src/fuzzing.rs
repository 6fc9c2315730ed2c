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
    }
}
