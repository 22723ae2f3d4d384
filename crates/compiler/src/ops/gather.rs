//! Gather on POOL.

use super::Registry;
use crate::error::{ErrorKind, Result};
use crate::lower::view::dense_ap;
use crate::lower::{At, Lowerer};
use crate::params::{Ctx, Out, out};
use nrt_hal::{DType, Engine};
use nrt_isa::Op;

pub(super) fn register(r: &mut Registry) {
    r.op("Gather", 1, infer_gather).device(lower!(lower_gather));
}

/// Gather (constant indices are range-checked).
pub(crate) fn infer_gather(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
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
    Ok(vec![out(x.dtype, s)])
}

impl<'a> Lowerer<'a> {
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
                Op::Gather {
                    data,
                    indices: ind,
                    output: out,
                },
            );
        }
        Ok(())
    }
}
