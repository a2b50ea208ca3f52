//! A gateway's masquerade address: where flows towards a peer whose source
//! the peer cannot route back to leave from. `--masquerade-ip` fixes it.
//! Without it, a gateway that serves Liqo v1 takes the address Liqo's own
//! fabric gives such sources, which the peers' `Configuration`s decide, and
//! follows it; any other agent masquerades nothing.

use std::net::Ipv4Addr;

use tracing::{error, info};

use crate::{
    kernel::conntrack::Masquerade,
    model::{liqo_v1, peer::Peer},
};

/// The masquerade setting, and what decides it.
pub struct MasqueradeAddress {
    map: Masquerade,
    follows_liqo_v1: bool,
}

impl MasqueradeAddress {
    /// Sets `fixed`, or, where `follows_liqo_v1`, nothing until the peers
    /// give Liqo v1's address.
    pub fn new(
        mut map: Masquerade,
        fixed: Option<Ipv4Addr>,
        follows_liqo_v1: bool,
    ) -> Result<Self, aya::maps::MapError> {
        map.set(fixed)?;
        Ok(Self {
            map,
            follows_liqo_v1,
        })
    }

    /// Follows the peers, where the address is Liqo v1's. A failure is
    /// logged and tried again at the next pass.
    pub fn follow(&mut self, peers: &[Peer]) {
        if !self.follows_liqo_v1 {
            return;
        }
        let addr = liqo_v1::unknown_source(peers);
        match self.map.set(addr) {
            Ok(false) => {}
            Ok(true) => {
                if let Some(addr) = addr {
                    info!(%addr, "masquerading to the first address of our ExternalCIDR, as Liqo v1's fabric does");
                } else {
                    info!("no Liqo v1 peer: masquerading nothing");
                }
            }
            Err(e) => error!(error = %e, "setting the masquerade address; will retry"),
        }
    }
}
