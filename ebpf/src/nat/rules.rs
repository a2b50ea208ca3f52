//! The stateless rules, each a step of a [`Rewrite`]: a prefix moved into
//! or out of the peer's view, a NatMapping's externalIP or endpoint.

use isthmus_common::{
    counters::Kind,
    nat::{NO_MAPPINGS, PeerNat, find_rule},
    wire::Address,
};

use super::Rewrite;
use crate::family::Family;

/// `rewrite`'s address as the peer sees it (unchanged when it is none of
/// ours).
#[inline(always)]
pub(super) fn to_peer_view<A: Address>(peer: &PeerNat<A>, rewrite: Rewrite<A>) -> Rewrite<A> {
    match find_rule(&peer.egress, rewrite.addr) {
        Some(rule) => {
            let remapped = rule.apply(rewrite.addr);
            rewrite.then(remapped, Kind::Prefix)
        }
        None => rewrite,
    }
}

/// An address in the peer's view of our networks, as it really is.
#[inline(always)]
pub(super) fn from_peer_view<A: Address>(peer: &PeerNat<A>, addr: A) -> Rewrite<A> {
    let rewrite = address_only(addr);
    match find_rule(&peer.ingress, addr) {
        Some(rule) => rewrite.then(rule.apply(addr), Kind::Prefix),
        None => rewrite,
    }
}

/// The externalIP under which the peer knows endpoint `addr`, if any: a
/// peer with [`NO_MAPPINGS`] has none, and costs no lookup.
#[inline(always)]
pub(super) fn external_of<F: Family>(peer: &PeerNat<F::Addr>, addr: F::Addr) -> Rewrite<F::Addr> {
    let rewrite = address_only(addr);
    if peer.flags & NO_MAPPINGS != 0 {
        return rewrite;
    }
    match F::external_of(peer.peer_id, addr) {
        Some(external) => rewrite.then(external, Kind::NatMapping),
        None => rewrite,
    }
}

/// The endpoint behind `rewrite`'s address if it is an externalIP (never,
/// for a peer with [`NO_MAPPINGS`]).
#[inline(always)]
pub(super) fn endpoint_of<F: Family>(
    peer: &PeerNat<F::Addr>,
    rewrite: Rewrite<F::Addr>,
) -> Rewrite<F::Addr> {
    if peer.flags & NO_MAPPINGS != 0 {
        return rewrite;
    }
    match F::endpoint_of(peer.peer_id, rewrite.addr) {
        Some(endpoint) => rewrite.then(endpoint, Kind::NatMapping),
        None => rewrite,
    }
}

/// A rewrite of the address alone, by no rule yet.
#[inline(always)]
pub(super) fn address_only<A>(addr: A) -> Rewrite<A> {
    Rewrite {
        addr,
        port: None,
        kinds: 0,
    }
}

impl<A: Address> Rewrite<A> {
    /// This rewrite followed by a rule of `kind` that gives `addr`; the
    /// kind counts only if the address changes.
    #[inline(always)]
    pub(super) fn then(self, addr: A, kind: Kind) -> Self {
        let kinds = if addr != self.addr {
            self.kinds | kind.bit()
        } else {
            self.kinds
        };
        Self {
            addr,
            kinds,
            ..self
        }
    }
}
