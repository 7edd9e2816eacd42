//! The Graph IR compiler: checks a definition against every rule before anything may run, and
//! turns it into an immutable `Plan` with a digest. Every refusal carries a stable code and a
//! JSON pointer into the definition (docs/graph.md lists the rules); nothing that did not compile
//! can cause an effect, because the runtime only ever runs plans.

use super::plan::*;
use crate::protocol::{
    GraphBody, GraphCompileErrorCode as Code, GraphDefinition, GraphEdge, GraphNode, GraphPort,
    GraphPortType, GraphRunGrant,
};
use serde_json::Value;
use std::collections::{HashMap, HashSet, VecDeque};

/// Most errors one compilation reports (the rest are summarised by the first ones).
pub const MAX_ERRORS: usize = 1000;

/// One reason a definition was refused.
#[derive(Debug, Clone, PartialEq)]
pub struct CompileError {
    pub code: Code,
    /// JSON pointer into the definition.
    pub pointer: String,
    pub message: String,
}

impl CompileError {
    /// The stable code as it is spelled on the wire (`danglingPort`…).
    pub fn code_name(&self) -> String {
        match serde_json::to_value(&self.code) {
            Ok(Value::String(s)) => s,
            _ => "unknown".into(),
        }
    }

    pub fn to_wire(&self) -> crate::protocol::GraphCompileError {
        crate::protocol::GraphCompileError {
            code: self.code.clone(),
            pointer: self.pointer.clone(),
            message: self.message.clone(),
            extra: Default::default(),
        }
    }
}

impl std::fmt::Display for CompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if self.pointer.is_empty() {
            "(root)"
        } else {
            &self.pointer
        };
        write!(f, "{} at {at}: {}", self.code_name(), self.message)
    }
}

/// Whether `grant` (a run's capability list) covers `need`.
pub fn granted(grant: &[String], need: &str) -> bool {
    grant.iter().any(|g| {
        g == "*"
            || g == need
            || g.strip_suffix('*')
                .is_some_and(|prefix| need.starts_with(prefix))
    })
}

/// Compiles `definition` for a run with `grant`. The definition is checked against the schema's
/// `GraphDefinition` first (`schemaInvalid` with the validator's pointers), then against every
/// rule; all errors found are returned, in definition order.
pub fn compile(definition: &Value, grant: &GraphRunGrant) -> Result<Plan, Vec<CompileError>> {
    if let Err(e) = cc_agent_protocol::validate_protocol_definition("GraphDefinition", definition) {
        let mut errors: Vec<CompileError> = e
            .issues
            .iter()
            .take(MAX_ERRORS)
            .map(|i| CompileError {
                code: Code::SchemaInvalid,
                pointer: i.pointer.clone(),
                message: cap(&i.message),
            })
            .collect();
        left_out(&mut errors, e.issues.len().saturating_sub(MAX_ERRORS));
        return Err(errors);
    }
    if !within_depth(definition, MAX_DEFINITION_DEPTH) {
        return Err(vec![CompileError {
            code: Code::TooLarge,
            pointer: String::new(),
            message: format!("the definition nests more than {MAX_DEFINITION_DEPTH} levels of arrays and objects; flatten its values"),
        }]);
    }
    let def = <GraphDefinition as serde::Deserialize>::deserialize(definition).map_err(|e| {
        vec![CompileError {
            code: Code::SchemaInvalid,
            pointer: String::new(),
            message: cap(&e.to_string()),
        }]
    })?;
    let grant_budgets = Budgets::from_wire(grant.budgets.as_ref());
    let def_budgets = Budgets::from_wire(def.budgets.as_ref());
    let mut c = Compiler {
        errors: Vec::new(),
        nodes: Vec::new(),
        scopes: Vec::new(),
        grant: grant.capabilities.clone(),
        run_budgets: grant_budgets.or(def_budgets),
        too_large: false,
        dropped: 0,
        effective: Vec::new(),
    };
    for (name, mine, run) in def_budgets.pairs(&grant_budgets) {
        if let (Some(mine), Some(run)) = (mine, run) {
            if mine > run {
                c.error(
                    Code::BudgetExceedsRun,
                    format!("/budgets/{name}"),
                    format!("the graph asks for {name} {mine}, more than the run grants ({run}); lower it or grant more"),
                );
            }
        }
    }
    let empty = Vec::new();
    c.scope(
        None,
        &def.nodes,
        def.edges.as_ref().unwrap_or(&empty),
        def.inputs.as_deref().unwrap_or(&[]),
        def.outputs.as_deref().unwrap_or(&[]),
        "",
        "",
        0,
    );
    if !c.errors.is_empty() {
        let mut errors = c.errors;
        left_out(&mut errors, c.dropped);
        return Err(errors);
    }
    Ok(Plan {
        digest: crate::approval::digest_json(definition),
        graph_id: def.id,
        title: def.title,
        nodes: c.nodes,
        scopes: c.scopes,
        budgets: c.run_budgets,
    })
}

/// Says on the last reported error how many more were found and left out.
fn left_out(errors: &mut [CompileError], dropped: usize) {
    if dropped == 0 {
        return;
    }
    if let Some(last) = errors.last_mut() {
        let note =
            format!(" [{dropped} more error(s) found and not reported: at most {MAX_ERRORS} are]");
        let keep: String = last.message.chars().take(1024 - note.len()).collect();
        last.message = keep + &note;
    }
}

fn cap(message: &str) -> String {
    if message.chars().count() <= 1024 {
        return message.to_string();
    }
    let mut s: String = message.chars().take(1020).collect();
    s.push_str("...");
    s
}

struct Compiler {
    errors: Vec<CompileError>,
    nodes: Vec<PlanNode>,
    scopes: Vec<PlanScope>,
    grant: Vec<String>,
    run_budgets: Budgets,
    too_large: bool,
    /// Errors found beyond `MAX_ERRORS` (counted, not reported).
    dropped: usize,
    /// `effective_scope` per node, once computed.
    effective: Vec<Option<std::rc::Rc<Vec<String>>>>,
}

/// The parts every node kind shares, read off the generated types.
struct Common<'a> {
    id: &'a str,
    inputs: &'a [GraphPort],
    outputs: &'a [GraphPort],
    capabilities: &'a [String],
    budgets: Option<&'a crate::protocol::GraphBudgets>,
    write_scope: &'a [String],
    max_attempts: Option<u64>,
}

fn common(node: &GraphNode) -> Common<'_> {
    fn s<T>(v: &Option<Vec<T>>) -> &[T] {
        v.as_deref().unwrap_or(&[])
    }
    match node {
        GraphNode::Agent(n) => Common {
            id: &n.id,
            inputs: s(&n.inputs),
            outputs: s(&n.outputs),
            capabilities: s(&n.capabilities),
            budgets: n.budgets.as_ref(),
            write_scope: s(&n.write_scope),
            max_attempts: n.max_attempts,
        },
        GraphNode::Tool(n) => Common {
            id: &n.id,
            inputs: s(&n.inputs),
            outputs: s(&n.outputs),
            capabilities: s(&n.capabilities),
            budgets: n.budgets.as_ref(),
            write_scope: s(&n.write_scope),
            max_attempts: n.max_attempts,
        },
        GraphNode::Join(n) => Common {
            id: &n.id,
            inputs: s(&n.inputs),
            outputs: s(&n.outputs),
            capabilities: &[],
            budgets: None,
            write_scope: &[],
            max_attempts: None,
        },
        GraphNode::Loop(n) => Common {
            id: &n.id,
            inputs: s(&n.inputs),
            outputs: s(&n.outputs),
            capabilities: &[],
            budgets: None,
            write_scope: &[],
            max_attempts: None,
        },
        GraphNode::Subgraph(n) => Common {
            id: &n.id,
            inputs: s(&n.inputs),
            outputs: s(&n.outputs),
            capabilities: &[],
            budgets: None,
            write_scope: &[],
            max_attempts: None,
        },
    }
}

fn ports(list: &[GraphPort]) -> Vec<PlanPort> {
    list.iter()
        .map(|p| PlanPort {
            name: p.name.clone(),
            ty: p.type_,
        })
        .collect()
}

/// A write-scope entry in its compared form: `./` prefixes and trailing `/` dropped.
fn normalize_scope(entry: &str) -> Result<String, String> {
    let mut s = entry;
    while let Some(rest) = s.strip_prefix("./") {
        s = rest;
    }
    let s = s.trim_end_matches('/');
    let s = if s.is_empty() && entry.starts_with('/') {
        "/"
    } else {
        s
    };
    if s.is_empty() || s == "." {
        return Err(format!(
            "write scope {entry:?} names nothing; name a path or resource"
        ));
    }
    if s.split('/').any(|seg| seg == "..") {
        return Err(format!(
            "write scope {entry:?} has a '..' segment; name the path itself"
        ));
    }
    Ok(s.to_string())
}

/// Whether two normalised scope entries can name the same thing.
fn overlaps(a: &str, b: &str) -> bool {
    let under = |x: &str, y: &str| {
        x.len() > y.len() && x.starts_with(y) && (y == "/" || x.as_bytes()[y.len()] == b'/')
    };
    a == "*" || b == "*" || a == b || under(a, b) || under(b, a)
}

impl Compiler {
    fn error(&mut self, code: Code, pointer: String, message: String) {
        if self.errors.len() < MAX_ERRORS {
            self.errors.push(CompileError {
                code,
                pointer,
                message: cap(&message),
            });
        } else {
            self.dropped += 1;
        }
    }

    /// Compiles one body; returns its scope index. `ptr` is the pointer of the object holding
    /// `nodes`/`edges`, `io_ptr` the pointer of the object holding the boundary ports.
    #[allow(clippy::too_many_arguments)]
    fn scope(
        &mut self,
        container: Option<usize>,
        nodes: &[GraphNode],
        edges: &[GraphEdge],
        inputs: &[GraphPort],
        outputs: &[GraphPort],
        ptr: &str,
        io_ptr: &str,
        depth: usize,
    ) -> usize {
        let index = self.scopes.len();
        self.scopes.push(PlanScope {
            container,
            nodes: Vec::new(),
            edges: Vec::new(),
            inputs: ports(inputs),
            outputs: ports(outputs),
            input_feeds: vec![Vec::new(); inputs.len()],
            output_fed_by: vec![None; outputs.len()],
        });
        let errors_before = self.errors.len();
        for (list, what) in [(inputs, "inputs"), (outputs, "outputs")] {
            self.duplicate_ports(list, &format!("{io_ptr}/{what}"), "the boundary");
        }
        // Nodes: ids, ports, kind rules, and their bodies (depth first).
        let mut by_id: HashMap<&str, usize> = HashMap::new();
        let mut members = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let p = format!("{ptr}/nodes/{i}");
            let c = common(node);
            if by_id.contains_key(c.id) {
                self.error(
                    Code::DuplicateId,
                    format!("{p}/id"),
                    format!(
                        "node id {:?} is used twice in this body; ids must be unique",
                        c.id
                    ),
                );
                continue;
            }
            if self.nodes.len() >= MAX_NODES {
                if !self.too_large {
                    self.too_large = true;
                    self.error(
                        Code::TooLarge,
                        p.clone(),
                        format!("the graph has more than {MAX_NODES} nodes across its bodies; split it into several runs"),
                    );
                }
                continue;
            }
            let n = self.node(node, index, &p, depth);
            by_id.insert(c.id, n);
            members.push(n);
        }
        // Edges: resolve, type-check, one feed per input.
        let mut resolved = Vec::new();
        for (k, edge) in edges.iter().enumerate() {
            let p = format!("{ptr}/edges/{k}");
            let from = self.end(
                &by_id,
                &edge.from.node,
                &edge.from.port,
                index,
                true,
                &format!("{p}/from"),
            );
            let to = self.end(
                &by_id,
                &edge.to.node,
                &edge.to.port,
                index,
                false,
                &format!("{p}/to"),
            );
            let (Some(from), Some(to)) = (from, to) else {
                continue;
            };
            let (ft, tt) = (
                self.port_of(index, from, true).ty,
                self.port_of(index, to, false).ty,
            );
            if !accepts(tt, ft) {
                self.error(
                    Code::PortTypeMismatch,
                    p.clone(),
                    format!(
                        "the edge carries {} into a {} port; make the types equal, or make the input json",
                        port_type_name(ft),
                        port_type_name(tt)
                    ),
                );
                continue;
            }
            let e = self.scopes[index].edges.len();
            let already = match to {
                End::Boundary(b) => self.scopes[index].output_fed_by[b].replace(e),
                End::Node(n, port) => self.nodes[n].fed_by[port].replace(e),
            };
            if already.is_some() {
                self.error(
                    Code::InputMultiplyFed,
                    format!("{p}/to"),
                    "this input already has an edge; each input takes exactly one (use a join to combine values)".into(),
                );
                continue;
            }
            match from {
                End::Boundary(b) => self.scopes[index].input_feeds[b].push(e),
                End::Node(n, port) => self.nodes[n].feeds[port].push(e),
            }
            self.scopes[index].edges.push(PlanEdge { from, to });
            resolved.push(p);
        }
        let structural_ok = self.errors.len() == errors_before;
        let order = self.topo(index, &members, &resolved);
        if structural_ok {
            if let Some(order) = &order {
                self.reachability(index, order, io_ptr);
                self.write_scopes(index, order);
            }
        }
        self.scopes[index].nodes = order.unwrap_or(members);
        index
    }

    fn duplicate_ports(&mut self, list: &[GraphPort], ptr: &str, owner: &str) {
        let mut seen = HashSet::new();
        for (j, port) in list.iter().enumerate() {
            if !seen.insert(port.name.as_str()) {
                self.error(
                    Code::DuplicateId,
                    format!("{ptr}/{j}/name"),
                    format!(
                        "port {:?} appears twice among the {owner}'s ports",
                        port.name
                    ),
                );
            }
        }
    }

    fn node(&mut self, node: &GraphNode, scope: usize, p: &str, depth: usize) -> usize {
        let c = common(node);
        self.duplicate_ports(c.inputs, &format!("{p}/inputs"), "node");
        self.duplicate_ports(c.outputs, &format!("{p}/outputs"), "node");
        let index = self.nodes.len();
        let mut capabilities: Vec<String> = Vec::new();
        match node {
            GraphNode::Agent(_) => capabilities.push("agent".into()),
            GraphNode::Tool(t) => capabilities.push(format!("tool:{}", t.tool)),
            _ => {}
        }
        if let Some(need) = capabilities.first() {
            if !granted(&self.grant, need) {
                self.error(
                    Code::CapabilityNotGranted,
                    p.to_string(),
                    format!("node {:?} needs {need:?} (implied by its kind), which the run does not grant; add it to the grant's capabilities", c.id),
                );
            }
        }
        for (j, cap) in c.capabilities.iter().enumerate() {
            if !granted(&self.grant, cap) {
                self.error(
                    Code::CapabilityNotGranted,
                    format!("{p}/capabilities/{j}"),
                    format!("node {:?} needs {cap:?}, which the run does not grant; add it to the grant's capabilities", c.id),
                );
            }
            if !capabilities.contains(cap) {
                capabilities.push(cap.clone());
            }
        }
        let budgets = Budgets::from_wire(c.budgets);
        for (name, mine, run) in budgets.pairs(&self.run_budgets) {
            if let (Some(mine), Some(run)) = (mine, run) {
                if mine > run {
                    self.error(
                        Code::BudgetExceedsRun,
                        format!("{p}/budgets/{name}"),
                        format!(
                            "node {:?} asks for {name} {mine}, more than the run's {run}",
                            c.id
                        ),
                    );
                }
            }
        }
        let mut write_scope = Vec::new();
        for (j, entry) in c.write_scope.iter().enumerate() {
            match normalize_scope(entry) {
                Ok(s) => write_scope.push(s),
                Err(m) => self.error(Code::WriteScopeInvalid, format!("{p}/writeScope/{j}"), m),
            }
        }
        let spec = match node {
            GraphNode::Agent(a) => NodeSpec::Agent {
                instructions: a.instructions.clone(),
                prompt: a.prompt.clone(),
                agent_options: a.agent_options.clone(),
            },
            GraphNode::Tool(t) => NodeSpec::Tool {
                tool: t.tool.clone(),
                arguments: t.arguments.clone().unwrap_or_default(),
            },
            GraphNode::Join(_) => {
                let ok = c.outputs.len() == 1
                    && matches!(
                        c.outputs[0].type_,
                        GraphPortType::Object | GraphPortType::Array | GraphPortType::Json
                    )
                    && !c.inputs.is_empty();
                if !ok {
                    self.error(
                        Code::InvalidPorts,
                        p.to_string(),
                        format!("join {:?} needs at least one input and exactly one output of type object, array or json", c.id),
                    );
                }
                NodeSpec::Join
            }
            GraphNode::Loop(l) => {
                let max_iterations = match l.max_iterations {
                    Some(m) => m as u32,
                    None => {
                        self.error(
                            Code::LoopUnbounded,
                            p.to_string(),
                            format!("loop {:?} has no maxIterations; every loop needs a bound (1 to 10000)", c.id),
                        );
                        1
                    }
                };
                let until = match &l.until {
                    None => None,
                    Some(name) => {
                        match c.outputs.iter().position(|o| &o.name == name) {
                            None => {
                                self.error(
                                Code::DanglingPort,
                                format!("{p}/until"),
                                format!("loop {:?} stops on {name:?}, which is not one of its outputs", c.id),
                            );
                                None
                            }
                            Some(j) if c.outputs[j].type_ != GraphPortType::Boolean => {
                                self.error(
                                Code::PortTypeMismatch,
                                format!("{p}/until"),
                                format!("loop {:?} stops on {name:?}, which must be a boolean output", c.id),
                            );
                                None
                            }
                            Some(j) => Some(j),
                        }
                    }
                };
                // What carries into the next iteration must fit the input it feeds.
                for (j, out) in c.outputs.iter().enumerate() {
                    if let Some(input) = c.inputs.iter().find(|i| i.name == out.name) {
                        if !accepts(input.type_, out.type_) {
                            self.error(
                                Code::PortTypeMismatch,
                                format!("{p}/outputs/{j}"),
                                format!("loop {:?} carries output {:?} ({}) into its input of the same name ({})", c.id, out.name, port_type_name(out.type_), port_type_name(input.type_)),
                            );
                        }
                    }
                }
                NodeSpec::Loop {
                    body: usize::MAX,
                    max_iterations,
                    until,
                }
            }
            GraphNode::Subgraph(_) => NodeSpec::Subgraph { body: usize::MAX },
        };
        self.nodes.push(PlanNode {
            id: c.id.to_string(),
            scope,
            pointer: p.to_string(),
            inputs: ports(c.inputs),
            outputs: ports(c.outputs),
            fed_by: vec![None; c.inputs.len()],
            feeds: vec![Vec::new(); c.outputs.len()],
            capabilities,
            budgets,
            write_scope,
            max_attempts: c.max_attempts.map_or(DEFAULT_MAX_ATTEMPTS, |m| m as u32),
            spec,
        });
        let body: Option<&GraphBody> = match node {
            GraphNode::Loop(l) => Some(&l.body),
            GraphNode::Subgraph(s) => Some(&s.body),
            _ => None,
        };
        if let Some(body) = body {
            if depth + 1 > MAX_NESTING {
                self.error(
                    Code::TooLarge,
                    format!("{p}/body"),
                    format!("containers nest more than {MAX_NESTING} deep here; flatten the graph"),
                );
            } else {
                let empty = Vec::new();
                let s = self.scope(
                    Some(index),
                    &body.nodes,
                    body.edges.as_ref().unwrap_or(&empty),
                    c.inputs,
                    c.outputs,
                    &format!("{p}/body"),
                    p,
                    depth + 1,
                );
                match &mut self.nodes[index].spec {
                    NodeSpec::Loop { body, .. } | NodeSpec::Subgraph { body } => *body = s,
                    _ => {}
                }
            }
        }
        index
    }

    /// Resolves one end of an edge in scope `scope`; `out` is true for the edge's start.
    fn end(
        &mut self,
        by_id: &HashMap<&str, usize>,
        node: &Option<String>,
        port: &str,
        scope: usize,
        out: bool,
        p: &str,
    ) -> Option<End> {
        match node {
            None => {
                let list = if out {
                    &self.scopes[scope].inputs
                } else {
                    &self.scopes[scope].outputs
                };
                match list.iter().position(|x| x.name == port) {
                    Some(b) => Some(End::Boundary(b)),
                    None => {
                        let side = if out { "inputs" } else { "outputs" };
                        self.error(
                            Code::DanglingPort,
                            format!("{p}/port"),
                            format!("the body's boundary has no {side} port {port:?}"),
                        );
                        None
                    }
                }
            }
            Some(id) => {
                let Some(&n) = by_id.get(id.as_str()) else {
                    self.error(
                        Code::DanglingNode,
                        format!("{p}/node"),
                        format!("no node {id:?} in this body"),
                    );
                    return None;
                };
                let list = if out {
                    &self.nodes[n].outputs
                } else {
                    &self.nodes[n].inputs
                };
                match list.iter().position(|x| x.name == port) {
                    Some(j) => Some(End::Node(n, j)),
                    None => {
                        let side = if out { "output" } else { "input" };
                        self.error(
                            Code::DanglingPort,
                            format!("{p}/port"),
                            format!("node {id:?} has no {side} port {port:?}"),
                        );
                        None
                    }
                }
            }
        }
    }

    fn port_of(&self, scope: usize, end: End, out: bool) -> &PlanPort {
        match (end, out) {
            (End::Boundary(b), true) => &self.scopes[scope].inputs[b],
            (End::Boundary(b), false) => &self.scopes[scope].outputs[b],
            (End::Node(n, j), true) => &self.nodes[n].outputs[j],
            (End::Node(n, j), false) => &self.nodes[n].inputs[j],
        }
    }

    /// Kahn's algorithm over node-to-node edges; a cycle is refused (loops repeat through their
    /// bodies, never through edges). `edge_ptrs[e]` is the pointer of resolved edge `e`.
    fn topo(
        &mut self,
        scope: usize,
        members: &[usize],
        edge_ptrs: &[String],
    ) -> Option<Vec<usize>> {
        let mut indegree: HashMap<usize, usize> = members.iter().map(|&n| (n, 0)).collect();
        let mut succ: HashMap<usize, Vec<usize>> = HashMap::new();
        for e in &self.scopes[scope].edges {
            if let (End::Node(a, _), End::Node(b, _)) = (e.from, e.to) {
                *indegree.get_mut(&b).expect("a member") += 1;
                succ.entry(a).or_default().push(b);
            }
        }
        let mut queue: VecDeque<usize> = members
            .iter()
            .copied()
            .filter(|n| indegree[n] == 0)
            .collect();
        let mut order = Vec::with_capacity(members.len());
        while let Some(n) = queue.pop_front() {
            order.push(n);
            for &m in succ.get(&n).map(Vec::as_slice).unwrap_or(&[]) {
                let d = indegree.get_mut(&m).expect("a member");
                *d -= 1;
                if *d == 0 {
                    queue.push_back(m);
                }
            }
        }
        if order.len() == members.len() {
            return Some(order);
        }
        let done: HashSet<usize> = order.iter().copied().collect();
        let stuck: Vec<&str> = members
            .iter()
            .filter(|n| !done.contains(n))
            .map(|&n| self.nodes[n].id.as_str())
            .collect();
        let at = self.scopes[scope]
            .edges
            .iter()
            .position(|e| matches!((e.from, e.to), (End::Node(a, _), End::Node(b, _)) if !done.contains(&a) && !done.contains(&b)))
            .map(|e| edge_ptrs[e].clone())
            .unwrap_or_default();
        let names = stuck
            .iter()
            .take(8)
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        self.error(
            Code::CycleOutsideLoop,
            at,
            format!("nodes {names} form a cycle; repeat work with a loop node and a bound (maxIterations), never with edges"),
        );
        None
    }

    /// A node can run only if every input has an edge from something that can run; the body's
    /// outputs must all be filled for it to complete.
    fn reachability(&mut self, scope: usize, order: &[usize], io_ptr: &str) {
        let mut can_run: HashSet<usize> = HashSet::new();
        for &n in order {
            let mut why = None;
            for (j, fed) in self.nodes[n].fed_by.iter().enumerate() {
                match fed.map(|e| self.scopes[scope].edges[e].from) {
                    None => {
                        why = Some(format!(
                            "its input {:?} has no edge",
                            self.nodes[n].inputs[j].name
                        ));
                        break;
                    }
                    Some(End::Node(m, _)) if !can_run.contains(&m) => {
                        why = Some(format!(
                            "it waits on node {:?}, which can never run",
                            self.nodes[m].id
                        ));
                        break;
                    }
                    Some(_) => {}
                }
            }
            match why {
                None => {
                    can_run.insert(n);
                }
                Some(why) => {
                    let (p, id) = (self.nodes[n].pointer.clone(), self.nodes[n].id.clone());
                    self.error(
                        Code::UnreachableNode,
                        p,
                        format!("node {id:?} can never run: {why}"),
                    );
                }
            }
        }
        for j in 0..self.scopes[scope].outputs.len() {
            if self.scopes[scope].output_fed_by[j].is_none() {
                let name = self.scopes[scope].outputs[j].name.clone();
                self.error(
                    Code::OutputNotConnected,
                    format!("{io_ptr}/outputs/{j}"),
                    format!(
                        "output {name:?} has no edge filling it, so the body could never complete"
                    ),
                );
            }
        }
    }

    /// Everything a node (and, for a container, its whole body) may change: normalised
    /// entries, sorted, without repeats. Computed once per node (a container's from its body's
    /// members, which are compiled before it).
    fn effective_scope(&mut self, n: usize) -> std::rc::Rc<Vec<String>> {
        if let Some(Some(s)) = self.effective.get(n) {
            return std::rc::Rc::clone(s);
        }
        let mut out = self.nodes[n].write_scope.clone();
        if let Some(body) = self.nodes[n].spec.body() {
            if body != usize::MAX {
                let members = self.scopes[body].nodes.clone();
                for m in members {
                    out.extend(self.effective_scope(m).iter().cloned());
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        let out = std::rc::Rc::new(out);
        if self.effective.len() <= n {
            self.effective.resize(n + 1, None);
        }
        self.effective[n] = Some(std::rc::Rc::clone(&out));
        out
    }

    /// Nodes of one body that can run at the same time (neither waits on the other) must not
    /// have overlapping write scopes. Iterations of a loop run one after another.
    ///
    /// Near-linear: "waits on" is a bitset per node over the body's scoped nodes, built in one
    /// pass over the topological order each way (so a chain costs edges × scoped / 64 words,
    /// not a search per pair); overlap is a walk of a path trie of the entries, where an entry
    /// overlaps exactly the entries on its path from the root (equal or a `/`-prefix; `*` sits
    /// at the root) and the entries below it — so every overlapping pair is seen from the side
    /// of its deeper entry, with one word-wise AND per entry against the union of the owners on
    /// its path. Each node is reported at most once (at the later node of the first clash
    /// found), so the errors are at most the scoped nodes, whatever the number of pairs.
    fn write_scopes(&mut self, scope: usize, order: &[usize]) {
        let scoped: Vec<(usize, std::rc::Rc<Vec<String>>)> = order
            .iter()
            .map(|&n| (n, self.effective_scope(n)))
            .filter(|(_, s)| !s.is_empty())
            .collect();
        let k = scoped.len();
        if k < 2 {
            return;
        }
        // Positions in the topological order, and the scoped index of each member.
        let pos: HashMap<usize, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
        let mut sidx = vec![usize::MAX; order.len()];
        for (s, (n, _)) in scoped.iter().enumerate() {
            sidx[pos[n]] = s;
        }
        let mut succ: Vec<Vec<usize>> = vec![Vec::new(); order.len()];
        for e in &self.scopes[scope].edges {
            if let (End::Node(a, _), End::Node(b, _)) = (e.from, e.to) {
                if let (Some(&a), Some(&b)) = (pos.get(&a), pos.get(&b)) {
                    succ[a].push(b);
                }
            }
        }
        // comparable[s]: the scoped nodes s waits on, or that wait on s, and s itself.
        let w = k.div_ceil(64);
        let mut desc = Bitsets::new(order.len(), w);
        for i in (0..order.len()).rev() {
            for &j in &succ[i] {
                desc.or_row(i, j);
                if sidx[j] != usize::MAX {
                    desc.set(i, sidx[j]);
                }
            }
        }
        let mut comparable = Bitsets::new(k, w);
        for (i, &s) in sidx.iter().enumerate() {
            if s != usize::MAX {
                comparable.copy_row_from(s, &desc, i);
                comparable.set(s, s);
            }
        }
        drop(desc);
        let mut anc = Bitsets::new(order.len(), w);
        for i in 0..order.len() {
            if sidx[i] != usize::MAX {
                comparable.or_row_from(sidx[i], &anc, i);
            }
            for &j in &succ[i] {
                anc.or_row(j, i);
                if sidx[i] != usize::MAX {
                    anc.set(j, sidx[i]);
                }
            }
        }
        drop(anc);
        // The trie: node 0 is the root (where `*` lives); children by segment.
        let mut trie = Trie::default();
        for (s, (_, entries)) in scoped.iter().enumerate() {
            for (j, entry) in entries.iter().enumerate() {
                let t = trie.insert(entry);
                trie.owners[t].push((s as u32, j as u32));
            }
        }
        // Depth-first, children in segment order (so the verdict and the messages are the same
        // on every run); `path` is the union of the owners from the root to the current node.
        let mut done = vec![false; k];
        let mut clashes: Vec<(usize, usize, u32)> = Vec::new();
        let mut path: Vec<Vec<u64>> = vec![vec![0u64; w]];
        let mut stack: Vec<(u32, bool)> = vec![(0, false)];
        while let Some((t, visited)) = stack.pop() {
            let t = t as usize;
            if visited {
                if !trie.owners[t].is_empty() {
                    path.pop();
                }
                continue;
            }
            stack.push((t as u32, true));
            if !trie.owners[t].is_empty() {
                let mut here = path[path.len() - 1].clone();
                for &(s, _) in &trie.owners[t] {
                    here[s as usize / 64] |= 1 << (s % 64);
                }
                for &(s, j) in &trie.owners[t] {
                    let s = s as usize;
                    if done[s] {
                        continue;
                    }
                    let row = comparable.row(s);
                    if let Some(y) = first_outside(&here, row) {
                        done[s] = true;
                        clashes.push((s, y, j));
                    }
                }
                path.push(here);
            }
            let mut children = std::mem::take(&mut trie.children[t]);
            children.sort_unstable_by(|a, b| b.0.cmp(a.0));
            for (_, c) in &children {
                stack.push((*c, false));
            }
        }
        // One error per node, at the later node of its clash, in topological order.
        let mut reported = vec![false; k];
        let mut errors: Vec<(usize, usize, usize, u32)> = Vec::new();
        for (x, y, j) in clashes {
            let (early, late) = if x < y { (x, y) } else { (y, x) };
            if !reported[late] {
                reported[late] = true;
                errors.push((late, early, x, j));
            }
        }
        errors.sort_unstable();
        let room = MAX_ERRORS.saturating_sub(self.errors.len());
        if errors.len() > room {
            self.dropped += errors.len() - room;
            errors.truncate(room);
        }
        for (late, early, x, j) in errors {
            let entry_x = scoped[x].1[j as usize].as_str();
            let other = if x == late { early } else { late };
            let entry_o = scoped[other]
                .1
                .iter()
                .find(|e| overlaps(e, entry_x))
                .map_or("*", String::as_str);
            let (ea, eb) = if x == early {
                (entry_x, entry_o)
            } else {
                (entry_o, entry_x)
            };
            let (a, b) = (scoped[early].0, scoped[late].0);
            let p = self.nodes[b].pointer.clone();
            let at = if self.nodes[b].write_scope.is_empty() {
                p
            } else {
                format!("{p}/writeScope")
            };
            let (an, bn) = (self.nodes[a].id.clone(), self.nodes[b].id.clone());
            self.error(
                Code::WriteScopeOverlap,
                at,
                format!("nodes {an:?} ({ea:?}) and {bn:?} ({eb:?}) can run at the same time and may change the same thing; order them with an edge or narrow their write scopes"),
            );
        }
    }
}

/// Rows of bits, one row per node, `w` words each, in one allocation.
struct Bitsets {
    w: usize,
    bits: Vec<u64>,
}

impl Bitsets {
    fn new(rows: usize, w: usize) -> Self {
        Bitsets {
            w,
            bits: vec![0; rows * w],
        }
    }

    fn row(&self, r: usize) -> &[u64] {
        &self.bits[r * self.w..(r + 1) * self.w]
    }

    fn set(&mut self, r: usize, bit: usize) {
        self.bits[r * self.w + bit / 64] |= 1 << (bit % 64);
    }

    /// row `r` |= row `from` (of the same set).
    fn or_row(&mut self, r: usize, from: usize) {
        if r == from {
            return;
        }
        let w = self.w;
        let (dst, src) = if r < from {
            let (a, b) = self.bits.split_at_mut(from * w);
            (&mut a[r * w..(r + 1) * w], &b[..w])
        } else {
            let (a, b) = self.bits.split_at_mut(r * w);
            (&mut b[..w], &a[from * w..(from + 1) * w])
        };
        for (d, s) in dst.iter_mut().zip(src) {
            *d |= *s;
        }
    }

    fn copy_row_from(&mut self, r: usize, other: &Bitsets, from: usize) {
        let w = self.w;
        self.bits[r * w..(r + 1) * w].copy_from_slice(other.row(from));
    }

    fn or_row_from(&mut self, r: usize, other: &Bitsets, from: usize) {
        let w = self.w;
        for (d, s) in self.bits[r * w..(r + 1) * w]
            .iter_mut()
            .zip(other.row(from))
        {
            *d |= *s;
        }
    }
}

/// The lowest bit set in `set` and not in `exclude`.
fn first_outside(set: &[u64], exclude: &[u64]) -> Option<usize> {
    set.iter().zip(exclude).enumerate().find_map(|(i, (s, e))| {
        let left = s & !e;
        (left != 0).then(|| i * 64 + left.trailing_zeros() as usize)
    })
}

/// A trie of write-scope entries by path segment; `*` is the root itself, an absolute path's
/// first segment is `/`.
struct Trie<'a> {
    edges: HashMap<(u32, &'a str), u32>,
    children: Vec<Vec<(&'a str, u32)>>,
    /// (scoped node, index of its entry) per trie node.
    owners: Vec<Vec<(u32, u32)>>,
}

impl Default for Trie<'_> {
    fn default() -> Self {
        Trie {
            edges: HashMap::new(),
            children: vec![Vec::new()],
            owners: vec![Vec::new()],
        }
    }
}

impl<'a> Trie<'a> {
    fn insert(&mut self, entry: &'a str) -> usize {
        if entry == "*" {
            return 0;
        }
        let (first, rest) = match entry.strip_prefix('/') {
            Some(rest) => (Some("/"), rest),
            None => (None, entry),
        };
        let rest = (!rest.is_empty()).then_some(rest);
        let segments = first
            .into_iter()
            .chain(rest.into_iter().flat_map(|r| r.split('/')));
        let mut t = 0u32;
        for seg in segments {
            let next = self.children.len() as u32;
            let c = *self.edges.entry((t, seg)).or_insert(next);
            if c == next {
                self.children.push(Vec::new());
                self.owners.push(Vec::new());
                self.children[t as usize].push((seg, c));
            }
            t = c;
        }
        t as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_scope_entries_overlap_on_path_boundaries_only() {
        assert!(overlaps("src", "src/a.rs"));
        assert!(overlaps("src/a.rs", "src"));
        assert!(overlaps("db:users", "db:users"));
        assert!(!overlaps("src", "srcx"));
        assert!(!overlaps("src/a", "src/b"));
        assert!(overlaps("*", "anything"));
        assert!(overlaps("/", "/etc"));
        assert_eq!(normalize_scope("./src/").unwrap(), "src");
        assert!(normalize_scope("a/../b").is_err());
        assert!(normalize_scope("./").is_err());
    }

    #[test]
    fn grants_match_exactly_by_prefix_wildcard_or_everything() {
        let g = vec!["agent".to_string(), "tool:fs.*".to_string()];
        assert!(granted(&g, "agent"));
        assert!(granted(&g, "tool:fs.write"));
        assert!(!granted(&g, "tool:run_command"));
        assert!(granted(&["*".to_string()], "tool:x"));
        assert!(!granted(&[], "agent"));
    }
}
