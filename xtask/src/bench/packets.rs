//! Packets and flows through the lab for the NAT benchmarks: trafgen's
//! frames from a client pod, counted where they arrive, in measurement
//! windows; a TCP answerer for the flows that need one.

use std::{
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use isthmus_lab::{
    cmd::{ip, run},
    lab, netns,
    topology::A,
    wait,
};

/// Measurement windows per setup and round; the median of all is reported.
pub(super) const WINDOWS: usize = 2;
/// The length of each window.
pub(super) const WINDOW: Duration = Duration::from_secs(2);
/// Traffic before the first window, to fill caches and tables.
pub(super) const WARMUP: Duration = Duration::from_secs(1);

/// Hard bounds on the generator, whatever happens to this process.
const GENERATOR_MAX_PACKETS: &str = "300000000";
pub(super) const GENERATOR_MAX_SECONDS: &str = "60";

/// A flow under test, from a client pod to a server pod.
pub(super) struct Flow {
    pub(super) client: String,
    /// The client's node and the node's end of the client's veth: its
    /// next hop.
    pub(super) next_hop: (String, &'static str),
    pub(super) server: String,
    /// The client's address; of the destination's family.
    pub(super) src: IpAddr,
    pub(super) dst: IpAddr,
    /// Where the server answers each of the flow's source ports once
    /// before the measurement (the client as the server sees it), so that
    /// conntrack on the way holds every flow as answered, as it does a
    /// request/response or TCP flow; none leaves the flows one-way.
    pub(super) answer_to: Option<IpAddr>,
}

/// How a reaches c-pod1 through the hub b (reachability row 5).
pub(super) const HUB_TARGET: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 45);

/// a-pod2, on a's gateway node, to c-pod1 through the hub, answered at
/// `answer_to` (b's masquerade address, as c-pod1 sees a) or not.
pub(super) fn hub_flow(answer_to: Option<Ipv4Addr>) -> Flow {
    Flow {
        client: A.pod(2),
        next_hop: (A.gw(), "pod2"),
        server: isthmus_lab::topology::C.pod(1),
        src: A.pod_addr(2).into(),
        dst: HUB_TARGET.into(),
        answer_to: answer_to.map(IpAddr::V4),
    }
}

/// The source ports of a flow's packets (trafgen's `c8(0x80), dinc(0, 255)`)
/// and its destination port.
pub(super) const FIRST_SOURCE_PORT: u16 = 0x8000;

const SOURCE_PORTS: u16 = 256;

pub(super) const DESTINATION_PORT: u16 = 9;

/// One datagram from the server's side of `flow` to each of its source
/// ports at `to`.
pub(super) fn answer(flow: &Flow, to: IpAddr) -> Result<()> {
    let any: IpAddr = match to {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    netns::run_in(&flow.server, || -> Result<()> {
        let socket = std::net::UdpSocket::bind((any, DESTINATION_PORT))?;
        for port in FIRST_SOURCE_PORT..FIRST_SOURCE_PORT + SOURCE_PORTS {
            socket.send_to(b"answer", (to, port))?;
        }
        Ok(())
    })?
    .context("answering the flow's source ports")
}

/// The MAC address of `dev` in netns `ns`, as trafgen bytes.
pub(super) fn mac_bytes(ns: &str, dev: &str) -> Result<String> {
    let out = ip(ns, &["-o", "link", "show", dev])?;
    let mac = out
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .context("no MAC")?;
    Ok(mac
        .split(':')
        .map(|b| format!("0x{b}"))
        .collect::<Vec<_>>()
        .join(", "))
}

/// Octets as trafgen bytes.
fn octets(octets: &[u8]) -> String {
    let bytes: Vec<String> = octets.iter().map(u8::to_string).collect();
    bytes.join(", ")
}

/// A trafgen configuration: the smallest frames from the client pod to
/// `dst` (IPv4: 60 bytes, 64 with FCS; IPv6: 64, 68 with FCS), over 256
/// source ports so conntrack sees real flows.
pub(super) fn trafgen_config(flow: &Flow) -> Result<String> {
    let l3 = match (flow.src, flow.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => format!(
            "c16(0x0800),
  0x45, 0x00, c16(46), c16(0), c16(0), 64, 17, csumip(14, 33),
  {}, {},",
            octets(&src.octets()),
            octets(&dst.octets())
        ),
        (IpAddr::V6(src), IpAddr::V6(dst)) => format!(
            "c16(0x86dd),
  0x60, 0x00, 0x00, 0x00, c16(10), 17, 64,
  {}, {},",
            octets(&src.octets()),
            octets(&dst.octets())
        ),
        (src, dst) => bail!("a flow from {src} to {dst} mixes address families"),
    };
    let (udp_len, csum, payload) = match flow.dst {
        IpAddr::V4(_) => (26, "csumudp(14, 34)", 18),
        IpAddr::V6(_) => (10, "csumudp6(14, 54)", 2),
    };
    Ok(format!(
        "{{
  {dst_mac}, {src_mac}, {l3}
  c8({port_high:#x}), dinc(0, {last_port_low}), c16({DESTINATION_PORT}), c16({udp_len}), {csum},
  fill(0x42, {payload})
}}
",
        dst_mac = mac_bytes(&flow.next_hop.0, flow.next_hop.1)?,
        src_mac = mac_bytes(&flow.client, "eth0")?,
        port_high = FIRST_SOURCE_PORT >> 8,
        last_port_low = SOURCE_PORTS - 1,
    ))
}

/// Packets received on the server pod's eth0.
fn rx_packets(ns: &str) -> Result<u64> {
    rx_counter(ns, 1)
}

/// Bytes received on the server pod's eth0: unlike packets, the same
/// whether the sender's stack merged segments (GSO) or not.
pub(super) fn rx_bytes(ns: &str) -> Result<u64> {
    rx_counter(ns, 0)
}

/// Receive counter `field` (0 bytes, 1 packets) of eth0 in netns `ns`.
fn rx_counter(ns: &str, field: usize) -> Result<u64> {
    // /proc/thread-self/net follows the calling thread's netns.
    let dev = netns::run_in(ns, || fs::read_to_string("/proc/thread-self/net/dev"))??;
    let line = dev
        .lines()
        .find(|l| l.trim_start().starts_with("eth0:"))
        .context("no eth0")?;
    let fields: Vec<&str> = line
        .split(':')
        .nth(1)
        .context("malformed")?
        .split_whitespace()
        .collect();
    fields
        .get(field)
        .context("no receive counter")?
        .parse()
        .context("a receive counter")
}

/// Runs the generator and returns the median rate seen at the server.
/// The server pod drops every frame at its netdev ingress hook, after its
/// interface counted it: the sink then costs the same in every setup (a UDP
/// socket or an ICMP error would not, and the no-NAT setup would drop them
/// as martians).
pub(super) fn measure(flow: &Flow) -> Result<Vec<f64>> {
    let sink = format!("{}/sink.nft", lab::STATE_DIR);
    fs::write(
        &sink,
        "table netdev isthmus_bench_sink {\n  chain in {\n    type filter hook ingress device \"eth0\" priority 0;\n    meta protocol ip ip protocol udp drop\n    meta protocol ip6 ip6 nexthdr udp drop\n  }\n}\n",
    )?;
    run("ip", &["netns", "exec", &flow.server, "nft", "-f", &sink])?;
    let rate = generate(flow);
    run(
        "ip",
        &[
            "netns",
            "exec",
            &flow.server,
            "nft",
            "delete table netdev isthmus_bench_sink",
        ],
    )?;
    rate
}

fn generate(flow: &Flow) -> Result<Vec<f64>> {
    let conf = format!("{}/bench.trafgen", lab::STATE_DIR);
    fs::write(&conf, trafgen_config(flow)?)?;
    let mut generator = Command::new("timeout")
        .args([GENERATOR_MAX_SECONDS, "ip", "netns", "exec", &flow.client])
        .args([
            "trafgen",
            "--dev",
            "eth0",
            "--conf",
            &conf,
            "--cpus",
            "1",
            "--num",
            GENERATOR_MAX_PACKETS,
        ])
        .stdout(Stdio::null())
        .stderr(fs::File::create(format!("{}/trafgen.log", lab::STATE_DIR))?)
        .spawn()
        .context("starting trafgen")?;
    let result = windows(flow, &mut generator);
    // Ends only the generator this function started, by PID.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(generator.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    let _ = generator.wait();
    let rates = result?;
    let shown: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
    println!("bench:   {} pps", shown.join(", "));
    Ok(rates)
}

/// Packets that must arrive before measuring: proof the path carries the flow.
const PATH_PROOF: u64 = 1000;

pub(super) fn windows(flow: &Flow, generator: &mut std::process::Child) -> Result<Vec<f64>> {
    let start = rx_packets(&flow.server)?;
    let proven = || {
        if let Some(status) = generator.try_wait()? {
            let log =
                fs::read_to_string(format!("{}/trafgen.log", lab::STATE_DIR)).unwrap_or_default();
            bail!("trafgen exited ({status}): {log}");
        }
        Ok((rx_packets(&flow.server)? >= start + PATH_PROOF).then_some(()))
    };
    let what = format!("{PATH_PROOF} packets reach {}", flow.server);
    wait::try_poll(
        Duration::from_secs(5),
        Duration::from_millis(10),
        &what,
        proven,
    )
    .context("the path is broken")?;
    if let Some(to) = flow.answer_to {
        answer(flow, to)?;
    }
    std::thread::sleep(WARMUP);
    (0..WINDOWS)
        .map(|_| {
            let (t0, n0) = (Instant::now(), rx_packets(&flow.server)?);
            std::thread::sleep(WINDOW);
            let (t1, n1) = (Instant::now(), rx_packets(&flow.server)?);
            Ok((n1 - n0) as f64 / (t1 - t0).as_secs_f64())
        })
        .collect()
}
