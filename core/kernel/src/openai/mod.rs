//! `OpenAiCompatibleKernel`: a real agent behind the kernel trait. It speaks Chat Completions with
//! `stream: true` — the dialect of OpenAI, Ollama, vLLM, llama.cpp's server, LM Studio and
//! OpenRouter — and loops model → tools (through the approval gate) → model until the model
//! answers or `maxSteps` is reached. The HTTP stream runs on a tokio runtime the kernel owns;
//! the engine's synchronous `run_turn` only waits on a channel, records what arrives, and aborts
//! the stream the moment the turn is interrupted. See docs/kernels.md.

mod http;
pub mod messages;
pub mod sse;

use crate::history::History;
use crate::protocol::{
    AgentMessageItem, CommandExecutionItem, ErrorItem, FileChange, FileChangeItem, FileChangeKind,
    ItemContent, ItemDelta, ItemStatus, ReasoningItem, TextDelta, ToolCall, ToolCallItem,
    ToolResult, UserInput,
};
use crate::{AgentKernel, KernelError, ToolSpec, TurnContext};
use http::{StreamEvent, StreamRequest};
use messages::ToolNames;
use serde_json::{json, Map, Value};
use sse::{AssembledCall, ToolCallAssembler, Usage};
use std::sync::Arc;
use std::time::Duration;

/// How often the turn's thread looks at the cancel flag while waiting for the stream.
const POLL: Duration = Duration::from_millis(5);

/// `OpenAiConfig::idle_timeout` unless set.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// `OpenAiConfig::call_deadline` unless set.
pub const DEFAULT_CALL_DEADLINE: Duration = Duration::from_secs(600);

/// Levels of arrays and objects a tool call's arguments may nest, the arguments themselves the
/// first. The engine records a kernel's item nested at most 64 levels (`MAX_OUTPUT_DEPTH`), and
/// a generic `toolCall` item holds the arguments two levels down (item → call → arguments), so
/// this is the most that records everywhere. Deeper arguments are answered with a tool error
/// the model reads, like arguments that are not JSON.
pub const MAX_ARGUMENT_DEPTH: usize = crate::MAX_OUTPUT_DEPTH - 2;

/// How deep the arrays and objects of JSON text nest, read off the brackets outside strings
/// (for valid JSON this is the parsed value's depth; it is found without parsing, so text deeper
/// than serde_json's own 128-level limit is told apart from text that is not JSON).
fn json_text_depth(text: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// An API key that never prints.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Where the kernel finds its model and how it treats it. Per thread, `agentOptions.model` and
/// `agentOptions.instructions` override `model` and `instructions`.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// The API root, e.g. `https://api.openai.com/v1` or `http://localhost:11434/v1`;
    /// requests go to `{base_url}/chat/completions`.
    pub base_url: String,
    pub model: String,
    api_key: Option<ApiKey>,
    /// The system message.
    pub instructions: Option<String>,
    pub temperature: Option<f64>,
    /// Sent as `max_tokens`.
    pub max_output_tokens: Option<u32>,
    /// Connect + first byte, and the longest silence allowed mid-stream.
    pub request_timeout: Duration,
    /// The longest a streaming answer may go without progress — a token, a reasoning token, a
    /// tool-call fragment, the finish reason or usage — once its response has started. SSE
    /// comments (`: keep-alive`), blank lines and chunks that carry nothing do not count.
    /// Exceeded → the call fails with `modelStalled`.
    pub idle_timeout: Duration,
    /// The longest one model call may take as a whole, from its first attempt (retries and
    /// their waits included) to the end of its answer. Exceeded → `modelDeadlineExceeded`.
    pub call_deadline: Duration,
    /// Send the API key over plain `http://` to a host that is not loopback (refused otherwise).
    pub insecure_http_allowed: bool,
    /// Model requests per turn (each tool round is one); exceeded → `maxStepsExceeded`.
    pub max_steps: u32,
    /// Attempts per request for 429/5xx/connection failures, the first included.
    pub max_attempts: u32,
    pub retry_base_delay: Duration,
    /// The longest wait between attempts (a longer `Retry-After` fails the turn instead).
    pub max_retry_delay: Duration,
    /// The history is cut from its oldest turns to fit this many bytes (about 4 per token).
    pub context_budget_bytes: usize,
    /// The most of one tool result the model is sent back.
    pub max_tool_output_bytes: usize,
}

/// Why a kernel could not be built.
#[derive(Debug, thiserror::Error)]
pub enum OpenAiConfigError {
    #[error(
        "invalid base URL {0:?}: give an http:// or https:// URL such as http://localhost:11434/v1"
    )]
    BaseUrl(String),
    #[error("no model: pass one (e.g. --model gpt-4o-mini) or set CC_APP_SERVER_MODEL")]
    NoModel,
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error("{0} must be longer than zero")]
    ZeroDuration(&'static str),
    #[error(
        "refusing to send the API key over plain http to {0}, which is not a loopback host (127.0.0.0/8, ::1, localhost): use an https:// base URL, or allow it explicitly with OpenAiConfig::allow_insecure_http(true) (the CLI's --allow-insecure-http) if the network to it is trusted"
    )]
    InsecureHttp(String),
    #[error("could not set up TLS or the runtime: {0}")]
    Setup(String),
}

impl OpenAiConfig {
    /// Defaults: no key, no instructions, 120 s timeout, 60 s idle timeout, a 10 min call
    /// deadline, 16 steps, 4 attempts from 500 ms, 30 s max retry wait, a 128 KiB history
    /// budget, 16 KiB of each tool result; plain http only to loopback when a key is set.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        OpenAiConfig {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            instructions: None,
            temperature: None,
            max_output_tokens: None,
            request_timeout: Duration::from_secs(120),
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            call_deadline: DEFAULT_CALL_DEADLINE,
            insecure_http_allowed: false,
            max_steps: 16,
            max_attempts: 4,
            retry_base_delay: Duration::from_millis(500),
            max_retry_delay: Duration::from_secs(30),
            context_budget_bytes: 128 * 1024,
            max_tool_output_bytes: 16 * 1024,
        }
    }

    /// `CC_APP_SERVER_BASE_URL` (default `https://api.openai.com/v1`), `CC_APP_SERVER_MODEL`,
    /// and the key from `CC_APP_SERVER_API_KEY`, else `OPENAI_API_KEY`.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        OpenAiConfig::new(
            var("CC_APP_SERVER_BASE_URL").unwrap_or_else(|| "https://api.openai.com/v1".into()),
            var("CC_APP_SERVER_MODEL").unwrap_or_default(),
        )
        .with_api_key_from_env()
    }

    /// The key as the host gives it (`None`: send no Authorization header, as local servers want).
    pub fn with_api_key(mut self, key: Option<String>) -> Self {
        self.api_key = key.filter(|k| !k.is_empty()).map(ApiKey);
        self
    }

    /// Fills the key from `CC_APP_SERVER_API_KEY`, else `OPENAI_API_KEY`, unless one is set.
    pub fn with_api_key_from_env(self) -> Self {
        if self.api_key.is_some() {
            return self;
        }
        let key = ["CC_APP_SERVER_API_KEY", "OPENAI_API_KEY"]
            .iter()
            .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()));
        self.with_api_key(key)
    }

    pub fn has_api_key(&self) -> bool {
        self.api_key.is_some()
    }

    pub fn with_instructions(mut self, text: Option<String>) -> Self {
        self.instructions = text;
        self
    }

    pub fn with_temperature(mut self, t: Option<f64>) -> Self {
        self.temperature = t;
        self
    }

    pub fn with_max_output_tokens(mut self, n: Option<u32>) -> Self {
        self.max_output_tokens = n;
        self
    }

    pub fn with_request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    /// See [`OpenAiConfig::idle_timeout`]; must be longer than zero.
    pub fn with_idle_timeout(mut self, d: Duration) -> Self {
        self.idle_timeout = d;
        self
    }

    /// See [`OpenAiConfig::call_deadline`]; must be longer than zero.
    pub fn with_call_deadline(mut self, d: Duration) -> Self {
        self.call_deadline = d;
        self
    }

    /// `true`: allow the API key over plain `http://` to any host (only on a network you trust).
    /// Without it `OpenAiCompatibleKernel::new` refuses a key with an `http://` base URL whose
    /// host is not loopback (127.0.0.0/8, ::1, `localhost`).
    pub fn allow_insecure_http(mut self, allow: bool) -> Self {
        self.insecure_http_allowed = allow;
        self
    }

    pub fn with_max_steps(mut self, n: u32) -> Self {
        self.max_steps = n;
        self
    }

    /// Attempts per request (the first included) and the first backoff delay.
    pub fn with_retries(mut self, max_attempts: u32, base_delay: Duration) -> Self {
        self.max_attempts = max_attempts;
        self.retry_base_delay = base_delay;
        self
    }

    pub fn with_max_retry_delay(mut self, d: Duration) -> Self {
        self.max_retry_delay = d;
        self
    }

    pub fn with_context_budget_bytes(mut self, n: usize) -> Self {
        self.context_budget_bytes = n;
        self
    }

    fn endpoint(&self) -> Result<(String, String), OpenAiConfigError> {
        let bad = || OpenAiConfigError::BaseUrl(self.base_url.chars().take(200).collect());
        let mut url =
            reqwest::Url::parse(self.base_url.trim_end_matches('/')).map_err(|_| bad())?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(bad());
        }
        if url.scheme() == "http"
            && self.api_key.is_some()
            && !self.insecure_http_allowed
            && !is_loopback(&url)
        {
            let host = url.host_str().unwrap_or_default();
            let shown = match url.port() {
                Some(p) => format!("{host}:{p}"),
                None => host.to_string(),
            };
            return Err(OpenAiConfigError::InsecureHttp(sse::excerpt(&shown)));
        }
        let path = format!("{}/chat/completions", url.path().trim_end_matches('/'));
        url.set_path(&path);
        let full = url.to_string();
        let mut shown = url.clone();
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        shown.set_query(None);
        Ok((full, shown.to_string()))
    }
}

/// Whether `url`'s host is this machine by address or by the name every resolver keeps for it:
/// 127.0.0.0/8, ::1 (and ::ffff:127.0.0.0/104), `localhost`. Other names are not trusted to
/// resolve there.
fn is_loopback(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    // The URL parser has already normalised the host: IPv4 in dotted form, IPv6 in brackets.
    let ip = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(v4)) => v4.is_loopback(),
        Ok(std::net::IpAddr::V6(v6)) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

/// See the module docs.
pub struct OpenAiCompatibleKernel {
    config: OpenAiConfig,
    url: String,
    shown_url: String,
    client: reqwest::Client,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for OpenAiCompatibleKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiCompatibleKernel")
            .field("config", &self.config)
            .finish()
    }
}

impl Drop for OpenAiCompatibleKernel {
    fn drop(&mut self) {
        // Never block (or panic) if the last owner happens to be inside an async context.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Aborts the stream task when the turn stops waiting for it, however it stops.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn tls_config() -> Result<rustls::ClientConfig, OpenAiConfigError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls_platform_verifier::Verifier::new(provider.clone())
        .map_err(|e| OpenAiConfigError::Setup(e.to_string()))?;
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| OpenAiConfigError::Setup(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth())
}

/// What one model request produced.
#[derive(Default)]
struct Step {
    text: String,
    message_item: Option<String>,
    calls: Vec<AssembledCall>,
    usage: Option<Usage>,
    finish_reason: Option<String>,
}

fn usage_json(u: &Usage, step: u32) -> Value {
    json!({"promptTokens": u.prompt_tokens, "completionTokens": u.completion_tokens,
        "totalTokens": u.total_tokens, "step": step})
}

fn fail(ctx: &dyn TurnContext, code: &str, message: impl Into<String>) -> KernelError {
    ctx.set_error_code(code);
    KernelError::Failed(message.into())
}

fn text_delta(text: String) -> ItemDelta {
    ItemDelta::Text(TextDelta {
        text,
        extra: Map::new(),
    })
}

/// How a tool call shows up as an item: the schema's commandExecution and fileChange for the
/// workspace tools, a generic toolCall otherwise.
enum Shape {
    Command(Vec<String>),
    File(String),
    Generic,
}

impl Shape {
    fn of(call: &ToolCall) -> Shape {
        match call.tool.as_str() {
            "run_command" => {
                let argv: Option<Vec<String>> = call
                    .arguments
                    .get("argv")
                    .and_then(Value::as_array)
                    .filter(|a| !a.is_empty() && a.len() <= 256)
                    .and_then(|a| {
                        a.iter()
                            .map(|v| {
                                v.as_str()
                                    .filter(|s| s.chars().count() <= 4096)
                                    .map(str::to_string)
                            })
                            .collect()
                    });
                argv.map_or(Shape::Generic, Shape::Command)
            }
            "write_file" => call
                .arguments
                .get("path")
                .and_then(Value::as_str)
                .filter(|p| !p.is_empty() && p.chars().count() <= 4096)
                .map_or(Shape::Generic, |p| Shape::File(p.to_string())),
            _ => Shape::Generic,
        }
    }

    fn item(
        &self,
        id: &str,
        call: &ToolCall,
        result: Option<&ToolResult>,
        extra: Map<String, Value>,
    ) -> ItemContent {
        let output = match result {
            Some(ToolResult::Ok(ok)) => Some(&ok.output),
            _ => None,
        };
        let status = match result {
            None => ItemStatus::InProgress,
            Some(ToolResult::Ok(_)) => ItemStatus::Completed,
            Some(ToolResult::Error(_)) => ItemStatus::Failed,
            Some(ToolResult::Denied(_)) => ItemStatus::Declined,
        };
        match self {
            Shape::Command(argv) => {
                let exit_code = output
                    .and_then(|o| o.get("exitCode"))
                    .and_then(Value::as_i64);
                let status = match (status, exit_code) {
                    (ItemStatus::Completed, Some(0)) => ItemStatus::Completed,
                    (ItemStatus::Completed, _) => ItemStatus::Failed,
                    (other, _) => other,
                };
                let mut text = String::new();
                if let Some(o) = output {
                    text.push_str(o.get("stdout").and_then(Value::as_str).unwrap_or(""));
                    let err = o.get("stderr").and_then(Value::as_str).unwrap_or("");
                    if !err.is_empty() {
                        text.push_str(&format!("\n[stderr]\n{err}"));
                    }
                    if o.get("timedOut") == Some(&Value::Bool(true)) {
                        text.push_str("\n[timed out: the process group was killed]");
                    }
                    for s in ["stdout", "stderr"] {
                        if o.get(format!("{s}Truncated")) == Some(&Value::Bool(true)) {
                            text.push_str(&format!(
                                "\n[{s} cut at {} bytes of {}]",
                                o.get("outputCapBytes").unwrap_or(&Value::Null),
                                o.get(format!("{s}Bytes")).unwrap_or(&Value::Null)
                            ));
                        }
                    }
                } else if let Some(ToolResult::Error(e)) = result {
                    text = e.message.clone();
                }
                let cwd = output
                    .and_then(|o| o.get("cwd"))
                    .and_then(Value::as_str)
                    .filter(|c| c.chars().count() <= 4096)
                    .map(|c| Some(c.to_string()));
                ItemContent::CommandExecution(CommandExecutionItem {
                    id: id.into(),
                    command: argv.clone(),
                    cwd,
                    status,
                    exit_code,
                    output: messages::cap(&text, 900_000),
                    extra,
                })
            }
            Shape::File(path) => {
                let kind = match output.and_then(|o| o.get("kind")).and_then(Value::as_str) {
                    Some("add") => Some(FileChangeKind::Add),
                    Some(_) => Some(FileChangeKind::Update),
                    None => None,
                };
                ItemContent::FileChange(FileChangeItem {
                    id: id.into(),
                    changes: kind
                        .map(|kind| {
                            vec![FileChange {
                                path: path.clone(),
                                kind,
                                diff: None,
                                extra: Map::new(),
                            }]
                        })
                        .unwrap_or_default(),
                    status,
                    extra,
                })
            }
            Shape::Generic => ItemContent::ToolCall(ToolCallItem {
                id: id.into(),
                call: call.clone(),
                status,
                result: result.cloned(),
                extra,
            }),
        }
    }
}

impl OpenAiCompatibleKernel {
    pub fn new(config: OpenAiConfig) -> Result<Self, OpenAiConfigError> {
        if config.model.trim().is_empty() {
            return Err(OpenAiConfigError::NoModel);
        }
        if config.max_steps == 0 {
            return Err(OpenAiConfigError::Zero("max_steps"));
        }
        if config.max_attempts == 0 {
            return Err(OpenAiConfigError::Zero("max_attempts"));
        }
        for (name, d) in [
            ("idle_timeout", config.idle_timeout),
            ("call_deadline", config.call_deadline),
            ("request_timeout", config.request_timeout),
        ] {
            if d.is_zero() {
                return Err(OpenAiConfigError::ZeroDuration(name));
            }
        }
        let (url, shown_url) = config.endpoint()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cc-openai")
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| OpenAiConfigError::Setup(e.to_string()))?;
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls_config()?)
            .connect_timeout(config.request_timeout)
            // A redirect would re-send the conversation (and, to the same origin, the key)
            // somewhere the base URL does not name, maybe over plain http: never followed; the
            // turn fails with modelRedirected naming where it pointed.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("cc-app-server/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| OpenAiConfigError::Setup(e.to_string()))?;
        Ok(OpenAiCompatibleKernel {
            config,
            url,
            shown_url,
            client,
            runtime: Some(runtime),
        })
    }

    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().expect("the runtime lives until drop")
    }

    fn request_body(&self, options: &Value, messages: &[Value], tools: &[Value]) -> Vec<u8> {
        let model = options
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or(&self.config.model);
        let mut body = json!({
            "model": model,
            "messages": messages,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if !tools.is_empty() {
            body["tools"] = Value::from(tools.to_vec());
        }
        if let Some(t) = self.config.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(n) = self.config.max_output_tokens {
            body["max_tokens"] = json!(n);
        }
        serde_json::to_vec(&body).expect("a request is JSON")
    }

    fn start_stream(
        &self,
        body: Vec<u8>,
    ) -> (tokio::sync::mpsc::Receiver<StreamEvent>, AbortOnDrop) {
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let req = StreamRequest {
            url: self.url.clone(),
            shown_url: self.shown_url.clone(),
            api_key: self.config.api_key.as_ref().map(|k| k.0.clone()),
            body,
            timeout: self.config.request_timeout,
            idle_timeout: self.config.idle_timeout,
            call_deadline: self.config.call_deadline,
            max_attempts: self.config.max_attempts,
            base_delay: self.config.retry_base_delay,
            max_delay: self.config.max_retry_delay,
        };
        let task = self
            .runtime()
            .spawn(http::stream(self.client.clone(), req, tx));
        (rx, AbortOnDrop(task.abort_handle()))
    }

    fn system_and_history(
        &self,
        options: &Value,
        mut history: History,
        input_bytes: usize,
        specs: &[ToolSpec],
        names: &ToolNames,
    ) -> Vec<Value> {
        let instructions = options
            .get("instructions")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| self.config.instructions.clone());
        let fixed = instructions.as_ref().map_or(0, String::len)
            + input_bytes
            + specs
                .iter()
                .map(|s| s.description.len() + s.parameters.to_string().len() + s.name.len())
                .sum::<usize>();
        history.retain_newest(self.config.context_budget_bytes.saturating_sub(fixed));
        let mut out = Vec::new();
        if let Some(i) = instructions.filter(|i| !i.is_empty()) {
            out.push(json!({"role": "system", "content": i}));
        }
        out.extend(messages::history_messages(
            &history,
            names,
            self.config.max_tool_output_bytes,
        ));
        out
    }

    /// One model request, recorded as it streams. Returns when the answer is complete.
    fn stream_step(
        &self,
        ctx: &dyn TurnContext,
        body: Vec<u8>,
        step: u32,
    ) -> Result<Step, KernelError> {
        let (mut rx, _abort) = self.start_stream(body);
        let mut out = Step::default();
        let mut reasoning: Option<(String, String)> = None; // (item id, text)
        let mut calls = ToolCallAssembler::default();
        loop {
            if ctx.is_cancelled() {
                return Err(KernelError::Cancelled);
            }
            let first = self
                .runtime()
                .block_on(async { tokio::time::timeout(POLL, rx.recv()).await });
            let first = match first {
                Err(_) => continue,
                Ok(None) => {
                    return Err(fail(
                        ctx,
                        "modelStreamCut",
                        "the model stream stopped without an end",
                    ))
                }
                Ok(Some(ev)) => ev,
            };
            // Whatever else is already waiting is recorded together: one delta per kind per
            // batch, so a fast stream costs few durable appends.
            let mut batch = vec![first];
            while batch.len() < 256 {
                match rx.try_recv() {
                    Ok(ev) => batch.push(ev),
                    Err(_) => break,
                }
            }
            let mut content = String::new();
            let mut thinking = String::new();
            let mut end: Option<Result<(), KernelError>> = None;
            for ev in batch {
                match ev {
                    StreamEvent::Chunk(c) => {
                        if let Some(r) = c.reasoning {
                            thinking.push_str(&r);
                        }
                        if let Some(t) = c.content {
                            if !thinking.is_empty() {
                                self.flush_reasoning(ctx, &mut reasoning, &mut thinking)?;
                            }
                            content.push_str(&t);
                        }
                        for d in &c.tool_calls {
                            calls
                                .add(d)
                                .map_err(|m| fail(ctx, "modelStreamMalformed", m))?;
                        }
                        if c.usage.is_some() {
                            out.usage = c.usage;
                        }
                        if c.finish_reason.is_some() {
                            out.finish_reason = c.finish_reason;
                        }
                    }
                    StreamEvent::Retrying {
                        attempt,
                        max_attempts,
                        status,
                        delay,
                        why,
                    } => {
                        let id = ctx.new_item_id();
                        let mut extra = Map::new();
                        extra.insert(
                            "retry".into(),
                            json!({"attempt": attempt, "maxAttempts": max_attempts,
                                "status": status, "delayMs": delay.as_millis() as u64}),
                        );
                        let item = ItemContent::Error(ErrorItem {
                            id,
                            message: format!(
                                "model request attempt {attempt} of {max_attempts} failed ({why}); retrying in {:.1} s",
                                delay.as_secs_f64()
                            ),
                            extra,
                        });
                        ctx.item_started(item.clone())?;
                        ctx.item_completed(item)?;
                    }
                    StreamEvent::Failed { code, message } => {
                        end = Some(Err(fail(ctx, code, message)));
                        break;
                    }
                    StreamEvent::Done => {
                        end = Some(Ok(()));
                        break;
                    }
                }
            }
            if !thinking.is_empty() {
                self.flush_reasoning(ctx, &mut reasoning, &mut thinking)?;
                // Reasoning stays open until content (or the end) arrives.
            }
            if !content.is_empty() {
                if let Some((id, text)) = reasoning.take() {
                    ctx.item_completed(ItemContent::Reasoning(ReasoningItem {
                        id,
                        text,
                        extra: Map::new(),
                    }))?;
                }
                let id = match &out.message_item {
                    Some(id) => id.clone(),
                    None => {
                        let id = ctx.new_item_id();
                        ctx.item_started(ItemContent::AgentMessage(AgentMessageItem {
                            id: id.clone(),
                            text: String::new(),
                            extra: Map::new(),
                        }))?;
                        out.message_item = Some(id.clone());
                        id
                    }
                };
                out.text.push_str(&content);
                ctx.item_delta(&id, text_delta(content))?;
            }
            match end {
                None => continue,
                Some(Err(e)) => return Err(e),
                Some(Ok(())) => {
                    if let Some((id, text)) = reasoning.take() {
                        ctx.item_completed(ItemContent::Reasoning(ReasoningItem {
                            id,
                            text,
                            extra: Map::new(),
                        }))?;
                    }
                    out.calls = calls.finish(&format!("{}-s{step}", ctx.turn_id()));
                    return Ok(out);
                }
            }
        }
    }

    fn flush_reasoning(
        &self,
        ctx: &dyn TurnContext,
        open: &mut Option<(String, String)>,
        pending: &mut String,
    ) -> Result<(), KernelError> {
        if open.is_none() {
            let id = ctx.new_item_id();
            ctx.item_started(ItemContent::Reasoning(ReasoningItem {
                id: id.clone(),
                text: String::new(),
                extra: Map::new(),
            }))?;
            *open = Some((id, String::new()));
        }
        let (id, text) = open.as_mut().expect("just opened");
        text.push_str(pending);
        ctx.item_delta(id, text_delta(std::mem::take(pending)))
    }

    /// Runs one of the model's tool calls through the gate; returns the `role: tool` message.
    fn run_call(
        &self,
        ctx: &dyn TurnContext,
        names: &ToolNames,
        call: &AssembledCall,
        mut extra: Map<String, Value>,
    ) -> Result<Value, KernelError> {
        let reply =
            |content: String| json!({"role": "tool", "tool_call_id": call.id, "content": content});
        let refuse = |message: String, extra: Map<String, Value>| -> Result<Value, KernelError> {
            let item = ItemContent::Error(ErrorItem {
                id: ctx.new_item_id(),
                message: messages::cap(&message, 900),
                extra,
            });
            ctx.item_started(item.clone())?;
            ctx.item_completed(item)?;
            Ok(reply(format!("Error: {message}")))
        };
        let Some(tool) = names.our_name(&call.name) else {
            return refuse(
                format!(
                    "the model asked for a tool named {:?}, which this server does not offer",
                    sse::excerpt(&call.name)
                ),
                extra,
            );
        };
        if call.too_long {
            return refuse(
                format!(
                    "the arguments for {tool} are longer than {} bytes, so the call was not run; send smaller arguments (for a large file, write it in parts)",
                    sse::MAX_ARGUMENT_BYTES
                ),
                extra,
            );
        }
        if json_text_depth(&call.arguments) > MAX_ARGUMENT_DEPTH {
            return refuse(
                format!(
                    "the arguments for {tool} nest arrays and objects more than {MAX_ARGUMENT_DEPTH} levels deep, so the call was not run; call it again with flatter arguments"
                ),
                extra,
            );
        }
        let arguments: Value = if call.arguments.trim().is_empty() {
            json!({})
        } else {
            match serde_json::from_str(&call.arguments) {
                Ok(v) => v,
                Err(e) => {
                    return refuse(
                        format!("the arguments for {tool} were not valid JSON ({e}); call it again with a JSON object"),
                        extra,
                    )
                }
            }
        };
        let tool_call = ToolCall {
            tool: tool.to_string(),
            arguments,
        };
        let shape = Shape::of(&tool_call);
        let id = ctx.new_item_id();
        extra.insert("modelCallId".into(), Value::from(sse::excerpt(&call.id)));
        ctx.item_started(shape.item(&id, &tool_call, None, Map::new()))?;
        let result = ctx.request_tool(&id, tool_call.clone())?;
        ctx.item_completed(shape.item(&id, &tool_call, Some(&result), extra))?;
        Ok(reply(messages::tool_result_text(
            Some(&result),
            self.config.max_tool_output_bytes,
        )))
    }
}

impl AgentKernel for OpenAiCompatibleKernel {
    fn run_turn(&self, ctx: &dyn TurnContext, input: &[UserInput]) -> Result<(), KernelError> {
        let options = ctx.agent_options().clone();
        let specs = ctx.tool_specs();
        let names = ToolNames::new(&specs);
        let tools = messages::tools_json(&specs, &names);
        let history = ctx.history()?;
        let user = messages::user_text(input);
        let mut conversation =
            self.system_and_history(&options, history, user.len(), &specs, &names);
        conversation.push(json!({"role": "user", "content": user}));
        for step in 1..=self.config.max_steps {
            let body = self.request_body(&options, &conversation, &tools);
            let out = self.stream_step(ctx, body, step)?;
            let mut usage_extra = Map::new();
            if let Some(u) = &out.usage {
                usage_extra.insert("usage".into(), usage_json(u, step));
            }
            if let Some(r) = &out.finish_reason {
                usage_extra.insert("finishReason".into(), Value::from(sse::excerpt(r)));
            }
            if out.calls.is_empty() || out.message_item.is_some() {
                let id = match out.message_item.clone() {
                    Some(id) => id,
                    None => {
                        // The model said nothing at all: still one (empty) answer item.
                        let id = ctx.new_item_id();
                        ctx.item_started(ItemContent::AgentMessage(AgentMessageItem {
                            id: id.clone(),
                            text: String::new(),
                            extra: Map::new(),
                        }))?;
                        id
                    }
                };
                ctx.item_completed(ItemContent::AgentMessage(AgentMessageItem {
                    id,
                    text: out.text.clone(),
                    extra: std::mem::take(&mut usage_extra),
                }))?;
            }
            if out.calls.is_empty() {
                return Ok(());
            }
            if step == self.config.max_steps {
                break;
            }
            let wire_calls: Vec<(String, String, String)> = out
                .calls
                .iter()
                .map(|c| {
                    // An over-long call is shown back as `{}`: the model is told why beside it.
                    let args = if c.too_long { "{}" } else { &c.arguments };
                    (c.id.clone(), c.name.clone(), args.to_string())
                })
                .collect();
            conversation.push(messages::assistant_with_calls(Some(&out.text), &wire_calls));
            for call in &out.calls {
                let message = self.run_call(ctx, &names, call, std::mem::take(&mut usage_extra))?;
                conversation.push(message);
            }
        }
        Err(fail(
            ctx,
            "maxStepsExceeded",
            format!(
                "the model was still calling tools after {} requests (maxSteps); raise maxSteps or ask for a smaller task",
                self.config.max_steps
            ),
        ))
    }

    fn summarize(
        &self,
        _thread_id: &str,
        agent_options: &Value,
        history: &History,
    ) -> Result<Option<String>, KernelError> {
        let names = ToolNames::default();
        let mut history = history.clone();
        history.retain_newest(self.config.context_budget_bytes);
        let mut conversation = vec![json!({"role": "system", "content":
            "You compact conversations between a user and a coding agent. Write a summary that lets the agent continue the work without the original messages: the user's goals and constraints, what was decided and done (files read or written, commands run and their outcomes), and what is still open. Plain text, at most 400 words."})];
        conversation.extend(messages::history_messages(
            &history,
            &names,
            self.config.max_tool_output_bytes,
        ));
        conversation
            .push(json!({"role": "user", "content": "Summarize the conversation above now."}));
        // The summary has no tools and no turn to record into: collect its text directly.
        let body = self.request_body(agent_options, &conversation, &[]);
        let (mut rx, _abort) = self.start_stream(body);
        let mut text = String::new();
        loop {
            // Dropping `_abort` on the way out closes the model's connection.
            if crate::summary_cancelled() {
                return Err(KernelError::Cancelled);
            }
            let event = self
                .runtime()
                .block_on(async { tokio::time::timeout(POLL, rx.recv()).await });
            match event {
                Err(_) => continue,
                Ok(Some(StreamEvent::Chunk(c))) => {
                    if let Some(t) = c.content {
                        text.push_str(&t);
                        if text.len() > crate::rollout::MAX_SUMMARY_CHARS {
                            return Err(KernelError::Failed(
                                "the model's summary is longer than a compaction may be".into(),
                            ));
                        }
                    }
                }
                Ok(Some(StreamEvent::Retrying { .. })) => {}
                Ok(Some(StreamEvent::Failed { code, message })) => {
                    return Err(KernelError::Failed(format!("{message} ({code})")))
                }
                Ok(Some(StreamEvent::Done)) => return Ok(Some(text.trim().to_string())),
                Ok(None) => {
                    return Err(KernelError::Failed(
                        "the model stream stopped without an end (modelStreamCut)".into(),
                    ))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_text_depth_counts_brackets_outside_strings_only() {
        for (text, depth) in [
            ("", 0),
            ("1", 0),
            ("{}", 1),
            (r#"{"a":[1,{"b":[]}]}"#, 4),
            (r#"{"a":"[[[{{{"}"#, 1),
            (r#"{"a":"\"[[[","b":[]}"#, 2),
            (r#"{"a":"\\","b":[[]]}"#, 3),
            ("]]]{", 1),
        ] {
            assert_eq!(json_text_depth(text), depth, "{text}");
        }
        let deep = format!(
            "{}{}",
            "[".repeat(MAX_ARGUMENT_DEPTH),
            "]".repeat(MAX_ARGUMENT_DEPTH)
        );
        assert_eq!(json_text_depth(&deep), MAX_ARGUMENT_DEPTH);
        assert_eq!(MAX_ARGUMENT_DEPTH, 62);
    }
}
