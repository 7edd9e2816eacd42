//! The runtime validator: every message crossing a transport is checked against the canonical
//! schema before anything acts on it, and a refusal says exactly where and why — for a tagged union,
//! inside the branch its tag selected, never a bare "not valid under any of oneOf". The schema is
//! compiled once by the profile's own interpreter (`check.rs`), not a general JSON Schema engine.

use crate::check::{truncate, Compiled, Found};
use serde_json::Value;
use std::collections::HashMap;
use std::fmt;
use std::sync::OnceLock;

/// What a valid message turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageKind {
    /// A client request (`method` + `id`); `definition` names its envelope, e.g. `ThreadStartRequest`.
    ClientRequest { method: String, definition: String },
    /// A server request (`approval/decide`).
    ServerRequest { method: String, definition: String },
    /// A server notification (`method`, no `id`).
    Notification { method: String, definition: String },
    /// A response (`result` or `error`), in either direction; its result is checked by name once
    /// the receiver has matched the id.
    Response,
}

/// Which JSON-RPC error a refusal maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The envelope is wrong (-32600).
    InvalidRequest,
    /// The method is not part of wire v1 (-32601).
    MethodNotFound,
    /// The envelope is right but its params are not (-32602).
    InvalidParams,
}

impl ErrorClass {
    /// The JSON-RPC error code for this class.
    pub fn code(self) -> i64 {
        match self {
            ErrorClass::InvalidRequest => -32600,
            ErrorClass::MethodNotFound => -32601,
            ErrorClass::InvalidParams => -32602,
        }
    }
}

/// One reason an instance was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationIssue {
    /// JSON pointer into the instance (`""` is the whole instance).
    pub pointer: String,
    /// The definition a tagged union's tag selected, when the issue is inside one.
    pub branch: Option<String>,
    /// What is wrong, for a person.
    pub message: String,
}

/// A refusal: the definition checked and every issue found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationError {
    pub definition: String,
    pub class: ErrorClass,
    pub issues: Vec<ValidationIssue>,
}

impl fmt::Display for ValidationIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = if self.pointer.is_empty() {
            "(root)"
        } else {
            &self.pointer
        };
        match &self.branch {
            Some(branch) => write!(f, "at {at} (branch {branch}): {}", self.message),
            None => write!(f, "at {at}: {}", self.message),
        }
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {}", self.definition)?;
        for (i, issue) in self.issues.iter().enumerate() {
            write!(f, "{}{issue}", if i == 0 { ": " } else { "; " })?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationError {}

impl ValidationError {
    fn single(definition: &str, class: ErrorClass, pointer: &str, message: String) -> Self {
        ValidationError {
            definition: definition.to_string(),
            class,
            issues: vec![ValidationIssue {
                pointer: pointer.to_string(),
                branch: None,
                message,
            }],
        }
    }

    /// The first issue's pointer, for error data.
    pub fn pointer(&self) -> &str {
        self.issues
            .first()
            .map(|i| i.pointer.as_str())
            .unwrap_or("")
    }
}

/// What validation keeps: the compiled schema and the envelopes' method tables. The schema's
/// text is compiled one definition at a time ([`Compiled::from_text`]), never parsed whole.
struct Registry {
    compiled: Compiled,
    client_methods: HashMap<String, String>,
    server_methods: HashMap<String, String>,
    notifications: HashMap<String, String>,
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let compiled = Compiled::from_text(crate::SCHEMA_JSON)
            .expect("the canonical schema is inside the profile");
        let methods = |union: &str| -> HashMap<String, String> {
            let (tag, branches) = compiled
                .tagged_branches(union)
                .expect("envelope unions are tagged");
            assert_eq!(tag, "method");
            branches
                .into_iter()
                .map(|(tag, def)| {
                    (
                        tag.as_str().expect("method tags are strings").to_string(),
                        def.to_string(),
                    )
                })
                .collect()
        };
        let (client_methods, server_methods, notifications) = (
            methods("ClientRequest"),
            methods("ServerRequest"),
            methods("ServerNotification"),
        );
        Registry {
            compiled,
            client_methods,
            server_methods,
            notifications,
        }
    })
}

impl Registry {
    fn check(&self, def: &str, instance: &Value, out: &mut Vec<ValidationIssue>) {
        let id = self.compiled.def(def).expect("a definition of the schema");
        let mut found = Vec::new();
        self.compiled
            .check(id, instance, &mut Vec::new(), None, &mut found, false);
        out.extend(found.into_iter().map(|f: Found| ValidationIssue {
            pointer: f.pointer,
            branch: f.branch,
            message: f.message,
        }));
    }

    /// The definition's `x-max-depth`, if it has one.
    fn max_depth(&self, def: &str) -> Option<usize> {
        self.compiled.max_depth(def)
    }

    fn validate_def(
        &self,
        def: &str,
        instance: &Value,
        class: ErrorClass,
    ) -> Result<(), ValidationError> {
        let mut issues = Vec::new();
        if let Some(limit) = self.max_depth(def) {
            check_depth(def, instance, limit, &mut issues);
        }
        self.check(def, instance, &mut issues);
        if issues.is_empty() {
            return Ok(());
        }
        let class = match class {
            ErrorClass::InvalidRequest
                if issues.iter().all(|i| i.pointer.starts_with("/params")) =>
            {
                ErrorClass::InvalidParams
            }
            other => other,
        };
        Err(ValidationError {
            definition: def.to_string(),
            class,
            issues,
        })
    }
}

/// `x-max-depth`: arrays and objects nest at most `limit` levels, the instance itself counting as
/// the first. A refusal points at the first container one level too deep.
fn check_depth(def: &str, instance: &Value, limit: usize, out: &mut Vec<ValidationIssue>) {
    fn walk(v: &Value, level: usize, limit: usize, at: &mut String) -> bool {
        let children: Box<dyn Iterator<Item = (String, &Value)>> = match v {
            Value::Array(a) => Box::new(a.iter().enumerate().map(|(i, x)| (i.to_string(), x))),
            Value::Object(o) => Box::new(
                o.iter()
                    .map(|(k, x)| (k.replace('~', "~0").replace('/', "~1"), x)),
            ),
            _ => return true,
        };
        if level > limit {
            return false;
        }
        for (seg, child) in children {
            let len = at.len();
            at.push('/');
            at.push_str(&seg);
            if !walk(child, level + 1, limit, at) {
                return false;
            }
            at.truncate(len);
        }
        true
    }
    let mut at = String::new();
    if !walk(instance, 1, limit, &mut at) {
        out.push(ValidationIssue {
            pointer: at,
            branch: None,
            message: format!(
                "nested more than {limit} levels of arrays and objects deep (the {def} bound, x-max-depth)"
            ),
        });
    }
}

/// Validates one wire message (either direction) and says what it is.
///
/// Requests are told apart by `method` + `id`, notifications by `method` alone, responses by
/// `result` or `error`; each is then checked against its own definition.
pub fn validate_protocol_message(message: &Value) -> Result<MessageKind, ValidationError> {
    let reg = registry();
    let Some(obj) = message.as_object() else {
        return Err(ValidationError::single(
            "message",
            ErrorClass::InvalidRequest,
            "",
            "a protocol message is a JSON object".into(),
        ));
    };
    let method = match obj.get("method") {
        None => {
            reg.validate_def("ClientResponse", message, ErrorClass::InvalidRequest)?;
            return Ok(MessageKind::Response);
        }
        Some(Value::String(m)) => m.as_str(),
        Some(_) => {
            return Err(ValidationError::single(
                "message",
                ErrorClass::InvalidRequest,
                "/method",
                "method must be a string".into(),
            ));
        }
    };
    let has_id = obj.contains_key("id");
    let lookup = |map: &HashMap<String, String>| map.get(method).cloned();
    let (definition, kind): (String, fn(String, String) -> MessageKind) = if has_id {
        if let Some(def) = lookup(&reg.client_methods) {
            (def, |method, definition| MessageKind::ClientRequest {
                method,
                definition,
            })
        } else if let Some(def) = lookup(&reg.server_methods) {
            (def, |method, definition| MessageKind::ServerRequest {
                method,
                definition,
            })
        } else if reg.notifications.contains_key(method) {
            return Err(ValidationError::single(
                "message",
                ErrorClass::InvalidRequest,
                "/id",
                format!("{method} is a notification and carries no id"),
            ));
        } else {
            return Err(ValidationError::single(
                "message",
                ErrorClass::MethodNotFound,
                "/method",
                format!(
                    "unknown method {}",
                    truncate(&Value::from(method).to_string(), 80)
                ),
            ));
        }
    } else if let Some(def) = lookup(&reg.notifications) {
        (def, |method, definition| MessageKind::Notification {
            method,
            definition,
        })
    } else if reg.client_methods.contains_key(method) || reg.server_methods.contains_key(method) {
        return Err(ValidationError::single(
            "message",
            ErrorClass::InvalidRequest,
            "",
            format!("{method} is a request and needs an id"),
        ));
    } else {
        return Err(ValidationError::single(
            "message",
            ErrorClass::MethodNotFound,
            "/method",
            format!(
                "unknown notification {}",
                truncate(&Value::from(method).to_string(), 80)
            ),
        ));
    };
    // A client request's depth bound lives on the ClientRequest union, which dispatch by method
    // skips: apply it here.
    if reg.client_methods.contains_key(method) {
        if let Some(limit) = reg.max_depth("ClientRequest") {
            let mut issues = Vec::new();
            check_depth("ClientRequest", message, limit, &mut issues);
            if !issues.is_empty() {
                let class = if issues.iter().all(|i| i.pointer.starts_with("/params")) {
                    ErrorClass::InvalidParams
                } else {
                    ErrorClass::InvalidRequest
                };
                return Err(ValidationError {
                    definition,
                    class,
                    issues,
                });
            }
        }
    }
    reg.validate_def(&definition, message, ErrorClass::InvalidRequest)?;
    Ok(kind(method.to_string(), definition))
}

/// Validates `value` against one named definition of the schema (e.g. `ThreadStartResult`).
pub fn validate_protocol_definition(name: &str, value: &Value) -> Result<(), ValidationError> {
    let reg = registry();
    if reg.compiled.def(name).is_none() {
        return Err(ValidationError::single(
            name,
            ErrorClass::InvalidParams,
            "",
            format!("no definition named {name:?} in wire v1"),
        ));
    }
    reg.validate_def(name, value, ErrorClass::InvalidParams)
}

/// Validates an approval decision object (`{"kind": "acceptOnce"}` …). Unknown decisions fail.
pub fn validate_approval_decision(value: &Value) -> Result<(), ValidationError> {
    validate_protocol_definition("ApprovalDecision", value)
}

/// Validates an approval decision and returns its wire tag (`acceptOnce`, …, `cancel`).
pub fn assert_approval_decision(value: &Value) -> Result<&str, ValidationError> {
    validate_approval_decision(value)?;
    Ok(value["kind"]
        .as_str()
        .expect("a valid decision has a string tag"))
}

/// The bare JSON Schema verdict on `value`: against one definition, or (`None`) the whole schema,
/// without the `x-max-depth` bound the validators above add. For differential tests against
/// another JSON Schema engine; `None` for an unknown definition.
#[doc(hidden)]
pub fn schema_verdict(definition: Option<&str>, value: &Value) -> Option<bool> {
    let compiled = &registry().compiled;
    let id = match definition {
        Some(name) => compiled.def(name)?,
        None => compiled.root(),
    };
    Some(compiled.is_valid(id, value))
}

/// Every definition name, in schema order.
pub fn definition_names() -> impl Iterator<Item = &'static str> {
    registry().compiled.names().iter().map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn start(params: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": 1, "method": "turn/start", "params": params})
    }

    #[test]
    fn a_valid_request_names_its_definition() {
        let kind = validate_protocol_message(&start(
            json!({"threadId": "t1", "input": [{"type": "text", "text": "hi"}]}),
        ))
        .unwrap();
        assert_eq!(
            kind,
            MessageKind::ClientRequest {
                method: "turn/start".into(),
                definition: "TurnStartRequest".into()
            }
        );
    }

    #[test]
    fn errors_inside_a_tagged_branch_name_the_branch_and_pointer() {
        let err = validate_protocol_message(&start(
            json!({"threadId": "t1", "input": [{"type": "text", "text": 5}]}),
        ))
        .unwrap_err();
        assert_eq!(err.class, ErrorClass::InvalidParams);
        assert_eq!(err.issues.len(), 1, "{err}");
        assert_eq!(err.issues[0].pointer, "/params/input/0/text");
        assert_eq!(err.issues[0].branch.as_deref(), Some("TextInput"));
        assert!(!err.to_string().contains("oneOf"), "{err}");
    }

    #[test]
    fn unknown_tag_lists_the_known_ones() {
        let err = validate_protocol_message(&start(
            json!({"threadId": "t1", "input": [{"type": "image"}]}),
        ))
        .unwrap_err();
        assert_eq!(err.issues[0].pointer, "/params/input/0/type");
        assert!(err.issues[0].message.contains("\"text\""), "{err}");
    }

    #[test]
    fn a_request_without_id_or_a_notification_with_one_is_an_invalid_request() {
        let err = validate_protocol_message(
            &json!({"jsonrpc": "2.0", "method": "thread/list", "params": {}}),
        )
        .unwrap_err();
        assert_eq!(err.class, ErrorClass::InvalidRequest, "{err}");
        let err = validate_protocol_message(
            &json!({"jsonrpc": "2.0", "id": 4, "method": "turn/completed", "params": {}}),
        )
        .unwrap_err();
        assert_eq!(
            (err.class, err.pointer()),
            (ErrorClass::InvalidRequest, "/id"),
            "{err}"
        );
    }

    #[test]
    fn unknown_method_is_method_not_found() {
        let err = validate_protocol_message(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "thread/explode"}),
        )
        .unwrap_err();
        assert_eq!(err.class, ErrorClass::MethodNotFound);
    }

    #[test]
    fn nested_nullable_reports_the_inner_definition() {
        let msg = json!({"jsonrpc": "2.0", "method": "turn/completed", "params": {"threadId": "t", "eventSeq": 3, "error": null, "turn": {
            "id": "u", "threadId": "t", "status": "completed", "createdAt": "2026-01-01T00:00:00Z",
            "completedAt": "yesterday", "revision": 2, "terminalEvidence": null}}});
        let err = validate_protocol_message(&msg).unwrap_err();
        assert_eq!(err.issues[0].pointer, "/params/turn/completedAt", "{err}");
    }

    #[test]
    fn inline_nullable_and_response_errors_say_what_is_expected() {
        let err = validate_protocol_message(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "thread/list", "params": {"cursor": 5}}),
        )
        .unwrap_err();
        assert_eq!(err.issues[0].pointer, "/params/cursor");
        assert!(
            err.issues[0].message.starts_with("expected null or"),
            "{err}"
        );
        for bad in [
            json!({"jsonrpc": "2.0", "id": 1}),
            json!({"jsonrpc": "2.0", "id": 1, "result": {}, "error": {"code": -32603, "message": "x"}}),
            json!({"jsonrpc": "2.0", "id": null, "result": {}}),
        ] {
            let err = validate_protocol_message(&bad).unwrap_err();
            assert!(err.to_string().contains("exactly one of"), "{err}");
            assert!(!err.to_string().contains("oneOf"), "{err}");
        }
        assert!(validate_protocol_message(&json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "parse error"}})).is_ok());
    }

    #[test]
    fn approval_decisions_are_strict() {
        assert_eq!(
            assert_approval_decision(&json!({"kind": "acceptOnce"})).unwrap(),
            "acceptOnce"
        );
        assert!(validate_approval_decision(&json!({"kind": "acceptAlways"})).is_err());
        assert!(
            validate_approval_decision(&json!({"kind": "acceptOnce", "scope": "all"})).is_err()
        );
        assert!(validate_approval_decision(&json!("acceptOnce")).is_err());
    }

    #[test]
    fn client_requests_nest_at_most_64_levels() {
        fn nested(levels: usize) -> Value {
            let mut v = json!(1);
            for _ in 0..levels {
                v = json!([v]);
            }
            v
        }
        // envelope (1) > params (2) > metadata (3) > 61 arrays = 64 levels.
        let msg = |levels: usize| {
            json!({"jsonrpc": "2.0", "id": 1, "method": "thread/start",
                   "params": {"metadata": {"k": nested(levels)}}})
        };
        assert!(validate_protocol_message(&msg(61)).is_ok());
        let err = validate_protocol_message(&msg(62)).unwrap_err();
        assert_eq!(err.class, ErrorClass::InvalidParams, "{err}");
        assert_eq!(
            err.pointer(),
            format!("/params/metadata/k{}", "/0".repeat(61))
        );
        assert!(err.to_string().contains("64 levels"), "{err}");
        // The same bound through the union's own definition.
        assert!(validate_protocol_definition("ClientRequest", &msg(61)).is_ok());
        assert!(validate_protocol_definition("ClientRequest", &msg(62)).is_err());
        // Server messages are not bound by it (thread/read answers nest deeper by design).
        let deep_note = json!({"jsonrpc": "2.0", "id": 1, "result": {"x": nested(100)}});
        assert!(validate_protocol_message(&deep_note).is_ok());
    }

    #[test]
    fn string_ids_are_request_ids_up_to_128_characters() {
        let req = |id: Value| json!({"jsonrpc": "2.0", "id": id, "method": "thread/list"});
        assert!(validate_protocol_message(&req(json!("1"))).is_ok());
        assert!(validate_protocol_message(&req(json!(""))).is_ok());
        assert!(validate_protocol_message(&req(json!("é".repeat(128)))).is_ok());
        let err = validate_protocol_message(&req(json!("x".repeat(129)))).unwrap_err();
        assert_eq!(
            (err.class, err.pointer()),
            (ErrorClass::InvalidRequest, "/id")
        );
        for bad in [json!(-1), json!(1.5), json!(null), json!(true), json!([1])] {
            assert!(
                validate_protocol_message(&req(bad.clone())).is_err(),
                "{bad}"
            );
        }
        let answer = json!({"jsonrpc": "2.0", "id": "abc", "result": {}});
        assert!(validate_protocol_message(&answer).is_ok());
    }

    #[test]
    fn every_definition_compiles() {
        for name in definition_names() {
            assert!(registry().compiled.def(name).is_some(), "{name}");
        }
    }
}
