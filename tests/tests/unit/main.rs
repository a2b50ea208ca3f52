//! The unit tier's integration tests: no root, no kernel, in parallel.

mod architecture;
mod manifests;
mod run_loop;
