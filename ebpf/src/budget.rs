//! Each owner's budget of new entries per second in the fragment table
//! (`isthmus_common::budget`): a first fragment past its owner's budget,
//! or past the peers' room, is not remembered, and only its own
//! datagram's later fragments pay.

use core::{
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr::{addr_of, addr_of_mut, read_volatile, write_volatile},
};

use aya_ebpf::{btf_maps::Array, helpers::bpf_ktime_get_ns, macros::btf_map};
use isthmus_common::{
    budget::{BUDGET_SLOTS, Budget, Spend},
    room::{ALL_PEERS, OWNER_LOCAL, Short, owner_of},
};

/// Each owner's budget, then the peers' together.
#[btf_map(name = "ist_frag_budget")]
static FRAGMENT_BUDGETS: Array<Budget, { BUDGET_SLOTS as usize }> = Array::new();

/// Charges a new entry of the fragment table to peer `peer_id` (the
/// gateway with [`OWNER_LOCAL`]) and to the peers' room; false, and
/// counted against the owner, when either is spent.
///
/// A subprogram, not inlined: only a datagram's first fragment calls it,
/// and inlined, its branches cost the IPv4 NAT some 25,000 of the
/// verifier's instructions, walked in every state that reaches them.
#[inline(never)]
pub fn take_fragment(peer_id: u32) -> bool {
    charge_fragment(peer_id)
}

/// [`take_fragment`], inlined: for the IPv6 programs, whose frames leave
/// no room for a subprogram's. A program that tail calls may use 512
/// bytes of stack in all its frames together, and the IPv6 masquerade
/// uses nearly all of them alone.
#[inline(always)]
pub fn charge_fragment(peer_id: u32) -> bool {
    let owner = owner_of(peer_id);
    let Some(own) = FRAGMENT_BUDGETS.get_ptr_mut(owner) else {
        return true;
    };
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: pointers to live array entries, from the map.
    unsafe {
        if !spend(own, now) {
            count_refused(own, Short::Share);
            return false;
        }
        if owner != OWNER_LOCAL
            && let Some(all) = FRAGMENT_BUDGETS.get_ptr_mut(ALL_PEERS)
            && !spend(all, now)
        {
            count_refused(own, Short::Table);
            return false;
        }
    }
    true
}

/// Spends one entry of `budget` at `now`, if it has one left.
///
/// # Safety
/// `budget` points to a live entry of [`FRAGMENT_BUDGETS`].
#[inline(always)]
unsafe fn spend(budget: *mut Budget, now: u64) -> bool {
    // SAFETY: aligned fields of a live entry, each read and written whole;
    // other CPUs add to `spent`, and the agent rewrites the entry.
    unsafe {
        let seen = Budget {
            limit: read_volatile(addr_of!((*budget).limit)),
            opened: read_volatile(addr_of!((*budget).opened)),
            spent: read_volatile(addr_of!((*budget).spent)),
            refused: [0; 2],
        };
        match seen.spend(now) {
            Spend::Unbounded => true,
            Spend::Opens => {
                write_volatile(addr_of_mut!((*budget).opened), now);
                write_volatile(addr_of_mut!((*budget).spent), 1);
                true
            }
            Spend::Fits => {
                atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(
                    addr_of_mut!((*budget).spent),
                    1,
                );
                true
            }
            Spend::Refused => false,
        }
    }
}

/// # Safety
/// `budget` points to a live entry of [`FRAGMENT_BUDGETS`].
#[inline(always)]
unsafe fn count_refused(budget: *mut Budget, short: Short) {
    // SAFETY: an aligned u64 of a live entry, only changed atomically here.
    unsafe {
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(
            addr_of_mut!((*budget).refused[short as usize]),
            1,
        );
    }
}
