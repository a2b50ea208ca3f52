//! A gateway's routes into the tunnel: in their own table (153), which the
//! active gateway's rule (priority 32765, just before main) sends lookups
//! to, with a blackhole in main behind each network; and `isthmus-agent
//! cleanup` takes all three away. A standby's staged table is checked by
//! the HA tests.

use isthmus_tests::require_lab;
use xtask::{
    cmd::{ip, run},
    lab,
    probe::{self, Proto},
    topology::{A, reachability},
};

/// a-gw's views of its peers' networks (b's and, through b, c's).
const VIEWS: [&str; 2] = ["10.0.0.0/24", "10.0.1.0/24"];

/// The rule of ours in `ns`, as `ip rule` prints it, if any.
fn our_rule(ns: &str) -> Option<String> {
    let rules = ip(ns, &["rule", "show"]).unwrap();
    rules
        .lines()
        .find(|l| l.contains("lookup 153"))
        .map(str::to_owned)
}

#[test]
fn a_gateway_routes_its_peers_through_its_own_table_behind_a_rule() {
    require_lab();
    let gw = A.gw();
    let rule = our_rule(&gw).expect("a rule `lookup 153`");
    assert!(
        rule.starts_with("32765:") && rule.contains("proto 153"),
        "the rule: {rule}"
    );
    let table = ip(&gw, &["route", "show", "table", "153"]).unwrap();
    let main = ip(&gw, &["route", "show", "table", "main"]).unwrap();
    for view in VIEWS {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(view) && l.contains("dev isthmus0 proto 153")),
            "no route for {view} into the tunnel in table 153: {table}"
        );
        assert!(
            main.lines()
                .any(|l| l.starts_with(&format!("blackhole {view} proto 153"))),
            "no blackhole for {view} in main: {main}"
        );
        assert!(
            !main
                .lines()
                .any(|l| l.starts_with(view) && l.contains("isthmus0")),
            "a route for {view} into the tunnel in main: {main}"
        );
    }
    let got = ip(&gw, &["route", "get", "10.0.0.5"]).unwrap();
    assert!(got.contains("dev isthmus0 table 153"), "{got}");
}

#[test]
fn cleanup_removes_the_routes_the_blackholes_and_the_rule() {
    require_lab();
    let gw = A.gw();
    lab::stop_agent(&gw).unwrap();
    let agent = lab::agent_binary();
    let bpffs = lab::bpffs(&gw);
    let report = run(
        "ip",
        &[
            "netns",
            "exec",
            &gw,
            &agent.to_string_lossy(),
            "cleanup",
            "--bpffs",
            &bpffs.to_string_lossy(),
        ],
    );
    let routes_left = ip(&gw, &["route", "show", "table", "all", "proto", "153"]).unwrap();
    let rule_left = our_rule(&gw);
    // The lab gets its agent back whatever was found.
    lab::start_agent(&gw).unwrap();
    lab::wait_ready(&gw).unwrap();

    let report = report.unwrap();
    assert!(
        // The routes into the device went with it; the blackholes stayed.
        report.contains("removed TUN device isthmus0")
            && report.contains("removed 2 route(s) of protocol 153")
            && report.contains("removed rule 32765 lookup 153"),
        "cleanup said: {report}"
    );
    assert_eq!(routes_left.trim(), "", "routes left");
    assert_eq!(rule_left, None, "the rule was left");
    assert!(our_rule(&gw).is_some(), "the restarted agent's rule");
    let row = &reachability()[0];
    let seen = probe::exchange(Proto::Udp, &row.from, &row.answered_by, row.target).unwrap();
    assert_eq!(seen.client_as_seen_by_server, row.client_seen_as);
}

/// An agent from before table 153 routed into the tunnel in main; its
/// successor moves those routes into table 153, where the rule decides.
#[test]
fn routes_into_the_tunnel_left_in_main_are_moved_to_the_table() {
    require_lab();
    let gw = A.gw();
    lab::stop_agent(&gw).unwrap();
    let old = ["10.0.0.0/24", "dev", "isthmus0", "proto", "153"];
    let added = ip(&gw, &[&["route", "add"][..], &old].concat());
    lab::start_agent(&gw).unwrap();
    lab::wait_ready(&gw).unwrap();
    added.unwrap();
    let main = ip(&gw, &["route", "show", "table", "main", "10.0.0.0/24"]).unwrap();
    assert_eq!(
        main.trim(),
        "blackhole 10.0.0.0/24 proto 153 metric 1073741824",
        "main still routes into the tunnel"
    );
    let table = ip(&gw, &["route", "show", "table", "153", "10.0.0.0/24"]).unwrap();
    assert!(
        table.contains("dev isthmus0 proto 153"),
        "table 153: {table}"
    );
}
