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
        let uptime = syscalls::kernel_uptime()?;
        run_tier(tier)?;
        syscalls::none_refused_since(uptime)?;
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
                Lab::LiqoPeer(&topology::B),
                &liqo_lab("liqo_peer_interop::"),
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
    LiqoPeer(&'static topology::Cluster),
    /// Cluster b run as Liqo v1, served by a on this side of the tunnel.
    LiqoV1Peer(Side),
}

/// Runs `cargo test --release <args>` with `setup` up, and takes the lab
/// down whatever happens.
fn in_lab(setup: Lab, args: &[&str]) -> Result<()> {
    match setup {
        Lab::Processes => lab::up(LabTunnel::Userspace)?,
        Lab::Containers => lab::up_in_containers(LabTunnel::Userspace)?,
        Lab::LiqoPeer(cluster) => lab::up_with_liqo_peer(cluster)?,
        Lab::LiqoV1Peer(side) => lab::up_with_liqo_v1_peer(side)?,
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
