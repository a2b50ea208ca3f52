//! Each owner's room in the kernel's flow tables (`isthmus_common::room`),
//! from userspace: the limits and releases the agent sets, what the kernel
//! charged, and the new flows it refused; and each owner's budget of new
//! entries per second in the fragment table (`isthmus_common::budget`).

use std::{collections::BTreeMap, path::Path};

use aya::maps::{Array, IterableMap, Map, MapData, MapError, PerCpuArray};
use isthmus_common::{
    budget::Budget,
    names,
    room::{FlowTable, Room, SHORTS, Short, refusal_slot, slot},
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

    /// The budgets in the fragment table of owners up to `last` (an
    /// [`owner_of`](isthmus_common::room::owner_of) result), by slot, in
    /// one system call.
    pub fn fragment_budgets(&self, last: u32) -> Result<Vec<(u32, Budget)>, MapError> {
        batch::array_range(self.fragments.map(), 0..last + 1)
    }

    /// The fragment table's budget at `slot`.
    pub fn fragment_budget(&self, slot: u32) -> Result<Budget, MapError> {
        self.fragments.get(&slot, 0)
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

    /// New flows of owners up to `last` (an
    /// [`owner_of`](isthmus_common::room::owner_of) result) refused
    /// so far in `table`, by owner and reason, over every CPU: in one
    /// system call, where one per owner and reason would cost thousands a
    /// second with a thousand peers.
    pub fn refusals(&self, table: FlowTable, last: u32) -> Result<Refusals, MapError> {
        let first = refusal_slot(table, 0, SHORTS[0]);
        let end = refusal_slot(table, last, SHORTS[SHORTS.len() - 1]) + 1;
        Ok(Refusals {
            table,
            by_slot: batch::per_cpu_sums(self.refused.map(), first..end)?
                .into_iter()
                .collect(),
        })
    }
}

/// New flows refused in one table, as [`Rooms::refusals`] read them.
pub struct Refusals {
    table: FlowTable,
    by_slot: BTreeMap<u32, u64>,
}

impl Refusals {
    /// New flows of `owner` refused for `short`; 0 if it was not read.
    pub fn get(&self, owner: u32, short: Short) -> u64 {
        self.by_slot
            .get(&refusal_slot(self.table, owner, short))
            .copied()
            .unwrap_or(0)
    }
}
