//! The compiled plan: an immutable, indexed form of a definition the compiler accepted, with
//! its digest. The runtime and the reducer only ever work from a plan, so nothing runs that did
//! not compile, and a log replays against exactly the plan it was written under.

use crate::protocol::{AgentOptions, GraphPortType};
use serde_json::{Map, Value};

/// Attempts a node gets when its definition does not say (`maxAttempts`).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// Nodes across all bodies of one definition.
pub const MAX_NODES: usize = 10_000;
/// Containers nested in containers (a loop in a subgraph in a loop…).
pub const MAX_NESTING: usize = 8;
/// Levels of arrays and objects a definition may nest (the value itself the first): what a
/// client request may carry inside its envelope, so a recorded definition reads back anywhere.
pub const MAX_DEFINITION_DEPTH: usize = 62;
/// Levels a value carried by a message (a run input, a node's output) may nest. Recorded
/// values are served back at most 6 levels deeper (graph/run/read), so every answer and every
/// log line stays far inside the 127 levels every wire parser accepts — a chain of joins, each
/// wrapping its input, is stopped here rather than writing an event nobody can read.
pub const MAX_VALUE_DEPTH: usize = 64;

/// Arrays and objects nest at most `limit` levels in `v` (itself the first).
pub fn within_depth(v: &Value, limit: usize) -> bool {
    match v {
        Value::Array(a) => limit > 0 && a.iter().all(|x| within_depth(x, limit - 1)),
        Value::Object(o) => limit > 0 && o.values().all(|x| within_depth(x, limit - 1)),
        _ => true,
    }
}

/// Limits; `None` is unbounded at that level.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budgets {
    pub max_steps: Option<u64>,
    pub max_tokens: Option<u64>,
    pub max_wall_time_ms: Option<u64>,
    pub max_effects: Option<u64>,
}

impl Budgets {
    pub fn from_wire(b: Option<&crate::protocol::GraphBudgets>) -> Budgets {
        match b {
            None => Budgets::default(),
            Some(b) => Budgets {
                max_steps: b.max_steps,
                max_tokens: b.max_tokens,
                max_wall_time_ms: b.max_wall_time_ms,
                max_effects: b.max_effects,
            },
        }
    }

    /// Field by field: `self` where set, else `fallback`.
    pub fn or(self, fallback: Budgets) -> Budgets {
        Budgets {
            max_steps: self.max_steps.or(fallback.max_steps),
            max_tokens: self.max_tokens.or(fallback.max_tokens),
            max_wall_time_ms: self.max_wall_time_ms.or(fallback.max_wall_time_ms),
            max_effects: self.max_effects.or(fallback.max_effects),
        }
    }

    /// (wire name, own value, other value) for every limit, to compare two budgets.
    pub fn pairs(&self, other: &Budgets) -> [(&'static str, Option<u64>, Option<u64>); 4] {
        [
            ("maxSteps", self.max_steps, other.max_steps),
            ("maxTokens", self.max_tokens, other.max_tokens),
            (
                "maxWallTimeMs",
                self.max_wall_time_ms,
                other.max_wall_time_ms,
            ),
            ("maxEffects", self.max_effects, other.max_effects),
        ]
    }
}

/// A port of a node or a body boundary.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanPort {
    pub name: String,
    pub ty: GraphPortType,
}

/// One end of an edge, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The enclosing body's boundary port (an input when the edge starts there, an output when
    /// it ends there).
    Boundary(usize),
    /// A node (index into `Plan::nodes`) and one of its ports.
    Node(usize, usize),
}

#[derive(Debug, Clone, PartialEq)]
pub struct PlanEdge {
    pub from: End,
    pub to: End,
}

/// What a node does when it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeSpec {
    Agent {
        instructions: Option<String>,
        prompt: Option<String>,
        agent_options: Option<AgentOptions>,
    },
    Tool {
        tool: String,
        arguments: Map<String, Value>,
    },
    Join,
    Loop {
        body: usize,
        max_iterations: u32,
        /// Index into the loop's outputs of the boolean that stops it.
        until: Option<usize>,
    },
    Subgraph {
        body: usize,
    },
}

impl NodeSpec {
    pub fn kind(&self) -> crate::protocol::GraphNodeKind {
        use crate::protocol::GraphNodeKind as K;
        match self {
            NodeSpec::Agent { .. } => K::Agent,
            NodeSpec::Tool { .. } => K::Tool,
            NodeSpec::Join => K::Join,
            NodeSpec::Loop { .. } => K::Loop,
            NodeSpec::Subgraph { .. } => K::Subgraph,
        }
    }

    /// Agent and tool nodes run on workers, under leases; joins run in the scheduler;
    /// containers only open bodies.
    pub fn is_work(&self) -> bool {
        matches!(self, NodeSpec::Agent { .. } | NodeSpec::Tool { .. })
    }

    pub fn body(&self) -> Option<usize> {
        match self {
            NodeSpec::Loop { body, .. } | NodeSpec::Subgraph { body } => Some(*body),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PlanNode {
    pub id: String,
    /// The body (index into `Plan::scopes`) this node belongs to.
    pub scope: usize,
    /// JSON pointer of the node in the definition.
    pub pointer: String,
    pub inputs: Vec<PlanPort>,
    pub outputs: Vec<PlanPort>,
    /// Per input port, the edge (index into its scope's edges) that feeds it.
    pub fed_by: Vec<Option<usize>>,
    /// Per output port, the edges leaving it.
    pub feeds: Vec<Vec<usize>>,
    /// Capabilities it needs, implied ones included.
    pub capabilities: Vec<String>,
    pub budgets: Budgets,
    pub write_scope: Vec<String>,
    pub max_attempts: u32,
    pub spec: NodeSpec,
}

/// A body: the root graph or a container's.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanScope {
    /// The container node; None for the root.
    pub container: Option<usize>,
    /// Its nodes, in a topological order.
    pub nodes: Vec<usize>,
    pub edges: Vec<PlanEdge>,
    pub inputs: Vec<PlanPort>,
    pub outputs: Vec<PlanPort>,
    /// Per boundary input, the edges leaving it.
    pub input_feeds: Vec<Vec<usize>>,
    /// Per boundary output, the edge that fills it.
    pub output_fed_by: Vec<Option<usize>>,
}

/// An immutable compiled definition.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// `sha256:` + hex of the definition's RFC 8785 form.
    pub digest: String,
    pub graph_id: String,
    pub title: Option<String>,
    pub nodes: Vec<PlanNode>,
    /// `scopes[0]` is the root.
    pub scopes: Vec<PlanScope>,
    /// The run's budgets: the grant's, else the definition's.
    pub budgets: Budgets,
}

impl Plan {
    pub fn root(&self) -> &PlanScope {
        &self.scopes[0]
    }

    /// Nodes across every body (what `graph/validate` reports as nodeCount).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }
}

/// Whether a value from a `from` port may travel to a `to` port.
pub fn accepts(to: GraphPortType, from: GraphPortType) -> bool {
    to == from
        || to == GraphPortType::Json
        || (to == GraphPortType::Number && from == GraphPortType::Integer)
}

/// Whether `value` is of port type `ty` (checked when a message is sent).
pub fn value_fits(ty: GraphPortType, value: &Value) -> bool {
    match ty {
        GraphPortType::Text => value.is_string(),
        GraphPortType::Json => true,
        GraphPortType::Number => value.is_number(),
        GraphPortType::Integer => {
            value.is_i64()
                || value.is_u64()
                || value
                    .as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f.is_finite())
        }
        GraphPortType::Boolean => value.is_boolean(),
        GraphPortType::Object => value.is_object(),
        GraphPortType::Array => value.is_array(),
    }
}

pub fn port_type_name(ty: GraphPortType) -> &'static str {
    match ty {
        GraphPortType::Text => "text",
        GraphPortType::Json => "json",
        GraphPortType::Number => "number",
        GraphPortType::Integer => "integer",
        GraphPortType::Boolean => "boolean",
        GraphPortType::Object => "object",
        GraphPortType::Array => "array",
    }
}

/// Instance keys: how node instances and body instances are named in a run (the schema's
/// `GraphNodeKey`).
pub mod keys {
    /// The key of node `id` inside the body instance `scope` ("" for the root).
    pub fn node(scope: &str, id: &str) -> String {
        if scope.is_empty() {
            id.to_string()
        } else {
            format!("{scope}/{id}")
        }
    }

    /// The key of the body instance of container `container` at `iteration`.
    pub fn scope(container: &str, iteration: u32) -> String {
        format!("{container}.{iteration}")
    }

    /// Whether a key names a body instance (its last segment ends in `.<n>`).
    pub fn is_scope(key: &str) -> bool {
        let last = key.rsplit('/').next().unwrap_or(key);
        last.contains('.')
    }

    /// The body instance a node key lives in ("" for a root node).
    pub fn parent(key: &str) -> &str {
        key.rfind('/').map_or("", |i| &key[..i])
    }

    /// The container key and iteration of a body instance key.
    pub fn split_scope(key: &str) -> Option<(&str, u32)> {
        let dot = key.rfind('.')?;
        if key[dot..].contains('/') {
            return None;
        }
        Some((&key[..dot], key[dot + 1..].parse().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_nodes_and_scopes_unambiguously() {
        assert_eq!(keys::node("", "a"), "a");
        let s = keys::scope("l", 3);
        assert_eq!(s, "l.3");
        assert!(keys::is_scope(&s));
        assert!(!keys::is_scope("l"));
        let inner = keys::node(&s, "b");
        assert_eq!(inner, "l.3/b");
        assert!(!keys::is_scope(&inner));
        assert_eq!(keys::parent(&inner), "l.3");
        assert_eq!(keys::parent("a"), "");
        assert_eq!(keys::split_scope("s.0/l.12"), Some(("s.0/l", 12)));
        assert_eq!(keys::split_scope("s.0/l"), None);
    }

    #[test]
    fn port_types_accept_equal_integer_to_number_and_anything_to_json() {
        use GraphPortType as T;
        assert!(accepts(T::Text, T::Text));
        assert!(accepts(T::Json, T::Boolean));
        assert!(accepts(T::Number, T::Integer));
        assert!(!accepts(T::Integer, T::Number));
        assert!(!accepts(T::Text, T::Json));
        assert!(value_fits(T::Integer, &serde_json::json!(3)));
        assert!(!value_fits(T::Integer, &serde_json::json!(3.5)));
        assert!(value_fits(T::Text, &serde_json::json!("x")));
        assert!(!value_fits(T::Object, &serde_json::json!([])));
    }
}
