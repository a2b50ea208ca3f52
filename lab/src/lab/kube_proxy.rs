//! kube-proxy's rules on a lab node: what kube-proxy v1.31 and later write
//! in iptables mode, its default, for a few Services, through iptables-nft.
//! Every node of a cluster that runs kube-proxy carries them; a node as
//! users have it, where the benches measure and `auto` is proved.
//!
//! Derived from `pkg/proxy/iptables/proxier.go` (`syncProxyRules`): the
//! jumps from the base chains, `KUBE-FORWARD` (the drop of invalid
//! packets, counted with `nfacct` since v1.31, and the accepts of marked and
//! established ones), the `nat` chains of each Service (`KUBE-SVC-`, one
//! `KUBE-SEP-` per endpoint, chosen at random), the masquerade of marked
//! packets, and the REJECT of a Service without endpoints.

use std::{
    fmt::Write as _,
    hash::{DefaultHasher, Hash, Hasher},
    net::Ipv4Addr,
};

use anyhow::Result;

use crate::{cmd, topology::Cluster};

/// The name kube-proxy's drop of invalid packets counts under.
const INVALID_COUNTER: &str = "ct_state_invalid_dropped_pkts";

/// One port of a Service.
pub struct Service {
    /// `namespace/name:port`, as kube-proxy's comments write it.
    pub name: &'static str,
    /// Its ClusterIP.
    pub cluster_ip: Ipv4Addr,
    /// `tcp` or `udp`.
    pub protocol: &'static str,
    /// The Service's port.
    pub port: u16,
    /// Its endpoints and their port; none makes kube-proxy reject.
    pub endpoints: Vec<(Ipv4Addr, u16)>,
}

/// The Services of `cluster` kube-proxy writes rules for: the API server,
/// the cluster DNS on both of its pods, and one without endpoints.
pub fn services(cluster: &Cluster) -> Vec<Service> {
    let dns = vec![(cluster.pod_addr(1), 53), (cluster.pod_addr(2), 53)];
    vec![
        Service {
            name: "default/kubernetes:https",
            cluster_ip: Ipv4Addr::new(10, 96, 0, 1),
            protocol: "tcp",
            port: 443,
            endpoints: vec![(cluster.lan_gw(), 6443)],
        },
        Service {
            name: "kube-system/kube-dns:dns",
            cluster_ip: Ipv4Addr::new(10, 96, 0, 10),
            protocol: "udp",
            port: 53,
            endpoints: dns.clone(),
        },
        Service {
            name: "kube-system/kube-dns:dns-tcp",
            cluster_ip: Ipv4Addr::new(10, 96, 0, 10),
            protocol: "tcp",
            port: 53,
            endpoints: dns,
        },
        Service {
            name: "kube-system/metrics-server:https",
            cluster_ip: Ipv4Addr::new(10, 96, 0, 20),
            protocol: "tcp",
            port: 443,
            endpoints: Vec::new(),
        },
    ]
}

/// Installs kube-proxy's rules for `services` in netns `ns` of `cluster`,
/// beside whatever rules are there, as kube-proxy does: its jumps from the
/// built-in chains go first (kube-proxy prepends them), before any other
/// rule. The counter of its drop of invalid packets comes first, as
/// kube-proxy creates it.
pub fn install(ns: &str, cluster: &Cluster, services: &[Service]) -> Result<()> {
    let counters = cmd::run("ip", &["netns", "exec", ns, "nfacct", "list"])?;
    if !counters.contains(INVALID_COUNTER) {
        cmd::run(
            "ip",
            &["netns", "exec", ns, "nfacct", "add", INVALID_COUNTER],
        )?;
    }
    cmd::iptables_restore(ns, &rules(cluster, services), true)
}

/// kube-proxy's `filter` and `nat` tables for `services` of `cluster`.
pub fn rules(cluster: &Cluster, services: &[Service]) -> String {
    let mut filter = String::from(FILTER_HEADER);
    let mut nat = String::from(NAT_HEADER);
    let mut nat_rules = String::new();
    for service in services {
        let (ip, proto, port, name) = (
            service.cluster_ip,
            service.protocol,
            service.port,
            service.name,
        );
        let matches = format!("-m {proto} -p {proto} -d {ip}/32 --dport {port}");
        if service.endpoints.is_empty() {
            let _ = writeln!(
                filter,
                "-A KUBE-SERVICES -m comment --comment \"{name} has no endpoints\" {matches} \
                 -j REJECT --reject-with icmp-port-unreachable"
            );
            continue;
        }
        let svc = chain("KUBE-SVC-", name);
        let _ = writeln!(nat, ":{svc} - [0:0]");
        let _ = writeln!(
            nat_rules,
            "-A KUBE-SERVICES -m comment --comment \"{name} cluster IP\" {matches} -j {svc}"
        );
        let _ = writeln!(
            nat_rules,
            "-A {svc} -m comment --comment \"{name} cluster IP\" {matches} ! -s {} -j KUBE-MARK-MASQ",
            cluster.pods()
        );
        let count = service.endpoints.len();
        for (i, (address, target)) in service.endpoints.iter().enumerate() {
            let sep = chain("KUBE-SEP-", &format!("{name}{address}"));
            let _ = writeln!(nat, ":{sep} - [0:0]");
            let left = count - i;
            let pick = match left {
                1 => String::new(),
                _ => format!(
                    "-m statistic --mode random --probability {:.11} ",
                    1.0 / left as f64
                ),
            };
            let _ = writeln!(
                nat_rules,
                "-A {svc} -m comment --comment \"{name} -> {address}:{target}\" {pick}-j {sep}"
            );
            let _ = writeln!(
                nat_rules,
                "-A {sep} -m comment --comment \"{name}\" -s {address}/32 -j KUBE-MARK-MASQ"
            );
            let _ = writeln!(
                nat_rules,
                "-A {sep} -m comment --comment \"{name}\" -m {proto} -p {proto} \
                 -j DNAT --to-destination {address}:{target}"
            );
        }
    }
    let _ = writeln!(
        nat_rules,
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be \
         the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
    );
    format!("{filter}{FILTER_RULES}COMMIT\n{nat}{NAT_RULES}{nat_rules}COMMIT\n")
}

/// A chain's name as kube-proxy forms it: a prefix and a hash of what the
/// chain is for.
fn chain(prefix: &str, of: &str) -> String {
    let mut hasher = DefaultHasher::new();
    of.hash(&mut hasher);
    format!("{prefix}{:016X}", hasher.finish())
}

const FILTER_HEADER: &str = "*filter
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SERVICES - [0:0]
";

const FILTER_RULES: &str = "-I INPUT 1 -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL
-I INPUT 2 -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS
-I INPUT 3 -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally visible service portals\" -j KUBE-EXTERNAL-SERVICES
-I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL
-I FORWARD 2 -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD
-I FORWARD 3 -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-I FORWARD 4 -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally visible service portals\" -j KUBE-EXTERNAL-SERVICES
-I OUTPUT 1 -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL
-I OUTPUT 2 -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP
-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
";

const NAT_HEADER: &str = "*nat
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SERVICES - [0:0]
";

const NAT_RULES: &str = "-I PREROUTING 1 -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-I OUTPUT 1 -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-I POSTROUTING 1 -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully
";
