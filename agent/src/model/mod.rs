//! What the objects mean: parsing and validating TunnelEndpoints,
//! NatMappings and Nodes, and what a TunnelEndpoint may ask of this node.
//! Nothing here does I/O, so all of it is tested in memory.

pub mod isolation;
pub mod key;
pub mod natmapping;
pub mod node;
pub mod object;
pub mod peer;
pub mod policy;
pub mod rejection;
