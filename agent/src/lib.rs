//! The Isthmus node agent, as a library: the binary wires these together,
//! and tests and tools reuse them.
//!
//! - [`object`]: the Liqo objects as read;
//! - [`peer`]: a validated TunnelEndpoint and the kernel rules it makes;
//! - [`policy`]: what a TunnelEndpoint may ask of this node;
//! - [`natmapping`]: a validated NatMapping;
//! - [`node`]: a validated Node: PodCIDRs, address, labels;
//! - [`source`]: where objects come from: a directory, or the Kubernetes API;
//! - [`kubernetes`]: the client, the node's role and the key Secret;
//! - [`status`]: TunnelEndpoint status and Events, written back;
//! - [`reconcile`]: from objects to the kernel, as a diff;
//! - [`conntrack`]: the masquerade's settings and garbage collector;
//! - [`dataplane`]: loading, pinning, attaching, cleanup;
//! - [`pinned`]: maps a previous agent pinned, kept, migrated or replaced;
//! - [`gateway`]: the gateway's tunnel and routes, following the peers;
//! - [`guard`]: the XDP guard's allowlist, following the tunnel;
//! - [`overlay`]: the VXLAN device, the gateway node and the node table;
//! - [`maps`]: typed views of the kernel maps;
//! - [`metrics`]: Prometheus and health endpoints;
//! - [`tunnel`]: the gateway's embedded WireGuard.

pub mod check;
pub mod conncheck;
pub mod conntrack;
pub mod dataplane;
pub mod gateway;
pub mod guard;
pub mod inspect;
pub mod kubernetes;
pub mod maps;
pub mod metrics;
pub mod natmapping;
pub mod node;
pub mod object;
pub mod overlay;
pub mod peer;
pub mod pinned;
pub mod policy;
pub mod reconcile;
pub mod samples;
pub mod source;
pub mod status;
pub mod tunnel;
