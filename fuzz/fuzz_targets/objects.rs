//! Objects as an author writes them (TunnelEndpoints, NatMappings, Nodes,
//! what isolation reads, and the election's Lease): any text, read as the directory source
//! reads a file, then every document validated as the reconciler does.
//! Nothing may panic, every error names its file, and the NatMapping fast
//! path, where it answers, must agree with the YAML scanner.
#![no_main]

use isthmus_agent::{
    model::natmapping::NatMapping,
    model::node::{ActiveGateway, Node},
    model::object::{Object, parse_documents, plain_natmapping},
    model::offloading::{ExportedSlice, OffloadedPod, Offloading},
    model::peer::Peer,
    model::policy::Policy,
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
        let message = match document {
            Err(e) => e.to_string(),
            Ok(Object::TunnelEndpoint(raw)) => match Peer::from_raw(&raw, FILE) {
                Ok(peer) => match Policy::default().check(&peer, &[]) {
                    Ok(()) => continue,
                    Err(problem) => format!("{FILE}: {problem}"),
                },
                Err(e) => e.to_string(),
            },
            Ok(Object::NatMapping(raw)) => match NatMapping::from_raw(&raw, FILE) {
                Ok(mapping) => match mapping.rejected.first() {
                    Some(e) => e.to_string(),
                    None => continue,
                },
                Err(e) => e.to_string(),
            },
            Ok(Object::Node(raw)) => match Node::from_raw(&raw, FILE) {
                Ok(_) => continue,
                Err(e) => e.to_string(),
            },
            Ok(Object::Pod(raw)) => match OffloadedPod::from_raw(&raw, FILE) {
                Ok(_) => continue,
                Err(e) => e.to_string(),
            },
            Ok(Object::EndpointSlice(raw)) => match ExportedSlice::from_raw(&raw, FILE) {
                Ok(_) => continue,
                Err(e) => e.to_string(),
            },
            Ok(Object::NamespaceOffloading(raw)) => match Offloading::from_raw(&raw, FILE) {
                Ok(_) => continue,
                Err(e) => e.to_string(),
            },
            Ok(Object::Lease(raw)) => match ActiveGateway::from_raw(&raw, FILE) {
                Ok(_) => continue,
                Err(e) => e.to_string(),
            },
        };
        assert!(message.starts_with(FILE), "an error without its file: {message}");
    }
});
