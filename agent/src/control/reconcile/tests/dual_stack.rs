//! Peers with IPv6 networks: both peer tables written from one pass, and
//! IPv6 views held apart as IPv4 ones are.

use ipnet::Ipv6Net;
use isthmus_common::wire::Be128;

use super::*;

type Peers6 = MemoryTable<Ipv6Net, PeerNat<Be128>>;

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

/// A reconciler over both peer tables, and a NatMapping table of its own.
fn reconciler6<'a>(
    peers: &'a mut Peers,
    peers6: &'a mut Peers6,
) -> Reconciler<&'a mut Peers, Mappings, MemoryAllowedTable, &'a mut Peers6> {
    Reconciler::dual_stack(
        peers,
        peers6,
        Mappings::default(),
        MemoryAllowedTable::default(),
    )
    .unwrap()
}

fn net6(s: &str) -> Ipv6Net {
    s.parse().unwrap()
}

#[test]
fn a_dual_stack_peer_is_written_to_both_tables_and_an_overlap_is_refused() {
    let (mut peers, mut peers6) = (Peers::default(), Peers6::default());
    let mut r = reconciler6(&mut peers, &mut peers6);
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
    let mut r = reconciler6(&mut peers, &mut peers6);
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
