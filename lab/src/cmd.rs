//! Running external commands with errors that say what failed.

use std::process::{Command, Stdio};

use anyhow::{Result, bail};

/// Runs `program args…` and returns its stdout; fails with its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| anyhow::anyhow!("{program}: {e} (is it installed?)"))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip -n NS args…`, or plain `ip args…` when `ns` is empty.
pub fn ip(ns: &str, args: &[&str]) -> Result<String> {
    let mut full = Vec::with_capacity(args.len() + 2);
    if !ns.is_empty() {
        full.extend(["-n", ns]);
    }
    full.extend_from_slice(args);
    run("ip", &full)
}

/// `iptables -w args…` inside netns `ns`.
pub fn iptables(ns: &str, args: &[&str]) -> Result<String> {
    run(
        "ip",
        &[&["netns", "exec", ns, "iptables", "-w"][..], args].concat(),
    )
}

/// Loads `rules` into netns `ns` with `iptables-restore` (iptables-nft), or
/// `ip6tables-restore` for `ipv6` rules, adding to what is there when
/// `noflush`.
pub fn iptables_restore(ns: &str, rules: &str, ipv6: bool, noflush: bool) -> Result<()> {
    use std::io::Write as _;
    let restore = if ipv6 {
        "ip6tables-restore"
    } else {
        "iptables-restore"
    };
    let mut args = vec!["netns", "exec", ns, restore, "-w"];
    if noflush {
        args.push("--noflush");
    }
    let mut child = Command::new("ip")
        .args(&args)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(rules.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{restore} in {ns} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Sets a sysctl inside netns `ns`. Network sysctls resolve against the
/// netns of the thread that opens them, so no `sysctl` binary is needed.
pub fn sysctl(ns: &str, key: &str, value: &str) -> Result<()> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    crate::netns::run_in(ns, || std::fs::write(&path, value))?
        .map_err(|e| anyhow::anyhow!("sysctl {key}={value} in {ns}: {e}"))
}
