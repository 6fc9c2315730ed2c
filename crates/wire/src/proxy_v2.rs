//! PROXY protocol version 2 (haproxy's `proxy-protocol.txt`, section 2.2): the binary header a
//! load balancer or the dispatcher puts in front of a TCP stream to pass on the client's
//! address, so agents log and persist on the real client rather than on the dispatcher.
//!
//! Only TCP over IPv4/IPv6 and the LOCAL command (health checks) are produced; TLVs are
//! accepted and skipped.

use std::net::{IpAddr, SocketAddr};

/// The 12-byte signature every v2 header starts with.
pub const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// Signature, version/command, family, length.
pub const FIXED_LEN: usize = 16;
/// Largest address block accepted (addresses plus TLVs); real headers are far smaller.
pub const MAX_BLOCK: usize = 512;

/// What a header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyHeader {
    /// A proxied connection: who connected, and to which address.
    Proxy {
        source: SocketAddr,
        destination: SocketAddr,
    },
    /// A connection made by the proxy itself (a health check): use the real peer address.
    Local,
}

/// Why a header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    #[error("not a PROXY protocol v2 header")]
    Signature,
    #[error("unsupported PROXY protocol version or command")]
    Version,
    #[error("unsupported PROXY address family or transport")]
    Family,
    #[error("PROXY header address block too short or too long")]
    Length,
}

/// Total header length once its first [`FIXED_LEN`] bytes are known; `Ok(None)` if fewer are
/// given. Lets a reader fetch exactly the header and not one byte of what follows.
pub fn header_len(fixed: &[u8]) -> Result<Option<usize>, ProxyError> {
    let sig_part = fixed.len().min(SIGNATURE.len());
    if fixed[..sig_part] != SIGNATURE[..sig_part] {
        return Err(ProxyError::Signature);
    }
    let Some(len) = fixed.get(14..16) else {
        return Ok(None);
    };
    let len = u16::from_be_bytes([len[0], len[1]]) as usize;
    if len > MAX_BLOCK {
        return Err(ProxyError::Length);
    }
    Ok(Some(FIXED_LEN + len))
}

/// Parses a complete header (exactly `header_len` bytes).
pub fn decode(header: &[u8]) -> Result<ProxyHeader, ProxyError> {
    let total = header_len(header)?.ok_or(ProxyError::Length)?;
    if header.len() != total {
        return Err(ProxyError::Length);
    }
    let block = &header[FIXED_LEN..];
    match header[12] {
        0x20 => return Ok(ProxyHeader::Local),
        0x21 => {}
        _ => return Err(ProxyError::Version),
    }
    let port = |b: &[u8]| u16::from_be_bytes([b[0], b[1]]);
    match header[13] {
        // TCP over IPv4
        0x11 if block.len() >= 12 => {
            let src: [u8; 4] = block[0..4].try_into().map_err(|_| ProxyError::Length)?;
            let dst: [u8; 4] = block[4..8].try_into().map_err(|_| ProxyError::Length)?;
            Ok(ProxyHeader::Proxy {
                source: SocketAddr::new(IpAddr::from(src), port(&block[8..10])),
                destination: SocketAddr::new(IpAddr::from(dst), port(&block[10..12])),
            })
        }
        // TCP over IPv6
        0x21 if block.len() >= 36 => {
            let src: [u8; 16] = block[0..16].try_into().map_err(|_| ProxyError::Length)?;
            let dst: [u8; 16] = block[16..32].try_into().map_err(|_| ProxyError::Length)?;
            Ok(ProxyHeader::Proxy {
                source: SocketAddr::new(IpAddr::from(src), port(&block[32..34])),
                destination: SocketAddr::new(IpAddr::from(dst), port(&block[34..36])),
            })
        }
        0x11 | 0x21 => Err(ProxyError::Length),
        _ => Err(ProxyError::Family),
    }
}

/// Encodes a header. Mixed address families are sent as IPv6 (IPv4-mapped).
pub fn encode(header: &ProxyHeader, out: &mut Vec<u8>) {
    out.extend_from_slice(&SIGNATURE);
    let ProxyHeader::Proxy {
        source,
        destination,
    } = header
    else {
        out.extend_from_slice(&[0x20, 0x00, 0x00, 0x00]);
        return;
    };
    out.push(0x21);
    match (source.ip(), destination.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            out.extend_from_slice(&[0x11, 0x00, 12]);
            out.extend_from_slice(&s.octets());
            out.extend_from_slice(&d.octets());
        }
        (s, d) => {
            let v6 = |ip: IpAddr| match ip {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            out.extend_from_slice(&[0x21, 0x00, 36]);
            out.extend_from_slice(&v6(s).octets());
            out.extend_from_slice(&v6(d).octets());
        }
    }
    out.extend_from_slice(&source.port().to_be_bytes());
    out.extend_from_slice(&destination.port().to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips_v4_v6_and_local() {
        for h in [
            ProxyHeader::Proxy {
                source: "192.0.2.1:5555".parse().unwrap(),
                destination: "127.0.0.1:443".parse().unwrap(),
            },
            ProxyHeader::Proxy {
                source: "[2001:db8::1]:5555".parse().unwrap(),
                destination: "[::1]:443".parse().unwrap(),
            },
            ProxyHeader::Local,
        ] {
            let mut out = Vec::new();
            encode(&h, &mut out);
            assert_eq!(header_len(&out[..FIXED_LEN]), Ok(Some(out.len())));
            assert_eq!(decode(&out), Ok(h));
        }
    }

    #[test]
    fn haproxy_example_with_tlv_is_accepted() {
        // v2 PROXY TCP4 127.0.0.1:40000 -> 127.0.0.1:8443, plus a 4-byte NOOP TLV
        let mut h = SIGNATURE.to_vec();
        h.extend_from_slice(&[
            0x21, 0x11, 0x00, 16, 127, 0, 0, 1, 127, 0, 0, 1, 0x9c, 0x40, 0x20, 0xfb,
        ]);
        h.extend_from_slice(&[0x04, 0x00, 0x01, 0x00]);
        assert_eq!(
            decode(&h),
            Ok(ProxyHeader::Proxy {
                source: "127.0.0.1:40000".parse().unwrap(),
                destination: "127.0.0.1:8443".parse().unwrap()
            })
        );
    }

    #[test]
    fn refuses_what_it_is_not() {
        assert_eq!(
            header_len(b"\x16\x03\x01\x02\x00"),
            Err(ProxyError::Signature)
        );
        assert_eq!(
            header_len(b"PROXY TCP4 1.2.3.4"),
            Err(ProxyError::Signature)
        );
        assert_eq!(header_len(&SIGNATURE[..5]), Ok(None));
        let mut big = SIGNATURE.to_vec();
        big.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
        assert_eq!(header_len(&big), Err(ProxyError::Length));
        let mut short = SIGNATURE.to_vec();
        short.extend_from_slice(&[0x21, 0x11, 0x00, 4, 1, 2, 3, 4]);
        assert_eq!(decode(&short), Err(ProxyError::Length));
        let mut udp = SIGNATURE.to_vec();
        udp.extend_from_slice(&[0x21, 0x12, 0x00, 12]);
        udp.extend_from_slice(&[0; 12]);
        assert_eq!(decode(&udp), Err(ProxyError::Family));
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = header_len(&bytes);
            let _ = decode(&bytes);
            let mut with_sig = SIGNATURE.to_vec();
            with_sig.extend_from_slice(&bytes);
            let _ = header_len(&with_sig);
            let _ = decode(&with_sig);
        }
    }
}
