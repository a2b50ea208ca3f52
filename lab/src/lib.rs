//! The Isthmus lab as a library: the `xtask` task runner drives it, the
//! end-to-end tests use it to reach into the lab's namespaces, and the
//! unit tests and fuzz targets write objects with it.

pub mod cmd;
pub mod container;
pub mod fake_api;
pub mod image;
pub mod kube_lab;
pub mod lab;
pub mod liqo_v1;
pub mod netns;
pub mod objects;
pub mod offloading;
pub mod probe;
pub mod stream;
pub mod tools;
pub mod topology;
pub mod wait;

use std::path::PathBuf;

/// The workspace root.
pub fn repo_root() -> PathBuf {
    let lab = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    lab.parent()
        .expect("lab/ is in the workspace")
        .to_path_buf()
}

/// Cargo's target directory.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| repo_root().join("target"), PathBuf::from)
}
