//! The lab's Prometheus server (Debian's `prometheus`). It runs in its own
//! namespace, `ist-mon`, wired into every cluster's LAN like a monitoring
//! host (172.16.N.100), and scrapes every agent at its node's address each
//! second, labelling the series with the node and the cluster.

use std::{
    collections::BTreeMap,
    fs,
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    process::Command,
    time::Duration,
};

use anyhow::{Context, Result, bail};

use crate::{
    cmd::ip,
    lab::{self, STATE_DIR},
    topology::{CLUSTERS, Cluster, METRICS_PORT},
};

/// The monitoring host's netns.
pub const MON_NS: &str = "ist-mon";
/// Where Prometheus listens, inside `ist-mon`.
const PROMETHEUS: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 9090);
/// How long Prometheus may take to start and see every agent up.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// One series of a query's answer: its labels and value.
pub type Series = (BTreeMap<String, String>, f64);

fn dir() -> PathBuf {
    PathBuf::from(STATE_DIR).join("prometheus")
}

fn pid_file() -> PathBuf {
    dir().join("pid")
}

/// The monitoring host's address on cluster `c`'s LAN.
pub fn address(c: &Cluster) -> Ipv4Addr {
    Ipv4Addr::new(172, 16, c.index, 100)
}

/// Wires `ist-mon` into every LAN, starts Prometheus there, and returns once
/// it scrapes every agent.
pub fn up() -> Result<()> {
    lab::add_ns(MON_NS)?;
    for c in CLUSTERS {
        let dev = format!("lan-{}", c.name);
        lab::veth(MON_NS, &dev, &c.lan(), "mon")?;
        ip(&c.lan(), &["link", "set", "mon", "master", "br0"])?;
        ip(
            MON_NS,
            &["addr", "add", &format!("{}/24", address(c)), "dev", &dev],
        )?;
    }
    fs::create_dir_all(dir().join("data"))?;
    let config = dir().join("prometheus.yml");
    fs::write(&config, config_yaml())?;
    let log = fs::File::create(lab::log_file("prometheus"))?;
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", MON_NS, "prometheus"])
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir().join("data").display()
        ))
        .arg(format!("--web.listen-address={PROMETHEUS}"))
        .arg("--log.level=warn");
    let pid = lab::process::spawn_detached(command, log).context("starting prometheus")?;
    // `ip netns exec` execs prometheus, so this PID is the server's.
    fs::write(pid_file(), pid.to_string())?;
    wait_until_every_agent_is_up()
}

/// Stops the lab's Prometheus, found by its PID file or by a command line
/// naming the lab's state directory; never another one.
pub fn down() -> Result<()> {
    let words = ["prometheus", STATE_DIR];
    let mut pids = lab::running_with(&words);
    if let Some(pid) = fs::read_to_string(pid_file())
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .filter(|pid| lab::runs_with(*pid, &words))
    {
        pids.push(pid);
    }
    pids.sort_unstable();
    pids.dedup();
    for pid in pids {
        lab::stop_pid(pid)?;
    }
    Ok(())
}

fn config_yaml() -> String {
    let mut targets = String::new();
    for c in CLUSTERS {
        for (node, addr) in c.node_addrs() {
            targets.push_str(&format!(
                "      - targets: ['{addr}:{METRICS_PORT}']\n        labels: {{node: {node}, cluster: {}}}\n",
                c.name
            ));
        }
    }
    format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: isthmus\n    static_configs:\n{targets}"
    )
}

/// Waits until Prometheus's last scrape of every agent succeeded (after
/// an agent restarts, the scrape that missed it says 0 for a second).
pub fn wait_until_every_agent_is_up() -> Result<()> {
    let agents = CLUSTERS.len() * 2;
    let mut up = Ok(0);
    let what = format!("prometheus sees all {agents} agents up");
    // Every 100 ms: each try is a query.
    crate::wait::until(READY_TIMEOUT, Duration::from_millis(100), &what, || {
        up = query("up{job=\"isthmus\"} == 1").map(|s| s.len());
        matches!(up, Ok(n) if n == agents)
    })
    .map(drop)
    .with_context(|| {
        let log = fs::read_to_string(lab::log_file("prometheus")).unwrap_or_default();
        format!("it saw {up:?}; its log:\n{log}")
    })
}

/// Evaluates PromQL `expr` now, through the HTTP API; returns every series
/// of the instant vector it gives.
pub fn query(expr: &str) -> Result<Vec<Series>> {
    let path = format!("/api/v1/query?query={}", percent_encode(expr));
    let (status, body) = lab::http_get_at(MON_NS, PROMETHEUS, &path)?;
    if status != 200 {
        bail!("prometheus answered {status} to {expr}: {body}");
    }
    let answer: serde_json::Value = serde_json::from_str(&body).context("prometheus's JSON")?;
    let series = answer["data"]["result"]
        .as_array()
        .with_context(|| format!("no result in {body}"))?;
    series
        .iter()
        .map(|s| {
            let labels = s["metric"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect();
            let value = s["value"][1]
                .as_str()
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("no value in {s}"))?;
            Ok((labels, value))
        })
        .collect()
}

/// `text` with every byte but unreserved ones percent-encoded (RFC 3986).
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
