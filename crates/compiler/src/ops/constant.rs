//! Operators computed at compile time: Constant, Shape, Size, ConstantOfShape, Range.

use super::{Fold, Registry};
use crate::error::{ErrorKind, Result};
use crate::params::{Ctx, Out, konst};
use crate::tensor::HostTensor;

pub(super) fn register(r: &mut Registry) {
    r.op("Constant", 1, infer_constant);
    r.op("Shape", 1, infer_shape);
    r.op("Size", 1, infer_size).fold(Fold::Only);
    r.op("ConstantOfShape", 9, infer_constant_of_shape)
        .fold(Fold::Only);
    r.op("Range", 11, infer_range).fold(Fold::Only);
}

/// Constant (any of its value attributes).
pub(crate) fn infer_constant(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
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
    Ok(vec![konst(t)])
}

/// Shape (with start / end).
pub(crate) fn infer_shape(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let x = c.input(0)?;
    let r = x.shape.len() as i64;
    let clampi = |v: i64| if v < 0 { (v + r).max(0) } else { v.min(r) };
    let start = clampi(n.attr_i("start", 0)?) as usize;
    let end = clampi(n.attr_i("end", r)?) as usize;
    let v: Vec<i64> = x.shape[start..end.max(start)]
        .iter()
        .map(|&d| d as i64)
        .collect();
    Ok(vec![konst(HostTensor::i64(vec![v.len()], v))])
}

/// Size.
pub(crate) fn infer_size(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    Ok(vec![konst(HostTensor::i64(
        vec![],
        vec![x.elements() as i64],
    ))])
}

/// ConstantOfShape.
pub(crate) fn infer_constant_of_shape(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
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
    Ok(vec![konst(t)])
}

/// Range.
pub(crate) fn infer_range(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
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
    Ok(vec![konst(t)])
}
