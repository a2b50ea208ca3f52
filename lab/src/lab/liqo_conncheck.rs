//! Liqo's conncheck, as the Liqo-peer labs run it on the gateway of the
//! cluster they run as Liqo. Written here from Liqo's protocol
//! (`pkg/liqonet/conncheck` in v0.10, `pkg/gateway/connection/conncheck`
//! in v1), not from the agent's code: one UDP socket on port 12345 that
//! PINGs each peer every 2 s, answers PINGs, and times PONGs. It runs as a
//! process of its own (`cargo xtask liqo-conncheck`), and writes what it
//! measured to a status file that tests read.

use std::{
    collections::BTreeMap,
    fs,
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    process::Command,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::{
    log_file,
    paths::state,
    process::{runs_with, spawn_detached},
    stop_pid,
};
use crate::topology::{CLUSTERS, Cluster, first_ip};

/// Liqo's conncheck port.
const PORT: u16 = 12345;
/// Liqo's PING interval.
const INTERVAL: Duration = Duration::from_secs(2);
/// Liqo's PingLossThreshold: silent intervals before a peer is down.
const LOSSES: u32 = 5;

/// Which Liqo's conncheck runs: whom it PINGs, and where.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// v0.10's: every peer, at the first host of its ExternalCIDR as we
    /// see it.
    V0_10,
    /// v1's: the one peer of the gateway, `peer`, at its tunnel address
    /// `addr`.
    V1 {
        /// The peer cluster.
        peer: &'static Cluster,
        /// Its tunnel address.
        addr: Ipv4Addr,
    },
}

/// The task runner's arguments that run `cluster`'s conncheck, Liqo
/// `api`'s way.
pub fn arguments(cluster: &Cluster, api: Api) -> Vec<String> {
    let mut args = ["liqo-conncheck", "--cluster", cluster.name]
        .map(String::from)
        .to_vec();
    if let Api::V1 { peer, addr } = api {
        args.extend([
            "--liqo-v1-peer".into(),
            peer.name.into(),
            "--liqo-v1-peer-addr".into(),
            addr.to_string(),
        ]);
    }
    args
}

/// Starts `cluster`'s gateway's conncheck, Liqo `api`'s way.
pub fn start(cluster: &Cluster, api: Api) -> Result<()> {
    let gw = cluster.gw();
    let log = fs::File::create(log_file(&format!("{gw}-conncheck")))?;
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", &gw])
        .arg(std::env::current_exe()?)
        .args(arguments(cluster, api));
    let pid = spawn_detached(command, log).context("starting the Liqo conncheck")?;
    fs::write(pid_file(), pid.to_string())?;
    Ok(())
}

/// Stops the conncheck this lab started, by its recorded PID.
pub fn stop() -> Result<()> {
    if let Ok(pid) = fs::read_to_string(pid_file())
        && let Ok(pid) = pid.trim().parse::<u32>()
        && runs_with(pid, &["liqo-conncheck"])
    {
        stop_pid(pid)?;
    }
    Ok(())
}

fn pid_file() -> std::path::PathBuf {
    state("liqo-conncheck.pid")
}

/// Where the conncheck writes what it measured: per peer cluster ID,
/// `connected`, `latency_us`, `pongs` and `pings_answered`.
pub fn status_file(cluster: &Cluster) -> std::path::PathBuf {
    state(&format!("liqo-conncheck-{}.json", cluster.name))
}

/// One peer as the conncheck sees it.
struct Peer {
    /// Where its PINGs go: the first host of its ExternalCIDR as we see it.
    target: SocketAddr,
    last_pong: Option<f64>,
    heard: Instant,
    latency_us: f64,
    pongs: u64,
}

/// The conncheck process of `cluster`'s gateway, Liqo `api`'s; runs
/// until stopped.
pub fn run(cluster_name: &str, api: Api) -> Result<()> {
    let cluster = CLUSTERS
        .iter()
        .find(|c| c.name == cluster_name)
        .context("no such cluster")?;
    let socket = UdpSocket::bind(("0.0.0.0", PORT))?;
    socket.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut peers: BTreeMap<String, Peer> = cluster
        .peerings()
        .filter(|p| match api {
            Api::V0_10 => true,
            Api::V1 { peer, .. } => p.remote.name == peer.name,
        })
        .map(|p| {
            let target = match api {
                Api::V0_10 => first_ip(p.remote_views()[1]),
                Api::V1 { addr, .. } => addr,
            };
            let peer = Peer {
                target: (target, PORT).into(),
                last_pong: None,
                heard: Instant::now(),
                latency_us: 0.0,
                pongs: 0,
            };
            (format!("cluster-{}", p.remote.name), peer)
        })
        .collect();
    let mut answered = 0u64;
    let mut next_ping = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        if Instant::now() >= next_ping {
            for (id, peer) in &peers {
                let ping = json!({"clusterID": id, "msgType": "PING", "timeStamp": go_time_now()});
                let _ = socket.send_to(ping.to_string().as_bytes(), peer.target);
            }
            next_ping += INTERVAL;
            write_status(cluster, &peers, answered)?;
        }
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        let Ok(mut message) = serde_json::from_slice::<Value>(&buf[..n]) else {
            continue;
        };
        match message["msgType"].as_str() {
            Some("PING") => {
                message["msgType"] = json!("PONG");
                let _ = socket.send_to(message.to_string().as_bytes(), from);
                answered += 1;
            }
            Some("PONG") => {
                let (Some(id), Some(sent)) = (
                    message["clusterID"].as_str(),
                    message["timeStamp"].as_str().and_then(parse_go_time),
                ) else {
                    continue;
                };
                if let Some(peer) = peers.get_mut(id)
                    && peer.last_pong.is_none_or(|last| sent >= last)
                {
                    peer.last_pong = Some(sent);
                    peer.latency_us = (unix_now() - sent) * 1e6;
                    peer.heard = Instant::now();
                    peer.pongs += 1;
                }
            }
            _ => {}
        }
    }
}

fn write_status(cluster: &Cluster, peers: &BTreeMap<String, Peer>, answered: u64) -> Result<()> {
    let status: serde_json::Map<String, Value> = peers
        .iter()
        .map(|(id, p)| {
            let connected = p.pongs > 0 && p.heard.elapsed() <= INTERVAL * LOSSES;
            let value =
                json!({"connected": connected, "latency_us": p.latency_us, "pongs": p.pongs});
            (id.clone(), value)
        })
        .collect();
    let text = json!({"peers": status, "pings_answered": answered}).to_string();
    let path = status_file(cluster);
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, text)?;
    fs::rename(tmp, path)?;
    Ok(())
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Now as Go's `json.Marshal` writes a `time.Time` in a +01:00 zone
/// (RFC 3339 with nanoseconds, trailing zeros dropped).
fn go_time_now() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let local = now.as_secs() as i64 + 3600;
    let (days, secs) = (local.div_euclid(86_400), local.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    let nanos = format!("{:09}", now.subsec_nanos());
    let nanos = nanos.trim_end_matches('0');
    let fraction = if nanos.is_empty() {
        String::new()
    } else {
        format!(".{nanos}")
    };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{fraction}+01:00",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// Seconds since the epoch of an RFC 3339 time with a numeric zone or Z.
#[allow(
    clippy::many_single_char_names,
    reason = "y, m, d, h and s, as RFC 3339 names the fields"
)]
fn parse_go_time(text: &str) -> Option<f64> {
    let (date, rest) = text.split_once('T')?;
    let mut ymd = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, d) = (ymd.next()??, ymd.next()??, ymd.next()??);
    let (clock, zone) = match rest.find(['Z', '+', '-']) {
        Some(i) => rest.split_at(i),
        None => return None,
    };
    let offset = if zone == "Z" {
        0
    } else {
        let sign = if zone.starts_with('-') { -1 } else { 1 };
        let (h, min) = zone[1..].split_once(':')?;
        sign * (h.parse::<i64>().ok()? * 3600 + min.parse::<i64>().ok()? * 60)
    };
    let mut hms = clock.split(':');
    let (h, min) = (
        hms.next()?.parse::<i64>().ok()?,
        hms.next()?.parse::<i64>().ok()?,
    );
    let s: f64 = hms.next()?.parse().ok()?;
    let days = days_from_civil(y, m, d);
    Some((days * 86_400 + h * 3600 + min * 60 - offset) as f64 + s)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a count of days since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_times_round_trip_and_read_any_zone() {
        let now = go_time_now();
        assert!(now.ends_with("+01:00"), "{now}");
        assert!((parse_go_time(&now).unwrap() - unix_now()).abs() < 1.0);
        assert_eq!(parse_go_time("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(parse_go_time("1970-01-01T01:00:01.5+01:00"), Some(1.5));
        assert_eq!(parse_go_time("2024-03-01T10:20:30Z"), Some(1_709_288_430.0));
        assert_eq!(civil_from_days(19_783), (2024, 3, 1));
    }
}
