//! Connection rate: one client opens a TCP connection, sends a one-byte
//! request, reads the one-byte answer and closes, again and again for a
//! fixed time, as netperf's `TCP_CRR` does. Every connection is a new flow for
//! each NAT and conntrack on the way.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, Shutdown, SocketAddrV4, TcpListener, TcpStream},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use isthmus_lab::{cmd::run, netns};

use super::stats::percentile;

/// How long the client runs per measurement.
const WINDOW: Duration = Duration::from_secs(3);
/// How long one connection may take before the measurement fails.
const TIMEOUT: Duration = Duration::from_secs(2);
/// The port the server listens on.
pub const PORT: u16 = 5101;

/// What one measurement found.
#[derive(Clone, Copy, Debug)]
pub struct Crr {
    /// Connections completed per second.
    pub per_second: f64,
    /// 99th percentile of one connection's time, connect to close, in µs;
    /// a connection that failed counts as taking [`TIMEOUT`].
    pub p99_us: f64,
    /// Connections that failed to complete within [`TIMEOUT`].
    pub failed: usize,
}

impl Crr {
    /// Fails if any connection did: where nothing on the path may refuse
    /// one, a failure is a broken path, not a figure.
    pub fn all_completed(self, target: SocketAddrV4) -> Result<Self> {
        if self.failed > 0 {
            bail!(
                "{} connection(s) to {target} did not complete within {TIMEOUT:?}",
                self.failed
            );
        }
        Ok(self)
    }
}

/// Runs the client in `client` against `target`, served in `server`.
pub fn measure(client: &str, server: &str, target: SocketAddrV4) -> Result<Crr> {
    // Ports free again at once, and the whole range: a client that closes
    // first keeps each port in TIME_WAIT.
    for (key, value) in [
        ("net.ipv4.tcp_tw_reuse", "1"),
        ("net.ipv4.ip_local_port_range", "1024 65000"),
    ] {
        let setting = format!("{key}={value}");
        run("ip", &["netns", "exec", client, "sysctl", "-qw", &setting])?;
    }
    let listener = netns::run_in(server, || TcpListener::bind((Ipv4Addr::UNSPECIFIED, PORT)))??;
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let answering = scope.spawn(|| answer(&listener, &done));
        let measured = netns::run_in(client, || connect_loop(target)).and_then(|r| r);
        done.store(true, Ordering::Relaxed);
        // Wakes the server from accept().
        let _ = netns::run_in(client, || {
            TcpStream::connect_timeout(&target.into(), TIMEOUT)
        });
        let _ = netns::run_in(server, || {
            TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, PORT).into(), TIMEOUT)
        });
        answering.join().expect("the server thread")?;
        measured
    })
}

/// Answers each connection's byte and waits for the client to close.
fn answer(listener: &TcpListener, done: &AtomicBool) -> Result<()> {
    let mut byte = [0u8; 1];
    while !done.load(Ordering::Relaxed) {
        let (mut conn, _) = listener.accept().context("accept")?;
        conn.set_read_timeout(Some(TIMEOUT))?;
        if conn.read_exact(&mut byte).is_ok() {
            conn.write_all(&byte)?;
            // EOF once the client closed.
            let _ = conn.read(&mut byte);
        }
    }
    Ok(())
}

fn connect_loop(target: SocketAddrV4) -> Result<Crr> {
    let mut times = Vec::new();
    let mut failed = 0;
    let start = Instant::now();
    while start.elapsed() < WINDOW {
        let began = Instant::now();
        match transaction(target) {
            Ok(()) => times.push(began.elapsed().as_secs_f64() * 1e6),
            Err(e) if is_timeout(&e) => failed += 1,
            Err(e) => {
                return Err(e).with_context(|| format!("connection {}", times.len() + 1));
            }
        }
    }
    if times.is_empty() {
        bail!("no connection completed in {WINDOW:?}");
    }
    let per_second = times.len() as f64 / start.elapsed().as_secs_f64();
    times.extend(std::iter::repeat_n(TIMEOUT.as_secs_f64() * 1e6, failed));
    Ok(Crr {
        per_second,
        p99_us: percentile(&times, 99),
        failed,
    })
}

/// One connection: connect, a byte each way, close.
fn transaction(target: SocketAddrV4) -> std::io::Result<()> {
    let mut conn = TcpStream::connect_timeout(&target.into(), TIMEOUT)?;
    conn.set_read_timeout(Some(TIMEOUT))?;
    conn.write_all(b"?")?;
    let mut byte = [0u8; 1];
    conn.read_exact(&mut byte)?;
    conn.shutdown(Shutdown::Both)
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
    )
}
