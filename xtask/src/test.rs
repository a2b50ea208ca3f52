//! `cargo xtask test`: the suite in four tiers, each a test binary of its
//! own (or the crates' unit tests), so a tier links once and runs alone.

use std::time::{Duration, Instant};

use anyhow::Result;
use isthmus_lab::{
    lab::{self, LabTunnel, liqo_v1_peer::Side},
    topology,
};

use crate::{build, cargo, fuzz, syscalls};

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
    /// The lab with every agent run from its image under the DaemonSets'
    /// container settings: the image, the privileges, and the demo's
    /// rows, the hub, the conncheck, metrics, restart and failover there.
    Containers,
    /// The WireGuard rekey interop, timing budgets, and the Liqo-peer lab.
    Slow,
}

const TIERS: [Tier; 5] = [
    Tier::Unit,
    Tier::Kernel,
    Tier::Lab,
    Tier::Containers,
    Tier::Slow,
];

/// The lab tests the container tier runs, by name prefix. The restart in
/// place of a process has a bound (200 ms) no container runtime meets;
/// `containers::` replaces it with a container's.
const IN_CONTAINERS: &[&str] = &[
    "containers::",
    "reachability::",
    "hub::",
    "conncheck::",
    "metrics::",
    "ha::",
    "--skip",
    "ha::restarting_the_gateway_agent_in_place",
];

/// Runs `only` that tier, or every tier and then the fuzz targets.
///
/// A whole run builds the fuzz targets right after the workspace: the
/// build type-checks them against the agent's API early, and the
/// fuzzing at the end then only runs them.
pub fn run(only: Option<Tier>) -> Result<()> {
    let started = Instant::now();
    let mut phases = Phases::default();
    phases.time("build", build)?;
    phases.time("fmt", || cargo(&["fmt", "--all", "--check"]))?;
    if only.is_none_or(|tier| tier == Tier::Unit) {
        phases.time("clippy", || cargo(&CLIPPY))?;
    }
    match only {
        None => phases.time("fuzz build", fuzz::build).map(drop)?,
        Some(Tier::Unit) => phases.time("fuzz check", fuzz::check).map(drop)?,
        Some(_) => {}
    }
    // Every test binary is linked before the first tier starts, so that a
    // tier's time is its tests' time.
    phases.time("test build", || cargo(&["test", "--release", "--no-run"]))?;
    let tiers = only.map_or(TIERS.to_vec(), |tier| vec![tier]);
    for tier in tiers {
        println!("==> tier {tier:?}");
        let uptime = syscalls::kernel_uptime()?;
        let took = phases.time(tier.name(), || run_tier(tier))?;
        syscalls::none_refused_since(uptime)?;
        println!("tier {tier:?}: passed in {took:.1?}");
    }
    if only.is_none() {
        phases.time("fuzz", || fuzz::run(fuzz::CI_SECONDS))?;
    }
    println!("{phases}");
    println!("test: everything passed in {:.1?}", started.elapsed());
    Ok(())
}

/// Clippy as the suite runs it: every target, warnings as errors.
const CLIPPY: [&str; 6] = [
    "clippy",
    "--release",
    "--all-targets",
    "--",
    "-D",
    "warnings",
];

fn run_tier(tier: Tier) -> Result<()> {
    match tier {
        // The default members, as every tier selects: one feature
        // resolution, so the tiers share their builds.
        Tier::Unit => cargo(&["test", "--release", "--lib", "--bins", "--test", "unit"]),
        Tier::Kernel => cargo(&["test", "--release", "--test", "kernel"]),
        Tier::Lab => in_lab(
            Lab::Processes,
            &[
                "--test",
                "lab",
                "--",
                "--test-threads=1",
                "--skip",
                "containers::",
            ],
        ),
        Tier::Containers => {
            let image = isthmus_lab::image::build()?;
            println!("image: {}, {:.1} MB", image.exact, image.size as f64 / 1e6);
            let args = [&["--test", "lab", "--", "--test-threads=1"], IN_CONTAINERS].concat();
            in_lab(Lab::Containers, &args)
        }
        Tier::Slow => {
            in_lab(
                Lab::Processes,
                &["--test", "slow", "--", "--test-threads=1"],
            )?;
            // The tests that need cluster b run as Liqo, in those labs of
            // their own: v0.10's, then v1's.
            let liqo_lab = |module| {
                [
                    "--test",
                    "slow",
                    "--",
                    "--ignored",
                    "--test-threads=1",
                    module,
                ]
            };
            in_lab(
                Lab::LiqoV0_10Peer(&topology::B),
                &liqo_lab("liqo_v0_10_interop::"),
            )?;
            // Isthmus as the client of b's gateway, then as its server.
            for side in [Side::Client, Side::Server] {
                in_lab(Lab::LiqoV1Peer(side), &liqo_lab("liqo_v1_interop::"))?;
            }
            Ok(())
        }
    }
}

/// The lab a tier runs in.
enum Lab {
    /// Every agent a process.
    Processes,
    /// Every agent in a container.
    Containers,
    /// This cluster run as Liqo, the others' agents processes.
    LiqoV0_10Peer(&'static topology::Cluster),
    /// Cluster b run as Liqo v1, served by a on this side of the tunnel.
    LiqoV1Peer(Side),
}

/// Runs `cargo test --release <args>` with `setup` up, and takes the lab
/// down whatever happens.
fn in_lab(setup: Lab, args: &[&str]) -> Result<()> {
    match setup {
        Lab::Processes => lab::up(LabTunnel::Userspace)?,
        Lab::Containers => lab::up_in_containers(LabTunnel::Userspace)?,
        Lab::LiqoV0_10Peer(cluster) => lab::up_with_liqo_v0_10_peer(cluster)?,
        Lab::LiqoV1Peer(side) => lab::up_with_liqo_v1_peer(side)?,
    }
    let tests = cargo(&[&["test", "--release"], args].concat());
    let down = lab::down();
    tests?;
    down
}

/// Each phase of a run and its wall time, in order.
#[derive(Default)]
struct Phases(Vec<(&'static str, Duration)>);

impl Phases {
    /// Runs `phase`, recording its wall time as `name`'s.
    fn time(&mut self, name: &'static str, phase: impl FnOnce() -> Result<()>) -> Result<Duration> {
        let started = Instant::now();
        phase()?;
        let took = started.elapsed();
        self.0.push((name, took));
        Ok(took)
    }
}

impl std::fmt::Display for Phases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "phase times:")?;
        for (name, took) in &self.0 {
            writeln!(f, "  {name:<12} {:>7.1} s", took.as_secs_f64())?;
        }
        Ok(())
    }
}

impl Tier {
    /// Lower-case name, as `--tier` takes it.
    fn name(self) -> &'static str {
        match self {
            Tier::Unit => "unit",
            Tier::Kernel => "kernel",
            Tier::Lab => "lab",
            Tier::Containers => "containers",
            Tier::Slow => "slow",
        }
    }
}
