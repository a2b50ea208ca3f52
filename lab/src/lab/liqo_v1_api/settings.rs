//! What the `--liqo-api v1` lab changes in the agents' command lines, and
//! where each cluster's API server stand-in is.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    path::PathBuf,
};

use crate::{
    lab::{liqo_v1_peer::Side, paths::STATE_DIR},
    liqo_v1::PORT,
    topology::{B, Cluster, Peering},
};

/// The cluster whose gateway serves both its peers: the hub.
pub const HUB: &Cluster = &B;

/// Where `cluster`'s API server stand-in listens: on its LAN's bridge, at
/// .254, the API server's port.
pub fn api_addr(cluster: &Cluster) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(172, 16, cluster.index, 254), 6443)
}

/// The kubeconfig of `cluster`'s stand-in, for its agents and for
/// `kubectl` run in one of its nodes' netns.
pub fn kubeconfig(cluster: &Cluster) -> PathBuf {
    PathBuf::from(STATE_DIR)
        .join("kubeconfig")
        .join(cluster.name)
}

/// The side of the tunnel `peering.local` takes: the hub serves, its
/// peers contact it.
pub fn side(peering: &Peering) -> Side {
    match peering.local.name == HUB.name {
        true => Side::Server,
        false => Side::Client,
    }
}

/// The port of the hub's `GatewayServer` for `client`: Liqo's for a, the
/// next ones for the others, since every server of one gateway listens
/// on the node and needs a port of its own.
pub fn server_port(client: &Cluster) -> u16 {
    PORT + u16::from(client.index.saturating_sub(1))
}
