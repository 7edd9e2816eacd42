//! The Graph Kernel inside one `AppServer`: the run store, the live runs and their threads,
//! restart resumption, and the Rust API hosts use (`AppServer::graph()` → `GraphHandle`). The
//! wire methods (wire.rs) are thin over the same calls.

use super::clock::RunClock;
use super::compiler::{compile, CompileError};
use super::effects::EffectReconciler;
use super::plan::{value_fits, Plan};
use super::port::{nobody, Follower, GraphEngine};
use super::runtime::{lock, start_events, Run};
use super::state::{RunState, DEFAULT_LEASE_MS, DEFAULT_WORKER};
use super::store::{self, RunHeader};
use super::threads::Threads;
use crate::protocol::error_code;
use crate::protocol::{
    GraphDefinition, GraphFencedAttempt, GraphRunGrant, GraphRunOptions, GraphRunStartedEvent,
    GraphRunSummary, GraphWorker, ToolResult,
};
use crate::rollout::trace::Trace;
use crate::rollout::{RolloutStore, StoreError};
use serde_json::{json, Map, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Runs that may be live (not terminal) at once; one more start is -32001.
pub const MAX_LIVE_RUNS: usize = 64;
/// Large compiles (graph/validate, graph/run/start of more than `LARGE_COMPILE_ELEMENTS` nodes
/// and edges) running at once on their own threads; one more is -32001 (server busy).
pub const MAX_CONCURRENT_COMPILES: usize = 2;

/// One of the server's large-compile slots, given back when dropped.
pub struct CompileSlot {
    taken: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for CompileSlot {
    fn drop(&mut self) {
        self.taken.fetch_sub(1, Ordering::SeqCst);
    }
}
/// Finished runs kept reduced in memory for reads; older ones are replayed from their logs.
const KEEP_FINISHED: usize = 64;

/// Why a graph call was refused; `code()` is the JSON-RPC code the wire answers with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GraphError {
    #[error("the definition does not compile: {0}")]
    Invalid(CompileError),
    #[error("invalid params: {0}")]
    Params(String),
    #[error("graph run {0:?} not found")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{MAX_LIVE_RUNS} graph runs are live, the most this server runs at once; retry when one ends")]
    Overloaded,
    #[error("the graph run store failed: {0}")]
    Store(String),
    #[error("the server is shutting down")]
    Closed,
}

impl GraphError {
    pub fn code(&self) -> i64 {
        match self {
            GraphError::Invalid(_) | GraphError::Params(_) => error_code::INVALID_PARAMS,
            GraphError::NotFound(_) => error_code::NOT_FOUND,
            GraphError::Conflict(_) => error_code::CONFLICT,
            GraphError::Overloaded => error_code::OVERLOADED,
            GraphError::Store(_) | GraphError::Closed => error_code::INTERNAL,
        }
    }
}

impl From<StoreError> for GraphError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(id) => GraphError::NotFound(id),
            StoreError::InvalidId { .. } | StoreError::InvalidArgument(_) => {
                GraphError::Params(e.to_string())
            }
            StoreError::AlreadyExists(id) => {
                GraphError::Conflict(format!("graph run {id:?} already exists"))
            }
            other => GraphError::Store(other.to_string()),
        }
    }
}

struct Settings {
    clock: RunClock,
    reconciler: Option<Arc<dyn EffectReconciler>>,
}

/// The graph runtime of one server (a field of the engine's `Inner`).
pub struct GraphHost {
    /// `<state>/graph-runs`, opened at the server's open if it exists, else at the first run:
    /// a server that never runs a graph leaves its state directory as it was.
    store: Mutex<Option<Arc<dyn RolloutStore>>>,
    kind: crate::rollout::StoreKind,
    options: crate::rollout::StoreOptions,
    state_dir: std::path::PathBuf,
    runs: Mutex<HashMap<String, Arc<Run>>>,
    finished: Mutex<VecDeque<String>>,
    /// idempotencyKey → (run id, params digest), rebuilt from the run headers at open.
    keys: Mutex<HashMap<String, (String, String)>>,
    settings: Mutex<Settings>,
    pub(crate) threads: Arc<Threads>,
    stopping: AtomicBool,
    /// Serialises run creation (id and key checks, then the log).
    starting: Mutex<()>,
    /// Large compiles running now (`MAX_CONCURRENT_COMPILES`).
    compiles: Arc<std::sync::atomic::AtomicUsize>,
    /// The engine this runtime runs attempts on.
    engine: Weak<dyn GraphEngine>,
}

/// A server's run store, opened before its engine exists; `attach` makes the engine's host of it.
pub struct OpenedRuns {
    store: Option<Arc<dyn RolloutStore>>,
    kind: crate::rollout::StoreKind,
    options: crate::rollout::StoreOptions,
    state_dir: std::path::PathBuf,
}

impl OpenedRuns {
    /// The graph runtime of `engine` (called while the engine is being made, so it takes a weak).
    pub fn attach(self, engine: Weak<dyn GraphEngine>) -> GraphHost {
        GraphHost {
            store: Mutex::new(self.store),
            kind: self.kind,
            options: self.options,
            state_dir: self.state_dir,
            runs: Mutex::new(HashMap::new()),
            finished: Mutex::new(VecDeque::new()),
            keys: Mutex::new(HashMap::new()),
            settings: Mutex::new(Settings {
                clock: RunClock::System,
                reconciler: None,
            }),
            threads: Arc::new(Threads::default()),
            stopping: AtomicBool::new(false),
            starting: Mutex::new(()),
            compiles: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            engine,
        }
    }
}

impl GraphHost {
    /// Opens `<state_dir>/graph-runs` (if it exists) with the server's store kind and options;
    /// a server that never runs a graph leaves its state directory as it was.
    pub fn open(
        kind: crate::rollout::StoreKind,
        state_dir: &std::path::Path,
        options: crate::rollout::StoreOptions,
    ) -> Result<OpenedRuns, StoreError> {
        let store = if store::runs_dir(state_dir).exists() {
            Some(store::open_runs(kind, state_dir, options.clone())?)
        } else {
            None
        };
        Ok(OpenedRuns {
            store,
            kind,
            options,
            state_dir: state_dir.to_path_buf(),
        })
    }

    /// The engine, while it lives.
    fn engine(&self) -> Option<Arc<dyn GraphEngine>> {
        self.engine.upgrade()
    }

    /// Takes a large-compile slot; None when `MAX_CONCURRENT_COMPILES` are taken.
    pub(crate) fn compile_slot(&self) -> Option<CompileSlot> {
        self.compiles
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < MAX_CONCURRENT_COMPILES).then_some(n + 1)
            })
            .ok()
            .map(|_| CompileSlot {
                taken: Arc::clone(&self.compiles),
            })
    }

    /// The run store, if any run was ever started here.
    pub(crate) fn existing_store(&self) -> Option<Arc<dyn RolloutStore>> {
        lock(&self.store).clone()
    }

    /// The run store, created on first use.
    pub(crate) fn store(&self) -> Result<Arc<dyn RolloutStore>, StoreError> {
        let mut s = lock(&self.store);
        if let Some(store) = &*s {
            return Ok(Arc::clone(store));
        }
        let store = store::open_runs(self.kind, &self.state_dir, self.options.clone())?;
        *s = Some(Arc::clone(&store));
        Ok(store)
    }

    fn spawn_scheduler(self: &Arc<Self>, run: &Arc<Run>) {
        if !Run::claim_scheduler(&mut run.enter()) {
            return;
        }
        let (r, threads, host) = (
            Arc::clone(run),
            Arc::clone(&self.threads),
            Arc::downgrade(self),
        );
        if !self
            .threads
            .spawn(&format!("cc-graph-{}", run.id), move || {
                // What the scheduler logs carries the run's trace id (docs/rollout-format.md).
                let trace_id = r.enter().state.trace_id.clone().unwrap_or_default();
                let _span = tracing::error_span!(
                    "graph_run",
                    trace_id = trace_id.as_str(),
                    run_id = r.id.as_str()
                )
                .entered();
                // A finished run leaves the live set (it stays readable, replayed from its log).
                if r.schedule(&threads) {
                    if let Some(host) = host.upgrade() {
                        host.remember_finished(&r.id);
                    }
                }
            })
        {
            run.enter().broken = Some("no scheduler thread".into());
            run.wake.notify_all();
            run.done.notify_all();
        }
    }

    /// Stops every run where it is (nothing more is recorded; the next open resumes them),
    /// cancels the attempts' turns and joins every graph thread.
    pub fn shutdown(&self) {
        if self.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        // A start in progress (a compile thread's, say) either finishes registering its run
        // before this takes the lock — and is stopped below — or sees `stopping` after it.
        drop(lock(&self.starting));
        let runs: Vec<Arc<Run>> = lock(&self.runs).values().cloned().collect();
        for run in runs {
            let mut core = run.enter();
            core.stopping = true;
            for live in core.live.values() {
                live.fence();
            }
            run.wake.notify_all();
        }
        self.threads.join_all();
        if let Some(store) = self.existing_store() {
            let _ = store.flush();
        }
    }

    pub(crate) fn remember_finished(&self, run_id: &str) {
        let mut f = lock(&self.finished);
        if f.iter().any(|r| r == run_id) {
            return;
        }
        f.push_back(run_id.to_string());
        while f.len() > KEEP_FINISHED {
            if let Some(old) = f.pop_front() {
                lock(&self.runs).remove(&old);
            }
        }
    }
}

/// Resumes every run a previous process left unfinished (called once by `AppServer::open`). An
/// attempt's turn the dead process left open is closed (`serverRestarted`) when its thread is
/// first touched (core/src/engine/threads.rs), which a resumed attempt does before it runs again.
pub fn resume(host: &Arc<GraphHost>) {
    let Some(runs_store) = host.existing_store() else {
        return;
    };
    let (runs, unreadable) = match store::list_runs(&*runs_store) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(target: "cc_app_server::graph", "cannot list graph runs, none resumed: {e}");
            return;
        }
    };
    for (id, why) in unreadable {
        tracing::warn!(target: "cc_app_server::graph", "graph run {id} cannot be read and was not resumed: {why}");
    }
    for (header, archived) in runs {
        if let Some(k) = &header.idempotency_key {
            lock(&host.keys).insert(
                k.clone(),
                (header.run_id.clone(), header.params_digest.clone()),
            );
        }
        if archived {
            continue;
        }
        let state = match store::load(&*runs_store, &header.run_id) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(target: "cc_app_server::graph", "graph run {} cannot be read and was not resumed: {e}", header.run_id);
                continue;
            }
        };
        if state.status.is_terminal() {
            let _ = runs_store.set_archived(&header.run_id, true);
            continue;
        }
        let resumed = state.start.is_some();
        let run = new_run(
            host,
            Arc::clone(&runs_store),
            &header.run_id,
            state,
            nobody(),
            resumed,
        );
        lock(&host.runs).insert(header.run_id.clone(), Arc::clone(&run));
        host.spawn_scheduler(&run);
    }
}

fn new_run(
    host: &Arc<GraphHost>,
    runs: Arc<dyn RolloutStore>,
    id: &str,
    state: RunState,
    owner: Weak<dyn Follower>,
    resumed: bool,
) -> Arc<Run> {
    let (clock, reconciler) = {
        let s = lock(&host.settings);
        (s.clock.clone(), s.reconciler.clone())
    };
    Run::new(
        id,
        state,
        Weak::clone(&host.engine),
        super::exec::execute,
        runs,
        clock,
        reconciler,
        owner,
        resumed,
    )
}

/// What this process did for one run (`GraphHandle::run_stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunStats {
    /// Appends to the run's log (each one durable batch).
    pub commits: u64,
    /// Events those appends carried.
    pub events_appended: u64,
    /// Attempts whose work is running in this process now.
    pub live_attempts: usize,
}

/// What `GraphHandle::start` (and graph/run/start) takes.
#[derive(Debug, Clone)]
pub struct StartRequest {
    /// The GraphDefinition as JSON (its digest is taken over exactly this).
    pub definition: Value,
    pub run_id: Option<String>,
    pub inputs: Map<String, Value>,
    pub grant: GraphRunGrant,
    pub options: Option<GraphRunOptions>,
    pub idempotency_key: Option<String>,
    /// The caller's W3C `traceparent` (else the run starts a trace of its own).
    pub traceparent: Option<String>,
}

impl StartRequest {
    pub fn new(definition: Value, grant: GraphRunGrant) -> Self {
        StartRequest {
            definition,
            run_id: None,
            inputs: Map::new(),
            grant,
            options: None,
            idempotency_key: None,
            traceparent: None,
        }
    }
}

/// A grant of the given capabilities and no budgets.
pub fn grant(capabilities: &[&str]) -> GraphRunGrant {
    GraphRunGrant {
        capabilities: capabilities.iter().map(|c| c.to_string()).collect(),
        budgets: None,
    }
}

fn resolved_options(options: Option<&GraphRunOptions>) -> GraphRunOptions {
    let workers = options
        .and_then(|o| o.workers.clone())
        .filter(|w| !w.is_empty())
        .unwrap_or_else(|| {
            vec![GraphWorker {
                id: DEFAULT_WORKER.0.into(),
                capacity: DEFAULT_WORKER.1 as u64,
            }]
        });
    GraphRunOptions {
        workers: Some(workers),
        lease_ms: Some(options.and_then(|o| o.lease_ms).unwrap_or(DEFAULT_LEASE_MS)),
    }
}

fn check_inputs(plan: &Plan, inputs: &Map<String, Value>) -> Result<(), GraphError> {
    let ports = &plan.root().inputs;
    if let Some(k) = inputs.keys().find(|k| !ports.iter().any(|p| &p.name == *k)) {
        return Err(GraphError::Params(format!(
            "inputs.{k}: the graph has no input {k:?}"
        )));
    }
    for p in ports {
        match inputs.get(&p.name) {
            None => {
                return Err(GraphError::Params(format!(
                    "inputs.{}: missing; the graph needs every input it declares",
                    p.name
                )))
            }
            Some(v) if !super::plan::within_depth(v, super::plan::MAX_VALUE_DEPTH) => {
                return Err(GraphError::Params(format!(
                    "inputs.{}: nests more than {} levels",
                    p.name,
                    super::plan::MAX_VALUE_DEPTH
                )))
            }
            Some(v) if !value_fits(p.ty, v) => {
                return Err(GraphError::Params(format!(
                    "inputs.{}: must be {}",
                    p.name,
                    super::plan::port_type_name(p.ty)
                )))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

fn random_run_id() -> String {
    format!("gr-{}", &crate::approval::new_nonce()[..20])
}

/// Starts a run: compiles, records the header and `graphRunStarted` durably, then schedules.
pub(crate) fn start(
    host: &Arc<GraphHost>,
    req: StartRequest,
    owner: Weak<dyn Follower>,
) -> Result<(Arc<Run>, GraphRunSummary), GraphError> {
    if host.stopping.load(Ordering::SeqCst) || host.engine().is_none_or(|e| e.is_shut_down()) {
        return Err(GraphError::Closed);
    }
    let plan = Arc::new(
        compile(&req.definition, &req.grant)
            .map_err(|errors| GraphError::Invalid(errors[0].clone()))?,
    );
    check_inputs(&plan, &req.inputs)?;
    let trace = Trace::of_request(req.traceparent.as_deref()).map_err(GraphError::Params)?;
    let options = resolved_options(req.options.as_ref());
    let params_digest = crate::approval::digest_json(&json!({
        "definition": req.definition,
        "inputs": req.inputs,
        "grant": req.grant,
        "options": options,
    }));
    let _starting = lock(&host.starting);
    if host.stopping.load(Ordering::SeqCst) {
        return Err(GraphError::Closed);
    }
    let runs_store = host.store()?;
    let same = |id: &str, digest: &str| -> Result<(Arc<Run>, GraphRunSummary), GraphError> {
        if digest == params_digest {
            let run = get(host, id)?;
            let summary = {
                let mut core = run.enter();
                // Joining a run whose starter is gone (a restart, a closed connection) makes the
                // joiner the one its tool approvals are asked of.
                if core.owner.strong_count() == 0 && owner.strong_count() > 0 {
                    core.owner = owner.clone();
                }
                core.state.summary(false)
            };
            Ok((run, summary))
        } else {
            Err(GraphError::Conflict(format!(
                "graph run {id:?} exists with other params; pick another id or key"
            )))
        }
    };
    if let Some(key) = &req.idempotency_key {
        if let Some((id, digest)) = lock(&host.keys).get(key).cloned() {
            return same(&id, &digest);
        }
    }
    let run_id = req.run_id.clone().unwrap_or_else(random_run_id);
    crate::rollout::validate_thread_id(&run_id)?;
    if run_id.len() > 64 {
        return Err(GraphError::Params("runId: at most 64 characters".into()));
    }
    match runs_store.summary(&run_id) {
        Ok(s) => {
            let digest = RunHeader::from_metadata(&run_id, &s.metadata)
                .map(|h| h.params_digest)
                .unwrap_or_default();
            return same(&run_id, &digest);
        }
        Err(StoreError::NotFound(_)) => {}
        Err(e) => return Err(e.into()),
    }
    let live = lock(&host.runs)
        .values()
        .filter(|r| !r.enter().state.status.is_terminal())
        .count();
    if live >= MAX_LIVE_RUNS {
        return Err(GraphError::Overloaded);
    }
    let definition: GraphDefinition = serde_json::from_value(req.definition.clone())
        .map_err(|e| GraphError::Params(format!("definition: {e}")))?;
    let header = RunHeader {
        run_id: run_id.clone(),
        graph_id: plan.graph_id.clone(),
        plan_digest: plan.digest.clone(),
        params_digest: params_digest.clone(),
        idempotency_key: req.idempotency_key.clone(),
    };
    store::create_log(
        &*runs_store,
        &header,
        plan.title
            .clone()
            .or(Some(format!("graph {}", plan.graph_id))),
        Some(&trace),
    )?;
    let clock = lock(&host.settings).clock.clone();
    let started = GraphRunStartedEvent {
        run_id: run_id.clone(),
        definition,
        plan_digest: plan.digest.clone(),
        grant: req.grant.clone(),
        inputs: req.inputs.clone(),
        options,
        started_at_ms: clock.now_ms().max(0) as u64,
        extra: Map::new(),
    };
    let events = start_events(started, &plan);
    let mut state = store::load(&*runs_store, &run_id)?;
    state.preload(Arc::clone(&plan), req.grant.clone());
    let run = new_run(host, Arc::clone(&runs_store), &run_id, state, owner, false);
    // The answer is the run as its start left it, taken before the scheduler can move on.
    let summary = {
        let mut core = run.enter();
        core.start_trace = Some(trace);
        run.commit(&mut core, events)?;
        core.state.summary(false)
    };
    if let Some(key) = &req.idempotency_key {
        lock(&host.keys).insert(key.clone(), (run_id.clone(), params_digest));
    }
    lock(&host.runs).insert(run_id, Arc::clone(&run));
    host.spawn_scheduler(&run);
    Ok((run, summary))
}

/// A run: live, recently finished, or replayed from its log.
pub(crate) fn get(host: &Arc<GraphHost>, run_id: &str) -> Result<Arc<Run>, GraphError> {
    if let Some(r) = lock(&host.runs).get(run_id) {
        return Ok(Arc::clone(r));
    }
    crate::rollout::validate_thread_id(run_id)
        .map_err(|_| GraphError::NotFound(run_id.to_string()))?;
    let Some(runs_store) = host.existing_store() else {
        return Err(GraphError::NotFound(run_id.to_string()));
    };
    let state = store::load(&*runs_store, run_id)?;
    if state.start.is_none() && state.last_seq == 0 {
        return Err(GraphError::NotFound(run_id.to_string()));
    }
    let run = new_run(host, runs_store, run_id, state, nobody(), false);
    let run = Arc::clone(lock(&host.runs).entry(run_id.to_string()).or_insert(run));
    if run.enter().state.status.is_terminal() {
        host.remember_finished(run_id);
    }
    Ok(run)
}

/// The Graph Kernel of a server, for Rust hosts (`AppServer::graph()`).
#[derive(Clone)]
pub struct GraphHandle {
    host: Arc<GraphHost>,
    /// Holds the server open while the handle lives (its runs need the engine's turns).
    _engine: Arc<dyn GraphEngine>,
}

impl GraphHandle {
    /// The handle of `engine`'s graph runtime `host` (hosts get it from `AppServer::graph()`).
    pub fn new(host: Arc<GraphHost>, engine: Arc<dyn GraphEngine>) -> Self {
        GraphHandle {
            host,
            _engine: engine,
        }
    }

    /// Compiles a definition for a run with `grant`, running nothing.
    pub fn validate(
        &self,
        definition: &Value,
        grant: &GraphRunGrant,
    ) -> Result<Plan, Vec<CompileError>> {
        compile(definition, grant)
    }

    /// Takes one of the server's large-compile slots (what graph/validate and graph/run/start
    /// of a large definition hold while they compile), so a host compiling large definitions
    /// itself shares the same bound; None while `MAX_CONCURRENT_COMPILES` are taken. The slot
    /// is given back when dropped.
    pub fn compile_slot(&self) -> Option<CompileSlot> {
        self.host.compile_slot()
    }

    /// Starts a run; returns once its start is durable.
    pub fn start(&self, req: StartRequest) -> Result<GraphRunSummary, GraphError> {
        Ok(start(&self.host, req, nobody())?.1)
    }

    /// The run's state (the reduction of its log), cloned.
    pub fn state(&self, run_id: &str) -> Result<RunState, GraphError> {
        let run = get(&self.host, run_id)?;
        let s = run.enter().state.clone();
        Ok(s)
    }

    pub fn summary(
        &self,
        run_id: &str,
        include_content: bool,
    ) -> Result<GraphRunSummary, GraphError> {
        let run = get(&self.host, run_id)?;
        let s = run.enter().state.summary(include_content);
        Ok(s)
    }

    /// Waits until the run is terminal (or `timeout`); returns its summary either way.
    pub fn wait(&self, run_id: &str, timeout: Duration) -> Result<GraphRunSummary, GraphError> {
        let run = get(&self.host, run_id)?;
        let deadline = Instant::now() + timeout;
        let mut core = run.enter();
        while !core.state.status.is_terminal() && core.broken.is_none() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            // Every end (terminal, broken, scheduler gone) notifies `done`: no slices needed.
            core = run
                .done
                .wait_timeout(core, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(core.state.summary(true))
    }

    /// Cancels a run: every outstanding attempt fenced durably before this returns.
    pub fn cancel(
        &self,
        run_id: &str,
        reason: Option<String>,
    ) -> Result<Vec<GraphFencedAttempt>, GraphError> {
        let run = get(&self.host, run_id)?;
        run.cancel(reason).map_err(GraphError::from)
    }

    /// Replaces the clock new runs (and runs resumed later) use for leases and wall-time
    /// budgets; tests pass a manual one.
    pub fn set_clock(&self, clock: RunClock) {
        lock(&self.host.settings).clock = clock;
    }

    /// Sets who answers "did this effect happen?" for intended effects without an outcome, and
    /// asks it about every effect now waiting in reconcile.
    pub fn set_reconciler(&self, reconciler: Arc<dyn EffectReconciler>) {
        lock(&self.host.settings).reconciler = Some(Arc::clone(&reconciler));
        let runs: Vec<Arc<Run>> = lock(&self.host.runs).values().cloned().collect();
        for r in runs {
            *lock(&r.reconciler) = Some(Arc::clone(&reconciler));
            r.reconciler_changed();
        }
    }

    /// The host's decision on an effect in reconcile: `Some(result)` it happened (with this
    /// result), `None` it did not (the key may run again).
    pub fn resolve_effect(
        &self,
        run_id: &str,
        key: &str,
        applied: Option<ToolResult>,
    ) -> Result<(), GraphError> {
        let run = get(&self.host, run_id)?;
        run.resolve_effect(key, applied)
            .map_err(GraphError::Conflict)
    }

    /// Delivers a message again (at least once); true if it had been consumed already, in which
    /// case it is acknowledged as a duplicate and not processed again.
    pub fn redeliver(&self, run_id: &str, message_id: &str) -> Result<bool, GraphError> {
        let run = get(&self.host, run_id)?;
        run.redeliver(message_id).map_err(GraphError::Conflict)
    }

    /// What this process did for a run: appends to its log, events they carried, attempts
    /// running here now (diagnostics and benchmarks).
    pub fn run_stats(&self, run_id: &str) -> Result<RunStats, GraphError> {
        let run = get(&self.host, run_id)?;
        let core = run.enter();
        Ok(RunStats {
            commits: core.commits,
            events_appended: core.events_appended,
            live_attempts: core.live.len(),
        })
    }

    /// Every run in the store: (header, finished).
    pub fn list(&self) -> Result<Vec<(RunHeader, bool)>, GraphError> {
        match self.host.existing_store() {
            Some(s) => Ok(store::list_runs(&*s)?.0),
            None => Ok(Vec::new()),
        }
    }

    /// The run store (for verification and tools), created if no run was started yet.
    pub fn store(&self) -> Result<Arc<dyn RolloutStore>, GraphError> {
        Ok(self.host.store()?)
    }
}
