//! The Chat Completions stream as servers send it: Server-Sent Events (`data: {json}` lines, a
//! blank line after each event, `data: [DONE]` at the end) carrying `chat.completion.chunk`
//! objects. Parsing is strict — a line that is not SSE, or data that is not a chunk, fails the
//! turn — because a lenient parser would turn a proxy's HTML error page into a silent empty
//! answer. Lines and events are bounded so a server cannot make us buffer without limit.

use serde_json::Value;

/// Longest SSE line we buffer; a longer one is a malformed stream.
pub const MAX_LINE_BYTES: usize = 4 << 20;

/// Incremental SSE decoder: bytes in, complete events' `data` out.
#[derive(Debug)]
pub struct SseDecoder {
    line: Vec<u8>,
    data: Option<String>,
    /// The previous byte was '\r' (so a following '\n' belongs to the same line end).
    after_cr: bool,
    /// The longest line, and the longest event's data (`MAX_LINE_BYTES` but in the fuzz target).
    max: usize,
}

impl Default for SseDecoder {
    fn default() -> Self {
        SseDecoder::with_max_line_bytes(MAX_LINE_BYTES)
    }
}

/// What the decoder found.
#[derive(Debug, Clone, PartialEq)]
pub enum SseEvent {
    /// One event's data (its `data:` lines joined with '\n').
    Data(String),
}

impl SseDecoder {
    /// A decoder with another bound than `MAX_LINE_BYTES` on a line and on an event's data (the
    /// fuzz target reaches small bounds with small inputs).
    pub fn with_max_line_bytes(max: usize) -> Self {
        SseDecoder {
            line: Vec::new(),
            data: None,
            after_cr: false,
            max,
        }
    }

    /// Feeds bytes; returns the events they complete, or why the stream is not SSE.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<Vec<SseEvent>, String> {
        let mut out = Vec::new();
        while let Some(&first) = bytes.first() {
            if self.after_cr {
                self.after_cr = false;
                if first == b'\n' {
                    bytes = &bytes[1..];
                    continue;
                }
            }
            // A line's bytes are copied a run at a time, up to its end.
            match bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
                None => {
                    self.extend_line(bytes)?;
                    break;
                }
                Some(end) => {
                    self.extend_line(&bytes[..end])?;
                    self.after_cr = bytes[end] == b'\r';
                    let line = std::mem::take(&mut self.line);
                    self.line_done(&line, &mut out)?;
                    bytes = &bytes[end + 1..];
                }
            }
        }
        Ok(out)
    }

    fn extend_line(&mut self, part: &[u8]) -> Result<(), String> {
        if self.line.len() + part.len() > self.max {
            return Err(format!("an event line is longer than {} bytes", self.max));
        }
        self.line.extend_from_slice(part);
        Ok(())
    }

    /// Bytes held between calls: the unfinished line and the unfinished event's data, each at
    /// most the bound (`MAX_LINE_BYTES`), which the fuzz target holds the decoder to.
    pub fn buffered(&self) -> (usize, usize) {
        (self.line.len(), self.data.as_ref().map_or(0, String::len))
    }

    /// The end of the body: a final event without its blank line still counts.
    pub fn finish(&mut self) -> Result<Vec<SseEvent>, String> {
        let mut out = Vec::new();
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, &mut out)?;
        }
        if let Some(data) = self.data.take() {
            out.push(SseEvent::Data(data));
        }
        Ok(out)
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<SseEvent>) -> Result<(), String> {
        if line.is_empty() {
            if let Some(data) = self.data.take() {
                out.push(SseEvent::Data(data));
            }
            return Ok(());
        }
        let line =
            std::str::from_utf8(line).map_err(|_| "an event line is not UTF-8".to_string())?;
        if line.starts_with(':') {
            return Ok(()); // a comment (keep-alive)
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => {
                let data = self.data.get_or_insert_with(String::new);
                // The '\n' joining data lines counts, and is checked before it is added.
                let join = usize::from(!data.is_empty());
                if data.len() + join + value.len() > self.max {
                    return Err(format!("an event is longer than {} bytes", self.max));
                }
                if join == 1 {
                    data.push('\n');
                }
                data.push_str(value);
                Ok(())
            }
            "event" | "id" | "retry" => Ok(()),
            _ => Err(format!(
                "the server sent a line that is not server-sent events: {:?}",
                excerpt(line)
            )),
        }
    }
}

/// A short, single-line excerpt of what the server sent, for error messages.
pub fn excerpt(text: &str) -> String {
    let one_line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(120)
        .collect();
    one_line
}

/// One tool-call fragment of a chunk.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolCallDelta {
    pub index: Option<u64>,
    pub id: Option<String>,
    pub name: Option<String>,
    pub arguments: Option<String>,
}

/// Token counts as the server reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

/// What one chunk carries (the first choice; we always ask for one).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChunkDelta {
    pub content: Option<String>,
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ToolCallDelta>,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
}

impl ChunkDelta {
    /// Whether the chunk moves the answer on (the idle deadline's notion of progress): text,
    /// reasoning, a tool-call fragment with something in it, the finish reason or usage. A
    /// chunk with an empty delta (or only a role) is not.
    pub fn is_progress(&self) -> bool {
        self.content.is_some()
            || self.reasoning.is_some()
            || self.finish_reason.is_some()
            || self.usage.is_some()
            || self.tool_calls.iter().any(|t| {
                t.id.is_some()
                    || t.name.is_some()
                    || t.arguments.as_ref().is_some_and(|a| !a.is_empty())
            })
    }
}

/// Parses one event's data: `Ok(None)` for `[DONE]`.
pub fn parse_chunk(data: &str) -> Result<Option<ChunkDelta>, String> {
    if data.trim() == "[DONE]" {
        return Ok(None);
    }
    let v: Value = serde_json::from_str(data).map_err(|_| {
        format!(
            "the server sent data that is not a JSON chunk: {:?}",
            excerpt(data)
        )
    })?;
    if let Some(err) = v.get("error") {
        let message = err
            .get("message")
            .and_then(Value::as_str)
            .or_else(|| err.as_str())
            .unwrap_or("no message");
        return Err(format!(
            "the server reported an error mid-stream: {}",
            excerpt(message)
        ));
    }
    let Some(obj) = v.as_object() else {
        return Err("a stream chunk is not a JSON object".into());
    };
    let mut out = ChunkDelta::default();
    if let Some(u) = obj.get("usage").filter(|u| u.is_object()) {
        let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
        out.usage = Some(Usage {
            prompt_tokens: n("prompt_tokens"),
            completion_tokens: n("completion_tokens"),
            total_tokens: n("total_tokens"),
        });
    }
    let choices = match obj.get("choices") {
        Some(Value::Array(c)) => c,
        None | Some(Value::Null) => return Ok(Some(out)),
        Some(_) => return Err("a stream chunk's choices is not an array".into()),
    };
    let Some(choice) = choices.first() else {
        return Ok(Some(out)); // the usage-only chunk has no choices
    };
    out.finish_reason = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .map(str::to_string);
    let Some(delta) = choice.get("delta").filter(|d| !d.is_null()) else {
        return Ok(Some(out));
    };
    let text = |k: &str| {
        delta
            .get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    out.content = text("content");
    // llama.cpp, vLLM and DeepSeek say reasoning_content; Ollama and OpenRouter say reasoning.
    out.reasoning = text("reasoning_content").or_else(|| text("reasoning"));
    if let Some(calls) = delta.get("tool_calls").filter(|c| !c.is_null()) {
        let calls = calls
            .as_array()
            .ok_or("a stream chunk's tool_calls is not an array")?;
        for c in calls {
            let f = c.get("function");
            let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
            out.tool_calls.push(ToolCallDelta {
                index: c.get("index").and_then(Value::as_u64),
                id: s(c.get("id")).filter(|s| !s.is_empty()),
                name: s(f.and_then(|f| f.get("name"))).filter(|s| !s.is_empty()),
                arguments: s(f.and_then(|f| f.get("arguments"))),
            });
        }
    }
    Ok(Some(out))
}

/// Most tool calls one response may carry (more fails the stream), and the longest arguments of
/// one (longer: the call is kept, marked `too_long`, with its arguments dropped, so the kernel
/// answers it with a tool error and the turn goes on).
pub const MAX_TOOL_CALLS: usize = 64;
pub const MAX_ARGUMENT_BYTES: usize = 1 << 20;

/// A tool call put together from its fragments.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AssembledCall {
    pub id: String,
    pub name: String,
    /// Empty when `too_long`.
    pub arguments: String,
    /// The arguments passed `MAX_ARGUMENT_BYTES`; what came of them is dropped, and so is the
    /// rest as it streams.
    pub too_long: bool,
}

/// Puts tool calls together by `index` (id, name and argument fragments arrive piecewise).
#[derive(Debug, Default)]
pub struct ToolCallAssembler {
    calls: Vec<(u64, AssembledCall)>,
}

impl ToolCallAssembler {
    pub fn add(&mut self, d: &ToolCallDelta) -> Result<(), String> {
        // A server that omits `index` sends each call whole or starts a new one with an id.
        let index = match d.index {
            Some(i) => i,
            None if d.id.is_some() || self.calls.is_empty() => self.calls.len() as u64,
            None => self.calls.last().map(|c| c.0).unwrap_or(0),
        };
        let slot = match self.calls.iter().position(|c| c.0 == index) {
            Some(p) => p,
            None => {
                if self.calls.len() >= MAX_TOOL_CALLS {
                    return Err(format!(
                        "the model asked for more than {MAX_TOOL_CALLS} tool calls at once"
                    ));
                }
                self.calls.push((index, AssembledCall::default()));
                self.calls.len() - 1
            }
        };
        let call = &mut self.calls[slot].1;
        if let Some(id) = &d.id {
            if call.id.is_empty() {
                call.id = id.clone();
            }
        }
        if let Some(name) = &d.name {
            if call.name.len() + name.len() > 256 {
                return Err("a tool call's name is longer than 256 bytes".into());
            }
            call.name.push_str(name);
        }
        if let Some(args) = &d.arguments {
            if call.too_long {
                // Dropped as it streams: memory stays bounded however long it goes on.
            } else if call.arguments.len() + args.len() > MAX_ARGUMENT_BYTES {
                call.too_long = true;
                call.arguments = String::new();
            } else {
                call.arguments.push_str(args);
            }
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// The calls in index order; a call the server sent without an id gets one.
    pub fn finish(mut self, prefix: &str) -> Vec<AssembledCall> {
        self.calls.sort_by_key(|c| c.0);
        self.calls
            .into_iter()
            .enumerate()
            .map(|(i, (_, mut c))| {
                if c.id.is_empty() {
                    c.id = format!("{prefix}-call{i}");
                }
                c
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_reads_and_line_endings() {
        let mut d = SseDecoder::default();
        let mut got = d.feed(b"data: {\"a\"").unwrap();
        assert!(got.is_empty());
        got.extend(
            d.feed(b":1}\r\n\r\n: keep-alive\n\ndata: x\rdata: y\r\r")
                .unwrap(),
        );
        got.extend(d.feed(b"event: message\ndata: [DONE]").unwrap());
        got.extend(d.finish().unwrap());
        assert_eq!(
            got,
            vec![
                SseEvent::Data("{\"a\":1}".into()),
                SseEvent::Data("x\ny".into()),
                SseEvent::Data("[DONE]".into())
            ]
        );
        assert!(SseDecoder::default().feed(b"<html>\n").is_err());
    }

    #[test]
    fn a_line_at_the_bound_is_kept_and_one_past_it_refused() {
        let mut d = SseDecoder::default();
        let mut line = b"data: ".to_vec();
        line.resize(MAX_LINE_BYTES, b'x');
        assert!(d.feed(&line).is_ok());
        assert!(d.feed(b"x").is_err());
    }

    #[test]
    fn an_event_at_the_bound_is_kept_and_a_joining_newline_past_it_refused_before_it_is_held() {
        // Found by the sse fuzz target: the '\n' joining data lines was added before the check,
        // so a refused event held one byte past the bound.
        let mut d = SseDecoder::with_max_line_bytes(7);
        assert!(d.feed(b"data:ab\ndata:cd\ndata:e\n").is_ok());
        assert_eq!(d.buffered(), (0, 7));
        assert!(d.feed(b"data:\n").is_err());
        assert!(d.buffered().1 <= 7, "{:?}", d.buffered());
        let mut d = SseDecoder::with_max_line_bytes(7);
        let got = d.feed(b"data:ab\ndata:cd\ndata:e\n\n").unwrap();
        assert_eq!(got, vec![SseEvent::Data("ab\ncd\ne".into())]);
    }

    #[test]
    fn only_chunks_that_carry_part_of_the_answer_are_progress() {
        let chunk = |delta: &str| {
            parse_chunk(&format!(
                r#"{{"choices":[{{"delta":{delta},"finish_reason":null}}]}}"#
            ))
            .unwrap()
            .unwrap()
        };
        for idle in [
            "{}",
            "null",
            r#"{"role":"assistant"}"#,
            r#"{"content":""}"#,
            r#"{"tool_calls":[{"index":0,"function":{"arguments":""}}]}"#,
        ] {
            assert!(!chunk(idle).is_progress(), "{idle}");
        }
        for busy in [
            r#"{"content":"a"}"#,
            r#"{"reasoning":"a"}"#,
            r#"{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}"#,
            r#"{"tool_calls":[{"index":0,"id":"c","function":{"name":"t"}}]}"#,
        ] {
            assert!(chunk(busy).is_progress(), "{busy}");
        }
        let done = parse_chunk(r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#);
        assert!(done.unwrap().unwrap().is_progress());
        let usage = parse_chunk(r#"{"choices":[],"usage":{"total_tokens":3}}"#);
        assert!(usage.unwrap().unwrap().is_progress());
    }

    #[test]
    fn tool_calls_assemble_by_index() {
        let mut a = ToolCallAssembler::default();
        let frag = |i, id: Option<&str>, name: Option<&str>, args: &str| ToolCallDelta {
            index: Some(i),
            id: id.map(str::to_string),
            name: name.map(str::to_string),
            arguments: Some(args.into()),
        };
        a.add(&frag(0, Some("c0"), Some("read_file"), "")).unwrap();
        a.add(&frag(1, Some("c1"), Some("list_directory"), "{\"pa"))
            .unwrap();
        a.add(&frag(0, None, None, "{\"path\":\"a\"}")).unwrap();
        a.add(&frag(1, None, None, "th\":\".\"}")).unwrap();
        let calls = a.finish("x");
        assert_eq!(calls[0].arguments, "{\"path\":\"a\"}");
        assert_eq!(calls[1].name, "list_directory");
        assert_eq!(calls[1].arguments, "{\"path\":\".\"}");
        let mut a = ToolCallAssembler::default();
        for i in 0..MAX_TOOL_CALLS as u64 {
            a.add(&frag(i, None, Some("t"), "")).unwrap();
        }
        assert!(a
            .add(&frag(MAX_TOOL_CALLS as u64, None, Some("t"), ""))
            .is_err());
        // Arguments at the bound are kept; one byte past it marks the call and drops them all.
        let mut a = ToolCallAssembler::default();
        let half = "x".repeat(MAX_ARGUMENT_BYTES / 2);
        a.add(&frag(0, Some("c0"), Some("t"), &half)).unwrap();
        a.add(&frag(0, None, None, &half)).unwrap();
        a.add(&frag(1, Some("c1"), Some("t"), &half)).unwrap();
        a.add(&frag(1, None, None, &half)).unwrap();
        a.add(&frag(1, None, None, "x")).unwrap();
        a.add(&frag(1, None, None, &half)).unwrap();
        let calls = a.finish("x");
        assert_eq!(
            (calls[0].arguments.len(), calls[0].too_long),
            (MAX_ARGUMENT_BYTES, false)
        );
        assert_eq!((calls[1].arguments.len(), calls[1].too_long), (0, true));
    }
}
