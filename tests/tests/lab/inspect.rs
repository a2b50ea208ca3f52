//! `isthmus-agent inspect` on the hub b-gw with its agent stopped: every
//! view reads the pinned maps and shows what the lab programmed, and an
//! empty bpffs directory gets a clear error.

use std::{collections::BTreeSet, process::Command};

use isthmus_lab::{
    lab,
    probe::{self, Proto},
    topology::{self, B, NAT_MAPPING, PEERINGS},
};
use isthmus_tests::{
    inspect::{cell, inspect_on},
    require_lab,
};
use serde_json::Value;

/// `inspect VIEW --json` on b-gw's pins: one object per row.
fn inspect(view: &str) -> Vec<serde_json::Map<String, Value>> {
    inspect_on(&B.gw(), view)
}

#[test]
fn inspect_reads_every_table_while_the_agent_is_down() {
    require_lab();
    // Row 5 crosses the hub b: a masqueraded flow in b-gw's conntrack.
    let row5 = &topology::reachability()[4];
    probe::exchange(Proto::Udp, &row5.from, &row5.answered_by, row5.target).unwrap();
    let gw = B.gw();
    lab::stop_agent(&gw).unwrap();
    let _restart = RestartOnDrop(gw.clone());
    assert!(lab::agent_pid(&gw).is_none());

    let networks: BTreeSet<String> = inspect("peers")
        .iter()
        .flat_map(|r| {
            cell(r, "networks")
                .split(',')
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    let want: BTreeSet<String> = PEERINGS
        .iter()
        .filter(|p| p.local.name == B.name)
        .flat_map(|p| p.remote_views().map(|n| n.to_string()))
        .collect();
    assert_eq!(networks, want, "peers");

    let nat = inspect("nat");
    assert!(
        nat.iter().any(|r| cell(r, "direction") == "masquerade"
            && cell(r, "to") == B.masquerade_addr().to_string()),
        "nat shows the masquerade address: {nat:?}"
    );
    assert!(
        nat.iter().any(|r| cell(r, "direction") == "egress"),
        "nat shows prefix remaps: {nat:?}"
    );

    let natmap = inspect("natmap");
    assert!(
        natmap.iter().any(
            |r| cell(r, "external_ip") == NAT_MAPPING.real_external().to_string()
                && cell(r, "endpoint_ip") == NAT_MAPPING.endpoint.to_string()
        ),
        "natmap: {natmap:?}"
    );

    let flows = inspect("conntrack");
    let masq = B.masquerade_addr().to_string();
    assert!(
        flows
            .iter()
            .any(|r| cell(r, "proto") == "udp" && cell(r, "nat").starts_with(&format!("{masq}:"))),
        "conntrack holds row 5's masqueraded flow: {flows:?}"
    );

    let counters = inspect("counters");
    let masqueraded: u64 = counters
        .iter()
        .filter(|r| {
            cell(r, "counter") == "nat_translated_packets"
                && cell(r, "labels").contains("kind=masquerade")
        })
        .map(|r| cell(r, "value").parse::<u64>().unwrap())
        .sum();
    assert!(masqueraded >= 1, "counters: {counters:?}");
}

/// Starts a node's agent again when the test ends, passed or failed, so
/// the tests after it find the lab whole.
struct RestartOnDrop(String);

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        let restarted = lab::start_agent(&self.0).and_then(|_| lab::wait_ready(&self.0));
        if let Err(e) = restarted {
            eprintln!("restarting {}'s agent: {e:#}", self.0);
        }
    }
}

#[test]
fn inspect_says_clearly_when_nothing_is_pinned() {
    let empty = std::env::temp_dir().join("isthmus-inspect-empty");
    std::fs::create_dir_all(&empty).unwrap();
    let out = Command::new(lab::agent_binary())
        .args(["inspect", "peers", "--bpffs"])
        .arg(&empty)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "inspect succeeded on {}",
        empty.display()
    );
    assert!(
        stderr.contains(&format!("nothing is pinned under {}", empty.display())),
        "stderr: {stderr}"
    );
}
