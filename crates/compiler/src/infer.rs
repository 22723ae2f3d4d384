//! Static shape inference and constant folding.
//!
//! Nodes are visited in topological order. Each gets its outputs' element types and shapes;
//! a node whose inputs are all constants (and whose operator the host evaluator knows) is
//! evaluated at compile time ([`crate::eval`]), and operators that only need shapes
//! (`Shape`, `Size`) or compile-time inputs (`ConstantOfShape`, `Range`) always fold.
//! Inputs that decide shapes (Reshape's shape, Slice's starts, Pad's pads, Resize's sizes…)
//! must be constants here, possibly through `input_values` specialization.
//!
//! The operator parameter helpers (`slice_params`, `window_params`, …) live in
//! [`crate::params`], shared with folding and lowering.

use crate::error::{ErrorKind, Result};
use crate::graph::{Graph, Value};
use crate::params::{
    CUMSUM_MAX_LEN, Ctx, Out, broadcast_all, broadcast_shapes, conv_transpose_params,
    elementwise_dtype_check, konst, matmul_shape, out, pad_params, reduce_axes, require_float,
    reshape_shape, resize_params, slice_params, split_sizes, squeeze_axes, transpose_perm,
    unsupported_outputs, window_params,
};
use crate::tensor::{HostTensor, budget, dtype_from_onnx, is_float, onnx_type_name};
use nrt_hal::DType;
use std::rc::Rc;

/// Operators the compiler supports: on the device, or folded at compile time.
pub const SUPPORTED_OPS: &[&str] = &[
    "Abs",
    "Add",
    "And",
    "ArgMax",
    "ArgMin",
    "AveragePool",
    "BatchNormalization",
    "Cast",
    "CastLike",
    "Ceil",
    "Celu",
    "Clip",
    "Concat",
    "Constant",
    "ConstantOfShape",
    "Conv",
    "ConvTranspose",
    "CumSum",
    "DepthToSpace",
    "Div",
    "Dropout",
    "Elu",
    "Equal",
    "Erf",
    "Exp",
    "Expand",
    "Flatten",
    "Floor",
    "Gather",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "Greater",
    "GreaterOrEqual",
    "GroupNormalization",
    "HardSigmoid",
    "HardSwish",
    "Hardmax",
    "Identity",
    "InstanceNormalization",
    "LRN",
    "LayerNormalization",
    "LeakyRelu",
    "Less",
    "LessOrEqual",
    "Log",
    "LogSoftmax",
    "LpPool",
    "MatMul",
    "Max",
    "MaxPool",
    "Mean",
    "Min",
    "Mish",
    "Mod",
    "Mul",
    "Neg",
    "Not",
    "Or",
    "PRelu",
    "Pad",
    "Pow",
    "RMSNormalization",
    "Range",
    "Reciprocal",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceSum",
    "ReduceSumSquare",
    "Relu",
    "Reshape",
    "Resize",
    "Selu",
    "Shape",
    "Shrink",
    "Sigmoid",
    "Sign",
    "Size",
    "Slice",
    "Softmax",
    "Softplus",
    "Softsign",
    "SpaceToDepth",
    "Split",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Sum",
    "Swish",
    "Tanh",
    "ThresholdedRelu",
    "Tile",
    "Transpose",
    "Trilu",
    "Unsqueeze",
    "Where",
];

/// Operators computed only at compile time: a model where their inputs are not constants
/// is rejected as unsupported.
pub const FOLD_ONLY_OPS: &[&str] = &["ConstantOfShape", "Range", "Size"];

/// Infers the outputs of one node (constants included when the operator always folds).
fn infer_node(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let op = n.op.as_str();
    Ok(match op {
        "Constant" => {
            let t = if let Some(t) = n.attr_t("value")? {
                t
            } else if n.has_attr("value_float") {
                HostTensor::f32(vec![], vec![n.attr_f("value_float", 0.0)?])
            } else if let Some(v) = n.attr_floats("value_floats")? {
                HostTensor::f32(vec![v.len()], v)
            } else if n.has_attr("value_int") {
                HostTensor::i64(vec![], vec![n.attr_i("value_int", 0)?])
            } else if let Some(v) = n.attr_ints("value_ints")? {
                HostTensor::i64(vec![v.len()], v)
            } else {
                return Err(c.e(
                    ErrorKind::UnsupportedOp,
                    "Constant without a value / value_float(s) / value_int(s) attribute",
                ));
            };
            vec![konst(t)]
        }
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Equal" | "Less" | "Greater" | "GreaterOrEqual"
        | "LessOrEqual" | "And" | "Or" => {
            let a = c.input(0)?;
            let b = c.input(1)?;
            if op != "Pow" {
                elementwise_dtype_check(c, &[a, b])?;
            }
            let s = broadcast_all(c, &[a, b])?;
            let d = if matches!(
                op,
                "Equal" | "Less" | "Greater" | "GreaterOrEqual" | "LessOrEqual"
            ) {
                DType::Bool
            } else {
                a.dtype
            };
            vec![out(d, s)]
        }
        "Max" | "Min" | "Sum" | "Mean" => {
            let vals: Vec<&Value> = (0..n.inputs.len()).filter_map(|i| c.opt(i)).collect();
            if vals.is_empty() {
                return Err(c.bad_attr("no inputs"));
            }
            let d = elementwise_dtype_check(c, &vals)?;
            vec![out(d, broadcast_all(c, &vals)?)]
        }
        "Where" => {
            let (cond, a, b) = (c.input(0)?, c.input(1)?, c.input(2)?);
            if cond.dtype != DType::Bool {
                return Err(c.e(ErrorKind::UnsupportedDType, "condition is not bool"));
            }
            elementwise_dtype_check(c, &[a, b])?;
            vec![out(a.dtype, broadcast_all(c, &[cond, a, b])?)]
        }
        "Selu" | "Celu" | "HardSwish" | "Softsign" | "ThresholdedRelu" | "Shrink" | "Sign"
        | "Swish" | "Mish" => {
            let x = c.input(0)?;
            require_float(c, x)?;
            vec![out(x.dtype, x.shape.clone())]
        }
        "PRelu" => {
            let (x, slope) = (c.input(0)?, c.input(1)?);
            require_float(c, x)?;
            elementwise_dtype_check(c, &[x, slope])?;
            if broadcast_shapes(&x.shape, &slope.shape).as_deref() != Some(&x.shape[..]) {
                return Err(c.mismatch(format!(
                    "slope {:?} does not broadcast to the input {:?}",
                    slope.shape, x.shape
                )));
            }
            vec![out(x.dtype, x.shape.clone())]
        }
        "RMSNormalization" => {
            let (x, scale) = (c.input(0)?, c.input(1)?);
            require_float(c, x)?;
            let r = x.shape.len();
            c.norm_axis(n.attr_i("axis", -1)?, r)?;
            if broadcast_shapes(&x.shape, &scale.shape).as_deref() != Some(&x.shape[..]) {
                return Err(c.mismatch(format!(
                    "scale {:?} does not broadcast to the input {:?}",
                    scale.shape, x.shape
                )));
            }
            unsupported_outputs(c, 1)?;
            vec![out(x.dtype, x.shape.clone())]
        }
        "Tile" => {
            let x = c.input(0)?;
            let reps = c
                .const_ints(1, "repeats")?
                .ok_or_else(|| c.bad_attr("missing repeats"))?;
            if reps.len() != x.shape.len() || reps.iter().any(|&r| r < 0) {
                return Err(c.bad_attr(format!("repeats {reps:?} for rank {}", x.shape.len())));
            }
            let s = x
                .shape
                .iter()
                .zip(&reps)
                .map(|(&d, &r)| d.checked_mul(r as usize))
                .collect::<Option<Vec<usize>>>()
                .ok_or_else(|| c.e(ErrorKind::TooLarge, format!("repeats {reps:?}")))?;
            vec![out(x.dtype, s)]
        }
        "DepthToSpace" | "SpaceToDepth" => {
            let x = c.input(0)?;
            let bs = n.attr_i("blocksize", 0)?;
            if x.shape.len() != 4 || bs < 1 {
                return Err(c.bad_attr(format!("blocksize {bs} on a {:?} input", x.shape)));
            }
            // Bounded so that b·b and h·b, w·b (≤ 2^34 · 2^16) cannot overflow.
            if bs > 1 << 16 {
                return Err(c.bad_attr(format!("blocksize {bs} (at most 65536)")));
            }
            let (b, [nn, ch, h, w]) = (
                bs as usize,
                [x.shape[0], x.shape[1], x.shape[2], x.shape[3]],
            );
            let s = if op == "DepthToSpace" {
                if ch % (b * b) != 0 {
                    return Err(c.mismatch(format!("{ch} channels for blocksize {b}")));
                }
                vec![nn, ch / (b * b), h * b, w * b]
            } else {
                if h % b != 0 || w % b != 0 {
                    return Err(c.mismatch(format!("{h}×{w} for blocksize {b}")));
                }
                vec![nn, ch * b * b, h / b, w / b]
            };
            vec![out(x.dtype, s)]
        }
        "Sqrt" | "Reciprocal" | "Exp" | "Log" | "Erf" | "Relu" | "LeakyRelu" | "Sigmoid"
        | "HardSigmoid" | "Tanh" | "Gelu" | "Neg" | "Abs" | "Floor" | "Ceil" | "Softplus"
        | "Elu" | "Identity" | "Not" => {
            let x = c.input(0)?;
            if op == "Gelu" {
                let a = n.attr_s("approximate", "none")?;
                if a != "none" && a != "tanh" {
                    return Err(c.bad_attr(format!("approximate '{a}'")));
                }
            }
            vec![out(x.dtype, x.shape.clone())]
        }
        "Dropout" => {
            let x = c.input(0)?;
            if c.opset() >= 12
                && c.const_ints(2, "training_mode")?
                    .is_some_and(|t| t.first() != Some(&0))
            {
                // Training mode drops at random, except with ratio 0 (then it is inference).
                let ratio = c
                    .const_floats(1, "ratio")?
                    .and_then(|r| r.first().copied())
                    .unwrap_or(0.5);
                if ratio != 0.0 {
                    return Err(c.e(
                        ErrorKind::UnsupportedOp,
                        format!("training_mode = true with ratio {ratio} (random dropping)"),
                    ));
                }
            }
            unsupported_outputs(c, 2)?;
            let mut outs = vec![out(x.dtype, x.shape.clone())];
            if n.outputs.get(1).copied().flatten().is_some() {
                // Inference: nothing is dropped, the mask is all true (all 1 before opset 10,
                // where it has the input's type).
                let d = if c.opset() >= 10 {
                    DType::Bool
                } else {
                    x.dtype
                };
                let ones = HostTensor::try_from_f64s(
                    "the mask",
                    d,
                    x.shape.clone(),
                    std::iter::repeat(1.0),
                )
                .map_err(|e| e.at_node(&n.name, &n.op))?;
                outs.push(konst(ones));
            }
            outs
        }
        "ArgMax" | "ArgMin" => {
            let x = c.input(0)?;
            if !matches!(x.dtype, DType::F32 | DType::I32 | DType::I64) {
                return Err(c.e(
                    ErrorKind::UnsupportedDType,
                    format!(
                        "input '{}' is {}; f32, i32 and i64 are supported",
                        x.name, x.dtype
                    ),
                ));
            }
            let r = x.shape.len();
            let axis = c.norm_axis(n.attr_i("axis", 0)?, r)?;
            if x.shape.get(axis) == Some(&0) {
                return Err(c.mismatch("arg-reduction over an empty axis"));
            }
            let mut s = x.shape.clone();
            if n.attr_i("keepdims", 1)? != 0 {
                s[axis] = 1;
            } else {
                s.remove(axis);
            }
            vec![out(DType::I64, s)]
        }
        "Hardmax" => {
            let x = c.input(0)?;
            require_float(c, x)?;
            let def = if c.opset() >= 13 { -1 } else { 1 };
            c.norm_axis(n.attr_i("axis", def)?, x.shape.len())?;
            vec![out(x.dtype, x.shape.clone())]
        }
        "CumSum" => {
            let x = c.input(0)?;
            require_float(c, x)?;
            let axis = c
                .const_ints(1, "axis")?
                .and_then(|a| a.first().copied())
                .ok_or_else(|| c.bad_attr("missing axis"))?;
            let axis = c.norm_axis(axis, x.shape.len())?;
            if x.shape[axis] > CUMSUM_MAX_LEN {
                return Err(c.e(
                    ErrorKind::UnsupportedOp,
                    format!(
                        "CumSum over {} elements (at most {CUMSUM_MAX_LEN}: it is a product with a triangular matrix)",
                        x.shape[axis]
                    ),
                ));
            }
            vec![out(x.dtype, x.shape.clone())]
        }
        "Mod" => {
            let (a, b) = (c.input(0)?, c.input(1)?);
            elementwise_dtype_check(c, &[a, b])?;
            if is_float(a.dtype) && n.attr_i("fmod", 0)? != 1 {
                return Err(c.bad_attr("fmod must be 1 for floating-point inputs"));
            }
            vec![out(a.dtype, broadcast_all(c, &[a, b])?)]
        }
        "Trilu" => {
            let x = c.input(0)?;
            if x.shape.len() < 2 {
                return Err(c.mismatch(format!("Trilu of a rank-{} input", x.shape.len())));
            }
            if let Some(k) = c.const_ints(1, "k")?
                && k.len() != 1
            {
                return Err(c.bad_attr(format!("k has {} values (one expected)", k.len())));
            }
            vec![out(x.dtype, x.shape.clone())]
        }
        "LRN" => {
            let x = c.input(0)?;
            if x.shape.len() < 3 {
                return Err(c.mismatch(format!("LRN of a rank-{} input", x.shape.len())));
            }
            let size = n.attr_i("size", 0)?;
            if !(1..=1 << 20).contains(&size) {
                return Err(c.bad_attr(format!("size = {size} (must be in 1..=2^20)")));
            }
            vec![out(x.dtype, x.shape.clone())]
        }
        "Clip" => {
            let x = c.input(0)?;
            if c.opset() >= 11 {
                c.const_floats(1, "min")?;
                c.const_floats(2, "max")?;
            }
            vec![out(x.dtype, x.shape.clone())]
        }
        "Cast" => {
            let x = c.input(0)?;
            let to = n.attr_i("to", 0)? as i32;
            let d = dtype_from_onnx(to).ok_or_else(|| {
                c.e(
                    ErrorKind::UnsupportedDType,
                    format!("cast to {}", onnx_type_name(to)),
                )
            })?;
            if n.attr_i("saturate", 1)? != 1 && is_float(d) {
                // saturate only concerns float8 targets
            }
            vec![out(d, x.shape.clone())]
        }
        "CastLike" => {
            // Cast to the element type of the second input (only its type matters).
            let (x, like) = (c.input(0)?, c.input(1)?);
            match &x.konst {
                // Folds whenever the data is constant (the second input is not read).
                Some(t) => vec![konst(t.cast(like.dtype))],
                None => vec![out(like.dtype, x.shape.clone())],
            }
        }
        "MatMul" => {
            let (a, b) = (c.input(0)?, c.input(1)?);
            elementwise_dtype_check(c, &[a, b])?;
            vec![out(a.dtype, matmul_shape(c, &a.shape, &b.shape)?)]
        }
        "Gemm" => {
            let (a, b) = (c.input(0)?, c.input(1)?);
            if a.shape.len() != 2 || b.shape.len() != 2 {
                return Err(c.mismatch(format!("Gemm of {:?} and {:?}", a.shape, b.shape)));
            }
            let ta = n.attr_i("transA", 0)? != 0;
            let tb = n.attr_i("transB", 0)? != 0;
            let (m, k) = if ta {
                (a.shape[1], a.shape[0])
            } else {
                (a.shape[0], a.shape[1])
            };
            let (kb, nn) = if tb {
                (b.shape[1], b.shape[0])
            } else {
                (b.shape[0], b.shape[1])
            };
            if k != kb {
                return Err(c.mismatch(format!("Gemm inner sizes {k} ≠ {kb}")));
            }
            if let Some(cc) = c.opt(2)
                && broadcast_shapes(&cc.shape, &[m, nn]).as_deref() != Some(&[m, nn][..])
            {
                return Err(c.mismatch(format!(
                    "C {:?} does not broadcast to [{m}, {nn}]",
                    cc.shape
                )));
            }
            vec![out(a.dtype, vec![m, nn])]
        }
        "Softmax" | "LogSoftmax" => {
            let x = c.input(0)?;
            let def = if c.opset() >= 13 { -1 } else { 1 };
            c.norm_axis(n.attr_i("axis", def)?, x.shape.len())?;
            vec![out(x.dtype, x.shape.clone())]
        }
        "LayerNormalization" => {
            let x = c.input(0)?;
            let axis = c.norm_axis(n.attr_i("axis", -1)?, x.shape.len())?;
            let norm: usize = x.shape[axis..].iter().product();
            for i in [1, 2] {
                if let Some(p) = c.opt(i)
                    && (p.elements() != norm
                        || broadcast_shapes(&p.shape, &x.shape).as_deref() != Some(&x.shape[..]))
                {
                    return Err(c.mismatch(format!(
                        "scale/bias shape {:?} does not match the normalized shape {:?}",
                        p.shape,
                        &x.shape[axis..]
                    )));
                }
            }
            let mut stat = x.shape[..axis].to_vec();
            stat.resize(x.shape.len(), 1);
            vec![
                out(x.dtype, x.shape.clone()),
                out(DType::F32, stat.clone()),
                out(DType::F32, stat),
            ]
        }
        "InstanceNormalization" | "GroupNormalization" => {
            let (x, scale, bias) = (c.input(0)?, c.input(1)?, c.input(2)?);
            require_float(c, x)?;
            if x.shape.len() < 3 {
                return Err(c.mismatch(format!("input of rank {} (N, C, D…)", x.shape.len())));
            }
            let ch = x.shape[1];
            let groups = if op == "GroupNormalization" {
                let g = n.attr_i("num_groups", 0)?;
                if g < 1 || ch % g as usize != 0 {
                    return Err(c.bad_attr(format!("num_groups {g} for {ch} channels")));
                }
                g as usize
            } else {
                ch
            };
            for p in [scale, bias] {
                if p.elements() != ch && p.elements() != groups {
                    return Err(c.mismatch(format!(
                        "parameter '{}' has {} elements for {ch} channels",
                        p.name,
                        p.elements()
                    )));
                }
            }
            vec![out(x.dtype, x.shape.clone())]
        }
        "BatchNormalization" => {
            let x = c.input(0)?;
            if n.attr_i("training_mode", 0)? != 0 {
                return Err(c.e(ErrorKind::UnsupportedOp, "training_mode = 1"));
            }
            unsupported_outputs(c, 1)?;
            if x.shape.len() < 2 {
                return Err(c.mismatch("input of rank < 2"));
            }
            let ch = x.shape[1];
            for (i, what) in [(1, "scale"), (2, "bias"), (3, "mean"), (4, "var")] {
                c.const_floats(i, what)?;
            }
            for i in 1..5 {
                let p = c.input(i)?;
                if p.elements() != ch {
                    return Err(c.mismatch(format!(
                        "parameter '{}' has {} elements for {ch} channels",
                        p.name,
                        p.elements()
                    )));
                }
            }
            vec![out(x.dtype, x.shape.clone())]
        }
        "Conv" => {
            let (x, w) = (c.input(0)?, c.input(1)?);
            let r = x.shape.len();
            if r < 3 || w.shape.len() != r {
                return Err(c.mismatch(format!("Conv of {:?} with weights {:?}", x.shape, w.shape)));
            }
            if r > 4 {
                return Err(c.e(ErrorKind::UnsupportedOp, format!("{}-D convolution", r - 2)));
            }
            let group = n.attr_i("group", 1)?;
            if group < 1 || x.shape[1] as i64 % group != 0 || w.shape[0] as i64 % group != 0 {
                return Err(c.bad_attr(format!("group {group}")));
            }
            if w.shape[1] * group as usize != x.shape[1] {
                return Err(c.mismatch(format!(
                    "weights {:?} for {} input channels in {group} groups",
                    w.shape, x.shape[1]
                )));
            }
            let kernel: Vec<usize> = w.shape[2..].to_vec();
            if let Some(ks) = n.attr_ints("kernel_shape")?
                && ks.iter().map(|&k| k as usize).collect::<Vec<_>>() != kernel
            {
                return Err(c.mismatch(format!("kernel_shape {ks:?} but weights {:?}", w.shape)));
            }
            if let Some(b) = c.opt(2)
                && b.elements() != w.shape[0]
            {
                return Err(c.mismatch(format!(
                    "bias of {} for {} channels",
                    b.elements(),
                    w.shape[0]
                )));
            }
            let p = window_params(c, &x.shape[2..], kernel, false)?;
            let mut s = vec![x.shape[0], w.shape[0]];
            s.extend(&p.out);
            vec![out(x.dtype, s)]
        }
        "ConvTranspose" => {
            let (x, w) = (c.input(0)?, c.input(1)?);
            let r = x.shape.len();
            if r < 3 || w.shape.len() != r {
                return Err(c.mismatch(format!(
                    "ConvTranspose of {:?} with weights {:?}",
                    x.shape, w.shape
                )));
            }
            if r > 4 {
                return Err(c.e(ErrorKind::UnsupportedOp, format!("{}-D convolution", r - 2)));
            }
            let group = n.attr_i("group", 1)? as usize;
            if group < 1 || x.shape[1] % group != 0 || w.shape[0] != x.shape[1] {
                return Err(c.mismatch(format!(
                    "weights {:?} for {} input channels in {group} groups",
                    w.shape, x.shape[1]
                )));
            }
            let p = conv_transpose_params(c, &x.shape[2..], w.shape[2..].to_vec())?;
            let mut s = vec![x.shape[0], w.shape[1] * group];
            s.extend(&p.out);
            vec![out(x.dtype, s)]
        }
        "MaxPool" | "AveragePool" | "LpPool" => {
            let x = c.input(0)?;
            let r = x.shape.len();
            if r < 3 {
                return Err(c.mismatch(format!("pooling of rank-{r} input")));
            }
            if r > 5 {
                return Err(c.e(ErrorKind::UnsupportedOp, format!("{}-D pooling", r - 2)));
            }
            unsupported_outputs(c, 1)?;
            let ks = n
                .attr_ints("kernel_shape")?
                .ok_or_else(|| c.bad_attr("missing kernel_shape"))?;
            if ks.iter().any(|&k| k < 1) {
                return Err(c.bad_attr(format!("kernel_shape {ks:?}")));
            }
            let ceil = n.attr_i("ceil_mode", 0)? != 0;
            let p = window_params(
                c,
                &x.shape[2..],
                ks.iter().map(|&k| k as usize).collect(),
                ceil,
            )?;
            let mut s = x.shape[..2].to_vec();
            s.extend(&p.out);
            vec![out(x.dtype, s)]
        }
        "GlobalAveragePool" | "GlobalMaxPool" => {
            let x = c.input(0)?;
            if x.shape.len() < 3 {
                return Err(c.mismatch("global pooling of rank < 3"));
            }
            let mut s = x.shape[..2].to_vec();
            s.resize(x.shape.len(), 1);
            vec![out(x.dtype, s)]
        }
        "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceL1" | "ReduceL2"
        | "ReduceSumSquare" | "ReduceLogSum" | "ReduceLogSumExp" => {
            let x = c.input(0)?;
            let keep = n.attr_i("keepdims", 1)? != 0;
            let s = match reduce_axes(c, x.shape.len())? {
                None => x.shape.clone(),
                Some(axes) => {
                    let mut s = Vec::new();
                    for (i, &d) in x.shape.iter().enumerate() {
                        if axes.contains(&i) {
                            if keep {
                                s.push(1);
                            }
                        } else {
                            s.push(d);
                        }
                    }
                    s
                }
            };
            vec![out(x.dtype, s)]
        }
        "Reshape" => {
            let x = c.input(0)?;
            let spec = if c.opset() < 5 {
                n.attr_ints("shape")?.unwrap_or_default()
            } else {
                c.const_ints(1, "shape")?
                    .ok_or_else(|| c.bad_attr("missing shape"))?
            };
            vec![out(x.dtype, reshape_shape(c, &x.shape, &spec)?)]
        }
        "Flatten" => {
            let x = c.input(0)?;
            let r = x.shape.len();
            let a = n.attr_i("axis", 1)?;
            let axis = if a == r as i64 { r } else { c.norm_axis(a, r)? };
            let outer: usize = x.shape[..axis].iter().product();
            let inner: usize = x.shape[axis..].iter().product();
            vec![out(x.dtype, vec![outer, inner])]
        }
        "Squeeze" => {
            let x = c.input(0)?;
            let axes = squeeze_axes(c)?;
            let r = x.shape.len();
            let axes: Vec<usize> = match axes {
                Some(a) => a
                    .iter()
                    .map(|&v| c.norm_axis(v, r))
                    .collect::<Result<_>>()?,
                None => (0..r).filter(|&i| x.shape[i] == 1).collect(),
            };
            for &a in &axes {
                if x.shape[a] != 1 {
                    return Err(
                        c.mismatch(format!("cannot squeeze axis {a} of size {}", x.shape[a]))
                    );
                }
            }
            let s = (0..r)
                .filter(|i| !axes.contains(i))
                .map(|i| x.shape[i])
                .collect();
            vec![out(x.dtype, s)]
        }
        "Unsqueeze" => {
            let x = c.input(0)?;
            let axes = squeeze_axes(c)?.ok_or_else(|| c.bad_attr("missing axes"))?;
            let r = x.shape.len() + axes.len();
            let mut ax: Vec<usize> = axes
                .iter()
                .map(|&v| c.norm_axis(v, r))
                .collect::<Result<_>>()?;
            ax.sort_unstable();
            if ax.windows(2).any(|w| w[0] == w[1]) {
                return Err(c.bad_attr(format!("repeated axes {axes:?}")));
            }
            let mut s = Vec::with_capacity(r);
            let mut it = x.shape.iter();
            for i in 0..r {
                if ax.contains(&i) {
                    s.push(1);
                } else {
                    s.push(*it.next().expect("rank"));
                }
            }
            vec![out(x.dtype, s)]
        }
        "Transpose" => {
            let x = c.input(0)?;
            let p = transpose_perm(c, x.shape.len())?;
            vec![out(x.dtype, p.iter().map(|&a| x.shape[a]).collect())]
        }
        "Concat" => {
            let vals: Vec<&Value> = (0..n.inputs.len()).filter_map(|i| c.opt(i)).collect();
            if vals.is_empty() {
                return Err(c.bad_attr("no inputs"));
            }
            let d = elementwise_dtype_check(c, &vals)?;
            let r = vals[0].shape.len();
            let axis = c
                .norm_axis(
                    n.attr_i("axis", if c.opset() < 4 { 1 } else { i64::MIN })?,
                    r,
                )
                .map_err(|_| c.bad_attr("missing or invalid axis"))?;
            let mut s = vals[0].shape.clone();
            s[axis] = 0;
            for v in &vals {
                if v.shape.len() != r || (0..r).any(|i| i != axis && v.shape[i] != vals[0].shape[i])
                {
                    return Err(c.mismatch(format!(
                        "cannot concatenate {:?} and {:?} along axis {axis}",
                        vals[0].shape, v.shape
                    )));
                }
                s[axis] += v.shape[axis];
            }
            vec![out(d, s)]
        }
        "Split" => {
            let x = c.input(0)?;
            let axis = c.norm_axis(n.attr_i("axis", 0)?, x.shape.len())?;
            let sizes = split_sizes(c, x.shape[axis])?;
            sizes
                .iter()
                .map(|&k| {
                    let mut s = x.shape.clone();
                    s[axis] = k;
                    out(x.dtype, s)
                })
                .collect()
        }
        "Slice" => {
            let x = c.input(0)?;
            let p = slice_params(c, &x.shape)?;
            vec![out(x.dtype, p.iter().map(|t| t.1).collect())]
        }
        "Gather" => {
            let (x, i) = (c.input(0)?, c.input(1)?);
            if !matches!(i.dtype, DType::I32 | DType::I64) {
                return Err(c.e(
                    ErrorKind::UnsupportedDType,
                    format!("indices of type {}", i.dtype),
                ));
            }
            if x.shape.is_empty() {
                return Err(c.mismatch("Gather from a scalar"));
            }
            let axis = c.norm_axis(n.attr_i("axis", 0)?, x.shape.len())?;
            if let Some(t) = c.konst(1) {
                let lim = x.shape[axis] as i64;
                if let Some(bad) = t.to_i64s().into_iter().find(|&v| v < -lim || v >= lim) {
                    return Err(c.bad_attr(format!("index {bad} is out of range for size {lim}")));
                }
            }
            let mut s = x.shape[..axis].to_vec();
            s.extend(&i.shape);
            s.extend(&x.shape[axis + 1..]);
            vec![out(x.dtype, s)]
        }
        "Expand" => {
            let x = c.input(0)?;
            let spec = c
                .const_ints(1, "shape")?
                .ok_or_else(|| c.bad_attr("missing shape"))?;
            if spec.iter().any(|&d| d < 0) {
                return Err(c.bad_attr(format!("shape {spec:?}")));
            }
            let spec: Vec<usize> = spec.iter().map(|&d| d as usize).collect();
            let s = broadcast_shapes(&x.shape, &spec)
                .ok_or_else(|| c.mismatch(format!("cannot expand {:?} to {spec:?}", x.shape)))?;
            vec![out(x.dtype, s)]
        }
        "Shape" => {
            let x = c.input(0)?;
            let r = x.shape.len() as i64;
            let clampi = |v: i64| if v < 0 { (v + r).max(0) } else { v.min(r) };
            let start = clampi(n.attr_i("start", 0)?) as usize;
            let end = clampi(n.attr_i("end", r)?) as usize;
            let v: Vec<i64> = x.shape[start..end.max(start)]
                .iter()
                .map(|&d| d as i64)
                .collect();
            vec![konst(HostTensor::i64(vec![v.len()], v))]
        }
        "Size" => {
            let x = c.input(0)?;
            vec![konst(HostTensor::i64(vec![], vec![x.elements() as i64]))]
        }
        "ConstantOfShape" => {
            let s = c.const_ints(0, "shape")?.unwrap_or_default();
            if s.iter().any(|&d| d < 0) {
                return Err(c.bad_attr(format!("shape {s:?}")));
            }
            let shape: Vec<usize> = s.iter().map(|&d| d as usize).collect();
            let v = n
                .attr_t("value")?
                .unwrap_or_else(|| HostTensor::f32(vec![1], vec![0.0]));
            if v.len() != 1 {
                return Err(c.bad_attr("value must hold one element"));
            }
            let t = HostTensor::try_from_f64s(
                "the output",
                v.dtype,
                shape,
                std::iter::repeat(v.get_f64(0)),
            )
            .map_err(|e| e.at_node(&n.name, &n.op))?;
            vec![konst(t)]
        }
        "Range" => {
            let (s, l, d) = (c.input(0)?, c.konst(1), c.konst(2));
            let (Some(st), Some(li), Some(de)) = (c.konst(0), l, d) else {
                return Err(c.e(
                    ErrorKind::UnsupportedOp,
                    "Range inputs must be known at compile time",
                ));
            };
            let (a, b, dd) = (st.get_f64(0), li.get_f64(0), de.get_f64(0));
            if dd == 0.0 {
                return Err(c.bad_attr("delta is 0"));
            }
            // Saturating float-to-int: NaN gives 0, ±inf and huge counts give usize::MAX,
            // which the budget then refuses.
            let cnt = ((b - a) / dd).ceil().max(0.0) as usize;
            let t = HostTensor::try_from_f64s(
                "the output",
                s.dtype,
                vec![cnt],
                (0..cnt).map(|i| a + i as f64 * dd),
            )
            .map_err(|e| e.at_node(&n.name, &n.op))?;
            vec![konst(t)]
        }
        "Pad" => {
            let x = c.input(0)?;
            let (pads, mode, _) = pad_params(c, x.shape.len())?;
            let mut s = Vec::new();
            for (i, &(b, e)) in pads.iter().enumerate() {
                // pad_params bounded b and e: this neither overflows nor goes negative.
                let d = x.shape[i] as i64 + b + e;
                if mode == "reflect" && (b.max(e) >= x.shape[i] as i64) && (b > 0 || e > 0) {
                    return Err(c.bad_attr(format!("reflect pad {b}/{e} ≥ size {}", x.shape[i])));
                }
                if (mode == "edge" || mode == "wrap") && x.shape[i] == 0 && (b > 0 || e > 0) {
                    return Err(c.bad_attr("edge/wrap padding of an empty axis"));
                }
                if mode == "wrap" && b.max(e) > x.shape[i] as i64 {
                    return Err(c.e(ErrorKind::UnsupportedOp, "wrap padding wider than the axis"));
                }
                s.push(d as usize);
            }
            vec![out(x.dtype, s)]
        }
        "Resize" => {
            let x = c.input(0)?;
            let p = resize_params(c, &x.shape)?;
            vec![out(x.dtype, p.out)]
        }
        _ => {
            return Err(c.e(
                ErrorKind::UnsupportedOp,
                format!("operator '{op}' is not supported"),
            ));
        }
    })
}

/// Operators the host evaluator folds when all their inputs are constants.
fn foldable(op: &str) -> bool {
    !matches!(
        op,
        "Conv"
            | "ConvTranspose"
            | "MaxPool"
            | "AveragePool"
            | "LpPool"
            | "GlobalAveragePool"
            | "GlobalMaxPool"
            | "Resize"
            | "LayerNormalization"
            | "BatchNormalization"
            | "Softmax"
            | "LogSoftmax"
            | "Pad"
            | "Gemm"
            | "LRN"
    )
}

/// Infers every value's type and shape and folds what can be computed at compile time.
pub fn infer(g: &mut Graph) -> Result<()> {
    for ni in 0..g.nodes.len() {
        let n = &g.nodes[ni];
        let c = Ctx { g, n };
        let outs = infer_node(&c)?;
        // One size budget for every value, checked before anything of that size is folded,
        // planned or emitted (D5, D7): shapes come from the model and may be anything.
        for (k, o) in outs.iter().enumerate() {
            let name = n
                .outputs
                .get(k)
                .copied()
                .flatten()
                .map_or("", |v| g.values[v].name.as_str());
            budget(&format!("output {k} ('{name}')"), &o.shape, o.dtype)
                .map_err(|e| e.at_node(&n.name, &n.op))?;
        }
        let all_const = n
            .inputs
            .iter()
            .all(|i| i.is_none_or(|v| g.values[v].konst.is_some()));
        let folded: Option<Vec<HostTensor>> = if outs.iter().all(|o| o.konst.is_some()) {
            Some(
                outs.iter()
                    .map(|o| o.konst.clone().expect("checked"))
                    .collect(),
            )
        } else if all_const && foldable(&n.op) && n.inputs.iter().any(|i| i.is_some()) {
            crate::eval::eval(&c, &outs)?
        } else {
            None
        };
        if folded.is_none() && FOLD_ONLY_OPS.contains(&n.op.as_str()) {
            return Err(c.e(
                ErrorKind::UnsupportedOp,
                "this operator is only supported on compile-time constant inputs",
            ));
        }
        // Computing ops need f32 (integer tensors are for shapes and indices).
        if folded.is_none() {
            check_device_dtypes(&c)?;
        }
        let ids: Vec<Option<usize>> = n.outputs.clone();
        for (k, id) in ids.iter().enumerate() {
            let Some(id) = *id else { continue };
            let Some(o) = outs.get(k) else {
                return Err(g.nodes[ni].error(
                    ErrorKind::UnsupportedOp,
                    format!("output {k} is not supported"),
                ));
            };
            let v = &mut g.values[id];
            v.dtype = o.dtype;
            v.shape = o.shape.clone();
            v.konst = match &folded {
                Some(f) => Some(Rc::new(f[k].clone())),
                // An output known whatever the inputs (Dropout's inference mask).
                None => o.konst.clone().map(Rc::new),
            };
        }
    }
    Ok(())
}

/// Rejects element types the device cannot compute for this operator.
fn check_device_dtypes(c: &Ctx) -> Result<()> {
    let op = c.n.op.as_str();
    let x = match c.opt(0) {
        Some(x) => x,
        None => return Ok(()),
    };
    let float_only = matches!(
        op,
        "Sqrt"
            | "Reciprocal"
            | "Exp"
            | "Log"
            | "Erf"
            | "Relu"
            | "LeakyRelu"
            | "Sigmoid"
            | "HardSigmoid"
            | "Tanh"
            | "Gelu"
            | "Abs"
            | "Neg"
            | "Floor"
            | "Ceil"
            | "Softplus"
            | "Elu"
            | "Clip"
            | "MatMul"
            | "Gemm"
            | "Softmax"
            | "LogSoftmax"
            | "LayerNormalization"
            | "BatchNormalization"
            | "LRN"
            | "Conv"
            | "ConvTranspose"
            | "MaxPool"
            | "AveragePool"
            | "LpPool"
            | "GlobalAveragePool"
            | "GlobalMaxPool"
            | "ReduceMean"
            | "ReduceL1"
            | "ReduceL2"
            | "ReduceSumSquare"
            | "ReduceLogSum"
            | "ReduceLogSumExp"
            | "Resize"
            | "Pow"
    );
    if float_only && op != "Pow" {
        require_float(c, x)?;
    }
    let reduce = matches!(op, "ReduceSum" | "ReduceMax" | "ReduceMin");
    if reduce && !matches!(x.dtype, DType::F32 | DType::I32 | DType::I64) {
        return Err(c.e(
            ErrorKind::UnsupportedDType,
            format!(
                "input '{}' is {}; reductions compute f32, i32 and i64",
                x.name, x.dtype
            ),
        ));
    }
    // Elementwise: narrower integers and halves are widened to i64 / f32 around the
    // operation; u64 would not survive the round trip.
    let elementwise = matches!(
        op,
        "Add"
            | "Sub"
            | "Mul"
            | "Div"
            | "Max"
            | "Min"
            | "Sum"
            | "Equal"
            | "Less"
            | "Greater"
            | "GreaterOrEqual"
            | "LessOrEqual"
            | "Mod"
            | "Pow"
    );
    if elementwise && matches!(x.dtype, DType::U64 | DType::Bool) {
        return Err(c.e(
            ErrorKind::UnsupportedDType,
            format!(
                "input '{}' is {}; the device computes f32, i32 and i64",
                x.name, x.dtype
            ),
        ));
    }
    Ok(())
}
