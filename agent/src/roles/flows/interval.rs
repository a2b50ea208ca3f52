//! How long the collector waits between sweeps of dead flows. A sweep of
//! a table of a million flows costs a noticeable share of a core, and most
//! sweeps of a table of long-lived connections find nothing dead. So the
//! wait adapts to what the last sweep found, as Cilium's conntrack GC
//! does: it grows while sweeps find few dead flows, and shrinks when they
//! find many. Room stays bounded meanwhile: the collector still passes
//! within a second of a refusal, or of a peer filling its share.

use std::time::Duration;

/// What one sweep of a table found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// The flows it read.
    pub flows: usize,
    /// The dead ones it removed.
    pub expired: usize,
}

impl Swept {
    /// The share of the flows that were dead.
    fn dead_share(self) -> f64 {
        self.expired as f64 / self.flows.max(1) as f64
    }
}

/// Below this share of dead flows, the wait grows.
const FEW_DEAD: f64 = 0.05;
/// Above this share, it shrinks, as much as the share says.
const MANY_DEAD: f64 = 0.25;
/// At most this share counts: the wait shrinks at most tenfold at once.
const MOST_DEAD: f64 = 0.9;

/// The wait between sweeps, between the shortest and the longest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SweepInterval {
    shortest: Duration,
    longest: Duration,
    now: Duration,
}

impl SweepInterval {
    /// Starts at `shortest`; never past `longest` (nor below `shortest`).
    pub fn new(shortest: Duration, longest: Duration) -> Self {
        Self {
            shortest,
            longest: longest.max(shortest),
            now: shortest,
        }
    }

    /// The wait before the next sweep.
    pub fn now(&self) -> Duration {
        self.now
    }

    /// Adapts the wait to the sweep of every table that just ran, by the
    /// table with the largest share of dead flows. Nothing dead at all
    /// doubles the wait, few dead grow it by half.
    pub fn after(&mut self, tables: &[Swept]) {
        let dead = tables
            .iter()
            .map(|t| t.dead_share())
            .fold(0.0_f64, f64::max);
        let next = if tables.iter().all(|t| t.expired == 0) {
            self.now.saturating_mul(2)
        } else if dead < FEW_DEAD {
            self.now.mul_f64(1.5)
        } else if dead > MANY_DEAD {
            self.now.mul_f64(1.0 - dead.min(MOST_DEAD))
        } else {
            self.now
        };
        self.now = next.clamp(self.shortest, self.longest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHORTEST: Duration = Duration::from_secs(10);
    const LONGEST: Duration = Duration::from_mins(5);

    fn swept(flows: usize, expired: usize) -> Swept {
        Swept { flows, expired }
    }

    #[test]
    fn nothing_dead_doubles_the_wait_up_to_the_longest() {
        let mut interval = SweepInterval::new(SHORTEST, LONGEST);
        let mut waits = Vec::new();
        for _ in 0..7 {
            interval.after(&[swept(1_000_000, 0), swept(0, 0)]);
            waits.push(interval.now().as_secs());
        }
        assert_eq!(waits, [20, 40, 80, 160, 300, 300, 300]);
    }

    #[test]
    fn few_dead_grow_it_by_half_and_some_keep_it() {
        let mut interval = SweepInterval::new(SHORTEST, LONGEST);
        interval.after(&[swept(1000, 10)]);
        assert_eq!(interval.now(), Duration::from_secs(15));
        interval.after(&[swept(1000, 100)]);
        assert_eq!(interval.now(), Duration::from_secs(15));
    }

    #[test]
    fn many_dead_in_any_table_shrink_it_down_to_the_shortest() {
        let mut interval = SweepInterval::new(SHORTEST, LONGEST);
        for _ in 0..4 {
            interval.after(&[swept(10, 0)]);
        }
        assert_eq!(interval.now(), Duration::from_secs(160));
        // Half of one table dead: the wait halves, whatever the other found.
        interval.after(&[swept(1_000_000, 0), swept(100, 50)]);
        assert_eq!(interval.now(), Duration::from_secs(80));
        // All dead counts as nine tenths: a tenth of the wait, but never
        // below the shortest.
        interval.after(&[swept(100, 100)]);
        assert_eq!(interval.now(), SHORTEST);
    }

    #[test]
    fn a_longest_below_the_shortest_is_the_shortest() {
        let mut interval = SweepInterval::new(SHORTEST, Duration::from_secs(1));
        interval.after(&[swept(10, 0)]);
        assert_eq!(interval.now(), SHORTEST);
    }
}
