//! Client-address affinity: which of `n` servers a client belongs to. The dispatcher uses it for
//! a client's home agent (`client-ip`, `handoff`), the agent for its `client-ip` upstream
//! balance (the paper's Pound-IP). A stable hash (FNV-1a over the address bytes), not Rust's
//! randomly keyed one, so a client keeps its server across restarts and across processes.

use std::net::IpAddr;

/// The server of `client` among `n` (`None` when there are none).
pub fn slot(client: IpAddr, n: usize) -> Option<usize> {
    let hash = match client {
        IpAddr::V4(v4) => fnv1a(&v4.octets()),
        IpAddr::V6(v6) => fnv1a(&v6.octets()),
    };
    (n > 0).then(|| (hash % n as u64) as usize)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_and_in_range() {
        // FNV-1a's published test vector: "a" -> 0xaf63dc4c8601ec8c.
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        let ip: IpAddr = "127.0.0.2".parse().unwrap();
        assert_eq!(slot(ip, 1), Some(0));
        assert_eq!(slot(ip, 0), None);
        assert_eq!(slot(ip, 7), slot(ip, 7));
        let hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"].map(|h| slot(h.parse().unwrap(), 2));
        assert!(hosts.iter().all(|s| s.is_some_and(|s| s < 2)));
    }
}
