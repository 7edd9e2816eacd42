//! Running one attempt of an agent or tool node: as a turn of the engine, on a thread of its
//! own (`graph-<run>-a<attempt>`, archived when the attempt ends), so its tool calls pass the
//! engine's one approval gate exactly as any turn's do. The attempt's `TurnContext` is wrapped:
//! every tool call becomes an effect (intended durably before the gate, outcome with a receipt
//! after), every sign of progress renews the lease, and a stale fence stops the kernel.

use super::effects::{self, EffectContext};
use super::plan::{NodeSpec, Plan};
use super::port::{AttemptEnd, AttemptTurn, Follower, GraphEngine, TurnCancel};
use super::runtime::{check_output, lock, outcome_event, Intent, Job, Outcome, Run};
use super::state::run_error;
use crate::kernel::{AgentKernel, History, KernelError, ToolSpec, TurnContext};
use crate::protocol::{
    GraphReceiptSource, GraphRunError, ItemContent, ItemDelta, ToolCall, ToolResult,
    ToolResultDenied, TurnStatus, UserInput,
};
use crate::rollout::{HeaderExtra, ThreadStart};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// What the wrapped context saw during the turn.
struct Seen {
    last_message: Mutex<Option<String>>,
    last_tool: Mutex<Option<ToolResult>>,
    tokens: AtomicU64,
    occurrences: Mutex<HashMap<String, u32>>,
    last_renew: AtomicI64,
    /// A failure the attempt itself decided (a budget), and whether it may be retried.
    failure: Mutex<Option<(GraphRunError, bool)>>,
}

struct Attempt<'a> {
    run: &'a Arc<Run>,
    engine: &'a dyn GraphEngine,
    job: &'a Job,
    plan: &'a Plan,
    lease_ms: i64,
    /// Tokens the run had used when the attempt started, for the run's token budget.
    run_tokens: u64,
    /// The run's granted capabilities: every tool call needs `tool:<name>` among them.
    grant: Vec<String>,
    seen: Seen,
}

/// Runs the job's attempt to its end. None when nothing should be recorded (the server is
/// stopping: the attempt is fenced by the next open instead).
pub(crate) fn execute(run: &Arc<Run>, job: &Job) -> Option<Outcome> {
    let engine = run.engine.upgrade()?;
    let (plan, owner, lease_ms, run_tokens, grant) = {
        let core = run.enter();
        (
            Arc::clone(core.state.plan()?),
            core.owner.clone(),
            Run::lease_ms(&core),
            core.state.usage.tokens,
            core.state.start.as_ref()?.grant.capabilities.clone(),
        )
    };
    let t = &plan.nodes[job.tmpl];
    let attempt = Attempt {
        run,
        engine: &*engine,
        job,
        plan: &plan,
        lease_ms,
        run_tokens,
        grant,
        seen: Seen {
            last_message: Mutex::new(None),
            last_tool: Mutex::new(None),
            tokens: AtomicU64::new(0),
            occurrences: Mutex::new(HashMap::new()),
            last_renew: AtomicI64::new(job.live.started_ms),
            failure: Mutex::new(None),
        },
    };
    let (text, options, call) = match &t.spec {
        NodeSpec::Agent {
            instructions,
            prompt,
            agent_options,
        } => {
            let mut options = agent_options
                .as_ref()
                .and_then(|o| serde_json::to_value(o).ok())
                .unwrap_or_else(|| Value::Object(Map::new()));
            if let (Some(i), Some(o)) = (instructions, options.as_object_mut()) {
                o.insert("instructions".into(), Value::String(i.clone()));
            }
            (
                agent_input(prompt.as_deref(), &t.id, &job.inputs),
                options,
                None,
            )
        }
        NodeSpec::Tool { tool, arguments } => {
            let mut args = arguments.clone();
            for (k, v) in &job.inputs {
                args.insert(k.clone(), v.clone());
            }
            let call = ToolCall {
                tool: tool.clone(),
                arguments: Value::Object(args),
            };
            (
                format!("Call the tool {tool} for graph node {:?}.", t.id),
                Value::Null,
                Some(call),
            )
        }
        _ => unreachable!("only agent and tool nodes run on workers"),
    };
    let kernel = NodeKernel {
        base: match call {
            None => Base::Agent(engine.kernel()),
            Some(c) => Base::Tool(c),
        },
        attempt: &attempt,
    };
    let turn = node_turn(
        &engine,
        run,
        job,
        &t.id,
        &t.write_scope,
        options,
        owner,
        text,
        &kernel,
    );
    if run.enter().stopping {
        return None;
    }
    Some(outcome(&attempt, turn))
}

fn agent_input(prompt: Option<&str>, node: &str, inputs: &Map<String, Value>) -> String {
    let mut text = prompt
        .map(str::to_string)
        .unwrap_or_else(|| format!("You are node {node:?} of a task graph; do its work."));
    if !inputs.is_empty() {
        text.push_str("\n\nInputs (JSON):\n");
        text.push_str(&serde_json::to_string_pretty(inputs).unwrap_or_default());
    }
    text
}

/// Runs the attempt as a turn of the engine on a thread of its own (named by the job), with
/// `kernel`, and tells the job's live state the turn's handle so a fence can stop it.
#[allow(clippy::too_many_arguments)]
fn node_turn(
    engine: &Arc<dyn GraphEngine>,
    run: &Run,
    job: &Job,
    node_id: &str,
    write_scope: &[String],
    agent_options: Value,
    owner: Weak<dyn Follower>,
    text: String,
    kernel: &dyn AgentKernel,
) -> Result<AttemptEnd, String> {
    let mut metadata = Map::new();
    metadata.insert("graphRun".into(), run.id.clone().into());
    metadata.insert("graphNode".into(), job.node.clone().into());
    metadata.insert("graphAttempt".into(), job.attempt.into());
    metadata.insert("graphFence".into(), job.fence.into());
    let thread = ThreadStart {
        thread_id: job.thread_id.clone(),
        title: Some(
            format!("graph {} node {node_id} attempt {}", run.id, job.attempt)
                .chars()
                .take(crate::rollout::MAX_TITLE_CHARS)
                .collect(),
        ),
        metadata,
        forked_from: None,
    };
    // The attempt's thread and turn are in the run's trace and name the run's event that
    // started the attempt (docs/rollout-format.md, "Trace and parent ids").
    let (trace_id, parent_id) = {
        let core = run.enter();
        let started = core.state.attempts.get(&job.attempt);
        (
            core.state.trace_id.clone(),
            started.map(|a| crate::rollout::trace::event_ref(&a.started_hash)),
        )
    };
    let extra = HeaderExtra {
        agent_options: (!agent_options.is_null()).then(|| agent_options.clone()),
        idempotency_key: None,
        parent_id: trace_id.as_ref().and(parent_id),
        trace_id,
    };
    let started = |turn: Arc<dyn TurnCancel>| {
        *lock(&job.live.turn) = Some(Arc::clone(&turn));
        if job.live.fenced.load(Ordering::SeqCst) {
            turn.cancel();
        }
    };
    Arc::clone(engine).run_attempt(
        AttemptTurn {
            thread,
            extra,
            agent_options,
            turn_id: format!("a{}-turn", job.attempt),
            text,
            write_scope,
            owner,
            started: &started,
        },
        kernel,
    )
}

/// How the attempt ended, from the turn and what the context saw.
fn outcome(a: &Attempt<'_>, turn: Result<AttemptEnd, String>) -> Outcome {
    let tokens = a.seen.tokens.load(Ordering::SeqCst);
    let failed = |code: &str, message: String, retryable: bool| Outcome::Failed {
        error: run_error(code, message, Some(&a.job.node)),
        retryable,
        tokens,
    };
    let turn = match turn {
        Ok(t) => t,
        Err(e) => return failed("attemptFailed", e, true),
    };
    if let Some((error, retryable)) = lock(&a.seen.failure).clone() {
        return Outcome::Failed {
            error,
            retryable,
            tokens,
        };
    }
    let t = &a.plan.nodes[a.job.tmpl];
    let output = |value: Value| -> Outcome {
        if t.outputs.is_empty() {
            return Outcome::Succeeded {
                outputs: Vec::new(),
                tokens,
            };
        }
        match check_output(a.plan, a.job.tmpl, 0, &value) {
            Ok(()) => Outcome::Succeeded {
                outputs: vec![(0, value)],
                tokens,
            },
            Err((code, m)) => failed(code, m, matches!(t.spec, NodeSpec::Agent { .. })),
        }
    };
    // Several outputs take the members of their names from one JSON object.
    let members = |value: &Value, retryable: bool| -> Outcome {
        let mut outputs = Vec::new();
        for (j, port) in t.outputs.iter().enumerate() {
            let Some(v) = value.get(&port.name) else {
                return failed(
                    "outputMissing",
                    format!(
                        "the result has no member {:?} for the output of that name",
                        port.name
                    ),
                    retryable,
                );
            };
            if let Err((code, m)) = check_output(a.plan, a.job.tmpl, j, v) {
                return failed(code, m, retryable);
            }
            outputs.push((j, v.clone()));
        }
        Outcome::Succeeded { outputs, tokens }
    };
    if let NodeSpec::Tool { .. } = t.spec {
        return match lock(&a.seen.last_tool).clone() {
            Some(ToolResult::Ok(ok)) if t.outputs.len() > 1 => members(&ok.output, false),
            Some(ToolResult::Ok(ok)) => output(ok.output),
            Some(ToolResult::Error(e)) => failed("toolFailed", e.message, false),
            Some(ToolResult::Denied(d)) => failed("toolDenied", d.reason, false),
            None => {
                let why = turn
                    .error
                    .map_or_else(|| "the tool call did not happen".to_string(), |e| e.message);
                failed("toolNotCalled", why, turn.status != TurnStatus::Interrupted)
            }
        };
    }
    match turn.status {
        TurnStatus::Completed => {}
        TurnStatus::Interrupted => {
            return failed(
                "interrupted",
                "the attempt's turn was interrupted".into(),
                false,
            )
        }
        _ => {
            let (code, message) = turn
                .error
                .map(|e| (e.code, e.message))
                .unwrap_or_else(|| ("kernelFailed".into(), "the agent failed".into()));
            return failed(&code, message, true);
        }
    }
    if t.outputs.is_empty() {
        return Outcome::Succeeded {
            outputs: Vec::new(),
            tokens,
        };
    }
    let Some(text) = lock(&a.seen.last_message).clone() else {
        return failed(
            "noOutput",
            "the agent finished without a message to take the node's output from".into(),
            true,
        );
    };
    if t.outputs.len() == 1 && t.outputs[0].ty == crate::protocol::GraphPortType::Text {
        return output(Value::String(text));
    }
    let parsed: Value = match serde_json::from_str(strip_fence(&text)) {
        Ok(v) => v,
        Err(e) => {
            return failed(
                "outputNotJson",
                format!("the agent's answer is not JSON ({e}); the node's outputs need JSON"),
                true,
            )
        }
    };
    if t.outputs.len() == 1 {
        return output(parsed);
    }
    members(&parsed, true)
}

/// Models like to wrap JSON in a Markdown fence; the node wants what is inside.
fn strip_fence(text: &str) -> &str {
    let t = text.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return t;
    };
    let body = rest.split_once('\n').map_or("", |(_, b)| b);
    body.trim_end().strip_suffix("```").unwrap_or(body).trim()
}

/// Whether a tool call would write outside the node's declared write scope (only `write_file`
/// names its target in a way the graph can check; other tools rely on the approval gate).
fn outside_scope(write_scope: &[String], call: &ToolCall) -> Option<String> {
    if write_scope.is_empty() || call.tool != "write_file" {
        return None;
    }
    let path = call.arguments.get("path").and_then(Value::as_str)?;
    let mut p = path;
    while let Some(rest) = p.strip_prefix("./") {
        p = rest;
    }
    let inside = write_scope.iter().any(|s| {
        s == "*"
            || p == s
            || (p.starts_with(s.as_str()) && (s == "/" || p.as_bytes().get(s.len()) == Some(&b'/')))
    });
    (!inside || p.split('/').any(|seg| seg == ".."))
        .then(|| format!("write_file {path:?} is outside the node's write scope {write_scope:?}"))
}

enum Base<'a> {
    Agent(&'a dyn AgentKernel),
    Tool(ToolCall),
}

/// The kernel a node's turn runs: the server's kernel (agent nodes) or one tool call (tool
/// nodes), either way through the wrapped context.
struct NodeKernel<'a> {
    base: Base<'a>,
    attempt: &'a Attempt<'a>,
}

impl AgentKernel for NodeKernel<'_> {
    fn run_turn(&self, ctx: &dyn TurnContext, input: &[UserInput]) -> Result<(), KernelError> {
        let ctx = NodeCtx {
            base: ctx,
            a: self.attempt,
        };
        match &self.base {
            Base::Agent(k) => k.run_turn(&ctx, input),
            Base::Tool(call) => crate::kernel::run_tool_call(&ctx, call).map(drop),
        }
    }
}

struct NodeCtx<'a> {
    base: &'a dyn TurnContext,
    a: &'a Attempt<'a>,
}

impl NodeCtx<'_> {
    /// Progress renews the lease (at most every third of it); a refused renewal means the
    /// attempt is stale, and the kernel is stopped.
    fn progress(&self) -> Result<(), KernelError> {
        let a = self.a;
        if a.job.live.fenced.load(Ordering::SeqCst) {
            return Err(KernelError::Cancelled);
        }
        let now = a.run.clock.now_ms();
        let last = a.seen.last_renew.load(Ordering::SeqCst);
        if now - last >= a.lease_ms / 3 {
            a.seen.last_renew.store(now, Ordering::SeqCst);
            if !a.run.renew(a.job.attempt, a.job.fence, &a.job.node) {
                a.job.live.fence();
                return Err(KernelError::Cancelled);
            }
        }
        Ok(())
    }

    fn fail(&self, error: GraphRunError) -> KernelError {
        let message = error.message.clone();
        *lock(&self.a.seen.failure) = Some((error, false));
        KernelError::Failed(message)
    }

    /// Counts an item's reported token usage against the node's and the run's budgets.
    fn tokens(&self, item: &ItemContent) -> Result<(), KernelError> {
        let used = serde_json::to_value(item)
            .ok()
            .and_then(|v| v.get("usage")?.get("totalTokens")?.as_u64())
            .unwrap_or(0);
        if used == 0 {
            return Ok(());
        }
        let a = self.a;
        let total = a.seen.tokens.fetch_add(used, Ordering::SeqCst) + used;
        let t = &a.plan.nodes[a.job.tmpl];
        if t.budgets.max_tokens.is_some_and(|m| total > m) {
            return Err(self.fail(run_error(
                "budgetExhausted",
                "the node used its tokens (maxTokens)",
                Some(&a.job.node),
            )));
        }
        if a.plan
            .budgets
            .max_tokens
            .is_some_and(|m| a.run_tokens + total > m)
        {
            return Err(self.fail(run_error(
                "budgetExhausted",
                "the run used its tokens (maxTokens)",
                Some(&a.job.node),
            )));
        }
        Ok(())
    }
}

impl TurnContext for NodeCtx<'_> {
    fn thread_id(&self) -> &str {
        self.base.thread_id()
    }

    fn turn_id(&self) -> &str {
        self.base.turn_id()
    }

    fn agent_options(&self) -> &Value {
        self.base.agent_options()
    }

    fn new_item_id(&self) -> String {
        self.base.new_item_id()
    }

    fn item_started(&self, item: ItemContent) -> Result<(), KernelError> {
        self.progress()?;
        self.base.item_started(item)
    }

    fn item_delta(&self, item_id: &str, delta: ItemDelta) -> Result<(), KernelError> {
        self.progress()?;
        self.base.item_delta(item_id, delta)
    }

    fn item_completed(&self, item: ItemContent) -> Result<(), KernelError> {
        self.progress()?;
        if let ItemContent::AgentMessage(m) = &item {
            *lock(&self.a.seen.last_message) = Some(m.text.clone());
        }
        self.tokens(&item)?;
        self.base.item_completed(item)
    }

    fn request_tool(&self, item_id: &str, call: ToolCall) -> Result<ToolResult, KernelError> {
        self.progress()?;
        let a = self.a;
        let t = &a.plan.nodes[a.job.tmpl];
        // The run's grant covers every call, the ones an agent's model asks for included: a
        // call it does not grant is refused here, before it is an effect or reaches the gate,
        // and the kernel (the model) sees the refusal as the call's result.
        let need = format!("tool:{}", call.tool);
        if !super::compiler::granted(&a.grant, &need) {
            let denied = ToolResult::Denied(ToolResultDenied {
                reason: format!(
                    "the graph run does not grant {need:?}; the run's grant is {:?}",
                    a.grant
                )
                .chars()
                .take(1000)
                .collect(),
            });
            *lock(&a.seen.last_tool) = Some(denied.clone());
            return Ok(denied);
        }
        if let Some(why) = outside_scope(&t.write_scope, &call) {
            let denied = ToolResult::Denied(ToolResultDenied { reason: why });
            *lock(&a.seen.last_tool) = Some(denied.clone());
            return Ok(denied);
        }
        let op = crate::approval::operation_digest(&call);
        let occurrence = {
            let mut o = lock(&a.seen.occurrences);
            let n = o.entry(op.clone()).or_insert(0);
            *n += 1;
            *n - 1
        };
        let key = effects::effect_key(&a.run.id, &a.job.node, &op, occurrence);
        let (thread_id, turn_id) = (
            self.base.thread_id().to_string(),
            self.base.turn_id().to_string(),
        );
        let evidence = (thread_id.as_str(), turn_id.as_str(), item_id);
        match a.run.intend_effect(
            a.job.attempt,
            a.job.fence,
            &a.job.node,
            &key,
            &call,
            &op,
            evidence,
        ) {
            Intent::Stale => {
                a.job.live.fence();
                return Err(KernelError::Cancelled);
            }
            Intent::Budget(error) => return Err(self.fail(error)),
            Intent::Reuse(result) => {
                *lock(&a.seen.last_tool) = Some(result.clone());
                return Ok(result);
            }
            Intent::Proceed => {}
        }
        let ctx = EffectContext {
            run_id: a.run.id.clone(),
            node: a.job.node.clone(),
            idempotency_key: key.clone(),
            attempt_id: a.job.attempt,
            fence: a.job.fence,
        };
        let answer = effects::with_effect(ctx, || self.base.request_tool(item_id, call.clone()));
        // The engine records the tool's result before it reports a cancellation, so an error
        // here still has its outcome in the thread's rollout.
        let result = match &answer {
            Ok(r) => Some(r.clone()),
            Err(_) => a.engine.recorded_tool_result(&thread_id, item_id),
        };
        let Some(result) = result else {
            a.run.effect_unknown(&key, &a.job.node, "the call's outcome could not be recorded; the tool executor or the host must say whether it happened");
            return answer;
        };
        *lock(&a.seen.last_tool) = Some(result.clone());
        let receipt = outcome_event(
            &key,
            a.job.attempt,
            a.job.fence,
            &op,
            &result,
            GraphReceiptSource::Executed,
            Some(evidence),
        );
        let current = a.run.settle_effect(a.job.attempt, a.job.fence, receipt);
        if answer.is_ok() && !current {
            a.job.live.fence();
            return Err(KernelError::Cancelled);
        }
        answer
    }

    fn is_cancelled(&self) -> bool {
        self.base.is_cancelled() || self.a.job.live.fenced.load(Ordering::SeqCst)
    }

    fn sleep_cancellable(&self, duration: Duration) -> bool {
        self.base.sleep_cancellable(duration) || self.is_cancelled()
    }

    fn history(&self) -> Result<History, KernelError> {
        self.base.history()
    }

    fn tool_specs(&self) -> Vec<ToolSpec> {
        self.base.tool_specs()
    }

    fn set_error_code(&self, code: &str) {
        self.base.set_error_code(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_json_is_unwrapped() {
        assert_eq!(strip_fence("```json\n{\"a\":1}\n```"), "{\"a\":1}");
        assert_eq!(strip_fence(" {\"a\":1} "), "{\"a\":1}");
    }

    #[test]
    fn write_file_outside_the_scope_is_refused() {
        let scope = vec!["docs".to_string()];
        let call = |p: &str| ToolCall {
            tool: "write_file".into(),
            arguments: serde_json::json!({"path": p, "content": "x"}),
        };
        assert_eq!(outside_scope(&scope, &call("docs/a.md")), None);
        assert_eq!(outside_scope(&scope, &call("./docs/a.md")), None);
        assert!(outside_scope(&scope, &call("src/a.rs")).is_some());
        assert!(outside_scope(&scope, &call("docsx/a.md")).is_some());
        assert!(outside_scope(&scope, &call("docs/../src/a.rs")).is_some());
        assert_eq!(outside_scope(&[], &call("anywhere")), None);
    }
}
