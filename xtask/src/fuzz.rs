//! `cargo xtask fuzz`: every cargo-fuzz target of `fuzz/`, each for a
//! bounded time, from the committed corpus. A crash fails the run and
//! leaves its input under `fuzz/artifacts/`, to become a regression test.

use std::{
    fs::{self, File},
    path::PathBuf,
    process::{Child, Command},
    time::Instant,
};

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

/// How many units rustc splits each crate into. cargo-fuzz's default, one,
/// compiles the agent on one core for over six minutes; sixteen build
/// the targets in a third of the time, at a cost to the fuzzing speed that
/// a minute per target does not notice.
const CODEGEN_UNITS: &str = "16";

/// `cargo +nightly fuzz <subcommand> --fuzz-dir fuzz`, in the repository,
/// with the build options that `build` and `run` must share, or `run`
/// would build the targets again.
fn cargo_fuzz(subcommand: &str) -> Command {
    let mut command = cargo_command("cargo");
    command
        .args([
            "+nightly",
            "fuzz",
            subcommand,
            "--codegen-units",
            CODEGEN_UNITS,
        ])
        .arg("--fuzz-dir")
        .arg(repo_root().join("fuzz"))
        // The fuzz targets never load the eBPF object: no need to build it.
        .env("AYA_BUILD_SKIP", "1");
    command
}

/// Builds every target.
pub fn build() -> Result<()> {
    prereqs::cargo_fuzz()?;
    let status = cargo_fuzz("build")
        .status()
        .context("running cargo fuzz build")?;
    if !status.success() {
        bail!("the fuzz targets do not build ({status})");
    }
    Ok(())
}

/// Runs each target for `seconds`, as many side by side as the machine
/// has cores (libFuzzer takes one), each with its output in a log of its
/// own; prints each one's final figures.
pub fn run(seconds: u64) -> Result<()> {
    // Built once, before the targets that share the build start together.
    build()?;
    let started = Instant::now();
    let side_by_side = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    for batch in TARGETS.chunks(side_by_side) {
        let running = batch
            .iter()
            .map(|target| start(target, seconds))
            .collect::<Result<Vec<_>>>()?;
        // Each is waited for, so that none runs on after another failed.
        let finished: Vec<Result<()>> = running.into_iter().map(Fuzzing::finish).collect();
        finished.into_iter().collect::<Result<()>>()?;
    }
    println!(
        "fuzz: {} targets, {seconds} s each, {side_by_side} at a time, no crash, in {:.1?}",
        TARGETS.len(),
        started.elapsed()
    );
    Ok(())
}

/// A target being fuzzed.
struct Fuzzing {
    target: &'static str,
    child: Child,
    log: PathBuf,
}

/// Starts fuzzing `target` for `seconds`, from the committed corpus.
fn start(target: &'static str, seconds: u64) -> Result<Fuzzing> {
    let fuzz = repo_root().join("fuzz");
    // New inputs go to a scratch corpus; the committed one is only read.
    let committed = fuzz.join("corpus").join(target);
    let scratch = fuzz.join("target").join("corpus").join(target);
    fs::create_dir_all(&committed)?;
    fs::create_dir_all(&scratch)?;
    let log = fuzz.join("target").join(format!("{target}.log"));
    let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    println!(
        "fuzz: {target} for {seconds} s, logged to {}",
        log.display()
    );
    let child = cargo_fuzz("run")
        .arg(target)
        .args([&scratch, &committed])
        .args([
            "--",
            &format!("-max_total_time={seconds}"),
            "-rss_limit_mb=4096",
            "-print_final_stats=1",
        ])
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .context("running cargo fuzz")?;
    Ok(Fuzzing { target, child, log })
}

impl Fuzzing {
    /// Waits for the target, then prints its final figures, or fails with
    /// the end of its log and where its input is.
    fn finish(mut self) -> Result<()> {
        let status = self.child.wait()?;
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        if !status.success() {
            let tail = &lines[lines.len().saturating_sub(40)..];
            let artifacts = repo_root().join("fuzz").join("artifacts").join(self.target);
            bail!(
                "fuzz target {} failed ({status}); its input is under {}:\n{}",
                self.target,
                artifacts.display(),
                tail.join("\n")
            );
        }
        for line in lines.iter().filter(|l| l.starts_with("Done ")) {
            println!("fuzz: {}: {line}", self.target);
        }
        Ok(())
    }
}
