//! Traffic that spans an event (a failover, a restart) between two lab
//! namespaces: a numbered UDP stream echoed back, whose longest silence is
//! the event's gap, and a TCP transfer whose every byte is checked. Both
//! are bounded in count and time and stop by themselves.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, Shutdown, SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};

use crate::{netns, probe::next_port};

/// Gap between datagrams: 1,000 a second, so a gap is measured to 1 ms.
const PACE: Duration = Duration::from_millis(1);
/// Bounds on every stream and transfer.
const MAX_PACKETS: u32 = 120_000;
const MAX_TIME: Duration = Duration::from_secs(90);
/// How long a socket waits for anything before its thread gives up.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(5);

/// What a UDP stream saw.
#[derive(Debug)]
pub struct StreamReport {
    /// Datagrams sent.
    pub sent: u32,
    /// Distinct datagrams echoed back.
    pub received: u32,
    /// The longest time between two echoes.
    pub longest_gap: Duration,
}

/// A numbered UDP stream from one namespace to an echo in another.
pub struct UdpStream {
    stop: Arc<AtomicBool>,
    received: Arc<AtomicU32>,
    sender: JoinHandle<u32>,
    receiver: JoinHandle<StreamReport>,
    echo: JoinHandle<()>,
}

impl UdpStream {
    /// Starts datagrams from netns `client` to `target`, echoed by netns
    /// `server`, which binds `bind` (its own address for `target`).
    pub fn start(client: &str, server: &str, bind: Ipv4Addr, target: Ipv4Addr) -> Result<Self> {
        let port = next_port();
        let echo = netns::run_in(server, || UdpSocket::bind((bind, port)))??;
        let socket = netns::run_in(client, || UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)))??;
        for s in [&echo, &socket] {
            s.set_read_timeout(Some(SOCKET_TIMEOUT))?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU32::new(0));
        let echo = std::thread::spawn(move || {
            let mut buf = [0u8; 16];
            while let Ok((n, from)) = echo.recv_from(&mut buf) {
                let _ = echo.send_to(&buf[..n], from);
            }
        });
        let sender = {
            let (stop, socket) = (stop.clone(), socket.try_clone()?);
            let to = SocketAddrV4::new(target, port);
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut seq = 0u32;
                while !stop.load(Ordering::Relaxed)
                    && seq < MAX_PACKETS
                    && start.elapsed() < MAX_TIME
                {
                    // While the path is down, a send may fail (no route): it counts as lost.
                    let _ = socket.send_to(&seq.to_be_bytes(), to);
                    seq += 1;
                    std::thread::sleep(PACE);
                }
                seq
            })
        };
        let receiver = {
            let (stop, received) = (stop.clone(), received.clone());
            std::thread::spawn(move || receive(&socket, &stop, &received))
        };
        Ok(Self {
            stop,
            received,
            sender,
            receiver,
            echo,
        })
    }

    /// Distinct datagrams echoed so far.
    pub fn received(&self) -> u32 {
        self.received.load(Ordering::Relaxed)
    }

    /// Waits until `more` datagrams beyond those echoed now come back.
    pub fn wait_more(&self, more: u32, within: Duration) -> Result<()> {
        let target = self.received() + more;
        crate::wait::until(
            within,
            Duration::from_millis(10),
            "the stream flowing",
            || self.received() >= target,
        )
        .map(drop)
        .with_context(|| format!("it stalled at {} echoes", self.received()))
    }

    /// Stops the stream and reports it.
    pub fn finish(self) -> Result<StreamReport> {
        self.stop.store(true, Ordering::Relaxed);
        let sent = self.sender.join().map_err(|_| anyhow!("sender panicked"))?;
        let mut report = self
            .receiver
            .join()
            .map_err(|_| anyhow!("receiver panicked"))?;
        let _ = self.echo.join();
        report.sent = sent;
        Ok(report)
    }
}

/// Collects echoes until stopped and quiet; the longest gap between two.
fn receive(socket: &UdpSocket, stop: &AtomicBool, received: &AtomicU32) -> StreamReport {
    let mut seen = std::collections::BTreeSet::new();
    let mut last: Option<Instant> = None;
    let mut longest_gap = Duration::ZERO;
    let mut buf = [0u8; 16];
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("a timeout");
    let start = Instant::now();
    loop {
        match socket.recv_from(&mut buf) {
            Ok((4, _)) => {
                let now = Instant::now();
                if let Some(last) = last {
                    longest_gap = longest_gap.max(now - last);
                }
                last = Some(now);
                if seen.insert(u32::from_be_bytes(buf[..4].try_into().expect("4 bytes"))) {
                    received.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(_) if stop.load(Ordering::Relaxed) || start.elapsed() > MAX_TIME => break,
            Ok(_) | Err(_) => {}
        }
    }
    StreamReport {
        sent: 0,
        received: seen.len() as u32,
        longest_gap,
    }
}

/// What a TCP transfer delivered.
#[derive(Debug)]
pub struct TransferReport {
    /// Bytes the client wrote.
    pub sent: u64,
    /// Bytes the server read, each checked against the pattern.
    pub verified: u64,
}

/// A TCP connection from one namespace to another, carrying a known
/// pattern until stopped.
pub struct TcpTransfer {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    client: JoinHandle<Result<()>>,
    server: JoinHandle<Result<u64>>,
}

/// The pattern's byte at offset `i`: a prime period, so a lost or
/// repeated segment shows.
fn pattern(i: u64) -> u8 {
    (i % 251) as u8
}

impl TcpTransfer {
    /// Connects from netns `client` to `target`, served by netns `server`
    /// on `bind`, and starts writing.
    pub fn start(client: &str, server: &str, bind: Ipv4Addr, target: Ipv4Addr) -> Result<Self> {
        let port = next_port();
        let listener = netns::run_in(server, || TcpListener::bind((bind, port)))??;
        let server = std::thread::spawn(move || -> Result<u64> {
            let (mut conn, _) = listener.accept()?;
            conn.set_read_timeout(Some(MAX_TIME))?;
            let mut buf = vec![0u8; 64 << 10];
            let mut offset = 0u64;
            loop {
                let n = conn.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                if let Some(bad) = (0..n).find(|i| buf[*i] != pattern(offset + *i as u64)) {
                    bail!("byte {} of the transfer is wrong", offset + bad as u64);
                }
                offset += n as u64;
            }
            conn.write_all(&offset.to_be_bytes())?;
            Ok(offset)
        });
        let mut conn = netns::run_in(client, || {
            TcpStream::connect_timeout(&SocketAddrV4::new(target, port).into(), SOCKET_TIMEOUT)
        })??;
        conn.set_write_timeout(Some(MAX_TIME))?;
        conn.set_read_timeout(Some(MAX_TIME))?;
        let (stop, sent) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let client = {
            let (stop, sent) = (stop.clone(), sent.clone());
            std::thread::spawn(move || -> Result<()> {
                let start = Instant::now();
                let mut chunk = vec![0u8; 16 << 10];
                while !stop.load(Ordering::Relaxed) && start.elapsed() < MAX_TIME {
                    let at = sent.load(Ordering::Relaxed);
                    for (i, b) in chunk.iter_mut().enumerate() {
                        *b = pattern(at + i as u64);
                    }
                    conn.write_all(&chunk)?;
                    sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    // About 8 MB/s: the transfer spans the event without
                    // taking the CPU the gateways need.
                    std::thread::sleep(Duration::from_millis(2));
                }
                conn.shutdown(Shutdown::Write)?;
                let mut count = [0u8; 8];
                conn.read_exact(&mut count)
                    .context("the server's count after the transfer")?;
                Ok(())
            })
        };
        Ok(Self {
            stop,
            sent,
            client,
            server,
        })
    }

    /// Bytes written so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Stops writing, and waits for the server to read and check it all.
    pub fn finish(self) -> Result<TransferReport> {
        self.stop.store(true, Ordering::Relaxed);
        self.client
            .join()
            .map_err(|_| anyhow!("client panicked"))?
            .context("the TCP client")?;
        let verified = self
            .server
            .join()
            .map_err(|_| anyhow!("server panicked"))?
            .context("the TCP server")?;
        Ok(TransferReport {
            sent: self.sent.load(Ordering::Relaxed),
            verified,
        })
    }
}
