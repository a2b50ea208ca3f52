//! Room in the kernel's flow tables, by owner: no peer can fill a table
//! every peer shares (docs/design.md#masquerade).
//!
//! Each entry of a flow table belongs to the party that caused it: a
//! masqueraded flow to the peer its source is in (or to the gateway
//! itself, [`OWNER_LOCAL`], for the node's own traffic and the
//! conncheck's), a flow towards a segregated peer to that peer. The agent
//! gives each owner a limit; the kernel charges an owner as it inserts
//! and refuses a new flow past the limit, and past the room all peers
//! share together, which leaves the gateway's reserve alone.
//!
//! The kernel only ever adds to an owner's `charged`; the agent sets its
//! `limit` and `released`. What an owner holds is what the kernel charged
//! less what the agent saw released: each collection, the agent sets
//! `released` so that the difference is what it counted. Where it counted
//! more than was ever charged (flows an upgrade carried over), it raises
//! `charged` to the count. The agent rewrites a room whole, with `charged`
//! as it read it, so a flow the kernel charged in between is lost from
//! `charged`, and the next collection, counting the flow itself, heals
//! that: an owner's count can be wrong by the flows of a few microseconds,
//! for one interval, not more. So the rooms also tell, in one lookup, how
//! many entries a flow table holds.

use crate::counters::DENY_PEERS;

/// The owner of the gateway's own flows.
pub const OWNER_LOCAL: u32 = 0;
/// Owners with room of their own per table; peer IDs from `OWNERS - 1`
/// up share the last slot.
pub const OWNERS: u32 = DENY_PEERS;
/// The slot that counts every peer's entries together.
pub const ALL_PEERS: u32 = OWNERS;
/// Slots per table: every owner, then [`ALL_PEERS`].
pub const SLOTS_PER_TABLE: u32 = OWNERS + 1;

/// A flow table whose room is shared out.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FlowTable {
    /// Masqueraded flows (`ist_conntrack`), two entries each.
    Conntrack = 0,
    /// Flows towards segregated peers (`ist_peer_flows`), one entry each.
    PeerFlows = 1,
}

/// Every shared flow table, in slot order.
pub const FLOW_TABLES: [FlowTable; 2] = [FlowTable::Conntrack, FlowTable::PeerFlows];

/// Slots of the room maps.
pub const SLOTS: u32 = FLOW_TABLES.len() as u32 * SLOTS_PER_TABLE;

impl FlowTable {
    /// Entries one flow holds.
    pub const fn entries_per_flow(self) -> u64 {
        match self {
            Self::Conntrack => 2,
            Self::PeerFlows => 1,
        }
    }

    /// The map that holds it.
    pub const fn map(self) -> &'static str {
        match self {
            Self::Conntrack => crate::names::MAP_CONNTRACK,
            Self::PeerFlows => crate::names::MAP_PEER_FLOWS,
        }
    }

    /// Lower-case name used in metrics and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Conntrack => "conntrack",
            Self::PeerFlows => "peer_flows",
        }
    }
}

/// Why a new flow found no room.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Short {
    /// Its owner's share was used up.
    Share = 0,
    /// The room every peer shares, or the table itself, was full.
    Table = 1,
}

/// Every reason, in slot order.
pub const SHORTS: [Short; 2] = [Short::Share, Short::Table];

impl Short {
    /// Lower-case name used in metrics and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Share => "share_full",
            Self::Table => "table_full",
        }
    }
}

/// Slots of the refusal counters: one per room slot and reason.
pub const REFUSAL_SLOTS: u32 = SLOTS * SHORTS.len() as u32;

/// The owner slot of peer `peer_id`.
pub const fn owner_of(peer_id: u32) -> u32 {
    if peer_id < OWNERS {
        peer_id
    } else {
        OWNERS - 1
    }
}

/// Index of `owner`'s room in `table` (`owner` an [`owner_of`] result or
/// [`ALL_PEERS`]).
pub const fn slot(table: FlowTable, owner: u32) -> u32 {
    table as u32 * SLOTS_PER_TABLE + owner
}

/// Index of the counter of `owner`'s new flows refused in `table` for `short`.
pub const fn refusal_slot(table: FlowTable, owner: u32, short: Short) -> u32 {
    slot(table, owner) * SHORTS.len() as u32 + short as u32
}

/// One owner's room in one table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Room {
    /// Entries the owner may hold, as the agent sets it; 0 before it set
    /// any: no bound but the table's.
    pub limit: u64,
    /// Of what the kernel charged, what the agent counts as given back.
    pub released: u64,
    /// Entries the kernel charged the owner, ever: only added to, by the
    /// kernel, atomically (a flow given back adds its negation).
    pub charged: u64,
}

assert_layout!(Room, size = 24, align = 8);

impl Room {
    /// Entries held, the kernel having charged `charged` in all.
    pub const fn used(&self, charged: u64) -> u64 {
        charged.saturating_sub(self.released)
    }

    /// This room, holding `held` entries with `limit`: what the kernel
    /// charged beyond them counts as released, and if it charged fewer,
    /// the charge rises to them.
    #[must_use]
    pub const fn holding(self, held: u64, limit: u64) -> Self {
        let charged = if self.charged > held {
            self.charged
        } else {
            held
        };
        Self {
            limit,
            released: charged - held,
            charged,
        }
    }

    /// Whether `entries` more fit, the kernel having charged `charged`.
    pub const fn fits(&self, charged: u64, entries: u64) -> bool {
        self.limit == 0 || self.used(charged) + entries <= self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_distinct_and_every_peer_has_one() {
        let last = refusal_slot(FlowTable::PeerFlows, ALL_PEERS, Short::Table);
        assert_eq!(last, REFUSAL_SLOTS - 1);
        assert_eq!(slot(FlowTable::PeerFlows, 0), SLOTS_PER_TABLE);
        assert_eq!(owner_of(7), 7);
        assert_eq!(owner_of(OWNERS + 9), OWNERS - 1);
        assert_ne!(owner_of(u32::MAX), ALL_PEERS);
    }

    #[test]
    fn an_owner_fits_up_to_its_limit_and_released_entries_come_back() {
        let room = Room {
            limit: 4,
            released: 10,
            charged: 0,
        };
        assert_eq!(room.used(12), 2);
        assert!(room.fits(12, 2));
        assert!(!room.fits(13, 2));
        // A refund the agent has not seen yet leaves nothing negative.
        assert_eq!(room.used(9), 0);
        assert!(Room::default().fits(u64::MAX - 1, 1), "no limit set yet");
    }

    #[test]
    fn a_room_holds_what_was_counted_charged_or_not() {
        let room = Room {
            limit: 4,
            released: 1,
            charged: 10,
        };
        let held = room.holding(3, 8);
        assert_eq!((held.limit, held.released, held.charged), (8, 7, 10));
        assert_eq!(held.used(held.charged), 3);
        // Entries the kernel never charged, carried over by an upgrade.
        let held = room.holding(25, 8);
        assert_eq!((held.released, held.charged), (0, 25));
        assert_eq!(held.used(held.charged), 25);
    }
}
