//! Inlining subgraph bodies: the names a subgraph reads from outside (its captures), and a
//! body's nodes copied into the graph under a prefix, reading from a scope (what `If`
//! branches, unrolled `Scan`/`Loop` iterations and attention modifiers share).

use super::{Graph, Node, Value, ValueId, decode_error};
use crate::error::{CompileError, ErrorKind, Result};
use crate::onnx::{AttributeProto, GraphProto, NodeProto};
use crate::tensor::HostTensor;
use nrt_hal::DType;
use std::collections::HashMap;
use std::rc::Rc;

/// The subgraph attribute `name` of node `n`, decoded.
pub(crate) fn subgraph(a: &AttributeProto) -> Result<GraphProto> {
    use prost::Message;
    GraphProto::decode(a.g.as_deref().unwrap_or_default()).map_err(decode_error)
}

/// The names a subgraph reads from outside itself (its own nested subgraphs included).
fn free_names(gp: &GraphProto, out: &mut Vec<String>) -> Result<()> {
    let mut local: std::collections::HashSet<&str> = gp
        .initializer
        .iter()
        .map(|t| t.name.as_str())
        .chain(gp.input.iter().map(|i| i.name.as_str()))
        .collect();
    for n in &gp.node {
        let mut reads: Vec<String> = n.input.clone();
        for a in n.attribute.iter().filter(|a| a.g.is_some()) {
            free_names(&subgraph(a)?, &mut reads)?;
        }
        for i in reads {
            if !i.is_empty() && !local.contains(i.as_str()) && !out.contains(&i) {
                out.push(i);
            }
        }
        local.extend(n.output.iter().map(|o| o.as_str()));
    }
    Ok(())
}

/// The outer names the subgraphs of node attributes `attrs` read, in a fixed order.
pub(crate) fn captured(attrs: &[AttributeProto]) -> Result<Vec<String>> {
    let mut free = Vec::new();
    for a in attrs.iter().filter(|a| a.g.is_some()) {
        free_names(&subgraph(a)?, &mut free)?;
    }
    Ok(free)
}

/// The operators whose subgraph attributes the compiler inlines.
pub(super) fn holds_subgraphs(op: &str) -> bool {
    matches!(op, "If" | "Scan" | "Loop" | "FlexAttention")
}

/// Whether the compiler reads operators of domain `domain` as `op`: the default domain, and
/// `FlexAttention` of `ai.onnx.preview` (opset 1), and the project's own `ai.nrt` operators
/// (`Sample`, `MatMulBlockQuant`, `GatherBlockQuant`, `CachedAttention`).
pub(crate) fn domain_supported(domain: &str, op: &str) -> bool {
    domain.is_empty()
        || domain == "ai.onnx"
        || (domain == "ai.onnx.preview" && op == "FlexAttention")
        || (domain == crate::ops::SAMPLE_DOMAIN
            && matches!(
                op,
                "Sample" | "MatMulBlockQuant" | "GatherBlockQuant" | "CachedAttention"
            ))
}

/// Node `n` with, for an `If`, the outer values its branches read ([`captured`]) appended
/// to its inputs after the condition; for a `Scan`, a `Loop` or a `FlexAttention`, after its
/// own inputs.
pub(super) fn with_captures(n: &NodeProto) -> Result<NodeProto> {
    let mut n = n.clone();
    if n.op_type == "If" {
        n.input.truncate(1);
        n.input.extend(captured(&n.attribute)?);
    } else if matches!(n.op_type.as_str(), "Scan" | "Loop" | "FlexAttention") {
        n.input.extend(captured(&n.attribute)?);
    }
    Ok(n)
}

/// One node of an inlined body (an If branch, a Scan iteration): its name under `prefix`
/// (named after its first output when unnamed), checked (the default domain; no subgraph
/// or function reference but those `holds_subgraphs` allows), its captured outer names
/// made inputs, and its input ids looked up in `scope`.
fn body_node(
    bn: &NodeProto,
    i: usize,
    prefix: &str,
    scope: &HashMap<String, ValueId>,
) -> Result<(String, NodeProto, Vec<Option<ValueId>>)> {
    let name = format!(
        "{prefix}{}",
        if bn.name.is_empty() {
            bn.output
                .first()
                .cloned()
                .unwrap_or_else(|| format!("#{i}"))
        } else {
            bn.name.clone()
        }
    );
    let err_here = |kind, msg: String| CompileError::new(kind, msg).at_node(&name, &bn.op_type);
    if !domain_supported(&bn.domain, &bn.op_type) {
        return Err(err_here(
            ErrorKind::UnsupportedOp,
            format!("operator domain '{}' is not supported", bn.domain),
        ));
    }
    for a in &bn.attribute {
        if !a.ref_attr_name.is_empty() || (a.g.is_some() && !holds_subgraphs(&bn.op_type)) {
            return Err(err_here(
                ErrorKind::UnsupportedOp,
                format!(
                    "attribute '{}' holds a subgraph or function reference",
                    a.name
                ),
            ));
        }
    }
    let bn = with_captures(bn)?;
    let mut inputs = Vec::with_capacity(bn.input.len());
    for s in &bn.input {
        if s.is_empty() {
            inputs.push(None);
            continue;
        }
        let id = scope.get(s).copied().ok_or_else(|| {
            err_here(
                ErrorKind::DanglingEdge,
                format!("input '{s}' is produced by nothing in scope"),
            )
        })?;
        inputs.push(Some(id));
    }
    Ok((name, bn, inputs))
}
/// `Identity(src) → dst`, named `name`: how an unrolled or inlined body writes a value the
/// graph already names (an output, a final state).
pub(super) fn identity(name: String, src: ValueId, dst: ValueId) -> Node {
    Node {
        name,
        op: "Identity".into(),
        inputs: vec![Some(src)],
        outputs: vec![Some(dst)],
        attrs: Vec::new(),
        guard: None,
    }
}

/// The nodes of subgraph `gp` (an If branch, a loop iteration, an attention modifier)
/// inlined under `prefix`: its initializers become constants, its nodes read their inputs
/// from `scope` (the body's inputs and the outer values it captures, bound by the caller)
/// and write new values named `<prefix><name>`. Output `k` is written into `targets[k]`
/// when that is `Some` (through an `Identity` when no body node produces it: an outer value
/// or a body input passed through). Returns the nodes and each output's value.
pub(crate) fn inline_body(
    g: &mut Graph,
    gp: &GraphProto,
    prefix: &str,
    mut scope: HashMap<String, ValueId>,
    targets: &[Option<ValueId>],
) -> Result<(Vec<Node>, Vec<ValueId>)> {
    for t in &gp.initializer {
        let h = HostTensor::from_proto(t, None)?;
        let id = g.values.len();
        g.values.push(Value {
            name: format!("{prefix}{}", t.name),
            dtype: h.dtype,
            shape: h.shape.clone(),
            konst: Some(Rc::new(h)),
        });
        scope.insert(t.name.clone(), id);
    }
    let out_index: HashMap<&str, usize> = gp
        .output
        .iter()
        .enumerate()
        .map(|(i, o)| (o.name.as_str(), i))
        .collect();
    let target = |k: usize| targets.get(k).copied().flatten();
    let mut new_nodes = Vec::new();
    for (i, bn) in gp.node.iter().enumerate() {
        let (name, bn, inputs) = body_node(bn, i, prefix, &scope)?;
        let mut outputs = Vec::new();
        for o in &bn.output {
            if o.is_empty() {
                outputs.push(None);
                continue;
            }
            let id = match out_index.get(o.as_str()).and_then(|&k| target(k)) {
                Some(id) => id,
                None => {
                    g.values.push(Value {
                        name: format!("{prefix}{o}"),
                        dtype: DType::F32,
                        shape: Vec::new(),
                        konst: None,
                    });
                    g.values.len() - 1
                }
            };
            scope.insert(o.clone(), id);
            outputs.push(Some(id));
        }
        new_nodes.push(Node {
            name,
            op: bn.op_type.clone(),
            inputs,
            outputs,
            attrs: bn.attribute.clone(),
            guard: None,
        });
    }
    let mut results = Vec::with_capacity(gp.output.len());
    for (k, o) in gp.output.iter().enumerate() {
        let src = scope.get(&o.name).copied().ok_or_else(|| {
            CompileError::new(
                ErrorKind::DanglingEdge,
                format!("body output '{}' is produced by nothing", o.name),
            )
        })?;
        let Some(t) = target(k) else {
            results.push(src);
            continue;
        };
        if src != t {
            new_nodes.push(identity(format!("{prefix}{}#out{k}", o.name), src, t));
        }
        results.push(t);
    }
    Ok((new_nodes, results))
}
