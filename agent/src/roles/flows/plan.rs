//! What one collection of a flow table removes: the dead flows, then,
//! where room is short, connections that are over and flows the far side
//! never answered, oldest first, as Linux conntrack's early drop does. A
//! live flow both sides spoke in is never evicted to make room. Pure: the
//! collector reads the table and the refusal counters, and applies the
//! plan.

use std::collections::{BTreeMap, HashSet};

use isthmus_common::room::{FlowTable, OWNER_LOCAL, owner_of};

use crate::kernel::conntrack::{Tracked, TrackedKey};

/// How much of a table one peer may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Share {
    /// An equal part of the peers' room for each peer.
    Equal,
    /// This percentage of the peers' room for each peer (the parts may
    /// add up to more than the room: the peers' room still bounds them
    /// together).
    Percent(u8),
    /// An equal part, or this percentage where that is more: with many
    /// peers, an equal part would leave each too little for a burst of
    /// connections, while one peer still never takes more than the
    /// percentage.
    EqualOrPercent(u8),
}

/// The limits of one table, in entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// What each peer may hold.
    pub per_peer: u64,
    /// What all peers together may hold: the table less the gateway's
    /// reserve. The gateway's own flows may take any room left.
    pub all_peers: u64,
}

impl Limits {
    /// The limits of a table of `capacity` entries with `reserve` of them
    /// kept for the gateway's own flows, shared by `peers` peers.
    pub fn new(capacity: u64, reserve: u64, share: Share, peers: usize) -> Self {
        let all_peers = capacity.saturating_sub(reserve).max(1);
        let equal = all_peers / peers.max(1) as u64;
        let percent = |p: u8| all_peers * u64::from(p.min(100)) / 100;
        let per_peer = match share {
            Share::Equal => equal,
            Share::Percent(p) => percent(p),
            Share::EqualOrPercent(p) => equal.max(percent(p)),
        };
        Self {
            per_peer: per_peer.max(1),
            all_peers,
        }
    }

    /// What an owner may hold before its connections that are over are
    /// evicted: a quarter of its share, so that the collector, which
    /// looks every second, takes them before a client opening up to three
    /// quarters of a share each second fills it.
    pub fn closed_kept(&self) -> u64 {
        self.per_peer / 4
    }
}

/// New flows the kernel refused since the last collection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pressure {
    /// By owner, for want of room in the owner's share.
    pub share: BTreeMap<u32, u64>,
    /// Peers' flows, for want of room in the peers' room or the table.
    pub peers_room: u64,
    /// The gateway's own flows, for want of room in the table.
    pub table: u64,
}

/// What one collection does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The entries to remove.
    pub remove: Vec<TrackedKey>,
    /// Connections that were over when the table was read: removed only
    /// if they still are, since a SYN from the same port may have opened
    /// one anew since.
    pub remove_closed: Vec<Tracked>,
    /// Dead flows among them.
    pub expired: usize,
    /// Flows evicted to make room, by owner.
    pub evicted: BTreeMap<u32, usize>,
    /// Entries each owner holds once the plan is applied.
    pub held: BTreeMap<u32, u64>,
}

/// Plans the collection of `flows` of `table` under `limits`, `pressure`
/// being what the kernel refused since the last one.
pub fn plan(table: FlowTable, flows: &[Tracked], limits: &Limits, pressure: &Pressure) -> Plan {
    let per_flow = table.entries_per_flow();
    let mut plan = Plan::default();
    let mut live = Vec::with_capacity(flows.len());
    for flow in flows {
        if flow.dead {
            plan.remove.extend_from_slice(flow.keys());
            plan.expired += 1;
        } else {
            *plan.held.entry(owner_of(flow.owner)).or_default() += flow.keys().len() as u64;
            live.push(flow);
        }
    }
    // Candidates for eviction: connections that are over, then flows
    // never answered, oldest first.
    let mut candidates: Vec<&Tracked> = live
        .into_iter()
        .filter(|f| f.closed || !f.answered)
        .collect();
    candidates.sort_by_key(|f| (!f.closed, f.last_seen));
    let mut evictor = Evictor {
        candidates,
        gone: HashSet::new(),
        plan,
    };
    let owners: Vec<(u32, u64)> = evictor.plan.held.iter().map(|(o, h)| (*o, *h)).collect();
    for (owner, held) in owners.into_iter().filter(|(o, _)| *o != OWNER_LOCAL) {
        // An owner's connections that are over go before they cost it a
        // refusal.
        if held > limits.closed_kept() {
            evictor.evict(u64::MAX, |f| f.closed && owner_of(f.owner) == owner);
        }
        let held = evictor.plan.held.get(&owner).copied().unwrap_or(0);
        let refused = pressure.share.get(&owner).copied().unwrap_or(0);
        let need =
            held.saturating_sub(limits.per_peer) + (refused * per_flow).min(limits.per_peer / 2);
        evictor.evict(need, |f| owner_of(f.owner) == owner);
    }
    let peers_held: u64 = evictor
        .plan
        .held
        .iter()
        .filter(|(o, _)| **o != OWNER_LOCAL)
        .map(|(_, h)| h)
        .sum();
    let need = peers_held.saturating_sub(limits.all_peers)
        + (pressure.peers_room * per_flow).min(limits.all_peers / 2);
    evictor.evict(need, |f| owner_of(f.owner) != OWNER_LOCAL);
    evictor.evict(
        (pressure.table * per_flow).min(limits.all_peers / 2),
        |_| true,
    );
    evictor.plan
}

/// Evicts connections that are over, then flows never answered, oldest
/// first.
struct Evictor<'a> {
    candidates: Vec<&'a Tracked>,
    gone: HashSet<usize>,
    plan: Plan,
}

impl Evictor<'_> {
    /// Frees at least `need` entries, if enough candidates that `chosen`
    /// picks exist.
    fn evict(&mut self, need: u64, chosen: impl Fn(&Tracked) -> bool) {
        let mut freed = 0;
        for (i, flow) in self.candidates.iter().enumerate() {
            if freed >= need {
                break;
            }
            if self.gone.contains(&i) || !chosen(flow) {
                continue;
            }
            self.gone.insert(i);
            let owner = owner_of(flow.owner);
            let entries = flow.keys().len() as u64;
            if flow.closed {
                self.plan.remove_closed.push(**flow);
            } else {
                self.plan.remove.extend_from_slice(flow.keys());
            }
            *self.plan.evicted.entry(owner).or_default() += 1;
            if let Some(held) = self.plan.held.get_mut(&owner) {
                *held -= entries;
            }
            freed += entries;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::conntrack::tests::tracked;

    const A: u32 = 1;
    const C: u32 = 2;

    /// `count` flows of `owner` in `table`, seen at `from`, `from + 1`, …
    fn flows(table: FlowTable, owner: u32, count: u32, answered: bool, from: u64) -> Vec<Tracked> {
        (0..count)
            .map(|i| {
                let mut flow = tracked(
                    table,
                    owner,
                    (owner << 16) + from as u32 + i,
                    from + u64::from(i),
                );
                flow.answered = answered;
                flow
            })
            .collect()
    }

    #[test]
    fn limits_split_the_peers_room_and_keep_the_reserve() {
        let equal = Limits::new(1000, 100, Share::Equal, 3);
        assert_eq!((equal.per_peer, equal.all_peers), (300, 900));
        assert_eq!(Limits::new(1000, 100, Share::Equal, 0).per_peer, 900);
        let fixed = Limits::new(1000, 100, Share::Percent(50), 3);
        assert_eq!((fixed.per_peer, fixed.all_peers), (450, 900));
        assert_eq!(Limits::new(10, 20, Share::Equal, 1).all_peers, 1);
        let floor = |peers| Limits::new(1000, 100, Share::EqualOrPercent(25), peers).per_peer;
        assert_eq!(floor(2), 450, "an equal part where it is more");
        assert_eq!(floor(200), 225, "the percentage where it is more");
    }

    /// `count` connections of `owner` that are over, answered, seen from
    /// `from` on.
    fn closed(owner: u32, count: u32, from: u64) -> Vec<Tracked> {
        let mut all = flows(FlowTable::Conntrack, owner, count, true, from);
        for f in &mut all {
            f.closed = true;
        }
        all
    }

    #[test]
    fn past_a_quarter_of_its_share_an_owner_loses_its_connections_that_are_over() {
        // Shares of 20 entries. a holds 4 live and 8 closed flows (24
        // entries, past a quarter): the closed go. c holds 2 closed flows
        // (4 entries, under a quarter): they stay until they expire.
        let ct = FlowTable::Conntrack;
        let mut all = flows(ct, A, 4, true, 0);
        all.extend(closed(A, 8, 50));
        all.extend(closed(C, 2, 60));
        let limits = Limits::new(40, 0, Share::Equal, 2);
        assert_eq!(limits.closed_kept(), 5);
        let plan = plan(ct, &all, &limits, &Pressure::default());
        assert_eq!(plan.evicted, BTreeMap::from([(A, 8)]));
        assert_eq!(plan.remove_closed.len(), 8);
        assert_eq!((plan.held[&A], plan.held[&C]), (8, 4));
    }

    #[test]
    fn refused_owners_lose_connections_that_are_over_before_unanswered_flows() {
        // a's share is 40 entries: it holds 3 unanswered and 2 closed
        // flows (10, a quarter), and was refused 2 flows.
        let ct = FlowTable::Conntrack;
        let mut all = flows(ct, A, 3, false, 0);
        all.extend(closed(A, 2, 100));
        let limits = Limits::new(80, 0, Share::Equal, 2);
        let pressure = Pressure {
            share: BTreeMap::from([(A, 2)]),
            ..Pressure::default()
        };
        let plan = plan(ct, &all, &limits, &pressure);
        assert_eq!(plan.evicted, BTreeMap::from([(A, 2)]));
        assert!(plan.remove.is_empty(), "no unanswered flow");
        assert!(
            plan.remove_closed
                .iter()
                .all(|f| f.closed && f.last_seen >= 100),
            "the closed ones, though newer"
        );
    }

    #[test]
    fn dead_flows_go_and_live_ones_are_counted_by_owner() {
        let ct = FlowTable::Conntrack;
        let mut all = flows(ct, A, 3, true, 0);
        let mut dead = tracked(ct, C, 99, 5);
        dead.dead = true;
        all.extend([dead, tracked(ct, OWNER_LOCAL, 100, 6)]);
        let limits = Limits::new(100, 10, Share::Equal, 2);
        let plan = plan(FlowTable::Conntrack, &all, &limits, &Pressure::default());
        assert_eq!(plan.expired, 1);
        assert_eq!(plan.remove.len(), 2, "both entries of the dead flow");
        assert_eq!(plan.held, BTreeMap::from([(OWNER_LOCAL, 2), (A, 6)]));
        assert!(plan.evicted.is_empty());
    }

    #[test]
    fn an_owner_over_its_share_loses_its_oldest_unanswered_flows_only() {
        // Peer a holds 4 answered and 6 unanswered flows (20 entries); its
        // share is 10 entries. Peer c, within its share, loses nothing.
        let ct = FlowTable::Conntrack;
        let mut all = flows(ct, A, 4, true, 0);
        all.extend(flows(ct, A, 6, false, 100));
        all.extend(flows(ct, C, 2, false, 0));
        let limits = Limits::new(20, 0, Share::Equal, 2);
        let plan = plan(FlowTable::Conntrack, &all, &limits, &Pressure::default());
        assert_eq!(plan.evicted, BTreeMap::from([(A, 5)]));
        assert_eq!(plan.held[&A], 10);
        assert_eq!(plan.held[&C], 4);
        let oldest: Vec<u64> = all
            .iter()
            .filter(|f| plan.remove.contains(&f.keys()[0]))
            .map(|f| f.last_seen)
            .collect();
        assert_eq!(oldest, [100, 101, 102, 103, 104]);
    }

    #[test]
    fn answered_flows_are_never_evicted_even_far_over_a_share() {
        let all = flows(FlowTable::PeerFlows, A, 50, true, 0);
        let limits = Limits::new(10, 0, Share::Equal, 1);
        let pressure = Pressure {
            share: BTreeMap::from([(A, 1000)]),
            peers_room: 1000,
            table: 1000,
        };
        let plan = plan(FlowTable::PeerFlows, &all, &limits, &pressure);
        assert!(plan.remove.is_empty() && plan.evicted.is_empty());
    }

    #[test]
    fn refusals_make_room_in_that_owners_share_first() {
        // a is at its share with unanswered flows and was refused 3 new
        // flows; c's and the gateway's unanswered flows are older, and stay.
        let pf = FlowTable::PeerFlows;
        let mut all = flows(pf, C, 3, false, 0);
        all.extend(flows(pf, OWNER_LOCAL, 3, false, 0));
        all.extend(flows(pf, A, 10, false, 50));
        let limits = Limits::new(40, 10, Share::Equal, 3);
        let pressure = Pressure {
            share: BTreeMap::from([(A, 3)]),
            ..Pressure::default()
        };
        let plan = plan(FlowTable::PeerFlows, &all, &limits, &pressure);
        assert_eq!(plan.evicted, BTreeMap::from([(A, 3)]));
    }

    #[test]
    fn a_full_peers_room_evicts_peers_flows_and_never_the_gateways() {
        let pf = FlowTable::PeerFlows;
        let mut all = flows(pf, OWNER_LOCAL, 5, false, 0);
        all.extend(flows(pf, A, 2, false, 10));
        all.extend(flows(pf, C, 2, false, 20));
        let limits = Limits::new(100, 10, Share::Percent(100), 2);
        let pressure = Pressure {
            peers_room: 3,
            ..Pressure::default()
        };
        let plan = plan(FlowTable::PeerFlows, &all, &limits, &pressure);
        assert_eq!(plan.evicted, BTreeMap::from([(A, 2), (C, 1)]));
    }
}
