//! Helpers shared by the kernel-level tests.

pub mod addrs;
pub mod capture;
pub mod inspect;
pub mod metrics;
pub mod netns;
pub mod packet;
pub mod packet6;
pub mod wireguard;

/// Runs `prog` once on `frame` (`BPF_PROG_TEST_RUN`); returns its return
/// value and the frame it left.
pub fn test_run<P>(prog: &P, frame: &[u8]) -> (u32, Vec<u8>)
where
    P: for<'a> aya::programs::TestRun<
            Opts<'a> = aya::programs::TestRunOptions<'a>,
            Result = aya::TestRunResult,
        >,
{
    test_run_marked(prog, frame, 0)
}

/// [`test_run`] of a TC program on a packet whose `skb->mark` is `mark`.
pub fn test_run_marked<P>(prog: &P, frame: &[u8], mark: u32) -> (u32, Vec<u8>)
where
    P: for<'a> aya::programs::TestRun<
            Opts<'a> = aya::programs::TestRunOptions<'a>,
            Result = aya::TestRunResult,
        >,
{
    // `struct __sk_buff` up to its mark: the kernel takes a shorter context,
    // and wants zeros before the mark.
    let mut skb = [0u8; 12];
    skb[8..].copy_from_slice(&mark.to_ne_bytes());
    let mut out = vec![0u8; frame.len() + 64];
    let result = prog
        .test_run(aya::programs::TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: (mark != 0).then_some(&skb[..]),
            ..Default::default()
        })
        .expect("BPF_PROG_TEST_RUN");
    out.truncate(result.data_size_out as usize);
    (result.return_value, out)
}

/// A directory of one test's own, removed when dropped.
pub fn scratch_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temporary directory")
}

/// How often [`eventually`] tries its condition.
pub const POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// Polls `done` until it holds and returns how long that took; fails the
/// test, naming `what`, if it still does not after `within`.
pub fn eventually(
    within: std::time::Duration,
    what: &str,
    done: impl FnMut() -> bool,
) -> std::time::Duration {
    isthmus_lab::wait::until(within, POLL, what, done).unwrap_or_else(|e| panic!("{e}"))
}

/// Fails the test unless the lab is up: lab tests never skip in silence.
pub fn require_lab() {
    assert!(
        isthmus_lab::lab::is_up(),
        "the lab is not up: run these tests through `cargo xtask test`, or `cargo xtask lab up` first"
    );
}

/// Fails the test unless it runs as root.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test loads eBPF programs and needs root; run it through `cargo xtask test` as root"
    );
}

/// Exchanges one probe of `proto` for reachability row `row`, of either
/// family: the row's server answers, each end seeing the addresses the row
/// says.
pub fn assert_row<A: Into<std::net::IpAddr> + Copy>(
    proto: isthmus_lab::probe::Proto,
    row: &isthmus_lab::topology::Reach<A>,
) {
    let seen = isthmus_lab::probe::exchange(proto, &row.from, &row.answered_by, row.target)
        .unwrap_or_else(|e| panic!("row {} over {proto:?}: {e:#}", row.row));
    assert_eq!(
        (seen.client_as_seen_by_server, seen.server_as_seen_by_client),
        (row.client_seen_as.into(), row.target.into()),
        "row {} over {proto:?}",
        row.row
    );
}
