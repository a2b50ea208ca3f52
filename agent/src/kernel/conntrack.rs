//! The kernel's flow tables from userspace: the masquerade's, one per
//! address family, with its settings, and the flows our side opened
//! towards segregated peers; and how the collector sees the flows of all.
//! Expiry is decided here, with a clock the caller passes, so tests choose
//! the time.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::Path,
};

use foldhash::HashMap as FoldHashMap;

use aya::maps::{Array, HashMap, IterableMap as _, Map, MapData, MapError};
use isthmus_common::{
    conntrack::{
        DIR_IN, DIR_OUT, FlowKey, FlowNat, SnatConfig, TcpState, Timeouts, TrackedAddr, reply_key,
        tcp_closed,
    },
    isolation::PeerFlow,
    names,
    room::FlowTable,
    wire::{Be32, Be128},
};

use crate::kernel::{batch, maps::open_pinned};

/// What one collection found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Collected {
    /// Entries left.
    pub live: usize,
    /// Entries removed.
    pub removed: usize,
}

/// An entry's key in a flow table of either family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TrackedKey {
    /// In an IPv4 table.
    V4(FlowKey),
    /// In an IPv6 table.
    V6(FlowKey<Be128>),
}

impl TrackedKey {
    /// Its direction: [`DIR_OUT`] or [`DIR_IN`].
    pub fn dir(&self) -> u8 {
        match self {
            Self::V4(key) => key.dir,
            Self::V6(key) => key.dir,
        }
    }
}

impl From<FlowKey> for TrackedKey {
    fn from(key: FlowKey) -> Self {
        Self::V4(key)
    }
}

impl From<FlowKey<Be128>> for TrackedKey {
    fn from(key: FlowKey<Be128>) -> Self {
        Self::V6(key)
    }
}

/// One flow of a table, as the collector judges it: the entries it holds
/// (two for a masqueraded flow, one for a flow towards a segregated peer
/// or a reply entry whose outbound one is gone), who was charged for them,
/// whether the far side ever answered, and whether it is dead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tracked {
    keys: [TrackedKey; 2],
    entries: usize,
    /// The room owner charged (`isthmus_common::room`).
    pub owner: u32,
    /// Whether the far side ever answered.
    pub answered: bool,
    /// The last packet either way (`CLOCK_MONOTONIC`, ns).
    pub last_seen: u64,
    /// Past its lifetime.
    pub dead: bool,
    /// A TCP connection that is over, kept only for stray packets
    /// ([`tcp_closed`]).
    pub closed: bool,
}

impl Tracked {
    /// The table entries of the flow, in the order they are removed: the
    /// reply's before the outbound one. Between the two removals, the
    /// flow's packets out still find their entry and leave by its port,
    /// and only a reply is lost, which TCP sends again. The other way
    /// round, a packet out would find no entry while the reply's entry
    /// still held the port, take another port, and split a live
    /// connection (one reopened by a SYN just as it was evicted) in two.
    pub fn keys(&self) -> &[TrackedKey] {
        &self.keys[..self.entries]
    }

    /// The outbound entry and the reply's, as [`keys`](Self::keys) orders
    /// them; a flow of one entry is its own reply.
    fn outbound_and_reply(&self) -> (TrackedKey, TrackedKey) {
        (self.keys[self.entries - 1], self.keys[0])
    }
}

/// A flow table the collector sweeps: dead flows go, and, when room is
/// short, flows never answered.
pub trait SweptTable {
    /// Which table it is.
    const TABLE: FlowTable;

    /// Every flow, judged at `now` (`CLOCK_MONOTONIC` ns, the kernel's
    /// `bpf_ktime_get_ns`).
    fn flows(&self, now: u64, timeouts: &Timeouts) -> Result<Vec<Tracked>, MapError>;

    /// Removes `keys`; returns how many it removed. Already gone is fine:
    /// the kernel may have lost a race for an entry.
    fn remove(&mut self, keys: &[TrackedKey]) -> usize;

    /// Whether `flow`'s entries, read again, still hold a connection that
    /// is over; false if one is gone.
    fn still_closed(&self, flow: &Tracked) -> bool;

    /// Removes the flows among `closed` that are still over, each read
    /// again just before: a SYN from the same port may have opened one
    /// anew since the table was read. Returns the entries removed.
    fn remove_closed(&mut self, closed: &[Tracked]) -> usize {
        let mut removed = 0;
        for flow in closed {
            if self.still_closed(flow) {
                removed += self.remove(flow.keys());
            }
        }
        removed
    }

    /// Removes the flows dead at `now`, all entries of a flow together.
    fn remove_dead(&mut self, now: u64, timeouts: &Timeouts) -> Result<Collected, MapError> {
        let flows = self.flows(now, timeouts)?;
        let dead: Vec<TrackedKey> = flows
            .iter()
            .filter(|f| f.dead)
            .flat_map(|f| f.keys().iter().copied())
            .collect();
        let live: usize = flows.iter().map(|f| f.keys().len()).sum();
        let removed = self.remove(&dead);
        Ok(Collected {
            live: live - removed,
            removed,
        })
    }
}

/// A family's flow table.
type Flows<A> = HashMap<MapData, FlowKey<A>, FlowNat<A>>;

/// A family's flow table's entries.
pub type Entries<A> = Vec<(FlowKey<A>, FlowNat<A>)>;

/// The masquerade's flow tables (`ist_conntrack`, `ist_conntrack6`),
/// swept as one: both families' flows are charged to one room per owner.
pub struct Conntrack {
    flows: Flows<Be32>,
    flows6: Flows<Be128>,
}

impl Conntrack {
    /// Wraps the maps taken from a freshly loaded object: the IPv4 table,
    /// then the IPv6 one.
    pub fn new(flows: Map, flows6: Map) -> Result<Self, MapError> {
        Ok(Self {
            flows: flows.try_into()?,
            flows6: flows6.try_into()?,
        })
    }

    /// Opens the maps pinned under `root`.
    pub fn open(root: &Path) -> Result<Self, MapError> {
        Self::new(
            open_pinned(root, names::MAP_CONNTRACK)?,
            open_pinned(root, names::MAP_CONNTRACK6)?,
        )
    }

    /// Every IPv4 entry, as the kernel holds it now.
    pub fn entries(&self) -> Result<Entries<Be32>, MapError> {
        batch::entries(self.flows.map())
    }

    /// Every IPv6 entry, as the kernel holds it now.
    pub fn entries6(&self) -> Result<Entries<Be128>, MapError> {
        batch::entries(self.flows6.map())
    }
}

/// One family's masquerade setting (`ist_snat`, `ist_snat6`): the
/// address of ours that flows needing it leave from, if any.
pub struct Masquerade<A: TrackedAddr>
where
    SnatConfig<A>: aya::Pod,
{
    config: Array<MapData, SnatConfig<A>>,
    /// Whether the map was set, and to what.
    written: bool,
    current: Option<A>,
}

impl<A: TrackedAddr> Masquerade<A>
where
    SnatConfig<A>: aya::Pod,
{
    /// Wraps the map taken from a freshly loaded object.
    pub fn new(config: Map) -> Result<Self, MapError> {
        Ok(Self {
            config: config.try_into()?,
            written: false,
            current: None,
        })
    }

    /// Masquerades flows that need it to `addr` (one of our own addresses),
    /// or stops masquerading. Returns whether that changed anything.
    pub fn set(&mut self, addr: Option<A>) -> Result<bool, MapError> {
        if self.written && self.current == addr {
            return Ok(false);
        }
        let config = SnatConfig {
            addr: addr.unwrap_or_default(),
            enabled: u32::from(addr.is_some()),
        };
        self.config.set(0, config, 0)?;
        (self.written, self.current) = (true, addr);
        Ok(true)
    }
}

/// The masquerade settings of both families.
pub struct MasqueradeSettings {
    ipv4: Masquerade<Be32>,
    ipv6: Masquerade<Be128>,
}

impl MasqueradeSettings {
    /// Wraps the maps taken from a freshly loaded object: IPv4's, then
    /// IPv6's.
    pub fn new(ipv4: Map, ipv6: Map) -> Result<Self, MapError> {
        Ok(Self {
            ipv4: Masquerade::new(ipv4)?,
            ipv6: Masquerade::new(ipv6)?,
        })
    }

    /// Masquerades to `ipv4` and `ipv6`, each family's flows to its own,
    /// or none. Returns whether that changed anything.
    pub fn set(
        &mut self,
        ipv4: Option<Ipv4Addr>,
        ipv6: Option<Ipv6Addr>,
    ) -> Result<bool, MapError> {
        let changed4 = self.ipv4.set(ipv4.map(Be32::from))?;
        let changed6 = self.ipv6.set(ipv6.map(Be128::from))?;
        Ok(changed4 || changed6)
    }
}

impl SweptTable for Conntrack {
    const TABLE: FlowTable = FlowTable::Conntrack;

    fn flows(&self, now: u64, timeouts: &Timeouts) -> Result<Vec<Tracked>, MapError> {
        let mut flows = pair(&self.entries()?, now, timeouts);
        flows.extend(pair(&self.entries6()?, now, timeouts));
        Ok(flows)
    }

    fn remove(&mut self, keys: &[TrackedKey]) -> usize {
        keys.iter()
            .filter(|key| match key {
                TrackedKey::V4(key) => self.flows.remove(key).is_ok(),
                TrackedKey::V6(key) => self.flows6.remove(key).is_ok(),
            })
            .count()
    }

    fn still_closed(&self, flow: &Tracked) -> bool {
        match flow.outbound_and_reply() {
            (TrackedKey::V4(out), TrackedKey::V4(back)) => still_closed(&self.flows, &out, &back),
            (TrackedKey::V6(out), TrackedKey::V6(back)) => still_closed(&self.flows6, &out, &back),
            _ => false,
        }
    }
}

/// Whether the entries `out` and `back` of `flows`, read again, still hold
/// a connection that is over; false if one is gone.
fn still_closed<A: TrackedAddr>(flows: &Flows<A>, out: &FlowKey<A>, back: &FlowKey<A>) -> bool
where
    FlowKey<A>: aya::Pod,
    FlowNat<A>: aya::Pod,
{
    let state = |key| flows.get(key, 0).map(|nat| nat.state);
    match (state(out), state(back)) {
        (Ok(out_state), Ok(back_state)) => closed(out.proto, out_state, back_state),
        _ => false,
    }
}

/// The flows our side opened towards segregated peers (`ist_peer_flows`
/// and `ist_peer_flows6`), one entry each, keyed as their replies arrive.
pub struct PeerFlows {
    flows: HashMap<MapData, FlowKey, PeerFlow>,
    flows6: HashMap<MapData, FlowKey<Be128>, PeerFlow>,
}

impl PeerFlows {
    /// Wraps the maps taken from a freshly loaded object: IPv4's, then
    /// IPv6's.
    pub fn new(flows: Map, flows6: Map) -> Result<Self, MapError> {
        Ok(Self {
            flows: flows.try_into()?,
            flows6: flows6.try_into()?,
        })
    }

    /// Every IPv4 entry, as the kernel holds it now.
    pub fn entries(&self) -> Result<Vec<(FlowKey, PeerFlow)>, MapError> {
        batch::entries(self.flows.map())
    }

    /// Every IPv6 entry, as the kernel holds it now.
    pub fn entries6(&self) -> Result<Vec<(FlowKey<Be128>, PeerFlow)>, MapError> {
        batch::entries(self.flows6.map())
    }
}

impl SweptTable for PeerFlows {
    const TABLE: FlowTable = FlowTable::PeerFlows;

    /// With the conntrack's lifetimes, each direction judged by what it said.
    fn flows(&self, now: u64, timeouts: &Timeouts) -> Result<Vec<Tracked>, MapError> {
        let mut flows = single(&self.entries()?, now, timeouts);
        flows.extend(single(&self.entries6()?, now, timeouts));
        Ok(flows)
    }

    fn remove(&mut self, keys: &[TrackedKey]) -> usize {
        keys.iter()
            .filter(|key| match key {
                TrackedKey::V4(key) => self.flows.remove(key).is_ok(),
                TrackedKey::V6(key) => self.flows6.remove(key).is_ok(),
            })
            .count()
    }

    fn still_closed(&self, flow: &Tracked) -> bool {
        let state = match &flow.keys[0] {
            TrackedKey::V4(key) => self.flows.get(key, 0).map(|f| (key.proto, f)),
            TrackedKey::V6(key) => self.flows6.get(key, 0).map(|f| (key.proto, f)),
        };
        state.is_ok_and(|(proto, f)| closed(proto, f.ours, f.theirs))
    }
}

/// The flows towards segregated peers in a table's `entries`: one entry
/// each.
fn single<A: Copy>(
    entries: &[(FlowKey<A>, PeerFlow)],
    now: u64,
    timeouts: &Timeouts,
) -> Vec<Tracked>
where
    TrackedKey: From<FlowKey<A>>,
{
    entries
        .iter()
        .map(|(key, flow)| Tracked {
            keys: [(*key).into(), (*key).into()],
            entries: 1,
            owner: flow.owner,
            answered: flow.answered != 0,
            last_seen: flow.last_seen,
            dead: flow.expired(key.proto, timeouts, now),
            closed: closed(key.proto, flow.ours, flow.theirs),
        })
        .collect()
}

/// The masquerade's flows in its table's `entries`: both entries of a flow
/// go together, judged by both directions. A reply entry whose outbound
/// entry is gone (a lost race in the kernel) is a flow of its own. The
/// collector pairs a table of up to millions of entries on every sweep:
/// replies are indexed by a fast hash, and marked paired by their place.
pub fn pair<A: TrackedAddr>(
    entries: &[(FlowKey<A>, FlowNat<A>)],
    now: u64,
    timeouts: &Timeouts,
) -> Vec<Tracked>
where
    TrackedKey: From<FlowKey<A>>,
{
    let replies: FoldHashMap<FlowKey<A>, usize> = entries
        .iter()
        .enumerate()
        .filter(|(_, (key, _))| key.dir == DIR_IN)
        .map(|(at, (key, _))| (*key, at))
        .collect();
    let mut paired = vec![false; entries.len()];
    let mut flows = Vec::with_capacity(entries.len() / 2 + 1);
    for (key, nat) in entries.iter().filter(|(k, _)| k.dir == DIR_OUT) {
        let reply = reply_key(key, nat);
        let (keys, back) = match replies.get(&reply) {
            Some(&at) => {
                paired[at] = true;
                (([reply.into(), (*key).into()], 2), &entries[at].1)
            }
            None => (([(*key).into(), (*key).into()], 1), nat),
        };
        flows.push(Tracked {
            keys: keys.0,
            entries: keys.1,
            owner: nat.owner,
            answered: back.answered != 0,
            last_seen: nat.last_seen.max(back.last_seen),
            dead: timeouts.expired(key.proto, nat, back, now),
            closed: closed(key.proto, nat.state, back.state),
        });
    }
    let unpaired = entries
        .iter()
        .zip(&paired)
        .filter(|((key, _), paired)| key.dir == DIR_IN && !**paired);
    for ((key, nat), _) in unpaired {
        flows.push(Tracked {
            keys: [(*key).into(), (*key).into()],
            entries: 1,
            owner: nat.owner,
            answered: nat.answered != 0,
            last_seen: nat.last_seen,
            dead: timeouts.expired(key.proto, nat, nat, now),
            closed: closed(key.proto, nat.state, nat.state),
        });
    }
    flows
}

/// [`tcp_closed`] of two directions' stored states.
fn closed(proto: u8, out: u8, back: u8) -> bool {
    tcp_closed(proto, TcpState::from_u8(out), TcpState::from_u8(back))
}

/// The kernel's clock for conntrack timestamps: `CLOCK_MONOTONIC`, in ns.
pub fn now() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always there");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A live, unanswered flow of `owner` in `table` for the collector's
    /// tests, its entries told apart by `id`, last seen at `last_seen`.
    pub(crate) fn tracked(table: FlowTable, owner: u32, id: u32, last_seen: u64) -> Tracked {
        let key = |dir| FlowKey::new(Be32::from_host(id), Be32::ZERO, 0, 0, 17, dir).into();
        Tracked {
            keys: [key(DIR_IN), key(DIR_OUT)],
            entries: table.entries_per_flow() as usize,
            owner,
            answered: false,
            last_seen,
            dead: false,
            closed: false,
        }
    }
}
