//! What the objects mean: parsing and validating TunnelEndpoints,
//! NatMappings, Nodes, the gateways' Lease and their election, what is
//! offloaded from or exported to each peer, and what a TunnelEndpoint may
//! ask of this node.
//! Nothing here does I/O, so all of it is tested in memory.

pub mod cidr;
pub mod election;
pub mod go_duration;
pub mod isolation;
pub mod key_text;
pub mod lease;
pub mod liqo_v1;
pub mod natmapping;
pub mod node;
pub mod object;
pub mod offloading;
pub mod peer;
pub mod policy;
pub mod rejection;
