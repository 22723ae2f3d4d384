//! The AVX2 kernels of the block-quantized product (`vpmaddubsw` on the unsigned 4-bit or
//! sign-moved 8-bit weights), monomorphized per format and activation-row count so the
//! accumulators stay in registers. Each computes exactly what its portable spelling in the
//! parent module does.

use super::{QBlock, QK};
use nrt_hal::tuning::BLOCKQ_PREFETCH_SUPERBLOCKS;
use nrt_isa::op::BlockFormat;
use std::arch::x86_64::*;

/// Format codes of the monomorphized tile (const generics take integers).
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 2;

/// The code of `f`'s block type.
fn code_of(f: BlockFormat) -> u8 {
    match f.base() {
        BlockFormat::Q4_0 => Q4_0,
        BlockFormat::Q4_1 => Q4_1,
        _ => Q8_0,
    }
}

/// As [`super::dot_rows_portable`], with AVX2 (`vpmaddubsw` on the unsigned 4-bit or
/// sign-moved 8-bit weights).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `w` holds whole blocks and each `x[m]` at least as
/// many blocks.
/// [`super::quantize_row`] with AVX2: the same bits as `quantize_row_portable` — the
/// maximum is exact in any order, `vcvtps2dq` rounds half to even (the default MXCSR), NaN
/// products are zeroed and the rest clamped to [−128, 127] first (Rust's saturating `as`).
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_row(x: &[f32], out: &mut [QBlock]) {
    let sign = _mm256_set1_ps(-0.0);
    let (lo, hi) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
    // Byte groups of the two packs (values [0..4 of q0, q1, q2, q3 | 4..8 of each]) back
    // in row order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (xb, o) in x.chunks_exact(QK).zip(out.iter_mut()) {
        // SAFETY: `xb` holds 32 f32, read as four vectors of 8; `o.q` takes 32 bytes.
        unsafe {
            let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(xb.as_ptr().add(8 * i)));
            let mut m = _mm256_setzero_ps();
            for &v in &v {
                // A NaN |v| is the first operand: maxps returns the second, the maximum so far.
                m = _mm256_max_ps(_mm256_andnot_ps(sign, v), m);
            }
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
            let d = amax / 127.0;
            let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
            let q: [__m256i; 4] = std::array::from_fn(|i| {
                let p = _mm256_mul_ps(v[i], id);
                let p = _mm256_and_ps(p, _mm256_cmp_ps(p, p, _CMP_ORD_Q));
                _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(p, lo), hi))
            });
            let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
            let sum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
            let bytes = _mm256_packs_epi16(
                _mm256_packs_epi32(q[0], q[1]),
                _mm256_packs_epi32(q[2], q[3]),
            );
            let bytes = _mm256_permutevar8x32_epi32(bytes, order);
            _mm256_storeu_si256(o.q.as_mut_ptr() as *mut __m256i, bytes);
            o.d = d;
            o.s = d * sum as f32;
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_rows(f: BlockFormat, w: &[u8], x: &[&[QBlock]], out: &mut [f32]) {
    let code = code_of(f);
    for (xs, os) in x.chunks(4).zip(out.chunks_mut(4)) {
        let p = |r: usize| xs[r.min(xs.len() - 1)].as_ptr();
        // SAFETY: the caller's guarantee, passed on; each tile reads `xs.len()` rows.
        unsafe {
            match (code, xs.len()) {
                (Q4_0, 1) => tile::<Q4_0, 1>(w, [p(0)], os),
                (Q4_1, 1) => tile::<Q4_1, 1>(w, [p(0)], os),
                (_, 1) => tile::<Q8_0, 1>(w, [p(0)], os),
                (Q4_0, 2) => tile::<Q4_0, 2>(w, [p(0), p(1)], os),
                (Q4_1, 2) => tile::<Q4_1, 2>(w, [p(0), p(1)], os),
                (_, 2) => tile::<Q8_0, 2>(w, [p(0), p(1)], os),
                (Q4_0, 3) => tile::<Q4_0, 3>(w, [p(0), p(1), p(2)], os),
                (Q4_1, 3) => tile::<Q4_1, 3>(w, [p(0), p(1), p(2)], os),
                (_, 3) => tile::<Q8_0, 3>(w, [p(0), p(1), p(2)], os),
                (Q4_0, _) => tile::<Q4_0, 4>(w, [p(0), p(1), p(2), p(3)], os),
                (Q4_1, _) => tile::<Q4_1, 4>(w, [p(0), p(1), p(2), p(3)], os),
                (_, _) => tile::<Q8_0, 4>(w, [p(0), p(1), p(2), p(3)], os),
            }
        }
    }
}

/// f16 bits → f32 with F16C.
#[inline(always)]
unsafe fn half(p: *const u8) -> f32 {
    // SAFETY: two readable bytes at `p` (the caller's); F16C is enabled by the caller.
    unsafe {
        let h = (p as *const u16).read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
    }
}

/// One weight row against `R` activation rows, the format `F` fixed at compile time so
/// the accumulators stay in registers.
///
/// # Safety
/// As [`dot_rows`]; `out` holds at least `R` values.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const F: u8, const R: usize>(w: &[u8], x: [*const QBlock; R], out: &mut [f32]) {
    let bb = match F {
        Q4_0 => 18,
        Q4_1 => 20,
        _ => 34,
    };
    let nb = w.len() / bb;
    let ones = _mm256_set1_epi16(1);
    let m4 = _mm_set1_epi8(15);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut acc2 = [_mm256_setzero_ps(); R];
    let mut extra = [0f32; R];
    let wp = w.as_ptr();
    // One block into `acc` (two chains, even and odd blocks, so the FMA latency of one
    // does not wait for the other).
    let step = |b: usize, acc: &mut [__m256; R], extra: &mut [f32; R]| {
        // SAFETY: block `b` lies inside `w` (`nb` whole blocks), and each x row holds at
        // least `nb` blocks (the caller's guarantee).
        unsafe {
            let blk = wp.add(b * bb);
            let d = half(blk);
            let (wv, off) = if F == Q8_0 {
                (_mm256_loadu_si256(blk.add(2) as *const __m256i), 0.0f32)
            } else {
                let (nib, off) = if F == Q4_0 {
                    (blk.add(2), -8.0 * d)
                } else {
                    (blk.add(4), half(blk.add(2)))
                };
                let raw = _mm_loadu_si128(nib as *const __m128i);
                let lo = _mm_and_si128(raw, m4);
                let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
                (_mm256_set_m128i(hi, lo), off)
            };
            let wabs = if F == Q8_0 {
                _mm256_sign_epi8(wv, wv)
            } else {
                wv
            };
            for r in 0..R {
                let xb = &*x[r].add(b);
                let xv = _mm256_loadu_si256(xb.q.as_ptr() as *const __m256i);
                let xv = if F == Q8_0 {
                    _mm256_sign_epi8(xv, wv)
                } else {
                    xv
                };
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, xv), ones);
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), _mm256_cvtepi32_ps(p), acc[r]);
                if F != Q8_0 {
                    extra[r] = off.mul_add(xb.s, extra[r]);
                }
            }
        }
    };
    let mut extra2 = [0f32; R];
    let mut b = 0;
    while b + 2 <= nb {
        step(b, &mut acc, &mut extra);
        step(b + 1, &mut acc2, &mut extra2);
        b += 2;
    }
    if b < nb {
        step(b, &mut acc, &mut extra);
    }
    for r in 0..R {
        acc[r] = _mm256_add_ps(acc[r], acc2[r]);
        extra[r] += extra2[r];
    }
    for r in 0..R {
        let v = acc[r];
        let q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let p = _mm_add_ps(q, _mm_movehl_ps(q, q));
        let s = _mm_add_ss(p, _mm_shuffle_ps(p, p, 1));
        out[r] = _mm_cvtss_f32(s) + extra[r];
    }
}

/// As [`super::dot_group_portable`], with AVX2: the same block of the 8 rows of an
/// interleaved group in two registers per pair of rows, the 8 rows' sums gathered into
/// one register by three horizontal adds.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `group` holds 8 rows of `nb` blocks of `f` (an `x8`
/// format) and each `x[r]` at least `nb` blocks; `out` at least `x.len()` rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_group(
    f: BlockFormat,
    group: &[u8],
    nb: usize,
    x: &[&[QBlock]],
    out: &mut [[f32; 8]],
) {
    let code = code_of(f);
    for (xs, os) in x.chunks(4).zip(out.chunks_mut(4)) {
        let p = |r: usize| xs[r.min(xs.len() - 1)].as_ptr();
        let g = group.as_ptr();
        // SAFETY: the caller's guarantee, passed on; each call reads `xs.len()` rows.
        unsafe {
            match (code, xs.len()) {
                (Q4_0, 1) => group_tile::<Q4_0, 1>(g, nb, [p(0)], os),
                (Q4_1, 1) => group_tile::<Q4_1, 1>(g, nb, [p(0)], os),
                (_, 1) => group_tile::<Q8_0, 1>(g, nb, [p(0)], os),
                (Q4_0, 2) => group_tile::<Q4_0, 2>(g, nb, [p(0), p(1)], os),
                (Q4_1, 2) => group_tile::<Q4_1, 2>(g, nb, [p(0), p(1)], os),
                (_, 2) => group_tile::<Q8_0, 2>(g, nb, [p(0), p(1)], os),
                (Q4_0, 3) => group_tile::<Q4_0, 3>(g, nb, [p(0), p(1), p(2)], os),
                (Q4_1, 3) => group_tile::<Q4_1, 3>(g, nb, [p(0), p(1), p(2)], os),
                (_, 3) => group_tile::<Q8_0, 3>(g, nb, [p(0), p(1), p(2)], os),
                (Q4_0, _) => group_tile::<Q4_0, 4>(g, nb, [p(0), p(1), p(2), p(3)], os),
                (Q4_1, _) => group_tile::<Q4_1, 4>(g, nb, [p(0), p(1), p(2), p(3)], os),
                (_, _) => group_tile::<Q8_0, 4>(g, nb, [p(0), p(1), p(2), p(3)], os),
            }
        }
    }
}

/// One interleaved group against `R` activation rows, the format fixed at compile time.
///
/// # Safety
/// As [`dot_group`]; `out` holds at least `R` rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_tile<const F: u8, const R: usize>(
    g: *const u8,
    nb: usize,
    x: [*const QBlock; R],
    out: &mut [[f32; 8]],
) {
    let bb = match F {
        Q4_0 => 18,
        Q4_1 => 20,
        _ => 34,
    };
    let ones = _mm256_set1_epi16(1);
    let m4 = _mm256_set1_epi8(15);
    let mut acc = [_mm256_setzero_ps(); R];
    let mut extra = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        // SAFETY: superblock `b` (8 blocks) lies inside the group, and each x row holds
        // at least `nb` blocks (the caller's guarantee).
        unsafe {
            let sb = g.add(b * 8 * bb);
            // The weights stream once per token: ask for them a few superblocks ahead (a
            // hint: an address past the table's end is never dereferenced).
            let ahead = sb.wrapping_add(BLOCKQ_PREFETCH_SUPERBLOCKS * 8 * bb);
            for line in (0..8 * bb).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
            }
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(sb as *const __m128i));
            let offv = match F {
                Q4_0 => _mm256_mul_ps(dv, _mm256_set1_ps(-8.0)),
                Q4_1 => _mm256_cvtph_ps(_mm_loadu_si128(sb.add(16) as *const __m128i)),
                _ => _mm256_setzero_ps(),
            };
            let q = sb.add(if F == Q4_1 { 32 } else { 16 });
            // Per pair p of rows (p, p + 4): the two 256-bit operands of the product and
            // (8-bit) their sign-moved magnitudes.
            let mut wa = [_mm256_setzero_si256(); 4];
            let mut wb = [_mm256_setzero_si256(); 4];
            for p in 0..4 {
                if F == Q8_0 {
                    wa[p] = _mm256_loadu_si256(q.add(64 * p) as *const __m256i);
                    wb[p] = _mm256_loadu_si256(q.add(64 * p + 32) as *const __m256i);
                } else {
                    let v = _mm256_loadu_si256(q.add(32 * p) as *const __m256i);
                    wa[p] = _mm256_and_si256(v, m4);
                    wb[p] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                }
            }
            for r in 0..R {
                let xb = &*x[r].add(b);
                let xl =
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(xb.q.as_ptr() as *const __m128i));
                let xh = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                    xb.q.as_ptr().add(16) as *const __m128i
                ));
                let mut s = [_mm256_setzero_si256(); 4];
                for p in 0..4 {
                    s[p] = if F == Q8_0 {
                        let a = _mm256_maddubs_epi16(
                            _mm256_sign_epi8(wa[p], wa[p]),
                            _mm256_sign_epi8(xl, wa[p]),
                        );
                        let c = _mm256_maddubs_epi16(
                            _mm256_sign_epi8(wb[p], wb[p]),
                            _mm256_sign_epi8(xh, wb[p]),
                        );
                        _mm256_add_epi32(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(c, ones))
                    } else {
                        // |each i16| ≤ 2·15·127, the sum of two ≤ 7620: no overflow.
                        let a = _mm256_maddubs_epi16(wa[p], xl);
                        let c = _mm256_maddubs_epi16(wb[p], xh);
                        _mm256_madd_epi16(_mm256_add_epi16(a, c), ones)
                    };
                }
                let tot =
                    _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
                let sc = _mm256_mul_ps(dv, _mm256_set1_ps(xb.d));
                acc[r] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(tot), acc[r]);
                if F != Q8_0 {
                    extra[r] = _mm256_fmadd_ps(offv, _mm256_set1_ps(xb.s), extra[r]);
                }
            }
        }
    }
    for r in 0..R {
        // SAFETY: `out[r]` is 8 f32.
        unsafe {
            _mm256_storeu_ps(out[r].as_mut_ptr(), _mm256_add_ps(acc[r], extra[r]));
        }
    }
}
