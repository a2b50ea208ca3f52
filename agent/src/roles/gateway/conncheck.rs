//! Liqo's connection check (`pkg/liqonet/conncheck` in Liqo v0.9/v0.10),
//! both ways, so that a Liqo gateway on the other side sees us as a Liqo
//! gateway and marks the peering healthy.
//!
//! - Every gateway answers PINGs on [`ADDR`]:[`PORT`]. The peer reaches it
//!   at the first host of our ExternalCIDR as it sees it; the NatMapping's
//!   `169.254.0.1` entry DNATs that to [`ADDR`].
//! - Every [`INTERVAL`], it sends a PING to the first host of each peer's
//!   ExternalCIDR as we see it. The PONG carries our own timestamp back,
//!   which gives the round trip on our clock. A Liqo gateway DNATs only
//!   what comes from our PodCIDR as it sees it (Liqo SNATs its own PINGs
//!   to that network's first address), so PINGs leave from
//!   [`SENDER_ADDR`], which the masquerade moves there. Without a
//!   masquerade they leave from [`ADDR`]:[`PORT`], which the NatMapping's
//!   reverse entry moves into our ExternalCIDR: Isthmus peers answer that.
//! - No PONG for [`LOSSES_FOR_ERROR`] intervals: the peering is in error.
//!
//! - A gateway with several tunnel devices (one per Liqo v1 peer) runs a
//!   socket on each: a peer's PINGs go, and its PONGs are taken, only
//!   through its own device, since every Liqo v1 peer has the same tunnel
//!   address.
//!
//! [`Checks`] is the protocol state, without I/O; [`spawn`] runs it on a
//! device's socket.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::sync::Unpoisoned;

/// The UDP port of the check.
pub const PORT: u16 = isthmus_common::nat::CONNCHECK_PORT;
/// The address the check answers on, behind every NatMapping; the ingress
/// NAT lets peers reach only [`PORT`] there.
pub const ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 1);
/// The address PINGs leave from when the gateway masquerades.
pub const SENDER_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 2);
/// Time between two PINGs to a peer.
pub const INTERVAL: Duration = Duration::from_secs(2);
/// Intervals without a PONG after which the peering is in error: four, so
/// that a peer gone silent shows in error within 10 s of its last PONG
/// (8 s, and a pass to write it). Liqo's own check waits five (its
/// `--ping-loss-threshold`), and reports it as late as 12 s after.
pub const LOSSES_FOR_ERROR: u32 = 4;
/// Largest message read, as Liqo's receiver's buffer; longer is not Liqo's.
const MAX_MESSAGE: usize = 1024;

/// A message, in Liqo's JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// The cluster the PING was sent to.
    #[serde(rename = "clusterID")]
    pub cluster_id: String,
    /// PING or PONG.
    #[serde(rename = "msgType")]
    pub kind: Kind,
    /// When the PING left, RFC 3339 with nanoseconds.
    #[serde(rename = "timeStamp")]
    pub timestamp: String,
}

/// The two kinds of message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Kind {
    /// Asks for an answer.
    Ping,
    /// The answer: the PING sent back.
    Pong,
}

impl Message {
    /// Reads a datagram; None for anything that is not a message of
    /// Liqo's, whatever its size or content.
    pub fn parse(datagram: &[u8]) -> Option<Self> {
        if datagram.len() > MAX_MESSAGE {
            return None;
        }
        serde_json::from_slice(datagram).ok()
    }

    /// The datagram.
    pub fn bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a message always serialises")
    }
}

/// What the check knows of one peer now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Health {
    /// Round trip of the last PONG.
    pub rtt: Option<Duration>,
    /// PINGs sent since the last PONG (or since the check began).
    pub unanswered: u32,
    /// Whether the peer answered within the last [`LOSSES_FOR_ERROR`]
    /// intervals.
    pub connected: bool,
    /// Whether [`LOSSES_FOR_ERROR`] intervals passed without an answer.
    pub failed: bool,
}

/// Where a peer's PINGs go: an address, through a tunnel device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The address the PINGs go to.
    pub addr: Ipv4Addr,
    /// The tunnel device whose socket sends the PINGs and takes the PONGs.
    pub device: String,
}

/// The check of one peer.
#[derive(Debug)]
struct PeerCheck {
    /// Where its PINGs go.
    target: Target,
    /// When the check began, or the last PONG arrived.
    heard: Instant,
    /// The timestamp of the last PONG taken: older ones are out of order.
    last_pong: Option<Timestamp>,
    rtt: Option<Duration>,
    unanswered: u32,
    answered: bool,
}

/// The protocol state of every peer's check, keyed by the cluster ID the
/// PINGs carry.
#[derive(Debug, Default)]
pub struct Checks {
    peers: BTreeMap<String, PeerCheck>,
}

impl Checks {
    /// Checks exactly `targets` (cluster ID → where to PING); a peer
    /// whose target is unchanged keeps its state.
    pub fn set_targets(&mut self, targets: &BTreeMap<String, Target>, now: Instant) {
        self.peers
            .retain(|id, check| targets.get(id) == Some(&check.target));
        for (id, target) in targets {
            self.peers.entry(id.clone()).or_insert(PeerCheck {
                target: target.clone(),
                heard: now,
                last_pong: None,
                rtt: None,
                unanswered: 0,
                answered: false,
            });
        }
    }

    /// The PINGs due now through `device`, one per peer, stamped `at`.
    pub fn pings(&mut self, device: &str, at: Timestamp) -> Vec<(SocketAddrV4, Message)> {
        self.peers
            .iter_mut()
            .filter(|(_, check)| check.target.device == device)
            .map(|(id, check)| {
                check.unanswered = check.unanswered.saturating_add(1);
                let ping = Message {
                    cluster_id: id.clone(),
                    kind: Kind::Ping,
                    timestamp: at.to_string(),
                };
                (SocketAddrV4::new(check.target.addr, PORT), ping)
            })
            .collect()
    }

    /// Takes a message received from `from` through `device` at `now`
    /// (`wall` on the clock the timestamps use); returns the answer to send
    /// back, if any.
    pub fn receive(
        &mut self,
        message: Message,
        from: &Target,
        now: Instant,
        wall: Timestamp,
    ) -> Option<Message> {
        match message.kind {
            Kind::Ping => Some(Message {
                kind: Kind::Pong,
                ..message
            }),
            Kind::Pong => {
                self.pong(&message, from, now, wall);
                None
            }
        }
    }

    fn pong(&mut self, message: &Message, from: &Target, now: Instant, wall: Timestamp) {
        // Only the address PINGed, through the peer's own device, answers
        // for the peer: anyone else (a pod of ours, another peer, whose
        // tunnel address may be the same) could otherwise keep a dead
        // peering looking healthy.
        let Some(check) = self
            .peers
            .get_mut(&message.cluster_id)
            .filter(|check| check.target == *from)
        else {
            return;
        };
        let Ok(sent) = message.timestamp.parse::<Timestamp>() else {
            return;
        };
        // Out of order, or a timestamp from the future: not a PONG of ours.
        if check.last_pong.is_some_and(|last| sent < last) || sent > wall {
            return;
        }
        let Ok(rtt) = Duration::try_from(wall.duration_since(sent)) else {
            return;
        };
        check.last_pong = Some(sent);
        check.rtt = Some(rtt);
        check.heard = now;
        check.unanswered = 0;
        check.answered = true;
    }

    /// The health of the peer whose PINGs carry `cluster_id`.
    pub fn health(&self, cluster_id: &str, now: Instant) -> Option<Health> {
        let check = self.peers.get(cluster_id)?;
        let silent = now.duration_since(check.heard) > INTERVAL * LOSSES_FOR_ERROR;
        Some(Health {
            rtt: check.rtt,
            unanswered: check.unanswered,
            connected: check.answered && !silent,
            failed: silent,
        })
    }
}

/// A latency as Liqo writes it in `status.connection.latency.value`
/// (`FormatLatency`): whole milliseconds, else whole microseconds, and
/// "N/A" for none.
pub fn format_latency(rtt: Option<Duration>) -> String {
    match rtt {
        None => "N/A".into(),
        Some(rtt) if rtt.is_zero() => "N/A".into(),
        Some(rtt) if rtt.as_millis() > 0 => format!("{}ms", rtt.as_millis()),
        Some(rtt) => format!("{}μs", rtt.as_micros()),
    }
}

/// Runs the check of tunnel device `device` until `stop` is dropped, or
/// the process ends: PINGs every [`INTERVAL`] from `pinger` (else from
/// `responder`, as Liqo's one socket does) to the targets in `checks`
/// through the device, and every message either socket receives taken in
/// (a PONG) or answered from where it came (a PING).
pub fn spawn(
    responder: tokio::net::UdpSocket,
    pinger: Option<tokio::net::UdpSocket>,
    checks: Arc<Mutex<Checks>>,
    device: String,
) -> tokio::task::AbortHandle {
    let task = tokio::spawn(async move {
        let mut ticks = tokio::time::interval(INTERVAL);
        let (mut buf, mut pong_buf) = (vec![0u8; MAX_MESSAGE + 1], vec![0u8; MAX_MESSAGE + 1]);
        let sender = pinger.as_ref().unwrap_or(&responder);
        loop {
            tokio::select! {
                _ = ticks.tick() => {
                    let pings = lock(&checks).pings(&device, Timestamp::now());
                    for (target, ping) in pings {
                        if let Err(e) = sender.send_to(&ping.bytes(), target).await {
                            debug!(%target, error = %e, "conncheck PING not sent");
                        }
                    }
                }
                received = responder.recv_from(&mut buf) => {
                    take(&responder, received, &buf, &checks, &device).await;
                }
                received = sender.recv_from(&mut pong_buf), if pinger.is_some() => {
                    take(sender, received, &pong_buf, &checks, &device).await;
                }
            }
        }
    });
    task.abort_handle()
}

/// A conncheck socket on port [`PORT`] of whatever address device `dev`
/// has: a Liqo v1 tunnel's address follows the side we have, and the
/// socket need not.
pub fn bind_on_device(dev: &str) -> std::io::Result<tokio::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    socket.bind_device(Some(dev.as_bytes()))?;
    socket.set_nonblocking(true)?;
    socket.bind(&SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, PORT).into())?;
    tokio::net::UdpSocket::from_std(socket.into())
}

/// Takes in one datagram `socket` received into `buf` through `device`,
/// and answers it on `socket` if it is a PING.
async fn take(
    socket: &tokio::net::UdpSocket,
    received: std::io::Result<(usize, SocketAddr)>,
    buf: &[u8],
    checks: &Mutex<Checks>,
    device: &str,
) {
    let (n, from) = match received {
        Ok(r) => r,
        Err(e) => {
            warn!(error = %e, "conncheck socket");
            return;
        }
    };
    let (Some(message), SocketAddr::V4(from)) = (Message::parse(&buf[..n]), from) else {
        debug!(%from, bytes = n, "conncheck: not a Liqo message; ignored");
        return;
    };
    let sender = Target {
        addr: *from.ip(),
        device: device.to_owned(),
    };
    let answer = lock(checks).receive(message, &sender, Instant::now(), Timestamp::now());
    if let Some(pong) = answer {
        let _ = socket.send_to(&pong.bytes(), from).await;
    }
}

fn lock(checks: &Mutex<Checks>) -> std::sync::MutexGuard<'_, Checks> {
    checks.lock().unpoisoned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_and_the_agent_agree_on_the_address() {
        assert_eq!(
            isthmus_common::nat::CONNCHECK_ADDR,
            isthmus_common::wire::Be32::from(ADDR)
        );
    }

    const DEVICE: &str = "isthmus0";

    fn through(device: &str, ip: [u8; 4]) -> Target {
        Target {
            addr: Ipv4Addr::from(ip),
            device: device.into(),
        }
    }

    fn targets(pairs: &[(&str, [u8; 4])]) -> BTreeMap<String, Target> {
        pairs
            .iter()
            .map(|(id, ip)| ((*id).to_owned(), through(DEVICE, *ip)))
            .collect()
    }

    /// The exact bytes a Liqo v0.10 gateway sends (Go's `json.Marshal` of
    /// `Msg`, a `time.Time` with a zone offset).
    #[test]
    fn reads_liqos_message_and_answers_a_ping_with_the_same_message_as_pong() {
        let go = br#"{"clusterID":"cluster-a","msgType":"PING","timeStamp":"2024-03-01T10:20:30.123456789+01:00"}"#;
        let ping = Message::parse(go).unwrap();
        assert_eq!(ping.cluster_id, "cluster-a");
        let mut checks = Checks::default();
        let pong = checks
            .receive(
                ping.clone(),
                &through(DEVICE, [127, 0, 0, 1]),
                Instant::now(),
                Timestamp::now(),
            )
            .unwrap();
        assert_eq!(pong.kind, Kind::Pong);
        assert_eq!(
            (pong.cluster_id, pong.timestamp),
            (ping.cluster_id, ping.timestamp)
        );
        let sent = String::from_utf8(
            Message {
                cluster_id: "x".into(),
                kind: Kind::Pong,
                timestamp: "t".into(),
            }
            .bytes(),
        )
        .unwrap();
        assert_eq!(
            sent,
            r#"{"clusterID":"x","msgType":"PONG","timeStamp":"t"}"#
        );
    }

    #[test]
    fn malformed_forged_and_oversized_datagrams_are_not_messages() {
        for bad in [
            &b""[..],
            b"{",
            b"null",
            br#"{"clusterID":"a","msgType":"PANG","timeStamp":"x"}"#,
            br#"{"clusterID":1,"msgType":"PING","timeStamp":"x"}"#,
            br#"["PING"]"#,
        ] {
            assert_eq!(
                Message::parse(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let huge = format!(
            r#"{{"clusterID":"{}","msgType":"PING","timeStamp":"x"}}"#,
            "a".repeat(MAX_MESSAGE)
        );
        assert_eq!(Message::parse(huge.as_bytes()), None);
    }

    #[test]
    fn a_pong_gives_the_round_trip_and_four_silent_intervals_an_error() {
        let mut checks = Checks::default();
        let t0 = Instant::now();
        checks.set_targets(&targets(&[("cluster-b", [10, 0, 1, 1])]), t0);
        let wall = Timestamp::now();
        let pings = checks.pings(DEVICE, wall);
        assert_eq!(pings[0].0, "10.0.1.1:12345".parse().unwrap());
        let health = checks.health("cluster-b", t0).unwrap();
        assert_eq!(
            (health.connected, health.failed, health.unanswered),
            (false, false, 1)
        );

        let pong = Message {
            kind: Kind::Pong,
            ..pings[0].1.clone()
        };
        let later = wall + Duration::from_micros(640);
        // The same PONG from anyone but the address PINGed, or from that
        // address through another device, is no answer.
        for stranger in [
            through(DEVICE, [10, 0, 40, 5]),
            through("ist-b", [10, 0, 1, 1]),
        ] {
            checks.receive(pong.clone(), &stranger, t0, later);
            assert!(!checks.health("cluster-b", t0).unwrap().connected);
        }
        let target = through(DEVICE, [10, 0, 1, 1]);
        checks.receive(pong.clone(), &target, t0, later);
        let health = checks.health("cluster-b", t0).unwrap();
        assert_eq!(health.rtt, Some(Duration::from_micros(640)));
        assert!(health.connected && health.unanswered == 0);

        // An older PONG, a forged one from the future, and one for a
        // cluster we do not check change nothing.
        let old = Message {
            timestamp: (wall - Duration::from_secs(1)).to_string(),
            ..pong.clone()
        };
        let future = Message {
            timestamp: (later + Duration::from_mins(1)).to_string(),
            ..pong.clone()
        };
        let stranger = Message {
            cluster_id: "cluster-z".into(),
            ..pong
        };
        for m in [old, future, stranger] {
            checks.receive(m, &target, t0, later);
        }
        assert_eq!(
            checks.health("cluster-b", t0).unwrap().rtt,
            Some(Duration::from_micros(640))
        );

        for _ in 0..LOSSES_FOR_ERROR {
            checks.pings(DEVICE, later);
        }
        let silent = t0 + INTERVAL * LOSSES_FOR_ERROR + Duration::from_millis(1);
        let health = checks.health("cluster-b", silent).unwrap();
        assert_eq!(
            (health.connected, health.failed, health.unanswered),
            (false, true, LOSSES_FOR_ERROR)
        );
        // A new target starts afresh; the others keep their state.
        checks.set_targets(&targets(&[("cluster-b", [10, 0, 1, 2])]), silent);
        assert!(!checks.health("cluster-b", silent).unwrap().failed);
    }

    #[test]
    fn each_device_pings_its_own_peers_alone() {
        let mut checks = Checks::default();
        let same = [169, 254, 18, 2];
        let targets = BTreeMap::from([
            ("rome".to_owned(), through("ist-rome", same)),
            ("milan".to_owned(), through("ist-milan", same)),
        ]);
        checks.set_targets(&targets, Instant::now());
        let pinged = |checks: &mut Checks, device| -> Vec<String> {
            let pings = checks.pings(device, Timestamp::now());
            pings.into_iter().map(|(_, m)| m.cluster_id).collect()
        };
        assert_eq!(pinged(&mut checks, "ist-rome"), ["rome"]);
        assert_eq!(pinged(&mut checks, "ist-milan"), ["milan"]);
        assert!(pinged(&mut checks, "isthmus0").is_empty());
    }

    #[test]
    fn latency_is_written_as_liqo_formats_it() {
        assert_eq!(format_latency(None), "N/A");
        assert_eq!(format_latency(Some(Duration::ZERO)), "N/A");
        assert_eq!(format_latency(Some(Duration::from_micros(640))), "640μs");
        assert_eq!(format_latency(Some(Duration::from_micros(12_345))), "12ms");
    }
}
