//! Installs what the build, the lab and the tests need, idempotently: a step
//! that is already done costs a file check or one short command.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use isthmus_lab::{cmd::run, tools};

/// Debian packages the lab, the tests and the benchmarks use (wireguard-go
/// and wg are the reference peer of the interop test and of `bench tunnel`).
const DEBIAN_PACKAGES: &[&str] = &[
    "iproute2",
    "bpftool",
    "iptables",
    "nftables",
    "netsniff-ng",
    "iperf3",
    "tcpdump",
    "wireguard-go",
    "wireguard-tools",
    // The `--ha` lab announces a moved endpoint address (gratuitous ARP).
    "iputils-arping",
    // The HA tests speak to the lab's API server stand-in from a-lan.
    "curl",
    // The benches flush NAT state between setups.
    "conntrack",
    // The upgrade test unpacks the previous release's agent.
    "zstd",
    // kube-proxy's rules count their drops of invalid packets with it.
    "nfacct",
    // The lab's Prometheus server, and promtool, which checks our metrics.
    "prometheus",
    // Renders the benchmark chart in docs/.
    "gnuplot-nox",
    // Build the agent's image and run the container lab (runc: crun
    // refuses this machine type's hybrid cgroups).
    "podman",
    "runc",
    // The image's CA bundle (`cargo xtask image`).
    "ca-certificates",
    // Draws the pictures of docs/ (`cargo xtask docs`).
    "graphviz",
];
/// bpf-linker release known to build against LLVM 22 (docs/design.md#toolchain).
const BPF_LINKER_VERSION: &str = "0.13.0";
const NIGHTLY: &str = "nightly";

/// Runs every step.
pub fn ensure() -> Result<()> {
    rust_src()?;
    bpf_linker()?;
    debian_packages()?;
    python_tools()?;
    Ok(())
}

/// A private Python environment with kubernetes-validate, which checks the
/// manifests against a current Kubernetes' schemas.
fn python_tools() -> Result<()> {
    let env = tools::python_env();
    let stamp_path = env.join("isthmus-stamp");
    let stamp = format!("kubernetes-validate {}\n", tools::KUBERNETES_VALIDATE);
    if tools::kubernetes_validate().exists()
        && fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp)
    {
        return Ok(());
    }
    println!(
        "prereqs: installing kubernetes-validate {} in {}",
        tools::KUBERNETES_VALIDATE,
        env.display()
    );
    run("python3", &["-m", "venv", &env.to_string_lossy()])?;
    let pip = env.join("bin/pip");
    run(
        &pip.to_string_lossy(),
        &[
            "install",
            "-q",
            &format!("kubernetes-validate=={}", tools::KUBERNETES_VALIDATE),
        ],
    )?;
    fs::write(stamp_path, stamp)?;
    Ok(())
}

fn nightly_sysroot() -> Result<PathBuf> {
    let out = run("rustc", &[&format!("+{NIGHTLY}"), "--print", "sysroot"])
        .context("the nightly toolchain is missing; it ships with this machine type (docs/design.md#toolchain)")?;
    Ok(PathBuf::from(out.trim()))
}

fn rust_src() -> Result<()> {
    let library = nightly_sysroot()?.join("lib/rustlib/src/rust/library/core");
    if library.exists() {
        return Ok(());
    }
    println!("prereqs: adding rust-src to {NIGHTLY}");
    run(
        "rustup",
        &["component", "add", "rust-src", "--toolchain", NIGHTLY],
    )
    .map(drop)
}

fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cargo"),
        PathBuf::from,
    )
}

/// The nightly's own libLLVM, which bpf-linker must link against.
fn nightly_libllvm(sysroot: &Path) -> Result<PathBuf> {
    let lib = sysroot.join("lib");
    let found = fs::read_dir(&lib)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so."))
        });
    found.with_context(|| format!("no libLLVM.so.* in {}", lib.display()))
}

fn bpf_linker() -> Result<()> {
    let sysroot = nightly_sysroot()?;
    let libllvm = nightly_libllvm(&sysroot)?;
    let llvm_name = libllvm
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_owned();
    // libLLVM.so.22.1-rust-… → 22
    let major = llvm_name
        .trim_start_matches("libLLVM.so.")
        .split('.')
        .next()
        .unwrap_or_default()
        .to_owned();
    let prefix = cargo_home().join("isthmus-llvm");
    let stamp_path = prefix.join("stamp");
    let stamp = format!("bpf-linker {BPF_LINKER_VERSION} against {llvm_name}\n");
    let works = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if works && fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp) {
        return Ok(());
    }
    println!(
        "prereqs: building bpf-linker {BPF_LINKER_VERSION} against the nightly's LLVM {major} (a few minutes)"
    );
    // The binary finds libLLVM through an rpath into this directory: keep it.
    let lib = prefix.join("lib");
    fs::create_dir_all(&lib)?;
    for name in [llvm_name.as_str(), "libLLVM.so"] {
        let link = lib.join(name);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&libllvm, &link)?;
    }
    let status = Command::new("cargo")
        .args([
            "install",
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
            "--force",
        ])
        .args([
            "--no-default-features",
            "--features",
            &format!("llvm-{major}"),
        ])
        .env("LLVM_PREFIX", &prefix)
        .status()?;
    if !status.success() {
        bail!("building bpf-linker failed ({status})");
    }
    fs::write(stamp_path, stamp)?;
    Ok(())
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${db:Status-Status}", package])
        .output()
        .is_ok_and(|o| o.stdout == b"installed")
}

fn debian_packages() -> Result<()> {
    let missing: Vec<&str> = DEBIAN_PACKAGES
        .iter()
        .copied()
        .filter(|p| !installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!("prereqs: installing Debian packages {}", missing.join(" "));
    run("apt-get", &["update", "-qq"])?;
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend(&missing);
    let status = Command::new("apt-get")
        .args(&args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()?;
    if !status.success() {
        bail!("apt-get install {} failed ({status})", missing.join(" "));
    }
    Ok(())
}
