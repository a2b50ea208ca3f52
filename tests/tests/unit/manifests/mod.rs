//! The manifests in `manifests/`: valid for a current Kubernetes, a
//! DaemonSet with only the capabilities it needs, and CRD schemas that
//! accept the objects Liqo writes and refuse malformed ones.

mod crds;
mod liqo_v1;
mod liqo_v1_crds;
mod liqo_v1_gateway_type;
mod liqo_v1_templates;
mod rbac;

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

/// `kubernetes-validate --strict` of `files`: its report, after checking
/// that it passed and left unchecked only kinds Kubernetes has no schema for.
fn validate(files: &[String]) -> String {
    let validator = tools::kubernetes_validate();
    let out = Command::new(&validator)
        .arg("--strict")
        .args(files)
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
    for line in report.lines().filter(|l| !l.starts_with("INFO")) {
        assert!(
            line.contains("kind PodMonitor with api version monitoring.coreos.com/v1"),
            "unexpected: {line}\n{report}"
        );
    }
    report
}

/// How many resources a [`validate`] report passed.
/// [`validate`] of `objects`, written to one file named after `name`.
fn validate_objects<'a>(name: &str, objects: impl IntoIterator<Item = &'a Value>) -> String {
    let path = std::env::temp_dir().join(format!("isthmus-{name}-{}.yaml", std::process::id()));
    let text: Vec<String> = objects
        .into_iter()
        .map(|o| serde_yaml_ng::to_string(o).unwrap())
        .collect();
    std::fs::write(&path, text.join("---\n")).unwrap();
    let report = validate(&[path.display().to_string()]);
    let _ = std::fs::remove_file(&path);
    report
}

fn passed(report: &str) -> usize {
    report.lines().filter(|l| l.contains(" passed ")).count()
}

#[test]
fn every_manifest_validates_for_a_current_kubernetes() {
    let files: Vec<String> = kustomize("standalone")
        .iter()
        .map(|f| manifests().join(f).display().to_string())
        .collect();
    let report = validate(&files);
    assert_eq!(passed(&report), 19, "resources checked:\n{report}");
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
