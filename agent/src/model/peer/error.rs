//! Why a TunnelEndpoint cannot be used, naming the file, object and field.

use std::net::IpAddr;

use ipnet::IpNet;
use thiserror::Error;

use crate::model::object::{ObjectKey, ObjectKind};

/// A peer that cannot be used, naming the file, object and field.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{file}: {kind} {object}: {problem}")]
pub struct PeerError {
    /// File holding the object.
    pub file: String,
    /// The kind of the object: a TunnelEndpoint, or Liqo v1's
    /// Configuration.
    pub kind: ObjectKind,
    /// The object.
    pub object: ObjectKey,
    /// What is wrong with it.
    pub problem: Box<Problem>,
}

impl PeerError {
    /// `problem` with the TunnelEndpoint found in `file`.
    pub fn new(file: &str, object: &ObjectKey, problem: Problem) -> Self {
        Self {
            file: file.to_owned(),
            kind: ObjectKind::TunnelEndpoint,
            object: object.clone(),
            problem: Box::new(problem),
        }
    }
}

/// What makes a TunnelEndpoint unusable, by field.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Problem {
    /// A required network is absent.
    #[error("field {field} is missing")]
    Missing {
        /// The field, by its Liqo name.
        field: &'static str,
    },
    /// A network that does not parse.
    #[error("field {field}: {value:?} is not an {family} CIDR{none}")]
    BadCidr {
        /// The field, by its Liqo name.
        field: &'static str,
        /// What it holds.
        value: String,
        /// The address family the field holds.
        family: &'static str,
        /// `or "None"` where "None" is allowed.
        none: &'static str,
    },
    /// A remapped network whose mask differs from the real one.
    #[error("field {field}: mask /{nat_len} differs from {real_field} /{real_len}")]
    MaskMismatch {
        /// The remapped field.
        field: &'static str,
        /// Its prefix length.
        nat_len: u8,
        /// The field it remaps.
        real_field: &'static str,
        /// That field's prefix length.
        real_len: u8,
    },
    /// Two peers are seen under overlapping networks, so a packet could not
    /// tell them apart.
    #[error(
        "field {field} ({net}) overlaps field {other_field} ({other_net}) of TunnelEndpoint {other} in {other_file}"
    )]
    Overlap {
        /// The overlapping field.
        field: &'static str,
        /// That field's network.
        net: Box<IpNet>,
        /// The object kept.
        other: ObjectKey,
        /// File holding the object kept.
        other_file: String,
        /// Its overlapping field.
        other_field: &'static str,
        /// That field's network.
        other_net: Box<IpNet>,
    },
    /// A scalar field that does not parse.
    #[error("field {field}: {value:?} is not {what}")]
    BadValue {
        /// The field, by its Liqo name.
        field: &'static str,
        /// What it holds.
        value: String,
        /// What it should be.
        what: &'static str,
    },
    /// A peer of the Liqo API the cluster does not run.
    #[error(
        "a Liqo {api} peer, and this agent serves Liqo {served}'s network API (--liqo-api {served})"
    )]
    OtherApi {
        /// The peer's API.
        api: &'static str,
        /// The API served.
        served: &'static str,
    },
    /// A second Liqo v1 peer on one gateway.
    #[error(
        "this gateway already serves Liqo v1 peer {other} (Configuration in {other_file}) on its NAT device (--nat-dev), which carries one Liqo v1 peer; the embedded tunnel (--tunnel userspace) gives each a device of its own"
    )]
    SecondV1Peer {
        /// The peer kept.
        other: ObjectKey,
        /// File holding its Configuration.
        other_file: String,
    },
    /// A gateway needs the peer's WireGuard endpoint and key.
    #[error("field {field} is missing: no tunnel to this peer")]
    NoTunnel {
        /// The first missing field.
        field: &'static str,
    },
    /// Two documents share a namespace and name.
    #[error("also defined in {other_file}; field metadata.name must be unique")]
    Duplicate {
        /// File holding the one kept.
        other_file: String,
    },
    /// A namespace where no peer is accepted.
    #[error(
        "field metadata.namespace: {namespace:?} is not one where TunnelEndpoints are accepted ({allowed}; see --tunnelendpoint-namespaces)"
    )]
    Namespace {
        /// The object's namespace.
        namespace: String,
        /// The namespaces allowed.
        allowed: String,
    },
    /// A network shorter than the policy allows.
    #[error("field {field}: {net} is wider than /{min} ({flag})")]
    TooWide {
        /// The field.
        field: &'static str,
        /// Its network.
        net: IpNet,
        /// The shortest prefix allowed in its family.
        min: u8,
        /// The flag that sets it.
        flag: &'static str,
    },
    /// A network that touches one no peer may use.
    #[error("field {field}: {net} touches {what}; no peer may use it")]
    Forbidden {
        /// The field.
        field: &'static str,
        /// Its network.
        net: IpNet,
        /// What it touches.
        what: String,
    },
    /// A view that holds a peer's WireGuard endpoint, or an endpoint in
    /// another peer's view: the tunnel's own traffic would enter a tunnel.
    #[error(
        "field {field} ({net}) holds endpointIP {endpoint} of TunnelEndpoint {other} in {other_file}: its WireGuard traffic would be routed into a tunnel"
    )]
    EndpointInView {
        /// The field holding the endpoint.
        field: &'static str,
        /// Its network.
        net: IpNet,
        /// The endpoint.
        endpoint: IpAddr,
        /// The TunnelEndpoint of that endpoint, or of that view.
        other: ObjectKey,
        /// File holding it.
        other_file: String,
    },
    /// An endpoint inside another peer's view.
    #[error(
        "field endpointIP ({endpoint}) lies in field {other_field} ({other_net}) of TunnelEndpoint {other} in {other_file}: its WireGuard traffic would be routed into a tunnel"
    )]
    EndpointUnderView {
        /// The endpoint.
        endpoint: IpAddr,
        /// The TunnelEndpoint whose view holds it.
        other: ObjectKey,
        /// File holding it.
        other_file: String,
        /// Its field.
        other_field: &'static str,
        /// That field's network.
        other_net: IpNet,
    },
    /// A second TunnelEndpoint with a public key already taken.
    #[error(
        "field backend_config.publicKey: the same key as TunnelEndpoint {other} in {other_file}"
    )]
    DuplicateKey {
        /// The TunnelEndpoint kept.
        other: ObjectKey,
        /// File holding it.
        other_file: String,
    },
    /// A second TunnelEndpoint for a cluster that has one.
    #[error(
        "field clusterID: cluster {cluster_id} already has TunnelEndpoint {other} in {other_file}"
    )]
    DuplicateCluster {
        /// The cluster.
        cluster_id: String,
        /// The TunnelEndpoint kept.
        other: ObjectKey,
        /// File holding it.
        other_file: String,
    },
}
