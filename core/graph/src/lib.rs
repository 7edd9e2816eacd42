//! The Graph Kernel's pure half: typed graphs of agent, tool, join, loop and subgraph nodes,
//! compiled before anything runs (`compiler` → an immutable `plan`), the run state as a pure
//! reduction of the run's own hash-chained log (`state`), effects with idempotency keys and
//! receipts (`effects`), the run store on a second rollout store (`store`) and the run clock.
//! docs/graph.md is the reference.
//!
//! The host half runs them: the scheduler of one run (`runtime`: leases, fences, messages,
//! scopes, budgets), one attempt as a turn (`exec`, through the approval gate, effects recorded),
//! the server's graph runtime and its Rust API (`host`), and the graph/* methods (`wire`).
//!
//! It may use the protocol types, the rollout store and the kernel layer. What it needs of the
//! engine it runs in (run an attempt's turn, deliver a notification, the server's kernel and
//! thread store) is the `port` traits, which the engine implements: the engine depends on this
//! crate, never the reverse (cargo refuses the cycle).

use cc_app_server_kernel as kernel;
use cc_app_server_kernel::approval;
use cc_app_server_protocol as protocol;
use cc_app_server_protocol::time;
use cc_app_server_rollout as rollout;

pub mod clock;
pub mod compiler;
pub mod effects;
mod exec;
pub mod host;
pub mod plan;
pub mod port;
mod runtime;
pub mod state;
pub mod store;
mod threads;
pub mod wire;

pub use clock::{ManualClock, RunClock};
pub use compiler::{compile, granted, CompileError, MAX_ERRORS};
pub use effects::{current_effect, EffectContext, EffectReconciler, Reconciliation};
pub use host::{
    grant, CompileSlot, GraphError, GraphHandle, GraphHost, OpenedRuns, RunStats, StartRequest,
    MAX_CONCURRENT_COMPILES,
};
pub use plan::Plan;
pub use state::RunState;
pub use wire::LARGE_COMPILE_ELEMENTS;
