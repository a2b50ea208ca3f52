//! `cargo xtask bench guard`: a handshake-shaped flood at a-gw's tunnel
//! port from an address no peer uses. With the XDP guard: the rate it
//! drops at, and the CPU the agent spends meanwhile. Without it: the CPU
//! the userspace tunnel spends turning the same flood away.

use std::{
    fs,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use isthmus_lab::{
    cmd::ip,
    lab,
    topology::{A, TUNNEL_PORT, WAN_NS},
};

use super::{
    ROUNDS,
    packets::mac_bytes,
    stats::{cpu_seconds, median, ratio_line},
    write_section,
};

/// An address on the WAN bridge that no peer uses.
const STRANGER: [u8; 4] = [203, 0, 113, 98];
/// How long each flood is measured, after a warm-up.
const MEASURE: Duration = Duration::from_secs(4);
const WARMUP: Duration = Duration::from_secs(1);
/// The generator stops by itself after this long, whatever happens.
const GENERATOR_MAX_SECONDS: &str = "20";

pub fn run_guard() -> Result<()> {
    lab::up(&lab::Setup::default())?;
    let result = guard();
    lab::down()?;
    result
}

/// What one flood cost a-gw.
struct Flood {
    /// Datagrams the guard dropped, per second.
    dropped_pps: f64,
    /// Datagrams userspace turned away, per second.
    userspace_pps: f64,
    /// The agent's CPU use, in percent of one core.
    agent_cpu: f64,
}

fn guard() -> Result<()> {
    let gw = A.gw();
    lab::stop_agent(&gw)?;
    // The lab runs a-gw as shipped, without the guard: the guarded turns
    // add the option.
    let without = lab::agent_args(&gw)?;
    let with_guard: Vec<String> = without
        .iter()
        .cloned()
        .chain([lab::GUARD_OPTION.to_owned()])
        .collect();
    let (mut guarded, mut unguarded) = (Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        println!("bench: round {round}/{ROUNDS}: flooding {gw}'s tunnel port with the XDP guard");
        guarded.push(flood_agent(&gw, &with_guard)?);
        println!("bench: round {round}/{ROUNDS}: the same flood without the guard");
        unguarded.push(flood_agent(&gw, &without)?);
    }
    lab::start_agent(&gw)?;
    lab::wait_ready(&gw)?;
    let of = |floods: &[Flood], f: fn(&Flood) -> f64| floods.iter().map(f).collect::<Vec<_>>();
    let mut lines = ratio_line(
        "guard-xdp-drop-kpps-vs-userspace-turned-away-kpps",
        &of(&guarded, |f| f.dropped_pps / 1e3),
        &of(&unguarded, |f| f.userspace_pps / 1e3),
        1,
    );
    lines += &ratio_line(
        "agent-cpu-percent-under-flood-guard-vs-no-guard",
        &of(&guarded, |f| f.agent_cpu),
        &of(&unguarded, |f| f.agent_cpu),
        1,
    );
    let median_of = |floods: &[Flood], f: fn(&Flood) -> f64| median(&of(floods, f));
    let section = format!(
        "## XDP guard of the tunnel port

`cargo xtask bench guard`: trafgen in `ist-wan` sends 148-byte datagrams
shaped like WireGuard handshake initiations to a-gw's tunnel port from
203.0.113.98, an address no peer uses, as fast as one core can. Each flood
is measured for {secs} s after {warm} s of warm-up: the drops from the
guard's per-CPU counters, and the agent's CPU from `/proc/PID/stat`. In
each of {ROUNDS} rounds, a-gw's agent floods once with `--guard-dev` and
once restarted without it, when the tunnel turns the flood away in
userspace (unknown sender, throttled per source, a full handshake queue,
or cookie replies under load). The table gives
medians over rounds; each RESULT line the median, least and greatest of
the rounds' ratios.

| | with the guard | without |
|---|---|---|
| dropped in XDP | {gd:.0} /s | |
| turned away by userspace | {gu:.0} /s | {uu:.0} /s |
| agent CPU, % of one core | {gc:.1} | {uc:.1} |

```
{lines}```
",
        secs = MEASURE.as_secs(),
        warm = WARMUP.as_secs(),
        gd = median_of(&guarded, |f| f.dropped_pps),
        gu = median_of(&guarded, |f| f.userspace_pps),
        uu = median_of(&unguarded, |f| f.userspace_pps),
        gc = median_of(&guarded, |f| f.agent_cpu),
        uc = median_of(&unguarded, |f| f.agent_cpu),
    );
    write_section("guard", &section)
}

/// Starts a-gw's agent with `args`, floods it and stops it.
fn flood_agent(gw: &str, args: &[String]) -> Result<Flood> {
    let log = lab::log_file(gw);
    let pid = lab::spawn_agent(gw, args, &log)?;
    let flooded = lab::wait_ready_in(gw, pid, &log).and_then(|()| flood(gw, pid));
    lab::stop_pid(pid)?;
    flooded
}

/// Runs the flood and measures it, and agent `pid`.
fn flood(gw: &str, pid: u32) -> Result<Flood> {
    let stranger = format!("{}/24", std::net::Ipv4Addr::from(STRANGER));
    let _ = ip(WAN_NS, &["addr", "del", &stranger, "dev", "br0"]);
    ip(WAN_NS, &["addr", "add", &stranger, "dev", "br0"])?;
    let conf = format!("{}/guard.trafgen", lab::STATE_DIR);
    fs::write(&conf, trafgen_config(gw)?)?;
    let mut generator = Command::new("timeout")
        .args([GENERATOR_MAX_SECONDS, "ip", "netns", "exec", WAN_NS])
        .args(["trafgen", "--dev", "br0", "--conf", &conf, "--cpus", "1"])
        .stdout(Stdio::null())
        .stderr(fs::File::create(format!("{}/trafgen.log", lab::STATE_DIR))?)
        .spawn()
        .context("starting trafgen")?;
    let measured = measure(gw, pid, &mut generator);
    // Ends only the generator this function started, by PID.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(generator.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    let _ = generator.wait();
    let _ = ip(WAN_NS, &["addr", "del", &stranger, "dev", "br0"]);
    let flood = measured?;
    println!(
        "bench:   {:.0} dropped in XDP/s, {:.0} turned away by userspace/s, agent CPU {:.1}%",
        flood.dropped_pps, flood.userspace_pps, flood.agent_cpu
    );
    Ok(flood)
}

fn measure(gw: &str, pid: u32, generator: &mut std::process::Child) -> Result<Flood> {
    std::thread::sleep(WARMUP);
    if let Some(status) = generator.try_wait()? {
        let log = fs::read_to_string(format!("{}/trafgen.log", lab::STATE_DIR)).unwrap_or_default();
        bail!("trafgen exited ({status}): {log}");
    }
    let sample = || -> Result<(Instant, f64, f64, f64)> {
        Ok((
            Instant::now(),
            lab::metric(gw, "isthmus_guard_packets_total{verdict=\"dropped\"}")?,
            turned_away(gw)?,
            cpu_seconds(pid)?,
        ))
    };
    let (t0, d0, u0, c0) = sample()?;
    std::thread::sleep(MEASURE);
    let (t1, d1, u1, c1) = sample()?;
    let secs = (t1 - t0).as_secs_f64();
    Ok(Flood {
        dropped_pps: (d1 - d0) / secs,
        userspace_pps: (u1 - u0) / secs,
        agent_cpu: (c1 - c0) / secs * 100.0,
    })
}

/// Initiations the tunnel turned away in userspace: from an unknown
/// sender, throttled per source, dropped for a full handshake queue, or
/// answered with a cookie.
fn turned_away(gw: &str) -> Result<f64> {
    let mut total = lab::metric(gw, "isthmus_tunnel_cookies_sent_total")?;
    for reason in [
        "unknown_sender",
        "handshake_throttled",
        "handshake_queue_full",
    ] {
        let labels = [("reason", reason)];
        total += lab::metric_sum(gw, "isthmus_tunnel_dropped_packets_total", &labels)?;
    }
    Ok(total)
}

/// 148-byte datagrams of type 1 from the stranger to a-gw's tunnel port,
/// with a changing sender index.
fn trafgen_config(gw: &str) -> Result<String> {
    let octets = |a: [u8; 4]| a.map(|o| o.to_string()).join(", ");
    let udp_len = 8 + 148;
    Ok(format!(
        "{{
  {dst_mac}, {src_mac}, c16(0x0800),
  0x45, 0x00, c16({ip_len}), c16(0), c16(0), 64, 17, csumip(14, 33),
  {src}, {dst},
  c16(40000), c16({port}), c16({udp_len}), csumudp(14, 34),
  0x01, 0x00, 0x00, 0x00, dinc(0, 255), fill(0x42, 143)
}}
",
        dst_mac = mac_bytes(gw, "wan0")?,
        src_mac = mac_bytes(WAN_NS, "br0")?,
        ip_len = 20 + udp_len,
        src = octets(STRANGER),
        dst = octets(A.wan_addr().octets()),
        port = TUNNEL_PORT,
    ))
}
