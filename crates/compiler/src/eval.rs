//! Constant folding on the host: `eval` dispatches a node whose inputs are all constants
//! to its operator's folding hook (`OpDef::folds` in [`crate::ops`], written in the operator's
//! family file beside its inference and lowering), and the hooks share the helpers here:
//! strided and broadcast views of a host tensor. Float tensors compute in `f32` like the
//! device; integers in `i64`. The operators that fold are those common in constant
//! subgraphs (shape arithmetic, index computation, weight dequantization and re-layout); an
//! operator without a hook (or whose hook declines) is computed on the device instead.

use crate::error::Result;
use crate::params::{Ctx, Out};
use crate::tensor::{Data, HostTensor};

/// Row-major element strides of `shape`.
pub fn dense_strides(shape: &[usize]) -> Vec<i64> {
    let mut s = vec![0i64; shape.len()];
    let mut acc = 1i64;
    for i in (0..shape.len()).rev() {
        s[i] = acc;
        acc *= shape[i].max(1) as i64;
    }
    s
}

/// Strides that read a tensor of `in_shape` broadcast to `out_shape` (0 on broadcast axes).
pub fn broadcast_strides(in_shape: &[usize], out_shape: &[usize]) -> Vec<i64> {
    let d = dense_strides(in_shape);
    let off = out_shape.len() - in_shape.len();
    (0..out_shape.len())
        .map(|i| {
            if i < off || in_shape[i - off] == 1 {
                0
            } else {
                d[i - off]
            }
        })
        .collect()
}

/// Reads `src` through a strided view: element `idx` of the output is
/// `src[base + Σ idx[i]·strides[i]]`.
pub fn strided_read<T: Copy>(src: &[T], shape: &[usize], base: i64, strides: &[i64]) -> Vec<T> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let r = shape.len();
    let mut idx = vec![0usize; r];
    let mut pos = base;
    for _ in 0..n {
        out.push(src[pos as usize]);
        for d in (0..r).rev() {
            idx[d] += 1;
            pos += strides[d];
            if idx[d] < shape[d] {
                break;
            }
            pos -= strides[d] * shape[d] as i64;
            idx[d] = 0;
        }
    }
    out
}

/// `t` read through a strided view ([`strided_read`]) as a dense tensor of `shape`.
pub(crate) fn view(t: &HostTensor, shape: &[usize], base: i64, strides: &[i64]) -> HostTensor {
    let data = match &t.data {
        Data::F32(v) => Data::F32(strided_read(v, shape, base, strides)),
        Data::I64(v) => Data::I64(strided_read(v, shape, base, strides)),
    };
    HostTensor {
        dtype: t.dtype,
        shape: shape.to_vec(),
        data,
    }
}

/// `t` broadcast to `shape` (which it broadcasts to), as a dense tensor.
pub(crate) fn broadcast_to(t: &HostTensor, shape: &[usize]) -> HostTensor {
    view(t, shape, 0, &broadcast_strides(&t.shape, shape))
}

/// Input `i` of a node being folded (all its inputs are constants).
pub(crate) fn input<'a>(c: &Ctx<'a>, i: usize) -> &'a HostTensor {
    c.konst(i).expect("all inputs are constant")
}

/// The result of a folding hook that computes one output.
pub(crate) fn one(t: HostTensor) -> Result<Option<Vec<HostTensor>>> {
    Ok(Some(vec![t]))
}

/// Evaluates a node whose inputs are all constants by its operator's folding hook; `None`
/// if it has none or the hook declines. `outs` are the inferred outputs.
pub(crate) fn eval(c: &Ctx, outs: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    if let Some(fold) = crate::ops::get(&c.n.op).and_then(|d| d.folds) {
        return fold(c, outs);
    }
    Ok(None)
}

/// Unit-test helpers of the folding hooks: one node on constant inputs, inferred and folded
/// as in a model.
#[cfg(test)]
pub(crate) mod testing {
    use crate::error::Result;
    use crate::graph::{Graph, Node, Value};
    use crate::onnx::{AttributeProto, attribute_type};
    use crate::tensor::HostTensor;
    use nrt_hal::DType;
    use std::rc::Rc;

    /// An input of a test node: a constant, or a run-time value of an element type and shape.
    #[derive(Clone)]
    pub(crate) enum Arg {
        Const(HostTensor),
        Var(DType, Vec<usize>),
    }

    /// A run-time input of element type `dtype` and shape `shape`.
    pub(crate) fn var(dtype: DType, shape: &[usize]) -> Option<Arg> {
        Some(Arg::Var(dtype, shape.to_vec()))
    }

    /// A constant input.
    pub(crate) fn konst(t: HostTensor) -> Option<Arg> {
        Some(Arg::Const(t))
    }

    /// The graph of one `op` node (opset `opset`, not yet inferred) on `inputs` (`None`: an
    /// omitted optional input) with `outputs` outputs, which are the graph's outputs; its
    /// run-time inputs are the graph's inputs.
    pub(crate) fn one_node(
        op: &str,
        opset: i64,
        inputs: Vec<Option<Arg>>,
        attrs: Vec<AttributeProto>,
        outputs: usize,
    ) -> Graph {
        let mut g = Graph {
            opset,
            ..Graph::default()
        };
        let mut ins = Vec::new();
        for (i, a) in inputs.into_iter().enumerate() {
            ins.push(a.map(|a| {
                let (dtype, shape, konst) = match a {
                    Arg::Const(t) => (t.dtype, t.shape.clone(), Some(Rc::new(t))),
                    Arg::Var(d, s) => (d, s, None),
                };
                let runtime = konst.is_none();
                g.values.push(Value {
                    name: format!("x{i}"),
                    dtype,
                    shape,
                    konst,
                });
                if runtime {
                    g.inputs.push(g.values.len() - 1);
                }
                g.values.len() - 1
            }));
        }
        let first = g.values.len();
        for k in 0..outputs {
            g.values.push(Value {
                name: format!("y{k}"),
                dtype: DType::F32,
                shape: Vec::new(),
                konst: None,
            });
        }
        g.outputs = (first..first + outputs).collect();
        g.nodes.push(Node {
            name: "n".into(),
            op: op.into(),
            inputs: ins,
            outputs: (first..first + outputs).map(Some).collect(),
            attrs,
            guard: None,
        });
        g
    }

    /// The context of the first node of `g` (of [`one_node`]), for an operator's parameter
    /// parsing.
    pub(crate) fn ctx(g: &Graph) -> crate::params::Ctx<'_> {
        crate::params::Ctx { g, n: &g.nodes[0] }
    }

    /// [`one_node`], inferred (and expanded, folded) as in a model.
    pub(crate) fn infer_one(
        op: &str,
        opset: i64,
        inputs: Vec<Option<Arg>>,
        attrs: Vec<AttributeProto>,
        outputs: usize,
    ) -> Result<Graph> {
        let mut g = one_node(op, opset, inputs, attrs, outputs);
        crate::infer::infer(&mut g)?;
        Ok(g)
    }

    /// The inferred element type and shape of each output of [`infer_one`]'s node.
    pub(crate) fn out_types(
        op: &str,
        opset: i64,
        inputs: Vec<Option<Arg>>,
        attrs: Vec<AttributeProto>,
        outputs: usize,
    ) -> Result<Vec<(DType, Vec<usize>)>> {
        let g = infer_one(op, opset, inputs, attrs, outputs)?;
        Ok(g.outputs
            .iter()
            .map(|&v| (g.values[v].dtype, g.values[v].shape.clone()))
            .collect())
    }

    /// Folds one `op` node (opset `opset`) on the constant `inputs` (`None`: an omitted
    /// optional input) with `outputs` outputs: each output's value, `None` where the node
    /// was not folded (it stays for the device).
    pub(crate) fn fold(
        op: &str,
        opset: i64,
        inputs: Vec<Option<HostTensor>>,
        attrs: Vec<AttributeProto>,
        outputs: usize,
    ) -> Result<Vec<Option<HostTensor>>> {
        let ins = inputs.into_iter().map(|t| t.map(Arg::Const)).collect();
        let g = infer_one(op, opset, ins, attrs, outputs)?;
        Ok(g.outputs
            .iter()
            .map(|&v| g.values[v].konst.as_deref().cloned())
            .collect())
    }

    /// [`fold`] of a node with one output that must fold.
    pub(crate) fn fold1(
        op: &str,
        opset: i64,
        inputs: Vec<HostTensor>,
        attrs: Vec<AttributeProto>,
    ) -> HostTensor {
        let ins = inputs.into_iter().map(Some).collect();
        let mut outs = fold(op, opset, ins, attrs, 1).expect("folds");
        outs.remove(0)
            .unwrap_or_else(|| panic!("{op} did not fold"))
    }

    /// An integer attribute.
    pub(crate) fn a_i(name: &str, v: i64) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: attribute_type::INT,
            i: v,
            ..Default::default()
        }
    }

    /// A float attribute.
    pub(crate) fn a_f(name: &str, v: f32) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: attribute_type::FLOAT,
            f: v,
            ..Default::default()
        }
    }

    /// A string attribute.
    pub(crate) fn a_s(name: &str, v: &str) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: attribute_type::STRING,
            s: v.as_bytes().to_vec(),
            ..Default::default()
        }
    }

    /// An integer-list attribute.
    pub(crate) fn a_ints(name: &str, v: &[i64]) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: attribute_type::INTS,
            ints: v.to_vec(),
            ..Default::default()
        }
    }

    /// The operator types of `g`'s nodes, in order.
    pub(crate) fn op_types(g: &Graph) -> Vec<&str> {
        g.nodes.iter().map(|n| n.op.as_str()).collect()
    }
}
