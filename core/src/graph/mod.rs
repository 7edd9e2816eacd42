//! The Graph Kernel: all of `cc_app_server_graph` (the compiler, plan, run state, effects, run
//! store, and the host that schedules runs and serves graph/*; docs/graph.md). The engine runs
//! each attempt's turn for it through `graph::port` (core/src/engine/attempt.rs).

pub use cc_app_server_graph::*;
