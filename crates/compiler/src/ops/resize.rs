//! Resize on POOL (nearest and linear, up to rank 4).

use super::Registry;
use crate::error::{ErrorKind, Result};
use crate::lower::{At, Lowerer};
use crate::params;
use crate::params::{Ctx, Out, out, resize_params};
use nrt_hal::Engine;
use nrt_isa::Op;

pub(super) fn register(r: &mut Registry) {
    r.op("Resize", 10, infer_resize)
        .f32_on_device()
        .note("nearest and linear, rank ≤ 4")
        .device(lower!(lower_resize));
}

/// Resize: output sizes from `resize_params`.
pub(crate) fn infer_resize(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    let p = resize_params(c, &x.shape)?;
    Ok(vec![out(x.dtype, p.out)])
}

impl<'a> Lowerer<'a> {
    /// Resize: one instruction on POOL.
    pub(crate) fn lower_resize(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        if xv.shape.len() > 4 {
            return Err(c.e(ErrorKind::UnsupportedOp, "Resize of rank > 4"));
        }
        let p = params::resize_params(&c, &xv.shape)?;
        let (x, y) = self.unary_io(n, o0)?;
        let mut scales = [0f32; 4];
        let off = 4 - xv.shape.len();
        for (i, &s) in p.scales.iter().enumerate() {
            scales[off + i] = s;
        }
        let xa = x.ap()?;
        let ya = y.ap()?;
        self.emit(
            0,
            Engine::Pool,
            Op::Resize {
                input: xa,
                output: ya,
                mode: p.mode,
                coord: p.coord,
                nearest: p.nearest,
                scales,
            },
        );
        Ok(())
    }
}
