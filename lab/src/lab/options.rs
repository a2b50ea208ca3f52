//! What can carry traffic between the lab's gateways.

use serde::{Deserialize, Serialize};

use super::external_tunnel;

/// What carries traffic between the lab's gateways.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LabTunnel {
    /// The agents' embedded WireGuard, over `ist-wan`.
    #[default]
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
