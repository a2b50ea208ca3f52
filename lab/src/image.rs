//! The agent's OCI image, built on this machine with no registry.
//!
//! The repository's `Containerfile` is the one recipe. Its last stage
//! starts `FROM scratch` and copies in a root filesystem that
//! [`stage_rootfs`] lays out: the agent and the shared libraries its ELF
//! header names, nothing else (no shell, no package manager). A builder
//! that reaches registries runs the whole file, whose build stage calls
//! `cargo xtask image --rootfs`; here, [`build`] stages the rootfs from the
//! local release build and hands podman that same last stage, so both give
//! the same files, entrypoint and user.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail, ensure};

use crate::{cmd::run, container};

/// Where the agent sits in the image.
pub const AGENT_PATH: &str = "/usr/local/bin/isthmus-agent";
/// The CA bundle: the Kubernetes client builds its TLS roots from the
/// system's even when the kubeconfig brings its own CA or speaks HTTP, and
/// fails without any.
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The repository name the DaemonSets' image reference uses.
pub const REPOSITORY: &str = "ghcr.io/isthmus/isthmus-agent";
/// The stage of the `Containerfile` that builds the rootfs.
const BUILD_STAGE: &str = "build";
/// Where the build stage leaves the rootfs for the last stage.
const STAGED_ROOTFS: &str = "/out/rootfs/";

/// The repository's `Containerfile`.
pub fn containerfile() -> PathBuf {
    crate::repo_root().join("Containerfile")
}

/// What the last stage of a Containerfile makes of the image.
#[derive(Debug, PartialEq, Eq)]
pub struct RuntimeStage {
    /// The instructions of the stage, one per entry, as written.
    pub instructions: Vec<String>,
    /// `ENTRYPOINT`, in its exec form.
    pub entrypoint: Vec<String>,
    /// `USER`.
    pub user: String,
}

impl RuntimeStage {
    /// Reads the last stage of `text` and checks it is one this project
    /// can build without a registry: `FROM scratch`, then only a copy of
    /// the staged rootfs, `USER` and `ENTRYPOINT`.
    pub fn parse(text: &str) -> Result<Self> {
        let instructions: Vec<String> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_owned)
            .collect();
        let start = instructions
            .iter()
            .rposition(|l| l.starts_with("FROM "))
            .context("the Containerfile has no FROM")?;
        let instructions = instructions[start..].to_vec();
        ensure!(
            instructions[0] == "FROM scratch",
            "the Containerfile's last stage must start FROM scratch, not `{}`",
            instructions[0]
        );
        let mut entrypoint = None;
        let mut user = None;
        for line in &instructions[1..] {
            let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
            match word {
                "COPY" => ensure!(
                    rest == format!("--from={BUILD_STAGE} {STAGED_ROOTFS} /"),
                    "the last stage may only copy the staged rootfs, not `{line}`"
                ),
                "USER" => user = Some(rest.to_owned()),
                "ENTRYPOINT" => {
                    entrypoint = Some(
                        serde_json::from_str(rest)
                            .with_context(|| format!("ENTRYPOINT in exec form: `{rest}`"))?,
                    );
                }
                _ => bail!("the last stage holds `{line}`, which `cargo xtask image` cannot build"),
            }
        }
        Ok(Self {
            instructions,
            entrypoint: entrypoint.context("the last stage has no ENTRYPOINT")?,
            user: user.context("the last stage has no USER")?,
        })
    }

    /// The stage as podman builds it here: from a context directory that
    /// holds the rootfs, in place of the build stage's output.
    fn local_containerfile(&self) -> String {
        let from_build = format!("--from={BUILD_STAGE} {STAGED_ROOTFS}");
        self.instructions
            .iter()
            .map(|l| l.replace(&from_build, "rootfs/"))
            .collect::<Vec<_>>()
            .join("\n")
            + "\n"
    }
}

/// Lays out the image's root filesystem under `rootfs`: the agent at
/// [`AGENT_PATH`], every shared library it loads (as `ldd` resolves
/// them) at the paths the dynamic loader looks them up under, and the CA
/// bundle. Returns the files, as absolute paths in the image, sorted.
pub fn stage_rootfs(agent: &Path, rootfs: &Path) -> Result<Vec<String>> {
    if rootfs.exists() {
        fs::remove_dir_all(rootfs).with_context(|| format!("emptying {}", rootfs.display()))?;
    }
    let mut files = vec![AGENT_PATH.to_owned(), CA_BUNDLE.to_owned()];
    files.extend(shared_libraries(agent)?);
    for file in &files {
        let from = if file == AGENT_PATH {
            agent.to_path_buf()
        } else {
            PathBuf::from(file)
        };
        let to = rootfs.join(file.trim_start_matches('/'));
        fs::create_dir_all(to.parent().expect("a file has a parent"))?;
        // Copies the file a symlink names: the image has no link farm.
        fs::copy(&from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    }
    files.sort();
    Ok(files)
}

/// The absolute paths of the shared libraries `binary` loads, its
/// dynamic loader included.
fn shared_libraries(binary: &Path) -> Result<Vec<String>> {
    let listing = run("ldd", &[&binary.to_string_lossy()])?;
    let mut libraries = Vec::new();
    for line in listing.lines().map(str::trim) {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)`, or the
        // loader alone: `/lib64/ld-linux-x86-64.so.2 (0x…)`. The vDSO has
        // no file.
        let path = match line.split_once(" => ") {
            Some((name, rest)) => {
                let path = rest.split_whitespace().next().unwrap_or_default();
                ensure!(path.starts_with('/'), "ldd found no file for {name}");
                path
            }
            None => line.split_whitespace().next().unwrap_or_default(),
        };
        if path.starts_with('/') {
            libraries.push(path.to_owned());
        }
    }
    ensure!(
        !libraries.is_empty(),
        "ldd found no libraries for {}",
        binary.display()
    );
    Ok(libraries)
}

/// The commit the image is built from, short, and `-dirty` if the work
/// tree differs from it.
fn commit() -> Result<String> {
    let root = crate::repo_root();
    let describe = run(
        "git",
        &[
            "-C",
            &root.to_string_lossy(),
            "describe",
            "--always",
            "--abbrev=12",
            "--dirty",
            "--exclude=*",
        ],
    )?;
    Ok(describe.trim().to_owned())
}

/// A built image: its references and where its archive is.
#[derive(Debug)]
pub struct Image {
    /// `REPOSITORY:VERSION`, what the DaemonSets name.
    pub reference: String,
    /// `REPOSITORY:VERSION-COMMIT`.
    pub exact: String,
    /// The image as an OCI archive, for `ctr images import` and the like.
    pub archive: PathBuf,
    /// Bytes of the image's one layer, uncompressed.
    pub size: u64,
}

impl std::fmt::Display for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}), {:.1} MB; OCI archive {}",
            self.exact,
            self.reference,
            self.size as f64 / 1e6,
            self.archive.display()
        )
    }
}

/// The image reference of the version this tree builds.
pub fn reference() -> String {
    format!("{REPOSITORY}:{}", env!("CARGO_PKG_VERSION"))
}

/// Builds the image from the release build of the agent, tags it with the
/// version and the commit, and saves it as an OCI archive.
pub fn build() -> Result<Image> {
    let agent = crate::lab::agent_binary();
    ensure!(
        agent.exists(),
        "{} is missing: run `cargo xtask build` first",
        agent.display()
    );
    let stage = RuntimeStage::parse(&fs::read_to_string(containerfile())?)?;
    let context = crate::target_dir().join("image");
    stage_rootfs(&agent, &context.join("rootfs"))?;
    fs::write(context.join("Containerfile"), stage.local_containerfile())?;
    let reference = reference();
    let exact = format!("{reference}-{}", commit()?);
    container::podman(&[
        "build",
        "--quiet",
        "--pull=never",
        "--tag",
        &reference,
        "--tag",
        &exact,
        &context.to_string_lossy(),
    ])
    .context("building the image")?;
    let archive = context.join("isthmus-agent.oci.tar");
    let _ = fs::remove_file(&archive);
    container::podman(&[
        "save",
        "--format",
        "oci-archive",
        "--output",
        &archive.to_string_lossy(),
        &exact,
    ])?;
    let size = container::podman(&["image", "inspect", "--format", "{{.Size}}", &exact])?
        .trim()
        .parse()
        .context("podman's image size")?;
    Ok(Image {
        reference,
        exact,
        archive,
        size,
    })
}

/// The files in image `reference`, as absolute paths, sorted: read from a
/// container made of it and never started.
pub fn files_in(reference: &str) -> Result<Vec<String>> {
    // No network: podman's default one would add a bridge to the root
    // namespace.
    let id = container::podman(&["create", "--pull=never", "--network=none", reference])?;
    let id = id.trim();
    let tar = crate::target_dir().join("image/export.tar");
    let exported = container::podman(&["export", "--output", &tar.to_string_lossy(), id]);
    container::podman(&["rm", id])?;
    exported?;
    let listing = run("tar", &["-t", "-f", &tar.to_string_lossy()])?;
    fs::remove_file(&tar)?;
    let mut files: Vec<String> = listing
        .lines()
        .filter(|l| !l.ends_with('/'))
        .map(|l| format!("/{}", l.trim_start_matches("./")))
        .collect();
    files.sort();
    Ok(files)
}
