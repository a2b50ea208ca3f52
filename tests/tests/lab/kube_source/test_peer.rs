//! The test's own WireGuard peer, standing for a peer cluster's gateway:
//! it answers the gateway's handshakes and, as a Liqo gateway does, its
//! conncheck PINGs.

use super::*;

/// The test's own WireGuard peer on loopback in the node's netns: answers
/// every handshake the gateway starts, until dropped.
pub struct TestPeer {
    socket: Option<UdpSocket>,
    pub port: u16,
    secret: [u8; 32],
    stop: Arc<AtomicBool>,
    /// While set, whatever arrives is lost, as behind a cut WAN link.
    cut: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TestPeer {
    pub fn new(ns: &str) -> Self {
        let mut secret = [0u8; 32];
        std::io::Read::read_exact(&mut fs::File::open("/dev/urandom").unwrap(), &mut secret)
            .unwrap();
        let socket = netns::run_in(ns, || UdpSocket::bind("127.0.0.1:0"))
            .unwrap()
            .unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        Self {
            port: socket.local_addr().unwrap().port(),
            socket: Some(socket),
            secret,
            stop: Arc::new(AtomicBool::new(false)),
            cut: Arc::new(AtomicBool::new(false)),
            thread: None,
        }
    }

    pub fn public(&self) -> [u8; 32] {
        *PublicKey::from(&StaticSecret::from(self.secret)).as_bytes()
    }

    /// Starts answering, now that the gateway's key is known.
    pub fn answer(&mut self, gateway_public: [u8; 32]) {
        self.run(gateway_public, None);
    }

    /// Makes contact with the gateway at `gateway` (its server), then
    /// answers as [`TestPeer::answer`] does.
    pub fn contact(&mut self, gateway_public: [u8; 32], gateway: std::net::SocketAddr) {
        self.run(gateway_public, Some(gateway));
    }

    /// Loses everything that arrives while `cut`, and answers again once
    /// not.
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::Relaxed);
    }

    fn run(&mut self, gateway_public: [u8; 32], contact: Option<std::net::SocketAddr>) {
        let socket = self.socket.take().expect("answering once");
        let (secret, stop) = (StaticSecret::from(self.secret), self.stop.clone());
        let cut = self.cut.clone();
        self.thread = Some(std::thread::spawn(move || {
            let mut tunn = Tunn::new(
                secret,
                PublicKey::from(gateway_public),
                None,
                None,
                0x99,
                None,
            );
            let (mut buf, mut out) = (vec![0u8; 2048], vec![0u8; 2048]);
            if let Some(gateway) = contact
                && let TunnResult::WriteToNetwork(init) =
                    tunn.format_handshake_initiation(&mut buf, false)
            {
                socket.send_to(init, gateway).unwrap();
            }
            while !stop.load(Ordering::Relaxed) {
                let Ok((n, from)) = socket.recv_from(&mut buf) else {
                    // A lost initiation is sent again, as WireGuard does.
                    if let (Some(gateway), TunnResult::WriteToNetwork(again)) =
                        (contact, tunn.update_timers(&mut out))
                    {
                        let _ = socket.send_to(again, gateway);
                    }
                    continue;
                };
                if cut.load(Ordering::Relaxed) {
                    continue;
                }
                let mut result = tunn.decapsulate(Some(from.ip()), &buf[..n], &mut out);
                while let TunnResult::WriteToNetwork(packet) = result {
                    let _ = socket.send_to(packet, from);
                    result = tunn.decapsulate(None, &[], &mut out);
                }
                // A Liqo gateway answers the conncheck's PINGs.
                if let TunnResult::WriteToTunnelV4(packet, _) = result
                    && let Some(pong) = pong_for(packet)
                    && let TunnResult::WriteToNetwork(sealed) = tunn.encapsulate(&pong, &mut buf)
                {
                    let _ = socket.send_to(sealed, from);
                }
            }
        }));
    }
}

/// The PONG a Liqo gateway sends for `packet`, if it is a conncheck PING:
/// the same message, typed PONG, back to where it came from.
fn pong_for(packet: &[u8]) -> Option<Vec<u8>> {
    let ihl = usize::from(packet.first()? & 0x0f) * 4;
    let udp = packet.get(ihl..)?;
    if packet.get(9) != Some(&17) || udp.get(2..4)? != 12345u16.to_be_bytes() {
        return None;
    }
    let mut message: Value = serde_json::from_slice(udp.get(8..)?).ok()?;
    (message["msgType"] == "PING").then_some(())?;
    message["msgType"] = json!("PONG");
    let addr = |at: usize| -> Option<[u8; 4]> { packet.get(at..at + 4)?.try_into().ok() };
    let sport = u16::from_be_bytes(udp.get(0..2)?.try_into().ok()?);
    let reply = isthmus_tests::packet::Datagram::new(
        addr(16)?,
        addr(12)?,
        isthmus_tests::packet::L4::Udp {
            sport: 12345,
            dport: sport,
            payload: serde_json::to_vec(&message).ok()?,
            zero_csum: false,
        },
    );
    Some(reply.bytes())
}

impl Drop for TestPeer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The text of a Secret's `data.<field>`.
pub fn secret_text(secret: &Value, field: &str) -> String {
    let encoded = secret["data"][field]
        .as_str()
        .unwrap_or_else(|| panic!("Secret has no data.{field}: {secret}"));
    String::from_utf8(STANDARD.decode(encoded).unwrap()).unwrap()
}
