//! The Graph Kernel's pure half: typed graphs of agent, tool, join, loop and subgraph nodes,
//! compiled before anything runs (`compiler` → an immutable `plan`), the run state as a pure
//! reduction of the run's own hash-chained log (`state`), effects with idempotency keys and
//! receipts (`effects`), the run store on a second rollout store (`store`) and the run clock.
//! docs/graph.md is the reference.
//!
//! It may use the protocol types, the rollout store and the kernel layer's approval digests. It
//! never runs anything: scheduling runs, attempts as engine turns and the graph/* methods are the
//! engine's graph host (`cc_app_server::graph`), which depends on this crate, never the reverse.

use cc_app_server_kernel::approval;
use cc_app_server_protocol as protocol;
use cc_app_server_protocol::time;
use cc_app_server_rollout as rollout;

pub mod clock;
pub mod compiler;
pub mod effects;
pub mod plan;
pub mod state;
pub mod store;

pub use clock::{ManualClock, RunClock};
pub use compiler::{compile, granted, CompileError, MAX_ERRORS};
pub use effects::{current_effect, EffectContext, EffectReconciler, Reconciliation};
pub use plan::Plan;
pub use state::RunState;
