//! A node of its own for the kube source: a netns (named `ist-t-*`, which
//! `lab down` removes) holding a fake API server on loopback and an agent
//! run with `--source kube`. The kube tests and the control bench use it;
//! the lab's bpffs and state directory must exist (`lab up`).

use std::{
    fs,
    net::{Ipv4Addr, TcpListener},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::{
    cmd::ip,
    fake_api::FakeApi,
    lab, netns,
    topology::{self, AGENT_NS, METRICS_PORT},
};

/// A netns with a fake API server and, once started, an agent.
pub struct KubeNode {
    /// The netns, also the node's name.
    pub ns: String,
    /// The API server the agent talks to.
    pub api: FakeApi,
    /// The agent's log.
    pub log: PathBuf,
    kubeconfig: PathBuf,
    agent: Option<u32>,
}

impl KubeNode {
    /// A fresh netns `ns` serving a Node object named after it, labelled a
    /// gateway if `gateway`.
    pub fn new(ns: &str, gateway: bool) -> Result<Self> {
        ensure!(
            ns.starts_with(lab::TEST_NS_PREFIX),
            "{ns}: such namespaces start with {}",
            lab::TEST_NS_PREFIX
        );
        ensure!(
            lab::is_up(),
            "the lab is not up: `cargo xtask lab up` first"
        );
        if netns::exists(ns) {
            ip("", &["netns", "del", ns])?;
        }
        ip("", &["netns", "add", ns])?;
        ip(ns, &["link", "set", "lo", "up"])?;
        let listener = netns::run_in(ns, || TcpListener::bind("127.0.0.1:0"))??;
        let api = FakeApi::start(listener)?;
        api.apply(topology::node(ns, Ipv4Addr::LOCALHOST, None, gateway));
        let kubeconfig = PathBuf::from(lab::STATE_DIR).join(format!("{ns}.kubeconfig"));
        fs::write(&kubeconfig, api.kubeconfig())?;
        let log = lab::log_file(ns);
        let _ = fs::remove_file(&log);
        Ok(Self {
            ns: ns.into(),
            api,
            log,
            kubeconfig,
            agent: None,
        })
    }

    /// Starts the agent with no `--role` (the Node's label decides) and
    /// waits until it is ready. Returns its PID.
    pub fn start_agent(&mut self, extra: &[&str]) -> Result<u32> {
        let args = [
            "run".to_owned(),
            "--source=kube".to_owned(),
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--node={}", self.ns),
            format!("--namespace={AGENT_NS}"),
            format!("--bpffs={}", self.bpffs().display()),
            format!("--metrics-addr=127.0.0.1:{METRICS_PORT}"),
        ];
        self.start(&lab::agent_binary(), &args, extra)
    }

    /// Starts `isthmus-agent liqo-wireguard` (the `wireguard` container of
    /// a Liqo v1 gateway pod) with `extra`, Liqo's flags, serving metrics
    /// and health where the agent's are, and waits until it is ready. It
    /// holds what the template's container holds, `NET_ADMIN` alone.
    pub fn start_liqo_wireguard(&mut self, extra: &[&str]) -> Result<u32> {
        let args = [
            "--bounding-set=-all,+net_admin".to_owned(),
            lab::agent_binary().display().to_string(),
            "liqo-wireguard".to_owned(),
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--health-probe-bind-address=127.0.0.1:{METRICS_PORT}"),
        ];
        self.start(Path::new("setpriv"), &args, extra)
    }

    /// Starts `binary` with `args` then `extra` in the node's netns, and
    /// waits until it is ready.
    fn start(&mut self, binary: &Path, args: &[String], extra: &[&str]) -> Result<u32> {
        let mut args = args.to_vec();
        args.extend(extra.iter().map(std::string::ToString::to_string));
        let pid = lab::spawn_agent_binary(binary, &self.ns, &args, &self.log)?;
        self.agent = Some(pid);
        lab::wait_ready_in(&self.ns, pid, &self.log).context("the kube agent")?;
        Ok(pid)
    }

    /// Stops the agent, if it runs, as a rollout would: by SIGTERM.
    pub fn stop_agent(&mut self) -> Result<()> {
        match self.agent.take() {
            Some(pid) => lab::stop_pid(pid),
            None => Ok(()),
        }
    }

    /// Where the agent pins its maps.
    pub fn bpffs(&self) -> PathBuf {
        lab::bpffs(&self.ns)
    }
}

impl Drop for KubeNode {
    fn drop(&mut self) {
        if let Some(pid) = self.agent {
            let _ = lab::stop_pid(pid);
        }
        if std::thread::panicking() {
            eprintln!("end of the agent's log:\n{}", lab::log_tail(&self.log));
        }
        let _ = ip("", &["netns", "del", &self.ns]);
        let _ = fs::remove_dir_all(self.bpffs());
        let _ = fs::remove_file(&self.kubeconfig);
    }
}

/// The networks of one side of a peering, as a TunnelEndpoint names them.
pub struct Networks<'a> {
    /// Our PodCIDR.
    pub local_pod: &'a str,
    /// Our ExternalCIDR.
    pub local_external: &'a str,
    /// The peer's PodCIDR.
    pub remote_pod: &'a str,
    /// The peer's ExternalCIDR.
    pub remote_external: &'a str,
}

/// A TunnelEndpoint of cluster `cluster` in Liqo's v0.10 (`spec`) layout,
/// nothing remapped; `extra` is merged into `spec`.
pub fn tunnel_endpoint(name: &str, cluster: &str, nets: &Networks, extra: Value) -> Value {
    let mut spec = json!({
        "clusterIdentity": {"clusterID": cluster, "clusterName": cluster},
        "localPodCIDR": nets.local_pod, "localNATPodCIDR": "None",
        "localExternalCIDR": nets.local_external, "localNATExternalCIDR": "None",
        "remotePodCIDR": nets.remote_pod, "remoteNATPodCIDR": "None",
        "remoteExternalCIDR": nets.remote_external, "remoteNATExternalCIDR": "None",
    });
    if let (Value::Object(spec), Value::Object(extra)) = (&mut spec, extra) {
        spec.extend(extra);
    }
    json!({
        "apiVersion": "net.liqo.io/v1alpha1", "kind": "TunnelEndpoint",
        "metadata": {"name": name, "namespace": format!("liqo-tenant-{cluster}")},
        "spec": spec,
    })
}

/// Cluster `cluster`'s NatMapping: (endpointIP, externalIP) entries.
pub fn nat_mapping<E: ToString, X: ToString>(cluster: &str, entries: &[(E, X)]) -> Value {
    let mappings: serde_json::Map<String, Value> = entries
        .iter()
        .map(|(endpoint, external)| (endpoint.to_string(), json!(external.to_string())))
        .collect();
    json!({
        "apiVersion": "net.liqo.io/v1alpha1", "kind": "NatMapping",
        "metadata": {"name": format!("natmapping-{cluster}")},
        "spec": {"clusterID": cluster, "clusterMappings": mappings},
    })
}
