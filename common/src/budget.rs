//! Each owner's budget of new entries per second in the fragment table
//! (docs/design.md#masquerade).
//!
//! The fragment table is an LRU: a new entry pushes out the oldest, and
//! nobody sees which. So its share is a rate, not a count held. Each
//! owner (the peer that sent a datagram's first fragment, or whose
//! transit datagram is masqueraded; the gateway itself for its own) may
//! add at most `limit` entries per window, and all peers together at most
//! the peers' room. The peers' room is smaller than the table, so in any
//! window the peers push out fewer entries than it holds, and a datagram's
//! entry outlives the milliseconds its later fragments take, whoever
//! floods. Owners are numbered as in [`crate::room`].
//!
//! The kernel opens a window, counts what it adds in it, and counts what
//! it refuses; the agent only sets the limits. Two CPUs that open a window
//! at once may each count from one: a limit can be passed by one entry
//! per CPU, never more.

use crate::room::{SHORTS, SLOTS_PER_TABLE, Short};

/// How long a window lasts (ns).
pub const WINDOW_NS: u64 = 1_000_000_000;

/// Slots of the budget map: every owner, then [`crate::room::ALL_PEERS`].
pub const BUDGET_SLOTS: u32 = SLOTS_PER_TABLE;

/// One owner's budget.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    /// Entries the owner may add per window, as the agent sets it; 0: no
    /// bound but the table's.
    pub limit: u64,
    /// When the current window opened (ns since boot).
    pub opened: u64,
    /// Entries added in the current window.
    pub spent: u64,
    /// Entries refused, ever, by [`Short`]: past the owner's own limit,
    /// or past the peers' room.
    pub refused: [u64; SHORTS.len()],
}

assert_layout!(Budget, size = 40, align = 8);

/// What one more entry does to a budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spend {
    /// No limit is set: nothing to count.
    Unbounded,
    /// The window is over: a new one opens with this entry.
    Opens,
    /// It fits in the current window.
    Fits,
    /// The window's limit is reached.
    Refused,
}

impl Budget {
    /// What one more entry at `now` does.
    pub const fn spend(&self, now: u64) -> Spend {
        if self.limit == 0 {
            Spend::Unbounded
        } else if now.wrapping_sub(self.opened) >= WINDOW_NS {
            Spend::Opens
        } else if self.spent < self.limit {
            Spend::Fits
        } else {
            Spend::Refused
        }
    }

    /// This budget with `limit`, its window and counts as they were.
    #[must_use]
    pub const fn with_limit(self, limit: u64) -> Self {
        Self { limit, ..self }
    }

    /// Entries refused for `short`, ever.
    pub const fn refused(&self, short: Short) -> u64 {
        self.refused[short as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_takes_up_to_its_limit_and_the_next_opens_anew() {
        let budget = Budget {
            limit: 2,
            opened: 5 * WINDOW_NS,
            spent: 1,
            refused: [0; 2],
        };
        let now = 5 * WINDOW_NS + 10;
        assert_eq!(budget.spend(now), Spend::Fits);
        let full = Budget { spent: 2, ..budget };
        assert_eq!(full.spend(now), Spend::Refused);
        assert_eq!(full.spend(6 * WINDOW_NS - 1), Spend::Refused);
        assert_eq!(full.spend(6 * WINDOW_NS), Spend::Opens);
        // Before the first, the window is the boot's: over once a second passed.
        assert_eq!(Budget::default().with_limit(1).spend(now), Spend::Opens);
        assert_eq!(full.with_limit(0).spend(now), Spend::Unbounded);
    }

    #[test]
    fn a_new_limit_keeps_the_window_and_the_counts() {
        let budget = Budget {
            limit: 2,
            opened: 7,
            spent: 2,
            refused: [3, 4],
        };
        let raised = budget.with_limit(9);
        assert_eq!((raised.opened, raised.spent, raised.limit), (7, 2, 9));
        assert_eq!(
            (raised.refused(Short::Share), raised.refused(Short::Table)),
            (3, 4)
        );
        assert_eq!(raised.spend(8), Spend::Fits);
    }
}
