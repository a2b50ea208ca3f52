//! The gateway's netfilter and the peers' packets for its pods: a FORWARD
//! rule applies unless the NAT forwards past netfilter, and `auto` follows
//! what the rules could act on: kube-proxy's Services' addresses take the
//! stack, where their DNAT applies, and the rest goes past it.

use isthmus_lab::lab::kube_proxy;

use super::*;

/// A NetworkPolicy of a CNI that enforces it in netfilter, as Calico's
/// iptables dataplane does, stood in for by a FORWARD rule on a-gw that
/// drops TCP to a-pod2 on one port. With `--forward-past-netfilter=off`,
/// b's packets for a-pod2 cross a-gw's FORWARD chain, and the rule stops
/// them; with `on`, they go past the chain, as the option's help says. A
/// worker's uplink has the decapsulation only when it forwards past
/// netfilter: an agent that does not takes away the one its predecessor left.
#[test]
fn a_forward_rule_on_the_gateway_applies_to_peers_packets_for_its_pods_unless_past_netfilter() {
    require_lab();
    let decap = || decap_pinned(&A.node());
    eventually(Duration::from_secs(5), "a-node decapsulates on lan0", decap);
    let policy = ForwardPolicy::new(Tool::Iptables, next_port());
    lab::set_forward_past_netfilter(Some("off")).unwrap();
    assert!(
        !decap(),
        "a-node's new agent left the decapsulation on lan0"
    );
    exchange_with_a_pod2(next_port()).expect("another port: not the policy's");
    assert!(
        exchange_with_a_pod2(policy.port).is_err(),
        "through netfilter, the policy's port was reached"
    );
    let dropped = policy.dropped();
    assert!(dropped >= 1.0, "the FORWARD rule saw {dropped} packets");

    lab::set_forward_past_netfilter(Some("on")).unwrap();
    exchange_with_a_pod2(next_port()).expect("another port, past netfilter");
    exchange_with_a_pod2(policy.port).expect("past netfilter, the policy's port");
    assert_eq!(
        policy.dropped(),
        dropped,
        "past netfilter, the FORWARD rule saw b's packets"
    );
    eventually(
        Duration::from_secs(5),
        "a-node decapsulates on lan0 again",
        decap,
    );
}

/// `auto`, the DaemonSets' setting and the lab's: while a forward-hook rule
/// drops TCP to a-pod2 on one port, a-gw forwards b's packets for a-pod2
/// through its netfilter, so the rule applies. It proves that of a rule
/// iptables-nft or nft wrote (only a-pod2 takes the stack); an
/// iptables-legacy rule, which it does not read, keeps every packet in the
/// stack. Once the rule is gone, it forwards them past its IP layer again.
#[test]
fn auto_sends_what_a_forward_rule_acts_on_through_netfilter_and_the_rest_past_it() {
    require_lab();
    assert_eq!(
        lab::Setup::current().unwrap().past_netfilter,
        None,
        "the lab runs the DaemonSets' setting"
    );
    let gw = A.gw();
    let past = || sample(&gw, "isthmus_forward_past_netfilter") == 1.0;
    let stack_destinations = || sample(&gw, "isthmus_forward_stack_destinations");
    eventually(
        Duration::from_secs(5),
        "a-gw forwards past netfilter",
        || past() && stack_destinations() == 0.0,
    );
    for tool in Tool::ALL {
        let policy = ForwardPolicy::new(tool, next_port());
        let (through, what) = match tool {
            Tool::IptablesLegacy => (
                Box::new(|| !past()) as Box<dyn Fn() -> bool>,
                "every packet",
            ),
            _ => (
                Box::new(|| past() && stack_destinations() == 1.0) as Box<dyn Fn() -> bool>,
                "a-pod2's packets alone",
            ),
        };
        eventually(
            Duration::from_secs(5),
            &format!("a-gw forwards {what} through netfilter while {tool:?}'s rule exists"),
            through,
        );
        exchange_with_a_pod2(next_port()).expect("another port: not the rule's");
        assert!(
            exchange_with_a_pod2(policy.port).is_err(),
            "{tool:?}: the rule's port was reached while the rule existed"
        );
        let port = policy.port;
        drop(policy);
        eventually(
            Duration::from_secs(5),
            &format!("a-gw forwards past netfilter once {tool:?}'s rule is gone"),
            || past() && stack_destinations() == 0.0,
        );
        assert_forwarded_past_the_ip_layer(
            || exchange_with_a_pod2(port).map(drop),
            "the rule gone",
        );
    }
}

/// Runs `exchange` and asserts a-gw forwarded its packets past its IP
/// layer: `when` says in what state.
fn assert_forwarded_past_the_ip_layer(exchange: impl FnOnce() -> anyhow::Result<()>, when: &str) {
    let gw = A.gw();
    let before = (overlay(&gw, "forwarded"), ip_forwarded(&gw));
    exchange().unwrap_or_else(|e| panic!("{when}: {e:#}"));
    let (past_the_stack, through_the_stack) = (
        overlay(&gw, "forwarded") - before.0,
        ip_forwarded(&gw) - before.1,
    );
    assert!(
        past_the_stack >= 2.0 && through_the_stack < past_the_stack,
        "{when}, a-gw forwarded {past_the_stack} packets past its IP layer and \
         {through_the_stack} through it"
    );
}

/// A node as users have it: a-gw carries kube-proxy's rules, with a Service
/// whose ClusterIP is an address of a-pod2 that b can reach (a-pod2's
/// second address, 10.244.0.134). `auto` still forwards b's packets for
/// a-pod2 past netfilter, since kube-proxy's rules cannot act on them. The
/// Service's address takes the stack, where kube-proxy's DNAT and
/// masquerade apply: a-pod2 sees b's connection to it come from a-gw.
/// Forwarded past netfilter, it would have reached a-pod2 straight, from b.
#[test]
fn kube_proxys_rules_leave_peers_packets_past_netfilter_and_services_dnat_in_the_stack() {
    require_lab();
    let gw = A.gw();
    let service = ServiceOnAPod2::new();
    eventually(
        Duration::from_secs(5),
        "a-gw forwards past netfilter, but to kube-proxy's Services",
        || {
            sample(&gw, "isthmus_forward_past_netfilter") == 1.0
                && sample(&gw, "isthmus_forward_stack_destinations") == 4.0
        },
    );
    assert_forwarded_past_the_ip_layer(
        || exchange_with_a_pod2(next_port()).map(drop),
        "with kube-proxy's rules",
    );
    let seen = probe::exchange_on(Proto::Tcp, &B.pod(2), &A.pod(2), SERVICE_AT_B, service.port)
        .expect("b's connection to the Service");
    assert_eq!(
        seen.client_as_seen_by_server, POD2_GATEWAY,
        "the Service's DNAT and masquerade applied to b's connection"
    );
}

/// a-pod2's second address, a Service's ClusterIP, and how b reaches it.
const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 134);
const SERVICE_AT_B: Ipv4Addr = Ipv4Addr::new(10, 0, 40, 134);
/// a-gw's address on a-pod2's veth, which kube-proxy masquerades to.
const POD2_GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// kube-proxy's rules on a-gw, with a Service at [`SERVICE_IP`] whose
/// endpoint is a-pod2, while it lives.
struct ServiceOnAPod2 {
    port: u16,
}

impl ServiceOnAPod2 {
    fn new() -> Self {
        let port = next_port();
        let this = Self { port };
        let service = kube_proxy::Service {
            name: "default/on-a-pod2:tcp",
            cluster_ip: SERVICE_IP.into(),
            protocol: "tcp",
            port,
            endpoints: vec![(Ipv4Addr::from(A_POD2).into(), port)],
        };
        let mut services = kube_proxy::services(&A);
        services.push(service);
        let address = format!("{SERVICE_IP}/32");
        ip(&A.pod(2), &["addr", "add", &address, "dev", "eth0"]).unwrap();
        ip(&A.gw(), &["route", "add", &address, "dev", "pod2"]).unwrap();
        // A resolved neighbour: past netfilter, the FIB would send the
        // Service's packets to a-pod2 in one step.
        let link = ip(&A.pod(2), &["-br", "link", "show", "eth0"]).unwrap();
        let mac = link.split_whitespace().nth(2).unwrap();
        let neighbour = [
            "neigh",
            "replace",
            &SERVICE_IP.to_string(),
            "lladdr",
            mac,
            "dev",
            "pod2",
        ];
        ip(&A.gw(), &neighbour).unwrap();
        kube_proxy::install(&A.gw(), &A, &services).unwrap();
        this
    }
}

impl Drop for ServiceOnAPod2 {
    fn drop(&mut self) {
        let address = format!("{SERVICE_IP}/32");
        let _ = in_a_gw(&["nft", "delete", "table", "ip", "filter"]);
        let _ = in_a_gw(&["nft", "delete", "table", "ip", "nat"]);
        let _ = ip(
            &A.gw(),
            &["neigh", "del", &SERVICE_IP.to_string(), "dev", "pod2"],
        );
        let _ = ip(&A.gw(), &["route", "del", &address, "dev", "pod2"]);
        let _ = ip(&A.pod(2), &["addr", "del", &address, "dev", "eth0"]);
    }
}

/// What writes a forward-hook rule.
#[derive(Clone, Copy, Debug)]
enum Tool {
    /// Debian's `iptables`: iptables-nft.
    Iptables,
    IptablesLegacy,
    /// Native nftables, in a table of its own.
    Nft,
}

impl Tool {
    const ALL: [Tool; 3] = [Tool::Iptables, Tool::IptablesLegacy, Tool::Nft];

    /// The iptables program of the tool, if it is one.
    fn xtables(self) -> Option<&'static str> {
        match self {
            Tool::Iptables => Some("iptables"),
            Tool::IptablesLegacy => Some("iptables-legacy"),
            Tool::Nft => None,
        }
    }
}

/// A rule at a-gw's forward hook that drops TCP to a-pod2 on one port, while
/// it lives; the lab runs its default setting again after it.
struct ForwardPolicy {
    tool: Tool,
    port: u16,
}

/// The nftables table [`Tool::Nft`] writes its chain in.
const NFT_TABLE: &str = "isthmus_test";

impl ForwardPolicy {
    fn new(tool: Tool, port: u16) -> Self {
        let policy = Self { tool, port };
        policy.add().unwrap();
        policy
    }

    fn add(&self) -> anyhow::Result<()> {
        let Some(program) = self.tool.xtables() else {
            let (a_pod2, port) = (Ipv4Addr::from(A_POD2).to_string(), self.port.to_string());
            let chain = "{ type filter hook forward priority 0; }";
            in_a_gw(&["nft", "add", "table", "inet", NFT_TABLE])?;
            in_a_gw(&["nft", "add", "chain", "inet", NFT_TABLE, "drop_tcp", chain])?;
            return in_a_gw(&[
                "nft", "add", "rule", "inet", NFT_TABLE, "drop_tcp", "ip", "daddr", &a_pod2, "tcp",
                "dport", &port, "drop",
            ])
            .map(drop);
        };
        self.xtables(program, "-I")
    }

    fn remove(&self) -> anyhow::Result<()> {
        match self.tool.xtables() {
            Some(program) => self.xtables(program, "-D"),
            None => in_a_gw(&["nft", "delete", "table", "inet", NFT_TABLE]).map(drop),
        }
    }

    /// Inserts (`-I`) or deletes (`-D`) the rule with iptables `program`.
    fn xtables(&self, program: &str, action: &str) -> anyhow::Result<()> {
        let (a_pod2, port) = (Ipv4Addr::from(A_POD2).to_string(), self.port.to_string());
        in_a_gw(&[
            program, "-w", action, "FORWARD", "-p", "tcp", "-d", &a_pod2, "--dport", &port, "-j",
            "DROP",
        ])
        .map(drop)
    }

    /// Packets the rule dropped (iptables only).
    fn dropped(&self) -> f64 {
        let listing = isthmus_lab::cmd::iptables(&A.gw(), &["-nvxL", "FORWARD"]).unwrap();
        let port = format!("dpt:{}", self.port);
        let line = listing
            .lines()
            .find(|l| l.contains(&port))
            .unwrap_or_else(|| panic!("no rule for {port} in a-gw's FORWARD chain:\n{listing}"));
        line.split_whitespace().next().unwrap().parse().unwrap()
    }
}

/// Runs `command` in a-gw.
fn in_a_gw(command: &[&str]) -> anyhow::Result<String> {
    isthmus_lab::cmd::run("ip", &[&["netns", "exec", &A.gw()][..], command].concat())
}

impl Drop for ForwardPolicy {
    fn drop(&mut self) {
        let _ = self.remove();
        if lab::Setup::current().unwrap().past_netfilter.is_some() {
            let _ = lab::set_forward_past_netfilter(None);
        }
    }
}
