//! The kernel tier: the real eBPF programs on crafted packets
//! (`BPF_PROG_TEST_RUN`), checked byte for byte. Needs root; each test loads
//! its own copy of the object, so they run in parallel.

mod forwarding_node;
mod guard_test_run;
mod netfilter_rules;
mod overlay_ipv6;
mod overlay_test_run;
mod prog_test_run;
mod verifier_budget;
