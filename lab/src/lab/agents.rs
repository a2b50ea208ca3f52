//! The lab's agents: the command line each node's agent runs with,
//! starting, stopping and restarting them, and waiting until they are
//! ready.

use std::{fs, path::Path, process::Command, time::Duration};

use anyhow::{Context, Result};

use super::{
    containers, external_tunnel,
    ha::settings as ha,
    keys::key_file,
    liqo_v1_api::settings as liqo_v1_api,
    liqo_v1_peer::settings as liqo_v1_peer,
    options::LabTunnel,
    paths::{agent_binary, bpffs, bpffs_root, log_file, object_dir, pid_file},
    process::{READY_TIMEOUT, alive, running_with, runs_with, spawn_detached, stop_pid},
    scrape::http_get,
    segregation::settings as segregation,
    setup::{LiqoPeer, Setup},
};
use crate::{
    cmd::run,
    topology::{CLUSTERS, Cluster, GW2, METRICS_PORT, node_addr},
};

/// The time between the gateways' lookups of endpoint names, as the
/// agent's `--resolve-interval` takes it.
pub const RESOLVE_INTERVAL: &str = "2s";

/// The option that runs a gateway's XDP guard on its uplink.
pub const GUARD_OPTION: &str = "--guard-dev=wan0";

/// The host ends of the lab's pod veths, which workers steer from.
pub const POD_DEVS: &str = "pod*";

fn role_of(node: &str) -> &'static str {
    if node.ends_with("-gw") || node == GW2 {
        "gateway"
    } else {
        "worker"
    }
}

/// The cluster lab node `node` belongs to.
fn cluster_of(node: &str) -> Option<&'static Cluster> {
    CLUSTERS.iter().copied().find(|c| {
        node.strip_prefix(c.name)
            .is_some_and(|rest| rest.starts_with('-'))
    })
}

/// Starts node `node`'s agent in its netns, as the running lab's setup
/// says, and records its PID. Does not wait for it to be ready.
pub fn start_agent(node: &str) -> Result<u32> {
    start_agent_in(node, &Setup::current()?)
}

/// Starts node `node`'s agent from `binary` (another build, such as a
/// previous release), with the running lab's arguments, and records its
/// PID. Does not wait for it to be ready.
pub fn start_agent_binary(node: &str, binary: &Path) -> Result<u32> {
    let pid = spawn_agent_binary(binary, node, &agent_args(node)?, &log_file(node))?;
    fs::write(pid_file(node), pid.to_string())?;
    Ok(pid)
}

/// Starts node `node`'s agent as `setup` says, and records its PID.
pub(super) fn start_agent_in(node: &str, setup: &Setup) -> Result<u32> {
    let args = args_in(node, setup)?;
    let pid = match setup.containers {
        true => spawn_container(
            node,
            &args,
            &containers::Variant::default(),
            &log_file(node),
            setup,
        )?,
        false => spawn_agent(node, &args, &log_file(node))?,
    };
    fs::write(pid_file(node), pid.to_string())?;
    Ok(pid)
}

/// Starts node `node`'s agent in a container, as `variant` of the
/// manifest says, with `args` from the lab and its output to `log`, in the
/// lab set up as `setup`. Returns the PID of `podman run`, which passes
/// signals on to the agent and exits with it.
pub fn spawn_container(
    node: &str,
    args: &[String],
    variant: &containers::Variant,
    log: &Path,
    setup: &Setup,
) -> Result<u32> {
    let command = containers::command(node, role_of(node), args, variant, setup)?;
    spawn_logged(command, log).context("starting the agent's container")
}

/// The command line the running lab runs node `node`'s agent with.
pub fn agent_args(node: &str) -> Result<Vec<String>> {
    args_in(node, &Setup::current()?)
}

/// The command line node `node`'s agent runs with in a lab set up as
/// `setup`.
fn args_in(node: &str, setup: &Setup) -> Result<Vec<String>> {
    let mut args: Vec<String> = vec![
        "run".into(),
        format!("--node={node}"),
        format!("--role={}", role_of(node)),
        // Metrics on the node's address, as the DaemonSet serves them.
        format!(
            "--node-ip={}",
            node_addr(node).context("a node of no cluster")?
        ),
        format!("--bpffs={}", bpffs(node).display()),
    ];
    if setup.liqo_api_v1 {
        let cluster = cluster_of(node).context("a node of no cluster")?;
        args.extend([
            "--source=kube".into(),
            format!(
                "--kubeconfig={}",
                liqo_v1_api::kubeconfig(cluster).display()
            ),
            format!("--namespace={}", crate::topology::AGENT_NS),
        ]);
    } else if ha::is_ha_node(node, setup) {
        args.extend([
            "--source=kube".into(),
            format!("--kubeconfig={}", ha::kubeconfig().display()),
            format!("--namespace={}", crate::topology::AGENT_NS),
        ]);
        if role_of(node) == "gateway" {
            args.push(format!("--pod-name={}", ha::pod_name(node)));
        }
    } else {
        args.push(format!("--source=dir:{}", object_dir(node).display()));
    }
    if role_of(node) == "gateway" {
        let cluster = cluster_of(node).context("a gateway of no cluster")?;
        // A gateway that serves Liqo v1 masquerades as the DaemonSet for
        // Liqo v1 has it: to Liqo's address, which its peers decide.
        if !serves_liqo_v1(node, setup) {
            let mut addrs = cluster.masquerade_addr().to_string();
            if setup.dual_stack {
                addrs.push_str(&format!(",{}", cluster.masquerade_addr6()));
            }
            args.push(format!("--masquerade-ip={addrs}"));
        }
        // Endpoint names are looked up again often, so a test sees a move.
        args.push(format!("--resolve-interval={RESOLVE_INTERVAL}"));
        if setup.segregation && node == segregation::CLUSTER.gw() {
            args.push(format!("--security-mode={}", segregation::MODE));
        }
    }
    if serves_liqo_v1(node, setup) {
        args.push("--liqo-api=v1".into());
        // Its MSS clamp fits Liqo's tunnel MTU, as manifests/liqo-v1's.
        if role_of(node) == "gateway" {
            args.push(format!("--mtu={}", crate::liqo_v1::MTU));
        }
    }
    args.push(format!("--pod-devs={POD_DEVS}"));
    if let Some(mode) = &setup.past_netfilter {
        args.push(format!("--forward-past-netfilter={mode}"));
    }
    match setup.tunnel {
        LabTunnel::Userspace => {
            args.push(format!("--private-key-file={}", key_file(node).display()));
            if role_of(node) == "gateway" && setup.guard {
                args.push(GUARD_OPTION.into());
            }
        }
        LabTunnel::None => args.extend(["--tunnel=none".into(), "--nat-dev=wan0".into()]),
        _ => args.extend([
            "--tunnel=none".into(),
            format!("--nat-dev={}", external_tunnel::dev(node)),
        ]),
    }
    Ok(args)
}

/// Whether node `node`'s agent serves Liqo v1 (`--liqo-api v1`) in a lab
/// set up as `setup`: every one in the `--liqo-api v1` lab, cluster a's in
/// the Liqo v1 peer lab.
fn serves_liqo_v1(node: &str, setup: &Setup) -> bool {
    let serving_liqo = matches!(setup.liqo, Some(LiqoPeer::V1(_)))
        && cluster_of(node).is_some_and(|c| c.name == liqo_v1_peer::ISTHMUS.name);
    setup.liqo_api_v1 || serving_liqo
}

/// Starts the agent with `args` in netns `ns`, in a session of its own, its
/// output appended to `log`. Returns its PID.
pub fn spawn_agent(ns: &str, args: &[String], log: &Path) -> Result<u32> {
    spawn_agent_binary(&agent_binary(), ns, args, log)
}

/// As [`spawn_agent`], with another build of the agent.
pub fn spawn_agent_binary(binary: &Path, ns: &str, args: &[String], log: &Path) -> Result<u32> {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", ns]).arg(binary).args(args);
    // `ip netns exec` execs the agent, so this PID is the agent's.
    spawn_logged(command, log).context("starting the agent")
}

/// [`spawn_detached`], its output appended to the file `log`.
fn spawn_logged(command: Command, log: &Path) -> Result<u32> {
    let log = fs::OpenOptions::new().create(true).append(true).open(log)?;
    spawn_detached(command, log)
}

/// Starts a gateway agent with a tunnel of its own in netns `ns` (a test's
/// or a bench's): its objects read from `objects`, its key and pins the
/// lab's for `ns`, its metrics on the netns's loopback, `extra` arguments
/// after these. Waits until it is ready; returns its PID.
pub fn start_gateway_in(ns: &str, objects: &Path, extra: &[&str]) -> Result<u32> {
    let own = [
        format!("--node={ns}"),
        format!("--private-key-file={}", key_file(ns).display()),
    ];
    start_gateway(ns, objects, &own, extra)
}

/// Starts a gateway agent without a tunnel of its own in netns `ns` (a
/// test's): its NAT on `nat_dev`, its objects read from `objects`, its
/// pins in the lab's bpffs, `extra` arguments after these. Waits until it
/// is ready; returns its PID.
pub fn start_tunnelless_gateway(
    ns: &str,
    nat_dev: &str,
    objects: &Path,
    extra: &[&str],
) -> Result<u32> {
    let own = [
        "--node=t".to_owned(),
        "--tunnel=none".to_owned(),
        format!("--nat-dev={nat_dev}"),
    ];
    start_gateway(ns, objects, &own, extra)
}

/// Starts a gateway agent in netns `ns` with `own` and `extra` arguments
/// besides its objects, pins and metrics address; waits until it is ready.
fn start_gateway(ns: &str, objects: &Path, own: &[String], extra: &[&str]) -> Result<u32> {
    let mut args: Vec<String> = vec![
        "run".into(),
        "--role=gateway".into(),
        format!("--source=dir:{}", objects.display()),
        format!("--bpffs={}", bpffs(ns).display()),
        format!("--metrics-addr=127.0.0.1:{METRICS_PORT}"),
    ];
    args.extend_from_slice(own);
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let log = log_file(ns);
    let pid = spawn_agent(ns, &args, &log)?;
    wait_ready_in(ns, pid, &log)?;
    Ok(pid)
}

/// The PID of node `node`'s agent, if it runs: in a container, PID 1 of
/// the container, which a signal to kill the agent must reach.
pub fn agent_pid(node: &str) -> Option<u32> {
    if Setup::current().is_ok_and(|setup| setup.containers) {
        return containers::agent_pid(node).filter(|pid| alive(*pid));
    }
    let pid: u32 = fs::read_to_string(pid_file(node))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    is_lab_agent(pid).then_some(pid)
}

/// Stops node `node`'s agent with SIGTERM and waits for it to exit. The
/// dataplane it attached stays in place.
pub fn stop_agent(node: &str) -> Result<()> {
    if let Some(pid) = agent_pid(node) {
        stop_pid(pid)?;
    }
    let _ = fs::remove_file(pid_file(node));
    Ok(())
}

/// Removes what the stopped agent of `node` left behind for a restart in
/// place, with its own `cleanup`: programs, pins, routes and its TUN
/// device. Returns what `cleanup` reported.
pub fn clean_up_agent(node: &str) -> Result<String> {
    let agent = agent_binary();
    run(
        "ip",
        &[
            "netns",
            "exec",
            node,
            &agent.to_string_lossy(),
            "cleanup",
            "--bpffs",
            &bpffs(node).to_string_lossy(),
        ],
    )
}

/// Stops and starts node `node`'s agent, as the running lab's setup says,
/// and waits until it is ready.
pub fn restart_agent(node: &str) -> Result<()> {
    restart_agent_in(node, &Setup::current()?)
}

/// Stops and starts node `node`'s agent as `setup` says, and waits until it
/// is ready.
pub(super) fn restart_agent_in(node: &str, setup: &Setup) -> Result<()> {
    stop_agent(node)?;
    start_agent_in(node, setup)?;
    wait_ready(node)
}

/// Whether `pid` is an agent the lab started: its command line names the
/// agent and the lab's bpffs. Only such processes are ever signalled.
pub(super) fn is_lab_agent(pid: u32) -> bool {
    runs_with(pid, &["isthmus-agent", &bpffs_root().to_string_lossy()])
}

/// Lab agents found by their command line, for when PID files are lost.
pub(super) fn stray_agents() -> Vec<u32> {
    running_with(&["isthmus-agent", &bpffs_root().to_string_lossy()])
}

/// Waits until node `node`'s agent answers `/readyz` with 200. Fails early,
/// with the end of its log, if the agent exits.
pub fn wait_ready(node: &str) -> Result<()> {
    // The recorded PID, not `agent_pid`: just after the fork, the child has
    // not yet exec'd into the agent, so its command line does not say so.
    let pid = fs::read_to_string(pid_file(node))
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .with_context(|| format!("agent of {node} was not started"))?;
    wait_ready_in(node, pid, &log_file(node))
}

/// Waits until the agent `pid` in netns `ns` answers `/readyz` with 200.
pub fn wait_ready_in(ns: &str, pid: u32, log: &Path) -> Result<()> {
    let ready = || {
        anyhow::ensure!(
            alive(pid),
            "agent {pid} in {ns} exited; end of {}:\n{}",
            log.display(),
            log_tail(log)
        );
        Ok(matches!(http_get(ns, "/readyz"), Ok((200, _))).then_some(()))
    };
    let what = format!("agent {pid} in {ns} ready");
    crate::wait::try_poll(READY_TIMEOUT, Duration::from_millis(20), &what, ready)
        .with_context(|| format!("end of its log:\n{}", log_tail(log)))
}

/// The last lines of an agent log.
pub fn log_tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
