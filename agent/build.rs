//! Compiles the eBPF programs with the nightly toolchain (see docs/design.md#toolchain) and
//! leaves the object in `OUT_DIR/isthmus` for `include_bytes_aligned!`.
//!
//! With `AYA_BUILD_SKIP=1` (the fuzz targets, which never load it) the
//! object is an empty file instead.

fn main() -> anyhow::Result<()> {
    let skipped =
        std::env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skipped {
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("isthmus");
        std::fs::write(out, [])?;
    }
    let package = aya_build::Package {
        name: "isthmus-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::Nightly)
}
