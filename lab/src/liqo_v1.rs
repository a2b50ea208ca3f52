//! The lab's peerings as Liqo v1.2 writes them
//! (`tests/fixtures/liqo-v1/` holds the shapes, with their sources): the
//! same networks and views as the TunnelEndpoints, for an agent that
//! serves a peer the Liqo v1 way (docs/design.md#liqo-v1-peers).

use crate::topology::{Cluster, Peering};

/// The label Liqo v1 names a peer's objects with.
const CLUSTER_ID_LABEL: &str = "liqo.io/remote-cluster-id";
/// Liqo v1's WireGuard port (`forge/gatewayserver.go:35`).
pub const PORT: u16 = 51840;
/// Liqo v1's tunnel MTU (`forge/common.go:19`).
pub const MTU: u16 = 1340;
/// The API version of Isthmus's gateway objects, which Liqo renders from
/// Isthmus's gateway templates.
const ISTHMUS_GATEWAY_API: &str = "gateway.isthmus.dev/v1alpha1";

/// `metadata` of a peer's object, in its tenant namespace.
fn metadata(remote: &Cluster) -> String {
    let id = remote.cluster_id();
    format!(
        "metadata:\n  name: {id}\n  namespace: liqo-tenant-{}\n  labels:\n    {CLUSTER_ID_LABEL}: {id}\n",
        remote.name
    )
}

/// A list of one CIDR, as the `cidr` fields hold it.
fn cidrs(pod: &str, external: &str) -> String {
    format!("    cidr:\n      pod:\n      - {pod}\n      external:\n      - {external}\n")
}

impl Peering {
    /// The local cluster's `Configuration` for the peer: both real
    /// networks in `spec`, our view of the peer's in `status.remote`.
    pub fn configuration_yaml(&self) -> String {
        let (local, remote) = (self.local, self.remote);
        format!(
            "apiVersion: networking.liqo.io/v1beta1\nkind: Configuration\n{}spec:\n  local:\n{}  remote:\n{}status:\n  remote:\n{}",
            metadata(remote),
            cidrs(local.pod_cidr, local.external_cidr),
            cidrs(remote.pod_cidr, remote.external_cidr),
            cidrs(
                self.remote_nat_pod.unwrap_or(remote.pod_cidr),
                self.remote_nat_external.unwrap_or(remote.external_cidr)
            ),
        )
    }

    /// The peer gateway's `PublicKey`, `key` in base64.
    pub fn public_key_yaml(&self, key: &str) -> String {
        format!(
            "apiVersion: networking.liqo.io/v1beta1\nkind: PublicKey\n{}spec:\n  publicKey: {key}\n",
            metadata(self.remote)
        )
    }

    /// The `IsthmusGatewayServer` Liqo renders from Isthmus's template
    /// for our `GatewayServer` towards the peer, whose gateway contacts
    /// ours on Liqo v1's port.
    pub fn isthmus_gateway_server_yaml(&self) -> String {
        format!(
            "apiVersion: {ISTHMUS_GATEWAY_API}\nkind: IsthmusGatewayServer\n{}spec:\n  mtu: {MTU}\n  endpoint:\n    port: {PORT}\n",
            metadata(self.remote)
        )
    }

    /// The `IsthmusGatewayClient` Liqo renders for our `GatewayClient`
    /// towards the peer's gateway, on its WAN address.
    pub fn isthmus_gateway_client_yaml(&self) -> String {
        format!(
            "apiVersion: {ISTHMUS_GATEWAY_API}\nkind: IsthmusGatewayClient\n{}spec:\n  mtu: {MTU}\n  endpoint:\n    addresses:\n    - {}\n    port: {PORT}\n",
            metadata(self.remote),
            self.remote.wan_addr()
        )
    }
}
