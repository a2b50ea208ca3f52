//! Objects as an author writes them (TunnelEndpoints, NatMappings, Nodes,
//! what isolation reads, the election's Lease, and Liqo v1's objects): any
//! text, read as the directory source reads a file, then every document
//! validated as the reconciler does; and the text as a Go duration, as a
//! Connection's latency is read.
//! Nothing may panic, every error names its file, and the NatMapping fast
//! path, where it answers, must agree with the YAML scanner.
#![no_main]

use isthmus_agent::{
    model::natmapping::NatMapping,
    model::object::{Object, ObjectKind, RawObject, parse_documents, plain_natmapping},
    model::offloading::{ExportedSlice, OffloadedPod, Offloading},
    model::peer::Peer,
    model::policy::Policy,
    model::{go_duration, liqo_v1},
    model::{lease::LeaseRecord, node::Node},
};
use libfuzzer_sys::fuzz_target;

const FILE: &str = "fuzz.yaml";

fuzz_target!(|text: &str| {
    if let Some(fast) = plain_natmapping(text) {
        let scanned: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(text).expect("the fast path read what the scanner refuses");
        assert_eq!(fast, scanned, "the fast path and the scanner disagree");
    }
    for document in parse_documents(FILE.as_ref(), text) {
        let message: Option<String> = match document {
            Err(e) => Some(e.to_string()),
            Ok(Object::TunnelEndpoint(raw)) => match Peer::from_raw(&raw, FILE) {
                Ok(peer) => error(
                    Policy::default()
                        .check(&peer, &[])
                        .map_err(|problem| format!("{FILE}: {problem}")),
                ),
                Err(e) => Some(e.to_string()),
            },
            Ok(Object::NatMapping(raw)) => match NatMapping::from_raw(&raw, FILE) {
                Ok(mapping) => mapping.rejected.first().map(ToString::to_string),
                Err(e) => Some(e.to_string()),
            },
            Ok(Object::Node(raw)) => error(Node::from_raw(&raw, FILE)),
            Ok(Object::Pod(raw)) => error(OffloadedPod::from_raw(&raw, FILE)),
            Ok(Object::EndpointSlice(raw)) => error(ExportedSlice::from_raw(&raw, FILE)),
            Ok(Object::NamespaceOffloading(raw)) => error(Offloading::from_raw(&raw, FILE)),
            Ok(Object::Lease(raw)) => error(LeaseRecord::from_raw(&raw, FILE)),
            Ok(Object::Configuration(raw)) => v1(&raw, ObjectKind::Configuration),
            Ok(Object::PublicKey(raw)) => v1(&raw, ObjectKind::PublicKey),
            Ok(Object::IsthmusGatewayServer(raw)) => v1(&raw, ObjectKind::IsthmusGatewayServer),
            Ok(Object::IsthmusGatewayClient(raw)) => v1(&raw, ObjectKind::IsthmusGatewayClient),
            Ok(Object::Ip(raw)) => v1(&raw, ObjectKind::Ip),
        };
        if let Some(message) = message {
            assert!(
                message.starts_with(FILE),
                "an error without its file: {message}"
            );
        }
    }
    // The same text as the latency a Connection carries, which the
    // gateway pod's `liqo_peer_*` read: a duration only if it ends in a unit.
    if go_duration::parse(text).is_ok() {
        assert!(
            text == "0" || text.ends_with(|c: char| c.is_ascii_lowercase()),
            "{text:?} read as a duration"
        );
    }
});

/// The error reading a Liqo v1 object gave, if any.
fn v1(raw: &RawObject, kind: ObjectKind) -> Option<String> {
    error(liqo_v1::read(raw, kind, FILE))
}

/// The error an object's validation gave, if any.
fn error<T, E: ToString>(validated: Result<T, E>) -> Option<String> {
    validated.err().map(|e| e.to_string())
}
