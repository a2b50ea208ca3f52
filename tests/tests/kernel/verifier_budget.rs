//! Every program verifies with room to spare. The verifier walks each path
//! through the NAT separately, and a small change of how LLVM lays out one
//! enum has more than doubled the instructions it processes; at its limit
//! of a million the agent would not start. A program that grows past the
//! budget fails here, naming its count, before it fails on a node.

use aya::{
    Ebpf,
    programs::{Program, ProgramError},
};
use isthmus_agent::kernel::dataplane::OBJECT;
use isthmus_common::names;
use isthmus_tests::require_root;

/// The verifier's limit of processed instructions per program.
const VERIFIER_LIMIT: u32 = 1_000_000;
/// What a program may use of it: the rest is for what comes next.
const BUDGET: u32 = VERIFIER_LIMIT * 3 / 4;

fn load(program: &mut Program) -> Result<(), ProgramError> {
    match program {
        Program::SchedClassifier(p) => p.load(),
        Program::Xdp(p) => p.load(),
        other => panic!("an unexpected program type: {:?}", other.prog_type()),
    }
}

#[test]
fn every_program_verifies_within_three_quarters_of_the_limit() {
    require_root();
    let mut ebpf = Ebpf::load(OBJECT).expect("loading the eBPF object");
    let mut counts = Vec::new();
    for name in names::PROGRAMS
        .into_iter()
        .chain(names::ONWARD_PROGRAMS)
        .chain([names::PROG_GUARD])
    {
        let program = ebpf
            .program_mut(name)
            .unwrap_or_else(|| panic!("{name} is missing"));
        load(program).unwrap_or_else(|e| panic!("verifier rejected {name}: {e}"));
        let count = program
            .info()
            .unwrap()
            .verified_instruction_count()
            .unwrap_or_else(|| panic!("the kernel reports no verified count for {name}"));
        counts.push((name, count));
    }
    println!("verified instructions: {counts:?}");
    let over: Vec<_> = counts.iter().filter(|(_, n)| *n > BUDGET).collect();
    assert!(
        over.is_empty(),
        "over the budget of {BUDGET} of the verifier's {VERIFIER_LIMIT}: {over:?}"
    );
}
