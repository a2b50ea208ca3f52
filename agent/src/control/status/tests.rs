//! What a TunnelEndpoint's or Connection's status says, and when the
//! writer writes it.

use super::*;
use crate::{
    control::source::api_resource,
    model::peer::{GatewayImplementation, GatewayRole},
};

fn status(state: State, message: &str, latency: Option<&str>) -> ConnectionStatus {
    ConnectionStatus {
        shown_on: ShownOn::TunnelEndpoint,
        state,
        message: message.into(),
        latency: latency.map(Into::into),
        peer_configuration: None,
    }
}

#[test]
fn writes_a_change_of_state_at_once_and_a_latency_only_every_refresh() {
    let now = Instant::now();
    let connecting = status(State::Connecting, "handshake", None);
    let connected = status(State::Connected, "up", Some("3ms"));
    let slower = status(State::Connected, "up", Some("4ms"));
    let connection = ConnectionStatus {
        shown_on: ShownOn::Connection(LiqoGateway::rome(
            GatewayRole::Client,
            GatewayImplementation::Isthmus,
        )),
        ..connected.clone()
    };
    // (why, shown, desired, last written and how many seconds ago, due)
    let rows = [
        ("nothing shown or written yet", None, &connected, None, true),
        (
            "shown already",
            Some(&connected),
            &connected,
            Some((&connected, 1)),
            false,
        ),
        (
            "the state changed, even right after a write",
            Some(&connecting),
            &connected,
            Some((&connecting, 0)),
            true,
        ),
        (
            "just written, the watch has not brought it back",
            Some(&connecting),
            &connected,
            Some((&connected, 1)),
            false,
        ),
        (
            "written long ago and still not shown: overwritten?",
            Some(&connecting),
            &connected,
            Some((&connected, 11)),
            true,
        ),
        (
            "only the latency moved, before the refresh",
            Some(&connected),
            &slower,
            Some((&connected, 5)),
            false,
        ),
        (
            "only the latency moved, after the refresh",
            Some(&connected),
            &slower,
            Some((&connected, 31)),
            true,
        ),
        (
            "a Connection, unchanged, before Liqo's interval",
            Some(&connection),
            &connection,
            Some((&connection, 9)),
            false,
        ),
        (
            "a Connection, unchanged, restamped after Liqo's interval",
            Some(&connection),
            &connection,
            Some((&connection, 11)),
            true,
        ),
    ];
    for (why, shown, desired, last, want) in rows {
        let last = last.map(|(s, ago): (&ConnectionStatus, u64)| Written {
            status: s.clone(),
            at: now.checked_sub(Duration::from_secs(ago)).unwrap(),
        });
        assert_eq!(due(shown, desired, last.as_ref(), now), want, "{why}");
    }
}

#[test]
fn the_patch_has_liqos_shape() {
    let now: Timestamp = "2026-11-22T10:00:00Z".parse().unwrap();
    let patch = status(State::Connected, "up", Some("3ms")).patch(now);
    assert_eq!(
        patch,
        serde_json::json!({"status": {"connection": {
            "status": "Connected",
            "statusMessage": "up",
            "latency": {"value": "3ms", "timestamp": "2026-11-22T10:00:00Z"},
            "peerConfiguration": null,
        }}})
    );
    let configured = ConnectionStatus {
        peer_configuration: Some(Arc::new(BTreeMap::from([
            (
                "allowedIPs".to_owned(),
                "10.0.0.0/24, 10.0.1.0/24".to_owned(),
            ),
            ("endpointIP".to_owned(), "203.0.113.2".to_owned()),
            ("port".to_owned(), "5871".to_owned()),
            ("publicKey".to_owned(), "k".to_owned()),
        ]))),
        ..status(State::Connected, "up", Some("640μs"))
    };
    let patch = configured.patch(now);
    assert_eq!(
        patch["status"]["connection"]["peerConfiguration"]["port"],
        "5871"
    );
    assert_eq!(patch["status"]["connection"]["latency"]["value"], "640μs");
    // What the patch writes reads back the same, and so does Liqo
    // v0.2–v0.4's lower case.
    let mut object = DynamicObject::new("tep", &api_resource(ObjectKind::TunnelEndpoint));
    object.data = patch;
    assert_eq!(ConnectionStatus::shown(&object), Some(configured.clone()));
    object.data["status"]["connection"]["status"] = "connected".into();
    assert_eq!(ConnectionStatus::shown(&object), Some(configured));
    let patch = status(State::Error, "bad", None).patch(now);
    assert_eq!(
        patch["status"]["connection"]["latency"],
        serde_json::Value::Null
    );
}

#[test]
fn a_rejected_tunnel_endpoint_shows_error_with_every_problem() {
    let key = ObjectKey {
        namespace: "liqo".into(),
        name: "bad".into(),
    };
    let rejection = |problem: &str| Rejection {
        object: Some((ObjectKind::TunnelEndpoint, key.clone())),
        problem: problem.into(),
        message: format!("kube:x: {problem}"),
    };
    let nat_mapping = Rejection {
        object: Some((ObjectKind::NatMapping, key.clone())),
        problem: "not for a TunnelEndpoint".into(),
        message: String::new(),
    };
    let rejections = BTreeSet::from([
        rejection("field a: x"),
        rejection("field b: y"),
        nat_mapping,
    ]);
    let statuses = desired(&[], None, &rejections);
    assert_eq!(
        statuses,
        BTreeMap::from([(key, status(State::Error, "field a: x; field b: y", None))])
    );
}

#[test]
fn many_rejected_entries_of_one_object_make_one_event() {
    let key = |name: &str| ObjectKey {
        namespace: String::new(),
        name: name.into(),
    };
    let entry = |name: &str, i: usize| Rejection {
        object: Some((ObjectKind::NatMapping, key(name))),
        problem: format!("field spec.clusterMappings.10.0.0.{i}: bad"),
        message: String::new(),
    };
    let mut rejections: Vec<Rejection> = (0..500).map(|i| entry("big", i)).collect();
    rejections.push(entry("small", 1));
    rejections.push(Rejection {
        object: Some((ObjectKind::Ip, key("db"))),
        problem: "field status.ip: outside".into(),
        message: String::new(),
    });
    rejections.push(Rejection {
        object: Some((ObjectKind::TunnelEndpoint, key("tep"))),
        problem: "field x".into(),
        message: String::new(),
    });
    let events = ObjectRejection::evented(&rejections);
    // The TunnelEndpoint's Event comes with its status.
    assert_eq!(
        events
            .iter()
            .map(|e| (e.kind, e.key.name.as_str()))
            .collect::<Vec<_>>(),
        [
            (ObjectKind::NatMapping, "big"),
            (ObjectKind::NatMapping, "small"),
            (ObjectKind::Ip, "db")
        ]
    );
    assert!(events[0].note().starts_with(
        "500 problems: field spec.clusterMappings.10.0.0.0: bad; field spec.clusterMappings.10.0.0.1: bad;"
    ));
    assert_eq!(events[1].note(), "field spec.clusterMappings.10.0.0.1: bad");
    assert_eq!(truncate_note(events[0].note()).len(), NOTE_MAX);
}

#[test]
fn events_take_turns_by_namespace_so_one_flood_does_not_fill_the_queue() {
    let rejection = |namespace: &str, name: String| Rejection {
        object: Some((
            ObjectKind::Ip,
            ObjectKey {
                namespace: namespace.into(),
                name,
            },
        )),
        problem: "field status.ip: outside".into(),
        message: String::new(),
    };
    let mut rejections: Vec<Rejection> = (0..200)
        .map(|i| rejection("aaa-flood", format!("ip-{i:03}")))
        .collect();
    rejections.push(rejection("zzz-quiet", "db".into()));
    rejections.push(rejection("zzz-quiet", "cache".into()));
    let events = ObjectRejection::evented(&rejections);
    assert_eq!(events.len(), 202);
    let first: Vec<(&str, &str)> = events[..5]
        .iter()
        .map(|e| (e.key.namespace.as_str(), e.key.name.as_str()))
        .collect();
    assert_eq!(
        first,
        [
            ("aaa-flood", "ip-000"),
            ("zzz-quiet", "cache"),
            ("aaa-flood", "ip-001"),
            ("zzz-quiet", "db"),
            ("aaa-flood", "ip-002"),
        ]
    );
    // Both quiet objects fit in a queue far smaller than the flood.
    assert!(
        events[..EVENT_QUEUE]
            .iter()
            .filter(|e| e.key.namespace == "zzz-quiet")
            .count()
            == 2
    );
}
