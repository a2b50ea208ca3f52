//! The lab's addresses and views, as DESIGN gives them.

use super::*;

#[test]
fn addresses_follow_design() {
    assert_eq!(A.pod_addr(1), Ipv4Addr::new(10, 244, 0, 5));
    assert_eq!(A.pod_addr(2), Ipv4Addr::new(10, 244, 0, 133));
    assert_eq!(A.pod_half(1).to_string(), "10.244.0.0/25");
    assert_eq!(A.pod_half(2).to_string(), "10.244.0.128/25");
    assert_eq!(B.wan_addr(), Ipv4Addr::new(203, 0, 113, 2));
    assert_eq!(B.lan_node(), Ipv4Addr::new(172, 16, 2, 2));
}

#[test]
fn peer_views_are_the_remapped_networks() {
    assert_eq!(
        PEERINGS[0].remote_views().map(|n| n.to_string()),
        ["10.0.0.0/24", "10.0.1.0/24"]
    );
    assert_eq!(
        PEERINGS[1].remote_views().map(|n| n.to_string()),
        ["10.0.40.0/24", "10.0.41.0/24"]
    );
}

#[test]
fn the_dual_stack_views_are_designs() {
    assert_eq!(
        PEERINGS[0].ipv6_views(),
        [
            [
                "fd00:10:244::/64",
                "fd00:10:0:40::/64",
                "fd00:192:168::/64",
                "fd00:10:0:41::/64"
            ],
            [
                "fd00:10:244::/64",
                "fd00:10::/64",
                "fd00:192:168::/64",
                "fd00:10:0:1::/64"
            ],
        ]
    );
    assert_eq!(
        PEERINGS[2].ipv6_views()[1],
        ["fd00:10:1::/64", "None", "fd00:192:168:2::/64", "None"]
    );
}

#[test]
fn the_dual_stack_addresses_are_designs() {
    let addr = |text: &str| text.parse::<std::net::Ipv6Addr>().unwrap();
    assert_eq!(A.pod_addr6(1), addr("fd00:10:244::5"));
    assert_eq!(A.pod_addr6(2), addr("fd00:10:244:0:8000::133"));
    assert_eq!(C.pod_addr6(1), addr("fd00:10:1::5"));
    assert_eq!(A.pod_half6(2).to_string(), "fd00:10:244:0:8000::/65");
    assert_eq!(B.wan_addr6(), addr("2001:db8:ffff::2"));
    assert_eq!(C.lan_node6(), addr("fd00:172:16:3::2"));
    assert_eq!(
        PEERINGS[0].remote_views6().map(|n| n.to_string()),
        ["fd00:10::/64", "fd00:10:0:1::/64"]
    );
    assert_eq!(
        PEERINGS[2].remote_views6().map(|n| n.to_string()),
        ["fd00:10:1::/64", "fd00:192:168:2::/64"]
    );
    let over_ipv6: Vec<bool> = PEERINGS.iter().map(Peering::over_ipv6_wan).collect();
    assert_eq!(over_ipv6, [true, true, false, false]);
    // Row 5 reaches c-pod1 through b's NatMapping, from b's masquerade
    // address.
    assert_eq!(
        NAT_MAPPING.entry6(),
        (addr("fd00:10:1::5"), addr("fd00:10:0:1::45"))
    );
    assert_eq!(
        B.masquerade_addr6(),
        addr("fd00:10:244::ffff:ffff:ffff:fffe")
    );
    // Each other row's server holds the address its client connects to,
    // as its own cluster sees it.
    for row in reachability6().into_iter().filter(|row| row.row != 5) {
        let cluster = CLUSTERS
            .iter()
            .find(|c| row.answered_by.starts_with(c.name))
            .unwrap();
        let i = if row.answered_by.ends_with('1') { 1 } else { 2 };
        let host = u128::from(cluster.pod_addr6(i)) & u128::from(u64::MAX);
        assert_eq!(
            u128::from(row.target) & u128::from(u64::MAX),
            host,
            "row {}",
            row.row
        );
    }
}
