//! A peer's networks of one address family, and the names of the fields
//! each is read from in every layout Liqo writes.

use ipnet::Ipv4Net;
use isthmus_common::nat::PrefixRewrite;

use super::Remaps;
use crate::model::{cidr::Cidr, object::Layout};

/// A real network and, when the other side remapped it, its remapped form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapped<N = Ipv4Net> {
    /// The real network.
    pub real: N,
    /// The network it is remapped to, if any.
    pub nat: Option<N>,
}

impl<N: Cidr> Mapped<N> {
    /// The network as it appears after remapping.
    pub fn seen(&self) -> N {
        self.nat.unwrap_or(self.real)
    }

    /// Real → remapped, or the identity when not remapped: the kernel
    /// still needs the real network, to tell our addresses from others'.
    pub(super) fn outbound(&self) -> PrefixRewrite<N::Wire> {
        rewrite(self.real, self.seen())
    }

    /// Remapped → real, or the identity when not remapped.
    pub(super) fn inbound(&self) -> PrefixRewrite<N::Wire> {
        rewrite(self.seen(), self.real)
    }
}

impl<N: Cidr> Mapped<N> {
    /// The real address behind `addr`, an address of the remapped network.
    pub fn real_of(&self, addr: N::Addr) -> Option<N::Addr> {
        let wire = N::Wire::from(addr);
        self.seen()
            .holds(addr)
            .then(|| self.inbound().apply(wire).into())
    }

    /// The address of the remapped network behind `addr`, a real one.
    pub fn seen_of(&self, addr: N::Addr) -> Option<N::Addr> {
        let wire = N::Wire::from(addr);
        self.real
            .holds(addr)
            .then(|| self.outbound().apply(wire).into())
    }
}

fn rewrite<N: Cidr>(from: N, to: N) -> PrefixRewrite<N::Wire> {
    PrefixRewrite::new(from.wire(), to.wire(), from.prefix())
}

/// The Liqo field names of one network pair.
pub(super) struct Fields {
    pub(super) real: &'static str,
    pub(super) nat: &'static str,
}

const LOCAL_POD: Fields = Fields {
    real: "localPodCIDR",
    nat: "localNATPodCIDR",
};
const LOCAL_EXTERNAL: Fields = Fields {
    real: "localExternalCIDR",
    nat: "localNATExternalCIDR",
};
const REMOTE_POD: Fields = Fields {
    real: "remotePodCIDR",
    nat: "remoteNATPodCIDR",
};
const REMOTE_EXTERNAL: Fields = Fields {
    real: "remoteExternalCIDR",
    nat: "remoteNATExternalCIDR",
};

/// The same networks in a Liqo v1 `Configuration`, where we remap only
/// the peer's: ours have no remapped form there.
const V1_LOCAL_POD: Fields = Fields {
    real: "spec.local.cidr.pod",
    nat: "spec.local.cidr.pod",
};
const V1_LOCAL_EXTERNAL: Fields = Fields {
    real: "spec.local.cidr.external",
    nat: "spec.local.cidr.external",
};
const V1_REMOTE_POD: Fields = Fields {
    real: "spec.remote.cidr.pod",
    nat: "status.remote.cidr.pod",
};
const V1_REMOTE_EXTERNAL: Fields = Fields {
    real: "spec.remote.cidr.external",
    nat: "status.remote.cidr.external",
};

/// The same networks of a TunnelEndpoint, IPv6: in `spec.ipv6`, by the
/// same names (docs/design.md#dual-stack).
const LOCAL_POD_V6: Fields = Fields {
    real: "ipv6.localPodCIDR",
    nat: "ipv6.localNATPodCIDR",
};
const LOCAL_EXTERNAL_V6: Fields = Fields {
    real: "ipv6.localExternalCIDR",
    nat: "ipv6.localNATExternalCIDR",
};
const REMOTE_POD_V6: Fields = Fields {
    real: "ipv6.remotePodCIDR",
    nat: "ipv6.remoteNATPodCIDR",
};
const REMOTE_EXTERNAL_V6: Fields = Fields {
    real: "ipv6.remoteExternalCIDR",
    nat: "ipv6.remoteNATExternalCIDR",
};

/// The fields of one layout and family: our PodCIDR, our ExternalCIDR, the
/// peer's PodCIDR, the peer's ExternalCIDR. A Liqo v1 field lists both
/// families.
pub(super) struct LayoutFields(pub(super) [&'static Fields; 4]);

impl LayoutFields {
    pub(super) const fn of<N: Cidr>(layout: Layout) -> Self {
        match (layout, N::IPV6) {
            (Layout::Spec | Layout::Legacy, false) => {
                Self([&LOCAL_POD, &LOCAL_EXTERNAL, &REMOTE_POD, &REMOTE_EXTERNAL])
            }
            (Layout::Spec | Layout::Legacy, true) => Self([
                &LOCAL_POD_V6,
                &LOCAL_EXTERNAL_V6,
                &REMOTE_POD_V6,
                &REMOTE_EXTERNAL_V6,
            ]),
            (Layout::LiqoV1, _) => Self([
                &V1_LOCAL_POD,
                &V1_LOCAL_EXTERNAL,
                &V1_REMOTE_POD,
                &V1_REMOTE_EXTERNAL,
            ]),
        }
    }
}

/// A peer's networks of one family: ours and the peer's, each with its
/// remapped form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Networks<N = Ipv4Net> {
    /// Our PodCIDR, and how the peer sees it.
    pub local_pod: Mapped<N>,
    /// Our ExternalCIDR, and how the peer sees it.
    pub local_external: Mapped<N>,
    /// The peer's PodCIDR, and how we see it.
    pub remote_pod: Mapped<N>,
    /// The peer's ExternalCIDR, and how we see it.
    pub remote_external: Mapped<N>,
}

impl<N: Cidr> Networks<N> {
    /// The networks we see the peer under, with the field each comes from
    /// in `layout`.
    pub fn views(&self, layout: Layout) -> [(&'static str, N); 2] {
        let [_, _, pod, external] = LayoutFields::of::<N>(layout).0;
        [
            (seen_field(&self.remote_pod, pod), self.remote_pod.seen()),
            (
                seen_field(&self.remote_external, external),
                self.remote_external.seen(),
            ),
        ]
    }

    /// The networks whose addresses the peer's packets carry inside the
    /// tunnel, with their fields: our views of them where the peer
    /// remaps its own (Liqo v0.10), the real ones where we do (Liqo v1).
    pub fn tunnel_networks(&self, layout: Layout) -> [(&'static str, N); 2] {
        let [_, _, pod, external] = LayoutFields::of::<N>(layout).0;
        match layout.remaps() {
            Remaps::Ours => self.views(layout),
            Remaps::Theirs => [
                (pod.real, self.remote_pod.real),
                (external.real, self.remote_external.real),
            ],
        }
    }

    /// Our networks as the peer sees them, each with its field.
    pub fn local_views(&self, layout: Layout) -> [(&'static str, N); 2] {
        let [pod, external, _, _] = LayoutFields::of::<N>(layout).0;
        [
            (seen_field(&self.local_pod, pod), self.local_pod.seen()),
            (
                seen_field(&self.local_external, external),
                self.local_external.seen(),
            ),
        ]
    }

    /// Our real networks, each with its field: where the ingress rules
    /// lead the peer's packets.
    pub fn local_networks(&self, layout: Layout) -> [(&'static str, N); 2] {
        let [pod, external, _, _] = LayoutFields::of::<N>(layout).0;
        [
            (pod.real, self.local_pod.real),
            (external.real, self.local_external.real),
        ]
    }

    /// Every network, each with its field: the real ones and those
    /// remapped.
    pub fn all(&self, layout: Layout) -> Vec<(&'static str, N)> {
        let fields = LayoutFields::of::<N>(layout).0;
        [
            &self.local_pod,
            &self.local_external,
            &self.remote_pod,
            &self.remote_external,
        ]
        .into_iter()
        .zip(fields)
        .flat_map(|(mapped, fields)| {
            [(fields.real, Some(mapped.real)), (fields.nat, mapped.nat)]
                .into_iter()
                .filter_map(|(field, net)| Some((field, net?)))
        })
        .collect()
    }
}

fn seen_field<N: Cidr>(mapped: &Mapped<N>, fields: &Fields) -> &'static str {
    if mapped.nat.is_some() {
        fields.nat
    } else {
        fields.real
    }
}
