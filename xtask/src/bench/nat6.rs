//! `cargo xtask bench nat6`: the smallest IPv6 UDP packets per second
//! through the two translating gateways of the dual-stack lab, with no
//! tunnel (the gateways route each other's views over the WAN's IPv6 in
//! clear): plain IPv6 forwarding, the ip6tables `NETMAP` and `MASQUERADE`
//! rules a user would write by hand for 200 peers (no Liqo release does
//! IPv6), and Isthmus as the DaemonSets run it with 1 and 200 peers, in
//! interleaved rounds, on bare nodes and on nodes with kube-proxy's rules
//! for a dual-stack cluster's Services.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv6Addr},
};

use anyhow::Result;
use ipnet::Ipv6Net;
use isthmus_lab::{
    cmd::{ip, run},
    lab::{self, kube_proxy},
    topology::{A, B, Cluster, PEERINGS, synthetic_peer_views6},
};

use super::{
    ROUNDS,
    gateways::{await_gauges, disable_isthmus, enable_isthmus, nat_gateways, set_isthmus_peers},
    liqo_v0_10::remove_all,
    packets::{Flow, WARMUP, WINDOW, WINDOWS, measure},
    program_time::{self, NAT_PROGRAMS},
    stats::{median, ratio_line},
    write_section,
};

/// b-pod2 as a sees it, where a-pod2 sends.
const TARGET: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0, 0, 0x8000, 0, 0, 0x133);
/// a-pod2 as b sees it, where the flows are answered.
const CLIENT_AT_B: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0, 0x40, 0x8000, 0, 0, 0x133);

/// What the gateways carry besides the setup's own rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    /// Nothing: no netfilter rule but the setup's.
    Bare,
    /// kube-proxy's iptables-mode rules for a dual-stack cluster's
    /// Services, IPv4's and IPv6's, as every node of such a cluster that
    /// runs kube-proxy carries them.
    KubeProxy,
}

/// One configuration of the gateways.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    /// No NAT: each gateway forwards, b-pod2 holding the address a sends to.
    Plain(Node),
    /// ip6tables rules written by hand for this many peers.
    Ip6tables(usize, Node),
    /// Isthmus with this many peers, as the DaemonSets run it.
    Isthmus(usize, Node),
}

/// The setups, in the order of odd rounds.
const SETUPS: [Setup; 8] = [
    Setup::Plain(Node::KubeProxy),
    Setup::Ip6tables(200, Node::KubeProxy),
    Setup::Isthmus(1, Node::KubeProxy),
    Setup::Isthmus(200, Node::KubeProxy),
    Setup::Plain(Node::Bare),
    Setup::Ip6tables(200, Node::Bare),
    Setup::Isthmus(1, Node::Bare),
    Setup::Isthmus(200, Node::Bare),
];

impl Setup {
    fn name(self) -> String {
        let name = match self {
            Setup::Plain(_) => "plain IPv6 forwarding".into(),
            Setup::Ip6tables(peers, _) => {
                format!("ip6tables NETMAP and MASQUERADE, {peers} peers")
            }
            Setup::Isthmus(peers, _) => format!("isthmus, {peers} peer(s)"),
        };
        match self.node() {
            Node::Bare => name,
            Node::KubeProxy => format!("kube-proxy node: {name}"),
        }
    }

    fn node(self) -> Node {
        match self {
            Setup::Plain(node) | Setup::Ip6tables(_, node) | Setup::Isthmus(_, node) => node,
        }
    }

    /// Configures the gateways and measures; undoes what only this setup
    /// needs.
    fn measure(self) -> Result<Vec<f64>> {
        let gateways = [A.gw(), B.gw()];
        match self {
            Setup::Plain(node) => {
                disable_isthmus(&nat_gateways())?;
                remove_all(&gateways)?;
                kube_proxy_rules(node)?;
                plain_addresses(true)?;
                let measured = measure(&flow(true));
                plain_addresses(false)?;
                measured
            }
            Setup::Ip6tables(peers, node) => {
                disable_isthmus(&nat_gateways())?;
                remove_all(&gateways)?;
                kube_proxy_rules(node)?;
                for cluster in [&A, &B] {
                    install_rules(cluster, peers)?;
                }
                measure(&flow(false))
            }
            Setup::Isthmus(peers, node) => {
                remove_all(&gateways)?;
                kube_proxy_rules(node)?;
                enable_isthmus(&nat_gateways())?;
                set_isthmus_peers(peers)?;
                past_netfilter(node)?;
                measure(&flow(false))
            }
        }
    }
}

/// Gives both gateways kube-proxy's rules for both families on a
/// kube-proxy node.
fn kube_proxy_rules(node: Node) -> Result<()> {
    if node == Node::KubeProxy {
        for cluster in [&A, &B] {
            for services in [
                kube_proxy::services(cluster),
                kube_proxy::services6(cluster),
            ] {
                kube_proxy::install(&cluster.gw(), cluster, &services)?;
            }
        }
    }
    Ok(())
}

/// Checks that both gateways' agents forward IPv6 past netfilter, as the
/// DaemonSets' setting does where it proves the node's rules harmless: on
/// a bare node, where the ip6tables setup left no table, and on a
/// kube-proxy node, with its IPv6 Services' addresses alone in the stack.
fn past_netfilter(node: Node) -> Result<()> {
    let services = match node {
        Node::Bare => 0,
        Node::KubeProxy => kube_proxy::addresses(&kube_proxy::services6(&A)),
    };
    let expected = [
        ("isthmus_forward_past_netfilter_ipv6", 1.0),
        ("isthmus_forward_stack_destinations_ipv6", services as f64),
    ];
    let setup = Setup::Isthmus(1, node).name();
    for gw in [A.gw(), B.gw()] {
        await_gauges(&gw, &expected, &setup)?;
    }
    Ok(())
}

/// a-pod2 → b-pod2 as a sees it, its flows answered by b-pod2 before the
/// measurement, so that conntrack, where it runs, holds them established.
/// Without NAT (`plain`), a-pod2 sends from its address as b sees it,
/// which b answers.
fn flow(plain: bool) -> Flow {
    Flow {
        client: A.pod(2),
        next_hop: (A.gw(), "pod2"),
        server: B.pod(2),
        src: if plain { CLIENT_AT_B } else { A.pod_addr6(2) }.into(),
        dst: TARGET.into(),
        answer_to: Some(IpAddr::V6(CLIENT_AT_B)),
    }
}

/// Without NAT, b-pod2 must own the address a sends to, and a-pod2 the
/// address b answers: both clusters' IPv6 PodCIDR is the same, so a-pod2's
/// own would be b-pod2's. b-pod2 answers from the address a sent to. Each
/// gateway already routes the other's views over the WAN.
fn plain_addresses(add: bool) -> Result<()> {
    let (target, client) = (format!("{TARGET}/128"), format!("{CLIENT_AT_B}/128"));
    let target_addr = TARGET.to_string();
    let mut steps = [
        (
            B.pod(2),
            "addr",
            vec![target.as_str(), "dev", "eth0", "nodad"],
        ),
        (B.gw(), "route", vec![&target, "dev", "pod2"]),
        (A.pod(2), "addr", vec![&client, "dev", "eth0", "nodad"]),
        (A.gw(), "route", vec![&client, "dev", "pod2"]),
        (
            B.pod(2),
            "route",
            vec![
                &client,
                "via",
                lab::POD_GATEWAY6,
                "dev",
                "eth0",
                "src",
                &target_addr,
            ],
        ),
    ];
    // The route from b-pod2's added address goes before the address.
    if !add {
        steps.reverse();
    }
    let op = if add { "add" } else { "del" };
    for (ns, object, args) in &steps {
        let mut command = vec!["-6", *object, op];
        // `nodad` is for adding alone.
        command.extend(args.iter().filter(|a| add || **a != "nodad"));
        ip(ns, &command)?;
    }
    Ok(())
}

/// The networks of one peer of `cluster` as the rules need them: ours
/// (Pod, External) as the peer sees them, then the peer's as we see them.
type PeerViews = [Ipv6Net; 4];

/// `cluster`'s peers in a run with `count` peers: the synthetic ones, then
/// the real one, last, as Isthmus's benchmark peers are.
fn peer_views(cluster: &Cluster, count: usize) -> Vec<PeerViews> {
    let real = PEERINGS
        .iter()
        .find(|p| p.local.name == cluster.name && [A.name, B.name].contains(&p.remote.name))
        .expect("the a–b peering");
    let [ours, _] = real.ipv6_views();
    let view = |text: &str| text.parse().expect("a CIDR");
    let [their_pods, their_external] = real.remote_views6();
    let real = [view(ours[1]), view(ours[3]), their_pods, their_external];
    let mut peers: Vec<PeerViews> = (1..count).map(synthetic_peer_views6).collect();
    peers.push(real);
    peers
}

/// The rules a user would write on `cluster`'s gateway for `count` peers:
/// our pods' and external addresses mapped, prefix for prefix, to the
/// networks each peer sees them under (`NETMAP`, source on the way out,
/// destination on the way in), and any other source masqueraded.
fn install_rules(cluster: &Cluster, count: usize) -> Result<()> {
    let mut rules = String::from("*nat\n");
    let (pods, external) = (cluster.pod_cidr6, cluster.external_cidr6);
    for [our_pods, our_external, their_pods, their_external] in peer_views(cluster, count) {
        for theirs in [their_pods, their_external] {
            for (ours, seen) in [(pods, our_pods), (external, our_external)] {
                rules += &format!("-A POSTROUTING -s {ours} -d {theirs} -j NETMAP --to {seen}\n");
            }
            rules += &format!("-A POSTROUTING -d {theirs} -j MASQUERADE\n");
        }
        for (ours, seen) in [(pods, our_pods), (external, our_external)] {
            rules += &format!("-A PREROUTING -d {seen} -j NETMAP --to {ours}\n");
        }
    }
    rules += "COMMIT\n";
    let file = format!("{}/bench.ip6tables", isthmus_lab::lab::STATE_DIR);
    std::fs::write(&file, rules)?;
    let restore = format!("ip6tables-restore < {file}");
    run(
        "ip",
        &["netns", "exec", &cluster.gw(), "sh", "-c", &restore],
    )?;
    Ok(())
}

/// The RESULT lines: Isthmus's setup against the other, by name.
const COMPARISONS: [(&str, Setup, Setup); 4] = [
    (
        "nat66-pps-default-1peer-vs-plain-forwarding",
        Setup::Isthmus(1, Node::Bare),
        Setup::Plain(Node::Bare),
    ),
    (
        "nat66-pps-default-200peers-vs-ip6tables",
        Setup::Isthmus(200, Node::Bare),
        Setup::Ip6tables(200, Node::Bare),
    ),
    (
        "nat66-pps-kubeproxy-node-1peer-vs-plain-forwarding",
        Setup::Isthmus(1, Node::KubeProxy),
        Setup::Plain(Node::KubeProxy),
    ),
    (
        "nat66-pps-kubeproxy-node-200peers-vs-ip6tables",
        Setup::Isthmus(200, Node::KubeProxy),
        Setup::Ip6tables(200, Node::KubeProxy),
    ),
];

/// One setup's figures in one round.
struct Round {
    /// The median of its windows' packet rates.
    pps: f64,
    /// The kernel's time per run of the NAT's entry programs, tail calls
    /// included, where Isthmus ran.
    ns_per_run: BTreeMap<&'static str, f64>,
}

/// Runs the NAT66 bench in the dual-stack lab that is up, and writes its
/// section of `docs/benchmarks.md`.
pub fn run_nat6() -> Result<()> {
    let mut samples: Vec<(Setup, Vec<Round>)> = SETUPS.iter().map(|s| (*s, Vec::new())).collect();
    for round in 1..=ROUNDS {
        // Every other round in the opposite order, as the NAT bench.
        let mut order: Vec<&mut (Setup, Vec<Round>)> = samples.iter_mut().collect();
        if round % 2 == 0 {
            order.reverse();
        }
        for (setup, rounds) in order {
            println!("bench: round {round}/{ROUNDS}, {}", setup.name());
            let pps = median(&setup.measure()?);
            let ns_per_run = program_time::time_per_run(|| measure(&flow(false)))?;
            rounds.push(Round { pps, ns_per_run });
        }
    }
    let pps = |setup| {
        samples
            .iter()
            .find(|(s, _)| *s == setup)
            .map_or_else(Vec::new, |(_, rounds)| {
                rounds.iter().map(|r| r.pps).collect()
            })
    };
    let lines: String = COMPARISONS
        .iter()
        .map(|(name, ours, theirs)| ratio_line(name, &pps(*ours), &pps(*theirs), 0))
        .collect();
    write_section("nat66", &report(&samples, &lines)?)
}

/// The bench's section of `docs/benchmarks.md`.
fn report(samples: &[(Setup, Vec<Round>)], lines: &str) -> Result<String> {
    let kernel = run("uname", &["-r"])?.trim().to_owned();
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let mut table = String::new();
    for (setup, rounds) in samples {
        let pps: Vec<f64> = rounds.iter().map(|r| r.pps).collect();
        let shown: Vec<String> = pps.iter().map(|r| format!("{r:.0}")).collect();
        let cost = |program| {
            let runs: Vec<f64> = (rounds.iter())
                .filter_map(|r| r.ns_per_run.get(program).copied())
                .collect();
            if runs.is_empty() {
                "–".to_owned()
            } else {
                format!("{:.0}", median(&runs))
            }
        };
        let [egress, ingress] = NAT_PROGRAMS.map(cost);
        table += &format!(
            "| {} | {:.0} | {egress} | {ingress} | {} |\n",
            setup.name(),
            median(&pps),
            shown.join(", ")
        );
    }
    Ok(format!(
        "## NAT66: IPv6 UDP through two gateways

Produced by `cargo xtask bench nat6` ({cpus} CPUs, kernel {kernel}), in
the dual-stack lab without a tunnel (`cargo xtask lab up --dual-stack
--tunnel none`), on bare nodes and on nodes with kube-proxy's rules.

trafgen in `a-pod2` sends the smallest IPv6 UDP frames (64 bytes, 68
with FCS) to `{TARGET}`, b-pod2 as a sees it, over 256 source ports;
the rate is what reaches `b-pod2`'s `eth0`, where an nftables netdev hook
drops it. b-pod2 answers each flow once first, so that conntrack, where
it runs, holds them established; without NAT, a-pod2 sends from
`{CLIENT_AT_B}`, its address as b sees it, which b answers. Each NAT
setup translates every packet twice (the source at `a-gw`, the
destination at `b-gw`). ip6tables has the rules a user would write by
hand, per peer: `NETMAP` of our Pod and External networks on the way out
and on the way in, and `MASQUERADE` of any other source, the measured
peer's rules last. Isthmus runs as the DaemonSets run it, its benchmark
peers carrying IPv6 networks too. On a kube-proxy node, both gateways
carry the rules kube-proxy v1.31 writes in iptables mode for a
dual-stack cluster's Services, IPv4's through iptables and IPv6's
through ip6tables, beside the setup's own. The bench checks that both
gateways forward IPv6 past netfilter
(`isthmus_forward_past_netfilter_ipv6` is 1), as the DaemonSets' `auto`
does where it proves the node's rules harmless to peers' packets, with
the IPv6 Services' addresses alone through the stack on a kube-proxy
node. {ROUNDS} interleaved rounds of {WINDOWS} windows of {WINDOW:?}
(after {WARMUP:?} of warm-up), every other round in the opposite order;
each round's figure is the median of its windows. The kernel's own count
of time in the NAT's entry programs (`BPF_ENABLE_STATS`) is given per
run, the median of the rounds'. It is taken over the same traffic once
more after each rate, since counting slows every run. It includes the
IPv6 NAT they go on in by tail call, and at b-gw the step that forwards
the packet to its pod. It leaves out `overlay_steer`, which forwards
a-pod2's packets at a-gw.

| setup | median pps | ns per run, `nat_egress_eth` at a-gw | ns per run, `nat_ingress_eth` at b-gw | each round |
|---|---|---|---|---|
{table}
```
{lines}```
"
    ))
}
