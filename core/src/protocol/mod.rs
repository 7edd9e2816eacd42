//! Wire v1 types for Rust hosts and the engine. Everything under `generated` comes from the
//! canonical schema; this module only re-exports it.

#[rustfmt::skip]
mod generated;

pub use generated::*;
