//! Cryptokey routing's table: whose networks hold an address, by longest
//! prefix, in both families. A peer's networks are where a packet to them
//! goes, and the only sources the peer may send from.

use std::{
    collections::{BTreeMap, HashMap},
    hash::Hash,
    net::IpAddr,
    ops::BitAnd,
};

use ipnet::IpNet;

/// One family's networks, longest prefix first: (mask, network → value).
struct Family<K, V> {
    longest_first: Vec<(K, HashMap<K, V>)>,
}

impl<K: Copy + Eq + Hash + BitAnd<Output = K>, V> Family<K, V> {
    /// The networks of `by_len`, by prefix length then network, each
    /// length's mask given by `mask`.
    fn new(by_len: BTreeMap<u8, HashMap<K, V>>, mask: impl Fn(u8) -> K) -> Self {
        let longest_first = by_len
            .into_iter()
            .rev()
            .map(|(len, nets)| (mask(len), nets))
            .collect();
        Self { longest_first }
    }

    fn get(&self, addr: K) -> Option<&V> {
        self.longest_first
            .iter()
            .find_map(|(mask, nets)| nets.get(&(addr & *mask)))
    }
}

/// Networks of both families, each leading to a `V`.
pub struct Routes<V> {
    ipv4: Family<u32, V>,
    ipv6: Family<u128, V>,
}

impl<V> Default for Routes<V> {
    fn default() -> Self {
        Self {
            ipv4: Family {
                longest_first: Vec::new(),
            },
            ipv6: Family {
                longest_first: Vec::new(),
            },
        }
    }
}

impl<V> Routes<V> {
    /// A table of `routes`; of two equal networks, the last stays.
    pub fn new(routes: impl IntoIterator<Item = (IpNet, V)>) -> Self {
        let mut ipv4: BTreeMap<u8, HashMap<u32, V>> = BTreeMap::new();
        let mut ipv6: BTreeMap<u8, HashMap<u128, V>> = BTreeMap::new();
        for (net, value) in routes {
            match net.trunc() {
                IpNet::V4(net) => {
                    let nets = ipv4.entry(net.prefix_len()).or_default();
                    nets.insert(u32::from(net.network()), value);
                }
                IpNet::V6(net) => {
                    let nets = ipv6.entry(net.prefix_len()).or_default();
                    nets.insert(u128::from(net.network()), value);
                }
            }
        }
        Self {
            ipv4: Family::new(ipv4, |len| {
                u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
            }),
            ipv6: Family::new(ipv6, |len| {
                u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
            }),
        }
    }

    /// What the longest network holding `addr` leads to.
    pub fn get(&self, addr: IpAddr) -> Option<&V> {
        match addr {
            IpAddr::V4(addr) => self.ipv4.get(u32::from(addr)),
            IpAddr::V6(addr) => self.ipv6.get(u128::from(addr)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(nets: &[(&str, u8)]) -> Routes<u8> {
        Routes::new(nets.iter().map(|(net, v)| (net.parse().unwrap(), *v)))
    }

    fn get(routes: &Routes<u8>, addr: &str) -> Option<u8> {
        routes.get(addr.parse().unwrap()).copied()
    }

    #[test]
    fn the_longest_network_of_the_addresss_family_wins() {
        let table = routes(&[
            ("10.0.0.0/16", 1),
            ("10.0.7.0/24", 2),
            ("0.0.0.0/0", 3),
            ("fd00:10::/32", 4),
            ("fd00:10:0:40::/64", 5),
            ("fd00:10:0:40::5/128", 6),
        ]);
        assert_eq!(get(&table, "10.0.7.9"), Some(2));
        assert_eq!(get(&table, "10.0.8.9"), Some(1));
        assert_eq!(get(&table, "192.0.2.1"), Some(3));
        assert_eq!(get(&table, "fd00:10:0:40::5"), Some(6));
        assert_eq!(get(&table, "fd00:10:0:40::6"), Some(5));
        assert_eq!(get(&table, "fd00:10:1::1"), Some(4));
        // IPv4's default route holds no IPv6 address, nor the mapped ones.
        assert_eq!(get(&table, "fd00:11::1"), None);
        assert_eq!(get(&table, "::ffff:10.0.7.9"), None);
        assert_eq!(get(&routes(&[("::/0", 7)]), "fe80::1"), Some(7));
        assert_eq!(get(&routes(&[("::/0", 7)]), "10.0.0.1"), None);
    }
}
