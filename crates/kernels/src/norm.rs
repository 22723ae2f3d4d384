//! `Softmax` (and log-softmax) and `LayerNorm`, both over dimension 3, in f32.
//!
//! Each row is copied into a workspace buffer (a `memcpy` for unit stride), computed there
//! with vectorized loops — [`crate::vmath::exp`], 16-lane folds for max and sums — and
//! written back, which also makes in-place operation safe. Softmax subtracts the row maximum
//! before exponentiating; LayerNorm is two-pass (mean, then the mean of squared deviations),
//! which is exact enough in f32 without Welford's per-element division.

use crate::Execute;
use crate::has_avx512;
use crate::strided::{View, gather_into, scatter_from};
use crate::vmath;
use crate::{DeviceMemory, KernelError, Workspace};
use nrt_isa::AccessPattern;
use nrt_isa::op;

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

/// Σx² with 16 independent lanes (vectorizes), the tail past the last whole group of 16
/// added in order: the variance of `LayerNorm` and the mean square of `RmsNorm`.
#[inline(always)]
fn sum_of_squares(x: &[f32]) -> f32 {
    let mut sq = [0.0f32; 16];
    let mut it = x.chunks_exact(16);
    for ch in &mut it {
        for i in 0..16 {
            sq[i] += ch[i] * ch[i];
        }
    }
    let tail: f32 = it.remainder().iter().map(|v| v * v).sum();
    sum(&sq) + tail
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
) -> Result<(), KernelError> {
    let vi = View::<f32>::new(input, mem);
    let vo = View::<f32>::new(output, mem);
    if vo.elements() == 0 {
        return Ok(());
    }
    let l = vi.shape[3];
    let buf = ws.f32(0, l)?;
    let avx512 = has_avx512();
    rows(vi.shape, |[a, b, c]| {
        // SAFETY: the row lies inside the input; `buf` is distinct scratch.
        unsafe { gather_into(vi.at([a, b, c, 0]), vi.stride[3], buf) };
        #[cfg(target_arch = "x86_64")]
        if avx512 {
            // SAFETY: AVX-512F detected (`has_avx512`).
            unsafe { softmax_row_avx512(buf, log) };
        } else {
            softmax_row(buf, log);
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = avx512;
            softmax_row(buf, log);
        }
        // SAFETY: the row lies inside the output; no reference into it is alive.
        unsafe { scatter_from(buf, vo.at([a, b, c, 0]), vo.stride[3]) };
    });
    Ok(())
}

/// [`max`] with AVX-512F: 16 lanes of `vmaxps` and a mask of the lanes that saw a NaN
/// (`vmaxps` itself would drop one). The maximum of the numbers is [`max`]'s; a row with a
/// NaN gives a NaN.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn max_avx512(x: &[f32]) -> f32 {
    use core::arch::x86_64::*;
    let whole = x.len() / 16 * 16;
    // SAFETY: AVX-512F per the contract; each load covers one whole chunk of 16.
    let (lanes, nan) = unsafe {
        let mut vmax = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut nan: __mmask16 = 0;
        for ch in x[..whole].chunks_exact(16) {
            let v = _mm512_loadu_ps(ch.as_ptr());
            nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            vmax = _mm512_max_ps(vmax, v);
        }
        let mut lanes = [0.0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), vmax);
        (lanes, nan)
    };
    let m = max(&lanes).max(max(&x[whole..]));
    if nan != 0 || m.is_nan() { f32::NAN } else { m }
}

/// [`softmax_row`] with AVX-512F. The exponentials and their sum run on 16-lane vectors
/// ([`vmath::exp_avx512`], one accumulator of 16 lanes as in [`softmax_row`], so the
/// result is bit-identical to it); LLVM vectorizes the scalar form to 256-bit vectors only.
/// The maximum runs on 16 lanes too ([`max_avx512`]); the scaling is the scalar code,
/// compiled here with AVX-512F. The log
/// form is [`softmax_row`] compiled with AVX-512F (mask-register blends instead of
/// two-µop `vblendvps`).
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn softmax_row_avx512(buf: &mut [f32], log: bool) {
    use core::arch::x86_64::*;
    if log {
        softmax_row(buf, true);
        return;
    }
    // SAFETY: AVX-512F per the contract; each load and store covers one whole chunk of 16.
    let m = unsafe { max_avx512(buf) };
    // SAFETY: as above.
    let lanes = unsafe {
        let vm = _mm512_set1_ps(m);
        let mut acc = _mm512_setzero_ps();
        for ch in buf.chunks_exact_mut(16) {
            let e = vmath::exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(ch.as_ptr()), vm));
            _mm512_storeu_ps(ch.as_mut_ptr(), e);
            acc = _mm512_add_ps(acc, e);
        }
        let mut lanes = [0.0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), acc);
        lanes
    };
    let whole = buf.len() / 16 * 16;
    let mut tail = 0.0f32;
    for x in &mut buf[whole..] {
        *x = vmath::exp(*x - m);
        tail += *x;
    }
    let r = 1.0 / (sum(&lanes) + tail);
    for x in buf.iter_mut() {
        *x *= r;
    }
}

/// One softmax (or log-softmax) row in place: the maximum, then `exp(x − max)` and its sum
/// in one pass, then the scaling — three passes over the row (it was five: the subtraction
/// and the exponentials each had their own).
#[inline(always)]
pub(crate) fn softmax_row(buf: &mut [f32], log: bool) {
    let m = max(buf);
    let mut lanes = [0.0f32; 16];
    if log {
        // `x − m` is kept (exact where it matters: near the maximum), then `− ln Σ`.
        let mut it = buf.chunks_exact_mut(16);
        for ch in &mut it {
            for i in 0..16 {
                ch[i] -= m;
                lanes[i] += vmath::exp(ch[i]);
            }
        }
        let mut tail = 0.0f32;
        for x in it.into_remainder() {
            *x -= m;
            tail += vmath::exp(*x);
        }
        let ls = vmath::ln(sum(&lanes) + tail);
        for x in buf.iter_mut() {
            *x -= ls;
        }
        return;
    }
    let mut it = buf.chunks_exact_mut(16);
    for ch in &mut it {
        for i in 0..16 {
            let e = vmath::exp(ch[i] - m);
            ch[i] = e;
            lanes[i] += e;
        }
    }
    let mut tail = 0.0f32;
    for x in it.into_remainder() {
        *x = vmath::exp(*x - m);
        tail += *x;
    }
    let r = 1.0 / (sum(&lanes) + tail);
    for x in buf.iter_mut() {
        *x *= r;
    }
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
) -> Result<(), KernelError> {
    let vi = View::<f32>::new(input, mem);
    let vo = View::<f32>::new(output, mem);
    let vg = View::<f32>::new(gamma, mem);
    let vb = beta.map(|b| View::<f32>::new(b, mem));
    if vo.elements() == 0 {
        return Ok(());
    }
    let l = vi.shape[3];
    let (x, g, bb) = ws.f32x3(l, l, l)?;
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
        let var = sum_of_squares(x) * inv_l;
        let rstd = 1.0 / (var + eps).sqrt();
        for ((v, g), b) in x.iter_mut().zip(g.iter()).zip(bb.iter()) {
            *v = (*v * rstd).mul_add(*g, *b);
        }
        // SAFETY: the row lies inside the output; no reference into it is alive.
        unsafe { scatter_from(x, vo.at([a, b, c, 0]), vo.stride[3]) };
    });
    Ok(())
}

impl Execute for op::Softmax {
    unsafe fn execute(&self, mem: DeviceMemory, ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::Softmax { input, output, log } = self;

        // SAFETY: see above.
        unsafe { softmax(input, output, *log, mem, ws) }
    }
}

/// Executes `Op::RmsNorm`: `x / √(mean(x²) + eps) · gamma` over dimension 3.
///
/// # Safety
/// Operands inside `mem`, aligned to 4 bytes.
pub unsafe fn rms_norm(
    input: &AccessPattern,
    gamma: &AccessPattern,
    output: &AccessPattern,
    eps: f32,
    mem: DeviceMemory,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    let vi = View::<f32>::new(input, mem);
    let vo = View::<f32>::new(output, mem);
    let vg = View::<f32>::new(gamma, mem);
    if vo.elements() == 0 {
        return Ok(());
    }
    let l = vi.shape[3];
    let (x, g, _) = ws.f32x3(l, l, 0)?;
    let g_fixed = row_invariant(&vg);
    // SAFETY: row 0 of gamma lies inside the operand; the buffers are distinct.
    unsafe { gather_into(vg.ptr, vg.stride[3], g) };
    let inv_l = 1.0 / l as f32;
    rows(vi.shape, |[a, b, c]| {
        // SAFETY: rows inside their operands; distinct scratch buffers.
        unsafe {
            gather_into(vi.at([a, b, c, 0]), vi.stride[3], x);
            if !g_fixed {
                gather_into(vg.at([a, b, c, 0]), vg.stride[3], g);
            }
        }
        let rms = 1.0 / (sum_of_squares(x) * inv_l + eps).sqrt();
        for (v, g) in x.iter_mut().zip(g.iter()) {
            *v = *v * rms * *g;
        }
        // SAFETY: the row lies inside the output; no reference into it is alive.
        unsafe { scatter_from(x, vo.at([a, b, c, 0]), vo.stride[3]) };
    });
    Ok(())
}

impl Execute for op::RmsNorm {
    unsafe fn execute(&self, mem: DeviceMemory, ws: &mut Workspace) -> Result<(), KernelError> {
        let op::RmsNorm {
            input,
            gamma,
            output,
            eps,
        } = self;
        // SAFETY: the caller guarantees every operand in bounds and aligned
        // ([`crate::execute`]).
        unsafe { rms_norm(input, gamma, output, *eps, mem, ws) }
    }
}

impl Execute for op::LayerNorm {
    unsafe fn execute(&self, mem: DeviceMemory, ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::LayerNorm {
            input,
            gamma,
            beta,
            output,
            eps,
        } = self;

        // SAFETY: see above.
        unsafe { layer_norm(input, gamma, beta.as_ref(), output, *eps, mem, ws) }
    }
}
