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
