//! The fixtures' peer, rome, as the agent's unit tests take it: built from
//! the objects in `tests/fixtures/liqo-v1/`, in the shapes Liqo writes.

use std::path::Path;

use super::{Companions, Gateway, PeerKey, PeerNetworks};
use crate::model::{
    object::{Object, ObjectKind, RawObject, parse_documents},
    peer::Peer,
};

/// rome's `Configuration`.
pub const CONFIGURATION: &str =
    include_str!("../../../../tests/fixtures/liqo-v1/configuration-rome.yaml");
/// rome's `PublicKey`.
pub const PUBLIC_KEY: &str = include_str!("../../../../tests/fixtures/liqo-v1/publickey-rome.yaml");
/// Our `IsthmusGatewayClient` towards rome.
pub const CLIENT: &str =
    include_str!("../../../../tests/fixtures/liqo-v1/isthmusgatewayclient-rome.yaml");
/// Our `IsthmusGatewayServer` towards rome.
pub const SERVER: &str =
    include_str!("../../../../tests/fixtures/liqo-v1/isthmusgatewayserver-rome.yaml");

/// The one object of `yaml`.
fn object(yaml: &str) -> Object {
    match parse_documents(Path::new("v1.yaml"), yaml).pop() {
        Some(Ok(object)) => object,
        other => panic!("not one object: {other:?}"),
    }
}

/// The raw form of `yaml`'s one object, of kind `kind`.
fn raw(yaml: &str, kind: ObjectKind) -> RawObject {
    match (object(yaml), kind) {
        (Object::Configuration(raw), ObjectKind::Configuration)
        | (Object::PublicKey(raw), ObjectKind::PublicKey)
        | (Object::IsthmusGatewayServer(raw), ObjectKind::IsthmusGatewayServer)
        | (Object::IsthmusGatewayClient(raw), ObjectKind::IsthmusGatewayClient) => raw,
        (other, _) => panic!("not a {kind}: {other:?}"),
    }
}

/// rome with our gateway object `gateway` (`SERVER` or `CLIENT`), and
/// its public key when `keyed`.
pub fn rome(gateway: &str, keyed: bool) -> Peer {
    let config = raw(CONFIGURATION, ObjectKind::Configuration);
    let kind = match gateway == SERVER {
        true => ObjectKind::IsthmusGatewayServer,
        false => ObjectKind::IsthmusGatewayClient,
    };
    let gateway = Gateway::from_raw(&raw(gateway, kind), kind, "g.yaml").unwrap();
    let key = keyed.then(|| {
        PeerKey::from_public_key(&raw(PUBLIC_KEY, ObjectKind::PublicKey), "k.yaml").unwrap()
    });
    let networks = PeerNetworks::from_configuration(&config, "c.yaml").unwrap();
    networks.peer(
        &config.key,
        "c.yaml",
        Companions {
            key: key.as_ref(),
            gateway: Some(&gateway),
        },
    )
}

/// rome's `Configuration` with an IPv6 network in each list, after the
/// IPv4 one, as Liqo's `[]CIDR` fields hold them.
pub fn dual_stack() -> String {
    let mut yaml = CONFIGURATION.to_owned();
    for (ipv4, ipv6) in [
        ("10.200.0.0/16", "fd00:10:244::/64"),
        ("10.201.0.0/16", "fd00:192:168::/64"),
        ("10.70.0.0/16", "fd00:10::/64"),
        ("10.71.0.0/16", "fd00:10:0:1::/64"),
    ] {
        yaml = yaml.replace(
            &format!("      - {ipv4}\n"),
            &format!("      - {ipv4}\n      - {ipv6}\n"),
        );
    }
    yaml
}
