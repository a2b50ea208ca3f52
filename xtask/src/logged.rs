//! A child process whose output goes to a log file of its own: processes
//! run side by side then do not interleave, and a failure can show what
//! the child printed.

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus},
};

use anyhow::{Context, Result};

/// A running child and its log.
pub(crate) struct Logged {
    child: Child,
    log: PathBuf,
}

impl Logged {
    /// Starts `command`, `what` naming it in an error, with its stdout and
    /// stderr in the new file `log`.
    pub(crate) fn start(mut command: Command, what: &str, log: PathBuf) -> Result<Self> {
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = command
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("running {what}"))?;
        Ok(Self { child, log })
    }

    /// The log the child writes.
    pub(crate) fn log(&self) -> &Path {
        &self.log
    }

    /// Waits for the child; returns how it ended and what it wrote.
    pub(crate) fn wait(mut self) -> Result<(ExitStatus, String)> {
        let status = self.child.wait()?;
        Ok((
            status,
            std::fs::read_to_string(&self.log).unwrap_or_default(),
        ))
    }
}
