//! Where graph runs live: a second rollout store of the server's kind and durability on
//! `<state>/graph-runs/`, one log per run. A run's log is an ordinary thread log — header
//! (`threadStarted`, title and metadata naming the graph and its plan digest), hash chain, torn
//! tail repair, corruption refusal, anchors — whose events are the schema's graph event types;
//! only the public `RolloutStore` trait is used.

use super::state::RunState;
use crate::rollout::trace::Trace;
use crate::rollout::{
    open_store, HeaderExtra, ListQuery, RolloutStore, StoreError, StoreKind, StoreOptions,
    StoredEvent, ThreadStart, MAX_READ_LIMIT,
};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The graph runs' directory inside a state directory.
pub const RUNS_DIR: &str = "graph-runs";

/// `<state>/graph-runs`.
pub fn runs_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(RUNS_DIR)
}

/// Opens (creating if needed) the run store of a state directory.
pub fn open_runs(
    kind: StoreKind,
    state_dir: &Path,
    options: StoreOptions,
) -> Result<Arc<dyn RolloutStore>, StoreError> {
    open_store(kind, &runs_dir(state_dir), options)
}

/// What a run's header records, so `list` answers without reading logs.
#[derive(Debug, Clone, PartialEq)]
pub struct RunHeader {
    pub run_id: String,
    pub graph_id: String,
    pub plan_digest: String,
    /// Digest of the start params (definition, inputs, grant, options): a retried start with the
    /// same run id or idempotency key is the same run only if this matches.
    pub params_digest: String,
    pub idempotency_key: Option<String>,
}

impl RunHeader {
    fn metadata(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("kind".into(), "graphRun".into());
        m.insert("graphId".into(), self.graph_id.clone().into());
        m.insert("planDigest".into(), self.plan_digest.clone().into());
        m.insert("paramsDigest".into(), self.params_digest.clone().into());
        if let Some(k) = &self.idempotency_key {
            m.insert("idempotencyKey".into(), k.clone().into());
        }
        m
    }

    pub fn from_metadata(run_id: &str, m: &Map<String, Value>) -> Option<RunHeader> {
        let s = |k: &str| m.get(k).and_then(Value::as_str).map(str::to_string);
        (s("kind").as_deref() == Some("graphRun")).then(|| RunHeader {
            run_id: run_id.to_string(),
            graph_id: s("graphId").unwrap_or_default(),
            plan_digest: s("planDigest").unwrap_or_default(),
            params_digest: s("paramsDigest").unwrap_or_default(),
            idempotency_key: s("idempotencyKey"),
        })
    }
}

/// Creates a run's log (seq 1, its header). The caller appends `graphRunStarted` next.
pub fn create_log(
    store: &dyn RolloutStore,
    header: &RunHeader,
    title: Option<String>,
    trace: Option<&Trace>,
) -> Result<(), StoreError> {
    let title = title.map(|t| t.chars().take(crate::rollout::MAX_TITLE_CHARS).collect());
    store
        .start_recorded(
            ThreadStart {
                thread_id: header.run_id.clone(),
                title,
                metadata: header.metadata(),
                forked_from: None,
            },
            HeaderExtra {
                agent_options: None,
                idempotency_key: header.idempotency_key.clone(),
                trace_id: trace.map(|t| t.id.clone()),
                parent_id: trace.and_then(|t| t.caller.clone()),
            },
        )
        .map(|_| ())
}

/// Calls `f` on every event of a run's log, in order.
pub fn for_each_event(
    store: &dyn RolloutStore,
    run_id: &str,
    mut f: impl FnMut(&StoredEvent),
) -> Result<(), StoreError> {
    let mut after = 0;
    loop {
        let page = store.read(run_id, after, MAX_READ_LIMIT)?;
        for e in &page.events {
            f(e);
        }
        match page.events.last() {
            Some(last) if page.has_more => after = last.seq,
            _ => return Ok(()),
        }
    }
}

/// A run's state, reduced from its whole log.
pub fn load(store: &dyn RolloutStore, run_id: &str) -> Result<RunState, StoreError> {
    let mut state = RunState::new(run_id);
    for_each_event(store, run_id, |e| state.apply(e))?;
    state.take_touched();
    Ok(state)
}

/// Every run's header with whether it finished, and the runs that could not be read (id, why).
pub type RunList = (Vec<(RunHeader, bool)>, Vec<(String, String)>);

/// Every run's header, archived (finished) ones included, and the runs that could not be read.
pub fn list_runs(store: &dyn RolloutStore) -> Result<RunList, StoreError> {
    let mut out = Vec::new();
    let mut unreadable = Vec::new();
    let mut cursor = None;
    loop {
        let page = store.list(&ListQuery {
            include_archived: true,
            cursor,
            limit: crate::rollout::MAX_LIST_LIMIT,
        })?;
        for s in &page.threads {
            match RunHeader::from_metadata(&s.thread_id, &s.metadata) {
                Some(h) => out.push((h, s.archived)),
                None => unreadable.push((s.thread_id.clone(), "not a graph run log".to_string())),
            }
        }
        unreadable.extend(page.unreadable);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok((out, unreadable)),
        }
    }
}
