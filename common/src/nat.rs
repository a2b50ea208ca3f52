//! Stateless prefix remapping (docs/design.md#prefix-remapping).
//!
//! Addresses are [`Be32`]s or [`Be128`]s: the bytes as they sit in the
//! packet. Masking and or-ing are byte-wise, so the maths needs no byte
//! swaps on either side, and is the same for both families ([`Address`]).

use crate::wire::{Address, Be32, Be128};

/// One prefix swap: addresses in `from/mask` move to `to/mask`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixRewrite<A = Be32> {
    /// Network that matches, already masked.
    pub from: A,
    /// Network that replaces it, already masked.
    pub to: A,
    /// Mask shared by both networks.
    pub mask: A,
    /// Non-zero when the rule applies; an empty table slot is zero.
    pub active: u32,
}

assert_layout!(PrefixRewrite, size = 16, align = 4);
assert_layout!(PrefixRewrite<Be128>, size = 52, align = 4);

impl PrefixRewrite {
    /// A rule that moves the IPv4 network `from/prefix_len` to
    /// `to/prefix_len`.
    pub fn ipv4(from: [u8; 4], to: [u8; 4], prefix_len: u8) -> Self {
        Self::new(Be32::from_bytes(from), Be32::from_bytes(to), prefix_len)
    }
}

impl<A: Address> PrefixRewrite<A> {
    /// A rule that moves `from/prefix_len` to `to/prefix_len`.
    pub fn new(from: A, to: A, prefix_len: u8) -> Self {
        let mask = A::mask(prefix_len);
        Self {
            from: from.masked(mask),
            to: to.masked(mask),
            mask,
            active: 1,
        }
    }

    /// Whether `addr` lies in the network this rule moves.
    #[inline(always)]
    pub fn matches(&self, addr: A) -> bool {
        self.active != 0 && addr.masked(self.mask) == self.from
    }

    /// `addr` moved into the target network, keeping its host bits.
    #[inline(always)]
    pub fn apply(&self, addr: A) -> A {
        addr.remap(self.to, self.mask)
    }

    /// The rule that moves the target network back.
    #[inline(always)]
    #[must_use]
    pub fn inverse(&self) -> Self {
        Self {
            from: self.to,
            to: self.from,
            ..*self
        }
    }
}

/// [`PeerNat::flags`]: the peer's NAT runs Liqo v1's way
/// (docs/design.md#liqo-v1-peers). We remap the peer's addresses, by
/// [`PeerNat::theirs`], and the peer remaps ours: inside the tunnel both
/// addresses are real.
pub const REMAPS_PEER: u32 = 1 << 1;

/// [`PeerNat::flags`]: the peer has no entry of this family in the
/// NatMapping tables (its NatMappings' and Liqo v1 `IP`s'), whose lookups
/// its packets then skip. Without it, they look, as for any peer: the
/// agent sets it, and clears it before writing the peer's first entry.
pub const NO_MAPPINGS: u32 = 1 << 2;

/// The translation a gateway applies for one peer, found by LPM on the
/// peer's networks as we see them (its `remoteNAT*CIDR`, or `remote*CIDR`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerNat<A = Be32> {
    /// Agent-assigned index of the peer, stable while the peer exists.
    pub peer_id: u32,
    /// How the peer is treated: [`crate::isolation::SEGREGATED`],
    /// [`REMAPS_PEER`], [`NO_MAPPINGS`], or none.
    pub flags: u32,
    /// Source rewrites towards the peer: PodCIDR, then ExternalCIDR.
    pub egress: [PrefixRewrite<A>; 2],
    /// Destination rewrites from the peer: PodCIDR, then ExternalCIDR.
    pub ingress: [PrefixRewrite<A>; 2],
    /// With [`REMAPS_PEER`], the peer's networks from our view back to
    /// the real ones, PodCIDR then ExternalCIDR: a destination's rewrite
    /// towards the peer; their inverses rewrite a source from the peer.
    /// Inactive otherwise.
    pub theirs: [PrefixRewrite<A>; 2],
    /// Which object the entry was written for: a fingerprint of its origin
    /// and name. Only the agent reads it: a restarted agent meeting two
    /// peers with the same networks keeps the one its predecessor accepted.
    pub owner: u64,
}

assert_layout!(PeerNat, size = 112, align = 8);
assert_layout!(PeerNat<Be128>, size = 328, align = 8);

/// Key of the peer table: a network, as its prefix length and its masked
/// address. A hash lookup per prefix length in use replaces a
/// trie walk, which costs a cache miss per node on a busy path.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerKey<A = Be32> {
    /// Prefix length, 0 to 32 (128 for IPv6).
    pub prefix_len: u32,
    /// The network address, masked to `prefix_len`.
    pub addr: A,
}

assert_layout!(PeerKey, size = 8, align = 4);
assert_layout!(PeerKey<Be128>, size = 20, align = 4);

impl<A: Address> PeerKey<A> {
    /// The key of the `prefix_len` network holding `addr`.
    #[inline(always)]
    pub fn of(addr: A, prefix_len: u8) -> Self {
        Self {
            prefix_len: u32::from(prefix_len),
            addr: addr.masked(A::mask(prefix_len)),
        }
    }
}

/// Key of the NatMapping tables: an address in one peer cluster's
/// mappings. The peer ID partitions one hash into per-cluster tables, so a
/// lookup stays one hash probe however many clusters hold mappings.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MappingKey<A = Be32> {
    /// [`PeerNat::peer_id`] of the cluster the mapping is for.
    pub peer_id: u32,
    /// An externalIP in the forward table, an endpointIP in the reverse one.
    pub addr: A,
}

assert_layout!(MappingKey, size = 8, align = 4);
assert_layout!(MappingKey<Be128>, size = 20, align = 4);

/// The address Liqo's conncheck answers on, on every gateway (169.254.0.1):
/// each NatMapping's `169.254.0.1` entry leads a peer there.
pub const CONNCHECK_ADDR: Be32 = Be32::from_bytes([169, 254, 0, 1]);
/// The conncheck's UDP port, the only one a peer reaches that address on.
pub const CONNCHECK_PORT: u16 = 12345;

/// Most prefix lengths a table can hold: /0 to /32. An IPv6 table holds as
/// many of its 129, which bounds the lookups a packet costs.
pub const PREFIX_LENS: usize = 33;

/// The prefix lengths present in the peer table, longest first: a lookup
/// tries each in turn, which is longest-prefix match.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixLens {
    /// How many of `lens` are in use.
    pub count: u32,
    /// The lengths, longest first.
    pub lens: [u32; PREFIX_LENS],
}

assert_layout!(PrefixLens, size = 136, align = 4);

impl Default for PrefixLens {
    fn default() -> Self {
        Self {
            count: 0,
            lens: [0; PREFIX_LENS],
        }
    }
}

/// Finds the first rule of `rules` that matches `addr`.
#[inline(always)]
pub fn find_rule<A: Address>(rules: &[PrefixRewrite<A>; 2], addr: A) -> Option<&PrefixRewrite<A>> {
    if rules[0].matches(addr) {
        Some(&rules[0])
    } else if rules[1].matches(addr) {
        Some(&rules[1])
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(a: u8, b: u8, c: u8, d: u8) -> Be32 {
        Be32::from_bytes([a, b, c, d])
    }

    #[test]
    fn remap_keeps_host_bits() {
        // docs/design.md#expected-reachability: a-pod1 10.244.0.5 is seen by b as 10.0.40.5.
        let r = PrefixRewrite::ipv4([10, 244, 0, 0], [10, 0, 40, 0], 24);
        assert!(r.matches(w(10, 244, 0, 5)));
        assert_eq!(r.apply(w(10, 244, 0, 5)), w(10, 0, 40, 5));
        assert_eq!(r.apply(w(10, 244, 0, 133)), w(10, 0, 40, 133));
    }

    #[test]
    fn remap_with_unaligned_prefixes() {
        let r = PrefixRewrite::ipv4([10, 200, 0, 0], [10, 71, 0, 0], 16);
        assert_eq!(r.apply(w(10, 200, 254, 7)), w(10, 71, 254, 7));
        let r = PrefixRewrite::ipv4([172, 16, 0, 0], [192, 168, 64, 0], 19);
        assert!(r.matches(w(172, 16, 31, 255)));
        assert!(!r.matches(w(172, 16, 32, 0)));
        assert_eq!(r.apply(w(172, 16, 31, 255)), w(192, 168, 95, 255));
    }

    #[test]
    fn remap_edges() {
        let all = PrefixRewrite::ipv4([0, 0, 0, 0], [0, 0, 0, 0], 0);
        assert!(all.matches(w(1, 2, 3, 4)));
        assert_eq!(all.apply(w(1, 2, 3, 4)), w(1, 2, 3, 4));
        let host = PrefixRewrite::ipv4([10, 0, 0, 1], [10, 9, 9, 9], 32);
        assert!(host.matches(w(10, 0, 0, 1)));
        assert!(!host.matches(w(10, 0, 0, 2)));
        assert_eq!(host.apply(w(10, 0, 0, 1)), w(10, 9, 9, 9));
    }

    #[test]
    fn remap_is_a_bijection_on_the_prefix() {
        let there = PrefixRewrite::ipv4([10, 244, 0, 0], [10, 0, 40, 0], 24);
        let back = PrefixRewrite::ipv4([10, 0, 40, 0], [10, 244, 0, 0], 24);
        for host in 0..=255u8 {
            let a = w(10, 244, 0, host);
            assert_eq!(back.apply(there.apply(a)), a);
        }
    }

    #[test]
    fn the_inverse_moves_back() {
        let there = PrefixRewrite::ipv4([10, 0, 0, 0], [10, 244, 0, 0], 24);
        let back = there.inverse();
        assert!(back.matches(w(10, 244, 0, 5)));
        assert!(!back.matches(w(10, 0, 0, 5)));
        assert_eq!(back.apply(w(10, 244, 0, 5)), w(10, 0, 0, 5));
        assert!(!PrefixRewrite::default().inverse().matches(Be32::ZERO));
    }

    #[test]
    fn unmasked_input_is_masked() {
        let r = PrefixRewrite::ipv4([10, 244, 0, 77], [10, 0, 40, 99], 24);
        assert_eq!(r.from, w(10, 244, 0, 0));
        assert_eq!(r.to, w(10, 0, 40, 0));
    }

    #[test]
    fn an_empty_slot_never_matches() {
        assert!(!PrefixRewrite::default().matches(Be32::ZERO));
        assert!(!PrefixRewrite::default().matches(w(10, 244, 0, 5)));
    }

    #[test]
    fn peer_keys_mask_the_address() {
        assert_eq!(
            PeerKey::of(w(10, 0, 40, 77), 24),
            PeerKey {
                prefix_len: 24,
                addr: w(10, 0, 40, 0)
            }
        );
        assert_eq!(
            PeerKey::of(w(10, 0, 40, 77), 16),
            PeerKey {
                prefix_len: 16,
                addr: w(10, 0, 0, 0)
            }
        );
        assert_eq!(
            PeerKey::of(w(10, 0, 40, 77), 0),
            PeerKey {
                prefix_len: 0,
                addr: Be32::ZERO
            }
        );
        assert_eq!(PeerKey::of(w(10, 0, 40, 77), 32).addr, w(10, 0, 40, 77));
    }

    #[test]
    fn find_rule_picks_the_matching_network() {
        let rules = [
            PrefixRewrite::ipv4([10, 244, 0, 0], [10, 0, 40, 0], 24),
            PrefixRewrite::ipv4([192, 168, 0, 0], [10, 0, 41, 0], 24),
        ];
        assert_eq!(find_rule(&rules, w(192, 168, 0, 9)), Some(&rules[1]));
        assert_eq!(find_rule(&rules, w(10, 244, 0, 9)), Some(&rules[0]));
        assert_eq!(find_rule(&rules, w(10, 245, 0, 9)), None);
    }
}
