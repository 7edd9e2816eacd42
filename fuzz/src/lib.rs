//! Shared pieces of the fuzz targets: the stdio framer compiled in by path (the CLI crate has no
//! library, and the framer is a self-contained module), the wire fixtures used as dictionary
//! material, and small helpers every target needs to state its invariants.

#[path = "../../cli/src/framing.rs"]
#[allow(dead_code)]
pub mod framing;

use std::path::PathBuf;
use std::sync::OnceLock;

pub mod engine;

/// True when `CC_FUZZ_STRICT=1`: the targets then also trip on findings already filed in
/// issue 10 (see docs/fuzzing.md, "Known findings"), instead of steering around them.
pub fn strict() -> bool {
    static STRICT: OnceLock<bool> = OnceLock::new();
    *STRICT.get_or_init(|| std::env::var_os("CC_FUZZ_STRICT").is_some_and(|v| v == "1"))
}

/// `schema/fixtures`, found from this crate's directory.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../schema/fixtures")
}

/// Every message-level fixture (valid and invalid), compacted to one line, in a stable order.
pub fn fixture_lines() -> &'static [String] {
    static LINES: OnceLock<Vec<String>> = OnceLock::new();
    LINES.get_or_init(|| {
        let mut paths = Vec::new();
        for folder in ["valid", "invalid"] {
            if let Ok(rd) = std::fs::read_dir(fixtures_dir().join(folder)) {
                paths.extend(
                    rd.filter_map(Result::ok)
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|e| e == "json")),
                );
            }
        }
        paths.sort();
        paths
            .iter()
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .map(|t| t.replace('\n', " "))
            .collect()
    })
}

/// Depth of a JSON value (a scalar is 1).
pub fn depth(v: &serde_json::Value) -> usize {
    use serde_json::Value;
    // Iterative: the values come from a parser with a recursion limit, but keep this cheap.
    let mut max = 0;
    let mut stack = vec![(v, 1usize)];
    while let Some((v, d)) = stack.pop() {
        max = max.max(d);
        match v {
            Value::Array(a) => stack.extend(a.iter().map(|x| (x, d + 1))),
            Value::Object(o) => stack.extend(o.values().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    max
}
