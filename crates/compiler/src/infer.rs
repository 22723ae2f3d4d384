//! Static shape inference and constant folding.
//!
//! Nodes are visited in topological order. Each gets its outputs' element types and shapes;
//! a node whose inputs are all constants (and whose operator the host evaluator knows) is
//! evaluated at compile time ([`crate::eval`]), and operators that only need shapes
//! (`Shape`, `Size`) or compile-time inputs (`ConstantOfShape`, `Range`) always fold.
//! Inputs that decide shapes (Reshape's shape, Slice's starts, Pad's pads, Resize's sizes…)
//! must be constants here, possibly through `input_values` specialization.
//!
//! The operator parameter helpers (`slice_params`, `conv_params`, …) are shared with
//! lowering, so both read attributes and inputs the same way.

use crate::error::{CompileError, ErrorKind, Result};
use crate::graph::{Graph, Node, Value};
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

/// Longest axis a CumSum may run along (it costs `len²` multiply-adds per row).
pub(crate) const CUMSUM_MAX_LEN: usize = 4096;

/// Operators computed only at compile time: a model where their inputs are not constants
/// is rejected as unsupported.
pub const FOLD_ONLY_OPS: &[&str] = &["ConstantOfShape", "Range", "Size"];

/// Inferred facts about one output.
#[derive(Clone, Debug)]
pub(crate) struct Out {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub konst: Option<HostTensor>,
}

fn out(dtype: DType, shape: Vec<usize>) -> Out {
    Out {
        dtype,
        shape,
        konst: None,
    }
}

fn konst(t: HostTensor) -> Out {
    Out {
        dtype: t.dtype,
        shape: t.shape.clone(),
        konst: Some(t),
    }
}

/// A node with its graph: the accessors every operator's inference and lowering use.
#[derive(Clone, Copy)]
pub(crate) struct Ctx<'a> {
    pub g: &'a Graph,
    pub n: &'a Node,
}

impl<'a> Ctx<'a> {
    pub fn e(&self, kind: ErrorKind, msg: impl Into<String>) -> CompileError {
        self.n.error(kind, msg)
    }

    pub fn opset(&self) -> i64 {
        self.g.opset
    }

    /// Input `i`, which must be present.
    pub fn input(&self, i: usize) -> Result<&'a Value> {
        match self.n.inputs.get(i).copied().flatten() {
            Some(v) => Ok(&self.g.values[v]),
            None => Err(self.e(
                ErrorKind::BadAttribute,
                format!("required input {i} is missing"),
            )),
        }
    }

    /// Input `i`, if present.
    pub fn opt(&self, i: usize) -> Option<&'a Value> {
        self.n
            .inputs
            .get(i)
            .copied()
            .flatten()
            .map(|v| &self.g.values[v])
    }

    /// The constant contents of input `i`, if present and constant.
    pub fn konst(&self, i: usize) -> Option<&'a HostTensor> {
        self.opt(i).and_then(|v| v.konst.as_deref())
    }

    /// Input `i` as compile-time integers (`None` if absent); an error if it is not constant.
    pub fn const_ints(&self, i: usize, what: &str) -> Result<Option<Vec<i64>>> {
        match self.opt(i) {
            None => Ok(None),
            Some(v) if v.elements() == 0 && v.konst.is_none() => Ok(Some(Vec::new())),
            Some(v) => match &v.konst {
                Some(t) => Ok(Some(t.to_i64s())),
                None => Err(self.e(
                    ErrorKind::UnsupportedOp,
                    format!(
                        "input '{}' ({what}) must be known at compile time; give its value with input_values",
                        v.name
                    ),
                )),
            },
        }
    }

    /// Input `i` as compile-time floats.
    pub fn const_floats(&self, i: usize, what: &str) -> Result<Option<Vec<f32>>> {
        match self.opt(i) {
            None => Ok(None),
            Some(v) => match &v.konst {
                Some(t) => Ok(Some(t.to_f32s())),
                None => Err(self.e(
                    ErrorKind::UnsupportedOp,
                    format!(
                        "input '{}' ({what}) must be known at compile time; give its value with input_values",
                        v.name
                    ),
                )),
            },
        }
    }

    pub fn norm_axis(&self, axis: i64, rank: usize) -> Result<usize> {
        let r = rank as i64;
        if axis < -r || axis >= r.max(1) {
            return Err(self.e(
                ErrorKind::BadAttribute,
                format!("axis {axis} is out of range for rank {rank}"),
            ));
        }
        Ok(if axis < 0 { axis + r } else { axis } as usize)
    }

    pub fn bad_attr(&self, msg: impl Into<String>) -> CompileError {
        self.e(ErrorKind::BadAttribute, msg)
    }

    pub fn mismatch(&self, msg: impl Into<String>) -> CompileError {
        self.e(ErrorKind::ShapeMismatch, msg)
    }
}

/// Multidirectional (numpy) broadcast of two shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for i in 0..r {
        let da = if i + a.len() >= r {
            a[i + a.len() - r]
        } else {
            1
        };
        let db = if i + b.len() >= r {
            b[i + b.len() - r]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// Per-axis `(start, length, step)` of a Slice.
pub(crate) fn slice_params(c: &Ctx, shape: &[usize]) -> Result<Vec<(i64, usize, i64)>> {
    let n = c.n;
    let (starts, ends, axes, steps) = if c.opset() < 10 {
        let starts = n
            .attr_ints("starts")?
            .ok_or_else(|| c.bad_attr("missing 'starts'"))?;
        let ends = n
            .attr_ints("ends")?
            .ok_or_else(|| c.bad_attr("missing 'ends'"))?;
        (starts, ends, n.attr_ints("axes")?, None)
    } else {
        let starts = c.const_ints(1, "starts")?.unwrap_or_default();
        let ends = c.const_ints(2, "ends")?.unwrap_or_default();
        (
            starts,
            ends,
            c.const_ints(3, "axes")?,
            c.const_ints(4, "steps")?,
        )
    };
    let rank = shape.len();
    let axes: Vec<i64> = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(c.bad_attr("starts, ends, axes and steps differ in length"));
    }
    let mut p: Vec<(i64, usize, i64)> = shape.iter().map(|&d| (0, d, 1)).collect();
    let mut seen = vec![false; rank];
    for i in 0..starts.len() {
        let ax = c.norm_axis(axes[i], rank)?;
        if seen[ax] {
            return Err(c.bad_attr(format!("axis {ax} is sliced twice")));
        }
        seen[ax] = true;
        let d = shape[ax] as i64;
        let step = steps[i];
        if step == 0 {
            return Err(c.bad_attr("a slice step is 0"));
        }
        let clampi = |v: i64, lo: i64, hi: i64| v.max(lo).min(hi);
        let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
        let (start, end) = if step > 0 {
            (clampi(norm(starts[i]), 0, d), clampi(norm(ends[i]), 0, d))
        } else {
            (
                clampi(norm(starts[i]), -1, d - 1),
                clampi(norm(ends[i]), -1, d - 1),
            )
        };
        // i128: a step of i64::MAX (or MIN) must not overflow the ceiling division.
        let (st, en, sp) = (start as i128, end as i128, step as i128);
        let len = if sp > 0 {
            if en > st { (en - st + sp - 1) / sp } else { 0 }
        } else if st > en {
            (st - en - sp - 1) / -sp
        } else {
            0
        } as i64; // ≤ d
        p[ax] = (if len == 0 { 0 } else { start }, len as usize, step);
    }
    Ok(p)
}

/// Per-axis `(begin, end)` pads, mode, constant value.
pub(crate) type PadParams = (Vec<(i64, i64)>, String, f64);

/// Pad parameters: per-axis `(begin, end)` (negative = crop), mode, constant value.
pub(crate) fn pad_params(c: &Ctx, rank: usize) -> Result<PadParams> {
    let n = c.n;
    let mode = n.attr_s("mode", "constant")?;
    if !["constant", "reflect", "edge", "wrap"].contains(&mode.as_str()) {
        return Err(c.bad_attr(format!("pad mode '{mode}' is not supported")));
    }
    let (pads, value, axes) = if c.opset() < 11 {
        let p = n
            .attr_ints("pads")?
            .or(n.attr_ints("paddings")?)
            .ok_or_else(|| c.bad_attr("missing 'pads'"))?;
        (p, n.attr_f("value", 0.0)? as f64, None)
    } else {
        let p = c
            .const_ints(1, "pads")?
            .ok_or_else(|| c.bad_attr("missing pads"))?;
        let v = match c.opt(2) {
            Some(v) if v.elements() > 0 => c
                .const_floats(2, "constant_value")?
                .map_or(0.0, |v| v[0] as f64),
            _ => 0.0,
        };
        (p, v, c.const_ints(3, "axes")?)
    };
    let axes: Vec<usize> = match axes {
        Some(a) => a
            .iter()
            .map(|&x| c.norm_axis(x, rank))
            .collect::<Result<_>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(c.bad_attr(format!(
            "{} pads for {} axes (expected twice as many)",
            pads.len(),
            axes.len()
        )));
    }
    let mut out = vec![(0i64, 0i64); rank];
    for (i, &a) in axes.iter().enumerate() {
        out[a] = (pads[i], pads[i + axes.len()]);
    }
    // Every later computation (`size + begin + end`, crops, offsets) is on these numbers:
    // bound them here, once, with exact arithmetic (D11: `[0, i64::MIN, 0, i64::MAX]`
    // overflowed into an emitted model that did not validate).
    let x = c.input(0)?;
    for (axis, &(b, e)) in out.iter().enumerate() {
        let d = x.shape.get(axis).copied().unwrap_or(0) as i128;
        let (b, e) = (b as i128, e as i128);
        let limit = crate::tensor::MAX_TENSOR_BYTES as i128;
        let why = if b < -d || e < -d {
            "crops more than the axis holds"
        } else if d + b + e < 0 {
            "crops the axis below zero"
        } else if b > limit || e > limit {
            "is larger than the compiler's tensor budget"
        } else {
            continue;
        };
        return Err(c.bad_attr(format!(
            "pads {pads:?}: axis {axis} (size {d}) pad begin {b} / end {e} {why}"
        )));
    }
    Ok((out, mode, value))
}

/// Convolution / pooling window geometry over the spatial dimensions.
#[derive(Clone, Debug)]
pub(crate) struct WindowParams {
    pub kernel: Vec<usize>,
    pub strides: Vec<usize>,
    pub dilations: Vec<usize>,
    pub pad_begin: Vec<usize>,
    pub pad_end: Vec<usize>,
    /// Extra end padding ceil_mode needs (not counted as padding by average pooling).
    pub ceil_extra: Vec<usize>,
    pub out: Vec<usize>,
}

/// Largest kernel size, stride, dilation, pad or output padding a window attribute may hold
/// (2^31). With spatial sizes inside the tensor budget (≤ 2^34), every window computation
/// below (`dilation · (kernel − 1)`, `size + pads`, `(out − 1) · stride`) stays far inside
/// `usize`/`i64`, so none of them can wrap into a plausible shape.
pub(crate) const MAX_WINDOW_ATTR: i64 = 1 << 31;

/// Window parameters of Conv / MaxPool / AveragePool on spatial sizes `spatial`.
pub(crate) fn window_params(
    c: &Ctx,
    spatial: &[usize],
    kernel: Vec<usize>,
    ceil_mode: bool,
) -> Result<WindowParams> {
    let n = c.n;
    let r = spatial.len();
    let get = |name: &str, def: usize| -> Result<Vec<usize>> {
        match n.attr_ints(name)? {
            None => Ok(vec![def; r]),
            Some(v) if v.len() == r && v.iter().all(|&x| (1..=MAX_WINDOW_ATTR).contains(&x)) => {
                Ok(v.iter().map(|&x| x as usize).collect())
            }
            Some(v) => Err(c.bad_attr(format!(
                "'{name}' = {v:?} for {r} spatial dims (each in 1..={MAX_WINDOW_ATTR})"
            ))),
        }
    };
    let strides = get("strides", 1)?;
    let dilations = get("dilations", 1)?;
    if kernel.len() != r
        || kernel.contains(&0)
        || kernel.iter().any(|&k| k as i64 > MAX_WINDOW_ATTR)
    {
        return Err(c.bad_attr(format!("kernel shape {kernel:?} for {r} spatial dims")));
    }
    let auto_pad = n.attr_s("auto_pad", "NOTSET")?;
    let mut pb = vec![0usize; r];
    let mut pe = vec![0usize; r];
    match auto_pad.as_str() {
        "NOTSET" => {
            if let Some(p) = n.attr_ints("pads")? {
                if p.len() != 2 * r || p.iter().any(|&x| !(0..=MAX_WINDOW_ATTR).contains(&x)) {
                    return Err(c.bad_attr(format!(
                        "pads {p:?} for {r} spatial dims (each in 0..={MAX_WINDOW_ATTR})"
                    )));
                }
                for i in 0..r {
                    pb[i] = p[i] as usize;
                    pe[i] = p[i + r] as usize;
                }
            }
        }
        "VALID" => {}
        "SAME_UPPER" | "SAME_LOWER" => {
            for i in 0..r {
                let o = spatial[i].div_ceil(strides[i]);
                let span = dilations[i] * (kernel[i] - 1) + 1;
                let total = ((o - 1) * strides[i] + span).saturating_sub(spatial[i]);
                let (small, big) = (total / 2, total - total / 2);
                if auto_pad == "SAME_UPPER" {
                    (pb[i], pe[i]) = (small, big);
                } else {
                    (pb[i], pe[i]) = (big, small);
                }
            }
        }
        other => return Err(c.bad_attr(format!("auto_pad '{other}' is not supported"))),
    }
    let mut outs = Vec::with_capacity(r);
    let mut extra = vec![0usize; r];
    for i in 0..r {
        let padded = spatial[i] + pb[i] + pe[i];
        let span = dilations[i] * (kernel[i] - 1) + 1;
        if padded < span {
            return Err(c.mismatch(format!(
                "window of extent {span} does not fit spatial size {} with padding {}+{}",
                spatial[i], pb[i], pe[i]
            )));
        }
        let mut o = if ceil_mode {
            (padded - span).div_ceil(strides[i]) + 1
        } else {
            (padded - span) / strides[i] + 1
        };
        if ceil_mode && (o - 1) * strides[i] >= spatial[i] + pb[i] {
            o -= 1;
        }
        let need = (o - 1) * strides[i] + span;
        extra[i] = need.saturating_sub(padded);
        outs.push(o);
    }
    Ok(WindowParams {
        kernel,
        strides,
        dilations,
        pad_begin: pb,
        pad_end: pe,
        ceil_extra: extra,
        out: outs,
    })
}

/// ConvTranspose geometry: `(window on the zero-inserted input, output spatial sizes)`.
/// The window's pads are those of the equivalent direct convolution (may be negative:
/// returned as `i64`).
pub(crate) struct ConvTransposeParams {
    pub strides: Vec<usize>,
    pub dilations: Vec<usize>,
    /// Padding of the equivalent stride-1 convolution over the zero-inserted input.
    pub conv_pad_begin: Vec<i64>,
    pub conv_pad_end: Vec<i64>,
    pub out: Vec<usize>,
}

pub(crate) fn conv_transpose_params(
    c: &Ctx,
    spatial: &[usize],
    kernel: Vec<usize>,
) -> Result<ConvTransposeParams> {
    let n = c.n;
    let r = spatial.len();
    let get = |name: &str, def: i64| -> Result<Vec<i64>> {
        match n.attr_ints(name)? {
            None => Ok(vec![def; r]),
            Some(v) if v.len() == r => Ok(v),
            Some(v) => Err(c.bad_attr(format!("'{name}' = {v:?} for {r} spatial dims"))),
        }
    };
    let strides = get("strides", 1)?;
    let dilations = get("dilations", 1)?;
    let out_pad = get("output_padding", 0)?;
    let in_window = |x: i64, lo: i64| (lo..=MAX_WINDOW_ATTR).contains(&x);
    if !strides.iter().chain(&dilations).all(|&x| in_window(x, 1))
        || !out_pad.iter().all(|&x| in_window(x, 0))
        || kernel.iter().any(|&k| k as i64 > MAX_WINDOW_ATTR)
    {
        return Err(c.bad_attr(format!(
            "strides {strides:?} / dilations {dilations:?} must be in 1..={MAX_WINDOW_ATTR}, \
             output_padding {out_pad:?} in 0..={MAX_WINDOW_ATTR}"
        )));
    }
    let auto_pad = n.attr_s("auto_pad", "NOTSET")?;
    let mut pb = vec![0i64; r];
    let mut pe = vec![0i64; r];
    // The full output extent, exact: stride (≤ 2^31) × size (≤ 2^34) exceeds i64.
    let full = |i: usize| -> Result<i64> {
        let f = strides[i] as i128 * (spatial[i] as i128 - 1)
            + out_pad[i] as i128
            + dilations[i] as i128 * (kernel[i] as i128 - 1)
            + 1;
        i64::try_from(f)
            .ok()
            .filter(|&f| f <= 1 << 40)
            .ok_or_else(|| {
                c.bad_attr(format!(
                    "strides {strides:?}: output extent {f} along spatial axis {i} is too large"
                ))
            })
    };
    if let Some(os) = n.attr_ints("output_shape")? {
        let os = if os.len() == r + 2 {
            os[2..].to_vec()
        } else {
            os
        };
        if os.len() != r || !os.iter().all(|&x| in_window(x, 0)) {
            return Err(c.bad_attr(format!("output_shape {os:?} for {r} spatial dims")));
        }
        for i in 0..r {
            // Floor division, as the reference: a negative total extends the end.
            let total = full(i)? - os[i];
            let half = total.div_euclid(2);
            if auto_pad == "SAME_UPPER" {
                (pb[i], pe[i]) = (half, total - half);
            } else {
                (pb[i], pe[i]) = (total - half, half);
            }
        }
    } else {
        match auto_pad.as_str() {
            "NOTSET" => {
                if let Some(p) = n.attr_ints("pads")? {
                    if p.len() != 2 * r || !p.iter().all(|&x| in_window(x.saturating_abs(), 0)) {
                        return Err(c.bad_attr(format!("pads {p:?} for {r} spatial dims")));
                    }
                    pb.copy_from_slice(&p[..r]);
                    pe.copy_from_slice(&p[r..]);
                }
            }
            "VALID" => {}
            "SAME_UPPER" | "SAME_LOWER" => {
                for i in 0..r {
                    let target = spatial[i] as i128 * strides[i] as i128;
                    let total = (full(i)? as i128 - target).max(0) as i64; // ≤ full(i)
                    if auto_pad == "SAME_UPPER" {
                        (pb[i], pe[i]) = (total / 2, total - total / 2);
                    } else {
                        (pb[i], pe[i]) = (total - total / 2, total / 2);
                    }
                }
            }
            other => return Err(c.bad_attr(format!("auto_pad '{other}' is not supported"))),
        }
    }
    let mut outs = Vec::new();
    let mut cb = Vec::new();
    let mut ce = Vec::new();
    for i in 0..r {
        let o = full(i)? - pb[i] - pe[i]; // |pads| ≤ 2^31, full ≤ 2^40: no overflow
        if o < 1 {
            return Err(c.mismatch(format!("output size {o} along spatial axis {i}")));
        }
        outs.push(o as usize);
        let k = dilations[i] * (kernel[i] as i64 - 1);
        cb.push(k - pb[i]);
        ce.push(k - pe[i] + out_pad[i]);
    }
    Ok(ConvTransposeParams {
        strides: strides.iter().map(|&x| x as usize).collect(),
        dilations: dilations.iter().map(|&x| x as usize).collect(),
        conv_pad_begin: cb,
        conv_pad_end: ce,
        out: outs,
    })
}

/// Axes a Reduce* node reduces; `None` when it is a no-op (`noop_with_empty_axes`).
pub(crate) fn reduce_axes(c: &Ctx, rank: usize) -> Result<Option<Vec<usize>>> {
    let n = c.n;
    let from_input = (n.op == "ReduceSum" && c.opset() >= 13) || c.opset() >= 18;
    let axes = if from_input {
        c.const_ints(1, "axes")?
    } else {
        n.attr_ints("axes")?
    };
    let axes = axes.unwrap_or_default();
    if axes.is_empty() {
        if n.attr_i("noop_with_empty_axes", 0)? != 0 {
            return Ok(None);
        }
        return Ok(Some((0..rank).collect()));
    }
    let mut v: Vec<usize> = axes
        .iter()
        .map(|&a| c.norm_axis(a, rank))
        .collect::<Result<_>>()?;
    v.sort_unstable();
    v.dedup();
    Ok(Some(v))
}

/// Sizes of the outputs of a Split along `dim`.
pub(crate) fn split_sizes(c: &Ctx, dim: usize) -> Result<Vec<usize>> {
    let n = c.n;
    let outs = n.outputs.len();
    let split = if c.opset() >= 13 {
        c.const_ints(1, "split")?
    } else {
        n.attr_ints("split")?
    };
    match split {
        Some(s) if !s.is_empty() => {
            if s.len() != outs || s.iter().any(|&x| x < 0) || s.iter().sum::<i64>() != dim as i64 {
                return Err(c.bad_attr(format!(
                    "split sizes {s:?} do not divide size {dim} into {outs} outputs"
                )));
            }
            Ok(s.iter().map(|&x| x as usize).collect())
        }
        _ => {
            let k = if c.opset() >= 18 {
                n.attr_i("num_outputs", outs as i64)? as usize
            } else {
                outs
            };
            if k == 0 || k != outs {
                return Err(c.bad_attr(format!("num_outputs {k} but {outs} outputs")));
            }
            let chunk = dim.div_ceil(k);
            let mut v = Vec::new();
            let mut left = dim;
            for _ in 0..k {
                let s = chunk.min(left);
                v.push(s);
                left -= s;
            }
            if c.opset() < 18 && !dim.is_multiple_of(k) {
                return Err(c.bad_attr(format!("size {dim} does not split evenly into {k}")));
            }
            Ok(v)
        }
    }
}

/// Resize parameters.
#[derive(Clone, Debug)]
pub(crate) struct ResizeParams {
    pub out: Vec<usize>,
    /// Per-axis scale (0 = use the size ratio).
    pub scales: Vec<f32>,
    pub mode: nrt_isa::ResizeMode,
    pub coord: nrt_isa::CoordMode,
    pub nearest: nrt_isa::NearestMode,
}

pub(crate) fn resize_params(c: &Ctx, shape: &[usize]) -> Result<ResizeParams> {
    use nrt_isa::{CoordMode, NearestMode, ResizeMode};
    let n = c.n;
    let r = shape.len();
    let mode = match n.attr_s("mode", "nearest")?.as_str() {
        "nearest" => ResizeMode::Nearest,
        "linear" | "bilinear" => ResizeMode::Linear,
        m => {
            return Err(c.e(
                ErrorKind::UnsupportedOp,
                format!("resize mode '{m}' is not supported"),
            ));
        }
    };
    if n.attr_i("antialias", 0)? != 0 {
        return Err(c.e(ErrorKind::UnsupportedOp, "antialias is not supported"));
    }
    let opset10 = c.opset() < 11;
    let coord_name = if opset10 {
        "asymmetric".to_owned()
    } else {
        n.attr_s("coordinate_transformation_mode", "half_pixel")?
    };
    let coord = match coord_name.as_str() {
        "half_pixel" => CoordMode::HalfPixel,
        "asymmetric" => CoordMode::Asymmetric,
        "align_corners" => CoordMode::AlignCorners,
        "pytorch_half_pixel" => CoordMode::PytorchHalfPixel,
        "tf_half_pixel_for_nearest" => CoordMode::TfHalfPixelForNearest,
        "half_pixel_symmetric" => CoordMode::HalfPixelSymmetric,
        m => {
            return Err(c.e(
                ErrorKind::UnsupportedOp,
                format!("coordinate_transformation_mode '{m}' is not supported"),
            ));
        }
    };
    let nearest = match n.attr_s("nearest_mode", "round_prefer_floor")?.as_str() {
        _ if opset10 => NearestMode::Floor,
        "round_prefer_floor" => NearestMode::RoundPreferFloor,
        "round_prefer_ceil" => NearestMode::RoundPreferCeil,
        "floor" => NearestMode::Floor,
        "ceil" => NearestMode::Ceil,
        m => return Err(c.bad_attr(format!("nearest_mode '{m}'"))),
    };
    let (scales_in, sizes_in) = if opset10 {
        (c.const_floats(1, "scales")?, None)
    } else {
        let s = match c.opt(2) {
            Some(v) if v.elements() > 0 => c.const_floats(2, "scales")?,
            _ => None,
        };
        let z = match c.opt(3) {
            Some(v) if v.elements() > 0 => c.const_ints(3, "sizes")?,
            _ => None,
        };
        (s, z)
    };
    let axes: Vec<usize> = match n.attr_ints("axes")? {
        Some(a) => a
            .iter()
            .map(|&x| c.norm_axis(x, r))
            .collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    let mut outs = shape.to_vec();
    let mut scales = vec![0f32; r];
    if let Some(s) = scales_in {
        if s.len() != axes.len() || s.iter().any(|&x| x.is_nan() || x <= 0.0 || !x.is_finite()) {
            return Err(c.bad_attr(format!("scales {s:?} for {} axes", axes.len())));
        }
        for (i, &a) in axes.iter().enumerate() {
            outs[a] = (shape[a] as f64 * s[i] as f64).floor() as usize;
            scales[a] = s[i];
        }
    } else if let Some(z) = sizes_in {
        if z.len() != axes.len() || z.iter().any(|&x| x < 1) {
            return Err(c.bad_attr(format!("sizes {z:?} for {} axes", axes.len())));
        }
        let policy = n.attr_s("keep_aspect_ratio_policy", "stretch")?;
        if policy == "stretch" {
            for (i, &a) in axes.iter().enumerate() {
                outs[a] = z[i] as usize;
            }
        } else {
            let ratios = axes
                .iter()
                .enumerate()
                .map(|(i, &a)| z[i] as f64 / shape[a] as f64);
            let s = if policy == "not_larger" {
                ratios.fold(f64::INFINITY, f64::min)
            } else if policy == "not_smaller" {
                ratios.fold(0.0, f64::max)
            } else {
                return Err(c.bad_attr(format!("keep_aspect_ratio_policy '{policy}'")));
            };
            for &a in &axes {
                outs[a] = (shape[a] as f64 * s).round() as usize;
                scales[a] = s as f32;
            }
        }
    } else {
        return Err(c.bad_attr("Resize needs scales or sizes"));
    }
    if outs.contains(&0) {
        return Err(c.mismatch(format!("resize to an empty shape {outs:?}")));
    }
    Ok(ResizeParams {
        out: outs,
        scales,
        mode,
        coord,
        nearest,
    })
}

/// Output shape of Reshape.
fn reshape_shape(c: &Ctx, input: &[usize], spec: &[i64]) -> Result<Vec<usize>> {
    let allowzero = c.n.attr_i("allowzero", 0)? != 0;
    let total: usize = input.iter().product();
    let mut out = Vec::with_capacity(spec.len());
    let mut infer_at = None;
    for (i, &s) in spec.iter().enumerate() {
        match s {
            -1 if infer_at.is_none() => {
                infer_at = Some(i);
                out.push(1);
            }
            0 if !allowzero => out.push(*input.get(i).ok_or_else(|| {
                c.bad_attr(format!("shape {spec:?}: 0 at axis {i} copies nothing"))
            })?),
            s if s >= 0 => out.push(s as usize),
            _ => return Err(c.bad_attr(format!("invalid reshape target {spec:?}"))),
        }
    }
    // Checked: the target comes from the model; an overflowing product matches nothing.
    let known = out
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| c.mismatch(format!("cannot reshape {input:?} to {spec:?}")))?;
    if let Some(i) = infer_at {
        if known == 0 || !total.is_multiple_of(known) {
            return Err(c.mismatch(format!("cannot reshape {input:?} to {spec:?}")));
        }
        out[i] = total / known;
    } else if known != total {
        return Err(c.mismatch(format!(
            "cannot reshape {input:?} ({total} elements) to {out:?}"
        )));
    }
    Ok(out)
}

/// Axes of Squeeze/Unsqueeze (attribute before opset 13, input from 13).
pub(crate) fn squeeze_axes(c: &Ctx) -> Result<Option<Vec<i64>>> {
    if c.opset() >= 13 {
        c.const_ints(1, "axes")
    } else {
        c.n.attr_ints("axes")
    }
}

/// Transpose permutation.
pub(crate) fn transpose_perm(c: &Ctx, rank: usize) -> Result<Vec<usize>> {
    match c.n.attr_ints("perm")? {
        None => Ok((0..rank).rev().collect()),
        Some(p) => {
            let mut seen = vec![false; rank];
            let mut v = Vec::new();
            for &x in &p {
                let a = c.norm_axis(x, rank)?;
                if seen[a] {
                    return Err(c.bad_attr(format!("perm {p:?} is not a permutation")));
                }
                seen[a] = true;
                v.push(a);
            }
            if v.len() != rank {
                return Err(c.bad_attr(format!("perm {p:?} for rank {rank}")));
            }
            Ok(v)
        }
    }
}

fn elementwise_dtype_check(c: &Ctx, vals: &[&Value]) -> Result<DType> {
    let d = vals[0].dtype;
    for v in vals {
        if v.dtype != d {
            return Err(c.e(
                ErrorKind::UnsupportedDType,
                format!(
                    "inputs have different element types ({} and {})",
                    d, v.dtype
                ),
            ));
        }
    }
    Ok(d)
}

fn broadcast_all(c: &Ctx, vals: &[&Value]) -> Result<Vec<usize>> {
    let mut s = vals[0].shape.clone();
    for v in &vals[1..] {
        s = broadcast_shapes(&s, &v.shape).ok_or_else(|| {
            c.mismatch(format!(
                "shapes {:?} and {:?} do not broadcast",
                vals[0].shape, v.shape
            ))
        })?;
    }
    Ok(s)
}

/// Output shape of MatMul (numpy semantics).
pub(crate) fn matmul_shape(c: &Ctx, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    if a.is_empty() || b.is_empty() {
        return Err(c.mismatch("MatMul of a scalar"));
    }
    let a2: Vec<usize> = if a.len() == 1 {
        vec![1, a[0]]
    } else {
        a.to_vec()
    };
    let b2: Vec<usize> = if b.len() == 1 {
        vec![b[0], 1]
    } else {
        b.to_vec()
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (kb, nn) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != kb {
        return Err(c.mismatch(format!("MatMul of {a:?} and {b:?}: inner sizes {k} ≠ {kb}")));
    }
    let batch = broadcast_shapes(&a2[..a2.len() - 2], &b2[..b2.len() - 2]).ok_or_else(|| {
        c.mismatch(format!(
            "MatMul batch dims of {a:?} and {b:?} do not broadcast"
        ))
    })?;
    let mut out = batch;
    if a.len() > 1 {
        out.push(m);
    }
    if b.len() > 1 {
        out.push(nn);
    }
    Ok(out)
}

fn unsupported_outputs(c: &Ctx, from: usize) -> Result<()> {
    if c.n.outputs.iter().skip(from).any(|o| o.is_some()) {
        return Err(c.e(
            ErrorKind::UnsupportedOp,
            format!("optional outputs after the first {from} are not supported"),
        ));
    }
    Ok(())
}

fn require_float(c: &Ctx, v: &Value) -> Result<()> {
    if v.dtype != DType::F32 {
        return Err(c.e(
            ErrorKind::UnsupportedDType,
            format!(
                "input '{}' is {}; this operator computes in f32 only",
                v.name, v.dtype
            ),
        ));
    }
    Ok(())
}

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
