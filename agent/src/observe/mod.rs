//! What operators read: Prometheus metrics and health, the kernel's counters,
//! and `isthmus-agent inspect`.

pub mod inspect;
pub mod metrics;
pub mod samples;
