//! `cargo xtask demo`: real traffic across the lab's clusters, and what
//! each end saw.

use std::net::IpAddr;

use anyhow::{Result, bail};
use isthmus_lab::{
    lab,
    probe::{self, Proto},
    topology::{self, CLUSTERS, Reach},
};

/// Builds, brings the lab up (`dual_stack`: the dual-stack lab), probes
/// every reachability row over TCP, UDP and ICMP, IPv4's and, in the
/// dual-stack lab, IPv6's, and prints the result. Fails if any row fails.
pub fn run(keep: bool, dual_stack: bool) -> Result<()> {
    crate::build()?;
    lab::up(&lab::Setup {
        dual_stack,
        ..lab::Setup::default()
    })?;
    let ipv4 = topology::reachability().into_iter().map(any_family);
    let mut result = probe_rows("IPv4", ipv4.collect());
    if dual_stack {
        let ipv6 = topology::reachability6().into_iter().map(any_family);
        result = result.and(probe_rows("IPv6", ipv6.collect()));
    }
    print_counters();
    if keep {
        println!("\nlab left up; `cargo xtask lab down` removes it");
    } else {
        lab::down()?;
    }
    result
}

/// A row in addresses of either family.
fn any_family<A: Into<IpAddr>>(row: Reach<A>) -> Reach<IpAddr> {
    Reach {
        row: row.row,
        from: row.from,
        target: row.target.into(),
        answered_by: row.answered_by,
        client_seen_as: row.client_seen_as.into(),
    }
}

/// Probes `rows`, of `family`, and prints a table of them.
fn probe_rows(family: &str, rows: Vec<Reach<IpAddr>>) -> Result<()> {
    let width = if family == "IPv4" { 12 } else { 24 };
    println!("\n{family}:");
    println!(
        "{:<4} {:<5} {:<w2$} {:<width$} {:<w2$} {:<w2$} result",
        "row",
        "proto",
        "from",
        "to",
        "answered by",
        "server saw client as",
        w2 = width + 10
    );
    let mut failures = 0;
    for row in rows {
        for proto in Proto::ALL {
            let v6 = row.target.is_ipv6();
            let from = format!("{} {}", row.from, pod_addr(&row.from, v6));
            let server = format!("{} {}", row.answered_by, pod_addr(&row.answered_by, v6));
            let (seen, verdict) =
                match probe::exchange(proto, &row.from, &row.answered_by, row.target) {
                    Ok(seen) => {
                        let ok = seen.client_as_seen_by_server == row.client_seen_as
                            && seen.server_as_seen_by_client == row.target;
                        let verdict = if ok {
                            "ok".to_owned()
                        } else {
                            format!(
                                "FAIL: want {} / reply from {}",
                                row.client_seen_as, row.target
                            )
                        };
                        failures += usize::from(!ok);
                        (seen.client_as_seen_by_server.to_string(), verdict)
                    }
                    Err(e) => {
                        failures += 1;
                        ("-".to_owned(), format!("FAIL: {e:#}"))
                    }
                };
            println!(
                "{:<4} {:<5} {:<w2$} {:<width$} {:<w2$} {:<w2$} {verdict}",
                row.row,
                proto.as_str(),
                from,
                row.target.to_string(),
                server,
                seen,
                w2 = width + 10
            );
        }
    }
    if failures > 0 {
        bail!("{failures} {family} exchange(s) failed");
    }
    println!(
        "every {family} row answered by the right pod, which saw the client under the remapped address"
    );
    Ok(())
}

/// The address of pod `ns`, IPv6's where `ipv6`.
fn pod_addr(ns: &str, ipv6: bool) -> String {
    let addr = |c: &topology::Cluster, i| match ipv6 {
        true => c.pod_addr6(i).to_string(),
        false => c.pod_addr(i).to_string(),
    };
    CLUSTERS
        .iter()
        .flat_map(|c| [1, 2].map(|i| (c.pod(i), addr(c, i))))
        .find(|(name, _)| name == ns)
        .map(|(_, addr)| addr)
        .unwrap_or_default()
}

/// What each gateway's NAT programs did, from its metrics.
fn print_counters() {
    println!(
        "\nNAT packet counters (non-zero), translations by kind of rule, NatMapping entries and masqueraded flows per gateway (from /metrics):"
    );
    for cluster in CLUSTERS {
        let gw = cluster.gw();
        match lab::http_get(&gw, "/metrics") {
            Ok((_, body)) => {
                // Per-program counters that stayed at zero are left out.
                for line in body.lines().filter(|l| {
                    let counter = [
                        "isthmus_nat_packets_total",
                        "isthmus_nat_translated_packets_total",
                    ]
                    .iter()
                    .any(|p| l.starts_with(p));
                    let gauge = ["isthmus_nat_mappings ", "isthmus_conntrack_entries "]
                        .iter()
                        .any(|p| l.starts_with(p));
                    gauge || (counter && !l.ends_with(" 0"))
                }) {
                    println!("  {gw:<5} {line}");
                }
            }
            Err(e) => println!("  {gw}: metrics unavailable: {e:#}"),
        }
    }
}
