//! TunnelEndpoints as Liqo writes them, built field by field: the one
//! template behind the lab's objects, the benchmarks', the fuzz targets' and
//! every test's.

use std::fmt;

/// The four networks of one side of a TunnelEndpoint: its PodCIDR and
/// ExternalCIDR, and what the other side remapped them to (`None` if not).
pub type Views<'a> = [&'a str; 4];

/// Where Liqo puts a TunnelEndpoint's networks (docs/design.md#tunnelendpoint-fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Liqo v0.3.1 and later: all in `spec`.
    Spec,
    /// Liqo v0.2.1–v0.3.0: the peer's networks as `spec.podCIDR` and
    /// `spec.externalCIDR`, the local and remapped ones in `status`.
    Legacy,
}

/// A TunnelEndpoint under construction.
#[derive(Clone, Debug)]
pub struct TunnelEndpoint {
    name: String,
    namespace: String,
    created: Option<String>,
    cluster_id: Option<String>,
    cluster_name: Option<String>,
    local: [String; 4],
    remote: [String; 4],
    ipv6: Option<[[String; 4]; 2]>,
    endpoint: Option<String>,
    port: Option<u16>,
    public_key: Option<String>,
    annotations: Vec<(String, String)>,
    layout: Layout,
}

const NETWORKS: [&str; 4] = ["PodCIDR", "NATPodCIDR", "ExternalCIDR", "NATExternalCIDR"];

impl TunnelEndpoint {
    /// `name` in `namespace`, with both sides' networks the ones most
    /// fixtures start from: `10.244.0.0/24` and `192.168.0.0/24`, not
    /// remapped.
    pub fn new(name: &str, namespace: &str) -> Self {
        let unmapped = ["10.244.0.0/24", "None", "192.168.0.0/24", "None"].map(String::from);
        Self {
            name: name.into(),
            namespace: namespace.into(),
            created: None,
            cluster_id: None,
            cluster_name: None,
            local: unmapped.clone(),
            remote: unmapped,
            ipv6: None,
            endpoint: None,
            port: None,
            public_key: None,
            annotations: Vec::new(),
            layout: Layout::Spec,
        }
    }

    /// Our networks, and the peer's remapping of them.
    #[must_use]
    pub fn local(mut self, views: Views) -> Self {
        self.local = views.map(String::from);
        self
    }

    /// The peer's networks, and our remapping of them.
    #[must_use]
    pub fn remote(mut self, views: Views) -> Self {
        self.remote = views.map(String::from);
        self
    }

    /// The IPv6 networks of both sides, ours then the peer's, in the
    /// `spec.ipv6` that Isthmus's CRD adds (docs/design.md#dual-stack).
    #[must_use]
    pub fn ipv6(mut self, local: Views, remote: Views) -> Self {
        self.ipv6 = Some([local.map(String::from), remote.map(String::from)]);
        self
    }

    /// The peer's cluster, as a bare `clusterID` (Liqo before v0.6).
    #[must_use]
    pub fn cluster_id(mut self, id: &str) -> Self {
        self.cluster_id = Some(id.into());
        self
    }

    /// The peer's cluster, as `clusterIdentity` (Liqo v0.6 onwards).
    #[must_use]
    pub fn cluster_identity(mut self, id: &str, name: &str) -> Self {
        self.cluster_id = Some(id.into());
        self.cluster_name = Some(name.into());
        self
    }

    /// The peer gateway's `endpointIP` (an address or a host name).
    #[must_use]
    pub fn endpoint(mut self, endpoint: impl fmt::Display) -> Self {
        self.endpoint = Some(endpoint.to_string());
        self
    }

    /// The peer gateway's WireGuard port, in `backend_config`.
    #[must_use]
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// The peer gateway's WireGuard public key, in `backend_config`.
    #[must_use]
    pub fn public_key(mut self, key: &str) -> Self {
        self.public_key = Some(key.into());
        self
    }

    /// An entry of `metadata.annotations`, its value written as given.
    #[must_use]
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.push((key.into(), value.into()));
        self
    }

    /// `metadata.creationTimestamp`.
    #[must_use]
    pub fn created(mut self, at: &str) -> Self {
        self.created = Some(at.into());
        self
    }

    /// Where the networks are written (by default, all in `spec`).
    #[must_use]
    pub fn layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    fn network_lines(&self, keep: impl Fn(&str) -> bool) -> String {
        lines_of([&self.local, &self.remote], "  ", keep)
    }

    /// `spec.ipv6`, if the object has IPv6 networks.
    fn ipv6_lines(&self) -> String {
        match &self.ipv6 {
            Some([local, remote]) => {
                format!("  ipv6:\n{}", lines_of([local, remote], "    ", |_| true))
            }
            None => String::new(),
        }
    }

    fn cluster_lines(&self) -> String {
        match (&self.cluster_id, &self.cluster_name) {
            (Some(id), Some(name)) => {
                format!("  clusterIdentity: {{clusterID: {id}, clusterName: {name}}}\n")
            }
            (Some(id), None) => format!("  clusterID: {id}\n"),
            _ => String::new(),
        }
    }

    fn backend_lines(&self) -> String {
        let mut config = Vec::new();
        if let Some(port) = self.port {
            config.push(format!("port: \"{port}\""));
        }
        if let Some(key) = &self.public_key {
            config.push(format!("publicKey: \"{key}\""));
        }
        let mut lines = String::new();
        if let Some(endpoint) = &self.endpoint {
            lines.push_str(&format!(
                "  endpointIP: {endpoint}\n  backendType: wireguard\n"
            ));
        }
        if !config.is_empty() {
            lines.push_str(&format!("  backend_config: {{{}}}\n", config.join(", ")));
        }
        lines
    }
}

/// The lines of both sides' networks, each field indented by `indent`.
fn lines_of(sides: [&[String; 4]; 2], indent: &str, keep: impl Fn(&str) -> bool) -> String {
    ["local", "remote"]
        .iter()
        .zip(sides)
        .flat_map(|(side, views)| {
            NETWORKS
                .iter()
                .zip(views.iter())
                .map(move |(network, value)| (format!("{side}{network}"), value))
        })
        .filter(|(field, _)| keep(field))
        .map(|(field, value)| format!("{indent}{field}: {value}\n"))
        .collect()
}

impl fmt::Display for TunnelEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let created = self
            .created
            .as_ref()
            .map(|at| format!("\n  creationTimestamp: \"{at}\""))
            .unwrap_or_default();
        let annotations: String = self
            .annotations
            .iter()
            .map(|(key, value)| format!("\n    {key}: {value}"))
            .collect();
        let created = if annotations.is_empty() {
            created
        } else {
            format!("{created}\n  annotations:{annotations}")
        };
        write!(
            f,
            "apiVersion: net.liqo.io/v1alpha1\nkind: TunnelEndpoint\nmetadata:\n  name: {}\n  namespace: {}{created}\nspec:\n{}",
            self.name,
            self.namespace,
            self.cluster_lines()
        )?;
        let real_remote = |field: &str| ["remotePodCIDR", "remoteExternalCIDR"].contains(&field);
        match self.layout {
            Layout::Spec => write!(
                f,
                "{}{}{}",
                self.network_lines(|_| true),
                self.ipv6_lines(),
                self.backend_lines()
            ),
            Layout::Legacy => write!(
                f,
                "  podCIDR: {}\n  externalCIDR: {}\n{}{}status:\n  phase: Ready\n{}",
                self.remote[0],
                self.remote[2],
                self.ipv6_lines(),
                self.backend_lines(),
                self.network_lines(|field| !real_remote(field))
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_liqo_v0_10s_shape() {
        let yaml = TunnelEndpoint::new("tep-b", "liqo-tenant-b")
            .cluster_identity("cluster-b", "b")
            .remote(["10.1.0.0/24", "10.0.0.0/24", "192.168.2.0/24", "None"])
            .endpoint("203.0.113.2")
            .port(5871)
            .public_key("KEY=")
            .to_string();
        assert_eq!(
            yaml,
            "apiVersion: net.liqo.io/v1alpha1\nkind: TunnelEndpoint\nmetadata:\n  name: tep-b\n  namespace: liqo-tenant-b\nspec:\n  clusterIdentity: {clusterID: cluster-b, clusterName: b}\n  localPodCIDR: 10.244.0.0/24\n  localNATPodCIDR: None\n  localExternalCIDR: 192.168.0.0/24\n  localNATExternalCIDR: None\n  remotePodCIDR: 10.1.0.0/24\n  remoteNATPodCIDR: 10.0.0.0/24\n  remoteExternalCIDR: 192.168.2.0/24\n  remoteNATExternalCIDR: None\n  endpointIP: 203.0.113.2\n  backendType: wireguard\n  backend_config: {port: \"5871\", publicKey: \"KEY=\"}\n"
        );
    }

    #[test]
    fn writes_liqo_v0_3_0s_shape() {
        let yaml = TunnelEndpoint::new("t", "ns")
            .cluster_id("c")
            .remote(["10.1.0.0/24", "10.0.0.0/24", "192.168.2.0/24", "None"])
            .layout(Layout::Legacy)
            .to_string();
        assert!(yaml.contains("spec:\n  clusterID: c\n  podCIDR: 10.1.0.0/24\n  externalCIDR: 192.168.2.0/24\nstatus:\n  phase: Ready\n  localPodCIDR: 10.244.0.0/24\n"), "{yaml}");
        assert!(yaml.contains("  remoteNATPodCIDR: 10.0.0.0/24\n"));
        assert!(!yaml.contains("remotePodCIDR"), "{yaml}");
    }
}
