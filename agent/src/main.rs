//! `isthmus-agent`: the node agent's command line. Each subcommand is one
//! call into the library.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use isthmus_agent::{
    control::{
        self,
        liqo_wireguard::LiqoWireguardArgs,
        options::{CheckArgs, DEFAULT_KEY_FILE, RunArgs},
    },
    kernel::dataplane,
    model::key_text,
    observe::inspect,
    roles::routes,
    tunnel::key,
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
    Pubkey {
        /// The private key file.
        #[arg(long, default_value = DEFAULT_KEY_FILE)]
        private_key_file: PathBuf,
    },
    /// Be the `wireguard` container of a Liqo v1 gateway pod, with the
    /// flags Liqo's gateway templates pass it (docs/operating.md#liqo-v1).
    LiqoWireguard(Box<LiqoWireguardArgs>),
    /// Validate a directory of objects as `run` would, and print what it
    /// would program and reject (file, object and field). Needs no root
    /// and no kernel; exits 1 if anything is rejected.
    Check(CheckArgs),
    /// Detach and unpin everything the agent attached or pinned, and
    /// delete its routes and its persistent TUN device.
    Cleanup {
        /// Directory on bpffs the agent pinned under.
        #[arg(long, default_value = "/sys/fs/bpf/isthmus")]
        bpffs: PathBuf,
        /// The tunnel's TUN device.
        #[arg(long, default_value = "isthmus0")]
        tunnel_dev: String,
    },
    /// Print a kernel table, read from the pinned maps (works while the
    /// agent is down).
    Inspect {
        /// Which table.
        #[arg(value_enum)]
        view: inspect::View,
        /// One JSON array of objects instead of aligned columns.
        #[arg(long)]
        json: bool,
        /// Directory on bpffs the agent pinned under.
        #[arg(long, default_value = "/sys/fs/bpf/isthmus")]
        bpffs: PathBuf,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    init_logs(cli.log_format);
    match cli.command {
        Command::Run(args) => control::run(*args).await,
        Command::LiqoWireguard(args) => control::liqo_wireguard::run(*args).await,
        Command::Check(args) => {
            if !control::check::command(&args)? {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Pubkey { private_key_file } => {
            let pair = key::load_or_generate(&private_key_file)?;
            println!("{}", key_text::encode(pair.public.as_bytes()));
            Ok(())
        }
        Command::Cleanup { bpffs, tunnel_dev } => {
            let mut removed = dataplane::cleanup(&bpffs)?;
            if routes::delete_device(&tunnel_dev).await? {
                removed.push(format!("TUN device {tunnel_dev}"));
            }
            removed.extend(routes::cleanup().await?);
            for item in &removed {
                println!("removed {item}");
            }
            println!(
                "cleanup of {}: {} item(s) removed",
                bpffs.display(),
                removed.len()
            );
            Ok(())
        }
        Command::Inspect { view, json, bpffs } => {
            let table = inspect::read(&bpffs, view)?;
            match json {
                true => println!("{}", table.json()),
                false => print!("{}", table.aligned()),
            }
            Ok(())
        }
    }
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
