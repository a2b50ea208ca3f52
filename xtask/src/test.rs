//! `cargo xtask test`: the suite in four tiers, each a test binary of its
//! own (or the crates' unit tests), so a tier links once and runs alone.

use std::time::{Duration, Instant};

use anyhow::Result;
use xtask::{
    lab::{self, LabTunnel},
    topology,
};

use crate::{build, cargo, fuzz};

/// A tier of the suite, cheapest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Tier {
    /// The crates' unit tests and the pure integration tests: no root, in
    /// parallel.
    Unit,
    /// `BPF_PROG_TEST_RUN` of the real programs: root, in parallel.
    Kernel,
    /// The reference lab: one test at a time, as they restart its agents.
    Lab,
    /// The WireGuard rekey interop, timing budgets, and the Liqo-peer lab.
    Slow,
}

const TIERS: [Tier; 4] = [Tier::Unit, Tier::Kernel, Tier::Lab, Tier::Slow];

/// Runs `only` that tier, or every tier and then the fuzz targets.
pub fn run(only: Option<Tier>) -> Result<()> {
    let started = Instant::now();
    build()?;
    if only.is_none_or(|tier| tier == Tier::Unit) {
        cargo(&["fmt", "--all", "--check"])?;
        cargo(&[
            "clippy",
            "--release",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ])?;
        fuzz::check()?;
    }
    // Every test binary is linked before the first tier starts, so that a
    // tier's time is its tests' time.
    cargo(&["test", "--release", "--no-run"])?;
    println!("build: done, tests included, in {:.1?}", started.elapsed());
    let tiers = only.map_or(TIERS.to_vec(), |tier| vec![tier]);
    let mut times = Vec::new();
    for tier in tiers {
        let tier_started = Instant::now();
        println!("==> tier {tier:?}");
        run_tier(tier)?;
        times.push((tier, tier_started.elapsed()));
        println!("tier {tier:?}: passed in {:.1?}", tier_started.elapsed());
    }
    if only.is_none() {
        let fuzz_started = Instant::now();
        fuzz::run(fuzz::CI_SECONDS)?;
        println!("fuzz: passed in {:.1?}", fuzz_started.elapsed());
    }
    println!("{}", report(&times));
    println!("test: everything passed in {:.1?}", started.elapsed());
    Ok(())
}

fn run_tier(tier: Tier) -> Result<()> {
    match tier {
        // The default members, as every tier selects: one feature
        // resolution, so the tiers share their builds.
        Tier::Unit => cargo(&["test", "--release", "--lib", "--bins", "--test", "unit"]),
        Tier::Kernel => cargo(&["test", "--release", "--test", "kernel"]),
        Tier::Lab => in_lab(None, &["--test", "lab", "--", "--test-threads=1"]),
        Tier::Slow => {
            in_lab(None, &["--test", "slow", "--", "--test-threads=1"])?;
            // The tests that need cluster b run as Liqo, in that lab of their own.
            in_lab(
                Some(&topology::B),
                &["--test", "slow", "--", "--ignored", "--test-threads=1"],
            )
        }
    }
}

/// Runs `cargo test --release <args>` with the lab up (cluster `liqo_peer`
/// run as Liqo, if given), and takes the lab down whatever happens.
fn in_lab(liqo_peer: Option<&'static topology::Cluster>, args: &[&str]) -> Result<()> {
    match liqo_peer {
        Some(cluster) => lab::up_with_liqo_peer(cluster)?,
        None => lab::up(LabTunnel::Userspace)?,
    }
    let tests = cargo(&[&["test", "--release"], args].concat());
    let down = lab::down();
    tests?;
    down
}

/// One line per tier: its wall time.
fn report(times: &[(Tier, Duration)]) -> String {
    let lines: Vec<String> = times
        .iter()
        .map(|(tier, took)| {
            format!(
                "  {:<7} {:>7.1} s",
                format!("{tier:?}").to_lowercase(),
                took.as_secs_f64()
            )
        })
        .collect();
    format!("tier times:\n{}", lines.join("\n"))
}
