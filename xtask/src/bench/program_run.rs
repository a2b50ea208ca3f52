//! The NAT programs the gateways' agents loaded, run by the kernel on the
//! NAT bench's own frame (`BPF_PROG_TEST_RUN`) with the maps the agents
//! filled: their cost per packet apart from the traffic, the stack and
//! the generator. On this machine, a VM, rounds vary by about 10% either
//! way, as much as the kernel's count during the traffic does. So two
//! builds are compared in one round, their programs held open and run in
//! turns, call by call: whatever slows the machine slows both.

use std::{collections::BTreeMap, net::IpAddr};

use anyhow::{Context, Result, ensure};
use aya::{
    maps::MapData,
    programs::{SchedClassifier, TestRun, TestRunOptions},
};
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
    let programs = NatPrograms::open()?;
    let [(egress, [egress_ns]), (ingress, [ingress_ns])] = NatPrograms::time([&programs], flow)?;
    Ok([(egress, egress_ns), (ingress, ingress_ns)].into())
}

/// The NAT programs the gateways' agents pinned, held open: a program and
/// its maps outlive the agent that loaded them while a descriptor holds
/// them. The maps are held too: the kernel empties a program array once
/// no process holds it, and a build whose agent does not pin its arrays
/// would then miss its tail calls once its agent stopped.
pub(super) struct NatPrograms {
    programs: [SchedClassifier; 2],
    _maps: Vec<MapData>,
}

impl NatPrograms {
    /// Opens the programs the agents pinned now.
    pub(super) fn open() -> Result<Self> {
        let [egress, ingress] = NAT_PROGRAMS.map(|program| {
            let pin = pinned(program);
            SchedClassifier::from_pin(&pin).with_context(|| {
                format!(
                    "opening {program}, which {}'s agent pins at {}",
                    node_of(program),
                    pin.display()
                )
            })
        });
        let programs = [egress?, ingress?];
        let mut maps = Vec::new();
        for program in &programs {
            let ids = program.info()?.map_ids()?.unwrap_or_default();
            for id in ids {
                maps.push(MapData::from_id(id)?);
            }
        }
        Ok(Self {
            programs,
            _maps: maps,
        })
    }

    /// Runs `nat_egress_eth` of each of `builds` on `flow`'s frame, in
    /// turns, then `nat_ingress_eth` of each on the frame its egress gave;
    /// returns each program's median nanoseconds per run, build by build.
    /// The builds must translate the frame alike.
    pub(super) fn time<const N: usize>(
        builds: [&NatPrograms; N],
        flow: &Flow,
    ) -> Result<[(&'static str, [f64; N]); 2]> {
        let [egress, ingress] = NAT_PROGRAMS;
        let (egress_ns, translated) =
            in_turns(egress, builds.map(|b| &b.programs[0]), &frame(flow)?)?;
        let (ingress_ns, _) = in_turns(ingress, builds.map(|b| &b.programs[1]), &translated)?;
        Ok([(egress, egress_ns), (ingress, ingress_ns)])
    }
}

/// The bench's smallest frame of `flow` (IPv4: 60 bytes, 64 on the wire),
/// from its first source port.
fn frame(flow: &Flow) -> Result<Vec<u8>> {
    let ethernet = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let (builder, payload) = match (flow.src, flow.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => (
            ethernet.ipv4(src.octets(), dst.octets(), 64),
            &[0x42; 18][..],
        ),
        (IpAddr::V6(src), IpAddr::V6(dst)) => (
            ethernet.ipv6(src.octets(), dst.octets(), 64),
            &[0x42; 2][..],
        ),
        (src, dst) => anyhow::bail!("a flow from {src} to {dst} mixes address families"),
    };
    let builder = builder.udp(FIRST_SOURCE_PORT, DESTINATION_PORT);
    let mut frame = Vec::with_capacity(builder.size(payload.len()));
    builder
        .write(&mut frame, payload)
        .expect("writing to a Vec cannot fail");
    Ok(frame)
}

/// Each copy's times per run, and the frame it gave.
type Turns<const N: usize> = ([Vec<f64>; N], [Vec<u8>; N]);

/// Runs each of `classifiers`, copies of `program`, [`RUNS`] times on
/// `frame`, in turns call by call; returns each one's median time per
/// run, and the frame they give, which must differ from `frame` in its
/// addresses (a run that left them would time a pass-through) and be the
/// same for every copy.
fn in_turns<const N: usize>(
    program: &str,
    classifiers: [&SchedClassifier; N],
    frame: &[u8],
) -> Result<([f64; N], Vec<u8>)> {
    let node = &node_of(program);
    // In the node's netns, so that any route or neighbour the program
    // looks up is the node's, and on one core, so that every run finds
    // the same caches.
    let (times, outs) = netns::run_in(node, || -> Result<Turns<N>> {
        let mut one_core = CpuSet::new();
        one_core.set(0)?;
        sched_setaffinity(Pid::from_raw(0), &one_core)?;
        let mut outs = [(); N].map(|()| vec![0; frame.len() + 64]);
        let mut times = [(); N].map(|()| Vec::with_capacity(RUNS as usize));
        let mut sizes = [0; N];
        for run in 0..RUNS as usize {
            // Each copy goes first as often as the others.
            for turn in 0..N {
                let which = (run + turn) % N;
                let result = classifiers[which].test_run(TestRunOptions {
                    data_in: Some(frame),
                    data_out: Some(&mut outs[which]),
                    ..TestRunOptions::default()
                })?;
                times[which].push(result.duration.as_secs_f64() * 1e9);
                sizes[which] = result.data_size_out as usize;
            }
        }
        for (out, size) in outs.iter_mut().zip(sizes) {
            out.truncate(size);
        }
        Ok((times, outs))
    })??;
    let addresses = |f: &[u8]| f.get(26..34).map(<[u8]>::to_vec);
    ensure!(
        addresses(&outs[0]).is_some() && addresses(&outs[0]) != addresses(frame),
        "{program} at {node} left the bench's frame's addresses as they were: its time \
         would be a pass-through's"
    );
    ensure!(
        outs.iter().all(|out| out == &outs[0]),
        "the builds' {program} at {node} translate the bench's frame differently: {outs:02x?}"
    );
    // The median, not the mean: a run the kernel interrupts (a softirq at
    // the end of the timed section, a timer) takes many times longer.
    Ok((times.map(|t| median(&t)), outs[0].clone()))
}
