//! The peer tables, one per address family (`ist_peer_nets`,
//! `ist_peer_nets6`), each with the prefix lengths it holds
//! (`ist_prefix_lens`, `ist_prefix6`), kept consistent: a length is listed
//! while at least one network has it.

use std::{collections::BTreeMap, path::Path};

use aya::maps::{
    Array, HashMap, Map, MapData, MapError,
    lpm_trie::{Key, LpmTrie},
};
use ipnet::{Ipv4Net, Ipv6Net};
use isthmus_common::{
    names,
    nat::{PREFIX_LENS, PeerKey, PeerNat, PrefixLens},
};

use crate::{
    kernel::{
        maps::{is_full, open_pinned},
        table::KernelTable,
    },
    model::cidr::Cidr,
};

/// A network of family `N` and the rules of the peer seen under it.
type Entry<N> = (N, PeerNat<<N as Cidr>::Wire>);

/// One family's peer table and its prefix lengths.
struct Prefixes<N: Cidr> {
    nets: HashMap<MapData, PeerKey<N::Wire>, PeerNat<N::Wire>>,
    lens: Array<MapData, PrefixLens>,
    /// Networks per prefix length.
    counts: BTreeMap<u32, usize>,
}

impl<N: Cidr> Prefixes<N>
where
    PeerKey<N::Wire>: aya::Pod,
    PeerNat<N::Wire>: aya::Pod,
{
    fn new(nets: Map, lens: Map) -> Result<Self, MapError> {
        let nets: HashMap<MapData, PeerKey<N::Wire>, PeerNat<N::Wire>> = nets.try_into()?;
        let mut counts = BTreeMap::new();
        for entry in &nets {
            let (key, _) = entry?;
            *counts.entry(key.prefix_len).or_insert(0) += 1;
        }
        Ok(Self {
            nets,
            lens: lens.try_into()?,
            counts,
        })
    }

    fn write_lens(&mut self) -> Result<(), MapError> {
        let mut lens = PrefixLens::default();
        for (slot, len) in lens.lens.iter_mut().zip(self.counts.keys().rev()) {
            *slot = *len;
        }
        lens.count = self.counts.len().min(PREFIX_LENS) as u32;
        self.lens.set(0, lens, 0)
    }

    fn entries(&self) -> Result<Vec<Entry<N>>, MapError> {
        self.nets
            .iter()
            .map(|entry| {
                let (key, nat) = entry?;
                Ok((N::from_wire(key.addr, key.prefix_len as u8), nat))
            })
            .collect()
    }

    fn put(
        &mut self,
        net: N,
        nat: &PeerNat<N::Wire>,
        old: Option<&PeerNat<N::Wire>>,
    ) -> Result<(), MapError> {
        let key = PeerKey::of(net.wire(), net.prefix());
        self.nets.insert(key, nat, 0)?;
        if old.is_none() {
            let count = self.counts.entry(key.prefix_len).or_insert(0);
            *count += 1;
            if *count == 1 {
                self.write_lens()?;
            }
        }
        Ok(())
    }

    fn delete(&mut self, net: N) -> Result<(), MapError> {
        let key = PeerKey::of(net.wire(), net.prefix());
        self.nets.remove(&key)?;
        if let Some(count) = self.counts.get_mut(&key.prefix_len) {
            *count -= 1;
            if *count == 0 {
                self.counts.remove(&key.prefix_len);
                self.write_lens()?;
            }
        }
        Ok(())
    }
}

/// One family's peer table, with the same networks in a trie to each
/// peer's ID (`ist_peer_owners`, `ist_peer_owner6`), which the masquerade
/// charges new flows by.
pub struct PeerTable<N: Cidr> {
    prefixes: Prefixes<N>,
    owners: LpmTrie<MapData, N::Wire, u32>,
}

/// The IPv4 peer table.
pub type PeerMap = PeerTable<Ipv4Net>;

/// The IPv6 peer table (docs/design.md#dual-stack).
pub type PeerMap6 = PeerTable<Ipv6Net>;

impl<N: Cidr> PeerTable<N>
where
    PeerKey<N::Wire>: aya::Pod,
    PeerNat<N::Wire>: aya::Pod,
    N::Wire: aya::Pod,
{
    /// Wraps the three maps taken from a freshly loaded object.
    pub fn new(nets: Map, owners: Map, lens: Map) -> Result<Self, MapError> {
        let prefixes = Prefixes::new(nets, lens)?;
        let mut owners: LpmTrie<MapData, N::Wire, u32> = owners.try_into()?;
        for entry in &prefixes.nets {
            let (key, nat) = entry?;
            // A previous agent's table may predate the trie: it follows.
            owners.insert(&Key::new(key.prefix_len, key.addr), nat.peer_id, 0)?;
        }
        Ok(Self { prefixes, owners })
    }
}

impl PeerMap {
    /// Opens the maps pinned under `root`.
    pub fn open(root: &Path) -> Result<Self, MapError> {
        Self::new(
            open_pinned(root, names::MAP_PEERS)?,
            open_pinned(root, names::MAP_PEER_OWNERS)?,
            open_pinned(root, names::MAP_PREFIX_LENS)?,
        )
    }
}

impl PeerMap6 {
    /// Opens the maps pinned under `root`.
    pub fn open(root: &Path) -> Result<Self, MapError> {
        Self::new(
            open_pinned(root, names::MAP_PEERS6)?,
            open_pinned(root, names::MAP_PEER_OWNERS6)?,
            open_pinned(root, names::MAP_PREFIX_LENS6)?,
        )
    }
}

fn owner_key<N: Cidr>(net: N) -> Key<N::Wire>
where
    N::Wire: aya::Pod,
{
    Key::new(u32::from(net.prefix()), net.wire())
}

impl<N: Cidr + Ord> KernelTable for PeerTable<N>
where
    PeerKey<N::Wire>: aya::Pod,
    PeerNat<N::Wire>: aya::Pod,
    N::Wire: aya::Pod,
{
    type Key = N;
    type Value = PeerNat<N::Wire>;
    type Error = MapError;
    fn is_full(error: &MapError) -> bool {
        is_full(error)
    }

    fn entries(&self) -> Result<Vec<(N, Self::Value)>, MapError> {
        self.prefixes.entries()
    }

    fn put(
        &mut self,
        net: N,
        nat: &Self::Value,
        old: Option<&Self::Value>,
    ) -> Result<(), MapError> {
        self.prefixes.put(net, nat, old)?;
        self.owners.insert(&owner_key(net), nat.peer_id, 0)
    }

    fn delete(&mut self, net: N, _old: &Self::Value) -> Result<(), MapError> {
        self.prefixes.delete(net)?;
        // Gone already is fine: a previous agent may not have written it.
        let _ = self.owners.remove(&owner_key(net));
        Ok(())
    }
}
