//! `manifests/liqo-v1/gateway-type`: Isthmus as a gateway type of Liqo v1.
//! Its templates fit its CRDs, and rendered as Liqo v1.2's controllers
//! render them for the fixtures' GatewayServer and GatewayClient, they give
//! the objects the agent reads (`tests/fixtures/liqo-v1/isthmus*.yaml`),
//! which fit their CRDs with the status the agent writes. Liqo's
//! controller-manager may do what it does with them.

use isthmus_agent::model::{
    liqo_v1::{Gateway, Side},
    object::{Object, ObjectKind, parse_documents},
    peer::Endpoint,
};

use super::{
    liqo_v1_templates::{render, template_data},
    rbac::{admitted, render as kustomize_render},
    *,
};

/// The schema of Isthmus's CRD of `plural`, and the CRD.
fn isthmus_crd(plural: &str) -> (jsonschema::Validator, Value) {
    let crd = &yaml_file(&format!(
        "liqo-v1/gateway-type/crds/gateway.isthmus.dev_{plural}.yaml"
    ))[0];
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    let schema = jsonschema::draft4::new(&version["schema"]["openAPIV3Schema"])
        .expect("the CRD schema compiles");
    (schema, crd.clone())
}

fn errors(schema: &jsonschema::Validator, object: &Value) -> Vec<String> {
    schema.iter_errors(object).map(|e| e.to_string()).collect()
}

/// The template of `kind` in `templates.yaml`.
fn template(kind: &str) -> Value {
    yaml_file("liqo-v1/gateway-type/templates.yaml")
        .into_iter()
        .find(|t| t["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

/// The object Liqo makes from `template` for the fixture `gateway`: the
/// template's object rendered, with the kind it names, the owner and the
/// cluster ID label Liqo adds (`server_controller.go:170-246` at v1.2.0).
fn rendered(template: &Value, gateway: &Value) -> Value {
    let mut object = render(
        &template["spec"]["template"],
        &template_data(gateway),
        false,
    );
    object["apiVersion"] = template["spec"]["objectKind"]["apiVersion"].clone();
    object["kind"] = template["spec"]["objectKind"]["kind"].clone();
    object["metadata"]["labels"]["liqo.io/remote-cluster-id"] =
        gateway["metadata"]["labels"]["liqo.io/remote-cluster-id"].clone();
    object["metadata"]["ownerReferences"] = serde_json::json!([{
        "apiVersion": gateway["apiVersion"], "kind": gateway["kind"],
        "name": gateway["metadata"]["name"], "uid": gateway["metadata"]["uid"],
        "controller": true,
    }]);
    object
}

#[test]
fn templates_render_the_objects_the_agent_reads_as_their_crds_have_them() {
    for (template_kind, gateway, fixture, plural) in [
        (
            "IsthmusGatewayServerTemplate",
            "gatewayserver-rome.yaml",
            "isthmusgatewayserver-rome.yaml",
            "isthmusgatewayservers",
        ),
        (
            "IsthmusGatewayClientTemplate",
            "gatewayclient-rome.yaml",
            "isthmusgatewayclient-rome.yaml",
            "isthmusgatewayclients",
        ),
    ] {
        let template = template(template_kind);
        let (template_schema, template_crd) =
            isthmus_crd(&format!("{}s", template_kind.to_lowercase()));
        assert_eq!(errors(&template_schema, &template), Vec::<String>::new());
        // From v1.3, Liqo watches the CRDs of templates with this label.
        assert_eq!(
            template_crd["metadata"]["labels"]["networking.liqo.io/gatewaytemplate"],
            "true"
        );
        let gateway = &yaml_file(&format!("../tests/fixtures/liqo-v1/{gateway}"))[0];
        let object = rendered(&template, gateway);
        let fixture = &yaml_file(&format!("../tests/fixtures/liqo-v1/{fixture}"))[0];
        for field in ["apiVersion", "kind", "spec"] {
            assert_eq!(object[field], fixture[field], "{template_kind}: {field}");
        }
        for field in ["name", "namespace", "labels", "ownerReferences"] {
            assert_eq!(
                object["metadata"][field], fixture["metadata"][field],
                "{template_kind}: metadata.{field}"
            );
        }
        // Liqo guesses the resource from the kind: lowercased, plus "s".
        let (schema, crd) = isthmus_crd(plural);
        assert_eq!(crd["spec"]["names"]["plural"], plural);
        assert_eq!(
            format!("{}s", object["kind"].as_str().unwrap().to_lowercase()),
            plural
        );
        assert_eq!(errors(&schema, &object), Vec::<String>::new());
        assert_eq!(errors(&schema, fixture), Vec::<String>::new());
        assert!(
            crd["spec"]["versions"][0]["subresources"]["status"].is_object(),
            "{plural} has a status subresource"
        );
    }
}

#[test]
fn the_rendered_objects_read_as_the_gateway_liqo_asked_for() {
    let read = |file: &str| {
        let text =
            std::fs::read_to_string(manifests().join("../tests/fixtures/liqo-v1").join(file))
                .unwrap();
        let (kind, raw) = match parse_documents(std::path::Path::new(file), &text).pop() {
            Some(Ok(Object::IsthmusGatewayServer(raw))) => (ObjectKind::IsthmusGatewayServer, raw),
            Some(Ok(Object::IsthmusGatewayClient(raw))) => (ObjectKind::IsthmusGatewayClient, raw),
            other => panic!("{file}: {other:?}"),
        };
        Gateway::from_raw(&raw, kind, file).unwrap()
    };
    let server = read("isthmusgatewayserver-rome.yaml");
    assert_eq!(
        (server.side, server.mtu),
        (Side::Server { port: 51840 }, 1340)
    );
    let client = read("isthmusgatewayclient-rome.yaml");
    assert_eq!(
        (client.side, client.mtu),
        (
            Side::Client {
                endpoint: Endpoint::Addr("203.0.113.2".parse().unwrap()),
                port: 51840
            },
            1340
        )
    );
}

#[test]
fn a_status_with_a_text_port_or_tcp_does_not_fit() {
    let (schema, _) = isthmus_crd("isthmusgatewayservers");
    let fixture = &yaml_file("../tests/fixtures/liqo-v1/isthmusgatewayserver-rome.yaml")[0];
    let mut text_port = fixture.clone();
    text_port["status"]["endpoint"]["port"] = "51840".into();
    assert!(!errors(&schema, &text_port).is_empty());
    let mut tcp = fixture.clone();
    tcp["status"]["endpoint"]["protocol"] = "TCP".into();
    assert!(!errors(&schema, &tcp).is_empty());
}

#[test]
fn liqos_controller_manager_may_read_the_templates_and_make_the_objects() {
    let objects = kustomize_render("liqo-v1/gateway-type");
    let rules: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRole")
        .flat_map(|r| r["rules"].as_array().unwrap())
        .collect();
    let binding = objects
        .iter()
        .find(|o| o["kind"] == "ClusterRoleBinding")
        .unwrap();
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "liqo-controller-manager", "namespace": "liqo"}])
    );
    let grants = |resource: &str, verb: &str| {
        rules.iter().any(|rule| {
            let has =
                |field: &str, want: &str| rule[field].as_array().unwrap().iter().any(|x| x == want);
            has("apiGroups", "gateway.isthmus.dev")
                && has("resources", resource)
                && has("verbs", verb)
        })
    };
    for template in [
        "isthmusgatewayservertemplates",
        "isthmusgatewayclienttemplates",
    ] {
        assert!(grants(template, "get"), "{template}");
        assert!(!grants(template, "create"), "{template}");
    }
    for object in ["isthmusgatewayservers", "isthmusgatewayclients"] {
        for verb in ["get", "list", "watch", "create", "patch"] {
            assert!(grants(object, verb), "{object} {verb}");
        }
        assert!(
            !grants(&format!("{object}/status"), "patch"),
            "{object}/status is ours"
        );
    }
}

/// The gateway's account may make the `gw-<gateway>` Deployment the agent
/// writes, and no Deployment of another shape: the policy holds what RBAC
/// cannot narrow.
#[test]
fn the_gateway_account_may_make_only_the_readiness_deployment() {
    use isthmus_agent::{
        control::status::gateway_pod,
        model::{
            object::ObjectKey,
            peer::{GatewayImplementation, GatewayRole, LiqoGateway},
        },
    };
    let admission = yaml_file("liqo-v1/admission.yaml");
    let policy = admission
        .iter()
        .find(|o| o["kind"] == "ValidatingAdmissionPolicy")
        .unwrap();
    let binding = admission
        .iter()
        .find(|o| o["kind"] == "ValidatingAdmissionPolicyBinding")
        .unwrap();
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    let gateway = LiqoGateway {
        role: GatewayRole::Server,
        implementation: GatewayImplementation::Isthmus,
        key: ObjectKey {
            namespace: "liqo-tenant-rome".into(),
            name: "rome".into(),
        },
        cluster_id: "rome".into(),
        port: 51840,
    };
    let deployment = gateway_pod::deployment(
        &gateway,
        "1f6d",
        "gateway-1",
        "10.200.1.3:9873".parse().unwrap(),
        gateway_pod::DEFAULT_IMAGE,
    );
    let request = |user: &str, operation: &str| serde_json::json!({"userInfo": {"username": user}, "operation": operation, "subResource": ""});
    let agent = "system:serviceaccount:isthmus-system:isthmus-gateway";
    for operation in ["CREATE", "UPDATE"] {
        assert_eq!(
            admitted(
                policy,
                &request(agent, operation),
                &deployment,
                &Value::Null
            ),
            Some(true),
            "{operation}"
        );
    }
    let changed = |edit: &dyn Fn(&mut Value)| {
        let mut d = deployment.clone();
        edit(&mut d);
        d
    };
    let refused: [(&str, Value); 7] = [
        (
            "another name",
            changed(&|d| d["metadata"]["name"] = "db".into()),
        ),
        (
            "another image",
            changed(&|d| d["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:1".into()),
        ),
        (
            "a command",
            changed(&|d| {
                d["spec"]["template"]["spec"]["containers"][0]["command"] =
                    serde_json::json!(["/bin/sh"]);
            }),
        ),
        (
            "the host's network",
            changed(&|d| d["spec"]["template"]["spec"]["hostNetwork"] = true.into()),
        ),
        (
            "a volume",
            changed(&|d| {
                d["spec"]["template"]["spec"]["volumes"] =
                    serde_json::json!([{"name": "root", "hostPath": {"path": "/"}}]);
            }),
        ),
        (
            "an account token",
            changed(&|d| {
                d["spec"]["template"]["spec"]["automountServiceAccountToken"] = true.into();
            }),
        ),
        (
            "a privilege",
            changed(&|d| {
                d["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]
                    ["add"] = serde_json::json!(["NET_ADMIN"]);
            }),
        ),
    ];
    for (what, d) in refused {
        assert_eq!(
            admitted(policy, &request(agent, "CREATE"), &d, &Value::Null),
            Some(false),
            "{what}"
        );
    }
    // Liqo's and everyone else's Deployments are not this policy's business.
    let others = request(
        "system:serviceaccount:liqo:liqo-controller-manager",
        "CREATE",
    );
    assert_eq!(admitted(policy, &others, &deployment, &Value::Null), None);
}
