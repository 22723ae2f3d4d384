//! Resize on POOL (nearest and linear, up to rank 4), and the modes that kernel does not
//! compute (cubic, antialias, tf_crop_and_resize) as one product per resized axis with a
//! constant weight matrix on PE: the interpolation is separable, so the weights of output
//! position `o` along an axis are the reference's coefficients scattered onto the (clamped)
//! input positions they read.

use super::Registry;
use crate::error::{ErrorKind, Result};
use crate::lower::view::{View, mk_ap};
use crate::lower::{At, Lowerer};
use crate::params;
use crate::params::{Ctx, Out, SeparableResize, out, resize_params};
use crate::tensor::{HostTensor, budget};
use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::{BinaryOp, Op};

pub(super) fn register(r: &mut Registry) {
    r.op("Resize", 10, infer_resize)
        .f32_on_device()
        .note("nearest and linear (rank ≤ 4) on POOL; cubic, antialias and tf_crop_and_resize as a product per axis on PE")
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
        let p = params::resize_params(&c, &xv.shape)?;
        if xv.shape.len() > 4 && p.separable.is_none() {
            return Err(c.e(ErrorKind::UnsupportedOp, "Resize of rank > 4"));
        }
        if let Some(sp) = &p.separable {
            return self.lower_resize_separable(at, sp, &p.out);
        }
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
            Op::Resize(op::Resize {
                input: xa,
                output: ya,
                mode: p.mode,
                coord: p.coord,
                nearest: p.nearest,
                scales,
            }),
        );
        Ok(())
    }
}

/// The interpolation coefficients of one output position (`ratio` in (0, 1]), as the ONNX
/// reference computes them.
fn coeffs(sp: &SeparableResize, ratio: f64, scale: f64) -> Vec<f64> {
    let a = sp.cubic_a;
    match (sp.mode.as_str(), sp.antialias) {
        ("cubic", false) => {
            let r = ratio;
            let s = 1.0 - r;
            vec![
                ((a * (r + 1.0) - 5.0 * a) * (r + 1.0) + 8.0 * a) * (r + 1.0) - 4.0 * a,
                ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
                ((a + 2.0) * s - (a + 3.0)) * s * s + 1.0,
                ((a * (s + 1.0) - 5.0 * a) * (s + 1.0) + 8.0 * a) * (s + 1.0) - 4.0 * a,
            ]
        }
        ("cubic", true) => {
            let scale = scale.min(1.0);
            let f = |x: f64| {
                let x = x.abs();
                let (x2, x3) = (x * x, x * x * x);
                if x <= 1.0 {
                    (a + 2.0) * x3 - (a + 3.0) * x2 + 1.0
                } else if x < 2.0 {
                    a * x3 - 5.0 * a * x2 + 8.0 * a * x - 4.0 * a
                } else {
                    0.0
                }
            };
            let start = (-2.0 / scale).floor() as i64 + 1;
            let end = 2 - start;
            let v: Vec<f64> = (start..end)
                .map(|i| f(scale * (i as f64 - ratio)))
                .collect();
            let sum: f64 = v.iter().sum();
            v.into_iter().map(|x| x / sum).collect()
        }
        ("linear", false) => vec![1.0 - ratio, ratio],
        ("linear", true) => {
            let scale = scale.min(1.0);
            let start = (-1.0 / scale).floor() as i64 + 1;
            let footprint = 2 - 2 * start;
            let v: Vec<f64> = (start..start + footprint)
                .map(|i| (1.0 - ((i as f64 - ratio) * scale).abs()).clamp(0.0, 1.0))
                .collect();
            let sum: f64 = v.iter().sum();
            v.into_iter().map(|x| x / sum).collect()
        }
        _ => {
            // nearest
            let up = if ratio == 1.0 {
                true
            } else {
                match sp.nearest.as_str() {
                    "round_prefer_ceil" => ratio >= 0.5,
                    "floor" => false,
                    "ceil" => true,
                    _ => ratio > 0.5,
                }
            };
            vec![f64::from(u8::from(!up)), f64::from(u8::from(up))]
        }
    }
}

/// The weights `W[out][in]` of one axis (row-major) and, for tf_crop_and_resize, the
/// positions whose source lies outside the input (their row is zero: they take the
/// extrapolation value).
fn axis_weights(
    sp: &SeparableResize,
    axis: usize,
    input: usize,
    output: usize,
) -> Result<(Vec<f32>, Vec<bool>)> {
    let scale = sp.scale[axis];
    let (in_f, out_w) = (input as f64, scale * input as f64);
    let (r0, r1) = sp.roi[axis];
    let n = budget("Resize weights", &[output, input], DType::F32)?;
    let mut w = crate::tensor::try_vec::<f32>(n, "Resize weights")?;
    w.resize(n, 0.0);
    let mut outside = crate::tensor::try_vec::<bool>(output, "Resize weights")?;
    for o in 0..output {
        let y = o as f64;
        let x = match sp.coord.as_str() {
            "align_corners" if out_w == 1.0 => 0.0,
            "align_corners" => y * (in_f - 1.0) / (out_w - 1.0),
            "asymmetric" => y / scale,
            "tf_crop_and_resize" => {
                let x = if out_w == 1.0 {
                    (r1 - r0) * (in_f - 1.0) / 2.0
                } else {
                    y * (r1 - r0) * (in_f - 1.0) / (out_w - 1.0)
                };
                x + r0 * (in_f - 1.0)
            }
            "pytorch_half_pixel" if out_w == 1.0 => -0.5,
            "half_pixel_symmetric" => {
                let adjustment = output as f64 / out_w;
                let offset = in_f / 2.0 * (1.0 - adjustment);
                offset + (y + 0.5) / scale - 0.5
            }
            _ => (y + 0.5) / scale - 0.5,
        };
        let out_of_range = sp.coord == "tf_crop_and_resize" && (x < 0.0 || x > in_f - 1.0);
        outside.push(out_of_range);
        if out_of_range {
            continue;
        }
        let xi = x.floor();
        let ratio = if x == xi { 1.0 } else { x - xi };
        let mut cf = coeffs(sp, ratio, scale);
        let k = cf.len() as i64;
        let pad = (k + 1) / 2;
        let xp = x + pad as f64;
        let p = xp.floor();
        let frac = xp - p;
        let off = if k % 2 == 0 {
            if frac == 0.0 { -(k / 2) } else { -(k / 2) + 1 }
        } else if frac <= 0.5 {
            -((k - 1) / 2)
        } else {
            -((k - 1) / 2) + 1
        };
        let start = p as i64 + off - pad;
        if sp.exclude_outside {
            for (j, c) in cf.iter_mut().enumerate() {
                let idx = start + j as i64;
                if idx < 0 || idx >= input as i64 {
                    *c = 0.0;
                }
            }
            let sum: f64 = cf.iter().sum();
            let sum = if sum == 0.0 { 1.0 } else { sum };
            cf.iter_mut().for_each(|c| *c /= sum);
        }
        let row = &mut w[o * input..(o + 1) * input];
        for (j, c) in cf.iter().enumerate() {
            let idx = (start + j as i64).clamp(0, input as i64 - 1) as usize;
            row[idx] += *c as f32;
        }
    }
    Ok((w, outside))
}

impl<'a> Lowerer<'a> {
    /// Resize as one MatMul per resized axis (as [`crate::ops`]' CumSum): `Y = W · X` over
    /// that axis, an axis the reference leaves alone (scale 1, same size, whole roi)
    /// skipped; tf_crop_and_resize's outside positions then get the extrapolation value
    /// (a DVE add of a constant per position: their weight rows are zero).
    pub(crate) fn lower_resize_separable(
        &mut self,
        at: At<'a>,
        sp: &SeparableResize,
        oshape: &[usize],
    ) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let (x, y) = self.unary_io(n, o0)?;
        let mut cur = x;
        let mut shape = xv.shape.clone();
        let axes: Vec<usize> = (0..shape.len())
            .filter(|&a| {
                !((sp.scale[a] - 1.0).abs() <= 1e-9
                    && oshape[a] == shape[a]
                    && (sp.roi[a].0.abs() <= 1e-9 && (sp.roi[a].1 - 1.0).abs() <= 1e-9))
            })
            .collect();
        if axes.is_empty() {
            return self.copy(Engine::Dve, &cur, &y);
        }
        for (k, &a) in axes.iter().enumerate() {
            let (inp, outp) = (shape[a], oshape[a]);
            let (w, outside) =
                axis_weights(sp, a, inp, outp).map_err(|e| e.at_node(&n.name, &n.op))?;
            let mut next = shape.clone();
            next[a] = outp;
            let last = k + 1 == axes.len();
            let dst = if last {
                y.clone()
            } else {
                let elems = budget("Resize intermediate", &next, DType::F32)
                    .map_err(|e| e.at_node(&n.name, &n.op))?;
                View::dense(self.temp(elems * 4), DType::F32, &next)
            };
            let wa = self.add_const(&HostTensor::f32(vec![outp, inp], w))?;
            let outer: usize = shape[..a].iter().product();
            let inner: usize = shape[a + 1..].iter().product();
            let src = if cur.is_dense() {
                cur.clone()
            } else {
                let t = View::dense(
                    self.temp(cur.shape.iter().product::<usize>() * 4),
                    DType::F32,
                    &shape,
                );
                self.copy(Engine::Dve, &cur, &t)?;
                t
            };
            let (li, lo) = (inp as i64, outp as i64);
            if inner == 1 {
                // Y[r, o] = Σ_i X[r, i]·W[o][i]: B = Wᵀ through swapped strides.
                let a_ = mk_ap(src.addr, DType::F32, &[outer, inp], &[li, 1])?;
                let b_ = mk_ap(wa, DType::F32, &[inp, outp], &[1, li])?;
                let c_ = mk_ap(dst.addr, DType::F32, &[outer, outp], &[lo, 1])?;
                self.matmul_aps(a_, b_, c_, 1.0, 0);
            } else {
                let inn = inner as i64;
                let a_ = mk_ap(wa, DType::F32, &[outer, outp, inp], &[0, li, 1])?;
                let b_ = mk_ap(
                    src.addr,
                    DType::F32,
                    &[outer, inp, inner],
                    &[li * inn, inn, 1],
                )?;
                let c_ = mk_ap(
                    dst.addr,
                    DType::F32,
                    &[outer, outp, inner],
                    &[lo * inn, inn, 1],
                )?;
                self.matmul_aps(a_, b_, c_, 1.0, 0);
            }
            if outside.iter().any(|&o| o) && sp.extrapolation != 0.0 {
                let e = sp.extrapolation as f32;
                let bias: Vec<f32> = outside.iter().map(|&o| if o { e } else { 0.0 }).collect();
                let ba = self.add_const(&HostTensor::f32(vec![outp], bias))?;
                let mut bs = vec![1usize; next.len()];
                bs[a] = outp;
                let bv = View::dense(ba, DType::F32, &bs).broadcast(&next);
                let d = View::dense(dst.addr, DType::F32, &next);
                self.binary(&d, &bv, &d, BinaryOp::Add)?;
            }
            cur = View::dense(dst.addr, DType::F32, &next);
            shape = next;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_s, konst, out_types, var};
    use crate::params::SeparableResize;
    use crate::tensor::HostTensor;
    use nrt_hal::DType;

    fn sep(mode: &str, coord: &str, scale: f64) -> SeparableResize {
        SeparableResize {
            mode: mode.into(),
            coord: coord.into(),
            nearest: "round_prefer_floor".into(),
            cubic_a: -0.75,
            exclude_outside: false,
            antialias: false,
            extrapolation: 0.0,
            scale: vec![scale],
            roi: vec![(0.0, 1.0)],
        }
    }

    #[test]
    fn resize_output_shape_from_scales() {
        let scales = konst(HostTensor::f32(vec![4], vec![1., 1., 2., 1.5]));
        let ins = vec![var(DType::F32, &[1, 1, 2, 4]), None, scales];
        let t = out_types("Resize", 13, ins, vec![a_s("mode", "linear")], 1).unwrap();
        assert_eq!(t, vec![(DType::F32, vec![1, 1, 4, 6])]);
    }

    #[test]
    fn cubic_coefficients_and_linear_weights_follow_the_reference() {
        let c = super::coeffs(&sep("cubic", "half_pixel", 2.0), 0.5, 2.0);
        assert_eq!(c, vec![-0.09375, 0.59375, 0.59375, -0.09375]);
        // Asymmetric ×2 of 2 positions: sources 0, 0.5, 1, 1.5 (the last clamped).
        let (w, outside) = super::axis_weights(&sep("linear", "asymmetric", 2.0), 0, 2, 4).unwrap();
        assert_eq!(w, vec![1., 0., 0.5, 0.5, 0., 1., 0., 1.]);
        assert_eq!(outside, vec![false; 4]);
    }
}
