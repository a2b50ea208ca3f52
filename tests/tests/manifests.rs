//! The manifests in `manifests/`: valid for a current Kubernetes, a
//! DaemonSet with only the capabilities it needs, and CRD schemas that
//! accept the objects Liqo writes and refuse malformed ones.

use std::{path::PathBuf, process::Command};

use serde_json::Value;
use xtask::{
    tools,
    topology::{NAT_MAPPING, PEERINGS},
};

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

#[test]
fn every_manifest_validates_for_a_current_kubernetes() {
    let kustomization = &yaml_file("kustomization.yaml")[0];
    let files: Vec<String> = kustomization["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| manifests().join(f.as_str().unwrap()).display().to_string())
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
    assert_eq!(passed, 9, "resources checked:\n{report}");
}

#[test]
fn the_daemonset_grants_net_admin_bpf_perfmon_and_nothing_else() {
    let ds = &yaml_file("daemonset.yaml")[0];
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let agent = &containers[0];
    let security = &agent["securityContext"];
    assert_eq!(security["privileged"], false);
    assert_eq!(security["allowPrivilegeEscalation"], false);
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
    assert_eq!(mounts, ["/sys/fs/bpf", "/dev/net/tun"]);
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(agent[probe]["httpGet"]["path"], path);
        assert_eq!(agent[probe]["httpGet"]["port"], "metrics");
    }
    assert_eq!(agent["ports"][0]["containerPort"], 9873);
    assert!(agent["resources"]["limits"]["memory"].is_string());
    let annotations = &ds["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/port"], "9873");
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
    // The lab's TunnelEndpoints, in both layouts (spec and status).
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
    for (what, bad) in [
        ("bad CIDR", good.replace("10.0.40.0/24", "10.0.40.0/33")),
        (
            "bad IP",
            good.replace("endpointIP: 203.0.113.2", "endpointIP: 203.0.113.256"),
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

    let nat_mappings = schema("crds/net.liqo.io_natmappings.yaml");
    let good = NAT_MAPPING.yaml(&[NAT_MAPPING.entry()]);
    assert!(nat_mappings.is_valid(&yaml(&good)), "{good}");
    let bad = good.replace(": 192.168.0.45", ": 192.168.0.450");
    assert!(
        !nat_mappings.is_valid(&yaml(&bad)),
        "bad externalIP accepted"
    );
    let no_cluster = good.replace("  clusterID: cluster-a\n", "");
    assert!(
        !nat_mappings.is_valid(&yaml(&no_cluster)),
        "missing clusterID accepted"
    );
}
