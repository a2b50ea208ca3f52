//! Present so the agent's build script can depend on this crate; the
//! programs themselves are in the `isthmus` binary target.
#![no_std]
