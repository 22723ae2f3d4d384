//! The compiler's graph: values with static shapes (and constant contents where known) and
//! nodes in topological order, built from an ONNX `ModelProto`.
//!
//! Import binds symbolic input dimensions from the caller's `input_shapes`, turns inputs
//! named in `input_values` into constants, sorts the nodes, and rejects dangling edges. Shape
//! inference and constant folding ([`crate::infer`]) then fill in every value.
//!
//! Subgraph bodies are inlined by the submodules: [`body`] (captures, copying a body under a
//! prefix), [`control`] (`If`: a compile-time condition takes its branch; a run-time one
//! keeps both, predicated), [`unroll`] (`Scan`, `Loop`).

use crate::CompileOptions;
use crate::error::{CompileError, ErrorKind, Result, err};
use crate::onnx::{AttributeProto, ModelProto, NodeProto, attribute_type as at};
use crate::tensor::{HostTensor, budget, dtype_from_onnx, onnx_type_name};
use nrt_hal::DType;
use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;

mod body;
mod control;
mod unroll;

pub(crate) use body::{captured, domain_supported, inline_body, subgraph};
use body::{holds_subgraphs, with_captures};
pub(crate) use control::inline_if;
pub(crate) use unroll::{inline_loop, inline_scan};

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
    /// The condition under which it runs, when it belongs to a branch of an `If` whose
    /// condition is computed at run time: its instructions are predicated on it.
    pub guard: Option<Guard>,
}

/// The run-time condition a node of an `If` branch runs under: its instructions are
/// bracketed by [`nrt_isa::Op::Guard`], so they move no data when it fails. `cond` is a
/// one-element bool value that unguarded nodes compute (never a stale value of a branch
/// not taken): the `If`'s own condition, or for a nested `If` the conjunction with its
/// enclosing branch's (see [`control::inline_if`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Guard {
    /// The condition value.
    pub cond: ValueId,
    /// The value of `cond` under which the node runs.
    pub when: bool,
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
    /// Every value the node reads: its inputs and its guard's condition.
    pub fn reads(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.inputs
            .iter()
            .flatten()
            .copied()
            .chain(self.guard.map(|g| g.cond))
    }

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

    /// Float attribute that must be a finite number (a scale, an epsilon, an activation's
    /// coefficient): NaN or ±inf is a bad attribute naming the node and the attribute —
    /// never a value carried into an instruction the model then fails to validate with.
    pub fn attr_finite_f(&self, name: &str, default: f32) -> Result<f32> {
        let v = self.attr_f(name, default)?;
        if v.is_finite() {
            Ok(v)
        } else {
            Err(self.bad(format!(
                "attribute '{name}' is {v}; a finite number is expected"
            )))
        }
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
            // Its inputs, less the initializers an IR < 4 model lists among them.
            let inputs: Vec<String> = gp
                .input
                .iter()
                .filter(|i| !by_name.contains_key(&i.name))
                .map(|i| format!("'{}'", i.name))
                .collect();
            return err(
                ErrorKind::BadOption,
                format!(
                    "the model has no input named '{name}'; its inputs: {}",
                    if inputs.is_empty() {
                        "none".to_owned()
                    } else {
                        inputs.join(", ")
                    }
                ),
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
                        return Err(CompileError::new(
                            ErrorKind::BadShape,
                            format!(
                                "input '{name}' has {what} at axis {i} (of {rank}): give its shape (input_shapes)"
                            ),
                        )
                        .needing_shape_of(name));
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
            guard: None,
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
            stack.extend(g.nodes[p].reads());
        }
    }
    g.inputs
        .iter()
        .filter(|i| found.contains(i))
        .map(|&i| g.values[i].name.clone())
        .collect()
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
