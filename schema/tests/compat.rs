//! The v1 gate's own tests: the change-case corpus (each case in both orders), the real schema
//! against the frozen baseline (this is what fails the test command on a breaking change to v1),
//! and mutated copies of the real schema that must be caught at the right pointer and rule.

use cc_agent_protocol::compat::{self, Finding, Verdict};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn case_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            case_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "json") {
            out.push(path);
        }
    }
}

fn rules_of(findings: &[Finding]) -> Vec<String> {
    let set: BTreeSet<String> = findings.iter().map(|f| f.rule.clone()).collect();
    set.into_iter().collect()
}

fn expected(case: &Value, key: &str, path: &Path) -> (bool, Vec<String>) {
    let e = case
        .get(key)
        .unwrap_or_else(|| panic!("{}: no \"{key}\"", path.display()));
    let breaking = e["breaking"]
        .as_bool()
        .unwrap_or_else(|| panic!("{}: {key}.breaking must be a bool", path.display()));
    let mut rules: Vec<String> = e["rules"]
        .as_array()
        .unwrap_or_else(|| panic!("{}: {key}.rules must be an array", path.display()))
        .iter()
        .map(|r| r.as_str().expect("rule ids are strings").to_string())
        .collect();
    rules.sort();
    rules.dedup();
    (breaking, rules)
}

fn render(findings: &[Finding]) -> String {
    findings
        .iter()
        .map(|f| {
            format!(
                "    {} {} [{}] {}",
                if f.breaking { "BREAKING" } else { "allowed " },
                f.pointer,
                f.rule,
                f.detail
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs every case both ways: `before -> after` must match `expect`, `after -> before` `reverse`.
/// A case passes only when both orders classify as written.
#[test]
fn change_case_corpus() {
    let mut files = Vec::new();
    case_files(&crate_dir().join("compat-cases"), &mut files);
    let known: BTreeSet<&str> = compat::RULES.iter().map(|r| r.id).collect();
    let (mut passed, mut failed) = (0usize, 0usize);
    let mut report = String::new();
    // Which verdicts each rule produced across the corpus, to prove direction-dependent rules are
    // exercised both ways.
    let mut seen: BTreeMap<String, BTreeSet<bool>> = BTreeMap::new();
    for path in &files {
        let case = read_json(path);
        let name = case["name"].as_str().unwrap_or("(unnamed)");
        assert!(
            case["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{}: every case says what it shows",
            path.display()
        );
        let (before, after) = (&case["before"], &case["after"]);
        let mut ok = true;
        for (key, old, new) in [("expect", before, after), ("reverse", after, before)] {
            let (want_breaking, want_rules) = expected(&case, key, path);
            for r in &want_rules {
                assert!(
                    known.contains(r.as_str()),
                    "{}: unknown rule id {r}",
                    path.display()
                );
            }
            let findings = compat::compare(old, new);
            for f in &findings {
                seen.entry(f.rule.clone()).or_default().insert(f.breaking);
            }
            let got_breaking = compat::is_breaking(&findings);
            let got_rules = rules_of(&findings);
            if got_breaking != want_breaking || got_rules != want_rules {
                ok = false;
                report.push_str(&format!(
                    "FAIL {name} ({key}): want breaking={want_breaking} rules={want_rules:?}, got breaking={got_breaking} rules={got_rules:?}\n{}\n",
                    render(&findings)
                ));
            }
        }
        if ok {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    // Written to stderr directly, not through println!, so the tally shows even when the harness
    // captures a passing test's output.
    let _ = writeln!(
        std::io::stderr(),
        "compat cases: {passed} passed, {failed} failed"
    );
    assert!(
        failed == 0,
        "{report}compat cases: {passed} passed, {failed} failed"
    );
    assert!(
        files.len() >= 45,
        "the corpus has {} cases; keep at least 45",
        files.len()
    );

    // Every rule is exercised, and a direction-dependent rule both ways.
    for rule in compat::RULES {
        let verdicts = seen.get(rule.id).cloned().unwrap_or_default();
        assert!(!verdicts.is_empty(), "no case exercises rule {}", rule.id);
        match rule.verdict {
            Verdict::Allowed => {
                assert_eq!(verdicts, [false].into(), "{} must never break", rule.id)
            }
            Verdict::Breaking => {
                assert_eq!(verdicts, [true].into(), "{} must always break", rule.id)
            }
            Verdict::IfClientSent | Verdict::IfServerSent => assert_eq!(
                verdicts,
                [false, true].into(),
                "{} depends on direction: the corpus must show it allowed and breaking",
                rule.id
            ),
        }
    }
}

/// The gate itself: the canonical schema must not break the frozen v1 baseline.
#[test]
fn canonical_schema_does_not_break_v1_baseline() {
    let baseline = read_json(&crate_dir().join("baselines/v1.json"));
    let findings = compat::compare(&baseline, cc_agent_protocol::schema());
    let breaking: Vec<_> = findings.iter().filter(|f| f.breaking).cloned().collect();
    assert!(
        breaking.is_empty(),
        "the canonical schema breaks wire v1 (schema/baselines/v1.json):\n{}\nsee docs/compat.md",
        render(&breaking)
    );
}

/// Every erratum still matches a finding of the canonical schema against the baseline (a stale one
/// would silently cover a future change at the same place), and is reported as allowed.
#[test]
fn every_erratum_matches_a_finding_and_nothing_else_is_excused() {
    let baseline = read_json(&crate_dir().join("baselines/v1.json"));
    let findings = compat::compare(&baseline, cc_agent_protocol::schema());
    for (pointer, rule, _) in compat::ERRATA {
        let f = find(&findings, pointer, rule);
        assert!(!f.breaking, "{f:?}");
        assert!(f.detail.contains("accepted v1 erratum"), "{f:?}");
    }
    let excused = findings
        .iter()
        .filter(|f| f.detail.contains("accepted v1 erratum"))
        .count();
    assert_eq!(excused, compat::ERRATA.len(), "{}", render(&findings));
    // The same change anywhere else is still caught.
    let mut mutated = cc_agent_protocol::schema().clone();
    mutated["$defs"]["Identifier"]["type"] = json!(["string", "integer"]);
    let f = compat::compare(&baseline, &mutated);
    assert!(find(&f, "/$defs/Identifier/type", "type-widened").breaking);
}

#[test]
fn baseline_compared_with_itself_has_no_findings() {
    let baseline = read_json(&crate_dir().join("baselines/v1.json"));
    assert_eq!(compat::compare(&baseline, &baseline), Vec::new());
}

fn find<'a>(findings: &'a [Finding], pointer: &str, rule: &str) -> &'a Finding {
    findings
        .iter()
        .find(|f| f.pointer == pointer && f.rule == rule)
        .unwrap_or_else(|| panic!("expected [{rule}] at {pointer}, got:\n{}", render(findings)))
}

#[test]
fn removing_an_approval_binding_member_is_caught() {
    let base = cc_agent_protocol::schema();
    let mut mutated = base.clone();
    let binding = &mut mutated["$defs"]["ApprovalBinding"];
    binding["properties"]
        .as_object_mut()
        .unwrap()
        .remove("nonce")
        .expect("ApprovalBinding has a nonce");
    binding["required"]
        .as_array_mut()
        .unwrap()
        .retain(|r| r != "nonce");
    let findings = compat::compare(base, &mutated);
    let pointer = "/$defs/ApprovalBinding/properties/nonce";
    assert!(find(&findings, pointer, "property-removed").breaking);
    assert!(find(&findings, pointer, "lifecycle-changed").breaking);
}

#[test]
fn adding_an_approval_decision_is_caught() {
    let base = cc_agent_protocol::schema();
    let mut mutated = base.clone();
    mutated["$defs"]["AcceptForProject"] = json!({
        "type": "object",
        "properties": {"decision": {"const": "acceptForProject"}},
        "required": ["decision"],
        "additionalProperties": false
    });
    let branches = mutated["$defs"]["ApprovalDecision"]["oneOf"]
        .as_array_mut()
        .unwrap();
    branches.push(json!({"$ref": "#/$defs/AcceptForProject"}));
    let pointer = format!("/$defs/ApprovalDecision/oneOf/{}", branches.len() - 1);
    let findings = compat::compare(base, &mutated);
    assert!(find(&findings, &pointer, "lifecycle-changed").breaking);
    // ApprovalDecision also reaches clients in approval/resolved, so the strict union grows
    // under an old client's feet as well.
    assert!(find(&findings, &pointer, "strict-variant-added").breaking);
    assert!(!find(&findings, "/$defs/AcceptForProject", "def-added").breaking);
}

#[test]
fn tightening_identifier_is_caught() {
    let base = cc_agent_protocol::schema();
    let mut mutated = base.clone();
    mutated["$defs"]["Identifier"]["maxLength"] = json!(64);
    let findings = compat::compare(base, &mutated);
    let f = find(&findings, "/$defs/Identifier/maxLength", "bound-tightened");
    assert!(f.breaking, "{f:?}");
    assert_eq!(findings.len(), 1, "{}", render(&findings));
}

#[test]
fn loosening_identifier_is_caught_because_servers_send_it() {
    let base = cc_agent_protocol::schema();
    let mut mutated = base.clone();
    mutated["$defs"]["Identifier"]["maxLength"] = json!(256);
    let findings = compat::compare(base, &mutated);
    assert!(find(&findings, "/$defs/Identifier/maxLength", "bound-loosened").breaking);
}

#[test]
fn a_new_optional_thread_start_param_and_a_new_feature_are_allowed() {
    let base = cc_agent_protocol::schema();
    let mut mutated = base.clone();
    mutated["$defs"]["ThreadStartParams"]["properties"]["labels"] =
        json!({"type": "array", "items": {"$ref": "#/$defs/ShortText"}, "maxItems": 16});
    mutated["$defs"]["Feature"]["enum"]
        .as_array_mut()
        .unwrap()
        .push(json!("thread_labels"));
    let findings = compat::compare(base, &mutated);
    assert!(!compat::is_breaking(&findings), "{}", render(&findings));
    find(
        &findings,
        "/$defs/ThreadStartParams/properties/labels",
        "property-added",
    );
    // The new name lands after the features the canonical schema already has.
    let index = base["$defs"]["Feature"]["enum"].as_array().unwrap().len();
    find(
        &findings,
        &format!("/$defs/Feature/enum/{index}"),
        "feature-added",
    );
}

#[test]
fn directions_of_the_real_schema() {
    let dirs = compat::directions(cc_agent_protocol::schema());
    let dir = |name: &str| {
        let d = dirs
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not a definition"));
        (d.client_sent, d.server_sent)
    };
    assert_eq!(dir("ThreadStartParams"), (true, false));
    assert_eq!(dir("TurnStartParams"), (true, false));
    assert_eq!(dir("ThreadStartResult"), (false, true));
    assert_eq!(dir("InitializeResult"), (false, true));
    assert_eq!(dir("Thread"), (false, true));
    assert_eq!(dir("TurnStatus"), (false, true));
    assert_eq!(dir("ApprovalRequest"), (false, true));
    assert_eq!(dir("ApprovalDecision"), (true, true));
    assert_eq!(dir("Identifier"), (true, true));
    assert_eq!(dir("ErrorObject"), (true, true));
    // Kernel-facing and negotiation-only types reach no envelope: checked both ways.
    assert_eq!(dir("AgentStreamEvent"), (true, true));
    assert_eq!(dir("Feature"), (true, true));
}

#[test]
fn every_rule_is_documented() {
    let doc = std::fs::read_to_string(crate_dir().join("../docs/compat.md"))
        .expect("docs/compat.md exists");
    for rule in compat::RULES {
        assert!(
            doc.contains(&format!("`{}`", rule.id)),
            "docs/compat.md does not document rule {}",
            rule.id
        );
    }
}
