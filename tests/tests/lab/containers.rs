//! The agent as users deploy it: its image, run by podman under the
//! DaemonSets' container settings (`cargo xtask lab up --containers`; the
//! `containers` tier of `cargo xtask test`). The image has the
//! Containerfile's layout; each capability the manifest adds is needed,
//! and named when missing; the runtime's default seccomp profile refuses
//! bpf(2), which is why the manifest asks for none and the agent confines
//! itself; a container replaced by a new one loses no TCP byte.

use std::{fs, time::Duration};

use isthmus_lab::{
    cmd::{ip, sysctl},
    container, image,
    lab::{
        self,
        containers::{self, AgentContainer, Variant},
    },
    netns,
    topology::{A, C, CLUSTERS, reachability},
};
use isthmus_tests::require_lab;

use crate::ha::Traffic;

/// Fails unless the lab runs its agents in containers.
fn require_container_lab() {
    require_lab();
    assert!(
        lab::Setup::current().expect("the lab's setup").containers,
        "the lab runs its agents as processes: bring it up with `cargo xtask lab up --containers`"
    );
}

/// How long an agent short of a privilege may take to give up.
const EXIT_WITHIN: Duration = Duration::from_secs(30);

/// Runs node `node`'s agent as `variant` of the manifest in place of the
/// lab's, waits for it to exit, puts the lab's back, and returns what the
/// agent printed. Fails if it did not exit: it started without what the
/// variant takes away.
fn log_of_failed_start(node: &str, variant: &Variant) -> String {
    lab::stop_agent(node).unwrap();
    let log = lab::log_file(&format!("{node}-variant"));
    let _ = fs::remove_file(&log);
    let setup = lab::Setup::current().unwrap();
    let args = lab::agent_args(node).unwrap();
    let pid = lab::spawn_container(node, &args, variant, &log, &setup).unwrap();
    let exited = isthmus_lab::wait::until(
        EXIT_WITHIN,
        Duration::from_millis(50),
        "the agent gives up",
        || !lab::alive(pid),
    );
    if exited.is_err() {
        lab::end_pid(pid, Duration::from_secs(10)).unwrap();
    }
    lab::start_agent(node).unwrap();
    lab::wait_ready(node).unwrap();
    let text = fs::read_to_string(&log).unwrap();
    exited.unwrap_or_else(|e| panic!("{e}: it runs without what the variant takes; log:\n{text}"));
    text
}

/// The manifest's gateway container.
fn gateway_container() -> AgentContainer {
    let manifest = fs::read_to_string(containers::manifest()).unwrap();
    AgentContainer::of_role(&manifest, "gateway").unwrap()
}

#[test]
fn the_image_has_the_containerfiles_files_entrypoint_and_user() {
    require_container_lab();
    let stage =
        image::RuntimeStage::parse(&fs::read_to_string(image::containerfile()).unwrap()).unwrap();
    let staged_in = isthmus_lab::target_dir().join("image/rootfs-compared");
    let staged = image::stage_rootfs(&lab::agent_binary(), &staged_in).unwrap();
    let reference = image::reference();
    let files = image::files_in(&reference).unwrap();
    assert_eq!(
        files, staged,
        "the image's files against the Containerfile's rootfs"
    );
    assert!(
        !files
            .iter()
            .any(|f| f.ends_with("/sh") || f.contains("apt")),
        "a shell or a package manager in the image: {files:?}"
    );
    let config = container::podman(&[
        "image",
        "inspect",
        "--format",
        "{{json .Config.Entrypoint}} {{.Config.User}}",
        &reference,
    ])
    .unwrap();
    let (entrypoint, user) = config.trim().split_once(' ').unwrap();
    let entrypoint: Vec<String> = serde_json::from_str(entrypoint).unwrap();
    assert_eq!(entrypoint, stage.entrypoint);
    assert_eq!(entrypoint, [image::AGENT_PATH]);
    assert_eq!(user, stage.user);
    // The same bytes as the build the lab tests.
    let in_image = fs::read(staged_in.join(image::AGENT_PATH.trim_start_matches('/'))).unwrap();
    assert_eq!(in_image, fs::read(lab::agent_binary()).unwrap());
}

#[test]
fn each_capability_the_manifest_adds_is_needed_and_named_when_missing() {
    require_container_lab();
    let capabilities = gateway_container().added_capabilities();
    assert_eq!(capabilities, ["NET_ADMIN", "BPF", "PERFMON"]);
    for cap in &capabilities {
        let without = [cap.as_str()];
        let variant = Variant {
            without_capabilities: &without,
            ..Variant::default()
        };
        let log = log_of_failed_start(&C.gw(), &variant);
        eprintln!("without {cap}:\n{}", last_error(&log));
        assert!(
            log.contains(&format!("missing capability CAP_{cap}")),
            "the error does not name CAP_{cap}:\n{log}"
        );
        // The kernel refused, not the agent on its own.
        assert!(
            [
                "Operation not permitted",
                "Permission denied",
                "prohibited for !root"
            ]
            .iter()
            .any(|refusal| log.contains(refusal)),
            "no refusal from the kernel without {cap}:\n{log}"
        );
    }
}

/// The agent's final error, from `Error:` on.
fn last_error(log: &str) -> &str {
    log.rfind("Error:").map_or(log, |at| &log[at..])
}

#[test]
fn the_runtimes_default_seccomp_profile_refuses_bpf_to_an_agent_with_cap_bpf() {
    require_container_lab();
    let variant = Variant {
        runtime_default_seccomp: true,
        ..Variant::default()
    };
    let log = log_of_failed_start(&C.gw(), &variant);
    eprintln!("under podman's default profile:\n{}", last_error(&log));
    assert!(
        log.contains("bpf(2) was refused although the agent holds CAP_BPF"),
        "{log}"
    );
}

#[test]
fn every_agent_runs_confined_by_its_own_filter_with_the_manifests_capabilities_only() {
    require_container_lab();
    // NET_ADMIN (12), PERFMON (38), BPF (39).
    let three = format!("{:016x}", (1u64 << 12) | (1 << 38) | (1 << 39));
    for node in CLUSTERS.iter().flat_map(|c| c.nodes().map(|(n, _)| n)) {
        let pid = lab::agent_pid(&node).expect("the agent runs");
        let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .map_or_else(|| panic!("{node}: no {name} in its status"), str::trim)
                .to_owned()
        };
        assert_eq!(field("Seccomp"), "2", "{node}: not under a seccomp filter");
        // The runtime adds none (Unconfined): the one filter is the agent's.
        assert_eq!(field("Seccomp_filters"), "1", "{node}");
        assert_eq!(field("NoNewPrivs"), "1", "{node}");
        assert_eq!(field("CapEff"), three, "{node}: effective capabilities");
        assert_eq!(field("CapBnd"), three, "{node}: bounding set");
    }
}

#[test]
fn the_overlay_device_accepts_any_source_where_the_nodes_default_is_strict() {
    require_container_lab();
    let node = A.node();
    let rp_filter = |dev: &str| {
        let path = format!("/proc/sys/net/ipv4/conf/{dev}/rp_filter");
        netns::run_in(&node, move || fs::read_to_string(&path))
            .unwrap()
            .unwrap()
            .trim()
            .to_owned()
    };
    lab::stop_agent(&node).unwrap();
    ip(&node, &["link", "del", "isthmus.vx"]).unwrap();
    sysctl(&node, "net.ipv4.conf.default.rp_filter", "1").unwrap();
    let started = lab::start_agent(&node).and_then(|_| lab::wait_ready(&node));
    let seen = rp_filter("isthmus.vx");
    sysctl(&node, "net.ipv4.conf.default.rp_filter", "0").unwrap();
    started.unwrap();
    // The container's /proc/sys is read-only: the agent sets it over netlink.
    assert_eq!(
        seen, "0",
        "rp_filter of the overlay device a-node's agent made"
    );
}

/// How long the tunnel may pause while a gateway's container is replaced:
/// the agent's stop, the runtime's start of a new container (podman and
/// runc take about 190 ms here) and the agent's start, which adopts the
/// programs its predecessor left attached (seen: 183 ms in all).
const MAX_REPLACEMENT_GAP: Duration = Duration::from_millis(500);

#[test]
fn a_gateways_container_replaced_by_a_new_one_loses_no_tcp_byte() {
    require_container_lab();
    let gw = reachability()[0].clusters_crossed()[0].gw();
    let before = lab::agent_pid(&gw).expect("the agent runs");
    let traffic = Traffic::start();
    lab::restart_agent(&gw).unwrap();
    traffic.flows_again();
    assert_ne!(lab::agent_pid(&gw), Some(before), "the same container runs");
    traffic.check(
        &format!("replacement of {gw}'s container"),
        MAX_REPLACEMENT_GAP,
    );
}
