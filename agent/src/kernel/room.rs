//! Each owner's room in the kernel's flow tables (`isthmus_common::room`),
//! from userspace: the limits and releases the agent sets, what the kernel
//! charged, and the new flows it refused.

use std::path::Path;

use aya::maps::{Array, Map, MapData, MapError, PerCpuArray};
use isthmus_common::{
    names,
    room::{FlowTable, Room, Short, refusal_slot, slot},
};

use crate::kernel::maps::open_pinned;

/// The room maps.
pub struct Rooms {
    rooms: Array<MapData, Room>,
    refused: PerCpuArray<MapData, u64>,
}

impl Rooms {
    /// Wraps the maps taken from a freshly loaded object.
    pub fn new(rooms: Map, refused: Map) -> Result<Self, MapError> {
        Ok(Self {
            rooms: rooms.try_into()?,
            refused: refused.try_into()?,
        })
    }

    /// Opens the maps pinned under `root`.
    pub fn open(root: &Path) -> Result<Self, MapError> {
        Self::new(
            open_pinned(root, names::MAP_ROOM)?,
            open_pinned(root, names::MAP_ROOM_REFUSED)?,
        )
    }

    /// `owner`'s room in `table`, with what the kernel charged it so far.
    pub fn room(&self, table: FlowTable, owner: u32) -> Result<Room, MapError> {
        self.rooms.get(&slot(table, owner), 0)
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
        self.rooms
            .set(slot(table, owner), read.holding(held, limit), 0)
    }

    /// New flows of `owner` refused in `table` for `short` so far, over
    /// every CPU.
    pub fn refused(&self, table: FlowTable, owner: u32, short: Short) -> Result<u64, MapError> {
        let slot = refusal_slot(table, owner, short);
        Ok(self.refused.get(&slot, 0)?.iter().sum())
    }
}
