//! The gateway's netfilter and the peers' packets for its pods: a FORWARD
//! rule applies unless the NAT forwards past netfilter, and `auto` follows
//! whether such a rule exists.

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

/// `auto`, the DaemonSets' setting and the lab's: a-gw forwards b's packets
/// for a-pod2 through its netfilter while a forward-hook chain holds a rule,
/// whichever tool wrote it, so the rule applies; once the rule is gone, it
/// forwards them past its IP layer again.
#[test]
fn auto_forwards_through_netfilter_while_a_forward_rule_exists_and_past_it_once_it_goes() {
    require_lab();
    assert_eq!(
        lab::Setup::current().unwrap().past_netfilter,
        None,
        "the lab runs the DaemonSets' setting"
    );
    let gw = A.gw();
    let past = || sample(&gw, "isthmus_forward_past_netfilter") == 1.0;
    eventually(Duration::from_secs(5), "a-gw forwards past netfilter", past);
    for tool in Tool::ALL {
        let policy = ForwardPolicy::new(tool, next_port());
        eventually(
            Duration::from_secs(5),
            &format!("a-gw forwards through netfilter while {tool:?}'s rule exists"),
            || !past(),
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
            past,
        );
        let before = (overlay(&gw, "forwarded"), ip_forwarded(&gw));
        exchange_with_a_pod2(port).expect("the rule gone, its port");
        let (past_the_stack, through_the_stack) = (
            overlay(&gw, "forwarded") - before.0,
            ip_forwarded(&gw) - before.1,
        );
        assert!(
            past_the_stack >= 2.0 && through_the_stack < past_the_stack,
            "{tool:?}'s rule gone, a-gw forwarded {past_the_stack} packets past its IP layer \
             and {through_the_stack} through it"
        );
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
