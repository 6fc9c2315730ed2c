//! Entry point for the cargo-fuzz target `fuzz/fuzz_targets/signer_frame.rs`, built and
//! type-checked with the crate (and run by a property test). Panics on purpose: a panic is a
//! finding.

use crate::protocol::{split_frame, Request, Response, MAX_FRAME};

/// Splits `data` into frames and decodes each as a request and as a response, checking:
/// nothing panics; a frame split is never longer than the limit; whatever decodes encodes
/// back to the same frame bytes (one reading per frame).
pub fn frames(data: &[u8]) {
    let mut rest = data;
    while let Ok(Some((frame, used))) = split_frame(rest) {
        assert!(frame.len() <= MAX_FRAME && used == frame.len() + 4 && used <= rest.len());
        if let Ok((id, req)) = Request::decode(frame) {
            let mut again = Vec::new();
            req.encode(id, &mut again);
            assert_eq!(&again[4..], frame, "request re-encodes to its frame");
        }
        if let Ok((id, resp)) = Response::decode(frame) {
            let mut again = Vec::new();
            resp.encode(id, &mut again);
            assert_eq!(&again[4..], frame, "response re-encodes to its frame");
        }
        rest = &rest[used..];
    }
}
