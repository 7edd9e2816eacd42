//! One-line, human-readable renderings of rollout events and wire notifications, shared by
//! `rollout show` and the demo so both read the same way: seq, what happened, the fields that
//! matter; everything else is one `--json` away.

use cc_app_server::rollout::StoredEvent;
use serde_json::Value;

/// Longest rendering of free text or JSON inside a line, in characters.
const MAX_TEXT: usize = 72;

/// `  seq  time  type  details` for one stored event.
pub fn event_line(ev: &StoredEvent) -> String {
    format!(
        "{:>6}  {}  {:<18} {}",
        ev.seq,
        ev.time,
        crate::term::one_line(ev.kind()),
        details(&ev.payload)
    )
}

/// `  seq  method  details` for one notification (`params.eventSeq` is its rollout seq).
pub fn notification_line(n: &Value) -> String {
    let params = &n["params"];
    let seq = params["eventSeq"]
        .as_u64()
        .map(|s| s.to_string())
        .unwrap_or_else(|| "-".into());
    format!(
        "{:>6}  {:<18} {}",
        seq,
        crate::term::one_line(n["method"].as_str().unwrap_or("?")),
        details(params)
    )
}

/// The essential fields of an event payload or notification params, in reading order, on one
/// line with every character a terminal would interpret shown visibly (the fields are the
/// model's and the tools' text).
pub fn details(p: &Value) -> String {
    crate::term::one_line(&details_raw(p))
}

fn details_raw(p: &Value) -> String {
    let mut parts: Vec<String> = Vec::new();
    let s = |v: &Value| v.as_str().map(str::to_string);
    let kind = p.get("type").and_then(Value::as_str);
    // Every turn-scoped event names its turn; only the turn's own events need to say it.
    let turn_event = kind.is_some_and(|k| k.starts_with("turn"));
    match kind {
        Some("threadStarted") => {
            if let Some(t) = s(&p["title"]) {
                parts.push(format!("title {}", quote(&t)));
            }
            if let Some(v) = p["formatVersion"].as_u64() {
                parts.push(format!("format v{v}"));
            }
            if p["forkedFrom"].is_object() {
                parts.push(format!(
                    "forked from {} at seq {}",
                    p["forkedFrom"]["threadId"].as_str().unwrap_or("?"),
                    p["forkedFrom"]["eventSeq"]
                ));
            }
        }
        Some("threadArchived") => parts.push(format!("archived={}", p["archived"])),
        Some("checkpoint") => parts.push(format!("label {}", quote(&text_of(&p["label"])))),
        Some("compacted") => parts.push(format!(
            "seq {}..={} summary {}",
            p["fromSeq"],
            p["toSeq"],
            quote(&text_of(&p["summary"]))
        )),
        Some("sealed") => parts.push(format!(
            "seals seq {} (key id {})",
            p["sealedSeq"],
            p["keyId"].as_str().unwrap_or("?")
        )),
        Some("repaired") => parts.push(format!(
            "{} ({} bytes cut)",
            text_of(&p["reason"]),
            p["truncatedBytes"]
        )),
        _ => {}
    }
    if let Some(turn) = p.get("turn").filter(|t| t.is_object()) {
        parts.push(format!(
            "turn {} {}",
            turn["id"].as_str().unwrap_or("?"),
            turn["status"].as_str().unwrap_or("?")
        ));
        if let Some(e) = turn.get("error").filter(|e| e.is_object()) {
            parts.push(format!("error {}", error_text(e)));
        }
    } else if let Some(id) = s(&p["turnId"]).filter(|_| turn_event) {
        parts.push(format!("turn {id}"));
        if let Some(status) = s(&p["status"]) {
            parts.push(status);
        }
        if let Some(e) = p.get("error").filter(|e| e.is_object()) {
            parts.push(format!("error {}", error_text(e)));
        }
    }
    if let Some(input) = p.get("input").and_then(Value::as_array) {
        let text: Vec<&str> = input.iter().filter_map(|i| i["text"].as_str()).collect();
        parts.push(format!("input {}", quote(&text.join(" "))));
    }
    if let Some(thread) = p.get("thread").filter(|t| t.is_object()) {
        parts.push(format!(
            "thread {} {}",
            thread["id"].as_str().unwrap_or("?"),
            thread["status"].as_str().unwrap_or("?")
        ));
    }
    if let Some(item) = p.get("item").filter(|i| i.is_object()) {
        parts.push(item_text(item));
    }
    if let Some(delta) = p.get("delta").filter(|d| d.is_object()) {
        let id = p["itemId"].as_str().unwrap_or("?");
        let body = match delta["type"].as_str() {
            Some("text") => quote(&text_of(&delta["text"])),
            _ => compact(delta),
        };
        parts.push(format!("item {id} +{body}"));
    } else if p.get("item").is_none() {
        if let Some(id) = s(&p["itemId"]) {
            parts.push(format!("item {id}"));
        }
    }
    if let Some(call) = p.get("call").or_else(|| p.get("operation")) {
        parts.push(call_text(call));
    }
    if let Some(result) = p.get("result").filter(|r| r.is_object()) {
        parts.push(result_text(result));
    }
    if let Some(binding) = p.get("binding").filter(|b| b.is_object()) {
        parts.push(format!(
            "nonce {} expires {}",
            binding["nonce"].as_str().unwrap_or("?"),
            binding["expiresAt"].as_str().unwrap_or("?")
        ));
    }
    if let Some(outcome) = s(&p["outcome"]) {
        parts.push(outcome);
        if let Some(d) = p["decision"]["kind"].as_str() {
            parts.push(format!("decision {d}"));
        }
        if let Some(f) = s(&p["failure"]) {
            parts.push(format!("failure {f}"));
        }
    }
    parts.join("  ")
}

/// The recorded body of an item: the published `Item`'s `content` (an `item/started` or
/// `item/completed` notification), or the body itself (a rollout event).
pub fn item_body(item: &Value) -> &Value {
    match item.get("content") {
        Some(c) if item.get("kind").is_some() => c,
        _ => item,
    }
}

fn item_text(item: &Value) -> String {
    let item = item_body(item);
    let kind = item["type"].as_str().unwrap_or("?");
    let id = item["id"].as_str().unwrap_or("?");
    let mut text = format!("{kind} {id}");
    match kind {
        "toolCall" => {
            text.push(' ');
            text.push_str(&call_text(&item["call"]));
            if let Some(status) = item["status"].as_str() {
                text.push_str(&format!(" [{status}]"));
            }
        }
        _ => {
            let body = text_of(&item["text"]);
            if !body.is_empty() {
                text.push(' ');
                text.push_str(&quote(&body));
            }
        }
    }
    text
}

fn call_text(call: &Value) -> String {
    format!(
        "{} {}",
        call["tool"].as_str().unwrap_or("?"),
        compact(&call["arguments"])
    )
}

fn result_text(result: &Value) -> String {
    match result["status"].as_str().or(result["type"].as_str()) {
        Some("ok") => format!("ok {}", compact(&result["output"])),
        Some("error") => format!("error {}", quote(&text_of(&result["message"]))),
        Some("denied") => format!("denied {}", quote(&text_of(&result["reason"]))),
        _ => compact(result),
    }
}

fn error_text(e: &Value) -> String {
    format!(
        "{}: {}",
        e["code"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| e["code"].to_string()),
        text_of(&e["message"])
    )
}

fn text_of(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// Shortens `text` to `MAX_TEXT` characters, marking the cut.
pub fn shorten(text: &str) -> String {
    if text.chars().count() <= MAX_TEXT {
        return text.to_string();
    }
    let mut out: String = text.chars().take(MAX_TEXT - 1).collect();
    out.push('…');
    out
}

/// A quoted, escaped, shortened string.
pub fn quote(text: &str) -> String {
    format!("{:?}", shorten(text))
}

/// Compact JSON, shortened.
pub fn compact(v: &Value) -> String {
    shorten(&v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn notifications_read_as_one_line() {
        let n = json!({"jsonrpc": "2.0", "method": "item/delta", "params": {"threadId": "t", "eventSeq": 7, "turnId": "tu-1", "itemId": "it-3", "delta": {"type": "text", "text": "I wrote"}}});
        let line = notification_line(&n);
        assert!(line.contains("     7  item/delta"), "{line}");
        assert!(line.contains("item it-3 +\"I wrote\""), "{line}");
        assert!(!line.contains('\n'));
        let long = json!({"params": {"item": {"type": "agentMessage", "id": "i", "text": "x".repeat(500)}}});
        assert!(notification_line(&long).chars().count() < 140);
    }

    #[test]
    fn model_text_cannot_reach_the_terminal_as_escapes() {
        let n = json!({"method": "item/delta\x1b[2J", "params": {"turnId": "u", "itemId": "i",
            "delta": {"type": "text", "text": "\x1b[8mhidden\u{202e}"}}});
        let line = notification_line(&n);
        assert!(
            !line.contains('\x1b') && !line.contains('\u{202e}'),
            "{line:?}"
        );
        assert!(line.contains("item/delta^[[2J"), "{line}");
    }
}
