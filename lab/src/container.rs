//! Podman, as it runs on this machine type: with runc (crun refuses the
//! machine's hybrid cgroups) and, for containers, explicit rlimits (runc
//! may not raise them, and podman's defaults ask it to).

use std::process::Command;

use anyhow::Result;

use crate::cmd::run;

/// The OCI runtime podman is told to use.
pub const RUNTIME: &str = "runc";
/// The open-file limit of a container: the one this process runs with,
/// which runc may set again without raising it.
fn nofile() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft)
}
/// The process limit of a container. runc here fails to set anything
/// above 32,768 (seen: 65,536 and this machine's own 96,551 refused); the
/// agent runs a few dozen threads.
const NPROC: u64 = 32_768;

/// `podman --runtime runc args…`: its stdout, or an error with its stderr.
pub fn podman(args: &[&str]) -> Result<String> {
    run("podman", &[&["--runtime", RUNTIME][..], args].concat())
}

/// The start of a `podman run` command line, up to the options of the
/// container itself: the runtime and the rlimits this machine allows.
pub fn run_command() -> Command {
    let mut command = Command::new("podman");
    let nofile = nofile();
    command.args([
        "--runtime",
        RUNTIME,
        "run",
        &format!("--ulimit=nofile={nofile}:{nofile}"),
        &format!("--ulimit=nproc={NPROC}:{NPROC}"),
    ]);
    command
}
