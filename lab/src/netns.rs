//! Running code inside a lab network namespace.
//!
//! `setns` moves only the calling thread, so the closure runs on a thread of
//! its own; sockets it creates stay in that namespace after it returns.

use std::{fs::File, path::Path};

use anyhow::{Context, Result, anyhow};
use nix::sched::{CloneFlags, setns};

/// Runs `f` on a thread that has entered netns `name` (as made by `ip netns add`).
pub fn run_in<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
    let path = Path::new("/run/netns").join(name);
    let ns = File::open(&path)
        .with_context(|| format!("netns {name} does not exist ({})", path.display()))?;
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                setns(&ns, CloneFlags::CLONE_NEWNET)
                    .with_context(|| format!("entering netns {name}"))?;
                Ok(f())
            })
            .join()
            .map_err(|_| anyhow!("thread in netns {name} panicked"))?
    })
}

/// Whether netns `name` exists.
pub fn exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}
