//! Operators whose output extent depends on the data: NonZero, Unique, NonMaxSuppression
//! (`Op::NonZero`, `Op::Unique`, `Op::NonMaxSuppression` on POOL).
//!
//! The device has static shapes, so such an output gets a static upper bound on its
//! data-dependent axis (NonZero: the input's element count; Unique: the elements along the
//! axis, or all of them; NonMaxSuppression: batches·classes·min(boxes,
//! max_output_boxes_per_class when it is known at compile time)). The instruction writes
//! the actual result packed first in that bound (zeros after) and the actual shape into the
//! i64 companion output `<name>:shape` ([`crate::lower::Lowerer::shape_out`]). Such a value
//! may only be a graph output: inference rejects a node that reads one.

use super::{Fold, Registry};
use crate::error::{ErrorKind, Result};
use crate::lower::view::{View, mk_ap};
use crate::lower::{At, Lowerer};
use crate::params::{Ctx, Out, bounded_out, out};
use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::{Op, ShapeTemplate, nms_flags};

pub(super) fn register(r: &mut Registry) {
    r.op("NonZero", 9, infer_non_zero)
        .fold(Fold::Never)
        .note("rank 1–4; output at its upper bound [rank, elements] with the actual shape in `<name>:shape`; graph outputs only")
        .device(lower!(lower_non_zero));
    r.op("Unique", 11, infer_unique)
        .fold(Fold::Never)
        .note("f32 and integers; Y, indices, counts at their upper bound with the actual shape in `<name>:shape`; graph outputs only")
        .device(lower!(lower_unique));
    r.op("NonMaxSuppression", 10, infer_nms)
        .fold(Fold::Never)
        .note("selected_indices at its upper bound with the actual shape in `<name>:shape`; thresholds read at execution time; graph outputs only")
        .device(lower!(lower_nms));
}

/// Element types Unique orders (as `Op::Unique` does).
fn unique_dtype(c: &Ctx, x: &crate::graph::Value) -> Result<()> {
    match x.dtype {
        DType::F32
        | DType::I64
        | DType::I32
        | DType::I16
        | DType::I8
        | DType::U64
        | DType::U32
        | DType::U16
        | DType::U8 => Ok(()),
        d => Err(c.e(
            ErrorKind::UnsupportedDType,
            format!("input '{}' is {d}; Unique orders f32 and integers", x.name),
        )),
    }
}

/// NonZero: i64 `[rank, elements]` (the bound).
fn infer_non_zero(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    let r = x.shape.len();
    if !(1..=4).contains(&r) {
        return Err(c.e(
            ErrorKind::UnsupportedOp,
            format!(
                "input '{}' has rank {r}; NonZero is supported on ranks 1 to 4",
                x.name
            ),
        ));
    }
    Ok(vec![bounded_out(DType::I64, vec![r, x.elements()])])
}

/// Unique's axis (`None`: flattened) and `sorted`.
fn unique_params(c: &Ctx) -> Result<(Option<usize>, bool)> {
    let x = c.input(0)?;
    let axis = if c.n.has_attr("axis") {
        Some(c.norm_axis(c.n.attr_i("axis", 0)?, x.shape.len())?)
    } else {
        None
    };
    let sorted = match c.n.attr_i("sorted", 1)? {
        0 => false,
        1 => true,
        v => return Err(c.bad_attr(format!("sorted = {v} (0 or 1)"))),
    };
    Ok((axis, sorted))
}

/// Unique: Y (bound: every slice distinct), indices, inverse_indices (static), counts.
fn infer_unique(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    unique_dtype(c, x)?;
    let (axis, _) = unique_params(c)?;
    let (y, a) = match axis {
        Some(ax) => (x.shape.clone(), x.shape[ax]),
        None => (vec![x.elements()], x.elements()),
    };
    Ok(vec![
        bounded_out(x.dtype, y),
        bounded_out(DType::I64, vec![a]),
        out(DType::I64, vec![a]),
        bounded_out(DType::I64, vec![a]),
    ])
}

/// NonMaxSuppression's sizes `(batches, classes, boxes)` and the compile-time
/// `max_output_boxes_per_class`, if known (clamped to `0..=boxes`).
fn nms_params(c: &Ctx) -> Result<(usize, usize, usize, Option<usize>)> {
    let (b, s) = (c.input(0)?, c.input(1)?);
    if b.shape.len() != 3 || b.shape[2] != 4 {
        return Err(c.mismatch(format!(
            "boxes '{}' must be [batches, boxes, 4], not {:?}",
            b.name, b.shape
        )));
    }
    let (nb, ns) = (b.shape[0], b.shape[1]);
    if s.shape.len() != 3 || s.shape[0] != nb || s.shape[2] != ns {
        return Err(c.mismatch(format!(
            "scores '{}' must be [{nb}, classes, {ns}], not {:?}",
            s.name, s.shape
        )));
    }
    for (i, v) in [(0, b), (1, s)] {
        if v.dtype != DType::F32 {
            return Err(c.e(
                ErrorKind::UnsupportedDType,
                format!("input {i} '{}' is {}; f32 is supported", v.name, v.dtype),
            ));
        }
    }
    for (i, what, dt) in [
        (2, "max_output_boxes_per_class", DType::I64),
        (3, "iou_threshold", DType::F32),
        (4, "score_threshold", DType::F32),
    ] {
        if let Some(v) = c.opt(i)
            && (v.elements() > 1 || v.dtype != dt)
        {
            return Err(c.mismatch(format!(
                "{what} '{}' must be one {dt} (is {} {:?})",
                v.name, v.dtype, v.shape
            )));
        }
    }
    let max = match c.konst(2) {
        Some(t) => Some(
            t.to_i64s()
                .first()
                .map_or(0, |&m| m.clamp(0, ns as i64) as usize),
        ),
        // (absent: no box is selected, as in ONNX Runtime and the reference)
        None if c.opt(2).is_none() => Some(0),
        None => None,
    };
    match c.n.attr_i("center_point_box", 0)? {
        0 | 1 => {}
        v => return Err(c.bad_attr(format!("center_point_box = {v} (0 or 1)"))),
    }
    Ok((nb, s.shape[1], ns, max))
}

/// NonMaxSuppression: selected_indices i64 `[bound, 3]`.
fn infer_nms(c: &Ctx) -> Result<Vec<Out>> {
    let (nb, nc, ns, max) = nms_params(c)?;
    let per_class = max.unwrap_or(ns).min(ns);
    let bound = nb
        .checked_mul(nc)
        .and_then(|x| x.checked_mul(per_class))
        .ok_or_else(|| c.e(ErrorKind::TooLarge, "batches × classes × boxes overflows"))?;
    Ok(vec![bounded_out(DType::I64, vec![bound, 3])])
}

impl<'a> Lowerer<'a> {
    /// Storage for output `k` of node `at.n`: its own (a graph output's buffer), or a
    /// temporary of its bound when the model does not use it.
    fn dyn_output(&mut self, at: &At<'a>, k: usize, dtype: DType, shape: &[usize]) -> View {
        match at.n.outputs.get(k).copied().flatten() {
            Some(v) => self.alloc(v),
            None => {
                let bytes = shape.iter().product::<usize>() * dtype.size();
                View::dense(self.temp(bytes), dtype, shape)
            }
        }
    }

    /// Where the actual shape of output `k` goes (a temporary when the model does not use
    /// the output).
    fn dyn_shape(&mut self, at: &At<'a>, k: usize, rank: usize) -> View {
        match at.n.outputs.get(k).copied().flatten() {
            Some(v) => self.shape_out(v),
            None => View::dense(self.temp(8 * rank), DType::I64, &[rank]),
        }
    }

    pub(crate) fn lower_non_zero(&mut self, at: At<'a>) -> Result<()> {
        let x = self.input_view(at.n, 0)?;
        let (r, n) = (x.shape.len(), x.shape.iter().product::<usize>());
        let y = self.dyn_output(&at, 0, DType::I64, &[r, n]);
        let shape = self.dyn_shape(&at, 0, 2);
        let dense = |v: &View, s: &[usize]| {
            let mut st = vec![1i64; s.len()];
            for i in (1..s.len()).rev() {
                st[i - 1] = st[i] * s[i] as i64;
            }
            mk_ap(v.addr, v.dtype, s, &st)
        };
        self.emit(
            0,
            Engine::Pool,
            Op::NonZero(op::NonZero {
                input: dense(&x, &x.shape)?,
                output: dense(&y, &[1, r, n])?,
                shape: dense(&shape, &[2])?,
            }),
        );
        Ok(())
    }

    pub(crate) fn lower_unique(&mut self, at: At<'a>) -> Result<()> {
        let c = at.c;
        let xv = c.input(0)?;
        let (axis, sorted) = unique_params(&c)?;
        let x = self.input_view(at.n, 0)?;
        let (outer, a, inner, ydims) = match axis {
            Some(ax) => (
                xv.shape[..ax].iter().product::<usize>(),
                xv.shape[ax],
                xv.shape[ax + 1..].iter().product::<usize>(),
                xv.shape.clone(),
            ),
            None => (1, xv.elements(), 1, vec![xv.elements()]),
        };
        if ydims.len() > 8 {
            return Err(c.e(
                ErrorKind::UnsupportedOp,
                format!("input '{}' has rank {} > 8", xv.name, ydims.len()),
            ));
        }
        let y = self.dyn_output(&at, 0, xv.dtype, &ydims);
        let idx = self.dyn_output(&at, 1, DType::I64, &[a]);
        let inv = self.dyn_output(&at, 2, DType::I64, &[a]);
        let cnt = self.dyn_output(&at, 3, DType::I64, &[a]);
        let shape = self.dyn_shape(&at, 0, ydims.len());
        let ax = axis.unwrap_or(0);
        let mut dims = [0u32; 8];
        for (d, &s) in dims.iter_mut().zip(&ydims) {
            *d = u32::try_from(s).map_err(|_| crate::lower::view::too_large("a dimension"))?;
        }
        let block = |v: &View| {
            mk_ap(
                v.addr,
                v.dtype,
                &[outer, a, inner],
                &[(a * inner) as i64, inner as i64, 1],
            )
        };
        let row = |v: &View| mk_ap(v.addr, v.dtype, &[a], &[1]);
        self.emit(
            0,
            Engine::Pool,
            Op::Unique(op::Unique {
                input: block(&x)?,
                y: block(&y)?,
                indices: row(&idx)?,
                inverse: row(&inv)?,
                counts: row(&cnt)?,
                shape: mk_ap(shape.addr, DType::I64, &[ydims.len()], &[1])?,
                dims: ShapeTemplate {
                    rank: ydims.len() as u8,
                    axis: ax as u8,
                    dims,
                },
                sorted,
            }),
        );
        // indices and counts have Y's data-dependent extent: their shapes are `[U]`, the
        // entry of Y's shape at the axis.
        let u = shape.slice(0, ax as i64, 1, 1);
        for k in [1, 3] {
            if let Some(v) = at.n.outputs.get(k).copied().flatten()
                && self.shape_vars.contains_key(&v)
            {
                let dst = self.shape_out(v);
                self.copy(Engine::Pool, &u, &dst)?;
            }
        }
        Ok(())
    }

    pub(crate) fn lower_nms(&mut self, at: At<'a>) -> Result<()> {
        let c = at.c;
        let (nb, nc, ns, max) = nms_params(&c)?;
        let bound = at.oshape[0];
        let boxes = self.input_view(at.n, 0)?;
        let scores = self.input_view(at.n, 1)?;
        let selected = self.dyn_output(&at, 0, DType::I64, &[bound, 3]);
        let shape = self.dyn_shape(&at, 0, 2);
        let mut flags = 0u32;
        if at.n.attr_i("center_point_box", 0)? == 1 {
            flags |= nms_flags::CENTER_POINT_BOX;
        }
        // A scalar operand: a compile-time constant becomes the immediate, a computed or
        // input value is read by the kernel at execution time.
        let mut operand =
            |l: &mut Self, i: usize, flag: u32| -> Result<Option<nrt_isa::AccessPattern>> {
                match c.opt(i) {
                    Some(v) if v.konst.is_none() && v.elements() == 1 => {
                        flags |= flag;
                        let x = l.input_view(at.n, i)?;
                        Ok(Some(mk_ap(x.addr, x.dtype, &[1], &[1])?))
                    }
                    _ => Ok(None),
                }
            };
        let max_out = operand(self, 2, nms_flags::MAX_OUT)?;
        let iou = operand(self, 3, nms_flags::IOU)?;
        let score_threshold = operand(self, 4, nms_flags::SCORE)?;
        let first = |i: usize| c.konst(i).and_then(|t| t.to_f32s().first().copied());
        let iou_const = first(3).unwrap_or(0.0);
        let score_const = first(4);
        if score_threshold.is_none() && score_const.is_some() {
            flags |= nms_flags::SCORE_CONST;
        }
        let finite = |v: f32, what: &str| {
            if v.is_nan() {
                Err(c.bad_attr(format!("{what} is NaN")))
            } else {
                Ok(v)
            }
        };
        let max_out_const = u32::try_from(max.unwrap_or(ns))
            .map_err(|_| crate::lower::view::too_large("max_output_boxes_per_class"))?;
        self.emit(
            0,
            Engine::Pool,
            Op::NonMaxSuppression(op::NonMaxSuppression {
                boxes: mk_ap(
                    boxes.addr,
                    DType::F32,
                    &[nb, ns, 4],
                    &[(ns * 4) as i64, 4, 1],
                )?,
                scores: mk_ap(
                    scores.addr,
                    DType::F32,
                    &[nb, nc, ns],
                    &[(nc * ns) as i64, ns as i64, 1],
                )?,
                max_out,
                iou,
                score_threshold,
                selected: mk_ap(selected.addr, DType::I64, &[bound, 3], &[3, 1])?,
                shape: mk_ap(shape.addr, DType::I64, &[2], &[1])?,
                flags,
                max_out_const,
                iou_const: finite(iou_const, "iou_threshold")?,
                score_const: finite(score_const.unwrap_or(0.0), "score_threshold")?,
            }),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_i, infer_one, konst, out_types, var};
    use crate::tensor::HostTensor;
    use nrt_hal::DType;

    #[test]
    fn data_dependent_outputs_get_bounded_shapes() {
        let g = infer_one("NonZero", 13, vec![var(DType::F32, &[2, 3])], vec![], 1).unwrap();
        let y = g.outputs[0];
        assert_eq!(
            (g.values[y].dtype, g.values[y].shape.clone()),
            (DType::I64, vec![2, 6])
        );
        assert!(g.bounded.contains(&y));
        // Unique along axis 1 of [2, 5]: Y keeps the shape, the others are [5].
        let t = out_types(
            "Unique",
            11,
            vec![var(DType::I32, &[2, 5])],
            vec![a_i("axis", 1)],
            4,
        );
        let i5 = (DType::I64, vec![5]);
        assert_eq!(
            t.unwrap(),
            vec![(DType::I32, vec![2, 5]), i5.clone(), i5.clone(), i5]
        );
    }

    #[test]
    fn nms_bound_uses_a_constant_max_and_checks_the_scores() {
        let max = || konst(HostTensor::i64(vec![1], vec![2]));
        let ins = vec![
            var(DType::F32, &[1, 5, 4]),
            var(DType::F32, &[1, 3, 5]),
            max(),
        ];
        let t = out_types("NonMaxSuppression", 11, ins, vec![], 1).unwrap();
        assert_eq!(t, vec![(DType::I64, vec![6, 3])]);
        let ins = vec![
            var(DType::F32, &[1, 5, 4]),
            var(DType::F32, &[1, 3, 4]),
            max(),
        ];
        let e = out_types("NonMaxSuppression", 11, ins, vec![], 1).unwrap_err();
        assert!(
            e.message.contains("scores 'x1' must be [1, classes, 5]"),
            "{e}"
        );
    }
}
