//! Clients below TLS 1.2, refused with the alert they understand, before rustls sees them.

use crate::transport::agent_io::AgentIo;

/// `protocol_version` alert, TLS 1.0 record framing (what a TLS 1.0/1.1 client reads).
const PROTOCOL_VERSION_ALERT: [u8; 7] = [0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x46];

/// Refuses a client whose best version is below TLS 1.2 with the alert RFC 5246 (E.1) names,
/// `protocol_version`. rustls would refuse it too, but with `handshake_failure`: such a
/// ClientHello lacks the signature_algorithms extension and rustls checks that first.
/// Peeks (at least 11 bytes of `head`), so rustls still sees every byte; returns how many
/// bytes it peeked into `head`, `None` if the client was refused.
pub(crate) async fn refuse_legacy_client(
    io: &mut AgentIo,
    head: &mut [u8],
) -> std::io::Result<Option<usize>> {
    let n = io.peek(head).await?;
    if n == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    if !is_legacy_client_hello(&head[..n]) {
        return Ok(Some(n));
    }
    // Seven bytes into a fresh socket's send buffer: one try is enough, and a failure only
    // means the client goes without its alert.
    io.write_best_effort(&PROTOCOL_VERSION_ALERT).await;
    Ok(None)
}

/// Whether these first bytes of a connection are a ClientHello whose client_version is below
/// TLS 1.2 (0x0303). A TLS 1.3 client always sends 0x0303 there (RFC 8446 section 4.1.2), so
/// this never refuses a client that could negotiate 1.2 or 1.3. Too few bytes: not decided here.
pub(crate) fn is_legacy_client_hello(head: &[u8]) -> bool {
    // record: type 22 (handshake), version, length; handshake: type 1 (client_hello), u24 length,
    // then client_version.
    head.len() >= 11
        && head[0] == 0x16
        && head[5] == 0x01
        && u16::from_be_bytes([head[9], head[10]]) < 0x0303
        && head[9] == 0x03
}

#[cfg(test)]
mod tests {
    use super::is_legacy_client_hello;

    #[test]
    fn legacy_client_versions() {
        let hello = |v: [u8; 2]| {
            [
                0x16, 0x03, 0x01, 0x00, 0x80, 0x01, 0x00, 0x00, 0x7c, v[0], v[1],
            ]
        };
        assert!(is_legacy_client_hello(&hello([0x03, 0x01])), "TLS 1.0");
        assert!(is_legacy_client_hello(&hello([0x03, 0x02])), "TLS 1.1");
        assert!(is_legacy_client_hello(&hello([0x03, 0x00])), "SSL 3");
        assert!(
            !is_legacy_client_hello(&hello([0x03, 0x03])),
            "TLS 1.2 / 1.3"
        );
        assert!(
            !is_legacy_client_hello(&hello([0x03, 0x02])[..10]),
            "too short to tell"
        );
        assert!(!is_legacy_client_hello(b"GET / HTTP/1.1\r\n"), "not TLS");
    }
}
