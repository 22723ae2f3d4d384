//! Operator parameter helpers shared by shape inference, constant folding and lowering, so
//! all three read attributes and inputs the same way: the node accessor [`Ctx`], the
//! inferred output [`Out`], and `slice_params`, `window_params`, `resize_params`, …
//!
//! (They lived in `infer`; `eval` needs them too, and `infer` calls `eval`.)

use crate::error::{CompileError, ErrorKind, Result};
use crate::graph::{Graph, Node, Value};
use crate::tensor::HostTensor;
use nrt_hal::DType;

/// Longest axis a CumSum may run along (it costs `len²` multiply-adds per row).
pub(crate) const CUMSUM_MAX_LEN: usize = 4096;

/// Inferred facts about one output.
#[derive(Clone, Debug)]
pub(crate) struct Out {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub konst: Option<HostTensor>,
    /// `shape` is a static upper bound: the extent depends on the data (see
    /// [`crate::graph::Graph::bounded`]).
    pub bounded: bool,
}

pub(crate) fn out(dtype: DType, shape: Vec<usize>) -> Out {
    Out {
        dtype,
        shape,
        konst: None,
        bounded: false,
    }
}

/// An output whose extent depends on the data, at its static upper bound `shape`.
pub(crate) fn bounded_out(dtype: DType, shape: Vec<usize>) -> Out {
    Out {
        bounded: true,
        ..out(dtype, shape)
    }
}

pub(crate) fn konst(t: HostTensor) -> Out {
    Out {
        dtype: t.dtype,
        shape: t.shape.clone(),
        konst: Some(t),
        bounded: false,
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

    /// The error for input `v` (`what`) that must be a compile-time constant and is not.
    fn not_constant(&self, v: &Value, what: &str) -> CompileError {
        let id = self
            .n
            .inputs
            .iter()
            .flatten()
            .copied()
            .find(|&i| std::ptr::eq(&self.g.values[i], v));
        let needs = id
            .map(|i| crate::graph::input_deps(self.g, i))
            .unwrap_or_default();
        self.e(
            ErrorKind::UnsupportedOp,
            format!(
                "input '{}' ({what}) must be known at compile time; give its value with input_values",
                v.name
            ),
        )
        .needing(needs)
    }

    /// The error for input `i`, which must be known at compile time and is not, naming the
    /// graph inputs it depends on ([`CompileError::needs_inputs`]).
    pub fn needs_known(&self, i: usize, msg: impl Into<String>) -> CompileError {
        let needs = self
            .n
            .inputs
            .get(i)
            .copied()
            .flatten()
            .map(|v| crate::graph::input_deps(self.g, v))
            .unwrap_or_default();
        self.e(ErrorKind::UnsupportedOp, msg).needing(needs)
    }

    /// Input `i` as compile-time integers (`None` if absent); an error if it is not constant.
    pub fn const_ints(&self, i: usize, what: &str) -> Result<Option<Vec<i64>>> {
        match self.opt(i) {
            None => Ok(None),
            Some(v) if v.elements() == 0 && v.konst.is_none() => Ok(Some(Vec::new())),
            Some(v) => match &v.konst {
                Some(t) => Ok(Some(t.to_i64s().into_owned())),
                None => Err(self.not_constant(v, what)),
            },
        }
    }

    /// Input `i` as compile-time floats.
    pub fn const_floats(&self, i: usize, what: &str) -> Result<Option<Vec<f32>>> {
        match self.opt(i) {
            None => Ok(None),
            Some(v) => match &v.konst {
                Some(t) => Ok(Some(t.to_f32s().into_owned())),
                None => Err(self.not_constant(v, what)),
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

    /// [`Self::norm_axis`] for indexing something per dimension (a slice's bounds, a pad's
    /// widths): a scalar has no axis 0.
    pub fn norm_dim(&self, axis: i64, rank: usize) -> Result<usize> {
        let a = self.norm_axis(axis, rank)?;
        if a >= rank {
            return Err(self.bad_attr(format!("axis {axis} is out of range for rank {rank}")));
        }
        Ok(a)
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
        let ax = c.norm_dim(axes[i], rank)?;
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
/// `(per-axis (begin, end), mode, constant value)`; the value is `None` when input 2 is
/// computed at run time (the device then fills from it).
pub(crate) type PadParams = (Vec<(i64, i64)>, String, Option<f64>);

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
        (p, Some(n.attr_f("value", 0.0)? as f64), None)
    } else {
        let p = c
            .const_ints(1, "pads")?
            .ok_or_else(|| c.bad_attr("missing pads"))?;
        let v = match c.opt(2) {
            Some(v) if v.elements() > 0 => v.konst.as_ref().map(|t| t.get_f64(0)),
            _ => Some(0.0),
        };
        (p, v, c.const_ints(3, "axes")?)
    };
    let axes: Vec<usize> = match axes {
        Some(a) => a
            .iter()
            .map(|&x| c.norm_dim(x, rank))
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
    /// The modes the POOL kernel does not compute, done as one product with a constant
    /// weight matrix per axis (`ops/resize.rs`): cubic, antialias, tf_crop_and_resize.
    pub separable: Option<SeparableResize>,
}

/// What the per-axis weight matrices of a separable Resize depend on (ONNX reference
/// semantics, `onnx/reference/ops/op_resize.py`).
#[derive(Clone, Debug)]
pub(crate) struct SeparableResize {
    /// `linear`, `cubic` or `nearest`.
    pub mode: String,
    /// The coordinate_transformation_mode.
    pub coord: String,
    /// The nearest_mode.
    pub nearest: String,
    pub cubic_a: f64,
    pub exclude_outside: bool,
    pub antialias: bool,
    pub extrapolation: f64,
    /// Per dimension: the scale factor (the given one, or output/input for sizes).
    pub scale: Vec<f64>,
    /// Per dimension: the region of interest (tf_crop_and_resize), (0, 1) elsewhere.
    pub roi: Vec<(f64, f64)>,
}

pub(crate) fn resize_params(c: &Ctx, shape: &[usize]) -> Result<ResizeParams> {
    use nrt_isa::{CoordMode, NearestMode, ResizeMode};
    let n = c.n;
    let r = shape.len();
    let mode_name = n.attr_s("mode", "nearest")?;
    let mode = match mode_name.as_str() {
        "nearest" => ResizeMode::Nearest,
        "linear" | "bilinear" | "cubic" | "bicubic" => ResizeMode::Linear,
        m => {
            return Err(c.e(
                ErrorKind::UnsupportedOp,
                format!("resize mode '{m}' is not supported"),
            ));
        }
    };
    let cubic = matches!(mode_name.as_str(), "cubic" | "bicubic");
    let antialias = n.attr_i("antialias", 0)? != 0;
    if antialias && mode == ResizeMode::Nearest {
        return Err(c.bad_attr("antialias with mode 'nearest'"));
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
        "tf_crop_and_resize" => CoordMode::Asymmetric, // separable; see `roi`
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
    // The reference's scale factor per dimension (f64).
    let mut scale64 = vec![1f64; r];
    if let Some(s) = scales_in {
        if s.len() != axes.len() || s.iter().any(|&x| x.is_nan() || x <= 0.0 || !x.is_finite()) {
            return Err(c.bad_attr(format!("scales {s:?} for {} axes", axes.len())));
        }
        for (i, &a) in axes.iter().enumerate() {
            let o = (shape[a] as f64 * s[i] as f64).floor();
            if !o.is_finite() || o >= (1u64 << 40) as f64 {
                return Err(c.bad_attr(format!("scale {} of axis {a}", s[i])));
            }
            outs[a] = o as usize;
            scales[a] = s[i];
            scale64[a] = s[i] as f64;
        }
    } else if let Some(z) = sizes_in {
        if z.len() != axes.len() || z.iter().any(|&x| x < 1) {
            return Err(c.bad_attr(format!("sizes {z:?} for {} axes", axes.len())));
        }
        let policy = n.attr_s("keep_aspect_ratio_policy", "stretch")?;
        if policy == "stretch" {
            for (i, &a) in axes.iter().enumerate() {
                outs[a] = usize::try_from(z[i]).map_err(|_| c.bad_attr(format!("sizes {z:?}")))?;
                scale64[a] = z[i] as f64 / shape[a] as f64;
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
                let o = (shape[a] as f64 * s).round();
                if !o.is_finite() || o >= (1u64 << 40) as f64 {
                    return Err(c.bad_attr(format!("sizes {z:?}")));
                }
                outs[a] = o as usize;
                scales[a] = s as f32;
                scale64[a] = s;
            }
        }
    } else {
        return Err(c.bad_attr("Resize needs scales or sizes"));
    }
    if outs.contains(&0) {
        return Err(c.mismatch(format!("resize to an empty shape {outs:?}")));
    }
    let tf_crop = coord_name == "tf_crop_and_resize";
    let separable = if cubic || antialias || tf_crop {
        let mut roi = vec![(0f64, 1f64); r];
        if tf_crop {
            let v = c
                .const_floats(1, "roi")?
                .ok_or_else(|| c.bad_attr("tf_crop_and_resize needs roi"))?;
            if v.len() != 2 * axes.len() {
                return Err(c.bad_attr(format!("roi {v:?} for {} axes", axes.len())));
            }
            for (i, &a) in axes.iter().enumerate() {
                roi[a] = (v[i] as f64, v[axes.len() + i] as f64);
            }
        }
        if shape.contains(&0) {
            return Err(c.mismatch(format!("resize of an empty shape {shape:?}")));
        }
        Some(SeparableResize {
            mode: if cubic {
                "cubic"
            } else if mode == ResizeMode::Linear {
                "linear"
            } else {
                "nearest"
            }
            .to_owned(),
            coord: coord_name.clone(),
            nearest: n.attr_s("nearest_mode", "round_prefer_floor")?,
            cubic_a: n.attr_f("cubic_coeff_a", -0.75)? as f64,
            exclude_outside: n.attr_i("exclude_outside", 0)? != 0,
            antialias,
            extrapolation: n.attr_f("extrapolation_value", 0.0)? as f64,
            scale: scale64,
            roi,
        })
    } else {
        None
    };
    Ok(ResizeParams {
        out: outs,
        scales,
        mode,
        coord,
        nearest,
        separable,
    })
}

/// Output shape of Reshape.
pub(crate) fn reshape_shape(c: &Ctx, input: &[usize], spec: &[i64]) -> Result<Vec<usize>> {
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
            // The length first: `norm_axis` accepts axis 0 of a scalar, which a permutation
            // of rank 0 does not have.
            if p.len() != rank {
                return Err(c.bad_attr(format!("perm {p:?} for rank {rank}")));
            }
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

pub(crate) fn elementwise_dtype_check(c: &Ctx, vals: &[&Value]) -> Result<DType> {
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

pub(crate) fn broadcast_all(c: &Ctx, vals: &[&Value]) -> Result<Vec<usize>> {
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

pub(crate) fn unsupported_outputs(c: &Ctx, from: usize) -> Result<()> {
    if c.n.outputs.iter().skip(from).any(|o| o.is_some()) {
        return Err(c.e(
            ErrorKind::UnsupportedOp,
            format!("optional outputs after the first {from} are not supported"),
        ));
    }
    Ok(())
}

pub(crate) fn require_float(c: &Ctx, v: &Value) -> Result<()> {
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
