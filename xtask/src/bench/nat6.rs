//! `cargo xtask bench nat6`: the smallest IPv6 UDP packets per second
//! through the two translating gateways of the dual-stack lab, with no
//! tunnel (the gateways route each other's views over the WAN's IPv6 in
//! clear): plain IPv6 forwarding, the ip6tables `NETMAP` and `MASQUERADE`
//! rules a user would write by hand for 200 peers (no Liqo release does
//! IPv6), and Isthmus as the DaemonSets run it with 1 and 200 peers, in
//! interleaved rounds on bare nodes.

use std::{
    net::{IpAddr, Ipv6Addr},
    time::Duration,
};

use anyhow::Result;
use ipnet::Ipv6Net;
use isthmus_lab::{
    cmd::{ip, run},
    lab,
    topology::{A, B, Cluster, PEERINGS, synthetic_peer_views6},
};

use super::{
    ROUNDS,
    gateways::{disable_isthmus, enable_isthmus, nat_gateways, set_isthmus_peers},
    packets::{Flow, WARMUP, WINDOW, WINDOWS, measure},
    stats::{median, ratio_line},
    write_section,
};

/// b-pod2 as a sees it, where a-pod2 sends.
const TARGET: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0, 0, 0x8000, 0, 0, 0x133);
/// a-pod2 as b sees it, where the flows are answered.
const CLIENT_AT_B: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0, 0x40, 0x8000, 0, 0, 0x133);

/// One configuration of the gateways.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    /// No NAT: each gateway forwards, b-pod2 holding the address a sends to.
    Plain,
    /// ip6tables rules written by hand for this many peers.
    Ip6tables(usize),
    /// Isthmus with this many peers, as the DaemonSets run it.
    Isthmus(usize),
}

/// The setups, in the order of odd rounds.
const SETUPS: [Setup; 4] = [
    Setup::Plain,
    Setup::Ip6tables(200),
    Setup::Isthmus(1),
    Setup::Isthmus(200),
];

impl Setup {
    fn name(self) -> String {
        match self {
            Setup::Plain => "plain IPv6 forwarding".into(),
            Setup::Ip6tables(peers) => format!("ip6tables NETMAP and MASQUERADE, {peers} peers"),
            Setup::Isthmus(peers) => format!("isthmus, {peers} peer(s)"),
        }
    }

    /// Configures the gateways and measures; undoes what only this setup
    /// needs.
    fn measure(self) -> Result<Vec<f64>> {
        match self {
            Setup::Plain => {
                disable_isthmus(&nat_gateways())?;
                plain_address(true)?;
                let measured = measure(&flow(false));
                plain_address(false)?;
                measured
            }
            Setup::Ip6tables(peers) => {
                disable_isthmus(&nat_gateways())?;
                for cluster in [&A, &B] {
                    install_rules(cluster, peers)?;
                }
                let measured = measure(&flow(true));
                for cluster in [&A, &B] {
                    flush_rules(&cluster.gw())?;
                }
                measured
            }
            Setup::Isthmus(peers) => {
                enable_isthmus(&nat_gateways())?;
                set_isthmus_peers(peers)?;
                past_netfilter()?;
                measure(&flow(true))
            }
        }
    }
}

/// Checks that both gateways' agents forward IPv6 past netfilter, as the
/// DaemonSets' setting does on bare nodes: the ip6tables setup leaves its
/// tables empty, which the agents prove harmless.
fn past_netfilter() -> Result<()> {
    for gw in [A.gw(), B.gw()] {
        let metric = "isthmus_forward_past_netfilter_ipv6";
        let what = format!("{gw}'s agent reports {metric} 1 (its log says why not)");
        // The agents read the node's rules once a second.
        isthmus_lab::wait::poll(
            Duration::from_secs(5),
            Duration::from_millis(50),
            &what,
            || (lab::metric_sum(&gw, metric, &[]).ok() == Some(1.0)).then_some(()),
        )?;
    }
    Ok(())
}

/// a-pod2 → b-pod2 as a sees it, its flows answered by b-pod2 before the
/// measurement, where conntrack runs, or not.
fn flow(answered: bool) -> Flow {
    Flow {
        client: A.pod(2),
        next_hop: (A.gw(), "pod2"),
        server: B.pod(2),
        src: A.pod_addr6(2).into(),
        dst: TARGET.into(),
        answer_to: answered.then_some(IpAddr::V6(CLIENT_AT_B)),
    }
}

/// Without NAT, b-gw delivers a's packets to b-pod2 only if b-pod2 holds
/// the address a sends to.
fn plain_address(add: bool) -> Result<()> {
    let target = format!("{TARGET}/128");
    let route = |op| ["-6", "route", op, target.as_str(), "dev", "pod2"];
    if add {
        ip(
            &B.pod(2),
            &["-6", "addr", "add", &target, "dev", "eth0", "nodad"],
        )?;
        ip(&B.gw(), &route("add"))?;
    } else {
        ip(&B.gw(), &route("del"))?;
        ip(&B.pod(2), &["-6", "addr", "del", &target, "dev", "eth0"])?;
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

/// Removes the ip6tables rules of gateway `gw`.
fn flush_rules(gw: &str) -> Result<()> {
    run("ip", &["netns", "exec", gw, "ip6tables", "-t", "nat", "-F"])?;
    Ok(())
}

/// Runs the NAT66 bench in the dual-stack lab that is up, and writes its
/// section of `docs/benchmarks.md`.
pub fn run_nat6() -> Result<()> {
    let mut samples: Vec<(Setup, Vec<f64>)> = SETUPS.iter().map(|s| (*s, Vec::new())).collect();
    for round in 1..=ROUNDS {
        // Every other round in the opposite order, as the NAT bench.
        let mut order: Vec<&mut (Setup, Vec<f64>)> = samples.iter_mut().collect();
        if round % 2 == 0 {
            order.reverse();
        }
        for (setup, rounds) in order {
            println!("bench: round {round}/{ROUNDS}, {}", setup.name());
            rounds.push(median(&setup.measure()?));
        }
    }
    let rounds = |setup| {
        samples
            .iter()
            .find(|(s, _)| *s == setup)
            .map_or_else(Vec::new, |(_, r)| r.clone())
    };
    let mut lines = ratio_line(
        "nat66-pps-default-1peer-vs-plain-forwarding",
        &rounds(Setup::Isthmus(1)),
        &rounds(Setup::Plain),
        0,
    );
    lines += &ratio_line(
        "nat66-pps-default-200peers-vs-ip6tables",
        &rounds(Setup::Isthmus(200)),
        &rounds(Setup::Ip6tables(200)),
        0,
    );
    write_section("nat66", &report(&samples, &lines)?)
}

/// The bench's section of `docs/benchmarks.md`.
fn report(samples: &[(Setup, Vec<f64>)], lines: &str) -> Result<String> {
    let kernel = run("uname", &["-r"])?.trim().to_owned();
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let mut table = String::new();
    for (setup, rounds) in samples {
        let shown: Vec<String> = rounds.iter().map(|r| format!("{r:.0}")).collect();
        table += &format!(
            "| {} | {:.0} | {} |\n",
            setup.name(),
            median(rounds),
            shown.join(", ")
        );
    }
    Ok(format!(
        "## NAT66: IPv6 UDP through two gateways

Produced by `cargo xtask bench nat6` ({cpus} CPUs, kernel {kernel}), in
the dual-stack lab without a tunnel (`cargo xtask lab up --dual-stack
--tunnel none`), on bare nodes.

trafgen in `a-pod2` sends the smallest IPv6 UDP frames (64 bytes, 68
with FCS) to `{TARGET}`, b-pod2 as a sees it, over 256 source ports;
the rate is what reaches `b-pod2`'s `eth0`, where an nftables netdev hook
drops it. Each NAT setup translates every packet twice (the source at
`a-gw`, the destination at `b-gw`). ip6tables has the rules a user would
write by hand, per peer: `NETMAP` of our Pod and External networks on the
way out and on the way in, and `MASQUERADE` of any other source, the
measured peer's rules last; its flows are answered first, so conntrack
holds them established. Isthmus runs as the DaemonSets run it, its
benchmark peers carrying IPv6 networks too; the bench checks that both
gateways forward IPv6 past netfilter
(`isthmus_forward_past_netfilter_ipv6` is 1), as the DaemonSets' `auto`
does where no rule could act on the packets. {ROUNDS} interleaved rounds
of {WINDOWS} windows of {WINDOW:?} (after {WARMUP:?} of warm-up), every
other round in the opposite order; each round's figure is the median of
its windows.

| setup | median pps | each round |
|---|---|---|
{table}
```
{lines}```
"
    ))
}
