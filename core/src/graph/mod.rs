//! The Graph Kernel inside the server: everything of `cc_app_server_graph` (compiler, plan, state,
//! effects, store; docs/graph.md), plus what needs the engine:
//!
//! - `runtime`: the scheduler of one run (leases, fences, messages, scopes, budgets).
//! - `exec`: one attempt as an engine turn, through the approval gate, with effects recorded.
//! - `host`, `wire`: the server's graph runtime, its Rust API and the graph/* methods.

pub use cc_app_server_graph::*;

mod exec;
pub mod host;
pub(crate) mod runtime;
pub(crate) mod wire;

pub use host::{
    grant, CompileSlot, GraphError, GraphHandle, GraphHost, RunStats, StartRequest,
    MAX_CONCURRENT_COMPILES,
};
pub use wire::LARGE_COMPILE_ELEMENTS;
