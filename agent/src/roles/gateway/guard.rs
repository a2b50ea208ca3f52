//! The XDP guard's tables, kept in line with the tunnel: the tunnel's
//! ports, each open to initiations from anywhere or not; the sources that
//! may reach them (every peer's configured and current endpoint, in a
//! table of each family); and our
//! peers' session indexes. A peer that roams reaches userspace through its
//! session index; once authenticated, its new endpoint shows in the
//! tunnel's status and is allowed here.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
};

use aya::maps::MapError;
use isthmus_common::{
    guard::{GuardSource, Initiations},
    wire::{Be16, Be32, Be128},
};

use crate::kernel::{
    maps::{ByteHash, GuardMaps},
    table::Mirror,
};

/// The guard's tables.
pub struct Guard {
    sources: Mirror<ByteHash<GuardSource>>,
    sources6: Mirror<ByteHash<GuardSource<Be128>>>,
    indexes: Mirror<ByteHash<u32>>,
    ports: Mirror<ByteHash<Be16>>,
}

impl Guard {
    /// Starts from what the tables hold.
    pub fn new(maps: GuardMaps) -> Result<Self, MapError> {
        let GuardMaps {
            sources,
            sources6,
            indexes,
            ports,
        } = maps;
        Ok(Self {
            sources: Mirror::new(sources)?,
            sources6: Mirror::new(sources6)?,
            indexes: Mirror::new(indexes)?,
            ports: Mirror::new(ports)?,
        })
    }

    /// Guards exactly `ports`, each letting handshake initiations through
    /// from any source where it serves a peer that makes contact itself,
    /// or from peers' endpoints alone. Returns the ports whose setting
    /// changed, or the first failure after trying every change.
    pub fn set_ports(
        &mut self,
        ports: &BTreeMap<u16, Initiations>,
    ) -> Result<Vec<(u16, Initiations)>, MapError> {
        let wanted: BTreeMap<Be16, u8> = ports
            .iter()
            .map(|(port, initiations)| (Be16::from_host(*port), *initiations as u8))
            .collect();
        let changed: Vec<(u16, Initiations)> = ports
            .iter()
            .filter(|(port, initiations)| {
                self.ports.applied().get(&Be16::from_host(**port)) != Some(&(**initiations as u8))
            })
            .map(|(port, initiations)| (*port, *initiations))
            .collect();
        match self.ports.apply(&wanted) {
            (_, _, Some(e)) => Err(e),
            _ => Ok(changed),
        }
    }

    /// Allows exactly `endpoints` and `indexes`. Returns the first failure
    /// after trying every change.
    pub fn sync(
        &mut self,
        endpoints: &BTreeSet<SocketAddr>,
        indexes: &BTreeSet<u32>,
    ) -> Result<(), MapError> {
        let mut sources = BTreeMap::new();
        let mut sources6 = BTreeMap::new();
        for endpoint in endpoints {
            let port = Be16::from_host(endpoint.port());
            match endpoint {
                SocketAddr::V4(e) => sources.insert(GuardSource::new(Be32::from(*e.ip()), port), 1),
                SocketAddr::V6(e) => {
                    sources6.insert(GuardSource::new(Be128::from(*e.ip()), port), 1)
                }
            };
        }
        let indexes: BTreeMap<u32, u8> = indexes.iter().map(|i| (*i, 1)).collect();
        let (_, _, sources_failure) = self.sources.apply(&sources);
        let (_, _, sources6_failure) = self.sources6.apply(&sources6);
        let (_, _, indexes_failure) = self.indexes.apply(&indexes);
        match sources_failure.or(sources6_failure).or(indexes_failure) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    #[test]
    fn keys_are_in_wire_order() {
        let port = Be16::from_host(5871);
        let key = GuardSource::new(Be32::from(Ipv4Addr::new(203, 0, 113, 2)), port);
        // SAFETY: GuardSource is repr(C) integers; its bytes are what the kernel compares.
        let bytes: [u8; 8] = unsafe { std::mem::transmute(key) };
        assert_eq!(bytes, [203, 0, 113, 2, 0x16, 0xef, 0, 0]);
        let addr: Ipv6Addr = "2001:db8:ffff::2".parse().unwrap();
        let key = GuardSource::new(Be128::from(addr), port);
        // SAFETY: as above.
        let bytes: [u8; 20] = unsafe { std::mem::transmute(key) };
        assert_eq!(bytes[..16], addr.octets());
        assert_eq!(bytes[16..], [0x16, 0xef, 0, 0]);
    }
}
