//! Whether the agents' own seccomp filter refused any system call: the
//! kernel logs each refusal as an audit record of type 1326, and the test
//! suite fails on any from an agent, so the filter's list stays complete.

use anyhow::{Context, Result, bail};
use isthmus_lab::cmd::run;

/// Seconds since boot, as the kernel log stamps its records.
pub fn kernel_uptime() -> Result<f64> {
    let text = std::fs::read_to_string("/proc/uptime")?;
    text.split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .context("reading /proc/uptime")
}

/// Fails, naming the calls, if the kernel logged that it refused a system
/// call to an agent since `since` (seconds since boot).
pub fn none_refused_since(since: f64) -> Result<()> {
    let log = run("dmesg", &[])?;
    let refused: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("type=1326") && line.contains("isthmus-agent"))
        .filter(|line| stamp(line).is_some_and(|at| at >= since))
        .collect();
    if !refused.is_empty() {
        bail!(
            "the agents' seccomp filter refused {} system call(s) (syscall=N is the number; add \
             what the agent needs to kernel::privileges::ALLOWED):\n{}",
            refused.len(),
            refused.join("\n")
        );
    }
    Ok(())
}

/// The stamp of a kernel log line, `[  123.456789] …`.
fn stamp(line: &str) -> Option<f64> {
    let inside = line.strip_prefix('[')?.split_once(']')?.0;
    inside.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_read_as_seconds_since_boot() {
        assert_eq!(
            stamp("[24231.636083] audit: type=1326"),
            Some(24_231.636_083)
        );
        assert_eq!(stamp("[   12.5] x"), Some(12.5));
        assert_eq!(stamp("no stamp"), None);
    }
}
