//! `cargo xtask bench nat`: 64-byte UDP packets per second through the two
//! translating gateways, with no NAT, with Liqo v0.10.3's rule set, and
//! with Isthmus as the DaemonSets run it and with `--forward-past-netfilter=off`
//! beside it, with 1 and 200 peers, in interleaved rounds; on gateways
//! that carry kube-proxy's rules, as users' nodes do, and on bare ones.

use std::{
    collections::BTreeMap,
    fs,
    net::{IpAddr, Ipv4Addr, SocketAddrV4},
    path::PathBuf,
};

use anyhow::{Context, Result};
use isthmus_lab::{
    cmd::ip,
    lab::{self, kube_proxy},
    topology::{A, B},
};

mod baseline;
mod report;

use baseline::{BASELINE, InTurns};

use super::{
    ROUNDS,
    crr::{self, Crr},
    gateways::{await_gauges, disable_isthmus, enable_isthmus, nat_gateways, set_isthmus_peers},
    isolation, liqo_v0_10,
    packets::{Flow, WARMUP, WINDOW, WINDOWS, measure},
    program_run::{self, NatPrograms},
    program_time::{self, NAT_PROGRAMS},
    stats::{agent_rss_mib, median, ratio_line},
    write_section,
};

/// Idle memory budget of the agent with 200 peers.
const RSS_BUDGET_MIB: f64 = 32.0;

/// `--forward-past-netfilter` on the gateways.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Netfilter {
    /// The DaemonSets' setting, `auto`: past netfilter where no rule could
    /// act, on bare gateways and past kube-proxy's rules alike.
    Default,
    /// `off`: through the stack, as on nodes whose rules enforce policy.
    Off,
}

/// What the server does with the flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flows {
    /// It answers each flow once before the measurement, so conntrack holds
    /// them as established, as it holds TCP and request/response flows.
    Answered,
    /// Never: conntrack keeps every flow NEW, and Liqo's LIQO-FORWARD
    /// chain walks its conntrack match once per peer for every packet.
    OneWay,
}

/// What the gateways carry besides the setup's own rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    /// Nothing: no netfilter rule but the setup's.
    Bare,
    /// kube-proxy's iptables-mode rules, as every node of a cluster that
    /// runs kube-proxy carries them.
    KubeProxy,
}

/// One configuration of the gateways.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    /// No NAT anywhere: on a bare node, no netfilter hook.
    Plain(Node),
    /// Liqo v0.10.3's rules for this many peers.
    Liqo(usize, Flows, Node),
    /// Isthmus with this many peers.
    Isthmus(usize, Netfilter, Node),
    /// The `--baseline` build of the agent, with one peer.
    Baseline,
    /// Isthmus with one peer, which b's gateway segregates, with
    /// `isolation::ENDPOINTS` endpoints allowed to it.
    Segregated,
}

/// The setups, in the order of odd rounds. The agent's memory is read
/// right after Isthmus with 200 peers as shipped, on a bare node.
const SETUPS: [Setup; 13] = [
    Setup::Plain(Node::KubeProxy),
    Setup::Liqo(200, Flows::Answered, Node::KubeProxy),
    Setup::Isthmus(1, Netfilter::Default, Node::KubeProxy),
    Setup::Isthmus(200, Netfilter::Default, Node::KubeProxy),
    Setup::Plain(Node::Bare),
    Setup::Liqo(1, Flows::Answered, Node::Bare),
    Setup::Liqo(200, Flows::Answered, Node::Bare),
    Setup::Liqo(200, Flows::OneWay, Node::Bare),
    Setup::Isthmus(1, Netfilter::Default, Node::Bare),
    Setup::Isthmus(1, Netfilter::Off, Node::Bare),
    Setup::Segregated,
    Setup::Isthmus(200, Netfilter::Off, Node::Bare),
    Setup::Isthmus(200, Netfilter::Default, Node::Bare),
];

/// The shipped agent with 200 peers on a bare node, whose memory is read.
const SHIPPED_200: Setup = Setup::Isthmus(200, Netfilter::Default, Node::Bare);

impl Setup {
    fn name(self) -> String {
        let name = match self {
            Setup::Plain(_) => "plain",
            Setup::Liqo(_, Flows::Answered, _) => "Liqo v0.10.3 rules",
            Setup::Liqo(_, Flows::OneWay, _) => "Liqo v0.10.3 rules, flows never answered",
            Setup::Isthmus(_, Netfilter::Default, _) => "isthmus",
            Setup::Isthmus(_, Netfilter::Off, _) => "isthmus, --forward-past-netfilter=off",
            Setup::Segregated => "isthmus, segregated",
            Setup::Baseline => "isthmus baseline build",
        };
        match self.node() {
            Node::Bare => name.to_owned(),
            Node::KubeProxy => format!("kube-proxy node: {name}"),
        }
    }

    fn node(self) -> Node {
        match self {
            Setup::Plain(node) | Setup::Liqo(_, _, node) | Setup::Isthmus(_, _, node) => node,
            Setup::Segregated | Setup::Baseline => Node::Bare,
        }
    }

    fn peers(self) -> usize {
        match self {
            Setup::Plain(_) => 0,
            Setup::Liqo(n, _, _) | Setup::Isthmus(n, _, _) => n,
            Setup::Segregated | Setup::Baseline => 1,
        }
    }

    /// Configures the gateways, measures, and undoes what only this setup needs.
    fn measure(self) -> Result<Measured> {
        let gateways = [A.gw(), B.gw()];
        // On a bare node, without NAT nor conntrack, nothing on the way
        // tells answered flows from others.
        let answered = !matches!(
            self,
            Setup::Plain(Node::Bare) | Setup::Liqo(_, Flows::OneWay, _)
        );
        let flow = &flow(answered, matches!(self, Setup::Plain(_)));
        match self {
            Setup::Plain(node) => {
                disable_isthmus(&nat_gateways())?;
                liqo_v0_10::remove_all(&gateways)?;
                kube_proxy_rules(node)?;
                plain_routes(true)?;
                let measured = traffic(flow);
                plain_routes(false)?;
                measured
            }
            Setup::Liqo(peers, _, node) => {
                disable_isthmus(&nat_gateways())?;
                liqo_v0_10::remove_all(&gateways)?;
                liqo_v0_10::install(&[&A, &B], peers)?;
                kube_proxy_rules(node)?;
                traffic(flow)
            }
            Setup::Isthmus(peers, netfilter, node) => {
                liqo_v0_10::remove_all(&gateways)?;
                kube_proxy_rules(node)?;
                run_isthmus(netfilter, node)?;
                set_isthmus_peers(peers)?;
                traffic(flow)?.with_test_runs(flow)
            }
            Setup::Baseline => {
                liqo_v0_10::remove_all(&gateways)?;
                baseline::baseline_round(flow)
            }
            Setup::Segregated => {
                liqo_v0_10::remove_all(&gateways)?;
                run_isthmus(Netfilter::Default, Node::Bare)?;
                set_isthmus_peers(1)?;
                isolation::segregate()?;
                let measured = traffic(flow);
                isolation::unsegregate()?;
                measured
            }
        }
    }
}

/// Gives both gateways kube-proxy's rules on a kube-proxy node, beside
/// whatever rules the setup installed.
fn kube_proxy_rules(node: Node) -> Result<()> {
    if node == Node::KubeProxy {
        for cluster in [&A, &B] {
            kube_proxy::install(&cluster.gw(), cluster, &kube_proxy::services(cluster))?;
        }
    }
    Ok(())
}

/// Runs the gateway agents with `netfilter`, restarting them if they run
/// with another setting, and checks that they forward past netfilter
/// exactly when the setup says so: on a kube-proxy node, with its
/// Services' addresses alone in the stack.
fn run_isthmus(netfilter: Netfilter, node: Node) -> Result<()> {
    let mode = match netfilter {
        Netfilter::Default => None,
        Netfilter::Off => Some("off"),
    };
    if lab::Setup::current()?.past_netfilter.as_deref() != mode {
        lab::Setup::change(|setup| setup.past_netfilter = mode.map(str::to_owned))?;
        disable_isthmus(&nat_gateways())?;
    }
    enable_isthmus(&nat_gateways())?;
    let past = f64::from(netfilter == Netfilter::Default);
    let setup = Setup::Isthmus(1, netfilter, node).name();
    for (cluster, gw) in [(&A, A.gw()), (&B, B.gw())] {
        let services = match (netfilter, node) {
            (Netfilter::Default, Node::KubeProxy) => {
                kube_proxy::addresses(&kube_proxy::services(cluster))
            }
            _ => 0,
        };
        let expected = [
            ("isthmus_forward_past_netfilter", past),
            ("isthmus_forward_stack_destinations", services as f64),
        ];
        await_gauges(&gw, &expected, &setup)?;
    }
    Ok(())
}

/// The NAT benchmark's flow: a-pod2 → b-pod2, pods on the gateways,
/// `answered` by b-pod2 before the measurement or not. Without NAT
/// (`plain`), a-pod2 sends from [`PLAIN_SOURCE`], the address b answers,
/// so that the answers match the flows where conntrack runs.
fn flow(answered: bool, plain: bool) -> Flow {
    Flow {
        client: A.pod(2),
        next_hop: (A.gw(), "pod2"),
        server: B.pod(2),
        src: if plain { PLAIN_SOURCE } else { A.pod_addr(2) }.into(),
        dst: PLAIN_TARGET.into(),
        // a-pod2 as b sees it.
        answer_to: answered.then_some(PLAIN_SOURCE.into()),
    }
}

/// A figure of each NAT program that has one, by name.
type ByProgram = BTreeMap<&'static str, f64>;

/// Where a round keeps one of its figures by program.
type Figure = fn(&Measured) -> &ByProgram;

/// What a setup measured in one round.
struct Measured {
    /// Packets per second, one figure per window.
    pps: Vec<f64>,
    /// Nanoseconds per run of each NAT program, by the kernel's count,
    /// while the packets ran; empty where Isthmus does not translate.
    ns_per_run: ByProgram,
    /// Nanoseconds per run of each NAT program, run by the kernel on the
    /// bench's frame with the agents' maps; empty where not timed.
    test_run_ns: ByProgram,
    /// For the baseline build, both builds' programs timed in turns, call
    /// by call; empty elsewhere.
    in_turns: InTurns,
    /// The connection rate.
    crr: Crr,
}

impl Measured {
    /// With the NAT programs the agents run now timed on the flow's frame.
    fn with_test_runs(self, flow: &Flow) -> Result<Self> {
        let test_run_ns = program_run::nat_programs(flow)?;
        Ok(Self {
            test_run_ns,
            ..self
        })
    }
}

/// Packets per second, with what they cost in the NAT programs, then the
/// connection rate, of the flow's two pods.
fn traffic(flow: &Flow) -> Result<Measured> {
    let pps = measure(flow)?;
    let ns_per_run = program_time::time_per_run(|| measure(flow))?;
    let IpAddr::V4(dst) = flow.dst else {
        anyhow::bail!("the connection rate is measured over IPv4");
    };
    let target = SocketAddrV4::new(dst, crr::PORT);
    let crr = crr::measure(&flow.client, &flow.server, target)?.all_completed(target)?;
    Ok(Measured {
        pps,
        ns_per_run,
        test_run_ns: BTreeMap::new(),
        in_turns: InTurns::default(),
        crr,
    })
}

/// What each setup measured, round by round.
type Samples = Vec<(Setup, Vec<Measured>)>;

/// Runs the NAT bench and writes its section of `docs/benchmarks.md`.
pub fn run_nat(baseline: Option<PathBuf>) -> Result<()> {
    let mut setups = SETUPS.to_vec();
    if let Some(binary) = baseline {
        let binary = fs::canonicalize(&binary)
            .with_context(|| format!("the baseline build {}", binary.display()))?;
        BASELINE.get_or_init(|| binary);
        // Beside this build with one peer, so each round pairs them.
        let this_build = Setup::Isthmus(1, Netfilter::Default, Node::Bare);
        let beside = setups.iter().position(|s| *s == this_build).unwrap_or(0);
        setups.insert(beside, Setup::Baseline);
    }
    let mut samples: Samples = setups.iter().map(|s| (*s, Vec::new())).collect();
    let mut rss = Vec::new();
    for round in 1..=ROUNDS {
        // Every other round runs the setups in the opposite order, so that
        // no setup always follows the same one: a build measured right
        // after another would otherwise inherit whatever the other left.
        let mut order: Vec<&mut (Setup, Vec<Measured>)> = samples.iter_mut().collect();
        if round % 2 == 0 {
            order.reverse();
        }
        for (setup, rounds) in order {
            println!(
                "bench: round {round}/{ROUNDS}, {} with {} peer(s)",
                setup.name(),
                setup.peers()
            );
            rounds.push(setup.measure()?);
            if *setup == SHIPPED_200 {
                rss.push(agent_rss_mib(&A.gw())?);
            }
        }
    }
    println!("bench: timing updates of b-gw's allowed table");
    isolation::segregate()?;
    let update_p99 = isolation::update_p99_ms();
    isolation::unsegregate()?;
    let update_p99 = update_p99?;
    let lines = results(&samples, &rss, update_p99);
    report::write(&samples, &rss, &lines)
}

/// The RESULT lines: each compares two setups round by round.
fn results(samples: &Samples, rss: &[f64], update_p99: f64) -> String {
    // `figure` of `setup` in each round that has it.
    let per_round = |setup: Setup, figure: &dyn Fn(&Measured) -> Option<f64>| -> Vec<f64> {
        samples
            .iter()
            .find(|(s, _)| *s == setup)
            .map_or_else(Vec::new, |(_, r)| r.iter().filter_map(figure).collect())
    };
    let rounds = |setup| per_round(setup, &|m| Some(median(&m.pps)));
    let crr = |setup| per_round(setup, &|m| Some(m.crr.per_second));
    let crr_p99 = |setup| per_round(setup, &|m| Some(m.crr.p99_us));
    let shipped = |peers| rounds(Setup::Isthmus(peers, Netfilter::Default, Node::Bare));
    let off = |peers| rounds(Setup::Isthmus(peers, Netfilter::Off, Node::Bare));
    let liqo = |peers| rounds(Setup::Liqo(peers, Flows::Answered, Node::Bare));
    let plain = rounds(Setup::Plain(Node::Bare));
    let on_kube_proxy = |peers| rounds(Setup::Isthmus(peers, Netfilter::Default, Node::KubeProxy));
    // What a NAT adds to a packet's trip over plain forwarding, per round;
    // negative when it was faster than plain forwarding in that round.
    let cost_ns = |rates: Vec<f64>| -> Vec<f64> {
        rates
            .iter()
            .zip(&plain)
            .map(|(rate, plain)| 1e9 / rate - 1e9 / plain)
            .collect()
    };
    let pps = [
        (
            "nat-pps-kubeproxy-node-1peer-vs-plain-forwarding",
            on_kube_proxy(1),
            rounds(Setup::Plain(Node::KubeProxy)),
        ),
        (
            "nat-pps-kubeproxy-node-200peers-vs-liqo-iptables",
            on_kube_proxy(200),
            rounds(Setup::Liqo(200, Flows::Answered, Node::KubeProxy)),
        ),
        (
            "nat-pps-default-1peer-vs-plain-forwarding",
            shipped(1),
            plain.clone(),
        ),
        (
            "nat-pps-default-1peer-vs-liqo-iptables",
            shipped(1),
            liqo(1),
        ),
        (
            "nat-pps-default-200peers-vs-liqo-iptables",
            shipped(200),
            liqo(200),
        ),
        (
            "nat-pps-default-200peers-vs-liqo-iptables-flows-never-answered",
            shipped(200),
            rounds(Setup::Liqo(200, Flows::OneWay, Node::Bare)),
        ),
        (
            "nat-pps-default-200peers-vs-default-1peer",
            shipped(200),
            shipped(1),
        ),
        (
            "nat-pps-off-1peer-vs-plain-forwarding",
            off(1),
            plain.clone(),
        ),
        ("nat-pps-off-200peers-vs-liqo-iptables", off(200), liqo(200)),
        (
            "nat-pps-default-segregated-10k-vs-default-1peer",
            rounds(Setup::Segregated),
            shipped(1),
        ),
    ];
    let liqo_crr = |peers| crr(Setup::Liqo(peers, Flows::Answered, Node::Bare));
    let shipped_crr = |peers| crr(Setup::Isthmus(peers, Netfilter::Default, Node::Bare));
    let connections = [
        (
            "nat-crr-kubeproxy-node-200peers-vs-liqo-iptables",
            crr(Setup::Isthmus(200, Netfilter::Default, Node::KubeProxy)),
            crr(Setup::Liqo(200, Flows::Answered, Node::KubeProxy)),
        ),
        (
            "nat-crr-default-1peer-vs-plain-forwarding",
            shipped_crr(1),
            crr(Setup::Plain(Node::Bare)),
        ),
        (
            "nat-crr-default-1peer-vs-liqo-iptables",
            shipped_crr(1),
            liqo_crr(1),
        ),
        (
            "nat-crr-default-200peers-vs-liqo-iptables",
            shipped_crr(200),
            liqo_crr(200),
        ),
        (
            "nat-crr-p99-us-default-200peers-vs-liqo-iptables",
            crr_p99(SHIPPED_200),
            crr_p99(Setup::Liqo(200, Flows::Answered, Node::Bare)),
        ),
        (
            "nat-crr-off-200peers-vs-liqo-iptables",
            crr(Setup::Isthmus(200, Netfilter::Off, Node::Bare)),
            liqo_crr(200),
        ),
    ];
    let mut lines: String = pps
        .iter()
        .chain(&connections)
        .map(|(name, ours, peer)| ratio_line(name, ours, peer, 1))
        .collect();
    lines += &ratio_line(
        "nat-cost-ns-per-packet-default-200peers-vs-liqo-iptables",
        &cost_ns(shipped(200)),
        &cost_ns(liqo(200)),
        0,
    );
    lines += &ratio_line(
        "agent-rss-mib-200peers-vs-budget",
        rss,
        &vec![RSS_BUDGET_MIB; rss.len()],
        1,
    );
    lines += &ratio_line(
        "isolation-update-p99-ms-10k-vs-budget",
        &[update_p99],
        &[isolation::UPDATE_BUDGET_MS],
        1,
    );
    if BASELINE.get().is_some() {
        lines += &ratio_line(
            "nat-pps-default-1peer-vs-baseline-build",
            &shipped(1),
            &rounds(Setup::Baseline),
            1,
        );
        // One line per NAT program, `{program}` in `name` standing for it:
        // this build's figure against the baseline's, round by round.
        let per_program = |name: &str, ours: (Setup, Figure), theirs: (Setup, Figure)| -> String {
            NAT_PROGRAMS
                .iter()
                .map(|program| {
                    let ns = |(setup, of): (Setup, Figure)| {
                        per_round(setup, &|m| of(m).get(program).copied())
                    };
                    let name = name.replace("{program}", &program.replace('_', "-"));
                    ratio_line(&name, &ns(ours), &ns(theirs), 1)
                })
                .collect()
        };
        lines += &per_program(
            "nat-ns-per-run-{program}-default-1peer-vs-baseline-build",
            (Setup::Isthmus(1, Netfilter::Default, Node::Bare), |m| {
                &m.ns_per_run
            }),
            (Setup::Baseline, |m| &m.ns_per_run),
        );
        // Both builds' programs, timed in turns in the baseline's rounds.
        lines += &per_program(
            "nat-test-run-ns-{program}-in-turns-vs-baseline-build",
            (Setup::Baseline, |m| &m.in_turns.this_build),
            (Setup::Baseline, |m| &m.in_turns.baseline),
        );
        // What holding a build's programs costs them, whichever build:
        // what the two orders cancel out.
        lines += &per_program(
            "nat-test-run-ns-{program}-held-vs-loaded-after",
            (Setup::Baseline, |m| &m.in_turns.held),
            (Setup::Baseline, |m| &m.in_turns.loaded_after),
        );
    }
    lines
}

/// Without NAT, b-pod2 must own the address a sends to, and a-pod2 must
/// send from the address b answers (its route's `src`): both clusters'
/// PodCIDR is 10.244.0.0/24, so a-pod2's own would be b-pod2's. Each
/// gateway already routes the other's views over the WAN.
fn plain_routes(add: bool) -> Result<()> {
    let (to_b, to_a) = (format!("{PLAIN_TARGET}/32"), format!("{PLAIN_SOURCE}/32"));
    let (source, target) = (PLAIN_SOURCE.to_string(), PLAIN_TARGET.to_string());
    // Each pod sends to the other from its added address, so that the
    // answers match the flows where conntrack runs (a kube-proxy node).
    let from = |src| vec!["via", lab::POD_GATEWAY, "dev", "eth0", "src", src];
    let mut steps = [
        (B.pod(2), "addr", vec![to_b.as_str(), "dev", "eth0"]),
        (B.gw(), "route", vec![&to_b, "dev", "pod2"]),
        (A.pod(2), "addr", vec![&to_a, "dev", "eth0"]),
        (A.gw(), "route", vec![&to_a, "dev", "pod2"]),
        (
            A.pod(2),
            "route",
            [vec![to_b.as_str()], from(&source)].concat(),
        ),
        (
            B.pod(2),
            "route",
            [vec![to_a.as_str()], from(&target)].concat(),
        ),
    ];
    // The routes from the pods' added addresses go before the addresses.
    if !add {
        steps.reverse();
    }
    let op = if add { "add" } else { "del" };
    for (ns, object, args) in &steps {
        let mut command = vec![*object, op];
        command.extend(args);
        ip(ns, &command)?;
    }
    Ok(())
}

/// Where a-pod2 sends, and what b-pod2 owns in the plain setup.
const PLAIN_TARGET: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 133);
/// a-pod2 as b sees it; its connections' source in the plain setup, by
/// its route's `src`: binding the source before connecting would make each
/// connection search the ports itself, slower than the kernel's choice.
const PLAIN_SOURCE: Ipv4Addr = Ipv4Addr::new(10, 0, 40, 133);
