//! The unit tier's integration tests: no root, no kernel, in parallel.

mod architecture;
mod docs;
mod election;
mod manifests;
mod run_loop;
