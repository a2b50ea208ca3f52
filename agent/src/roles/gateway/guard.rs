//! The XDP guard's tables, kept in line with the tunnel: the sources that
//! may reach the tunnel port (every peer's configured and current
//! endpoint) and our peers' session indexes. A peer that roams reaches
//! userspace through its session index; once authenticated, its new
//! endpoint shows in the tunnel's status and is allowed here.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddrV4,
};

use aya::maps::MapError;
use isthmus_common::{
    guard::GuardSource,
    wire::{Be16, Be32},
};

use crate::kernel::{
    maps::{GuardMaps, GuardSettings, PresenceSet},
    table::Mirror,
};

/// The guard's tables.
pub struct Guard {
    sources: Mirror<PresenceSet<GuardSource>>,
    indexes: Mirror<PresenceSet<u32>>,
    settings: GuardSettings,
    port: u16,
    /// Whether initiations pass from anywhere, as last written.
    open: bool,
}

impl Guard {
    /// Starts from what the tables hold, and sets the tunnel `port`, with
    /// initiations passing only from peers' endpoints.
    pub fn new(maps: GuardMaps, port: u16) -> Result<Self, MapError> {
        let GuardMaps {
            sources,
            indexes,
            mut settings,
        } = maps;
        settings.set(port, false)?;
        Ok(Self {
            sources: Mirror::new(sources)?,
            indexes: Mirror::new(indexes)?,
            settings,
            port,
            open: false,
        })
    }

    /// Lets handshake initiations pass from any source (`open`), while the
    /// gateway serves a peer that makes contact itself, or only from peers'
    /// endpoints. Returns whether that changed.
    pub fn open_to_initiations(&mut self, open: bool) -> Result<bool, MapError> {
        if open == self.open {
            return Ok(false);
        }
        self.settings.set(self.port, open)?;
        self.open = open;
        Ok(true)
    }

    /// Allows exactly `endpoints` and `indexes`. Returns the first failure
    /// after trying every change.
    pub fn sync(
        &mut self,
        endpoints: &BTreeSet<SocketAddrV4>,
        indexes: &BTreeSet<u32>,
    ) -> Result<(), MapError> {
        let sources: BTreeMap<GuardSource, u8> =
            endpoints.iter().map(|e| (source(*e), 1)).collect();
        let indexes: BTreeMap<u32, u8> = indexes.iter().map(|i| (*i, 1)).collect();
        let (_, _, sources_failure) = self.sources.apply(&sources);
        let (_, _, indexes_failure) = self.indexes.apply(&indexes);
        match sources_failure.or(indexes_failure) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The guard's key for `endpoint`.
pub fn source(endpoint: SocketAddrV4) -> GuardSource {
    GuardSource::new(Be32::from(*endpoint.ip()), Be16::from_host(endpoint.port()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_in_wire_order() {
        let key = source("203.0.113.2:5871".parse().unwrap());
        // SAFETY: GuardSource is repr(C) integers; its bytes are what the kernel compares.
        let bytes: [u8; 8] = unsafe { std::mem::transmute(key) };
        assert_eq!(bytes, [203, 0, 113, 2, 0x16, 0xef, 0, 0]);
    }
}
