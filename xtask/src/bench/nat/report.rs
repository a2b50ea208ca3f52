//! The NAT bench's section of `docs/benchmarks.md`: what each setup is,
//! its table, and the RESULT lines.

use std::fmt::Write as _;

use anyhow::Result;
use isthmus_lab::cmd::run;

use super::{
    Figure, Measured, NAT_PROGRAMS, ROUNDS, Samples, WARMUP, WINDOW, WINDOWS, crr, isolation,
    median, program_run, write_section,
};

/// Writes the section from what the rounds measured.
pub(super) fn write(samples: &Samples, rss: &[f64], results: &str) -> Result<()> {
    let kernel = run("uname", &["-r"])?.trim().to_owned();
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let mut table = String::new();
    for (setup, rounds) in samples {
        let peers = match setup.peers() {
            0 => "-".to_owned(),
            n => n.to_string(),
        };
        let windows: Vec<f64> = rounds.iter().flat_map(|m| m.pps.clone()).collect();
        let crr: Vec<f64> = rounds.iter().map(|m| m.crr.per_second).collect();
        let crr_p99: Vec<f64> = rounds.iter().map(|m| m.crr.p99_us).collect();
        let program_ns = programs_column(rounds, |m| &m.ns_per_run);
        let test_run_ns = programs_column(rounds, |m| &m.test_run_ns);
        let (lo, hi) = windows
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
        let _ = writeln!(
            table,
            "| {} | {peers} | {:.0} | {lo:.0}–{hi:.0} | {program_ns} | {test_run_ns} | {:.0} | {:.0} |",
            setup.name(),
            median(&windows),
            median(&crr),
            median(&crr_p99)
        );
    }
    let endpoints = format!(
        "{},{:03}",
        isolation::ENDPOINTS / 1000,
        isolation::ENDPOINTS % 1000
    );
    let rss = median(rss);
    let port = crr::PORT;
    let test_runs = program_run::RUNS;
    let report = format!(
        "## NAT: 64-byte UDP and TCP connections through two gateways

Produced by `cargo xtask bench nat` ({cpus} CPUs, kernel {kernel}).

trafgen in `a-pod2` sends 60-byte frames (64 with FCS) to `10.0.0.133` over
256 source ports; the rate is what reaches `b-pod2`'s `eth0`, where an
nftables netdev hook drops it so the sink costs the same in every setup.
Every packet crosses both gateways, so each NAT setup translates it twice
(SNAT at `a-gw`, DNAT at `b-gw`). The setups are measured in {ROUNDS}
interleaved rounds of {WINDOWS} windows of {WINDOW:?} (after {WARMUP:?} of
warm-up), every other round in the opposite order; the table gives the median and the range of all windows. Each
RESULT line gives the median over rounds of the ratio of the two setups'
rates in the same round, with the least and greatest of those ratios.

- **plain**: no NAT, and no netfilter table on either gateway, so no
  netfilter hook, conntrack's included (the bench checks `nft list
  ruleset` and the iptables-legacy tables before each such setup, and
  fails if one is left); `b-pod2` also owns `10.0.0.133`.
- **Liqo v0.10.3 rules**: the complete rule set Liqo v0.10.3's gateway
  installs for each peer, derived from its code.
  `lab/src/lab/liqo_v0_10_peer/iptables.rs` cites the file and line of each rule.
  In `nat`: the dispatch rules of LIQO-POSTROUTING and LIQO-PREROUTING
  into per-peer chains, `NETMAP` for the prefixes, and two `SNAT` rules
  for other sources. In `filter`: LIQO-FORWARD's three rules per peer, one
  of them a conntrack `--ctstate ESTABLISHED,RELATED` match, and the
  per-peer DROP chain for the remapped ExternalCIDR. Each NatMapping entry
  is a DNAT.
  The synthetic peers come first and the lab's own last, as peers that
  joined last are: `b-gw` holds a's rules, then c's. Liqo installs these in its gateway
  netns, a veth hop from the host; the bench spares it that hop.

  In every NAT setup, `b-pod2` answers each of the 256 flows once before
  the measurement, so conntrack holds them as established, as it holds TCP
  and request/response flows: each packet then leaves LIQO-FORWARD at the
  first peer's `ESTABLISHED,RELATED` rule, and no packet but a flow's
  first meets the nat chains. **Liqo v0.10.3 rules, flows never answered**
  keeps them NEW, as one-way UDP is: each packet then walks LIQO-FORWARD's
  three rules of every peer.
- **isthmus**: the agents as the DaemonSets run them
  (`--forward-past-netfilter=auto`). The bare gateways have no
  netfilter rule, so each forwards by the FIB from TC, past its IP
  layer: `a-gw` from `a-pod2`'s veth towards the NAT device, `b-gw` from
  the NAT device into `b-pod2`; the bench checks
  `isthmus_forward_past_netfilter` is 1.
- **isthmus, --forward-past-netfilter=off**: the same agents kept in the
  stack, as `auto` is on a node whose rules could act on any forwarded
  packet (Calico's iptables policy): both
  gateways' IP layers forward every packet, with no netfilter table.
- **kube-proxy node**: both gateways also carry kube-proxy's rules, as
  kube-proxy v1.31 and later write them in iptables mode, for four Service
  ports (`lab/src/lab/kube_proxy.rs`). They are the jumps from INPUT,
  FORWARD and OUTPUT, and `KUBE-FORWARD`: its drop of invalid packets,
  counted with `nfacct`, and its accepts of marked and established ones.
  Then each Service's `nat` chains with their DNAT and masquerade mark,
  the masquerade of marked packets, and the REJECT of a Service without
  endpoints. These rows are the headline: nodes users run carry such
  rules. Plain
  forwarding there pays conntrack and kube-proxy's chains, flows answered
  as in the NAT setups. Liqo's rules sit after kube-proxy's jumps, which
  kube-proxy puts first in the built-in chains. Isthmus as
  shipped proves that kube-proxy's rules cannot act on peers' packets and
  forwards them past netfilter, its Services' addresses alone through the
  stack; the bench checks `isthmus_forward_past_netfilter` is 1 and
  `isthmus_forward_stack_destinations` is 3 on both gateways.
- **isthmus, segregated**: the shipped setting with one peer, and `b-gw` in
  IntraClusterTrafficSegregation with {endpoints} endpoints
  exported to a beside `b-pod2`, which is offloaded from a: each packet
  from a also misses the flows b opened and the exact endpoint, and hits
  `b-pod2`'s any-port entry.

**Connection rate.** In each round, right after its packets, each setup
also carries TCP connections from `a-pod2` to `10.0.0.133` port {port}
(`b-pod2`): one client opens a connection, sends one byte, reads the
one-byte answer and closes, again and again for 3 s, as netperf's TCP_CRR
does (`xtask/src/bench/crr.rs`). Each connection is a new flow for every NAT
and conntrack on the way, so this is where Liqo's nat chains are walked
(twice per connection, one walk per gateway). The table gives the median
over rounds of connections per second and of their p99 time, connect to
close.

| setup | peers | packets/s (median) | range | NAT programs, ns per run (SNAT, DNAT) | ns per test run (SNAT, DNAT) | connections/s | connection p99 (µs) |
|---|---|---|---|---|---|---|---|
{table}
Agent resident memory, idle with 200 peers: {rss:.1} MiB (median over rounds).

`isolation-update-p99` is the p99 of 40 changes of `b-pod2`'s
`virtualkubelet.liqo.io/origin` label (removed, restored), from the write of
its file in `b-gw`'s object directory until `b-gw`'s allowed table shows it,
with those {endpoints} endpoints in the table; it is one measurement.

```
{results}```

**NAT programs, ns per run.** Over the same packets once more, after the
rate's pass, the kernel counts the time each program spends
(`BPF_ENABLE_STATS`, as `bpftool prog show` prints it). Counting costs
every run two clock reads, which the shipped agents do not pay, so the
rates are measured without it. The table gives the median over rounds of `nat_egress_eth`'s
mean time per run on `a-gw` (the SNAT) and `nat_ingress_eth`'s on `b-gw`
(the DNAT); the `nat-ns-per-run` RESULT lines compare them with the
`--baseline` build's, when one is given. Lower is cheaper. This is the
datapath alone, without the generator's and the stack's noise.

**NAT programs, ns per test run.** After the packets, the bench runs the
same two programs, as the agents loaded them and with the maps they
filled, on the bench's own frame (`BPF_PROG_TEST_RUN`, in the gateway's
netns): `nat_egress_eth` {test_runs} times on `a-pod2`'s frame, and
`nat_ingress_eth` {test_runs} times on the frame that gave, from one
core. The kernel times each run alone; a round's figure is the median
run, which leaves out the runs an interrupt lengthened.

Rounds on this machine, a VM, drift by 5 to 10% either way, more than
the 2% a change of build must stay within. So in the `--baseline` build's
rounds, both builds' programs run in turns, call by call, on the same
frame: whatever slows the machine slows both alike. The two must translate
the frame to the same bytes. A program outlives its agent while it is held
open, so the bench holds one build's programs and stops its agents as for
a restart in place. The other build's agents then find and keep the pinned
maps and devices, which both builds' programs share. Each round times two
orders: this build held with the baseline loaded after it, then the
baseline held with this build loaded after it. A round's figure is the
geometric mean of the two orders' figures. Both builds' agents start the
same way, from gateways cleaned up, with the same flags. The
`nat-test-run-ns-…-in-turns` RESULT lines compare this build's median run
with the baseline's, round by round. The `…-held-vs-loaded-after` lines
show what the two orders cancel out.

trafgen sends from mmap'd ring pages, so any setup that writes a packet
(every NAT setup, not plain forwarding) first makes the kernel copy it
(`skb_copy_ubufs`, `__pskb_pull_tail`); traffic from pod sockets does not
pay this. `nat-cost-ns-per-packet` is what each NAT adds to a packet's
trip over plain forwarding, copy included, per round; it is negative in a
round where the setup outran plain forwarding.
"
    );
    write_section("nat", &report)
}

/// The median over rounds of each NAT program's figure `of`, SNAT then
/// DNAT, or `-` where no round has it.
fn programs_column(rounds: &[Measured], of: Figure) -> String {
    NAT_PROGRAMS
        .map(|program| {
            let ns: Vec<f64> = rounds
                .iter()
                .filter_map(|m| of(m).get(program).copied())
                .collect();
            if ns.is_empty() {
                "-".to_owned()
            } else {
                format!("{:.0}", median(&ns))
            }
        })
        .join(", ")
}
