//! CC App Server core.
