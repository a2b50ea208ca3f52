//! `cargo xtask bench hub`: connections and packets through the hub, on
//! reachability row 5 (a-pod2 → 10.0.1.45 → c-pod1, NatMapping DNAT and
//! masquerade at b-gw), with Liqo v0.10.3's complete rule set on the three
//! gateways and with Isthmus as the DaemonSets run it, with 1 and 200
//! peers, in interleaved rounds.
//!
//! Under Liqo, no Isthmus agent runs in cluster c: its worker routes the
//! peers' networks to its gateway, as Liqo's route operator does.

use std::net::{Ipv4Addr, SocketAddrV4};

use anyhow::Result;
use isthmus_lab::{
    lab::liqo_v0_10_peer,
    topology::{A, B, C},
};

use super::{
    ROUNDS,
    crr::{self, Crr},
    gateways::{disable_isthmus, enable_isthmus, set_isthmus_peers},
    liqo_v0_10,
    packets::{HUB_TARGET, hub_flow, measure},
    stats::{median, ratio_line},
    write_section,
};

/// Who translates on the hub path, with how many peers on a and b.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Setup {
    Liqo(usize),
    Isthmus(usize),
}

const SETUPS: [Setup; 4] = [
    Setup::Liqo(1),
    Setup::Isthmus(1),
    Setup::Liqo(200),
    Setup::Isthmus(200),
];

impl Setup {
    fn name(self) -> String {
        match self {
            Setup::Liqo(n) => format!("Liqo v0.10.3 rules, {n} peer(s)"),
            Setup::Isthmus(n) => format!("isthmus, {n} peer(s)"),
        }
    }

    /// Configures the path, measures, and undoes what only this setup needs.
    fn measure(self) -> Result<Measured> {
        match self {
            Setup::Liqo(peers) => {
                disable_isthmus(&nodes())?;
                liqo_v0_10::remove_all(&gateways())?;
                liqo_v0_10::install(&[&A, &B], peers)?;
                liqo_v0_10::install(&[&C], 1)?;
                liqo_v0_10_peer::route_worker(&C, "add")?;
                // b masquerades towards c, which does not remap b, to the
                // first address of b's own PodCIDR.
                let measured = traffic(isthmus_lab::topology::first_ip(B.pods()));
                liqo_v0_10_peer::route_worker(&C, "del")?;
                liqo_v0_10::remove_all(&gateways())?;
                measured
            }
            Setup::Isthmus(peers) => {
                enable_isthmus(&nodes())?;
                set_isthmus_peers(peers)?;
                traffic(B.masquerade_addr())
            }
        }
    }
}

/// Every node whose agent is on the hub path, c's worker included: it
/// carries c-pod1's answers to c's gateway.
fn nodes() -> [String; 4] {
    [A.gw(), B.gw(), C.gw(), C.node()]
}

fn gateways() -> [String; 3] {
    [A.gw(), B.gw(), C.gw()]
}

/// One figure of a round.
type Figure = fn(&Measured) -> f64;

/// What a setup measured in one round.
struct Measured {
    pps: f64,
    crr: Crr,
}

/// Packets per second, the flows answered at `masquerade` (b's address as
/// c-pod1 sees a), then connections.
fn traffic(masquerade: Ipv4Addr) -> Result<Measured> {
    let pps = median(&measure(&hub_flow(Some(masquerade)))?);
    let target = SocketAddrV4::new(HUB_TARGET, crr::PORT);
    let crr = crr::measure(&A.pod(2), &C.pod(1), target)?;
    println!(
        "bench:   {pps:.0} pps, {:.0} connections/s, p99 {:.0} µs, {} failed",
        crr.per_second, crr.p99_us, crr.failed
    );
    Ok(Measured { pps, crr })
}

/// Runs the bench on a lab that is up, and writes its section.
pub fn run_hub() -> Result<()> {
    let mut samples: Vec<Vec<Measured>> = SETUPS.iter().map(|_| Vec::new()).collect();
    for round in 1..=ROUNDS {
        for (setup, rounds) in SETUPS.iter().zip(&mut samples) {
            println!("bench: round {round}/{ROUNDS}, {}", setup.name());
            rounds.push(setup.measure()?);
        }
    }
    let series = |setup: Setup, figure: fn(&Measured) -> f64| -> Vec<f64> {
        let i = SETUPS.iter().position(|s| *s == setup).expect("a setup");
        samples[i].iter().map(figure).collect()
    };
    let figures: [(&str, Figure); 3] = [
        ("crr", |m| m.crr.per_second),
        ("crr-p99-us", |m| m.crr.p99_us),
        ("pps", |m| m.pps),
    ];
    let mut lines = String::new();
    for peers in [1, 200] {
        for (what, figure) in figures {
            lines += &ratio_line(
                &format!(
                    "hub-{what}-{peers}{}-vs-liqo-iptables",
                    if peers == 1 { "peer" } else { "peers" }
                ),
                &series(Setup::Isthmus(peers), figure),
                &series(Setup::Liqo(peers), figure),
                1,
            );
        }
    }
    write_section("hub", &report(&samples, &lines))
}

fn report(samples: &[Vec<Measured>], lines: &str) -> String {
    let mut table = String::new();
    for (setup, rounds) in SETUPS.iter().zip(samples) {
        let of = |f: fn(&Measured) -> f64| median(&rounds.iter().map(f).collect::<Vec<_>>());
        let failed: usize = rounds.iter().map(|m| m.crr.failed).sum();
        table += &format!(
            "| {} | {:.0} | {:.0} | {:.0} | {failed} |\n",
            setup.name(),
            of(|m| m.crr.per_second),
            of(|m| m.crr.p99_us),
            of(|m| m.pps),
        );
    }
    format!(
        "## The hub: connections through b

`cargo xtask bench hub`: reachability row 5, `a-pod2` to `10.0.1.45`,
answered by `c-pod1`, in {ROUNDS} interleaved rounds. `a-gw` translates the
double NAT towards b; `b-gw` translates `10.0.1.45` to `10.1.0.5` (a's
NatMapping) and masquerades towards c; `c-gw` forwards to `c-pod1`.

- **Liqo v0.10.3 rules**: the complete rule set of `bench nat` on each
  gateway (`lab/src/lab/liqo_v0_10_peer/iptables.rs`): with n peers, `a-gw` and `b-gw`
  hold n − 1 synthetic peers' chains and rules before the lab's own, and
  `b-gw`'s NatMapping chain for a holds the DNAT of `10.0.1.45`. b
  masquerades towards c with Liqo's SNAT to `10.244.0.1`. No Isthmus
  agent runs on the path; c's worker routes a's and b's networks to its
  gateway, as Liqo's route operator does.
- **isthmus**: the agents as the DaemonSets run them, with n − 1
  synthetic peers on `a-gw` and `b-gw` besides the lab's own. b's
  masquerade keeps each flow in its conntrack, charged to a's share of the
  table. That share is `--flow-share=equal-or-25`, the default: an equal
  part of the peers' room, or 25% of it where that is more. Once a holds a
  quarter of it, b's agent evicts a's connections that are over.

Each round measures 64-byte UDP packets, then connections. Packets are
the NAT bench's trafgen flows (256 source ports), answered once by `c-pod1`
before the measurement. For connections, one client opens a TCP connection, sends one byte, reads the answer and
closes, again and again for 3 s (`xtask/src/bench/crr.rs`); a connection
that does not complete within 2 s counts as failed, and as taking 2 s in
the p99.

| setup | connections/s | connection p99 (µs) | packets/s | failed connections (all rounds) |
|---|---|---|---|---|
{table}
```
{lines}```
"
    )
}
