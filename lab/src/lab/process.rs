//! Processes the lab starts and ends: detached from the terminal, found by
//! their command line, and ended only by the PIDs the lab recorded.

use std::{
    fs,
    os::unix::process::CommandExt,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Result, bail};
use nix::sys::signal::Signal;

/// How long an agent, or another process the lab starts, may take to
/// become ready.
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an agent may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts `command` in a session of its own, with no input and its output
/// to `log`, so that it survives the terminal that ran `lab up`. Returns
/// its PID.
pub(crate) fn spawn_detached(mut command: Command, log: fs::File) -> Result<u32> {
    command
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    Ok(command.spawn()?.id())
}

/// Stops an agent this process started, by PID, and waits for it to exit;
/// fails if it had to be killed.
pub fn stop_pid(pid: u32) -> Result<()> {
    if signal_and_wait(pid, Signal::SIGTERM, STOP_TIMEOUT) {
        return Ok(());
    }
    signal_and_wait(pid, Signal::SIGKILL, STOP_TIMEOUT);
    bail!("agent {pid} did not exit within {STOP_TIMEOUT:?} of SIGTERM: killed it")
}

/// Ends a process this process started, by PID, for sure: SIGTERM, and
/// SIGKILL once `grace` has passed.
pub fn end_pid(pid: u32, grace: Duration) -> Result<()> {
    if signal_and_wait(pid, Signal::SIGTERM, grace)
        || signal_and_wait(pid, Signal::SIGKILL, STOP_TIMEOUT)
    {
        return Ok(());
    }
    bail!("process {pid} is still there after SIGKILL")
}

/// Sends `signal` to `pid` and waits up to `timeout` for it to exit;
/// whether it did.
fn signal_and_wait(pid: u32, signal: Signal, timeout: Duration) -> bool {
    let target = nix::unistd::Pid::from_raw(pid as i32);
    let _ = nix::sys::signal::kill(target, signal);
    crate::wait::until(
        timeout,
        Duration::from_millis(10),
        &format!("process {pid} exits on {signal}"),
        || {
            // Reap it if it is our child; harmless otherwise.
            let _ = nix::sys::wait::waitpid(target, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
            !alive(pid)
        },
    )
    .is_ok()
}

/// Whether `pid` runs and is not a zombie.
pub fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// Whether `pid` runs, is not a zombie, and its command line names every word.
pub(crate) fn runs_with(pid: u32, words: &[&str]) -> bool {
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let cmdline = String::from_utf8_lossy(&cmdline);
    alive(pid) && words.iter().all(|w| cmdline.contains(w))
}

/// Every process whose command line names every word.
pub(crate) fn running_with(words: &[&str]) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid| runs_with(*pid, words))
        .collect()
}

/// Ends the lab's background `cargo xtask <command>` process, recorded in
/// `pid_file` or found running, if any.
pub(crate) fn stop_xtask_process(command: &str, pid_file: &Path) -> Result<()> {
    let recorded = fs::read_to_string(pid_file)
        .ok()
        .and_then(|p| p.trim().parse().ok());
    let mut pids: Vec<u32> = recorded.into_iter().collect();
    pids.extend(running_with(&["xtask", command]));
    pids.sort_unstable();
    pids.dedup();
    for pid in pids {
        if runs_with(pid, &["xtask", command]) {
            stop_pid(pid)?;
        }
    }
    let _ = fs::remove_file(pid_file);
    Ok(())
}
