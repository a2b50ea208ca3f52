//! Each owner's budget of new entries per second in the fragment table
//! (`isthmus_common::budget`): the collector sets the limits as the peers
//! come and go, and reports and logs what the kernel refused.

use std::collections::BTreeMap;

use aya::maps::MapError;
use isthmus_common::{
    budget::Budget,
    names::MAX_FRAGMENTS,
    room::{ALL_PEERS, OWNER_LOCAL, OWNERS, SHORTS, owner_of},
};
use tracing::warn;

use super::{FlowReport, Limits, RefusalsSeen, Share};
use crate::kernel::room::Rooms;

/// How metrics and logs name the fragment table.
pub const FRAGMENTS: &str = "fragments";

/// What the collector remembers of the budgets between passes.
pub struct FragmentBudgets {
    reserve: u64,
    /// The limits last written to every slot.
    written: Option<Limits>,
    /// Refusals counted so far, by owner and reason.
    refused: RefusalsSeen,
    /// Refusals since the last log line, by owner.
    unlogged: BTreeMap<u32, u64>,
}

impl FragmentBudgets {
    /// Budgets that keep `reserve_percent` of the table's entries per
    /// second for the gateway's own datagrams, as the flow tables do.
    pub fn new(reserve_percent: u8) -> Self {
        Self {
            reserve: u64::from(MAX_FRAGMENTS) * u64::from(reserve_percent) / 100,
            written: None,
            refused: RefusalsSeen::default(),
            unlogged: BTreeMap::new(),
        }
    }

    /// Sets the limits where `peers` (their IDs) sharing the table as
    /// `share` says changed them; reports the refusals since the last pass,
    /// read in one call.
    pub fn pass(
        &mut self,
        rooms: &mut Rooms,
        peers: &[u32],
        share: Share,
        report: &dyn FlowReport,
    ) -> Result<(), MapError> {
        let limits = Limits::new(u64::from(MAX_FRAGMENTS), self.reserve, share, peers.len());
        if self.written != Some(limits) {
            // Every owner's slot, a peer's or not yet: a peer that comes
            // before the next pass is bounded from its first datagram.
            let slots = rooms.fragment_budgets(OWNERS - 1)?.into_iter();
            let all = (ALL_PEERS, rooms.fragment_budget(ALL_PEERS)?);
            for (slot, read) in slots.chain([all]) {
                rooms.set_fragment_limit(slot, read, limit_of(slot, &limits))?;
            }
            self.written = Some(limits);
        }
        let last = peers
            .iter()
            .copied()
            .map(owner_of)
            .max()
            .unwrap_or(OWNER_LOCAL);
        for (owner, budget) in rooms.fragment_budgets(last)? {
            self.count(owner, &budget, report);
        }
        Ok(())
    }

    fn count(&mut self, owner: u32, budget: &Budget, report: &dyn FlowReport) {
        for short in SHORTS {
            let new = self.refused.since(owner, short, budget.refused(short));
            if new > 0 {
                *self.unlogged.entry(owner).or_default() += new;
                report.refused(FRAGMENTS, owner, short, new);
            }
        }
    }

    /// One line per owner refused since the last.
    pub fn log(&mut self, report: &dyn FlowReport) {
        for (owner, refused) in std::mem::take(&mut self.unlogged) {
            warn!(
                table = FRAGMENTS,
                owner = report.owner_name(owner),
                refused,
                "first fragments not remembered past the owner's budget per second: \
                 their datagrams' later fragments are dropped"
            );
        }
    }
}

/// The limit of the budget at `slot`: none for the gateway's own (the
/// table bounds it), the peers' room for all peers, a peer's share for
/// each peer.
fn limit_of(slot: u32, limits: &Limits) -> u64 {
    match slot {
        OWNER_LOCAL => 0,
        ALL_PEERS => limits.all_peers,
        _ => limits.per_peer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_is_unbounded_and_each_peer_gets_its_share_of_the_peers_room() {
        // 8,192 entries a second, 10% kept for the gateway, four peers.
        let limits = Limits::new(u64::from(MAX_FRAGMENTS), 819, Share::Equal, 4);
        assert_eq!(limit_of(OWNER_LOCAL, &limits), 0);
        assert_eq!(limit_of(ALL_PEERS, &limits), 7373);
        assert_eq!(limit_of(1, &limits), 1843);
        assert_eq!(limit_of(ALL_PEERS - 1, &limits), 1843);
    }
}
