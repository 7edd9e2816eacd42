//! Replays every shared fixture in `schema/fixtures/` through the runtime validator.
//!
//! Layout (see `schema/fixtures/README.md`):
//! - `valid/*.json`, `invalid/*.json`: one wire message each, checked by `validate_protocol_message`;
//! - `valid/definitions/*.json`, `invalid/definitions/*.json`: `{"definition": Name, "value": …}`,
//!   checked by `validate_protocol_definition(Name, value)`;
//! - `invalid/parse-*.json`: refused by the JSON parser itself (-32700), before any schema check.

use cc_agent_protocol::{validate_protocol_definition, validate_protocol_message, ValidationError};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

const MINIMUM_FIXTURES: usize = 170;

/// Definitions whose fixtures must cover at least one valid and four invalid instances.
const SECURITY_SENSITIVE: &[&str] = &[
    "ApprovalDecision",
    "ApprovalBinding",
    "ApprovalRequest",
    "ToolResult",
    "ToolCall",
    "UserInput",
    "ForkOrigin",
    "GraphDefinition",
    "GraphRunGrant",
    "GraphEffectReceipt",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries =
        fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "json") {
            out.push(path);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Valid,
    Invalid,
}

struct Fixture {
    /// Path relative to `fixtures/`, with `/` separators.
    rel: String,
    expect: Expect,
    /// `Some(name)` for a definition-level fixture.
    definition: Option<String>,
    text: String,
}

impl Fixture {
    fn file_name(&self) -> &str {
        self.rel.rsplit('/').next().unwrap_or(&self.rel)
    }

    fn is_parse_fixture(&self) -> bool {
        self.file_name().starts_with("parse-")
    }
}

/// Every fixture, sorted by relative path.
fn fixtures() -> Vec<Fixture> {
    let mut all = Vec::new();
    for (folder, expect) in [("valid", Expect::Valid), ("invalid", Expect::Invalid)] {
        let mut paths = Vec::new();
        walk(&root().join(folder), &mut paths);
        for path in paths {
            let rel = path.strip_prefix(root()).expect("under the root");
            let rel = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            let text =
                fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: not UTF-8 text: {e}"));
            let definition = if rel.starts_with(&format!("{folder}/definitions/")) {
                let wrapper: Value =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{rel}: {e}"));
                let name = wrapper.get("definition").and_then(Value::as_str);
                Some(
                    name.unwrap_or_else(|| {
                        panic!("{rel}: a definition fixture names its definition")
                    })
                    .to_string(),
                )
            } else {
                None
            };
            all.push(Fixture {
                rel,
                expect,
                definition,
                text,
            });
        }
    }
    all.sort_by(|a, b| a.rel.cmp(&b.rel));
    all
}

/// The validator's verdict on one fixture: `Ok(())`, or the refusal (`None` for a parse error).
fn verdict(f: &Fixture) -> Result<Result<(), Option<ValidationError>>, String> {
    let value: Value = match serde_json::from_str(&f.text) {
        Ok(v) => v,
        Err(_) => return Ok(Err(None)),
    };
    match &f.definition {
        Some(name) => {
            let obj = value
                .as_object()
                .ok_or("a definition fixture is an object")?;
            if obj.len() != 2 || !obj.contains_key("value") {
                return Err("a definition fixture has exactly `definition` and `value`".into());
            }
            Ok(validate_protocol_definition(name, &obj["value"]).map_err(Some))
        }
        None => Ok(validate_protocol_message(&value).map(|_| ()).map_err(Some)),
    }
}

/// Why a fixture failed, or `None` when it behaved as its folder says.
fn check(f: &Fixture) -> Option<String> {
    let verdict = match verdict(f) {
        Ok(v) => v,
        Err(reason) => return Some(reason),
    };
    let value: Option<Value> = serde_json::from_str(&f.text).ok();
    match (f.expect, verdict) {
        (Expect::Valid, Ok(())) if !f.is_parse_fixture() => None,
        (Expect::Valid, Ok(())) => Some("`parse-` fixtures belong in invalid/".into()),
        (Expect::Valid, Err(None)) => Some("valid fixture does not parse".into()),
        (Expect::Valid, Err(Some(e))) => Some(format!("expected valid, refused: {e}")),
        (Expect::Invalid, Ok(())) => Some("expected a refusal, but it validated".into()),
        (Expect::Invalid, Err(None)) if f.is_parse_fixture() => None,
        (Expect::Invalid, Err(None)) => {
            Some("does not parse; only `parse-` fixtures may fail in the parser".into())
        }
        (Expect::Invalid, Err(Some(_))) if f.is_parse_fixture() => {
            Some("`parse-` fixture parsed; it must be refused by the parser".into())
        }
        (Expect::Invalid, Err(Some(e))) => {
            if e.issues.is_empty() {
                return Some(format!("refused without issues: {e}"));
            }
            // Every issue names a JSON pointer into the instance that exists there.
            let instance = match (&f.definition, value) {
                (Some(_), Some(v)) => v["value"].clone(),
                (None, Some(v)) => v,
                (_, None) => unreachable!("a parsed fixture"),
            };
            for issue in &e.issues {
                if !(issue.pointer.is_empty() || issue.pointer.starts_with('/')) {
                    return Some(format!(
                        "issue pointer {:?} is not a JSON pointer: {e}",
                        issue.pointer
                    ));
                }
                if instance.pointer(&issue.pointer).is_none() {
                    return Some(format!(
                        "issue pointer {:?} does not resolve in the instance: {e}",
                        issue.pointer
                    ));
                }
                if issue.message.is_empty() {
                    return Some(format!("issue at {:?} has no message", issue.pointer));
                }
            }
            None
        }
    }
}

#[test]
fn every_fixture_gets_the_verdict_of_its_folder() {
    let all = fixtures();
    let (mut passed, mut failed) = (0usize, 0usize);
    for f in &all {
        match check(f) {
            None => passed += 1,
            Some(reason) => {
                failed += 1;
                println!("FAIL {}: {reason}", f.rel);
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    assert_eq!(
        failed,
        0,
        "{failed} of {} fixtures did not get the verdict of their folder",
        all.len()
    );
    assert!(
        all.len() >= MINIMUM_FIXTURES,
        "only {} fixtures; at least {MINIMUM_FIXTURES} expected",
        all.len()
    );
}

#[test]
fn every_security_sensitive_definition_has_valid_and_invalid_fixtures() {
    let mut counts: BTreeMap<&str, (usize, usize)> =
        SECURITY_SENSITIVE.iter().map(|d| (*d, (0, 0))).collect();
    for f in fixtures() {
        let Some(name) = f.definition.as_deref() else {
            continue;
        };
        if let Some((valid, invalid)) = counts.get_mut(name) {
            match f.expect {
                Expect::Valid => *valid += 1,
                Expect::Invalid => *invalid += 1,
            }
        }
    }
    let short: Vec<String> = counts
        .iter()
        .filter(|(_, (v, i))| *v < 1 || *i < 4)
        .map(|(d, (v, i))| format!("{d}: {v} valid, {i} invalid"))
        .collect();
    assert!(
        short.is_empty(),
        "needs at least 1 valid and 4 invalid definition fixtures: {short:?}"
    );
}

#[test]
fn fixture_files_are_kebab_case_and_pretty_printed() {
    for f in fixtures() {
        let stem = f.file_name().strip_suffix(".json").expect("a .json file");
        let kebab = !stem.is_empty()
            && !stem.starts_with('-')
            && !stem.ends_with('-')
            && !stem.contains("--")
            && stem
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        assert!(kebab, "{}: file names are kebab-case", f.rel);
        assert!(f.text.ends_with('\n'), "{}: ends with a newline", f.rel);
        let structured = f.text.trim_start().starts_with(['{', '[']);
        if structured && f.text.trim().len() > 2 {
            assert!(
                f.text.lines().count() > 1,
                "{}: pretty-printed, one member per line",
                f.rel
            );
        }
    }
}

#[test]
fn unknown_methods_are_method_not_found_and_params_errors_are_invalid_params() {
    use cc_agent_protocol::ErrorClass;
    let class_of = |rel: &str| {
        let f = fixtures()
            .into_iter()
            .find(|f| f.rel == rel)
            .unwrap_or_else(|| panic!("missing fixture {rel}"));
        match verdict(&f) {
            Ok(Err(Some(e))) => e.class,
            _ => panic!("{rel} should be refused by the validator"),
        }
    };
    assert_eq!(
        class_of("invalid/envelope-unknown-method.json"),
        ErrorClass::MethodNotFound
    );
    assert_eq!(
        class_of("invalid/envelope-unknown-notification.json"),
        ErrorClass::MethodNotFound
    );
    assert_eq!(
        class_of("invalid/envelope-jsonrpc-1-0.json"),
        ErrorClass::InvalidRequest
    );
    assert_eq!(
        class_of("invalid/envelope-id-string-129-chars.json"),
        ErrorClass::InvalidRequest
    );
    assert_eq!(
        class_of("invalid/thread-start-request-metadata-nesting-depth-65-past-request-bound.json"),
        ErrorClass::InvalidParams
    );
    assert_eq!(
        class_of("invalid/envelope-top-level-array-batch.json"),
        ErrorClass::InvalidRequest
    );
    assert_eq!(
        class_of("invalid/turn-start-request-input-image-unknown-kind.json"),
        ErrorClass::InvalidParams
    );
    assert_eq!(
        class_of("invalid/approval-binding-nonce-31-hex.json"),
        ErrorClass::InvalidParams
    );
}
