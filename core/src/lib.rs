//! CC App Server core: the wire v1 engine, its transports, the rollout stores that make every
//! thread durable, the kernel and tool traits, and the one Rust client every host goes through.

pub mod approval;
pub mod client;
pub mod engine;
pub mod graph;
pub mod kernel;
#[cfg(feature = "openai")]
pub mod openai;
pub mod protocol;
pub mod rollout;
pub mod scripted;
pub mod time;
pub mod workspace_tools;
