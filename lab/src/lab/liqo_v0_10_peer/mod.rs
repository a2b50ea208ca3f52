//! The Liqo-peer lab (`cargo xtask lab up --liqo-v0-10-peer b`): one cluster's
//! gateway runs the way Liqo v0.10 runs it, not with Isthmus, so that the
//! other clusters' Isthmus gateways are checked against the real thing:
//! - wireguard-go, configured with `wg` from the cluster's TunnelEndpoints;
//! - Liqo's iptables rules ([`iptables`]) for the double NAT,
//!   the NatMappings and the forward chain;
//! - 169.254.0.1 on the tunnel device, and Liqo's conncheck
//!   ([`super::liqo_conncheck`]), which PINGs every peer.
//!
//! Its workers route the peers' networks to the gateway, as Liqo's route
//! operator does; no Isthmus agent runs in the cluster.

pub mod iptables;

use anyhow::Result;

use super::{
    external_tunnel,
    liqo_conncheck::{self, Api},
};
use crate::{
    cmd::ip,
    topology::{CONNCHECK_ADDR, Cluster},
};

/// Sets up `cluster`'s gateway and worker as Liqo v0.10 would.
pub fn start(cluster: &'static Cluster) -> Result<()> {
    let gw = cluster.gw();
    external_tunnel::start_on(
        external_tunnel::Implementation::WireguardGoBookworm,
        cluster,
    )?;
    let dev = external_tunnel::dev(&gw);
    ip(
        &gw,
        &["addr", "add", &format!("{CONNCHECK_ADDR}/32"), "dev", &dev],
    )?;
    iptables::install(cluster, 0)?;
    route_worker(cluster, "add")?;
    liqo_conncheck::start(cluster, Api::V0_10)
}

/// Adds (`add`) or removes (`del`) the routes Liqo's route operator gives
/// `cluster`'s worker: each peer's networks via the gateway.
pub fn route_worker(cluster: &Cluster, action: &str) -> Result<()> {
    for p in cluster.peerings() {
        for view in p.remote_views() {
            let (view, via) = (view.to_string(), cluster.lan_gw().to_string());
            ip(&cluster.node(), &["route", action, &view, "via", &via])?;
        }
    }
    Ok(())
}
