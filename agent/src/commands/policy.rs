//! What objects may ask of this node: the options `run` and `check` share.

use ipnet::IpNet;
use tracing::error;

use crate::model::{
    isolation::SecurityMode,
    peer::LiqoApi,
    policy::{self, Policy},
};

/// What TunnelEndpoints may ask of this node.
#[derive(clap::Args, Clone)]
pub struct PolicyArgs {
    /// Namespaces TunnelEndpoints are accepted from, besides Liqo's
    /// `liqo-tenant-*`: names, or prefixes ending in `*` (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub tunnelendpoint_namespaces: Vec<String>,
    /// The shortest prefix of any IPv4 network of a TunnelEndpoint.
    #[arg(long, default_value_t = policy::DEFAULT_MIN_PREFIX)]
    pub min_view_prefix: u8,
    /// The shortest prefix of any IPv6 network of a TunnelEndpoint.
    #[arg(long, default_value_t = policy::DEFAULT_MIN_PREFIX6)]
    pub min_view_prefix_ipv6: u8,
    /// This cluster's Pod networks of either family, which no peer may be
    /// seen under (the Node objects' PodCIDRs count too; comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub pod_cidr: Vec<IpNet>,
    /// This cluster's Service networks of either family, which no peer
    /// may be seen under (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub service_cidr: Vec<IpNet>,
    /// What peers reach in this cluster (Liqo's security modes):
    /// FullPodToPod, or IntraClusterTrafficSegregation, where a peer opens
    /// connections only to pods offloaded from it and endpoints exported to
    /// it. A TunnelEndpoint's annotation isthmus.io/security-mode overrides
    /// it for that peer.
    #[arg(long, env = "ISTHMUS_SECURITY_MODE", default_value = "FullPodToPod")]
    pub security_mode: SecurityMode,
    /// The API server's address, which no peer may reach (in a pod, the
    /// `kubernetes` Service's, from the variable the kubelet sets; a name
    /// or an IPv6 address is no IPv4 address to protect, and is ignored).
    #[arg(long, env = "KUBERNETES_SERVICE_HOST")]
    pub api_server_address: Option<String>,
    /// Which Liqo network API this cluster runs: the peers of the other
    /// are refused, naming the flag.
    #[arg(long, value_enum, default_value_t = LiqoApi::V0_10)]
    pub liqo_api: LiqoApi,
}

impl PolicyArgs {
    /// The policy objects must follow, with this node's networks as they
    /// are now.
    pub fn policy(&self) -> Policy {
        let host = policy::host_addresses().unwrap_or_else(|e| {
            error!(error = %e, "listing this node's addresses: they are not protected from peers");
            Vec::new()
        });
        self.policy_with(&host)
    }

    /// The policy, protecting `host` as this node's addresses.
    pub fn policy_with(&self, host: &[policy::HostAddress]) -> Policy {
        let mut namespaces = vec![policy::LIQO_TENANT_NAMESPACES.to_owned()];
        namespaces.extend(self.tunnelendpoint_namespaces.iter().cloned());
        let api_server = self
            .api_server_address
            .as_deref()
            .and_then(|a| a.parse().ok())
            .map(|addr| policy::NodeAddress {
                addr,
                what: "the API server's address (--api-server-address)".into(),
            });
        Policy {
            namespaces,
            min_prefix: self.min_view_prefix,
            min_prefix6: self.min_view_prefix_ipv6,
            protected: host
                .iter()
                .map(policy::HostAddress::network)
                .chain(policy::cluster_networks(&self.pod_cidr, &self.service_cidr))
                .collect(),
            host_addresses: host
                .iter()
                .filter_map(policy::HostAddress::address)
                .collect(),
            api_server,
            security_mode: self.security_mode,
            liqo_api: self.liqo_api,
        }
    }
}
