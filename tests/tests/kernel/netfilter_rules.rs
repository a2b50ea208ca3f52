//! What `--forward-past-netfilter=auto` proves of a node's real rules, read
//! back from the kernel as the agent reads them: kube-proxy's rules act
//! only on its Services' addresses, which then take the stack, and a rule
//! that could act on any forwarded packet keeps them all in the stack,
//! whichever tool wrote it.

use ipnet::Ipv4Net;
use isthmus_agent::kernel::netfilter::{Hooks, Reader};
use isthmus_lab::{lab::kube_proxy, netns::run_in, topology::A};
use isthmus_tests::{netns, require_root};

const NS: &str = "ist-t-netfilter";

fn in_ns(command: &[&str]) {
    isthmus_lab::cmd::run("ip", &[&["netns", "exec", NS][..], command].concat()).unwrap();
}

fn nets(list: &[&str]) -> Vec<Ipv4Net> {
    list.iter().map(|n| n.parse().unwrap()).collect()
}

/// The hooks as one reader sees them: the same reader throughout, so that
/// its cache of nftables' rules is tested against every change.
fn read(reader: &mut Reader) -> Hooks {
    run_in(NS, || reader.read()).unwrap()
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
    assert_eq!(
        read(&mut reader),
        Hooks::Clear {
            stack_destinations: vec![]
        },
        "a node without rules"
    );

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
    let why = acting(&read(&mut reader));
    assert!(
        why.contains("inet isthmus_test chain forward") && why.contains("log"),
        "{why}"
    );
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
