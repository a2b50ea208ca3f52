//! Liqo's way for the control bench: its DNAT rules inserted as its
//! network manager does, and the packets through the hub with Isthmus and
//! with iptables in turns.

use std::{
    fmt::Write,
    fs,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use isthmus_lab::{
    lab,
    topology::{A, B, C, NAT_MAPPING},
};

use super::{
    ENTRIES, FEW, Format, IPTABLES_BUDGET, ROUNDS, bench_mapping, entry, wait_entries,
    wait_for_peer,
};
use crate::bench::{
    gateways::{disable_isthmus, enable_isthmus, nat_gateways},
    packets::{hub_flow, measure},
    stats::median,
};

pub(super) struct IptablesApply {
    pub(super) elapsed: Duration,
    pub(super) inserted: usize,
}

const MAP_CHAIN: &str = "LIQO-PRRT-MAP-CLS-bench";

fn iptables(node: &str, args: &[&str]) -> Result<bool> {
    let status = Command::new("ip")
        .args(["netns", "exec", node, "iptables", "-w", "-t", "nat"])
        .args(args)
        .stderr(std::process::Stdio::null())
        .status()?;
    Ok(status.success())
}

pub(super) fn apply_iptables(node: &str) -> Result<IptablesApply> {
    let _ = iptables(node, &["-F", MAP_CHAIN]);
    let _ = iptables(node, &["-X", MAP_CHAIN]);
    if !iptables(node, &["-N", MAP_CHAIN])? {
        bail!("cannot create {MAP_CHAIN} in {node}");
    }
    let start = Instant::now();
    let mut inserted = 0;
    for i in 0..ENTRIES {
        if start.elapsed() > IPTABLES_BUDGET {
            break;
        }
        let (endpoint, external) = entry(i, 0);
        let (d, to) = (external.to_string(), endpoint.to_string());
        let rule = ["-d", &d, "-j", "DNAT", "--to-destination", &to];
        if !iptables(node, &[&["-C", MAP_CHAIN][..], &rule].concat())?
            && !iptables(node, &[&["-A", MAP_CHAIN][..], &rule].concat())?
        {
            bail!("iptables -A {MAP_CHAIN} failed at rule {i}");
        }
        inserted += 1;
        if inserted % 1000 == 0 {
            println!(
                "bench:   {inserted} rules in {:.1} s",
                start.elapsed().as_secs_f64()
            );
        }
    }
    let elapsed = start.elapsed();
    iptables(node, &["-F", MAP_CHAIN])?;
    iptables(node, &["-X", MAP_CHAIN])?;
    Ok(IptablesApply { elapsed, inserted })
}

/// pps through the hub for Isthmus and iptables, with few and many
/// entries: each setup's median in each round.
pub(super) fn hub_pps() -> Result<Vec<(&'static str, usize, Vec<f64>)>> {
    let flow = hub_flow(None);
    let setups = [
        ("isthmus", FEW),
        ("isthmus", ENTRIES),
        ("iptables", FEW),
        ("iptables", ENTRIES),
    ];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); setups.len()];
    for round in 1..=ROUNDS {
        for (i, &(name, count)) in setups.iter().enumerate() {
            println!("bench: round {round}/{ROUNDS}, hub pps, {name} with {count} entries");
            let rates = if name == "isthmus" {
                enable_isthmus(&nat_gateways())?;
                let gw = B.gw();
                // A restarted agent may have numbered the peers anew.
                let peer_id = wait_for_peer(&gw)?;
                let text = bench_mapping(count - 1, None, Format::Yaml);
                lab::write_object(&gw, Format::Yaml.file(), &text)?;
                wait_entries(&gw, peer_id, count - 1)?;
                measure(&flow)
            } else {
                disable_isthmus(&nat_gateways())?;
                install_hub_iptables(count)?;
                let rates = measure(&flow);
                flush_hub_iptables()?;
                rates
            };
            samples[i].push(median(&rates?));
        }
    }
    fs::remove_file(lab::object_dir(&B.gw()).join(Format::Yaml.file()))?;
    Ok(setups
        .iter()
        .zip(samples)
        .map(|((name, count), rounds)| (*name, *count, rounds))
        .collect())
}

/// Liqo's rules for the hub path: a NETMAPs its pods towards b; b sends
/// a's traffic for its remapped ExternalCIDR to the cluster's MAP chain,
/// DNATs there, and SNATs what it forwards to c from sources not its own.
fn install_hub_iptables(count: usize) -> Result<()> {
    let (endpoint, _) = NAT_MAPPING.entry();
    let mut a = String::from("*nat\n");
    let _ = writeln!(
        a,
        "-A POSTROUTING -s {} -d 10.0.0.0/23 -j NETMAP --to 10.0.40.0/24\nCOMMIT",
        A.pod_cidr
    );
    let mut b = format!("*nat\n:{MAP_CHAIN} - [0:0]\n");
    let _ = writeln!(
        b,
        "-A PREROUTING -s 10.0.40.0/24 -d 10.0.1.0/24 -j {MAP_CHAIN}"
    );
    for i in 0..count {
        if i == count / 2 {
            let _ = writeln!(
                b,
                "-A {MAP_CHAIN} -d 10.0.1.45 -j DNAT --to-destination {endpoint}"
            );
        } else {
            let (ep, ext) = entry(i, 0);
            let _ = writeln!(b, "-A {MAP_CHAIN} -d {ext} -j DNAT --to-destination {ep}");
        }
    }
    let _ = writeln!(
        b,
        "-A POSTROUTING ! -s {pods} -d {c} -j SNAT --to-source {masq}\nCOMMIT",
        pods = B.pod_cidr,
        c = C.pod_cidr,
        masq = B.masquerade_addr()
    );
    for (gw, rules) in [(A.gw(), a), (B.gw(), b)] {
        let path = format!("{}/iptables-hub-{gw}.rules", lab::STATE_DIR);
        fs::write(&path, rules)?;
        let status = Command::new("ip")
            .args(["netns", "exec", &gw, "iptables-restore"])
            .stdin(fs::File::open(&path)?)
            .status()?;
        if !status.success() {
            bail!("iptables-restore in {gw} failed ({status}); rules in {path}");
        }
    }
    Ok(())
}

fn flush_hub_iptables() -> Result<()> {
    crate::bench::liqo_v0_10::remove_all(&[A.gw(), B.gw()])
}
