//! Entry points for the cargo-fuzz target in `fuzz/` (calling [`http1`]), so the fuzzed
//! invariants are built and type-checked with the crate. Unlike the rest of the crate this
//! panics on purpose: a panic is a finding. The same target feeds its input to
//! `baton_recorder::fuzzing::connect` (`baton record`'s proxy request heads).

use crate::http1::{parse_head, Chunked, MAX_HEAD};

/// Bytes a server under test sends: a response head, a chunked body. The first byte picks a
/// chunk size. Checks: a parsed head is no longer than its input and parses the same from
/// exactly its own bytes; an incomplete head is under its limit; the chunked decoder reaches
/// the same outcome whole and in chunks, and never claims more than it was given.
pub fn http1(data: &[u8]) {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let chunk = 1 + usize::from(cut % 64);

    for head_request in [false, true] {
        match parse_head(rest, head_request) {
            Ok(Some(head)) => {
                assert!(head.len <= rest.len());
                assert_eq!(parse_head(&rest[..head.len], head_request), Ok(Some(head)));
            }
            Ok(None) => assert!(rest.len() < MAX_HEAD),
            Err(_) => {}
        }
    }

    let whole = Chunked::default().push(rest);
    if let Ok((used, _)) = whole {
        assert!(used <= rest.len());
    }
    let mut body = Chunked::default();
    let mut chunked = Ok((0, false));
    for piece in rest.chunks(chunk) {
        match body.push(piece) {
            Ok((used, done)) => {
                assert!(used <= piece.len());
                assert!(
                    done || used == piece.len(),
                    "stopped early without finishing"
                );
                chunked = Ok((chunked.map_or(0, |c| c.0) + used, done));
                if done {
                    break;
                }
            }
            Err(e) => {
                chunked = Err(e);
                break;
            }
        }
    }
    match (&whole, &chunked) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "chunked body differs by chunking"),
        (Err(_), Err(_)) => {}
        (a, b) => panic!("whole {a:?}, in chunks {b:?}"),
    }
}

// The fuzz target's invariants on structured inputs, run on stable in `cargo test` too.
#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn response_heads_and_chunked_bodies(
            cut in any::<u8>(),
            status in 100u16..600,
            headers in prop::collection::vec(
                ("(?i:content-length|transfer-encoding|connection|x-a)", "[ -~]{0,12}"),
                0..5,
            ),
            body in "([0-9a-fA-F]{1,3}(;[a-z=]{0,5})?\r\n[a-z]{0,20}\r\n){0,4}0\r\n([a-z: ]{0,10}\r\n)?\r\n",
        ) {
            let mut data = vec![cut];
            data.extend_from_slice(format!("HTTP/1.1 {status} X\r\n").as_bytes());
            for (name, value) in &headers {
                data.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
            }
            data.extend_from_slice(b"\r\n");
            super::http1(&data);
            let mut chunked = vec![cut];
            chunked.extend_from_slice(body.as_bytes());
            super::http1(&chunked);
        }

    }
}
