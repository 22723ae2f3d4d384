//! Indexed gathers and scatters on POOL: Gather (rows), GatherElements / ScatterElements
//! (one index per element, `Op::GatherElements` / `Op::ScatterElements`), and GatherND /
//! ScatterND: each index tuple becomes one flat row number — every component through a
//! `GatherElements` from a constant table of row strides, which range-checks it on the
//! device — and the rows then move with `Op::Gather` / `Op::ScatterElements`.

use super::Registry;
use crate::error::{ErrorKind, Result};
use crate::eval::{input, one};
use crate::graph::Value;
use crate::lower::view::{View, dense_ap, mk_ap};
use crate::lower::{At, Lowerer};
use crate::params::{Ctx, Out, out};
use crate::tensor::{Data, HostTensor};
use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::{AccessPattern, BinaryOp, Op, ScatterReduce};

pub(super) fn register(r: &mut Registry) {
    r.op("Gather", 1, infer_gather)
        .folds(fold_gather)
        .device(lower!(lower_gather));
    r.op("GatherElements", 11, infer_gather_elements)
        .note("≤ 4 dimensions after merging those the indices cover whole")
        .device(lower!(lower_gather_elements));
    for name in ["ScatterElements", "Scatter"] {
        r.op(name, 9, infer_scatter_elements)
            .note("as GatherElements; reductions in f32, i32, i64")
            .device(lower!(lower_scatter_elements));
    }
    r.op("GatherND", 11, infer_gather_nd)
        .device(lower!(lower_gather_nd));
    r.op("ScatterND", 11, infer_scatter_nd)
        .note("reductions in f32, i32, i64")
        .device(lower!(lower_scatter_nd));
    r.op("OneHot", 9, infer_one_hot)
        .note("depth known at compile time; indices compared with a ramp on DVE")
        .device(lower!(lower_one_hot));
    r.op("TensorScatter", 24, infer_tensor_scatter)
        .note("run-time write indices: positions computed on DVE, one ScatterElements")
        .device(lower!(lower_tensor_scatter));
    r.op("MaxUnpool", 9, infer_max_unpool)
        .note("run-time indices: a zero fill and one ScatterElements; a larger output_shape holds the unpooled values in its leading corner, as onnx's reference (ONNX Runtime indexes the larger plane)")
        .device(lower!(lower_max_unpool));
    r.op("Compress", 9, infer_compress)
        .note("condition known at compile time: one copy per run of kept slices")
        .device(lower!(lower_compress));
}

/// OneHot's depth (a compile-time scalar) and output axis.
fn one_hot_params(c: &Ctx) -> Result<(usize, usize)> {
    let x = c.input(0)?;
    let depth = match c.const_floats(1, "depth")?.as_deref() {
        Some([d]) if d.is_finite() && *d >= 1.0 && *d < (1u64 << 40) as f32 => *d as usize,
        v => return Err(c.bad_attr(format!("depth {v:?}"))),
    };
    let axis = c.norm_axis(c.n.attr_i("axis", -1)?, x.shape.len() + 1)?;
    Ok((depth, axis))
}

/// OneHot: the indices' shape with `depth` inserted at `axis`, the values' type.
pub(crate) fn infer_one_hot(c: &Ctx) -> Result<Vec<Out>> {
    let (x, values) = (c.input(0)?, c.input(2)?);
    if values.elements() != 2 {
        return Err(c.mismatch(format!("values of shape {:?} (2 elements)", values.shape)));
    }
    if matches!(x.dtype, DType::Bool) {
        return Err(c.e(ErrorKind::UnsupportedDType, "bool indices"));
    }
    let (depth, axis) = one_hot_params(c)?;
    let mut s = x.shape.clone();
    s.insert(axis, depth);
    Ok(vec![out(values.dtype, s)])
}

/// TensorScatter's axis and circular mode.
fn tensor_scatter_params(c: &Ctx) -> Result<(usize, bool)> {
    let (x, u) = (c.input(0)?, c.input(1)?);
    let r = x.shape.len();
    if r < 2 || u.shape.len() != r || u.dtype != x.dtype {
        return Err(c.mismatch(format!(
            "past_cache {:?} ({}) and update {:?} ({})",
            x.shape, x.dtype, u.shape, u.dtype
        )));
    }
    let axis = c.norm_axis(c.n.attr_i("axis", -2)?, r)?;
    if axis == 0 {
        return Err(c.bad_attr("axis 0 (the batch axis)"));
    }
    for d in 0..r {
        if (d == axis && u.shape[d] > x.shape[d]) || (d != axis && u.shape[d] != x.shape[d]) {
            return Err(c.mismatch(format!(
                "update {:?} does not fit past_cache {:?} along axis {axis}",
                u.shape, x.shape
            )));
        }
    }
    if let Some(w) = c.opt(2) {
        index_type(c, w)?;
        if w.shape != [x.shape[0]] {
            return Err(c.mismatch(format!("write_indices of shape {:?}", w.shape)));
        }
    }
    let circular = match c.n.attr_s("mode", "linear")?.as_str() {
        "linear" => false,
        "circular" => true,
        m => return Err(c.bad_attr(format!("mode '{m}'"))),
    };
    Ok((axis, circular))
}

/// TensorScatter: the cache's shape and type.
pub(crate) fn infer_tensor_scatter(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    tensor_scatter_params(c)?;
    Ok(vec![out(x.dtype, x.shape.clone())])
}

/// MaxUnpool's unpooled shape `(in − 1)·stride + kernel − pads` (where the indices point)
/// and its output shape (`output_shape`, at least as large: the unpooled values sit in its
/// leading corner).
fn max_unpool_shapes(c: &Ctx) -> Result<(Vec<usize>, Vec<usize>)> {
    let (x, i) = (c.input(0)?, c.input(1)?);
    if i.shape != x.shape || x.shape.len() < 3 {
        return Err(c.mismatch(format!("X {:?} and I {:?}", x.shape, i.shape)));
    }
    index_type(c, i)?;
    let k = x.shape.len() - 2;
    let n = c.n;
    let ks = n
        .attr_ints("kernel_shape")?
        .ok_or_else(|| c.bad_attr("missing kernel_shape"))?;
    let strides = n.attr_ints("strides")?.unwrap_or_else(|| vec![1; k]);
    let pads = n.attr_ints("pads")?.unwrap_or_else(|| vec![0; 2 * k]);
    if ks.len() != k || strides.len() != k || pads.len() != 2 * k {
        return Err(c.bad_attr("kernel_shape, strides, pads lengths"));
    }
    let mut inferred = x.shape[..2].to_vec();
    for d in 0..k {
        let lim = crate::params::MAX_WINDOW_ATTR;
        let ok = |v: i64| (0..=lim).contains(&v);
        if !ok(ks[d]) || !ok(strides[d]) || !ok(pads[d]) || !ok(pads[k + d]) {
            return Err(c.bad_attr(format!("kernel {ks:?}, strides {strides:?}, pads {pads:?}")));
        }
        let o = (x.shape[2 + d] as i64 - 1) * strides[d] + ks[d] - pads[d] - pads[k + d];
        inferred.push(usize::try_from(o).map_err(|_| c.mismatch(format!("output size {o}")))?);
    }
    let out = match c.opt(2) {
        Some(v) if v.elements() > 0 => {
            let s = c.const_ints(2, "output_shape")?.unwrap_or_default();
            let s: Vec<usize> = s
                .iter()
                .map(|&d| usize::try_from(d).ok())
                .collect::<Option<_>>()
                .ok_or_else(|| c.bad_attr(format!("output_shape {s:?}")))?;
            if s.len() != k + 2
                || s.iter().zip(&inferred).any(|(a, b)| a < b)
                || s[..2] != x.shape[..2]
            {
                return Err(c.bad_attr(format!(
                    "output_shape {s:?} (at least the unpooled shape {inferred:?})"
                )));
            }
            s
        }
        _ => inferred.clone(),
    };
    Ok((inferred, out))
}

/// MaxUnpool: zeros with the values put back at their indices.
pub(crate) fn infer_max_unpool(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    Ok(vec![out(x.dtype, max_unpool_shapes(c)?.1)])
}

/// Compress's kept indices along its axis (`None`: the flattened input).
fn compress_params(c: &Ctx) -> Result<(Option<usize>, Vec<usize>)> {
    let x = c.input(0)?;
    let cond = c
        .const_ints(1, "condition")?
        .ok_or_else(|| c.bad_attr("missing condition"))?;
    let axis = if c.n.has_attr("axis") {
        Some(c.norm_axis(c.n.attr_i("axis", 0)?, x.shape.len())?)
    } else {
        None
    };
    let len = axis.map_or(x.elements(), |a| x.shape[a]);
    if cond.len() > len {
        return Err(c.mismatch(format!(
            "condition of {} elements for an axis of {len}",
            cond.len()
        )));
    }
    let kept = cond
        .iter()
        .enumerate()
        .filter(|(_, b)| **b != 0)
        .map(|(i, _)| i)
        .collect();
    Ok((axis, kept))
}

/// Compress: the kept slices along the axis (or elements of the flattened input).
pub(crate) fn infer_compress(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    let (axis, kept) = compress_params(c)?;
    let s = match axis {
        Some(a) => {
            let mut s = x.shape.clone();
            s[a] = kept.len();
            s
        }
        None => vec![kept.len()],
    };
    Ok(vec![out(x.dtype, s)])
}

/// Checks that `i` is an index tensor (i32 or i64).
fn index_type(c: &Ctx, i: &Value) -> Result<()> {
    if !matches!(i.dtype, DType::I32 | DType::I64) {
        return Err(c.e(
            ErrorKind::UnsupportedDType,
            format!("indices '{}' of type {}", i.name, i.dtype),
        ));
    }
    Ok(())
}

/// Constant indices `i` outside `[-lim, lim)` (per `lim_of` position) are a compile error.
fn check_const_indices(c: &Ctx, i: usize, lim_of: impl Fn(usize) -> usize) -> Result<()> {
    if let Some(t) = c.konst(i) {
        for (p, &v) in t.to_i64s().iter().enumerate() {
            let lim = lim_of(p) as i64;
            if v < -lim || v >= lim {
                return Err(c.bad_attr(format!("index {v} is out of range for size {lim}")));
            }
        }
    }
    Ok(())
}

/// GatherElements / ScatterElements: data and indices of one rank ≤ 4, the indices no
/// larger than the data off the axis; returns the axis.
fn elements_axis(c: &Ctx, x: &Value, i: &Value) -> Result<usize> {
    index_type(c, i)?;
    let r = x.shape.len();
    if r == 0 || i.shape.len() != r {
        return Err(c.mismatch(format!(
            "data of shape {:?} with indices of shape {:?} (same rank ≥ 1)",
            x.shape, i.shape
        )));
    }
    let axis = c.norm_axis(c.n.attr_i("axis", 0)?, r)?;
    if (0..r).any(|d| d != axis && i.shape[d] > x.shape[d]) {
        return Err(c.mismatch(format!(
            "indices of shape {:?} exceed data of shape {:?} off axis {axis}",
            i.shape, x.shape
        )));
    }
    let (is, _, _) = merge_dims(&i.shape, &x.shape, axis);
    if is.len() > 4 {
        return Err(c.e(
            ErrorKind::UnsupportedOp,
            format!(
                "indices of shape {:?} into data of shape {:?}: rank {} after merging (the device indexes ≤ 4 dimensions)",
                i.shape,
                x.shape,
                is.len()
            ),
        ));
    }
    Ok(axis)
}

/// Merges the dimensions of an element-wise indexing (indices of shape `is` into dense data
/// of shape `ds` along `axis`): a dimension off the axis that the indices cover whole joins
/// the one before it (also off the axis). Returns the merged indices and data shapes and the
/// merged axis; dense strides over each stay valid.
fn merge_dims(is: &[usize], ds: &[usize], axis: usize) -> (Vec<usize>, Vec<usize>, usize) {
    let (mut mi, mut md, mut ma) = (Vec::new(), Vec::new(), 0);
    for d in 0..is.len() {
        let joins = d != axis && d > 0 && d - 1 != axis && is[d] == ds[d];
        if joins {
            *mi.last_mut().expect("d > 0") *= is[d];
            *md.last_mut().expect("d > 0") *= ds[d];
        } else {
            if d == axis {
                ma = mi.len();
            }
            mi.push(is[d]);
            md.push(ds[d]);
        }
    }
    (mi, md, ma)
}

/// The element-wise indexing operands after [`merge_dims`]: the data-side access pattern of
/// `v` (dense over `ds`, seen with the indices' extent off the axis), and the dense
/// access patterns of the index-side views `sides`, with the merged axis (of 4).
fn elements_aps(
    is: &[usize],
    ds: &[usize],
    axis: usize,
    v: &View,
    sides: &[&View],
) -> Result<(AccessPattern, Vec<AccessPattern>, u8)> {
    let (mi, md, ma) = merge_dims(is, ds, axis);
    let mut vs = mi.clone();
    vs[ma] = md[ma];
    let mut st = vec![1i64; md.len()];
    for d in (1..md.len()).rev() {
        st[d - 1] = st[d] * md[d] as i64;
    }
    let data = mk_ap(v.addr, v.dtype, &vs, &st)?;
    let aps = sides
        .iter()
        .map(|x| dense_ap(x.addr, x.dtype, &mi))
        .collect::<Result<Vec<_>>>()?;
    Ok((data, aps, (ma + 4 - mi.len()) as u8))
}

/// GatherElements: the output has the indices' shape.
pub(crate) fn infer_gather_elements(c: &Ctx) -> Result<Vec<Out>> {
    let (x, i) = (c.input(0)?, c.input(1)?);
    let axis = elements_axis(c, x, i)?;
    check_const_indices(c, 1, |_| x.shape[axis])?;
    Ok(vec![out(x.dtype, i.shape.clone())])
}

/// The `reduction` attribute of ScatterElements / ScatterND (opset 16+).
fn scatter_reduce(c: &Ctx, dtype: DType) -> Result<ScatterReduce> {
    let r = match c.n.attr_s("reduction", "none")?.as_str() {
        "none" => ScatterReduce::None,
        "add" => ScatterReduce::Add,
        "mul" => ScatterReduce::Mul,
        "max" => ScatterReduce::Max,
        "min" => ScatterReduce::Min,
        other => return Err(c.bad_attr(format!("reduction '{other}'"))),
    };
    if r != ScatterReduce::None && !matches!(dtype, DType::F32 | DType::I32 | DType::I64) {
        return Err(c.e(
            ErrorKind::UnsupportedDType,
            format!("reduction on {dtype} (the device reduces f32, i32 and i64)"),
        ));
    }
    Ok(r)
}

/// ScatterElements (and its opset-9 name Scatter): the output is the data.
pub(crate) fn infer_scatter_elements(c: &Ctx) -> Result<Vec<Out>> {
    let (x, i, u) = (c.input(0)?, c.input(1)?, c.input(2)?);
    let axis = elements_axis(c, x, i)?;
    if u.shape != i.shape || u.dtype != x.dtype {
        return Err(c.mismatch(format!(
            "updates {:?} ({}) for indices {:?} into data of {}",
            u.shape, u.dtype, i.shape, x.dtype
        )));
    }
    scatter_reduce(c, x.dtype)?;
    check_const_indices(c, 1, |_| x.shape[axis])?;
    Ok(vec![out(x.dtype, x.shape.clone())])
}

/// GatherND / ScatterND geometry: `(b, k)`, batch dimensions and index tuple length.
fn nd_geometry(c: &Ctx, x: &Value, i: &Value, b: usize) -> Result<(usize, usize)> {
    index_type(c, i)?;
    let (r, q) = (x.shape.len(), i.shape.len());
    if q == 0 || r == 0 {
        return Err(c.mismatch("data and indices of rank ≥ 1"));
    }
    let k = i.shape[q - 1];
    if b >= q || b + k > r || x.shape[..b] != i.shape[..b] {
        return Err(c.mismatch(format!(
            "indices of shape {:?} into data of shape {:?} with batch_dims {b}",
            i.shape, x.shape
        )));
    }
    if k == 0 {
        return Err(c.e(
            ErrorKind::UnsupportedOp,
            "index tuples of length 0 (whole-data slices)",
        ));
    }
    Ok((b, k))
}

/// GatherND: `indices.shape[..-1] + data.shape[b + k..]`.
pub(crate) fn infer_gather_nd(c: &Ctx) -> Result<Vec<Out>> {
    let (x, i) = (c.input(0)?, c.input(1)?);
    let b = usize::try_from(c.n.attr_i("batch_dims", 0)?)
        .map_err(|_| c.bad_attr("negative batch_dims"))?;
    let (b, k) = nd_geometry(c, x, i, b)?;
    let q = i.shape.len();
    check_const_indices(c, 1, |p| x.shape[b + p % k])?;
    let mut s = i.shape[..q - 1].to_vec();
    s.extend(&x.shape[b + k..]);
    Ok(vec![out(x.dtype, s)])
}

/// ScatterND: the output is the data; updates are `indices.shape[..-1] + data.shape[k..]`.
pub(crate) fn infer_scatter_nd(c: &Ctx) -> Result<Vec<Out>> {
    let (x, i, u) = (c.input(0)?, c.input(1)?, c.input(2)?);
    let (_, k) = nd_geometry(c, x, i, 0)?;
    let q = i.shape.len();
    let mut want = i.shape[..q - 1].to_vec();
    want.extend(&x.shape[k..]);
    if u.shape != want || u.dtype != x.dtype {
        return Err(c.mismatch(format!(
            "updates of shape {:?} ({}) where {want:?} ({}) is expected",
            u.shape, u.dtype, x.dtype
        )));
    }
    scatter_reduce(c, x.dtype)?;
    check_const_indices(c, 1, |p| x.shape[p % k])?;
    Ok(vec![out(x.dtype, x.shape.clone())])
}

/// Gather (constant indices are range-checked).
pub(crate) fn infer_gather(c: &Ctx) -> Result<Vec<Out>> {
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
    let axis = gather_axis(c, x.shape.len())?;
    if let Some(t) = c.konst(1) {
        let lim = x.shape[axis] as i64;
        if let Some(bad) = t.to_i64s().iter().copied().find(|&v| v < -lim || v >= lim) {
            return Err(c.bad_attr(format!("index {bad} is out of range for size {lim}")));
        }
    }
    let mut s = x.shape[..axis].to_vec();
    s.extend(&i.shape);
    s.extend(&x.shape[axis + 1..]);
    Ok(vec![out(x.dtype, s)])
}

/// Gather's axis for data of rank `r` (the `axis` attribute, 0 by default).
fn gather_axis(c: &Ctx, r: usize) -> Result<usize> {
    c.norm_axis(c.n.attr_i("axis", 0)?, r)
}

/// Folds Gather: the rows the indices name (negative ones from the end; inference checked
/// the range), for each index before the axis.
fn fold_gather(c: &Ctx, outs: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    let x = input(c, 0);
    let idx = input(c, 1).to_i64s();
    let axis = gather_axis(c, x.shape.len())?;
    let outer: usize = x.shape[..axis].iter().product();
    let a = x.shape[axis];
    let inner: usize = x.shape[axis + 1..].iter().product();
    let mut positions = Vec::with_capacity(outer * idx.len() * inner);
    for o in 0..outer {
        for &i in idx.iter() {
            let i = if i < 0 { i + a as i64 } else { i } as usize;
            for j in 0..inner {
                positions.push(((o * a + i) * inner + j) as i64);
            }
        }
    }
    let data = match &x.data {
        Data::F32(v) => Data::F32(positions.iter().map(|&p| v[p as usize]).collect()),
        Data::I64(v) => Data::I64(positions.iter().map(|&p| v[p as usize]).collect()),
    };
    one(HostTensor {
        dtype: x.dtype,
        shape: outs[0].shape.clone(),
        data,
    })
}

impl<'a> Lowerer<'a> {
    /// OneHot: the indices (as i64, negative ones + depth) broadcast along the new axis
    /// are compared with a constant ramp `0..depth`; the values' on / off element is
    /// selected on DVE. Indices outside `[-depth, depth)` match nothing.
    pub(crate) fn lower_one_hot(&mut self, at: At<'a>) -> Result<()> {
        let At {
            n, c, o0, oshape, ..
        } = at;
        let (depth, axis) = one_hot_params(&c)?;
        let y = self.alloc(o0);
        let total: usize = oshape.iter().product();
        if total == 0 {
            return Ok(());
        }
        let x = self.input_view(n, 0)?;
        let ishape = x.shape.clone();
        let idx = self.converted(x, DType::I64)?;
        let ie: usize = ishape.iter().product();
        let tmp = |l: &mut Self, d: DType, sh: &[usize]| {
            View::dense(l.temp(sh.iter().product::<usize>() * d.size()), d, sh)
        };
        let neg = tmp(self, DType::Bool, &ishape);
        let zc = self.add_const(&HostTensor::ints(DType::I64, vec![1], vec![0]))?;
        let dc = self.add_const(&HostTensor::ints(DType::I64, vec![1], vec![depth as i64]))?;
        let ones = vec![1usize; ishape.len()];
        let zero = View::dense(zc, DType::I64, &ones).broadcast(&ishape);
        let dv = View::dense(dc, DType::I64, &ones).broadcast(&ishape);
        let norm = tmp(self, DType::I64, &ishape);
        if ie > 0 {
            self.binary(&idx, &zero, &neg, BinaryOp::Less)?;
            self.binary(&idx, &dv, &norm, BinaryOp::Add)?;
            self.select(&neg, &norm, &idx, &norm)?;
        }
        // The indices along every output axis but `axis` (stride 0 there).
        let mut strides = norm.strides.clone();
        strides.insert(axis, 0);
        let nv = View {
            addr: norm.addr,
            dtype: DType::I64,
            shape: oshape.to_vec(),
            strides,
        };
        let ramp = self.add_const(&HostTensor::ints(
            DType::I64,
            vec![depth],
            (0..depth as i64).collect(),
        ))?;
        let mut rs = vec![1usize; oshape.len()];
        rs[axis] = depth;
        let rv = View::dense(ramp, DType::I64, &rs).broadcast(oshape);
        let eq = tmp(self, DType::Bool, oshape);
        self.binary(&nv, &rv, &eq, BinaryOp::Equal)?;
        let vals = self.input_view(n, 2)?;
        let vals = vals
            .reshape(&[2])
            .ok_or_else(|| c.mismatch("values are not two contiguous elements"))?;
        let off = vals.slice(0, 0, 1, 1);
        let on = vals.slice(0, 1, 1, 1);
        let one = vec![1usize; oshape.len()];
        let off = View {
            shape: one.clone(),
            strides: vec![0; one.len()],
            ..off
        }
        .broadcast(oshape);
        let on = View {
            shape: one.clone(),
            strides: vec![0; one.len()],
            ..on
        }
        .broadcast(oshape);
        self.select(&eq, &on, &off, &y)
    }

    /// TensorScatter: the cache copied, then the update scattered along the axis at
    /// `write_indices[b] + s` (mod the cache length when circular), positions computed on
    /// DVE in i64 (POOL's ScatterElements range-checks them).
    pub(crate) fn lower_tensor_scatter(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let (xv, uv) = (c.input(0)?, c.input(1)?);
        let (axis, circular) = tensor_scatter_params(&c)?;
        let x = self.input_view(n, 0)?;
        let y = self.alloc(o0);
        self.copy(Engine::Pool, &x, &y)?;
        let us = uv.shape.clone();
        let total: usize = us.iter().product();
        if total == 0 {
            return Ok(());
        }
        let len = us[axis];
        let mut rs = vec![1usize; us.len()];
        rs[axis] = len;
        let ramp = self.add_const(&HostTensor::i64(vec![len], (0..len as i64).collect()))?;
        let rv = View::dense(ramp, DType::I64, &rs).broadcast(&us);
        let idx = View::dense(self.temp(total * 8), DType::I64, &us);
        match c.opt(2) {
            Some(_) => {
                let w = self.input_view(n, 2)?;
                let w = self.converted(w, DType::I64)?;
                let mut strides = vec![0i64; us.len()];
                strides[0] = w.strides[0];
                let wv = View {
                    shape: us.clone(),
                    strides,
                    ..w
                };
                self.binary(&wv, &rv, &idx, BinaryOp::Add)?;
            }
            None => self.copy(Engine::Dve, &rv, &idx)?,
        }
        if circular {
            // idx mod L, the remainder made non-negative.
            let m = xv.shape[axis] as i64;
            let ones = vec![1usize; us.len()];
            let mc = self.add_const(&HostTensor::i64(vec![1], vec![m]))?;
            let mv = View::dense(mc, DType::I64, &ones).broadcast(&us);
            let zc = self.add_const(&HostTensor::i64(vec![1], vec![0]))?;
            let zv = View::dense(zc, DType::I64, &ones).broadcast(&us);
            let q = View::dense(self.temp(total * 8), DType::I64, &us);
            self.binary(&idx, &mv, &q, BinaryOp::Div)?;
            self.binary(&q, &mv, &q, BinaryOp::Mul)?;
            self.binary(&idx, &q, &idx, BinaryOp::Sub)?;
            let neg = View::dense(self.temp(total), DType::Bool, &us);
            self.binary(&idx, &zv, &neg, BinaryOp::Less)?;
            self.binary(&idx, &mv, &q, BinaryOp::Add)?;
            self.select(&neg, &q, &idx, &idx)?;
        }
        let upd = self.input_view(n, 1)?;
        let (output, aps, ax) = elements_aps(&us, &xv.shape, axis, &y, &[&idx, &upd])?;
        self.emit(
            0,
            Engine::Pool,
            Op::ScatterElements(op::ScatterElements {
                indices: aps[0],
                updates: aps[1],
                output,
                axis: ax,
                reduce: ScatterReduce::None,
            }),
        );
        Ok(())
    }

    /// MaxUnpool: the unpooled tensor zeroed, then `X` scattered at `I` (flat positions in
    /// it) by one ScatterElements; with a larger `output_shape` it is a zeroed temporary
    /// copied into the output's leading corner.
    pub(crate) fn lower_max_unpool(&mut self, at: At<'a>) -> Result<()> {
        let At {
            n, c, o0, oshape, ..
        } = at;
        let xv = c.input(0)?;
        let (inferred, _) = max_unpool_shapes(&c)?;
        let y = self.alloc(o0);
        if oshape.iter().product::<usize>() == 0 {
            return Ok(());
        }
        self.fill(Engine::Pool, &y, 0.0)?;
        let total: usize = inferred.iter().product();
        let direct = inferred == oshape;
        let dst = if direct {
            y.clone()
        } else {
            let t = View::dense(self.temp(total * xv.dtype.size()), xv.dtype, &inferred);
            self.fill(Engine::Pool, &t, 0.0)?;
            t
        };
        if total == 0 {
            return Ok(());
        }
        let ne = xv.elements();
        if ne == 0 {
            return Ok(());
        }
        let flat = |l: &mut Self, v: View| -> Result<View> {
            let sh = v.shape.clone();
            Ok(match v.reshape(&[1, ne]) {
                Some(f) => f,
                None => {
                    let t = View::dense(l.temp(ne * v.dtype.size()), v.dtype, &sh);
                    l.copy(Engine::Pool, &v, &t)?;
                    View::dense(t.addr, t.dtype, &[1, ne])
                }
            })
        };
        let xi = self.input_view(n, 0)?;
        let xf = flat(self, xi)?;
        let ii = self.input_view(n, 1)?;
        let idf = flat(self, ii)?;
        let yf = View::dense(dst.addr, dst.dtype, &[1, total]);
        let (output, aps, ax) = elements_aps(&[1, ne], &[1, total], 1, &yf, &[&idf, &xf])?;
        self.emit(
            0,
            Engine::Pool,
            Op::ScatterElements(op::ScatterElements {
                indices: aps[0],
                updates: aps[1],
                output,
                axis: ax,
                reduce: ScatterReduce::None,
            }),
        );
        if !direct {
            let mut corner = y.clone();
            for (d, &len) in inferred.iter().enumerate() {
                corner = corner.slice(d, 0, len, 1);
            }
            self.copy(Engine::Pool, &dst, &corner)?;
        }
        Ok(())
    }

    /// Compress with a compile-time condition: one copy per run of consecutive kept
    /// slices (elements of the flattened input without an axis).
    pub(crate) fn lower_compress(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let (axis, kept) = compress_params(&c)?;
        let y = self.alloc(o0);
        if y.shape.contains(&0) {
            return Ok(());
        }
        let x = self.input_view(n, 0)?;
        let (x, a) = match axis {
            Some(a) => (x, a),
            None => {
                let flat = x.shape.iter().product::<usize>();
                let x = match x.reshape(&[flat]) {
                    Some(v) => v,
                    None => {
                        let t = View::dense(self.temp(flat * x.dtype.size()), x.dtype, &x.shape);
                        self.copy(Engine::Pool, &x, &t)?;
                        View::dense(t.addr, t.dtype, &[flat])
                    }
                };
                (x, 0)
            }
        };
        let mut k = 0;
        while k < kept.len() {
            let mut e = k + 1;
            while e < kept.len() && kept[e] == kept[e - 1] + 1 {
                e += 1;
            }
            let src = x.slice(a, kept[k] as i64, e - k, 1);
            let dst = y.slice(a, k as i64, e - k, 1);
            self.copy(Engine::Pool, &src, &dst)?;
            k = e;
        }
        Ok(())
    }

    /// Gather: one instruction on POOL.
    pub(crate) fn lower_gather(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let iv = c.input(1)?;
        let axis = c.norm_axis(n.attr_i("axis", 0)?, xv.shape.len())?;
        let x = self.input_view(n, 0)?;
        let idx = self.input_view(n, 1)?;
        let y = self.alloc(o0);
        let outer: usize = xv.shape[..axis].iter().product();
        let a = xv.shape[axis];
        let inner: usize = xv.shape[axis + 1..].iter().product();
        let ni_ = iv.elements();
        if outer * inner * ni_ > 0 {
            let data = dense_ap(x.addr, x.dtype, &[outer, a, inner])?;
            let ind = dense_ap(idx.addr, idx.dtype, &[ni_])?;
            let out = dense_ap(y.addr, y.dtype, &[outer, ni_, inner])?;
            self.emit(
                0,
                Engine::Pool,
                Op::Gather(op::Gather {
                    data,
                    indices: ind,
                    output: out,
                }),
            );
        }
        Ok(())
    }

    /// GatherElements: one instruction on POOL.
    pub(crate) fn lower_gather_elements(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let (xv, iv) = (c.input(0)?, c.input(1)?);
        let axis = c.norm_axis(n.attr_i("axis", 0)?, xv.shape.len())?;
        let x = self.input_view(n, 0)?;
        let idx = self.input_view(n, 1)?;
        let y = self.alloc(o0);
        if iv.elements() == 0 {
            return Ok(());
        }
        let (data, aps, axis) = elements_aps(&iv.shape, &xv.shape, axis, &x, &[&idx, &y])?;
        self.emit(
            0,
            Engine::Pool,
            Op::GatherElements(op::GatherElements {
                data,
                indices: aps[0],
                output: aps[1],
                axis,
            }),
        );
        Ok(())
    }

    /// ScatterElements: a copy of the data, then one scatter on POOL.
    pub(crate) fn lower_scatter_elements(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let (xv, iv) = (c.input(0)?, c.input(1)?);
        let axis = c.norm_axis(n.attr_i("axis", 0)?, xv.shape.len())?;
        let reduce = scatter_reduce(&c, xv.dtype)?;
        let x = self.input_view(n, 0)?;
        let idx = self.input_view(n, 1)?;
        let upd = self.input_view(n, 2)?;
        let y = self.alloc(o0);
        self.copy(Engine::Pool, &x, &y)?;
        if iv.elements() == 0 {
            return Ok(());
        }
        let (output, aps, axis) = elements_aps(&iv.shape, &xv.shape, axis, &y, &[&idx, &upd])?;
        self.emit(
            0,
            Engine::Pool,
            Op::ScatterElements(op::ScatterElements {
                indices: aps[0],
                updates: aps[1],
                output,
                axis,
                reduce,
            }),
        );
        Ok(())
    }

    /// The flat row number of each index tuple of GatherND / ScatterND: `[N]` i64 (N the
    /// number of tuples) over the data seen as `[rows, slice]`. Component `j` becomes
    /// `idx·stride_j` through a `GatherElements` from the constant table
    /// `[0, stride_j, 2·stride_j, …]` (which also range-checks it and resolves negative
    /// indices on the device); batch offsets are one more constant.
    fn nd_rows(&mut self, n: &crate::graph::Node, x: &Value, i: &Value, b: usize) -> Result<View> {
        let q = i.shape.len();
        let k = i.shape[q - 1];
        let tuples: usize = i.shape[..q - 1].iter().product();
        let idx = self.input_view(n, 1)?;
        let rows = View::dense(self.temp(tuples * 8), DType::I64, &[tuples]);
        let part = View::dense(self.temp(tuples * 8), DType::I64, &[tuples]);
        let mut stride = 1i64;
        for j in (0..k).rev() {
            let dim = x.shape[b + j];
            let table = HostTensor::i64(vec![dim], (0..dim as i64).map(|v| v * stride).collect());
            let t = self.add_const(&table)?;
            let dst = if j == k - 1 { &rows } else { &part };
            self.emit(
                0,
                Engine::Pool,
                Op::GatherElements(op::GatherElements {
                    data: mk_ap(t, DType::I64, &[tuples, dim], &[0, 1])?,
                    indices: mk_ap(idx.elems(j as i64), idx.dtype, &[tuples, 1], &[k as i64, 1])?,
                    output: dense_ap(dst.addr, DType::I64, &[tuples, 1])?,
                    axis: 3,
                }),
            );
            if j != k - 1 {
                self.binary(&rows, &part, &rows, BinaryOp::Add)?;
            }
            stride = stride
                .checked_mul(dim as i64)
                .ok_or_else(|| c_too_large(n))?;
        }
        if b > 0 {
            // Tuple t of batch β (β = t / per_batch) adds β · (rows per batch).
            let per_batch = tuples / i.shape[..b].iter().product::<usize>().max(1);
            let offs: Vec<i64> = (0..tuples)
                .map(|t| (t / per_batch.max(1)) as i64 * stride)
                .collect();
            let o = self.add_const(&HostTensor::i64(vec![tuples], offs))?;
            self.binary(
                &rows,
                &View::dense(o, DType::I64, &[tuples]),
                &rows,
                BinaryOp::Add,
            )?;
        }
        Ok(rows)
    }

    /// GatherND: the row numbers ([`Self::nd_rows`]), then one row `Gather`.
    pub(crate) fn lower_gather_nd(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let (xv, iv) = (c.input(0)?, c.input(1)?);
        let b = n.attr_i("batch_dims", 0)? as usize;
        let q = iv.shape.len();
        let k = iv.shape[q - 1];
        let tuples: usize = iv.shape[..q - 1].iter().product();
        let slice: usize = xv.shape[b + k..].iter().product();
        let total_rows: usize = xv.shape[..b + k].iter().product();
        let y = self.alloc(o0);
        if tuples * slice == 0 {
            return Ok(());
        }
        let rows = self.nd_rows(n, xv, iv, b)?;
        let x = self.input_view(n, 0)?;
        self.emit(
            0,
            Engine::Pool,
            Op::Gather(op::Gather {
                data: dense_ap(x.addr, x.dtype, &[total_rows, slice])?,
                indices: dense_ap(rows.addr, DType::I64, &[tuples])?,
                output: dense_ap(y.addr, y.dtype, &[tuples, slice])?,
            }),
        );
        Ok(())
    }

    /// ScatterND: a copy of the data, the row numbers ([`Self::nd_rows`]), then one
    /// scatter of whole rows (the row number broadcast along the slice).
    pub(crate) fn lower_scatter_nd(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let (xv, iv) = (c.input(0)?, c.input(1)?);
        let reduce = scatter_reduce(&c, xv.dtype)?;
        let q = iv.shape.len();
        let k = iv.shape[q - 1];
        let tuples: usize = iv.shape[..q - 1].iter().product();
        let slice: usize = xv.shape[k..].iter().product();
        let total_rows: usize = xv.shape[..k].iter().product();
        let y = self.alloc(o0);
        if !self.in_place.contains(&o0) {
            let x = self.input_view(n, 0)?;
            self.copy(Engine::Pool, &x, &y)?;
        }
        if tuples * slice == 0 {
            return Ok(());
        }
        let rows = self.nd_rows(n, xv, iv, 0)?;
        let upd = self.input_view(n, 2)?;
        self.emit(
            0,
            Engine::Pool,
            Op::ScatterElements(op::ScatterElements {
                indices: mk_ap(rows.addr, DType::I64, &[tuples, slice], &[1, 0])?,
                updates: dense_ap(upd.addr, upd.dtype, &[tuples, slice])?,
                output: dense_ap(y.addr, y.dtype, &[total_rows, slice])?,
                axis: 2,
                reduce,
            }),
        );
        Ok(())
    }
}

/// The error for index strides that overflow.
fn c_too_large(n: &crate::graph::Node) -> crate::error::CompileError {
    n.error(ErrorKind::UnsupportedOp, "data too large to index")
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_i, fold1};
    use crate::tensor::HostTensor;

    #[test]
    fn gather_folds_rows_along_its_axis() {
        let x = HostTensor::i64(vec![2, 3], vec![10, 11, 12, 20, 21, 22]);
        // Negative indices count from the end; indices of rank 2 add their shape.
        let idx = HostTensor::i64(vec![2, 1], vec![-1, 0]);
        let g = fold1(
            "Gather",
            13,
            vec![x.clone(), idx.clone()],
            vec![a_i("axis", 1)],
        );
        assert_eq!(g, HostTensor::i64(vec![2, 2, 1], vec![12, 10, 22, 20]));
        let rows = fold1(
            "Gather",
            13,
            vec![x, HostTensor::i64(vec![], vec![1])],
            vec![],
        );
        assert_eq!(rows, HostTensor::i64(vec![3], vec![20, 21, 22]));
        // Float data (opset 1: axis 0 by default).
        let f = HostTensor::f32(vec![3], vec![0.5, 1.5, 2.5]);
        let g = fold1("Gather", 1, vec![f, idx], vec![]);
        assert_eq!(g, HostTensor::f32(vec![2, 1], vec![2.5, 0.5]));
    }
}
