//! `DynamicQuantize` (NCM 1.8): ONNX `DynamicQuantizeLinear` in one instruction — a range
//! pass and a quantizing pass over the input, 16 lanes a vector on AVX-512, 8 on AVX2 (the
//! lowering it replaces took eleven instructions and eight passes over the tensor).
//!
//! Semantics (the ONNX operator, with ONNX Runtime's choice where ONNX leaves one open):
//! - `lo = min(0, min x)`, `hi = max(0, max x)`; NaN elements do not move either;
//! - `scale = (hi − lo) / 255`, or 1 when `hi = lo` (an all-zero input: ONNX Runtime's
//!   choice, where the ONNX formula divides 0 by 0);
//! - `zero_point = round(clamp(−lo / scale, 0, 255))`;
//! - `y = clamp(round(x / scale) + zero_point, 0, 255)`, a NaN giving 0.
//!
//! Rounding is to nearest, ties to even, everywhere; the vector and scalar paths compute
//! the same f32 operations in the same order, so they agree bit for bit.

use crate::DeviceMemory;
use crate::strided::{View, walk};
use crate::{Execute, KernelError, Workspace};
use nrt_isa::AccessPattern;
use nrt_isa::op;

/// The range's scale and zero point (as f32, an integer in `0..=255`) from `lo ≤ 0 ≤ hi`.
pub fn parameters(lo: f32, hi: f32) -> (f32, f32) {
    let scale = if hi == lo { 1.0 } else { (hi - lo) / 255.0 };
    let zero = (-(lo / scale)).clamp(0.0, 255.0).round_ties_even();
    // `clamp` passes a NaN through (an infinite range): such a zero point is 0.
    (scale, if zero.is_nan() { 0.0 } else { zero })
}

/// One element: `clamp(round(x / scale) + zero, 0, 255)`, NaN → 0 (`clamp` keeps a NaN and
/// the saturating `as` makes it 0, as `vmaxps` with the NaN first does on the vector path).
#[inline(always)]
fn quantize_one(x: f32, scale: f32, zero: f32) -> u8 {
    ((x / scale).round_ties_even() + zero).clamp(0.0, 255.0) as u8
}

/// Executes `Op::DynamicQuantize`.
///
/// The scale and zero point are written last, so every operand may alias the input (a
/// hostile model's overlap gives a defined result: nothing here holds a reference into
/// device memory).
///
/// # Safety
/// Operands inside `mem`, aligned, shapes and types as the decoder checks (input f32, output
/// u8 of the input's shape, scale f32 and zero point u8 of one element each).
pub unsafe fn dynamic_quantize(
    input: &AccessPattern,
    output: &AccessPattern,
    scale: &AccessPattern,
    zero_point: &AccessPattern,
    mem: DeviceMemory,
) {
    let vi = View::<f32>::new(input, mem);
    let vo = View::<u8>::new(output, mem);
    let shape = vi.shape;
    let w = walk(shape, [vi.stride, vo.stride]);
    let avx512 = crate::has_avx512();
    #[cfg(target_arch = "x86_64")]
    let avx2 = crate::cpu::avx2_fma();
    let (base_i, base_o) = (vi.at([0; 4]), vo.at([0; 4]));
    let (mut lo, mut hi) = (0f32, 0f32);
    let [si, so] = w.inner();
    let n = w.len();
    w.rows(|[oi, _]| {
        let p = base_i.wrapping_offset(oi);
        #[cfg(target_arch = "x86_64")]
        if avx512 && si == 1 {
            // SAFETY: AVX-512F detected; the row's n elements lie inside the input.
            unsafe { range_row_avx512(p, n, &mut lo, &mut hi) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if avx2 && si == 1 {
            // SAFETY: AVX2 detected; the row's n elements lie inside the input.
            unsafe { range_row_avx2(p, n, &mut lo, &mut hi) };
            return;
        }
        for e in 0..n {
            // SAFETY: element e of the row lies inside the input.
            let x = unsafe { p.wrapping_offset(e as isize * si).read() };
            if x < lo {
                lo = x;
            }
            if x > hi {
                hi = x;
            }
        }
    });
    let (s, z) = parameters(lo, hi);
    w.rows(|[oi, oo]| {
        let (p, q) = (base_i.wrapping_offset(oi), base_o.wrapping_offset(oo));
        #[cfg(target_arch = "x86_64")]
        if avx512 && si == 1 && so == 1 {
            // SAFETY: AVX-512F detected; the row's n elements lie inside the input and the
            // output.
            unsafe { quantize_row_avx512(p, q, n, s, z) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if avx2 && si == 1 && so == 1 {
            // SAFETY: AVX2 detected; the row's n elements lie inside the input and the
            // output.
            unsafe { quantize_row_avx2(p, q, n, s, z) };
            return;
        }
        for e in 0..n {
            // SAFETY: element e of the row lies inside the input and the output.
            unsafe {
                let x = p.wrapping_offset(e as isize * si).read();
                q.wrapping_offset(e as isize * so)
                    .write(quantize_one(x, s, z));
            }
        }
    });
    // SAFETY: one element each, inside `mem` (the decoder's shapes, the device's bounds).
    unsafe {
        View::<f32>::new(scale, mem).at([0; 4]).write(s);
        View::<u8>::new(zero_point, mem).at([0; 4]).write(z as u8);
    }
    let _ = avx512;
}

/// Widens `[lo, hi]` by `n` unit-stride elements from `p`: four 16-lane minima and maxima,
/// the tail masked; `vminps(x, acc)` returns `acc` for a NaN `x`.
///
/// # Safety
/// `p` readable for `n` f32; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn range_row_avx512(p: *const f32, n: usize, lo: &mut f32, hi: &mut f32) {
    use core::arch::x86_64::*;
    let mut mn = [_mm512_set1_ps(*lo); 4];
    let mut mx = [_mm512_set1_ps(*hi); 4];
    let mut i = 0;
    // SAFETY: every load reads elements below n (the tail under a mask).
    unsafe {
        while i + 64 <= n {
            for k in 0..4 {
                let x = _mm512_loadu_ps(p.add(i + 16 * k));
                mn[k] = _mm512_min_ps(x, mn[k]);
                mx[k] = _mm512_max_ps(x, mx[k]);
            }
            i += 64;
        }
        while i < n {
            let m = crate::lanes_below(n - i);
            let x = _mm512_maskz_loadu_ps(m, p.add(i));
            // Masked lanes keep the accumulator (zeros would be inside the range anyway).
            mn[0] = _mm512_mask_min_ps(mn[0], m, x, mn[0]);
            mx[0] = _mm512_mask_max_ps(mx[0], m, x, mx[0]);
            i += 16;
        }
        let mn = _mm512_min_ps(_mm512_min_ps(mn[0], mn[1]), _mm512_min_ps(mn[2], mn[3]));
        let mx = _mm512_max_ps(_mm512_max_ps(mx[0], mx[1]), _mm512_max_ps(mx[2], mx[3]));
        *lo = _mm512_reduce_min_ps(mn);
        *hi = _mm512_reduce_max_ps(mx);
    }
}

/// Quantizes `n` unit-stride elements from `p` to `q`: divide, round (ties to even), add the
/// zero point, clamp (`vmaxps` with the value first: a NaN becomes 0), convert, narrow.
///
/// # Safety
/// `p` readable for `n` f32, `q` writable for `n` bytes; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn quantize_row_avx512(p: *const f32, q: *mut u8, n: usize, scale: f32, zero: f32) {
    use core::arch::x86_64::*;
    let (s, z) = (_mm512_set1_ps(scale), _mm512_set1_ps(zero));
    let (floor, ceil) = (_mm512_setzero_ps(), _mm512_set1_ps(255.0));
    let mut i = 0;
    // SAFETY: every access touches elements below n (the tail under a mask).
    unsafe {
        while i < n {
            let m = crate::lanes_below(n - i);
            let x = _mm512_maskz_loadu_ps(m, p.add(i));
            let r = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_div_ps(x, s),
            );
            let v = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(r, z), floor), ceil);
            _mm512_mask_cvtepi32_storeu_epi8(q.add(i) as *mut _, m, _mm512_cvtps_epi32(v));
            i += 16;
        }
    }
}

/// [`range_row_avx512`] on AVX2: four 8-lane minima and maxima, the tail (< 32 elements)
/// one element at a time with the scalar path's comparisons (a NaN moves neither bound).
///
/// # Safety
/// `p` readable for `n` f32; the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn range_row_avx2(p: *const f32, n: usize, lo: &mut f32, hi: &mut f32) {
    use core::arch::x86_64::*;
    let mut mn = [_mm256_set1_ps(*lo); 4];
    let mut mx = [_mm256_set1_ps(*hi); 4];
    let mut i = 0;
    // SAFETY: every load reads elements below n.
    unsafe {
        while i + 32 <= n {
            for k in 0..4 {
                // `vminps(x, acc)` returns `acc` when `x` is a NaN.
                let x = _mm256_loadu_ps(p.add(i + 8 * k));
                mn[k] = _mm256_min_ps(x, mn[k]);
                mx[k] = _mm256_max_ps(x, mx[k]);
            }
            i += 32;
        }
        let mut a = [0f32; 8];
        let mut b = [0f32; 8];
        _mm256_storeu_ps(
            a.as_mut_ptr(),
            _mm256_min_ps(_mm256_min_ps(mn[0], mn[1]), _mm256_min_ps(mn[2], mn[3])),
        );
        _mm256_storeu_ps(
            b.as_mut_ptr(),
            _mm256_max_ps(_mm256_max_ps(mx[0], mx[1]), _mm256_max_ps(mx[2], mx[3])),
        );
        for (&l, &h) in a.iter().zip(&b) {
            *lo = lo.min(l);
            *hi = hi.max(h);
        }
        for e in i..n {
            let x = p.add(e).read();
            if x < *lo {
                *lo = x;
            }
            if x > *hi {
                *hi = x;
            }
        }
    }
}

/// [`quantize_row_avx512`] on AVX2, 32 elements a step: divide, round (ties to even), add
/// the zero point, clamp (`vmaxps` with the value first: a NaN becomes 0), convert, then
/// narrow four vectors to 32 bytes (two saturating packs, which interleave the 128-bit
/// lanes, and one permute that puts them back in order); the tail (< 32) one element at a
/// time with the same operations.
///
/// # Safety
/// `p` readable for `n` f32, `q` writable for `n` bytes; the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_row_avx2(p: *const f32, q: *mut u8, n: usize, scale: f32, zero: f32) {
    use core::arch::x86_64::*;
    let (s, z) = (_mm256_set1_ps(scale), _mm256_set1_ps(zero));
    let (floor, ceil) = (_mm256_setzero_ps(), _mm256_set1_ps(255.0));
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut i = 0;
    // SAFETY: every access touches elements below n.
    unsafe {
        while i + 32 <= n {
            let v: [__m256i; 4] = core::array::from_fn(|k| {
                let x = _mm256_loadu_ps(p.add(i + 8 * k));
                let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm256_div_ps(x, s),
                );
                let c = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(r, z), floor), ceil);
                _mm256_cvtps_epi32(c)
            });
            // Per 128-bit lane: [v0 v1] then [v2 v3] as u16, then all four as u8 — the
            // dwords come out as v0.lo v1.lo v2.lo v3.lo v0.hi v1.hi v2.hi v3.hi.
            let w01 = _mm256_packus_epi32(v[0], v[1]);
            let w23 = _mm256_packus_epi32(v[2], v[3]);
            let bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(w01, w23), order);
            _mm256_storeu_si256(q.add(i) as *mut __m256i, bytes);
            i += 32;
        }
        for e in i..n {
            q.add(e).write(quantize_one(p.add(e).read(), scale, zero));
        }
    }
}

impl Execute for op::DynamicQuantize {
    unsafe fn execute(&self, mem: DeviceMemory, _ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::DynamicQuantize {
            input,
            output,
            scale,
            zero_point,
        } = self;

        // SAFETY: see above.
        unsafe { dynamic_quantize(input, output, scale, zero_point, mem) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_follow_onnx_runtime() {
        // ONNX's example: x = [0, 2, −3, −2.5, 1.34, 0.5] → scale 5/255, zero point 153.
        let (s, z) = parameters(-3.0, 2.0);
        assert_eq!(s, 5.0 / 255.0);
        assert_eq!(z, 153.0);
        // All zeros: scale 1 (ONNX Runtime), zero point 0.
        assert_eq!(parameters(0.0, 0.0), (1.0, 0.0));
        // Only positive values: the range starts at 0.
        assert_eq!(parameters(0.0, 255.0), (1.0, 0.0));
        // NaN becomes 0; saturation at both ends.
        assert_eq!(quantize_one(f32::NAN, 1.0, 7.0), 0);
        assert_eq!(quantize_one(1e30, 1.0, 7.0), 255);
        assert_eq!(quantize_one(-1e30, 1.0, 7.0), 0);
        // Ties to even: 2.5 → 2, 3.5 → 4.
        assert_eq!(quantize_one(2.5, 1.0, 0.0), 2);
        assert_eq!(quantize_one(3.5, 1.0, 0.0), 4);
    }
}
