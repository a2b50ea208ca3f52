//! `isthmus-agent cleanup`: removes everything the agent attached, pinned
//! or routed, so that a node is as it was before the agent.

use std::path::PathBuf;

use anyhow::Result;

use crate::{kernel::dataplane, roles::routes};

/// The options of `cleanup`.
#[derive(clap::Args)]
pub struct CleanupArgs {
    /// Directory on bpffs the agent pinned under.
    #[arg(long, default_value = dataplane::DEFAULT_BPFFS)]
    pub bpffs: PathBuf,
    /// The tunnel's TUN device.
    #[arg(long, default_value = "isthmus0")]
    pub tunnel_dev: String,
}

/// Detaches and unpins everything under `args.bpffs`, and deletes the
/// agent's routes and its persistent TUN device, printing each item.
pub async fn run(args: &CleanupArgs) -> Result<()> {
    let mut removed = dataplane::cleanup(&args.bpffs)?;
    if routes::delete_device(&args.tunnel_dev).await? {
        removed.push(format!("TUN device {}", args.tunnel_dev));
    }
    removed.extend(routes::cleanup().await?);
    for item in &removed {
        println!("removed {item}");
    }
    println!(
        "cleanup of {}: {} item(s) removed",
        args.bpffs.display(),
        removed.len()
    );
    Ok(())
}
