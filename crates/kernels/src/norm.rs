//! `Softmax` (and log-softmax) and `LayerNorm`, both over dimension 3, in f32.
//!
//! Each row is copied into a workspace buffer (a `memcpy` for unit stride), computed there
//! with vectorized loops — [`crate::vmath::exp`], 16-lane folds for max and sums — and
//! written back, which also makes in-place operation safe. Softmax subtracts the row maximum
//! before exponentiating; LayerNorm is two-pass (mean, then the mean of squared deviations),
//! which is exact enough in f32 without Welford's per-element division.

use crate::strided::{View, gather_into, scatter_from};
use crate::vmath;
use crate::{DeviceMemory, Workspace};
use nrt_isa::AccessPattern;

/// Sum with 16 independent lanes (vectorizes; pairwise-ish rounding).
#[inline(always)]
pub(crate) fn sum(x: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let mut it = x.chunks_exact(16);
    for c in &mut it {
        for i in 0..16 {
            lanes[i] += c[i];
        }
    }
    for (i, v) in it.remainder().iter().enumerate() {
        lanes[i] += v;
    }
    let mut w = 16;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            lanes[i] += lanes[i + w];
        }
    }
    lanes[0]
}

/// NaN-propagating maximum with 16 independent lanes.
#[inline(always)]
fn max(x: &[f32]) -> f32 {
    #[allow(clippy::eq_op)]
    let f = |a: f32, b: f32| if b > a || b != b { b } else { a };
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut it = x.chunks_exact(16);
    for c in &mut it {
        for i in 0..16 {
            lanes[i] = f(lanes[i], c[i]);
        }
    }
    for (i, v) in it.remainder().iter().enumerate() {
        lanes[i] = f(lanes[i], *v);
    }
    lanes.into_iter().fold(f32::NEG_INFINITY, f)
}

/// Calls `f(row_index_of_each_operand…)` for every row `(a, b, c)` of a `[A, B, C, L]` shape.
fn rows(shape: [usize; 4], mut f: impl FnMut([usize; 3])) {
    for a in 0..shape[0] {
        for b in 0..shape[1] {
            for c in 0..shape[2] {
                f([a, b, c]);
            }
        }
    }
}

/// Executes `Op::Softmax`.
///
/// # Safety
/// Operands inside `mem`, aligned to 4 bytes.
pub unsafe fn softmax(
    input: &AccessPattern,
    output: &AccessPattern,
    log: bool,
    mem: DeviceMemory,
    ws: &mut Workspace,
) {
    let vi = View::<f32>::new(input, mem);
    let vo = View::<f32>::new(output, mem);
    if vo.elements() == 0 {
        return;
    }
    let l = vi.shape[3];
    let buf = ws.f32(0, l);
    rows(vi.shape, |[a, b, c]| {
        // SAFETY: the row lies inside the input; `buf` is distinct scratch.
        unsafe { gather_into(vi.at([a, b, c, 0]), vi.stride[3], buf) };
        let m = max(buf);
        for x in buf.iter_mut() {
            *x -= m;
        }
        if log {
            let mut s = [0.0f32; 16];
            let mut it = buf.chunks_exact(16);
            for ch in &mut it {
                for i in 0..16 {
                    s[i] += vmath::exp(ch[i]);
                }
            }
            let tail: f32 = it.remainder().iter().map(|&x| vmath::exp(x)).sum();
            let ls = vmath::ln(sum(&s) + tail);
            for x in buf.iter_mut() {
                *x -= ls;
            }
        } else {
            for x in buf.iter_mut() {
                *x = vmath::exp(*x);
            }
            let r = 1.0 / sum(buf);
            for x in buf.iter_mut() {
                *x *= r;
            }
        }
        // SAFETY: the row lies inside the output; no reference into it is alive.
        unsafe { scatter_from(buf, vo.at([a, b, c, 0]), vo.stride[3]) };
    });
}

/// Whether a `[A, B, C, L]` operand holds the same row everywhere (strides 0 on the outer
/// dimensions that have more than one element).
fn row_invariant(v: &View<f32>) -> bool {
    (0..3).all(|d| v.shape[d] <= 1 || v.stride[d] == 0)
}

/// Executes `Op::LayerNorm`: `(x − mean)/√(var + eps) · gamma + beta` over dimension 3.
///
/// # Safety
/// Operands inside `mem`, aligned to 4 bytes.
pub unsafe fn layer_norm(
    input: &AccessPattern,
    gamma: &AccessPattern,
    beta: Option<&AccessPattern>,
    output: &AccessPattern,
    eps: f32,
    mem: DeviceMemory,
    ws: &mut Workspace,
) {
    let vi = View::<f32>::new(input, mem);
    let vo = View::<f32>::new(output, mem);
    let vg = View::<f32>::new(gamma, mem);
    let vb = beta.map(|b| View::<f32>::new(b, mem));
    if vo.elements() == 0 {
        return;
    }
    let l = vi.shape[3];
    let (x, g, bb) = ws.f32x3(l, l, l);
    let g_fixed = row_invariant(&vg);
    let b_fixed = vb.as_ref().is_none_or(row_invariant);
    // SAFETY: row 0 of gamma/beta lies inside the operands; the buffers are distinct.
    unsafe {
        gather_into(vg.ptr, vg.stride[3], g);
        match &vb {
            Some(v) => gather_into(v.ptr, v.stride[3], bb),
            None => bb.fill(0.0),
        }
    }
    let inv_l = 1.0 / l as f32;
    rows(vi.shape, |[a, b, c]| {
        // SAFETY: rows inside their operands; distinct scratch buffers.
        unsafe {
            gather_into(vi.at([a, b, c, 0]), vi.stride[3], x);
            if !g_fixed {
                gather_into(vg.at([a, b, c, 0]), vg.stride[3], g);
            }
            if !b_fixed && let Some(v) = &vb {
                gather_into(v.at([a, b, c, 0]), v.stride[3], bb);
            }
        }
        let mean = sum(x) * inv_l;
        for v in x.iter_mut() {
            *v -= mean;
        }
        let mut sq = [0.0f32; 16];
        let mut it = x.chunks_exact(16);
        for ch in &mut it {
            for i in 0..16 {
                sq[i] += ch[i] * ch[i];
            }
        }
        let tail: f32 = it.remainder().iter().map(|v| v * v).sum();
        let var = (sum(&sq) + tail) * inv_l;
        let rstd = 1.0 / (var + eps).sqrt();
        for ((v, g), b) in x.iter_mut().zip(g.iter()).zip(bb.iter()) {
            *v = (*v * rstd).mul_add(*g, *b);
        }
        // SAFETY: the row lies inside the output; no reference into it is alive.
        unsafe { scatter_from(x, vo.at([a, b, c, 0]), vo.stride[3]) };
    });
}
