//! The lab's `--liqo-api v1` variant: every cluster runs Isthmus as Liqo
//! v1's gateway type (docs/design.md#liqo-v1-gateway-type), with the same
//! networks, views and reachability rows as the reference lab.
//!
//! - Every agent runs `--source kube --liqo-api v1` against an API server
//!   stand-in of its own cluster ([`crate::fake_api`]), served from the
//!   cluster's LAN at [`settings::api_addr`]. A kubeconfig per cluster is
//!   at [`settings::kubeconfig`], for `kubectl` in that cluster's netns.
//! - Each stand-in holds Liqo v1.2's CRDs and Isthmus's, and refuses what
//!   they refuse (their schemas and CEL rules), the agents' writes too.
//!   It holds its cluster's objects as `liqoctl peer` and Liqo's
//!   controllers write them: per peer, the `Configuration` with its
//!   status and condition, the peer's `PublicKey`, the `GatewayServer` or
//!   `GatewayClient` naming Isthmus's template, and the object Liqo
//!   renders from it, owned by it. Then the Nodes, and the gateway's key.
//! - b is the hub and serves both its peers, each on its own port
//!   ([`settings::server_port`]); a and c are clients. The hub path (row
//!   5) is an `IP` of b's, in place of the NatMapping Liqo v1 no longer
//!   has.
//!
//! The stand-ins live in a background process of their own (`cargo xtask
//! liqo-v1-apis`), which `lab down` ends.

pub mod settings;

use std::{fs, net::TcpListener, path::PathBuf, process::Command, time::Duration};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::{
    agents::log_tail,
    keys::{key_file, public_key},
    paths::{log_file, state, xtask_binary},
    process::{spawn_detached, stop_xtask_process},
};
use crate::{
    cmd::ip,
    fake_api::{FakeApi, schema::Crds},
    netns,
    topology::{AGENT_NS, CLUSTERS, Cluster, NAT_MAPPING, PEERINGS},
};
use settings::{api_addr, kubeconfig, server_port, side};

/// The hidden xtask command that runs the stand-ins.
pub const CONTROL_COMMAND: &str = "liqo-v1-apis";
/// How long the control process may take to serve.
const START_TIMEOUT: Duration = Duration::from_secs(10);

fn pid_file() -> PathBuf {
    state("liqo-v1-apis.pid")
}

/// Starts the stand-ins, each on its cluster's LAN, and waits until every
/// one serves its objects: its kubeconfig, written last, says so.
pub fn start() -> Result<()> {
    for cluster in CLUSTERS {
        let addr = format!("{}/24", api_addr(cluster).ip());
        ip(&cluster.lan(), &["addr", "add", &addr, "dev", "br0"])?;
    }
    let log = fs::File::create(log_file(CONTROL_COMMAND))?;
    let mut command = Command::new(xtask_binary()?);
    command.arg(CONTROL_COMMAND);
    let pid = spawn_detached(command, log).context("starting the API server stand-ins")?;
    fs::write(pid_file(), pid.to_string())?;
    for cluster in CLUSTERS {
        crate::wait::until(
            START_TIMEOUT,
            Duration::from_millis(20),
            &format!(
                "cluster {}'s API server stand-in serves its objects",
                cluster.name
            ),
            || kubeconfig(cluster).exists(),
        )
        .with_context(|| format!("its log:\n{}", log_tail(&log_file(CONTROL_COMMAND))))?;
    }
    Ok(())
}

/// Ends the control process, if it runs.
pub fn stop() -> Result<()> {
    stop_xtask_process(CONTROL_COMMAND, &pid_file())
}

/// The control process: serves every cluster's objects until signalled.
pub fn serve() -> Result<()> {
    let mut apis = Vec::new();
    for cluster in CLUSTERS {
        let listener = netns::run_in(&cluster.lan(), || TcpListener::bind(api_addr(cluster)))??;
        let api = FakeApi::start_with_crds(listener, crds()?)?;
        seed(&api, cluster)?;
        // Last: the lab starts the agents once every kubeconfig is there.
        let path = kubeconfig(cluster);
        fs::create_dir_all(path.parent().context("a directory")?)?;
        let staged = path.with_extension("new");
        fs::write(&staged, api.kubeconfig())?;
        fs::rename(&staged, &path)?;
        println!(
            "{CONTROL_COMMAND}: serving cluster {}'s objects on {}",
            cluster.name,
            api_addr(cluster)
        );
        apis.push(api);
    }
    loop {
        std::thread::park();
    }
}

/// Liqo v1.2's CRDs, as its chart installs them, and Isthmus's gateway
/// kinds: what each stand-in holds and judges writes by.
fn crds() -> Result<Crds> {
    let root = crate::repo_root();
    let mut files = Vec::new();
    for dir in [
        "tests/fixtures/liqo-v1/crds",
        "manifests/liqo-v1/gateway-type/crds",
    ] {
        let dir = root.join(dir);
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            files.push(entry?.path());
        }
    }
    files.sort();
    Crds::load(&files)
}

/// Stores `object` in `api`, as the API server would; one its CRDs refuse
/// stops the lab, naming the field.
fn admit(api: &FakeApi, object: Value) -> Result<()> {
    api.admit(object)
        .map(drop)
        .map_err(|why| anyhow::anyhow!("the lab's own object is refused: {why}"))
}

/// `cluster`'s objects, as its API server holds them once `liqoctl peer`
/// and Liqo's controllers are done; in the dual-stack lab, with both
/// families' networks and node addresses.
fn seed(api: &FakeApi, cluster: &Cluster) -> Result<()> {
    let dual_stack = super::Setup::current()?.dual_stack;
    for node in nodes(cluster, dual_stack) {
        api.apply(node);
    }
    let key = fs::read_to_string(key_file(&cluster.gw()))?;
    api.apply(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "isthmus-wireguard", "namespace": AGENT_NS},
        "stringData": {"privateKey": key.trim()},
    }));
    for peering in PEERINGS.iter().filter(|p| p.local.name == cluster.name) {
        let side = side(peering);
        let port = server_port(match side {
            super::liqo_v1_peer::Side::Server => peering.remote,
            super::liqo_v1_peer::Side::Client => peering.local,
        });
        admit(
            api,
            match dual_stack {
                true => peering.dual_stack_configuration(),
                false => peering.configuration(),
            },
        )?;
        admit(api, peering.public_key(&public_key(&peering.remote.gw())?))?;
        let parent = peering.liqo_gateway(side, port);
        let rendered = owned_by(api, &parent, peering.isthmus_gateway(side, port))?;
        admit(api, rendered)?;
    }
    if cluster.name == NAT_MAPPING.hub.name {
        admit(api, hub_ip())?;
    }
    Ok(())
}

/// The hub's `IP` that gives the lab's hub path (reachability row 5) in
/// place of a NatMapping: an address of the hub's ExternalCIDR, which
/// every peer reaches, leading to c-pod1. IPv4 alone: Liqo's CRD holds an
/// `IP`'s addresses to `format: ipv4`, and the stand-in refuses others.
fn hub_ip() -> Value {
    let hub = NAT_MAPPING.hub;
    json!({
        "apiVersion": "ipam.liqo.io/v1alpha1", "kind": "IP",
        "metadata": {"name": "c-pod1", "namespace": "default"},
        "spec": {"ip": NAT_MAPPING.endpoint.to_string()},
        "status": {"ip": NAT_MAPPING.real_external().to_string(), "cidr": hub.external_cidr},
    })
}

/// `child`, with a controller reference to `parent`, once `api` holds
/// `parent` and has given it a UID, as Liqo's controllers own what they
/// render.
fn owned_by(api: &FakeApi, parent: &Value, mut child: Value) -> Result<Value> {
    admit(api, parent.clone())?;
    let kind = parent["kind"].as_str().context("a kind")?;
    let (namespace, name) = (
        parent["metadata"]["namespace"]
            .as_str()
            .context("a namespace")?,
        parent["metadata"]["name"].as_str().context("a name")?,
    );
    let plural = format!("{}s", kind.to_lowercase());
    let Some(stored) = api.get(&plural, namespace, name) else {
        bail!("{kind} {namespace}/{name} was not stored");
    };
    child["metadata"]["ownerReferences"] = json!([{
        "apiVersion": parent["apiVersion"], "kind": kind, "name": name,
        "uid": stored["metadata"]["uid"], "controller": true,
    }]);
    Ok(child)
}

/// `cluster`'s Nodes, the gateway's with its uplink as `ExternalIP`, where
/// a server's peers make contact.
fn nodes(cluster: &Cluster, dual_stack: bool) -> [Value; 2] {
    let mut nodes = match dual_stack {
        true => cluster.dual_stack_node_objects(),
        false => cluster.node_objects(),
    };
    let external = json!({"type": "ExternalIP", "address": cluster.wan_addr().to_string()});
    nodes[0]["status"]["addresses"]
        .as_array_mut()
        .expect("a Node lists its addresses")
        .push(external);
    nodes
}
