//! `cargo xtask fuzz`: every cargo-fuzz target of `fuzz/`, each for a
//! bounded time, from the committed corpus. A crash fails the run and
//! leaves its input under `fuzz/artifacts/`, to become a regression test.

use std::{fs, process::Command, time::Instant};

use anyhow::{Context, Result, bail};

use crate::{cargo_command, prereqs};
use isthmus_lab::repo_root;

/// How long each target runs in `cargo xtask test`, and by default.
pub const CI_SECONDS: u64 = 60;

/// The targets, in the order they run.
pub const TARGETS: [&str; 4] = ["offload", "datagram", "objects", "reconciler"];

/// Type-checks the fuzz targets: their crate lies outside the workspace,
/// so the workspace's clippy never compiles them, and a change of the
/// agent's API would otherwise surface only when fuzzing starts.
pub fn check() -> Result<()> {
    let status = cargo_command("cargo")
        .args(["+nightly", "check", "--bins", "--manifest-path"])
        .arg(repo_root().join("fuzz").join("Cargo.toml"))
        .env("AYA_BUILD_SKIP", "1")
        .status()
        .context("running cargo check on the fuzz targets")?;
    if !status.success() {
        bail!("the fuzz targets do not compile ({status})");
    }
    Ok(())
}

/// `cargo +nightly fuzz <subcommand> --fuzz-dir fuzz`, in the repository.
fn cargo_fuzz(subcommand: &str) -> Command {
    let mut command = cargo_command("cargo");
    command
        .args(["+nightly", "fuzz", subcommand, "--fuzz-dir"])
        .arg(repo_root().join("fuzz"))
        // The fuzz targets never load the eBPF object: no need to build it.
        .env("AYA_BUILD_SKIP", "1");
    command
}

/// Builds every target, as `run` would before running it.
pub fn build_command() -> Command {
    cargo_fuzz("build")
}

/// Runs each target for `seconds`.
pub fn run(seconds: u64) -> Result<()> {
    prereqs::cargo_fuzz()?;
    let fuzz = repo_root().join("fuzz");
    let started = Instant::now();
    for target in TARGETS {
        // New inputs go to a scratch corpus; the committed one is only read.
        let committed = fuzz.join("corpus").join(target);
        let scratch = fuzz.join("target").join("corpus").join(target);
        fs::create_dir_all(&committed)?;
        fs::create_dir_all(&scratch)?;
        println!("fuzz: {target} for {seconds} s");
        let status = cargo_fuzz("run")
            .arg(target)
            .args([&scratch, &committed])
            .args([
                "--",
                &format!("-max_total_time={seconds}"),
                "-rss_limit_mb=4096",
                "-print_final_stats=1",
            ])
            .status()
            .context("running cargo fuzz")?;
        if !status.success() {
            let artifacts = fuzz.join("artifacts").join(target);
            bail!(
                "fuzz target {target} failed ({status}); its input is under {}",
                artifacts.display()
            );
        }
    }
    println!(
        "fuzz: {} targets, {seconds} s each, no crash, in {:.1?}",
        TARGETS.len(),
        started.elapsed()
    );
    Ok(())
}
