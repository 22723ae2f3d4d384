//! Layout operators: views of their input that copy nothing (Reshape, Flatten, Squeeze,
//! Unsqueeze, Identity, Dropout, Transpose, Split, forward Slice), and the copies (Concat,
//! Expand, Tile, DepthToSpace / SpaceToDepth, Pad, Trilu). On constants the views, Concat
//! and Expand fold (strided reads of the host tensor).

use super::unary::infer_same;
use super::{Fold, Registry};
use crate::error::{ErrorKind, Result};
use crate::eval::{broadcast_to, dense_strides, input, one, view};
use crate::graph::{Graph, Node, Value};
use crate::lower::view::View;
use crate::lower::{At, Lowerer};
use crate::params;
use crate::params::{
    Ctx, Out, broadcast_shapes, elementwise_dtype_check, konst, out, pad_params, reshape_shape,
    slice_params, split_sizes, squeeze_axes, transpose_perm, unsupported_outputs,
};
use crate::tensor::{Data, HostTensor};
use nrt_hal::{DType, Engine};

pub(super) fn register(r: &mut Registry) {
    r.op("Identity", 1, infer_same)
        .folds(fold_reshaped)
        .device(lower!(lower_view));
    r.op("Dropout", 1, infer_dropout)
        .note("inference; training_mode only with ratio 0")
        .folds(fold_dropout)
        .device(lower!(lower_view));
    r.op("Reshape", 1, infer_reshape)
        .folds(fold_reshaped)
        .device(lower!(lower_view));
    r.op("Flatten", 1, infer_flatten)
        .folds(fold_reshaped)
        .device(lower!(lower_view));
    r.op("Squeeze", 1, infer_squeeze)
        .folds(fold_reshaped)
        .device(lower!(lower_view));
    r.op("Unsqueeze", 1, infer_unsqueeze)
        .folds(fold_reshaped)
        .device(lower!(lower_view));
    r.op("Transpose", 1, infer_transpose)
        .folds(fold_transpose)
        .device(lower!(lower_transpose));
    r.op("Concat", 1, infer_concat)
        .folds(fold_concat)
        .device(lower!(lower_concat));
    r.op("Split", 1, infer_split)
        .folds(fold_split)
        .device(lower!(lower_split));
    r.op("Slice", 1, infer_slice)
        .folds(fold_slice)
        .device(lower!(lower_slice));
    r.op("Expand", 8, infer_expand)
        .folds(fold_expand)
        .device(lower!(lower_expand));
    r.op("Tile", 1, infer_tile).device(lower!(lower_tile));
    for name in ["DepthToSpace", "SpaceToDepth"] {
        r.op(name, 1, infer_depth_space)
            .device(lower!(lower_depth_space));
    }
    r.op("Pad", 1, infer_pad)
        .fold(Fold::Never)
        .note("constant, reflect, edge, wrap")
        .device(lower!(lower_pad));
    r.op("Trilu", 14, infer_trilu).device(lower!(lower_trilu));
    r.op("ReverseSequence", 10, infer_reverse_sequence)
        .fold(Fold::Never)
        .note("sequence_lens constant: a reversed-view copy per batch entry; computed at run time: a GatherElements of computed indices")
        .expands_when(lens_at_run_time, expand_reverse_sequence)
        .device(lower!(lower_reverse_sequence));
    r.op("CenterCropPad", 18, infer_center_crop_pad)
        .fold(Fold::Never)
        .note("shape known at compile time: zero fill and one copy")
        .device(lower!(lower_center_crop_pad));
}

/// CenterCropPad's target size per dimension (the input's where `axes` leaves it).
fn center_crop_pad_sizes(c: &Ctx) -> Result<Vec<usize>> {
    let x = c.input(0)?;
    let r = x.shape.len();
    let shape = c
        .const_ints(1, "shape")?
        .ok_or_else(|| c.bad_attr("missing shape"))?;
    let axes: Vec<usize> = match c.n.attr_ints("axes")? {
        Some(a) => a
            .iter()
            .map(|&a| c.norm_axis(a, r))
            .collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    if shape.len() != axes.len() {
        return Err(c.bad_attr(format!("shape {shape:?} for {} axes", axes.len())));
    }
    let mut out = x.shape.clone();
    for (&a, &s) in axes.iter().zip(&shape) {
        out[a] = usize::try_from(s).map_err(|_| c.bad_attr(format!("shape {shape:?}")))?;
    }
    Ok(out)
}

/// Whether a ReverseSequence's lengths are computed at run time.
fn lens_at_run_time(g: &Graph, n: &Node) -> bool {
    n.inputs
        .get(1)
        .copied()
        .flatten()
        .is_some_and(|l| g.values[l].konst.is_none())
}

/// Replaces ReverseSequence node `ni`, whose `sequence_lens` is computed at run time, by a
/// gather of computed indices along the time axis: with `t` the step and `L` the entry's
/// length, `idx = t < L ? L − 1 − t : t`, broadcast over the other axes, then
/// `GatherElements(X, idx, time_axis)` (a length past the sequence is an out-of-range index
/// on the device, as ONNX Runtime refuses it).
fn expand_reverse_sequence(g: &mut Graph, ni: usize) -> Result<()> {
    let n = g.nodes[ni].clone();
    let input = |k: usize| n.inputs.get(k).copied().flatten();
    let (Some(x), Some(lens), Some(y)) = (input(0), input(1), n.outputs.first().copied().flatten())
    else {
        return Err(n.error(
            ErrorKind::ShapeMismatch,
            "input, sequence_lens and output are required",
        ));
    };
    let shape = g.values[x].shape.clone();
    let r = shape.len();
    let norm = |a: i64| {
        let a = if a < 0 { a + r as i64 } else { a };
        usize::try_from(a).ok().filter(|&a| a < 2 && r >= 2)
    };
    let (Some(ba), Some(ta)) = (
        norm(n.attr_i("batch_axis", 1)?),
        norm(n.attr_i("time_axis", 0)?),
    ) else {
        return Err(n.error(
            ErrorKind::BadAttribute,
            format!("batch_axis and time_axis (0 and 1) of a rank-{r} input"),
        ));
    };
    if ba == ta || g.values[lens].shape != [shape[ba]] {
        return Err(n.error(
            ErrorKind::ShapeMismatch,
            format!(
                "batch_axis {ba}, time_axis {ta}, sequence_lens {:?} for input {shape:?}",
                g.values[lens].shape
            ),
        ));
    }
    let (steps, batch) = (shape[ta], shape[ba]);
    let mut e = super::attention::Expansion {
        name: n.name.clone(),
        g,
        nodes: Vec::new(),
    };
    // [T, 1] / [1, B] for time axis 0, [1, T] / [B, 1] for time axis 1.
    let (t_shape, l_shape) = if ta == 0 {
        (vec![steps, 1], [1, batch as i64])
    } else {
        (vec![1, steps], [batch as i64, 1])
    };
    let t = e.konst(
        "t",
        HostTensor::ints(DType::I64, t_shape, (0..steps as i64).collect()),
    );
    let l64 = e.node(
        "Cast",
        &[lens],
        vec![super::attention::a_int("to", 7)],
        None,
    );
    let l_shape = e.ints("lshape", &l_shape);
    let l = e.node("Reshape", &[l64, l_shape], vec![], None);
    let one = e.scalar("one", DType::I64, 1.0);
    let keep = e.node("Less", &[t, l], vec![], None);
    let last = e.node("Sub", &[l, one], vec![], None);
    let rev = e.node("Sub", &[last, t], vec![], None);
    let idx2 = e.node("Where", &[keep, rev, t], vec![], None);
    let full: Vec<i64> = (0..r)
        .map(|i| if i < 2 { shape[i] as i64 } else { 1 })
        .collect();
    let full = e.ints("ishape", &full);
    let idx_r = e.node("Reshape", &[idx2, full], vec![], None);
    let xs: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let xs = e.ints("xshape", &xs);
    let idx = e.node("Expand", &[idx_r, xs], vec![], None);
    e.node(
        "GatherElements",
        &[x, idx],
        vec![super::attention::a_int("axis", ta as i64)],
        Some(y),
    );
    let nodes = std::mem::take(&mut e.nodes);
    e.g.nodes.splice(ni..=ni, nodes);
    Ok(())
}

/// ReverseSequence's batch axis, time axis and lengths.
fn reverse_sequence_params(c: &Ctx) -> Result<(usize, usize, Vec<usize>)> {
    let x = c.input(0)?;
    if x.shape.len() < 2 {
        return Err(c.mismatch("input of rank < 2"));
    }
    let ba = c.norm_axis(c.n.attr_i("batch_axis", 1)?, x.shape.len())?;
    let ta = c.norm_axis(c.n.attr_i("time_axis", 0)?, x.shape.len())?;
    if ba == ta || ba > 1 || ta > 1 {
        return Err(c.bad_attr(format!("batch_axis {ba} and time_axis {ta} (0 and 1)")));
    }
    let lens = c
        .const_ints(1, "sequence_lens")?
        .ok_or_else(|| c.bad_attr("missing sequence_lens"))?;
    if lens.len() != x.shape[ba] {
        return Err(c.mismatch(format!(
            "{} sequence_lens for a batch of {}",
            lens.len(),
            x.shape[ba]
        )));
    }
    let lens = lens
        .iter()
        .map(|&l| usize::try_from(l).ok().filter(|&l| l <= x.shape[ta]))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| c.bad_attr(format!("sequence_lens {lens:?} for {} steps", x.shape[ta])))?;
    Ok((ba, ta, lens))
}

/// ReverseSequence: the input's shape and type.
pub(crate) fn infer_reverse_sequence(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    reverse_sequence_params(c)?;
    Ok(vec![out(x.dtype, x.shape.clone())])
}

/// CenterCropPad: the input's type, the target shape.
pub(crate) fn infer_center_crop_pad(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    Ok(vec![out(x.dtype, center_crop_pad_sizes(c)?)])
}

/// Dropout (inference): the data passes, the mask is constant.
pub(crate) fn infer_dropout(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
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
        let ones =
            HostTensor::try_from_f64s("the mask", d, x.shape.clone(), std::iter::repeat(1.0))
                .map_err(|e| e.at_node(&n.name, &n.op))?;
        outs.push(konst(ones));
    }
    Ok(outs)
}

/// Reshape.
pub(crate) fn infer_reshape(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let x = c.input(0)?;
    let spec = if c.opset() < 5 {
        n.attr_ints("shape")?.unwrap_or_default()
    } else {
        c.const_ints(1, "shape")?
            .ok_or_else(|| c.bad_attr("missing shape"))?
    };
    Ok(vec![out(x.dtype, reshape_shape(c, &x.shape, &spec)?)])
}

/// Flatten.
pub(crate) fn infer_flatten(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let x = c.input(0)?;
    let r = x.shape.len();
    let a = n.attr_i("axis", 1)?;
    let axis = if a == r as i64 { r } else { c.norm_axis(a, r)? };
    let outer: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis..].iter().product();
    Ok(vec![out(x.dtype, vec![outer, inner])])
}

/// Squeeze.
pub(crate) fn infer_squeeze(c: &Ctx) -> Result<Vec<Out>> {
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
            return Err(c.mismatch(format!("cannot squeeze axis {a} of size {}", x.shape[a])));
        }
    }
    let s = (0..r)
        .filter(|i| !axes.contains(i))
        .map(|i| x.shape[i])
        .collect();
    Ok(vec![out(x.dtype, s)])
}

/// Unsqueeze.
pub(crate) fn infer_unsqueeze(c: &Ctx) -> Result<Vec<Out>> {
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
    Ok(vec![out(x.dtype, s)])
}

/// Transpose.
pub(crate) fn infer_transpose(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    let p = transpose_perm(c, x.shape.len())?;
    Ok(vec![out(x.dtype, p.iter().map(|&a| x.shape[a]).collect())])
}

/// Concat's axis for inputs of rank `r`: the `axis` attribute, 1 when absent before opset 4
/// (required from it).
fn concat_axis(c: &Ctx, r: usize) -> Result<usize> {
    let default = if c.opset() < 4 { 1 } else { i64::MIN };
    c.norm_axis(c.n.attr_i("axis", default)?, r)
        .map_err(|_| c.bad_attr("missing or invalid axis"))
}

/// Split's axis for an input of rank `r` (the `axis` attribute, 0 by default).
fn split_axis(c: &Ctx, r: usize) -> Result<usize> {
    c.norm_axis(c.n.attr_i("axis", 0)?, r)
}

/// Concat.
pub(crate) fn infer_concat(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let vals: Vec<&Value> = (0..n.inputs.len()).filter_map(|i| c.opt(i)).collect();
    if vals.is_empty() {
        return Err(c.bad_attr("no inputs"));
    }
    let d = elementwise_dtype_check(c, &vals)?;
    let r = vals[0].shape.len();
    let axis = concat_axis(c, r)?;
    let mut s = vals[0].shape.clone();
    s[axis] = 0;
    for v in &vals {
        if v.shape.len() != r || (0..r).any(|i| i != axis && v.shape[i] != vals[0].shape[i]) {
            return Err(c.mismatch(format!(
                "cannot concatenate {:?} and {:?} along axis {axis}",
                vals[0].shape, v.shape
            )));
        }
        s[axis] += v.shape[axis];
    }
    Ok(vec![out(d, s)])
}

/// Split.
pub(crate) fn infer_split(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    let axis = split_axis(c, x.shape.len())?;
    let sizes = split_sizes(c, x.shape[axis])?;
    Ok(sizes
        .iter()
        .map(|&k| {
            let mut s = x.shape.clone();
            s[axis] = k;
            out(x.dtype, s)
        })
        .collect())
}

/// Slice.
pub(crate) fn infer_slice(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    let p = slice_params(c, &x.shape)?;
    Ok(vec![out(x.dtype, p.iter().map(|t| t.1).collect())])
}

/// Expand.
pub(crate) fn infer_expand(c: &Ctx) -> Result<Vec<Out>> {
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
    Ok(vec![out(x.dtype, s)])
}

/// Tile.
pub(crate) fn infer_tile(c: &Ctx) -> Result<Vec<Out>> {
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
    Ok(vec![out(x.dtype, s)])
}

/// DepthToSpace / SpaceToDepth.
pub(crate) fn infer_depth_space(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let op = n.op.as_str();
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
    Ok(vec![out(x.dtype, s)])
}

/// Pad.
pub(crate) fn infer_pad(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    let (pads, mode, value) = pad_params(c, x.shape.len())?;
    if value.is_none() && c.input(2)?.dtype != x.dtype {
        return Err(c.mismatch(format!(
            "constant_value is {}, the data {}",
            c.input(2)?.dtype,
            x.dtype
        )));
    }
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
    Ok(vec![out(x.dtype, s)])
}

/// Trilu.
pub(crate) fn infer_trilu(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    if x.shape.len() < 2 {
        return Err(c.mismatch(format!("Trilu of a rank-{} input", x.shape.len())));
    }
    if let Some(k) = c.const_ints(1, "k")?
        && k.len() != 1
    {
        return Err(c.bad_attr(format!("k has {} values (one expected)", k.len())));
    }
    Ok(vec![out(x.dtype, x.shape.clone())])
}

/// Folds the operators that only reshape (Identity, Reshape, Flatten, Squeeze,
/// Unsqueeze): the data, with the inferred shape.
fn fold_reshaped(c: &Ctx, outs: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    one(input(c, 0).reshaped(outs[0].shape.clone()))
}

/// Folds Dropout (inference): the data passes through; the mask, when asked for, is the
/// constant inference gave.
fn fold_dropout(c: &Ctx, outs: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    let mut v = vec![input(c, 0).clone()];
    v.extend(outs[1..].iter().filter_map(|o| o.konst.clone()));
    Ok(Some(v))
}

/// Folds Transpose: a read through the permuted strides.
fn fold_transpose(c: &Ctx, outs: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    let x = input(c, 0);
    let p = transpose_perm(c, x.shape.len())?;
    let d = dense_strides(&x.shape);
    let st: Vec<i64> = p.iter().map(|&a| d[a]).collect();
    one(view(x, &outs[0].shape, 0, &st))
}

/// Folds Slice: a read from the first element by the steps' strides.
fn fold_slice(c: &Ctx, outs: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    let x = input(c, 0);
    let p = slice_params(c, &x.shape)?;
    let d = dense_strides(&x.shape);
    let base: i64 = p.iter().zip(&d).map(|(t, s)| t.0 * s).sum();
    let st: Vec<i64> = p.iter().zip(&d).map(|(t, s)| t.2 * s).collect();
    one(view(x, &outs[0].shape, base, &st))
}

/// Folds Expand: the input broadcast to the inferred shape.
fn fold_expand(c: &Ctx, outs: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    one(broadcast_to(input(c, 0), &outs[0].shape))
}

/// Folds Concat: for each index before the axis, each input's block in turn.
fn fold_concat(c: &Ctx, outs: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    let (n, o0) = (c.n, &outs[0]);
    let vals: Vec<&HostTensor> = (0..n.inputs.len()).filter_map(|i| c.konst(i)).collect();
    let axis = concat_axis(c, o0.shape.len())?;
    let outer: usize = o0.shape[..axis].iter().product();
    let mut fl: Vec<f32> = Vec::new();
    let mut il: Vec<i64> = Vec::new();
    let float = matches!(vals[0].data, Data::F32(_));
    for o in 0..outer {
        for v in &vals {
            let chunk: usize = v.shape[axis..].iter().product();
            match &v.data {
                Data::F32(d) => fl.extend_from_slice(&d[o * chunk..(o + 1) * chunk]),
                Data::I64(d) => il.extend_from_slice(&d[o * chunk..(o + 1) * chunk]),
            }
        }
    }
    one(HostTensor {
        dtype: o0.dtype,
        shape: o0.shape.clone(),
        data: if float { Data::F32(fl) } else { Data::I64(il) },
    })
}

/// Folds Split: each output a read of the input from its start along the axis.
fn fold_split(c: &Ctx, outs: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    let x = input(c, 0);
    let axis = split_axis(c, x.shape.len())?;
    let sizes = split_sizes(c, x.shape[axis])?;
    let d = dense_strides(&x.shape);
    let mut start = 0i64;
    let mut res = Vec::new();
    for (i, &s) in sizes.iter().enumerate() {
        res.push(view(x, &outs[i].shape, start * d[axis], &d));
        start += s as i64;
    }
    Ok(Some(res))
}

impl<'a> Lowerer<'a> {
    /// Identity, Dropout, Reshape, Flatten, Squeeze, Unsqueeze: a view of the input.
    pub(crate) fn lower_view(&mut self, at: At<'a>) -> Result<()> {
        let (n, c, o0, oshape) = (at.n, at.c, at.o0, at.oshape);
        // Views of the input's storage; a copy only when the input is a strided view
        // the new shape cannot describe.
        let xi = n.inputs[0].expect("present");
        let x = self.sview(xi)?;
        let v = match x.reshape(oshape) {
            Some(v) => v,
            None => self
                .view(xi)?
                .reshape(oshape)
                .ok_or_else(|| c.e(ErrorKind::Internal, "dense reshape failed"))?,
        };
        self.alias_or_copy(o0, v)?;
        Ok(())
    }

    /// Transpose: a permuted view.
    pub(crate) fn lower_transpose(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        // A permuted view; consumers that need dense data copy it (once).
        let xv = c.input(0)?;
        let perm = params::transpose_perm(&c, xv.shape.len())?;
        let x = self.input_sview(n, 0)?.permute(&perm);
        let stored = self.loc[o0]
            .as_ref()
            .is_some_and(|y| y.addr == x.addr && x.is_dense());
        if !stored {
            // (else the producer already wrote the transposed layout: alloc_any)
            self.alias_or_copy(o0, x)?;
        }
        Ok(())
    }

    /// Concat: the parts not written in place are copied.
    pub(crate) fn lower_concat(&mut self, at: At<'a>) -> Result<()> {
        let (n, c, o0, oshape) = (at.n, at.c, at.o0, at.oshape);
        // Inputs whose producers wrote their part in place (`concat_slot`) are
        // already there; the others are copied.
        let axis = concat_axis(&c, oshape.len())?;
        let y = match self.loc[o0].clone() {
            Some(y) => y,
            None => self.alloc(o0),
        };
        let mut at = 0usize;
        for i in 0..n.inputs.len() {
            let Some(v) = n.inputs[i] else { continue };
            let x = self.sview(v)?;
            let len = x.shape[axis];
            let dst = y.slice(axis, at as i64, len, 1);
            let placed = x.addr == dst.addr
                && (0..x.shape.len()).all(|d| x.shape[d] <= 1 || x.strides[d] == dst.strides[d]);
            if !placed {
                self.copy(Engine::Pool, &x, &dst)?;
            }
            at += len;
        }
        Ok(())
    }

    /// Split: views of the input.
    pub(crate) fn lower_split(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, .. } = at;
        let xv = c.input(0)?;
        let axis = split_axis(&c, xv.shape.len())?;
        let sizes = params::split_sizes(&c, xv.shape[axis])?;
        // Views of the input (copied only into graph outputs).
        let x = self.input_sview(n, 0)?;
        let mut at = 0usize;
        for (k, &len) in sizes.iter().enumerate() {
            if let Some(Some(ov)) = n.outputs.get(k).copied() {
                self.alias_or_copy(ov, x.slice(axis, at as i64, len, 1))?;
            }
            at += len;
        }
        Ok(())
    }

    /// Slice: a view (a copy when reversed).
    pub(crate) fn lower_slice(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let p = params::slice_params(&c, &xv.shape)?;
        let mut x = self.input_sview(n, 0)?;
        for (axis, &(start, len, step)) in p.iter().enumerate() {
            x = x.slice(axis, start, len, step);
        }
        if x.strides.iter().all(|&s| s >= 0) {
            // A view (a reversed one would make its readers walk it index by index).
            self.alias_or_copy(o0, x)?;
        } else {
            self.copy_out(Engine::Pool, &x, o0)?;
        }
        Ok(())
    }

    /// Expand: a broadcast copy.
    pub(crate) fn lower_expand(&mut self, at: At<'a>) -> Result<()> {
        let At { n, o0, oshape, .. } = at;
        let x = self.input_view(n, 0)?.broadcast(oshape);
        self.copy_out(Engine::Pool, &x, o0)
    }

    /// Tile: one copy of a broadcast view.
    pub(crate) fn lower_tile(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        // Each dim d becomes [repeats, d] of a broadcast view: one copy.
        let x = self.input_sview(n, 0)?;
        let y = self.alloc(o0);
        let reps = c.const_ints(1, "repeats")?.unwrap_or_default();
        let (mut sh, mut st) = (Vec::new(), Vec::new());
        for (i, &r) in reps.iter().enumerate() {
            sh.extend([r as usize, x.shape[i]]);
            st.extend([0, x.strides[i]]);
        }
        let src = View {
            shape: sh.clone(),
            strides: st,
            ..x
        };
        self.copy(Engine::Pool, &src, &View::dense(y.addr, y.dtype, &sh))?;
        Ok(())
    }

    /// DepthToSpace / SpaceToDepth: a 6-D permutation copied once.
    pub(crate) fn lower_depth_space(&mut self, at: At<'a>) -> Result<()> {
        let At { n, op, o0, .. } = at;
        // A 6-D permutation of the input, copied once.
        let (x, y) = self.unary_io(n, o0)?;
        let b = n.attr_i("blocksize", 1)? as usize;
        let [nn, ch, h, w] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
        let (split, perm): (Vec<usize>, [usize; 6]) = if op == "SpaceToDepth" {
            (vec![nn, ch, h / b, b, w / b, b], [0, 3, 5, 1, 2, 4])
        } else if n.attr_s("mode", "DCR")? == "CRD" {
            (vec![nn, ch / (b * b), b, b, h, w], [0, 1, 4, 2, 5, 3])
        } else {
            (vec![nn, b, b, ch / (b * b), h, w], [0, 3, 4, 1, 5, 2])
        };
        let src = View::dense(x.addr, x.dtype, &split).permute(&perm);
        let dst = View::dense(y.addr, y.dtype, &src.shape);
        self.copy(Engine::Pool, &src, &dst)?;
        Ok(())
    }

    /// ReverseSequence: a copy, then per batch entry its first `len` steps again through a
    /// reversed view.
    pub(crate) fn lower_reverse_sequence(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let (ba, ta, lens) = reverse_sequence_params(&c)?;
        let (x, y) = self.unary_io(n, o0)?;
        if y.shape.contains(&0) {
            return Ok(());
        }
        self.copy(Engine::Pool, &x, &y)?;
        for (b, &len) in lens.iter().enumerate() {
            if len < 2 {
                continue;
            }
            let src = x
                .slice(ba, b as i64, 1, 1)
                .slice(ta, len as i64 - 1, len, -1);
            let dst = y.slice(ba, b as i64, 1, 1).slice(ta, 0, len, 1);
            self.copy(Engine::Pool, &src, &dst)?;
        }
        Ok(())
    }

    /// CenterCropPad: per dimension the centred overlap of input and output (a crop starts
    /// `⌊(in − out)/2⌋` into the input, a pad `⌊(out − in)/2⌋` into the output), one copy,
    /// the rest zero.
    pub(crate) fn lower_center_crop_pad(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let os = center_crop_pad_sizes(&c)?;
        let (x, y) = self.unary_io(n, o0)?;
        if os.contains(&0) {
            return Ok(());
        }
        let (mut src, mut dst, mut padded) = (x, y.clone(), false);
        for (d, (&i, &o)) in xv.shape.iter().zip(&os).enumerate() {
            let len = i.min(o);
            let (si, so) = if i >= o {
                ((i - o) / 2, 0)
            } else {
                (0, (o - i) / 2)
            };
            padded |= o > i;
            src = src.slice(d, si as i64, len, 1);
            dst = dst.slice(d, so as i64, len, 1);
        }
        if padded {
            self.fill(Engine::Pool, &y, 0.0)?;
        }
        if src.shape.contains(&0) {
            return Ok(());
        }
        self.copy(Engine::Pool, &src, &dst)
    }

    pub(crate) fn lower_pad(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let (pads, mode, value) = params::pad_params(&c, xv.shape.len())?;
        let (x, y) = self.unary_io(n, o0)?;
        if y.shape.contains(&0) {
            return Ok(());
        }
        let r = xv.shape.len();
        // Interior: the input (cropped where pads are negative) at its place in the output.
        let mut src = x.clone();
        let mut dst = y.clone();
        let mut inner = vec![0usize; r];
        for (i, &(b, e)) in pads.iter().enumerate() {
            let crop_b = (-b).max(0);
            let len = (xv.shape[i] as i64 - crop_b - (-e).max(0)).max(0) as usize;
            inner[i] = len;
            src = src.slice(i, crop_b, len, 1);
            dst = dst.slice(i, b.max(0), len, 1);
        }
        let any_pad = pads.iter().any(|&(b, e)| b > 0 || e > 0);
        if mode == "constant" && any_pad {
            match value {
                Some(v) => self.fill(Engine::Pool, &y, v)?,
                // constant_value computed at run time: its one element broadcast over the
                // output, before the interior is copied in.
                None => {
                    let v = self.input_view(n, 2)?;
                    let v = View {
                        shape: vec![1; y.shape.len()],
                        strides: vec![0; y.shape.len()],
                        ..v
                    }
                    .broadcast(&y.shape);
                    self.copy(Engine::Pool, &v, &y)?;
                }
            }
        }
        self.copy(Engine::Pool, &src, &dst)?;
        if mode == "constant" {
            return Ok(());
        }
        // Axis by axis (like numpy): earlier axes full, later axes interior only.
        for d in 0..r {
            let (b, e) = (pads[d].0.max(0), pads[d].1.max(0));
            if b == 0 && e == 0 {
                continue;
            }
            let mut base = y.clone();
            for k in d + 1..r {
                base = base.slice(k, pads[k].0.max(0), inner[k], 1);
            }
            let nlen = inner[d] as i64;
            let (lsrc, lstep, rsrc, rstep) = match mode.as_str() {
                "edge" => (b, 0, b + nlen - 1, 0),
                "reflect" => (2 * b, -1, b + nlen - 2, -1),
                _ => (nlen, 1, b, 1), // wrap
            };
            if b > 0 {
                let s = base.slice(d, lsrc, b as usize, lstep);
                let t = base.slice(d, 0, b as usize, 1);
                self.copy(Engine::Pool, &s, &t)?;
            }
            if e > 0 {
                let s = base.slice(d, rsrc, e as usize, rstep);
                let t = base.slice(d, b + nlen, e as usize, 1);
                self.copy(Engine::Pool, &s, &t)?;
            }
        }
        Ok(())
    }

    /// Trilu: a select through a constant triangular mask.
    pub(crate) fn lower_trilu(&mut self, at: At<'a>) -> Result<()> {
        let (n, c, o0, oshape, odt) = (at.n, at.c, at.o0, at.oshape, at.odt);
        // Select through a constant triangular mask (broadcast over the batch).
        let xv = c.input(0)?;
        let r = xv.shape.len();
        let (rows, cols) = (xv.shape[r - 2], xv.shape[r - 1]);
        let k = c.const_ints(1, "k")?.map_or(0, |v| v[0]);
        let upper = n.attr_i("upper", 1)? != 0;
        let mask: Vec<i64> = (0..rows * cols)
            .map(|e| {
                let d = (e % cols) as i64 - (e / cols) as i64;
                i64::from(if upper { d >= k } else { d <= k })
            })
            .collect();
        let m = self.add_const(&HostTensor::ints(DType::Bool, vec![rows, cols], mask))?;
        let mv = View::dense(m, DType::Bool, &[rows, cols]).broadcast(oshape);
        let zero = HostTensor::from_f64s(odt, vec![1], std::iter::once(0.0));
        let z = self.add_const(&zero)?;
        let zv = View::dense(z, odt, &[1]).broadcast(oshape);
        let x = self.input_sview(n, 0)?;
        let y = self.alloc_any(o0)?;
        self.select(&mv, &x, &zv, &y)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_i, a_ints, fold, fold1};
    use crate::tensor::HostTensor;
    use nrt_hal::DType;

    /// `0, 1, …` as f32 of `shape`.
    fn iota(shape: &[usize]) -> HostTensor {
        let n = shape.iter().product::<usize>();
        HostTensor::f32(shape.to_vec(), (0..n).map(|i| i as f32).collect())
    }

    fn i64s(v: &[i64]) -> HostTensor {
        HostTensor::i64(vec![v.len()], v.to_vec())
    }

    #[test]
    fn reshapes_keep_the_data() {
        let x = iota(&[2, 3]);
        let r = fold1("Reshape", 14, vec![x.clone(), i64s(&[3, -1])], vec![]);
        assert_eq!(r, x.reshaped(vec![3, 2]));
        let f = fold1("Flatten", 13, vec![iota(&[2, 1, 3])], vec![a_i("axis", 2)]);
        assert_eq!(f, x.reshaped(vec![2, 3]));
        let u = fold1("Unsqueeze", 13, vec![x.clone(), i64s(&[0])], vec![]);
        assert_eq!(u, x.reshaped(vec![1, 2, 3]));
        let s = fold1("Squeeze", 13, vec![u], vec![]);
        assert_eq!(s, x);
        assert_eq!(fold1("Identity", 13, vec![x.clone()], vec![]), x);
    }

    #[test]
    fn dropout_passes_the_data_and_its_constant_mask() {
        let x = iota(&[3]);
        let outs = fold("Dropout", 13, vec![Some(x.clone())], vec![], 2).unwrap();
        let mask = HostTensor::ints(DType::Bool, vec![3], vec![1, 1, 1]);
        assert_eq!(outs, vec![Some(x), Some(mask)]);
    }

    #[test]
    fn transpose_and_slice_read_strided() {
        let x = iota(&[2, 3]);
        let t = fold1(
            "Transpose",
            13,
            vec![x.clone()],
            vec![a_ints("perm", &[1, 0])],
        );
        assert_eq!(t, HostTensor::f32(vec![3, 2], vec![0., 3., 1., 4., 2., 5.]));
        // Rows 1.. , columns backwards from the last.
        let (starts, ends, axes, steps) = (
            i64s(&[1, -1]),
            i64s(&[2, -4]),
            i64s(&[0, 1]),
            i64s(&[1, -1]),
        );
        let s = fold1("Slice", 13, vec![x, starts, ends, axes, steps], vec![]);
        assert_eq!(s, HostTensor::f32(vec![1, 3], vec![5., 4., 3.]));
    }

    #[test]
    fn expand_broadcasts() {
        let x = HostTensor::i64(vec![2, 1], vec![7, 8]);
        let e = fold1("Expand", 13, vec![x, i64s(&[2, 3])], vec![]);
        assert_eq!(e, HostTensor::i64(vec![2, 3], vec![7, 7, 7, 8, 8, 8]));
    }

    #[test]
    fn concat_and_split_along_an_axis() {
        let (a, b) = (iota(&[2, 1]), iota(&[2, 2]));
        let c = fold1("Concat", 13, vec![a, b], vec![a_i("axis", 1)]);
        assert_eq!(c, HostTensor::f32(vec![2, 3], vec![0., 0., 1., 1., 2., 3.]));
        let outs = fold(
            "Split",
            13,
            vec![Some(c), Some(i64s(&[2, 1]))],
            vec![a_i("axis", -1)],
            2,
        )
        .unwrap();
        let want = [
            HostTensor::f32(vec![2, 2], vec![0., 0., 1., 2.]),
            HostTensor::f32(vec![2, 1], vec![1., 3.]),
        ];
        assert_eq!(outs, want.map(Some).to_vec());
    }

    /// Before opset 4, Concat's axis defaults to 1.
    #[test]
    fn concat_folds_along_the_default_axis_of_opset_1() {
        let (a, b) = (iota(&[2, 1]), iota(&[2, 1]));
        let c = fold1("Concat", 1, vec![a, b], vec![]);
        assert_eq!(c, HostTensor::f32(vec![2, 2], vec![0., 0., 1., 1.]));
    }
}
