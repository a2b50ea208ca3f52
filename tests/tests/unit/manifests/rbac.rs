//! Who may do what: the ClusterRoles of each DaemonSet's account, and the
//! gateway election's labels no kubelet and no other account can set.

use super::*;

/// The rules of the base bound to ServiceAccount `account`.
fn rules_of(account: &str) -> Vec<Value> {
    rules_bound(&yaml_file("base/rbac.yaml"), account)
}

/// The rules among `rbac` bound to ServiceAccount `account`, through any
/// binding.
pub(super) fn rules_bound(rbac: &[Value], account: &str) -> Vec<Value> {
    let roles: Vec<&str> = rbac
        .iter()
        .filter(|o| o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding")
        .filter(|b| {
            b["subjects"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["name"] == account)
        })
        .map(|b| b["roleRef"]["name"].as_str().unwrap())
        .collect();
    rbac.iter()
        .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
        .filter(|r| roles.contains(&r["metadata"]["name"].as_str().unwrap()))
        .flat_map(|r| r["rules"].as_array().unwrap().clone())
        .collect()
}

#[test]
fn only_the_gateway_may_touch_secrets_or_write_anything() {
    let reaches = |account: &str, resource: &str| {
        rules_of(account).iter().any(|r| {
            r["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x == resource)
        })
    };
    for resource in [
        "secrets",
        "tunnelendpoints/status",
        // The election, and what isolation reads.
        "leases",
        "pods",
        "endpointslices",
        "namespaceoffloadings",
    ] {
        assert!(reaches("isthmus-gateway", resource), "{resource}");
    }
    // A worker follows the election's Lease, and only reads it (below).
    assert!(reaches("isthmus-worker", "leases"));
    assert!(
        !reaches("isthmus-worker", "secrets"),
        "a worker can read Secrets"
    );
    for rule in rules_of("isthmus-worker") {
        let verbs: Vec<&str> = rule["verbs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(
            verbs,
            ["get", "list", "watch"],
            "a worker may write: {rule}"
        );
    }
    assert!(reaches("isthmus-worker", "tunnelendpoints"));
}

/// `kubectl kustomize DIR` under `manifests/`: the objects kustomize renders.
pub(super) fn render(dir: &str) -> Vec<Value> {
    let out = Command::new("kubectl")
        .args(["kustomize"])
        .arg(manifests().join(dir))
        .output()
        .unwrap_or_else(|e| panic!("kubectl kustomize: {e}; this machine type ships kubectl"));
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_yaml_ng::Deserializer::from_slice(&out.stdout)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .collect()
}

/// The gateway DaemonSet's node selection and the label the agents are
/// told makes a gateway, for each DaemonSet of `objects`.
fn gateway_selection(objects: &[Value]) -> Vec<(String, String, String)> {
    objects
        .iter()
        .filter(|o| o["kind"] == "DaemonSet")
        .map(|ds| {
            let spec = &ds["spec"]["template"]["spec"];
            let selection = match spec["nodeSelector"].as_object() {
                Some(selector) => serde_json::to_string(selector).unwrap(),
                None => serde_json::to_string(
                    &spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
                )
                .unwrap(),
            };
            let label = spec["containers"][0]["env"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == "ISTHMUS_GATEWAY_LABEL")
                .map(|e| e["value"].as_str().unwrap().to_owned())
                .unwrap_or_default();
            (ds["metadata"]["name"].as_str().unwrap().to_owned(), selection, label)
        })
        .collect()
}

/// A kubelet may set any label on its own Node except under
/// `node-restriction.kubernetes.io/` (the NodeRestriction plugin): the
/// gateways are selected by such a label, and Liqo's label is an opt-in.
#[test]
fn gateways_are_chosen_by_a_label_no_kubelet_can_set_on_itself() {
    const PROTECTED: &str = "node-restriction.kubernetes.io/isthmus-gateway";
    let base = gateway_selection(&render("base"));
    assert_eq!(base.len(), 2);
    for (name, selection, label) in &base {
        assert!(selection.contains(PROTECTED), "{name}: {selection}");
        assert!(!selection.contains("net.liqo.io"), "{name}: {selection}");
        assert_eq!(label, &format!("{PROTECTED}=true"), "{name}");
    }
    for (name, selection, label) in gateway_selection(&render("liqo-selection")) {
        assert!(
            selection.contains("net.liqo.io/gateway"),
            "{name}: {selection}"
        );
        assert!(!selection.contains(PROTECTED), "{name}: {selection}");
        assert_eq!(label, "net.liqo.io/gateway=true", "{name}");
    }
}

/// Whether the ValidatingAdmissionPolicy admits `request`: its match
/// condition, then its variables and every validation, evaluated by a CEL
/// interpreter. None when the policy does not apply.
pub(super) fn admitted(
    policy: &Value,
    request: &Value,
    object: &Value,
    old: &Value,
) -> Option<bool> {
    use cel_interpreter::{Context, Program, Value as Cel};
    let eval = |context: &Context, expression: &str| -> Cel {
        let program =
            Program::compile(expression).unwrap_or_else(|e| panic!("{expression}: {e:?}"));
        program
            .execute(context)
            .unwrap_or_else(|e| panic!("{expression}: {e:?}"))
    };
    let mut context = Context::default();
    context.add_variable("request", request).unwrap();
    context.add_variable("object", object).unwrap();
    context.add_variable("oldObject", old).unwrap();
    let spec = &policy["spec"];
    for condition in spec["matchConditions"].as_array().unwrap() {
        if eval(&context, condition["expression"].as_str().unwrap()) != Cel::Bool(true) {
            return None;
        }
    }
    let mut variables = std::collections::HashMap::new();
    for variable in spec["variables"].as_array().unwrap() {
        let value = eval(&context, variable["expression"].as_str().unwrap());
        variables.insert(variable["name"].as_str().unwrap().to_owned(), value);
        context.add_variable_from_value("variables", variables.clone());
    }
    Some(
        spec["validations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| eval(&context, v["expression"].as_str().unwrap()) == Cel::Bool(true)),
    )
}

/// The gateway's ServiceAccount may set only `net.liqo.io/gateway` to
/// active or standby on the agent's own gateway pods; every other change
/// it asks for is refused, and nobody else's requests are the policy's.
#[test]
fn the_gateway_account_may_change_only_its_pods_election_label() {
    let policy = yaml_file("base/admission.yaml")
        .into_iter()
        .find(|o| o["kind"] == "ValidatingAdmissionPolicy")
        .unwrap();
    let binding = yaml_file("base/admission.yaml")
        .into_iter()
        .find(|o| o["kind"] == "ValidatingAdmissionPolicyBinding")
        .unwrap();
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(
        binding["spec"]["validationActions"],
        serde_json::json!(["Deny"])
    );
    let gateway = "system:serviceaccount:isthmus-system:isthmus-gateway";
    let request = |user: &str, operation: &str| serde_json::json!({"userInfo": {"username": user}, "operation": operation, "subResource": ""});
    let pod = serde_json::json!({
        "metadata": {
            "name": "isthmus-gateway-x1", "namespace": "isthmus-system",
            "labels": {"app.kubernetes.io/name": "isthmus", "isthmus.io/role": "gateway",
                       "net.liqo.io/gateway": "standby"},
            "annotations": {"prometheus.io/scrape": "true"},
        },
        "spec": {"nodeName": "a-gw", "containers": [{"name": "agent", "image": "isthmus-agent:0.2.0-dev"}]},
    });
    let changed = |edit: &dyn Fn(&mut Value)| {
        let mut new = pod.clone();
        edit(&mut new);
        new
    };
    let update = request(gateway, "UPDATE");
    // What the election writes (elector.rs: a merge patch of the label).
    let active = changed(&|p| p["metadata"]["labels"]["net.liqo.io/gateway"] = "active".into());
    assert_eq!(admitted(&policy, &update, &active, &pod), Some(true));
    let unlabelled = changed(&|p| {
        p["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove("net.liqo.io/gateway");
    });
    assert_eq!(admitted(&policy, &update, &pod, &unlabelled), Some(true));
    let refused: [(&str, Value, Value); 6] = [
        (
            "another label",
            changed(&|p| p["metadata"]["labels"]["isthmus.io/role"] = "worker".into()),
            pod.clone(),
        ),
        (
            "an annotation",
            changed(&|p| p["metadata"]["annotations"]["x"] = "y".into()),
            pod.clone(),
        ),
        (
            "the image",
            changed(&|p| p["spec"]["containers"][0]["image"] = "evil:1".into()),
            pod.clone(),
        ),
        (
            "a value other than active or standby",
            changed(&|p| p["metadata"]["labels"]["net.liqo.io/gateway"] = "true".into()),
            pod.clone(),
        ),
        (
            "a pod not the agent's",
            changed(&|p| {
                p["metadata"]["labels"] =
                    serde_json::json!({"app": "db", "net.liqo.io/gateway": "active"});
            }),
            changed(&|p| p["metadata"]["labels"] = serde_json::json!({"app": "db"})),
        ),
        (
            "a gateway pod of another namespace",
            changed(&|p| {
                p["metadata"]["namespace"] = "default".into();
                p["metadata"]["labels"]["net.liqo.io/gateway"] = "active".into();
            }),
            changed(&|p| p["metadata"]["namespace"] = "default".into()),
        ),
    ];
    for (what, new, old) in refused {
        assert_eq!(
            admitted(&policy, &update, &new, &old),
            Some(false),
            "{what}"
        );
    }
    // Deleting or creating pods is no relabelling either.
    assert_eq!(
        admitted(&policy, &request(gateway, "DELETE"), &Value::Null, &pod),
        Some(false)
    );
    assert_eq!(
        admitted(&policy, &request(gateway, "CREATE"), &pod, &Value::Null),
        Some(false)
    );
    // Everyone else's requests are not this policy's business.
    let kubelet = request("system:node:a-gw", "UPDATE");
    assert_eq!(admitted(&policy, &kubelet, &active, &pod), None);
}
