//! A gateway's routes into the tunnel: staged in their own table (153),
//! and on the active gateway also in main, where they are used, with a
//! blackhole in main behind each network; no policy rule, which would make
//! every lookup walk the rules; and `isthmus-agent cleanup` takes them all
//! away. A standby's staged table is checked by the HA tests.

use isthmus_lab::{
    cmd::ip,
    lab,
    probe::{self, Proto},
    topology::{A, reachability},
};
use isthmus_tests::require_lab;

/// a-gw's views of its peers' networks (b's and, through b, c's).
const VIEWS: [&str; 2] = ["10.0.0.0/24", "10.0.1.0/24"];

/// The rule sending lookups to table 153 in `ns`, as `ip rule` prints
/// it, if any: agents of an earlier release added one.
fn rule_to_table(ns: &str) -> Option<String> {
    let rules = ip(ns, &["rule", "show"]).unwrap();
    rules
        .lines()
        .find(|l| l.contains("lookup 153"))
        .map(str::to_owned)
}

/// Asserts that gateway `gw` routes `view` into the tunnel from main, with
/// the route staged in table 153 and a blackhole behind it.
fn routed_from_main(gw: &str, view: &str) {
    let table = ip(gw, &["route", "show", "table", "153", view]).unwrap();
    let main = ip(gw, &["route", "show", "table", "main", view]).unwrap();
    assert!(
        table.contains("dev isthmus0 proto 153"),
        "no route for {view} staged in table 153: {table}"
    );
    assert!(
        main.lines()
            .any(|l| l.starts_with(view) && l.contains("dev isthmus0 proto 153")),
        "no route for {view} into the tunnel in main: {main}"
    );
    assert!(
        main.lines()
            .any(|l| l.starts_with(&format!("blackhole {view} proto 153"))),
        "no blackhole for {view} in main: {main}"
    );
}

#[test]
fn the_active_gateway_routes_its_peers_from_main_with_them_staged_and_no_rule() {
    require_lab();
    let gw = A.gw();
    for view in VIEWS {
        routed_from_main(&gw, view);
    }
    assert_eq!(
        rule_to_table(&gw),
        None,
        "a rule sends lookups to table 153"
    );
    let got = ip(&gw, &["route", "get", "10.0.0.5"]).unwrap();
    assert!(
        got.contains("dev isthmus0") && !got.contains("table"),
        "{got}"
    );
}

#[test]
fn cleanup_removes_the_routes_and_the_blackholes() {
    require_lab();
    let gw = A.gw();
    lab::stop_agent(&gw).unwrap();
    let report = lab::clean_up_agent(&gw);
    let routes_left = ip(&gw, &["route", "show", "table", "all", "proto", "153"]).unwrap();
    // The lab gets its agent back whatever was found.
    lab::start_agent(&gw).unwrap();
    lab::wait_ready(&gw).unwrap();

    let report = report.unwrap();
    assert!(
        // The routes into the device went with it; the blackholes stayed.
        report.contains("removed TUN device isthmus0")
            && report.contains("removed 2 route(s) of protocol 153"),
        "cleanup said: {report}"
    );
    assert_eq!(routes_left.trim(), "", "routes left");
    for view in VIEWS {
        routed_from_main(&gw, view);
    }
    let row = &reachability()[0];
    let seen = probe::exchange(Proto::Udp, &row.from, &row.answered_by, row.target).unwrap();
    assert_eq!(seen.client_as_seen_by_server, row.client_seen_as);
}

/// An agent of an earlier release sent lookups to table 153 with a rule; its
/// successor removes the rule and routes from main.
#[test]
fn the_rule_of_an_older_agent_is_removed() {
    require_lab();
    let gw = A.gw();
    lab::stop_agent(&gw).unwrap();
    let old = ["pref", "32765", "lookup", "153", "proto", "153"];
    let added = ip(&gw, &[&["rule", "add"][..], &old].concat());
    lab::start_agent(&gw).unwrap();
    lab::wait_ready(&gw).unwrap();
    added.unwrap();
    assert_eq!(rule_to_table(&gw), None, "the older agent's rule stayed");
    for view in VIEWS {
        routed_from_main(&gw, view);
    }
}
