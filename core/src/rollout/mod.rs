//! Rollout stores (being written).
