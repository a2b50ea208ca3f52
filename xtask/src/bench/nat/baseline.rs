//! The `--baseline` build's rounds of the NAT bench: its agents carry the
//! traffic, and both builds' NAT programs are timed in turns, in both
//! orders.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use isthmus_lab::lab;

use super::{
    ByProgram, Flow, Measured, NatPrograms, disable_isthmus, nat_gateways, set_isthmus_peers,
    traffic,
};

/// A round of the `--baseline` build: its agents with one peer carry the
/// traffic. Both builds' programs are then timed in turns, in two orders.
/// First this build's, held from its agents, which stop as for a restart
/// in place, with the baseline's that its agents loaded after them. Then
/// the baseline's held, with this build's loaded after them. So both
/// builds' programs share the pinned maps and devices. Both builds' agents
/// start the same way, from a gateway cleaned up, with the same flags: the
/// agents the lab keeps running for the other setups have a history of
/// their own.
pub(super) fn baseline_round(flow: &Flow) -> Result<Measured> {
    let gateways = nat_gateways();
    disable_isthmus(&gateways)?;
    let mut agents = Agents::default();
    let measured = in_both_orders(flow, &gateways, &mut agents);
    // Stopped even when a step failed, so the next setup finds no agent.
    agents.stop()?;
    disable_isthmus(&gateways)?;
    measured
}

/// The round's steps, with `agents` started on `gateways` in turn.
fn in_both_orders(flow: &Flow, gateways: &[String], agents: &mut Agents) -> Result<Measured> {
    let this_binary = lab::agent_binary();
    let baseline_binary = BASELINE.get().context("no --baseline build")?;
    agents.run(&this_binary, gateways)?;
    let this_build = NatPrograms::open()?;
    agents.run(baseline_binary, gateways)?;
    let measured = traffic(flow)?;
    let baseline = NatPrograms::open()?;
    let this_held = NatPrograms::time([&this_build, &baseline], flow)?;
    drop(this_build);
    agents.run(&this_binary, gateways)?;
    let baseline_held = NatPrograms::time([&NatPrograms::open()?, &baseline], flow)?;
    Ok(measured.with_turns(&this_held, &baseline_held))
}

/// The agents a baseline round started, by PID.
#[derive(Default)]
struct Agents(Vec<u32>);

impl Agents {
    /// Stops the agents running, as for a restart in place, then starts
    /// `binary`'s on `gateways` with one peer, and waits until they serve it.
    fn run(&mut self, binary: &Path, gateways: &[String]) -> Result<()> {
        self.stop()?;
        for gw in gateways {
            let args = for_older_builds(lab::agent_args(gw)?);
            let log = lab::log_file(gw);
            let pid = lab::spawn_agent_binary(binary, gw, &args, &log)?;
            self.0.push(pid);
            lab::wait_ready_in(gw, pid, &log)?;
        }
        set_isthmus_peers(1)
    }

    /// Stops the agents running, leaving what they pinned.
    fn stop(&mut self) -> Result<()> {
        for pid in self.0.drain(..) {
            lab::stop_pid(pid)?;
        }
        Ok(())
    }
}

/// `args` as a build from before interval flags took durations reads them
/// too: `--resolve-interval` in bare seconds, which this build still reads
/// (with a warning).
fn for_older_builds(args: Vec<String>) -> Vec<String> {
    args.into_iter()
        .map(|arg| {
            let seconds = arg
                .strip_prefix("--resolve-interval=")
                .and_then(|interval| interval.strip_suffix('s'))
                .filter(|seconds| seconds.parse::<u32>().is_ok());
            seconds.map_or_else(|| arg.clone(), |s| format!("--resolve-interval={s}"))
        })
        .collect()
}

/// The `--baseline` build the NAT bench measures beside this one.
pub(super) static BASELINE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Each NAT program's time per run in one order of the builds, this
/// build's then the baseline's.
type Turns = [(&'static str, [f64; 2]); 2];

/// A baseline round's test runs of both builds' programs, in turns. Each
/// figure is the geometric mean of the two orders': with this build's
/// programs held from its stopped agents and the baseline's loaded after
/// them, then the other way round. A program held open runs a few percent
/// slower than one its agent loaded after it (measured against itself,
/// up to 4%); the two orders cancel that out.
#[derive(Default)]
pub(super) struct InTurns {
    /// This build's programs, ns per run.
    pub(super) this_build: ByProgram,
    /// The baseline build's programs, ns per run.
    pub(super) baseline: ByProgram,
    /// The held build's programs, whichever it was, ns per run.
    pub(super) held: ByProgram,
    /// The programs of the build loaded after it, ns per run.
    pub(super) loaded_after: ByProgram,
}

impl Measured {
    /// With both builds' programs timed in turns, in both orders.
    fn with_turns(self, this_held: &Turns, baseline_held: &Turns) -> Self {
        let mut in_turns = InTurns::default();
        for ((program, [this_1, base_1]), (_, [this_2, base_2])) in
            this_held.iter().zip(baseline_held)
        {
            let both = |first: f64, second: f64| (first * second).sqrt();
            in_turns.this_build.insert(program, both(*this_1, *this_2));
            in_turns.baseline.insert(program, both(*base_1, *base_2));
            in_turns.held.insert(program, both(*this_1, *base_2));
            in_turns
                .loaded_after
                .insert(program, both(*base_1, *this_2));
        }
        Self {
            test_run_ns: in_turns.baseline.clone(),
            in_turns,
            ..self
        }
    }
}
