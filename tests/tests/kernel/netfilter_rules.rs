//! What `--forward-past-netfilter=auto` proves of a node's real rules, read
//! back from the kernel as the agent reads them: kube-proxy's rules act
//! only on its Services' addresses, which then take the stack, and a rule
//! that could act on any forwarded packet keeps them all in the stack,
//! whichever tool wrote it; each family apart.

use ipnet::IpNet;
use isthmus_agent::kernel::netfilter::{Hooks, NodeHooks, Reader};
use isthmus_lab::{lab::kube_proxy, netns::run_in, topology::A};
use isthmus_tests::{netns, require_root};

const NS: &str = "ist-t-netfilter";

fn in_ns(command: &[&str]) {
    isthmus_lab::cmd::run("ip", &[&["netns", "exec", NS][..], command].concat()).unwrap();
}

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|n| n.parse().unwrap()).collect()
}

/// The hooks as one reader sees them: the same reader throughout, so that
/// its cache of nftables' rules is tested against every change.
fn read_both(reader: &mut Reader) -> NodeHooks {
    run_in(NS, || reader.read()).unwrap()
}

/// IPv4's hooks, checking that IPv6's are clear with no destination: the
/// rules of the IPv4 part of the test are IPv4's alone.
fn read(reader: &mut Reader) -> Hooks {
    let both = read_both(reader);
    assert_eq!(both.ipv6, clear(&[]), "IPv6, beside IPv4's rules");
    both.ipv4
}

fn clear(destinations: &[&str]) -> Hooks {
    Hooks::Clear {
        stack_destinations: nets(destinations),
    }
}

fn acting(hooks: &Hooks) -> String {
    match hooks {
        Hooks::Acting(acting) => acting
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; "),
        other => panic!("expected rules that act, read {other:?}"),
    }
}

#[test]
fn kube_proxys_rules_send_only_its_services_addresses_through_the_stack() {
    require_root();
    netns::fresh(&[NS]);
    let mut reader = Reader::default();
    assert_eq!(read(&mut reader), clear(&[]), "a node without rules");

    kube_proxy::install(NS, &A, &kube_proxy::services(&A)).unwrap();
    assert_eq!(
        read(&mut reader),
        Hooks::Clear {
            stack_destinations: nets(&["10.96.0.1/32", "10.96.0.10/32", "10.96.0.20/32"])
        },
        "kube-proxy's rules: its Services' addresses take the stack, those with endpoints \
         (DNAT) and the one without (REJECT)"
    );

    in_ns(&[
        "iptables", "-w", "-A", "FORWARD", "-p", "tcp", "--dport", "80", "-j", "DROP",
    ]);
    let why = acting(&read(&mut reader));
    assert!(
        why.contains("ip filter chain FORWARD: rule") && why.contains("drops"),
        "{why}"
    );
    in_ns(&[
        "iptables", "-w", "-D", "FORWARD", "-p", "tcp", "--dport", "80", "-j", "DROP",
    ]);

    in_ns(&[
        "iptables",
        "-w",
        "-t",
        "nat",
        "-A",
        "POSTROUTING",
        "-j",
        "MASQUERADE",
    ]);
    let why = acting(&read(&mut reader));
    assert!(
        why.contains("ip nat chain POSTROUTING") && why.contains("MASQUERADE"),
        "{why}"
    );
    in_ns(&[
        "iptables",
        "-w",
        "-t",
        "nat",
        "-D",
        "POSTROUTING",
        "-j",
        "MASQUERADE",
    ]);

    in_ns(&["nft", "add table inet isthmus_test"]);
    in_ns(&[
        "nft",
        "add chain inet isthmus_test forward { type filter hook forward priority 0; }",
    ]);
    in_ns(&[
        "nft",
        "add rule inet isthmus_test forward ct state invalid drop",
    ]);
    in_ns(&[
        "nft",
        "add rule inet isthmus_test forward ip daddr 10.244.0.133 tcp dport 80 drop",
    ]);
    assert_eq!(
        read(&mut reader),
        Hooks::Clear {
            stack_destinations: nets(&[
                "10.96.0.1/32",
                "10.96.0.10/32",
                "10.96.0.20/32",
                "10.244.0.133/32"
            ])
        },
        "native nftables: the invalid drop is inert, the policy for one pod sends it through"
    );
    in_ns(&["nft", "add rule inet isthmus_test forward meta mark 0 log"]);
    let both = read_both(&mut reader);
    for why in [acting(&both.ipv4), acting(&both.ipv6)] {
        assert!(
            why.contains("inet isthmus_test chain forward") && why.contains("log"),
            "an inet table's rule, in both families: {why}"
        );
    }
    in_ns(&["nft", "delete table inet isthmus_test"]);

    in_ns(&["iptables-legacy", "-w", "-A", "FORWARD", "-j", "ACCEPT"]);
    let why = acting(&read(&mut reader));
    assert!(
        why.contains("iptables-legacy filter chain FORWARD"),
        "{why}"
    );
    in_ns(&["iptables-legacy", "-w", "-D", "FORWARD", "-j", "ACCEPT"]);

    in_ns(&["iptables", "-w", "-P", "FORWARD", "DROP"]);
    let why = acting(&read(&mut reader));
    assert!(why.contains("policy drops"), "{why}");
    netns::remove(&[NS]);
}

/// IPv6's own rules, from ip6tables (nft and legacy) and nftables' ip6
/// tables, move IPv6's proof alone.
#[test]
fn ipv6_rules_send_ipv6_through_the_stack_and_leave_ipv4_past_it() {
    require_root();
    netns::fresh(&[NS]);
    let mut reader = Reader::default();
    let read_ipv6 = |reader: &mut Reader| {
        let both = read_both(reader);
        assert_eq!(both.ipv4, clear(&[]), "IPv4, beside IPv6's rules");
        both.ipv6
    };
    let service = ["-d", "fd00:10:96::1/128", "-p", "tcp", "-j", "DROP"];
    let ip6tables = |tool: &str, op: &str, chain: &[&str], rule: &[&str]| {
        in_ns(&[&[tool, "-w"][..], chain, &[op][..], rule].concat());
    };
    ip6tables(
        "ip6tables",
        "-A",
        &[],
        &[&["FORWARD"][..], &service].concat(),
    );
    assert_eq!(
        read_ipv6(&mut reader),
        clear(&["fd00:10:96::1/128"]),
        "ip6tables-nft: a rule for one address sends it through the stack"
    );
    ip6tables(
        "ip6tables",
        "-D",
        &[],
        &[&["FORWARD"][..], &service].concat(),
    );

    let masquerade = ["POSTROUTING", "-j", "MASQUERADE"];
    ip6tables("ip6tables", "-A", &["-t", "nat"], &masquerade);
    let why = acting(&read_ipv6(&mut reader));
    assert!(
        why.contains("ip6 nat chain POSTROUTING") && why.contains("MASQUERADE"),
        "{why}"
    );
    ip6tables("ip6tables", "-D", &["-t", "nat"], &masquerade);

    in_ns(&["nft", "add table ip6 isthmus_test"]);
    in_ns(&[
        "nft",
        "add chain ip6 isthmus_test forward { type filter hook forward priority 0; }",
    ]);
    in_ns(&[
        "nft",
        "add rule ip6 isthmus_test forward ip6 daddr fd00:10:244::/64 counter accept",
    ]);
    in_ns(&[
        "nft",
        "add rule ip6 isthmus_test forward ip6 daddr fd00:10:244:0:8000::133 reject",
    ]);
    assert_eq!(
        read_ipv6(&mut reader),
        clear(&["fd00:10:244:0:8000::133/128"]),
        "native ip6 table: the accept is inert, the reject for one pod sends it through"
    );
    in_ns(&["nft", "delete table ip6 isthmus_test"]);

    let forward = ["FORWARD", "-j", "ACCEPT"];
    ip6tables("ip6tables-legacy", "-A", &[], &forward);
    let why = acting(&read_ipv6(&mut reader));
    assert!(
        why.contains("ip6tables-legacy filter chain FORWARD"),
        "{why}"
    );
    ip6tables("ip6tables-legacy", "-D", &[], &forward);
    assert_eq!(read_ipv6(&mut reader), clear(&[]), "all rules gone");
    netns::remove(&[NS]);
}
