//! The Graph Kernel: typed graphs of agent, tool, join, loop and subgraph nodes, compiled before
//! anything runs, and run durably — every state change an event in the run's own hash-chained
//! log, the state a pure reduction of that log, attempts under leases and fencing tokens, node
//! outputs as messages delivered at least once and consumed once, every tool call an effect
//! with a receipt. docs/graph.md is the reference.
//!
//! - `compiler`, `plan`: the Graph IR (the schema's `GraphDefinition`) to an immutable plan.
//! - `state`: the reducer (log → state) and the wire projections.
//! - `runtime`: the scheduler of one run (leases, fences, messages, scopes, budgets).
//! - `exec`: one attempt as an engine turn, through the approval gate, with effects recorded.
//! - `effects`: idempotency keys, receipts, reconciliation.
//! - `store`: runs as logs of a second rollout store on `<state>/graph-runs/`.
//! - `host`, `wire`: the server's graph runtime, its Rust API and the graph/* methods.

pub mod clock;
pub mod compiler;
pub mod effects;
mod exec;
pub mod host;
pub mod plan;
pub(crate) mod runtime;
pub mod state;
pub mod store;
pub(crate) mod wire;

pub use clock::{ManualClock, RunClock};
pub use compiler::{compile, granted, CompileError, MAX_ERRORS};
pub use effects::{current_effect, EffectContext, EffectReconciler, Reconciliation};
pub use host::{
    grant, CompileSlot, GraphError, GraphHandle, GraphHost, RunStats, StartRequest,
    MAX_CONCURRENT_COMPILES,
};
pub use plan::Plan;
pub use state::RunState;
pub use wire::LARGE_COMPILE_ELEMENTS;
