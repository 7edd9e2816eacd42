//! CC App Server: the wire v1 engine (`engine`: bounded in-process connections, dispatch, turns,
//! approvals, the pipeline to the store), the Graph Kernel's host (`graph`), and the one Rust
//! client every host goes through (`client`). docs/architecture.md draws the layers.
//!
//! The layers below are crates of their own, re-exported here so a host writes `cc_app_server::…`
//! for all of them: `protocol` (the generated wire types) and `time`, `rollout` (the stores),
//! `kernel` with `approval`, `scripted`, `workspace_tools` and `openai` (kernels and tools), and
//! the pure half of `graph`. None of them may depend on this crate; cargo refuses the cycle.

pub use cc_app_server_kernel as kernel;
#[cfg(feature = "openai")]
pub use cc_app_server_kernel::openai;
pub use cc_app_server_kernel::{approval, scripted, workspace_tools};
pub use cc_app_server_protocol as protocol;
pub use cc_app_server_protocol::time;
pub use cc_app_server_rollout as rollout;

pub mod client;
pub mod engine;
pub mod graph;
