//! The time each stage of a control loop run takes: what an object change
//! that arrives meanwhile waits for. Recorded in a histogram by stage, and
//! a slow run is logged whole (at debug level), stage by stage, so that a
//! slow update can be traced to what held the loop.

use std::time::{Duration, Instant};

use tracing::debug;

use crate::observe::metrics::Metrics;

/// A run the whole of which is logged: the latency an object change may
/// see is bounded by about 10 ms.
const SLOW: Duration = Duration::from_millis(5);

/// The stages of one run of the loop, timed one after another.
pub struct Stages {
    run: &'static str,
    started: Instant,
    last: Instant,
    spent: Vec<(&'static str, Duration)>,
}

impl Stages {
    /// Starts timing a run of kind `run` (`pass`, `tick`).
    pub fn start(run: &'static str) -> Self {
        let now = Instant::now();
        Self {
            run,
            started: now,
            last: now,
            spent: Vec::new(),
        }
    }

    /// Ends stage `stage`, begun where the last one ended.
    pub fn end(&mut self, stage: &'static str) {
        let now = Instant::now();
        self.spent.push((stage, now - self.last));
        self.last = now;
    }

    /// Records every stage in `metrics`, and logs the run if it was slow.
    pub fn finish(self, metrics: &Metrics) {
        for (stage, spent) in &self.spent {
            metrics
                .loop_stages
                .get_or_create(&[("stage", *stage)])
                .observe(spent.as_secs_f64());
        }
        let total = self.last - self.started;
        if total >= SLOW {
            let stages: Vec<String> = self
                .spent
                .iter()
                .map(|(stage, spent)| format!("{stage} {:.2} ms", spent.as_secs_f64() * 1e3))
                .collect();
            debug!(
                run = self.run,
                ms = total.as_secs_f64() * 1e3,
                stages = stages.join(", "),
                "a slow run of the control loop"
            );
        }
    }
}
