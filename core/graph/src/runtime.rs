//! The scheduler of one run: it reads the run's state (the reduction of its log), decides what
//! happens next — leases that expired, bodies that completed, ready nodes to assign — and writes
//! each decision as a durable batch of events before acting on it. Attempts get a lease and a
//! fencing token from one monotonically increasing counter; anything an attempt reports is
//! checked against its node's current token under the same lock that appends, so a stale
//! attempt can never settle a node: its result is refused and the refusal recorded.

use super::clock::RunClock;
use super::effects::{self, EffectReconciler, Reconciliation};
use super::plan::{keys, value_fits, End, NodeSpec, Plan};
use super::port::{same_follower, Follower, GraphEngine, TurnCancel};
use super::state::{run_error, AttemptStatus, Custody, EffectStatus, RunState};
use super::threads::Threads;
use crate::protocol::{
    EventPayload, GraphAttemptFinishedEvent, GraphAttemptStartedEvent, GraphAttemptStatus,
    GraphEffectFailedEvent, GraphEffectIntendedEvent, GraphEffectReceipt,
    GraphEffectReconcileEvent, GraphEffectSucceededEvent, GraphEventNotification, GraphEventParams,
    GraphFencedAttempt, GraphLeaseExpiredEvent, GraphLeaseRenewedEvent, GraphMessageAckedEvent,
    GraphMessageSentEvent, GraphNodeUpdatedParams, GraphPortRef, GraphReceiptSource,
    GraphRunCancelledEvent, GraphRunCompletedEvent, GraphRunError, GraphRunResumedEvent,
    GraphRunStatus, GraphRunUpdatedParams, GraphScopeEnteredEvent, GraphScopeExitedEvent,
    GraphScopeReason, GraphStaleRefusedEvent, GraphStaleWhat, GraphUsage, ServerNotification,
    ToolCall, ToolResult,
};
pub(crate) use crate::rollout::sync::lock;
use crate::rollout::trace::{seq_ref, Trace};
use crate::rollout::{NewEvent, RolloutStore, StoreError, StoredEvent};
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};

/// Events one scheduling decision writes at most (well inside the store's 4096 per append).
const MAX_BATCH: usize = 1024;
/// Connections following one run (the starter and readers); more forget the oldest.
const MAX_FOLLOWERS: usize = 64;

fn payload_event(p: &EventPayload) -> NewEvent {
    let value = serde_json::to_value(p).expect("a graph event is JSON");
    // Debug builds (every test) prove each event the runtime writes is in the schema.
    #[cfg(debug_assertions)]
    if let Err(e) = cc_agent_protocol::validate_protocol_definition("EventPayload", &value) {
        panic!("the graph runtime built an event outside the schema: {e}\n{value}");
    }
    NewEvent::new(value)
}

/// Sets each event's trace and parent ids (docs/rollout-format.md, "Trace and parent ids"):
/// the run's trace id on every event; `graphRunStarted` names the run's header (seq 1, which
/// names the caller's span); an attempt's events name its `graphAttemptStarted`, every other
/// event `graphRunStarted`. The runtime is the only writer of the run's log, under the run's
/// lock, so the seqs this batch gets are the state's last + 1, + 2, ...
fn traced(core: &RunCore, mut events: Vec<NewEvent>) -> Vec<NewEvent> {
    let mut trace_id = core.state.trace_id.clone();
    let mut run_seq = core.state.run_started_seq;
    let mut attempts_here: HashMap<u64, u64> = HashMap::new();
    for (seq, e) in (core.state.last_seq + 1..).zip(events.iter_mut()) {
        let kind = e.payload.get("type").and_then(Value::as_str).unwrap_or("");
        let attempt = e.payload.get("attemptId").and_then(Value::as_u64);
        if kind == "graphRunStarted" {
            trace_id = core.start_trace.as_ref().map(|t| t.id.clone());
            run_seq = seq;
            e.parent_id = (seq > 1).then(|| seq_ref(seq - 1));
        } else {
            let of_attempt = attempt.and_then(|a| {
                attempts_here
                    .get(&a)
                    .copied()
                    .or_else(|| core.state.attempts.get(&a).map(|x| x.started_seq))
            });
            e.parent_id = of_attempt.or((run_seq > 0).then_some(run_seq)).map(seq_ref);
        }
        if kind == "graphAttemptStarted" {
            if let Some(a) = attempt {
                attempts_here.insert(a, seq);
            }
        }
        e.trace_id.clone_from(&trace_id);
        if trace_id.is_none() {
            e.parent_id = None;
        }
    }
    events
}

/// An attempt running in this process: what cancels it.
pub(crate) struct Live {
    /// Set when the attempt's fence went stale (expiry, cancellation, a failed run): the
    /// attempt's context then reports cancellation and its kernel stops.
    pub fenced: AtomicBool,
    pub turn: Mutex<Option<Arc<dyn TurnCancel>>>,
    pub started_ms: i64,
}

impl Live {
    pub fn fence(&self) {
        self.fenced.store(true, Ordering::SeqCst);
        if let Some(t) = lock(&self.turn).as_ref() {
            t.cancel();
        }
    }
}

/// Work handed to a worker thread: one attempt of an agent or tool node.
pub(crate) struct Job {
    pub attempt: u64,
    pub fence: u64,
    pub node: String,
    pub tmpl: usize,
    pub thread_id: String,
    /// Input values by port name.
    pub inputs: Map<String, Value>,
    pub live: Arc<Live>,
}

/// How an attempt ended, as its worker saw it.
pub(crate) enum Outcome {
    /// Output values by port.
    Succeeded {
        outputs: Vec<(usize, Value)>,
        tokens: u64,
    },
    Failed {
        error: GraphRunError,
        retryable: bool,
        tokens: u64,
    },
}

/// What `intend_effect` decided.
pub(crate) enum Intent {
    /// Recorded as intended: run the call.
    Proceed,
    /// An earlier attempt's receipt for the same key: use its result, run nothing.
    Reuse(ToolResult),
    /// This attempt no longer holds its node; refused and recorded.
    Stale,
    /// A budget is used up.
    Budget(GraphRunError),
}

pub(crate) struct RunCore {
    pub state: RunState,
    pub live: HashMap<u64, Arc<Live>>,
    jobs: VecDeque<Job>,
    workers: usize,
    idle: usize,
    /// The store refused a write: the run stops here and resumes at the next open.
    pub broken: Option<String>,
    /// Approvals of this run's node turns go to this connection.
    pub owner: Weak<dyn Follower>,
    followers: Vec<Weak<dyn Follower>>,
    /// Effects already asked of the reconciler since it last changed.
    reconcile_asked: HashSet<String>,
    /// Opened from a log by a new process: `graphRunResumed` comes first.
    pub resumed: bool,
    pub stopping: bool,
    scheduler: bool,
    /// Appends this process made to the run's log, and the events they carried.
    pub commits: u64,
    pub events_appended: u64,
    /// The trace of the request that starts the run, for its `graphRunStarted` (later events
    /// take the trace id from the state, which has it from the log).
    pub start_trace: Option<Trace>,
}

pub(crate) struct Run {
    pub id: String,
    pub core: Mutex<RunCore>,
    pub wake: Condvar,
    /// Signalled when the run ends (or stops recording), for those waiting for its end.
    pub done: Condvar,
    /// Threads waiting for the run's lock other than the scheduler: the scheduler lets them
    /// in between two decisions (the lock is not fair by itself).
    contenders: std::sync::atomic::AtomicUsize,
    pub engine: Weak<dyn GraphEngine>,
    execute: Execute,
    pub store: Arc<dyn RolloutStore>,
    pub clock: RunClock,
    pub reconciler: Mutex<Option<Arc<dyn EffectReconciler>>>,
    /// Registered with a manual clock so an advance wakes the scheduler.
    waker: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
}

/// Runs one attempt to its end (`exec::execute`; None: nothing to record, the server stops).
/// The scheduler is given it, so it knows nothing of how an attempt runs.
pub(crate) type Execute = fn(&Arc<Run>, &Job) -> Option<Outcome>;

impl Run {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: &str,
        state: RunState,
        engine: Weak<dyn GraphEngine>,
        execute: Execute,
        store: Arc<dyn RolloutStore>,
        clock: RunClock,
        reconciler: Option<Arc<dyn EffectReconciler>>,
        owner: Weak<dyn Follower>,
        resumed: bool,
    ) -> Arc<Run> {
        let run = Arc::new(Run {
            id: id.to_string(),
            core: Mutex::new(RunCore {
                state,
                live: HashMap::new(),
                jobs: VecDeque::new(),
                workers: 0,
                idle: 0,
                broken: None,
                owner: owner.clone(),
                followers: if owner.strong_count() > 0 {
                    vec![owner]
                } else {
                    Vec::new()
                },
                reconcile_asked: HashSet::new(),
                resumed,
                stopping: false,
                scheduler: false,
                commits: 0,
                events_appended: 0,
                start_trace: None,
            }),
            wake: Condvar::new(),
            done: Condvar::new(),
            contenders: std::sync::atomic::AtomicUsize::new(0),
            engine,
            execute,
            store,
            clock,
            reconciler: Mutex::new(reconciler),
            waker: Mutex::new(None),
        });
        let weak = Arc::downgrade(&run);
        let waker: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            if let Some(r) = weak.upgrade() {
                let _core = lock(&r.core);
                r.wake.notify_all();
            }
        });
        run.clock.on_advance(Arc::downgrade(&waker));
        *lock(&run.waker) = Some(waker);
        run
    }

    /// The run's lock, for everyone but its scheduler.
    pub fn enter(&self) -> MutexGuard<'_, RunCore> {
        self.contenders.fetch_add(1, Ordering::SeqCst);
        let guard = lock(&self.core);
        self.contenders.fetch_sub(1, Ordering::SeqCst);
        guard
    }

    /// Follows the run from `conn` (its node and run notifications go there too).
    pub fn follow(&self, conn: &Arc<dyn Follower>) {
        let mut core = self.enter();
        core.followers
            .retain(|w| w.upgrade().is_some_and(|c| c.is_open()));
        if core.followers.iter().any(|w| same_follower(w, conn)) {
            return;
        }
        if core.followers.len() >= MAX_FOLLOWERS {
            core.followers.remove(0);
        }
        core.followers.push(Arc::downgrade(conn));
    }

    /// Appends `payloads` as one durable batch, folds the stored events into the state and
    /// tells the followers. Nothing is announced that is not durable.
    pub fn commit(
        &self,
        core: &mut RunCore,
        payloads: Vec<EventPayload>,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        if payloads.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(why) = &core.broken {
            return Err(StoreError::InvalidArgument(format!(
                "the run stopped recording: {why}"
            )));
        }
        let events = traced(core, payloads.iter().map(payload_event).collect());
        let stored = match self.store.append(&self.id, events) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(target: "cc_app_server::graph", "run {}: an event could not be recorded ({e}); the run stops here and resumes when the server next opens", self.id);
                core.broken = Some(e.to_string());
                self.wake.notify_all();
                self.done.notify_all();
                return Err(e);
            }
        };
        core.commits += 1;
        core.events_appended += stored.len() as u64;
        let was_terminal = core.state.status.is_terminal();
        for e in &stored {
            core.state.apply(e);
        }
        let seq = stored.last().map_or(0, |e| e.seq);
        if !was_terminal && core.state.status.is_terminal() {
            // A finished run's log is archived at once (so the next open does not replay it),
            // under this same lock, so the archive event takes its place in the state.
            match self.store.set_archived(&self.id, true) {
                Ok(ev) => core.state.apply(&ev),
                Err(e) => {
                    tracing::warn!(target: "cc_app_server::graph", "run {}: could not mark the finished run archived: {e}", self.id)
                }
            }
        }
        self.notify(core, seq);
        self.wake.notify_all();
        if core.state.status.is_terminal() {
            self.done.notify_all();
        }
        Ok(stored)
    }

    fn notify(&self, core: &mut RunCore, seq: u64) {
        let (nodes, run_changed) = core.state.take_touched();
        core.followers
            .retain(|w| w.upgrade().is_some_and(|c| c.is_open()));
        if core.followers.is_empty() || seq == 0 {
            return;
        }
        let Some(engine) = self.engine.upgrade() else {
            return;
        };
        let mut texts = Vec::new();
        for key in nodes {
            if let Some(n) = core.state.nodes.get(&key) {
                let note = ServerNotification::GraphEvent(GraphEventNotification {
                    jsonrpc: "2.0".into(),
                    params: GraphEventParams::NodeUpdated(GraphNodeUpdatedParams {
                        run_id: self.id.clone(),
                        event_seq: seq,
                        node: core.state.node_state(n),
                        extra: Map::new(),
                    }),
                });
                texts.push(serde_json::to_string(&note).expect("a notification is JSON"));
            }
        }
        if run_changed {
            let note = ServerNotification::GraphEvent(GraphEventNotification {
                jsonrpc: "2.0".into(),
                params: GraphEventParams::RunUpdated(GraphRunUpdatedParams {
                    run_id: self.id.clone(),
                    event_seq: seq,
                    run: core.state.summary(false),
                    extra: Map::new(),
                }),
            });
            texts.push(serde_json::to_string(&note).expect("a notification is JSON"));
        }
        let conns: Vec<Arc<dyn Follower>> =
            core.followers.iter().filter_map(Weak::upgrade).collect();
        for text in texts {
            for c in &conns {
                engine.deliver(&**c, text.clone());
            }
        }
    }

    pub fn lease_ms(core: &RunCore) -> i64 {
        core.state
            .start
            .as_ref()
            .map_or(super::state::DEFAULT_LEASE_MS, |s| s.lease_ms) as i64
    }

    // ------------------------------------------------------------------ the scheduler

    /// Drives the run until it is terminal, the host stops, or the store refuses a write.
    /// True when the run ended (it may leave the host's live set).
    pub fn schedule(self: &Arc<Self>, threads: &Threads) -> bool {
        let mut core = lock(&self.core);
        loop {
            if core.stopping || core.broken.is_some() {
                break;
            }
            if core.state.status.is_terminal() {
                // Nothing may change a finished run; stragglers are refused when they report.
                break;
            }
            let now = self.clock.now_ms();
            match self.step(&mut core, now) {
                Step::Commit(payloads, jobs, fence) => {
                    if self.commit(&mut core, payloads).is_err() {
                        break;
                    }
                    for live in fence {
                        live.fence();
                    }
                    if !jobs.is_empty() {
                        self.dispatch(&mut core, jobs, threads);
                    }
                    // Let workers reporting results, readers and cancel in between decisions.
                    if self.contenders.load(Ordering::SeqCst) > 0 {
                        drop(core);
                        std::thread::yield_now();
                        core = lock(&self.core);
                    }
                }
                Step::Wait(deadline) => {
                    core = self.clock.wait(&self.wake, core, deadline);
                }
            }
        }
        core.scheduler = false;
        self.done.notify_all();
        let done = core.state.status.is_terminal();
        drop(core);
        done
    }

    pub fn claim_scheduler(core: &mut RunCore) -> bool {
        !std::mem::replace(&mut core.scheduler, true)
    }

    fn dispatch(self: &Arc<Self>, core: &mut RunCore, jobs: Vec<Job>, threads: &Threads) {
        let capacity: usize = core
            .state
            .start
            .as_ref()
            .map_or(1, |s| s.workers.iter().map(|w| w.1 as usize).sum());
        for job in jobs {
            core.live.insert(job.attempt, Arc::clone(&job.live));
            core.jobs.push_back(job);
        }
        // Enough threads for the queued work, at most twice the capacity (fenced attempts whose
        // kernels ignore cancellation may still hold a thread for a while).
        while core.idle < core.jobs.len() && core.workers < capacity * 2 {
            core.workers += 1;
            let run = Arc::clone(self);
            let spawned = threads.spawn(&format!("cc-graph-{}", self.id), move || run.work());
            if !spawned {
                core.workers -= 1;
                tracing::error!(target: "cc_app_server::graph", "run {}: could not start a worker thread; the queued attempts wait", self.id);
                break;
            }
        }
        self.wake.notify_all();
    }

    fn work(self: Arc<Self>) {
        loop {
            let job = {
                let mut core = self.enter();
                loop {
                    if let Some(job) = core.jobs.pop_front() {
                        break Some(job);
                    }
                    if core.stopping || core.state.status.is_terminal() || core.broken.is_some() {
                        break None;
                    }
                    // No timeout: a job, a stop, the end of the run and a broken store all
                    // notify `wake`, so an idle worker costs no wake-up.
                    core.idle += 1;
                    core = self.wake.wait(core).unwrap_or_else(|p| p.into_inner());
                    core.idle -= 1;
                }
            };
            let Some(job) = job else {
                self.enter().workers -= 1;
                return;
            };
            let attempt = job.attempt;
            let outcome = (self.execute)(&self, &job);
            let mut core = self.enter();
            core.live.remove(&attempt);
            if let Some(outcome) = outcome {
                if !core.stopping {
                    let _ = self.finish_attempt(&mut core, &job, outcome);
                }
            }
            self.wake.notify_all();
        }
    }

    /// One scheduling decision.
    fn step(&self, core: &mut RunCore, now: i64) -> Step {
        let Some(start) = &core.state.start else {
            return Step::commit(vec![completed(
                GraphRunStatus::Failed,
                Some(run_error(
                    "startNotRecorded",
                    "the server stopped before the run's start was recorded; start it again",
                    None,
                )),
                Vec::new(),
                Vec::new(),
            )]);
        };
        let (plan, started_at, workers) = (
            Arc::clone(&start.plan),
            start.started_at_ms,
            start.workers.clone(),
        );
        if core.resumed {
            core.resumed = false;
            let fenced = fenced_attempts(&core.state);
            return Step::commit(vec![EventPayload::GraphRunResumed(GraphRunResumedEvent {
                fenced,
                extra: Map::new(),
            })]);
        }
        // A run over its wall time, or with a node that failed for good, fails as a whole.
        if let Some(max) = plan.budgets.max_wall_time_ms {
            if now >= started_at + max as i64 {
                return self.fail_run(
                    core,
                    run_error(
                        "budgetExhausted",
                        format!("the run used its wall time ({max} ms)"),
                        None,
                    ),
                );
            }
        }
        if let Some(key) = &core.state.failed_node {
            let error = core.state.nodes[key]
                .error
                .clone()
                .unwrap_or_else(|| run_error("nodeFailed", "a node failed", Some(key)));
            return self.fail_run(core, error);
        }
        if let Some(step) = self.expiries(core, &plan, now) {
            return step;
        }
        // Effects whose attempt is gone from this process and which have no outcome.
        if let Some(step) = self.reconcile_step(core) {
            return step;
        }
        let st = &core.state;
        // Bodies that completed: exit (and maybe iterate), or complete the run.
        if let Some(scope) = st.complete_scopes().first() {
            if scope.key.is_empty() {
                return Step::commit(vec![completed(
                    GraphRunStatus::Succeeded,
                    None,
                    st.outputs.clone(),
                    Vec::new(),
                )]);
            }
            let mut b = Batch::new(st, &plan);
            b.exit_scope(&scope.key.clone());
            return Step::Commit(b.events, Vec::new(), Vec::new());
        }
        // Ready nodes, oldest first.
        let lease_ms = Self::lease_ms(core);
        let mut b = Batch::new(st, &plan);
        let mut busy: HashMap<String, u32> = HashMap::new();
        for a in st.running_attempts() {
            *busy.entry(a.worker.clone()).or_default() += 1;
        }
        let mut steps_used = st.usage.steps;
        let ready: Vec<String> = st.ready_nodes().map(|n| n.key.clone()).collect();
        for key in ready {
            if b.events.len() >= MAX_BATCH {
                break;
            }
            if st.blocked_by_effect(&key).is_some() {
                continue;
            }
            let t = &plan.nodes[st.nodes[&key].tmpl];
            let work = t.spec.is_work();
            if matches!(t.spec, NodeSpec::Loop { .. } | NodeSpec::Subgraph { .. }) {
                b.enter_scope(&key, 0);
                continue;
            }
            let worker = if work {
                match workers
                    .iter()
                    .find(|(id, cap)| busy.get(id).copied().unwrap_or(0) < *cap)
                {
                    Some((id, _)) => Some(id.clone()),
                    None => continue,
                }
            } else {
                None
            };
            if plan.budgets.max_steps.is_some_and(|m| steps_used >= m) {
                return self.fail_run(
                    core,
                    run_error(
                        "budgetExhausted",
                        "the run used all its steps (maxSteps)",
                        Some(&key),
                    ),
                );
            }
            steps_used += 1;
            match worker {
                None => b.join(&key, now),
                Some(worker) => {
                    *busy.entry(worker.clone()).or_default() += 1;
                    b.start_work(&key, &worker, now, lease_ms, &self.id);
                }
            }
        }
        if !b.events.is_empty() {
            return Step::Commit(b.events, b.jobs, Vec::new());
        }
        // Nothing to do: wait for a worker, a lease deadline or a wall-time budget.
        let mut deadline: Option<i64> = st.running_attempts().map(|a| a.lease_expires_at_ms).min();
        let mut sooner = |d: i64| deadline = Some(deadline.map_or(d, |x: i64| x.min(d)));
        if let Some(max) = plan.budgets.max_wall_time_ms {
            sooner(started_at + max as i64);
        }
        for a in st.running_attempts() {
            let t = &plan.nodes[st.nodes[&a.node].tmpl];
            if let (Some(max), Some(live)) = (t.budgets.max_wall_time_ms, core.live.get(&a.id)) {
                sooner(live.started_ms + max as i64);
            }
        }
        Step::Wait(deadline)
    }

    /// Leases that ran out, and attempts over their node's wall time.
    fn expiries(&self, core: &RunCore, plan: &Plan, now: i64) -> Option<Step> {
        let st = &core.state;
        let mut batch = Vec::new();
        let mut fence = Vec::new();
        for a in st.running_attempts() {
            let live = core.live.get(&a.id).cloned();
            if a.lease_expires_at_ms <= now {
                batch.push(EventPayload::GraphLeaseExpired(GraphLeaseExpiredEvent {
                    attempt_id: a.id,
                    fence: a.fence,
                    node: a.node.clone(),
                    at_ms: now.max(0) as u64,
                    extra: Map::new(),
                }));
                fence.extend(live);
                continue;
            }
            let t = &plan.nodes[st.nodes[&a.node].tmpl];
            if let (Some(max), Some(live)) = (t.budgets.max_wall_time_ms, &live) {
                if now >= live.started_ms + max as i64 {
                    batch.push(finished_failed(
                        a.id,
                        a.fence,
                        &a.node,
                        run_error(
                            "budgetExhausted",
                            format!(
                                "the attempt ran longer than the node's maxWallTimeMs ({max} ms)"
                            ),
                            Some(&a.node),
                        ),
                        false,
                        0,
                    ));
                    fence.push(Arc::clone(live));
                }
            }
        }
        (!batch.is_empty()).then(|| Step::Commit(batch, Vec::new(), fence))
    }

    /// Fails the run: one terminal event fencing every running attempt.
    fn fail_run(&self, core: &RunCore, error: GraphRunError) -> Step {
        let fenced = fenced_attempts(&core.state);
        let live = fenced
            .iter()
            .filter_map(|f| core.live.get(&f.attempt_id).cloned())
            .collect();
        Step::Commit(
            vec![completed(
                GraphRunStatus::Failed,
                Some(error),
                Vec::new(),
                fenced,
            )],
            Vec::new(),
            live,
        )
    }

    /// Cancels the run: every outstanding attempt is fenced in the same durable batch as the
    /// terminal event, then their kernels are told to stop.
    pub fn cancel(&self, reason: Option<String>) -> Result<Vec<GraphFencedAttempt>, StoreError> {
        let mut core = self.enter();
        if core.state.status.is_terminal() {
            return Ok(Vec::new());
        }
        let fenced = fenced_attempts(&core.state);
        let live: Vec<Arc<Live>> = fenced
            .iter()
            .filter_map(|f| core.live.get(&f.attempt_id).cloned())
            .collect();
        self.commit(
            &mut core,
            vec![
                EventPayload::GraphRunCancelled(GraphRunCancelledEvent {
                    reason: reason.clone(),
                    fenced: fenced.clone(),
                    extra: Map::new(),
                }),
                completed(
                    GraphRunStatus::Cancelled,
                    Some(run_error(
                        "cancelled",
                        reason.unwrap_or_else(|| "the run was cancelled".into()),
                        None,
                    )),
                    Vec::new(),
                    Vec::new(),
                ),
            ],
        )?;
        drop(core);
        for l in live {
            l.fence();
        }
        Ok(fenced)
    }

    // ------------------------------------------------------------------ reports from attempts

    /// Records what an attempt reported, if it still holds its node; otherwise refuses it and
    /// records the refusal.
    pub fn finish_attempt(
        &self,
        core: &mut RunCore,
        job: &Job,
        outcome: Outcome,
    ) -> Result<(), StoreError> {
        let st = &core.state;
        if !st.is_current(job.attempt, job.fence) {
            let p = self.stale(
                st,
                job.attempt,
                job.fence,
                &job.node,
                GraphStaleWhat::Result,
            );
            return self.commit(core, vec![p]).map(|_| ());
        }
        let plan = Arc::clone(st.plan().expect("running"));
        let mut b = Batch::new(st, &plan);
        match outcome {
            Outcome::Succeeded { outputs, tokens } => {
                b.succeed(&job.node, job.attempt, job.fence, outputs, tokens)
            }
            Outcome::Failed {
                error,
                retryable,
                tokens,
            } => b.events.push(finished_failed(
                job.attempt,
                job.fence,
                &job.node,
                error,
                retryable,
                tokens,
            )),
        }
        let events = b.events;
        self.commit(core, events).map(|_| ())
    }

    fn stale(
        &self,
        st: &RunState,
        attempt: u64,
        fence: u64,
        node: &str,
        what: GraphStaleWhat,
    ) -> EventPayload {
        let current = st.nodes.get(node).and_then(|n| n.fence);
        let reason = if st.status.is_terminal() {
            "the run is over"
        } else if st
            .attempts
            .get(&attempt)
            .is_some_and(|a| a.status == AttemptStatus::Expired)
        {
            "the attempt's lease expired"
        } else if current.is_some_and(|c| c != fence) {
            "a newer attempt holds the node"
        } else {
            "the attempt was fenced"
        };
        EventPayload::GraphStaleRefused(GraphStaleRefusedEvent {
            attempt_id: attempt,
            fence,
            node: node.to_string(),
            current_fence: current,
            what,
            reason: reason.into(),
            extra: Map::new(),
        })
    }

    /// Moves an attempt's lease forward; false (refused and recorded) if it is stale.
    pub fn renew(&self, attempt: u64, fence: u64, node: &str) -> bool {
        let mut core = self.enter();
        if !core.state.is_current(attempt, fence) {
            let p = self.stale(&core.state, attempt, fence, node, GraphStaleWhat::Renewal);
            let _ = self.commit(&mut core, vec![p]);
            return false;
        }
        let lease = self.clock.now_ms() + Self::lease_ms(&core);
        self.commit(
            &mut core,
            vec![EventPayload::GraphLeaseRenewed(GraphLeaseRenewedEvent {
                attempt_id: attempt,
                fence,
                lease_expires_at_ms: lease.max(0) as u64,
                extra: Map::new(),
            })],
        )
        .is_ok()
    }

    /// Records an effect as intended (durably) before its call goes to the gate — unless the
    /// attempt is stale, a budget is used up, or the key already has an outcome to reuse.
    #[allow(clippy::too_many_arguments)]
    pub fn intend_effect(
        &self,
        attempt: u64,
        fence: u64,
        node: &str,
        key: &str,
        call: &ToolCall,
        operation_digest: &str,
        evidence: (&str, &str, &str),
    ) -> Intent {
        let mut core = self.enter();
        let st = &core.state;
        if !st.is_current(attempt, fence) {
            let p = self.stale(st, attempt, fence, node, GraphStaleWhat::Effect);
            let _ = self.commit(&mut core, vec![p]);
            return Intent::Stale;
        }
        match st.effects.get(key) {
            Some(e)
                if e.status == EffectStatus::Succeeded
                    || (e.status == EffectStatus::Failed && e.applied != Some(false)) =>
            {
                if let Some(result) = e.receipt.as_ref().and_then(|r| r.result.clone()) {
                    return Intent::Reuse(result);
                }
            }
            Some(e) if matches!(e.status, EffectStatus::Intended | EffectStatus::Reconcile) => {
                // Only this attempt can have it in flight (its node was not scheduled while an
                // effect was unsettled); the same key twice in one attempt is a bug.
                return Intent::Budget(run_error(
                    "effectInFlight",
                    format!("effect {key} is already in flight"),
                    Some(node),
                ));
            }
            _ => {}
        }
        let plan = Arc::clone(st.plan().expect("running"));
        let n = &st.nodes[node];
        if plan
            .budgets
            .max_effects
            .is_some_and(|m| st.usage.effects >= m)
        {
            return Intent::Budget(run_error(
                "budgetExhausted",
                "the run used all its effects (maxEffects)",
                Some(node),
            ));
        }
        if plan.nodes[n.tmpl]
            .budgets
            .max_effects
            .is_some_and(|m| n.effects >= m)
        {
            return Intent::Budget(run_error(
                "budgetExhausted",
                "the node used all its effects (maxEffects)",
                Some(node),
            ));
        }
        let p = EventPayload::GraphEffectIntended(GraphEffectIntendedEvent {
            attempt_id: attempt,
            fence,
            idempotency_key: key.to_string(),
            node: node.to_string(),
            call: call.clone(),
            operation_digest: operation_digest.to_string(),
            thread_id: evidence.0.to_string(),
            turn_id: evidence.1.to_string(),
            item_id: evidence.2.to_string(),
            extra: Map::new(),
        });
        match self.commit(&mut core, vec![p]) {
            Ok(_) => Intent::Proceed,
            Err(_) => Intent::Stale,
        }
    }

    /// Records an effect's outcome. Outcomes are facts about the world and are recorded whatever
    /// the attempt's fence; the answer says whether the attempt still holds its node.
    pub fn settle_effect(&self, attempt: u64, fence: u64, outcome: EventPayload) -> bool {
        let mut core = self.enter();
        let _ = self.commit(&mut core, vec![outcome]);
        core.state.is_current(attempt, fence)
    }

    /// Marks an effect as needing reconciliation (its outcome could not be learnt).
    pub fn effect_unknown(&self, key: &str, node: &str, reason: &str) {
        let mut core = self.enter();
        let _ = self.commit(
            &mut core,
            vec![EventPayload::GraphEffectReconcile(
                GraphEffectReconcileEvent {
                    idempotency_key: key.to_string(),
                    node: node.to_string(),
                    reason: reason.to_string(),
                    extra: Map::new(),
                },
            )],
        );
    }

    /// An intended effect whose attempt is gone from this process has no outcome: find it in
    /// the attempt thread's rollout, else ask the reconciler, else surface it (reconcile).
    fn reconcile_step(&self, core: &mut RunCore) -> Option<Step> {
        let st = &core.state;
        let pending: Vec<&super::state::EffectInst> = st
            .effect_order
            .iter()
            .filter_map(|k| st.effects.get(k))
            .filter(|e| match e.status {
                EffectStatus::Intended => !core.live.contains_key(&e.attempt),
                EffectStatus::Reconcile => !core.reconcile_asked.contains(&e.key),
                _ => false,
            })
            .collect();
        let e = pending.first()?;
        let (key, node, status) = (e.key.clone(), e.node.clone(), e.status);
        let (attempt, fence) = (e.attempt, e.fence);
        let evidence = (e.thread_id.clone(), e.turn_id.clone(), e.item_id.clone());
        let (op, call) = (e.operation_digest.clone(), e.call.clone());
        core.reconcile_asked.insert(key.clone());
        let from_rollout = self
            .engine
            .upgrade()
            .and_then(|engine| engine.recorded_tool_result(&evidence.0, &evidence.2));
        let ev = (
            evidence.0.as_str(),
            evidence.1.as_str(),
            evidence.2.as_str(),
        );
        let outcome = if let Some(result) = from_rollout {
            Some(outcome_event(
                &key,
                attempt,
                fence,
                &op,
                &result,
                GraphReceiptSource::Rollout,
                Some(ev),
            ))
        } else {
            let reconciler = lock(&self.reconciler).clone();
            match reconciler.map(|r| r.reconcile(&self.id, &key, &call)) {
                Some(Reconciliation::Applied(result)) => Some(outcome_event(
                    &key,
                    attempt,
                    fence,
                    &op,
                    &result,
                    GraphReceiptSource::Executor,
                    Some(ev),
                )),
                Some(Reconciliation::NotApplied) => {
                    Some(EventPayload::GraphEffectFailed(GraphEffectFailedEvent {
                        attempt_id: attempt,
                        fence,
                        idempotency_key: key.clone(),
                        applied: false,
                        receipt: None,
                        error: run_error(
                            "effectNotApplied",
                            "the tool executor reports the call never happened; it may run again",
                            Some(&node),
                        ),
                        extra: Map::new(),
                    }))
                }
                _ => None,
            }
        };
        Some(match (outcome, status) {
            (Some(p), _) => Step::commit(vec![p]),
            (None, EffectStatus::Intended) => Step::commit(vec![EventPayload::GraphEffectReconcile(GraphEffectReconcileEvent {
                idempotency_key: key,
                node,
                reason: "intended, no outcome recorded, and nothing could tell whether it happened; the tool executor or the host must decide".into(),
                extra: Map::new(),
            })]),
            (None, _) => Step::Commit(Vec::new(), Vec::new(), Vec::new()),
        })
    }

    /// A new reconciler (or a host decision) may settle effects that were left in reconcile.
    pub fn reconciler_changed(&self) {
        let mut core = self.enter();
        core.reconcile_asked.clear();
        self.wake.notify_all();
    }

    /// The host's decision on an effect in reconcile.
    pub fn resolve_effect(&self, key: &str, applied: Option<ToolResult>) -> Result<(), String> {
        let mut core = self.enter();
        let Some(e) = core.state.effects.get(key) else {
            return Err(format!("run {} has no effect {key}", self.id));
        };
        if !matches!(e.status, EffectStatus::Reconcile | EffectStatus::Intended)
            || core.live.contains_key(&e.attempt)
        {
            return Err(format!("effect {key} is not waiting for a decision"));
        }
        let p = match &applied {
            Some(result) => outcome_event(
                key,
                e.attempt,
                e.fence,
                &e.operation_digest,
                result,
                GraphReceiptSource::Host,
                None,
            ),
            None => EventPayload::GraphEffectFailed(GraphEffectFailedEvent {
                attempt_id: e.attempt,
                fence: e.fence,
                idempotency_key: key.to_string(),
                applied: false,
                receipt: None,
                error: run_error(
                    "effectNotApplied",
                    "the host reports the call never happened; it may run again",
                    Some(&e.node),
                ),
                extra: Map::new(),
            }),
        };
        self.commit(&mut core, vec![p])
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Redelivers a message (at least once): a message already consumed is acknowledged as a
    /// duplicate and not processed again; one still in the run's custody is simply delivered to
    /// its node's next attempt.
    pub fn redeliver(&self, message_id: &str) -> Result<bool, String> {
        let mut core = self.enter();
        let Some(m) = core.state.messages.get(message_id) else {
            return Err(format!("run {} has no message {message_id}", self.id));
        };
        if m.custody != Custody::Acked {
            return Ok(false);
        }
        let consumer = m.acked_by.clone().unwrap_or_default();
        let p = EventPayload::GraphMessageAcked(GraphMessageAckedEvent {
            message_id: message_id.to_string(),
            consumer,
            attempt_id: None,
            duplicate: true,
            extra: Map::new(),
        });
        self.commit(&mut core, vec![p])
            .map(|_| true)
            .map_err(|e| e.to_string())
    }
}

/// The receipt event for a tool result.
pub(crate) fn outcome_event(
    key: &str,
    attempt: u64,
    fence: u64,
    operation_digest: &str,
    result: &ToolResult,
    source: GraphReceiptSource,
    evidence: Option<(&str, &str, &str)>,
) -> EventPayload {
    let receipt: GraphEffectReceipt =
        effects::receipt(key, operation_digest, result, source, evidence);
    match result {
        ToolResult::Ok(_) => EventPayload::GraphEffectSucceeded(GraphEffectSucceededEvent {
            attempt_id: attempt,
            fence,
            idempotency_key: key.to_string(),
            receipt,
            extra: Map::new(),
        }),
        ToolResult::Error(e) => EventPayload::GraphEffectFailed(GraphEffectFailedEvent {
            attempt_id: attempt,
            fence,
            idempotency_key: key.to_string(),
            applied: true,
            receipt: Some(receipt),
            error: run_error(
                "toolFailed",
                e.message.chars().take(1000).collect::<String>(),
                None,
            ),
            extra: Map::new(),
        }),
        ToolResult::Denied(d) => EventPayload::GraphEffectFailed(GraphEffectFailedEvent {
            attempt_id: attempt,
            fence,
            idempotency_key: key.to_string(),
            applied: false,
            receipt: Some(receipt),
            error: run_error(
                "toolDenied",
                d.reason.chars().take(1000).collect::<String>(),
                None,
            ),
            extra: Map::new(),
        }),
    }
}

fn fenced_attempts(st: &RunState) -> Vec<GraphFencedAttempt> {
    st.running_attempts()
        .map(|a| GraphFencedAttempt {
            attempt_id: a.id,
            node: a.node.clone(),
            fence: a.fence,
        })
        .collect()
}

fn completed(
    status: GraphRunStatus,
    error: Option<GraphRunError>,
    outputs: Vec<String>,
    fenced: Vec<GraphFencedAttempt>,
) -> EventPayload {
    EventPayload::GraphRunCompleted(GraphRunCompletedEvent {
        status,
        error,
        outputs,
        fenced,
        extra: Map::new(),
    })
}

fn usage(tokens: u64) -> Option<GraphUsage> {
    Some(GraphUsage {
        steps: 1,
        effects: 0,
        tokens,
        extra: Map::new(),
    })
}

fn finished_failed(
    attempt: u64,
    fence: u64,
    node: &str,
    error: GraphRunError,
    retryable: bool,
    tokens: u64,
) -> EventPayload {
    EventPayload::GraphAttemptFinished(GraphAttemptFinishedEvent {
        attempt_id: attempt,
        fence,
        node: node.to_string(),
        status: GraphAttemptStatus::Failed,
        retryable,
        error: Some(error),
        usage: usage(tokens),
        extra: Map::new(),
    })
}

enum Step {
    /// Append these events; then hand these jobs to workers and fence these live attempts.
    Commit(Vec<EventPayload>, Vec<Job>, Vec<Arc<Live>>),
    /// Nothing to do until woken or until this clock time.
    Wait(Option<i64>),
}

impl Step {
    fn commit(events: Vec<EventPayload>) -> Step {
        Step::Commit(events, Vec::new(), Vec::new())
    }
}

/// Builds one decision's events, allocating message ids, attempt ids, fences and channel
/// sequence numbers from the state so they stay deterministic functions of the log.
struct Batch<'a> {
    st: &'a RunState,
    plan: &'a Plan,
    events: Vec<EventPayload>,
    next_msg: u64,
    next_attempt: u64,
    next_fence: u64,
    channels: HashMap<String, u64>,
    jobs: Vec<Job>,
}

impl<'a> Batch<'a> {
    fn new(st: &'a RunState, plan: &'a Plan) -> Self {
        Batch {
            st,
            plan,
            events: Vec::new(),
            next_msg: st.message_order.len() as u64 + 1,
            next_attempt: st.max_attempt + 1,
            next_fence: st.max_fence + 1,
            channels: HashMap::new(),
            jobs: Vec::new(),
        }
    }

    fn send(
        &mut self,
        from: GraphPortRef,
        to: GraphPortRef,
        channel: String,
        causes: Vec<String>,
        value: Value,
    ) -> String {
        let id = format!("m{}", self.next_msg);
        self.next_msg += 1;
        let seq = match self.channels.get(&channel) {
            Some(s) => s + 1,
            None => self.st.channel_sent(&channel) + 1,
        };
        self.channels.insert(channel.clone(), seq);
        self.events
            .push(EventPayload::GraphMessageSent(GraphMessageSentEvent {
                message_id: id.clone(),
                from,
                to,
                channel,
                channel_seq: seq,
                causes,
                value_digest: crate::approval::digest_json(&value),
                value,
                extra: Map::new(),
            }));
        id
    }

    fn ack(&mut self, message: &str, consumer: &str, attempt: Option<u64>) {
        self.events
            .push(EventPayload::GraphMessageAcked(GraphMessageAckedEvent {
                message_id: message.to_string(),
                consumer: consumer.to_string(),
                attempt_id: attempt,
                duplicate: false,
                extra: Map::new(),
            }));
    }

    /// Where an edge of template scope `tmpl_scope` ends, inside body instance `scope`.
    fn target(&self, scope: &str, tmpl_scope: usize, end: End) -> GraphPortRef {
        let s = &self.plan.scopes[tmpl_scope];
        match end {
            End::Node(m, p) => GraphPortRef {
                node: Some(keys::node(scope, &self.plan.nodes[m].id)),
                port: self.plan.nodes[m].inputs[p].name.clone(),
            },
            End::Boundary(b) => GraphPortRef {
                node: (!scope.is_empty()).then(|| scope.to_string()),
                port: s.outputs[b].name.clone(),
            },
        }
    }

    fn channel(scope: &str, edge: usize) -> String {
        let container = keys::split_scope(scope).map_or("", |(c, _)| c);
        format!("{container}:e{edge}")
    }

    /// Sends output `port` of node instance `key` (template `n`) along its edges.
    fn route_output(&mut self, key: &str, n: usize, port: usize, value: &Value, causes: &[String]) {
        let t = &self.plan.nodes[n];
        let scope = keys::parent(key).to_string();
        for &e in &t.feeds[port] {
            let to = self.target(&scope, t.scope, self.plan.scopes[t.scope].edges[e].to);
            let from = GraphPortRef {
                node: Some(key.to_string()),
                port: t.outputs[port].name.clone(),
            };
            self.send(
                from,
                to,
                Self::channel(&scope, e),
                causes.to_vec(),
                value.clone(),
            );
        }
    }

    /// Sends boundary input `port` of body instance `scope` (template `s`) to its consumers.
    fn route_boundary_input(
        &mut self,
        scope: &str,
        s: usize,
        port: usize,
        value: &Value,
        causes: &[String],
    ) {
        for &e in &self.plan.scopes[s].input_feeds[port] {
            let to = self.target(scope, s, self.plan.scopes[s].edges[e].to);
            let from = GraphPortRef {
                node: (!scope.is_empty()).then(|| scope.to_string()),
                port: self.plan.scopes[s].inputs[port].name.clone(),
            };
            self.send(
                from,
                to,
                Self::channel(scope, e),
                causes.to_vec(),
                value.clone(),
            );
        }
    }

    /// The run's own inputs, sent right after `graphRunStarted`.
    fn run_inputs(&mut self, inputs: &Map<String, Value>) {
        for (b, port) in self.plan.root().inputs.iter().enumerate() {
            let value = inputs.get(&port.name).cloned().unwrap_or(Value::Null);
            self.route_boundary_input("", 0, b, &value, &[]);
        }
    }

    fn input_values(&self, key: &str) -> Vec<(String, Value)> {
        let n = &self.st.nodes[key];
        let t = &self.plan.nodes[n.tmpl];
        n.inputs
            .iter()
            .enumerate()
            .map(|(j, m)| {
                let v = m
                    .as_ref()
                    .and_then(|m| self.st.messages.get(m))
                    .map_or(Value::Null, |m| m.value.clone());
                (t.inputs[j].name.clone(), v)
            })
            .collect()
    }

    fn custody(&self, key: &str) -> Vec<String> {
        self.st.nodes[key]
            .inputs
            .iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// A join: started, consumed and finished in one batch (it has no side effect).
    fn join(&mut self, key: &str, now: i64) {
        let (attempt, fence) = (self.next_attempt, self.next_fence);
        self.next_attempt += 1;
        self.next_fence += 1;
        let custody = self.custody(key);
        self.events.push(EventPayload::GraphAttemptStarted(
            GraphAttemptStartedEvent {
                attempt_id: attempt,
                fence,
                node: key.to_string(),
                worker: "scheduler".into(),
                lease_expires_at_ms: now.max(0) as u64,
                custody: custody.clone(),
                thread_id: None,
                extra: Map::new(),
            },
        ));
        let n = self.st.nodes[key].tmpl;
        let inputs = self.input_values(key);
        let value = match self.plan.nodes[n].outputs[0].ty {
            crate::protocol::GraphPortType::Array => {
                Value::Array(inputs.into_iter().map(|(_, v)| v).collect())
            }
            _ => Value::Object(inputs.into_iter().collect()),
        };
        if !super::plan::within_depth(&value, super::plan::MAX_VALUE_DEPTH) {
            self.events.push(finished_failed(
                attempt,
                fence,
                key,
                run_error("outputTooDeep", format!("the join's output would nest more than {} levels (each join wraps its inputs once more); flatten the chain", super::plan::MAX_VALUE_DEPTH), Some(key)),
                false,
                0,
            ));
            return;
        }
        self.succeed(key, attempt, fence, vec![(0, value)], 0);
    }

    /// A successful attempt: its inputs acked, the attempt finished, its outputs sent.
    fn succeed(
        &mut self,
        key: &str,
        attempt: u64,
        fence: u64,
        outputs: Vec<(usize, Value)>,
        tokens: u64,
    ) {
        let custody = self
            .st
            .attempts
            .get(&attempt)
            .map(|a| a.custody.clone())
            .unwrap_or_else(|| self.custody(key));
        for m in &custody {
            self.ack(m, key, Some(attempt));
        }
        self.events.push(EventPayload::GraphAttemptFinished(
            GraphAttemptFinishedEvent {
                attempt_id: attempt,
                fence,
                node: key.to_string(),
                status: GraphAttemptStatus::Succeeded,
                retryable: false,
                error: None,
                usage: usage(tokens),
                extra: Map::new(),
            },
        ));
        let n = self.st.nodes[key].tmpl;
        for (port, value) in outputs {
            self.route_output(key, n, port, &value, &custody);
        }
    }

    /// An agent or tool attempt: a new fence, a lease, and a job for a worker.
    fn start_work(&mut self, key: &str, worker: &str, now: i64, lease_ms: i64, run_id: &str) {
        let (attempt, fence) = (self.next_attempt, self.next_fence);
        self.next_attempt += 1;
        self.next_fence += 1;
        let custody = self.custody(key);
        let thread_id = format!("graph-{run_id}-a{attempt}");
        self.events.push(EventPayload::GraphAttemptStarted(
            GraphAttemptStartedEvent {
                attempt_id: attempt,
                fence,
                node: key.to_string(),
                worker: worker.to_string(),
                lease_expires_at_ms: (now + lease_ms).max(0) as u64,
                custody,
                thread_id: Some(thread_id.clone()),
                extra: Map::new(),
            },
        ));
        self.jobs.push(Job {
            attempt,
            fence,
            node: key.to_string(),
            tmpl: self.st.nodes[key].tmpl,
            thread_id,
            inputs: self.input_values(key).into_iter().collect(),
            live: Arc::new(Live {
                fenced: AtomicBool::new(false),
                turn: Mutex::new(None),
                started_ms: now,
            }),
        });
    }

    /// A container's body, iteration `iteration`: its inputs consumed (first iteration), the
    /// body instance opened, the values relayed in.
    fn enter_scope(&mut self, container: &str, iteration: u32) {
        let n = self.st.nodes[container].tmpl;
        let body = self.plan.nodes[n].spec.body().expect("a container");
        let scope = keys::scope(container, iteration);
        let inputs: Vec<(String, Value, String)> = self.st.nodes[container]
            .inputs
            .iter()
            .flatten()
            .filter_map(|m| self.st.messages.get(m))
            .map(|m| (m.to.port.clone(), m.value.clone(), m.id.clone()))
            .collect();
        if iteration == 0 {
            for (_, _, m) in &inputs {
                self.ack(m, container, None);
            }
        }
        self.events
            .push(EventPayload::GraphScopeEntered(GraphScopeEnteredEvent {
                node: container.to_string(),
                scope: scope.clone(),
                iteration: iteration as u64,
                extra: Map::new(),
            }));
        for (b, port) in self.plan.scopes[body].inputs.iter().enumerate() {
            if let Some((_, v, m)) = inputs.iter().find(|(p, _, _)| p == &port.name) {
                self.route_boundary_input(&scope, body, b, v, std::slice::from_ref(m));
            }
        }
    }

    /// A body instance that completed: a subgraph or a loop that stops sends its outputs on; a
    /// loop that continues opens its next iteration with the values carried over.
    fn exit_scope(&mut self, scope: &str) {
        let s = &self.st.scopes[scope];
        let container = s.node.clone();
        let (iteration, tmpl_scope) = (s.iteration, s.tmpl);
        let outputs: Vec<(String, Value, String)> = s
            .outputs
            .iter()
            .flatten()
            .filter_map(|m| self.st.messages.get(m))
            .map(|m| (m.to.port.clone(), m.value.clone(), m.id.clone()))
            .collect();
        for (_, _, m) in &outputs {
            self.ack(m, scope, None);
        }
        let n = self.st.nodes[&container].tmpl;
        let reason = match &self.plan.nodes[n].spec {
            NodeSpec::Loop {
                max_iterations,
                until,
                ..
            } => {
                let stop = until.is_some_and(|u| {
                    let name = &self.plan.nodes[n].outputs[u].name;
                    outputs
                        .iter()
                        .any(|(p, v, _)| p == name && v == &Value::Bool(true))
                });
                if stop {
                    GraphScopeReason::Until
                } else if iteration + 1 >= *max_iterations {
                    GraphScopeReason::MaxIterations
                } else {
                    GraphScopeReason::Continue
                }
            }
            _ => GraphScopeReason::Completed,
        };
        self.events
            .push(EventPayload::GraphScopeExited(GraphScopeExitedEvent {
                node: container.clone(),
                scope: scope.to_string(),
                iteration: iteration as u64,
                reason,
                extra: Map::new(),
            }));
        if reason == GraphScopeReason::Continue {
            // The next iteration's inputs: this iteration's output of the same name, else the
            // loop's own input again.
            let next = keys::scope(&container, iteration + 1);
            self.events
                .push(EventPayload::GraphScopeEntered(GraphScopeEnteredEvent {
                    node: container.clone(),
                    scope: next.clone(),
                    iteration: (iteration + 1) as u64,
                    extra: Map::new(),
                }));
            let originals: Vec<(String, Value, String)> = self.st.nodes[&container]
                .inputs
                .iter()
                .flatten()
                .filter_map(|m| self.st.messages.get(m))
                .map(|m| (m.to.port.clone(), m.value.clone(), m.id.clone()))
                .collect();
            for (b, port) in self.plan.scopes[tmpl_scope].inputs.iter().enumerate() {
                let source = outputs
                    .iter()
                    .find(|(p, _, _)| p == &port.name)
                    .or_else(|| originals.iter().find(|(p, _, _)| p == &port.name));
                if let Some((_, v, m)) = source {
                    self.route_boundary_input(&next, tmpl_scope, b, v, std::slice::from_ref(m));
                }
            }
            return;
        }
        for (j, port) in self.plan.nodes[n].outputs.iter().enumerate() {
            if let Some((_, v, m)) = outputs.iter().find(|(p, _, _)| p == &port.name) {
                self.route_output(&container, n, j, v, std::slice::from_ref(m));
            }
        }
    }
}

/// The first batch of a run: `graphRunStarted` and the messages carrying its inputs.
pub(crate) fn start_events(
    started: crate::protocol::GraphRunStartedEvent,
    plan: &Arc<Plan>,
) -> Vec<EventPayload> {
    let inputs = started.inputs.clone();
    // The input messages are the run's first: numbered from an empty state, routed by the plan.
    let empty = RunState::new(&started.run_id);
    let mut b = Batch::new(&empty, plan);
    b.run_inputs(&inputs);
    let mut events = vec![EventPayload::GraphRunStarted(started)];
    events.extend(b.events);
    events
}

/// Checks a value against a node's output port; the error for a mismatch.
pub(crate) fn check_output(
    plan: &Plan,
    tmpl: usize,
    port: usize,
    value: &Value,
) -> Result<(), (&'static str, String)> {
    let p = &plan.nodes[tmpl].outputs[port];
    if !super::plan::within_depth(value, super::plan::MAX_VALUE_DEPTH) {
        return Err((
            "outputTooDeep",
            format!(
                "output {:?} nests more than {} levels",
                p.name,
                super::plan::MAX_VALUE_DEPTH
            ),
        ));
    }
    if value_fits(p.ty, value) {
        Ok(())
    } else {
        Err((
            "outputTypeMismatch",
            format!(
                "output {:?} must be {}",
                p.name,
                super::plan::port_type_name(p.ty)
            ),
        ))
    }
}
