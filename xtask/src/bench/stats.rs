//! What the benchmarks compute from their samples and print: medians,
//! percentiles, the RESULT lines, and a process's CPU time and memory.

use std::fs;

use anyhow::{Context, Result};
use isthmus_lab::lab;

/// The median of `values` (the upper one of an even count).
pub(super) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// The resident memory of node `node`'s agent, in MiB.
pub(super) fn agent_rss_mib(node: &str) -> Result<f64> {
    rss_mib(lab::agent_pid(node).context("agent not running")?)
}

/// CPU seconds (user and system, every thread) process `pid` has used.
pub(super) fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name, which may hold spaces: state is
    // the first, utime and stime (fields 14 and 15) the 12th and 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .context("an unreadable /proc/PID/stat")?
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    let per_second =
        nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.context("no clock tick rate")?;
    Ok(ticks / per_second as f64)
}

/// Resident memory of process `pid`, in MiB.
pub(super) fn rss_mib(pid: u32) -> Result<f64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")?;
    Ok(kib / 1024.0)
}

/// A RESULT line comparing `ours` with `peer` round by round (`ours[i]`
/// and `peer[i]` measured in round `i`): the median of each, and the
/// median, least and greatest of the per-round ratios. Prints it and
/// returns it for the report.
pub(super) fn ratio_line(name: &str, ours: &[f64], peer: &[f64], decimals: usize) -> String {
    let ratios: Vec<f64> = ours.iter().zip(peer).map(|(o, p)| o / p).collect();
    let (lo, hi) = ratios
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), r| {
            (lo.min(*r), hi.max(*r))
        });
    let line = format!(
        "RESULT name={name} isthmus={:.decimals$} peer={:.decimals$} ratio={} min={} max={} rounds={}\n",
        median(ours),
        median(peer),
        format_ratio(median(&ratios)),
        format_ratio(lo),
        format_ratio(hi),
        ratios.len()
    );
    print!("{line}");
    line
}

/// A ratio with three decimals, or in scientific notation where three
/// decimals would print a thousandfold speed-up as 0.000.
fn format_ratio(ratio: f64) -> String {
    if ratio.abs() < 0.01 {
        format!("{ratio:.3e}")
    } else {
        format!("{ratio:.3}")
    }
}

/// The `p`th percentile of `values`, by rank.
pub(super) fn percentile(values: &[f64], p: usize) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}
