//! `cargo xtask docs`: renders the pictures of `docs/` from their sources
//! with Graphviz. Each picture names the hash of its source, so that a
//! unit test can tell a picture drawn from an older source.

use std::{fs, process::Command};

use anyhow::{Context, Result, bail};
use isthmus_lab::repo_root;
use sha2::{Digest, Sha256};

/// The pictures, each a Graphviz source beside its SVG.
const PICTURES: [&str; 1] = ["packet-path"];

/// Renders every picture.
pub fn run() -> Result<()> {
    for picture in PICTURES {
        let docs = repo_root().join("docs");
        let source = docs.join(format!("{picture}.dot"));
        let text = fs::read(&source).with_context(|| format!("reading {}", source.display()))?;
        let out = Command::new("dot")
            .arg("-Tsvg")
            .arg(&source)
            .output()
            .context("running dot (Debian's graphviz, which `cargo xtask build` installs)")?;
        if !out.status.success() {
            bail!(
                "dot could not render {}: {}",
                source.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let svg = String::from_utf8(out.stdout)?;
        let target = docs.join(format!("{picture}.svg"));
        fs::write(&target, stamped(&svg, &text, picture))?;
        println!("docs: {} drawn from {}", target.display(), source.display());
    }
    Ok(())
}

/// `svg` with a comment naming its source and the source's SHA-256,
/// after the XML declaration.
fn stamped(svg: &str, source: &[u8], picture: &str) -> String {
    let hash: String = Sha256::digest(source)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let stamp = format!("<!-- drawn from docs/{picture}.dot, sha256 {hash} -->\n");
    match svg.split_once('\n') {
        Some((declaration, rest)) if declaration.starts_with("<?xml") => {
            format!("{declaration}\n{stamp}{rest}")
        }
        _ => format!("{stamp}{svg}"),
    }
}
