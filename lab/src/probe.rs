//! Real traffic between lab pods: a server in one netns, a client in
//! another, and what each end saw of the other.

use std::{
    io::{Read, Write},
    mem::MaybeUninit,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    sync::atomic::{AtomicU16, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use socket2::{Domain, Protocol, Socket, Type};

use crate::netns;

/// How long one exchange may take.
const TIMEOUT: Duration = Duration::from_secs(3);

/// A transport to probe with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// A TCP connection.
    Tcp,
    /// A UDP request and reply.
    Udp,
    /// An ICMP echo request and reply.
    Icmp,
}

impl Proto {
    /// Every transport.
    pub const ALL: [Proto; 3] = [Proto::Tcp, Proto::Udp, Proto::Icmp];

    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Icmp => "icmp",
        }
    }
}

/// What each end of one exchange saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The source address of the client's packets, as the server got them.
    pub client_as_seen_by_server: IpAddr,
    /// The source address of the server's reply, as the client got it.
    pub server_as_seen_by_client: IpAddr,
}

static NEXT_PORT: AtomicU16 = AtomicU16::new(0);
static NEXT_ICMP_ID: AtomicU16 = AtomicU16::new(0);

/// A port no other probe of this process uses.
pub fn next_port() -> u16 {
    20_000
        + (std::process::id() as u16 % 200) * 100
        + NEXT_PORT.fetch_add(1, Ordering::Relaxed) % 100
}

/// One exchange: a server in `server_ns`, a client in `client_ns` that
/// sends to `target` (of either family), on a port no other probe uses.
pub fn exchange(
    proto: Proto,
    client_ns: &str,
    server_ns: &str,
    target: impl Into<IpAddr>,
) -> Result<Seen> {
    exchange_on(proto, client_ns, server_ns, target, next_port())
}

/// One exchange on `port` (ICMP has none).
pub fn exchange_on(
    proto: Proto,
    client_ns: &str,
    server_ns: &str,
    target: impl Into<IpAddr>,
    port: u16,
) -> Result<Seen> {
    let target = target.into();
    match proto {
        Proto::Tcp => tcp(client_ns, server_ns, target, port),
        Proto::Udp => udp(client_ns, server_ns, target, port),
        Proto::Icmp => icmp(client_ns, server_ns, target),
    }
    .with_context(|| {
        format!(
            "{} from {client_ns} to {target} port {port} (server in {server_ns})",
            proto.as_str()
        )
    })
}

/// The unspecified address of `target`'s family, for a server or a
/// client to bind.
fn any_of(target: IpAddr) -> IpAddr {
    match target {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    }
}

fn tcp(client_ns: &str, server_ns: &str, target: IpAddr, port: u16) -> Result<Seen> {
    let listener = netns::run_in(server_ns, || TcpListener::bind((any_of(target), port)))??;
    let server = std::thread::spawn(move || -> Result<IpAddr> {
        listener.set_nonblocking(true)?;
        let accepted = || match listener.accept() {
            Ok(conn) => Ok(Some(conn)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e).context("server accept"),
        };
        let (mut stream, peer) =
            crate::wait::try_poll(TIMEOUT, Duration::from_millis(2), "a connection", accepted)?;
        stream.set_nonblocking(false)?;
        let peer = peer.ip();
        stream.write_all(peer.to_string().as_bytes())?;
        Ok(peer)
    });
    let server_seen = netns::run_in(client_ns, move || -> Result<IpAddr> {
        let addr = SocketAddr::from((target, port));
        let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT).context("connect")?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        let mut echoed = String::new();
        stream
            .read_to_string(&mut echoed)
            .context("reading the server's reply")?;
        Ok(stream.peer_addr()?.ip())
    })?;
    // Join the server before reporting a client failure, so no thread outlives the probe.
    let client_seen = server
        .join()
        .map_err(|_| anyhow::anyhow!("server thread panicked"))?;
    let server_seen = server_seen?;
    Ok(Seen {
        client_as_seen_by_server: client_seen?,
        server_as_seen_by_client: server_seen,
    })
}

fn udp(client_ns: &str, server_ns: &str, target: IpAddr, port: u16) -> Result<Seen> {
    let any = any_of(target);
    let server = netns::run_in(server_ns, || UdpSocket::bind((any, port)))??;
    let client = netns::run_in(client_ns, || UdpSocket::bind((any, 0)))??;
    server.set_read_timeout(Some(TIMEOUT))?;
    client.set_read_timeout(Some(TIMEOUT))?;
    client.send_to(b"isthmus-probe", (target, port))?;
    let mut buf = [0u8; 64];
    let (_, from) = server
        .recv_from(&mut buf)
        .context("server waiting for the request")?;
    server.send_to(b"isthmus-reply", from)?;
    let (_, reply_from) = client
        .recv_from(&mut buf)
        .context("client waiting for the reply")?;
    Ok(Seen {
        client_as_seen_by_server: from.ip(),
        server_as_seen_by_client: reply_from.ip(),
    })
}

/// An echo request and reply's ICMP types, and the raw socket's protocol,
/// in `target`'s family. An ICMPv6 raw socket gets no IPv6 header, and
/// has the kernel fill its checksum over the pseudo-header.
fn echo_of(target: IpAddr) -> (u8, u8, Domain, Protocol) {
    match target {
        IpAddr::V4(_) => (8, 0, Domain::IPV4, Protocol::ICMPV4),
        IpAddr::V6(_) => (128, 129, Domain::IPV6, Protocol::ICMPV6),
    }
}

fn icmp(client_ns: &str, server_ns: &str, target: IpAddr) -> Result<Seen> {
    let id = NEXT_ICMP_ID.fetch_add(1, Ordering::Relaxed) ^ (std::process::id() as u16);
    let (request, reply, domain, protocol) = echo_of(target);
    let raw = || Socket::new(domain, Type::RAW, Some(protocol));
    // The server's kernel answers the echo; a raw socket there watches it arrive.
    let watcher = netns::run_in(server_ns, raw)??;
    let client = netns::run_in(client_ns, raw)??;
    watcher.set_read_timeout(Some(TIMEOUT))?;
    client.set_read_timeout(Some(TIMEOUT))?;
    let echo = echo_request(request, id, 1);
    client.send_to(&echo, &SocketAddr::new(target, 0).into())?;
    let client_seen =
        wait_icmp(&watcher, request, id).context("server watching for the echo request")?;
    let server_seen = wait_icmp(&client, reply, id).context("client waiting for the echo reply")?;
    Ok(Seen {
        client_as_seen_by_server: client_seen,
        server_as_seen_by_client: server_seen,
    })
}

/// An echo request of ICMP type `icmp_type`; its checksum is IPv4's (the
/// kernel fills an ICMPv6 one).
fn echo_request(icmp_type: u8, id: u16, seq: u16) -> Vec<u8> {
    let mut packet = vec![icmp_type, 0, 0, 0];
    packet.extend(id.to_be_bytes());
    packet.extend(seq.to_be_bytes());
    packet.extend(b"isthmus-probe");
    if icmp_type == 8 {
        let check = isthmus_common::csum::checksum(&packet);
        packet[2..4].copy_from_slice(&check.bytes());
    }
    packet
}

/// Reads a raw ICMP or ICMPv6 socket until a message of `icmp_type` with
/// echo id `id` arrives; returns its IP source.
fn wait_icmp(socket: &Socket, icmp_type: u8, id: u16) -> Result<IpAddr> {
    let deadline = Instant::now() + TIMEOUT;
    let mut buf = [MaybeUninit::<u8>::uninit(); 1500];
    while Instant::now() < deadline {
        let (n, from) = socket.recv_from(&mut buf)?;
        // SAFETY: recv_from initialised the first n bytes.
        let packet: Vec<u8> = buf[..n]
            .iter()
            .map(|b| unsafe { b.assume_init() })
            .collect();
        let Some(source) = from.as_socket().map(|a| a.ip()) else {
            continue;
        };
        // An IPv4 raw socket gets the IP header; an IPv6 one does not.
        let icmp = match source {
            IpAddr::V4(_) => packet.get(usize::from(packet[0] & 0x0f) * 4..),
            IpAddr::V6(_) => Some(&packet[..]),
        };
        let Some(icmp) = icmp else {
            continue;
        };
        if icmp.len() >= 8 && icmp[0] == icmp_type && u16::from_be_bytes([icmp[4], icmp[5]]) == id {
            return Ok(source);
        }
    }
    bail!("no ICMP type {icmp_type} with id {id} within {TIMEOUT:?}")
}

/// What a round makes of an echo that does not come back within
/// [`ECHO_TIMEOUT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lost {
    /// Fails the round past 1% of its echoes: an idle path loses nothing.
    Fails,
    /// A round trip of [`ECHO_TIMEOUT`], and fails the round only past
    /// 10%: under a bulk transfer, a full queue drops a ping as it delays
    /// one, and both are what the probe measures.
    Waited,
}

impl Lost {
    /// The most echoes a round may lose before it fails, in percent.
    pub fn most_percent(self) -> usize {
        match self {
            Lost::Fails => 1,
            Lost::Waited => 10,
        }
    }
}

/// How long a ping's echo is waited for.
pub const ECHO_TIMEOUT: Duration = Duration::from_millis(200);

/// `rounds` rounds of `samples` UDP ping-pongs from netns `client` to an
/// echo in netns `server` at `target`, each round from a new socket: each
/// round's p50 and p99, in microseconds.
pub fn round_trips(
    client: &str,
    server: &str,
    target: Ipv4Addr,
    rounds: usize,
    samples: usize,
    lost_as: Lost,
) -> Result<Vec<[f64; 2]>> {
    let port = next_port();
    let echo = netns::run_in(server, || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)))??;
    echo.set_read_timeout(Some(Duration::from_secs(1)))?;
    let echoer = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while let Ok((n, from)) = echo.recv_from(&mut buf) {
            let _ = echo.send_to(&buf[..n], from);
        }
    });
    let percentiles = (0..rounds)
        .map(|_| round_trip_round(client, (target, port), samples, lost_as))
        .collect::<Result<Vec<_>>>()?;
    echoer
        .join()
        .map_err(|_| anyhow::anyhow!("echo thread panicked"))?;
    Ok(percentiles)
}

/// One round of `samples` ping-pongs from a new socket in `client` to the
/// echo at `to`: the p50 and p99, in microseconds. An echo that does not
/// come back within [`ECHO_TIMEOUT`] is what `lost_as` says; past its share,
/// the round fails at once.
fn round_trip_round(
    client: &str,
    to: (Ipv4Addr, u16),
    samples: usize,
    lost_as: Lost,
) -> Result<[f64; 2]> {
    let socket = netns::run_in(client, || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)))??;
    socket.set_read_timeout(Some(ECHO_TIMEOUT))?;
    let most_lost_percent = lost_as.most_percent();
    let mut times = Vec::with_capacity(samples);
    let mut lost = 0;
    let mut buf = [0u8; 64];
    for i in 0..samples as u32 {
        if lost * 100 > samples * most_lost_percent {
            bail!("{lost} of the first {i} echoes of {samples} never came back");
        }
        let sent = Instant::now();
        socket.send_to(&i.to_be_bytes(), to)?;
        let mut answered = false;
        // Echoes of earlier, lost-looking pings may still arrive: skipped.
        while let Ok((n, _)) = socket.recv_from(&mut buf) {
            if n == 4 && buf[..4] == i.to_be_bytes() {
                times.push(sent.elapsed().as_secs_f64() * 1e6);
                answered = true;
                break;
            }
        }
        if !answered {
            lost += 1;
            if lost_as == Lost::Waited {
                times.push(ECHO_TIMEOUT.as_secs_f64() * 1e6);
            }
        }
    }
    if lost * 100 > samples * most_lost_percent || times.is_empty() {
        bail!("{lost} of {samples} echoes never came back");
    }
    times.sort_by(f64::total_cmp);
    Ok([times[times.len() / 2], times[times.len() * 99 / 100]])
}
