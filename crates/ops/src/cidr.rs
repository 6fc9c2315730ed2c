//! Source networks (`10.0.0.0/8`, `::1/128`, or a bare address): who may send a PROXY header
//! (`--proxy-protocol-from`). A header names the client the server routes, logs and forwards
//! as; accepting one from anyone lets anyone choose the address they are seen as.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An IP network: an address and how many leading bits of it count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// The loopback networks, v4 and v6: the default trusted source of PROXY headers, where the
    /// lab's balancers and a `baton up` dispatcher run.
    pub fn loopback() -> Vec<Cidr> {
        vec![
            Cidr {
                addr: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)),
                prefix: 8,
            },
            Cidr {
                addr: IpAddr::V6(Ipv6Addr::LOCALHOST),
                prefix: 128,
            },
        ]
    }

    /// Whether `ip` is in this network. An IPv4 address mapped into IPv6 (`::ffff:a.b.c.d`,
    /// what a dual-stack listener reports) is compared as the IPv4 address it is.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                prefix_eq(&net.octets(), &ip.octets(), self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(&net.octets(), &ip.octets(), self.prefix)
            }
            _ => false,
        }
    }

    /// Whether any of `nets` contains `ip`.
    pub fn any_contains(nets: &[Cidr], ip: IpAddr) -> bool {
        nets.iter().any(|n| n.contains(ip))
    }
}

fn prefix_eq(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let full = usize::from(prefix / 8);
    let rest = prefix % 8;
    if a[..full] != b[..full] {
        return false;
    }
    rest == 0 || {
        let mask = 0xffu8 << (8 - rest);
        a[full] & mask == b[full] & mask
    }
}

/// Why a network did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CidrError(String);

impl fmt::Display for CidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a network: give ADDR/PREFIX (10.0.0.0/8, fd00::/8) or an address",
            self.0
        )
    }
}

impl std::error::Error for CidrError {}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || CidrError(s.to_string());
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.trim().parse::<u8>().map_err(|_| bad())?,
            None => max,
        };
        if prefix > max {
            return Err(bad());
        }
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl<'de> serde::Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn networks_contain_what_they_should() {
        let net: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(net.contains(ip("10.1.255.3")));
        assert!(!net.contains(ip("10.2.0.1")));
        assert!(!net.contains(ip("::1")));
        let odd: Cidr = "192.168.4.0/22".parse().unwrap();
        assert!(odd.contains(ip("192.168.7.255")));
        assert!(!odd.contains(ip("192.168.8.0")));
        let one: Cidr = "203.0.113.9".parse().unwrap();
        assert_eq!(one.to_string(), "203.0.113.9/32");
        assert!(one.contains(ip("203.0.113.9")) && !one.contains(ip("203.0.113.8")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("8.8.8.8")));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        // a dual-stack listener's view of an IPv4 client
        assert!(Cidr::any_contains(
            &Cidr::loopback(),
            ip("::ffff:127.0.0.2")
        ));
        assert!(Cidr::any_contains(&Cidr::loopback(), ip("::1")));
        assert!(!Cidr::any_contains(&Cidr::loopback(), ip("10.0.0.1")));
    }

    #[test]
    fn bad_networks_are_refused() {
        for s in [
            "",
            "10.0.0.0/33",
            "::/129",
            "10.0.0/8",
            "10.0.0.0/",
            "10.0.0.0/x",
            "host",
        ] {
            let e = s.parse::<Cidr>().unwrap_err();
            assert!(e.to_string().contains("is not a network"), "{s}");
        }
    }

    proptest! {
        #[test]
        fn a_network_contains_exactly_the_addresses_sharing_its_prefix(
            net in any::<u32>(), ip in any::<u32>(), prefix in 0u8..=32
        ) {
            let cidr: Cidr = format!("{}/{prefix}", Ipv4Addr::from(net)).parse().unwrap();
            let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
            prop_assert_eq!(cidr.contains(IpAddr::V4(ip.into())), net & mask == ip & mask);
        }

        #[test]
        fn parsing_never_panics(s in "\\PC{0,60}") {
            let _ = s.parse::<Cidr>();
        }
    }
}
