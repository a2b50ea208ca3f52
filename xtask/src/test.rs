//! `cargo xtask test`: the suite in five tiers, each a test binary of its
//! own (or the crates' unit tests), so a tier links once and runs alone.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use isthmus_lab::{
    lab::{self, LiqoPeer, Setup, liqo_v1_peer::Side},
    target_dir, topology,
};

use crate::{build, cargo, cargo_command, fuzz, logged::Logged, syscalls};

/// A tier of the suite, cheapest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Tier {
    /// The crates' unit tests and the pure integration tests: no root, in
    /// parallel.
    Unit,
    /// `BPF_PROG_TEST_RUN` of the real programs: root, in parallel.
    Kernel,
    /// The reference lab: one test at a time, as they restart its agents.
    /// Beside them, the WireGuard rekey interop of the slow tests.
    Lab,
    /// The lab with every agent run from its image under the DaemonSets'
    /// container settings: the image, the privileges, and the demo's
    /// rows, the hub, the conncheck, metrics, restart and failover there.
    Containers,
    /// Timing budgets, and the Liqo-peer labs.
    Slow,
}

/// A whole run's order. The slow tier follows the lab tier, so that its
/// first tests run in the lab the lab tier leaves up.
const TIERS: [Tier; 5] = [
    Tier::Unit,
    Tier::Kernel,
    Tier::Lab,
    Tier::Slow,
    Tier::Containers,
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
/// Clippy checks the fuzz targets with the rest, so a change of the
/// agent's API that breaks them fails early; their instrumented build
/// waits for the end, beside the fuzzing.
pub fn run(only: Option<Tier>) -> Result<()> {
    let started = Instant::now();
    let mut phases = Phases::default();
    let outcome = run_phases(only, &mut phases);
    // Printed on failure too: a run that fails late shows where its time went.
    println!("{phases}");
    outcome?;
    println!("test: everything passed in {:.1?}", started.elapsed());
    Ok(())
}

fn run_phases(only: Option<Tier>, phases: &mut Phases) -> Result<()> {
    phases.time("build", build)?;
    phases.time("fmt", || cargo(&["fmt", "--all", "--check"]))?;
    if only.is_none_or(|tier| tier == Tier::Unit) {
        phases.time("clippy", || cargo(&CLIPPY))?;
    }
    // Every test binary is linked before the first tier starts, so that a
    // tier's time is its tests' time.
    phases.time("test build", || cargo(&["test", "--release", "--no-run"]))?;
    let tiers = only.map_or(TIERS.to_vec(), |tier| vec![tier]);
    // One lab serves consecutive runs that ask for the same one.
    let mut lab = LabUp::default();
    for tier in tiers {
        println!("==> tier {tier:?}");
        let uptime = syscalls::kernel_uptime()?;
        let took = phases.time(tier.name(), || {
            tier.runs().iter().try_for_each(|run| lab.run(run))
        })?;
        syscalls::none_refused_since(uptime)?;
        println!("tier {tier:?}: passed in {took:.1?}");
    }
    lab.take_down()?;
    if only.is_none() {
        phases.time("fuzz build", fuzz::build)?;
        phases.time("fuzz", || fuzz::run(fuzz::CI_SECONDS))?;
    }
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

/// One `cargo test --release` of a tier, and the lab it needs.
struct TestRun {
    lab: Option<Setup>,
    args: Vec<&'static str>,
    /// A second `cargo test --release`, run at the same time: tests that
    /// wait on a protocol's timer, in namespaces of their own, and leave
    /// the CPU to the first.
    beside: Vec<&'static str>,
}

impl TestRun {
    fn bare(args: &[&'static str]) -> Self {
        Self {
            lab: None,
            args: args.to_vec(),
            beside: Vec::new(),
        }
    }

    fn in_lab(lab: Setup, args: &[&'static str]) -> Self {
        Self {
            lab: Some(lab),
            ..Self::bare(args)
        }
    }

    fn beside(self, args: &[&'static str]) -> Self {
        Self {
            beside: args.to_vec(),
            ..self
        }
    }
}

/// The slow tests that wait minutes for WireGuard's timers, each in
/// namespaces of its own: the rekey interop with wireguard-go, and a
/// silent peer's rounds of handshakes. They run beside the lab tier, in
/// the lab that tier brings up, and the slow tier skips them.
const BESIDE_THE_LAB: [&str; 2] = ["wireguard_go_interop::", "silent_peer::"];

impl Tier {
    fn runs(self) -> Vec<TestRun> {
        // One test at a time in a lab: the tests restart its agents.
        let one_by_one = |binary, filters: &[&'static str]| {
            [&["--test", binary, "--", "--test-threads=1"], filters].concat()
        };
        let with_liqo = |liqo| Setup {
            liqo: Some(liqo),
            ..Setup::default()
        };
        match self {
            // The default members, as every tier selects: one feature
            // resolution, so the tiers share their builds.
            // The binaries by name: `--bins` would take the fuzz targets
            // too, overriding their `test = false`, and run libFuzzer
            // without end.
            Tier::Unit => vec![TestRun::bare(&[
                "--lib",
                "--bin",
                "isthmus-agent",
                "--bin",
                "xtask",
                "--test",
                "unit",
            ])],
            Tier::Kernel => vec![TestRun::bare(&["--test", "kernel"])],
            Tier::Lab => vec![
                TestRun::in_lab(
                    Setup::default(),
                    &one_by_one("lab", &["--skip", "containers::"]),
                )
                .beside(&one_by_one("slow", &BESIDE_THE_LAB)),
            ],
            Tier::Containers => vec![TestRun::in_lab(
                Setup {
                    containers: true,
                    ..Setup::default()
                },
                &one_by_one("lab", IN_CONTAINERS),
            )],
            // The dual-stack lab's tests follow the slow ones, in a lab of
            // their own. The tests that need cluster b run as Liqo come
            // last, in labs of their own: v0.10's, then v1's with Isthmus
            // as the client of b's gateway, then as its server; then every
            // cluster on Liqo v1's API, dual-stack.
            Tier::Slow => {
                let liqo = |peer, module| {
                    TestRun::in_lab(with_liqo(peer), &one_by_one("slow", &["--ignored", module]))
                };
                vec![
                    TestRun::in_lab(
                        Setup::default(),
                        &one_by_one("slow", &BESIDE_THE_LAB.map(|t| ["--skip", t]).concat()),
                    ),
                    TestRun::in_lab(
                        Setup {
                            dual_stack: true,
                            ..Setup::default()
                        },
                        &one_by_one("lab", &["--ignored", "dual_stack::"]),
                    ),
                    liqo(LiqoPeer::V0_10(&topology::B), "liqo_v0_10_interop::"),
                    liqo(LiqoPeer::V1(Side::Client), "liqo_v1_interop::"),
                    liqo(LiqoPeer::V1(Side::Server), "liqo_v1_interop::"),
                    TestRun::in_lab(
                        Setup {
                            liqo_api_v1: true,
                            dual_stack: true,
                            ..Setup::default()
                        },
                        &one_by_one("slow", &["--ignored", "liqo_v1_api::"]),
                    ),
                ]
            }
        }
    }
}

/// The lab that is up, if any. Dropped, it takes the lab down whatever
/// happened.
#[derive(Default)]
struct LabUp(Option<Setup>);

impl LabUp {
    /// Runs `run`, in the lab it needs: the one up if it is that one, or
    /// else a fresh one.
    fn run(&mut self, run: &TestRun) -> Result<()> {
        if self.0 != run.lab {
            self.take_down()?;
            if let Some(wanted) = &run.lab {
                lab::up(wanted)?;
                self.0 = Some(wanted.clone());
            }
        }
        let beside = (!run.beside.is_empty())
            .then(|| Beside::start(&run.beside))
            .transpose()?;
        let outcome = cargo(&[&["test", "--release"], run.args.as_slice()].concat());
        // Waited for even when the first failed: it ends by itself, and
        // takes down what it set up.
        let beside_outcome = beside.map_or(Ok(()), Beside::finish);
        outcome.and(beside_outcome)
    }

    fn take_down(&mut self) -> Result<()> {
        match self.0.take() {
            Some(_) => lab::down(),
            None => Ok(()),
        }
    }
}

impl Drop for LabUp {
    fn drop(&mut self) {
        if let Err(e) = self.take_down() {
            eprintln!("test: taking the lab down: {e:#}");
        }
    }
}

/// A `cargo test --release` running beside another, its output in a log
/// of its own so that the two do not interleave.
struct Beside {
    run: Logged,
    command: String,
}

impl Beside {
    fn start(args: &[&str]) -> Result<Self> {
        let args = [&["test", "--release"], args].concat();
        let command = format!("cargo {}", args.join(" "));
        let mut cargo = cargo_command(env!("CARGO"));
        cargo.args(&args);
        let run = Logged::start(cargo, &command, target_dir().join("test-beside.log"))?;
        println!("==> {command}, beside, logged to {}", run.log().display());
        Ok(Self { run, command })
    }

    /// Waits for the run, prints its log, and fails if it failed.
    fn finish(self) -> Result<()> {
        let (status, text) = self.run.wait()?;
        println!("==> {}, beside:", self.command);
        print!("{text}");
        if !status.success() {
            bail!("`{}` failed ({status})", self.command);
        }
        Ok(())
    }
}

/// Each phase of a run and its wall time, in order.
#[derive(Default)]
struct Phases(Vec<(&'static str, Duration)>);

impl Phases {
    /// Runs `phase`, recording its wall time as `name`'s, whether it
    /// passes or fails.
    fn time(&mut self, name: &'static str, phase: impl FnOnce() -> Result<()>) -> Result<Duration> {
        let started = Instant::now();
        let outcome = phase();
        let took = started.elapsed();
        self.0.push((name, took));
        outcome.map(|()| took)
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

#[cfg(test)]
mod tests {
    use super::Tier;

    /// The unit tier names its binaries, since `--bins` would run the fuzz
    /// targets: every binary of a default member that has tests must be
    /// among them.
    #[test]
    fn the_unit_tier_names_every_binary_that_has_tests() {
        let out = crate::cargo_command(env!("CARGO"))
            .args(["metadata", "--no-deps", "--format-version", "1"])
            .output()
            .expect("running cargo metadata");
        assert!(out.status.success(), "cargo metadata: {out:?}");
        let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let default_members = metadata["workspace_default_members"].as_array().unwrap();
        let runs = Tier::Unit.runs();
        let args = &runs[0].args;
        let named = |bin: &str| args.windows(2).any(|w| w == ["--bin", bin]);
        let mut checked = 0;
        for package in metadata["packages"].as_array().unwrap() {
            if !default_members.contains(&package["id"]) {
                continue;
            }
            for target in package["targets"].as_array().unwrap() {
                let is_bin = target["kind"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|k| k == "bin");
                if is_bin && target["test"] == true {
                    let name = target["name"].as_str().unwrap();
                    assert!(named(name), "the unit tier does not run {name}'s tests");
                    checked += 1;
                }
            }
        }
        assert!(checked > 0, "no binary with tests found: {args:?}");
    }
}
