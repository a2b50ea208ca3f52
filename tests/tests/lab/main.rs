//! The lab tier: tests against the reference lab of docs/design.md#the-reference-lab, with real
//! sockets in its namespaces. They share one lab and restart its agents, so
//! `cargo xtask test` runs them one at a time.

mod attach_modes;
mod bpftool;
mod conncheck;
mod containers;
mod dashboard;
mod dual_stack;
mod flow_share;
mod fragment_share;
mod guard;
mod ha;
mod hostname;
mod hub;
mod inspect;
mod kube_source;
mod liqo_shapes;
mod logs;
mod metrics;
mod mss_clamp;
mod nat_device;
mod nat_restart;
mod overlay;
mod reachability;
mod routes;
mod segregation;
mod tunnel_offload;
mod tunnel_security;
mod upgrade;
mod wan_capture;
