//! `cargo xtask demo`: real traffic across the lab's clusters, and what
//! each end saw.

use anyhow::{Result, bail};
use isthmus_lab::{
    lab,
    probe::{self, Proto},
    topology::{self, CLUSTERS},
};

/// Builds, brings the lab up, probes every reachability row over TCP, UDP
/// and ICMP, and prints the result. Fails if any row fails.
pub fn run(keep: bool) -> Result<()> {
    crate::build()?;
    lab::up(&lab::Setup::default())?;
    let result = probe_rows();
    print_counters();
    if keep {
        println!("\nlab left up; `cargo xtask lab down` removes it");
    } else {
        lab::down()?;
    }
    result
}

fn probe_rows() -> Result<()> {
    println!();
    println!(
        "{:<4} {:<5} {:<22} {:<12} {:<22} {:<24} result",
        "row", "proto", "from", "to", "answered by", "server saw client as"
    );
    let mut failures = 0;
    for row in topology::reachability() {
        for proto in Proto::ALL {
            let from = format!("{} {}", row.from, pod_addr(&row.from));
            let server = format!("{} {}", row.answered_by, pod_addr(&row.answered_by));
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
                "{:<4} {:<5} {:<22} {:<12} {:<22} {:<24} {verdict}",
                row.row,
                proto.as_str(),
                from,
                row.target.to_string(),
                server,
                seen
            );
        }
    }
    if failures > 0 {
        bail!("{failures} exchange(s) failed");
    }
    println!(
        "\nevery row answered by the right pod, which saw the client under the remapped address"
    );
    Ok(())
}

fn pod_addr(ns: &str) -> String {
    CLUSTERS
        .iter()
        .flat_map(|c| [1, 2].map(|i| (c.pod(i), c.pod_addr(i))))
        .find(|(name, _)| name == ns)
        .map(|(_, addr)| addr.to_string())
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
