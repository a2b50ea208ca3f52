//! How the lab is set up: one value, built from `lab up`'s flags and
//! changed only by the switches of a running lab. Every module that needs
//! to know takes it as an argument. It is recorded in one file of the
//! lab's state, because a test, a benchmark or a later `cargo xtask`
//! runs in another process than the one that brought the lab up.

use std::{fmt, fs};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::{liqo_v1_peer::settings::Side, options::LabTunnel, paths::state};
use crate::topology::{CLUSTERS, Cluster};

/// The lab's setup.
#[allow(
    clippy::struct_excessive_bools,
    reason = "each is a flag of `lab up`, independent of the others"
)]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Setup {
    /// What carries traffic between the gateways.
    pub tunnel: LabTunnel,
    /// Every agent runs from the image under podman, as the DaemonSets
    /// run it.
    pub containers: bool,
    /// A cluster run as Liqo runs one, if any.
    pub liqo: Option<LiqoPeer>,
    /// Cluster a has a second gateway, and its agents elect the active one.
    pub ha: bool,
    /// b's gateway segregates its peers.
    pub segregation: bool,
    /// The embedded tunnel's gateways run the XDP guard on their uplinks.
    pub guard: bool,
    /// The agents' `--forward-past-netfilter`, when a test sets one; none
    /// runs the DaemonSet's default.
    pub past_netfilter: Option<String>,
    /// Every cluster serves Liqo v1's objects from an API server stand-in
    /// of its own (`--liqo-api v1`).
    #[serde(default)]
    pub liqo_api_v1: bool,
    /// Every network also has its IPv6 network, and the a–b tunnel runs
    /// over the WAN's IPv6 addresses (docs/design.md#dual-stack).
    #[serde(default)]
    pub dual_stack: bool,
}

/// A cluster the lab runs as Liqo runs one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum LiqoPeer {
    /// This cluster, as Liqo v0.10; the others run Isthmus.
    V0_10(&'static Cluster),
    /// Cluster b, as Liqo v1.2, served by a on this side of the tunnel.
    V1(Side),
}

impl LiqoPeer {
    /// The cluster run as Liqo.
    pub fn cluster(self) -> &'static Cluster {
        match self {
            LiqoPeer::V0_10(cluster) => cluster,
            LiqoPeer::V1(_) => super::liqo_v1_peer::LIQO,
        }
    }
}

impl fmt::Display for LiqoPeer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LiqoPeer::V0_10(cluster) => write!(f, "v0.10:{}", cluster.name),
            LiqoPeer::V1(side) => write!(f, "v1:{}", side.as_str()),
        }
    }
}

impl From<LiqoPeer> for String {
    fn from(peer: LiqoPeer) -> Self {
        peer.to_string()
    }
}

impl TryFrom<String> for LiqoPeer {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let cluster = |name: &str| CLUSTERS.iter().copied().find(|c| c.name == name);
        match text.split_once(':') {
            Some(("v0.10", name)) => cluster(name).map(LiqoPeer::V0_10),
            Some(("v1", side)) => Side::parse(side).map(LiqoPeer::V1),
            _ => None,
        }
        .ok_or_else(|| format!("{text:?} names no Liqo peer the lab runs"))
    }
}

/// The file the setup is recorded in.
const FILE: &str = "setup.json";

impl Setup {
    /// The default lab, with `tunnel` between its gateways.
    pub fn with_tunnel(tunnel: LabTunnel) -> Self {
        Self {
            tunnel,
            ..Self::default()
        }
    }

    /// The setup of the lab that is up.
    pub fn current() -> Result<Self> {
        let path = state(FILE);
        let text = fs::read_to_string(&path).with_context(|| {
            format!(
                "reading the lab's setup from {}: is the lab up? (`cargo xtask lab up`)",
                path.display()
            )
        })?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// Records this as the lab's setup.
    pub(super) fn record(&self) -> Result<()> {
        let path = state(FILE);
        fs::write(&path, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Changes the running lab's recorded setup; returns the new one. The
    /// agents started from now on follow it; the lab's switches
    /// (`set_guard`, `ha::set`, …) also restart the agents concerned.
    pub fn change(edit: impl FnOnce(&mut Setup)) -> Result<Self> {
        let mut setup = Self::current()?;
        edit(&mut setup);
        setup.record()?;
        Ok(setup)
    }

    /// Refuses a combination the lab cannot build, naming both flags of
    /// `cargo xtask lab up` that ask for it.
    pub fn check(&self) -> Result<()> {
        if self.ha && self.tunnel != LabTunnel::Userspace {
            bail!(
                "`--tunnel {}` and `--ha` cannot be combined: the second gateway runs the embedded tunnel, which follows the endpoint address from one gateway to the other",
                self.tunnel.as_str()
            );
        }
        if self.liqo_api_v1 {
            let peer = self.liqo.is_some().then_some("a Liqo peer");
            if let Some(other) = peer.or_else(|| self.variant_beside("--tunnel")) {
                bail!(
                    "`--liqo-api v1` and {other} cannot be combined: every cluster then runs Isthmus's embedded tunnel as processes, one gateway each, none segregating"
                );
            }
        }
        if self.dual_stack {
            let tunnel_flag = format!("--tunnel {}", self.tunnel.as_str());
            let other_tunnel = !matches!(self.tunnel, LabTunnel::Userspace | LabTunnel::None);
            let refused = [
                (self.liqo.is_some(), "a Liqo peer"),
                (other_tunnel, tunnel_flag.as_str()),
                (self.containers, "--containers"),
                (self.ha, "--ha"),
                (self.segregation, "--segregation"),
            ];
            if let Some((_, other)) = refused.iter().find(|(on, _)| *on) {
                bail!(
                    "`--dual-stack` and {other} cannot be combined: the dual-stack lab runs Isthmus's embedded tunnel, or none, as processes, one gateway per cluster, none segregating"
                );
            }
        }
        let Some(liqo) = self.liqo else {
            return Ok(());
        };
        let liqo_flag = match liqo {
            LiqoPeer::V0_10(cluster) => format!("--liqo-v0-10-peer {}", cluster.name),
            LiqoPeer::V1(_) => format!("--liqo-v1-peer {}", liqo.cluster().name),
        };
        let tunnel_flag = format!("--tunnel {}", self.tunnel.as_str());
        if let Some(other) = self.variant_beside(&tunnel_flag) {
            bail!(
                "`{liqo_flag}` and `{other}` cannot be combined: a cluster run as Liqo brings its own tunnel, and the lab runs it beside agents that are processes, one gateway per cluster, none segregating"
            );
        }
        Ok(())
    }

    /// The first variant set that runs beside every cluster's own agents
    /// (`tunnel_flag` naming another tunnel), which a lab of Liqo peers or
    /// of Liqo v1's API cannot take.
    fn variant_beside<'a>(&self, tunnel_flag: &'a str) -> Option<&'a str> {
        [
            (self.tunnel != LabTunnel::default(), tunnel_flag),
            (self.containers, "--containers"),
            (self.ha, "--ha"),
            (self.segregation, "--segregation"),
        ]
        .into_iter()
        .find_map(|(on, flag)| on.then_some(flag))
    }

    /// Whether `cluster`'s agents run Isthmus, not Liqo.
    pub fn runs_isthmus(&self, cluster: &Cluster) -> bool {
        self.liqo.is_none_or(|l| l.cluster().name != cluster.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::B;

    #[test]
    fn a_setup_reads_back_as_it_was_written() {
        let setup = Setup {
            tunnel: LabTunnel::WireguardGo,
            liqo: Some(LiqoPeer::V1(Side::Server)),
            past_netfilter: Some("off".into()),
            ..Setup::default()
        };
        let text = serde_json::to_string(&setup).unwrap();
        assert_eq!(serde_json::from_str::<Setup>(&text).unwrap(), setup);
        let v0_10 = serde_json::to_string(&Some(LiqoPeer::V0_10(&B))).unwrap();
        assert_eq!(v0_10, "\"v0.10:b\"");
        assert!(serde_json::from_str::<LiqoPeer>("\"v0.10:q\"").is_err());
    }

    #[test]
    fn a_combination_the_lab_cannot_build_names_both_flags() {
        let refused = |setup: Setup| setup.check().unwrap_err().to_string();
        let error = refused(Setup {
            liqo: Some(LiqoPeer::V1(Side::Client)),
            ha: true,
            ..Setup::default()
        });
        assert!(error.contains("`--liqo-v1-peer b` and `--ha`"), "{error}");
        let error = refused(Setup {
            tunnel: LabTunnel::Gotatun,
            liqo: Some(LiqoPeer::V0_10(&B)),
            ..Setup::default()
        });
        assert!(
            error.contains("`--liqo-v0-10-peer b` and `--tunnel gotatun`"),
            "{error}"
        );
        let error = refused(Setup {
            tunnel: LabTunnel::WireguardGo,
            ha: true,
            ..Setup::default()
        });
        assert!(
            error.contains("`--tunnel wireguard-go` and `--ha`"),
            "{error}"
        );
        let error = refused(Setup {
            liqo_api_v1: true,
            ha: true,
            ..Setup::default()
        });
        assert!(error.contains("`--liqo-api v1` and --ha"), "{error}");
        let error = refused(Setup {
            dual_stack: true,
            tunnel: LabTunnel::WireguardGo,
            ..Setup::default()
        });
        assert!(
            error.contains("`--dual-stack` and --tunnel wireguard-go"),
            "{error}"
        );
        Setup {
            dual_stack: true,
            tunnel: LabTunnel::None,
            ..Setup::default()
        }
        .check()
        .unwrap();
        let fine = Setup {
            containers: true,
            ha: true,
            segregation: true,
            ..Setup::default()
        };
        fine.check().unwrap();
    }
}
