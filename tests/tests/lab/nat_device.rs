//! The gateway's NAT follows its device. An external tunnel (wireguard-go,
//! Liqo's way) deletes its device when it restarts and creates another
//! under the same name; the agent, told by the kernel's link
//! announcements, attaches the NAT programs to the new one.
//!
//! `ist-t-natdev` runs a gateway agent without a tunnel of its own, its NAT
//! on a veth that the test recreates.

use std::{fs, path::PathBuf, time::Duration};

use aya::programs::{SchedClassifier, TcAttachType};
use isthmus_common::names;
use isthmus_lab::{cmd::ip, lab, netns};
use isthmus_tests::{eventually, netns as test_netns, require_lab};

const NS: &str = "ist-t-natdev";
const DEV: &str = "natdev0";
const GIVE_UP: Duration = Duration::from_secs(10);

/// The agent in its netns, stopped and removed when dropped.
struct Node {
    agent: u32,
    objects: PathBuf,
}

impl Node {
    fn start() -> Self {
        require_lab();
        test_netns::fresh(&[NS]);
        add_device();
        let objects = PathBuf::from(lab::STATE_DIR).join("natdev-objects");
        let _ = fs::remove_dir_all(&objects);
        fs::create_dir_all(&objects).unwrap();
        let agent = lab::start_tunnelless_gateway(NS, DEV, &objects, &["--no-overlay"]).unwrap();
        Self { agent, objects }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = lab::stop_pid(self.agent);
        test_netns::remove(&[NS]);
        let _ = fs::remove_dir_all(&self.objects);
    }
}

/// A veth pair, both ends in [`NS`] (not every kernel has `dummy`).
fn add_device() {
    ip(
        NS,
        &[
            "link", "add", DEV, "type", "veth", "peer", "name", "natdev0p",
        ],
    )
    .unwrap();
    ip(NS, &["link", "set", DEV, "up"]).unwrap();
}

/// The names of the TCX programs on the device named [`DEV`] now, egress
/// then ingress (bpftool 7.1 does not list TCX).
fn programs_on_device() -> Vec<String> {
    [TcAttachType::Egress, TcAttachType::Ingress]
        .into_iter()
        .flat_map(|attach_type| {
            netns::run_in(NS, || SchedClassifier::query_tcx(DEV, attach_type))
                .unwrap()
                .map(|(_, programs)| {
                    programs
                        .iter()
                        .filter_map(|p| p.name_as_str().map(str::to_owned))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        })
        .collect::<Vec<String>>()
}

fn ifindex() -> u32 {
    netns::run_in(NS, || nix::net::if_::if_nametoindex(DEV))
        .unwrap()
        .unwrap()
}

fn nat_programs() -> Vec<String> {
    [names::PROG_EGRESS_ETH, names::PROG_INGRESS_ETH]
        .map(str::to_owned)
        .to_vec()
}

#[test]
fn a_recreated_nat_device_gets_the_nat_programs_again() {
    let _node = Node::start();
    assert_eq!(programs_on_device(), nat_programs(), "attached at start");

    let before = ifindex();
    ip(NS, &["link", "del", DEV]).unwrap();
    add_device();
    assert_ne!(ifindex(), before, "the device is a new one");
    let took = eventually(GIVE_UP, "the NAT programs on the new device", || {
        programs_on_device() == nat_programs()
    });
    eprintln!("NAT programs attached to the recreated {DEV} after {took:?}");
}
