//! A table every peer shares, split so that no peer can take another's
//! room: max-min fairness. Each peer gets what it asks for up to an equal
//! share of what is left; what a small peer leaves goes to the larger
//! ones. A peer within its share keeps every entry however large another
//! peer's demand grows.

/// How many entries each of `demands` may have in a table of `capacity`,
/// in the same order: each at most its demand, all together at most
/// `capacity`, and none less than an equal share of what the peers that
/// ask for more leave.
pub fn fair_shares(demands: &[usize], capacity: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by_key(|&i| demands[i]);
    let mut shares = vec![0; demands.len()];
    let mut left = capacity;
    for (served, &i) in order.iter().enumerate() {
        let waiting = demands.len() - served;
        // What is left, equally among those still waiting; the first ones
        // (by demand, then by order) get the remainder's extra entries.
        let level = left.div_ceil(waiting);
        let share = demands[i].min(level);
        shares[i] = share;
        left -= share;
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_demands_are_met_and_the_large_ones_share_the_rest() {
        assert_eq!(fair_shares(&[2, 100_000, 3], 65_536), [2, 65_531, 3]);
        assert_eq!(fair_shares(&[40_000, 40_000], 65_536), [32_768, 32_768]);
        assert_eq!(fair_shares(&[50_000, 10, 50_000], 100), [45, 10, 45]);
        // Uneven remainders still fill the table exactly.
        assert_eq!(fair_shares(&[10, 10, 10], 10).iter().sum::<usize>(), 10);
        assert_eq!(fair_shares(&[], 10), Vec::<usize>::new());
        assert_eq!(fair_shares(&[5, 7], 100), [5, 7]);
    }

    #[test]
    fn a_peer_within_its_share_keeps_everything_whatever_another_asks() {
        for flood in [0, 10, 1_000, 1_000_000] {
            let shares = fair_shares(&[flood, 300], 1_000);
            assert_eq!(shares[1], 300, "flood {flood}");
            assert!(shares.iter().sum::<usize>() <= 1_000);
        }
    }
}
