//! Each document of an origin validated once, when the origin changes,
//! into what the tables are built from.

use super::{Document, Valid};
use crate::model::{
    lease::LeaseRecord,
    liqo_v1::{Gateway, IpMapping, PeerKey, PeerNetworks},
    natmapping::NatMapping,
    node::Node,
    object::{Object, ObjectKind},
    offloading::{ExportedSlice, OffloadedPod, Offloading},
    peer::Peer,
    rejection::Rejection,
};

/// Whether the selection of nodes and peers reads any of `documents`:
/// everything but what only the NatMapping and allowed tables hold.
pub(super) fn read_by_selection(documents: &[Result<Valid, Rejection>]) -> bool {
    documents.iter().any(|document| {
        !matches!(
            document,
            Ok(Valid::Mapping(_)
                | Valid::Pod(_)
                | Valid::Slice(_)
                | Valid::Offloading(_)
                | Valid::Lease(_)
                | Valid::V1Ip(..))
        )
    })
}

/// Validates one document of `origin`; None for an object that concerns
/// no table (a Pod not offloaded, an EndpointSlice of another manager).
pub(super) fn validate(document: Document, origin: &str) -> Option<Result<Valid, Rejection>> {
    fn valid<T, E: Into<Rejection>>(
        result: Result<T, E>,
        into: fn(T) -> Valid,
    ) -> Result<Valid, Rejection> {
        result.map(into).map_err(Into::into)
    }
    Some(match document {
        Err(e) => Err(e.into()),
        Ok(Object::TunnelEndpoint(raw)) => {
            valid(Peer::from_raw(&raw, origin).map(Box::new), Valid::Peer)
        }
        Ok(Object::NatMapping(raw)) => valid(NatMapping::from_raw(&raw, origin), Valid::Mapping),
        Ok(Object::Node(raw)) => valid(Node::from_raw(&raw, origin), Valid::Node),
        Ok(Object::Pod(raw)) => valid(
            OffloadedPod::from_raw(&raw, origin).transpose()?,
            Valid::Pod,
        ),
        Ok(Object::EndpointSlice(raw)) => valid(
            ExportedSlice::from_raw(&raw, origin).transpose()?,
            Valid::Slice,
        ),
        Ok(Object::NamespaceOffloading(raw)) => {
            valid(Offloading::from_raw(&raw, origin), Valid::Offloading)
        }
        Ok(Object::Lease(raw)) => valid(LeaseRecord::from_raw(&raw, origin), Valid::Lease),
        Ok(Object::Configuration(raw)) => PeerNetworks::from_configuration(&raw, origin)
            .map(|networks| Valid::V1Networks(raw.key, networks))
            .map_err(Into::into),
        Ok(Object::PublicKey(raw)) => valid(PeerKey::from_public_key(&raw, origin), Valid::V1Key),
        Ok(Object::IsthmusGatewayServer(raw)) => valid(
            Gateway::from_raw(&raw, ObjectKind::IsthmusGatewayServer, origin),
            Valid::V1Gateway,
        ),
        Ok(Object::IsthmusGatewayClient(raw)) => valid(
            Gateway::from_raw(&raw, ObjectKind::IsthmusGatewayClient, origin),
            Valid::V1Gateway,
        ),
        Ok(Object::Ip(raw)) => IpMapping::from_raw(&raw, origin)
            .transpose()?
            .map(|mapping| Valid::V1Ip(raw.key, mapping))
            .map_err(Into::into),
    })
}
