//! `isthmus-agent pubkey`: prints the gateway's WireGuard public key,
//! creating the key file if it does not exist.

use std::path::PathBuf;

use anyhow::Result;

use crate::{model::key_text, tunnel::key};

/// The options of `pubkey`.
#[derive(clap::Args)]
pub struct PubkeyArgs {
    /// The private key file.
    #[arg(long, default_value = key::DEFAULT_KEY_FILE)]
    pub private_key_file: PathBuf,
}

/// Prints the public key of the pair in `args.private_key_file`, creating
/// the file (mode 0600) if it does not exist.
pub fn run(args: &PubkeyArgs) -> Result<()> {
    let pair = key::load_or_generate(&args.private_key_file)?;
    println!("{}", key_text::encode(pair.public.as_bytes()));
    Ok(())
}
