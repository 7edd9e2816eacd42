//! The emitter layer every target shares: the one walk over the model (definitions, then the
//! envelope, then the by-name dispatch), the field-presence matrix, and the bounded-reader
//! expressions of the checking targets (Kotlin, Swift). A target supplies spellings — a
//! [`Target`] impl for the walk, a [`ReaderSyntax`] table for the readers — so a new language
//! costs a table and its own idioms, not a copy of the walk.

use super::model::{Branch, Def, DefKind, Field, Model, Ty};
use super::schema_info::{self, bounds, child};
use serde_json::Value;
use std::fmt::Write;

/// The four ways a member can stand on the wire; every target spells each one differently, and the
/// rule "optional, nullable and missing stay distinct" is that these four never merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Present, never `null`.
    Required,
    /// Present, may be `null`.
    Nullable,
    /// May be missing, never `null`.
    Optional,
    /// May be missing, may be `null`: three states.
    OptionalNullable,
}

impl Presence {
    pub fn of(f: &Field) -> Self {
        match (f.required, f.nullable) {
            (true, false) => Self::Required,
            (true, true) => Self::Nullable,
            (false, false) => Self::Optional,
            (false, true) => Self::OptionalNullable,
        }
    }
}

/// A tagged union's parts, as [`Target::union`] gets them.
#[derive(Clone, Copy)]
pub struct UnionDef<'a> {
    pub tag: &'a str,
    pub branches: &'a [Branch],
    pub keep_unknown: bool,
}

/// What a target writes for each kind of definition. [`walk`] calls these in schema order.
pub trait Target {
    fn alias(&mut self, out: &mut String, d: &Def, t: &Ty);
    fn string_enum(&mut self, out: &mut String, d: &Def, values: &[String], keep_unknown: bool);
    fn structure(&mut self, out: &mut String, d: &Def, fields: &[Field], strict: bool);
    fn union(&mut self, out: &mut String, d: &Def, u: UnionDef<'_>);
    /// Called before each definition (doc comments).
    fn before_def(&mut self, _out: &mut String, _d: &Def) {}
    /// Called after each definition (separators).
    fn after_def(&mut self, _out: &mut String, _d: &Def) {}
    /// The JSON-RPC message envelope, after every definition.
    fn envelope(&mut self, _out: &mut String, _model: &Model) {}
    /// Decode/round-trip by definition name, last.
    fn dispatch(&mut self, _out: &mut String, _model: &Model) {}
}

/// The one walk over the model: every definition in schema order, then the envelope and the
/// by-name dispatch.
pub fn walk(model: &Model, target: &mut impl Target, out: &mut String) {
    for d in &model.defs {
        target.before_def(out, d);
        match &d.kind {
            DefKind::Alias(t) => target.alias(out, d, t),
            DefKind::StringEnum {
                values,
                keep_unknown,
            } => target.string_enum(out, d, values, *keep_unknown),
            DefKind::Struct { fields, strict, .. } => target.structure(out, d, fields, *strict),
            DefKind::Union {
                tag,
                branches,
                keep_unknown,
            } => target.union(
                out,
                d,
                UnionDef {
                    tag,
                    branches,
                    keep_unknown: *keep_unknown,
                },
            ),
        }
        target.after_def(out, d);
    }
    target.envelope(out, model);
    target.dispatch(out, model);
}

/// A target's spelling of each type expression: a table, so the recursion over [`Ty`] is written once.
pub struct TypeNames {
    pub string: &'static str,
    /// An integer the schema lets go negative.
    pub signed: &'static str,
    /// An integer with a non-negative `minimum`.
    pub unsigned: &'static str,
    pub number: &'static str,
    pub boolean: &'static str,
    /// A JSON-RPC request id: a non-negative integer or a string.
    pub integer_or_string: &'static str,
    /// Any JSON value.
    pub json: &'static str,
    /// Written before and after the item type of an array.
    pub array: [&'static str; 2],
    /// Written before and after the value type of a string-keyed map.
    pub map: [&'static str; 2],
}

impl TypeNames {
    pub fn spell(&self, t: &Ty) -> String {
        match t {
            Ty::String => self.string.into(),
            Ty::Integer { signed: true } => self.signed.into(),
            Ty::Integer { signed: false } => self.unsigned.into(),
            Ty::Number => self.number.into(),
            Ty::Boolean => self.boolean.into(),
            Ty::IntegerOrString => self.integer_or_string.into(),
            Ty::Json => self.json.into(),
            Ty::Named(n) => n.clone(),
            Ty::Array(inner) => format!("{}{}{}", self.array[0], self.spell(inner), self.array[1]),
            Ty::Map(inner) => format!("{}{}{}", self.map[0], self.spell(inner), self.map[1]),
        }
    }
}

/// One line per definition, in schema order, between `open` and `close` (name lists and by-name
/// dispatch tables).
pub fn per_def(
    out: &mut String,
    model: &Model,
    open: &str,
    line: impl Fn(&str) -> String,
    close: &str,
) {
    out.push_str(open);
    for d in &model.defs {
        let _ = writeln!(out, "{}", line(&d.name));
    }
    out.push_str(close);
}

/// The tag values of union definition `union` in branch order (none when it is no union): the
/// methods of a request union, for the envelope's request/notification split.
pub fn union_tags<'m>(model: &'m Model, union: &str) -> Vec<&'m Value> {
    match model.def(union).map(|d| &d.kind) {
        Some(DefKind::Union { branches, .. }) => branches.iter().map(|b| &b.tag_value).collect(),
        _ => Vec::new(),
    }
}

/// The wire's error classes, one per branch of the `ErrorObject` union whose tag is an integer
/// `code`: (name, code, description). The name is the branch's definition without its `Error`
/// suffix (`NotFoundError` → `NotFound`); each target spells it its own way (`NOT_FOUND`,
/// `notFound`). In schema order, so every language lists them alike.
pub fn error_codes(model: &Model) -> Vec<(String, i64, Option<String>)> {
    let Some(DefKind::Union { branches, .. }) = model.def("ErrorObject").map(|d| &d.kind) else {
        return Vec::new();
    };
    branches
        .iter()
        .filter_map(|b| {
            let code = b.tag_value.as_i64()?;
            let name = b
                .def
                .strip_suffix("Error")
                .filter(|n| !n.is_empty())
                .unwrap_or(&b.def);
            let description = model.def(&b.def).and_then(|d| d.description.clone());
            Some((name.to_string(), code, description))
        })
        .collect()
}

/// `NotFound` → `NOT_FOUND`.
pub fn screaming(pascal: &str) -> String {
    snake(pascal).trim_start_matches('_').to_ascii_uppercase()
}

/// `NotFound` → `notFound`.
pub fn camel_from_pascal(pascal: &str) -> String {
    let mut c = pascal.chars();
    match c.next() {
        Some(f) => f.to_ascii_lowercase().to_string() + c.as_str(),
        None => String::new(),
    }
}

/// Refuses a model whose definition names clash with what a target's runtime defines.
pub fn assert_no_clash(model: &Model, reserved: &[&str], language: &str) {
    for d in &model.defs {
        assert!(
            !reserved.contains(&d.name.as_str()),
            "definition {} clashes with a name the {language} runtime defines",
            d.name
        );
    }
}

/// The case for an unknown value: `unknown`, unless a real case already has that name.
pub fn unknown_case<'a>(
    mut cases: impl Iterator<Item = &'a str>,
    unknown: &'static str,
    fallback: &'static str,
) -> &'static str {
    if cases.any(|c| c == unknown) {
        fallback
    } else {
        unknown
    }
}

/// Identifiers for a struct's wire names, made unique in schema order by appending `_`.
pub fn unique_idents<'a>(
    wires: impl Iterator<Item = &'a str>,
    ident: impl Fn(&str) -> String,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in wires {
        let mut id = ident(w);
        while out.contains(&id) {
            id.push('_');
        }
        out.push(id);
    }
    out
}

/// The camel-case core of a member identifier: separators dropped, the letter after one upper-cased
/// (`retry_after_ms` → `retryAfterMs`), and `_` in front when nothing or a digit would lead. The
/// target then applies its own keyword rule.
pub fn lower_camel(wire: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in wire.chars() {
        if c.is_ascii_alphanumeric() {
            if upper && !out.is_empty() {
                out.push(c.to_ascii_uppercase());
            } else {
                out.push(c);
            }
            upper = false;
        } else {
            upper = true;
        }
    }
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// The snake_case core of a member identifier: `threadId` → `thread_id`, any other separator → `_`.
/// The target then applies its own keyword rule.
pub fn snake(wire: &str) -> String {
    let mut out = String::new();
    for (i, c) in wire.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 && !out.ends_with('_') {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        } else {
            out.push('_');
        }
    }
    out
}

/// `///` doc lines (Rust, Swift): blank lines stay bare, trailing blanks go.
pub fn slash_doc(out: &mut String, indent: &str, text: Option<&str>) {
    if let Some(text) = text {
        for line in text.lines() {
            let _ = writeln!(
                out,
                "{indent}///{}{}",
                if line.is_empty() { "" } else { " " },
                line.trim_end()
            );
        }
    }
}

/// A definition's `x-max-depth` (nesting bound), if it has one.
pub fn max_depth(raw: Option<&Value>, name: &str) -> Option<u64> {
    schema_info::def_node(raw, name)?
        .get("x-max-depth")?
        .as_u64()
}

/// How a checking target spells its runtime's reader calls (`readString(j, at, maxLength = 5)` in
/// Kotlin, `readString(j, at, maxLength: 5)` in Swift) and the statements around them.
pub trait ReaderSyntax {
    /// The reader of a request id (a non-negative integer or a string).
    const INTEGER_OR_STRING_READER: &'static str;
    /// The reader of an optional (missing or present, never null) member.
    const OPTIONAL_READER: &'static str;
    /// Prefix of a throwing call (`try ` in Swift).
    const TRY: &'static str;
    /// The literal of a JSON `null` tag.
    const NULL: &'static str;

    /// A labelled argument.
    fn arg(name: &str, value: impl std::fmt::Display) -> String;
    /// An integer bound literal.
    fn int(v: i64) -> String;
    /// A closure taking `params` and returning `body`.
    fn lambda(params: &str, body: &str) -> String;
    /// A list literal.
    fn list(items: &[String]) -> String;
    /// A const or tag value as the runtime's JSON literal.
    fn json_literal(v: &Value) -> String;
    fn string_literal(s: &str) -> String;
    /// The private value name of the `i`-th compiled pattern.
    fn pattern_name(i: usize) -> String;
    /// Whether a `const` check wraps the decoded value (true) or the raw input (false): whichever
    /// the runtime's `checkConst` takes.
    const CONST_AROUND_VALUE: bool;
    /// The statement checking that an `exactly_one_of` member set narrows `member` to `target`.
    fn narrow(cond: &[String], member: &str, target: &str) -> String;
    /// The condition "`o` has member `m`".
    fn has(m: &str) -> String;
}

/// Regexes are compiled once, as private top-level values, numbered in order of first use.
#[derive(Default)]
pub struct Patterns(pub Vec<String>);

impl Patterns {
    pub fn index(&mut self, pattern: &str) -> usize {
        match self.0.iter().position(|p| p == pattern) {
            Some(i) => i,
            None => {
                self.0.push(pattern.to_string());
                self.0.len() - 1
            }
        }
    }
}

/// The reader expressions of a checking target: each carries the schema's bounds for its node.
pub struct Readers<S> {
    pub raw: Option<&'static Value>,
    pub patterns: Patterns,
    syntax: std::marker::PhantomData<S>,
}

impl<S: ReaderSyntax> Readers<S> {
    pub fn new(raw: Option<&'static Value>) -> Self {
        Self {
            raw,
            patterns: Patterns::default(),
            syntax: std::marker::PhantomData,
        }
    }

    /// An expression decoding `j` (a JSON value at pointer `at`) as `t`, checking `node`'s bounds.
    pub fn dec(&mut self, t: &Ty, node: Option<&Value>, j: &str, at: &str, depth: usize) -> String {
        let b = bounds(node);
        let constant = node.and_then(|n| n.get("const")).map(S::json_literal);
        let check = |v: &str, c: &str| format!("checkConst({v}, {c}, {at})");
        let j = match &constant {
            Some(c) if !S::CONST_AROUND_VALUE => check(j, c),
            _ => j.to_string(),
        };
        let call = |reader: &str, args: Vec<String>| format!("{reader}({})", args.join(", "));
        let expr = match t {
            Ty::Named(n) => format!("decode{n}({j}, {at}, mode)"),
            Ty::String => {
                let mut args = vec![j, at.to_string()];
                args.extend(b.min_length.map(|m| S::arg("minLength", m)));
                args.extend(b.max_length.map(|m| S::arg("maxLength", m)));
                if let Some(p) = &b.pattern {
                    let name = S::pattern_name(self.patterns.index(p));
                    args.push(S::arg("pattern", name));
                }
                call("readString", args)
            }
            Ty::Integer { .. } => {
                let mut args = vec![j, at.to_string()];
                args.extend(b.minimum.map(|m| S::arg("minimum", S::int(m))));
                args.extend(b.maximum.map(|m| S::arg("maximum", S::int(m))));
                call("readLong", args)
            }
            Ty::Number => format!("readNumber({j}, {at})"),
            Ty::Boolean => format!("readBoolean({j}, {at})"),
            Ty::IntegerOrString => {
                let mut args = vec![j, at.to_string()];
                args.extend(b.minimum.map(|m| S::arg("minimum", S::int(m))));
                args.extend(b.maximum.map(|m| S::arg("maximum", S::int(m))));
                args.extend(b.max_length.map(|m| S::arg("maxLength", m)));
                call(S::INTEGER_OR_STRING_READER, args)
            }
            Ty::Json => format!("readJson({j}, {at})"),
            Ty::Array(inner) => {
                let mut args = vec![j, at.to_string()];
                args.extend(b.min_items.map(|m| S::arg("minItems", m)));
                args.extend(b.max_items.map(|m| S::arg("maxItems", m)));
                let (jn, an) = (format!("j{depth}"), format!("at{depth}"));
                let item_node = child(node, "items").map(schema_info::strip_nullable);
                let inner = self.dec(inner, item_node, &jn, &an, depth + 1);
                let f = S::lambda(&format!("{jn}, {an}"), &inner);
                format!("{} {f}", call("readList", args))
            }
            Ty::Map(inner) => {
                let mut args = vec![j, at.to_string()];
                args.extend(b.max_properties.map(|m| S::arg("maxProperties", m)));
                args.extend(b.key_min_length.map(|m| S::arg("keyMinLength", m)));
                args.extend(b.key_max_length.map(|m| S::arg("keyMaxLength", m)));
                let (jn, an) = (format!("j{depth}"), format!("at{depth}"));
                let value_node = child(node, "additionalProperties")
                    .filter(|v| v.is_object())
                    .map(schema_info::strip_nullable);
                let inner = self.dec(inner, value_node, &jn, &an, depth + 1);
                let f = S::lambda(&format!("{jn}, {an}"), &inner);
                format!("{} {f}", call("readMap", args))
            }
        };
        match &constant {
            Some(c) if S::CONST_AROUND_VALUE => check(&expr, c),
            _ => expr,
        }
    }

    /// The expression decoding member `f` of object `o` (in definition `def`), by its presence.
    pub fn member(&mut self, def: &str, f: &Field) -> String {
        let node = schema_info::prop_node(self.raw, def, &f.wire);
        let wl = S::string_literal(&f.wire);
        let at = format!("ptr(at, {wl})");
        let (reader, inner) = match Presence::of(f) {
            Presence::Required => {
                let j = format!("requireMember(o, {wl}, at)");
                return self.dec(&f.ty, node, &j, &at, 1);
            }
            Presence::Nullable => (
                format!("nullOr(requireMember(o, {wl}, at))"),
                self.dec(&f.ty, node, "m", &at, 1),
            ),
            Presence::Optional => (
                format!("{}(o, {wl})", S::OPTIONAL_READER),
                self.dec(&f.ty, node, "m", &at, 1),
            ),
            Presence::OptionalNullable => (
                format!("optionalNullable(o, {wl})"),
                self.dec(&f.ty, node, "m", &at, 1),
            ),
        };
        format!("{reader} {}", S::lambda("m", &inner))
    }

    /// The object-level checks a decoder runs before reading members: an untagged `oneOf` of
    /// required member sets (with the members each set narrows), then the union tag's value.
    pub fn object_checks(&self, out: &mut String, def: &str, fields: &[Field]) {
        let sets = schema_info::exactly_one_of(self.raw, def);
        if !sets.is_empty() {
            let lists: Vec<String> = sets
                .iter()
                .map(|s| {
                    let members: Vec<String> =
                        s.required.iter().map(|m| S::string_literal(m)).collect();
                    S::list(&members)
                })
                .collect();
            let _ = writeln!(
                out,
                "    {}requireExactlyOne(o, at, {})",
                S::TRY,
                S::list(&lists)
            );
            for s in &sets {
                let cond: Vec<String> = s
                    .required
                    .iter()
                    .map(|m| S::has(&S::string_literal(m)))
                    .collect();
                for (member, target) in &s.narrows {
                    let _ = writeln!(
                        out,
                        "    {}",
                        S::narrow(&cond, &S::string_literal(member), target)
                    );
                }
            }
        }
        for f in fields.iter().filter(|f| f.is_tag) {
            let wl = S::string_literal(&f.wire);
            let tag = f
                .constant
                .as_ref()
                .map(S::json_literal)
                .unwrap_or_else(|| S::NULL.into());
            let _ = writeln!(
                out,
                "    {}checkConst(requireMember(o, {wl}, at), {tag}, ptr(at, {wl}))",
                S::TRY
            );
        }
    }

    /// The private compiled-pattern values, one line each, then a blank line if there were any.
    pub fn pattern_decls(&self, out: &mut String, decl: impl Fn(&str, &str) -> String) {
        for (i, p) in self.patterns.0.iter().enumerate() {
            let lit = S::string_literal(&schema_info::end_anchored(p));
            let _ = writeln!(out, "{}", decl(&S::pattern_name(i), &lit));
        }
        if !self.patterns.0.is_empty() {
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::model;

    /// Every error class of the schema's `ErrorObject` becomes a named code in every language,
    /// with the schema's number: no host has to write `-32004`.
    #[test]
    fn every_error_class_is_a_named_code_in_every_language() {
        let m = model::build(crate::schema());
        let codes = error_codes(&m);
        let branches = crate::schema()["$defs"]["ErrorObject"]["oneOf"]
            .as_array()
            .unwrap()
            .len();
        assert_eq!(codes.len(), branches);
        assert!(codes.contains(&("NotFound".to_string(), -32004, None)));
        assert!(codes.contains(&("Internal".to_string(), -32603, None)));
        let files = crate::codegen::generate_all(crate::schema());
        let text = |suffix: &str| {
            files
                .iter()
                .filter(|f| f.path.to_string_lossy().ends_with(suffix))
                .map(|f| f.contents.clone())
                .collect::<String>()
        };
        for (name, code, _) in &codes {
            let (upper, lower) = (screaming(name), camel_from_pascal(name));
            assert!(text("generated.rs").contains(&format!("pub const {upper}: i64 = {code};")));
            assert!(text("protocol.ts").contains(&format!("  {lower}: {code},")));
            assert!(text("cc_agent_protocol/__init__.py")
                .contains(&format!("    {upper}: Final = {code}")));
            assert!(
                text("ProtocolTypes.kt").contains(&format!("    const val {upper}: Int = {code}"))
            );
            assert!(text("ProtocolTypes.swift")
                .contains(&format!("    public static let `{lower}`: Int = {code}")));
        }
        assert_eq!(screaming("MethodNotFound"), "METHOD_NOT_FOUND");
        assert_eq!(camel_from_pascal("MethodNotFound"), "methodNotFound");
    }

    /// A target that only records what the walk asked for, in order.
    #[derive(Default)]
    struct Trace(Vec<String>);

    impl Target for Trace {
        fn alias(&mut self, _: &mut String, d: &Def, _: &Ty) {
            self.0.push(format!("alias {}", d.name));
        }
        fn string_enum(&mut self, _: &mut String, d: &Def, values: &[String], _: bool) {
            self.0.push(format!("enum {} {}", d.name, values.len()));
        }
        fn structure(&mut self, _: &mut String, d: &Def, fields: &[Field], _: bool) {
            self.0.push(format!("struct {} {}", d.name, fields.len()));
        }
        fn union(&mut self, _: &mut String, d: &Def, u: UnionDef<'_>) {
            self.0
                .push(format!("union {} {} {}", d.name, u.tag, u.branches.len()));
        }
        fn after_def(&mut self, out: &mut String, _: &Def) {
            out.push('.');
        }
        fn envelope(&mut self, _: &mut String, _: &Model) {
            self.0.push("envelope".into());
        }
        fn dispatch(&mut self, _: &mut String, _: &Model) {
            self.0.push("dispatch".into());
        }
    }

    #[test]
    fn walk_visits_every_definition_in_schema_order_then_envelope_then_dispatch() {
        let m = model::build(crate::schema());
        let mut trace = Trace::default();
        let mut out = String::new();
        walk(&m, &mut trace, &mut out);
        assert_eq!(trace.0.len(), m.defs.len() + 2);
        assert_eq!(
            out.len(),
            m.defs.len(),
            "after_def runs once per definition"
        );
        for (seen, d) in trace.0.iter().zip(&m.defs) {
            assert_eq!(seen.split(' ').nth(1), Some(d.name.as_str()));
        }
        assert_eq!(trace.0[m.defs.len()..], ["envelope", "dispatch"]);
        assert!(trace
            .0
            .iter()
            .any(|t| t.starts_with("union ServerNotification method ")));
    }

    #[test]
    fn presence_keeps_the_four_wire_states_apart() {
        let f = |required, nullable| Field {
            wire: "x".into(),
            ty: Ty::String,
            required,
            nullable,
            constant: None,
            is_tag: false,
            description: None,
        };
        assert_eq!(Presence::of(&f(true, false)), Presence::Required);
        assert_eq!(Presence::of(&f(true, true)), Presence::Nullable);
        assert_eq!(Presence::of(&f(false, false)), Presence::Optional);
        assert_eq!(Presence::of(&f(false, true)), Presence::OptionalNullable);
    }

    #[test]
    fn identifier_cores_and_uniqueness() {
        assert_eq!(lower_camel("retry_after_ms"), "retryAfterMs");
        assert_eq!(lower_camel("thread/start"), "threadStart");
        assert_eq!(lower_camel("2fa"), "_2fa");
        assert_eq!(lower_camel("--"), "_");
        assert_eq!(snake("threadId"), "thread_id");
        assert_eq!(snake("a-b"), "a_b");
        assert_eq!(
            unique_idents(["a_b", "aB", "a-b"].into_iter(), lower_camel),
            ["aB", "aB_", "aB__"]
        );
        let cases = ["Unknown", "Other"];
        assert_eq!(
            unknown_case(cases.into_iter(), "Unknown", "UnknownValue"),
            "UnknownValue"
        );
        assert_eq!(
            unknown_case(["Other"].into_iter(), "Unknown", "UnknownValue"),
            "Unknown"
        );
    }

    #[test]
    fn union_tags_are_in_branch_order_and_empty_for_non_unions() {
        let m = model::build(crate::schema());
        let tags = union_tags(&m, "ClientRequest");
        assert!(!tags.is_empty());
        assert_eq!(tags[0], &Value::from("initialize"));
        assert!(union_tags(&m, "ClientResponse").is_empty());
        assert!(union_tags(&m, "NoSuchDefinition").is_empty());
    }
}
