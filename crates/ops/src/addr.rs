//! Addresses on command lines: `IP:PORT`, or `HOST:PORT` resolved once, when the flags are read.

use std::net::{SocketAddr, ToSocketAddrs};

/// `127.0.0.1:8443`, `[::1]:8443` or `localhost:8443`. A host name is resolved at once; its first
/// IPv4 address is taken, else its first IPv6 one (a listener bound to one address, as `IP:PORT`
/// would be).
pub fn parse(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    if let Ok(addr) = s.parse() {
        return Ok(addr);
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!(
            "`{s}`: expected HOST:PORT or IP:PORT (e.g. 127.0.0.1:8443)"
        ));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!(
            "`{s}`: expected HOST:PORT or IP:PORT with a port from 0 to 65535"
        ));
    }
    let found: Vec<SocketAddr> = s
        .to_socket_addrs()
        .map_err(|e| format!("`{s}`: cannot resolve `{host}`: {e}"))?
        .collect();
    found
        .iter()
        .find(|a| a.is_ipv4())
        .or(found.first())
        .copied()
        .ok_or_else(|| format!("`{s}`: `{host}` has no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_names() {
        assert_eq!(parse("127.0.0.1:80"), Ok("127.0.0.1:80".parse().unwrap()));
        assert_eq!(parse("[::1]:80"), Ok("[::1]:80".parse().unwrap()));
        assert_eq!(
            parse("localhost:8443"),
            Ok("127.0.0.1:8443".parse().unwrap())
        );
        for bad in [
            "localhost",
            "localhost:",
            ":80",
            "localhost:99999",
            "no-such-host.invalid:80",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }
}
