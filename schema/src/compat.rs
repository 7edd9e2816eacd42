//! The v1 breaking-change gate: classifies every difference between the frozen baseline schema and
//! the current one, per direction of travel, so a change that would break a deployed peer fails CI.
//!
//! The model (docs/compat.md has the full rule table): within wire v1 the server is the side that
//! upgrades and clients may be old. For what a client sends, the new schema must accept every old
//! message (loosening is fine, tightening breaks). For what the server sends, an old client must
//! accept every new message, except where its receiver keeps unknown values (`x-unknown: keep`) or
//! ignores unknown properties (an object that is not `additionalProperties: false`). A definition
//! reachable both ways gets both checks; one reachable from nowhere (kernel-facing types, the
//! feature list) gets both as well, because we cannot tell who receives it.

use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// One difference between the baseline and the current schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// JSON pointer into the schema where the difference is.
    pub pointer: String,
    /// The rule that classified it.
    pub rule: String,
    /// True when the change breaks wire v1.
    pub breaking: bool,
    pub detail: String,
}

/// When a rule's finding is breaking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed within v1 in every direction.
    Allowed,
    /// Breaking in every direction.
    Breaking,
    /// Breaking when the definition is client-sent (the new server must accept old messages).
    IfClientSent,
    /// Breaking when the definition is server-sent (an old client must accept new messages).
    IfServerSent,
}

/// A rule: its stable id, when it breaks, and what it means.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub id: &'static str,
    pub verdict: Verdict,
    pub summary: &'static str,
}

/// Every rule `compare` can report. Ids are stable: tooling and docs/compat.md refer to them.
pub const RULES: &[Rule] = &[
    Rule { id: "def-added", verdict: Verdict::Allowed, summary: "a new $def" },
    Rule { id: "def-removed", verdict: Verdict::Breaking, summary: "a $def was deleted" },
    Rule { id: "description-changed", verdict: Verdict::Allowed, summary: "description, title, $comment or examples changed" },
    Rule { id: "schema-identity-changed", verdict: Verdict::Breaking, summary: "$id, $schema or x-wire-version changed" },
    Rule { id: "envelope-changed", verdict: Verdict::Breaking, summary: "a member of the top-level envelope oneOf was added or removed" },
    Rule { id: "property-added", verdict: Verdict::Allowed, summary: "a new optional property (on a server-sent object only when the object is not strict)" },
    Rule { id: "property-added-to-strict", verdict: Verdict::IfServerSent, summary: "a new property on a strict (additionalProperties: false) object an old client must decode" },
    Rule { id: "property-removed", verdict: Verdict::Breaking, summary: "a property was deleted" },
    Rule { id: "wire-name-changed", verdict: Verdict::Breaking, summary: "a property was renamed (same schema, new name)" },
    Rule { id: "required-added", verdict: Verdict::IfClientSent, summary: "a new required property, or an optional one made required" },
    Rule { id: "required-removed", verdict: Verdict::IfServerSent, summary: "a required property relaxed to optional" },
    Rule { id: "type-changed", verdict: Verdict::Breaking, summary: "the JSON type changed" },
    Rule { id: "type-widened", verdict: Verdict::IfServerSent, summary: "the JSON type now admits more types (integer -> [integer, string])" },
    Rule { id: "type-narrowed", verdict: Verdict::IfClientSent, summary: "the JSON type now admits fewer types" },
    Rule { id: "ref-changed", verdict: Verdict::Breaking, summary: "a $ref points to another definition" },
    Rule { id: "ref-inlined", verdict: Verdict::Allowed, summary: "a $ref was inlined or an inline schema extracted to a $def; the contents are compared" },
    Rule { id: "nullable-added", verdict: Verdict::IfServerSent, summary: "X became oneOf [X, null]" },
    Rule { id: "nullable-removed", verdict: Verdict::IfClientSent, summary: "oneOf [X, null] became X" },
    Rule { id: "const-changed", verdict: Verdict::Breaking, summary: "a const (tag value, literal) changed, appeared or disappeared" },
    Rule { id: "pattern-changed", verdict: Verdict::Breaking, summary: "a pattern changed, appeared or disappeared" },
    Rule { id: "bound-tightened", verdict: Verdict::IfClientSent, summary: "minimum/maximum, minLength/maxLength, minItems/maxItems, minProperties/maxProperties narrowed" },
    Rule { id: "bound-loosened", verdict: Verdict::IfServerSent, summary: "one of those bounds widened or dropped" },
    Rule { id: "additional-properties-tightened", verdict: Verdict::IfClientSent, summary: "additionalProperties true -> false (or -> a schema)" },
    Rule { id: "additional-properties-loosened", verdict: Verdict::IfServerSent, summary: "additionalProperties widened; from false it is always breaking (a strict object is security-sensitive)" },
    Rule { id: "enum-value-added", verdict: Verdict::Allowed, summary: "a new value in an enum whose receivers keep unknowns" },
    Rule { id: "strict-enum-value-added", verdict: Verdict::IfServerSent, summary: "a new value in a strict enum" },
    Rule { id: "feature-added", verdict: Verdict::Allowed, summary: "a new capability name in Feature (negotiated in initialize)" },
    Rule { id: "enum-value-removed", verdict: Verdict::Breaking, summary: "an enum value was deleted" },
    Rule { id: "enum-value-reused", verdict: Verdict::Breaking, summary: "an enum value was deleted and a new one put in its place" },
    Rule { id: "variant-added", verdict: Verdict::Allowed, summary: "a new branch in a union whose receivers keep unknowns" },
    Rule { id: "strict-variant-added", verdict: Verdict::IfServerSent, summary: "a new branch in a strict union" },
    Rule { id: "variant-removed", verdict: Verdict::Breaking, summary: "a union branch (tag value) was deleted" },
    Rule { id: "tag-value-moved", verdict: Verdict::Breaking, summary: "a tag value now selects a different definition" },
    Rule { id: "tag-changed", verdict: Verdict::Breaking, summary: "a union's x-tag (its discriminator's wire name) changed" },
    Rule { id: "unknown-policy-changed", verdict: Verdict::Breaking, summary: "x-unknown appeared or disappeared" },
    Rule { id: "union-changed", verdict: Verdict::Breaking, summary: "an untagged oneOf (other than nullable) changed" },
    Rule { id: "order-changed", verdict: Verdict::Allowed, summary: "enum values or union branches reordered (the wire uses names)" },
    Rule { id: "lifecycle-changed", verdict: Verdict::Breaking, summary: "any change to a thread/turn/item/tool/approval lifecycle definition" },
    Rule { id: "keyword-changed", verdict: Verdict::Breaking, summary: "any other keyword changed (fails safe)" },
];

/// Definitions whose values carry thread, turn, item, tool or approval lifecycle semantics: every
/// non-annotation change to them (or to the branches of those that are unions) is breaking,
/// whatever the direction or unknown-value policy says.
pub const LIFECYCLE_DEFS: &[&str] = &[
    "ThreadStatus",
    "TurnStatus",
    "ItemStatus",
    "ToolResult",
    "ApprovalBinding",
    "ApprovalDecision",
    "ApprovalRequest",
    "ItemPhase",
    "TerminalEvidence",
    "ApprovalOutcome",
    "ApprovalFailure",
];

/// Keywords that describe but never constrain.
const ANNOTATIONS: &[&str] = &["description", "title", "$comment", "examples", "deprecated"];

/// Bounds: (keyword, true when a larger value is tighter, the implied value when absent).
const BOUNDS: &[(&str, bool, f64)] = &[
    ("minimum", true, f64::NEG_INFINITY),
    ("exclusiveMinimum", true, f64::NEG_INFINITY),
    ("minLength", true, 0.0),
    ("minItems", true, 0.0),
    ("minProperties", true, 0.0),
    ("maximum", false, f64::INFINITY),
    ("exclusiveMaximum", false, f64::INFINITY),
    ("maxLength", false, f64::INFINITY),
    ("maxItems", false, f64::INFINITY),
    ("maxProperties", false, f64::INFINITY),
    // Our own keyword: arrays and objects nest at most this many levels (the validator enforces it).
    ("x-max-depth", false, f64::INFINITY),
];

/// Which JSON type a bound constrains: a bound added together with a type the old schema did not
/// admit constrains only new values, so it tightens nothing.
fn bound_applies_to(key: &str) -> &'static [&'static str] {
    match key {
        "minimum" | "exclusiveMinimum" | "maximum" | "exclusiveMaximum" => &["integer", "number"],
        "minLength" | "maxLength" => &["string"],
        "minItems" | "maxItems" => &["array"],
        "minProperties" | "maxProperties" => &["object"],
        _ => &[],
    }
}

/// Breaking findings accepted into v1 on purpose, each exactly (pointer, rule) with the reason.
/// The list is closed: an entry here is a decision recorded in docs/compat.md ("v1 errata"), and
/// the gate's tests fail if an entry stops matching a finding.
pub const ERRATA: &[(&str, &str, &str)] = &[
    // Empty since the re-freeze of v1 on the published wire (docs/compat.md): the two earlier
    // errata (string request ids, the 64-level request depth) are part of that baseline.
];

/// Keywords `compare_node` handles itself; any other keyword that differs is `keyword-changed`.
const HANDLED: &[&str] = &[
    "$ref",
    "type",
    "const",
    "enum",
    "pattern",
    "x-tag",
    "x-unknown",
    "x-max-depth",
    "oneOf",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "propertyNames",
];

/// Who sends values of a definition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Direction {
    /// Reachable from ClientRequest or from a server request's result (the client's answer).
    pub client_sent: bool,
    /// Reachable from ServerNotification, ServerRequest or a client request's result.
    pub server_sent: bool,
}

impl Direction {
    pub const BOTH: Direction = Direction {
        client_sent: true,
        server_sent: true,
    };

    fn union(self, other: Direction) -> Direction {
        Direction {
            client_sent: self.client_sent || other.client_sent,
            server_sent: self.server_sent || other.server_sent,
        }
    }

    fn describe(self) -> &'static str {
        match (self.client_sent, self.server_sent) {
            (true, true) => "sent both ways",
            (true, false) => "client-sent",
            (false, true) => "server-sent",
            (false, false) => "unreached",
        }
    }
}

fn defs(schema: &Value) -> Option<&Map<String, Value>> {
    schema.get("$defs").and_then(Value::as_object)
}

fn ref_name(node: &Value) -> Option<&str> {
    node.get("$ref")?.as_str()?.strip_prefix("#/$defs/")
}

fn collect_refs(node: &Value, out: &mut BTreeSet<String>) {
    match node {
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => {
                        if let Some(n) = r.strip_prefix("#/$defs/") {
                            out.insert(n.to_string());
                        }
                    }
                    // Data, not schemas: a const or enum value that looks like a $ref is not one.
                    ("const" | "enum" | "examples", _) => {}
                    _ => collect_refs(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

fn reachable(schema: &Value, roots: &[String]) -> BTreeSet<String> {
    let Some(defs) = defs(schema) else {
        return BTreeSet::new();
    };
    let mut seen = BTreeSet::new();
    let mut stack: Vec<String> = roots.to_vec();
    while let Some(name) = stack.pop() {
        let Some(def) = defs.get(&name) else { continue };
        if !seen.insert(name) {
            continue;
        }
        let mut refs = BTreeSet::new();
        collect_refs(def, &mut refs);
        stack.extend(refs.into_iter().filter(|r| !seen.contains(r)));
    }
    seen
}

/// The result definitions of the requests in union `union`: the one a request names in `x-result`;
/// else request `X` with params `XParams` has result `XResult`; failing that, method
/// `thread/start` has `ThreadStartResult`.
fn result_defs(schema: &Value, union: &str) -> Vec<String> {
    let Some(defs) = defs(schema) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let branches = defs
        .get(union)
        .and_then(|u| u.get("oneOf"))
        .and_then(Value::as_array);
    for branch in branches.into_iter().flatten() {
        let Some(req) = ref_name(branch).and_then(|n| defs.get(n)) else {
            continue;
        };
        let props = req.get("properties");
        // A request whose result is not named after it says so (`x-result`).
        let by_annotation = req
            .get("x-result")
            .and_then(Value::as_str)
            .map(str::to_string);
        let by_params = props
            .and_then(|p| p.get("params"))
            .and_then(ref_name)
            .and_then(|p| p.strip_suffix("Params"))
            .map(|stem| format!("{stem}Result"));
        let by_method = props
            .and_then(|p| p.get("method"))
            .and_then(|m| m.get("const"))
            .and_then(Value::as_str)
            .map(|m| {
                let mut stem: String = m
                    .split(['/', '_', '-', '.'])
                    .map(|part| {
                        let mut c = part.chars();
                        c.next()
                            .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                            .unwrap_or_default()
                    })
                    .collect();
                stem.push_str("Result");
                stem
            });
        for name in [by_annotation, by_params, by_method].into_iter().flatten() {
            if defs.contains_key(&name) && !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

/// Who sends each definition of `schema`. `ClientResponse` carries answers both ways, so it and
/// what it reaches are sent both ways; a definition reachable from nowhere counts as both.
pub fn directions(schema: &Value) -> BTreeMap<String, Direction> {
    let mut client_roots = vec!["ClientRequest".to_string(), "ClientResponse".to_string()];
    client_roots.extend(result_defs(schema, "ServerRequest"));
    let mut server_roots = vec![
        "ServerNotification".to_string(),
        "ServerRequest".to_string(),
        "ClientResponse".to_string(),
    ];
    server_roots.extend(result_defs(schema, "ClientRequest"));
    let client = reachable(schema, &client_roots);
    let server = reachable(schema, &server_roots);
    defs(schema)
        .map(|d| {
            d.keys()
                .map(|name| {
                    let dir = Direction {
                        client_sent: client.contains(name),
                        server_sent: server.contains(name),
                    };
                    let dir = if dir == Direction::default() {
                        Direction::BOTH
                    } else {
                        dir
                    };
                    (name.clone(), dir)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Escapes one JSON pointer segment (RFC 6901).
fn esc(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// `node` without annotations, for "is this the same schema" questions.
fn strip_annotations(node: &Value) -> Value {
    match node {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !ANNOTATIONS.contains(&k.as_str()))
                .map(|(k, v)| {
                    let v = match k.as_str() {
                        "const" | "enum" => v.clone(),
                        "properties" | "$defs" => Value::Object(
                            v.as_object()
                                .map(|p| {
                                    p.iter()
                                        .map(|(n, s)| (n.clone(), strip_annotations(s)))
                                        .collect()
                                })
                                .unwrap_or_default(),
                        ),
                        _ => strip_annotations(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_annotations).collect()),
        other => other.clone(),
    }
}

/// `X` when `node` is the profile's nullable form `oneOf: [X, {"type": "null"}]` (either order).
fn nullable_inner(node: &Map<String, Value>) -> Option<(usize, &Value)> {
    if node.contains_key("x-tag") {
        return None;
    }
    let branches = node.get("oneOf")?.as_array()?;
    if branches.len() != 2 {
        return None;
    }
    let is_null = |v: &Value| strip_annotations(v) == serde_json::json!({"type": "null"});
    match (is_null(&branches[0]), is_null(&branches[1])) {
        (false, true) => Some((0, &branches[0])),
        (true, false) => Some((1, &branches[1])),
        _ => None,
    }
}

fn type_set(node: &Map<String, Value>) -> BTreeSet<String> {
    match node.get("type") {
        Some(Value::String(s)) => [s.clone()].into(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect(),
        _ => BTreeSet::new(),
    }
}

fn string_set(v: Option<&Value>) -> BTreeSet<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Where a node sits: which definition, who sends it, and whether it is lifecycle-bearing.
#[derive(Clone)]
struct Site {
    dir: Direction,
    lifecycle: bool,
    def: String,
}

struct Comparer<'a> {
    old: &'a Value,
    new: &'a Value,
    findings: Vec<Finding>,
}

fn rule(id: &str) -> &'static Rule {
    RULES
        .iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("compat rule {id} is not in RULES"))
}

impl Comparer<'_> {
    /// Records a finding; its verdict comes from the rule and the direction of the site.
    fn emit(&mut self, site: Option<&Site>, pointer: &str, id: &str, detail: String) {
        let r = rule(id);
        let dir = site.map_or(Direction::BOTH, |s| s.dir);
        let mut breaking = match r.verdict {
            Verdict::Allowed => false,
            Verdict::Breaking => true,
            Verdict::IfClientSent => dir.client_sent,
            Verdict::IfServerSent => dir.server_sent,
        };
        let erratum = ERRATA
            .iter()
            .find(|(p, rule, _)| *p == pointer && *rule == id)
            .map(|(_, _, why)| *why);
        let detail = match (r.verdict, site) {
            (Verdict::IfClientSent | Verdict::IfServerSent, Some(s)) => {
                format!("{detail} ({} is {})", s.def, dir.describe())
            }
            _ => detail,
        };
        let detail = match erratum {
            Some(why) if breaking => {
                breaking = false;
                format!("{detail}; accepted v1 erratum: {why}")
            }
            _ => detail,
        };
        self.findings.push(Finding {
            pointer: pointer.to_string(),
            rule: id.to_string(),
            breaking,
            detail,
        });
        if let Some(s) = site {
            if s.lifecycle && !matches!(id, "description-changed" | "order-changed" | "ref-inlined")
            {
                self.findings.push(Finding {
                    pointer: pointer.to_string(),
                    rule: "lifecycle-changed".to_string(),
                    breaking: true,
                    detail: format!(
                        "{} carries lifecycle semantics; any change to its values or variants is breaking ({id})",
                        s.def
                    ),
                });
            }
        }
    }

    fn compare_root(&mut self) {
        let (old, new) = (self.old, self.new);
        let empty = Map::new();
        let om = old.as_object().unwrap_or(&empty);
        let nm = new.as_object().unwrap_or(&empty);
        for key in union_keys(om, nm) {
            let (o, n) = (om.get(&key), nm.get(&key));
            if o == n {
                continue;
            }
            let ptr = format!("/{}", esc(&key));
            match key.as_str() {
                "$defs" => {}
                "$id" | "$schema" | "x-wire-version" => self.emit(
                    None,
                    &ptr,
                    "schema-identity-changed",
                    format!("{key}: {} -> {}", show(o), show(n)),
                ),
                "oneOf" => self.compare_envelope(o, n),
                k if ANNOTATIONS.contains(&k) => {
                    self.emit(None, &ptr, "description-changed", format!("{key} changed"))
                }
                _ => self.emit(
                    None,
                    &ptr,
                    "keyword-changed",
                    format!("{key}: {} -> {}", show(o), show(n)),
                ),
            }
        }
        self.compare_defs();
    }

    fn compare_envelope(&mut self, old: Option<&Value>, new: Option<&Value>) {
        let list = |v: Option<&Value>| -> Vec<String> {
            v.and_then(Value::as_array)
                .map(|a| a.iter().map(|b| b.to_string()).collect())
                .unwrap_or_default()
        };
        let (o, n) = (list(old), list(new));
        for (i, b) in o.iter().enumerate() {
            if !n.contains(b) {
                self.emit(
                    None,
                    &format!("/oneOf/{i}"),
                    "envelope-changed",
                    format!("envelope member {b} removed"),
                );
            }
        }
        for (i, b) in n.iter().enumerate() {
            if !o.contains(b) {
                self.emit(
                    None,
                    &format!("/oneOf/{i}"),
                    "envelope-changed",
                    format!("envelope member {b} added: JSON-RPC peers tell messages apart by members, an old peer cannot"),
                );
            }
        }
        let common_o: Vec<_> = o.iter().filter(|b| n.contains(b)).collect();
        let common_n: Vec<_> = n.iter().filter(|b| o.contains(b)).collect();
        if common_o != common_n {
            self.emit(
                None,
                "/oneOf",
                "order-changed",
                "envelope members reordered".into(),
            );
        }
    }

    fn compare_defs(&mut self) {
        let empty = Map::new();
        let od = defs(self.old).unwrap_or(&empty);
        let nd = defs(self.new).unwrap_or(&empty);
        let (old_dirs, new_dirs) = (directions(self.old), directions(self.new));
        let lifecycle = lifecycle_set(self.old)
            .union(&lifecycle_set(self.new))
            .cloned()
            .collect::<BTreeSet<_>>();
        for name in union_keys(od, nd) {
            let ptr = format!("/$defs/{}", esc(&name));
            let dir = old_dirs
                .get(&name)
                .copied()
                .unwrap_or_default()
                .union(new_dirs.get(&name).copied().unwrap_or_default());
            let site = Site {
                dir,
                lifecycle: lifecycle.contains(&name),
                def: name.clone(),
            };
            match (od.get(&name), nd.get(&name)) {
                (Some(o), Some(n)) => self.compare_node(o, n, &ptr, &site, 0),
                (Some(_), None) => self.emit(
                    Some(&site),
                    &ptr,
                    "def-removed",
                    format!("definition {name} deleted"),
                ),
                (None, Some(_)) => {
                    self.emit(None, &ptr, "def-added", format!("new definition {name}"))
                }
                (None, None) => {}
            }
        }
    }

    fn resolve<'v>(schema: &'v Value, node: &Value) -> Option<&'v Value> {
        defs(schema)?.get(ref_name(node)?)
    }

    fn compare_node(&mut self, old: &Value, new: &Value, ptr: &str, site: &Site, depth: u32) {
        // A tagged union can change without its own text changing: a branch's tag value lives in
        // the branch's definition.
        if let (Some(om), Some(nm)) = (old.as_object(), new.as_object()) {
            if om.get("x-tag").is_some() && om.get("x-tag") == nm.get("x-tag") {
                let (o, n) = (Self::variants(self.old, om), Self::variants(self.new, nm));
                if o != n {
                    self.compare_tagged_union(&o, &n, om, nm, ptr, site);
                }
            }
        }
        if old == new {
            return;
        }
        let as_map = |v: &Value| -> Option<Map<String, Value>> {
            match v {
                Value::Object(m) => Some(m.clone()),
                Value::Bool(true) => Some(Map::new()),
                _ => None,
            }
        };
        let (Some(om), Some(nm)) = (as_map(old), as_map(new)) else {
            self.emit(
                Some(site),
                ptr,
                "keyword-changed",
                format!("schema {} -> {}", show(Some(old)), show(Some(new))),
            );
            return;
        };
        for key in ANNOTATIONS {
            if om.get(*key) != nm.get(*key) {
                self.emit(
                    Some(site),
                    &format!("{ptr}/{key}"),
                    "description-changed",
                    format!("{key} changed"),
                );
            }
        }
        // Nullable wrapping is its own change; what is wrapped is compared as usual.
        match (nullable_inner(&om), nullable_inner(&nm)) {
            (Some((_, a)), Some((i, b))) => {
                return self.compare_node(a, b, &format!("{ptr}/oneOf/{i}"), site, depth + 1);
            }
            (Some((_, a)), None) => {
                self.emit(
                    Some(site),
                    ptr,
                    "nullable-removed",
                    "null is no longer accepted".into(),
                );
                return self.compare_node(a, new, ptr, site, depth + 1);
            }
            (None, Some((i, b))) => {
                self.emit(
                    Some(site),
                    ptr,
                    "nullable-added",
                    "null is now accepted".into(),
                );
                return self.compare_node(old, b, &format!("{ptr}/oneOf/{i}"), site, depth + 1);
            }
            (None, None) => {}
        }

        // References.
        match (ref_name(old), ref_name(new)) {
            (Some(a), Some(b)) if a != b => {
                self.emit(
                    Some(site),
                    &format!("{ptr}/$ref"),
                    "ref-changed",
                    format!("{a} -> {b}"),
                );
                return;
            }
            (Some(_), Some(_)) => {} // same target; siblings are compared below
            (Some(a), None) | (None, Some(a)) if depth < 32 => {
                let (o, n) = if om.contains_key("$ref") {
                    (Self::resolve(self.old, old), Some(new))
                } else {
                    (Some(old), Self::resolve(self.new, new))
                };
                if let (Some(o), Some(n)) = (o, n) {
                    self.emit(
                        Some(site),
                        ptr,
                        "ref-inlined",
                        format!("{a} inlined or extracted; its contents are compared"),
                    );
                    let (o, n) = (strip_annotations(o), strip_annotations(n));
                    return self.compare_node(&o, &n, ptr, site, depth + 1);
                }
                self.emit(
                    Some(site),
                    ptr,
                    "ref-changed",
                    format!("unresolvable $ref {a}"),
                );
                return;
            }
            _ => {}
        }

        let (ot, nt) = (type_set(&om), type_set(&nm));
        if ot != nt {
            // An absent `type` admits everything.
            let id = if !ot.is_empty() && (nt.is_empty() || nt.is_superset(&ot)) {
                "type-widened"
            } else if !nt.is_empty() && (ot.is_empty() || ot.is_superset(&nt)) {
                "type-narrowed"
            } else {
                "type-changed"
            };
            self.emit(
                Some(site),
                &format!("{ptr}/type"),
                id,
                format!("{} -> {}", show(om.get("type")), show(nm.get("type"))),
            );
        }
        if om.get("const") != nm.get("const") {
            self.emit(
                Some(site),
                &format!("{ptr}/const"),
                "const-changed",
                format!("{} -> {}", show(om.get("const")), show(nm.get("const"))),
            );
        }
        if om.get("pattern") != nm.get("pattern") {
            self.emit(
                Some(site),
                &format!("{ptr}/pattern"),
                "pattern-changed",
                format!("{} -> {}", show(om.get("pattern")), show(nm.get("pattern"))),
            );
        }
        self.compare_bounds(&om, &nm, ptr, site);
        if om.get("enum").is_some() || nm.get("enum").is_some() {
            self.compare_enum(&om, &nm, ptr, site);
        }
        if om.get("x-tag") != nm.get("x-tag") {
            self.emit(
                Some(site),
                &format!("{ptr}/x-tag"),
                "tag-changed",
                format!("{} -> {}", show(om.get("x-tag")), show(nm.get("x-tag"))),
            );
        }
        if om.get("x-unknown") != nm.get("x-unknown") {
            self.emit(
                Some(site),
                &format!("{ptr}/x-unknown"),
                "unknown-policy-changed",
                format!(
                    "{} -> {}",
                    show(om.get("x-unknown")),
                    show(nm.get("x-unknown"))
                ),
            );
        }
        // Tagged unions were compared above; a changed x-tag is reported on its own.
        if om.get("x-tag").is_none() && nm.get("x-tag").is_none() {
            self.compare_opaque(&om, &nm, "oneOf", ptr, site, "union-changed");
        }
        self.compare_object(&om, &nm, ptr, site, depth);
        for key in ["items", "propertyNames"] {
            match (om.get(key), nm.get(key)) {
                (Some(o), Some(n)) => {
                    self.compare_node(o, n, &format!("{ptr}/{key}"), site, depth + 1)
                }
                (None, None) => {}
                (o, n) => self.emit(
                    Some(site),
                    &format!("{ptr}/{key}"),
                    "keyword-changed",
                    format!("{key}: {} -> {}", show(o), show(n)),
                ),
            }
        }
        for key in union_keys(&om, &nm) {
            let k = key.as_str();
            if HANDLED.contains(&k)
                || ANNOTATIONS.contains(&k)
                || BOUNDS.iter().any(|(b, _, _)| *b == k)
            {
                continue;
            }
            self.compare_opaque(&om, &nm, k, ptr, site, "keyword-changed");
        }
    }

    /// A keyword compared as a whole: an annotation-only difference is allowed, anything else is
    /// reported under `id`.
    fn compare_opaque(
        &mut self,
        om: &Map<String, Value>,
        nm: &Map<String, Value>,
        key: &str,
        ptr: &str,
        site: &Site,
        id: &str,
    ) {
        let (o, n) = (om.get(key), nm.get(key));
        if o == n {
            return;
        }
        let kp = format!("{ptr}/{}", esc(key));
        if o.map(strip_annotations) == n.map(strip_annotations) {
            self.emit(
                Some(site),
                &kp,
                "description-changed",
                format!("annotations inside {key} changed"),
            );
        } else {
            self.emit(
                Some(site),
                &kp,
                id,
                format!("{key}: {} -> {}", show(o), show(n)),
            );
        }
    }

    fn compare_bounds(
        &mut self,
        om: &Map<String, Value>,
        nm: &Map<String, Value>,
        ptr: &str,
        site: &Site,
    ) {
        let old_types = type_set(om);
        for (key, larger_is_tighter, absent) in BOUNDS {
            let (o, n) = (om.get(*key), nm.get(*key));
            if o == n {
                continue;
            }
            let applies = bound_applies_to(key);
            let newly_admitted = !old_types.is_empty()
                && !applies.is_empty()
                && !applies.iter().any(|t| old_types.contains(*t))
                && o.is_none();
            if newly_admitted {
                continue; // bounds only values of a type the old schema refused outright
            }
            let num = |v: Option<&Value>| v.and_then(Value::as_f64).unwrap_or(*absent);
            let (a, b) = (num(o), num(n));
            if a == b {
                continue; // e.g. an explicit minLength: 0 added
            }
            let tightened = (b > a) == *larger_is_tighter;
            let id = if tightened {
                "bound-tightened"
            } else {
                "bound-loosened"
            };
            self.emit(
                Some(site),
                &format!("{ptr}/{key}"),
                id,
                format!("{key}: {} -> {}", show(o), show(n)),
            );
        }
    }

    fn compare_enum(
        &mut self,
        om: &Map<String, Value>,
        nm: &Map<String, Value>,
        ptr: &str,
        site: &Site,
    ) {
        let empty = Vec::new();
        let o = om.get("enum").and_then(Value::as_array).unwrap_or(&empty);
        let n = nm.get("enum").and_then(Value::as_array).unwrap_or(&empty);
        if om.get("enum").is_none() || nm.get("enum").is_none() {
            let id = if om.get("enum").is_none() {
                "bound-tightened"
            } else {
                "bound-loosened"
            };
            self.emit(
                Some(site),
                &format!("{ptr}/enum"),
                id,
                format!(
                    "enum {}",
                    if om.get("enum").is_none() {
                        "added"
                    } else {
                        "removed"
                    }
                ),
            );
            return;
        }
        let keep = om.get("x-unknown").and_then(Value::as_str) == Some("keep")
            && nm.get("x-unknown").and_then(Value::as_str) == Some("keep");
        let removed: Vec<usize> = (0..o.len()).filter(|i| !n.contains(&o[*i])).collect();
        let added: Vec<usize> = (0..n.len()).filter(|i| !o.contains(&n[*i])).collect();
        for &i in &removed {
            if added.contains(&i) {
                self.emit(
                    Some(site),
                    &format!("{ptr}/enum/{i}"),
                    "enum-value-reused",
                    format!(
                        "{} deleted and {} put in its place: a peer reading by position or by meaning gets the wrong value",
                        o[i], n[i]
                    ),
                );
            } else {
                self.emit(
                    Some(site),
                    &format!("{ptr}/enum/{i}"),
                    "enum-value-removed",
                    format!("value {} deleted", o[i]),
                );
            }
        }
        for &i in &added {
            if removed.contains(&i) {
                continue;
            }
            let id = if site.def == "Feature" && ptr == "/$defs/Feature" {
                "feature-added"
            } else if keep {
                "enum-value-added"
            } else {
                "strict-enum-value-added"
            };
            self.emit(
                Some(site),
                &format!("{ptr}/enum/{i}"),
                id,
                format!("value {} added", n[i]),
            );
        }
        let common_o: Vec<_> = o.iter().filter(|v| n.contains(v)).collect();
        let common_n: Vec<_> = n.iter().filter(|v| o.contains(v)).collect();
        if common_o != common_n {
            self.emit(
                Some(site),
                &format!("{ptr}/enum"),
                "order-changed",
                "values reordered".into(),
            );
        }
    }

    /// Branch key -> (index, target definition): the branch's tag value, resolved through its $ref.
    fn variants(schema: &Value, node: &Map<String, Value>) -> Vec<(String, usize, String)> {
        let tag = node
            .get("x-tag")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let mut out = Vec::new();
        for (i, b) in node
            .get("oneOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let target = ref_name(b).unwrap_or_default().to_string();
            let value = Self::resolve(schema, b)
                .unwrap_or(b)
                .get("properties")
                .and_then(|p| p.get(tag))
                .and_then(|t| t.get("const"))
                .map(|c| c.to_string())
                .unwrap_or_else(|| format!("(branch {})", strip_annotations(b)));
            out.push((value, i, target));
        }
        out
    }

    fn compare_tagged_union(
        &mut self,
        o: &[(String, usize, String)],
        n: &[(String, usize, String)],
        om: &Map<String, Value>,
        nm: &Map<String, Value>,
        ptr: &str,
        site: &Site,
    ) {
        let keep = om.get("x-unknown").and_then(Value::as_str) == Some("keep")
            && nm.get("x-unknown").and_then(Value::as_str) == Some("keep");
        for (value, i, target) in o {
            match n.iter().find(|(v, _, _)| v == value) {
                None => self.emit(
                    Some(site),
                    &format!("{ptr}/oneOf/{i}"),
                    "variant-removed",
                    format!("branch {value} ({target}) deleted"),
                ),
                Some((_, j, t)) if t != target => self.emit(
                    Some(site),
                    &format!("{ptr}/oneOf/{j}"),
                    "tag-value-moved",
                    format!("tag {value} now selects {t}, was {target}"),
                ),
                Some(_) => {}
            }
        }
        for (value, j, target) in n {
            if !o.iter().any(|(v, _, _)| v == value) {
                let id = if keep {
                    "variant-added"
                } else {
                    "strict-variant-added"
                };
                self.emit(
                    Some(site),
                    &format!("{ptr}/oneOf/{j}"),
                    id,
                    format!("branch {value} ({target}) added"),
                );
            }
        }
        let common_o: Vec<_> = o
            .iter()
            .filter(|(v, _, _)| n.iter().any(|(w, _, _)| w == v))
            .map(|(v, _, _)| v)
            .collect();
        let common_n: Vec<_> = n
            .iter()
            .filter(|(v, _, _)| o.iter().any(|(w, _, _)| w == v))
            .map(|(v, _, _)| v)
            .collect();
        if common_o != common_n {
            self.emit(
                Some(site),
                &format!("{ptr}/oneOf"),
                "order-changed",
                "branches reordered".into(),
            );
        }
    }

    fn compare_object(
        &mut self,
        om: &Map<String, Value>,
        nm: &Map<String, Value>,
        ptr: &str,
        site: &Site,
        depth: u32,
    ) {
        let empty = Map::new();
        let op = om
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let np = nm
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let oreq = string_set(om.get("required"));
        let nreq = string_set(nm.get("required"));
        let old_strict = om.get("additionalProperties") == Some(&Value::Bool(false));
        let any = Value::Bool(true);

        let mut names: Vec<String> = union_keys(op, np);
        for r in oreq.iter().chain(nreq.iter()) {
            if !names.contains(r) {
                names.push(r.clone());
            }
        }
        let in_old = |n: &str| op.contains_key(n) || oreq.contains(n);
        let in_new = |n: &str| np.contains_key(n) || nreq.contains(n);
        let removed: Vec<&String> = names.iter().filter(|n| in_old(n) && !in_new(n)).collect();
        let added: Vec<&String> = names.iter().filter(|n| !in_old(n) && in_new(n)).collect();

        // A removed property whose exact schema reappears under a new name is a rename.
        let mut renamed: BTreeMap<&String, &String> = BTreeMap::new();
        for r in &removed {
            let shape = strip_annotations(op.get(*r).unwrap_or(&any));
            if let Some(a) = added.iter().find(|a| {
                !renamed.values().any(|x| x == *a)
                    && strip_annotations(np.get(**a).unwrap_or(&any)) == shape
                    && oreq.contains(*r) == nreq.contains(**a)
            }) {
                renamed.insert(r, a);
            }
        }

        for name in &names {
            let pp = format!("{ptr}/properties/{}", esc(name));
            match (in_old(name), in_new(name)) {
                (true, false) => {
                    if let Some(to) = renamed.get(name) {
                        self.emit(
                            Some(site),
                            &format!("{ptr}/properties/{}", esc(to)),
                            "wire-name-changed",
                            format!("property {name} renamed to {to}"),
                        );
                    } else {
                        self.emit(
                            Some(site),
                            &pp,
                            "property-removed",
                            format!("property {name} deleted"),
                        );
                    }
                }
                (false, true) => {
                    if renamed.values().any(|to| to == &name) {
                        continue;
                    }
                    if nreq.contains(name) {
                        self.emit(
                            Some(site),
                            &pp,
                            "required-added",
                            format!("new required property {name}: an old sender omits it"),
                        );
                    } else if !old_strict {
                        self.emit(
                            Some(site),
                            &pp,
                            "property-added",
                            format!("new optional property {name}"),
                        );
                    }
                    if old_strict {
                        self.emit(
                            Some(site),
                            &pp,
                            "property-added-to-strict",
                            format!(
                                "new property {name} on a strict object: an old receiver refuses it"
                            ),
                        );
                    }
                }
                (true, true) => {
                    let (o, n) = (op.get(name).unwrap_or(&any), np.get(name).unwrap_or(&any));
                    self.compare_node(o, n, &pp, site, depth + 1);
                    match (oreq.contains(name), nreq.contains(name)) {
                        (false, true) => self.emit(
                            Some(site),
                            &pp,
                            "required-added",
                            format!("optional property {name} made required"),
                        ),
                        (true, false) => self.emit(
                            Some(site),
                            &pp,
                            "required-removed",
                            format!("required property {name} made optional"),
                        ),
                        _ => {}
                    }
                }
                (false, false) => {}
            }
        }

        // additionalProperties: absent means true.
        let t = Value::Bool(true);
        let oa = om.get("additionalProperties").unwrap_or(&t);
        let na = nm.get("additionalProperties").unwrap_or(&t);
        let ap = format!("{ptr}/additionalProperties");
        match (oa, na) {
            (a, b) if a == b => {}
            (Value::Object(_), Value::Object(_)) => self.compare_node(oa, na, &ap, site, depth + 1),
            (Value::Bool(false), _) => {
                let mut s = site.clone();
                s.dir = Direction::BOTH; // opening a strict object is a security change either way
                self.emit(
                    Some(&s),
                    &ap,
                    "additional-properties-loosened",
                    "a strict object now accepts unknown properties: it no longer fails closed"
                        .into(),
                );
            }
            (_, Value::Bool(false)) | (Value::Bool(true), Value::Object(_)) => self.emit(
                Some(site),
                &ap,
                "additional-properties-tightened",
                format!("additionalProperties {oa} -> {na}"),
            ),
            _ => self.emit(
                Some(site),
                &ap,
                "additional-properties-loosened",
                format!("additionalProperties {oa} -> {na}"),
            ),
        }
    }
}

fn lifecycle_set(schema: &Value) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = LIFECYCLE_DEFS.iter().map(|s| s.to_string()).collect();
    if let Some(d) = defs(schema) {
        for name in LIFECYCLE_DEFS {
            let branches = d
                .get(*name)
                .and_then(|u| u.get("oneOf"))
                .and_then(Value::as_array);
            for b in branches.into_iter().flatten() {
                if let Some(r) = ref_name(b) {
                    out.insert(r.to_string());
                }
            }
        }
    }
    out
}

fn union_keys(a: &Map<String, Value>, b: &Map<String, Value>) -> Vec<String> {
    let mut keys: Vec<String> = a.keys().cloned().collect();
    keys.extend(b.keys().filter(|k| !a.contains_key(*k)).cloned());
    keys
}

fn show(v: Option<&Value>) -> String {
    match v {
        None => "(absent)".into(),
        Some(v) => {
            let s = v.to_string();
            if s.len() > 80 {
                format!("{}…", &s[..s.floor_char_boundary_compat(77)])
            } else {
                s
            }
        }
    }
}

trait FloorCharBoundary {
    fn floor_char_boundary_compat(&self, i: usize) -> usize;
}

impl FloorCharBoundary for str {
    fn floor_char_boundary_compat(&self, mut i: usize) -> usize {
        while i > 0 && !self.is_char_boundary(i) {
            i -= 1;
        }
        i
    }
}

/// Classifies every difference between `baseline` and `current`.
pub fn compare(baseline: &Value, current: &Value) -> Vec<Finding> {
    let mut c = Comparer {
        old: baseline,
        new: current,
        findings: Vec::new(),
    };
    c.compare_root();
    c.findings
}

/// True when any finding breaks wire v1.
pub fn is_breaking(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.breaking)
}
