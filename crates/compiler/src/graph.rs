//! The compiler's graph: values with static shapes (and constant contents where known) and
//! nodes in topological order, built from an ONNX `ModelProto`.
//!
//! Import binds symbolic input dimensions from the caller's `input_shapes`, turns inputs
//! named in `input_values` into constants, sorts the nodes, and rejects dangling edges. Shape
//! inference and constant folding ([`crate::infer`]) then fill in every value.

use crate::CompileOptions;
use crate::error::{CompileError, ErrorKind, Result, err};
use crate::onnx::{AttributeProto, GraphProto, ModelProto, NodeProto, attribute_type as at};
use crate::tensor::{HostTensor, budget, dtype_from_onnx, onnx_type_name};
use nrt_hal::DType;
use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;

/// Index of a value in [`Graph::values`].
pub type ValueId = usize;

/// A tensor-valued edge of the graph.
#[derive(Clone, Debug)]
pub struct Value {
    /// ONNX name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Static shape.
    pub shape: Vec<usize>,
    /// Contents, when known at compile time (initializers, folded values, specialized inputs).
    pub konst: Option<Rc<HostTensor>>,
}

impl Value {
    /// Number of elements.
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.elements() * self.dtype.size()
    }
}

/// An operator application.
#[derive(Clone, Debug)]
pub struct Node {
    /// Name (the first output's name when the model leaves it empty).
    pub name: String,
    /// Operator type.
    pub op: String,
    /// Inputs (`None`: an omitted optional input).
    pub inputs: Vec<Option<ValueId>>,
    /// Outputs (`None`: an omitted optional output).
    pub outputs: Vec<Option<ValueId>>,
    /// Attributes.
    pub attrs: Vec<AttributeProto>,
}

/// A whole model.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    /// Graph name.
    pub name: String,
    /// Every value.
    pub values: Vec<Value>,
    /// Nodes in topological order.
    pub nodes: Vec<Node>,
    /// Runtime inputs (not specialized, not initializers), in model order.
    pub inputs: Vec<ValueId>,
    /// Outputs, in model order.
    pub outputs: Vec<ValueId>,
    /// Version of the default-domain operator set.
    pub opset: i64,
    /// Inputs the caller's `input_values` turned into constants.
    pub specialized: Vec<String>,
    /// Values whose extent depends on the data (NonZero, Unique, NonMaxSuppression): their
    /// `shape` is a static upper bound, the device writes the actual shape into the
    /// companion output `<name>:shape`. Only graph outputs may be such values.
    pub bounded: std::collections::BTreeSet<ValueId>,
}

/// Lowest and highest default-domain opset accepted. Opsets 23–25 only extend the types of
/// the operators we support, so their semantics are those of 22; opset 26 only adds
/// operators (BitCast, CumProd) and 27 adds operators and float16/bfloat16 to Range (checked
/// against onnx 1.22's schema history: no supported operator changed meaning). Below 7, only
/// operators whose semantics did not change are accepted (legacy attributes such as
/// `broadcast` or `consumed_inputs` are rejected by name).
pub const OPSET_RANGE: (i64, i64) = (1, 27);

impl Node {
    fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.attrs.iter().find(|a| a.name == name)
    }

    fn bad(&self, msg: String) -> CompileError {
        CompileError::new(ErrorKind::BadAttribute, msg).at_node(&self.name, &self.op)
    }

    fn typed(&self, name: &str, want: i32) -> Result<Option<&AttributeProto>> {
        match self.attr(name) {
            None => Ok(None),
            Some(a) if a.r#type == want || a.r#type == at::UNDEFINED => Ok(Some(a)),
            Some(a) => Err(self.bad(format!(
                "attribute '{name}' has type {} where {} is expected",
                a.r#type, want
            ))),
        }
    }

    /// Integer attribute.
    pub fn attr_i(&self, name: &str, default: i64) -> Result<i64> {
        Ok(self.typed(name, at::INT)?.map_or(default, |a| a.i))
    }

    /// Whether an attribute is present.
    pub fn has_attr(&self, name: &str) -> bool {
        self.attr(name).is_some()
    }

    /// Float attribute.
    pub fn attr_f(&self, name: &str, default: f32) -> Result<f32> {
        Ok(self.typed(name, at::FLOAT)?.map_or(default, |a| a.f))
    }

    /// Integer-list attribute.
    pub fn attr_ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        Ok(self.typed(name, at::INTS)?.map(|a| a.ints.clone()))
    }

    /// Float-list attribute.
    pub fn attr_floats(&self, name: &str) -> Result<Option<Vec<f32>>> {
        Ok(self.typed(name, at::FLOATS)?.map(|a| a.floats.clone()))
    }

    /// String attribute.
    pub fn attr_s(&self, name: &str, default: &str) -> Result<String> {
        match self.typed(name, at::STRING)? {
            None => Ok(default.to_owned()),
            Some(a) => String::from_utf8(a.s.clone())
                .map_err(|_| self.bad(format!("attribute '{name}' is not UTF-8"))),
        }
    }

    /// String-list attribute.
    pub fn attr_strings(&self, name: &str) -> Result<Option<Vec<String>>> {
        match self.typed(name, at::STRINGS)? {
            None => Ok(None),
            Some(a) => a
                .strings
                .iter()
                .map(|s| {
                    String::from_utf8(s.clone())
                        .map_err(|_| self.bad(format!("attribute '{name}' is not UTF-8")))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
        }
    }

    /// Tensor attribute.
    pub fn attr_t(&self, name: &str) -> Result<Option<HostTensor>> {
        match self.typed(name, at::TENSOR)? {
            None => Ok(None),
            Some(a) => match &a.t {
                None => Err(self.bad(format!("attribute '{name}' holds no tensor"))),
                Some(t) => HostTensor::from_proto(t, None)
                    .map(Some)
                    .map_err(|e| e.at_node(&self.name, &self.op)),
            },
        }
    }

    /// An error of `kind` about this node.
    pub fn error(&self, kind: ErrorKind, msg: impl Into<String>) -> CompileError {
        CompileError::new(kind, msg).at_node(&self.name, &self.op)
    }
}

fn decode_error(e: impl core::fmt::Display) -> CompileError {
    CompileError::new(
        ErrorKind::Decode,
        format!("not a valid ONNX model (truncated or corrupt?): {e}"),
    )
}

/// Reads an ONNX model into a graph (shapes of inputs bound; node outputs not yet inferred).
pub fn import(bytes: &[u8], model_dir: Option<&Path>, opts: &CompileOptions) -> Result<Graph> {
    let model: ModelProto = crate::onnx::decode_model(bytes).map_err(decode_error)?;
    let Some(gp) = model.graph else {
        return Err(decode_error("the model has no graph"));
    };
    let mut opset = None;
    for o in &model.opset_import {
        if o.domain.is_empty() || o.domain == "ai.onnx" {
            opset = Some(o.version);
        }
    }
    let opset = match opset {
        Some(v) => v,
        None if model.opset_import.is_empty() && model.ir_version < 3 => 1,
        None => {
            return err(
                ErrorKind::UnsupportedOp,
                "the model imports no version of the default ONNX operator set",
            );
        }
    };
    if opset < OPSET_RANGE.0 || opset > OPSET_RANGE.1 {
        return err(
            ErrorKind::UnsupportedOp,
            format!(
                "opset {opset} of the default domain is outside the supported range {}..={}",
                OPSET_RANGE.0, OPSET_RANGE.1
            ),
        );
    }
    if !gp.sparse_initializer.is_empty() {
        return err(
            ErrorKind::UnsupportedOp,
            "sparse initializers are not supported",
        );
    }
    let mut g = Graph {
        name: gp.name.clone(),
        opset,
        ..Default::default()
    };
    let mut by_name: HashMap<String, ValueId> = HashMap::new();
    for t in &gp.initializer {
        let h = HostTensor::from_proto(t, model_dir).map_err(|mut e| {
            e.message = format!("initializer: {}", e.message);
            e
        })?;
        let id = g.values.len();
        g.values.push(Value {
            name: t.name.clone(),
            dtype: h.dtype,
            shape: h.shape.clone(),
            konst: Some(Rc::new(h)),
        });
        by_name.insert(t.name.clone(), id);
    }
    for name in opts.input_shapes.keys().chain(opts.input_values.keys()) {
        if !gp.input.iter().any(|i| &i.name == name) {
            return err(
                ErrorKind::BadOption,
                format!("the model has no input named '{name}'"),
            );
        }
    }
    for vi in &gp.input {
        if by_name.contains_key(&vi.name) {
            continue; // an initializer listed as an input (IR < 4): a constant
        }
        let name = &vi.name;
        let tt = vi
            .r#type
            .as_ref()
            .and_then(|t| t.tensor_type.as_ref())
            .ok_or_else(|| {
                CompileError::new(
                    ErrorKind::UnsupportedDType,
                    format!("input '{name}' is not a tensor"),
                )
            })?;
        let dtype = dtype_from_onnx(tt.elem_type).ok_or_else(|| {
            CompileError::new(
                ErrorKind::UnsupportedDType,
                format!(
                    "input '{name}' has element type {}",
                    onnx_type_name(tt.elem_type)
                ),
            )
        })?;
        let declared = tt.shape.as_ref().map(|s| &s.dim);
        let user = opts.input_shapes.get(name);
        let given = opts.input_values.get(name);
        let mut shape = Vec::new();
        if let Some(dims) = declared {
            if let Some(u) = user
                .map(|u| u.as_slice())
                .or(given.map(|t| t.shape.as_slice()))
                && u.len() != dims.len()
            {
                return err(
                    ErrorKind::ShapeMismatch,
                    format!(
                        "input '{name}' has rank {} but the given shape {u:?} has rank {}",
                        dims.len(),
                        u.len()
                    ),
                );
            }
            for (i, d) in dims.iter().enumerate() {
                let from_user = user.map(|u| u[i]).or(given.map(|t| t.shape[i]));
                // `-1` is a common exporter habit for "unknown" (ONNX Runtime reads it so):
                // the same as a `dim_param`.
                let value = d.dim_value.filter(|&v| v != -1);
                match (value, from_user) {
                    (Some(v), _) if v < 0 => {
                        return err(
                            ErrorKind::BadShape,
                            format!("input '{name}' declares negative dimension {v} at axis {i}"),
                        );
                    }
                    (Some(v), Some(u)) if v as usize != u => {
                        return err(
                            ErrorKind::ShapeMismatch,
                            format!(
                                "input '{name}' declares size {v} at axis {i}; the given shape has {u}"
                            ),
                        );
                    }
                    (Some(v), _) => shape.push(v as usize),
                    (None, Some(u)) => shape.push(u),
                    (None, None) => {
                        let what = match (&d.dim_param, d.dim_value) {
                            (Some(p), _) if !p.is_empty() => format!("symbolic dimension '{p}'"),
                            (_, Some(-1)) => "unknown dimension -1".to_owned(),
                            _ => "an unnamed symbolic dimension".to_owned(),
                        };
                        let rank = dims.len();
                        return err(
                            ErrorKind::BadShape,
                            format!(
                                "input '{name}' has {what} at axis {i} (of {rank}): fix its shape with input_shapes / `--input-shape {name}=D,D,..`, or give an input file (`nrt run --input {name}=FILE`)"
                            ),
                        );
                    }
                }
            }
        } else if let Some(u) = user.or(given.map(|t| &t.shape)) {
            shape = u.clone();
        } else {
            return err(
                ErrorKind::BadShape,
                format!("input '{name}' has no declared shape: give it with input_shapes"),
            );
        }
        // The compiler's size budget (D7): `[2^31, 2^31, 2^31]` wrapped to 0 elements.
        budget(&format!("input '{name}'"), &shape, dtype)?;
        let id = g.values.len();
        let konst = match given {
            Some(t) => {
                if t.shape != shape {
                    return err(
                        ErrorKind::ShapeMismatch,
                        format!(
                            "the value given for input '{name}' has shape {:?}, expected {shape:?}",
                            t.shape
                        ),
                    );
                }
                g.specialized.push(name.clone());
                Some(Rc::new(t.cast(dtype)))
            }
            None => None,
        };
        if konst.is_none() {
            g.inputs.push(id);
        }
        g.values.push(Value {
            name: name.clone(),
            dtype,
            shape,
            konst,
        });
        by_name.insert(name.clone(), id);
    }

    // An `If` also reads the outer values its branches use (captured): they become extra
    // inputs after the condition, so that the sort orders their producers first.
    let nodes: Vec<NodeProto> = gp.node.iter().map(with_captures).collect::<Result<_>>()?;
    let nodes = &nodes;
    // Topological order (Kahn), keeping the model's order among ready nodes.
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        for o in &n.output {
            if !o.is_empty() {
                producer.insert(o.as_str(), i);
            }
        }
    }
    let node_name = |i: usize| {
        let n = &nodes[i];
        if !n.name.is_empty() {
            n.name.clone()
        } else {
            n.output.first().cloned().unwrap_or_else(|| format!("#{i}"))
        }
    };
    let mut deps: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    let mut pending = vec![0usize; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        for inp in n.input.iter().filter(|s| !s.is_empty()) {
            if by_name.contains_key(inp) {
                continue;
            }
            match producer.get(inp.as_str()) {
                Some(&p) => {
                    deps[p].push(i);
                    pending[i] += 1;
                }
                None => {
                    return Err(CompileError::new(
                        ErrorKind::DanglingEdge,
                        format!("input '{inp}' is produced by no node, initializer or graph input"),
                    )
                    .at_node(&node_name(i), &n.op_type));
                }
            }
        }
    }
    let mut order = Vec::with_capacity(nodes.len());
    let mut ready: std::collections::BTreeSet<usize> =
        (0..nodes.len()).filter(|&i| pending[i] == 0).collect();
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &d in &deps[i] {
            pending[d] -= 1;
            if pending[d] == 0 {
                ready.insert(d);
            }
        }
    }
    if order.len() != nodes.len() {
        let i = (0..nodes.len()).find(|&i| pending[i] > 0).unwrap_or(0);
        return Err(CompileError::new(
            ErrorKind::DanglingEdge,
            "the graph has a cycle through this node",
        )
        .at_node(&node_name(i), &nodes[i].op_type));
    }
    for i in order {
        let n = &nodes[i];
        let name = node_name(i);
        if !domain_supported(&n.domain, &n.op_type) {
            return Err(CompileError::new(
                ErrorKind::UnsupportedOp,
                format!("operator domain '{}' is not supported", n.domain),
            )
            .at_node(&name, &n.op_type));
        }
        for a in &n.attribute {
            if opset < 7 && matches!(a.name.as_str(), "broadcast" | "consumed_inputs") {
                return Err(CompileError::new(
                    ErrorKind::UnsupportedOp,
                    format!(
                        "legacy attribute '{}' (opset {opset}) is not supported",
                        a.name
                    ),
                )
                .at_node(&name, &n.op_type));
            }
            if !a.ref_attr_name.is_empty() || (a.g.is_some() && !holds_subgraphs(&n.op_type)) {
                return Err(CompileError::new(
                    ErrorKind::UnsupportedOp,
                    format!(
                        "attribute '{}' holds a subgraph or function reference",
                        a.name
                    ),
                )
                .at_node(&name, &n.op_type));
            }
        }
        let inputs = n
            .input
            .iter()
            .map(|s| {
                if s.is_empty() {
                    None
                } else {
                    by_name.get(s).copied()
                }
            })
            .collect();
        let mut outputs = Vec::new();
        for o in &n.output {
            if o.is_empty() {
                outputs.push(None);
                continue;
            }
            if by_name.contains_key(o) {
                return Err(CompileError::new(
                    ErrorKind::DanglingEdge,
                    format!("value '{o}' is produced twice"),
                )
                .at_node(&name, &n.op_type));
            }
            let id = g.values.len();
            g.values.push(Value {
                name: o.clone(),
                dtype: DType::F32,
                shape: Vec::new(),
                konst: None,
            });
            by_name.insert(o.clone(), id);
            outputs.push(Some(id));
        }
        g.nodes.push(Node {
            name,
            op: n.op_type.clone(),
            inputs,
            outputs,
            attrs: n.attribute.clone(),
        });
    }
    for vi in &gp.output {
        let id = *by_name.get(&vi.name).ok_or_else(|| {
            CompileError::new(
                ErrorKind::DanglingEdge,
                format!("graph output '{}' is produced by nothing", vi.name),
            )
        })?;
        g.outputs.push(id);
    }
    if g.outputs.is_empty() {
        return err(ErrorKind::BadShape, "the graph has no outputs");
    }
    Ok(g)
}

/// The runtime graph inputs value `v` depends on, in model order: its producers walked
/// back to the graph's inputs (what a caller must give with `input_values` for `v` to be
/// known at compile time).
pub(crate) fn input_deps(g: &Graph, v: ValueId) -> Vec<String> {
    let mut producer: HashMap<ValueId, usize> = HashMap::new();
    for (i, n) in g.nodes.iter().enumerate() {
        for o in n.outputs.iter().flatten() {
            producer.insert(*o, i);
        }
    }
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![v];
    let mut found = std::collections::HashSet::new();
    while let Some(x) = stack.pop() {
        if !seen.insert(x) || g.values[x].konst.is_some() {
            continue;
        }
        if g.inputs.contains(&x) {
            found.insert(x);
        } else if let Some(&p) = producer.get(&x) {
            stack.extend(g.nodes[p].inputs.iter().flatten().copied());
        }
    }
    g.inputs
        .iter()
        .filter(|i| found.contains(i))
        .map(|&i| g.values[i].name.clone())
        .collect()
}

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
fn holds_subgraphs(op: &str) -> bool {
    matches!(op, "If" | "Scan" | "Loop" | "FlexAttention")
}

/// Whether the compiler reads operators of domain `domain` as `op`: the default domain, and
/// `FlexAttention` of `ai.onnx.preview` (opset 1).
pub(crate) fn domain_supported(domain: &str, op: &str) -> bool {
    domain.is_empty()
        || domain == "ai.onnx"
        || (domain == "ai.onnx.preview" && op == "FlexAttention")
}

/// Node `n` with, for an `If`, the outer values its branches read ([`captured`]) appended
/// to its inputs after the condition; for a `Scan`, a `Loop` or a `FlexAttention`, after its
/// own inputs.
fn with_captures(n: &NodeProto) -> Result<NodeProto> {
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
            new_nodes.push(Node {
                name: format!("{prefix}{}#out{k}", o.name),
                op: "Identity".into(),
                inputs: vec![Some(src)],
                outputs: vec![Some(t)],
                attrs: Vec::new(),
            });
        }
        results.push(t);
    }
    Ok((new_nodes, results))
}

/// Inlines the `If` node `ni`, whose condition is a compile-time constant, as the nodes of
/// the branch it takes: the branch's values are renamed `<If name>/<name>`, its outputs
/// become the `If`'s outputs, and the values it reads from outside resolve in the
/// enclosing scope (a nested `If` keeps its own branches for later). An `If` whose
/// condition is only known at run time is an error naming it.
pub(crate) fn inline_if(g: &mut Graph, ni: usize) -> Result<()> {
    let n = g.nodes[ni].clone();
    let bad = |kind, msg: String| n.error(kind, msg);
    let cond = n.inputs.first().copied().flatten().ok_or_else(|| {
        bad(
            ErrorKind::ShapeMismatch,
            "the condition input is missing".into(),
        )
    })?;
    let cv = &g.values[cond];
    let Some(k) = cv.konst.clone() else {
        return Err(bad(
            ErrorKind::UnsupportedOp,
            format!(
                "condition '{}' is computed at run time: only an If whose condition is known at compile time (a constant, a folded shape comparison, an input given with input_values) is supported; it is folded to its branch",
                cv.name
            ),
        )
        .needing(input_deps(g, cond)));
    };
    if k.len() != 1 {
        return Err(bad(
            ErrorKind::ShapeMismatch,
            format!(
                "condition '{}' has {} elements (one expected)",
                cv.name,
                k.len()
            ),
        ));
    }
    let branch = if k.get_f64(0) != 0.0 {
        "then_branch"
    } else {
        "else_branch"
    };
    let a = n
        .attrs
        .iter()
        .find(|a| a.name == branch && a.g.is_some())
        .ok_or_else(|| bad(ErrorKind::BadAttribute, format!("no {branch} subgraph")))?;
    let gp = subgraph(a).map_err(|e| e.at_node(&n.name, &n.op))?;
    if gp.output.len() != n.outputs.len() {
        return Err(bad(
            ErrorKind::ShapeMismatch,
            format!(
                "{branch} has {} outputs for the If's {}",
                gp.output.len(),
                n.outputs.len()
            ),
        ));
    }
    // The enclosing scope: the values the branches capture, as the If's inputs after the
    // condition (resolved where the If stood, so a nested If sees its parent branch's
    // names); the branch's own names are added (and shadow them) below.
    let mut scope: HashMap<String, ValueId> = HashMap::new();
    for (name, id) in captured(&n.attrs)?.into_iter().zip(n.inputs.iter().skip(1)) {
        if let Some(id) = id {
            scope.insert(name, *id);
        }
    }
    let prefix = format!("{}/", n.name);
    let (new_nodes, _) =
        inline_body(g, &gp, &prefix, scope, &n.outputs).map_err(|e| e.at_node(&n.name, &n.op))?;
    g.nodes.splice(ni..=ni, new_nodes);
    Ok(())
}

/// Longest Scan unrolled (steps, times the batch of an opset-8 Scan).
const MAX_SCAN_STEPS: usize = 4096;

/// Most nodes a graph may hold after unrolling a Scan or Loop (nested bodies multiply:
/// a hostile model must not turn into millions of node copies).
const MAX_GRAPH_NODES: usize = 1 << 18;

/// The error when unrolling `copies` copies of a body of `body` nodes would pass
/// [`MAX_GRAPH_NODES`].
fn check_unrolled_size(g: &Graph, n: &Node, copies: usize, body: usize) -> Result<()> {
    let total = copies
        .checked_mul(body)
        .and_then(|x| x.checked_add(g.nodes.len()));
    if total.is_none_or(|t| t > MAX_GRAPH_NODES) {
        return Err(n.error(
            ErrorKind::TooLarge,
            format!(
                "unrolling {copies} copies of a body of {body} nodes into a graph of {} would pass {MAX_GRAPH_NODES} nodes",
                g.nodes.len()
            ),
        ));
    }
    Ok(())
}

/// What one unrolled scan needs: the body, its state and scan inputs, and how its outputs
/// are stacked.
struct ScanRun<'a> {
    gp: &'a GraphProto,
    /// Number of states.
    ns: usize,
    /// Per scan input: the value, its sequence axis, whether it is read from the end.
    scan_in: Vec<(ValueId, usize, bool)>,
    steps: usize,
    outer: &'a HashMap<String, ValueId>,
    out_axes: &'a [i64],
    out_dirs: &'a [i64],
}

/// Inlines the `Scan` node `ni` as its body's nodes once per step of its (inferred, so
/// compile-time) sequence: step `t` reads element `t` of each scan input along its axis
/// (`Gather` of a constant index; from the end for a reverse direction) and the state the
/// previous step produced; the final states are the Scan's state outputs and each scan
/// output is the steps' values stacked along its axis (`Unsqueeze` + `Concat`, reversed for
/// a reverse direction). Body values are renamed `<Scan name>/<t>/<name>`; the outer values
/// the body reads are the node's inputs after its own. The batched form of opset 8 (a
/// leading batch axis on states and scan inputs, an optional `sequence_lens` first input)
/// is unrolled per batch entry the same way (`<Scan name>/b<b>/<t>/<name>`), the entries'
/// results stacked along axis 0.
pub(crate) fn inline_scan(g: &mut Graph, ni: usize) -> Result<()> {
    let n = g.nodes[ni].clone();
    let bad = |kind, msg: String| n.error(kind, msg);
    let v8 = g.opset < 9;
    let a = n
        .attrs
        .iter()
        .find(|a| a.name == "body" && a.g.is_some())
        .ok_or_else(|| bad(ErrorKind::BadAttribute, "no body subgraph".into()))?;
    let gp = subgraph(a).map_err(|e| e.at_node(&n.name, &n.op))?;
    let m = usize::try_from(n.attr_i("num_scan_inputs", 0)?)
        .ok()
        .filter(|&m| m >= 1 && m <= gp.input.len())
        .ok_or_else(|| bad(ErrorKind::BadAttribute, "num_scan_inputs".into()))?;
    let ns = gp.input.len() - m;
    let k_out = gp.output.len().checked_sub(ns).ok_or_else(|| {
        bad(
            ErrorKind::ShapeMismatch,
            "fewer body outputs than states".into(),
        )
    })?;
    // Opset 8: `sequence_lens` comes first.
    let first = usize::from(v8);
    if n.inputs.len() < first + ns + m || n.outputs.len() > ns + k_out {
        return Err(bad(
            ErrorKind::ShapeMismatch,
            format!(
                "{} inputs and {} outputs for a body of {} inputs and {} outputs",
                n.inputs.len(),
                n.outputs.len(),
                gp.input.len(),
                gp.output.len()
            ),
        ));
    }
    let ints = |name: &str, len: usize| -> Result<Vec<i64>> {
        match n.attr_ints(name)? {
            None => Ok(vec![0; len]),
            Some(v) if v.len() == len => Ok(v),
            Some(v) => Err(bad(ErrorKind::BadAttribute, format!("{name} {v:?}"))),
        }
    };
    let (in_axes, in_dirs, out_axes, out_dirs) = if v8 {
        // Opset 8: the sequence axis is 1 of the batched inputs, 0 of a batch entry.
        (
            vec![1; m],
            ints("directions", m)?,
            vec![0; k_out],
            vec![0; k_out],
        )
    } else {
        (
            ints("scan_input_axes", m)?,
            ints("scan_input_directions", m)?,
            ints("scan_output_axes", k_out)?,
            ints("scan_output_directions", k_out)?,
        )
    };
    let mut scan_in = Vec::new();
    let mut steps = None;
    let mut batch = None;
    for j in 0..m {
        let v = n.inputs[first + ns + j].ok_or_else(|| {
            bad(
                ErrorKind::ShapeMismatch,
                format!("scan input {j} is missing"),
            )
        })?;
        let shape = &g.values[v].shape;
        let r = shape.len() as i64;
        let ax = in_axes[j];
        if ax < -r || ax >= r {
            return Err(bad(
                ErrorKind::BadAttribute,
                format!("scan_input_axes {in_axes:?} for an input of rank {r}"),
            ));
        }
        let ax = if ax < 0 { ax + r } else { ax } as usize;
        let len = shape[ax];
        if steps.is_some_and(|s| s != len) || (v8 && batch.is_some_and(|b| b != shape[0])) {
            return Err(bad(
                ErrorKind::ShapeMismatch,
                "scan inputs of different lengths".into(),
            ));
        }
        steps = Some(len);
        batch = Some(shape[0]);
        // A batch entry's sequence axis is one less.
        scan_in.push((v, if v8 { ax - 1 } else { ax }, in_dirs[j] != 0));
    }
    let steps = steps.unwrap_or(0);
    let batch = if v8 { batch.unwrap_or(0) } else { 1 };
    if steps == 0 || batch == 0 || steps.saturating_mul(batch) > MAX_SCAN_STEPS {
        return Err(bad(
            ErrorKind::UnsupportedOp,
            format!(
                "a Scan of {steps} steps × {batch} batch entries (1 to {MAX_SCAN_STEPS} in all are unrolled)"
            ),
        ));
    }
    if v8 && let Some(lens) = n.inputs[0] {
        match g.values[lens].konst.as_deref() {
            Some(t) if t.to_i64s().iter().all(|&l| l == steps as i64) => {}
            Some(t) => {
                return Err(bad(
                    ErrorKind::UnsupportedOp,
                    format!(
                        "sequence_lens {:?} shorter than the sequence ({steps}): only full sequences are unrolled",
                        t.to_i64s()
                    ),
                ));
            }
            None => {
                return Err(bad(
                    ErrorKind::UnsupportedOp,
                    format!(
                        "sequence_lens '{}' must be known at compile time (and equal the sequence length {steps})",
                        g.values[lens].name
                    ),
                )
                .needing(input_deps(g, lens)));
            }
        }
    }
    check_unrolled_size(g, &n, steps * batch, gp.node.len() + m + 2)?;
    let outer: HashMap<String, ValueId> = captured(&n.attrs)?
        .into_iter()
        .zip(n.inputs.iter().skip(first + ns + m))
        .filter_map(|(name, id)| id.map(|id| (name, id)))
        .collect();
    let states: Vec<ValueId> = (0..ns)
        .map(|i| {
            n.inputs[first + i]
                .ok_or_else(|| bad(ErrorKind::ShapeMismatch, format!("state {i} is missing")))
        })
        .collect::<Result<_>>()?;
    let mut run = ScanRun {
        gp: &gp,
        ns,
        scan_in,
        steps,
        outer: &outer,
        out_axes: &out_axes,
        out_dirs: &out_dirs,
    };
    let targets: Vec<Option<ValueId>> = (0..ns + k_out)
        .map(|k| n.outputs.get(k).copied().flatten())
        .collect();
    let mut new_nodes = Vec::new();
    if !v8 {
        scan_steps(
            g,
            &n,
            &run,
            states,
            &format!("{}/", n.name),
            &targets,
            &mut new_nodes,
        )?;
    } else {
        // Per batch entry `b`: its states and scan inputs (`Gather` of index `b` on axis
        // 0), one scan, its outputs stacked over the entries along axis 0.
        let batched: Vec<(ValueId, usize, bool)> = run.scan_in.clone();
        let mut per_entry: Vec<Vec<ValueId>> = vec![Vec::new(); ns + k_out];
        for b in 0..batch {
            let prefix = format!("{}/b{b}/", n.name);
            let mut pick = |g: &mut Graph, v: ValueId, tag: String| {
                let idx = new_konst_i64(g, format!("{prefix}#entry{tag}"), vec![], vec![b as i64]);
                let o = new_value(g, format!("{prefix}#{tag}"));
                new_nodes.push(gather_node(format!("{prefix}#pick{tag}"), v, idx, 0, o));
                o
            };
            let entry_states: Vec<ValueId> = states
                .iter()
                .enumerate()
                .map(|(i, &s)| pick(g, s, format!("state{i}")))
                .collect();
            run.scan_in = batched
                .iter()
                .enumerate()
                .map(|(j, &(v, ax, rev))| (pick(g, v, format!("input{j}")), ax, rev))
                .collect();
            let entry_targets: Vec<Option<ValueId>> = targets
                .iter()
                .enumerate()
                .map(|(k, t)| t.map(|_| new_value(g, format!("{prefix}#out{k}"))))
                .collect();
            scan_steps(
                g,
                &n,
                &run,
                entry_states,
                &prefix,
                &entry_targets,
                &mut new_nodes,
            )?;
            for (k, t) in entry_targets.iter().enumerate() {
                if let Some(t) = t {
                    per_entry[k].push(*t);
                }
            }
        }
        let prefix = format!("{}/", n.name);
        for (k, t) in targets.iter().enumerate() {
            if let Some(t) = t {
                stack_along_0(
                    g,
                    &prefix,
                    &format!("batch{k}"),
                    &per_entry[k],
                    *t,
                    &mut new_nodes,
                );
            }
        }
    }
    g.nodes.splice(ni..=ni, new_nodes);
    Ok(())
}

fn new_value(g: &mut Graph, name: String) -> ValueId {
    g.values.push(Value {
        name,
        dtype: DType::F32,
        shape: Vec::new(),
        konst: None,
    });
    g.values.len() - 1
}

fn new_konst_i64(g: &mut Graph, name: String, shape: Vec<usize>, v: Vec<i64>) -> ValueId {
    g.values.push(Value {
        name,
        dtype: DType::I64,
        shape: shape.clone(),
        konst: Some(Rc::new(HostTensor::ints(DType::I64, shape, v))),
    });
    g.values.len() - 1
}

fn gather_node(name: String, data: ValueId, index: ValueId, axis: usize, out: ValueId) -> Node {
    Node {
        name,
        op: "Gather".into(),
        inputs: vec![Some(data), Some(index)],
        outputs: vec![Some(out)],
        attrs: vec![AttributeProto {
            name: "axis".into(),
            r#type: at::INT,
            i: axis as i64,
            ..Default::default()
        }],
    }
}

/// The nodes of one unrolled scan (see [`inline_scan`]) from `states`, named under
/// `prefix`; the final states and the stacked scan outputs are written into `targets`
/// (`None`: not needed).
fn scan_steps(
    g: &mut Graph,
    n: &Node,
    run: &ScanRun,
    mut states: Vec<ValueId>,
    prefix: &str,
    targets: &[Option<ValueId>],
    new_nodes: &mut Vec<Node>,
) -> Result<()> {
    let (gp, ns, steps) = (run.gp, run.ns, run.steps);
    let k_out = gp.output.len() - ns;
    let mut collected: Vec<Vec<ValueId>> = vec![Vec::new(); k_out];
    for t in 0..steps {
        let step = format!("{prefix}{t}/");
        let mut scope = run.outer.clone();
        for (i, inp) in gp.input.iter().enumerate().take(ns) {
            scope.insert(inp.name.clone(), states[i]);
        }
        for (j, &(v, ax, rev)) in run.scan_in.iter().enumerate() {
            let idx = if rev { steps - 1 - t } else { t };
            let iv = new_konst_i64(g, format!("{step}#index{j}"), vec![], vec![idx as i64]);
            let o = new_value(g, format!("{step}{}", gp.input[ns + j].name));
            new_nodes.push(gather_node(format!("{step}#slice{j}"), v, iv, ax, o));
            scope.insert(gp.input[ns + j].name.clone(), o);
        }
        let (nodes, outs) =
            inline_body(g, gp, &step, scope, &[]).map_err(|e| e.at_node(&n.name, &n.op))?;
        new_nodes.extend(nodes);
        states.copy_from_slice(&outs[..ns]);
        for (k, c) in collected.iter_mut().enumerate() {
            c.push(outs[ns + k]);
        }
    }
    // Final states, through an Identity into the Scan's outputs.
    for (i, &st) in states.iter().enumerate() {
        if let Some(Some(o)) = targets.get(i).copied() {
            new_nodes.push(Node {
                name: format!("{prefix}#state{i}"),
                op: "Identity".into(),
                inputs: vec![Some(st)],
                outputs: vec![Some(o)],
                attrs: Vec::new(),
            });
        }
    }
    for (k, vals) in collected.into_iter().enumerate() {
        let Some(Some(o)) = targets.get(ns + k).copied() else {
            continue;
        };
        let ax = run.out_axes[k];
        let mut parts = Vec::new();
        for (t, v) in vals.into_iter().enumerate() {
            let u = new_value(g, format!("{prefix}#stack{k}_{t}"));
            let (inputs, attrs) = if g.opset >= 13 {
                let a = new_konst_i64(g, format!("{prefix}#axes{k}_{t}"), vec![1], vec![ax]);
                (vec![Some(v), Some(a)], Vec::new())
            } else {
                (
                    vec![Some(v)],
                    vec![AttributeProto {
                        name: "axes".into(),
                        r#type: at::INTS,
                        ints: vec![ax],
                        ..Default::default()
                    }],
                )
            };
            new_nodes.push(Node {
                name: format!("{prefix}#unsqueeze{k}_{t}"),
                op: "Unsqueeze".into(),
                inputs,
                outputs: vec![Some(u)],
                attrs,
            });
            parts.push(Some(u));
        }
        if run.out_dirs[k] != 0 {
            parts.reverse();
        }
        new_nodes.push(Node {
            name: format!("{prefix}#concat{k}"),
            op: "Concat".into(),
            inputs: parts,
            outputs: vec![Some(o)],
            attrs: vec![AttributeProto {
                name: "axis".into(),
                r#type: at::INT,
                i: ax,
                ..Default::default()
            }],
        });
    }
    Ok(())
}

/// Longest Loop unrolled.
const MAX_LOOP_ITERATIONS: u64 = 4096;

/// The nodes stacking `parts` (one value per step) along a new leading axis into `out`
/// (`Unsqueeze` each, then `Concat`), named under `prefix` with `tag`.
fn stack_along_0(
    g: &mut Graph,
    prefix: &str,
    tag: &str,
    parts: &[ValueId],
    out: ValueId,
    nodes: &mut Vec<Node>,
) {
    let mut stacked = Vec::with_capacity(parts.len());
    for (t, &v) in parts.iter().enumerate() {
        g.values.push(Value {
            name: format!("{prefix}#stack{tag}_{t}"),
            dtype: DType::F32,
            shape: Vec::new(),
            konst: None,
        });
        let u = g.values.len() - 1;
        let (inputs, attrs) = if g.opset >= 13 {
            g.values.push(Value {
                name: format!("{prefix}#axes{tag}_{t}"),
                dtype: DType::I64,
                shape: vec![1],
                konst: Some(Rc::new(HostTensor::ints(DType::I64, vec![1], vec![0]))),
            });
            (vec![Some(v), Some(g.values.len() - 1)], Vec::new())
        } else {
            (
                vec![Some(v)],
                vec![AttributeProto {
                    name: "axes".into(),
                    r#type: at::INTS,
                    ints: vec![0],
                    ..Default::default()
                }],
            )
        };
        nodes.push(Node {
            name: format!("{prefix}#unsqueeze{tag}_{t}"),
            op: "Unsqueeze".into(),
            inputs,
            outputs: vec![Some(u)],
            attrs,
        });
        stacked.push(Some(u));
    }
    nodes.push(Node {
        name: format!("{prefix}#concat{tag}"),
        op: "Concat".into(),
        inputs: stacked,
        outputs: vec![Some(out)],
        attrs: vec![AttributeProto {
            name: "axis".into(),
            r#type: at::INT,
            i: 0,
            ..Default::default()
        }],
    });
}

/// Unrolls the `Loop` node `ni`, whose trip count `M` and condition must be known at
/// compile time: the node is replaced by its body's nodes once per iteration (values
/// renamed `<Loop name>/<i>/<name>`), iteration `i` reading the constant iteration number
/// `i`, the condition, the loop-carried values the previous iteration produced and the
/// outer values the body captures (the node's inputs after its own). Each iteration is
/// inferred ([`crate::infer::infer_span`]) before the next is decided, so a condition the
/// body computes is known by then (or the error names it). The final loop-carried values
/// are the Loop's first outputs (through `Identity`), each scan output the iterations'
/// values stacked along a new axis 0. Returns the index of the first node not yet
/// inferred (the nodes writing the Loop's outputs).
pub(crate) fn inline_loop(g: &mut Graph, ni: usize) -> Result<usize> {
    let n = g.nodes[ni].clone();
    let bad = |kind, msg: String| n.error(kind, msg);
    let a = n
        .attrs
        .iter()
        .find(|a| a.name == "body" && a.g.is_some())
        .ok_or_else(|| bad(ErrorKind::BadAttribute, "no body subgraph".into()))?;
    let gp = subgraph(a).map_err(|e| e.at_node(&n.name, &n.op))?;
    let nc = gp.input.len().checked_sub(2).ok_or_else(|| {
        bad(
            ErrorKind::BadAttribute,
            format!(
                "the body has {} inputs (iteration number, condition, loop-carried values…)",
                gp.input.len()
            ),
        )
    })?;
    let k_out = gp.output.len().checked_sub(1 + nc).ok_or_else(|| {
        bad(
            ErrorKind::BadAttribute,
            format!(
                "the body has {} outputs for {nc} loop-carried values (condition, values, scan outputs…)",
                gp.output.len()
            ),
        )
    })?;
    if n.inputs.len() < 2 + nc || n.outputs.len() > nc + k_out {
        return Err(bad(
            ErrorKind::ShapeMismatch,
            format!(
                "{} inputs and {} outputs for a body of {} inputs and {} outputs",
                n.inputs.len(),
                n.outputs.len(),
                gp.input.len(),
                gp.output.len()
            ),
        ));
    }
    let input = |k: usize| n.inputs.get(k).copied().flatten();
    // One compile-time scalar of input `k` (the trip count, the condition), or the error
    // naming it and the graph inputs it depends on.
    let scalar = |g: &Graph, v: ValueId, what: &str| -> Result<i64> {
        let val = &g.values[v];
        match val.konst.as_deref() {
            Some(t) if t.len() == 1 => Ok(t.to_i64s()[0]),
            Some(t) => Err(bad(
                ErrorKind::ShapeMismatch,
                format!("{what} '{}' has {} elements (one expected)", val.name, t.len()),
            )),
            None => Err(bad(
                ErrorKind::UnsupportedOp,
                format!(
                    "{what} '{}' is computed at run time: only a Loop whose trip count and condition are known at compile time (constants, folded shapes, inputs given with input_values) is supported; it is unrolled",
                    val.name
                ),
            )
            .needing(input_deps(g, v))),
        }
    };
    let trip = match input(0) {
        Some(m) => Some(scalar(g, m, "trip count")?.max(0) as u64),
        None => None,
    };
    let mut cond = match input(1) {
        Some(c) => Some(scalar(g, c, "condition")? != 0),
        None => None,
    };
    if trip.is_none() && cond.is_none() {
        return Err(bad(
            ErrorKind::UnsupportedOp,
            "a Loop with neither a trip count nor a condition never ends".into(),
        ));
    }
    let outer: HashMap<String, ValueId> = captured(&n.attrs)?
        .into_iter()
        .zip(n.inputs.iter().skip(2 + nc))
        .filter_map(|(name, id)| id.map(|id| (name, id)))
        .collect();
    let mut states: Vec<ValueId> = (0..nc)
        .map(|i| {
            input(2 + i).ok_or_else(|| {
                bad(
                    ErrorKind::ShapeMismatch,
                    format!("loop-carried value {i} is missing"),
                )
            })
        })
        .collect::<Result<_>>()?;
    let mut scans: Vec<Vec<ValueId>> = vec![Vec::new(); k_out];
    g.nodes.remove(ni);
    let tail = g.nodes.len() - ni;
    let mut pos = ni;
    let mut i = 0u64;
    while trip.is_none_or(|m| i < m) && cond != Some(false) {
        if i >= MAX_LOOP_ITERATIONS {
            return Err(bad(
                ErrorKind::UnsupportedOp,
                format!("a Loop of more than {MAX_LOOP_ITERATIONS} iterations (they are unrolled)"),
            ));
        }
        check_unrolled_size(g, &n, 1, gp.node.len())?;
        let prefix = format!("{}/{i}/", n.name);
        let mut scope = outer.clone();
        for (k, t) in [
            HostTensor::ints(DType::I64, vec![], vec![i as i64]),
            HostTensor::ints(DType::Bool, vec![], vec![1]),
        ]
        .into_iter()
        .enumerate()
        {
            g.values.push(Value {
                name: format!("{prefix}{}", gp.input[k].name),
                dtype: t.dtype,
                shape: Vec::new(),
                konst: Some(Rc::new(t)),
            });
            scope.insert(gp.input[k].name.clone(), g.values.len() - 1);
        }
        for (j, &st) in states.iter().enumerate() {
            scope.insert(gp.input[2 + j].name.clone(), st);
        }
        let (nodes, outs) =
            inline_body(g, &gp, &prefix, scope, &[]).map_err(|e| e.at_node(&n.name, &n.op))?;
        g.nodes.splice(pos..pos, nodes);
        crate::infer::infer_span(g, pos, tail)?;
        pos = g.nodes.len() - tail;
        if cond.is_some() {
            cond = Some(scalar(g, outs[0], "the condition the body computes")? != 0);
        }
        states.copy_from_slice(&outs[1..1 + nc]);
        for (k, s) in scans.iter_mut().enumerate() {
            s.push(outs[1 + nc + k]);
        }
        i += 1;
    }
    let prefix = format!("{}/", n.name);
    let mut fin = Vec::new();
    for (k, &st) in states.iter().enumerate() {
        if let Some(Some(o)) = n.outputs.get(k).copied() {
            fin.push(Node {
                name: format!("{prefix}#final{k}"),
                op: "Identity".into(),
                inputs: vec![Some(st)],
                outputs: vec![Some(o)],
                attrs: Vec::new(),
            });
        }
    }
    for (k, parts) in scans.iter().enumerate() {
        let Some(Some(o)) = n.outputs.get(nc + k).copied() else {
            continue;
        };
        if parts.is_empty() {
            return Err(bad(
                ErrorKind::UnsupportedOp,
                format!(
                    "scan output {k} of a Loop that runs no iteration (an empty tensor of unknown shape)"
                ),
            ));
        }
        stack_along_0(g, &prefix, &k.to_string(), parts, o, &mut fin);
    }
    g.nodes.splice(pos..pos, fin);
    Ok(pos)
}

/// A declared output: name, ONNX element type, dims (`None` where symbolic).
pub type DeclaredOutput = (String, i32, Option<Vec<Option<i64>>>);

/// Declared output types of the model, for checking inference: `(name, elem_type, dims)`
/// where a dim is `None` when symbolic.
pub fn declared_outputs(bytes: &[u8]) -> Result<Vec<DeclaredOutput>> {
    let model: ModelProto = crate::onnx::decode_model(bytes).map_err(decode_error)?;
    let gp = model.graph.unwrap_or_default();
    Ok(gp
        .output
        .iter()
        .map(|vi| {
            let tt = vi.r#type.as_ref().and_then(|t| t.tensor_type.as_ref());
            (
                vi.name.clone(),
                tt.map_or(0, |t| t.elem_type),
                tt.and_then(|t| t.shape.as_ref())
                    .map(|s| s.dim.iter().map(|d| d.dim_value).collect()),
            )
        })
        .collect())
}
