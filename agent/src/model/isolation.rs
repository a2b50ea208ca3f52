//! The security mode of a peering (Liqo v0.10's names): whether a peer
//! reaches everything in our Pod and External networks, or only what was
//! offloaded from it or exported to it (`isthmus_common::isolation`).

use std::{fmt, str::FromStr};

/// The annotation of a TunnelEndpoint that overrides the agent's mode for
/// that peer.
pub const ANNOTATION: &str = "isthmus.io/security-mode";

/// How a peer's connections into this cluster are treated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SecurityMode {
    /// Everything in our Pod and External networks (Liqo's default).
    #[default]
    FullPodToPod,
    /// Only pods offloaded from the peer, endpoints exported to it, its
    /// NatMapping endpoints, and replies to our own connections.
    IntraClusterTrafficSegregation,
}

impl SecurityMode {
    /// Every mode, as Liqo names them.
    pub const ALL: [SecurityMode; 2] = [Self::FullPodToPod, Self::IntraClusterTrafficSegregation];

    /// Liqo's name of the mode.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::FullPodToPod => "FullPodToPod",
            Self::IntraClusterTrafficSegregation => "IntraClusterTrafficSegregation",
        }
    }

    /// Whether the kernel holds the peer to the allowed table.
    pub const fn segregates(self) -> bool {
        matches!(self, Self::IntraClusterTrafficSegregation)
    }
}

impl fmt::Display for SecurityMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no security mode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a security mode (FullPodToPod or IntraClusterTrafficSegregation)")]
pub struct UnknownMode(pub String);

impl FromStr for SecurityMode {
    type Err = UnknownMode;

    fn from_str(s: &str) -> Result<Self, UnknownMode> {
        Self::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| UnknownMode(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_by_liqos_names_only() {
        for mode in SecurityMode::ALL {
            assert_eq!(mode.as_str().parse(), Ok(mode));
        }
        assert!(SecurityMode::IntraClusterTrafficSegregation.segregates());
        assert!(!SecurityMode::default().segregates());
        let e = "intraclustertrafficsegregation".parse::<SecurityMode>();
        assert_eq!(
            e.unwrap_err().to_string(),
            "\"intraclustertrafficsegregation\" is not a security mode (FullPodToPod or IntraClusterTrafficSegregation)"
        );
    }
}
