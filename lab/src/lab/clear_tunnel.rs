//! A tunnel in clear between the gateways, the tunnel bench's reference:
//! a VXLAN device (the one tunnel this machine's kernel has) with the
//! WireGuards' MTU, on their path, with their device name and routes, so
//! the pods, the MTU and the agents' NAT are the same and only the
//! encryption is left out. Each gateway's neighbours and forwarding
//! entries are written, so nothing is learnt or flooded.

use anyhow::Result;

use super::external_tunnel::dev;
use crate::{
    cmd::{ip, run},
    topology::Cluster,
};

/// The WireGuards' MTU in the lab.
const MTU: &str = "1420";
/// The VNI and UDP port of the tunnel in clear.
const VNI: &str = "4242";
const PORT: &str = "4790";

/// The tunnel's own address and MAC address on `cluster`'s gateway.
fn inner(cluster: &Cluster) -> (String, String) {
    (
        format!("169.254.42.{}", cluster.index),
        format!("02:00:00:00:42:{:02x}", cluster.index),
    )
}

/// Creates the VXLAN device on `cluster`'s gateway, with an entry per peer
/// gateway in its forwarding table and neighbour table, and routes each
/// peer's networks through it.
pub fn start_on(cluster: &Cluster) -> Result<()> {
    let (gw, dev) = (cluster.gw(), dev(&cluster.gw()));
    let local = cluster.wan_addr().to_string();
    let (address, mac) = inner(cluster);
    ip(
        &gw,
        &[
            "link",
            "add",
            &dev,
            "address",
            &mac,
            "mtu",
            MTU,
            "type",
            "vxlan",
            "id",
            VNI,
            "local",
            &local,
            "dstport",
            PORT,
            "nolearning",
        ],
    )?;
    ip(&gw, &["addr", "add", &format!("{address}/24"), "dev", &dev])?;
    ip(&gw, &["link", "set", &dev, "up"])?;
    for p in cluster.peerings() {
        let (peer_address, peer_mac) = inner(p.remote);
        let wan = p.remote.wan_addr().to_string();
        run(
            "bridge",
            &["-n", &gw, "fdb", "add", &peer_mac, "dev", &dev, "dst", &wan],
        )?;
        ip(
            &gw,
            &[
                "neigh",
                "add",
                &peer_address,
                "lladdr",
                &peer_mac,
                "dev",
                &dev,
            ],
        )?;
        for view in p.remote_views() {
            ip(
                &gw,
                &[
                    "route",
                    "add",
                    &view.to_string(),
                    "via",
                    &peer_address,
                    "dev",
                    &dev,
                ],
            )?;
        }
    }
    Ok(())
}

/// Removes the device of `cluster`'s gateway, and its routes with it, if
/// it has one.
pub fn stop_on(cluster: &Cluster) -> Result<()> {
    let (gw, dev) = (cluster.gw(), dev(&cluster.gw()));
    if ip(&gw, &["link", "show", &dev]).is_ok() {
        ip(&gw, &["link", "del", &dev])?;
    }
    Ok(())
}
