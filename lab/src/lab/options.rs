//! The lab's setups that its agents follow: which tunnel carries traffic
//! between the gateways, and the agents' options a test or a benchmark
//! turns on or off. Each is a file in the lab's state, read when an agent
//! starts; [`super::switch`] changes them in a running lab.

use std::fs;

use anyhow::Result;

use super::{external_tunnel, paths::state};

/// What carries traffic between the lab's gateways.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LabTunnel {
    /// The agents' embedded WireGuard, over `ist-wan`.
    Userspace,
    /// None: gateways route peers' networks over `wan0` in clear, and NAT there.
    None,
    /// Debian bookworm's wireguard-go, configured with `wg`, carries the
    /// traffic; the agents only NAT, on its device. Liqo v0.10's way.
    WireguardGo,
    /// wireguard-go from bookworm-backports in its place.
    WireguardGoCurrent,
    /// gotatun-cli in its place.
    Gotatun,
    /// boringtun-cli in its place.
    BoringtunCli,
    /// A kernel VXLAN tunnel in clear in its place: what the path costs
    /// without encryption.
    Clear,
}

impl LabTunnel {
    /// The other WireGuard that carries the traffic, if one does.
    pub fn external(self) -> Option<external_tunnel::Implementation> {
        use external_tunnel::Implementation as I;
        match self {
            LabTunnel::Userspace | LabTunnel::None | LabTunnel::Clear => None,
            LabTunnel::WireguardGo => Some(I::WireguardGoBookworm),
            LabTunnel::WireguardGoCurrent => Some(I::WireguardGoCurrent),
            LabTunnel::Gotatun => Some(I::Gotatun),
            LabTunnel::BoringtunCli => Some(I::BoringtunCli),
        }
    }

    /// The lab setup in which `imp` carries the traffic.
    pub fn running(imp: external_tunnel::Implementation) -> Self {
        use clap::ValueEnum;
        *Self::value_variants()
            .iter()
            .find(|t| t.external() == Some(imp))
            .expect("every implementation has a lab setup")
    }

    pub(super) fn as_str(self) -> String {
        use clap::ValueEnum;
        self.to_possible_value()
            .expect("no variant is skipped")
            .get_name()
            .to_owned()
    }
}

/// The tunnel mode the lab was brought up with.
pub fn tunnel_mode() -> LabTunnel {
    use clap::ValueEnum;
    fs::read_to_string(state("tunnel"))
        .ok()
        .and_then(|s| LabTunnel::from_str(&s, false).ok())
        .unwrap_or(LabTunnel::Userspace)
}

/// The lab state's marker file that turns the gateways' XDP guard on.
pub(super) const GUARD: &str = "guard";

/// The lab state's file that holds `--forward-past-netfilter`'s value when
/// a test sets one; without it, the agents run the DaemonSet's default.
pub(super) const PAST_NETFILTER: &str = "past-netfilter";

/// Whether the embedded tunnel's gateways run the XDP guard on their
/// uplinks. The lab starts them as the DaemonSet ships them, without it;
/// [`super::set_guard`] turns it on.
pub fn guard_is_on() -> bool {
    state(GUARD).exists()
}

/// The `--forward-past-netfilter` value a test set (`on`, `off`, `auto`),
/// or none while the agents run the DaemonSet's default, `auto`.
pub fn past_netfilter_mode() -> Option<String> {
    fs::read_to_string(state(PAST_NETFILTER)).ok()
}

/// Sets `--forward-past-netfilter` to `mode` (none: the default) for the
/// agents started from now on.
pub fn write_past_netfilter_mode(mode: Option<&str>) -> Result<()> {
    match mode {
        Some(mode) => fs::write(state(PAST_NETFILTER), mode)?,
        None => {
            let _ = fs::remove_file(state(PAST_NETFILTER));
        }
    }
    Ok(())
}

/// Writes the marker file that turns an option of the agents on, or
/// removes it; the agents started next follow it.
pub(super) fn set_marker(marker: &str, on: bool) -> Result<()> {
    match on {
        true => fs::write(state(marker), "")?,
        false => {
            let _ = fs::remove_file(state(marker));
        }
    }
    Ok(())
}
