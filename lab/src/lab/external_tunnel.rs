//! Userspace WireGuard implementations other than ours, run on the lab's
//! gateways in the embedded tunnel's place: Liqo's wireguard-go, and the
//! peers `bench tunnel` compares with. Each creates a TUN device and the
//! standard UAPI socket, so `wg` configures every one of them from the
//! lab's keys; the agents then only NAT, on that device.
//!
//! Those that are not the system's Debian packages are installed once
//! under `~/.cache/isthmus/peers`, beside the system's: the releases the
//! issue names, from Debian's bookworm-backports and from crates.io.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, bail};

use super::{
    keys::{key_file, public_key},
    process::{READY_TIMEOUT, end_pid, running_with},
};
use crate::{
    cmd::{ip, run},
    topology::{CLUSTERS, Cluster, TUNNEL_PORT},
};

/// A userspace WireGuard that is not ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Implementation {
    /// Debian bookworm's wireguard-go, as Liqo v0.10's gateway runs it.
    WireguardGoBookworm,
    /// wireguard-go from bookworm-backports, with its TUN TSO/GRO and UDP
    /// GSO/GRO.
    WireguardGoCurrent,
    /// Mullvad's boringtun fork, `gotatun-cli` from crates.io.
    Gotatun,
    /// Cloudflare's `boringtun-cli` from crates.io, Liqo's gateway before v0.9.
    BoringtunCli,
}

/// What an implementation is, and where it comes from.
struct Spec {
    /// Its name in reports and `RESULT` lines.
    name: &'static str,
    /// The Debian package or crate.
    package: &'static str,
    /// The program's file name, which names its processes.
    program: &'static str,
    /// The release installed under the peers' directory; none for the
    /// system's package.
    release: Option<&'static str>,
    source: Source,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The system's Debian package, a prerequisite of the build.
    System,
    /// Debian's bookworm-backports, unpacked aside.
    Backports,
    /// crates.io, by `cargo install`.
    Crates,
}

/// The bookworm-backports wireguard-go measured.
const WIREGUARD_GO_CURRENT: &str = "0.0.20231211-1~bpo12+1";
const GOTATUN_CLI: &str = "0.10.2";
const BORINGTUN_CLI: &str = "0.7.1";

/// The suite bookworm-backports, added for wireguard-go alone.
const BACKPORTS_SOURCES: &str = "/etc/apt/sources.list.d/isthmus-bookworm-backports.sources";
const BACKPORTS_SOURCES_TEXT: &str = "Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
";
/// Its pin: nothing is ever installed or upgraded from the suite; the
/// bench downloads its one package by version and unpacks it aside.
const BACKPORTS_PIN: &str = "/etc/apt/preferences.d/isthmus-bookworm-backports";
const BACKPORTS_PIN_TEXT: &str = "Package: *
Pin: release n=bookworm-backports
Pin-Priority: 1
";

/// How long an implementation may take to exit on SIGTERM before it is
/// killed: gotatun in the foreground ignores SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(2);

impl Implementation {
    /// Every implementation, in the order the benchmark reports them.
    pub const ALL: [Implementation; 4] = [
        Implementation::WireguardGoCurrent,
        Implementation::Gotatun,
        Implementation::BoringtunCli,
        Implementation::WireguardGoBookworm,
    ];

    /// What it is and where it comes from.
    fn spec(self) -> Spec {
        match self {
            Implementation::WireguardGoBookworm => Spec {
                name: "wireguard-go",
                package: "wireguard-go",
                program: "wireguard-go",
                release: None,
                source: Source::System,
            },
            Implementation::WireguardGoCurrent => Spec {
                name: "wireguard-go-current",
                package: "wireguard-go",
                program: "wireguard-go",
                release: Some(WIREGUARD_GO_CURRENT),
                source: Source::Backports,
            },
            Implementation::Gotatun => Spec {
                name: "gotatun",
                package: "gotatun-cli",
                program: "gotatun",
                release: Some(GOTATUN_CLI),
                source: Source::Crates,
            },
            Implementation::BoringtunCli => Spec {
                name: "boringtun-cli",
                package: "boringtun-cli",
                program: "boringtun-cli",
                release: Some(BORINGTUN_CLI),
                source: Source::Crates,
            },
        }
    }

    /// Its name in reports and `RESULT` lines.
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// The release run, and where it comes from.
    pub fn version(self) -> Result<String> {
        let Spec {
            package,
            release,
            source,
            ..
        } = self.spec();
        let release = match release {
            Some(release) => release.to_owned(),
            None => run("dpkg-query", &["-W", "-f", "${Version}", package])?,
        };
        let from = match source {
            Source::System => "Debian bookworm",
            Source::Backports => "Debian bookworm-backports",
            Source::Crates => "crates.io",
        };
        Ok(format!("{package} {release} ({from})"))
    }

    /// Where its install lives, under the peers' directory, unless it is
    /// the system's.
    fn install_dir(self) -> Option<PathBuf> {
        let spec = self.spec();
        let dir = format!("{}-{}", spec.package, spec.release?);
        Some(crate::tools::peers_dir().join(dir))
    }

    fn binary(self) -> PathBuf {
        let program = self.spec().program;
        match (self.spec().source, self.install_dir()) {
            // A Debian package unpacked aside keeps its own tree.
            (Source::Backports, Some(dir)) => dir.join("usr/bin").join(program),
            (_, Some(dir)) => dir.join("bin").join(program),
            (_, None) => PathBuf::from("/usr/bin").join(program),
        }
    }

    /// Installs it unless it is there (the bookworm package comes with the
    /// build's prerequisites).
    pub fn install(self) -> Result<()> {
        let binary = self.binary();
        if binary.exists() {
            return Ok(());
        }
        let spec = self.spec();
        let (Some(dir), Some(release)) = (self.install_dir(), spec.release) else {
            bail!("{} is missing: run `cargo xtask build`", binary.display());
        };
        println!(
            "prereqs: installing {} in {} (minutes, once)",
            self.version()?,
            dir.display()
        );
        match spec.source {
            Source::Backports => unpack_backport(spec.package, release, &dir)?,
            _ => crate::tools::cargo_install(spec.package, release, Some(&dir))?,
        }
        if !binary.exists() {
            bail!("installing {} left no {}", self.name(), binary.display());
        }
        Ok(())
    }

    /// The command that runs it in netns `ns`, in the foreground, on
    /// device `dev`, as root, logging nowhere. `ip netns exec` execs it, so
    /// the child's PID is the tunnel's.
    fn command(self, ns: &str, dev: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", ns]).arg(self.binary());
        match self {
            Implementation::WireguardGoBookworm | Implementation::WireguardGoCurrent => {
                command.env("WG_PROCESS_FOREGROUND", "1");
            }
            Implementation::Gotatun | Implementation::BoringtunCli => {
                command.args([
                    "--foreground",
                    "--disable-drop-privileges",
                    "--log",
                    "/dev/null",
                ]);
            }
        }
        command.arg(dev);
        command
    }
}

/// Adds bookworm-backports, pinned so that nothing comes from it by
/// itself, and unpacks `package` at `version` from it into `dir`.
fn unpack_backport(package: &str, version: &str, dir: &Path) -> Result<()> {
    let fresh = [
        (BACKPORTS_SOURCES, BACKPORTS_SOURCES_TEXT),
        (BACKPORTS_PIN, BACKPORTS_PIN_TEXT),
    ]
    .iter()
    .map(|(path, text)| write_if_changed(path, text))
    .collect::<Result<Vec<bool>>>()?;
    let wanted = format!("{package}={version}");
    if fresh.contains(&true) || run("apt-cache", &["show", &wanted]).is_err() {
        run("apt-get", &["update", "-qq"])?;
    }
    let download = PathBuf::from(format!("{}.download", dir.display()));
    let _ = fs::remove_dir_all(&download);
    fs::create_dir_all(&download)?;
    let status = Command::new("apt-get")
        .args(["download", "-qq", &wanted])
        .current_dir(&download)
        .status()?;
    if !status.success() {
        bail!("apt-get download {wanted} failed ({status})");
    }
    let deb = fs::read_dir(&download)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .with_context(|| format!("apt-get download {wanted} left no .deb"))?;
    fs::create_dir_all(dir)?;
    run(
        "dpkg-deb",
        &["-x", &deb.to_string_lossy(), &dir.to_string_lossy()],
    )?;
    Ok(fs::remove_dir_all(&download)?)
}

/// Writes `text` to `path` unless it holds it already; whether it wrote.
fn write_if_changed(path: &str, text: &str) -> Result<bool> {
    if fs::read_to_string(path).is_ok_and(|t| t == text) {
        return Ok(false);
    }
    fs::write(path, text).with_context(|| format!("writing {path}"))?;
    Ok(true)
}

/// The device of an external tunnel on gateway `node`; its control socket
/// lives in a machine-wide directory, so the name is the lab's own.
pub fn dev(node: &str) -> String {
    format!("istwg-{}", node.trim_end_matches("-gw"))
}

fn socket(dev: &str) -> PathBuf {
    Path::new("/var/run/wireguard").join(format!("{dev}.sock"))
}

/// Runs `imp` on `cluster`'s gateway, configured with `wg` from the lab's
/// keys and the cluster's peerings, and routes its peers' networks into
/// it.
pub fn start_on(imp: Implementation, cluster: &Cluster) -> Result<()> {
    let dev = launch(imp, cluster)?;
    configure(cluster, &dev)
}

/// Runs `imp` on `cluster`'s gateway, unconfigured; returns its device
/// once its control socket is open.
pub fn launch(imp: Implementation, cluster: &Cluster) -> Result<String> {
    imp.install()?;
    let (gw, dev) = (cluster.gw(), dev(&cluster.gw()));
    let _ = fs::remove_file(socket(&dev));
    imp.command(&gw, &dev)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", imp.name()))?;
    crate::wait::until(
        READY_TIMEOUT,
        Duration::from_millis(10),
        &format!("{} on {gw} opens its control socket", imp.name()),
        || std::os::unix::net::UnixStream::connect(socket(&dev)).is_ok(),
    )?;
    Ok(dev)
}

/// Gives the tunnel on `cluster`'s gateway its key and peers with `wg`,
/// brings its device up and routes the peers' networks into it.
fn configure(cluster: &Cluster, dev: &str) -> Result<()> {
    let gw = cluster.gw();
    let mut script = format!(
        "wg set {dev} private-key {key} listen-port {TUNNEL_PORT}",
        key = key_file(&gw).display(),
    );
    let mut views = Vec::new();
    for p in cluster.peerings() {
        let allowed: Vec<String> = p
            .remote_views()
            .iter()
            .map(std::string::ToString::to_string)
            .collect();
        script.push_str(&format!(
            " peer {peer} endpoint {endpoint}:{TUNNEL_PORT} allowed-ips {allowed} persistent-keepalive 10",
            peer = public_key(&p.remote.gw())?,
            endpoint = p.remote.wan_addr(),
            allowed = allowed.join(","),
        ));
        views.extend(allowed);
    }
    run("ip", &["netns", "exec", &gw, "sh", "-c", &script])?;
    ip(&gw, &["link", "set", dev, "mtu", "1420", "up"])?;
    for view in &views {
        ip(&gw, &["route", "add", view, "dev", dev])?;
    }
    Ok(())
}

/// Stops the external tunnel of `cluster`'s gateway, which takes its
/// device and routes with it.
pub fn stop_on(cluster: &Cluster) -> Result<()> {
    let dev = dev(&cluster.gw());
    for pid in processes(&dev) {
        end_pid(pid, STOP_GRACE)?;
    }
    let _ = fs::remove_file(socket(&dev));
    Ok(())
}

/// External tunnels the lab started, found by their command line naming
/// one of the implementations and a lab device (`prefix` of its name).
/// Only these are ever signalled.
fn processes(prefix: &str) -> Vec<u32> {
    let mut pids: Vec<u32> = Implementation::ALL
        .iter()
        .flat_map(|imp| running_with(&[imp.spec().program, prefix]))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Stops every external tunnel the lab started, and removes their sockets.
pub fn stop_all() -> Result<()> {
    for pid in processes("istwg-") {
        end_pid(pid, STOP_GRACE)?;
    }
    for cluster in CLUSTERS {
        let _ = fs::remove_file(socket(&dev(&cluster.gw())));
    }
    Ok(())
}
