//! Every program verifies with room to spare, and calls no subprogram on its fast path.
//!
//! The verifier walks each path through the NAT separately, and a small
//! change of how LLVM lays out one enum has more than doubled the
//! instructions it processes; at its limit of a million the agent would
//! not start. A program that grows past the budget fails here, naming its
//! count, before it fails on a node.
//!
//! LLVM turns a run of zero stores into a `memset`, which the BPF target
//! emits as a call to a byte loop of its own: a subprogram call per
//! packet, and its return through the CPU's return-thunk mitigation, that
//! cost the forwarding path about 5% of its rate.

use std::{process::Command, time::Instant};

use aya::{
    Ebpf,
    programs::{Program, ProgramError, ProgramInfo},
};
use isthmus_agent::kernel::dataplane::OBJECT;
use isthmus_common::names;
use isthmus_tests::require_root;

/// The verifier's limit of processed instructions per program.
const VERIFIER_LIMIT: u32 = 1_000_000;
/// What a program may use of it: the rest is for what comes next.
const BUDGET: u32 = VERIFIER_LIMIT / 2;

fn load(program: &mut Program) -> Result<(), ProgramError> {
    match program {
        Program::SchedClassifier(p) => p.load(),
        Program::Xdp(p) => p.load(),
        other => panic!("an unexpected program type: {:?}", other.prog_type()),
    }
}

/// Loads every program of the object, as the agent does: the object,
/// which holds them loaded, and each one's name and what the kernel says
/// of it.
fn loaded() -> (Ebpf, Vec<(&'static str, ProgramInfo)>) {
    let mut ebpf = Ebpf::load(OBJECT).expect("loading the eBPF object");
    let names = names::tc_programs().chain([names::PROG_GUARD]);
    let infos = names
        .map(|name| {
            let program = ebpf
                .program_mut(name)
                .unwrap_or_else(|| panic!("{name} is missing"));
            load(program).unwrap_or_else(|e| panic!("verifier rejected {name}: {e}"));
            (name, program.info().unwrap())
        })
        .collect();
    (ebpf, infos)
}

#[test]
fn every_program_verifies_within_half_the_limit() {
    require_root();
    let start = Instant::now();
    let (_ebpf, infos) = loaded();
    println!(
        "the object's programs loaded in {:.2} s",
        start.elapsed().as_secs_f64()
    );
    let counts: Vec<(&str, u32)> = infos
        .iter()
        .map(|(name, info)| {
            let count = info
                .verified_instruction_count()
                .unwrap_or_else(|| panic!("the kernel reports no verified count for {name}"));
            (*name, count)
        })
        .collect();
    println!("verified instructions: {counts:?}");
    let over: Vec<_> = counts.iter().filter(|(_, n)| *n > BUDGET).collect();
    assert!(
        over.is_empty(),
        "over the budget of {BUDGET} of the verifier's {VERIFIER_LIMIT}: {over:?}"
    );
}

/// Subprograms a program may call: each on a path few packets take, where
/// the call costs little and saves the verifier a walk of its branches in
/// every state that reaches it. A datagram's first fragment alone is
/// charged to its owner's budget.
const OFF_THE_FAST_PATH: [&str; 1] = ["take_fragment"];

#[test]
fn no_program_calls_a_subprogram_off_the_fast_path() {
    require_root();
    let mut calling = Vec::new();
    let (_ebpf, infos) = loaded();
    for (name, info) in infos {
        let id = info.id().to_string();
        let dump = Command::new("bpftool")
            .args(["prog", "dump", "xlated", "id", &id])
            .output()
            .expect("running bpftool, a prerequisite of the kernel tests");
        assert!(dump.status.success(), "bpftool could not dump {name}");
        // A helper call reads `call bpf_…`; a call of a subprogram,
        // `call pc+N#bpf_prog_<tag>_<name>`.
        let calls: Vec<String> = String::from_utf8_lossy(&dump.stdout)
            .lines()
            .filter(|line| line.contains("call pc"))
            .filter(|line| {
                !OFF_THE_FAST_PATH
                    .iter()
                    .any(|f| line.ends_with(&format!("_{f}")))
            })
            .map(|line| line.trim().to_owned())
            .collect();
        if !calls.is_empty() {
            calling.push((name, calls));
        }
    }
    assert!(
        calling.is_empty(),
        "programs call subprograms (a zeroed struct of a helper's arguments \
         becomes a memset: see ebpf/src/stack.rs): {calling:?}"
    );
}
