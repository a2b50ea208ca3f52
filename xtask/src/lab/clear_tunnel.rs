//! A tunnel in clear between the gateways, the tunnel bench's reference:
//! a kernel ipip device with the WireGuards' MTU, on their path, their
//! device name and their routes, so the pods, the MTU and the agents' NAT
//! are the same and only the encryption is left out.

use anyhow::Result;

use super::external_tunnel::dev;
use crate::{
    cmd::ip,
    topology::{Cluster, PEERINGS},
};

/// The WireGuards' MTU in the lab.
const MTU: &str = "1420";

/// Creates the ipip device on `cluster`'s gateway, with no fixed remote:
/// each route's next hop, a peer gateway's WAN address, is the outer
/// destination.
pub fn start_on(cluster: &Cluster) -> Result<()> {
    let (gw, dev) = (cluster.gw(), dev(&cluster.gw()));
    let local = cluster.wan_addr().to_string();
    ip(&gw, &["link", "add", &dev, "type", "ipip", "local", &local])?;
    ip(&gw, &["link", "set", &dev, "mtu", MTU, "up"])?;
    for p in PEERINGS.iter().filter(|p| p.local.name == cluster.name) {
        let via = p.remote.wan_addr().to_string();
        for view in p.remote_views() {
            let view = view.to_string();
            ip(
                &gw,
                &["route", "add", &view, "via", &via, "dev", &dev, "onlink"],
            )?;
        }
    }
    Ok(())
}

/// Removes the ipip device of `cluster`'s gateway, and its routes with it,
/// if it has one.
pub fn stop_on(cluster: &Cluster) -> Result<()> {
    let (gw, dev) = (cluster.gw(), dev(&cluster.gw()));
    if ip(&gw, &["link", "show", &dev]).is_ok() {
        ip(&gw, &["link", "del", &dev])?;
    }
    Ok(())
}
