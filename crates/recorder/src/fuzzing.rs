//! Entry point for the cargo-fuzz target in `fuzz/` (`http1`, which feeds the same input to
//! `baton_bench::fuzzing::http1`), so the fuzzed invariants are built and type-checked with
//! the crate. Unlike the rest of the crate this panics on purpose: a panic is a finding.

use crate::connect;

/// Bytes a browser sends `baton record` first: a proxy request head. The first byte is
/// skipped (the `http1` target's chunk size). Checks: a parsed `CONNECT` is no longer than
/// its input, names a host and a port, and parses the same from exactly its own bytes; an
/// incomplete head is under its limit.
pub fn connect(data: &[u8]) {
    let Some((_, rest)) = data.split_first() else {
        return;
    };
    match connect::parse(rest) {
        Ok(Some(connect::Head::Connect { host, port, len })) => {
            assert!(len <= rest.len() && !host.is_empty() && port != 0);
            assert_eq!(
                connect::parse(&rest[..len]),
                Ok(Some(connect::Head::Connect { host, port, len }))
            );
        }
        Ok(None) => assert!(rest.len() < connect::MAX_HEAD),
        Ok(Some(connect::Head::Refuse { .. })) | Err(_) => {}
    }
}

// The fuzz target's invariants on structured inputs, run on stable in `cargo test` too.
#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn proxy_requests(cut in any::<u8>(), method in "CONNECT|GET|[A-Z]{1,7}", target in "[a-z0-9.:\\[\\]]{0,30}") {
            let mut data = vec![cut];
            data.extend_from_slice(format!("{method} {target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
            super::connect(&data);
        }
    }
}
