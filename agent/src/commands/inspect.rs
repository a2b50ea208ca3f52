//! `isthmus-agent inspect`: prints a kernel table, read from the pinned
//! maps, so that it works while the agent is down.

use std::path::PathBuf;

use anyhow::Result;

use crate::{kernel::dataplane, observe::inspect};

/// The options of `inspect`.
#[derive(clap::Args)]
pub struct InspectArgs {
    /// Which table.
    #[arg(value_enum)]
    pub view: inspect::View,
    /// One JSON array of objects instead of aligned columns.
    #[arg(long)]
    pub json: bool,
    /// Directory on bpffs the agent pinned under.
    #[arg(long, default_value = dataplane::DEFAULT_BPFFS)]
    pub bpffs: PathBuf,
}

/// Prints the table `args.view`.
pub fn run(args: &InspectArgs) -> Result<()> {
    let table = inspect::read(&args.bpffs, args.view)?;
    match args.json {
        true => println!("{}", table.json()),
        false => print!("{}", table.aligned()),
    }
    Ok(())
}
