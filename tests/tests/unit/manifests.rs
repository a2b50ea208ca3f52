//! The manifests in `manifests/`: valid for a current Kubernetes, a
//! DaemonSet with only the capabilities it needs, and CRD schemas that
//! accept the objects Liqo writes and refuse malformed ones.

use std::{path::PathBuf, process::Command};

use isthmus_lab::{
    tools,
    topology::{NAT_MAPPING, PEERINGS},
};
use serde_json::Value;

fn manifests() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests")
}

fn yaml_file(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(manifests().join(path)).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .collect()
}

fn yaml(text: &str) -> Value {
    serde_yaml_ng::from_str(text).unwrap()
}

/// The files a kustomization in `dir` (under `manifests/`) brings in,
/// following directories to their own kustomizations, as kustomize does.
fn kustomize(dir: &str) -> Vec<String> {
    let kustomization = &yaml_file(&format!("{dir}/kustomization.yaml"))[0];
    kustomization["resources"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| {
            let path = format!("{dir}/{}", r.as_str().unwrap());
            match manifests().join(&path).is_dir() {
                true => kustomize(&path),
                false => vec![path],
            }
        })
        .collect()
}

fn kinds(files: &[String]) -> Vec<String> {
    files
        .iter()
        .flat_map(|f| yaml_file(f))
        .map(|o| o["kind"].as_str().unwrap().to_owned())
        .collect()
}

/// Where Liqo's chart owns the CRDs, the base goes alone; `standalone`
/// adds ours.
#[test]
fn the_base_has_no_crd_and_standalone_adds_both() {
    let base = kustomize("base");
    assert!(
        !kinds(&base).contains(&"CustomResourceDefinition".to_owned()),
        "{base:?}"
    );
    let standalone = kustomize("standalone");
    let crds: Vec<&String> = standalone
        .iter()
        .filter(|f| !base.contains(&f.replace("standalone/../", "")))
        .collect();
    assert_eq!(
        crds,
        [
            "standalone/../crds/net.liqo.io_tunnelendpoints.yaml",
            "standalone/../crds/net.liqo.io_natmappings.yaml"
        ]
    );
}

#[test]
fn every_manifest_validates_for_a_current_kubernetes() {
    let files: Vec<String> = kustomize("standalone")
        .iter()
        .map(|f| manifests().join(f).display().to_string())
        .collect();
    let validator = tools::kubernetes_validate();
    let out = Command::new(&validator)
        .arg("--strict")
        .args(&files)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; `cargo xtask build` installs it",
                validator.display()
            )
        });
    let report =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "kubernetes-validate failed:\n{report}"
    );
    // Only kinds Kubernetes itself has no schema for may go unchecked.
    for line in report.lines().filter(|l| !l.starts_with("INFO")) {
        assert!(
            line.contains("kind PodMonitor with api version monitoring.coreos.com/v1"),
            "unexpected: {line}\n{report}"
        );
    }
    let passed = report.lines().filter(|l| l.contains(" passed ")).count();
    assert_eq!(passed, 19, "resources checked:\n{report}");
}

#[test]
fn each_daemonset_grants_net_admin_bpf_perfmon_its_bpffs_directory_and_nothing_else() {
    let sets = yaml_file("base/daemonset.yaml");
    assert_eq!(sets.len(), 2, "a gateway and a worker DaemonSet");
    let mut accounts = Vec::new();
    let tun_on_gateways_only = [
        vec!["/sys/fs/bpf/isthmus", "/dev/net/tun"],
        vec!["/sys/fs/bpf/isthmus"],
    ];
    // The bpffs directory is mounted off /sys, which the runtime mounts
    // read-only and cannot make a mount point in.
    let seen_at = |path: &str| match path {
        "/sys/fs/bpf/isthmus" => "/run/isthmus/bpffs".to_owned(),
        other => other.to_owned(),
    };
    for (ds, paths) in sets.iter().zip(tun_on_gateways_only) {
        let name = ds["metadata"]["name"].as_str().unwrap();
        let pod = &ds["spec"]["template"]["spec"];
        assert_eq!(pod["hostNetwork"], true, "{name}");
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{name}"
        );
        // The agent confines itself (kernel::privileges): some runtimes'
        // default profiles refuse bpf(2) to CAP_BPF.
        assert_eq!(
            pod["containers"][0]["securityContext"]["seccompProfile"]["type"], "Unconfined",
            "{name}"
        );
        accounts.push(pod["serviceAccountName"].as_str().unwrap().to_owned());
        let containers = pod["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 1);
        let agent = &containers[0];
        let security = &agent["securityContext"];
        assert_eq!(security["privileged"], false, "{name}");
        assert_eq!(security["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
        assert_eq!(
            security["capabilities"]["add"],
            serde_json::json!(["NET_ADMIN", "BPF", "PERFMON"])
        );
        let mounts: Vec<&str> = agent["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["mountPath"].as_str().unwrap())
            .collect();
        let mounted_at: Vec<String> = paths.iter().map(|p| seen_at(p)).collect();
        assert_eq!(mounts, mounted_at, "{name}");
        assert!(
            agent["args"]
                .to_string()
                .contains("--bpffs=/run/isthmus/bpffs"),
            "{name}"
        );
        let host_paths: Vec<&str> = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["hostPath"]["path"].as_str().unwrap())
            .collect();
        assert_eq!(host_paths, paths, "{name}");
        for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
            assert_eq!(agent[probe]["httpGet"]["path"], path);
            assert_eq!(agent[probe]["httpGet"]["port"], "metrics");
        }
        // Metrics on the node's own address (the agent's default with
        // NODE_IP), not on every address of the node.
        let args = agent["args"].to_string();
        assert!(!args.contains("0.0.0.0"), "{name} binds everything: {args}");
        assert!(
            agent["env"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["name"] == "NODE_IP"
                    && e["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"),
            "{name} has no NODE_IP"
        );
        assert_eq!(agent["ports"][0]["containerPort"], 9873);
        assert!(agent["resources"]["limits"]["memory"].is_string());
        let annotations = &ds["spec"]["template"]["metadata"]["annotations"];
        assert_eq!(annotations["prometheus.io/port"], "9873");
    }
    assert_eq!(accounts, ["isthmus-gateway", "isthmus-worker"]);
}

/// The rules bound to ServiceAccount `account`, through any binding.
fn rules_of(account: &str) -> Vec<Value> {
    let rbac = yaml_file("base/rbac.yaml");
    let roles: Vec<&str> = rbac
        .iter()
        .filter(|o| o["kind"].as_str().is_some_and(|k| k.ends_with("Binding")))
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
        .filter(|o| o["kind"].as_str().is_some_and(|k| k.ends_with("Role")))
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

/// The schema of a CRD's served version, as a JSON Schema validator.
fn schema(crd: &str) -> jsonschema::Validator {
    let crd = &yaml_file(crd)[0];
    jsonschema::draft4::new(&crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
        .expect("the CRD schema compiles")
}

const KEY: &str = "oR2+uQn4MBy1GmxIvBqEjW6sIpH9h5CTmhzRrTzB4W8=";

#[test]
fn liqo_objects_fit_the_crd_schemas_and_malformed_ones_do_not() {
    let tunnel_endpoints = schema("crds/net.liqo.io_tunnelendpoints.yaml");
    // The lab's TunnelEndpoints, in both layouts Liqo wrote.
    for p in &PEERINGS {
        let object = yaml(&p.tunnel_endpoint_yaml(Some(KEY)));
        let errors: Vec<String> = tunnel_endpoints
            .iter_errors(&object)
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "{}→{}: {errors:?}",
            p.local.name,
            p.remote.name
        );
    }
    let good = PEERINGS[0].tunnel_endpoint_yaml(Some(KEY));
    let endpoint = format!(
        "endpointIP: {}",
        PEERINGS[0]
            .endpoint_name
            .expect("the lab names b by host name")
    );
    assert!(good.contains(&endpoint), "{good}");
    for (what, bad) in [
        ("bad CIDR", good.replace("10.0.40.0/24", "10.0.40.0/33")),
        (
            "bad IP",
            good.replace(&endpoint, "endpointIP: 203.0.113.256"),
        ),
        (
            "bad port",
            good.replace("port: \"5871\"", "port: \"65536\""),
        ),
        ("bad key", good.replace(KEY, "not-base64")),
    ] {
        assert!(
            !tunnel_endpoints.is_valid(&yaml(&bad)),
            "{what} accepted:\n{bad}"
        );
    }
    let status = serde_json::json!({"status": {"connection": {"status": "Sleeping"}}});
    assert!(
        !tunnel_endpoints.is_valid(&status),
        "unknown connection status accepted"
    );
    // Liqo v0.2-v0.4 wrote statuses in lower case.
    let status = serde_json::json!({"status": {"connection": {"status": "connected"}}});
    assert!(tunnel_endpoints.is_valid(&status));
    let elb = good.replace(
        &endpoint,
        "endpointIP: a1b2c3-1234567890.eu-west-1.elb.amazonaws.com",
    );
    assert!(tunnel_endpoints.is_valid(&yaml(&elb)), "{elb}");

    // Every object of Liqo's shapes in the fixtures.
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/liqo");
    let nat_mappings = schema("crds/net.liqo.io_natmappings.yaml");
    for entry in std::fs::read_dir(&fixtures).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let object = yaml(&std::fs::read_to_string(&path).unwrap());
        let validator = match object["kind"].as_str() {
            Some("TunnelEndpoint") => &tunnel_endpoints,
            _ => &nat_mappings,
        };
        let errors: Vec<String> = validator
            .iter_errors(&object)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{}: {errors:?}", path.display());
    }

    let good = NAT_MAPPING.yaml(&[NAT_MAPPING.entry()]);
    assert!(nat_mappings.is_valid(&yaml(&good)), "{good}");
    let bad = good.replace(": 10.0.1.45", ": 10.0.1.450");
    assert!(
        !nat_mappings.is_valid(&yaml(&bad)),
        "bad externalIP accepted"
    );
    let no_cluster = good.replace("spec:\n  clusterID: cluster-a\n", "spec:\n");
    assert!(
        !nat_mappings.is_valid(&yaml(&no_cluster)),
        "missing clusterID accepted"
    );
}

/// Every field, printer column and category of Liqo v0.10.3's CRDs
/// (`deployments/liqo/crds`) is in ours, so that either may own them.
#[test]
fn our_crds_are_a_superset_of_liqo_v0_10() {
    let crd = |file: &str| yaml_file(file).remove(0);
    let tep = crd("crds/net.liqo.io_tunnelendpoints.yaml");
    let nm = crd("crds/net.liqo.io_natmappings.yaml");
    for c in [&tep, &nm] {
        assert_eq!(
            c["spec"]["names"]["categories"],
            serde_json::json!(["liqo"])
        );
    }
    let has = |c: &Value, path: &str| {
        let mut node = &c["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        for part in path.split('.') {
            node = &node["properties"][part];
        }
        !node.is_null()
    };
    for path in [
        "spec.backend_config",
        "spec.backendType",
        "spec.clusterIdentity.clusterID",
        "spec.clusterIdentity.clusterName",
        "spec.endpointIP",
        "spec.localExternalCIDR",
        "spec.localNATExternalCIDR",
        "spec.localNATPodCIDR",
        "spec.localPodCIDR",
        "spec.remoteExternalCIDR",
        "spec.remoteNATExternalCIDR",
        "spec.remoteNATPodCIDR",
        "spec.remotePodCIDR",
        "status.connection.latency.timestamp",
        "status.connection.latency.value",
        "status.connection.peerConfiguration",
        "status.connection.status",
        "status.connection.statusMessage",
        "status.gatewayIP",
        "status.tunnelIFaceIndex",
        "status.tunnelIFaceName",
        "status.vethIFaceIndex",
        "status.vethIFaceName",
        "status.vethIP",
    ] {
        assert!(has(&tep, path), "TunnelEndpoint lacks Liqo's {path}");
    }
    for path in [
        "spec.clusterID",
        "spec.clusterMappings",
        "spec.externalCIDR",
        "spec.podCIDR",
    ] {
        assert!(has(&nm, path), "NatMapping lacks Liqo's {path}");
    }
    let columns: Vec<(&str, &str)> = tep["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["jsonPath"].as_str().unwrap()))
        .collect();
    assert_eq!(
        columns,
        [
            ("Peering Cluster", ".spec.clusterIdentity.clusterName"),
            ("Endpoint IP", ".spec.endpointIP"),
            ("Backend type", ".spec.backendType"),
            ("Latency", ".status.connection.latency.value"),
            ("Connection status", ".status.connection.status"),
            ("Age", ".metadata.creationTimestamp"),
        ]
    );
}

/// `kubectl kustomize DIR` under `manifests/`: the objects kustomize renders.
fn render(dir: &str) -> Vec<Value> {
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
fn admitted(policy: &Value, request: &Value, object: &Value, old: &Value) -> Option<bool> {
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
        "spec": {"nodeName": "a-gw", "containers": [{"name": "agent", "image": "isthmus-agent:0.1.0"}]},
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
                    serde_json::json!({"app": "db", "net.liqo.io/gateway": "active"})
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

/// The image the DaemonSets run is the one `cargo xtask image` tags, and
/// the standalone kustomization names it where users set their registry's.
#[test]
fn the_daemonsets_run_the_image_cargo_xtask_image_tags() {
    for ds in yaml_file("base/daemonset.yaml") {
        let image = &ds["spec"]["template"]["spec"]["containers"][0]["image"];
        assert_eq!(
            image,
            &isthmus_lab::image::reference(),
            "{}",
            ds["metadata"]["name"]
        );
    }
    let kustomization = &yaml_file("standalone/kustomization.yaml")[0];
    let set = &kustomization["images"][0];
    assert_eq!(set["name"], isthmus_lab::image::REPOSITORY);
    assert_eq!(set["newTag"], env!("CARGO_PKG_VERSION"));
}
