//! A run's state as a pure reduction of its log: `RunState::apply` folds one stored event at a
//! time, with no clock, no I/O and no randomness, so replaying a log (after a restart, in a test,
//! in `graph inspect`) always gives the state the runtime had when it wrote that log. Decisions
//! the runtime takes (which node next, what expired) are themselves events; the reducer only
//! follows them, and records anything that breaks an invariant as an anomaly instead of
//! guessing.

use super::compiler::compile;
use super::plan::{keys, NodeSpec, Plan, DEFAULT_MAX_ATTEMPTS};
use crate::protocol::{
    EventPayload, GraphEffectReceipt, GraphEffectState, GraphEffectStatus, GraphMessageState,
    GraphMessageStatus, GraphNodeCounts, GraphNodeState, GraphNodeStatus, GraphPortRef,
    GraphRunError, GraphRunGrant, GraphRunStatus, GraphRunSummary, GraphUsage, ToolCall,
};
use crate::rollout::StoredEvent;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Lease length when a run's options do not say.
pub const DEFAULT_LEASE_MS: u64 = 300_000;
/// The worker pool when a run's options do not say.
pub const DEFAULT_WORKER: (&str, u32) = ("local", 4);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// The header is there but `graphRunStarted` is not (a start that was never acknowledged).
    Starting,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl RunStatus {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Succeeded | RunStatus::Failed | RunStatus::Cancelled
        )
    }

    pub fn to_wire(self) -> GraphRunStatus {
        match self {
            RunStatus::Starting | RunStatus::Running => GraphRunStatus::Running,
            RunStatus::Succeeded => GraphRunStatus::Succeeded,
            RunStatus::Failed => GraphRunStatus::Failed,
            RunStatus::Cancelled => GraphRunStatus::Cancelled,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeStatus {
    Pending,
    Ready,
    Running,
    Succeeded,
    Failed,
    Skipped,
    Cancelled,
}

impl NodeStatus {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            NodeStatus::Succeeded
                | NodeStatus::Failed
                | NodeStatus::Skipped
                | NodeStatus::Cancelled
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptStatus {
    Running,
    Succeeded,
    Failed,
    /// Its lease ran out.
    Expired,
    /// Fenced by a restart or a cancellation.
    Fenced,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Custody {
    /// In the run's custody: waiting for (re)delivery.
    Run,
    /// Handed to an attempt.
    Attempt(u64),
    /// Consumed, for good.
    Acked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EffectStatus {
    Intended,
    Succeeded,
    Failed,
    Reconcile,
}

/// What `graphRunStarted` fixed for the whole run.
#[derive(Debug, Clone)]
pub struct Start {
    pub plan: Arc<Plan>,
    pub definition: Value,
    pub grant: GraphRunGrant,
    pub inputs: Map<String, Value>,
    /// (worker id, capacity), in order.
    pub workers: Vec<(String, u32)>,
    pub lease_ms: u64,
    pub started_at_ms: i64,
}

#[derive(Debug, Clone)]
pub struct NodeInst {
    pub key: String,
    /// Index into `Plan::nodes`.
    pub tmpl: usize,
    /// The body instance it lives in ("" for the root).
    pub scope: String,
    /// Per input port, the message that filled it.
    pub inputs: Vec<Option<String>>,
    pub filled: usize,
    pub status: NodeStatus,
    pub attempts: u32,
    /// Attempts cut off by a server restart: they do not count against maxAttempts (the
    /// process died, not the node).
    pub lost: u32,
    pub attempt: Option<u64>,
    pub fence: Option<u64>,
    pub thread_id: Option<String>,
    pub error: Option<GraphRunError>,
    /// A container's current iteration.
    pub iteration: u32,
    pub tokens: u64,
    pub effects: u64,
    /// Its place in the ready queue while ready.
    ready_at: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct ScopeInst {
    pub key: String,
    /// The container's key ("" for the root).
    pub node: String,
    /// Index into `Plan::scopes`.
    pub tmpl: usize,
    pub iteration: u32,
    /// Per boundary output, the message that filled it.
    pub outputs: Vec<Option<String>>,
    /// Children not yet succeeded.
    pub open_children: usize,
    pub closed: bool,
}

#[derive(Debug, Clone)]
pub struct AttemptInst {
    pub id: u64,
    pub node: String,
    pub fence: u64,
    pub worker: String,
    pub lease_expires_at_ms: i64,
    pub status: AttemptStatus,
    pub custody: Vec<String>,
    pub thread_id: Option<String>,
    pub refusals: u32,
    /// Its `graphAttemptStarted` event's seq and hash (what its events' and its turn's
    /// `parentId` name).
    pub started_seq: u64,
    pub started_hash: String,
}

#[derive(Debug, Clone)]
pub struct MsgInst {
    pub id: String,
    pub from: GraphPortRef,
    pub to: GraphPortRef,
    pub channel: String,
    pub channel_seq: u64,
    pub causes: Vec<String>,
    pub value_digest: String,
    pub value: Value,
    pub custody: Custody,
    pub deliveries: u32,
    pub acked_by: Option<String>,
    pub duplicates: u32,
}

#[derive(Debug, Clone)]
pub struct EffectInst {
    pub key: String,
    pub node: String,
    pub attempt: u64,
    pub fence: u64,
    pub call: ToolCall,
    pub operation_digest: String,
    pub status: EffectStatus,
    pub applied: Option<bool>,
    pub receipt: Option<GraphEffectReceipt>,
    pub error: Option<GraphRunError>,
    pub thread_id: String,
    pub turn_id: String,
    pub item_id: String,
}

/// Something in the log that breaks an invariant. The reducer never acts on it; it is
/// reported (graph inspect, tests) so it can be investigated.
#[derive(Debug, Clone, PartialEq)]
pub struct Anomaly {
    pub seq: u64,
    pub message: String,
}

#[derive(Debug, Clone, Default)]
struct Channel {
    sent: u64,
    acked: u64,
}

/// Everything a run is, from its log.
#[derive(Debug, Clone)]
pub struct RunState {
    pub run_id: String,
    /// The run's trace id (its `graphRunStarted` event's; docs/rollout-format.md, "Trace and
    /// parent ids") and that event's seq, which the run's later events name as their parent.
    pub trace_id: Option<String>,
    pub run_started_seq: u64,
    pub title: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    pub last_seq: u64,
    pub start: Option<Start>,
    pub status: RunStatus,
    pub error: Option<GraphRunError>,
    pub nodes: HashMap<String, NodeInst>,
    pub node_order: Vec<String>,
    pub scopes: HashMap<String, ScopeInst>,
    pub attempts: BTreeMap<u64, AttemptInst>,
    /// Attempts holding a lease now (kept so the scheduler never scans every attempt).
    running: std::collections::BTreeSet<u64>,
    /// Body instances not yet exited (kept so the scheduler never scans every scope).
    open_scopes: std::collections::BTreeSet<String>,
    pub messages: HashMap<String, MsgInst>,
    pub message_order: Vec<String>,
    channels: HashMap<String, Channel>,
    pub effects: HashMap<String, EffectInst>,
    pub effect_order: Vec<String>,
    effects_by_node: HashMap<String, Vec<String>>,
    pub max_fence: u64,
    pub max_attempt: u64,
    pub usage: GraphUsage,
    /// Ready nodes, in the order they became ready.
    ready: BTreeMap<u64, String>,
    ready_tick: u64,
    pub anomalies: Vec<Anomaly>,
    pub stale_refusals: u64,
    /// Messages carrying the run's outputs.
    pub outputs: Vec<String>,
    /// The first node that failed for good (fails the run).
    pub failed_node: Option<String>,
    /// Node keys and run-level changes since the last `take_touched`, for notifications.
    touched: Vec<String>,
    run_touched: bool,
    /// A plan already compiled for the `graphRunStarted` to come (`preload`).
    preloaded: Option<(Arc<Plan>, GraphRunGrant)>,
}

fn usage_zero() -> GraphUsage {
    GraphUsage {
        steps: 0,
        effects: 0,
        tokens: 0,
        extra: Map::new(),
    }
}

pub fn run_error(code: &str, message: impl Into<String>, node: Option<&str>) -> GraphRunError {
    GraphRunError {
        code: code.into(),
        message: message.into(),
        node: node.map(str::to_string),
        extra: Map::new(),
    }
}

impl RunState {
    pub fn new(run_id: &str) -> Self {
        RunState {
            run_id: run_id.into(),
            trace_id: None,
            run_started_seq: 0,
            title: None,
            created_at: String::new(),
            updated_at: String::new(),
            last_seq: 0,
            start: None,
            status: RunStatus::Starting,
            error: None,
            nodes: HashMap::new(),
            node_order: Vec::new(),
            scopes: HashMap::new(),
            attempts: BTreeMap::new(),
            running: Default::default(),
            open_scopes: Default::default(),
            messages: HashMap::new(),
            message_order: Vec::new(),
            channels: HashMap::new(),
            effects: HashMap::new(),
            effect_order: Vec::new(),
            effects_by_node: HashMap::new(),
            max_fence: 0,
            max_attempt: 0,
            usage: usage_zero(),
            ready: BTreeMap::new(),
            ready_tick: 0,
            anomalies: Vec::new(),
            stale_refusals: 0,
            outputs: Vec::new(),
            failed_node: None,
            touched: Vec::new(),
            run_touched: false,
            preloaded: None,
        }
    }

    /// Hands the reducer the plan the runtime compiled for the run's start, so folding
    /// `graphRunStarted` does not compile the definition a second time. It is used only if the
    /// recorded definition and grant are the ones it was compiled from.
    pub fn preload(&mut self, plan: Arc<Plan>, grant: GraphRunGrant) {
        self.preloaded = Some((plan, grant));
    }

    /// Folds a whole log.
    pub fn replay<'a>(run_id: &str, events: impl IntoIterator<Item = &'a StoredEvent>) -> Self {
        let mut s = RunState::new(run_id);
        for e in events {
            s.apply(e);
        }
        s.take_touched();
        s
    }

    pub fn plan(&self) -> Option<&Arc<Plan>> {
        self.start.as_ref().map(|s| &s.plan)
    }

    /// Node keys changed since the last call, and whether the run's own status changed.
    pub fn take_touched(&mut self) -> (Vec<String>, bool) {
        let mut keys = std::mem::take(&mut self.touched);
        keys.dedup();
        (keys, std::mem::replace(&mut self.run_touched, false))
    }

    fn anomaly(&mut self, seq: u64, message: String) {
        self.anomalies.push(Anomaly { seq, message });
    }

    fn touch(&mut self, key: &str) {
        if self.touched.last().map(String::as_str) != Some(key) {
            self.touched.push(key.to_string());
        }
    }

    /// Folds one event. Events must come in seq order; a gap is an anomaly.
    pub fn apply(&mut self, ev: &StoredEvent) {
        if ev.seq != self.last_seq + 1 {
            self.anomaly(ev.seq, format!("seq {} follows {}", ev.seq, self.last_seq));
        }
        self.last_seq = ev.seq;
        self.updated_at = ev.time.clone();
        if self.status.is_terminal() && ev.kind() == "graphRunCompleted" {
            self.anomaly(ev.seq, "a second graphRunCompleted".into());
            return;
        }
        let payload: EventPayload = match serde_json::from_value(ev.payload.clone()) {
            Ok(p) => p,
            Err(e) => {
                self.anomaly(ev.seq, format!("undecodable payload: {e}"));
                return;
            }
        };
        match payload {
            EventPayload::ThreadStarted(h) => {
                self.title = h.title;
                self.created_at = ev.time.clone();
            }
            EventPayload::GraphRunStarted(p) => {
                self.trace_id.clone_from(&ev.trace_id);
                self.run_started_seq = ev.seq;
                self.run_started(ev.seq, p)
            }
            EventPayload::GraphAttemptStarted(p) => self.attempt_started(ev.seq, &ev.hash, p),
            EventPayload::GraphLeaseRenewed(p) => match self.attempts.get_mut(&p.attempt_id) {
                Some(a) if a.status == AttemptStatus::Running && a.fence == p.fence => {
                    a.lease_expires_at_ms = p.lease_expires_at_ms as i64;
                }
                _ => self.anomaly(
                    ev.seq,
                    format!(
                        "renewal of attempt {} which holds no lease under fence {}",
                        p.attempt_id, p.fence
                    ),
                ),
            },
            EventPayload::GraphLeaseExpired(p) => {
                if self.is_current(p.attempt_id, p.fence) {
                    self.end_attempt(p.attempt_id, AttemptStatus::Expired, true, None);
                } else {
                    self.anomaly(
                        ev.seq,
                        format!(
                            "expiry of attempt {} which holds no lease under fence {}",
                            p.attempt_id, p.fence
                        ),
                    );
                }
            }
            EventPayload::GraphAttemptFinished(p) => {
                if !self.is_current(p.attempt_id, p.fence) {
                    self.anomaly(
                        ev.seq,
                        format!(
                            "attempt {} settled its node under stale fence {}",
                            p.attempt_id, p.fence
                        ),
                    );
                    return;
                }
                if let Some(u) = &p.usage {
                    self.usage.tokens += u.tokens;
                    if let Some(n) = self.nodes.get_mut(&p.node) {
                        n.tokens += u.tokens;
                    }
                }
                let ok = p.status == crate::protocol::GraphAttemptStatus::Succeeded;
                let status = if ok {
                    AttemptStatus::Succeeded
                } else {
                    AttemptStatus::Failed
                };
                self.end_attempt(p.attempt_id, status, p.retryable, p.error);
                if ok {
                    self.node_succeeded(&p.node);
                }
            }
            EventPayload::GraphStaleRefused(p) => {
                self.stale_refusals += 1;
                if let Some(a) = self.attempts.get_mut(&p.attempt_id) {
                    a.refusals += 1;
                }
                self.run_touched = true;
            }
            EventPayload::GraphMessageSent(p) => self.message_sent(ev.seq, p),
            EventPayload::GraphMessageAcked(p) => self.message_acked(ev.seq, p),
            EventPayload::GraphScopeEntered(p) => self.scope_entered(ev.seq, p),
            EventPayload::GraphScopeExited(p) => self.scope_exited(ev.seq, p),
            EventPayload::GraphEffectIntended(p) => self.effect_intended(ev.seq, p),
            EventPayload::GraphEffectSucceeded(p) => self.effect_outcome(
                ev.seq,
                &p.idempotency_key,
                EffectStatus::Succeeded,
                Some(true),
                Some(p.receipt),
                None,
            ),
            EventPayload::GraphEffectFailed(p) => self.effect_outcome(
                ev.seq,
                &p.idempotency_key,
                EffectStatus::Failed,
                Some(p.applied),
                p.receipt,
                Some(p.error),
            ),
            EventPayload::GraphEffectReconcile(p) => {
                let key = p.idempotency_key.clone();
                match self.effects.get_mut(&key) {
                    Some(e)
                        if matches!(e.status, EffectStatus::Intended | EffectStatus::Reconcile) =>
                    {
                        e.status = EffectStatus::Reconcile;
                        let node = e.node.clone();
                        self.touch(&node);
                    }
                    _ => self.anomaly(
                        ev.seq,
                        format!(
                            "reconcile of effect {key} which has an outcome or was never intended"
                        ),
                    ),
                }
            }
            EventPayload::GraphRunResumed(p) => {
                for f in p.fenced {
                    if self.is_current(f.attempt_id, f.fence) {
                        if let Some(n) = self.nodes.get_mut(&f.node) {
                            n.lost += 1;
                        }
                        self.end_attempt(f.attempt_id, AttemptStatus::Fenced, true, None);
                    }
                }
                self.run_touched = true;
            }
            EventPayload::GraphRunCancelled(p) => {
                for f in p.fenced {
                    if let Some(a) = self.attempts.get_mut(&f.attempt_id) {
                        if a.status == AttemptStatus::Running {
                            a.status = AttemptStatus::Fenced;
                            self.running.remove(&f.attempt_id);
                        }
                    }
                }
                self.run_touched = true;
            }
            EventPayload::GraphRunCompleted(p) => self.run_completed(p),
            // What the store itself writes (a finished run's log is archived) changes nothing.
            EventPayload::ThreadArchived(_)
            | EventPayload::Checkpoint(_)
            | EventPayload::Repaired(_)
            | EventPayload::Migrated(_) => {}
            other => {
                let kind = ev.kind().to_string();
                let _ = other;
                self.anomaly(ev.seq, format!("{kind} does not belong in a graph run"));
            }
        }
    }

    fn run_started(&mut self, seq: u64, p: crate::protocol::GraphRunStartedEvent) {
        if self.start.is_some() {
            self.anomaly(seq, "a second graphRunStarted".into());
            return;
        }
        let definition = match serde_json::to_value(&p.definition) {
            Ok(v) => v,
            Err(e) => {
                self.anomaly(seq, format!("definition does not encode: {e}"));
                return;
            }
        };
        // A plan the caller compiled from this very definition and grant (the runtime, which
        // compiled it before writing it) is what compiling again would give: reuse it.
        let preloaded = self.preloaded.take().filter(|(plan, grant)| {
            *grant == p.grant && plan.digest == crate::approval::digest_json(&definition)
        });
        let compiled = match preloaded {
            Some((plan, _)) => Ok(plan),
            None => compile(&definition, &p.grant).map(Arc::new),
        };
        let plan = match compiled {
            Ok(plan) => plan,
            Err(errors) => {
                // The runtime compiled it before writing it; a refusal now means the log was
                // written under other rules. Nothing of it may run.
                self.anomaly(
                    seq,
                    format!("the recorded definition does not compile: {}", errors[0]),
                );
                self.status = RunStatus::Failed;
                self.error = Some(run_error(
                    "planInvalid",
                    "the recorded definition no longer compiles",
                    None,
                ));
                return;
            }
        };
        if plan.digest != p.plan_digest {
            self.anomaly(
                seq,
                format!(
                    "plan digest {} recorded, {} computed",
                    p.plan_digest, plan.digest
                ),
            );
        }
        let workers = match &p.options.workers {
            Some(w) if !w.is_empty() => w
                .iter()
                .map(|w| (w.id.clone(), w.capacity as u32))
                .collect(),
            _ => vec![(DEFAULT_WORKER.0.to_string(), DEFAULT_WORKER.1)],
        };
        self.start = Some(Start {
            plan: Arc::clone(&plan),
            definition,
            grant: p.grant,
            inputs: p.inputs,
            workers,
            lease_ms: p.options.lease_ms.unwrap_or(DEFAULT_LEASE_MS),
            started_at_ms: p.started_at_ms as i64,
        });
        self.status = RunStatus::Running;
        self.run_touched = true;
        self.instantiate("", "", 0, 0);
    }

    /// Creates the body instance `key` of template scope `tmpl` and its nodes.
    fn instantiate(&mut self, key: &str, container: &str, tmpl: usize, iteration: u32) {
        let plan = Arc::clone(self.plan().expect("instantiated after start"));
        let scope = &plan.scopes[tmpl];
        self.open_scopes.insert(key.to_string());
        self.scopes.insert(
            key.to_string(),
            ScopeInst {
                key: key.to_string(),
                node: container.to_string(),
                tmpl,
                iteration,
                outputs: vec![None; scope.outputs.len()],
                open_children: scope.nodes.len(),
                closed: false,
            },
        );
        for &n in &scope.nodes {
            let t = &plan.nodes[n];
            let nk = keys::node(key, &t.id);
            let inst = NodeInst {
                key: nk.clone(),
                tmpl: n,
                scope: key.to_string(),
                inputs: vec![None; t.inputs.len()],
                filled: 0,
                status: NodeStatus::Pending,
                attempts: 0,
                lost: 0,
                attempt: None,
                fence: None,
                thread_id: None,
                error: None,
                iteration: 0,
                tokens: 0,
                effects: 0,
                ready_at: None,
            };
            self.nodes.insert(nk.clone(), inst);
            self.node_order.push(nk.clone());
            if t.inputs.is_empty() {
                self.make_ready(&nk);
            }
            self.touch(&nk);
        }
    }

    fn make_ready(&mut self, key: &str) {
        if let Some(n) = self.nodes.get_mut(key) {
            n.status = NodeStatus::Ready;
            self.ready_tick += 1;
            if let Some(old) = n.ready_at.replace(self.ready_tick) {
                self.ready.remove(&old);
            }
            self.ready.insert(self.ready_tick, key.to_string());
        }
    }

    fn unready(&mut self, key: &str) {
        if let Some(tick) = self.nodes.get_mut(key).and_then(|n| n.ready_at.take()) {
            self.ready.remove(&tick);
        }
    }

    /// Whether `attempt` still holds its node: running, under the node's current fence.
    pub fn is_current(&self, attempt: u64, fence: u64) -> bool {
        match self.attempts.get(&attempt) {
            Some(a) => {
                a.status == AttemptStatus::Running
                    && a.fence == fence
                    && self.nodes.get(&a.node).and_then(|n| n.fence) == Some(fence)
            }
            None => false,
        }
    }

    /// The most attempts node `n` may have: its maxAttempts, capped by its maxSteps budget.
    pub fn attempt_limit(&self, n: &NodeInst) -> u32 {
        let Some(plan) = self.plan() else {
            return DEFAULT_MAX_ATTEMPTS;
        };
        let t = &plan.nodes[n.tmpl];
        let by_budget = t
            .budgets
            .max_steps
            .map_or(u32::MAX, |s| s.min(u32::MAX as u64) as u32);
        t.max_attempts.min(by_budget)
    }

    fn attempt_started(
        &mut self,
        seq: u64,
        hash: &str,
        p: crate::protocol::GraphAttemptStartedEvent,
    ) {
        if p.fence <= self.max_fence {
            self.anomaly(
                seq,
                format!(
                    "fence {} does not increase (max {})",
                    p.fence, self.max_fence
                ),
            );
        }
        self.max_fence = self.max_fence.max(p.fence);
        self.max_attempt = self.max_attempt.max(p.attempt_id);
        let Some(node) = self.nodes.get(&p.node) else {
            self.anomaly(seq, format!("attempt for unknown node {}", p.node));
            return;
        };
        if node.status != NodeStatus::Ready {
            self.anomaly(
                seq,
                format!("attempt for node {} which is not ready", p.node),
            );
        }
        for m in &p.custody {
            match self.messages.get_mut(m) {
                Some(msg) if msg.custody == Custody::Run => {
                    msg.custody = Custody::Attempt(p.attempt_id);
                    msg.deliveries += 1;
                }
                _ => self.anomaly(
                    seq,
                    format!("custody of message {m}, which the run does not hold"),
                ),
            }
        }
        self.unready(&p.node);
        let node = self.nodes.get_mut(&p.node).expect("checked");
        node.status = NodeStatus::Running;
        node.attempts += 1;
        node.attempt = Some(p.attempt_id);
        node.fence = Some(p.fence);
        node.thread_id = p.thread_id.clone();
        node.error = None;
        self.usage.steps += 1;
        self.attempts.insert(
            p.attempt_id,
            AttemptInst {
                id: p.attempt_id,
                node: p.node.clone(),
                fence: p.fence,
                worker: p.worker,
                lease_expires_at_ms: p.lease_expires_at_ms as i64,
                status: AttemptStatus::Running,
                custody: p.custody,
                thread_id: p.thread_id,
                refusals: 0,
                started_seq: seq,
                started_hash: hash.to_string(),
            },
        );
        self.running.insert(p.attempt_id);
        self.touch(&p.node);
    }

    /// Ends a running attempt. Messages it held go back to the run unless it succeeded (then
    /// they are acked in the same batch); its node runs again if `retry` and attempts remain.
    fn end_attempt(
        &mut self,
        id: u64,
        status: AttemptStatus,
        retry: bool,
        error: Option<GraphRunError>,
    ) {
        let Some(a) = self.attempts.get_mut(&id) else {
            return;
        };
        a.status = status;
        self.running.remove(&id);
        let (node_key, custody) = (a.node.clone(), a.custody.clone());
        if status != AttemptStatus::Succeeded {
            for m in &custody {
                if let Some(msg) = self.messages.get_mut(m) {
                    if msg.custody == Custody::Attempt(id) {
                        msg.custody = Custody::Run;
                    }
                }
            }
        }
        if status == AttemptStatus::Succeeded {
            return;
        }
        let Some(node) = self.nodes.get(&node_key) else {
            return;
        };
        if node.status != NodeStatus::Running || node.attempt != Some(id) {
            return;
        }
        let limit = self.attempt_limit(node);
        let attempts = node.attempts - node.lost;
        let error = error.unwrap_or_else(|| match status {
            AttemptStatus::Expired => run_error(
                "leaseExpired",
                "the attempt's lease expired",
                Some(&node_key),
            ),
            _ => run_error("attemptFenced", "the attempt was fenced", Some(&node_key)),
        });
        if retry && attempts < limit {
            if let Some(n) = self.nodes.get_mut(&node_key) {
                n.error = Some(error);
            }
            self.make_ready(&node_key);
        } else {
            let error = if retry {
                run_error(
                    "attemptsExhausted",
                    format!(
                        "{attempts} attempt(s) used, the most this node may have; last: {}",
                        error.message
                    ),
                    Some(&node_key),
                )
            } else {
                error
            };
            self.fail_node(&node_key, error);
        }
        self.touch(&node_key);
    }

    fn fail_node(&mut self, key: &str, mut error: GraphRunError) {
        if error.node.is_none() {
            error.node = Some(key.to_string());
        }
        if let Some(n) = self.nodes.get_mut(key) {
            n.status = NodeStatus::Failed;
            n.error = Some(error);
        }
        if self.failed_node.is_none() {
            self.failed_node = Some(key.to_string());
        }
        self.touch(key);
    }

    fn node_succeeded(&mut self, key: &str) {
        let Some(n) = self.nodes.get_mut(key) else {
            return;
        };
        n.status = NodeStatus::Succeeded;
        let scope = n.scope.clone();
        if let Some(s) = self.scopes.get_mut(&scope) {
            s.open_children = s.open_children.saturating_sub(1);
        }
        self.touch(key);
    }

    /// The index of port `name` among a node's inputs or a scope's outputs.
    fn port_index(&self, to: &GraphPortRef) -> Option<(bool, usize)> {
        let plan = self.plan()?;
        let node = to.node.as_deref()?;
        if keys::is_scope(node) {
            let s = self.scopes.get(node)?;
            let idx = plan.scopes[s.tmpl]
                .outputs
                .iter()
                .position(|p| p.name == to.port)?;
            Some((true, idx))
        } else {
            let n = self.nodes.get(node)?;
            let idx = plan.nodes[n.tmpl]
                .inputs
                .iter()
                .position(|p| p.name == to.port)?;
            Some((false, idx))
        }
    }

    fn message_sent(&mut self, seq: u64, p: crate::protocol::GraphMessageSentEvent) {
        if self.messages.contains_key(&p.message_id) {
            // At least once: a second copy of a message is the same message.
            if let Some(m) = self.messages.get_mut(&p.message_id) {
                m.duplicates += 1;
            }
            return;
        }
        let ch = self.channels.entry(p.channel.clone()).or_default();
        if p.channel_seq != ch.sent + 1 {
            let sent = ch.sent;
            self.anomaly(
                seq,
                format!(
                    "channel {} skips from {sent} to {}",
                    p.channel, p.channel_seq
                ),
            );
        }
        let ch = self.channels.entry(p.channel.clone()).or_default();
        ch.sent = ch.sent.max(p.channel_seq);
        for c in &p.causes {
            match self.messages.get(c) {
                Some(m) if m.custody == Custody::Acked => {}
                Some(_) => self.anomaly(
                    seq,
                    format!(
                        "message {} names cause {c}, which was not consumed before it",
                        p.message_id
                    ),
                ),
                None => self.anomaly(
                    seq,
                    format!("message {} names unknown cause {c}", p.message_id),
                ),
            }
        }
        let id = p.message_id.clone();
        match (&p.to.node, self.port_index(&p.to)) {
            (None, _) => {
                self.outputs.push(id.clone());
                let idx = self
                    .plan()
                    .and_then(|plan| plan.root().outputs.iter().position(|o| o.name == p.to.port));
                match (idx, self.scopes.get_mut("")) {
                    (Some(idx), Some(root)) => {
                        if root.outputs[idx].replace(id.clone()).is_some() {
                            self.anomaly(seq, format!("run output {} filled twice", p.to.port));
                        }
                    }
                    _ => self.anomaly(
                        seq,
                        format!(
                            "message {} goes to run output {}, which does not exist",
                            p.message_id, p.to.port
                        ),
                    ),
                }
            }
            (Some(target), Some((true, idx))) => {
                let s = self.scopes.get_mut(target).expect("resolved");
                if s.outputs[idx].replace(id.clone()).is_some() {
                    self.anomaly(seq, format!("boundary {target}:{} filled twice", p.to.port));
                }
            }
            (Some(target), Some((false, idx))) => {
                let target = target.clone();
                let n = self.nodes.get_mut(&target).expect("resolved");
                if n.inputs[idx].replace(id.clone()).is_some() {
                    self.anomaly(seq, format!("input {target}:{} filled twice", p.to.port));
                } else {
                    n.filled += 1;
                    if n.filled == n.inputs.len() && n.status == NodeStatus::Pending {
                        self.make_ready(&target);
                    }
                }
                self.touch(&target);
            }
            (Some(target), None) => {
                self.anomaly(
                    seq,
                    format!(
                        "message {} goes to {target}:{}, which does not exist",
                        p.message_id, p.to.port
                    ),
                );
            }
        }
        self.messages.insert(
            id.clone(),
            MsgInst {
                id: id.clone(),
                from: p.from,
                to: p.to,
                channel: p.channel,
                channel_seq: p.channel_seq,
                causes: p.causes,
                value_digest: p.value_digest,
                value: p.value,
                custody: Custody::Run,
                deliveries: 0,
                acked_by: None,
                duplicates: 0,
            },
        );
        self.message_order.push(id);
    }

    fn message_acked(&mut self, seq: u64, p: crate::protocol::GraphMessageAckedEvent) {
        let Some(m) = self.messages.get_mut(&p.message_id) else {
            self.anomaly(seq, format!("ack of unknown message {}", p.message_id));
            return;
        };
        if p.duplicate {
            m.duplicates += 1;
            if m.custody != Custody::Acked {
                self.anomaly(
                    seq,
                    format!(
                        "message {} acked as a duplicate before it was consumed",
                        p.message_id
                    ),
                );
            }
            return;
        }
        if m.custody == Custody::Acked {
            self.anomaly(seq, format!("message {} consumed twice", p.message_id));
            return;
        }
        m.custody = Custody::Acked;
        m.acked_by = Some(p.consumer);
        let (channel, cseq) = (m.channel.clone(), m.channel_seq);
        let ch = self.channels.entry(channel.clone()).or_default();
        let acked = ch.acked;
        ch.acked = ch.acked.max(cseq);
        if cseq != acked + 1 {
            self.anomaly(
                seq,
                format!("channel {channel}: message {cseq} consumed after {acked} (causal order)"),
            );
        }
    }

    fn scope_entered(&mut self, seq: u64, p: crate::protocol::GraphScopeEnteredEvent) {
        let iteration = p.iteration as u32;
        if p.scope != keys::scope(&p.node, iteration) || self.scopes.contains_key(&p.scope) {
            self.anomaly(seq, format!("scope {} cannot be entered", p.scope));
            return;
        }
        let Some(body) = self
            .nodes
            .get(&p.node)
            .and_then(|n| self.plan().and_then(|plan| plan.nodes[n.tmpl].spec.body()))
        else {
            self.anomaly(seq, format!("{} is not a container", p.node));
            return;
        };
        self.unready(&p.node);
        if let Some(n) = self.nodes.get_mut(&p.node) {
            n.status = NodeStatus::Running;
            n.iteration = iteration;
        }
        self.touch(&p.node);
        self.instantiate(&p.scope, &p.node, body, iteration);
    }

    fn scope_exited(&mut self, seq: u64, p: crate::protocol::GraphScopeExitedEvent) {
        match self.scopes.get_mut(&p.scope) {
            Some(s) if !s.closed => {
                s.closed = true;
                self.open_scopes.remove(&p.scope);
            }
            _ => {
                self.anomaly(seq, format!("scope {} cannot be exited", p.scope));
                return;
            }
        }
        if p.reason != crate::protocol::GraphScopeReason::Continue {
            self.node_succeeded(&p.node);
        }
    }

    fn effect_intended(&mut self, seq: u64, p: crate::protocol::GraphEffectIntendedEvent) {
        if let Some(e) = self.effects.get(&p.idempotency_key) {
            let again = e.status == EffectStatus::Failed && e.applied == Some(false);
            if !again {
                self.anomaly(
                    seq,
                    format!(
                        "effect {} intended again while it may have happened",
                        p.idempotency_key
                    ),
                );
                return;
            }
        } else {
            self.effect_order.push(p.idempotency_key.clone());
            self.effects_by_node
                .entry(p.node.clone())
                .or_default()
                .push(p.idempotency_key.clone());
        }
        self.usage.effects += 1;
        if let Some(n) = self.nodes.get_mut(&p.node) {
            n.effects += 1;
        }
        self.effects.insert(
            p.idempotency_key.clone(),
            EffectInst {
                key: p.idempotency_key,
                node: p.node.clone(),
                attempt: p.attempt_id,
                fence: p.fence,
                call: p.call,
                operation_digest: p.operation_digest,
                status: EffectStatus::Intended,
                applied: None,
                receipt: None,
                error: None,
                thread_id: p.thread_id,
                turn_id: p.turn_id,
                item_id: p.item_id,
            },
        );
        self.touch(&p.node);
    }

    fn effect_outcome(
        &mut self,
        seq: u64,
        key: &str,
        status: EffectStatus,
        applied: Option<bool>,
        receipt: Option<GraphEffectReceipt>,
        error: Option<GraphRunError>,
    ) {
        match self.effects.get_mut(key) {
            Some(e) if matches!(e.status, EffectStatus::Intended | EffectStatus::Reconcile) => {
                e.status = status;
                e.applied = applied;
                e.receipt = receipt;
                e.error = error;
                let node = e.node.clone();
                self.touch(&node);
            }
            _ => self.anomaly(
                seq,
                format!("outcome for effect {key}, which is not awaiting one"),
            ),
        }
    }

    fn run_completed(&mut self, p: crate::protocol::GraphRunCompletedEvent) {
        self.status = match p.status {
            GraphRunStatus::Succeeded => RunStatus::Succeeded,
            GraphRunStatus::Cancelled => RunStatus::Cancelled,
            _ => RunStatus::Failed,
        };
        self.error = p.error;
        for f in &p.fenced {
            if let Some(a) = self.attempts.get_mut(&f.attempt_id) {
                if a.status == AttemptStatus::Running {
                    a.status = AttemptStatus::Fenced;
                    self.running.remove(&f.attempt_id);
                }
            }
        }
        for m in &p.outputs {
            if let Some(msg) = self.messages.get_mut(m) {
                msg.custody = Custody::Acked;
            }
        }
        let keys: Vec<String> = self.node_order.clone();
        for k in keys {
            let n = self.nodes.get_mut(&k).expect("ordered keys exist");
            let next = match n.status {
                NodeStatus::Running => NodeStatus::Cancelled,
                NodeStatus::Pending | NodeStatus::Ready => NodeStatus::Skipped,
                s => s,
            };
            if next != n.status {
                n.status = next;
                self.touched.push(k);
            }
        }
        self.ready.clear();
        self.run_touched = true;
    }

    // ------------------------------------------------------------------ queries

    /// The highest sequence number sent on a channel so far.
    pub fn channel_sent(&self, channel: &str) -> u64 {
        self.channels.get(channel).map_or(0, |c| c.sent)
    }

    /// Ready nodes, oldest first.
    pub fn ready_nodes(&self) -> impl Iterator<Item = &NodeInst> {
        self.ready.values().filter_map(|k| self.nodes.get(k))
    }

    /// Attempts that hold a lease now.
    pub fn running_attempts(&self) -> impl Iterator<Item = &AttemptInst> {
        self.running.iter().filter_map(|id| self.attempts.get(id))
    }

    /// Whether node `key` waits for an effect's outcome (intended with no live attempt that
    /// could still report it, or in reconcile).
    pub fn blocked_by_effect(&self, key: &str) -> Option<&EffectInst> {
        self.effects_by_node
            .get(key)?
            .iter()
            .filter_map(|k| self.effects.get(k))
            .find(|e| matches!(e.status, EffectStatus::Reconcile | EffectStatus::Intended))
    }

    /// Effects in a node's name, in intent order.
    pub fn node_effects(&self, key: &str) -> impl Iterator<Item = &EffectInst> {
        self.effects_by_node
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|k| self.effects.get(k))
    }

    /// Body instances whose nodes all succeeded and whose outputs are all filled.
    pub fn complete_scopes(&self) -> Vec<&ScopeInst> {
        self.open_scopes
            .iter()
            .filter_map(|k| self.scopes.get(k))
            .filter(|s| s.open_children == 0 && s.outputs.iter().all(Option::is_some))
            .collect()
    }

    pub fn wire_status(&self, n: &NodeInst) -> GraphNodeStatus {
        let reconciling = self.node_effects(&n.key).any(|e| {
            e.status == EffectStatus::Reconcile
                || (e.status == EffectStatus::Intended
                    && !self
                        .attempts
                        .get(&e.attempt)
                        .is_some_and(|a| a.status == AttemptStatus::Running))
        });
        if reconciling && !n.status.is_terminal() {
            return GraphNodeStatus::Reconcile;
        }
        match n.status {
            NodeStatus::Pending => GraphNodeStatus::Pending,
            NodeStatus::Ready => GraphNodeStatus::Ready,
            NodeStatus::Running => GraphNodeStatus::Running,
            NodeStatus::Succeeded => GraphNodeStatus::Succeeded,
            NodeStatus::Failed => GraphNodeStatus::Failed,
            NodeStatus::Skipped => GraphNodeStatus::Skipped,
            NodeStatus::Cancelled => GraphNodeStatus::Cancelled,
        }
    }

    // ------------------------------------------------------------------ wire projections

    pub fn node_state(&self, n: &NodeInst) -> GraphNodeState {
        let plan = self.plan().expect("nodes exist only after start");
        let t = &plan.nodes[n.tmpl];
        GraphNodeState {
            key: n.key.clone(),
            node_id: t.id.clone(),
            kind: t.spec.kind(),
            status: self.wire_status(n),
            attempts: n.attempts as u64,
            attempt_id: n.attempt,
            fence: n.fence,
            thread_id: n.thread_id.clone(),
            error: n.error.clone(),
            extra: Map::new(),
        }
    }

    pub fn counts(&self) -> GraphNodeCounts {
        let mut c = GraphNodeCounts {
            total: 0,
            pending: 0,
            ready: 0,
            running: 0,
            succeeded: 0,
            failed: 0,
            skipped: 0,
            cancelled: 0,
            reconcile: 0,
            extra: Map::new(),
        };
        for n in self.nodes.values() {
            c.total += 1;
            match self.wire_status(n) {
                GraphNodeStatus::Pending => c.pending += 1,
                GraphNodeStatus::Ready => c.ready += 1,
                GraphNodeStatus::Running => c.running += 1,
                GraphNodeStatus::Succeeded => c.succeeded += 1,
                GraphNodeStatus::Failed => c.failed += 1,
                GraphNodeStatus::Skipped => c.skipped += 1,
                GraphNodeStatus::Cancelled => c.cancelled += 1,
                GraphNodeStatus::Reconcile => c.reconcile += 1,
                GraphNodeStatus::Unknown(_) => {}
            }
        }
        c
    }

    /// The run's outputs by port (content).
    pub fn output_values(&self) -> Map<String, Value> {
        self.outputs
            .iter()
            .filter_map(|m| self.messages.get(m))
            .map(|m| (m.to.port.clone(), m.value.clone()))
            .collect()
    }

    pub fn summary(&self, include_content: bool) -> GraphRunSummary {
        let plan = self.plan();
        GraphRunSummary {
            run_id: self.run_id.clone(),
            graph_id: plan.map_or_else(|| "unknown".to_string(), |p| p.graph_id.clone()),
            title: plan
                .and_then(|p| p.title.clone())
                .or_else(|| self.title.clone()),
            plan_digest: plan.map_or_else(
                || format!("sha256:{}", "0".repeat(64)),
                |p| p.digest.clone(),
            ),
            status: self.status.to_wire(),
            created_at: self.created_at.clone(),
            updated_at: self.updated_at.clone(),
            last_event_seq: self.last_seq.max(1),
            nodes: self.counts(),
            usage: self.usage.clone(),
            error: self.error.clone(),
            outputs: include_content.then(|| self.output_values()),
            extra: Map::new(),
        }
    }

    pub fn message_state(&self, m: &MsgInst, include_content: bool) -> GraphMessageState {
        GraphMessageState {
            message_id: m.id.clone(),
            from: m.from.clone(),
            to: m.to.clone(),
            channel: m.channel.clone(),
            channel_seq: m.channel_seq,
            causes: m.causes.clone(),
            status: match m.custody {
                Custody::Run => GraphMessageStatus::Sent,
                Custody::Attempt(_) => GraphMessageStatus::Delivered,
                Custody::Acked => GraphMessageStatus::Acked,
            },
            deliveries: m.deliveries as u64,
            value_digest: m.value_digest.clone(),
            value: include_content.then(|| m.value.clone()),
            extra: Map::new(),
        }
    }

    pub fn effect_state(&self, e: &EffectInst, include_content: bool) -> GraphEffectState {
        let mut receipt = e.receipt.clone();
        if !include_content {
            if let Some(r) = &mut receipt {
                r.result = None;
            }
        }
        GraphEffectState {
            idempotency_key: e.key.clone(),
            node: e.node.clone(),
            attempt_id: e.attempt,
            fence: e.fence,
            tool: e.call.tool.clone(),
            operation_digest: e.operation_digest.clone(),
            status: match e.status {
                EffectStatus::Intended => GraphEffectStatus::Intended,
                EffectStatus::Succeeded => GraphEffectStatus::Succeeded,
                EffectStatus::Failed => GraphEffectStatus::Failed,
                EffectStatus::Reconcile => GraphEffectStatus::Reconcile,
            },
            applied: e.applied,
            receipt,
            error: e.error.clone(),
            extra: Map::new(),
        }
    }

    /// Which kind of node a template is (for the runtime).
    pub fn spec(&self, n: &NodeInst) -> &NodeSpec {
        &self.plan().expect("started").nodes[n.tmpl].spec
    }
}
