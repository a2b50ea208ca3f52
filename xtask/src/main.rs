//! `cargo xtask`: build, lab, demo, test and benchmark Isthmus.

mod bench;
mod demo;
mod docs;
mod fuzz;
mod logged;
mod prereqs;
mod syscalls;
mod test;

use std::{path::PathBuf, process::Command, time::Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use isthmus_lab::lab::{self, LabTunnel};

#[derive(Parser)]
#[command(about = "Isthmus build, lab, test and benchmark tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install prerequisites, then build the eBPF object and the agent.
    Build,
    /// Build, bring the lab up, and send traffic for every reachability row.
    Demo {
        /// Leave the lab up afterwards.
        #[arg(long)]
        keep: bool,
        /// Build the dual-stack lab, and send traffic for its IPv6 rows
        /// too.
        #[arg(long)]
        dual_stack: bool,
    },
    /// The test suite in tiers: style and unit tests, `BPF_PROG_TEST_RUN`,
    /// the lab, the slow tests; then a minute of each fuzz target. Each
    /// tier's wall time is printed at the end.
    Test {
        /// Run only this tier (and no fuzzing).
        #[arg(long, value_enum)]
        tier: Option<test::Tier>,
    },
    /// Build the agent's OCI image from the release build, with no
    /// registry: tagged with the version and the commit, and saved as an
    /// OCI archive under target/image/.
    Image {
        /// Only lay out the image's root filesystem in this directory (the
        /// Containerfile's build stage does this).
        #[arg(long)]
        rootfs: Option<PathBuf>,
    },
    /// Draw the pictures of `docs/` from their Graphviz sources.
    Docs,
    /// Bring the reference lab up or down.
    Lab {
        #[command(subcommand)]
        action: LabAction,
    },
    /// Every cargo-fuzz target, each for a bounded time, from the committed
    /// corpus; a crash fails the run.
    Fuzz {
        /// How long each target runs.
        #[arg(long, default_value_t = fuzz::CI_SECONDS)]
        seconds: u64,
    },
    /// Benchmarks against the peers named in the issues; without a
    /// subcommand, every one of them in one run.
    Bench {
        #[command(subcommand)]
        which: Option<bench::Which>,
    },
    /// The `--ha` lab's API server stand-in and load balancer (started by
    /// `lab up --ha`).
    #[command(hide = true)]
    LabControl,
    /// The API server stand-ins of the `--liqo-api v1` lab (started by
    /// `lab up --liqo-api v1`).
    #[command(hide = true)]
    LiqoV1Apis,
    /// The Liqo-peer labs' conncheck on a cluster's gateway (started by
    /// `lab up --liqo-v0-10-peer` and `--liqo-v1-peer`).
    #[command(hide = true)]
    LiqoConncheck {
        /// The cluster whose gateway it runs on.
        #[arg(long)]
        cluster: String,
        /// Liqo v1's: the one peer cluster, at `--liqo-v1-peer-addr`.
        #[arg(long, requires = "liqo_v1_peer_addr")]
        liqo_v1_peer: Option<String>,
        /// The tunnel address of `--liqo-v1-peer`.
        #[arg(long, requires = "liqo_v1_peer")]
        liqo_v1_peer_addr: Option<std::net::Ipv4Addr>,
    },
}

#[derive(Subcommand)]
enum LabAction {
    /// Build the topology and start every agent; return once ready.
    Up {
        /// What carries traffic between gateways.
        #[arg(long, value_enum, default_value_t = LabTunnel::Userspace)]
        tunnel: LabTunnel,
        /// Run this cluster (a, b or c) as Liqo v0.10 does: wireguard-go,
        /// Liqo's iptables rules and conncheck; the others run Isthmus.
        #[arg(long, alias = "liqo-peer")]
        liqo_v0_10_peer: Option<String>,
        /// Run cluster b as Liqo v1.2 does (wireguard-go, the nftables its
        /// FirewallConfigurations render, its conncheck), served by a from
        /// Liqo v1's objects (`--liqo-api v1`).
        #[arg(long, conflicts_with = "liqo_v0_10_peer")]
        liqo_v1_peer: Option<String>,
        /// With `--liqo-v1-peer`: the side of the tunnel a takes, client
        /// (a GatewayClient: a contacts b) or server (a GatewayServer: b
        /// contacts a).
        #[arg(long, value_enum, requires = "liqo_v1_peer", default_value_t = lab::liqo_v1_peer::Side::Client)]
        isthmus_side: lab::liqo_v1_peer::Side,
        /// Run cluster b's gateway in IntraClusterTrafficSegregation, with
        /// a pod offloaded from a and a service exported to a.
        #[arg(long)]
        segregation: bool,
        /// Give cluster a a second gateway node (a-gw2), its agents on the
        /// kube source against the lab's API server stand-in, electing the
        /// active gateway; a's endpoint address follows the active one.
        #[arg(long)]
        ha: bool,
        /// Run every agent from the agent's image under podman, with the
        /// DaemonSets' container settings (capabilities, seccomp, mounts,
        /// arguments), as a cluster runs it.
        #[arg(long)]
        containers: bool,
        /// `v1`: every cluster serves Liqo v1's objects as Liqo's gateway
        /// type, each agent on `--source kube` against an API server
        /// stand-in of its cluster's own (kubeconfigs in
        /// /run/isthmus-lab/kubeconfig/).
        #[arg(long, value_parser = ["v1"])]
        liqo_api: Option<String>,
        /// Give every network its IPv6 network beside the IPv4 one, and
        /// run the a–b tunnel over the WAN's IPv6 addresses
        /// (docs/design.md#dual-stack).
        #[arg(long)]
        dual_stack: bool,
    },
    /// Remove everything the lab created; succeeds when nothing is up.
    Down,
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Build => build(),
        Task::Demo { keep, dual_stack } => demo::run(keep, dual_stack),
        Task::Test { tier } => test::run(tier),
        Task::Fuzz { seconds } => fuzz::build().and_then(|()| fuzz::run(seconds)),
        Task::Lab {
            action:
                LabAction::Up {
                    tunnel,
                    liqo_v0_10_peer,
                    liqo_v1_peer,
                    isthmus_side,
                    segregation,
                    ha,
                    containers,
                    liqo_api,
                    dual_stack,
                },
        } => {
            let liqo = match (liqo_v0_10_peer, liqo_v1_peer) {
                (Some(name), _) => Some(lab::LiqoPeer::V0_10(cluster_named(&name)?)),
                (None, Some(name)) => {
                    let liqo = lab::liqo_v1_peer::LIQO.name;
                    anyhow::ensure!(
                        name == liqo,
                        "--liqo-v1-peer {name}: the lab runs cluster {liqo} as Liqo v1"
                    );
                    Some(lab::LiqoPeer::V1(isthmus_side))
                }
                (None, None) => None,
            };
            let setup = lab::Setup {
                tunnel,
                containers,
                liqo,
                ha,
                segregation,
                liqo_api_v1: liqo_api.is_some(),
                dual_stack,
                ..lab::Setup::default()
            };
            // Before the build, which takes minutes.
            setup.check()?;
            build()?;
            lab::up(&setup)
        }
        Task::Image { rootfs: Some(dir) } => {
            let files = isthmus_lab::image::stage_rootfs(&lab::agent_binary(), &dir)?;
            println!("image: rootfs in {}: {}", dir.display(), files.join(" "));
            Ok(())
        }
        Task::Docs => {
            prereqs::ensure()?;
            docs::run()
        }
        Task::Image { rootfs: None } => {
            build()?;
            println!("image: {}", isthmus_lab::image::build()?);
            Ok(())
        }
        Task::LabControl => lab::ha::serve(),
        Task::LiqoV1Apis => lab::liqo_v1_api::serve(),
        Task::LiqoConncheck {
            cluster,
            liqo_v1_peer,
            liqo_v1_peer_addr,
        } => {
            use lab::liqo_conncheck::{self, Api};
            let api = match (liqo_v1_peer, liqo_v1_peer_addr) {
                (Some(peer), Some(addr)) => Api::V1 {
                    peer: cluster_named(&peer)?,
                    addr,
                },
                _ => Api::V0_10,
            };
            liqo_conncheck::run(&cluster, api)
        }
        Task::Lab {
            action: LabAction::Down,
        } => {
            lab::down()?;
            println!("lab: down");
            Ok(())
        }
        Task::Bench { which } => {
            build()?;
            match which {
                Some(which) => bench::run_bench(which),
                None => bench::run_all(),
            }
        }
    }
}

/// Says what `cargo xtask image` built.
/// The lab cluster called `name`.
fn cluster_named(name: &str) -> Result<&'static isthmus_lab::topology::Cluster> {
    isthmus_lab::topology::CLUSTERS
        .iter()
        .copied()
        .find(|c| c.name == name)
        .with_context(|| format!("no lab cluster {name:?}: a, b or c"))
}

/// Runs a cargo command in the workspace, failing if it fails.
pub(crate) fn cargo(args: &[&str]) -> Result<()> {
    println!("==> cargo {}", args.join(" "));
    let status = cargo_command(env!("CARGO")).args(args).status()?;
    if !status.success() {
        bail!("`cargo {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

/// `program` (cargo, or rustup's proxy of it) in the workspace, without
/// the variables `cargo run` set for this task runner. ring's build script
/// watches them: with them, a build run from here and one run by hand
/// would each rebuild ring and everything above it.
pub(crate) fn cargo_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new(program);
    command.current_dir(isthmus_lab::repo_root());
    for (name, _) in std::env::vars_os() {
        let set_by_cargo_run = name.to_str().is_some_and(|name| {
            [
                "CARGO_PKG_",
                "CARGO_MANIFEST_",
                "CARGO_CRATE_",
                "CARGO_BIN_",
                "CARGO_PRIMARY_",
            ]
            .iter()
            .any(|prefix| name.starts_with(prefix))
        });
        if set_by_cargo_run {
            command.env_remove(name);
        }
    }
    command
}

pub(crate) fn build() -> Result<()> {
    let started = Instant::now();
    prereqs::ensure()?;
    cargo(&["build", "--release"])?;
    println!("build: done in {:.1?}", started.elapsed());
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use isthmus_lab::{
        lab::{
            ha::CONTROL_COMMAND,
            liqo_conncheck::{Api, arguments},
        },
        topology::{A, B},
    };

    use super::Cli;

    fn parses(args: &[String]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("xtask".to_owned()).chain(args.iter().cloned()))
    }

    /// The lab starts its hidden commands with these arguments: they must
    /// parse, or the process they start dies before it serves.
    #[test]
    fn the_hidden_commands_parse_as_the_lab_starts_them() {
        let v1 = Api::V1 {
            peer: &A,
            addr: "169.254.18.2".parse().unwrap(),
        };
        for args in [
            arguments(&B, Api::V0_10),
            arguments(&B, v1),
            vec![CONTROL_COMMAND.to_owned()],
        ] {
            if let Err(e) = parses(&args) {
                panic!("{args:?}: {e}");
            }
        }
        let v1 = arguments(&B, v1);
        assert!(parses(&v1[..v1.len() - 2]).is_err());
    }
}
