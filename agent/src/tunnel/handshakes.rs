//! Handshake initiations wait here, apart from data, for the one thread
//! that opens them, as the kernel module queues them apart from its
//! per-peer data queues.
//!
//! An initiation costs the gateway a MAC check, and a cookie reply or
//! Diffie-Hellman work: done on the datapath workers, a stranger's flood
//! of them would keep the workers from draining the UDP socket, and the
//! kernel would drop peers' data with the flood. A worker only copies an
//! initiation into this queue, and drops it, counted, when the queue is
//! full. Initiations from a peer's endpoint address wait in a queue of
//! their own, served first: a flood from elsewhere cannot crowd out a peer
//! that restarts where it was. The others are opened within a budget a
//! second ([`OTHERS_PER_SECOND`]), so a flood cannot take the CPU the
//! workers need either.
//!
//! Within each queue, every source address has a line of its own, of at
//! most [`PER_SOURCE`], and the lines are served in turn. A flood from
//! one address then fills only its own line and takes only its turns: a
//! new peer's first initiation, from an address never seen before, waits
//! behind one of the flood's at most, not behind a full queue of them.

use std::{
    collections::{HashMap, VecDeque},
    net::{IpAddr, SocketAddr},
    sync::{Condvar, Mutex},
    time::{Duration, Instant},
};

use super::throttle::party;
use crate::sync::Unpoisoned;

/// The length of a WireGuard handshake initiation.
pub const INITIATION_LEN: usize = 148;
/// WireGuard's message type of an initiation.
const MESSAGE_INITIATION: u8 = 1;
/// Initiations each queue holds.
pub const QUEUE_LEN: usize = 1024;
/// Initiations one source address may have waiting in a queue: a peer
/// retries every 5 s, so a handful is plenty for an honest one.
pub const PER_SOURCE: usize = 8;
/// Initiations from elsewhere than a peer's endpoint opened a second, at
/// most: each costs a MAC check and a cookie reply or Diffie-Hellman
/// work, and the CPU a stranger's flood would take is the workers'. A new
/// peer's first contact needs a handful.
pub const OTHERS_PER_SECOND: u32 = 4096;

/// One initiation, as it arrived.
pub struct Initiation {
    /// The datagram.
    pub bytes: [u8; INITIATION_LEN],
    /// Where it came from.
    pub source: SocketAddr,
    /// Whether that is a peer's endpoint address.
    pub from_peer: bool,
}

/// Whether `datagram` is a handshake initiation, by its type and length.
pub fn is_initiation(datagram: &[u8]) -> bool {
    datagram.len() == INITIATION_LEN && datagram[..4] == [MESSAGE_INITIATION, 0, 0, 0]
}

/// Initiations from peers' endpoint addresses, and from anywhere else.
#[derive(Default)]
struct Queues {
    peers: TakeTurns,
    others: TakeTurns,
    closed: bool,
}

/// One queue: a line per source address, served in turn.
#[derive(Default)]
struct TakeTurns {
    lines: HashMap<IpAddr, VecDeque<Initiation>>,
    /// The sources (each a [`party`]) with initiations waiting, in the
    /// order of their turns.
    turns: VecDeque<IpAddr>,
    len: usize,
}

impl TakeTurns {
    /// Queues `initiation` at the end of its source's line; false, dropping
    /// it, when the line or the queue is full.
    fn push(&mut self, initiation: Initiation) -> bool {
        if self.len >= QUEUE_LEN {
            return false;
        }
        let address = party(initiation.source.ip());
        let line = self.lines.entry(address).or_default();
        if line.len() >= PER_SOURCE {
            return false;
        }
        if line.is_empty() {
            self.turns.push_back(address);
        }
        line.push_back(initiation);
        self.len += 1;
        true
    }

    /// The first initiation of the source whose turn it is.
    fn pop(&mut self) -> Option<Initiation> {
        let address = self.turns.pop_front()?;
        let line = self.lines.get_mut(&address)?;
        let initiation = line.pop_front();
        if line.is_empty() {
            self.lines.remove(&address);
        } else {
            self.turns.push_back(address);
        }
        self.len -= 1;
        initiation
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The bounded queue between the workers and the handshake thread.
#[derive(Default)]
pub struct HandshakeQueue {
    queues: Mutex<Queues>,
    ready: Condvar,
}

impl HandshakeQueue {
    /// Queues an initiation (see [`is_initiation`]) from `source`, a peer's
    /// endpoint address if `from_peer`. Returns false, dropping it, when
    /// its queue, or its source's line in it, is full.
    pub fn push(&self, datagram: &[u8], source: SocketAddr, from_peer: bool) -> bool {
        let Ok(bytes) = datagram.try_into() else {
            return false;
        };
        let mut queues = self.queues.lock().unpoisoned();
        let queue = match from_peer {
            true => &mut queues.peers,
            false => &mut queues.others,
        };
        let queued = queue.push(Initiation {
            bytes,
            source,
            from_peer,
        });
        drop(queues);
        if queued {
            self.ready.notify_one();
        }
        queued
    }

    /// Closes the queue as the tunnel stops: [`HandshakeQueue::pop`]
    /// returns at once from then on.
    pub fn close(&self) {
        self.queues.lock().unpoisoned().closed = true;
        self.ready.notify_all();
    }

    /// The next initiation, peers' first, and only peers' unless `others`;
    /// None after `wait` with none.
    pub fn pop(&self, wait: Duration, others: bool) -> Option<Initiation> {
        let queues = self.queues.lock().unpoisoned();
        let (mut queues, _) = self
            .ready
            .wait_timeout_while(queues, wait, |q| {
                !q.closed && q.peers.is_empty() && (!others || q.others.is_empty())
            })
            .unpoisoned();
        match queues.peers.pop() {
            Some(initiation) => Some(initiation),
            None if others => queues.others.pop(),
            None => None,
        }
    }
}

/// How many initiations from elsewhere than a peer's endpoint the
/// handshake thread may still open this second.
pub struct OthersBudget {
    left: u32,
    second: Instant,
}

impl OthersBudget {
    /// A full budget, from `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            left: OTHERS_PER_SECOND,
            second: now,
        }
    }

    /// Whether another may be opened at `now`.
    pub fn available(&mut self, now: Instant) -> bool {
        if now.duration_since(self.second) >= Duration::from_secs(1) {
            *self = Self::new(now);
        }
        self.left > 0
    }

    /// Counts one opened.
    pub fn spend(&mut self) {
        self.left = self.left.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddrV4};

    fn initiation(tag: u8) -> [u8; INITIATION_LEN] {
        let mut bytes = [tag; INITIATION_LEN];
        bytes[..4].copy_from_slice(&[MESSAGE_INITIATION, 0, 0, 0]);
        bytes
    }

    #[test]
    fn only_initiations_are_queued() {
        assert!(is_initiation(&initiation(7)));
        assert!(!is_initiation(&initiation(7)[..147]));
        let mut data = initiation(7);
        data[0] = 4;
        assert!(!is_initiation(&data));
        let queue = HandshakeQueue::default();
        assert!(!queue.push(
            &[1, 0, 0, 0],
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1).into(),
            false
        ));
    }

    /// A stranger's source `i`, on any port.
    fn stranger(i: u32, port: u16) -> SocketAddr {
        SocketAddrV4::new(Ipv4Addr::from(0xc633_6400 + i), port).into()
    }

    #[test]
    fn a_full_queue_of_strangers_leaves_a_peers_initiation_first_in_line() {
        let queue = HandshakeQueue::default();
        let peer = SocketAddr::from(([203, 0, 113, 2], 51820));
        for i in 0..QUEUE_LEN as u32 {
            assert!(queue.push(&initiation(1), stranger(i, 4000), false));
        }
        let one_more = stranger(QUEUE_LEN as u32, 4000);
        assert!(!queue.push(&initiation(1), one_more, false), "bounded");
        assert!(queue.push(&initiation(2), peer, true));
        let first = queue.pop(Duration::ZERO, true).unwrap();
        assert_eq!((first.source, first.bytes[4]), (peer, 2));
        assert!(queue.pop(Duration::ZERO, false).is_none(), "peers' only");
        assert_eq!(
            queue.pop(Duration::ZERO, true).unwrap().source,
            stranger(0, 4000)
        );
    }

    #[test]
    fn a_flood_from_one_address_fills_its_own_line_and_takes_only_its_turns() {
        let queue = HandshakeQueue::default();
        // Any port: the line is the address's.
        for port in 0..100 {
            let queued = queue.push(&initiation(1), stranger(0, port), false);
            assert_eq!(queued, usize::from(port) < PER_SOURCE, "port {port}");
        }
        // A newcomer, from an address never seen, is next but one.
        assert!(queue.push(&initiation(2), stranger(1, 51820), false));
        let first = queue.pop(Duration::ZERO, true).unwrap();
        let second = queue.pop(Duration::ZERO, true).unwrap();
        assert_eq!(first.source.ip(), stranger(0, 0).ip());
        assert_eq!((second.source, second.bytes[4]), (stranger(1, 51820), 2));
        // The flood's line drains after it, and then takes new ones again.
        let rest = std::iter::from_fn(|| queue.pop(Duration::ZERO, true)).count();
        assert_eq!(rest, PER_SOURCE - 1);
        assert!(queue.push(&initiation(1), stranger(0, 7), false));
    }

    #[test]
    fn an_ipv6_flood_shares_one_line_across_its_slash_64() {
        let queue = HandshakeQueue::default();
        let host = |i: u32| SocketAddr::new(format!("2001:db8:7:7::{i:x}").parse().unwrap(), 9);
        let queued = (1..100)
            .filter(|i| queue.push(&initiation(1), host(*i), false))
            .count();
        assert_eq!(queued, PER_SOURCE, "one line for every address of the /64");
        let other: SocketAddr = "[2001:db8:7:8::1]:9".parse().unwrap();
        assert!(queue.push(&initiation(2), other, false));
        queue.pop(Duration::ZERO, true).unwrap();
        let next = queue.pop(Duration::ZERO, true).unwrap();
        assert_eq!((next.source, next.bytes[4]), (other, 2), "next but one");
    }

    #[test]
    fn a_peer_flooding_from_its_endpoint_leaves_other_peers_their_turns() {
        let queue = HandshakeQueue::default();
        let (flooding, other) = (stranger(5, 51820), stranger(6, 51820));
        for _ in 0..PER_SOURCE * 4 {
            queue.push(&initiation(1), flooding, true);
        }
        assert!(queue.push(&initiation(2), other, true));
        let sources: Vec<SocketAddr> = (0..3)
            .filter_map(|_| queue.pop(Duration::ZERO, false))
            .map(|i| i.source)
            .collect();
        assert_eq!(sources, [flooding, other, flooding]);
    }

    #[test]
    fn an_empty_queue_waits_only_as_long_as_asked_and_not_once_closed() {
        let queue = HandshakeQueue::default();
        assert!(queue.pop(Duration::from_millis(1), true).is_none());
        queue.close();
        let started = std::time::Instant::now();
        assert!(queue.pop(Duration::from_secs(5), true).is_none());
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "closed: no wait"
        );
    }

    #[test]
    fn strangers_get_a_budget_a_second() {
        let start = Instant::now();
        let mut budget = OthersBudget::new(start);
        for _ in 0..OTHERS_PER_SECOND {
            assert!(budget.available(start));
            budget.spend();
        }
        assert!(!budget.available(start + Duration::from_millis(999)));
        assert!(budget.available(start + Duration::from_secs(1)));
    }
}
