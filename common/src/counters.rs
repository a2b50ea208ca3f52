//! Layout of the per-CPU packet counters.

/// Which way a packet crosses the tunnel-facing device.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Leaving towards a peer.
    Egress = 0,
    /// Arriving from a peer.
    Ingress = 1,
}

/// What a NAT program did with one packet.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// At least one address was rewritten.
    Translated = 0,
    /// No rule applied; the packet went on untouched.
    Passed = 1,
    /// The packet could not be parsed; it went on untouched.
    Unparseable = 2,
    /// A flow needed masquerading and the conntrack had no room or no free
    /// port for it: dropped rather than sent where no reply could return.
    Dropped = 3,
}

/// Both directions, in slot order.
pub const DIRECTIONS: [Direction; 2] = [Direction::Egress, Direction::Ingress];
/// Every outcome, in slot order.
pub const OUTCOMES: [Outcome; 4] = [
    Outcome::Translated,
    Outcome::Passed,
    Outcome::Unparseable,
    Outcome::Dropped,
];

/// Number of slots in the counters map.
pub const SLOTS: u32 = (DIRECTIONS.len() * OUTCOMES.len()) as u32;

/// Index of the counter for `outcome` in `direction`.
pub const fn slot(direction: Direction, outcome: Outcome) -> u32 {
    direction as u32 * OUTCOMES.len() as u32 + outcome as u32
}

impl Direction {
    /// Lower-case name used in metrics and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Direction::Egress => "egress",
            Direction::Ingress => "ingress",
        }
    }
}

impl Outcome {
    /// Lower-case name used in metrics and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Translated => "translated",
            Outcome::Passed => "passed",
            Outcome::Unparseable => "unparseable",
            Outcome::Dropped => "dropped",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_distinct_and_dense() {
        let mut seen = [false; SLOTS as usize];
        for d in DIRECTIONS {
            for o in OUTCOMES {
                let s = slot(d, o) as usize;
                assert!(!seen[s], "slot {s} used twice");
                seen[s] = true;
            }
        }
        assert!(seen.iter().all(|s| *s));
    }
}
