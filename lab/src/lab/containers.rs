//! The lab's agents as users deploy them: from the agent's image, under
//! podman, with the container settings of `manifests/base/daemonset.yaml`.
//!
//! Nothing here restates the DaemonSets' settings: [`AgentContainer`] reads
//! them from the manifest and [`AgentContainer::podman_args`] says each one
//! to podman. Where the two cannot say the same thing, the lab stands in
//! for the kubelet, and says so here:
//! - `hostNetwork: true` is the node's network namespace (`--network
//!   ns:/run/netns/NODE`);
//! - a hostPath is the same host path, except the bpffs directory
//!   (`/sys/fs/bpf/isthmus`), which is the node's own directory of the
//!   lab's bpffs, as every lab node has its own;
//! - the downward API's fields are the lab's: the node's name and address,
//!   the container's name as the pod's, namespace `isthmus-system`;
//! - `readOnlyRootFilesystem` adds no tmpfs (`--read-only-tmpfs=false`),
//!   as the kubelet adds none; `allowPrivilegeEscalation: false` is
//!   `no-new-privileges`; `RuntimeDefault` is podman's default profile, a
//!   `Localhost` profile is a file of `manifests/seccomp/`, where the lab
//!   keeps the kubelet's seccomp root;
//! - the memory limit is `--memory`; requests, probes and ports have no
//!   podman counterpart (the lab waits on `/readyz` itself);
//! - rlimits, which Kubernetes does not set, are what this machine's runc
//!   accepts ([`crate::container`]);
//! - the lab adds what the API server would give: the node's objects, its
//!   key and hosts file, the `--ha` lab's kubeconfig (read-only, at the
//!   same paths), and its own flags ([`super::agent_args`]), each of which
//!   replaces the manifest's flag of that name.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::{apps::v1::DaemonSet, core::v1::Container};
use serde::Deserialize;

use super::{
    ha::settings::{is_ha_node, kubeconfig},
    paths::{bpffs, hosts_file, object_dir, state},
    setup::Setup,
};
use crate::{container, repo_root};

/// The manifest the lab reads the agents' container settings from.
pub fn manifest() -> PathBuf {
    repo_root().join("manifests/base/daemonset.yaml")
}

/// The hostPath of the agents' bpffs directory in the manifest.
const BPFFS_HOST_PATH: &str = "/sys/fs/bpf/isthmus";
/// The label every lab container carries, so that `lab down` finds them.
pub const LABEL: &str = "isthmus-lab";
/// A new name for a container of node `node`'s agent. Each container has
/// its own, so that the next can start while podman still removes the
/// one before (which takes it about two seconds after the agent exits).
fn new_name(node: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{LABEL}-{node}-{nanos}")
}

/// What the downward API gives a pod on a lab node.
pub struct Downward {
    /// `spec.nodeName`.
    pub node: String,
    /// `metadata.name`.
    pub pod: String,
    /// `status.hostIP`.
    pub node_ip: String,
    /// `metadata.namespace`.
    pub namespace: String,
}

impl Downward {
    fn field(&self, path: &str) -> Result<&str> {
        Ok(match path {
            "spec.nodeName" => &self.node,
            "metadata.name" => &self.pod,
            "status.hostIP" => &self.node_ip,
            "metadata.namespace" => &self.namespace,
            _ => bail!("the lab cannot fill the downward API field {path}"),
        })
    }
}

/// The agent container of one of the manifest's DaemonSets, with the pod
/// settings that apply to it.
pub struct AgentContainer {
    daemonset: String,
    container: Container,
    host_network: bool,
    pod_seccomp: Option<k8s_openapi::api::core::v1::SeccompProfile>,
    /// Each hostPath volume's path and type.
    host_paths: BTreeMap<String, (String, Option<String>)>,
}

impl AgentContainer {
    /// The `agent` container of DaemonSet `isthmus-ROLE` in `manifest`.
    pub fn of_role(manifest: &str, role: &str) -> Result<Self> {
        let wanted = format!("isthmus-{role}");
        for document in serde_yaml_ng::Deserializer::from_str(manifest) {
            let daemonset = DaemonSet::deserialize(document).context("a DaemonSet")?;
            if daemonset.metadata.name.as_deref() != Some(&wanted) {
                continue;
            }
            let pod = daemonset
                .spec
                .template
                .spec
                .with_context(|| format!("DaemonSet {wanted} has no pod spec"))?;
            let container = pod
                .containers
                .into_iter()
                .find(|c| c.name == "agent")
                .with_context(|| format!("DaemonSet {wanted} has no container `agent`"))?;
            let host_paths = pod
                .volumes
                .unwrap_or_default()
                .into_iter()
                .filter_map(|v| {
                    let host = v.host_path?;
                    Some((v.name, (host.path, host.type_)))
                })
                .collect();
            return Ok(Self {
                daemonset: wanted,
                container,
                host_network: pod.host_network == Some(true),
                pod_seccomp: pod.security_context.and_then(|s| s.seccomp_profile),
                host_paths,
            });
        }
        bail!("the manifest has no DaemonSet {wanted}")
    }

    /// The image the DaemonSet runs.
    pub fn image(&self) -> Result<&str> {
        self.container
            .image
            .as_deref()
            .with_context(|| format!("{}: the agent container names no image", self.daemonset))
    }

    /// The capabilities the container adds.
    pub fn added_capabilities(&self) -> Vec<String> {
        self.security()
            .and_then(|s| s.capabilities.as_ref())
            .and_then(|c| c.add.clone())
            .unwrap_or_default()
    }

    fn security(&self) -> Option<&k8s_openapi::api::core::v1::SecurityContext> {
        self.container.security_context.as_ref()
    }

    /// The container's environment, the downward API filled in from `pod`.
    pub fn env(&self, pod: &Downward) -> Result<Vec<(String, String)>> {
        let mut env = Vec::new();
        for var in self.container.env.iter().flatten() {
            let value = match (&var.value, &var.value_from) {
                (Some(value), _) => value.clone(),
                (None, Some(from)) => {
                    let field = from.field_ref.as_ref().with_context(|| {
                        format!(
                            "{}: env {} is not a downward API field",
                            self.daemonset, var.name
                        )
                    })?;
                    pod.field(&field.field_path)?.to_owned()
                }
                (None, None) => String::new(),
            };
            env.push((var.name.clone(), value));
        }
        Ok(env)
    }

    /// The container's arguments, `$(VAR)` expanded from `env` as the
    /// kubelet does.
    pub fn args(&self, env: &[(String, String)]) -> Vec<String> {
        self.container
            .args
            .iter()
            .flatten()
            .map(|arg| {
                env.iter().fold(arg.clone(), |arg, (name, value)| {
                    arg.replace(&format!("$({name})"), value)
                })
            })
            .collect()
    }

    /// The bpffs directory the container sees its host path under.
    pub fn bpffs_mount(&self) -> Result<String> {
        let volume = self
            .host_paths
            .iter()
            .find(|(_, (path, _))| path.as_str() == BPFFS_HOST_PATH)
            .map(|(name, _)| name)
            .with_context(|| format!("{}: no hostPath {BPFFS_HOST_PATH}", self.daemonset))?;
        self.mount_path(volume)
            .with_context(|| format!("{}: volume {volume} is not mounted", self.daemonset))
    }

    fn mount_path(&self, volume: &str) -> Option<String> {
        self.container
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == volume)
            .map(|m| m.mount_path.clone())
    }

    /// Podman's options for this container on lab node `node`, before the
    /// image: network, privileges, seccomp, filesystem, mounts, limits
    /// and environment, changed as `variant` says.
    pub fn podman_args(
        &self,
        node: &str,
        pod: &Downward,
        variant: &Variant,
    ) -> Result<Vec<String>> {
        ensure!(
            self.host_network,
            "{}: the lab runs only hostNetwork pods",
            self.daemonset
        );
        let mut args = vec![
            format!("--name={}", pod.pod),
            format!("--label={LABEL}={node}"),
            "--rm".into(),
            "--pull=never".into(),
            format!("--network=ns:/run/netns/{node}"),
        ];
        args.extend(self.privilege_args(variant)?);
        for mount in self.container.volume_mounts.iter().flatten() {
            let (host, kind) = self.host_paths.get(&mount.name).with_context(|| {
                format!(
                    "{}: volume {} is not a hostPath",
                    self.daemonset, mount.name
                )
            })?;
            let host = match host.as_str() {
                BPFFS_HOST_PATH => bpffs(node),
                other => PathBuf::from(other),
            };
            prepare_host_path(&host, kind.as_deref())?;
            let host = host.display();
            let mode = if mount.read_only == Some(true) {
                ":ro"
            } else {
                ""
            };
            args.push(format!("--volume={host}:{}{mode}", mount.mount_path));
        }
        if let Some(memory) = self
            .container
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref()?.get("memory"))
        {
            args.push(format!("--memory={}", podman_quantity(&memory.0)?));
        }
        for (name, value) in self.env(pod)? {
            args.push(format!("--env={name}={value}"));
        }
        Ok(args)
    }

    /// Capabilities, privilege escalation, user, root filesystem and
    /// seccomp, as podman options.
    fn privilege_args(&self, variant: &Variant) -> Result<Vec<String>> {
        let mut args = Vec::new();
        let security = self.security();
        if security.and_then(|s| s.privileged) == Some(true) {
            args.push("--privileged".into());
        }
        let capabilities = security.and_then(|s| s.capabilities.as_ref());
        for cap in capabilities
            .and_then(|c| c.drop.as_ref())
            .into_iter()
            .flatten()
        {
            args.push(format!("--cap-drop={}", cap.to_lowercase()));
        }
        for cap in capabilities
            .and_then(|c| c.add.as_ref())
            .into_iter()
            .flatten()
        {
            if !variant.without_capabilities.contains(&cap.as_str()) {
                args.push(format!("--cap-add={cap}"));
            }
        }
        if security.and_then(|s| s.allow_privilege_escalation) == Some(false) {
            args.push("--security-opt=no-new-privileges".into());
        }
        if let Some(user) = security.and_then(|s| s.run_as_user) {
            let group = security.and_then(|s| s.run_as_group).unwrap_or(user);
            args.push(format!("--user={user}:{group}"));
        }
        if security.and_then(|s| s.read_only_root_filesystem) == Some(true) {
            args.extend(["--read-only".into(), "--read-only-tmpfs=false".into()]);
        }
        let seccomp = security
            .and_then(|s| s.seccomp_profile.clone())
            .or_else(|| self.pod_seccomp.clone());
        if variant.runtime_default_seccomp {
            return Ok(args);
        }
        match seccomp
            .as_ref()
            .map(|p| (p.type_.as_str(), p.localhost_profile.as_deref()))
        {
            None | Some(("Unconfined", _)) => args.push("--security-opt=seccomp=unconfined".into()),
            Some(("RuntimeDefault", _)) => {}
            Some(("Localhost", Some(profile))) => args.push(format!(
                "--security-opt=seccomp={}",
                repo_root()
                    .join("manifests/seccomp")
                    .join(profile)
                    .display()
            )),
            Some((other, _)) => bail!("{}: seccomp profile type {other}", self.daemonset),
        }
        Ok(args)
    }
}

/// Does for `path` what the kubelet does for a hostPath of type `kind`:
/// makes a `DirectoryOrCreate`, checks the others exist as said.
fn prepare_host_path(path: &Path, kind: Option<&str>) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let exists_as =
        |check: fn(&fs::FileType) -> bool| fs::metadata(path).is_ok_and(|m| check(&m.file_type()));
    let ok = match kind.unwrap_or("") {
        "DirectoryOrCreate" => {
            fs::create_dir_all(path).with_context(|| format!("making {}", path.display()))?;
            true
        }
        "Directory" => exists_as(fs::FileType::is_dir),
        "CharDevice" => exists_as(fs::FileType::is_char_device),
        "File" => exists_as(fs::FileType::is_file),
        "" => true,
        other => bail!("hostPath {}: the lab knows no type {other}", path.display()),
    };
    ensure!(
        ok,
        "hostPath {} is not a {}",
        path.display(),
        kind.unwrap_or_default()
    );
    Ok(())
}

/// How a container departs from the manifest, for the tests that prove
/// each of its settings is needed.
#[derive(Default)]
pub struct Variant<'a> {
    /// Capabilities of the manifest's `add` list left out.
    pub without_capabilities: &'a [&'a str],
    /// The runtime's default seccomp profile in place of the manifest's.
    pub runtime_default_seccomp: bool,
}

/// A Kubernetes memory quantity as podman writes it: `256Mi` is `256m`.
fn podman_quantity(quantity: &str) -> Result<String> {
    let (number, unit) = quantity.split_at(quantity.trim_end_matches(char::is_alphabetic).len());
    let unit = match unit {
        "" => "b",
        "Ki" => "k",
        "Mi" => "m",
        "Gi" => "g",
        _ => bail!("memory quantity {quantity}: the lab knows Ki, Mi and Gi"),
    };
    Ok(format!("{number}{unit}"))
}

/// The agent's arguments: the manifest's, each flag the lab sets replaced
/// by the lab's.
pub fn merge_args(manifest: Vec<String>, lab: &[String]) -> Vec<String> {
    let flag = |arg: &str| arg.split('=').next().unwrap_or(arg).to_owned();
    let lab_flags: Vec<String> = lab
        .iter()
        .filter(|a| a.starts_with("--"))
        .map(|a| flag(a))
        .collect();
    let mut args: Vec<String> = manifest
        .into_iter()
        .filter(|a| !lab_flags.contains(&flag(a)))
        .collect();
    args.extend(lab.iter().filter(|a| a.starts_with("--")).cloned());
    args
}

/// The paths the lab's own flags name, mounted read-only where the agent
/// looks for them.
fn lab_mounts(node: &str, setup: &Setup) -> Vec<String> {
    let mut paths = vec![object_dir(node), state("keys")];
    if is_ha_node(node, setup) {
        paths.push(kubeconfig());
    }
    let mut mounts: Vec<String> = paths
        .iter()
        .filter(|p| p.exists())
        .map(|p| format!("--volume={0}:{0}:ro", p.display()))
        .collect();
    let hosts = hosts_file(node);
    if hosts.exists() {
        mounts.push(format!("--volume={}:/etc/hosts:ro", hosts.display()));
    }
    mounts
}

/// The `podman run` command that runs node `node`'s agent with the lab's
/// arguments `lab_args`, as the manifest says but for `variant`, in the lab
/// set up as `setup`.
pub fn command(
    node: &str,
    role: &str,
    lab_args: &[String],
    variant: &Variant,
    setup: &Setup,
) -> Result<Command> {
    let text = fs::read_to_string(manifest())?;
    let agent = AgentContainer::of_role(&text, role)?;
    let pod = Downward {
        node: node.to_owned(),
        pod: new_name(node),
        node_ip: crate::topology::node_addr(node)
            .context("a node of no cluster")?
            .to_string(),
        namespace: crate::topology::AGENT_NS.to_owned(),
    };
    let env = agent.env(&pod)?;
    // The manifest's bpffs directory, as the container sees it, stays.
    let lab_args: Vec<String> = lab_args
        .iter()
        .filter(|a| !a.starts_with("--bpffs="))
        .cloned()
        .collect();
    let mut command = container::run_command();
    command
        .args(agent.podman_args(node, &pod, variant)?)
        .args(lab_mounts(node, setup))
        .arg(agent.image()?)
        .args(merge_args(agent.args(&env), &lab_args));
    Ok(command)
}

/// The host PID of node `node`'s agent, PID 1 of its running container.
pub fn agent_pid(node: &str) -> Option<u32> {
    let running = container::podman(&[
        "ps",
        "--quiet",
        &format!("--filter=label={LABEL}={node}"),
        "--filter=status=running",
    ])
    .ok()?;
    let id = running.split_whitespace().next()?;
    container::podman(&["inspect", "--format", "{{.State.Pid}}", id])
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|pid| *pid != 0)
}

/// Removes every lab container, running or not.
pub fn remove_all() -> Result<()> {
    // Nothing to remove where podman is not even installed.
    if container::podman(&["--version"]).is_err() {
        return Ok(());
    }
    let ids = container::podman(&["ps", "--all", "--quiet", &format!("--filter=label={LABEL}")])?;
    for id in ids.split_whitespace() {
        container::podman(&["rm", "--force", "--time=10", id])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lab_flags_replace_the_manifests_and_the_others_stay() {
        let manifest = ["run", "--source=kube", "--node=n", "--log-format=json"]
            .map(String::from)
            .to_vec();
        let lab = ["run", "--source=dir:/x", "--node=n"].map(String::from);
        assert_eq!(
            merge_args(manifest, &lab),
            ["run", "--log-format=json", "--source=dir:/x", "--node=n"]
        );
    }

    #[test]
    fn memory_quantities_read_as_podman_writes_them() {
        assert_eq!(podman_quantity("256Mi").unwrap(), "256m");
        assert!(podman_quantity("1G").is_err());
    }
}
