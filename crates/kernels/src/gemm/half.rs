//! `MatMul` with half-precision weights: B in bf16 or f16, A and C in f32 (what `nrt compile
//! --auto-cast matmult` emits). Entered only through [`crate::matmul::matmul`], which picks
//! this path from B's element type.
//!
//! - **bf16** with AVX-512 BF16 (`vdpbf16ps`, detected at run time): A's rows are rounded to
//!   bf16 once per call (round to nearest even), then blocks of up to 4 rows of A × 4
//!   columns of B are dot products of 32 bf16 pairs per instruction with f32 accumulation,
//!   16 accumulators in registers, masked loads for the K tail.
//! - **f16** with AVX-512F (`vcvtph2ps`, the 512-bit F16C): B's halves are widened in
//!   registers and multiplied with A's f32 values (A is not rounded), same blocking.
//! - **Without those** (AVX2, FMA, F16C: every x86-64-v3 CPU) both types are widened in
//!   registers (bf16 16 of a column per load, f16 8) and multiplied with A's f32 values by FMA
//!   (bf16: A rounded to bf16 first, as above, unless the product has `F32_A`): no f32 copy
//!   of B is made (module `avx2`).
//! - **`F32_A`** (`matmul_flags`, NCM 1.13: a bf16 weight read through ONNX's `Cast`): A's
//!   f32 values multiply the widened bf16 B unrounded, the products ONNX's `MatMul(A,
//!   Cast(B))` defines; the AVX-512 BF16 path (which rounds A) steps aside for the AVX2 one.
//! - Constant bf16 weights of larger products arrive packed in panels instead
//!   (`matmul_flags::PACKED_B`) and run [`super::packed::gemm_packed_bf16`].
//! - All need B's columns contiguous along K (`[N, K]` storage: the layout the compiler
//!   writes cast weights in, and a bf16 weight input read through a `Cast`). Any other
//!   layout, and machines without AVX2, widen B to f32 in the workspace and run the f32
//!   GEMM: slower, same results up to the f32 summation order (the bf16 path also rounds
//!   A, which the fallback does too).

use super::sgemm::gemm_auto;
use super::types::Mat;
use crate::elem::{bf16_to_f32, f16_to_f32, f32_to_bf16};
use crate::{KernelError, Workspace};

/// Which 16-bit float B holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    /// bfloat16.
    Bf16,
    /// IEEE binary16.
    F16,
}

/// A strided matrix of 16-bit floats: element `[p, j]` at `ptr + p·rs + j·cs`.
#[derive(Clone, Copy, Debug)]
pub struct HalfMat {
    /// Element `[0, 0]`.
    pub ptr: *const u16,
    /// Row stride (along K).
    pub rs: isize,
    /// Column stride (along N).
    pub cs: isize,
    /// Element type.
    pub kind: Half,
}

impl Half {
    fn widen(self, h: u16) -> f32 {
        match self {
            Half::Bf16 => bf16_to_f32(h),
            Half::F16 => f16_to_f32(h),
        }
    }
}

/// Whether the vectorized path runs for `kind` on this machine.
pub fn fast_path_available(kind: Half) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match kind {
            Half::Bf16 => crate::cpu::avx512bf16(),
            Half::F16 => crate::cpu::avx512_bw_vl(),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = kind;
        false
    }
}

/// `C = alpha·A·B` (`+= ` when `accumulate`) for an f32 `m×k` A, a half-precision `k×n` B
/// and an f32 `m×n` C. With a bf16 B, `round_a` rounds A to bf16 first (the auto-cast
/// product, what `vdpbf16ps` multiplies); without it A's f32 values multiply the widened B
/// (`matmul_flags::F32_A`: ONNX's `MatMul(A, Cast(B))`), and the AVX-512 BF16 path steps
/// aside for the AVX2 one.
///
/// # Safety
/// As [`gemm_auto`]: every addressed element valid, C not overlapping A or B; `m, n, k ≥ 1`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_half(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: HalfMat,
    c: Mat,
    alpha: f32,
    accumulate: bool,
    round_a: bool,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    let round_a = round_a && b.kind == Half::Bf16;
    #[cfg(target_arch = "x86_64")]
    if b.rs == 1 && fast_path_available(b.kind) && (round_a || b.kind == Half::F16) {
        // SAFETY: forwarded contract; the CPU features were just detected.
        unsafe {
            match b.kind {
                Half::Bf16 => avx512::bf16(m, n, k, a, b, c, alpha, accumulate, ws),
                Half::F16 => avx512::f16(m, n, k, a, b, c, alpha, accumulate, ws),
            }
        }?;
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if b.rs == 1 && avx2::available() {
        // SAFETY: forwarded contract; the CPU features were just detected.
        unsafe { avx2::gemm(m, n, k, a, b, c, alpha, accumulate, round_a, ws) }?;
        return Ok(());
    }
    // Portable path: B widened to f32 (A rounded to bf16 first for bf16, so both paths
    // compute the same products). Columns contiguous along K (`[N, K]` storage, what the
    // compiler writes cast weights in) are widened in that order, one pass in memory order,
    // and the f32 GEMM reads them as a column-major `k×n` (1×512×512 bf16 without AVX-512:
    // 1.8 GFLOP/s when the copy walked B across its columns); any other layout becomes a
    // dense row-major `k×n`.
    let aw_len = if round_a { m.saturating_mul(k) } else { 0 };
    let (bw, aw) = ws.f32x2(k.saturating_mul(n), aw_len)?;
    let bm = if b.rs == 1 {
        for (j, col) in bw.chunks_exact_mut(k).enumerate() {
            let src = b.ptr.wrapping_offset(j as isize * b.cs);
            for (p, o) in col.iter_mut().enumerate() {
                // SAFETY: element (p, j) in bounds per the contract.
                *o = b.kind.widen(unsafe { *src.add(p) });
            }
        }
        Mat {
            ptr: bw.as_mut_ptr(),
            rs: 1,
            cs: k as isize,
        }
    } else {
        for p in 0..k {
            for j in 0..n {
                // SAFETY: in bounds per the contract.
                let h = unsafe { *b.ptr.offset(p as isize * b.rs + j as isize * b.cs) };
                bw[p * n + j] = b.kind.widen(h);
            }
        }
        Mat {
            ptr: bw.as_mut_ptr(),
            rs: n as isize,
            cs: 1,
        }
    };
    let a2 = if round_a {
        for i in 0..m {
            for p in 0..k {
                // SAFETY: in bounds per the contract.
                let x = unsafe { *a.ptr.offset(i as isize * a.rs + p as isize * a.cs) };
                aw[i * k + p] = bf16_to_f32(f32_to_bf16(x));
            }
        }
        Mat {
            ptr: aw.as_mut_ptr(),
            rs: k as isize,
            cs: 1,
        }
    } else {
        a
    };
    // SAFETY: the scratch copies are dense and valid (`gemm_auto` uses only the workspace's
    // buffer 3, so buffers 0 and 1 stay where they are); C per the contract.
    unsafe { gemm_auto(m, n, k, a2, bm, c, alpha, accumulate, ws)? };
    Ok(())
}

#[cfg(target_arch = "x86_64")]
/// Writes one `R×CN` block of dot products into C.
///
/// # Safety
/// C's block writable.
#[inline(always)]
pub(crate) unsafe fn store<const R: usize, const CN: usize>(
    sums: [[f32; CN]; R],
    c: Mat,
    i: usize,
    j: usize,
    alpha: f32,
    accumulate: bool,
) {
    for (r, row) in sums.iter().enumerate() {
        for (q, s) in row.iter().enumerate() {
            let p = c
                .ptr
                .wrapping_offset((i + r) as isize * c.rs + (j + q) as isize * c.cs);
            // SAFETY: in C per the contract.
            unsafe { *p = alpha * s + if accumulate { *p } else { 0.0 } };
        }
    }
}

/// The AVX2 path (every x86-64-v3 CPU: AVX2, FMA, F16C) for a B contiguous along K: a
/// column's halves widened in registers (bf16: 16 at a time, zeros interleaved below them —
/// exact — against A's rows reordered to match; f16: 8 at a time by `vcvtph2ps`), multiplied
/// with A's f32 values by FMA. No f32 copy of B is made — what a decoder LLM's bf16 weights
/// need on a CPU without AVX-512 BF16, where the portable path would widen the whole matrix
/// per call. For bf16 B without `F32_A`, A's rows are rounded to bf16 first (into the
/// scratch), as `vdpbf16ps` and the portable path see them, so every path computes the same
/// products (each exact in f32) and differs only in summation order; with `F32_A` they are
/// copied unrounded.
/// Blocks of `R` rows × `CN` columns: 1×4, 2×4, 3×3, 4×2 (4–9 accumulators, the rest of the
/// 16 registers for A and B; one row reads 4 columns, not 8: 8 short streams at once
/// decoded SmolLM2's bf16 build at 41 tok/s, 4 at 44), over column panels of B that stay in
/// L2 while every row block passes ([`nrt_hal::tuning::HALF_GEMM_PANEL_BYTES`]); the next
/// block's columns are prefetched a line at a time.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
pub(crate) mod avx2 {
    use super::{Half, HalfMat, KernelError, Mat, store};
    use crate::Workspace;
    use core::arch::x86_64::*;

    /// Whether the AVX2 path runs on this machine (F16C for bf16 too: the kernels are
    /// compiled with it, and every AVX2 CPU has it).
    pub(crate) fn available() -> bool {
        crate::cpu::avx2_fma() && std::arch::is_x86_feature_detected!("f16c")
    }

    /// The sum of `v`'s 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
    }

    /// `R` contiguous f32 rows of A (row stride `lda`) against `CN` half columns of B (each
    /// contiguous along K, column stride `ldb`): the `R×CN` dot products over `k`. For bf16,
    /// A's rows come in [`bf16_order`] (16 bf16 of a column are one load, widened in two
    /// halves by interleaving zeros below them: elements 0–3, 8–11, then 4–7, 12–15).
    ///
    /// # Safety
    /// The rows and columns readable for `k` elements; AVX2, FMA and F16C present.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block<const BF16: bool, const R: usize, const CN: usize>(
        k: usize,
        a: *const f32,
        lda: usize,
        b: *const u16,
        ldb: isize,
    ) -> [[f32; CN]; R] {
        let mut acc = [[_mm256_setzero_ps(); CN]; R];
        let mut cols = [b; CN];
        for q in 0..CN {
            cols[q] = b.wrapping_offset(q as isize * ldb);
        }
        let mut rows = [a; R];
        for r in 0..R {
            rows[r] = a.wrapping_add(r * lda);
        }
        let mut p = 0;
        // SAFETY: every load is inside the rows/columns per the contract (`p + 16 ≤ k`,
        // `p + 8 ≤ k`).
        unsafe {
            if BF16 {
                let zero = _mm256_setzero_si256();
                while p + 16 <= k {
                    if p % 32 == 0 {
                        // The next block's columns, a cache line each: a column is a short
                        // stream (K halves) that the hardware prefetcher does not reach.
                        for q in 0..CN {
                            let ahead = cols[q].wrapping_offset(CN as isize * ldb).wrapping_add(p);
                            _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
                        }
                    }
                    for q in 0..CN {
                        let x = _mm256_loadu_si256(cols[q].add(p) as *const __m256i);
                        let lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, x));
                        let hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, x));
                        for r in 0..R {
                            let (al, ah) = (
                                _mm256_loadu_ps(rows[r].add(p)),
                                _mm256_loadu_ps(rows[r].add(p + 8)),
                            );
                            acc[r][q] = _mm256_fmadd_ps(al, lo, acc[r][q]);
                            acc[r][q] = _mm256_fmadd_ps(ah, hi, acc[r][q]);
                        }
                    }
                    p += 16;
                }
            } else {
                while p + 8 <= k {
                    let mut av = [_mm256_setzero_ps(); R];
                    for r in 0..R {
                        av[r] = _mm256_loadu_ps(rows[r].add(p));
                    }
                    for q in 0..CN {
                        let bv = _mm256_cvtph_ps(_mm_loadu_si128(cols[q].add(p) as *const __m128i));
                        for r in 0..R {
                            acc[r][q] = _mm256_fmadd_ps(av[r], bv, acc[r][q]);
                        }
                    }
                    p += 8;
                }
            }
        }
        let mut out = [[0f32; CN]; R];
        for r in 0..R {
            for q in 0..CN {
                let mut t = hsum(acc[r][q]);
                for e in p..k {
                    // SAFETY: the K tail (in natural order), inside the row and the column.
                    let (x, h) = unsafe { (*rows[r].add(e), *cols[q].add(e)) };
                    let w = if BF16 {
                        crate::elem::bf16_to_f32(h)
                    } else {
                        crate::elem::f16_to_f32(h)
                    };
                    t = x.mul_add(w, t);
                }
                out[r][q] = t;
            }
        }
        out
    }

    /// Reorders each whole 16 of `row` as [`block`] reads bf16 columns: elements 0–3, 8–11,
    /// 4–7, 12–15 (the tail past the last 16 stays in order).
    fn bf16_order(row: &mut [f32]) {
        for c in row.chunks_exact_mut(16) {
            let mut t = [0f32; 16];
            t[..4].copy_from_slice(&c[..4]);
            t[4..8].copy_from_slice(&c[8..12]);
            t[8..12].copy_from_slice(&c[4..8]);
            t[12..].copy_from_slice(&c[12..]);
            c.copy_from_slice(&t);
        }
    }

    /// Rounds `k` f32 (stride `s`) to the nearest bf16 (ties to even; NaN stays NaN), written
    /// back as f32 into `out`, 8 at a time when contiguous: what [`crate::elem::f32_to_bf16`]
    /// then [`crate::elem::bf16_to_f32`] give.
    ///
    /// # Safety
    /// `x` readable for `out.len()` elements at stride `s`; AVX2 present.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn round_row_bf16(x: *const f32, s: isize, out: &mut [f32]) {
        let k = out.len();
        let mut p = 0;
        if s == 1 {
            let one = _mm256_set1_epi32(1);
            let bias = _mm256_set1_epi32(0x7fff);
            let high = _mm256_set1_epi32(0xffff_0000u32 as i32);
            let quiet = _mm256_set1_epi32(0x0040_0000);
            while p + 8 <= k {
                // SAFETY: 8 contiguous readable floats; 8 writable floats of `out`.
                unsafe {
                    let v = _mm256_loadu_ps(x.add(p));
                    let b = _mm256_castps_si256(v);
                    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(b), one);
                    let r = _mm256_add_epi32(b, _mm256_add_epi32(bias, lsb));
                    let rounded = _mm256_and_si256(r, high);
                    let nan = _mm256_and_si256(_mm256_or_si256(b, quiet), high);
                    let is_nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
                    let y = _mm256_blendv_ps(
                        _mm256_castsi256_ps(rounded),
                        _mm256_castsi256_ps(nan),
                        is_nan,
                    );
                    _mm256_storeu_ps(out.as_mut_ptr().add(p), y);
                }
                p += 8;
            }
        }
        for (q, o) in out.iter_mut().enumerate().skip(p) {
            // SAFETY: readable per the contract.
            let v = unsafe { *x.offset(q as isize * s) };
            *o = crate::elem::bf16_to_f32(crate::elem::f32_to_bf16(v));
        }
    }

    /// `C = alpha·A·B` for a half B contiguous along K (`b.rs == 1`); `round_a` as
    /// [`super::gemm_half`]'s.
    ///
    /// # Safety
    /// As [`super::gemm_half`], with `b.rs == 1`; [`available`].
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn gemm(
        m: usize,
        n: usize,
        k: usize,
        a: Mat,
        b: HalfMat,
        c: Mat,
        alpha: f32,
        accumulate: bool,
        round_a: bool,
        ws: &mut Workspace,
    ) -> Result<(), KernelError> {
        // A's rows contiguous in the scratch: for bf16 B in `bf16_order` (rounded to bf16
        // when `round_a`); for f16 B only when strided (or walked backwards).
        let (ap, lda) = if b.kind == Half::Bf16 || a.cs != 1 || a.rs < 0 {
            let buf = ws.f32(0, m.saturating_mul(k))?;
            for (i, row) in buf.chunks_exact_mut(k).enumerate() {
                let src = a.ptr.wrapping_offset(i as isize * a.rs);
                if round_a {
                    // SAFETY: A's row readable per the contract; `row` is distinct scratch.
                    unsafe { round_row_bf16(src, a.cs, row) };
                } else {
                    // SAFETY: as above.
                    unsafe { crate::strided::gather_into(src, a.cs, row) };
                }
                if b.kind == Half::Bf16 {
                    bf16_order(row);
                }
            }
            (buf.as_ptr(), k)
        } else {
            (a.ptr as *const f32, a.rs as usize)
        };
        let bf16 = b.kind == Half::Bf16;
        macro_rules! run {
            ($r:literal, $cn:literal, $i:expr, $j:expr) => {{
                let (ai, bj) = (
                    ap.wrapping_add($i * lda),
                    b.ptr.wrapping_offset($j as isize * b.cs),
                );
                // SAFETY: rows i.. of A and columns j.. of B are in bounds per the contract.
                let s = unsafe {
                    if bf16 {
                        block::<true, $r, $cn>(k, ai, lda, bj, b.cs)
                    } else {
                        block::<false, $r, $cn>(k, ai, lda, bj, b.cs)
                    }
                };
                // SAFETY: C's block is writable per the contract.
                unsafe { store::<$r, $cn>(s, c, $i, $j, alpha, accumulate) };
                $cn
            }};
        }
        // Column panels of B that stay in L2 while every row block of A passes.
        let pw = (nrt_hal::tuning::HALF_GEMM_PANEL_BYTES / (2 * k.max(1))).max(8);
        let mut j0 = 0;
        while j0 < n {
            let jn = (j0 + pw).min(n);
            let mut i = 0;
            while i < m {
                let r = (m - i).min(4);
                let mut j = j0;
                while j < jn {
                    j += match (r, jn - j) {
                        (4, 2..) => run!(4, 2, i, j),
                        (4, _) => run!(4, 1, i, j),
                        (3, 3..) => run!(3, 3, i, j),
                        (3, 2) => run!(3, 2, i, j),
                        (3, _) => run!(3, 1, i, j),
                        (2, 4..) => run!(2, 4, i, j),
                        (2, 3) => run!(2, 3, i, j),
                        (2, 2) => run!(2, 2, i, j),
                        (2, _) => run!(2, 1, i, j),
                        (_, 4..) => run!(1, 4, i, j),
                        (_, 2..) => run!(1, 2, i, j),
                        (_, _) => run!(1, 1, i, j),
                    };
                }
                i += r;
            }
            j0 = jn;
        }
        Ok(())
    }
}

#[cfg(target_arch = "x86_64")]
// Register blocks index accumulators by row and column explicitly: clearer than iterators.
#[allow(clippy::needless_range_loop)]
pub(crate) mod avx512 {
    use super::store;
    use super::{HalfMat, KernelError, Mat};
    use crate::Workspace;
    use crate::gemm::types::avx512::round_row;
    use core::arch::x86_64::*;

    /// Covers `m×n` with blocks of up to 4×4, dispatching each block size to its
    /// monomorphized kernel.
    macro_rules! drive {
        ($m:expr, $n:expr, $k:expr, $block:ident) => {{
            let (m, n) = ($m, $n);
            // Column panels of B that stay in L2 while every row block of A passes.
            let pw = (nrt_hal::tuning::HALF_GEMM_PANEL_BYTES / (2 * $k.max(1))).max(4) & !3;
            let mut j0 = 0;
            while j0 < n {
                let jn = (j0 + pw).min(n);
                let mut i = 0;
                while i < m {
                    let r = (m - i).min(4);
                    let mut j = j0;
                    while j < jn {
                        let cn = (jn - j).min(4);
                        match (r, cn) {
                            (4, 4) => $block!(4, 4, i, j),
                            (4, 3) => $block!(4, 3, i, j),
                            (4, 2) => $block!(4, 2, i, j),
                            (4, _) => $block!(4, 1, i, j),
                            (3, 4) => $block!(3, 4, i, j),
                            (3, 3) => $block!(3, 3, i, j),
                            (3, 2) => $block!(3, 2, i, j),
                            (3, _) => $block!(3, 1, i, j),
                            (2, 4) => $block!(2, 4, i, j),
                            (2, 3) => $block!(2, 3, i, j),
                            (2, 2) => $block!(2, 2, i, j),
                            (2, _) => $block!(2, 1, i, j),
                            (_, 4) => $block!(1, 4, i, j),
                            (_, 3) => $block!(1, 3, i, j),
                            (_, 2) => $block!(1, 2, i, j),
                            (_, _) => $block!(1, 1, i, j),
                        }
                        j += cn;
                    }
                    i += r;
                }
                j0 = jn;
            }
        }};
    }

    /// The horizontal sums of 16 vectors, in order, by a transposing add tree (45
    /// instructions instead of 16 separate reductions of ~9).
    ///
    /// # Safety
    /// AVX-512F present.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn hsum16(v: [__m512; 16]) -> [f32; 16] {
        // (Plain loops, not closures: a closure does not inherit this function's target
        // features, and vectors crossing its boundary are not in registers.)
        // Level 1: per 128-bit lane [a0+a2, b0+b2, a1+a3, b1+b3].
        let mut x = [_mm512_setzero_ps(); 8];
        for p in 0..8 {
            let (a, b) = (v[2 * p], v[2 * p + 1]);
            x[p] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
        }
        // Level 2: per lane the partial sums of 4 accumulators, [A, B, C, D].
        let mut w = [_mm512_setzero_ps(); 4];
        for p in 0..4 {
            let (a, b) = (_mm512_castps_pd(x[2 * p]), _mm512_castps_pd(x[2 * p + 1]));
            // Shuffled as 64-bit pairs, added as floats.
            w[p] = _mm512_add_ps(
                _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
            );
        }
        // Levels 3 and 4: add the four lanes, lane p then holding accumulators 4p..4p+4.
        let mut s = [_mm512_setzero_ps(); 2];
        for p in 0..2 {
            let (a, b) = (w[2 * p], w[2 * p + 1]);
            s[p] = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x88>(a, b),
                _mm512_shuffle_f32x4::<0xDD>(a, b),
            );
        }
        let t = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(s[0], s[1]),
            _mm512_shuffle_f32x4::<0xDD>(s[0], s[1]),
        );
        let mut out = [0f32; 16];
        // SAFETY: 16 writable floats.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), t) };
        out
    }

    /// The `R×CN` horizontal sums of the accumulators.
    ///
    /// # Safety
    /// AVX-512F present.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn reduce<const R: usize, const CN: usize>(acc: [[__m512; CN]; R]) -> [[f32; CN]; R] {
        let mut out = [[0f32; CN]; R];
        if R == 4 && CN == 4 {
            let mut flat = [_mm512_setzero_ps(); 16];
            for i in 0..16 {
                flat[i] = acc[i / 4][i % 4];
            }
            // SAFETY: the features of this function.
            let t = unsafe { hsum16(flat) };
            for r in 0..R {
                for q in 0..CN {
                    out[r][q] = t[r * CN + q];
                }
            }
            return out;
        }
        for r in 0..R {
            for q in 0..CN {
                out[r][q] = _mm512_reduce_add_ps(acc[r][q]);
            }
        }
        out
    }

    /// `R` rows of bf16 A (row stride `lda`) against `CN` bf16 columns of B (each contiguous
    /// along K, column stride `ldb`): the `R×CN` dot products over `k`.
    ///
    /// # Safety
    /// The rows and columns readable for `k` elements; AVX-512 F/BW/BF16 present.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn bf16_block<const R: usize, const CN: usize>(
        k: usize,
        a: *const u16,
        lda: usize,
        b: *const u16,
        ldb: isize,
    ) -> [[f32; CN]; R] {
        let mut acc = [[_mm512_setzero_ps(); CN]; R];
        // SAFETY: any bit pattern is a bf16 vector.
        let bh_zero = unsafe { core::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512()) };
        let mut p = 0;
        // SAFETY: (every load) inside the rows/columns per the contract; the tail loads are
        // masked to the `k − p` remaining elements.
        unsafe {
            while p + 32 <= k {
                let mut av = [bh_zero; R];
                for r in 0..R {
                    av[r] = core::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                        a.add(r * lda + p) as *const __m512i,
                    ));
                }
                for q in 0..CN {
                    let bv = core::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                        b.offset(q as isize * ldb).add(p) as *const __m512i,
                    ));
                    for r in 0..R {
                        acc[r][q] = _mm512_dpbf16_ps(acc[r][q], av[r], bv);
                    }
                }
                p += 32;
            }
            if p < k {
                let mask: __mmask32 = (1u32 << (k - p)) - 1;
                let mut av = [bh_zero; R];
                for r in 0..R {
                    av[r] = core::mem::transmute::<__m512i, __m512bh>(_mm512_maskz_loadu_epi16(
                        mask,
                        a.add(r * lda + p) as *const i16,
                    ));
                }
                for q in 0..CN {
                    let bv = core::mem::transmute::<__m512i, __m512bh>(_mm512_maskz_loadu_epi16(
                        mask,
                        b.offset(q as isize * ldb).add(p) as *const i16,
                    ));
                    for r in 0..R {
                        acc[r][q] = _mm512_dpbf16_ps(acc[r][q], av[r], bv);
                    }
                }
            }
        }
        // SAFETY: the features of this function.
        unsafe { reduce(acc) }
    }

    /// bf16 `C = alpha·A·B` with `vdpbf16ps`.
    ///
    /// # Safety
    /// As [`super::gemm_half`], with `b.rs == 1`; AVX-512 F/BW/VL/BF16 present.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(super) unsafe fn bf16(
        m: usize,
        n: usize,
        k: usize,
        a: Mat,
        b: HalfMat,
        c: Mat,
        alpha: f32,
        accumulate: bool,
        ws: &mut Workspace,
    ) -> Result<(), KernelError> {
        // A rounded to bf16 once: `m` rows of `k` (2 per f32 slot of the scratch).
        let buf = ws.f32(0, m.saturating_mul(k).div_ceil(2))?;
        // SAFETY: the scratch holds `2·len ≥ m·k` u16, f32-aligned.
        let ab = unsafe { core::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut u16, m * k) };
        for (i, row) in ab.chunks_exact_mut(k).enumerate() {
            // SAFETY: A's row readable per the contract; features present per ours.
            unsafe { round_row(a.ptr.wrapping_offset(i as isize * a.rs), a.cs, row) };
        }
        let ap = ab.as_ptr();
        macro_rules! block {
            ($r:literal, $cn:literal, $i:expr, $j:expr) => {{
                // SAFETY: rows i.. of the scratch and columns j.. of B are in bounds.
                let s = unsafe {
                    bf16_block::<$r, $cn>(
                        k,
                        ap.add($i * k),
                        k,
                        b.ptr.offset($j as isize * b.cs),
                        b.cs,
                    )
                };
                // SAFETY: C's block is writable per the contract.
                unsafe { store::<$r, $cn>(s, c, $i, $j, alpha, accumulate) };
            }};
        }
        drive!(m, n, k, block);
        Ok(())
    }

    /// `R` f32 rows of A (row stride `lda`, contiguous) against `CN` f16 columns of B.
    ///
    /// # Safety
    /// As [`bf16_block`]; AVX-512 F/BW/VL present.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn f16_block<const R: usize, const CN: usize>(
        k: usize,
        a: *const f32,
        lda: isize,
        b: *const u16,
        ldb: isize,
    ) -> [[f32; CN]; R] {
        let mut acc = [[_mm512_setzero_ps(); CN]; R];
        let mut p = 0;
        // SAFETY: (every load) inside the rows/columns per the contract; tails masked.
        unsafe {
            while p + 16 <= k {
                let mut av = [_mm512_setzero_ps(); R];
                for r in 0..R {
                    av[r] = _mm512_loadu_ps(a.offset(r as isize * lda).add(p));
                }
                for q in 0..CN {
                    let bv = _mm512_cvtph_ps(_mm256_loadu_si256(
                        b.offset(q as isize * ldb).add(p) as *const __m256i
                    ));
                    for r in 0..R {
                        acc[r][q] = _mm512_fmadd_ps(av[r], bv, acc[r][q]);
                    }
                }
                p += 16;
            }
            if p < k {
                let mask: __mmask16 = ((1u32 << (k - p)) - 1) as u16;
                let mut av = [_mm512_setzero_ps(); R];
                for r in 0..R {
                    av[r] = _mm512_maskz_loadu_ps(mask, a.offset(r as isize * lda).add(p));
                }
                for q in 0..CN {
                    let bv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                        mask,
                        b.offset(q as isize * ldb).add(p) as *const i16,
                    ));
                    for r in 0..R {
                        acc[r][q] = _mm512_fmadd_ps(av[r], bv, acc[r][q]);
                    }
                }
            }
        }
        // SAFETY: the features of this function.
        unsafe { reduce(acc) }
    }

    /// f16 `C = alpha·A·B`: B widened in registers, A in f32.
    ///
    /// # Safety
    /// As [`super::gemm_half`], with `b.rs == 1`; AVX-512 F/BW/VL present.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn f16(
        m: usize,
        n: usize,
        k: usize,
        a: Mat,
        b: HalfMat,
        c: Mat,
        alpha: f32,
        accumulate: bool,
        ws: &mut Workspace,
    ) -> Result<(), KernelError> {
        // A's rows contiguous (a copy in the scratch when they are strided).
        let (ap, lda) = if a.cs == 1 {
            (a.ptr as *const f32, a.rs)
        } else {
            let buf = ws.f32(0, m.saturating_mul(k))?;
            for (i, row) in buf.chunks_exact_mut(k).enumerate() {
                // SAFETY: A's row readable per the contract; `buf` is distinct scratch.
                unsafe {
                    crate::strided::gather_into(a.ptr.wrapping_offset(i as isize * a.rs), a.cs, row)
                };
            }
            (buf.as_ptr(), k as isize)
        };
        macro_rules! block {
            ($r:literal, $cn:literal, $i:expr, $j:expr) => {{
                // SAFETY: rows i.. of A and columns j.. of B are in bounds.
                let s = unsafe {
                    f16_block::<$r, $cn>(
                        k,
                        ap.wrapping_offset($i as isize * lda),
                        lda,
                        b.ptr.offset($j as isize * b.cs),
                        b.cs,
                    )
                };
                // SAFETY: C's block is writable per the contract.
                unsafe { store::<$r, $cn>(s, c, $i, $j, alpha, accumulate) };
            }};
        }
        drive!(m, n, k, block);
        Ok(())
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    #[test]
    fn hsum16_sums_each_vector_in_order() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        use core::arch::x86_64::*;
        let vals: Vec<[f32; 16]> = (0..16)
            .map(|i| core::array::from_fn(|j| (i * 100 + j) as f32))
            .collect();
        #[target_feature(enable = "avx512f")]
        unsafe fn run(vals: &[[f32; 16]]) -> [f32; 16] {
            let mut v = [_mm512_setzero_ps(); 16];
            for i in 0..16 {
                // SAFETY: 16 readable floats.
                v[i] = unsafe { _mm512_loadu_ps(vals[i].as_ptr()) };
            }
            // SAFETY: the features of this function.
            unsafe { super::avx512::hsum16(v) }
        }
        // SAFETY: AVX-512F detected above.
        let got = unsafe { run(&vals) };
        let want: Vec<f32> = vals.iter().map(|v| v.iter().sum()).collect();
        assert_eq!(got.to_vec(), want);
    }
}
