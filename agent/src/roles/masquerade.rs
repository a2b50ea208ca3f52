//! A gateway's masquerade addresses, one per family: where flows towards a
//! peer whose source the peer cannot route back to leave from.
//! `--masquerade-ip` fixes them. Without it, a gateway that serves Liqo v1
//! takes the IPv4 address Liqo's own fabric gives such sources, which the
//! peers' `Configuration`s decide, and follows it; any other agent
//! masquerades nothing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use thiserror::Error;
use tracing::{error, info};

use crate::{
    kernel::conntrack::MasqueradeSettings,
    model::{liqo_v1, peer::Peer},
};

/// The addresses `--masquerade-ip` gives, by family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MasqueradeIps {
    /// IPv4 flows' address.
    pub ipv4: Option<Ipv4Addr>,
    /// IPv6 flows' address.
    pub ipv6: Option<Ipv6Addr>,
}

/// Two addresses of one family in `--masquerade-ip`: one would be left out.
#[derive(Debug, Error, PartialEq, Eq)]
#[error(
    "--masquerade-ip: {first} and {second} are of one family; give at most one address per family"
)]
pub struct TwoOfAFamily {
    first: IpAddr,
    second: IpAddr,
}

impl MasqueradeIps {
    /// The addresses of the flag's list.
    pub fn from_flag(addrs: &[IpAddr]) -> Result<Self, TwoOfAFamily> {
        let mut ips = Self::default();
        for &addr in addrs {
            let taken = match addr {
                IpAddr::V4(v4) => ips.ipv4.replace(v4).map(IpAddr::V4),
                IpAddr::V6(v6) => ips.ipv6.replace(v6).map(IpAddr::V6),
            };
            if let Some(first) = taken {
                return Err(TwoOfAFamily {
                    first,
                    second: addr,
                });
            }
        }
        Ok(ips)
    }

    /// Whether no family is masqueraded.
    pub fn is_empty(&self) -> bool {
        self.ipv4.is_none() && self.ipv6.is_none()
    }
}

/// The masquerade settings, and what decides them.
pub struct MasqueradeAddress {
    map: MasqueradeSettings,
    follows_liqo_v1: bool,
}

impl MasqueradeAddress {
    /// Sets `fixed`, or, where `follows_liqo_v1`, nothing until the peers
    /// give Liqo v1's address.
    pub fn new(
        mut map: MasqueradeSettings,
        fixed: MasqueradeIps,
        follows_liqo_v1: bool,
    ) -> Result<Self, aya::maps::MapError> {
        map.set(fixed.ipv4, fixed.ipv6)?;
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
        let (addr, addr6) = liqo_v1::unknown_sources(peers);
        match self.map.set(addr, addr6) {
            Ok(false) => {}
            Ok(true) => {
                if let Some(addr) = addr {
                    info!(%addr, ipv6 = ?addr6, "masquerading to the first address of our ExternalCIDR, as Liqo v1's fabric does");
                } else {
                    info!("no Liqo v1 peer: masquerading nothing");
                }
            }
            Err(e) => error!(error = %e, "setting the masquerade address; will retry"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_gives_one_address_per_family() {
        let [v4, v6, other_v4]: [IpAddr; 3] =
            ["10.244.255.254", "fd00:10:244::fffe", "10.0.0.1"].map(|a| a.parse().unwrap());
        let ips = MasqueradeIps::from_flag(&[v6, v4]).unwrap();
        assert_eq!(
            (ips.ipv4.map(IpAddr::V4), ips.ipv6.map(IpAddr::V6)),
            (Some(v4), Some(v6))
        );
        assert!(MasqueradeIps::from_flag(&[]).unwrap().is_empty());
        let err = MasqueradeIps::from_flag(&[v4, v6, other_v4]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--masquerade-ip: 10.244.255.254 and 10.0.0.1 are of one family; give at most one address per family"
        );
    }
}
