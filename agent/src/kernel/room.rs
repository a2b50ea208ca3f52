//! Each owner's room in the kernel's flow tables (`isthmus_common::room`),
//! from userspace: the limits and releases the agent sets, what the kernel
//! charged, and the new flows it refused; and each owner's budget of new
//! entries per second in the fragment table (`isthmus_common::budget`).

use std::path::Path;

use aya::maps::{Array, IterableMap, Map, MapData, MapError, PerCpuArray};
use isthmus_common::{
    budget::Budget,
    names,
    room::{FlowTable, REFUSAL_SLOTS, Room, Short, refusal_slot, slot},
};

use crate::kernel::{batch, maps::open_pinned};

/// The room maps.
pub struct Rooms {
    by_owner: Array<MapData, Room>,
    refused: PerCpuArray<MapData, u64>,
    fragments: Array<MapData, Budget>,
}

impl Rooms {
    /// Wraps the maps taken from a freshly loaded object: the rooms, the
    /// refusals, and the fragment table's budgets.
    pub fn new(rooms: Map, refused: Map, fragments: Map) -> Result<Self, MapError> {
        Ok(Self {
            by_owner: rooms.try_into()?,
            refused: refused.try_into()?,
            fragments: fragments.try_into()?,
        })
    }

    /// Opens the maps pinned under `root`.
    pub fn open(root: &Path) -> Result<Self, MapError> {
        Self::new(
            open_pinned(root, names::MAP_ROOM)?,
            open_pinned(root, names::MAP_ROOM_REFUSED)?,
            open_pinned(root, names::MAP_FRAGMENT_BUDGET)?,
        )
    }

    /// Every owner's budget in the fragment table, by slot, in one system
    /// call.
    pub fn fragment_budgets(&self) -> Result<Vec<(u32, Budget)>, MapError> {
        batch::entries(self.fragments.map())
    }

    /// Sets the limit of the budget at `slot`, which `read` found: its
    /// window and counts are kept as read, and what the kernel counted in
    /// between is lost, which costs a budget a few entries of one window.
    pub fn set_fragment_limit(
        &mut self,
        slot: u32,
        read: Budget,
        limit: u64,
    ) -> Result<(), MapError> {
        self.fragments.set(slot, read.with_limit(limit), 0)
    }

    /// `owner`'s room in `table`, with what the kernel charged it so far.
    pub fn room(&self, table: FlowTable, owner: u32) -> Result<Room, MapError> {
        self.by_owner.get(&slot(table, owner), 0)
    }

    /// Sets `owner`'s limit in `table`, and what it holds: `held`
    /// entries, as the collector counted them. What the kernel charged is
    /// kept as `read` found it (see `isthmus_common::room` for why a charge
    /// lost in between is harmless), or raised to `held` where entries the
    /// kernel never charged (carried over by an upgrade) are held.
    pub fn set(
        &mut self,
        table: FlowTable,
        owner: u32,
        read: Room,
        limit: u64,
        held: u64,
    ) -> Result<(), MapError> {
        self.by_owner
            .set(slot(table, owner), read.holding(held, limit), 0)
    }

    /// New flows refused so far, by owner and reason, over every CPU: the
    /// whole map in a few system calls, where one per owner would cost
    /// thousands a second with a thousand peers.
    pub fn refusals(&self) -> Result<Refusals, MapError> {
        let mut sums = vec![0; REFUSAL_SLOTS as usize];
        for (slot, sum) in batch::per_cpu_sums(self.refused.map())? {
            if let Some(at) = sums.get_mut(slot as usize) {
                *at = sum;
            }
        }
        Ok(Refusals(sums))
    }
}

/// New flows refused, as [`Rooms::refusals`] read them.
pub struct Refusals(Vec<u64>);

impl Refusals {
    /// New flows of `owner` refused in `table` for `short`.
    pub fn get(&self, table: FlowTable, owner: u32, short: Short) -> u64 {
        self.0
            .get(refusal_slot(table, owner, short) as usize)
            .copied()
            .unwrap_or(0)
    }
}
