//! Work of a whole `cargo xtask test` that needs the processor but not the
//! lab: clippy, and cargo-fuzz and the fuzz targets' instrumented build.
//! It runs at idle priority (`SCHED_IDLE`) beside the workspace's build,
//! so it takes only the processor time that build leaves. Its output goes
//! to a log, printed if it fails.

use std::{
    fs::{self, File},
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
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

/// Each step's name and wall time, once every step is done.
type StepTimes = Vec<(&'static str, Duration)>;

/// Steps running one after another on a thread of their own. Dropped
/// before it finished, it ends the step under way.
pub struct Background {
    thread: Option<JoinHandle<Result<StepTimes>>>,
    log: PathBuf,
    /// The process group of the step under way, if any.
    running: Arc<Mutex<Option<u32>>>,
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
        let running = Arc::new(Mutex::new(None));
        let shared = running.clone();
        let thread = thread::spawn(move || {
            steps
                .into_iter()
                .map(|step| run(step, &file, &shared))
                .collect()
        });
        Ok(Self {
            thread: Some(thread),
            log,
            running,
        })
    }

    /// Waits for every step; each one's wall time, or the failure with the
    /// log's end.
    pub fn finish(mut self) -> Result<StepTimes> {
        let waited = Instant::now();
        let thread = self.thread.take().expect("finished once");
        let outcome = thread
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

impl Drop for Background {
    fn drop(&mut self) {
        if self.thread.is_none() {
            return;
        }
        let running = *self.running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(group) = running {
            // The step's own process group: cargo and the compilers it ran.
            let group = nix::unistd::Pid::from_raw(-(group as i32));
            let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGTERM);
            println!("background: ended, unfinished");
        }
    }
}

/// Runs `step` under `chrt --idle 0` in a process group of its own, its
/// output appended to `log`, its group in `running` meanwhile.
fn run(step: Step, log: &File, running: &Mutex<Option<u32>>) -> Result<(&'static str, Duration)> {
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
        .stderr(log.try_clone()?)
        .process_group(0);
    for (key, value) in step.command.get_envs() {
        match value {
            Some(value) => idle.env(key, value),
            None => idle.env_remove(key),
        };
    }
    let mut child = idle
        .spawn()
        .with_context(|| format!("{}: running chrt (util-linux)", step.name))?;
    *running.lock().unwrap_or_else(|p| p.into_inner()) = Some(child.id());
    let status = child.wait();
    *running.lock().unwrap_or_else(|p| p.into_inner()) = None;
    let status = status.with_context(|| format!("{}: waiting for it", step.name))?;
    if !status.success() {
        bail!("{} failed ({status})", step.name);
    }
    Ok((step.name, started.elapsed()))
}
