//! Client-address affinity: which server a client belongs to. The dispatcher uses it for a
//! client's home agent (`client-ip`, `handoff`), the agent for its `client-ip` upstream balance
//! (the paper's Pound-IP).
//!
//! Rendezvous hashing (highest random weight): each client scores every server by a hash of
//! (client, server key) and belongs to the best-scoring one. Unlike `hash % n`, adding a server
//! moves only the clients it now wins (about 1/(n+1) of them) and removing one moves only its
//! own clients; a server that is down hands each of its clients to that client's second choice,
//! so the other clients keep their homes. The hashes are fixed functions (FNV-1a over the
//! address bytes, then the SplitMix64 finalizer), not Rust's randomly keyed ones, so every
//! process (several dispatchers, restarts) makes the same choice from the same members.

use std::net::IpAddr;

/// The server of `client` among `n` keyed by their positions (`None` when there are none).
pub fn slot(client: IpAddr, n: usize) -> Option<usize> {
    best(client, (0..n as u64).map(|k| (k, true)))
}

/// The position in `servers` of the best-scoring server for `client` among those marked
/// available: `servers` yields each server's stable key (an agent id, not a list position,
/// where servers come and go) and whether it may be chosen. `None` when none may.
pub fn best(client: IpAddr, servers: impl IntoIterator<Item = (u64, bool)>) -> Option<usize> {
    let c = client_hash(client);
    servers
        .into_iter()
        .enumerate()
        .filter(|(_, (_, available))| *available)
        // Ties (a 2^-64 event) go to the lower position, so every process agrees.
        .max_by_key(|(i, (key, _))| (score(c, *key), std::cmp::Reverse(*i)))
        .map(|(i, _)| i)
}

/// A stable 64-bit hash of a client address (FNV-1a over its bytes); `hash % n` is how homes
/// were chosen before rendezvous hashing (the lab's `homes` experiment compares the two).
pub fn client_hash(client: IpAddr) -> u64 {
    match client {
        IpAddr::V4(v4) => fnv1a(&v4.octets()),
        IpAddr::V6(v6) => fnv1a(&v6.octets()),
    }
}

/// A client's score for one server. FNV-1a alone varies little in its high bits between
/// neighbouring addresses; the finalizer spreads every input bit over the whole word, which is
/// what makes the per-server maxima independent (and the load even).
fn score(client: u64, key: u64) -> u64 {
    splitmix64(client ^ splitmix64(key))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The SplitMix64 output function (Steele, Lea and Flood 2014).
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn client(i: u32) -> IpAddr {
        IpAddr::from((0x0a00_0000 | i).to_be_bytes())
    }

    const CLIENTS: u32 = 20_000;

    #[test]
    fn stable_and_in_range() {
        // FNV-1a's published test vector: "a" -> 0xaf63dc4c8601ec8c.
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        // SplitMix64 seeded with 0: its first output.
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
        let ip: IpAddr = "127.0.0.2".parse().unwrap();
        assert_eq!(slot(ip, 1), Some(0));
        assert_eq!(slot(ip, 0), None);
        assert_eq!(slot(ip, 7), slot(ip, 7));
        // The lab's three client hosts over two servers: two on one, one on the other, as
        // the CSSL paper's LB-IP had them.
        let hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"].map(|h| slot(h.parse().unwrap(), 2));
        assert_eq!(hosts, [Some(0), Some(1), Some(0)]);
    }

    #[test]
    fn nothing_available_is_no_choice() {
        assert_eq!(best(client(1), [(0, false), (1, false)]), None);
        assert_eq!(best(client(1), [(0, false), (7, true)]), Some(1));
    }

    #[test]
    fn load_is_within_a_few_percent_of_even() {
        for n in [2usize, 3, 5, 8] {
            let mut load = vec![0u32; n];
            for i in 0..CLIENTS {
                load[slot(client(i), n).unwrap()] += 1;
            }
            let even = CLIENTS as f64 / n as f64;
            for l in &load {
                let off = (*l as f64 - even).abs() / even;
                assert!(off < 0.05, "{n} servers: {load:?} ({off:.3} off even)");
            }
        }
    }

    /// The share of clients whose server differs between two memberships.
    fn moved(a: &[(u64, bool)], b: &[(u64, bool)]) -> f64 {
        let key = |m: &[(u64, bool)], i| best(client(i), m.iter().copied()).map(|p| m[p].0);
        let n = (0..CLIENTS).filter(|i| key(a, *i) != key(b, *i)).count();
        n as f64 / CLIENTS as f64
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// A server joining N takes about 1/(N+1) of the clients, and only for itself.
        #[test]
        fn a_join_moves_about_one_in_n_plus_one(n in 2usize..9, newcomer in 100u64..10_000) {
            let before: Vec<(u64, bool)> = (0..n as u64).map(|k| (k, true)).collect();
            let mut after = before.clone();
            after.push((newcomer, true));
            for i in 0..CLIENTS {
                let was = best(client(i), before.iter().copied()).unwrap();
                let now = best(client(i), after.iter().copied()).unwrap();
                prop_assert!(now == was || now == n, "client {i} moved between old servers");
            }
            let share = moved(&before, &after);
            let ideal = 1.0 / (n as f64 + 1.0);
            prop_assert!((share - ideal).abs() < 0.25 * ideal, "{share} moved, ideal {ideal}");
        }

        /// A server leaving (or down) moves its own clients and nobody else's, whatever its
        /// position in the list.
        #[test]
        fn a_leave_moves_only_its_clients(n in 3usize..9, gone in 0usize..8) {
            let gone = gone % n;
            let before: Vec<(u64, bool)> = (0..n as u64).map(|k| (k * 7 + 3, true)).collect();
            let mut down = before.clone();
            down[gone].1 = false;
            let mut removed = before.clone();
            removed.remove(gone);
            for i in 0..CLIENTS {
                let was = before[best(client(i), before.iter().copied()).unwrap()].0;
                let d = down[best(client(i), down.iter().copied()).unwrap()].0;
                let r = removed[best(client(i), removed.iter().copied()).unwrap()].0;
                // down and removed agree: a dead member and a missing one are the same
                prop_assert_eq!(d, r);
                if was != before[gone].0 {
                    prop_assert_eq!(d, was);
                }
            }
        }
    }
}
