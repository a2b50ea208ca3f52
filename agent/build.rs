//! Compiles the eBPF programs with the nightly toolchain (see docs/design.md#toolchain) and
//! leaves the object in `OUT_DIR/isthmus` for `include_bytes_aligned!`.
//!
//! With `AYA_BUILD_SKIP=1` (the fuzz targets, which never load it) the
//! object is an empty file instead.

use std::{env, fs, path::PathBuf};

use anyhow::Context;

/// The object's file name, as aya-build names it after the eBPF binary.
const OBJECT: &str = "isthmus";

fn main() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let package = aya_build::Package {
        name: "isthmus-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../ebpf"),
        ..Default::default()
    };
    let skipped =
        env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skipped {
        fs::write(out_dir.join(OBJECT), [])?;
        return aya_build::build_ebpf([package], aya_build::Toolchain::Nightly);
    }
    // The object depends on ebpf/ and the nightly alone, not on the host
    // build's profile or features, yet the build and clippy each run this
    // script with an OUT_DIR of their own, under which aya-build compiled
    // the object and `core` from nothing, a minute each time. So aya-build works in one directory per profile directory,
    // where its cargo finds the last build's work, and the object is
    // copied from there.
    let shared = out_dir
        .ancestors()
        .nth(3)
        .context("OUT_DIR is not <target>/<profile>/build/<package>/out")?
        .join("isthmus-ebpf");
    fs::create_dir_all(&shared)?;
    // Held until the copy: another host build's script may be building
    // the same object at the same time.
    let lock = fs::File::create(shared.join("lock"))?;
    lock.lock()?;
    // SAFETY: no other thread reads the environment: the script has none
    // yet, and aya-build starts its one after it has read the variable.
    unsafe { env::set_var("OUT_DIR", &shared) };
    aya_build::build_ebpf([package], aya_build::Toolchain::Nightly)?;
    fs::copy(shared.join(OBJECT), out_dir.join(OBJECT))
        .with_context(|| format!("copying the eBPF object from {}", shared.display()))?;
    Ok(())
}
