//! Peers with IPv6 networks: both peer tables written from one pass, and
//! IPv6 views held apart as IPv4 ones are.

use ipnet::Ipv6Net;
use isthmus_common::wire::Be128;

use super::*;

pub(super) type Peers6 = MemoryTable<Ipv6Net, PeerNat<Be128>>;

/// Peer `name` of `peer`, with IPv6 networks we see as `remote_pod` and
/// `remote_ext`.
fn dual(name: &str, remote_pod: &str, remote_ext: &str) -> TunnelEndpoint {
    let at = name.len();
    peer(name, &format!("10.{at}.0.0/24"), &format!("10.{at}.1.0/24")).ipv6(
        ["fd00:10:244::/64", "None", "fd00:192:168::/64", "None"],
        [
            "fd00:10:244::/64",
            remote_pod,
            "fd00:192:168::/64",
            remote_ext,
        ],
    )
}

pub(super) type Mappings6 = MemoryMappingTable6;

/// A reconciler over both peer tables and the IPv6 NatMapping table, and
/// an IPv4 NatMapping table of its own.
pub(super) fn reconciler6<'a>(
    peers: &'a mut Peers,
    peers6: &'a mut Peers6,
    mappings6: &'a mut Mappings6,
) -> Reconciler<
    &'a mut Peers,
    Mappings,
    MemoryAllowedTable,
    &'a mut Peers6,
    &'a mut Mappings6,
    MemoryAllowedTable6,
> {
    let ipv6 = Ipv6Tables {
        peers: peers6,
        mappings: mappings6,
        allowed: MemoryAllowedTable6::default(),
    };
    Reconciler::dual_stack(
        peers,
        Mappings::default(),
        MemoryAllowedTable::default(),
        ipv6,
    )
    .unwrap()
}

fn net6(s: &str) -> Ipv6Net {
    s.parse().unwrap()
}

#[test]
fn a_dual_stack_peer_is_written_to_both_tables_and_an_overlap_is_refused() {
    let (mut peers, mut peers6) = (Peers::default(), Peers6::default());
    let mut mappings6 = Mappings6::default();
    let mut r = reconciler6(&mut peers, &mut peers6, &mut mappings6);
    r.set_origin(
        "b.yaml".into(),
        docs(
            "b.yaml",
            &dual("b", "fd00:10::/64", "fd00:10:0:1::/64").to_string(),
        ),
    );
    // We would see c's pods where we see b's: refused, naming the IPv6
    // field.
    r.set_origin(
        "c.yaml".into(),
        docs(
            "c.yaml",
            &dual("cc", "fd00:10::/64", "fd00:10:1:1::/64").to_string(),
        ),
    );
    let (report, failure) = r.reconcile();
    assert!(failure.is_none());
    assert_eq!((report.written, report.peers), (4, 1));
    assert_eq!(
        messages(&report.new_errors),
        [
            "c.yaml: TunnelEndpoint liqo-tenant-x/cc: field ipv6.remoteNATPodCIDR (fd00:10::/64) \
          overlaps field ipv6.remoteNATPodCIDR (fd00:10::/64) of TunnelEndpoint liqo-tenant-x/b \
          in b.yaml"
        ]
    );
    drop(r);
    assert_eq!(
        peers.entries.keys().copied().collect::<Vec<_>>(),
        [net("10.1.0.0/24"), net("10.1.1.0/24")]
    );
    assert_eq!(
        peers6.entries.keys().copied().collect::<Vec<_>>(),
        [net6("fd00:10::/64"), net6("fd00:10:0:1::/64")]
    );
    let rules = peers6.entries[&net6("fd00:10::/64")];
    assert_eq!(rules.peer_id, peers.entries[&net("10.1.0.0/24")].peer_id);
    assert_eq!(
        rules.egress[0],
        isthmus_common::nat::PrefixRewrite::new(
            Be128::from(net6("fd00:10:244::/64").network()),
            Be128::from(net6("fd00:10:244::/64").network()),
            64
        )
    );
}

#[test]
fn removing_the_ipv6_networks_removes_their_views_alone() {
    let (mut peers, mut peers6) = (Peers::default(), Peers6::default());
    let mut mappings6 = Mappings6::default();
    let mut r = reconciler6(&mut peers, &mut peers6, &mut mappings6);
    let with = dual("b", "fd00:10::/64", "None").to_string();
    r.set_origin("b.yaml".into(), docs("b.yaml", &with));
    assert_eq!(r.reconcile().0.written, 4);
    let without = with[..with.find("  ipv6:").unwrap()].to_owned();
    r.set_origin("b.yaml".into(), docs("b.yaml", &without));
    let report = r.reconcile().0;
    assert_eq!((report.written, report.removed), (0, 2));
    drop(r);
    assert_eq!(peers.entries.len(), 2);
    assert!(peers6.entries.is_empty());
}

/// cluster-b's NatMapping: an IPv4 entry, and in `spec.ipv6` two IPv6
/// ones, the second outside our ExternalCIDR as b sees it.
const NATMAPPING_B: &str = "apiVersion: net.liqo.io/v1alpha1
kind: NatMapping
metadata: {name: nm-cluster-b}
spec:
  clusterID: cluster-b
  clusterMappings:
    10.244.0.5: 192.168.0.45
  ipv6:
    externalCIDR: fd00:192:168::/64
    clusterMappings:
      'fd00:10:244::5': 'fd00:192:168::45'
      'fd00:10:244::6': 'fd00:99::1'
";

#[test]
fn an_ipv6_natmapping_entry_is_keyed_by_its_real_external_ip_and_a_bad_one_costs_only_itself() {
    let (mut peers, mut peers6) = (Peers::default(), Peers6::default());
    let mut mappings6 = Mappings6::default();
    let mut r = reconciler6(&mut peers, &mut peers6, &mut mappings6);
    let tep = dual("b", "fd00:10::/64", "fd00:10:0:1::/64").cluster_id("cluster-b");
    r.set_origin("b.yaml".into(), docs("b.yaml", &tep.to_string()));
    r.set_origin("nm.yaml".into(), docs("nm.yaml", NATMAPPING_B));
    let (report, failure) = r.reconcile();
    assert!(failure.is_none());
    assert_eq!((report.mappings, report.mappings_written), (2, 2));
    assert_eq!(
        messages(&report.new_errors),
        [
            "nm.yaml: NatMapping nm-cluster-b: field spec.ipv6.clusterMappings.fd00:10:244::6: externalIP fd00:99::1 lies outside fd00:192:168::/64, our ExternalCIDR as the peer sees it (ipv6.localExternalCIDR of TunnelEndpoint liqo-tenant-x/b)"
        ]
    );
    drop(r);
    let key = MappingKey {
        peer_id: 1,
        addr: Be128::from("fd00:192:168::45".parse::<std::net::Ipv6Addr>().unwrap()),
    };
    let endpoint = Be128::from("fd00:10:244::5".parse::<std::net::Ipv6Addr>().unwrap());
    assert_eq!(
        mappings6.entries.into_iter().collect::<Vec<_>>(),
        [(key, endpoint)]
    );
}

#[test]
fn ipv6_entries_for_a_peer_without_ipv6_networks_are_held_and_its_ipv4_ones_programmed() {
    let (mut peers, mut peers6) = (Peers::default(), Peers6::default());
    let mut mappings6 = Mappings6::default();
    let mut r = reconciler6(&mut peers, &mut peers6, &mut mappings6);
    let tep = peer("b", "10.1.0.0/24", "10.1.1.0/24").cluster_id("cluster-b");
    r.set_origin("b.yaml".into(), docs("b.yaml", &tep.to_string()));
    r.set_origin("nm.yaml".into(), docs("nm.yaml", NATMAPPING_B));
    let report = r.reconcile().0;
    assert_eq!(report.mappings, 1, "the IPv4 entry");
    assert_eq!(
        messages(&report.new_errors),
        [
            "nm.yaml: NatMapping nm-cluster-b: field spec.ipv6: TunnelEndpoint liqo-tenant-x/b gives cluster cluster-b no IPv6 networks; its IPv6 entries are held"
        ]
    );
    drop(r);
    assert!(mappings6.entries.is_empty());
}
