//! What `--forward-past-netfilter=auto` proves of a node's real rules, read
//! back from the kernel as the agent reads them: kube-proxy's rules act
//! only on its Services' addresses, which then take the stack, and a rule
//! that could act on any forwarded packet keeps them all in the stack,
//! whichever tool wrote it; each family apart.

use ipnet::IpNet;
use isthmus_agent::kernel::netfilter::{Hooks, NodeHooks, Reader};
use isthmus_lab::{lab::kube_proxy, netns::run_in, topology::A};
use isthmus_tests::{netns, require_root};

/// A netns of the test's own, with the reader that reads its hooks: the
/// same reader throughout, so that its cache of nftables' rules is tested
/// against every change. Each test has its netns, as they run in parallel.
struct RuleNode {
    ns: &'static str,
    reader: Reader,
}

impl RuleNode {
    fn new(ns: &'static str) -> Self {
        netns::fresh(&[ns]);
        Self {
            ns,
            reader: Reader::default(),
        }
    }

    fn run(&self, command: &[&str]) {
        in_ns(self.ns, command);
    }

    fn read_both(&mut self) -> NodeHooks {
        let reader = &mut self.reader;
        run_in(self.ns, || reader.read()).unwrap()
    }

    /// IPv4's hooks, checking that IPv6's are clear with no destination:
    /// the rules of the IPv4 test are IPv4's alone.
    fn read(&mut self) -> Hooks {
        let both = self.read_both();
        assert_eq!(both.ipv6, clear(&[]), "IPv6, beside IPv4's rules");
        both.ipv4
    }

    /// IPv6's hooks, checking that IPv4's are clear with no destination.
    fn read_ipv6(&mut self) -> Hooks {
        let both = self.read_both();
        assert_eq!(both.ipv4, clear(&[]), "IPv4, beside IPv6's rules");
        both.ipv6
    }
}

impl Drop for RuleNode {
    fn drop(&mut self) {
        netns::remove(&[self.ns]);
    }
}

/// Runs `command` in netns `ns`.
fn in_ns(ns: &str, command: &[&str]) {
    isthmus_lab::cmd::run("ip", &[&["netns", "exec", ns][..], command].concat()).unwrap();
}

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|n| n.parse().unwrap()).collect()
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
    let mut node = RuleNode::new("ist-t-netfilter");
    assert_eq!(node.read(), clear(&[]), "a node without rules");

    kube_proxy::install(node.ns, &A, &kube_proxy::services(&A)).unwrap();
    assert_eq!(
        node.read(),
        Hooks::Clear {
            stack_destinations: nets(&["10.96.0.1/32", "10.96.0.10/32", "10.96.0.20/32"])
        },
        "kube-proxy's rules: its Services' addresses take the stack, those with endpoints \
         (DNAT) and the one without (REJECT)"
    );

    node.run(&[
        "iptables", "-w", "-A", "FORWARD", "-p", "tcp", "--dport", "80", "-j", "DROP",
    ]);
    let why = acting(&node.read());
    assert!(
        why.contains("ip filter chain FORWARD: rule") && why.contains("drops"),
        "{why}"
    );
    node.run(&[
        "iptables", "-w", "-D", "FORWARD", "-p", "tcp", "--dport", "80", "-j", "DROP",
    ]);

    node.run(&[
        "iptables",
        "-w",
        "-t",
        "nat",
        "-A",
        "POSTROUTING",
        "-j",
        "MASQUERADE",
    ]);
    let why = acting(&node.read());
    assert!(
        why.contains("ip nat chain POSTROUTING") && why.contains("MASQUERADE"),
        "{why}"
    );
    node.run(&[
        "iptables",
        "-w",
        "-t",
        "nat",
        "-D",
        "POSTROUTING",
        "-j",
        "MASQUERADE",
    ]);

    node.run(&["nft", "add table inet isthmus_test"]);
    node.run(&[
        "nft",
        "add chain inet isthmus_test forward { type filter hook forward priority 0; }",
    ]);
    node.run(&[
        "nft",
        "add rule inet isthmus_test forward ct state invalid drop",
    ]);
    node.run(&[
        "nft",
        "add rule inet isthmus_test forward ip daddr 10.244.0.133 tcp dport 80 drop",
    ]);
    assert_eq!(
        node.read(),
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
    node.run(&["nft", "add rule inet isthmus_test forward meta mark 0 log"]);
    let both = node.read_both();
    for why in [acting(&both.ipv4), acting(&both.ipv6)] {
        assert!(
            why.contains("inet isthmus_test chain forward") && why.contains("log"),
            "an inet table's rule, in both families: {why}"
        );
    }
    node.run(&["nft", "delete table inet isthmus_test"]);

    node.run(&["iptables-legacy", "-w", "-A", "FORWARD", "-j", "ACCEPT"]);
    let why = acting(&node.read());
    assert!(
        why.contains("iptables-legacy filter chain FORWARD"),
        "{why}"
    );
    node.run(&["iptables-legacy", "-w", "-D", "FORWARD", "-j", "ACCEPT"]);

    node.run(&["iptables", "-w", "-P", "FORWARD", "DROP"]);
    let why = acting(&node.read());
    assert!(why.contains("policy drops"), "{why}");
}

/// IPv6's own rules, from ip6tables (nft and legacy) and nftables' ip6
/// tables, move IPv6's proof alone.
#[test]
fn a_dual_stack_nodes_kube_proxy_rules_send_each_familys_services_through_the_stack() {
    require_root();
    let mut node = RuleNode::new("ist-t-netfilter-ds");
    kube_proxy::install(node.ns, &A, &kube_proxy::services(&A)).unwrap();
    kube_proxy::install(node.ns, &A, &kube_proxy::services6(&A)).unwrap();
    let both = node.read_both();
    assert_eq!(
        both.ipv4,
        clear(&["10.96.0.1/32", "10.96.0.10/32", "10.96.0.20/32"]),
        "IPv4: its Services' addresses"
    );
    assert_eq!(
        both.ipv6,
        clear(&["fd00:10:96::a/128", "fd00:10:96::14/128"]),
        "IPv6: the addresses ip6tables' rules give the dual-stack Services, \
         with endpoints (DNAT) and without (REJECT)"
    );
}

#[test]
fn ipv6_rules_send_ipv6_through_the_stack_and_leave_ipv4_past_it() {
    require_root();
    let mut node = RuleNode::new("ist-t-netfilter6");
    let service = ["-d", "fd00:10:96::1/128", "-p", "tcp", "-j", "DROP"];
    let ns = node.ns;
    let ip6tables = |tool: &str, op: &str, chain: &[&str], rule: &[&str]| {
        in_ns(ns, &[&[tool, "-w"][..], chain, &[op][..], rule].concat());
    };
    ip6tables(
        "ip6tables",
        "-A",
        &[],
        &[&["FORWARD"][..], &service].concat(),
    );
    assert_eq!(
        node.read_ipv6(),
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
    let why = acting(&node.read_ipv6());
    assert!(
        why.contains("ip6 nat chain POSTROUTING") && why.contains("MASQUERADE"),
        "{why}"
    );
    ip6tables("ip6tables", "-D", &["-t", "nat"], &masquerade);

    node.run(&["nft", "add table ip6 isthmus_test"]);
    node.run(&[
        "nft",
        "add chain ip6 isthmus_test forward { type filter hook forward priority 0; }",
    ]);
    node.run(&[
        "nft",
        "add rule ip6 isthmus_test forward ip6 daddr fd00:10:244::/64 counter accept",
    ]);
    node.run(&[
        "nft",
        "add rule ip6 isthmus_test forward ip6 daddr fd00:10:244:0:8000::133 reject",
    ]);
    assert_eq!(
        node.read_ipv6(),
        clear(&["fd00:10:244:0:8000::133/128"]),
        "native ip6 table: the accept is inert, the reject for one pod sends it through"
    );
    node.run(&["nft", "delete table ip6 isthmus_test"]);

    let forward = ["FORWARD", "-j", "ACCEPT"];
    ip6tables("ip6tables-legacy", "-A", &[], &forward);
    let why = acting(&node.read_ipv6());
    assert!(
        why.contains("ip6tables-legacy filter chain FORWARD"),
        "{why}"
    );
    ip6tables("ip6tables-legacy", "-D", &[], &forward);
    assert_eq!(node.read_ipv6(), clear(&[]), "all rules gone");
}
