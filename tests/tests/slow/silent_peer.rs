//! A peer whose endpoint never answers gets WireGuard's retries and no
//! more: one initiation per Rekey-Timeout with a jitter, a round given up
//! after Rekey-Attempt-Time, then rounds further and further apart, while
//! Liqo's conncheck keeps sending it data every 2 s.
//!
//! `ist-t-silent` runs a gateway agent whose one peer's endpoint is routed
//! into `ist-t-silent-wan`, which does not forward: its datagrams vanish.
//! It runs beside the lab tier: two minutes of waiting for timers.

use std::{
    fs,
    path::PathBuf,
    time::{Duration, Instant},
};

use isthmus_lab::{cmd::ip, lab, objects::TunnelEndpoint};
use isthmus_tests::{netns as test_netns, require_lab, require_root};

const GW: &str = "ist-t-silent";
const WAN: &str = "ist-t-silent-wan";
/// Where the peer's endpoint is: routed to `WAN`, which drops it.
const SILENT_ENDPOINT: &str = "198.19.0.1";
/// The longest the whole test may take: a round (90 s), the wait after
/// it (10 s), two initiations of the next round (10 s apart), and some.
const BOUND: Duration = Duration::from_mins(3);
/// How often the agent's counters are read.
const POLL: Duration = Duration::from_millis(50);
/// Slack on a measured gap: the poll, and the timer thread's tick.
const SLACK: Duration = Duration::from_millis(150);

/// The agent and its peer that never answers, gone when dropped.
struct Silent {
    agent: u32,
    dir: PathBuf,
}

impl Silent {
    fn new() -> Self {
        require_root();
        require_lab();
        test_netns::fresh(&[GW, WAN]);
        test_netns::link(GW, WAN);
        ip(GW, &["route", "add", "198.19.0.0/16", "via", "192.0.2.2"]).unwrap();
        let dir = PathBuf::from(lab::STATE_DIR).join("silent");
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("objects")).unwrap();
        fs::write(
            dir.join("objects/peer-silent.yaml"),
            TunnelEndpoint::new("tep-silent", "liqo-tenant-silent")
                .cluster_id("cluster-silent")
                .local(["10.244.0.0/24", "10.0.40.0/24", "192.168.0.0/24", "None"])
                .remote(["10.1.0.0/24", "None", "10.2.0.0/24", "None"])
                .endpoint(SILENT_ENDPOINT)
                .port(5871)
                .public_key(&lab::public_key(WAN).unwrap())
                .to_string(),
        )
        .unwrap();
        let _ = fs::remove_file(lab::log_file(GW));
        let agent = lab::start_gateway_in(GW, &dir.join("objects"), &[]).unwrap();
        Self { agent, dir }
    }
}

/// The silent peer's counter `name`.
fn counter(name: &str) -> u64 {
    lab::metric_sum(GW, name, &[("cluster_id", "cluster-silent")]).unwrap_or(0.0) as u64
}

/// A measured gap of at least `d`, within [`SLACK`].
fn at_least(gap: Duration, d: Duration) -> bool {
    gap >= d.saturating_sub(SLACK)
}

impl Drop for Silent {
    fn drop(&mut self) {
        let _ = lab::stop_pid(self.agent);
        let _ = lab::clean_up_agent(GW);
        test_netns::remove(&[GW, WAN]);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// What the test saw: when each initiation went out, and when the first
/// round was given up.
#[derive(Debug, Default)]
struct Seen {
    initiations: Vec<Instant>,
    given_up: Option<Instant>,
    drops_when_given_up: u64,
    drops_before_next_round: u64,
}

#[test]
fn a_silent_peer_gets_wireguards_retries_then_rounds_further_apart() {
    let _silent = Silent::new();
    let started = Instant::now();
    let mut seen = Seen::default();
    let mut sent = 0;
    // Until two initiations of the round after the silence went out.
    while seen
        .given_up
        .is_none_or(|at| seen.initiations.iter().filter(|t| **t > at).count() < 2)
    {
        assert!(started.elapsed() < BOUND, "timed out: {seen:?}");
        std::thread::sleep(POLL);
        let now = Instant::now();
        let count = counter("isthmus_peer_handshake_initiations_total");
        let after_give_up = seen.given_up.is_some();
        for _ in sent..count {
            if after_give_up && seen.drops_before_next_round == 0 {
                seen.drops_before_next_round = counter("isthmus_peer_silent_drops_total");
            }
            seen.initiations.push(now);
        }
        sent = sent.max(count);
        if seen.given_up.is_none() && counter("isthmus_peer_handshake_failures_total") >= 1 {
            seen.given_up = Some(now);
            seen.drops_when_given_up = counter("isthmus_peer_silent_drops_total");
        }
    }
    eprintln!("{seen:?}");
    let given_up = seen.given_up.expect("given up");
    let (round, after): (Vec<Instant>, Vec<Instant>) =
        seen.initiations.iter().partition(|t| **t <= given_up);

    // The first round: quick retries for the first 6 s, then one per
    // Rekey-Timeout plus a jitter of up to a third of a second, for 90 s.
    let first = round[0];
    assert!(
        at_least(given_up - first, Duration::from_secs(90))
            && given_up - first <= Duration::from_secs(96),
        "the round was given up {:?} after it began",
        given_up - first
    );
    let timed: Vec<Duration> = round
        .windows(2)
        .filter(|w| w[0] - first > Duration::from_secs(7))
        .map(|w| w[1] - w[0])
        .collect();
    assert!(timed.len() >= 14, "too few retries: {timed:?}");
    for gap in &timed {
        assert!(
            at_least(*gap, Duration::from_secs(5)) && *gap <= Duration::from_millis(5_334) + SLACK,
            "a retry {gap:?} after the last: {timed:?}"
        );
    }
    let spread = timed
        .iter()
        .max()
        .unwrap()
        .saturating_sub(*timed.iter().min().unwrap());
    assert!(spread >= Duration::from_millis(60), "no jitter: {timed:?}");

    // Then nothing for 10 s, though the conncheck's PINGs come.
    assert!(
        at_least(after[0] - given_up, Duration::from_secs(10)),
        "the next round began {:?} after the first was given up",
        after[0] - given_up
    );
    assert!(
        seen.drops_before_next_round >= seen.drops_when_given_up + 3,
        "the conncheck's PINGs were not held: {seen:?}"
    );
    // And the next round's initiations are 10 s apart.
    assert!(
        at_least(after[1] - after[0], Duration::from_secs(10)),
        "{:?} between the next round's initiations",
        after[1] - after[0]
    );
    let log = fs::read_to_string(lab::log_file(GW)).unwrap();
    assert_eq!(
        log.matches("no handshake with the peer answered").count(),
        1,
        "the silence is logged once"
    );
}
