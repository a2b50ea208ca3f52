//! Packet captures in lab namespaces with tcpdump, bounded in time.

use std::{
    fs,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use isthmus_lab::lab;

/// Frames of a classic pcap file.
pub fn frames(pcap: &[u8]) -> Vec<&[u8]> {
    assert!(pcap.len() >= 24, "no pcap header");
    let mut frames = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let len = u32::from_le_bytes(pcap[at + 8..at + 12].try_into().unwrap()) as usize;
        frames.push(&pcap[at + 16..(at + 16 + len).min(pcap.len())]);
        at += 16 + len;
    }
    frames
}

/// Starts tcpdump on `dev` in netns `ns` with `args`, for 60 s at most,
/// and returns once it listens. Its stderr goes to a log named after
/// `name` in the lab's state directory.
pub fn start(ns: &str, dev: &str, args: &[&str], name: &str) -> Child {
    let log_path = PathBuf::from(lab::STATE_DIR).join(format!("tcpdump-{name}.log"));
    // Bounded in time whatever happens; `timeout` passes our SIGINT on.
    let mut tcpdump = Command::new("timeout")
        .args([
            "60", "ip", "netns", "exec", ns, "tcpdump", "-i", dev, "-n", "-U",
        ])
        .arg("--immediate-mode")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(fs::File::create(&log_path).unwrap())
        .spawn()
        .expect("tcpdump");
    crate::eventually(Duration::from_secs(10), "tcpdump listening", || {
        let log = fs::read_to_string(&log_path).unwrap_or_default();
        assert!(
            tcpdump.try_wait().unwrap().is_none(),
            "tcpdump exited: {log}"
        );
        log.contains("listening on")
    });
    tcpdump
}

/// Stops a capture this test started, by PID, and waits for it to write
/// what it has.
pub fn stop(mut tcpdump: Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(tcpdump.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    tcpdump.wait().unwrap();
}
