//! Compiles the eBPF programs with the nightly toolchain (see DESIGN §3) and
//! leaves the object in `OUT_DIR/isthmus` for `include_bytes_aligned!`.

fn main() -> anyhow::Result<()> {
    let package = aya_build::Package {
        name: "isthmus-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::Nightly)
}
