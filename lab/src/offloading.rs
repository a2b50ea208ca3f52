//! What Liqo offloads and Kubernetes exports, as they write it: Pods the
//! virtual kubelet created for a peer, EndpointSlices of Kubernetes' own
//! controller, and NamespaceOffloadings with Liqo v0.10's status. The
//! lab's, the benchmarks' and the tests' isolation objects.

use std::net::IpAddr;

use isthmus_common::liqo::namespace_map_name;

/// A pod in `namespace` at `ips` (the first is `status.podIP`; a
/// dual-stack pod has one of each family), offloaded from the cluster
/// `origin_cluster_id`, or local with None.
pub fn pod<A: Into<IpAddr> + Copy>(
    name: &str,
    namespace: &str,
    origin_cluster_id: Option<&str>,
    ips: &[A],
) -> String {
    let origin = origin_cluster_id
        .map(|id| {
            format!("\n    virtualkubelet.liqo.io/origin: {id}\n    liqo.io/managed-by: shadowpod")
        })
        .unwrap_or_default();
    let ips: Vec<IpAddr> = ips.iter().map(|ip| (*ip).into()).collect();
    let first = ips.first().map(IpAddr::to_string).unwrap_or_default();
    let all: String = ips.iter().map(|ip| format!("  - ip: {ip}\n")).collect();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  labels:\n    app: {name}{origin}\n\
         spec:\n  containers:\n  - name: main\n    image: registry.k8s.io/pause:3.9\n\
         status:\n  phase: Running\n  podIP: {first}\n  podIPs:\n{all}"
    )
}

/// The EndpointSlice Kubernetes' endpointslice controller writes for
/// Service `service` in `namespace`: `addresses`, all of one family, on
/// `ports` (name, port, protocol). A dual-stack Service has one slice per
/// family, named apart.
pub fn endpoint_slice<A: Into<IpAddr> + Copy>(
    service: &str,
    namespace: &str,
    addresses: &[A],
    ports: &[(&str, u16, &str)],
) -> String {
    let ipv6 = addresses.first().is_some_and(|a| (*a).into().is_ipv6());
    let (family, suffix) = if ipv6 {
        ("IPv6", "m3q9w")
    } else {
        ("IPv4", "x7k2p")
    };
    let endpoints: String = addresses
        .iter()
        .map(|a| (*a).into())
        .map(|a: IpAddr| format!("- addresses:\n  - {a}\n  conditions:\n    ready: true\n    serving: true\n    terminating: false\n"))
        .collect();
    let ports: String = ports
        .iter()
        .map(|(name, port, protocol)| {
            format!("- name: {name}\n  port: {port}\n  protocol: {protocol}\n")
        })
        .collect();
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {service}-{suffix}\n  namespace: {namespace}\n  generateName: {service}-\n\
         \x20 labels:\n    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io\n    kubernetes.io/service-name: {service}\n\
         addressType: {family}\nendpoints:\n{endpoints}ports:\n{ports}"
    )
}

/// A peer as a NamespaceOffloading's status lists it.
pub struct Listed<'a> {
    /// Its `clusterIdentity.clusterName`; None where the TunnelEndpoint
    /// has none, as before Liqo v0.6, whose status keys peers by cluster ID.
    pub cluster_name: Option<&'a str>,
    /// Its `clusterIdentity.clusterID`.
    pub cluster_id: &'a str,
    /// Whether the cluster selector picked it.
    pub selected: bool,
}

/// The NamespaceOffloading of `namespace` as Liqo's controller leaves it:
/// every peer listed under its NamespaceMap's name (its cluster ID for a
/// peer without a cluster name, as Liqo v0.3 and v0.4 key it), with
/// `OffloadingRequired` True for those selected.
pub fn namespace_offloading(namespace: &str, peers: &[Listed]) -> String {
    let conditions: String = peers
        .iter()
        .map(|p| {
            let (status, reason) = match p.selected {
                true => ("True", "ClusterSelected"),
                false => ("False", "ClusterNotSelected"),
            };
            format!(
                "    {}:\n    - lastTransitionTime: \"2024-05-01T10:00:00Z\"\n      reason: {reason}\n      status: \"{status}\"\n      type: OffloadingRequired\n",
                p.cluster_name.map_or_else(
                    || p.cluster_id.to_owned(),
                    |name| namespace_map_name(name, p.cluster_id)
                )
            )
        })
        .collect();
    format!(
        "apiVersion: offloading.liqo.io/v1alpha1\nkind: NamespaceOffloading\nmetadata:\n  name: offloading\n  namespace: {namespace}\n\
         spec:\n  namespaceMappingStrategy: DefaultName\n  podOffloadingStrategy: LocalAndRemote\n\
         status:\n  offloadingPhase: Ready\n  remoteNamespacesConditions:\n{conditions}"
    )
}
