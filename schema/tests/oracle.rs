//! The runtime validator (the schema profile's own interpreter, src/check.rs) against a general
//! JSON Schema 2020-12 engine, the `jsonschema` crate, as an oracle: the same verdict on every
//! fixture and on tens of thousands of mutants made from them (members dropped, added, renamed,
//! retyped, tags swapped, bounds crossed), and the same answer as the `regex` crate for every
//! pattern of the schema over strings made to sit on its edges. The mutants are generated here, not
//! checked in, so nobody tuned the engine to them.

use cc_agent_protocol::pattern::Pattern;
use cc_agent_protocol::validate::schema_verdict;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn fixtures() -> Vec<(String, Option<String>, Value)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let mut out = Vec::new();
    for folder in [
        "valid",
        "invalid",
        "valid/definitions",
        "invalid/definitions",
    ] {
        let mut files: Vec<_> = std::fs::read_dir(root.join(folder))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            let Ok(doc) = serde_json::from_str::<Value>(&text) else {
                continue; // parse-* fixtures: refused before any schema
            };
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if folder.ends_with("definitions") {
                let def = doc["definition"].as_str().unwrap().to_string();
                out.push((name, Some(def), doc["value"].clone()));
            } else {
                out.push((name, None, doc));
            }
        }
    }
    out
}

struct Oracle {
    whole: jsonschema::Validator,
    defs: BTreeMap<String, jsonschema::Validator>,
}

impl Oracle {
    fn new() -> Oracle {
        let schema = cc_agent_protocol::schema();
        let whole = jsonschema::draft202012::new(schema).unwrap();
        let mut defs = BTreeMap::new();
        for name in schema["$defs"].as_object().unwrap().keys() {
            let mut wrapper = schema.clone();
            let obj = wrapper.as_object_mut().unwrap();
            obj.remove("oneOf");
            obj.insert("$ref".into(), Value::from(format!("#/$defs/{name}")));
            defs.insert(
                name.clone(),
                jsonschema::draft202012::new(&wrapper).unwrap(),
            );
        }
        Oracle { whole, defs }
    }

    fn verdict(&self, def: Option<&str>, v: &Value) -> bool {
        match def {
            None => self.whole.is_valid(v),
            Some(d) => self.defs[d].is_valid(v),
        }
    }
}

#[test]
fn every_fixture_gets_the_oracles_verdict() {
    let oracle = Oracle::new();
    let mut checked = 0;
    for (name, def, value) in fixtures() {
        if def.as_deref().is_some_and(|d| !oracle.defs.contains_key(d)) {
            assert_eq!(schema_verdict(def.as_deref(), &value), None, "{name}");
            continue;
        }
        let ours = schema_verdict(def.as_deref(), &value).unwrap();
        assert_eq!(ours, oracle.verdict(def.as_deref(), &value), "{name}");
        checked += 1;
    }
    assert!(checked > 300, "only {checked} fixtures");
}

/// A small deterministic generator (no `rand` dependency; the same mutants every run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// Every string value seen under each member name, to swap tags and enum values between messages.
fn seen_strings(corpus: &[(String, Option<String>, Value)]) -> BTreeMap<String, BTreeSet<String>> {
    fn walk(v: &Value, out: &mut BTreeMap<String, BTreeSet<String>>) {
        match v {
            Value::Object(o) => {
                for (k, x) in o {
                    if let Value::String(s) = x {
                        if s.len() <= 64 {
                            out.entry(k.clone()).or_default().insert(s.clone());
                        }
                    }
                    walk(x, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    for (_, _, v) in corpus {
        walk(v, &mut out);
    }
    out
}

/// Replacement values for the node at one position (its member name, if any, picks tag swaps).
fn replacements(
    v: &Value,
    key: Option<&str>,
    seen: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<Value> {
    let mut out = vec![
        json!(null),
        json!(true),
        json!(0),
        json!(-1),
        json!(1.5),
        json!(3.0),
        json!(9007199254740991u64),
        json!(9007199254740992u64),
        json!(""),
        json!("A"),
        json!("thr_01\n"),
        json!("é"),
        json!([]),
        json!({}),
    ];
    match v {
        Value::String(s) => {
            out.push(json!(format!("{s}x")));
            out.push(json!(format!("_{s}")));
            out.push(json!(format!("{s}\n")));
            out.push(json!(s.to_uppercase()));
            out.push(json!(s.repeat(3)));
            let mut shorter = s.clone();
            shorter.pop();
            out.push(json!(shorter));
            if let Some(k) = key {
                for other in seen.get(k).into_iter().flatten().take(12) {
                    out.push(json!(other));
                }
            }
        }
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                for d in [1, -1, 1000, -1000] {
                    out.push(json!(i.saturating_add(d)));
                }
                out.push(json!(i as f64 + 0.5));
                out.push(json!(-i));
            }
        }
        Value::Array(a) => {
            if let Some(first) = a.first() {
                let mut dup = a.clone();
                dup.push(first.clone());
                out.push(Value::Array(dup));
                out.push(Value::Array(a[1..].to_vec()));
                out.push(Value::Array(vec![first.clone(); 65]));
            }
        }
        Value::Object(o) => {
            let mut extra = o.clone();
            extra.insert("zz".into(), json!(1));
            out.push(Value::Object(extra));
            for k in o.keys() {
                let mut dropped = o.clone();
                dropped.shift_remove(k);
                out.push(Value::Object(dropped));
                let mut renamed = o.clone();
                let x = renamed.shift_remove(k).unwrap();
                renamed.insert(format!("{k}s"), x);
                out.push(Value::Object(renamed));
            }
        }
        _ => {}
    }
    out
}

/// Every position in `v` as a JSON pointer, with its member name.
fn positions(v: &Value, at: String, key: Option<String>, out: &mut Vec<(String, Option<String>)>) {
    out.push((at.clone(), key));
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                let seg = k.replace('~', "~0").replace('/', "~1");
                positions(x, format!("{at}/{seg}"), Some(k.clone()), out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                positions(x, format!("{at}/{i}"), None, out);
            }
        }
        _ => {}
    }
}

#[test]
fn mutants_of_every_fixture_get_the_oracles_verdict() {
    let oracle = Oracle::new();
    let corpus: Vec<_> = fixtures()
        .into_iter()
        .filter(|(_, def, _)| def.as_deref().is_none_or(|d| oracle.defs.contains_key(d)))
        .collect();
    let seen = seen_strings(&corpus);
    let mut rng = Lcg(0x5eed_cafe);
    let (mut valid, mut invalid, mut differ) = (0usize, 0usize, Vec::new());
    for (name, def, value) in &corpus {
        let mut spots = Vec::new();
        positions(value, String::new(), None, &mut spots);
        for (pointer, key) in spots {
            let here = value.pointer(&pointer).unwrap();
            for replacement in replacements(here, key.as_deref(), &seen) {
                // One in 24 (about 10,000 of them), so the test stays quick in a debug build.
                if !rng.next().is_multiple_of(24) {
                    continue;
                }
                let mut mutant = value.clone();
                *mutant.pointer_mut(&pointer).unwrap() = replacement;
                let expected = oracle.verdict(def.as_deref(), &mutant);
                let ours = schema_verdict(def.as_deref(), &mutant).unwrap();
                if ours != expected {
                    differ.push(format!(
                        "{name} at {pointer:?}: ours {ours}, oracle {expected}: {mutant}"
                    ));
                }
                if expected {
                    valid += 1;
                } else {
                    invalid += 1;
                }
            }
        }
    }
    assert!(
        differ.is_empty(),
        "{} mutants differ, e.g.:\n{}",
        differ.len(),
        differ
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The corpus must exercise both verdicts, or it proves nothing.
    assert!(
        valid > 2_000 && invalid > 10_000,
        "{valid} valid, {invalid} invalid mutants"
    );
    eprintln!("oracle: {valid} valid and {invalid} invalid mutants, all agreed");
}

/// Every `pattern` of the schema, with its `maxLength` when the same node has one.
fn schema_patterns() -> BTreeSet<String> {
    fn walk(v: &Value, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(o) => {
                if let Some(Value::String(p)) = o.get("pattern") {
                    out.insert(p.clone());
                }
                for (k, x) in o {
                    if k != "description" && k != "const" && k != "enum" {
                        walk(x, out);
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    walk(cc_agent_protocol::schema(), &mut out);
    out
}

#[test]
fn every_schema_pattern_matches_like_the_regex_crate() {
    let patterns = schema_patterns();
    assert!(patterns.len() >= 10, "{patterns:?}");
    let alphabet: Vec<char> = "aAz09_-.:/*+=~@T Z\n\u{e9}\u{1F600}f".chars().collect();
    let mut rng = Lcg(7);
    let mut subjects: Vec<String> = vec![String::new()];
    for len in [1usize, 2, 5, 16, 31, 32, 33, 63, 64, 65, 128, 129, 160, 161] {
        for _ in 0..40 {
            subjects.push(
                (0..len)
                    .map(|_| alphabet[(rng.next() % alphabet.len() as u64) as usize])
                    .collect(),
            );
        }
    }
    let seeds = [
        "thr_01",
        "2026-01-01T00:00:00Z",
        "2026-01-01T00:00:00.123456789+01:00",
        "fs:read",
        "*",
        "sha256:",
        "tool.call",
        "a/b.1/c",
        "graph/node.2",
        "0123456789abcdef",
    ];
    for s in seeds {
        for n in [1usize, 2, 4, 8, 16] {
            subjects.push(s.repeat(n));
            subjects.push(format!("{s}\n"));
            subjects.push(format!(" {s}"));
        }
    }
    let hex64 = "0123456789abcdef".repeat(4);
    for s in [
        hex64.clone(),
        format!("sha256:{hex64}"),
        hex64[..32].to_string(),
        hex64[..63].to_string(),
        hex64.to_uppercase(),
    ] {
        subjects.push(s);
    }
    let mut checked = 0;
    for p in &patterns {
        let ours = Pattern::new(p).unwrap();
        let theirs = regex::Regex::new(p).unwrap();
        for s in &subjects {
            assert_eq!(
                ours.is_match(s),
                theirs.is_match(s),
                "pattern {p:?} on {s:?}"
            );
            checked += 1;
        }
    }
    assert!(checked > 5_000);
}
