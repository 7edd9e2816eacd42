//! The language-neutral view of the schema every generator target works from, so that the
//! rules "order from the schema", "optional, nullable and missing stay distinct" and "tagged unions
//! become sum types" are decided once, not once per language.

use serde_json::Value;

/// A type expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Ty {
    String,
    /// `signed` when the schema allows negative values.
    Integer {
        signed: bool,
    },
    Number,
    Boolean,
    /// `"type": ["integer", "string"]` (JSON-RPC request ids): a non-negative integer or a string.
    IntegerOrString,
    /// Any JSON value.
    Json,
    /// A reference to another definition.
    Named(String),
    Array(Box<Ty>),
    /// An object whose keys are free strings.
    Map(Box<Ty>),
}

/// One property of an object.
#[derive(Debug, Clone)]
pub struct Field {
    /// The exact wire name.
    pub wire: String,
    pub ty: Ty,
    /// Must be present on the wire.
    pub required: bool,
    /// May be `null` on the wire.
    pub nullable: bool,
    /// A `const` value that is not the union tag (e.g. `"jsonrpc": "2.0"`).
    pub constant: Option<Value>,
    /// This field is the tag of the union the struct is a branch of; targets whose sum types carry
    /// the tag themselves leave it out of the struct.
    pub is_tag: bool,
    pub description: Option<String>,
}

/// One branch of a tagged union.
#[derive(Debug, Clone)]
pub struct Branch {
    pub tag_value: Value,
    /// The definition holding the branch's fields.
    pub def: String,
    /// A PascalCase case name: the tag value for string tags, the definition name otherwise.
    pub variant: String,
}

#[derive(Debug, Clone)]
pub enum DefKind {
    /// A named scalar or free-form type (`Identifier` is a bounded string).
    Alias(Ty),
    StringEnum {
        values: Vec<String>,
        keep_unknown: bool,
    },
    Struct {
        fields: Vec<Field>,
        strict: bool,
        tag: Option<String>,
    },
    /// A `oneOf` whose branches share a required `const` tag. `keep_unknown` unions decode an
    /// unknown tag as `Unknown(raw)`; the others refuse it.
    Union {
        tag: String,
        branches: Vec<Branch>,
        keep_unknown: bool,
    },
}

#[derive(Debug, Clone)]
pub struct Def {
    pub name: String,
    pub description: Option<String>,
    pub kind: DefKind,
}

#[derive(Debug, Clone)]
pub struct Model {
    pub digest: String,
    pub schema_id: String,
    pub defs: Vec<Def>,
}

impl Model {
    pub fn def(&self, name: &str) -> Option<&Def> {
        self.defs.iter().find(|d| d.name == name)
    }

    /// The union a struct is a branch of, with its tag field.
    pub fn union_of(&self, def: &str) -> Option<(&Def, &Branch)> {
        self.defs.iter().find_map(|d| match &d.kind {
            DefKind::Union { branches, .. } => {
                branches.iter().find(|b| b.def == def).map(|b| (d, b))
            }
            _ => None,
        })
    }
}

fn ref_name(node: &Value) -> Option<&str> {
    node.get("$ref")?.as_str()?.strip_prefix("#/$defs/")
}

/// `oneOf: [X, {"type": "null"}]` → X.
fn nullable_inner(node: &Value) -> Option<&Value> {
    let branches = node.get("oneOf")?.as_array()?;
    (branches.len() == 2 && branches[1] == serde_json::json!({"type": "null"}))
        .then(|| &branches[0])
}

fn ty_of(node: &Value) -> Ty {
    if let Some(name) = ref_name(node) {
        return Ty::Named(name.to_string());
    }
    if let Some(c) = node.get("const") {
        return match c {
            Value::Bool(_) => Ty::Boolean,
            Value::Number(n) if n.is_i64() || n.is_u64() => Ty::Integer {
                signed: n.as_i64().is_some_and(|i| i < 0),
            },
            Value::Number(_) => Ty::Number,
            _ => Ty::String,
        };
    }
    if let Some(types) = node.get("type").and_then(Value::as_array) {
        let mut names: Vec<&str> = types.iter().filter_map(Value::as_str).collect();
        names.sort_unstable();
        return match names.as_slice() {
            ["integer", "string"] => Ty::IntegerOrString,
            _ => Ty::Json,
        };
    }
    match node.get("type").and_then(Value::as_str) {
        Some("string") => Ty::String,
        Some("integer") => Ty::Integer {
            signed: node
                .get("minimum")
                .and_then(Value::as_i64)
                .is_none_or(|m| m < 0),
        },
        Some("number") => Ty::Number,
        Some("boolean") => Ty::Boolean,
        Some("array") => Ty::Array(Box::new(node.get("items").map(ty_of).unwrap_or(Ty::Json))),
        Some("object") if node.get("properties").is_none() => Ty::Map(Box::new(
            node.get("additionalProperties")
                .map(ty_of)
                .unwrap_or(Ty::Json),
        )),
        _ => Ty::Json,
    }
}

/// PascalCase of a wire value: `thread/start` → `ThreadStart`, `waiting_approval` → `WaitingApproval`.
pub fn pascal(wire: &str) -> String {
    let mut out = String::new();
    let mut upper = true;
    for c in wire.chars() {
        if c.is_ascii_alphanumeric() {
            if upper {
                out.push(c.to_ascii_uppercase());
                upper = false;
            } else {
                out.push(c);
            }
        } else {
            upper = true;
        }
    }
    out
}

/// Builds the model from the schema, in the schema's own definition order.
pub fn build(schema: &Value) -> Model {
    let defs_obj = schema["$defs"].as_object().expect("schema has $defs");
    let mut defs = Vec::new();
    // Branch → (union tag) so struct fields know which one is the tag.
    let mut tags: Vec<(String, String)> = Vec::new();
    for node in defs_obj.values() {
        if let (Some(tag), Some(branches)) = (
            node.get("x-tag").and_then(Value::as_str),
            node.get("oneOf").and_then(Value::as_array),
        ) {
            for b in branches {
                if let Some(n) = ref_name(b) {
                    tags.push((n.to_string(), tag.to_string()));
                }
            }
        }
    }
    for (name, node) in defs_obj {
        let description = node
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_string);
        let keep_unknown = node.get("x-unknown").and_then(Value::as_str) == Some("keep");
        let kind = if let Some(tag) = node.get("x-tag").and_then(Value::as_str) {
            let branches = node["oneOf"]
                .as_array()
                .expect("a tagged union has oneOf")
                .iter()
                .map(|b| {
                    let def = ref_name(b).expect("union branches are $refs").to_string();
                    let tag_value = defs_obj[&def]["properties"][tag]["const"].clone();
                    let variant = match &tag_value {
                        Value::String(s) => pascal(s),
                        _ => def.clone(),
                    };
                    Branch {
                        tag_value,
                        def,
                        variant,
                    }
                })
                .collect();
            DefKind::Union {
                tag: tag.to_string(),
                branches,
                keep_unknown,
            }
        } else if let Some(values) = node.get("enum").and_then(Value::as_array) {
            DefKind::StringEnum {
                values: values
                    .iter()
                    .map(|v| v.as_str().expect("enums are strings").to_string())
                    .collect(),
                keep_unknown,
            }
        } else if let Some(props) = node
            .get("properties")
            .and_then(Value::as_object)
            .filter(|_| node.get("type") == Some(&Value::from("object")))
        {
            let required: Vec<&str> = node
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let tag = tags.iter().find(|(b, _)| b == name).map(|(_, t)| t.clone());
            let fields = props
                .iter()
                .map(|(wire, p)| {
                    let (inner, nullable) = match nullable_inner(p) {
                        Some(inner) => (inner, true),
                        None => (p, false),
                    };
                    Field {
                        wire: wire.clone(),
                        ty: ty_of(inner),
                        required: required.contains(&wire.as_str()),
                        nullable,
                        constant: p.get("const").cloned(),
                        is_tag: tag.as_deref() == Some(wire.as_str()),
                        description: p
                            .get("description")
                            .and_then(Value::as_str)
                            .map(str::to_string),
                    }
                })
                .collect();
            DefKind::Struct {
                fields,
                strict: node.get("additionalProperties") == Some(&Value::Bool(false)),
                tag,
            }
        } else {
            DefKind::Alias(ty_of(node))
        };
        defs.push(Def {
            name: name.clone(),
            description,
            kind,
        });
    }
    Model {
        digest: crate::digest_of(schema),
        schema_id: schema["$id"].as_str().unwrap_or_default().to_string(),
        defs,
    }
}
