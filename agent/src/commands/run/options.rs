//! The options of `isthmus-agent run`, as the command line and the
//! environment give them.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::PathBuf,
};

use crate::{
    commands::{
        interval::{self, Interval, OldUnit},
        policy::PolicyArgs,
    },
    control::{source::SourceSpec, status::gateway_pod},
    kernel::{
        dataplane::{self, AttachMode, Capacity},
        privileges::SyscallFilter,
    },
    model::election::{Timings, TimingsError},
    observe::metrics,
    roles::{flows::Share, past_netfilter::PastNetfilter},
    tunnel::key,
};
use clap::ValueEnum;
use isthmus_common::overlay as defaults;

/// What carries traffic between gateways.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TunnelMode {
    /// The embedded WireGuard (boringtun) carries peers' traffic.
    Userspace,
    /// No tunnel: another one carries the traffic; the agent only does NAT.
    None,
}

/// What this node does.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// Holds the tunnel: attaches the NAT programs.
    Gateway,
    /// Steers remote-bound traffic to the gateway.
    Worker,
}

impl Role {
    /// The role as logs and metrics name it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Gateway => "gateway",
            Role::Worker => "worker",
        }
    }
}

/// `isthmus-agent run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Where objects come from: `dir:PATH` or `kube`.
    #[arg(long)]
    pub source: SourceSpec,
    /// This node's name.
    #[arg(long, env = "NODE_NAME")]
    pub node: String,
    /// This node's role. With `--source kube` it defaults to what the node's
    /// labels say (see `--gateway-label`).
    #[arg(long, value_enum)]
    pub role: Option<Role>,
    /// A node carrying this label (`key=value`) is a gateway: with `--source
    /// kube` this decides the role, and in any case the overlay's gateway.
    #[arg(
        long,
        env = "ISTHMUS_GATEWAY_LABEL",
        default_value = "net.liqo.io/gateway=true"
    )]
    pub gateway_label: String,
    /// `--source kube`: the kubeconfig to use; by default the pod's service
    /// account, else `$KUBECONFIG` or `~/.kube/config`.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// `--source kube`: the agent's namespace, where the key Secret lives.
    #[arg(long, env = "POD_NAMESPACE", default_value = "isthmus-system")]
    pub namespace: String,
    /// `--source kube`, gateway: the Secret holding the WireGuard key,
    /// created if missing; the public key is published in it as `publicKey`.
    #[arg(long, default_value = "isthmus-wireguard")]
    pub key_secret: String,
    /// Directory on bpffs to pin programs, links and maps under.
    #[arg(long, default_value = dataplane::DEFAULT_BPFFS)]
    pub bpffs: PathBuf,
    /// Address of the metrics and health endpoints; by default this node's
    /// address (`--node-ip`) on port 9873, else loopback.
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// This node's address, where the metrics are served by default (the
    /// DaemonSet gives the pod's `status.hostIP`).
    #[arg(long, env = "NODE_IP")]
    pub node_ip: Option<Ipv4Addr>,
    /// Gateway: the tunnel-facing device the NAT programs attach to.
    #[arg(long, default_value = "isthmus0")]
    pub nat_dev: String,
    /// Gateway: what carries traffic between gateways.
    #[arg(long, value_enum, default_value_t = TunnelMode::Userspace)]
    pub tunnel: TunnelMode,
    /// Gateway with `--source dir:PATH`: the WireGuard private key file;
    /// created (mode 0600) if missing.
    #[arg(long, default_value = key::DEFAULT_KEY_FILE)]
    pub private_key_file: PathBuf,
    /// Gateway: the TUN device of the tunnel.
    #[arg(long, default_value = "isthmus0")]
    pub tunnel_dev: String,
    /// Gateway: the TUN device's MTU.
    #[arg(long, default_value_t = 1420)]
    pub mtu: u32,
    /// Gateway: the UDP port WireGuard listens on.
    #[arg(long, default_value_t = 5871)]
    pub listen_port: u16,
    /// Gateway: seconds between keepalives to each peer (0: none).
    #[arg(long, default_value_t = 10)]
    pub keepalive: u16,
    /// Gateway: the largest MSS a TCP SYN or SYN-ACK crossing the NAT device
    /// may advertise, lowered in the kernel (0: none). By default, what the
    /// embedded tunnel's MTU carries (MTU - 40); none without it.
    #[arg(long)]
    pub tcp_mss: Option<u16>,
    /// Gateway: the time between lookups of an `endpointIP` that is a DNS
    /// name (it is also looked up again after a failed handshake).
    #[arg(long, default_value = "1m", value_parser = interval::parser(OldUnit::Seconds))]
    pub resolve_interval: Interval,
    /// Gateway: the uplink to attach the XDP guard of the tunnel port to,
    /// in native mode. It drops datagrams to the port from sources that are
    /// not peers' endpoints and name none of our sessions.
    #[arg(long)]
    pub guard_dev: Option<String>,
    /// Gateway: datapath threads (default: one per CPU).
    #[arg(long)]
    pub tunnel_workers: Option<usize>,
    /// The pod-facing host devices whose pods' remote-bound traffic is
    /// sent to the gateway node, or on the gateway node towards the tunnel
    /// past the stack: names, or prefixes ending in `*` (comma-separated;
    /// for example `lxc*,cali*`).
    #[arg(long, value_delimiter = ',')]
    pub pod_devs: Vec<String>,
    /// The collect-metadata VXLAN device of the overlay between nodes.
    #[arg(long, default_value = defaults::DEFAULT_DEVICE)]
    pub overlay_dev: String,
    /// The overlay's VNI.
    #[arg(long, default_value_t = defaults::DEFAULT_VNI)]
    pub overlay_vni: u32,
    /// The overlay's UDP port.
    #[arg(long, default_value_t = defaults::DEFAULT_PORT)]
    pub overlay_port: u16,
    /// The gateway node's address for the overlay. By default it is the
    /// InternalIP of the Node carrying `--gateway-label`.
    #[arg(long)]
    pub gateway_ip: Option<Ipv4Addr>,
    /// No overlay: another mechanism carries traffic between this node
    /// and the gateway node.
    #[arg(long)]
    pub no_overlay: bool,
    /// Forward, with the overlay, what the FIB settles in one step past
    /// this node's IP layer and netfilter: the overlay's packets for this
    /// node's pods; on the gateway node, peers' packets for its pods and its
    /// pods' packets for peers. Faster, but the FORWARD chain does not see
    /// them. `auto` does so only where it proves that no netfilter rule at
    /// the hooks they would cross could act on them: kube-proxy's rules act
    /// on its Services' addresses alone, which then take the stack; a CNI
    /// enforcing NetworkPolicy there (Calico's iptables dataplane,
    /// kube-router) keeps every packet in the stack. The bare flag is `on`.
    #[arg(
        long,
        value_enum,
        default_value_t = PastNetfilter::Auto,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "on"
    )]
    pub forward_past_netfilter: PastNetfilter,
    /// How to attach TC programs.
    #[arg(long, value_enum, default_value_t = AttachMode::Auto)]
    pub attach: AttachMode,
    /// Capacity of the NatMapping tables, in entries over every cluster.
    #[arg(long, default_value_t = Capacity::default().nat_mappings)]
    pub nat_mapping_capacity: u32,
    /// Gateway: an address of our own networks to masquerade flows to when
    /// their source is none of ours (the node's own traffic, transit
    /// through this cluster); one per family, comma-separated. Without
    /// one, such flows of that family leave unchanged.
    #[arg(long, value_delimiter = ',')]
    pub masquerade_ip: Vec<IpAddr>,
    /// Capacity of the conntrack table, in entries (two per flow).
    #[arg(long, default_value_t = Capacity::default().conntrack)]
    pub conntrack_capacity: u32,
    /// Capacity of the table of endpoints segregated peers may open
    /// connections to, in entries over every peer; IPv6 endpoints have a
    /// table of their own, of the same capacity.
    #[arg(long, default_value_t = Capacity::default().allowed)]
    pub allowed_capacity: u32,
    /// Capacity of the table of flows our side opened towards segregated
    /// peers; when it is full, a new such flow is dropped and counted
    /// (reason `peer_flows_full`). IPv6 flows have a table of their own,
    /// of the same capacity; a peer's share bounds what it holds in both.
    #[arg(long, default_value_t = Capacity::default().peer_flows)]
    pub peer_flow_capacity: u32,
    /// The shortest time between conntrack garbage collections. The time
    /// grows while collections find few dead flows, up to
    /// `--conntrack-gc-max-interval`, and shrinks when they find many.
    #[arg(long, default_value = "10s", value_parser = interval::parser(OldUnit::Seconds))]
    pub conntrack_gc_interval: Interval,
    /// The longest time between conntrack garbage collections. A peer's
    /// refused or filling share is collected within a second whatever it
    /// is.
    #[arg(long, default_value = "1m", value_parser = interval::parser(OldUnit::Seconds))]
    pub conntrack_gc_max_interval: Interval,
    /// What the agent's own seccomp filter does with a system call the
    /// agent does not make: `enforce` refuses it (EPERM), `log` only logs
    /// it (to the kernel log, as audit type 1326), `off` installs none.
    #[arg(long, value_enum, env = "ISTHMUS_SYSCALL_FILTER", default_value_t = SyscallFilter::Enforce)]
    pub syscall_filter: SyscallFilter,
    /// Percentage of the conntrack kept for the gateway's own flows (the
    /// node's traffic, the conncheck's), which no peer can take; and of
    /// the fragment table's new entries per second.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u8).range(0..=90))]
    pub flow_reserve_percent: u8,
    /// How much of each flow table one peer's flows may hold: `equal` (the
    /// peers' room split equally among the peers), a percentage of the
    /// peers' room, or `equal-or-P` (an equal part, or P% where that is
    /// more: with many peers, an equal part is too small for a burst of
    /// connections). Past a quarter of it, the peer's connections that are over
    /// are evicted; past it, its new flows are refused, and its flows never
    /// answered are evicted, oldest first. The same share bounds the first
    /// fragments a peer leaves in the fragment table each second.
    #[arg(long, default_value = "equal-or-25", value_parser = parse_share)]
    pub flow_share: Share,
    /// What objects may ask of this node.
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// How the gateways of the cluster elect the active one.
    #[command(flatten)]
    pub election: ElectionArgs,
    /// Gateway with `--liqo-api v1`: the image of the pod of each peer's
    /// `gw-<gateway>` Deployment, which Liqo reads the readiness of. It
    /// runs nothing; kubelet asks the agent whether the peer is served.
    #[arg(long, default_value = gateway_pod::DEFAULT_IMAGE)]
    pub gateway_pod_image: String,
}

impl RunArgs {
    /// Where the metrics and health endpoints are served: `--metrics-addr`,
    /// else this node's address (`--node-ip`) on the default port, else
    /// loopback.
    pub fn metrics_address(&self) -> SocketAddr {
        self.metrics_addr.unwrap_or_else(|| {
            let ip = self.node_ip.unwrap_or(Ipv4Addr::LOCALHOST);
            SocketAddr::from((ip, metrics::DEFAULT_PORT))
        })
    }
}

/// How the gateways of a cluster elect the active one (`--source kube`):
/// the defaults replace a dead active gateway in about 1.2 s.
#[derive(clap::Args, Clone)]
pub struct ElectionArgs {
    /// The Lease the gateways elect by, in `--namespace`.
    #[arg(long, default_value = "isthmus-gateway")]
    pub lease_name: String,
    /// How long the Lease must stand unchanged before a standby gateway
    /// takes over.
    #[arg(long, alias = "lease-duration-ms", default_value = "1s", value_parser = interval::parser(OldUnit::Milliseconds))]
    pub lease_duration: Interval,
    /// How long the active gateway goes on without a successful renewal;
    /// shorter than the lease duration.
    #[arg(long, alias = "lease-renew-deadline-ms", default_value = "800ms", value_parser = interval::parser(OldUnit::Milliseconds))]
    pub lease_renew_deadline: Interval,
    /// The time between renewals, and between a standby's looks.
    #[arg(long, alias = "lease-retry-period-ms", default_value = "200ms", value_parser = interval::parser(OldUnit::Milliseconds))]
    pub lease_retry_period: Interval,
    /// This agent's pod, labelled `net.liqo.io/gateway=active` or
    /// `standby` as Liqo labels its gateway pods.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
}

impl ElectionArgs {
    /// The election's timings, checked.
    pub fn timings(&self) -> Result<Timings, TimingsError> {
        Timings::new(
            self.lease_duration.duration,
            self.lease_renew_deadline.duration,
            self.lease_retry_period.duration,
        )
    }

    /// The intervals, each with its flag.
    fn intervals(&self) -> [(&'static str, Interval); 3] {
        [
            ("lease-duration", self.lease_duration),
            ("lease-renew-deadline", self.lease_renew_deadline),
            ("lease-retry-period", self.lease_retry_period),
        ]
    }
}

impl RunArgs {
    /// A warning for each interval flag given in its old spelling, naming
    /// the new one.
    pub fn old_spellings(&self) -> Vec<String> {
        [
            ("resolve-interval", self.resolve_interval),
            ("conntrack-gc-interval", self.conntrack_gc_interval),
            ("conntrack-gc-max-interval", self.conntrack_gc_max_interval),
        ]
        .into_iter()
        .chain(self.election.intervals())
        .filter_map(|(flag, interval)| interval.old_spelling_warning(flag))
        .collect()
    }
}

/// Parses `--flow-share`: `equal`, a percentage from 1 to 100, or
/// `equal-or-` and such a percentage.
fn parse_share(value: &str) -> Result<Share, String> {
    let percent = |v: &str| match v.trim_end_matches('%').parse::<u8>() {
        Ok(p @ 1..=100) => Some(p),
        _ => None,
    };
    if value == "equal" {
        return Ok(Share::Equal);
    }
    let share = match value.strip_prefix("equal-or-") {
        Some(p) => percent(p).map(Share::EqualOrPercent),
        None => percent(value).map(Share::Percent),
    };
    share.ok_or_else(|| {
        format!(
            "`{value}` is not `equal`, a percentage from 1 to 100, or `equal-or-` and a percentage"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_shares_parse_and_bad_ones_say_what_is_accepted() {
        assert_eq!(parse_share("equal"), Ok(Share::Equal));
        assert_eq!(parse_share("40"), Ok(Share::Percent(40)));
        assert_eq!(parse_share("40%"), Ok(Share::Percent(40)));
        assert_eq!(parse_share("equal-or-25"), Ok(Share::EqualOrPercent(25)));
        for bad in ["0", "101", "equal-or-0", "equal-or-", "fair", "-5"] {
            let e = parse_share(bad).unwrap_err();
            assert!(e.contains(&format!("`{bad}`")), "{e}");
        }
    }
}
