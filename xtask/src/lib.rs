//! The Isthmus lab as a library: the `xtask` binary drives it, and the
//! end-to-end tests use it to reach into the lab's namespaces.

pub mod cmd;
pub mod fake_api;
pub mod kube_lab;
pub mod lab;
pub mod netns;
pub mod objects;
pub mod offloading;
pub mod probe;
pub mod stream;
pub mod tools;
pub mod topology;
pub mod wait;
