//! Embeds the canonical schema without the whitespace between its tokens (`SCHEMA_JSON`): the
//! same JSON document — same members, same strings, same digest (RFC 8785 ignores whitespace) —
//! in 61 % of the checked-in file's bytes, which every host library carries (docs/bench/size.md).

use std::path::Path;

/// `text` without the whitespace outside its strings.
fn minify(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in text.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            in_string = c == '"';
            out.push(c);
        }
    }
    out
}

fn main() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("cc-agent-protocol.schema.json");
    println!("cargo:rerun-if-changed={}", source.display());
    let text = std::fs::read_to_string(&source).expect("the schema is readable UTF-8");
    let out =
        Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("schema.min.json");
    std::fs::write(out, minify(&text)).expect("OUT_DIR is writable");
}
