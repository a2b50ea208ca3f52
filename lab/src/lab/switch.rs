//! Changing a running lab's setup: each switch changes the recorded
//! [`Setup`] and restarts the agents it concerns, or puts another tunnel
//! between the gateways.

use anyhow::{Result, bail};

use super::{
    agents::{clean_up_agent, restart_agent_in, start_agent_in, stop_agent, wait_ready},
    clear_tunnel, external_tunnel,
    options::LabTunnel,
    paths::pid_file,
    setup::Setup,
};
use crate::topology::CLUSTERS;

/// Starts on every gateway what carries traffic in `tunnel` besides the
/// agents: another WireGuard, or the VXLAN device in clear.
pub(super) fn start_other_tunnel(tunnel: LabTunnel) -> Result<()> {
    if let Some(imp) = tunnel.external() {
        for cluster in CLUSTERS {
            external_tunnel::start_on(imp, cluster)?;
        }
    }
    if tunnel == LabTunnel::Clear {
        CLUSTERS
            .iter()
            .try_for_each(|c| clear_tunnel::start_on(c))?;
    }
    Ok(())
}

/// Turns the gateways' XDP guard on or off, restarting their agents;
/// returns once they are ready. The guard is an option of the agent, off
/// in the DaemonSet and so in the lab: its tests and benchmark turn it on.
pub fn set_guard(on: bool) -> Result<()> {
    let setup = Setup::change(|setup| setup.guard = on)?;
    isthmus_gateways()
        .iter()
        .try_for_each(|gw| restart_agent_in(gw, &setup))
}

/// The gateways the lab started an Isthmus agent on: every one but that
/// of a cluster it runs as Liqo.
fn isthmus_gateways() -> Vec<String> {
    CLUSTERS
        .iter()
        .map(|c| c.gw())
        .filter(|gw| pid_file(gw).exists())
        .collect()
}

/// Puts `tunnel` between the gateways in place of the one running, with
/// the embedded tunnel's XDP guard on or off, restarting the gateways'
/// agents only; returns once they are ready. The tunnel benchmark compares
/// setups round by round on one lab this way, so that a slow minute of
/// the shared machine falls on all of them. Not to or from
/// [`LabTunnel::None`], whose lab routes peers' networks itself.
pub fn set_gateway_tunnel(tunnel: LabTunnel, guard: bool) -> Result<()> {
    if tunnel == LabTunnel::None || Setup::current()?.tunnel == LabTunnel::None {
        bail!("a lab without a tunnel routes peers' networks itself: bring it up anew");
    }
    let gateways: Vec<String> = CLUSTERS.iter().map(|c| c.gw()).collect();
    // From a clean slate, as in a new lab: the embedded tunnel's device
    // and routes outlive its agent, for a restart in place.
    for gw in &gateways {
        stop_agent(gw)?;
        clean_up_agent(gw)?;
    }
    external_tunnel::stop_all()?;
    CLUSTERS.iter().try_for_each(|c| clear_tunnel::stop_on(c))?;
    let setup = Setup::change(|setup| {
        setup.tunnel = tunnel;
        setup.guard = guard;
    })?;
    start_other_tunnel(tunnel)?;
    for gw in &gateways {
        start_agent_in(gw, &setup)?;
    }
    gateways.iter().try_for_each(|gw| wait_ready(gw))
}

/// Sets `--forward-past-netfilter` to `mode` (none: the default), restarting
/// every agent; returns once they are ready.
pub fn set_forward_past_netfilter(mode: Option<&str>) -> Result<()> {
    let setup = Setup::change(|setup| setup.past_netfilter = mode.map(str::to_owned))?;
    CLUSTERS
        .iter()
        .flat_map(|c| c.nodes().map(|(name, _)| name))
        .try_for_each(|node| restart_agent_in(&node, &setup))
}
