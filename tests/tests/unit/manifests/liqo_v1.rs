//! `manifests/liqo-v1`: the base for a Liqo v1 cluster, whose agents read
//! Liqo v1's kinds, with the rights to read them and to write a peer's
//! Connection, and nothing more.

use isthmus_agent::model::object::{ObjectKind, ReadFor};

use super::{
    rbac::{render, rules_bound},
    *,
};

/// Whether one of `rules` grants `verb` on `resource` of `group`.
fn grants(rules: &[Value], group: &str, resource: &str, verb: &str) -> bool {
    let has = |rule: &Value, field: &str, want: &str| {
        rule[field]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x == want || x == "*")
    };
    rules.iter().any(|r| {
        has(r, "apiGroups", group) && has(r, "resources", resource) && has(r, "verbs", verb)
    })
}

#[test]
fn every_agent_serves_liqo_v1_and_may_read_its_kinds() {
    let objects = render("liqo-v1");
    let sets: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "DaemonSet")
        .collect();
    assert_eq!(sets.len(), 2);
    for ds in sets {
        let agent = &ds["spec"]["template"]["spec"]["containers"][0];
        let has = |arg: &str| agent["args"].as_array().unwrap().iter().any(|a| a == arg);
        let name = &ds["metadata"]["name"];
        assert!(has("--liqo-api=v1"), "{name}: {}", agent["args"]);
        // Each peer's device listens on its own GatewayServer's port, so
        // no --listen-port: the port declared is a GatewayServer's default.
        if name == "isthmus-gateway" {
            // The MSS clamp fits Liqo's tunnel MTU.
            assert!(has("--mtu=1340"), "{}", agent["args"]);
            assert!(
                !agent["args"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|a| a.as_str().is_some_and(|a| a.starts_with("--listen-port"))),
                "{}",
                agent["args"]
            );
            let wireguard = agent["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == "wireguard")
                .unwrap();
            assert_eq!(wireguard["containerPort"], 51840, "{wireguard}");
        }
    }
    for account in ["isthmus-gateway", "isthmus-worker"] {
        let rules = rules_bound(&objects, account);
        for kind in ObjectKind::read_for_all(ReadFor::LiqoV1) {
            let group = kind.api_version().split_once('/').unwrap().0;
            for verb in ["list", "watch"] {
                assert!(
                    grants(&rules, group, kind.plural(), verb),
                    "{account} may not {verb} {}",
                    kind.plural()
                );
            }
        }
    }
    // The gateway writes a peer's Connection as Liqo's gateway does, the
    // status of its gateway objects and its public key; a worker writes
    // nothing.
    let gateway = rules_bound(&objects, "isthmus-gateway");
    for (group, resource, verb) in [
        ("networking.liqo.io", "connections", "create"),
        ("networking.liqo.io", "connections", "patch"),
        ("networking.liqo.io", "connections/status", "patch"),
        (
            "gateway.isthmus.dev",
            "isthmusgatewayservers/status",
            "patch",
        ),
        (
            "gateway.isthmus.dev",
            "isthmusgatewayclients/status",
            "patch",
        ),
        ("", "secrets", "patch"),
        ("apps", "deployments", "create"),
        ("apps", "deployments", "patch"),
    ] {
        assert!(grants(&gateway, group, resource, verb), "{resource} {verb}");
    }
    for rule in rules_bound(&objects, "isthmus-worker") {
        assert_eq!(
            rule["verbs"],
            serde_json::json!(["get", "list", "watch"]),
            "{rule}"
        );
    }
}

#[test]
fn the_liqo_v1_manifests_validate_for_a_current_kubernetes() {
    let objects = render("liqo-v1");
    // Isthmus's templates are of its own kinds, which their CRDs check
    // (liqo_v1_gateway_type.rs).
    let known = objects
        .iter()
        .filter(|o| o["apiVersion"] != "gateway.isthmus.dev/v1alpha1");
    let report = validate_objects("liqo-v1", known);
    // The base's 17 (no Liqo CRDs: Liqo's chart owns them), rbac.yaml's 6,
    // admission.yaml's 2, and the gateway type's 4 CRDs and 2 rights of
    // Liqo's.
    assert_eq!(passed(&report), 31, "resources checked:\n{report}");
}
