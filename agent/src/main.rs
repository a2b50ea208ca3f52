//! `isthmus-agent`: the node agent's command line. Each subcommand is one
//! call into the library.

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use isthmus_agent::commands::{
    check::{self, CheckArgs},
    cleanup::{self, CleanupArgs},
    inspect::{self, InspectArgs},
    liqo_wireguard::{self, LiqoWireguardArgs},
    pubkey::{self, PubkeyArgs},
    run::{self, options::RunArgs},
};

#[derive(Parser)]
#[command(
    version,
    about = "Isthmus node agent: eBPF dataplane for multi-cluster networks"
)]
struct Cli {
    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Program the dataplane from the source and keep it in line.
    Run(Box<RunArgs>),
    /// Print the gateway's WireGuard public key, creating the key file
    /// (mode 0600) if it does not exist.
    Pubkey(PubkeyArgs),
    /// Be the `wireguard` container of a Liqo v1 gateway pod, with the
    /// flags Liqo's gateway templates pass it (docs/operating.md#liqo-v1).
    LiqoWireguard(Box<LiqoWireguardArgs>),
    /// Validate a directory of objects as `run` would, and print what it
    /// would program and reject (file, object and field). Needs no root
    /// and no kernel; exits 1 if anything is rejected.
    Check(CheckArgs),
    /// Detach and unpin everything the agent attached or pinned, and
    /// delete its routes and its persistent TUN device.
    Cleanup(CleanupArgs),
    /// Print a kernel table, read from the pinned maps (works while the
    /// agent is down).
    Inspect(InspectArgs),
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    init_logs(cli.log_format);
    match cli.command {
        // Boxed: the agent's whole state lives in this future.
        Command::Run(args) => Box::pin(run::run(*args)).await,
        Command::LiqoWireguard(args) => liqo_wireguard::run(*args).await,
        Command::Check(args) => {
            if !check::run(&args)? {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Pubkey(args) => pubkey::run(&args),
        Command::Cleanup(args) => cleanup::run(&args).await,
        Command::Inspect(args) => inspect::run(&args),
    }
}

fn init_logs(format: LogFormat) {
    // boringtun logs each retry and expiry of every peer's handshake: with
    // many peers silent, hundreds of lines a second. The agent says the
    // same once per peer, and counts it; RUST_LOG brings them back.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,boringtun=off"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
