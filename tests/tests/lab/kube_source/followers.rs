//! What the agents follow from the API besides peers: Node objects (the
//! overlay), offloaded pods, slices and offloadings (segregation), and the
//! Lease (the elected gateway).

use super::*;

/// A Node object as the API server holds it.
fn node_object(name: &str, pod_cidr: &str, address: &str, gateway: bool) -> Value {
    let labels = if gateway {
        json!({"net.liqo.io/gateway": "true"})
    } else {
        json!({})
    };
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"podCIDR": pod_cidr},
        "status": {"addresses": [{"type": "InternalIP", "address": address}]},
    })
}

/// The overlay as a worker's kernel holds it: the gateway node, and the
/// other nodes' PodCIDRs with their addresses.
fn overlay_of(node: &KubeNode) -> (Ipv4Addr, BTreeSet<(Ipv4Net, Ipv4Addr)>) {
    let gateway = OverlaySettings::open(&node.bpffs())
        .unwrap()
        .get()
        .unwrap()
        .gateway;
    let table = NodeMap::open(&node.bpffs())
        .unwrap()
        .entries()
        .unwrap()
        .into_iter()
        .map(|(net, addr)| (net, Ipv4Addr::from(addr)))
        .collect();
    (Ipv4Addr::from(gateway), table)
}

/// In kube mode the overlay follows the Node objects: the node carrying
/// the gateway label is where the worker sends, every other node's
/// PodCIDR and address lead to its InternalIP, and both follow changes
/// live.
#[test]
fn the_overlay_follows_node_objects() {
    let mut node = node("ist-t-kube3", false);
    node.api
        .apply(node_object("gw-1", "10.90.0.0/25", "172.30.0.1", true));
    node.api
        .apply(node_object("w-2", "10.90.0.128/25", "172.30.0.2", false));
    start(&mut node);
    let entry = |net: &str, addr: [u8; 4]| (net.parse::<Ipv4Net>().unwrap(), Ipv4Addr::from(addr));
    // Each node by its PodCIDR, and by its address.
    let both: BTreeSet<_> = [
        entry("10.90.0.0/25", [172, 30, 0, 1]),
        entry("172.30.0.1/32", [172, 30, 0, 1]),
        entry("10.90.0.128/25", [172, 30, 0, 2]),
        entry("172.30.0.2/32", [172, 30, 0, 2]),
    ]
    .into();
    wait_for("the overlay programmed from the Node objects", || {
        overlay_of(&node) == (Ipv4Addr::new(172, 30, 0, 1), both.clone())
    });

    // The gateway role moves to w-2.
    node.api
        .apply(node_object("gw-1", "10.90.0.0/25", "172.30.0.1", false));
    node.api
        .apply(node_object("w-2", "10.90.0.128/25", "172.30.0.2", true));
    wait_for("the worker sending to the new gateway", || {
        overlay_of(&node).0 == Ipv4Addr::new(172, 30, 0, 2)
    });

    // A node leaves: its PodCIDR goes, and so does the gateway it was.
    assert!(node.api.delete("nodes", "", "w-2"));
    let rest: BTreeSet<_> = [
        entry("10.90.0.0/25", [172, 30, 0, 1]),
        entry("172.30.0.1/32", [172, 30, 0, 1]),
    ]
    .into();
    wait_for("the node table without w-2, and no gateway", || {
        overlay_of(&node) == (Ipv4Addr::UNSPECIFIED, rest.clone())
    });
}

/// A YAML object of `isthmus_lab::offloading`, as the API server serves it.
fn served(yaml: &str) -> Value {
    serde_yaml_ng::from_str(yaml).expect("the fixtures are valid YAML")
}

fn allowed_entries(node: &KubeNode) -> usize {
    isthmus_lab::lab::pinned_hash::<AllowKey, u8>(&node.bpffs(), names::MAP_ALLOWED)
        .map_or(0, |table| table.keys().count())
}

#[test]
fn a_segregating_gateway_follows_offloaded_pods_exported_slices_and_offloadings() {
    let mut node = node("ist-t-kube4", true);
    let offloaded = |origin: Option<&str>| {
        served(&offloading::pod(
            "web",
            "shop",
            origin,
            &[Ipv4Addr::new(10, 244, 0, 133)],
        ))
    };
    let slice = offloading::endpoint_slice(
        "api",
        "shop",
        &[Ipv4Addr::new(10, 244, 0, 5)],
        &[("http", 18080, "TCP"), ("dns", 53, "UDP")],
    );
    let offloaded_to_b = |selected| {
        let b = offloading::Listed {
            cluster_name: Some("b"),
            cluster_id: "b",
            selected,
        };
        served(&offloading::namespace_offloading("shop", &[b]))
    };
    for object in [
        tep("tep-b", "b", "10.60.0.0/24", "10.61.0.0/24", json!({})),
        offloaded(Some("b")),
        served(&slice),
        offloaded_to_b(true),
    ] {
        node.api.apply(object);
    }
    node.start_agent(&[
        "--keepalive=0",
        "--security-mode=IntraClusterTrafficSegregation",
    ])
    .unwrap();
    // The pod on any port, the service's two ports.
    wait_for("the allowed table from the API server", || {
        allowed_entries(&node) == 3
    });
    // Pods and slices are listed by their labels, not all of them.
    for selector in [
        "pods?&labelSelector=virtualkubelet.liqo.io%2Forigin&",
        "endpointslices?&labelSelector=endpointslice.kubernetes.io%2Fmanaged-by%3Dendpointslice-controller.k8s.io&",
    ] {
        assert!(node.requests("GET", selector) > 0, "no list of {selector}");
    }
    assert!(node.lists("namespaceoffloadings") > 0);
    // The pod loses its label, then the namespace its offloading to b.
    node.api.apply(offloaded(None));
    wait_for("the pod's entry gone", || allowed_entries(&node) == 2);
    node.api.apply(offloaded_to_b(false));
    wait_for("the service's entries gone", || allowed_entries(&node) == 0);
    node.api.apply(offloaded_to_b(true));
    wait_for("the service's entries back", || allowed_entries(&node) == 2);
    assert!(node.api.delete("endpointslices", "shop", "api-x7k2p"));
    wait_for("the deleted slice's entries gone", || {
        allowed_entries(&node) == 0
    });
}

/// The election's Lease, held by `holder` (None: released).
fn lease_object(holder: Option<&str>) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "isthmus-gateway", "namespace": AGENT_NS},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 1},
    })
}

/// Where several nodes carry the gateway label, a worker sends to the one
/// holding the election's Lease, and moves as soon as it changes hands.
#[test]
fn a_worker_follows_the_elected_gateway() {
    let mut node = node("ist-t-kube5", false);
    for object in [
        node_object("gw-1", "10.90.0.0/25", "172.30.0.1", true),
        node_object("gw-2", "10.90.1.0/25", "172.30.0.2", true),
        lease_object(Some("gw-2")),
        // Another namespace's Lease of the same name is not the election's.
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "isthmus-gateway", "namespace": "elsewhere"},
            "spec": {"holderIdentity": "gw-1"}}),
    ] {
        node.api.apply(object);
    }
    start(&mut node);
    let gateway = |node: &KubeNode| overlay_of(node).0;
    wait_for("the worker sending to gw-2, the Lease's holder", || {
        gateway(&node) == Ipv4Addr::new(172, 30, 0, 2)
    });
    node.api.apply(lease_object(Some("gw-1")));
    let moved = wait_for("the worker sending to gw-1, the new holder", || {
        gateway(&node) == Ipv4Addr::new(172, 30, 0, 1)
    });
    println!("the worker followed the Lease in {moved:?}");
    // Released: the first labelled node by name.
    node.api.apply(lease_object(None));
    node.api.apply(lease_object(Some("gw-2")));
    wait_for("the worker back on gw-2", || {
        gateway(&node) == Ipv4Addr::new(172, 30, 0, 2)
    });
    assert!(
        node.lists("leases") > 0
            && node.requests("GET", "fieldSelector=metadata.name%3Disthmus-gateway") > 0,
        "the Lease is not watched by name"
    );
}
