//! Objects in the exact shapes Liqo writes them
//! (`tests/fixtures/liqo`) are accepted by `isthmus-agent check` and by
//! `run`, and `check` names the file, the object and the field of what it
//! rejects.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use isthmus_lab::lab;
use isthmus_tests::{eventually, netns as test_netns, require_lab, require_root};
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/liqo")
}

fn check(dir: &Path, json: bool) -> Output {
    let mut command = Command::new(lab::agent_binary());
    command.args(["check", &format!("--source=dir:{}", dir.display())]);
    if json {
        command.arg("--json");
    }
    command
        .output()
        .expect("the agent binary (cargo xtask build)")
}

/// A copy of the fixtures in a fresh directory, to change.
fn copy_of_fixtures() -> tempfile::TempDir {
    let dir = isthmus_tests::scratch_dir();
    for entry in fs::read_dir(fixtures()).unwrap() {
        let path = entry.unwrap().path();
        fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    dir
}

fn rows<'v>(verdict: &'v Value, table: &str) -> &'v Vec<Value> {
    verdict[table].as_array().unwrap()
}

#[test]
fn check_accepts_every_shape_liqo_writes_and_says_what_it_would_program() {
    let out = check(&fixtures(), true);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verdict: Value = serde_json::from_str(&said).unwrap();
    assert_eq!(rows(&verdict, "rejected"), &Vec::<Value>::new(), "{said}");
    let peers = rows(&verdict, "peers");
    let peer = |object: &str| {
        peers
            .iter()
            .find(|p| p["object"] == object)
            .unwrap_or_else(|| panic!("{object} not accepted: {said}"))
    };
    let milan = peer("liqo-tenant-milan-6a0e9f/milan");
    assert!(milan["layout"].as_str().unwrap().starts_with("spec"));
    assert_eq!(
        milan["views"],
        "remoteNATPodCIDR=10.50.0.0/16 remoteNATExternalCIDR=10.51.0.0/16"
    );
    let rome = peer("liqo-tenant-rome-c41d2e/rome");
    assert_eq!(
        rome["endpoint"],
        "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6-1234567890.eu-south-1.elb.amazonaws.com:32145"
    );
    let turin = peer("liqo-tenant-2f1e0d9c-8b7a-4695-8473-6251403f2e1d/tun-endpoint-k8p2w");
    assert!(
        turin["layout"].as_str().unwrap().contains("v0.2.1-v0.3.0"),
        "{turin}"
    );
    assert_eq!(
        turin["views"],
        "remotePodCIDR=10.80.0.0/16 remoteExternalCIDR=10.81.0.0/16"
    );
    // milan's entries in its view of our ExternalCIDR, keyed in the kernel
    // by the real address with the same host bits; rome's NatMapping is empty.
    let mut entries: Vec<(String, String, String)> = rows(&verdict, "natMappings")
        .iter()
        .map(|r| {
            let cell = |c: &str| r[c].as_str().unwrap().to_owned();
            (cell("external_ip"), cell("endpoint_ip"), cell("kernel_key"))
        })
        .collect();
    entries.sort();
    assert_eq!(
        entries,
        [
            (
                "10.61.0.1".into(),
                "169.254.0.1".into(),
                "10.201.0.1".into()
            ),
            ("10.61.0.2".into(), "10.70.4.21".into(), "10.201.0.2".into()),
        ]
    );
}

/// The shape the lab once used, an externalIP in our real ExternalCIDR
/// while the peer remapped it, and a NatMapping written for other views.
#[test]
fn check_names_file_object_and_field_of_each_rejection_and_exits_1() {
    let dir = copy_of_fixtures();
    let milan = dir.path().join("natmapping-milan.yaml");
    let text = fs::read_to_string(&milan).unwrap();
    fs::write(
        &milan,
        text.replace("10.70.4.21: 10.61.0.2", "10.70.4.21: 10.201.0.2"),
    )
    .unwrap();
    let rome = dir.path().join("natmapping-rome.yaml");
    let text = fs::read_to_string(&rome).unwrap();
    fs::write(
        &rome,
        text.replace("podCIDR: 10.70.0.0/16", "podCIDR: 10.90.0.0/16"),
    )
    .unwrap();
    let out = check(dir.path(), false);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    for expected in [
        format!(
            "{}: NatMapping natmapping-5kq7d: field spec.clusterMappings.10.70.4.21: externalIP 10.201.0.2 lies outside 10.61.0.0/16, our ExternalCIDR as the peer sees it (localNATExternalCIDR of TunnelEndpoint liqo-tenant-milan-6a0e9f/milan)",
            milan.display()
        ),
        format!(
            "{}: NatMapping natmapping-w2xv8: field spec.podCIDR: 10.90.0.0/16 is not 10.70.0.0/16",
            rome.display()
        ),
    ] {
        assert!(said.contains(&expected), "no {expected:?} in:\n{said}");
    }
    // The other entry of milan's NatMapping is still programmed.
    assert!(said.contains("169.254.0.1"), "{said}");
}

/// The test's agent and namespace, gone with it.
struct Agent {
    pid: u32,
    objects: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = lab::stop_pid(self.pid);
        test_netns::remove(&["ist-t-liqo"]);
        let _ = fs::remove_dir_all(&self.objects);
    }
}

/// `run` reads the same objects as `check` and rejects none. A host name
/// that does not resolve leaves that peer out of the tunnel, said in the
/// log, and the others in.
#[test]
fn run_accepts_every_shape_liqo_writes() {
    require_root();
    require_lab();
    const NS: &str = "ist-t-liqo";
    test_netns::fresh(&[NS]);
    let objects = PathBuf::from(lab::STATE_DIR).join("objects").join(NS);
    let _ = fs::remove_dir_all(&objects);
    fs::create_dir_all(&objects).unwrap();
    for entry in fs::read_dir(fixtures()).unwrap() {
        let path = entry.unwrap().path();
        fs::copy(&path, objects.join(path.file_name().unwrap())).unwrap();
    }
    let log = lab::log_file(NS);
    let _ = fs::remove_file(&log);
    let args = vec![
        "run".to_owned(),
        "--node=t".to_owned(),
        "--role=gateway".to_owned(),
        format!("--source=dir:{}", objects.display()),
        format!("--bpffs={}", lab::bpffs(NS).display()),
        format!("--private-key-file={}/{NS}.key", lab::STATE_DIR),
        format!(
            "--metrics-addr=127.0.0.1:{}",
            isthmus_lab::topology::METRICS_PORT
        ),
    ];
    let pid = lab::spawn_agent(NS, &args, &log).unwrap();
    let _agent = Agent { pid, objects };
    lab::wait_ready_in(NS, pid, &log).unwrap();
    let metric = |name: &str| lab::metric(NS, name).unwrap_or(-1.0);
    eventually(
        std::time::Duration::from_secs(10),
        "three peers and two NatMapping entries",
        || metric("isthmus_peers ") == 3.0 && metric("isthmus_nat_mappings ") == 2.0,
    );
    assert_eq!(
        metric("isthmus_rejected_objects "),
        0.0,
        "{}",
        lab::log_tail(&log)
    );
    eventually(
        std::time::Duration::from_secs(10),
        "the log says rome's name does not resolve",
        || {
            let text = fs::read_to_string(&log).unwrap_or_default();
            text.contains("endpointIP does not resolve")
                && text.contains(
                    "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6-1234567890.eu-south-1.elb.amazonaws.com",
                )
        },
    );
    // milan and turin are in the tunnel; rome is not, for want of an address.
    let body = lab::scrape(NS).unwrap();
    let in_tunnel = |id: &str| {
        body.lines()
            .any(|l| l.starts_with("isthmus_peer_connected{") && l.contains(id))
    };
    assert!(in_tunnel("6a0e9f1c-2f3a-4c55-9d0e-8e1b2c3d4e5f"), "{body}");
    assert!(in_tunnel("2f1e0d9c-8b7a-4695-8473-6251403f2e1d"), "{body}");
    assert!(!in_tunnel("c41d2e7a-8b90-4e12-a3f4-5b6c7d8e9f01"), "{body}");
}
