//! The schema profile's interpreter: the canonical schema compiled once into a table of nodes and
//! checked against instances without a general JSON Schema engine (and without its regex, URL,
//! IDNA and big-number dependencies, which were most of the mobile library's bytes).
//!
//! Only the keywords of the profile (docs/schema.md) are understood; compiling refuses any other
//! keyword, a `$ref` outside `#/$defs/`, or a pattern outside the supported subset, so the schema
//! cannot grow a keyword this engine would silently skip. Annotations (`description`, `title`,
//! `x-…`) are ignored here; `x-max-depth` is applied by the caller.
//!
//! Semantics are JSON Schema 2020-12's for these keywords, and a differential test
//! (`schema/tests/oracle.rs`) holds them equal to the `jsonschema` crate over every fixture and
//! thousands of mutants. Reporting goes further than a generic engine: a failed tagged union is
//! reported inside the branch its tag selected, a nullable inside its inner schema.

use crate::pattern::Pattern;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// Index of a node in [`Compiled::nodes`].
pub(crate) type NodeId = usize;

/// The JSON types, as a bit set.
const NULL: u8 = 1;
const BOOLEAN: u8 = 2;
const INTEGER: u8 = 4;
const NUMBER: u8 = 8;
const STRING: u8 = 16;
const ARRAY: u8 = 32;
const OBJECT: u8 = 64;

const TYPE_NAMES: [(u8, &str); 7] = [
    (NULL, "null"),
    (BOOLEAN, "boolean"),
    (INTEGER, "integer"),
    (NUMBER, "number"),
    (STRING, "string"),
    (ARRAY, "array"),
    (OBJECT, "object"),
];

/// How a `oneOf` is read, for checking and for reporting.
pub(crate) enum OneOf {
    /// Branches are `$ref`s to objects with a distinct required `const` tag: the tag selects one.
    Tagged {
        tag: String,
        /// (tag value, definition name, node), in schema order.
        branches: Vec<(Value, String, NodeId)>,
    },
    /// `[X, {"type": "null"}]`.
    Nullable {
        inner: NodeId,
        inner_ref: Option<String>,
        inner_text: String,
    },
    /// Branches told apart by their `required` members (the response envelope).
    Members(Vec<NodeId>),
    /// Anything else: exactly one branch must hold.
    Plain(Vec<NodeId>),
}

#[derive(Default)]
pub(crate) struct Node {
    /// `false` schema (`additionalProperties: false` compiles to one).
    never: bool,
    types: Option<u8>,
    reference: Option<NodeId>,
    constant: Option<Value>,
    choices: Option<Vec<Value>>,
    min_length: Option<u64>,
    max_length: Option<u64>,
    /// Shared by every node with the same pattern text (compiled once).
    pattern: Option<Arc<Pattern>>,
    minimum: Option<f64>,
    maximum: Option<f64>,
    properties: Vec<(String, NodeId)>,
    required: Vec<String>,
    /// For each `required` name, its index in `properties` (below 128) when it has one: a
    /// present member is then known from the walk over the members, with no hash lookup.
    required_index: Vec<Option<usize>>,
    additional: Option<NodeId>,
    max_properties: Option<u64>,
    property_names: Option<NodeId>,
    items: Option<NodeId>,
    min_items: Option<u64>,
    max_items: Option<u64>,
    unique_items: bool,
    one_of: Option<OneOf>,
}

/// One segment of the path to the instance being checked (rendered only for a refusal).
#[derive(Clone, Copy)]
pub(crate) enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

/// A refusal found by [`Compiled::check`]: where, in which tagged branch, and why.
pub(crate) struct Found {
    pub pointer: String,
    pub branch: Option<String>,
    pub message: String,
}

/// The canonical schema, compiled.
pub(crate) struct Compiled {
    nodes: Vec<Node>,
    defs: HashMap<String, NodeId>,
    root: NodeId,
    /// Each distinct pattern text, compiled once (emptied when compiling is done).
    patterns: HashMap<String, Arc<Pattern>>,
    /// Every definition name, in schema order.
    names: Vec<String>,
    /// Each definition's `x-max-depth`, where it has one.
    max_depths: HashMap<String, usize>,
}

/// For each definition, its required properties that carry a `const` (name, value): all a
/// tagged union needs to know of its branches, gathered before any definition is compiled.
type TagConsts = HashMap<String, Vec<(String, Value)>>;

/// The members of a JSON object as unparsed text, in document order (duplicates kept, so they
/// can be refused).
struct RawMembers(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for RawMembers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = RawMembers;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawMembers, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, Box<RawValue>>()? {
                    members.push(member);
                }
                Ok(RawMembers(members))
            }
        }
        d.deserialize_map(Members)
    }
}

/// Why a schema is outside the profile.
#[derive(Debug)]
pub struct ProfileError(pub String);

impl std::fmt::Display for ProfileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProfileError {}

const ANNOTATIONS: [&str; 5] = ["$schema", "$id", "title", "description", "$defs"];

impl Compiled {
    /// Compiles `root` (a schema with `$defs`), refusing anything outside the profile.
    #[cfg(test)]
    pub(crate) fn new(root: &Value) -> Result<Compiled, ProfileError> {
        Compiled::from_text(&root.to_string())
    }

    /// Compiles the schema `text`, refusing anything outside the profile. One definition is
    /// parsed at a time and dropped once compiled, so the schema's whole tree of `Value`s (about
    /// twelve times its text) never exists: what a process keeps, and the peak it touches, is
    /// the node table.
    pub(crate) fn from_text(text: &str) -> Result<Compiled, ProfileError> {
        let bad = |e: serde_json::Error| ProfileError(format!("the schema is not JSON: {e}"));
        let root: Value = match serde_json::from_str::<RawMembers>(text) {
            Ok(members) => {
                let mut rest = Map::new();
                let mut defs = Vec::new();
                for (key, raw) in members.0 {
                    if key == "$defs" {
                        defs = serde_json::from_str::<RawMembers>(raw.get())
                            .map_err(|_| ProfileError("$defs is not an object".into()))?
                            .0;
                    } else {
                        rest.insert(key, serde_json::from_str(raw.get()).map_err(bad)?);
                    }
                }
                return Compiled::build(&Value::Object(rest), &defs);
            }
            Err(_) => serde_json::from_str(text).map_err(bad)?,
        };
        // Not an object (`true`, `false`): a schema without definitions.
        Compiled::build(&root, &[])
    }

    fn build(root: &Value, defs: &[(String, Box<RawValue>)]) -> Result<Compiled, ProfileError> {
        let mut c = Compiled {
            nodes: Vec::new(),
            defs: HashMap::new(),
            root: 0,
            patterns: HashMap::new(),
            names: Vec::with_capacity(defs.len()),
            max_depths: HashMap::new(),
        };
        let parse = |name: &str, raw: &RawValue| -> Result<Value, ProfileError> {
            serde_json::from_str(raw.get())
                .map_err(|e| ProfileError(format!("#/$defs/{name} is not JSON: {e}")))
        };
        // Every definition gets its node first, so `$ref`s (also recursive ones) resolve; and
        // its tag constants and depth bound are read, so no definition is needed again.
        let mut consts = TagConsts::new();
        for (name, raw) in defs {
            if c.defs.contains_key(name) {
                return Err(ProfileError(format!("#/$defs/{name} is defined twice")));
            }
            let id = c.alloc();
            c.defs.insert(name.clone(), id);
            c.names.push(name.clone());
            let body = parse(name, raw)?;
            if let Some(depth) = body.get("x-max-depth").and_then(Value::as_u64) {
                if let Ok(depth) = usize::try_from(depth) {
                    c.max_depths.insert(name.clone(), depth);
                }
            }
            consts.insert(name.clone(), required_consts(&body));
        }
        for (name, raw) in defs {
            let id = c.defs[name];
            let body = parse(name, raw)?;
            c.fill(id, &body, &consts, &format!("#/$defs/{name}"))?;
        }
        let root_id = c.alloc();
        c.fill(root_id, root, &consts, "#")?;
        c.root = root_id;
        // Held for the life of the process: no slack, no compile-time tables.
        c.nodes.shrink_to_fit();
        c.patterns = HashMap::new();
        Ok(c)
    }

    /// Every definition name, in schema order.
    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }

    /// A definition's `x-max-depth`, if it has one.
    pub(crate) fn max_depth(&self, name: &str) -> Option<usize> {
        self.max_depths.get(name).copied()
    }

    /// A definition that is a tagged union: its tag and (tag value, branch definition) pairs,
    /// in schema order.
    pub(crate) fn tagged_branches(&self, name: &str) -> Option<(&str, Vec<(&Value, &str)>)> {
        match &self.nodes[self.def(name)?].one_of {
            Some(OneOf::Tagged { tag, branches }) => Some((
                tag.as_str(),
                branches.iter().map(|(v, n, _)| (v, n.as_str())).collect(),
            )),
            _ => None,
        }
    }

    fn alloc(&mut self) -> NodeId {
        self.nodes.push(Node::default());
        self.nodes.len() - 1
    }

    fn compile(
        &mut self,
        schema: &Value,
        defs: &TagConsts,
        at: &str,
    ) -> Result<NodeId, ProfileError> {
        // A bare `$ref` (annotations aside) is its definition's node: checking goes straight
        // there with the same path, so a node of its own would only cost memory (a third of the
        // schema's subschemas are such references).
        if let Value::Object(o) = schema {
            let bare = o
                .keys()
                .all(|k| k == "$ref" || ANNOTATIONS.contains(&k.as_str()) || k.starts_with("x-"));
            let target = o
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix("#/$defs/"))
                .and_then(|n| self.defs.get(n).copied());
            if let (true, Some(t)) = (bare, target) {
                return Ok(t);
            }
        }
        let id = self.alloc();
        self.fill(id, schema, defs, at)?;
        Ok(id)
    }

    fn fill(
        &mut self,
        id: NodeId,
        schema: &Value,
        defs: &TagConsts,
        at: &str,
    ) -> Result<(), ProfileError> {
        let fail = |what: String| Err(ProfileError(format!("{at}: {what}")));
        let obj = match schema {
            Value::Bool(true) => return Ok(()),
            Value::Bool(false) => {
                self.nodes[id].never = true;
                return Ok(());
            }
            Value::Object(o) => o,
            _ => return fail("a schema is an object or a boolean".into()),
        };
        let mut node = Node::default();
        let count = |v: &Value, k: &str| -> Result<u64, ProfileError> {
            v.as_u64()
                .ok_or_else(|| ProfileError(format!("{at}/{k}: a non-negative integer")))
        };
        let bound = |v: &Value, k: &str| -> Result<f64, ProfileError> {
            match v.as_i64() {
                Some(n) if n.unsigned_abs() <= 1 << 53 => Ok(n as f64),
                _ => Err(ProfileError(format!(
                    "{at}/{k}: an integer bound within ±2^53"
                ))),
            }
        };
        for (k, v) in obj {
            let here = format!("{at}/{k}");
            match k.as_str() {
                "type" => {
                    let names: Vec<&Value> = match v {
                        Value::Array(a) => a.iter().collect(),
                        one => vec![one],
                    };
                    let mut set = 0;
                    for n in names {
                        let bit = TYPE_NAMES
                            .iter()
                            .find(|(_, t)| Some(*t) == n.as_str())
                            .map(|(b, _)| *b);
                        match bit {
                            Some(b) => set |= b,
                            None => return fail(format!("unknown type {n}")),
                        }
                    }
                    node.types = Some(set);
                }
                "$ref" => {
                    let target = v
                        .as_str()
                        .and_then(|r| r.strip_prefix("#/$defs/"))
                        .and_then(|n| self.defs.get(n).copied());
                    match target {
                        Some(t) => node.reference = Some(t),
                        None => return fail(format!("$ref {v} is not one of #/$defs/")),
                    }
                }
                "const" => node.constant = Some(v.clone()),
                "enum" => match v {
                    Value::Array(a) => node.choices = Some(a.clone()),
                    _ => return fail("enum is an array".into()),
                },
                "minLength" => node.min_length = Some(count(v, k)?),
                "maxLength" => node.max_length = Some(count(v, k)?),
                "pattern" => {
                    let Some(p) = v.as_str() else {
                        return fail("pattern is a string".into());
                    };
                    if let Some(known) = self.patterns.get(p) {
                        node.pattern = Some(Arc::clone(known));
                    } else {
                        match Pattern::new(p) {
                            Ok(compiled) => {
                                let compiled = Arc::new(compiled);
                                self.patterns.insert(p.to_string(), Arc::clone(&compiled));
                                node.pattern = Some(compiled);
                            }
                            Err(e) => return fail(e.to_string()),
                        }
                    }
                }
                "minimum" => node.minimum = Some(bound(v, k)?),
                "maximum" => node.maximum = Some(bound(v, k)?),
                "properties" => {
                    let Some(props) = v.as_object() else {
                        return fail("properties is an object".into());
                    };
                    for (name, sub) in props {
                        let sub = self.compile(sub, defs, &format!("{here}/{name}"))?;
                        node.properties.push((name.clone(), sub));
                    }
                }
                "required" => match v.as_array() {
                    Some(names) if names.iter().all(Value::is_string) => {
                        node.required = names
                            .iter()
                            .filter_map(|n| n.as_str().map(str::to_string))
                            .collect();
                    }
                    _ => return fail("required is an array of strings".into()),
                },
                "additionalProperties" => {
                    node.additional = Some(self.compile(v, defs, &here)?);
                }
                "maxProperties" => node.max_properties = Some(count(v, k)?),
                "propertyNames" => node.property_names = Some(self.compile(v, defs, &here)?),
                "items" => node.items = Some(self.compile(v, defs, &here)?),
                "minItems" => node.min_items = Some(count(v, k)?),
                "maxItems" => node.max_items = Some(count(v, k)?),
                "uniqueItems" => node.unique_items = v.as_bool().unwrap_or(false),
                "oneOf" => {
                    let Some(branches) = v.as_array() else {
                        return fail("oneOf is an array".into());
                    };
                    let mut ids = Vec::new();
                    for (i, b) in branches.iter().enumerate() {
                        ids.push(self.compile(b, defs, &format!("{here}/{i}"))?);
                    }
                    node.one_of = Some(read_one_of(obj, branches, ids, defs, &self.defs, at)?);
                }
                k if ANNOTATIONS.contains(&k) || k.starts_with("x-") => {}
                other => return fail(format!("keyword {other:?} is outside the schema profile")),
            }
        }
        node.required_index = node
            .required
            .iter()
            .map(|r| {
                node.properties
                    .iter()
                    .position(|(p, _)| p == r)
                    .filter(|&i| i < 128)
            })
            .collect();
        self.nodes[id] = node;
        Ok(())
    }

    /// The node of a definition, if the schema has it.
    pub(crate) fn def(&self, name: &str) -> Option<NodeId> {
        self.defs.get(name).copied()
    }

    /// The node of the whole schema (its own keywords, e.g. the root `oneOf`).
    pub(crate) fn root(&self) -> NodeId {
        self.root
    }

    /// True if `v` satisfies node `id` (no report is built).
    pub(crate) fn is_valid(&self, id: NodeId, v: &Value) -> bool {
        let mut out = Vec::new();
        self.check(id, v, &mut Vec::new(), None, &mut out, true);
        out.is_empty()
    }

    /// Checks `v` against node `id`, appending what is wrong to `out`; `path` is where `v` sits in
    /// the instance being reported, `branch` the tagged branch it is inside. With `first_only`
    /// it stops at the first refusal (a yes/no question).
    pub(crate) fn check<'v>(
        &self,
        id: NodeId,
        v: &'v Value,
        path: &mut Vec<Seg<'v>>,
        branch: Option<&str>,
        out: &mut Vec<Found>,
        first_only: bool,
    ) {
        let node = &self.nodes[id];
        let start = out.len();
        // The message is built only for a report: a yes/no check (`first_only`, every `oneOf`
        // branch tried) records the refusal and nothing else.
        let mut push = |out: &mut Vec<Found>, path: &[Seg<'_>], message: &dyn Fn() -> String| {
            out.push(if first_only {
                Found {
                    pointer: String::new(),
                    branch: None,
                    message: String::new(),
                }
            } else {
                Found {
                    pointer: render(path),
                    branch: branch.map(str::to_string),
                    message: message(),
                }
            });
        };
        macro_rules! done {
            () => {
                if first_only && out.len() > start {
                    return;
                }
            };
        }
        if node.never {
            push(out, path, &|| {
                format!("False schema does not allow {}", show(v))
            });
            return;
        }
        if let Some(r) = node.reference {
            self.check(r, v, path, branch, out, first_only);
            done!();
        }
        if let Some(types) = node.types {
            if !has_type(v, types) {
                push(out, path, &|| type_message(v, types));
                // The other keywords would only repeat the same mistake.
                return;
            }
        }
        if let Some(c) = &node.constant {
            if !json_eq(c, v) {
                push(out, path, &|| format!("{} was expected", show(c)));
                done!();
            }
        }
        if let Some(choices) = &node.choices {
            if !choices.iter().any(|c| json_eq(c, v)) {
                let list: Vec<String> = choices.iter().map(|c| c.to_string()).collect();
                push(out, path, &|| {
                    format!(
                        "{} is not one of [{}]",
                        show(v),
                        truncate(&list.join(", "), 200)
                    )
                });
                done!();
            }
        }
        match v {
            Value::String(s) => self.check_string(node, s, v, path, out, &mut push),
            Value::Number(_) => {
                let x = number(v);
                if let Some(min) = node.minimum {
                    if x < min {
                        push(out, path, &|| {
                            format!("{} is less than the minimum of {min}", show(v))
                        });
                    }
                }
                if let Some(max) = node.maximum {
                    if x > max {
                        push(out, path, &|| {
                            format!("{} is greater than the maximum of {max}", show(v))
                        });
                    }
                }
            }
            Value::Array(items) => {
                if let Some(min) = node.min_items {
                    if (items.len() as u64) < min {
                        push(out, path, &|| {
                            format!("{} has less than {min} item{}", show(v), plural(min))
                        });
                    }
                }
                if let Some(max) = node.max_items {
                    if items.len() as u64 > max {
                        push(out, path, &|| {
                            format!("{} has more than {max} item{}", show(v), plural(max))
                        });
                    }
                }
                done!();
                if node.unique_items && !unique(items) {
                    push(out, path, &|| {
                        format!("{} has non-unique elements", show(v))
                    });
                    done!();
                }
                if let Some(item) = node.items {
                    for (i, x) in items.iter().enumerate() {
                        // A yes/no check renders no pointer, so it keeps no path either.
                        if first_only {
                            self.check(item, x, path, branch, out, true);
                        } else {
                            path.push(Seg::Index(i));
                            self.check(item, x, path, branch, out, false);
                            path.pop();
                        }
                        done!();
                    }
                }
            }
            Value::Object(members) => {
                self.check_object(node, members, v, path, branch, out, first_only, &mut push);
            }
            _ => {}
        }
        done!();
        if let Some(one_of) = &node.one_of {
            self.check_one_of(one_of, v, path, branch, out, first_only, &mut push);
        }
    }

    fn check_string(
        &self,
        node: &Node,
        s: &str,
        v: &Value,
        path: &[Seg<'_>],
        out: &mut Vec<Found>,
        push: &mut impl FnMut(&mut Vec<Found>, &[Seg<'_>], &dyn Fn() -> String),
    ) {
        if node.min_length.is_some() || node.max_length.is_some() {
            let len = s.chars().count() as u64;
            if let Some(min) = node.min_length {
                if len < min {
                    push(out, path, &|| {
                        format!("{} is shorter than {min} character{}", show(v), plural(min))
                    });
                }
            }
            if let Some(max) = node.max_length {
                if len > max {
                    push(out, path, &|| {
                        format!("{} is longer than {max} character{}", show(v), plural(max))
                    });
                }
            }
        }
        if let Some(p) = &node.pattern {
            if !p.is_match(s) {
                push(out, path, &|| {
                    format!("{} does not match {:?}", show(v), p.as_str())
                });
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn check_object<'v>(
        &self,
        node: &Node,
        members: &'v Map<String, Value>,
        v: &Value,
        path: &mut Vec<Seg<'v>>,
        branch: Option<&str>,
        out: &mut Vec<Found>,
        first_only: bool,
        push: &mut impl FnMut(&mut Vec<Found>, &[Seg<'_>], &dyn Fn() -> String),
    ) {
        let start = out.len();
        let stop = |out: &Vec<Found>| first_only && out.len() > start;
        if let Some(max) = node.max_properties {
            if members.len() as u64 > max {
                push(out, path, &|| {
                    format!(
                        "{} has more than {max} propert{}",
                        show(v),
                        if max == 1 { "y" } else { "ies" }
                    )
                });
                if stop(out) {
                    return;
                }
            }
        }
        if let Some(names) = node.property_names {
            for key in members.keys() {
                let key_value = Value::String(key.clone());
                let mut found = Vec::new();
                self.check(
                    names,
                    &key_value,
                    &mut Vec::new(),
                    branch,
                    &mut found,
                    first_only,
                );
                if let Some(f) = found.into_iter().next() {
                    push(out, path, &|| {
                        format!("property name {}: {}", show(&key_value), f.message)
                    });
                    if stop(out) {
                        return;
                    }
                }
            }
        }
        let additional = node.additional.map(|a| (a, self.nodes[a].never));
        let mut unexpected = Vec::new();
        // Which declared properties are present, for `required` below.
        let mut present: u128 = 0;
        for (key, value) in members {
            let declared = node.properties.iter().position(|(n, _)| n == key);
            if let Some(i) = declared.filter(|&i| i < 128) {
                present |= 1 << i;
            }
            let target = match (declared, additional) {
                (Some(i), _) => node.properties[i].1,
                (None, Some((_, true))) => {
                    unexpected.push(key.as_str());
                    continue;
                }
                (None, Some((id, false))) => id,
                (None, None) => continue,
            };
            if first_only {
                self.check(target, value, path, branch, out, true);
            } else {
                path.push(Seg::Key(key));
                self.check(target, value, path, branch, out, false);
                path.pop();
            }
            if stop(out) {
                return;
            }
        }
        // Reported first, as the object's own shape comes before what is inside it.
        let mut missing = Vec::new();
        for (name, index) in node.required.iter().zip(&node.required_index) {
            let here = match index {
                Some(i) => present & (1 << i) != 0,
                None => members.contains_key(name),
            };
            if !here {
                push(&mut missing, path, &|| {
                    format!("{} is a required property", Value::from(name.as_str()))
                });
                if first_only {
                    break;
                }
            }
        }
        if !missing.is_empty() {
            out.splice(start..start, missing);
            if stop(out) {
                return;
            }
        }
        if !unexpected.is_empty() {
            let list: Vec<String> = unexpected
                .iter()
                .map(|k| format!("{:?}", truncate(k, 80)))
                .collect();
            let verb = if unexpected.len() == 1 { "was" } else { "were" };
            push(out, path, &|| {
                format!(
                    "Additional properties are not allowed ({} {verb} unexpected)",
                    list.join(", ")
                )
            });
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn check_one_of<'v>(
        &self,
        one_of: &OneOf,
        v: &'v Value,
        path: &mut Vec<Seg<'v>>,
        branch: Option<&str>,
        out: &mut Vec<Found>,
        first_only: bool,
        push: &mut impl FnMut(&mut Vec<Found>, &[Seg<'_>], &dyn Fn() -> String),
    ) {
        match one_of {
            OneOf::Tagged { tag, branches } => {
                let expected = || {
                    let list: Vec<String> =
                        branches.iter().map(|(t, _, _)| t.to_string()).collect();
                    list.join(", ")
                };
                let Some(obj) = v.as_object() else {
                    push(out, path, &|| {
                        format!("expected an object tagged by {tag:?}")
                    });
                    return;
                };
                // A linear scan: objects are small, and it costs less than hashing the tag.
                let Some((key, value)) = obj.iter().find(|(k, _)| *k == tag) else {
                    push(out, path, &|| {
                        format!("missing tag {tag:?}; expected one of {}", expected())
                    });
                    return;
                };
                match branches.iter().find(|(t, _, _)| json_eq(t, value)) {
                    Some((_, def, id)) => self.check(*id, v, path, Some(def), out, first_only),
                    None => {
                        path.push(Seg::Key(key));
                        push(out, path, &|| {
                            format!(
                                "unknown {tag} {}; expected one of {}",
                                truncate(&value.to_string(), 80),
                                expected()
                            )
                        });
                        path.pop();
                    }
                }
            }
            OneOf::Nullable {
                inner,
                inner_ref,
                inner_text,
            } => {
                let inner_ok = self.is_valid(*inner, v);
                if v.is_null() {
                    if inner_ok {
                        push(out, path, &|| {
                            format!("{} is valid under more than one of the schemas listed in the 'oneOf' keyword", show(v))
                        });
                    }
                    return;
                }
                if inner_ok {
                    return;
                }
                match inner_ref {
                    Some(_) => self.check(*inner, v, path, branch, out, first_only),
                    None => push(out, path, &|| {
                        format!(
                            "expected null or a value matching {}",
                            truncate(inner_text, 200)
                        )
                    }),
                }
            }
            OneOf::Members(ids) | OneOf::Plain(ids) => {
                let valid = ids.iter().filter(|&&b| self.is_valid(b, v)).count();
                if valid == 1 {
                    return;
                }
                let message = || {
                    if matches!(one_of, OneOf::Members(_)) {
                        "a response carries exactly one of \"result\" (with a non-null id) and \"error\"".to_string()
                    } else if valid == 0 {
                        format!("{} is not valid under any of the schemas listed in the 'oneOf' keyword", show(v))
                    } else {
                        format!("{} is valid under more than one of the schemas listed in the 'oneOf' keyword", show(v))
                    }
                };
                push(out, path, &message);
            }
        }
    }
}

/// A definition's required properties that carry a `const`.
fn required_consts(def: &Value) -> Vec<(String, Value)> {
    let Some(required) = def.get("required").and_then(Value::as_array) else {
        return Vec::new();
    };
    required
        .iter()
        .filter_map(Value::as_str)
        .filter_map(|p| {
            let value = def.get("properties")?.get(p)?.get("const")?;
            Some((p.to_string(), value.clone()))
        })
        .collect()
}

/// Reads the shape of a `oneOf` (see [`OneOf`]).
fn read_one_of(
    node: &Map<String, Value>,
    branches: &[Value],
    ids: Vec<NodeId>,
    consts: &TagConsts,
    def_ids: &HashMap<String, NodeId>,
    at: &str,
) -> Result<OneOf, ProfileError> {
    let ref_name = |b: &Value| {
        b.get("$ref")?
            .as_str()?
            .strip_prefix("#/$defs/")
            .map(str::to_string)
    };
    if branches.len() == 2 && branches[1] == serde_json::json!({"type": "null"}) {
        return Ok(OneOf::Nullable {
            inner: ids[0],
            inner_ref: ref_name(&branches[0]),
            inner_text: branches[0].to_string(),
        });
    }
    if let Some(tag) = node.get("x-tag").and_then(Value::as_str) {
        let mut tagged = Vec::new();
        for b in branches {
            let name = ref_name(b).ok_or_else(|| {
                ProfileError(format!("{at}: a tagged union's branches are $refs"))
            })?;
            let value = consts
                .get(&name)
                .and_then(|c| c.iter().find(|(p, _)| p == tag))
                .map(|(_, v)| v);
            let Some(value) = value else {
                return Err(ProfileError(format!(
                    "{at}: branch {name} of a union tagged by {tag:?} lacks the required const tag"
                )));
            };
            if tagged
                .iter()
                .any(|(t, _, _): &(Value, String, NodeId)| json_eq(t, value))
            {
                return Err(ProfileError(format!(
                    "{at}: tag value {value} appears twice"
                )));
            }
            tagged.push((value.clone(), name.clone(), def_ids[&name]));
        }
        return Ok(OneOf::Tagged {
            tag: tag.to_string(),
            branches: tagged,
        });
    }
    if node.contains_key("required") && branches.iter().all(|b| b.get("required").is_some()) {
        return Ok(OneOf::Members(ids));
    }
    Ok(OneOf::Plain(ids))
}

fn has_type(v: &Value, types: u8) -> bool {
    let bit = match v {
        Value::Null => NULL,
        Value::Bool(_) => BOOLEAN,
        Value::Number(n) => {
            // JSON Schema: an integer is any number with a zero fractional part (3.0 included).
            let integral = n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0);
            if integral && types & INTEGER != 0 {
                return true;
            }
            NUMBER
        }
        Value::String(_) => STRING,
        Value::Array(_) => ARRAY,
        Value::Object(_) => OBJECT,
    };
    types & bit != 0
}

fn type_message(v: &Value, types: u8) -> String {
    let names: Vec<String> = TYPE_NAMES
        .iter()
        .filter(|(b, _)| types & b != 0)
        .map(|(_, n)| format!("{n:?}"))
        .collect();
    if names.len() == 1 {
        format!("{} is not of type {}", show(v), names[0])
    } else {
        format!("{} is not of types {}", show(v), names.join(", "))
    }
}

/// A number as f64 for the integer bounds of the profile (bounds are within ±2^53, where an
/// f64 comparison is exact for every bound and moves no value across one).
fn number(v: &Value) -> f64 {
    match v {
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i as f64
            } else if let Some(u) = n.as_u64() {
                u as f64
            } else {
                n.as_f64().unwrap_or(f64::NAN)
            }
        }
        _ => f64::NAN,
    }
}

/// JSON equality: numbers by value (`1` equals `1.0`), objects regardless of member order.
pub(crate) fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (integral(x), integral(y)) {
            (Some(p), Some(q)) => p == q,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, p)| y.get(k).is_some_and(|q| json_eq(p, q)))
        }
        _ => a == b,
    }
}

/// A number with no fractional part, exactly (`3.0` is 3).
fn integral(n: &serde_json::Number) -> Option<i128> {
    if let Some(i) = n.as_i64() {
        return Some(i128::from(i));
    }
    if let Some(u) = n.as_u64() {
        return Some(i128::from(u));
    }
    let f = n.as_f64()?;
    (f.fract() == 0.0 && f.abs() < 1e38).then_some(f as i128)
}

fn unique(items: &[Value]) -> bool {
    for (i, a) in items.iter().enumerate() {
        if items[i + 1..].iter().any(|b| json_eq(a, b)) {
            return false;
        }
    }
    true
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `v` as JSON, cut at 80 bytes: serialization stops there, so a refused megabyte array costs
/// no more to report than a refused number.
fn show(v: &Value) -> String {
    struct Capped(Vec<u8>);
    impl std::io::Write for Capped {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.0.len() > 80 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            self.0.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut w = Capped(Vec::new());
    let _ = serde_json::to_writer(&mut w, v);
    truncate(&String::from_utf8_lossy(&w.0), 80)
}

/// `s` cut to at most `max` bytes on a character boundary, with `…` when cut.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The JSON pointer of a path.
fn render(path: &[Seg<'_>]) -> String {
    let mut s = String::new();
    for seg in path {
        s.push('/');
        match seg {
            Seg::Key(k) => {
                for c in k.chars() {
                    match c {
                        '~' => s.push_str("~0"),
                        '/' => s.push_str("~1"),
                        c => s.push(c),
                    }
                }
            }
            Seg::Index(i) => s.push_str(&i.to_string()),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn compiled(schema: Value) -> Compiled {
        Compiled::new(&schema).unwrap()
    }

    #[test]
    fn a_definition_named_twice_is_refused_and_bare_refs_share_their_target() {
        let twice = r##"{"$defs": {"A": {"type": "string"}, "A": {"type": "integer"}}}"##;
        let e = Compiled::from_text(twice).err().expect("refused");
        assert!(e.to_string().contains("#/$defs/A is defined twice"), "{e}");
        let c = Compiled::from_text(
            r##"{"$defs": {"A": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/A"}}}"##,
        )
        .unwrap();
        // The root and A only: the bare reference is A's own node.
        assert_eq!(c.nodes.len(), 2);
        assert!(c.is_valid(c.root(), &json!({"a": "x"})));
        assert!(!c.is_valid(c.root(), &json!({"a": 1})));
        assert_eq!(c.names(), ["A"]);
    }

    #[test]
    fn keywords_outside_the_profile_are_refused_at_compile_time() {
        for bad in [
            json!({"format": "date-time"}),
            json!({"anyOf": [true]}),
            json!({"$ref": "http://example.com/x"}),
            json!({"$ref": "#/$defs/Missing"}),
            json!({"pattern": "\\d+"}),
            json!({"type": "float"}),
            json!({"minimum": 1.5}),
            json!({"properties": {"a": {"if": true}}}),
        ] {
            assert!(Compiled::new(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn integers_bounds_and_equality_follow_json_schema() {
        let c = compiled(json!({"type": "integer", "minimum": 0, "maximum": 9007199254740991i64}));
        let r = c.root();
        for ok in [json!(0), json!(3.0), json!(9007199254740991i64)] {
            assert!(c.is_valid(r, &ok), "{ok}");
        }
        for bad in [
            json!(-1),
            json!(1.5),
            json!(9007199254740992i64),
            json!(u64::MAX),
            json!("1"),
            json!(1e300),
        ] {
            assert!(!c.is_valid(r, &bad), "{bad}");
        }
        assert!(json_eq(&json!(2), &json!(2.0)));
        assert!(json_eq(
            &json!({"a": 1, "b": [1]}),
            &json!({"b": [1.0], "a": 1})
        ));
        assert!(!json_eq(&json!(1), &json!(true)));
        let u = compiled(json!({"uniqueItems": true}));
        assert!(!u.is_valid(u.root(), &json!([1, 1.0])));
        assert!(u.is_valid(u.root(), &json!([1, "1"])));
    }

    #[test]
    fn lengths_count_code_points() {
        let c = compiled(json!({"type": "string", "minLength": 2, "maxLength": 3}));
        assert!(c.is_valid(c.root(), &json!("éé")));
        assert!(c.is_valid(c.root(), &json!("😀😀😀")));
        assert!(!c.is_valid(c.root(), &json!("é")));
        assert!(!c.is_valid(c.root(), &json!("abcd")));
    }

    #[test]
    fn refusals_point_into_the_instance() {
        let c = compiled(json!({
            "type": "object", "additionalProperties": false, "required": ["a"],
            "properties": {"a": {"type": "array", "items": {"type": "string", "maxLength": 1}},
                           "b/c": {"type": "integer"}}
        }));
        let v = json!({"a": ["x", "yy"], "b/c": "n", "zz": 1});
        let mut out = Vec::new();
        c.check(c.root(), &v, &mut Vec::new(), None, &mut out, false);
        let pointers: Vec<&str> = out.iter().map(|f| f.pointer.as_str()).collect();
        assert_eq!(
            pointers,
            ["/a/1", "/b~1c", ""],
            "{:?}",
            out.iter().map(|f| &f.message).collect::<Vec<_>>()
        );
        assert!(out[2].message.contains("\"zz\" was unexpected"));
    }
}
