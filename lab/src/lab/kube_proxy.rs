//! kube-proxy's rules on a lab node: what kube-proxy v1.31 and later write
//! in iptables mode, its default, for a few Services, through iptables-nft,
//! and, in a dual-stack cluster, for the Services' IPv6 addresses through
//! ip6tables-nft. Every node of a cluster that runs kube-proxy carries
//! them; a node as users have it, where the benches measure and `auto` is
//! proved.
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
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use anyhow::Result;

use crate::{cmd, topology::Cluster};

/// The name kube-proxy's drop of invalid packets counts under.
const INVALID_COUNTER: &str = "ct_state_invalid_dropped_pkts";

/// One port of a Service.
pub struct Service {
    /// `namespace/name:port`, as kube-proxy's comments write it.
    pub name: &'static str,
    /// Its ClusterIP; every Service given to [`rules`] at once is of one
    /// family.
    pub cluster_ip: IpAddr,
    /// `tcp` or `udp`.
    pub protocol: &'static str,
    /// The Service's port.
    pub port: u16,
    /// Its endpoints and their port; none makes kube-proxy reject.
    pub endpoints: Vec<(IpAddr, u16)>,
}

/// The Services of `cluster` kube-proxy writes rules for: the API server,
/// the cluster DNS on both of its pods, and one without endpoints.
pub fn services(cluster: &Cluster) -> Vec<Service> {
    let api_server = Service {
        name: "default/kubernetes:https",
        cluster_ip: Ipv4Addr::new(10, 96, 0, 1).into(),
        protocol: "tcp",
        port: 443,
        endpoints: vec![(cluster.lan_gw().into(), 6443)],
    };
    let dns = [cluster.pod_addr(1), cluster.pod_addr(2)].map(IpAddr::from);
    let [dns_ip, metrics_ip] = [10, 20].map(|host| Ipv4Addr::new(10, 96, 0, host).into());
    let mut services = vec![api_server];
    services.extend(add_ons(dns_ip, dns, metrics_ip));
    services
}

/// The IPv6 addresses of the Services of a dual-stack `cluster`, whose
/// add-ons ask for both families (`ipFamilyPolicy: PreferDualStack`): the
/// cluster DNS and the Service without endpoints. The API server's Service
/// is of the cluster's first family alone, as Kubernetes creates it.
pub fn services6(cluster: &Cluster) -> Vec<Service> {
    let dns = [cluster.pod_addr6(1), cluster.pod_addr6(2)].map(IpAddr::from);
    let [dns_ip, metrics_ip] =
        [0xa, 0x14].map(|host| Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, host).into());
    add_ons(dns_ip, dns, metrics_ip)
}

/// The cluster DNS at `dns_ip` on its two pods `dns`, and a Service at
/// `metrics_ip` without endpoints.
fn add_ons(dns_ip: IpAddr, dns: [IpAddr; 2], metrics_ip: IpAddr) -> Vec<Service> {
    let dns: Vec<(IpAddr, u16)> = dns.iter().map(|pod| (*pod, 53)).collect();
    vec![
        Service {
            name: "kube-system/kube-dns:dns",
            cluster_ip: dns_ip,
            protocol: "udp",
            port: 53,
            endpoints: dns.clone(),
        },
        Service {
            name: "kube-system/kube-dns:dns-tcp",
            cluster_ip: dns_ip,
            protocol: "tcp",
            port: 53,
            endpoints: dns,
        },
        Service {
            name: "kube-system/metrics-server:https",
            cluster_ip: metrics_ip,
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
/// kube-proxy creates it. IPv6 Services' rules go to ip6tables.
pub fn install(ns: &str, cluster: &Cluster, services: &[Service]) -> Result<()> {
    let counters = cmd::run("ip", &["netns", "exec", ns, "nfacct", "list"])?;
    if !counters.contains(INVALID_COUNTER) {
        cmd::run(
            "ip",
            &["netns", "exec", ns, "nfacct", "add", INVALID_COUNTER],
        )?;
    }
    cmd::iptables_restore(ns, &rules(cluster, services), is_ipv6(services), true)
}

/// Whether `services`, all of one family, are IPv6's.
fn is_ipv6(services: &[Service]) -> bool {
    services.iter().any(|s| s.cluster_ip.is_ipv6())
}

/// How many addresses `services` have between them: those whose packets
/// kube-proxy's rules act on.
pub fn addresses(services: &[Service]) -> usize {
    let addresses: std::collections::BTreeSet<IpAddr> =
        services.iter().map(|s| s.cluster_ip).collect();
    addresses.len()
}

/// kube-proxy's `filter` and `nat` tables for `services` of `cluster`, all
/// of one family.
pub fn rules(cluster: &Cluster, services: &[Service]) -> String {
    let (host, pods, unreachable) = match is_ipv6(services) {
        false => (32, cluster.pods().to_string(), "icmp-port-unreachable"),
        true => (128, cluster.pods6().to_string(), "icmp6-port-unreachable"),
    };
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
        let matches = format!("-m {proto} -p {proto} -d {ip}/{host} --dport {port}");
        if service.endpoints.is_empty() {
            let _ = writeln!(
                filter,
                "-A KUBE-SERVICES -m comment --comment \"{name} has no endpoints\" {matches} \
                 -j REJECT --reject-with {unreachable}"
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
            "-A {svc} -m comment --comment \"{name} cluster IP\" {matches} ! -s {pods} -j KUBE-MARK-MASQ"
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
                "-A {sep} -m comment --comment \"{name}\" -s {address}/{host} -j KUBE-MARK-MASQ"
            );
            let _ = writeln!(
                nat_rules,
                "-A {sep} -m comment --comment \"{name}\" -m {proto} -p {proto} \
                 -j DNAT --to-destination {}",
                std::net::SocketAddr::new(*address, *target)
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
