//! The lab's `--segregation` variant: cluster b's gateway runs in
//! IntraClusterTrafficSegregation, and b's objects say that b-pod2 was
//! offloaded from a, and that b-pod1 is the endpoint of a TCP service on
//! port 18080 in a namespace offloaded to a and to nobody else. In the
//! dual-stack lab, b-pod2 has both its addresses, and the service a slice
//! of each family, as Kubernetes writes a dual-stack Service's.

use std::{fs, net::IpAddr};

use anyhow::Result;

pub mod settings;

use super::{
    agents::restart_agent_in, node_objects::write_object, paths::object_dir, setup::Setup,
};
use crate::{
    objects::Layout,
    offloading::{Listed, endpoint_slice, namespace_offloading, pod},
    topology::{A, C, Cluster, PEERINGS},
};
use settings::CLUSTER;

/// The namespace b offloads to a, holding b-pod1's service.
pub const NAMESPACE: &str = "shop";
/// The port of b-pod1's service.
pub const SERVICE_PORT: u16 = 18080;
/// The file holding b-pod2's Pod.
pub const POD_FILE: &str = "isolation-pod2.yaml";
/// The file holding the namespace's NamespaceOffloading.
pub const OFFLOADING_FILE: &str = "isolation-offloading.yaml";
/// The file holding the service's EndpointSlice.
const SLICE_FILE: &str = "isolation-slice.yaml";
/// The file holding the service's IPv6 EndpointSlice, in the dual-stack lab.
const SLICE6_FILE: &str = "isolation-slice6.yaml";

/// Turns segregation on (or off): b's isolation objects are written (or
/// removed) and b's gateway restarted in the mode; returns once it is ready.
pub fn set(on: bool) -> Result<()> {
    let gw = CLUSTER.gw();
    if on {
        write_pod(true)?;
        write_offloading(true)?;
        write_object(&gw, SLICE_FILE, &service_slice(CLUSTER.pod_addr(1)))?;
        if Setup::current()?.dual_stack {
            write_object(&gw, SLICE6_FILE, &service_slice(CLUSTER.pod_addr6(1)))?;
        }
    } else {
        for file in [POD_FILE, OFFLOADING_FILE, SLICE_FILE, SLICE6_FILE] {
            let _ = fs::remove_file(object_dir(&gw).join(file));
        }
    }
    let setup = Setup::change(|setup| setup.segregation = on)?;
    restart_agent_in(&gw, &setup)
}

/// Writes b-pod2's Pod, offloaded from a or (`false`) not.
pub fn write_pod(from_a: bool) -> Result<()> {
    let origin = from_a.then(|| A.cluster_id());
    let yaml = pod("b-pod2", NAMESPACE, origin.as_deref(), &pod2()?);
    write_object(&CLUSTER.gw(), POD_FILE, &yaml)
}

/// The EndpointSlice of b-pod1's service, for its address `addr`.
fn service_slice(addr: impl Into<IpAddr>) -> String {
    let addr: IpAddr = addr.into();
    endpoint_slice("web", NAMESPACE, &[addr], &[("http", SERVICE_PORT, "TCP")])
}

/// Writes the namespace's NamespaceOffloading, as Liqo lists both of b's
/// peers, with a selected or (`false`) not, and c never.
pub fn write_offloading(to_a: bool) -> Result<()> {
    let (a_id, c_id) = (A.cluster_id(), C.cluster_id());
    let listed = [listed(&A, &a_id, to_a), listed(&C, &c_id, false)];
    let yaml = namespace_offloading(NAMESPACE, &listed);
    write_object(&CLUSTER.gw(), OFFLOADING_FILE, &yaml)
}

/// `peer` as the Liqo that wrote b's TunnelEndpoint for it lists it: by
/// NamespaceMap name where the object carries a cluster name, else (Liqo
/// v0.3, v0.4) by cluster ID.
fn listed<'a>(peer: &'a Cluster, cluster_id: &'a str, selected: bool) -> Listed<'a> {
    let layout = PEERINGS
        .iter()
        .find(|p| p.local.name == CLUSTER.name && p.remote.name == peer.name)
        .map(|p| p.layout);
    Listed {
        cluster_name: (layout == Some(Layout::Spec)).then_some(peer.name),
        cluster_id,
        selected,
    }
}

/// b-pod2's addresses: both families' in the dual-stack lab.
fn pod2() -> Result<Vec<IpAddr>> {
    let mut addresses = vec![IpAddr::from(CLUSTER.pod_addr(2))];
    if Setup::current()?.dual_stack {
        addresses.push(CLUSTER.pod_addr6(2).into());
    }
    Ok(addresses)
}
