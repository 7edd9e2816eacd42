//! The engine's side of the Graph Kernel's port (core/src/graph/port.rs): an attempt of a graph
//! node runs here as an ordinary turn on a thread of its own, so its tool calls pass the one
//! approval gate every turn passes; the graph host reaches the engine through nothing else.

use super::causal::Step;
use super::outbound::deliver;
use super::pipeline::emit_locked;
use super::threads::data_from_summary;
use super::turn::{event, run_on, TurnShared};
use super::{lock, ConnShared, Inner, ThreadState};
use crate::graph::port::{AttemptEnd, AttemptTurn, Follower, GraphEngine, TurnCancel};
use crate::kernel::AgentKernel;
use crate::protocol::{EventPayload, TextInput, TurnStartedEvent, UserInput};
use crate::rollout::trace::Trace;
use crate::rollout::RolloutStore;
use serde_json::Map;
use std::any::Any;
use std::sync::{Arc, Weak};

impl Follower for ConnShared {
    fn is_open(&self) -> bool {
        ConnShared::is_open(self)
    }
    fn has_feature(&self, feature: &str) -> bool {
        ConnShared::has_feature(self, feature)
    }
}

impl TurnCancel for TurnShared {
    fn cancel(&self) {
        TurnShared::cancel(self)
    }
}

/// The connection behind a follower (every follower the engine hands the graph is one).
fn connection(follower: &Weak<dyn Follower>) -> Weak<ConnShared> {
    follower
        .upgrade()
        .and_then(|f| {
            (f as Arc<dyn Any + Send + Sync>)
                .downcast::<ConnShared>()
                .ok()
        })
        .map_or_else(Weak::new, |c| Arc::downgrade(&c))
}

impl GraphEngine for Inner {
    fn is_shut_down(&self) -> bool {
        self.lifecycle.is_shut_down()
    }

    fn kernel(&self) -> &dyn AgentKernel {
        &*self.config.kernel
    }

    fn thread_store(&self) -> &dyn RolloutStore {
        &*self.store
    }

    fn run_attempt(
        self: Arc<Self>,
        attempt: AttemptTurn<'_>,
        kernel: &dyn AgentKernel,
    ) -> Result<AttemptEnd, String> {
        // The attempt's turn is in its run's trace, and names the run's event that started the
        // attempt (`event:<hash>`), as the thread's header does.
        let trace = Trace {
            id: attempt
                .extra
                .trace_id
                .clone()
                .unwrap_or_else(|| Trace::fresh().id),
            caller: attempt.extra.parent_id.clone(),
        };
        let (summary, _) = self
            .store
            .start_recorded(attempt.thread, attempt.extra)
            .map_err(|e| format!("could not create the attempt's thread: {e}"))?;
        let thread_id = summary.thread_id.clone();
        let mut data = data_from_summary(&summary);
        data.agent_options = attempt.agent_options;
        let thread = self.threads.add(&thread_id, data, &self.stats);
        let turn = TurnShared::new(
            attempt.turn_id,
            thread.id.clone(),
            connection(&attempt.owner),
            summary.last_seq,
        );
        // Every tool call of the turn goes to the executor with the node's write scope, so it
        // can check the path the tool actually resolves.
        if !attempt.write_scope.is_empty() {
            let _ = turn.write_scope.set(attempt.write_scope.to_vec());
        }
        let input = vec![UserInput::Text(TextInput { text: attempt.text })];
        let recorded = {
            let guard = lock(&thread.emit_lock);
            lock(&thread.data).active = Some(Arc::clone(&turn));
            let mut started = event(&EventPayload::TurnStarted(TurnStartedEvent {
                turn_id: turn.id.clone(),
                input: input.clone(),
                extra: Map::new(),
            }));
            {
                let mut t = lock(&turn.trace);
                t.begin(trace);
                (started.trace_id, started.parent_id) = t.ids(Step::TurnStarted, None);
            }
            emit_locked(&self, &thread, &guard, vec![started], |events| {
                turn.set_started_at(&events[0].time);
                lock(&turn.trace).recorded(Step::TurnStarted, None, events[0].seq);
                Vec::new()
            })
        };
        if let Err(e) = recorded {
            lock(&thread.data).active = None;
            return Err(format!("could not record the attempt's turn: {e}"));
        }
        (attempt.started)(Arc::clone(&turn) as Arc<dyn TurnCancel>);
        run_on(
            Arc::clone(&self),
            Arc::clone(&thread),
            Arc::clone(&turn),
            input,
            kernel,
        );
        let ended = turn.to_ended();
        archive(&self, &thread);
        Ok(AttemptEnd {
            status: ended.turn.status,
            error: ended.error,
        })
    }

    fn deliver(&self, to: &dyn Follower, text: String) {
        if let Some(conn) = (to as &dyn Any).downcast_ref::<ConnShared>() {
            deliver(&self.stats, conn, text);
        }
    }
}

/// Hides a finished attempt's thread from the default thread/list (thread/read still reads it).
fn archive(inner: &Inner, thread: &ThreadState) {
    let _emitting = lock(&thread.emit_lock);
    if lock(&thread.data).is_busy() {
        return;
    }
    match inner.store.set_archived(&thread.id, true) {
        Ok(ev) => {
            let mut d = lock(&thread.data);
            d.archived = true;
            d.last_seq = ev.seq;
            d.updated_at = ev.time;
        }
        Err(e) => {
            tracing::warn!(target: "cc_app_server::graph", "could not archive attempt thread {}: {e}", thread.id)
        }
    }
}
