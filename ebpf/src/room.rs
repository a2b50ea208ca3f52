//! Each owner's room in the flow tables (`isthmus_common::room`): a new
//! flow is charged to its owner, and refused past the owner's limit or
//! past the room every peer shares.

use core::{
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr::{addr_of, addr_of_mut, read_volatile},
};

use aya_ebpf::{
    btf_maps::{Array, PerCpuArray},
    macros::btf_map,
};
use isthmus_common::room::{
    ALL_PEERS, FlowTable, OWNER_LOCAL, REFUSAL_SLOTS, Room, SLOTS, Short, owner_of, refusal_slot,
    slot,
};

use crate::maps;

/// Each owner's limit and what it was charged.
#[btf_map(name = "ist_room")]
static ROOMS: Array<Room, { SLOTS as usize }> = Array::new();

/// New flows refused, by owner and reason; summed over CPUs by the agent.
#[btf_map(name = "ist_room_refuse")]
static REFUSED: PerCpuArray<u64, { REFUSAL_SLOTS as usize }> = PerCpuArray::new();

/// Charges a new flow to peer `peer_id`'s room in `table` (the gateway's
/// own with [`OWNER_LOCAL`]), and to the room all peers share. Concurrent
/// inserts may each see the last free entry: a limit can be passed by
/// one flow per CPU, never more.
#[inline(always)]
pub fn take(table: FlowTable, peer_id: u32) -> Result<(), Short> {
    let owner = owner_of(peer_id);
    let entries = table.entries_per_flow();
    let Some(own) = ROOMS.get_ptr_mut(slot(table, owner)) else {
        return Ok(());
    };
    // SAFETY: pointers to live array entries, from the map.
    unsafe {
        if !fits(own, entries) {
            refused(table, peer_id, Short::Share);
            return Err(Short::Share);
        }
        if owner != OWNER_LOCAL
            && let Some(all) = ROOMS.get_ptr_mut(slot(table, ALL_PEERS))
        {
            if !fits(all, entries) {
                refused(table, peer_id, Short::Table);
                return Err(Short::Table);
            }
            charge(all, entries);
        }
        charge(own, entries);
    }
    Ok(())
}

/// Gives back what [`take`] charged, for a flow that was not inserted.
#[inline(always)]
pub fn give_back(table: FlowTable, peer_id: u32) {
    let owner = owner_of(peer_id);
    let entries = table.entries_per_flow().wrapping_neg();
    charge_slot(table, owner, entries);
    if owner != OWNER_LOCAL {
        charge_slot(table, ALL_PEERS, entries);
    }
}

#[inline(always)]
fn charge_slot(table: FlowTable, owner: u32, entries: u64) {
    if let Some(room) = ROOMS.get_ptr_mut(slot(table, owner)) {
        // SAFETY: a pointer to a live array entry, from the map.
        unsafe { charge(room, entries) };
    }
}

/// Counts a new flow of `peer_id` refused for `short`: by [`take`], or
/// when the table itself had no room.
#[inline(always)]
pub fn refused(table: FlowTable, peer_id: u32, short: Short) {
    maps::increment(&REFUSED, refusal_slot(table, owner_of(peer_id), short));
}

/// # Safety
/// `room` points to a live entry of [`ROOMS`].
#[inline(always)]
unsafe fn fits(room: *mut Room, entries: u64) -> bool {
    // SAFETY: aligned fields of a live entry, each read whole; other CPUs
    // add to `charged`, and the agent rewrites the entry.
    unsafe {
        let charged = read_volatile(addr_of!((*room).charged));
        let room = Room {
            limit: read_volatile(addr_of!((*room).limit)),
            released: read_volatile(addr_of!((*room).released)),
            charged,
        };
        room.fits(charged, entries)
    }
}

/// # Safety
/// `room` points to a live entry of [`ROOMS`].
#[inline(always)]
unsafe fn charge(room: *mut Room, entries: u64) {
    // SAFETY: an aligned u64 of a live entry, only changed atomically here.
    unsafe {
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(addr_of_mut!((*room).charged), entries)
    };
}
