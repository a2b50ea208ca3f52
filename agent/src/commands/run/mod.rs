//! `isthmus-agent run`, starting the agent: the dataplane is loaded, this
//! node's role started and the source opened, then [`RunLoop`] follows the
//! source.

mod host;
pub mod options;

use std::{collections::BTreeMap, net::IpAddr, sync::Arc};

use anyhow::{Context, Result, bail};
use isthmus_common::{isolation::AllowKey, tcp, wire::Be128};
use tokio::{
    signal::unix,
    sync::{mpsc, watch},
};
use tracing::{info, warn};

use self::host::NodeHost;
use crate::{
    control::{
        election::{
            elector::{Elector, PodLabels},
            lease::LeaseClient,
        },
        kubernetes,
        reconcile::{Ipv6Tables, Reconciler},
        run::RunLoop,
        source::{self, SourceEvent, SourceSpec},
        status::{Feedback, GatewayHome},
    },
    kernel::{
        conntrack::Conntrack,
        dataplane::{Capacity, Dataplane},
        link::LinkEvents,
        maps::{ByteHash, MappingMap, MappingMap6},
        peer_table::{PeerMap, PeerMap6},
        privileges,
    },
    model::{
        election::Election,
        object::{ObjectKey, ObjectKind, ReadFor},
        peer::LiqoApi,
    },
    observe::metrics::{self, BuildInfo, GatewayState, Metrics, PeerHealth},
    roles::{
        flows::{self, FlowTables, Sharing},
        gateway::{
            Gateway,
            guard::Guard,
            lane::{LaneSettings, LaneSpec},
        },
        masquerade::{MasqueradeAddress, MasqueradeIps},
        nat_device::NatDevice,
        overlay::{self, Overlay, OverlayOptions, PodDevices},
        past_netfilter::{FamilyGauges, PastNetfilterSetting},
        routes::Routes,
    },
    tunnel::{TunnelConfig, key},
};
use options::{Role, RunArgs, TunnelMode};

use super::interval;

/// `isthmus-agent run`: loads the dataplane, starts this node's role and
/// follows the source until a signal arrives.
pub async fn run(args: RunArgs) -> Result<()> {
    for warning in args.old_spellings() {
        warn!("{warning}");
    }
    let missing = privileges::missing_capabilities()?;
    if !missing.0.is_empty() {
        warn!("{missing}");
    }
    let runtime_filtered = privileges::runtime_filter_present();
    privileges::confine(args.syscall_filter)?;
    // The agent's whole state lives in this future: on the heap, once.
    Box::pin(run_confined(args, runtime_filtered))
        .await
        .map_err(|e| match missing.0.is_empty() {
            true => e,
            false => e.context(missing),
        })
}

/// `run`, once the agent has confined itself: the phases of a start, in
/// order, then the run loop until a signal.
async fn run_confined(args: RunArgs, runtime_filtered: bool) -> Result<()> {
    let client = match args.source {
        SourceSpec::Kube => Some(kubernetes::client(args.kubeconfig.as_deref()).await?),
        SourceSpec::Dir(_) => None,
    };
    let role = role(&args, client.as_ref()).await?;
    let capacity = Capacity {
        nat_mappings: args.nat_mapping_capacity,
        conntrack: args.conntrack_capacity,
        allowed: args.allowed_capacity,
        peer_flows: args.peer_flow_capacity,
    };
    let mut dataplane = Dataplane::load(&args.bpffs, &capacity, serves_liqo_v1(&args, role))
        .map_err(|e| refused_by_runtime(e.into(), runtime_filtered))
        .with_context(|| format!("loading the dataplane under {}", args.bpffs.display()))?;
    let reconciler = reconciler(&args, &mut dataplane)?;
    let gateway = start_gateway(&args, role, client.as_ref(), &mut dataplane).await?;
    let (conntrack, masquerade) = configure_translation(&args, role, &mut dataplane)?;
    let mut host = start_host(&args, role, dataplane, masquerade).await?;
    release_freed_heap();
    let metrics = serve_metrics(&args, role, gateway.as_ref()).await?;
    let passed = watch::Sender::new(());
    spawn_collector(
        &args,
        &capacity,
        conntrack,
        &mut host.dataplane,
        &passed,
        &metrics,
    )?;
    let objects = open_source(&args, role, client, &metrics)?;
    info!(node = %args.node, role = role.name(), source = ?args.source, bpffs = %args.bpffs.display(), "agent started");
    host.past_netfilter.report_in([
        FamilyGauges {
            past: metrics.forward_past_netfilter.clone(),
            stack_destinations: metrics.forward_stack_destinations.clone(),
        },
        FamilyGauges {
            past: metrics.forward_past_netfilter_ipv6.clone(),
            stack_destinations: metrics.forward_stack_destinations_ipv6.clone(),
        },
    ]);
    // A worker's peer-bound packets that the overlay does not steer are
    // dropped, not sent in clear: the blackholes outlive the agent. Its
    // own go into the overlay, where there is one.
    let worker_routes = match (role, args.no_overlay) {
        (Role::Worker, false) => Some(Routes::into_overlay(&args.overlay_dev).await?),
        (Role::Worker, true) => Some(Routes::blackholes_only().await?),
        (Role::Gateway, _) => None,
    };
    let mut run_loop = RunLoop {
        reconciler,
        gateway,
        worker_routes,
        host,
        feedback: objects.feedback,
        active: objects.active,
        metrics,
        passed,
    };
    run_loop.follow(objects.events, signal()?).await
}

/// The reconciler over the kernel's own tables.
type KernelReconciler = Reconciler<
    PeerMap,
    MappingMap,
    ByteHash<AllowKey>,
    PeerMap6,
    MappingMap6,
    ByteHash<AllowKey<Be128>>,
>;

/// This node's role: as `--role` says, or, from the API, by its label.
async fn role(args: &RunArgs, client: Option<&kube::Client>) -> Result<Role> {
    Ok(match (args.role, client) {
        (Some(role), _) => role,
        (None, Some(client)) => {
            if kubernetes::node_has_label(client, &args.node, &args.gateway_label).await? {
                Role::Gateway
            } else {
                Role::Worker
            }
        }
        (None, None) => bail!("--role is required with --source dir:PATH"),
    })
}

/// Gives the heap the start freed back to the system. Parsing the eBPF
/// object (megabytes of programs and BTF) and loading its programs leave
/// twice the agent's steady memory freed in the allocator, which glibc
/// would otherwise keep resident for the agent's lifetime.
fn release_freed_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The reconciler, holding the tables the kernel already has.
fn reconciler(args: &RunArgs, dataplane: &mut Dataplane) -> Result<KernelReconciler> {
    let ipv6 = Ipv6Tables {
        peers: dataplane.take_peer_map6()?,
        mappings: dataplane.take_mapping_map6()?,
        allowed: dataplane.take_allowed6()?,
    };
    let mut reconciler = Reconciler::dual_stack(
        dataplane.take_peer_map()?,
        dataplane.take_mapping_map()?,
        dataplane.take_allowed()?,
        ipv6,
    )
    .context("reading the pinned tables")?;
    reconciler.set_policy(args.policy.policy());
    reconciler.set_mapping_capacity(args.nat_mapping_capacity as usize);
    reconciler.set_device_per_liqo_v1_peer(args.tunnel == TunnelMode::Userspace);
    Ok(reconciler)
}

/// Whether this node is a gateway that serves Liqo v1 peers: their tunnel
/// devices are the embedded tunnel's.
fn serves_liqo_v1(args: &RunArgs, role: Role) -> bool {
    runs_tunnel(args, role) && args.policy.liqo_api == LiqoApi::V1
}

/// Whether this node runs the embedded tunnel: a gateway's, unless another
/// tunnel serves.
fn runs_tunnel(args: &RunArgs, role: Role) -> bool {
    (role, args.tunnel) == (Role::Gateway, TunnelMode::Userspace)
}

/// A gateway's embedded tunnel, with its key and its XDP guard; none on a
/// worker, or where another tunnel serves.
async fn start_gateway(
    args: &RunArgs,
    role: Role,
    client: Option<&kube::Client>,
    dataplane: &mut Dataplane,
) -> Result<Option<Gateway>> {
    if !runs_tunnel(args, role) {
        return Ok(None);
    }
    let key = match client {
        Some(client) => {
            kubernetes::key_from_secret(client, &args.namespace, &args.key_secret).await?
        }
        None => key::load_or_generate(&args.private_key_file)?,
    };
    if let (Some(client), LiqoApi::V1) = (client, args.policy.liqo_api) {
        let secret = public_key_secret(args);
        kubernetes::publish_public_key(
            client,
            &secret.namespace,
            &secret.name,
            key.public.as_bytes(),
        )
        .await?;
    }
    let guard = match &args.guard_dev {
        Some(dev) => {
            dataplane.attach_guard(dev)?;
            Some(Guard::new(dataplane.take_guard()?)?)
        }
        None => None,
    };
    let liqo_v1 = match dataplane.serves_liqo_v1() {
        true => Some(dataplane.take_peer_devs()?),
        false => None,
    };
    let settings = LaneSettings {
        tunnel: tunnel_config(args),
        key,
        masquerading: args.masquerade_ip.iter().any(IpAddr::is_ipv4),
    };
    let shared = LaneSpec {
        device: args.tunnel_dev.clone(),
        port: args.listen_port,
        liqo_v1: false,
        mtu: None,
    };
    let gateway = Gateway::start(
        settings,
        shared,
        guard,
        args.resolve_interval.duration,
        liqo_v1,
    )
    .await?;
    Ok(Some(gateway))
}

/// The translation's settings: a gateway's masquerade address and MSS
/// bound. Returns the flow table, for the collector, and the masquerade
/// address, which may follow the peers.
fn configure_translation(
    args: &RunArgs,
    role: Role,
    dataplane: &mut Dataplane,
) -> Result<(Conntrack, MasqueradeAddress)> {
    let conntrack = dataplane.take_conntrack()?;
    let gateway = role == Role::Gateway;
    let fixed = match gateway {
        true => MasqueradeIps::from_flag(&args.masquerade_ip)?,
        false => MasqueradeIps::default(),
    };
    let masquerade = MasqueradeAddress::new(
        dataplane.take_masquerade()?,
        fixed,
        gateway && fixed.is_empty() && args.policy.liqo_api == LiqoApi::V1,
    )?;
    if role == Role::Gateway {
        let tunnel_mss = match args.tunnel {
            TunnelMode::Userspace => {
                u16::try_from(args.mtu.saturating_sub(tcp::IPV4_TCP_HEADERS)).unwrap_or(u16::MAX)
            }
            TunnelMode::None => 0,
        };
        dataplane.set_tcp_mss(args.tcp_mss.unwrap_or(tunnel_mss))?;
    }
    Ok((conntrack, masquerade))
}

/// The devices this node's programs attach to: a gateway's NAT device, the
/// overlay and the pods' devices.
async fn start_host(
    args: &RunArgs,
    role: Role,
    mut dataplane: Dataplane,
    masquerade: MasqueradeAddress,
) -> Result<NodeHost> {
    // Serving Liqo v1 peers, the NAT follows their tunnel devices.
    let nat = match (role, serves_liqo_v1(args, role)) {
        (Role::Gateway, false) => {
            let device = NatDevice::start(&mut dataplane, &args.nat_dev, args.attach)?;
            BTreeMap::from([(args.nat_dev.clone(), device)])
        }
        _ => BTreeMap::new(),
    };
    let past_netfilter = PastNetfilterSetting::new(args.forward_past_netfilter);
    let overlay = match args.no_overlay {
        true => None,
        false => Some(start_overlay(args, role, &mut dataplane, &past_netfilter).await?),
    };
    dataplane.load_steer()?;
    let pods = PodDevices::new(args.pod_devs.clone(), dataplane.take_pod_devs()?)?;
    Ok(NodeHost {
        past_netfilter,
        nat,
        nat_follows_tunnels: serves_liqo_v1(args, role),
        links: LinkEvents::subscribe()?,
        dataplane,
        overlay,
        pods,
        attach: args.attach,
        policy: args.policy.clone(),
        masquerade,
    })
}

/// Serves `/metrics`, `/healthz` and `/readyz` on the node's address.
async fn serve_metrics(
    args: &RunArgs,
    role: Role,
    gateway: Option<&Gateway>,
) -> Result<Arc<Metrics>> {
    let xdp_mode = match gateway.is_some() && args.guard_dev.is_some() {
        true => "native",
        false => "none",
    };
    let metrics = Metrics::new(
        Some(&args.bpffs),
        gateway.map(|g| GatewayState {
            tunnels: g.tunnels.clone(),
            health: PeerHealth::Conncheck(g.checks.clone()),
            device: args.tunnel_dev.clone(),
            liqo_api: args.policy.liqo_api,
        }),
        BuildInfo {
            node: &args.node,
            role: role.name(),
            attach_mode: args.attach.resolve().as_str(),
            xdp_mode,
        },
    )
    .context("opening the pinned maps for the metrics")?;
    if args.metrics_addr.is_none() && args.node_ip.is_none() {
        warn!("no --node-ip nor --metrics-addr: metrics are served on loopback only");
    }
    let addr = args.metrics_address();
    metrics::serve(addr, metrics.clone())
        .await
        .with_context(|| format!("serving metrics on {addr}"))?;
    Ok(metrics)
}

/// Starts the flow collector, which wakes after each pass of the run loop
/// (`passed`) as well as on its interval.
fn spawn_collector(
    args: &RunArgs,
    capacity: &Capacity,
    conntrack: Conntrack,
    dataplane: &mut Dataplane,
    passed: &watch::Sender<()>,
    metrics: &Arc<Metrics>,
) -> Result<()> {
    let tables = FlowTables {
        conntrack: (conntrack, capacity.conntrack),
        peer_flows: (dataplane.take_peer_flows()?, capacity.peer_flows),
        rooms: dataplane.take_rooms()?,
        peers: PeerMap::open(&args.bpffs)?,
        peers_written: passed.subscribe(),
    };
    let (shortest, longest) = (args.conntrack_gc_interval, args.conntrack_gc_max_interval);
    if longest.duration < shortest.duration {
        bail!(
            "--conntrack-gc-max-interval ({}) is shorter than --conntrack-gc-interval ({})",
            interval::go_text(longest.duration),
            interval::go_text(shortest.duration)
        );
    }
    let sharing = Sharing {
        every: args.conntrack_gc_interval.duration,
        longest: args.conntrack_gc_max_interval.duration,
        reserve_percent: args.flow_reserve_percent,
        share: args.flow_share,
    };
    flows::spawn(tables, sharing, metrics.clone())
        .context("starting the flow collector's thread")?;
    Ok(())
}

/// What the run loop follows: the objects' events, and on a gateway with
/// the API, where it reports status and whether it is the active one.
struct Source {
    events: mpsc::Receiver<SourceEvent>,
    feedback: Option<Feedback>,
    active: Option<watch::Receiver<bool>>,
}

/// Opens the source of objects; a gateway reading the API also reports
/// status and joins the election.
fn open_source(
    args: &RunArgs,
    role: Role,
    client: Option<kube::Client>,
    metrics: &Arc<Metrics>,
) -> Result<Source> {
    let kinds: Vec<ObjectKind> = ObjectKind::ALL
        .into_iter()
        .filter(|kind| match kind.read_for() {
            ReadFor::Cluster => true,
            ReadFor::LiqoV0_10 => args.policy.liqo_api == LiqoApi::V0_10,
            ReadFor::LiqoV1 => args.policy.liqo_api == LiqoApi::V1,
            // A worker does not watch every offloaded pod.
            ReadFor::Isolation => role == Role::Gateway,
        })
        .collect();
    let client = match (&args.source, client) {
        (SourceSpec::Dir(dir), _) => {
            return Ok(Source {
                events: source::watch_dir(dir)?,
                feedback: None,
                active: None,
            });
        }
        (SourceSpec::Kube, Some(client)) => client,
        (SourceSpec::Kube, None) => unreachable!("a kube source has a client"),
    };
    let lease = source::ElectionLease {
        namespace: args.namespace.clone(),
        name: args.election.lease_name.clone(),
    };
    let (events, objects) = source::watch_kube(client.clone(), &kinds, &lease);
    // The gateway speaks for the cluster's tunnels; workers only read.
    let gateway = role == Role::Gateway;
    let active = gateway.then(|| elect(&client, args)).transpose()?;
    // Serving Liqo v1, the gateway also shows where peers reach it on
    // Isthmus's gateway objects.
    let home = (args.policy.liqo_api == LiqoApi::V1).then(|| GatewayHome {
        node: args.node.clone(),
        public_key_secret: public_key_secret(args),
        readiness: args.metrics_address(),
        pod_image: args.gateway_pod_image.clone(),
    });
    let feedback =
        gateway.then(|| Feedback::spawn(client, objects, &args.node, metrics.clone(), home));
    Ok(Source {
        events,
        feedback,
        active,
    })
}

/// The Secret the gateway publishes its public key in for Liqo v1's peers:
/// the key Secret's name with `-public`, in the agent's namespace.
fn public_key_secret(args: &RunArgs) -> ObjectKey {
    ObjectKey {
        namespace: args.namespace.clone(),
        name: format!("{}-public", args.key_secret),
    }
}

/// Starts this gateway's election among the cluster's gateways; returns
/// whether it is the active one, as that changes.
fn elect(client: &kube::Client, args: &RunArgs) -> Result<watch::Receiver<bool>> {
    let election = &args.election;
    let timings = election.timings()?;
    let lease = LeaseClient::new(client.clone(), &args.namespace, &election.lease_name);
    let pods = election
        .pod_name
        .as_deref()
        .map(|pod| PodLabels::new(client.clone(), &args.namespace, pod));
    if pods.is_none() {
        warn!("no --pod-name (POD_NAME): the gateway pods are not labelled active or standby");
    }
    let elector = Elector::new(Election::new(&args.node, timings), lease, pods);
    let active = elector.subscribe();
    info!(lease = %election.lease_name, namespace = %args.namespace, ?timings, "electing the active gateway");
    tokio::spawn(elector.run());
    Ok(active)
}

/// Completes on SIGTERM or SIGINT.
fn signal() -> Result<impl std::future::Future<Output = ()>> {
    let mut terminate = unix::signal(unix::SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    })
}

/// Creates the overlay's device, attaches its programs (on a worker, the
/// one sending the node's own traffic for peers too) and writes its
/// settings.
async fn start_overlay(
    args: &RunArgs,
    role: Role,
    dataplane: &mut Dataplane,
    past_netfilter: &PastNetfilterSetting,
) -> Result<Overlay> {
    let options = OverlayOptions {
        dev: args.overlay_dev.clone(),
        vni: args.overlay_vni,
        port: args.overlay_port,
        gateway: args.gateway_ip,
        gateway_label: args.gateway_label.clone(),
        node: args.node.clone(),
        past_netfilter: past_netfilter.wanted(),
    };
    let ifindex = overlay::ensure_device(&options).await?;
    dataplane.attach_accept(&options.dev, args.attach)?;
    if role == Role::Worker {
        dataplane.attach_own(&options.dev, args.attach)?;
    }
    let maps = dataplane.take_overlay()?;
    let overlay = Overlay::new(options, maps, ifindex)?;
    overlay.drop_stale_decap(dataplane);
    Ok(overlay)
}

fn tunnel_config(args: &RunArgs) -> TunnelConfig {
    TunnelConfig {
        dev: args.tunnel_dev.clone(),
        mtu: args.mtu,
        port: args.listen_port,
        keepalive: args.keepalive,
        workers: args.tunnel_workers.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
        }),
    }
}

/// Says where an EPERM from the kernel comes from when the agent holds its
/// capabilities but a container runtime's seccomp profile confines it.
fn refused_by_runtime(error: anyhow::Error, runtime_filtered: bool) -> anyhow::Error {
    let eperm = error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(libc::EPERM))
    });
    match eperm && runtime_filtered {
        true => error.context(
            "bpf(2) was refused although the agent holds CAP_BPF: the container runtime's \
             seccomp profile forbids it (some RuntimeDefault profiles allow bpf(2) only with \
             CAP_SYS_ADMIN); run the agent with seccompProfile Unconfined, as the DaemonSets \
             do: it confines itself with its own filter (--syscall-filter)",
        ),
        false => error,
    }
}
