//! Half-precision (and double) tensors through operators that compute in f32 only.
//!
//! The engines compute in f32; `float16`, `bfloat16` and `double` are storage types (elementwise
//! operators widen them themselves, see `ops/elementwise.rs`). An operator whose device rule
//! is f32-only ([`Dtypes::Float`], [`Dtypes::Reduce`]: MatMul, Gemm, Conv, pooling,
//! normalizations, reductions, activations, Resize, …) gets its half inputs through `Cast`
//! nodes to f32 inserted before it, and its f32 outputs back to the half type through `Cast`
//! nodes after it — the same graph a user would write by hand, so the casts are ordinary
//! nodes for every later stage. Computing in f32 is at least as accurate as the half type
//! (ONNX Runtime computes most of these in f32 on CPU too), and the result is rounded once,
//! on the way out. MaxPool / GlobalMaxPool take 8- and 16-bit integers the same way (exact
//! in f32; the max only picks values).

use crate::graph::{Graph, Guard, Node, Value, ValueId};
use crate::onnx::{AttributeProto, attribute_type as at};
use crate::ops::{Dtypes, OpDef};
use crate::tensor::dtype_to_onnx;
use nrt_hal::DType;

/// Whether `d` is a float type the engines do not compute in (they compute f32): the halves,
/// and double (computed in f32: ~7 significant digits, not 16).
fn is_half(d: DType) -> bool {
    matches!(d, DType::F16 | DType::Bf16 | DType::F64)
}

/// The half type node `ni`'s inputs are widened from, if the node needs it: an f32-only
/// operator with a half input that is not folded at compile time.
pub(crate) fn needed(g: &Graph, ni: usize, def: &OpDef) -> Option<DType> {
    if !matches!(def.dtypes, Dtypes::Float | Dtypes::Reduce) {
        return None;
    }
    let n = &g.nodes[ni];
    let ins = || n.inputs.iter().flatten().map(|&v| &g.values[v]);
    if ins().all(|v| v.konst.is_some()) {
        return None; // folded on the host, in any type
    }
    // Max pooling only picks values: 8- and 16-bit integers are exact in f32 and come back
    // unchanged.
    let exact_int = |d: DType| {
        matches!(def.name, "MaxPool" | "GlobalMaxPool")
            && matches!(d, DType::I8 | DType::U8 | DType::I16 | DType::U16)
    };
    ins().map(|v| v.dtype).find(|&d| is_half(d) || exact_int(d))
}

fn cast_node(
    name: String,
    input: ValueId,
    output: ValueId,
    to: DType,
    guard: Option<Guard>,
) -> Node {
    Node {
        name,
        op: "Cast".to_owned(),
        inputs: vec![Some(input)],
        outputs: vec![Some(output)],
        attrs: vec![AttributeProto {
            name: "to".to_owned(),
            r#type: at::INT,
            i: dtype_to_onnx(to) as i64,
            ..Default::default()
        }],
        guard,
    }
}

fn add_value(g: &mut Graph, like: &Value, name: String, dtype: DType) -> ValueId {
    g.values.push(Value {
        name,
        dtype,
        shape: like.shape.clone(),
        konst: None,
    });
    g.values.len() - 1
}

/// Inserts a `Cast` to f32 before node `ni` for each of its half inputs (or inputs of type
/// `from`, what [`needed`] found) and rewires the node to read the f32 copies. Returns how
/// many nodes were inserted (the node is now at `ni` + that).
pub(crate) fn cast_inputs(g: &mut Graph, ni: usize, from: DType) -> usize {
    let mut casts = Vec::new();
    let node_name = g.nodes[ni].name.clone();
    for k in 0..g.nodes[ni].inputs.len() {
        let Some(v) = g.nodes[ni].inputs[k] else {
            continue;
        };
        let d = g.values[v].dtype;
        if !is_half(d) && d != from {
            continue;
        }
        let like = g.values[v].clone();
        let wide = add_value(
            g,
            &like,
            format!("{}__f32_in{k}_{node_name}", like.name),
            DType::F32,
        );
        casts.push(cast_node(
            format!("{node_name}__widen_in{k}"),
            v,
            wide,
            DType::F32,
            g.nodes[ni].guard,
        ));
        g.nodes[ni].inputs[k] = Some(wide);
    }
    let n = casts.len();
    g.nodes.splice(ni..ni, casts);
    n
}

/// After node `ni` was inferred on widened inputs: each f32 output is renamed to an f32
/// temporary and a `Cast` back to `half` after the node writes the original value.
pub(crate) fn cast_outputs(g: &mut Graph, ni: usize, half: DType) {
    let mut casts = Vec::new();
    let node_name = g.nodes[ni].name.clone();
    for k in 0..g.nodes[ni].outputs.len() {
        let Some(o) = g.nodes[ni].outputs[k] else {
            continue;
        };
        if g.values[o].dtype != DType::F32 {
            continue; // indices, masks: not a value of the half type
        }
        let like = g.values[o].clone();
        let wide = add_value(g, &like, format!("{}__f32_out{k}", like.name), DType::F32);
        g.values[wide].konst = like.konst.clone();
        g.values[o].konst = None;
        g.nodes[ni].outputs[k] = Some(wide);
        casts.push(cast_node(
            format!("{node_name}__narrow_out{k}"),
            wide,
            o,
            half,
            g.nodes[ni].guard,
        ));
    }
    g.nodes.splice(ni + 1..ni + 1, casts);
}
