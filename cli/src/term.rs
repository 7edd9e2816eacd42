//! Text the model or a tool controls, made safe for a terminal, and the approval prompt drawn so
//! that nothing printed before it can disguise it.
//!
//! `visible` passes printable text and line breaks through and shows everything a terminal would
//! *interpret* as a visible token instead: C0 and C1 control characters (ESC and CSI start every
//! colour, cursor, hide and clear sequence; CR returns over a line; BS erases), DEL, and the
//! Unicode format characters that reorder or hide text (bidirectional embeddings, overrides and
//! isolates, zero-width characters, the BOM). So a model cannot hide, move, recolour or overwrite
//! anything: every byte it sends ends up as visible text on the screen.

use serde_json::Value;
use std::borrow::Cow;

/// Whether `c` would be interpreted by a terminal (or reorder/hide text) rather than shown.
fn dangerous(c: char) -> bool {
    match c {
        '\n' | '\t' => false,
        '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' => true,
        // Bidirectional controls (embeddings, overrides, isolates, marks) and invisible
        // characters that can make two different strings look alike.
        '\u{200b}'..='\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{2069}'
        | '\u{061c}'
        | '\u{feff}'
        | '\u{fff9}'..='\u{fffb}' => true,
        _ => false,
    }
}

/// `text` with every character a terminal would interpret shown as a visible token: `^[` style
/// caret notation for C0 and DEL (`ESC` → `^[`, CR → `^M`), `<U+XXXX>` for the rest.
pub fn visible(text: &str) -> Cow<'_, str> {
    if !text.chars().any(dangerous) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if !dangerous(c) {
            out.push(c);
        } else if (c as u32) < 0x20 {
            out.push('^');
            out.push(char::from(b'@' + c as u8));
        } else if c == '\u{7f}' {
            out.push_str("^?");
        } else {
            out.push_str(&format!("<U+{:04X}>", c as u32));
        }
    }
    Cow::Owned(out)
}

/// `visible`, on one line: line breaks and tabs are shown too (for values inside the prompt's
/// frame, where a line break would let a value draw lines of its own).
pub fn one_line(text: &str) -> String {
    visible(text).replace('\n', "\\n").replace('\t', "\\t")
}

/// Attributes back to normal, on a fresh line: what the terminal looks like before the prompt,
/// whatever came before (only written to a terminal; model text can never contain it, since
/// `visible` shows every ESC).
pub const RESET: &str = "\x1b[0m";

/// The approval prompt for the published `ApprovalRequest` in `params`: a frame whose every line
/// starts with `│`, every value on one visible line, a run_command's argv one element per line
/// exactly as it will be executed, and the question last. `tty`: reset attributes first and draw
/// the header in reverse video, which text from the model can never produce.
pub fn approval_prompt(params: &Value, tty: bool) -> String {
    let op = &params["operation"];
    let b = &params["binding"];
    let s = |v: &Value| one_line(v.as_str().unwrap_or("?"));
    let tool = s(&op["tool"]);
    let mut out = String::new();
    if tty {
        out.push_str(RESET);
    }
    out.push('\n');
    let header = format!("┌─ APPROVAL NEEDED: {tool} ");
    if tty {
        out.push_str(&format!("\x1b[7m{header}\x1b[0m\n"));
    } else {
        out.push_str(&header);
        out.push('\n');
    }
    let mut line = |label: &str, value: String| {
        out.push_str(&format!("│ {label:<10} {value}\n"));
    };
    line("tool:", tool.clone());
    if let Some(risk) = params["risk"].as_str() {
        line("risk:", one_line(risk));
    }
    let args = &op["arguments"];
    match args.get("argv").and_then(Value::as_array) {
        Some(argv) if op["tool"] == "run_command" => {
            line("runs:", format!("{} argument(s), no shell", argv.len()));
            for (i, a) in argv.iter().enumerate() {
                let shown = match a.as_str() {
                    Some(t) => format!("{:?}", one_line(t)),
                    None => one_line(&a.to_string()),
                };
                line(&format!("argv[{i}]"), shown);
            }
            let rest: serde_json::Map<String, Value> = args
                .as_object()
                .map(|o| {
                    o.iter()
                        .filter(|(k, _)| k.as_str() != "argv")
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .unwrap_or_default();
            if !rest.is_empty() {
                line("options:", one_line(&Value::Object(rest).to_string()));
            }
        }
        _ => line("arguments:", one_line(&args.to_string())),
    }
    if let Some(reason) = params["reason"].as_str() {
        line("reason:", one_line(reason));
    }
    line(
        "binding:",
        format!(
            "thread {} turn {} item {}",
            s(&b["threadId"]),
            s(&b["turnId"]),
            s(&b["itemId"])
        ),
    );
    line("operation", s(&b["operationDigest"]));
    line("workspace", s(&b["workspaceDigest"]));
    line("expires", s(&b["expiresAt"]));
    out.push_str(&format!("└─ approve {tool}? [y] once, [t] for this turn, [s] for this session, [n] decline, [c] cancel the turn: "));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn escapes_and_controls_are_shown_not_interpreted() {
        assert_eq!(visible("plain\ttext\nnext"), "plain\ttext\nnext");
        assert_eq!(visible("\x1b[8mhidden"), "^[[8mhidden");
        assert_eq!(visible("a\rb\x08c\x7f"), "a^Mb^Hc^?");
        assert_eq!(visible("\u{9b}2J"), "<U+009B>2J");
        assert_eq!(visible("x\u{202e}txt.exe"), "x<U+202E>txt.exe");
        assert_eq!(visible("zero\u{200b}width"), "zero<U+200B>width");
        for c in (0u32..0x110000).filter_map(char::from_u32) {
            let shown = visible(&c.to_string()).into_owned();
            assert!(
                !shown.chars().any(dangerous),
                "{c:?} still reaches the terminal"
            );
        }
    }

    #[test]
    fn the_prompt_frames_every_value_on_its_own_line_and_shows_the_exact_argv() {
        let params = json!({
            "id": "approval-1",
            "risk": "high",
            "operation": {"tool": "run_command", "arguments": {
                "argv": ["sh", "-c", "rm -rf ~\n--- approval needed ---\x1b[8m"], "timeout_ms": 5}},
            "binding": {"threadId": "t", "turnId": "u", "itemId": "i",
                "operationDigest": "sha256:ab", "workspaceDigest": "sha256:cd",
                "expiresAt": "2026-01-01T00:00:00Z"},
        });
        let p = approval_prompt(&params, false);
        assert!(!p.contains('\x1b'), "{p}");
        let lines: Vec<&str> = p.lines().collect();
        assert_eq!(lines[1], "┌─ APPROVAL NEEDED: run_command ");
        assert!(
            lines[2..lines.len() - 1]
                .iter()
                .all(|l| l.starts_with("│ ")),
            "{p}"
        );
        assert!(
            p.contains(r#"│ argv[2]    "rm -rf ~\\n--- approval needed ---^[[8m""#),
            "{p}"
        );
        assert!(p.contains("│ runs:      3 argument(s), no shell"), "{p}");
        assert!(p.contains(r#"│ options:   {"timeout_ms":5}"#), "{p}");
        assert!(lines.last().unwrap().starts_with("└─ approve run_command?"));
        let tty = approval_prompt(&params, true);
        assert!(
            tty.starts_with("\x1b[0m\n\x1b[7m┌─ APPROVAL NEEDED"),
            "{tty:?}"
        );
    }
}
