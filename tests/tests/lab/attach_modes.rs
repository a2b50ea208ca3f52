//! Attaching in each mode, replacing on restart, switching modes, and
//! cleanup, on a veth in a namespace of the test's own.

use std::{fs, path::PathBuf};

use aya::programs::{SchedClassifier, TcAttachType};
use isthmus_common::names;
use isthmus_lab::{cmd::ip, lab, netns, topology::PEERINGS};
use isthmus_tests::{netns as test_netns, require_lab, require_root};

/// A throwaway node: a netns with a veth `v0`, an object directory holding
/// peer b, and a bpffs directory in the lab's bpffs.
struct Node {
    ns: String,
    objects: PathBuf,
}

impl Node {
    fn new(ns: &str) -> Self {
        require_root();
        require_lab();
        test_netns::fresh(&[ns]);
        ip(
            ns,
            &["link", "add", "v0", "type", "veth", "peer", "name", "v1"],
        )
        .unwrap();
        for dev in ["v0", "v1"] {
            ip(ns, &["link", "set", dev, "up"]).unwrap();
        }
        let objects = PathBuf::from(isthmus_lab::lab::STATE_DIR).join(format!("objects/{ns}"));
        fs::create_dir_all(&objects).unwrap();
        fs::write(
            objects.join("peer-b.yaml"),
            PEERINGS[0].tunnel_endpoint_yaml(None),
        )
        .unwrap();
        Self {
            ns: ns.to_owned(),
            objects,
        }
    }

    fn bpffs(&self) -> PathBuf {
        lab::bpffs(&self.ns)
    }

    /// Runs an agent in `mode` until it is ready, then stops it.
    fn run_agent(&self, mode: &str) {
        let attach = format!("--attach={mode}");
        let pid = lab::start_tunnelless_gateway(&self.ns, "v0", &self.objects, &[&attach]).unwrap();
        lab::stop_pid(pid).unwrap();
    }

    fn cleanup(&self) -> String {
        lab::clean_up_agent(&self.ns).unwrap()
    }

    /// IDs of the clsact filters named `program` on v0.
    fn clsact(&self, direction: &str, program: &str) -> Vec<String> {
        let out = ip_tc(&self.ns, direction);
        out.lines()
            .filter(|l| l.contains(program))
            .filter_map(|l| {
                l.split_whitespace()
                    .skip_while(|w| *w != "id")
                    .nth(1)
                    .map(str::to_owned)
            })
            .collect()
    }

    /// IDs of the TCX programs on v0.
    fn tcx(&self, attach_type: TcAttachType) -> Vec<u32> {
        netns::run_in(&self.ns, || SchedClassifier::query_tcx("v0", attach_type))
            .unwrap()
            .map(|(_, programs)| {
                programs
                    .iter()
                    .map(aya::programs::ProgramInfo::id)
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn ip_tc(ns: &str, direction: &str) -> String {
    isthmus_lab::cmd::run("tc", &["-n", ns, "filter", "show", "dev", "v0", direction])
        .unwrap_or_default()
}

impl Drop for Node {
    fn drop(&mut self) {
        test_netns::remove(&[&self.ns]);
        let _ = fs::remove_dir_all(&self.objects);
    }
}

#[test]
fn clsact_filters_are_replaced_on_restart_and_removed_by_cleanup() {
    let node = Node::new("ist-t-clsact");
    node.run_agent("clsact");
    let first = node.clsact("egress", names::PROG_EGRESS_ETH);
    assert_eq!(
        first.len(),
        1,
        "one egress filter: {}",
        ip_tc(&node.ns, "egress")
    );
    assert_eq!(node.clsact("ingress", names::PROG_INGRESS_ETH).len(), 1);

    // The filter outlived the agent; the next one replaces it in place.
    node.run_agent("clsact");
    let second = node.clsact("egress", names::PROG_EGRESS_ETH);
    assert_eq!(
        second.len(),
        1,
        "restart duplicated the filter: {}",
        ip_tc(&node.ns, "egress")
    );
    assert_ne!(first, second, "restart did not load the new program");

    let report = node.cleanup();
    assert!(
        report.contains("clsact filter nat_egress_eth on v0 egress"),
        "{report}"
    );
    assert!(node.clsact("egress", "nat_").is_empty() && node.clsact("ingress", "nat_").is_empty());
    assert!(
        !node.bpffs().exists(),
        "cleanup left {}",
        node.bpffs().display()
    );
}

#[test]
fn tcx_links_are_updated_on_restart_and_modes_can_be_switched() {
    let node = Node::new("ist-t-tcx");
    node.run_agent("tcx");
    let first = node.tcx(TcAttachType::Egress);
    assert_eq!(first.len(), 1, "one TCX egress program");
    assert_eq!(
        node.tcx(TcAttachType::Ingress).len(),
        1,
        "one TCX ingress program"
    );

    node.run_agent("auto");
    let second = node.tcx(TcAttachType::Egress);
    assert_eq!(second.len(), 1, "restart added a second TCX program");
    assert_ne!(first, second, "restart did not swap in the new program");

    // Switching to clsact leaves exactly one attachment per direction.
    node.run_agent("clsact");
    assert!(
        node.tcx(TcAttachType::Egress).is_empty() && node.tcx(TcAttachType::Ingress).is_empty()
    );
    assert_eq!(node.clsact("egress", names::PROG_EGRESS_ETH).len(), 1);
    node.run_agent("tcx");
    assert_eq!(node.tcx(TcAttachType::Egress).len(), 1);
    assert!(
        node.clsact("egress", "nat_").is_empty(),
        "{}",
        ip_tc(&node.ns, "egress")
    );

    node.cleanup();
    assert!(
        node.tcx(TcAttachType::Egress).is_empty() && node.tcx(TcAttachType::Ingress).is_empty()
    );
    assert!(!node.bpffs().exists());
}
