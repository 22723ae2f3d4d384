//! GridSample (1-D to 3-D, nearest / linear / cubic, zeros / border / reflection padding)
//! as the ONNX reference computes it, on the device: per spatial dimension the grid
//! coordinate is denormalized, rounded (nearest) and brought inside the borders (border,
//! reflection) on DVE, then each interpolation tap gets its (clamped) input position and
//! weight — zero where the zeros padding reads outside. Every combination of taps is one
//! `GatherElements` on POOL from the input seen as `[N, C, S]` (the flat position, the same
//! for every channel, broadcast by stride 0) weighted and accumulated on DVE. One deliberate
//! difference from the reference: cubic with border padding clamps each tap, not the
//! coordinate, as PyTorch and ONNX Runtime do (no node test covers that pair).

use super::Registry;
use crate::error::{ErrorKind, Result};
use crate::lower::view::{View, dense_ap, mk_ap};
use crate::lower::{At, Lowerer};
use crate::params::{Ctx, Out, out};
use crate::tensor::HostTensor;
use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::{ActFunc, BinaryOp, Op};

pub(super) fn register(r: &mut Registry) {
    r.op("GridSample", 16, infer_grid_sample)
        .f32_on_device()
        .note("1-D to 3-D; taps gathered on POOL, coordinates and weights on DVE")
        .device(lower!(lower_grid_sample));
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

fn grid_params(c: &Ctx) -> Result<(Mode, Padding, bool)> {
    let n = c.n;
    let mode = match n.attr_s("mode", "linear")?.as_str() {
        "nearest" => Mode::Nearest,
        "linear" | "bilinear" => Mode::Linear,
        "cubic" | "bicubic" => Mode::Cubic,
        m => return Err(c.bad_attr(format!("mode '{m}'"))),
    };
    let pad = match n.attr_s("padding_mode", "zeros")?.as_str() {
        "zeros" => Padding::Zeros,
        "border" => Padding::Border,
        "reflection" => Padding::Reflection,
        m => return Err(c.bad_attr(format!("padding_mode '{m}'"))),
    };
    Ok((mode, pad, n.attr_i("align_corners", 0)? != 0))
}

/// GridSample: `[N, C, O…]` from the input `[N, C, D…]` and the grid `[N, O…, k]`.
pub(crate) fn infer_grid_sample(c: &Ctx) -> Result<Vec<Out>> {
    let (x, g) = (c.input(0)?, c.input(1)?);
    grid_params(c)?;
    let r = x.shape.len();
    if !(3..=5).contains(&r) {
        return Err(c.e(
            ErrorKind::UnsupportedOp,
            format!("GridSample of a rank-{r} input (1 to 3 spatial dimensions)"),
        ));
    }
    let k = r - 2;
    if g.shape.len() != r || g.shape[r - 1] != k || g.shape[0] != x.shape[0] {
        return Err(c.mismatch(format!(
            "grid of shape {:?} for an input of shape {:?}",
            g.shape, x.shape
        )));
    }
    if g.dtype != x.dtype {
        return Err(c.mismatch(format!("grid is {}, the input {}", g.dtype, x.dtype)));
    }
    let mut s = x.shape[..2].to_vec();
    s.extend(&g.shape[1..r - 1]);
    Ok(vec![out(x.dtype, s)])
}

impl<'a> Lowerer<'a> {
    fn gs_tmp(&mut self, shape: &[usize]) -> View {
        View::dense(
            self.temp(shape.iter().product::<usize>() * 4),
            DType::F32,
            shape,
        )
    }

    fn gs_bool(&mut self, shape: &[usize]) -> View {
        View::dense(
            self.temp(shape.iter().product::<usize>()),
            DType::Bool,
            shape,
        )
    }

    /// `y = min(max(x, lo), hi)`.
    fn gs_clamp(&mut self, x: &View, y: &View, lo: f32, hi: f32) -> Result<()> {
        self.tensor_scalar(x, y, BinaryOp::Max, lo)?;
        self.tensor_scalar(y, y, BinaryOp::Min, hi)
    }

    /// `x < lo ∨ x > hi`.
    fn gs_outside(&mut self, x: &View, lo: f32, hi: f32) -> Result<View> {
        let sh = x.shape.clone();
        let (a, b) = (self.gs_bool(&sh), self.gs_bool(&sh));
        let (lv, hv) = (self.scalar(lo, &sh)?, self.scalar(hi, &sh)?);
        self.binary(x, &lv, &a, BinaryOp::Less)?;
        self.binary(x, &hv, &b, BinaryOp::Greater)?;
        self.binary(&a, &b, &a, BinaryOp::Or)?;
        Ok(a)
    }

    /// The reference's reflection of `x` into `[lo, hi]` (by the nearer border, as often as
    /// needed), in place.
    fn gs_reflect(&mut self, x: &View, lo: f32, hi: f32) -> Result<()> {
        let sh = x.shape.clone();
        let rng = hi - lo;
        if rng <= 0.0 {
            return self.gs_clamp(x, x, lo, lo);
        }
        let (lv, hv) = (self.scalar(lo, &sh)?, self.scalar(hi, &sh)?);
        let (below, above) = (self.gs_bool(&sh), self.gs_bool(&sh));
        self.binary(x, &lv, &below, BinaryOp::Less)?;
        self.binary(x, &hv, &above, BinaryOp::Greater)?;
        let (dx, t) = (self.gs_tmp(&sh), self.gs_tmp(&sh));
        // dx = lo − x below, x − hi above.
        self.tensor_scalar(x, &dx, BinaryOp::Sub, hi)?;
        self.tensor_scalar(x, &t, BinaryOp::Mul, -1.0)?;
        self.tensor_scalar(&t, &t, BinaryOp::Add, lo)?;
        self.select(&below, &t, &dx, &dx)?;
        // q = ⌊dx / rng⌋ (dx ≥ 0 where it is used), r = dx − q·rng, odd = q mod 2.
        let q = self.gs_tmp(&sh);
        self.tensor_scalar(&dx, &q, BinaryOp::Div, rng)?;
        self.activation(&q, &q, None, (ActFunc::Floor, 0.0, 0.0), 1.0)?;
        self.tensor_scalar(&q, &t, BinaryOp::Mul, rng)?;
        self.binary(&dx, &t, &dx, BinaryOp::Sub)?;
        self.activation(&q, &t, None, (ActFunc::Floor, 0.0, 0.0), 0.5)?;
        self.tensor_scalar(&t, &t, BinaryOp::Mul, 2.0)?;
        self.binary(&q, &t, &q, BinaryOp::Sub)?;
        let odd = self.gs_bool(&sh);
        let half = self.scalar(0.5, &sh)?;
        self.binary(&q, &half, &odd, BinaryOp::Greater)?;
        // lo + r and hi − r.
        let (plus, minus) = (self.gs_tmp(&sh), self.gs_tmp(&sh));
        self.tensor_scalar(&dx, &plus, BinaryOp::Add, lo)?;
        self.tensor_scalar(&dx, &minus, BinaryOp::Mul, -1.0)?;
        self.tensor_scalar(&minus, &minus, BinaryOp::Add, hi)?;
        // Below: even → lo + r, odd → hi − r; above: even → hi − r, odd → lo + r.
        let (lo_res, hi_res) = (self.gs_tmp(&sh), self.gs_tmp(&sh));
        self.select(&odd, &minus, &plus, &lo_res)?;
        self.select(&odd, &plus, &minus, &hi_res)?;
        self.select(&above, &hi_res, x, x)?;
        self.select(&below, &lo_res, x, x)
    }

    /// `((p0·u + p1)·u + p2)·u + p3` into `y`.
    fn gs_cubic_poly(&mut self, u: &View, y: &View, p: [f32; 4]) -> Result<()> {
        self.tensor_scalar(u, y, BinaryOp::Mul, p[0])?;
        self.tensor_scalar(y, y, BinaryOp::Add, p[1])?;
        self.binary(y, u, y, BinaryOp::Mul)?;
        self.tensor_scalar(y, y, BinaryOp::Add, p[2])?;
        self.binary(y, u, y, BinaryOp::Mul)?;
        self.tensor_scalar(y, y, BinaryOp::Add, p[3])
    }

    pub(crate) fn lower_grid_sample(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let (xv, gv) = (c.input(0)?, c.input(1)?);
        let (mode, pad, align) = grid_params(&c)?;
        let r = xv.shape.len();
        let k = r - 2;
        let (nb, ch) = (xv.shape[0], xv.shape[1]);
        let dims = xv.shape[2..].to_vec();
        let gshape: Vec<usize> = gv.shape[..r - 1].to_vec();
        let otot: usize = gshape[1..].iter().product();
        let s_tot: usize = dims.iter().product();
        let y = self.alloc(o0);
        if nb * ch * otot == 0 {
            return Ok(());
        }
        if s_tot == 0 {
            return self.fill(Engine::Dve, &y, 0.0);
        }
        let mut x = self.input_view(n, 0)?;
        if !x.is_dense() {
            let t = View::dense(self.temp(xv.elements() * 4), DType::F32, &xv.shape);
            self.copy(Engine::Dve, &x, &t)?;
            x = t;
        }
        let grid = self.input_view(n, 1)?;
        // Per dimension: its taps (flat-position contribution as i64, weight or none).
        let mut taps: Vec<Vec<(View, Option<View>)>> = Vec::new();
        let mut stride = 1i64;
        let mut strides = vec![0i64; k];
        for i in (0..k).rev() {
            strides[i] = stride;
            stride *= dims[i] as i64;
        }
        for i in 0..k {
            let len = dims[i] as f32;
            let g = View {
                addr: grid.elems((k - 1 - i) as i64 * grid.strides[r - 1]),
                dtype: DType::F32,
                shape: gshape.clone(),
                strides: grid.strides[..r - 1].to_vec(),
            };
            let xi = self.gs_tmp(&gshape);
            // Denormalize: align ? (g+1)/2·(L−1) : ((g+1)·L − 1)/2.
            let (a, b) = if align {
                ((len - 1.0) / 2.0, (len - 1.0) / 2.0)
            } else {
                (len / 2.0, (len - 1.0) / 2.0)
            };
            self.tensor_scalar(&g, &xi, BinaryOp::Mul, a)?;
            self.tensor_scalar(&xi, &xi, BinaryOp::Add, b)?;
            if mode == Mode::Nearest {
                // Round half to even: (x + 1.5·2^23) − 1.5·2^23 where |x| < 2^22.
                const MAGIC: f32 = 12_582_912.0;
                let t = self.gs_tmp(&gshape);
                self.tensor_scalar(&xi, &t, BinaryOp::Add, MAGIC)?;
                self.tensor_scalar(&t, &t, BinaryOp::Sub, MAGIC)?;
                let big = self.gs_outside(&xi, -4_194_304.0, 4_194_304.0)?;
                self.select(&big, &xi, &t, &xi)?;
            }
            let (lo, hi) = if align {
                (0.0, len - 1.0)
            } else {
                (-0.5, len - 0.5)
            };
            match pad {
                // Cubic taps are clamped one by one, the coordinate itself is not (PyTorch's
                // grid_sample and ONNX Runtime; onnx's reference clamps it first, which moves
                // the taps: the two differ only for cubic with border padding).
                Padding::Border if mode == Mode::Cubic => {}
                Padding::Border => {
                    let out = self.gs_outside(&xi, lo, hi)?;
                    let cl = self.gs_tmp(&gshape);
                    self.gs_clamp(&xi, &cl, 0.0, len - 1.0)?;
                    self.select(&out, &cl, &xi, &xi)?;
                }
                Padding::Reflection => self.gs_reflect(&xi, lo, hi)?,
                Padding::Zeros => {}
            }
            let (base, t) = (self.gs_tmp(&gshape), self.gs_tmp(&gshape));
            if mode == Mode::Nearest {
                self.copy(Engine::Dve, &xi, &base)?;
            } else {
                self.activation(&xi, &base, None, (ActFunc::Floor, 0.0, 0.0), 1.0)?;
                self.binary(&xi, &base, &t, BinaryOp::Sub)?;
            }
            let (offsets, weights): (Vec<f32>, Vec<Option<View>>) = match mode {
                Mode::Nearest => (vec![0.0], vec![None]),
                Mode::Linear => {
                    let w0 = self.gs_tmp(&gshape);
                    self.tensor_scalar(&t, &w0, BinaryOp::Mul, -1.0)?;
                    self.tensor_scalar(&w0, &w0, BinaryOp::Add, 1.0)?;
                    (vec![0.0, 1.0], vec![Some(w0), Some(t.clone())])
                }
                Mode::Cubic => {
                    const A: f32 = -0.75;
                    let outer = [A, -5.0 * A, 8.0 * A, -4.0 * A];
                    let inner = [A + 2.0, -(A + 3.0), 0.0, 1.0];
                    let mut ws = Vec::new();
                    for (shift, sign, p) in [
                        (1.0, 1.0, outer),
                        (0.0, 1.0, inner),
                        (1.0, -1.0, inner),
                        (2.0, -1.0, outer),
                    ] {
                        // u = sign·t + shift.
                        let u = self.gs_tmp(&gshape);
                        self.tensor_scalar(&t, &u, BinaryOp::Mul, sign)?;
                        self.tensor_scalar(&u, &u, BinaryOp::Add, shift)?;
                        let w = self.gs_tmp(&gshape);
                        self.gs_cubic_poly(&u, &w, p)?;
                        ws.push(Some(w));
                    }
                    (vec![-1.0, 0.0, 1.0, 2.0], ws)
                }
            };
            let mut dim_taps = Vec::new();
            for (off, w) in offsets.into_iter().zip(weights) {
                let pos = self.gs_tmp(&gshape);
                self.tensor_scalar(&base, &pos, BinaryOp::Add, off)?;
                let mut w = w;
                match pad {
                    Padding::Zeros => {
                        let out = self.gs_outside(&pos, 0.0, len - 1.0)?;
                        let m = self.gs_tmp(&gshape);
                        let (zero, one) = (self.scalar(0.0, &gshape)?, self.scalar(1.0, &gshape)?);
                        self.select(&out, &zero, &one, &m)?;
                        w = Some(match w {
                            Some(w) => {
                                let wm = self.gs_tmp(&gshape);
                                self.binary(&w, &m, &wm, BinaryOp::Mul)?;
                                wm
                            }
                            None => m,
                        });
                    }
                    Padding::Reflection => {
                        // int(reflect(i)): truncation toward zero.
                        self.gs_reflect(&pos, lo, hi)?;
                        let (neg, cl) = (self.gs_bool(&gshape), self.gs_tmp(&gshape));
                        let zero = self.scalar(0.0, &gshape)?;
                        self.binary(&pos, &zero, &neg, BinaryOp::Less)?;
                        self.activation(&pos, &cl, None, (ActFunc::Ceil, 0.0, 0.0), 1.0)?;
                        self.activation(&pos, &pos, None, (ActFunc::Floor, 0.0, 0.0), 1.0)?;
                        self.select(&neg, &cl, &pos, &pos)?;
                    }
                    Padding::Border => {}
                }
                self.gs_clamp(&pos, &pos, 0.0, len - 1.0)?;
                let idx = View::dense(
                    self.temp(gshape.iter().product::<usize>() * 8),
                    DType::I64,
                    &gshape,
                );
                self.copy(Engine::Dve, &pos, &idx)?;
                if strides[i] != 1 {
                    let sc =
                        self.add_const(&HostTensor::ints(DType::I64, vec![1], vec![strides[i]]))?;
                    let sv = View::dense(sc, DType::I64, &vec![1; gshape.len()]).broadcast(&gshape);
                    self.binary(&idx, &sv, &idx, BinaryOp::Mul)?;
                }
                dim_taps.push((idx, w));
            }
            taps.push(dim_taps);
        }
        // Every combination of taps: flat position, weight, one gather, accumulate.
        let yflat = dense_ap(y.addr, DType::F32, &[nb, ch, otot])?;
        let yv = View::dense(y.addr, DType::F32, &[nb, ch, otot]);
        let data = dense_ap(x.addr, DType::F32, &[nb, ch, s_tot])?;
        let combos: usize = taps.iter().map(Vec::len).product();
        let flat = View::dense(self.temp(nb * otot * 8), DType::I64, &gshape);
        let wt = self.gs_tmp(&gshape);
        let gathered = View::dense(self.temp(nb * ch * otot * 4), DType::F32, &[nb, ch, otot]);
        for combo in 0..combos {
            let mut rem = combo;
            let mut w_any = false;
            for (i, dt) in taps.iter().enumerate() {
                let j = rem % dt.len();
                rem /= dt.len();
                let (idx, w) = &dt[j];
                if i == 0 {
                    self.copy(Engine::Dve, idx, &flat)?;
                } else {
                    self.binary(&flat, idx, &flat, BinaryOp::Add)?;
                }
                if let Some(w) = w {
                    if w_any {
                        self.binary(&wt, w, &wt, BinaryOp::Mul)?;
                    } else {
                        self.copy(Engine::Dve, w, &wt)?;
                        w_any = true;
                    }
                }
            }
            let dst = if combo == 0 {
                yv.clone()
            } else {
                gathered.clone()
            };
            let ind = mk_ap(flat.addr, DType::I64, &[nb, ch, otot], &[otot as i64, 0, 1])?;
            let outp = if combo == 0 {
                yflat
            } else {
                dense_ap(gathered.addr, DType::F32, &[nb, ch, otot])?
            };
            self.emit(
                0,
                Engine::Pool,
                Op::GatherElements(op::GatherElements {
                    data,
                    indices: ind,
                    output: outp,
                    axis: 3,
                }),
            );
            if w_any {
                let wv = View {
                    addr: wt.addr,
                    dtype: DType::F32,
                    shape: vec![nb, ch, otot],
                    strides: vec![otot as i64, 0, 1],
                };
                self.binary(&dst, &wv, &dst, BinaryOp::Mul)?;
            }
            if combo > 0 {
                self.binary(&yv, &gathered, &yv, BinaryOp::Add)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{Mode, Padding};
    use crate::eval::testing::{a_i, a_s, ctx, one_node, out_types, var};
    use nrt_hal::DType;

    #[test]
    fn grid_params_read_the_aliases() {
        let attrs = vec![
            a_s("mode", "bicubic"),
            a_s("padding_mode", "reflection"),
            a_i("align_corners", 1),
        ];
        let g = one_node("GridSample", 16, vec![var(DType::F32, &[1])], attrs, 1);
        let c = ctx(&g);
        assert!(super::grid_params(&c).unwrap() == (Mode::Cubic, Padding::Reflection, true));
        let g = one_node(
            "GridSample",
            16,
            vec![],
            vec![a_s("padding_mode", "wrap")],
            1,
        );
        let c = ctx(&g);
        let e = super::grid_params(&c).err().expect("refused");
        assert!(e.message.contains("padding_mode 'wrap'"), "{e}");
    }

    #[test]
    fn output_takes_the_grid_positions() {
        let ins = vec![
            var(DType::F32, &[2, 3, 8, 8]),
            var(DType::F32, &[2, 4, 5, 2]),
        ];
        let t = out_types("GridSample", 16, ins, vec![], 1).unwrap();
        assert_eq!(t, vec![(DType::F32, vec![2, 3, 4, 5])]);
        let ins = vec![
            var(DType::F32, &[2, 3, 8, 8]),
            var(DType::F32, &[2, 4, 5, 3]),
        ];
        let e = out_types("GridSample", 16, ins, vec![], 1).unwrap_err();
        assert!(e.message.contains("grid of shape [2, 4, 5, 3]"), "{e}");
    }
}
