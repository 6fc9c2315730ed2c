//! Entry points for the cargo-fuzz targets in `fuzz/` (each target is one line calling a
//! function here), so the fuzzed code and its invariants are built and type-checked with the
//! crate. Unlike the rest of the crate these functions panic on purpose: a panic is a finding.

use std::mem::discriminant;

use crate::hello::{ClientHello, HelloReader, Progress};
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
