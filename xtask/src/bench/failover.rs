//! `cargo xtask bench failover`: how long traffic a-pod1 → b-pod1 stops
//! (the longest silence of a numbered UDP stream, echoed back) when
//! - cluster a's active gateway agent is killed and its standby takes over
//!   (the `--ha` lab), against the lease duration;
//! - a-gw's agent is restarted in place (SIGTERM, then start), against the
//!   issue's 200 ms budget;
//! - Liqo's way: wireguard-go on a-gw is restarted and handshakes from
//!   cold, measured in the same run on the same path.

use std::time::Duration;

use anyhow::{Context, Result};

use super::{
    on_lab,
    stats::{median, ratio_line},
    write_section,
};
use isthmus_lab::{
    lab::{
        self, LabTunnel,
        external_tunnel::{self, Implementation},
        ha,
    },
    stream::UdpStream,
    topology::{A, B, reachability},
};

/// Events measured per setup; event `i` of each is compared with event
/// `i` of the others.
const EVENTS: usize = 5;
/// The agents' default lease duration, which bounds a failover.
const LEASE_DURATION_MS: f64 = 1000.0;
/// The issue's budget for a restart in place.
const RESTART_BUDGET_MS: f64 = 200.0;
const GIVE_UP: Duration = Duration::from_secs(20);

/// Runs the three setups and records them.
pub fn run_failover() -> Result<()> {
    let restart = on_lab(LabTunnel::Userspace, || {
        gaps("isthmus restart in place", || lab::restart_agent(&A.gw()))
    })?;
    let failover = on_lab(LabTunnel::Userspace, || {
        ha::set(true)?;
        gaps(
            "isthmus failover (SIGKILL of the active agent)",
            kill_active,
        )
    })?;
    let wireguard_go = on_lab(LabTunnel::WireguardGo, || {
        gaps("wireguard-go restart, cold", || {
            external_tunnel::stop_on(&A)?;
            external_tunnel::start_on(Implementation::WireguardGoBookworm, &A)
        })
    })?;
    let go_version = Implementation::WireguardGoBookworm.version()?;
    let budget = |ms| vec![ms; EVENTS];
    let mut lines = ratio_line(
        "failover-gap-ms-vs-lease-duration",
        &failover,
        &budget(LEASE_DURATION_MS),
        1,
    );
    lines += &ratio_line(
        "restart-gap-ms-vs-budget",
        &restart,
        &budget(RESTART_BUDGET_MS),
        1,
    );
    lines += &ratio_line(
        "restart-gap-ms-vs-wireguard-go-cold",
        &restart,
        &wireguard_go,
        1,
    );
    let (failover, restart, wireguard_go) =
        (median(&failover), median(&restart), median(&wireguard_go));
    let body = format!(
        "## Failover and restart

`cargo xtask bench failover`: the longest silence of a numbered UDP
stream a-pod1 → b-pod1 (1,000 datagrams a second, echoed back), in
{EVENTS} events of each setup; the setups need labs of their own, so
event `i` of one is paired with event `i` of the other, and each RESULT
line gives the median, least and greatest of those pairs' ratios:
- failover: the `--ha` lab, cluster a's active gateway agent killed with
  SIGKILL; its standby takes the Lease (duration {LEASE_DURATION_MS} ms)
  and a's endpoint address. Against the lease duration.
- restart: a-gw's agent restarted in place (SIGTERM, then start), no
  failover. Against the issue's budget of {RESTART_BUDGET_MS} ms, and
  against Liqo's way, {go_version} on a-gw
  restarted and handshaking from cold, in the same run on the same path.

```
{lines}```

Failover: {failover:.0} ms; restart in place: {restart:.0} ms;
wireguard-go restarted: {wireguard_go:.0} ms. Lower is better: a ratio
under 1 is a shorter gap than the reference. A failover waits out the
lease (the standby cannot tell a dead holder from a slow one), then
takes it on its next retry (200 ms) and the balancer moves the address
with a gratuitous ARP; the tunnel's handshake adds one round trip. A
restart in place keeps the TUN device, the routes and the NAT programs,
so the gap is the new process's start and one handshake.
"
    );
    write_section("failover", &body)
}

/// The gaps of [`EVENTS`] events `event`, each during its own stream.
fn gaps(what: &str, mut event: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
    let row = &reachability()[0];
    let mut measured = Vec::new();
    for i in 0..EVENTS {
        let stream = UdpStream::start(&row.from, &row.answered_by, B.pod_addr(1), row.target)?;
        stream
            .wait_more(300, GIVE_UP)
            .context("the stream before")?;
        event()?;
        stream.wait_more(500, GIVE_UP).context("the stream after")?;
        let report = stream.finish()?;
        let gap = report.longest_gap.as_secs_f64() * 1e3;
        println!(
            "bench: {what} {}/{EVENTS}: gap {gap:.1} ms ({} of {} datagrams back)",
            i + 1,
            report.received,
            report.sent
        );
        measured.push(gap);
    }
    Ok(measured)
}

/// Kills the active gateway's agent, waits for the standby to take a's
/// endpoint address, then starts the killed agent again as the standby.
fn kill_active() -> Result<()> {
    let active = ha::endpoint_holder().context("no active gateway")?;
    let pid = lab::agent_pid(&active).context("the active agent is not running")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    isthmus_lab::wait::until(
        GIVE_UP,
        Duration::from_millis(10),
        "the standby takes a's endpoint address",
        || ha::endpoint_holder().is_some_and(|h| h != active),
    )?;
    lab::start_agent(&active)?;
    lab::wait_ready(&active)
}
