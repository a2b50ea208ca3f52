//! `cargo xtask fuzz`: every cargo-fuzz target of `fuzz/`, each for a
//! bounded time, from the committed corpus. A crash fails the run and
//! leaves its input under `fuzz/artifacts/`, to become a regression test.

use std::{fs, os::unix::fs::PermissionsExt, path::PathBuf, process::Command, time::Instant};

use anyhow::{Context, Result, bail};

use crate::{cargo_command, logged::Logged};
use isthmus_lab::{repo_root, target_dir};

/// How long each target runs in `cargo xtask test`, and by default.
pub const CI_SECONDS: u64 = 60;

/// The targets, in the order they run.
pub const TARGETS: [&str; 5] = ["offload", "datagram", "objects", "reconciler", "ipv6"];

/// The crates whose code the targets fuzz, and the targets: only these
/// are instrumented. cargo-fuzz instruments every crate; built so, the
/// targets took 16 min 39 s to build and ran 2 to 14 times fewer inputs a
/// second, most of their time going to libFuzzer's bookkeeping of the
/// dependencies' counters.
const INSTRUMENTED: [&str; 3] = ["isthmus-agent", "isthmus-common", "isthmus-fuzz"];

/// What cargo-fuzz gives rustc, given here to [`INSTRUMENTED`] alone:
/// libFuzzer's edge counters and comparison tracing, `cfg(fuzzing)`, debug
/// assertions, and the address sanitizer, with leave to link crates built
/// without it.
const INSTRUMENTATION: [&str; 11] = [
    "-Cpasses=sancov-module",
    "-Cllvm-args=-sanitizer-coverage-level=4",
    "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
    "-Cllvm-args=-sanitizer-coverage-pc-table",
    "-Cllvm-args=-sanitizer-coverage-trace-compares",
    "-Cllvm-args=-sanitizer-coverage-stack-depth",
    "-Cllvm-args=-simplifycfg-branch-fold-threshold=0",
    "--cfg=fuzzing",
    "-Cdebug-assertions",
    "-Zsanitizer=address",
    "-Cunsafe-allow-abi-mismatch=sanitizer",
];

/// `cargo build --release` of every target, in the workspace's target
/// directory, through [`wrapper`]. Cargo keeps what a workspace wrapper
/// builds apart, and builds the dependencies as the release build did:
/// the fuzz build reuses them, where a target directory of its own
/// compiled them all a second time (twelve minutes on two cores).
fn cargo_build() -> Result<Command> {
    let mut command = cargo_command("cargo");
    command
        .args(["build", "--release"])
        .args(TARGETS.iter().flat_map(|target| ["--bin", target]))
        .env("RUSTC_WORKSPACE_WRAPPER", wrapper()?)
        // The targets never load the eBPF object: the agent's build script
        // leaves it empty.
        .env("AYA_BUILD_SKIP", "1");
    Ok(command)
}

/// Writes the rustc wrapper that gives [`INSTRUMENTATION`] to
/// [`INSTRUMENTED`] alone (their build scripts aside), and returns its
/// path. The sanitizer is unstable: `RUSTC_BOOTSTRAP=1` unlocks it for
/// those crates' compilations alone, as the Linux kernel's Rust build
/// does. Had cargo itself been given it, build scripts that probe for the
/// nightly (proc-macro2's, anyhow's) would have changed every crate.
///
/// The path names a hash of the script: cargo fingerprints a wrapper by
/// its path, so a change of the flags rebuilds the targets.
fn wrapper() -> Result<PathBuf> {
    let script = format!(
        "#!/bin/sh\n\
         # Written by cargo xtask fuzz: rustc with the fuzz targets' instrumentation.\n\
         rustc=\"$1\"; shift\n\
         case \"$CARGO_PKG_NAME:$CARGO_CRATE_NAME\" in\n\
         *:build_script_*) ;;\n\
         {}:*) RUSTC_BOOTSTRAP=1 exec \"$rustc\" \"$@\" {} ;;\n\
         esac\n\
         exec \"$rustc\" \"$@\"\n",
        INSTRUMENTED.join(":*|"),
        INSTRUMENTATION.join(" "),
    );
    let mut hasher = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(&script, &mut hasher);
    let path = scratch_dir().join(format!("rustc-{:016x}", std::hash::Hasher::finish(&hasher)));
    fs::create_dir_all(scratch_dir())?;
    fs::write(&path, script).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

/// Where the build leaves `target`.
fn binary(target: &str) -> PathBuf {
    target_dir().join("release").join(target)
}

/// The fuzzing's scratch corpora and logs.
fn scratch_dir() -> PathBuf {
    target_dir().join("fuzz")
}

/// Builds every target.
pub fn build() -> Result<()> {
    let status = cargo_build()?
        .status()
        .context("running cargo build on the fuzz targets")?;
    if !status.success() {
        bail!("the fuzz targets do not build ({status})");
    }
    Ok(())
}

/// Runs each target, as [`build`] left it, for `seconds`, as many side by side as the machine
/// has cores (libFuzzer takes one), each with its output in a log of its
/// own; prints each one's final figures.
pub fn run(seconds: u64) -> Result<()> {
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
    run: Logged,
    /// Where libFuzzer leaves a crashing input.
    artifacts: PathBuf,
}

/// Starts fuzzing `target` for `seconds`, from the committed corpus.
fn start(target: &'static str, seconds: u64) -> Result<Fuzzing> {
    let fuzz = repo_root().join("fuzz");
    // New inputs go to a scratch corpus; the committed one is only read.
    let committed = fuzz.join("corpus").join(target);
    let scratch = scratch_dir().join("corpus").join(target);
    fs::create_dir_all(&committed)?;
    fs::create_dir_all(&scratch)?;
    // libFuzzer writes a crashing input under this prefix, so it ends with
    // a slash.
    let artifacts = fuzz.join("artifacts").join(target);
    fs::create_dir_all(&artifacts)?;
    let log = scratch_dir().join(format!("{target}.log"));
    println!(
        "fuzz: {target} for {seconds} s, logged to {}",
        log.display()
    );
    let mut command = Command::new(binary(target));
    command
        .args([&scratch, &committed])
        .args([
            format!("-max_total_time={seconds}"),
            "-rss_limit_mb=4096".to_owned(),
            "-print_final_stats=1".to_owned(),
            format!("-artifact_prefix={}/", artifacts.display()),
        ])
        // As cargo-fuzz sets it: a global that two Rust crates both
        // define is not the C++ bug this check is for.
        .env("ASAN_OPTIONS", "detect_odr_violation=0");
    let run = Logged::start(command, &binary(target).display().to_string(), log)?;
    Ok(Fuzzing {
        target,
        run,
        artifacts,
    })
}

impl Fuzzing {
    /// Waits for the target, then prints its final figures, or fails with
    /// the end of its log and where its input is.
    fn finish(self) -> Result<()> {
        let (status, text) = self.run.wait()?;
        if !status.success() {
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            bail!(
                "fuzz target {} failed ({status}); its input is under {}:\n{}",
                self.target,
                self.artifacts.display(),
                tail.join("\n")
            );
        }
        for line in text.lines().filter(|l| l.starts_with("Done ")) {
            println!("fuzz: {}: {line}", self.target);
        }
        Ok(())
    }
}
