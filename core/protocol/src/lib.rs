//! The contract as Rust: the wire v1 types for hosts and every layer above (all of `generated`
//! comes from the canonical schema; `cc-agent-protocol generate` writes it), and `time`, the wire's
//! timestamp format. Depends on nothing of the project; may not grow logic beyond the types.

#[rustfmt::skip]
mod generated;

pub use generated::*;

pub mod time;
