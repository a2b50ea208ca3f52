//! Work of a whole `cargo xtask test` that needs the processor but not the
//! lab: clippy, and cargo-fuzz and the fuzz targets' instrumented build.
//! It runs at idle priority (`SCHED_IDLE`) beside the tiers, which spend
//! most of their time waiting on the lab's network, so it takes only the
//! time they leave. Its output goes to a log, printed if it fails.

use std::{
    fs::{self, File},
    path::PathBuf,
    process::{Command, Stdio},
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use isthmus_lab::repo_root;

/// One step: what it is, and its command.
pub struct Step {
    /// Named in the log and in errors.
    pub name: &'static str,
    /// Run at idle priority, in the repository.
    pub command: Command,
}

/// Steps running one after another on a thread of their own.
pub struct Background {
    thread: JoinHandle<Result<Vec<(&'static str, Duration)>>>,
    log: PathBuf,
}

impl Background {
    /// Starts `steps`, in order; the first that fails ends the run.
    pub fn start(steps: Vec<Step>) -> Result<Self> {
        let log = repo_root().join("target").join("test-background.log");
        fs::create_dir_all(log.parent().unwrap_or(&log))?;
        let file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        println!(
            "background: {} at idle priority, logged to {}",
            steps.iter().map(|s| s.name).collect::<Vec<_>>().join(", "),
            log.display()
        );
        let thread = thread::spawn(move || steps.into_iter().map(|s| run(s, &file)).collect());
        Ok(Self { thread, log })
    }

    /// Waits for every step; each one's wall time, or the failure with the
    /// log's end.
    pub fn finish(self) -> Result<Vec<(&'static str, Duration)>> {
        let waited = Instant::now();
        let outcome = self
            .thread
            .join()
            .map_err(|_| anyhow::anyhow!("the background thread panicked"))?;
        println!("background: waited {:.1?} for it", waited.elapsed());
        outcome.inspect_err(|_| {
            let text = fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            eprintln!(
                "background: the end of {}:\n{}",
                self.log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        })
    }
}

/// Runs `step` under `chrt --idle 0`, its output appended to `log`.
fn run(step: Step, log: &File) -> Result<(&'static str, Duration)> {
    let started = Instant::now();
    let program = step.command.get_program().to_owned();
    let mut idle = Command::new("chrt");
    idle.args(["--idle", "0"])
        .arg(&program)
        .args(step.command.get_args())
        .current_dir(
            step.command
                .get_current_dir()
                .map_or_else(repo_root, PathBuf::from),
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log.try_clone()?);
    for (key, value) in step.command.get_envs() {
        match value {
            Some(value) => idle.env(key, value),
            None => idle.env_remove(key),
        };
    }
    let status = idle
        .status()
        .with_context(|| format!("{}: running chrt (util-linux)", step.name))?;
    if !status.success() {
        bail!("{} failed ({status})", step.name);
    }
    Ok((step.name, started.elapsed()))
}
