//! The kernel's own count of the time spent in Isthmus's NAT programs
//! (`BPF_ENABLE_STATS`), read around a bench's traffic: the datapath's cost
//! per packet, without the noise of the traffic generator and the rest of
//! the path.

use std::{collections::BTreeMap, os::fd::OwnedFd, path::PathBuf};

use anyhow::{Context, Result};
use aya::{
    programs::ProgramInfo,
    sys::{Stats, enable_stats},
};
use isthmus_lab::{
    lab,
    topology::{A, B},
};

/// The programs every packet of the NAT bench runs: the SNAT at `a-gw`
/// and the DNAT at `b-gw`.
pub(super) const NAT_PROGRAMS: [&str; 2] = ["nat_egress_eth", "nat_ingress_eth"];

/// The node that runs `program` of [`NAT_PROGRAMS`] for the bench's
/// packets.
pub(super) fn node_of(program: &str) -> String {
    if program == NAT_PROGRAMS[0] {
        A.gw()
    } else {
        B.gw()
    }
}

/// Where that node's agent pins `program`.
pub(super) fn pinned(program: &str) -> PathBuf {
    lab::pins(&node_of(program)).program(program)
}

/// The kernel counts run time while this lives, and stops when it drops.
struct Counting {
    _stats: OwnedFd,
}

/// Starts the kernel's counting of every program's run time and runs.
fn start_counting() -> Result<Counting> {
    enable_stats(Stats::RunTime)
        .map(|stats| Counting { _stats: stats })
        .context("BPF_ENABLE_STATS, which needs root and Linux 5.8")
}

/// The kernel's time per run of each of [`NAT_PROGRAMS`] loaded, over
/// `traffic`: a pass of its own, after the one whose rate is measured,
/// since counting costs every program run two clock reads, which the
/// shipped agents do not pay. Without Isthmus on the way, no pass.
pub(super) fn time_per_run<T>(
    traffic: impl FnOnce() -> Result<T>,
) -> Result<BTreeMap<&'static str, f64>> {
    if Snapshot::take()?.0.is_empty() {
        return Ok(BTreeMap::new());
    }
    println!("bench:   the same traffic again, its programs timed");
    let _counting = start_counting()?;
    let before = Snapshot::take()?;
    traffic()?;
    Ok(Snapshot::take()?.ns_per_run_since(&before))
}

/// Run time (ns) and runs of each of [`NAT_PROGRAMS`] that its node's
/// agent has loaded.
#[derive(Clone, Debug, Default)]
pub(super) struct Snapshot(BTreeMap<&'static str, (u64, u64)>);

impl Snapshot {
    /// The counts now.
    pub(super) fn take() -> Result<Self> {
        let mut counts = BTreeMap::new();
        for name in NAT_PROGRAMS {
            let pin = pinned(name);
            // No pin, no Isthmus on that node in this setup.
            if !pin.exists() {
                continue;
            }
            let program = ProgramInfo::from_pin(&pin)
                .with_context(|| format!("reading the info of {}", pin.display()))?;
            let ns = u64::try_from(program.run_time().as_nanos()).unwrap_or(u64::MAX);
            counts.insert(name, (ns, program.run_count()));
        }
        Ok(Self(counts))
    }

    /// Nanoseconds per run of each program that ran since `earlier`, as
    /// long as the same programs stayed loaded.
    pub(super) fn ns_per_run_since(&self, earlier: &Snapshot) -> BTreeMap<&'static str, f64> {
        self.0
            .iter()
            .filter_map(|(name, (ns, runs))| {
                let (ns_before, runs_before) = earlier.0.get(name).copied().unwrap_or_default();
                let runs = runs.checked_sub(runs_before).filter(|r| *r > 0)?;
                let ns = ns.checked_sub(ns_before)?;
                Some((*name, ns as f64 / runs as f64))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Snapshot;

    #[test]
    fn only_the_programs_that_ran_since_get_a_time_per_run() {
        let earlier = Snapshot(
            [
                ("nat_egress_eth", (1_000, 10)),
                ("nat_ingress_eth", (500, 5)),
            ]
            .into(),
        );
        let later = Snapshot(
            [
                ("nat_egress_eth", (4_000, 40)),
                ("nat_ingress_eth", (500, 5)),
            ]
            .into(),
        );
        assert_eq!(
            later.ns_per_run_since(&earlier),
            [("nat_egress_eth", 100.0)].into()
        );
    }

    #[test]
    fn a_program_loaded_again_in_between_gives_no_figure() {
        let earlier = Snapshot([("nat_egress_eth", (9_000, 90))].into());
        let reloaded = Snapshot([("nat_egress_eth", (300, 3))].into());
        assert!(reloaded.ns_per_run_since(&earlier).is_empty());
    }
}
