//! `isthmus-agent cleanup`: removes everything the agent attached, pinned
//! or routed, so that a node is as it was before the agent.

use std::path::PathBuf;

use anyhow::Result;

use crate::{
    kernel::dataplane,
    roles::{gateway::liqo_v1, routes},
};

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
/// agent's routes and its persistent TUN devices (the shared one and each
/// Liqo v1 peer's), printing each item.
pub async fn run(args: &CleanupArgs) -> Result<()> {
    let mut removed = dataplane::cleanup(&args.bpffs)?;
    let tunnels = std::iter::once(args.tunnel_dev.clone()).chain(liqo_v1::peer_devices());
    for dev in tunnels {
        if routes::delete_device(&dev).await? {
            removed.push(format!("TUN device {dev}"));
        }
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
