//! A bounded CPU burner: one core kept busy while a bench measures, since
//! a gateway node is rarely quiet.

use std::{
    process::{Child, Command},
    time::Duration,
};

use anyhow::{Context, Result};
use isthmus_lab::lab;

/// The longest a burner runs, should the bench die before ending it.
const LIMIT: Duration = Duration::from_mins(5);

/// One busy shell loop in a lab namespace, under `timeout`, ended by its
/// PID when dropped.
pub struct Burner(Child);

impl Burner {
    /// Starts burning one core in `ns`.
    pub fn start(ns: &str) -> Result<Self> {
        let child = Command::new("ip")
            .args(["netns", "exec", ns, "timeout"])
            .arg(LIMIT.as_secs().to_string())
            .args(["sh", "-c", "while :; do :; done"])
            .spawn()
            .context("starting the CPU burner")?;
        Ok(Self(child))
    }
}

impl Drop for Burner {
    fn drop(&mut self) {
        // timeout passes SIGTERM on to the loop.
        if let Err(e) = lab::end_pid(self.0.id(), Duration::from_secs(2)) {
            eprintln!("bench: the CPU burner: {e:#}");
        }
        let _ = self.0.wait();
    }
}

/// p50 and p99 of one set of changes, in ms.
pub type Spread = (f64, f64);

/// The [`Spread`] of `latencies`.
pub fn spread(latencies: &[f64]) -> Spread {
    (
        super::stats::percentile(latencies, 50),
        super::stats::percentile(latencies, 99),
    )
}

/// `rounds` rounds of `time` (the [`Spread`] of a set of `what`s), each
/// on a quiet machine, then while a burner keeps one core busy in `ns`.
/// Returns the quiet rounds' spreads and the busy ones'.
pub fn quiet_and_busy(
    ns: &str,
    rounds: usize,
    what: &str,
    mut time: impl FnMut() -> Result<Spread>,
) -> Result<(Vec<Spread>, Vec<Spread>)> {
    let (mut quiet, mut busy) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let q = time()?;
        let burner = Burner::start(ns)?;
        let b = time()?;
        drop(burner);
        println!(
            "bench:   round {round}/{rounds}: {what} p50/p99 {:.2}/{:.2} ms quiet, {:.2}/{:.2} ms with a core kept busy",
            q.0, q.1, b.0, b.1
        );
        quiet.push(q);
        busy.push(b);
    }
    Ok((quiet, busy))
}
