//! WireGuard peers for the idle bench: boringtun sessions in a namespace
//! of the lab, one UDP socket each, that answer the gateway's handshakes,
//! keep their sessions alive and answer the conncheck's PINGs, as live peer
//! gateways do.

use std::{
    net::{IpAddr, SocketAddr, SocketAddrV4, UdpSocket},
    os::fd::AsFd,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow};
use base64::Engine as _;
use boringtun::{
    noise::{Tunn, TunnResult},
    x25519::{PublicKey, StaticSecret},
};
use isthmus_lab::netns;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

/// How often the sessions' timers run (keepalives, rekeys), as
/// boringtun's own device does.
const TIMER_TICK: Duration = Duration::from_millis(250);
/// Largest datagram handled.
const BUFFER: usize = 2048;
/// The port conncheck PINGs go to.
const CONNCHECK_PORT: u16 = 12345;

/// Peer `i`'s static key: X25519 clamps the first and last bytes, so the
/// index goes in between.
fn secret(i: usize) -> StaticSecret {
    let mut bytes = [0x42u8; 32];
    bytes[8..16].copy_from_slice(&(i as u64 + 1).to_le_bytes());
    StaticSecret::from(bytes)
}

/// Peer `i`'s public key, as a TunnelEndpoint carries it.
pub fn public_key(i: usize) -> String {
    base64::engine::general_purpose::STANDARD.encode(PublicKey::from(&secret(i)).as_bytes())
}

/// One peer: its socket, its session, and where the gateway was last seen.
struct Peer {
    socket: UdpSocket,
    tunn: Tunn,
    gateway: Option<SocketAddr>,
}

/// Peers answering on a thread of their own until dropped.
pub struct Peers {
    stop: Arc<AtomicBool>,
    established: Arc<AtomicUsize>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl Peers {
    /// Starts peers `range` in netns `ns`, peer `i` on `endpoint(i)`, each
    /// knowing the gateway by `gateway_key` (base64).
    pub fn start(
        ns: &str,
        endpoint: impl Fn(usize) -> SocketAddrV4 + Sync,
        range: std::ops::Range<usize>,
        gateway_key: &str,
    ) -> Result<Self> {
        let key: [u8; 32] = base64::engine::general_purpose::STANDARD
            .decode(gateway_key)?
            .try_into()
            .map_err(|_| anyhow!("the gateway's key is not 32 bytes"))?;
        let gateway = PublicKey::from(key);
        let peers = netns::run_in(ns, || {
            range
                .map(|i| {
                    let at = endpoint(i);
                    let socket =
                        UdpSocket::bind(at).with_context(|| format!("binding peer {i} to {at}"))?;
                    socket.set_nonblocking(true)?;
                    let tunn = Tunn::new(secret(i), gateway, None, None, i as u32, None);
                    Ok(Peer {
                        socket,
                        tunn,
                        gateway: None,
                    })
                })
                .collect::<Result<Vec<Peer>>>()
        })??;
        let stop = Arc::new(AtomicBool::new(false));
        let established = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, established) = (stop.clone(), established.clone());
            std::thread::spawn(move || serve(peers, &stop, &established))
        };
        Ok(Self {
            stop,
            established,
            thread: Some(thread),
        })
    }

    /// How many peers hold a session with the gateway.
    pub fn established(&self) -> usize {
        self.established.load(Ordering::Relaxed)
    }

    /// Stops the peers; fails if their thread did.
    pub fn stop(mut self) -> Result<()> {
        self.end()
    }

    fn end(&mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(thread) => thread
                .join()
                .map_err(|_| anyhow!("the peers' thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for Peers {
    fn drop(&mut self) {
        if let Err(e) = self.end() {
            eprintln!("bench: the WireGuard peers: {e:#}");
        }
    }
}

/// Answers every socket and runs every session's timers until `stop`.
fn serve(mut peers: Vec<Peer>, stop: &AtomicBool, established: &AtomicUsize) -> Result<()> {
    let (mut buf, mut out) = (vec![0u8; BUFFER], vec![0u8; BUFFER]);
    let mut ticked = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let ready: Vec<usize> = {
            let mut fds: Vec<PollFd> = peers
                .iter()
                .map(|p| PollFd::new(p.socket.as_fd(), PollFlags::POLLIN))
                .collect();
            poll(&mut fds, PollTimeout::from(50u16)).context("poll")?;
            fds.iter()
                .enumerate()
                .filter(|(_, fd)| fd.revents().is_some_and(|r| r.contains(PollFlags::POLLIN)))
                .map(|(i, _)| i)
                .collect()
        };
        for i in ready {
            let peer = &mut peers[i];
            while let Ok((len, from)) = peer.socket.recv_from(&mut buf) {
                peer.gateway = Some(from);
                receive(peer, &buf[..len], from, &mut out)?;
            }
        }
        if ticked.elapsed() >= TIMER_TICK {
            ticked = Instant::now();
            for peer in &mut peers {
                if let (TunnResult::WriteToNetwork(packet), Some(to)) =
                    (peer.tunn.update_timers(&mut out), peer.gateway)
                {
                    peer.socket.send_to(packet, to)?;
                }
            }
            let up = peers
                .iter()
                .filter(|p| p.tunn.time_since_last_handshake().is_some())
                .count();
            established.store(up, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// One datagram from the gateway: handshake messages are answered, and a
/// conncheck PING inside the session gets its PONG.
fn receive(peer: &mut Peer, datagram: &[u8], from: SocketAddr, out: &mut [u8]) -> Result<()> {
    let reply = match peer.tunn.decapsulate(Some(from.ip()), datagram, out) {
        TunnResult::WriteToNetwork(packet) => {
            peer.socket.send_to(packet, from)?;
            // Packets queued while the handshake was under way.
            while let TunnResult::WriteToNetwork(packet) = peer.tunn.decapsulate(None, &[], out) {
                peer.socket.send_to(packet, from)?;
            }
            return Ok(());
        }
        TunnResult::WriteToTunnelV4(packet, _) => pong(packet),
        _ => None,
    };
    if let Some(reply) = reply
        && let TunnResult::WriteToNetwork(packet) = peer.tunn.encapsulate(&reply, out)
    {
        peer.socket.send_to(packet, from)?;
    }
    Ok(())
}

/// The PONG answering an IPv4 UDP conncheck PING: the same message with
/// its type changed, from the address it was sent to.
fn pong(packet: &[u8]) -> Option<Vec<u8>> {
    let header = usize::from(packet.first()? & 0x0f) * 4;
    if packet.len() < header + 8 || packet[9] != 17 {
        return None;
    }
    let (ip, udp) = (&packet[..header], &packet[header..]);
    if u16::from_be_bytes([udp[2], udp[3]]) != CONNCHECK_PORT {
        return None;
    }
    let mut message: serde_json::Value = serde_json::from_slice(&udp[8..]).ok()?;
    (message.get("msgType")? == "PING").then_some(())?;
    message["msgType"] = "PONG".into();
    let payload = serde_json::to_vec(&message).ok()?;
    let (from, to) = (
        IpAddr::from(<[u8; 4]>::try_from(&ip[16..20]).ok()?),
        IpAddr::from(<[u8; 4]>::try_from(&ip[12..16]).ok()?),
    );
    let (IpAddr::V4(from), IpAddr::V4(to)) = (from, to) else {
        return None;
    };
    Some(udp_packet(
        SocketAddrV4::new(from, CONNCHECK_PORT),
        SocketAddrV4::new(to, u16::from_be_bytes([udp[0], udp[1]])),
        &payload,
    ))
}

/// An IPv4 UDP packet (no UDP checksum, which IPv4 allows).
fn udp_packet(from: SocketAddrV4, to: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let total = 20 + 8 + payload.len();
    let mut p = Vec::with_capacity(total);
    p.extend_from_slice(&[0x45, 0]);
    p.extend_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    p.extend_from_slice(&from.ip().octets());
    p.extend_from_slice(&to.ip().octets());
    let sum = checksum(&p);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    p.extend_from_slice(&from.port().to_be_bytes());
    p.extend_from_slice(&to.port().to_be_bytes());
    p.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
    p
}

/// The Internet checksum of `header`.
fn checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn every_peer_has_a_key_of_its_own() {
        let keys: std::collections::BTreeSet<String> = (0..1000).map(public_key).collect();
        assert_eq!(keys.len(), 1000);
    }

    #[test]
    fn a_ping_gets_its_pong_from_the_address_it_was_sent_to() {
        let ping = br#"{"clusterID":"c","msgType":"PING","timeStamp":"t"}"#;
        let from = SocketAddrV4::new(Ipv4Addr::new(10, 0, 40, 1), 40000);
        let to = SocketAddrV4::new(Ipv4Addr::new(10, 72, 3, 1), CONNCHECK_PORT);
        let reply = pong(&udp_packet(from, to, ping)).expect("a PONG");
        assert_eq!(checksum(&reply[..20]), 0, "a valid IPv4 header checksum");
        assert_eq!(&reply[12..16], &[10, 72, 3, 1]);
        assert_eq!(&reply[16..20], &[10, 0, 40, 1]);
        assert_eq!(&reply[20..24], &[0x30, 0x39, 0x9c, 0x40]);
        let message: serde_json::Value = serde_json::from_slice(&reply[28..]).unwrap();
        assert_eq!(message["msgType"], "PONG");
        assert_eq!(message["timeStamp"], "t");
        // Not a PING, or not to the conncheck's port: no answer.
        assert!(pong(&reply).is_none());
        let elsewhere = SocketAddrV4::new(*to.ip(), 53);
        assert!(pong(&udp_packet(from, elsewhere, ping)).is_none());
    }
}
