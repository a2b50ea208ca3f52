//! `cargo xtask bench tunnel6`: TCP from a-pod1 to b-pod1 through the
//! embedded tunnel of the dual-stack lab, the a–b tunnel over the WAN's
//! IPv6 addresses and over its IPv4 ones in turns: what an IPv6 WAN costs.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::Duration,
};

use anyhow::Result;
use isthmus_lab::{
    lab, netns,
    probe::{self, Proto},
    topology::{A, B, PEERINGS, Peering},
    wait,
};

use super::{
    IPERF_SECONDS, ROUNDS, iperf,
    stats::{median, ratio_line},
    write_section,
};

/// b-pod1 as a sees it.
const TARGET: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 5);

/// Which of the WAN's families carries the a–b tunnel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wan {
    Ipv4,
    Ipv6,
}

impl Wan {
    /// Where `p`'s peer gateway is on this WAN.
    fn endpoint(self, p: &Peering) -> IpAddr {
        match self {
            Wan::Ipv4 => p.remote.wan_addr().into(),
            Wan::Ipv6 => p.remote.wan_addr6().into(),
        }
    }

    /// The counter of a gateway's datagrams sent on this WAN, from its
    /// netns's `/proc/net/snmp` or `snmp6`.
    fn sent(self, gw: &str) -> Result<u64> {
        let (file, counter) = match self {
            Wan::Ipv4 => ("snmp", "Udp: "),
            Wan::Ipv6 => ("snmp6", "Udp6OutDatagrams"),
        };
        let path = format!("/proc/thread-self/net/{file}");
        let text = netns::run_in(gw, || std::fs::read_to_string(&path))??;
        match self {
            // The header line names the fields; the next holds the values.
            Wan::Ipv4 => {
                let mut lines = text.lines().filter(|l| l.starts_with(counter));
                let (names, values) = (lines.next(), lines.next());
                let (Some(names), Some(values)) = (names, values) else {
                    anyhow::bail!("{gw} has no UDP counters");
                };
                let at = names.split_whitespace().position(|n| n == "OutDatagrams");
                let value = at.and_then(|i| values.split_whitespace().nth(i));
                Ok(value.unwrap_or_default().parse()?)
            }
            Wan::Ipv6 => {
                let line = text.lines().find(|l| l.starts_with(counter));
                let value = line.and_then(|l| l.split_whitespace().nth(1));
                Ok(value.unwrap_or_default().parse()?)
            }
        }
    }
}

/// The a–b peering, both sides.
fn a_b() -> impl Iterator<Item = &'static Peering> {
    PEERINGS.iter().filter(|p| p.over_ipv6_wan())
}

/// Points both sides of the a–b tunnel at each other's address on `wan`,
/// and waits until the tunnel's datagrams go over it alone.
fn use_wan(wan: Wan) -> Result<()> {
    for p in a_b() {
        let key = lab::public_key(&p.remote.gw())?;
        let endpoint = wan.endpoint(p);
        let yaml = p
            .dual_stack_tunnel_endpoint(Some(&key), endpoint)
            .endpoint(endpoint)
            .to_string();
        for (node, _) in p.local.nodes() {
            lab::write_object(&node, &format!("peer-{}.yaml", p.remote.name), &yaml)?;
        }
    }
    let other = match wan {
        Wan::Ipv4 => Wan::Ipv6,
        Wan::Ipv6 => Wan::Ipv4,
    };
    let moved = || -> Result<Option<()>> {
        let before = [wan.sent(&A.gw())?, other.sent(&A.gw())?];
        probe::exchange(Proto::Udp, &A.pod(1), &B.pod(1), TARGET)?;
        let after = [wan.sent(&A.gw())?, other.sent(&A.gw())?];
        Ok((after[0] > before[0] && after[1] == before[1]).then_some(()))
    };
    wait::try_poll(
        Duration::from_secs(15),
        Duration::from_millis(100),
        &format!("the a–b tunnel over the {wan:?} WAN"),
        moved,
    )
}

/// Runs the bench in the dual-stack lab that is up, and writes its
/// section of `docs/benchmarks.md`.
pub fn run_tunnel6() -> Result<()> {
    let mut gbps = [(Wan::Ipv6, Vec::new()), (Wan::Ipv4, Vec::new())];
    for round in 1..=ROUNDS {
        let mut order: Vec<&mut (Wan, Vec<f64>)> = gbps.iter_mut().collect();
        if round % 2 == 0 {
            order.reverse();
        }
        for (wan, got) in order {
            println!("bench: round {round}/{ROUNDS}, the a–b tunnel over the {wan:?} WAN");
            use_wan(*wan)?;
            let measured = iperf(&A.pod(1), &B.pod(1), TARGET, 1)?;
            println!("bench:   {measured:.2} Gbit/s");
            got.push(measured);
        }
    }
    use_wan(Wan::Ipv6)?;
    let lines = ratio_line(
        "tunnel-tcp-1stream-ipv6-wan-vs-ipv4-wan",
        &gbps[0].1,
        &gbps[1].1,
        2,
    );
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let shown = |g: &[f64]| {
        let each: Vec<String> = g.iter().map(|v| format!("{v:.2}")).collect();
        format!("{:.2} ({})", median(g), each.join(", "))
    };
    let report = format!(
        "## Tunnel: an IPv6 WAN against an IPv4 WAN

Produced by `cargo xtask bench tunnel6` ({cpus} CPUs), in the dual-stack
lab (`cargo xtask lab up --dual-stack`), the agents' embedded tunnel as
the DaemonSets run it. iperf3 sends one TCP stream for {IPERF_SECONDS} s from
`a-pod1` to `b-pod1` (IPv4 inside the tunnel), with the a–b tunnel over
the WAN's IPv6 addresses and over its IPv4 ones in turns, {ROUNDS} rounds,
every other one in the opposite order. Before each turn, both sides'
TunnelEndpoints are pointed at the other's address on that WAN, and the
turn starts once the tunnel's datagrams go over that family alone.

| WAN | Gbit/s, median (each round) |
|---|---|
| IPv6 | {} |
| IPv4 | {} |

```
{lines}```
",
        shown(&gbps[0].1),
        shown(&gbps[1].1)
    );
    write_section("tunnel6", &report)
}
