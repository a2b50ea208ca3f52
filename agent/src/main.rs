//! `isthmus-agent`: the node agent's command line.

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    sync::Arc,
};

use ipnet::Ipv4Net;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use isthmus_agent::{
    conntrack::{self, Conntrack},
    dataplane::{self, AttachMode, Capacity, Dataplane},
    gateway::Gateway,
    inspect, kubernetes,
    maps::{self, Counters},
    metrics::{self, BuildInfo, GatewayState, Metrics},
    object::{KIND_NODE, KIND_TUNNEL_ENDPOINT},
    overlay::{self, Overlay, OverlayOptions, PodDevices},
    policy::{self, Policy},
    reconcile::{MappingTable, PeerTable, Reconciler, Report},
    source::{self, SourceEvent, SourceSpec},
    status::{self, Feedback},
    tunnel::{TunnelConfig, key, route},
};
use isthmus_common::{
    conntrack::Timeouts,
    counters::{DIRECTIONS, LINKS, Outcome, outcome_slot},
    overlay as defaults, tcp,
};
use tokio::{signal::unix, sync::mpsc};
use tracing::{debug, error, info, warn};

#[derive(Parser)]
#[command(
    version,
    about = "Isthmus node agent: eBPF dataplane for multi-cluster networks"
)]
struct Cli {
    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Program the dataplane from the source and keep it in line.
    Run(Box<RunArgs>),
    /// Print the gateway's WireGuard public key, creating the key file
    /// (mode 0600) if it does not exist.
    Pubkey {
        /// The private key file.
        #[arg(long, default_value = DEFAULT_KEY_FILE)]
        private_key_file: PathBuf,
    },
    /// Validate a directory of objects as `run` would, and print what it
    /// would program and reject (file, object and field). Needs no root
    /// and no kernel; exits 1 if anything is rejected.
    Check(CheckArgs),
    /// Detach and unpin everything the agent attached or pinned.
    Cleanup {
        /// Directory on bpffs the agent pinned under.
        #[arg(long, default_value = "/sys/fs/bpf/isthmus")]
        bpffs: PathBuf,
    },
    /// Print a kernel table, read from the pinned maps (works while the
    /// agent is down).
    Inspect {
        /// Which table.
        #[arg(value_enum)]
        view: inspect::View,
        /// One JSON array of objects instead of aligned columns.
        #[arg(long)]
        json: bool,
        /// Directory on bpffs the agent pinned under.
        #[arg(long, default_value = "/sys/fs/bpf/isthmus")]
        bpffs: PathBuf,
    },
}

const DEFAULT_KEY_FILE: &str = "/var/lib/isthmus/private.key";

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum TunnelMode {
    /// The embedded WireGuard (boringtun) carries peers' traffic.
    Userspace,
    /// No tunnel: another one carries the traffic; the agent only does NAT.
    None,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Role {
    /// Holds the tunnel: attaches the NAT programs.
    Gateway,
    /// Steers remote-bound traffic to the gateway.
    Worker,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Where objects come from: `dir:PATH` or `kube`.
    #[arg(long)]
    source: SourceSpec,
    /// This node's name.
    #[arg(long, env = "NODE_NAME")]
    node: String,
    /// This node's role. With `--source kube` it defaults to what the node's
    /// labels say (see `--gateway-label`).
    #[arg(long, value_enum)]
    role: Option<Role>,
    /// A node carrying this label (`key=value`) is a gateway: with `--source
    /// kube` this decides the role, and in any case the overlay's gateway.
    #[arg(long, default_value = "net.liqo.io/gateway=true")]
    gateway_label: String,
    /// `--source kube`: the kubeconfig to use; by default the pod's service
    /// account, else `$KUBECONFIG` or `~/.kube/config`.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// `--source kube`: the agent's namespace, where the key Secret lives.
    #[arg(long, env = "POD_NAMESPACE", default_value = "isthmus-system")]
    namespace: String,
    /// `--source kube`, gateway: the Secret holding the WireGuard key,
    /// created if missing; the public key is published in it as `publicKey`.
    #[arg(long, default_value = "isthmus-wireguard")]
    key_secret: String,
    /// Directory on bpffs to pin programs, links and maps under.
    #[arg(long, default_value = "/sys/fs/bpf/isthmus")]
    bpffs: PathBuf,
    /// Address of the metrics and health endpoints; by default this node's
    /// address (`--node-ip`) on port 9873, else loopback.
    #[arg(long)]
    metrics_addr: Option<SocketAddr>,
    /// This node's address, where the metrics are served by default (the
    /// DaemonSet gives the pod's `status.hostIP`).
    #[arg(long, env = "NODE_IP")]
    node_ip: Option<Ipv4Addr>,
    /// Gateway: the tunnel-facing device the NAT programs attach to.
    #[arg(long, default_value = "isthmus0")]
    nat_dev: String,
    /// Gateway: what carries traffic between gateways.
    #[arg(long, value_enum, default_value_t = TunnelMode::Userspace)]
    tunnel: TunnelMode,
    /// Gateway with `--source dir:PATH`: the WireGuard private key file;
    /// created (mode 0600) if missing.
    #[arg(long, default_value = DEFAULT_KEY_FILE)]
    private_key_file: PathBuf,
    /// Gateway: the TUN device of the tunnel.
    #[arg(long, default_value = "isthmus0")]
    tunnel_dev: String,
    /// Gateway: the TUN device's MTU.
    #[arg(long, default_value_t = 1420)]
    mtu: u32,
    /// Gateway: the UDP port WireGuard listens on.
    #[arg(long, default_value_t = 5871)]
    listen_port: u16,
    /// Gateway: seconds between keepalives to each peer (0: none).
    #[arg(long, default_value_t = 10)]
    keepalive: u16,
    /// Gateway: the largest MSS a TCP SYN or SYN-ACK crossing the NAT device
    /// may advertise, lowered in the kernel (0: none). By default, what the
    /// embedded tunnel's MTU carries (MTU - 40); none without it.
    #[arg(long)]
    tcp_mss: Option<u16>,
    /// Gateway: seconds between lookups of an `endpointIP` that is a DNS
    /// name (it is also looked up again after a failed handshake).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    resolve_interval: u64,
    /// Gateway: the uplink to attach the XDP guard of the tunnel port to,
    /// in native mode. It drops datagrams to the port from sources that are
    /// not peers' endpoints and name none of our sessions.
    #[arg(long)]
    guard_dev: Option<String>,
    /// Gateway: datapath threads (default: one per CPU).
    #[arg(long)]
    tunnel_workers: Option<usize>,
    /// Worker: the pod-facing host devices whose pods' remote-bound
    /// traffic is sent to the gateway node: names, or prefixes ending in
    /// `*` (comma-separated; for example `lxc*,cali*`).
    #[arg(long, value_delimiter = ',')]
    pod_devs: Vec<String>,
    /// The collect-metadata VXLAN device of the overlay between nodes.
    #[arg(long, default_value = defaults::DEFAULT_DEVICE)]
    overlay_dev: String,
    /// The overlay's VNI.
    #[arg(long, default_value_t = defaults::DEFAULT_VNI)]
    overlay_vni: u32,
    /// The overlay's UDP port.
    #[arg(long, default_value_t = defaults::DEFAULT_PORT)]
    overlay_port: u16,
    /// The gateway node's address for the overlay. By default it is the
    /// InternalIP of the Node carrying `--gateway-label`.
    #[arg(long)]
    gateway_ip: Option<Ipv4Addr>,
    /// No overlay: another mechanism carries traffic between this node
    /// and the gateway node.
    #[arg(long)]
    no_overlay: bool,
    /// How to attach TC programs.
    #[arg(long, value_enum, default_value_t = AttachMode::Auto)]
    attach: AttachMode,
    /// Capacity of the NatMapping tables, in entries over every cluster.
    #[arg(long, default_value_t = Capacity::default().nat_mappings)]
    nat_mapping_capacity: u32,
    /// Gateway: an address of our own networks to masquerade flows to when
    /// their source is none of ours (the node's own traffic, transit
    /// through this cluster). Without it, such flows leave unchanged.
    #[arg(long)]
    masquerade_ip: Option<Ipv4Addr>,
    /// Capacity of the conntrack table, in entries (two per flow).
    #[arg(long, default_value_t = Capacity::default().conntrack)]
    conntrack_capacity: u32,
    /// Seconds between conntrack garbage collections.
    #[arg(long, default_value_t = 10)]
    conntrack_gc_interval: u64,
    #[command(flatten)]
    policy: PolicyArgs,
}

#[derive(clap::Args)]
struct CheckArgs {
    /// Where the objects are: `dir:PATH`.
    #[arg(long)]
    source: SourceSpec,
    /// One JSON object instead of aligned tables.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    policy: PolicyArgs,
}

/// What TunnelEndpoints may ask of this node.
#[derive(clap::Args, Clone)]
struct PolicyArgs {
    /// Namespaces TunnelEndpoints are accepted from, besides Liqo's
    /// `liqo-tenant-*`: names, or prefixes ending in `*` (comma-separated).
    #[arg(long, value_delimiter = ',')]
    tunnelendpoint_namespaces: Vec<String>,
    /// The shortest prefix of any network of a TunnelEndpoint.
    #[arg(long, default_value_t = policy::DEFAULT_MIN_PREFIX)]
    min_view_prefix: u8,
    /// This cluster's Pod networks, which no peer may be seen under (the
    /// Node objects' PodCIDRs count too; comma-separated).
    #[arg(long, value_delimiter = ',')]
    pod_cidr: Vec<Ipv4Net>,
    /// This cluster's Service networks, which no peer may be seen under
    /// (comma-separated).
    #[arg(long, value_delimiter = ',')]
    service_cidr: Vec<Ipv4Net>,
}

impl PolicyArgs {
    /// The policy objects must follow, with this node's networks as they
    /// are now.
    fn policy(&self) -> Policy {
        let host = policy::host_networks().unwrap_or_else(|e| {
            error!(error = %e, "listing this node's addresses: they are not protected from peers' views");
            Vec::new()
        });
        self.policy_with(host)
    }

    /// The policy, protecting `host` as this node's networks.
    fn policy_with(&self, host: Vec<policy::Protected>) -> Policy {
        let mut namespaces = vec![policy::LIQO_TENANT_NAMESPACES.to_owned()];
        namespaces.extend(self.tunnelendpoint_namespaces.iter().cloned());
        Policy {
            namespaces,
            min_prefix: self.min_view_prefix,
            protected: [
                host,
                policy::cluster_networks(&self.pod_cidr, &self.service_cidr),
            ]
            .concat(),
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    init_logs(cli.log_format);
    match cli.command {
        Command::Run(args) => run(*args).await,
        Command::Check(args) => check(&args),
        Command::Pubkey { private_key_file } => {
            let pair = key::load_or_generate(&private_key_file)?;
            println!("{}", key::encode(pair.public.as_bytes()));
            Ok(())
        }
        Command::Cleanup { bpffs } => {
            let mut removed = dataplane::cleanup(&bpffs)?;
            let routes = route::cleanup().await?;
            if routes > 0 {
                removed.push(format!(
                    "{routes} route(s) of protocol {}",
                    route::ROUTE_PROTOCOL
                ));
            }
            for item in &removed {
                println!("removed {item}");
            }
            println!(
                "cleanup of {}: {} item(s) removed",
                bpffs.display(),
                removed.len()
            );
            Ok(())
        }
        Command::Inspect { view, json, bpffs } => {
            let table = inspect::read(&bpffs, view)?;
            match json {
                true => println!("{}", table.json()),
                false => print!("{}", table.aligned()),
            }
            Ok(())
        }
    }
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn run(args: RunArgs) -> Result<()> {
    let client = match args.source {
        SourceSpec::Kube => Some(kubernetes::client(args.kubeconfig.as_deref()).await?),
        SourceSpec::Dir(_) => None,
    };
    let role = match (args.role, &client) {
        (Some(role), _) => role,
        (None, Some(client)) => {
            if kubernetes::node_has_label(client, &args.node, &args.gateway_label).await? {
                Role::Gateway
            } else {
                Role::Worker
            }
        }
        (None, None) => bail!("--role is required with --source dir:PATH"),
    };
    let role_name = match role {
        Role::Gateway => "gateway",
        Role::Worker => "worker",
    };
    let capacity = Capacity {
        nat_mappings: args.nat_mapping_capacity,
        conntrack: args.conntrack_capacity,
    };
    let mut dataplane = Dataplane::load(&args.bpffs, &capacity)
        .with_context(|| format!("loading the dataplane under {}", args.bpffs.display()))?;
    let mut reconciler = Reconciler::new(dataplane.take_peer_map()?, dataplane.take_mapping_map()?)
        .context("reading the pinned tables")?;
    reconciler.set_policy(args.policy.policy());
    let mut gateway = match (role, args.tunnel) {
        (Role::Gateway, TunnelMode::Userspace) => {
            let key = match &client {
                Some(client) => {
                    kubernetes::key_from_secret(client, &args.namespace, &args.key_secret).await?
                }
                None => key::load_or_generate(&args.private_key_file)?,
            };
            let guard = match &args.guard_dev {
                Some(dev) => {
                    dataplane.attach_guard(dev)?;
                    Some(dataplane.take_guard(args.listen_port)?)
                }
                None => None,
            };
            Some(
                Gateway::start(
                    &tunnel_config(&args),
                    key,
                    guard,
                    std::time::Duration::from_secs(args.resolve_interval),
                    args.masquerade_ip.is_some(),
                )
                .await?,
            )
        }
        _ => None,
    };
    let mut conntrack = dataplane.take_conntrack()?;
    conntrack.set_masquerade(args.masquerade_ip.filter(|_| role == Role::Gateway))?;
    if role == Role::Gateway {
        let tunnel_mss = match args.tunnel {
            TunnelMode::Userspace => {
                u16::try_from(args.mtu.saturating_sub(tcp::IPV4_TCP_HEADERS)).unwrap_or(u16::MAX)
            }
            TunnelMode::None => 0,
        };
        dataplane.set_tcp_mss(args.tcp_mss.unwrap_or(tunnel_mss))?;
        dataplane.attach_nat(&args.nat_dev, args.attach)?;
    }
    let overlay = match args.no_overlay {
        true => None,
        false => Some(start_overlay(&args, &mut dataplane).await?),
    };
    let patterns = match role {
        Role::Worker => args.pod_devs.clone(),
        Role::Gateway => Vec::new(),
    };
    let pods = PodDevices::new(patterns, dataplane.take_pod_devs()?)?;
    let xdp_mode = match gateway.is_some() && args.guard_dev.is_some() {
        true => "native",
        false => "none",
    };
    let metrics = Metrics::new(
        &args.bpffs,
        gateway.as_ref().map(|g| GatewayState {
            tunnel: g.tunnel.clone(),
            checks: g.checks.clone(),
            device: args.tunnel_dev.clone(),
        }),
        BuildInfo {
            node: &args.node,
            role: role_name,
            attach_mode: args.attach.resolve().as_str(),
            xdp_mode,
        },
    )
    .context("opening the pinned maps for the metrics")?;
    let metrics_addr = args.metrics_addr.unwrap_or_else(|| {
        let ip = args.node_ip.unwrap_or_else(|| {
            warn!("no --node-ip nor --metrics-addr: metrics are served on loopback only");
            Ipv4Addr::LOCALHOST
        });
        SocketAddr::from((ip, metrics::DEFAULT_PORT))
    });
    metrics::serve(metrics_addr, metrics.clone())
        .await
        .with_context(|| format!("serving metrics on {metrics_addr}"))?;
    tokio::spawn(collect_flows(
        conntrack,
        Counters::open(&args.bpffs)?,
        std::time::Duration::from_secs(args.conntrack_gc_interval.max(1)),
        capacity.conntrack,
        metrics.clone(),
    ));
    let (events, feedback) = match (&args.source, client) {
        (SourceSpec::Dir(dir), _) => (source::watch_dir(dir)?, None),
        (SourceSpec::Kube, Some(client)) => {
            let (events, objects) = source::watch_kube(client.clone());
            // The gateway speaks for the cluster's tunnels; workers only read.
            let feedback = (role == Role::Gateway)
                .then(|| Feedback::spawn(client, objects, &args.node, metrics.clone()));
            (events, feedback)
        }
        (SourceSpec::Kube, None) => unreachable!("a kube source has a client"),
    };
    info!(node = %args.node, role = role_name, source = ?args.source, bpffs = %args.bpffs.display(), "agent started");
    let mut host = Host {
        dataplane,
        overlay,
        pods,
        attach: args.attach,
        policy: args.policy.clone(),
    };
    follow(
        events,
        &mut reconciler,
        gateway.as_mut(),
        &mut host,
        feedback.as_ref(),
        &metrics,
    )
    .await
}

/// `check`: the machine it runs on is not a gateway, so its own addresses
/// are not protected.
fn check(args: &CheckArgs) -> Result<()> {
    let SourceSpec::Dir(dir) = &args.source else {
        bail!("check reads --source dir:PATH only");
    };
    let verdict =
        isthmus_agent::check::check(source::read_dir(dir)?, args.policy.policy_with(Vec::new()));
    match args.json {
        true => println!("{}", serde_json::to_string_pretty(&verdict.json())?),
        false => print!("{}", verdict.text()),
    }
    if !verdict.clean() {
        std::process::exit(1);
    }
    Ok(())
}

/// Creates the overlay's device, attaches its receiving program and
/// writes its settings.
async fn start_overlay(args: &RunArgs, dataplane: &mut Dataplane) -> Result<Overlay> {
    let options = OverlayOptions {
        dev: args.overlay_dev.clone(),
        vni: args.overlay_vni,
        port: args.overlay_port,
        gateway: args.gateway_ip,
        gateway_label: args.gateway_label.clone(),
        node: args.node.clone(),
    };
    let ifindex = overlay::ensure_device(&options).await?;
    dataplane.attach_accept(&options.dev, args.attach)?;
    let maps = dataplane.take_overlay()?;
    Ok(Overlay::new(options, maps, ifindex)?)
}

/// This host's side of the dataplane: the loaded programs, the overlay and
/// the pod devices it steers from.
struct Host {
    /// Kept for the agent's lifetime: the XDP guard's link lives with it.
    dataplane: Dataplane,
    overlay: Option<Overlay>,
    pods: PodDevices,
    attach: AttachMode,
    /// What objects may ask of this node; its addresses may change.
    policy: PolicyArgs,
}

impl Host {
    /// Follows the devices the overlay attaches to: pods', and the uplink.
    fn refresh_devices(&mut self) {
        self.pods.refresh(&mut self.dataplane, self.attach);
        if let Some(overlay) = self.overlay.as_mut() {
            overlay.refresh_uplink(&mut self.dataplane, self.attach);
        }
    }

    /// Brings the overlay's tables up to date. Returns whether it could;
    /// it logs why not.
    fn sync_nodes(&mut self, nodes: &[isthmus_agent::node::Node]) -> bool {
        let mut synced = true;
        if let Some(overlay) = self.overlay.as_mut()
            && let Err(e) = overlay.sync(nodes)
        {
            error!(kind = KIND_NODE, error = %e, "updating the overlay's node table; will retry");
            synced = false;
        }
        self.refresh_devices();
        synced
    }
}

fn tunnel_config(args: &RunArgs) -> TunnelConfig {
    TunnelConfig {
        dev: args.tunnel_dev.clone(),
        mtu: args.mtu,
        port: args.listen_port,
        keepalive: args.keepalive,
        workers: args
            .tunnel_workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
    }
}

/// Removes dead masqueraded flows every `every`, and says when the kernel
/// had to drop flows because the table was full or out of ports.
async fn collect_flows(
    mut conntrack: Conntrack,
    counters: Counters,
    every: std::time::Duration,
    capacity: u32,
    metrics: Arc<Metrics>,
) {
    let dropped = || {
        counters.read().map_or(0, |sums| {
            LINKS
                .iter()
                .flat_map(|l| DIRECTIONS.map(|d| outcome_slot(*l, d, Outcome::Dropped)))
                .map(|slot| sums[slot as usize])
                .sum::<u64>()
        })
    };
    let mut ticks = tokio::time::interval(every);
    let mut dropped_before = dropped();
    loop {
        ticks.tick().await;
        match conntrack.collect(conntrack::now(), &Timeouts::DEFAULT) {
            Ok(collected) => {
                metrics.conntrack_entries.set(collected.live as i64);
                if collected.removed > 0 {
                    debug!(
                        removed = collected.removed,
                        live = collected.live,
                        "conntrack collected"
                    );
                }
            }
            Err(e) => error!(error = %e, "reading the conntrack table"),
        }
        let dropped = dropped();
        if dropped > dropped_before {
            error!(
                packets = dropped - dropped_before,
                capacity,
                "packets dropped: the conntrack table is full or out of ports for a peer; no live flow was evicted"
            );
        }
        dropped_before = dropped;
    }
}

/// How often peers' connection states are checked for changes to log.
const STATE_REPORT: std::time::Duration = std::time::Duration::from_secs(1);

/// Applies source events until a signal arrives. Nothing is written before
/// the source has sent every existing object, so a restart never removes
/// peers it has not read yet.
async fn follow<P: PeerTable<Error = aya::maps::MapError>, M: MappingTable<Error = P::Error>>(
    mut events: mpsc::Receiver<SourceEvent>,
    reconciler: &mut Reconciler<P, M>,
    mut gateway: Option<&mut Gateway>,
    host: &mut Host,
    feedback: Option<&Feedback>,
    metrics: &Arc<Metrics>,
) -> Result<()> {
    host.refresh_devices();
    let mut terminate = unix::signal(unix::SignalKind::terminate())?;
    let mut states = tokio::time::interval(STATE_REPORT);
    let mut synced = false;
    let mut retry = Retry::default();
    let mut status_log = status::StatusLog::default();
    loop {
        tokio::select! {
            event = events.recv() => {
                synced |= apply_event(reconciler, event.context("the source stopped")?);
            }
            _ = states.tick() => {
                host.refresh_devices();
                let report = gateway.as_deref_mut().map(Gateway::report);
                if synced && (report.is_some() || feedback.is_some()) {
                    let statuses = status::desired(reconciler.peers(), report.as_ref(), reconciler.rejections());
                    status_log.record(&statuses);
                    if let Some(feedback) = feedback {
                        feedback.show(statuses);
                    }
                }
                // A node address that came or went may allow or refuse a view.
                let changed = reconciler.set_policy(host.policy.policy());
                let moved = match gateway.as_deref_mut() {
                    Some(gateway) if synced => gateway.resolve(reconciler.peers()).await,
                    _ => false,
                };
                if changed {
                    info!("this node's networks changed; checking every peer's views again");
                } else if !moved && !retry.due() {
                    continue;
                }
            }
            _ = terminate.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        };
        // Fold whatever else is already queued into the same pass.
        while let Ok(event) = events.try_recv() {
            synced |= apply_event(reconciler, event);
        }
        if !synced {
            continue;
        }
        let (report, failure) = reconciler.reconcile();
        record(&report, metrics);
        // A peer's ID is assigned when it is accepted and kept until it goes.
        if !report.added.is_empty() || !report.dropped.is_empty() {
            metrics.set_peer_ids(reconciler.peer_ids());
        }
        if let Some(feedback) = feedback {
            feedback.rejected(&report.new_errors);
        }
        // The overlay and the tunnel follow the accepted peers even when a
        // table could not take them all: a removed peer loses its session
        // and routes whatever else is full.
        let nodes_synced = host.sync_nodes(reconciler.nodes());
        let routed = match gateway.as_deref_mut() {
            Some(gateway) => gateway.sync(reconciler.peers()).await,
            None => true,
        };
        if let Some(e) = &failure {
            if maps::is_full(&e.source) {
                metrics.map_full.inc();
                error!(kind = e.kind, error = %e, "a kernel table is full: entries that did not fit are not programmed, and nothing was evicted; raise its capacity or remove objects");
            } else {
                error!(kind = e.kind, error = %e, "updating the kernel tables; will retry");
            }
        }
        let failed = [
            failure.map(|e| e.kind),
            (!nodes_synced).then_some(KIND_NODE),
            (!routed).then_some(KIND_TUNNEL_ENDPOINT),
        ];
        match failed.into_iter().flatten().next() {
            None => {
                metrics.reconciled();
                retry = Retry::default();
            }
            Some(kind) => {
                metrics.reconcile_failed(kind);
                let wait = retry.failed();
                debug!(retry_in = ?wait, "a pass left work undone; trying it again");
            }
        }
        metrics.set_ready();
    }
    info!("stopping; the NAT programs stay attached (`isthmus-agent cleanup` removes them)");
    Ok(())
}

/// When a pass that failed to write a kernel table is tried again, without
/// waiting for an object to change: after 1 s, then twice as long each
/// time, up to a minute.
#[derive(Default)]
struct Retry {
    at: Option<std::time::Instant>,
    wait: std::time::Duration,
}

impl Retry {
    const FIRST: std::time::Duration = std::time::Duration::from_secs(1);
    const LONGEST: std::time::Duration = std::time::Duration::from_secs(60);

    /// Records a failed pass; returns how long until the next try.
    fn failed(&mut self) -> std::time::Duration {
        self.wait = (self.wait * 2).clamp(Self::FIRST, Self::LONGEST);
        self.at = Some(std::time::Instant::now() + self.wait);
        self.wait
    }

    /// Whether a failed pass is due to be tried again.
    fn due(&self) -> bool {
        self.at.is_some_and(|at| std::time::Instant::now() >= at)
    }
}

/// Feeds one event to the reconciler. Returns true for the end of the initial sync.
fn apply_event<P: PeerTable, M: MappingTable<Error = P::Error>>(
    reconciler: &mut Reconciler<P, M>,
    event: SourceEvent,
) -> bool {
    match event {
        SourceEvent::Origin { origin, documents } => reconciler.set_origin(origin, documents),
        SourceEvent::Removed { origin } => reconciler.remove_origin(&origin),
        SourceEvent::Synced => return true,
    }
    false
}

fn record(report: &Report, metrics: &Metrics) {
    for peer in &report.added {
        info!(
            object = %peer.key, peer = peer.label(), file = %peer.origin, fields_from = %peer.layout,
            pod = %peer.remote_pod.seen(), external = %peer.remote_external.seen(),
            "peer programmed"
        );
    }
    for key in &report.dropped {
        info!(object = %key, "peer removed");
    }
    for e in &report.new_errors {
        let (kind, object) = e.kind_and_key();
        error!(kind, object, error = %e, "object rejected");
    }
    for e in &report.cleared_errors {
        let (kind, object) = e.kind_and_key();
        warn!(kind, object, error = %e, "rejection cleared");
    }
    if report.mappings_written + report.mappings_removed > 0 {
        info!(
            written = report.mappings_written,
            removed = report.mappings_removed,
            entries = report.mappings,
            "NatMapping entries programmed"
        );
    }
    metrics.peers.set(report.peers as i64);
    metrics.nat_mappings.set(report.mappings as i64);
    metrics.rejected_objects.set(report.rejected as i64);
    metrics
        .map_updates
        .get_or_create(&[("op", "write")])
        .inc_by(report.written as u64);
    metrics
        .map_updates
        .get_or_create(&[("op", "remove")])
        .inc_by(report.removed as u64);
}
