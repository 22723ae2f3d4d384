//! DFT and STFT as products with constant matrices on PE. A DFT along one axis is linear:
//! with the complex dimension last (1: real, 2: real and imaginary), each output component
//! is `Σ_c W_c · X[.., c]` for the cos/sin matrices of that component, so one DFT is up to
//! four batched MatMuls (the second of each pair accumulating) reading the components
//! through strided views. `dft_length` truncates or zero-pads by the matrices' columns;
//! onesided keeps the first `N/2 + 1` rows; the inverse divides by `N`, and the inverse of a
//! one-sided spectrum (irfft) doubles the mirrored bins and drops the imaginary output. STFT
//! reads its frames as a strided view of the signal and folds the window into the matrix.

use super::Registry;
use crate::error::Result;
use crate::lower::view::{View, mk_ap};
use crate::lower::{At, Lowerer};
use crate::params::{Ctx, Out, out};
use crate::tensor::{HostTensor, budget, try_vec};
use nrt_hal::DType;
use nrt_isa::{BinaryOp, matmul_flags};

pub(super) fn register(r: &mut Registry) {
    r.op("DFT", 17, infer_dft)
        .f32_on_device()
        .note("dft_length and axis known at compile time; MatMuls with cos/sin matrices")
        .device(lower!(lower_dft));
    r.op("STFT", 17, infer_stft)
        .f32_on_device()
        .note("frame step and length known at compile time; the window constant (folded into the DFT) or computed at run time")
        .device(lower!(lower_stft));
}

/// What a DFT computes along its axis.
struct Dft {
    axis: usize,
    /// Input length along the axis, and complex components in and out.
    len: usize,
    cin: usize,
    cout: usize,
    /// The transform length and the output length along the axis.
    n: usize,
    k: usize,
    inverse: bool,
    onesided: bool,
}

fn dft_params(c: &Ctx) -> Result<Dft> {
    let node = c.n;
    let x = c.input(0)?;
    let r = x.shape.len();
    if r < 2 || !matches!(x.shape[r - 1], 1 | 2) {
        return Err(c.mismatch(format!(
            "input of shape {:?}: the last dimension is 1 (real) or 2 (complex)",
            x.shape
        )));
    }
    let axis = if c.opset() >= 20 {
        match c.opt(2) {
            Some(_) => match c.const_ints(2, "axis")?.as_deref() {
                Some([a]) => *a,
                v => return Err(c.bad_attr(format!("axis {v:?}"))),
            },
            None => -2,
        }
    } else {
        node.attr_i("axis", 1)?
    };
    let axis = c.norm_axis(axis, r)?;
    if axis == r - 1 {
        return Err(c.bad_attr("axis is the complex dimension"));
    }
    let inverse = node.attr_i("inverse", 0)? != 0;
    let onesided = node.attr_i("onesided", 0)? != 0;
    let len = x.shape[axis];
    let n = match c.opt(1) {
        Some(v) if v.elements() > 0 => match c.const_ints(1, "dft_length")?.as_deref() {
            Some([d]) if *d >= 1 && *d <= (1 << 31) => *d as usize,
            v => return Err(c.bad_attr(format!("dft_length {v:?}"))),
        },
        _ if inverse && onesided => 2 * len.saturating_sub(1),
        _ => len,
    };
    if n == 0 || len == 0 {
        return Err(c.mismatch("a DFT of length 0"));
    }
    let (k, cout) = match (inverse, onesided) {
        (false, true) => (n / 2 + 1, 2),
        (true, true) => (n, 1),
        _ => (n, 2),
    };
    Ok(Dft {
        axis,
        len,
        cin: x.shape[r - 1],
        cout,
        n,
        k,
        inverse,
        onesided,
    })
}

/// DFT: the axis becomes the output length, the last dimension 2 (1 for an irfft).
pub(crate) fn infer_dft(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    let p = dft_params(c)?;
    let mut s = x.shape.clone();
    s[p.axis] = p.k;
    let r = s.len();
    s[r - 1] = p.cout;
    Ok(vec![out(x.dtype, s)])
}

/// The matrix `W[k][j]` (`rows` × `cols`, row-major) of output component `c2` from input
/// component `c` of a DFT of length `n`, each column scaled by `window[j]`.
fn dft_matrix(
    p: &Dft,
    c2: usize,
    c: usize,
    rows: usize,
    cols: usize,
    window: &[f32],
) -> Result<Vec<f32>> {
    let total = budget("DFT matrix", &[rows, cols], DType::F32)?;
    let mut w = try_vec::<f32>(total, "DFT matrix")?;
    let nf = p.n as f64;
    for k in 0..rows {
        for j in 0..cols {
            // θ = 2π·k·j/N, with k·j reduced mod N first (exact for large products).
            let kj = ((k as u128 * j as u128) % p.n as u128) as f64;
            let th = 2.0 * std::f64::consts::PI * kj / nf;
            let (s, co) = th.sin_cos();
            let v = if p.inverse && p.onesided {
                // irfft: output n = k here, input bin = j.
                let half = p.n / 2;
                let wgt = if j == 0 || (p.n.is_multiple_of(2) && j == half) {
                    1.0
                } else if j <= (p.n - 1) / 2 {
                    2.0
                } else {
                    0.0
                };
                wgt / nf * if c == 0 { co } else { -s }
            } else if p.inverse {
                let v = match (c2, c) {
                    (0, 0) | (1, 1) => co,
                    (0, _) => -s,
                    _ => s,
                };
                v / nf
            } else {
                match (c2, c) {
                    (0, 0) | (1, 1) => co,
                    (0, _) => s,
                    _ => -s,
                }
            };
            w.push((v * f64::from(window.get(j).copied().unwrap_or(1.0))) as f32);
        }
    }
    Ok(w)
}

/// STFT's frame step, frame (and transform) length, window (`None`: computed at run time,
/// input 2), onesided.
fn stft_params(c: &Ctx) -> Result<(usize, usize, Option<Vec<f32>>, bool)> {
    let x = c.input(0)?;
    if x.shape.len() != 3 || !matches!(x.shape[2], 1 | 2) {
        return Err(c.mismatch(format!(
            "signal of shape {:?} ([batch, length, 1 or 2])",
            x.shape
        )));
    }
    let step = match c.const_ints(1, "frame_step")?.as_deref() {
        Some([s]) if *s >= 1 && *s <= (1 << 31) => *s as usize,
        v => return Err(c.bad_attr(format!("frame_step {v:?}"))),
    };
    // A window computed at run time multiplies the frames on the device; a constant one is
    // folded into the DFT matrices.
    let (window, run_time_window) = match c.opt(2) {
        Some(v) if v.elements() > 0 => match &v.konst {
            Some(t) => (Some(t.to_f32s().into_owned()), false),
            None if v.shape.len() == 1 && v.dtype == DType::F32 => {
                (Some(vec![1.0; v.shape[0]]), true)
            }
            None => {
                return Err(c.mismatch(format!(
                    "window {} {:?} (f32 [frame_length] expected)",
                    v.dtype, v.shape
                )));
            }
        },
        _ => (None, false),
    };
    let flen = match c.opt(3) {
        Some(v) if v.elements() > 0 => match c.const_ints(3, "frame_length")?.as_deref() {
            Some([l]) if *l >= 1 && *l <= (1 << 31) => Some(*l as usize),
            v => return Err(c.bad_attr(format!("frame_length {v:?}"))),
        },
        _ => None,
    };
    let (flen, window) = match (flen, window) {
        (Some(l), Some(w)) if w.len() != l => {
            return Err(c.mismatch(format!("window of {} for frame_length {l}", w.len())));
        }
        (_, Some(w)) => (w.len(), w),
        (Some(l), None) => (l, vec![1.0; l]),
        (None, None) => return Err(c.bad_attr("STFT needs a window or frame_length")),
    };
    if flen > x.shape[1] {
        return Err(c.mismatch(format!(
            "frame length {flen} longer than the signal ({})",
            x.shape[1]
        )));
    }
    let onesided = c.n.attr_i("onesided", 1)? != 0;
    Ok((step, flen, (!run_time_window).then_some(window), onesided))
}

/// STFT: `[batch, frames, bins, 2]`.
pub(crate) fn infer_stft(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    let (step, flen, _, onesided) = stft_params(c)?;
    let frames = (x.shape[1] - flen) / step + 1;
    let bins = if onesided { flen / 2 + 1 } else { flen };
    Ok(vec![out(x.dtype, vec![x.shape[0], frames, bins, 2])])
}

impl<'a> Lowerer<'a> {
    /// DFT: per output component, a MatMul `W_c · X[.., c]` per input component over the
    /// input seen as `[outer, len, mid]` (strided by the component count), into the output
    /// seen as `[outer, K, mid]`.
    pub(crate) fn lower_dft(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let p = dft_params(&c)?;
        let (x, y) = self.unary_io(n, o0)?;
        let r = xv.shape.len();
        let outer: usize = xv.shape[..p.axis].iter().product();
        let mid: usize = xv.shape[p.axis + 1..r - 1].iter().product();
        if outer * mid == 0 {
            return Ok(());
        }
        // Columns: the input positions that reach the transform (truncated / zero-padded).
        let cols = p.len.min(if p.inverse && p.onesided {
            p.n / 2 + 1
        } else {
            p.n
        });
        let (cin, cout, k) = (p.cin as i64, p.cout as i64, p.k);
        let (len, m, ki) = (p.len as i64, mid as i64, k as i64);
        for c2 in 0..p.cout {
            let mut first = true;
            for ci in 0..p.cin {
                let w =
                    dft_matrix(&p, c2, ci, k, cols, &[]).map_err(|e| e.at_node(&n.name, &n.op))?;
                let wa = self.add_const(&HostTensor::f32(vec![k, cols], w))?;
                let a = mk_ap(wa, DType::F32, &[outer, k, cols], &[0, cols as i64, 1])?;
                let b = mk_ap(
                    x.elems(ci as i64),
                    DType::F32,
                    &[outer, cols, mid],
                    &[len * m * cin, m * cin, cin],
                )?;
                let cc = mk_ap(
                    y.elems(c2 as i64),
                    DType::F32,
                    &[outer, k, mid],
                    &[ki * m * cout, m * cout, cout],
                )?;
                let flags = if first { 0 } else { matmul_flags::ACCUMULATE };
                self.matmul_aps(a, b, cc, 1.0, flags);
                first = false;
            }
        }
        Ok(())
    }

    /// STFT: the frames `[batch, frames, flen]` (a strided view of the signal) times the
    /// windowed DFT matrices, transposed (`[flen, bins]`), per component.
    pub(crate) fn lower_stft(&mut self, at: At<'a>) -> Result<()> {
        let At {
            n, c, o0, oshape, ..
        } = at;
        let xv = c.input(0)?;
        let (step, flen, window, onesided) = stft_params(&c)?;
        let (x, y) = self.unary_io(n, o0)?;
        let (batch, frames, bins) = (oshape[0], oshape[1], oshape[2]);
        if batch * frames == 0 {
            return Ok(());
        }
        let p = Dft {
            axis: 1,
            len: flen,
            cin: xv.shape[2],
            cout: 2,
            n: flen,
            k: bins,
            inverse: false,
            onesided,
        };
        let (cin, len) = (p.cin as i64, xv.shape[1] as i64);
        let (fl, bi) = (flen as i64, bins as i64);
        // The frames of input component ci: a strided view of the signal, or, with a window
        // computed at run time, that view times the window (one DVE pass per component).
        let mut frames_of = Vec::with_capacity(p.cin);
        for ci in 0..p.cin {
            let view = View {
                addr: x.elems(ci as i64),
                dtype: DType::F32,
                shape: vec![batch, frames, flen],
                strides: vec![len * cin, step as i64 * cin, cin],
            };
            if window.is_some() {
                frames_of.push(view);
                continue;
            }
            let w = self.input_view(n, 2)?.broadcast(&[batch, frames, flen]);
            let t = View::dense(
                self.temp(batch * frames * flen * 4),
                DType::F32,
                &[batch, frames, flen],
            );
            self.binary(&view, &w, &t, BinaryOp::Mul)?;
            frames_of.push(t);
        }
        let window = window.unwrap_or_default();
        for c2 in 0..2usize {
            let mut first = true;
            for (ci, framed) in frames_of.iter().enumerate() {
                let w = dft_matrix(&p, c2, ci, bins, flen, &window)
                    .map_err(|e| e.at_node(&n.name, &n.op))?;
                let wa = self.add_const(&HostTensor::f32(vec![bins, flen], w))?;
                let a = framed.ap()?;
                let b = mk_ap(wa, DType::F32, &[batch, flen, bins], &[0, 1, fl])?;
                let cc = mk_ap(
                    y.elems(c2 as i64),
                    DType::F32,
                    &[batch, frames, bins],
                    &[frames as i64 * bi * 2, bi * 2, 2],
                )?;
                let flags = if first { 0 } else { matmul_flags::ACCUMULATE };
                self.matmul_aps(a, b, cc, 1.0, flags);
                first = false;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_i, ctx, konst, one_node, out_types, var};
    use crate::tensor::HostTensor;
    use nrt_hal::DType;

    #[test]
    fn dft_output_shapes_onesided_and_inverse() {
        let x = vec![var(DType::F32, &[1, 8, 1])];
        let t = out_types("DFT", 20, x, vec![a_i("onesided", 1)], 1);
        assert_eq!(t.unwrap(), vec![(DType::F32, vec![1, 5, 2])]);
        // The inverse of a one-sided spectrum of 5 bins: 8 real samples.
        let attrs = vec![a_i("onesided", 1), a_i("inverse", 1)];
        let t = out_types("DFT", 20, vec![var(DType::F32, &[1, 5, 2])], attrs, 1);
        assert_eq!(t.unwrap(), vec![(DType::F32, vec![1, 8, 1])]);
    }

    #[test]
    fn a_4_point_dft_matrix_is_cosines_and_minus_sines() {
        let x = vec![var(DType::F32, &[4, 1])];
        let g = one_node("DFT", 17, x, vec![a_i("axis", 0)], 1);
        let c = ctx(&g);
        let p = super::dft_params(&c).unwrap();
        assert_eq!((p.axis, p.len, p.cin, p.cout, p.n, p.k), (0, 4, 1, 2, 4, 4));
        let w = super::dft_matrix(&p, 0, 0, 4, 4, &[]).unwrap();
        let near = |w: &[f32], want: &[f32]| w.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6);
        let cos = [
            1., 1., 1., 1., 1., 0., -1., 0., 1., -1., 1., -1., 1., 0., -1., 0.,
        ];
        assert!(w.len() == 16 && near(&w, &cos), "{w:?}");
        // The imaginary part from the real input: −sin.
        let w = super::dft_matrix(&p, 1, 0, 2, 4, &[]).unwrap();
        assert!(
            w.len() == 8 && near(&w, &[0., 0., 0., 0., 0., -1., 0., 1.]),
            "{w:?}"
        );
    }

    #[test]
    fn stft_frames_and_its_window_check() {
        let i64s = |v: i64| konst(HostTensor::i64(vec![], vec![v]));
        let ins = vec![var(DType::F32, &[2, 16, 1]), i64s(4), None, i64s(8)];
        let t = out_types("STFT", 17, ins, vec![], 1).unwrap();
        assert_eq!(t, vec![(DType::F32, vec![2, 3, 5, 2])]);
        let ins = vec![
            var(DType::F32, &[2, 16, 1]),
            i64s(4),
            var(DType::F32, &[6]),
            i64s(8),
        ];
        let e = out_types("STFT", 17, ins, vec![], 1).unwrap_err();
        assert!(e.message.contains("window of 6 for frame_length 8"), "{e}");
    }
}
