//! The engine's counters: cheap atomics bumped on the hot paths, and a plain snapshot a host can
//! poll (the FFI exposes it) to see load, back-pressure and refusals without parsing logs.

use crate::protocol::ApprovalFailure;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters a host or test can read; they never go down. Gauges (connections open, turns
/// running, queue depths…) are read from the live structures by `AppServer::stats_snapshot`.
#[derive(Debug, Default)]
pub struct Stats {
    /// Responses from a host that matched no pending server request (late, duplicate, unknown).
    pub ignored_responses: AtomicU64,
    /// Connections closed because their host stopped reading.
    pub closed_slow_consumers: AtomicU64,
    /// Tools actually executed.
    pub tools_executed: AtomicU64,
    /// Connections opened since start.
    pub connections_opened: AtomicU64,
    /// Connections refused because `max_connections` were open (or a worker could not start).
    pub connections_refused: AtomicU64,
    /// turn/start refused with -32001 because running and queued turns were at their bounds.
    pub turns_refused_overloaded: AtomicU64,
    /// turn/interrupt refused with -32001 because the connection had too many waiting.
    pub interrupts_refused_overloaded: AtomicU64,
    /// Events the store could not write (disk full, I/O error) while a turn ran.
    pub recording_failures: AtomicU64,
    /// Turns that ended without their terminal event on disk (turn/completed sent with
    /// `recordingFailed`; recorded later when the store accepts writes again).
    pub unrecorded_terminals: AtomicU64,
    /// Threads unloaded to stay under `max_loaded_threads`.
    pub threads_unloaded: AtomicU64,
    /// Times a running turn waited because its in-flight bound was reached (events handed over
    /// and not yet delivered, `Limits::max_inflight_events` / `max_inflight_bytes`).
    pub pipeline_waits: AtomicU64,
    /// The most events one turn ever had in flight at once (never above the bound).
    pub inflight_high_water: AtomicU64,
    /// Turns a dead process left open, closed (`serverRestarted`) when their thread was first
    /// touched.
    pub dangling_turns_closed: AtomicU64,
    /// Approvals that failed closed, by reason (`ApprovalFailure` order).
    failed_closed: [AtomicU64; FAILURE_REASONS],
}

const FAILURE_REASONS: usize = 8;

fn failure_index(f: ApprovalFailure) -> usize {
    match f {
        ApprovalFailure::NoHandler => 0,
        ApprovalFailure::HandlerError => 1,
        ApprovalFailure::Timeout => 2,
        ApprovalFailure::Expired => 3,
        ApprovalFailure::BindingMismatch => 4,
        ApprovalFailure::NonceReused => 5,
        ApprovalFailure::UnknownDecision => 6,
        ApprovalFailure::TransportClosed => 7,
    }
}

/// Approvals that failed closed, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailedClosedCounts {
    pub no_handler: u64,
    pub handler_error: u64,
    pub timeout: u64,
    pub expired: u64,
    pub binding_mismatch: u64,
    pub nonce_reused: u64,
    pub unknown_decision: u64,
    pub transport_closed: u64,
}

impl FailedClosedCounts {
    pub fn total(&self) -> u64 {
        self.no_handler
            + self.handler_error
            + self.timeout
            + self.expired
            + self.binding_mismatch
            + self.nonce_reused
            + self.unknown_decision
            + self.transport_closed
    }
}

/// A point-in-time copy of every counter plus the queue depths summed over open connections.
/// Each field is read atomically on its own; the set is not one atomic cut (cheap by design).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub connections_opened: u64,
    pub connections_open: u64,
    pub connections_refused: u64,
    pub turns_running: u64,
    pub turns_queued: u64,
    pub turns_refused_overloaded: u64,
    pub runner_spawn_failures: u64,
    pub runner_threads: u64,
    pub interrupts_waiting: u64,
    pub interrupts_refused_overloaded: u64,
    /// Messages waiting in every open connection's inbound / outbound queue.
    pub inbound_queued: u64,
    pub outbound_queued: u64,
    pub closed_slow_consumers: u64,
    pub ignored_responses: u64,
    pub tools_executed: u64,
    pub recording_failures: u64,
    pub unrecorded_terminals: u64,
    pub threads_loaded: u64,
    pub threads_unloaded: u64,
    pub idempotency_entries: u64,
    pub used_nonces: u64,
    pub failed_closed: FailedClosedCounts,
    pub pipeline_waits: u64,
    pub inflight_high_water: u64,
    pub dangling_turns_closed: u64,
    /// The store: threads in its summary index, of which not summarised yet, with a loaded
    /// slot, with a cached tail, and the tail cache's bytes.
    pub store_indexed_threads: u64,
    pub store_unsummarised_threads: u64,
    pub store_loaded_threads: u64,
    pub tail_cache_threads: u64,
    pub tail_cache_bytes: u64,
}

impl Stats {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn failed_closed(&self, reason: ApprovalFailure) {
        Self::bump(&self.failed_closed[failure_index(reason)]);
    }

    /// Approvals that failed closed for `reason` so far.
    pub fn failed_closed_count(&self, reason: ApprovalFailure) -> u64 {
        self.failed_closed[failure_index(reason)].load(Ordering::Relaxed)
    }

    pub(crate) fn counters(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let f = |r| self.failed_closed_count(r);
        StatsSnapshot {
            connections_opened: get(&self.connections_opened),
            connections_refused: get(&self.connections_refused),
            turns_refused_overloaded: get(&self.turns_refused_overloaded),
            interrupts_refused_overloaded: get(&self.interrupts_refused_overloaded),
            closed_slow_consumers: get(&self.closed_slow_consumers),
            ignored_responses: get(&self.ignored_responses),
            tools_executed: get(&self.tools_executed),
            recording_failures: get(&self.recording_failures),
            unrecorded_terminals: get(&self.unrecorded_terminals),
            threads_unloaded: get(&self.threads_unloaded),
            pipeline_waits: get(&self.pipeline_waits),
            inflight_high_water: get(&self.inflight_high_water),
            dangling_turns_closed: get(&self.dangling_turns_closed),
            failed_closed: FailedClosedCounts {
                no_handler: f(ApprovalFailure::NoHandler),
                handler_error: f(ApprovalFailure::HandlerError),
                timeout: f(ApprovalFailure::Timeout),
                expired: f(ApprovalFailure::Expired),
                binding_mismatch: f(ApprovalFailure::BindingMismatch),
                nonce_reused: f(ApprovalFailure::NonceReused),
                unknown_decision: f(ApprovalFailure::UnknownDecision),
                transport_closed: f(ApprovalFailure::TransportClosed),
            },
            ..StatsSnapshot::default()
        }
    }
}
