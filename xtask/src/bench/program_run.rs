//! The NAT programs the gateways' agents loaded, run by the kernel on the
//! NAT bench's own frame (`BPF_PROG_TEST_RUN`) with the maps the agents
//! filled: their cost per packet apart from the traffic, the stack and
//! the generator. On this machine, a VM, its rounds still vary by about
//! 10% either way, as much as the kernel's count during the traffic does.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use aya::programs::{SchedClassifier, TestRun, TestRunOptions};
use etherparse::PacketBuilder;
use nix::{
    sched::{CpuSet, sched_setaffinity},
    unistd::Pid,
};

use isthmus_lab::netns;

use super::{
    packets::{DESTINATION_PORT, FIRST_SOURCE_PORT, Flow},
    program_time::{NAT_PROGRAMS, node_of, pinned},
    stats::median,
};

/// Calls per program and round. One run per call: the kernel repeats a
/// run on the same buffer, which the first run has already translated.
pub(super) const RUNS: u32 = 100_000;

/// Nanoseconds per run of `nat_egress_eth` at a's gateway on `flow`'s
/// frame, and of `nat_ingress_eth` at b's on the frame a's gave.
pub(super) fn nat_programs(flow: &Flow) -> Result<BTreeMap<&'static str, f64>> {
    let [egress, ingress] = NAT_PROGRAMS;
    let (egress_ns, translated) = time_program(egress, &frame(flow))?;
    let (ingress_ns, _) = time_program(ingress, &translated)?;
    Ok([(egress, egress_ns), (ingress, ingress_ns)].into())
}

/// The bench's 60-byte frame (64 on the wire) of `flow`, from its first
/// source port.
fn frame(flow: &Flow) -> Vec<u8> {
    let builder = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(flow.src, flow.dst, 64)
        .udp(FIRST_SOURCE_PORT, DESTINATION_PORT);
    let payload = [0x42; 18];
    let mut frame = Vec::with_capacity(builder.size(payload.len()));
    builder
        .write(&mut frame, &payload)
        .expect("writing to a Vec cannot fail");
    frame
}

/// Runs `program`, as its node's agent loaded it, [`RUNS`] times on `frame`;
/// returns its median time per run and the frame it gives, which must
/// differ from `frame` in its addresses: a run that left them would time
/// a pass-through.
fn time_program(program: &str, frame: &[u8]) -> Result<(f64, Vec<u8>)> {
    let node = &node_of(program);
    let pin = pinned(program);
    let classifier = SchedClassifier::from_pin(&pin).with_context(|| {
        format!(
            "opening {program}, which {node}'s agent pins at {}",
            pin.display()
        )
    })?;
    // In the node's netns, so that any route or neighbour the program
    // looks up is the node's, and on one core, so that every run finds
    // the same caches.
    let (times, out) = netns::run_in(node, || -> Result<(Vec<f64>, Vec<u8>)> {
        let mut one_core = CpuSet::new();
        one_core.set(0)?;
        sched_setaffinity(Pid::from_raw(0), &one_core)?;
        let mut out = vec![0; frame.len() + 64];
        let mut times = Vec::with_capacity(RUNS as usize);
        let mut size = 0;
        for _ in 0..RUNS {
            let result = classifier.test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ..TestRunOptions::default()
            })?;
            times.push(result.duration.as_secs_f64() * 1e9);
            size = result.data_size_out as usize;
        }
        out.truncate(size);
        Ok((times, out))
    })??;
    let addresses = |f: &[u8]| f.get(26..34).map(<[u8]>::to_vec);
    ensure!(
        addresses(&out).is_some() && addresses(&out) != addresses(frame),
        "{program} at {node} left the bench's frame's addresses as they were: its time \
         would be a pass-through's"
    );
    // The median, not the mean: a run the kernel interrupts (a softirq at
    // the end of the timed section, a timer) takes many times longer.
    Ok((median(&times), out))
}
