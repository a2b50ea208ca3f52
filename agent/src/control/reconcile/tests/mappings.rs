//! NatMappings: held, rejected alone, read in the peer's view, and
//! written as a diff.

use super::*;
use isthmus_common::wire::Be32;

/// Peer a, cluster-a, whose view of our ExternalCIDR is ours.
fn add_cluster_a<P, M, A, P6, M6, A6>(r: &mut Reconciler<P, M, A, P6, M6, A6>)
where
    P: PeerTable,
    M: MappingTable<Error = P::Error>,
    A: AllowedTable<Error = P::Error>,
    P6: PeerTable6<Error = P::Error>,
    M6: MappingTable6<Error = P::Error>,
    A6: AllowedTable6<Error = P::Error>,
{
    let tep_a = peer("a", "10.0.40.0/24", "10.0.41.0/24")
        .cluster_id("cluster-a")
        .to_string();
    r.set_origin("a.yaml".into(), docs("a.yaml", &tep_a));
}

fn mapping_key(peer_id: u32, external: [u8; 4]) -> MappingKey {
    MappingKey {
        peer_id,
        addr: Be32::from_bytes(external),
    }
}

#[test]
fn a_natmapping_is_held_until_its_cluster_has_a_tunnel_endpoint() {
    let (mut peers, mut mappings) = (Peers::default(), Mappings::default());
    let mut r = Reconciler::new(&mut peers, &mut mappings, MemoryAllowedTable::default()).unwrap();
    let entry = [("10.1.0.5".to_owned(), "192.168.0.45".to_owned())];
    r.set_origin(
        "nm.yaml".into(),
        docs("nm.yaml", &natmapping("cluster-a", &entry)),
    );
    let report = r.reconcile().0;
    assert_eq!((report.mappings, report.rejected), (0, 1));
    assert_eq!(
        messages(&report.new_errors),
        [
            "nm.yaml: NatMapping nm-cluster-a: field spec.clusterID: cluster cluster-a has no TunnelEndpoint yet; its mappings are held until one appears"
        ]
    );
    add_cluster_a(&mut r);
    let report = r.reconcile().0;
    assert_eq!(
        (
            report.mappings,
            report.mappings_written,
            report.cleared_errors.len()
        ),
        (1, 1, 1)
    );
    drop(r);
    assert_eq!(
        mappings.entries.into_iter().collect::<Vec<_>>(),
        [(
            mapping_key(1, [192, 168, 0, 45]),
            Be32::from_bytes([10, 1, 0, 5])
        )]
    );
}

#[test]
fn an_external_ip_outside_our_external_cidr_is_rejected_alone() {
    let (mut peers, mut mappings) = (Peers::default(), Mappings::default());
    let mut r = Reconciler::new(&mut peers, &mut mappings, MemoryAllowedTable::default()).unwrap();
    add_cluster_a(&mut r);
    let entries = [
        ("10.1.0.5".to_owned(), "192.168.0.45".to_owned()),
        ("10.1.0.6".to_owned(), "192.168.7.46".to_owned()),
    ];
    r.set_origin(
        "nm.yaml".into(),
        docs("nm.yaml", &natmapping("cluster-a", &entries)),
    );
    let report = r.reconcile().0;
    assert_eq!(report.mappings, 1);
    assert_eq!(
        messages(&report.new_errors),
        [
            "nm.yaml: NatMapping nm-cluster-a: field spec.clusterMappings.10.1.0.6: externalIP 192.168.7.46 lies outside 192.168.0.0/24, our ExternalCIDR as the peer sees it (localExternalCIDR of TunnelEndpoint liqo-tenant-x/a)"
        ]
    );
}

/// An entry may not lead a peer to a node: a Node object's address, one of
/// this node's own or the API server's is refused, naming the entry; the
/// object's other entries apply.
#[test]
fn an_entry_whose_endpoint_is_a_node_address_is_rejected_alone() {
    let (mut peers, mut mappings) = (Peers::default(), Mappings::default());
    let mut r = Reconciler::new(&mut peers, &mut mappings, MemoryAllowedTable::default()).unwrap();
    r.set_policy(Policy {
        host_addresses: vec![
            crate::model::policy::NodeAddress {
                addr: "172.16.2.1".parse().unwrap(),
                what: "an address of this node (lan0)".into(),
            },
            crate::model::policy::NodeAddress {
                addr: "169.254.0.1".parse().unwrap(),
                what: "an address of this node (isthmus0)".into(),
            },
        ],
        api_server: Some(crate::model::policy::NodeAddress {
            addr: "10.96.0.1".parse().unwrap(),
            what: "the API server's address (--api-server-address)".into(),
        }),
        ..Policy::default()
    });
    r.set_origin(
        "nodes.yaml".into(),
        docs(
            "nodes.yaml",
            "apiVersion: v1\nkind: Node\nmetadata: {name: b-node}\nspec: {podCIDR: 10.244.0.0/25}\nstatus: {addresses: [{type: InternalIP, address: 172.16.2.2}]}\n",
        ),
    );
    add_cluster_a(&mut r);
    let entries = [
        ("10.1.0.5".to_owned(), "192.168.0.45".to_owned()),
        ("172.16.2.1".to_owned(), "192.168.0.77".to_owned()),
        ("172.16.2.2".to_owned(), "192.168.0.78".to_owned()),
        ("10.96.0.1".to_owned(), "192.168.0.79".to_owned()),
        // The conncheck's entry: the gateway's own address, kept.
        ("169.254.0.1".to_owned(), "192.168.0.1".to_owned()),
    ];
    r.set_origin(
        "nm.yaml".into(),
        docs("nm.yaml", &natmapping("cluster-a", &entries)),
    );
    let report = r.reconcile().0;
    assert_eq!(
        report.mappings, 2,
        "the pod's and the conncheck's entries apply"
    );
    assert_eq!(
        messages(&report.new_errors),
        [
            "nm.yaml: NatMapping nm-cluster-a: field spec.clusterMappings.10.96.0.1: endpoint 10.96.0.1 (externalIP 192.168.0.79) is the API server's address (--api-server-address); no node is exposed to a peer",
            "nm.yaml: NatMapping nm-cluster-a: field spec.clusterMappings.172.16.2.1: endpoint 172.16.2.1 (externalIP 192.168.0.77) is an address of this node (lan0); no node is exposed to a peer",
            "nm.yaml: NatMapping nm-cluster-a: field spec.clusterMappings.172.16.2.2: endpoint 172.16.2.2 (externalIP 192.168.0.78) is the address of node b-node; no node is exposed to a peer",
        ]
    );
    drop(r);
    assert_eq!(
        mappings.entries.into_values().collect::<Vec<_>>(),
        [
            Be32::from_bytes([169, 254, 0, 1]),
            Be32::from_bytes([10, 1, 0, 5])
        ]
    );
}

/// The hub case: the peer remapped our ExternalCIDR, and Liqo's IPAM
/// writes the values in that view (docs/design.md#natmapping).
#[test]
fn values_in_the_peers_view_of_our_external_cidr_reach_the_kernel_as_real_addresses() {
    let (mut peers, mut mappings) = (Peers::default(), Mappings::default());
    let mut r = Reconciler::new(&mut peers, &mut mappings, MemoryAllowedTable::default()).unwrap();
    let tep_a = peer("a", "10.0.40.0/24", "10.0.41.0/24")
        .cluster_id("cluster-a")
        .to_string()
        .replace(
            "localNATExternalCIDR: None",
            "localNATExternalCIDR: 10.0.1.0/24",
        );
    r.set_origin("a.yaml".into(), docs("a.yaml", &tep_a));
    let liqo = |pod: &str, external: &str, entries: &str| {
        format!(
            "apiVersion: net.liqo.io/v1alpha1\nkind: NatMapping\nmetadata:\n  generateName: natmapping-\n  name: natmapping-x7k2p\n  labels: {{net.liqo.io/natmapping: \"true\", clusterID: cluster-a}}\nspec:\n  clusterID: cluster-a\n  podCIDR: {pod}\n  externalCIDR: {external}\n  clusterMappings:\n{entries}"
        )
    };
    let entries =
        "    10.1.0.5: 10.0.1.45\n    169.254.0.1: 10.0.1.1\n    10.1.0.6: 192.168.0.46\n";
    r.set_origin(
        "nm.yaml".into(),
        docs("nm.yaml", &liqo("10.0.40.0/24", "10.0.1.0/24", entries)),
    );
    let report = r.reconcile().0;
    assert_eq!(report.mappings, 2);
    assert_eq!(
        messages(&report.new_errors),
        [
            "nm.yaml: NatMapping natmapping-x7k2p: field spec.clusterMappings.10.1.0.6: externalIP 192.168.0.46 lies outside 10.0.1.0/24, our ExternalCIDR as the peer sees it (localNATExternalCIDR of TunnelEndpoint liqo-tenant-x/a)"
        ]
    );
    // A NatMapping written for other views is refused whole.
    for (pod, external, field, found) in [
        (
            "10.0.40.0/24",
            "192.168.0.0/24",
            "externalCIDR",
            "192.168.0.0/24",
        ),
        ("10.0.50.0/24", "10.0.1.0/24", "podCIDR", "10.0.50.0/24"),
    ] {
        r.set_origin(
            "nm.yaml".into(),
            docs("nm.yaml", &liqo(pod, external, entries)),
        );
        let report = r.reconcile().0;
        assert_eq!(report.mappings, 0);
        assert!(
            messages(&report.new_errors)
                .iter()
                .any(|m| m.contains(&format!("field spec.{field}: {found} is not "))),
            "{:?}",
            messages(&report.new_errors)
        );
    }
    r.set_origin(
        "nm.yaml".into(),
        docs("nm.yaml", &liqo("10.0.40.0/24", "10.0.1.0/24", entries)),
    );
    r.reconcile();
    drop(r);
    assert_eq!(
        mappings.entries.into_iter().collect::<Vec<_>>(),
        [
            (
                mapping_key(1, [192, 168, 0, 1]),
                Be32::from_bytes([169, 254, 0, 1])
            ),
            (
                mapping_key(1, [192, 168, 0, 45]),
                Be32::from_bytes([10, 1, 0, 5])
            )
        ]
    );
}

#[test]
fn one_changed_entry_of_ten_thousand_touches_one_element() {
    let (mut peers, mut mappings) = (Peers::default(), Mappings::default());
    let mut r = Reconciler::new(&mut peers, &mut mappings, MemoryAllowedTable::default()).unwrap();
    // A /16 ExternalCIDR, so that 10,000 externalIPs fit in it.
    let tep_a = peer("a", "10.0.40.0/24", "10.0.41.0/24")
        .cluster_id("cluster-a")
        .local(["10.244.0.0/24", "10.0.40.0/24", "192.168.0.0/16", "None"])
        .to_string();
    r.set_origin("a.yaml".into(), docs("a.yaml", &tep_a));
    let mut entries: Vec<(String, String)> = (0..10_000u32)
        .map(|i| {
            (
                format!("10.2.{}.{}", i / 256, i % 256),
                format!("192.168.{}.{}", i / 256, i % 256),
            )
        })
        .collect();
    r.set_origin(
        "nm.yaml".into(),
        docs("nm.yaml", &natmapping("cluster-a", &entries)),
    );
    let report = r.reconcile().0;
    assert_eq!((report.mappings, report.mappings_written), (10_000, 10_000));
    entries[4321].0 = "10.3.0.1".into();
    r.set_origin(
        "nm.yaml".into(),
        docs("nm.yaml", &natmapping("cluster-a", &entries)),
    );
    let report = r.reconcile().0;
    assert_eq!(
        (
            report.mappings_written,
            report.mappings_removed,
            report.written
        ),
        (1, 0, 0)
    );
    entries.remove(17);
    r.set_origin(
        "nm.yaml".into(),
        docs("nm.yaml", &natmapping("cluster-a", &entries)),
    );
    let report = r.reconcile().0;
    assert_eq!((report.mappings_written, report.mappings_removed), (0, 1));
    drop(r);
    assert_eq!(mappings.writes, 10_002);
    assert_eq!(
        mappings.entries[&mapping_key(1, [192, 168, 16, 225])],
        Be32::from_bytes([10, 3, 0, 1])
    );
}

/// One cluster's huge NatMapping cannot take another's room in the table:
/// the small one keeps every entry, the large one its conncheck entry and
/// what is programmed already, and the rest of it is refused in one error.
#[test]
fn a_large_natmapping_takes_no_other_clusters_room() {
    let (mut peers, mut mappings) = (Peers::default(), Mappings::default());
    mappings.capacity = 10;
    let mut r = Reconciler::new(&mut peers, &mut mappings, MemoryAllowedTable::default()).unwrap();
    r.set_mapping_capacity(10);
    let a = peer("a", "10.0.40.0/24", "10.0.41.0/24")
        .cluster_id("cluster-a")
        .to_string();
    let b = peer("b", "10.0.50.0/24", "10.0.51.0/24")
        .cluster_id("cluster-b")
        .to_string();
    r.set_origin("a.yaml".into(), docs("a.yaml", &a));
    r.set_origin("b.yaml".into(), docs("b.yaml", &b));
    let conncheck = || ("169.254.0.1".to_owned(), "192.168.0.1".to_owned());
    let small = [
        conncheck(),
        ("10.1.0.5".to_owned(), "192.168.0.45".to_owned()),
    ];
    r.set_origin(
        "nm-a.yaml".into(),
        docs("nm-a.yaml", &natmapping("cluster-a", &small)),
    );
    // b first asks for two entries, which are programmed...
    let early = [
        conncheck(),
        ("10.2.0.200".to_owned(), "192.168.0.200".to_owned()),
    ];
    r.set_origin(
        "nm-b.yaml".into(),
        docs("nm-b.yaml", &natmapping("cluster-b", &early)),
    );
    assert_eq!(r.reconcile().0.mappings, 4);
    // ...then for a hundred more, which sort before them.
    let flood: Vec<(String, String)> = early
        .into_iter()
        .chain((2..102).map(|i| (format!("10.2.0.{i}"), format!("192.168.0.{i}"))))
        .collect();
    r.set_origin(
        "nm-b.yaml".into(),
        docs("nm-b.yaml", &natmapping("cluster-b", &flood)),
    );
    let (report, failure) = r.reconcile();
    assert!(failure.is_none(), "the table overflowed: {failure:?}");
    assert_eq!(report.mappings, 10);
    assert_eq!(
        messages(&report.new_errors),
        [
            "nm-b.yaml: NatMapping nm-cluster-b: field spec.clusterMappings: 94 of its 102 entries are refused: this cluster's share of the IPv4 NatMapping table is 8 of 10 (--nat-mapping-capacity); the conncheck's entry and those already programmed are kept first"
        ]
    );
    drop(r);
    let endpoints: Vec<[u8; 4]> = mappings
        .entries
        .iter()
        .map(|(key, endpoint)| {
            let peer = key.peer_id;
            let e = endpoint.bytes();
            [peer as u8, e[0], e[2], e[3]]
        })
        .collect();
    // a (id 1) keeps both; b (id 2) its conncheck entry, the one it had,
    // and six new ones.
    assert!(endpoints.contains(&[1, 169, 0, 1]) && endpoints.contains(&[1, 10, 0, 5]));
    assert!(endpoints.contains(&[2, 169, 0, 1]) && endpoints.contains(&[2, 10, 0, 200]));
    assert_eq!(endpoints.iter().filter(|e| e[0] == 2).count(), 8);
}

/// A change of NatMappings alone keeps the selection of peers, with what
/// it rejected; any other change of the same file selects them again.
#[test]
fn a_natmapping_change_keeps_the_peers_and_any_other_change_selects_them_again() {
    let (mut peers, mut mappings) = (Peers::default(), Mappings::default());
    let mut r = Reconciler::new(&mut peers, &mut mappings, MemoryAllowedTable::default()).unwrap();
    add_cluster_a(&mut r);
    r.set_origin("bad.yaml".into(), docs("bad.yaml", "kind: ["));
    let mapping =
        |endpoint: &str| natmapping("cluster-a", &[(endpoint.into(), "192.168.0.45".into())]);
    r.set_origin("nm.yaml".into(), docs("nm.yaml", &mapping("10.1.0.5")));
    let report = r.reconcile().0;
    assert_eq!((report.peers, report.rejected, report.mappings), (1, 1, 1));

    r.set_origin("nm.yaml".into(), docs("nm.yaml", &mapping("10.1.0.6")));
    let report = r.reconcile().0;
    assert_eq!(
        (report.peers, report.rejected, report.mappings_written),
        (1, 1, 1)
    );
    assert!(
        report.added.is_empty() && report.new_errors.is_empty() && report.cleared_errors.is_empty()
    );

    let tep_b = peer("b", "10.0.50.0/24", "10.0.51.0/24").to_string();
    let both = format!("{}---\n{tep_b}", mapping("10.1.0.6"));
    r.set_origin("nm.yaml".into(), docs("nm.yaml", &both));
    let report = r.reconcile().0;
    assert_eq!((report.peers, report.added.len()), (2, 1));

    r.set_origin("nm.yaml".into(), docs("nm.yaml", &mapping("10.1.0.6")));
    let report = r.reconcile().0;
    assert_eq!(report.peers, 1);
    assert_eq!(report.dropped.len(), 1);

    r.remove_origin("bad.yaml");
    let report = r.reconcile().0;
    assert_eq!((report.rejected, report.cleared_errors.len()), (0, 1));
}

#[test]
fn a_peers_rules_say_whether_it_has_mappings_so_that_its_packets_skip_an_empty_table() {
    use isthmus_common::nat::NO_MAPPINGS;
    let (mut peers, mut mappings) = (Peers::default(), Mappings::default());
    let mut r = Reconciler::new(&mut peers, &mut mappings, MemoryAllowedTable::default()).unwrap();
    add_cluster_a(&mut r);
    let unmapped = |applied: &BTreeMap<ipnet::Ipv4Net, PeerNat>| -> Vec<bool> {
        (applied.values())
            .map(|nat| nat.flags & NO_MAPPINGS != 0)
            .collect()
    };
    r.reconcile();
    assert_eq!(
        unmapped(r.peer_table.applied()),
        [true; 2],
        "no NatMapping yet: every view"
    );

    let entry = [("10.1.0.5".to_owned(), "192.168.0.45".to_owned())];
    r.set_origin(
        "nm.yaml".into(),
        docs("nm.yaml", &natmapping("cluster-a", &entry)),
    );
    let report = r.reconcile().0;
    assert_eq!((report.mappings, report.written), (1, 2));
    assert_eq!(
        unmapped(r.peer_table.applied()),
        [false; 2],
        "its first entry: the views look"
    );

    r.remove_origin("nm.yaml");
    let report = r.reconcile().0;
    assert_eq!((report.mappings, report.written), (0, 2));
    assert_eq!(
        unmapped(r.peer_table.applied()),
        [true; 2],
        "its last entry gone"
    );
}
