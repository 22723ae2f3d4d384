//! `Pool`: max and average pooling windows over `[N, C, H, W]`, with padding, stride and
//! dilation.
//!
//! For each output row the window is swept tap by tap: for a tap `(ky, kx)` the output
//! columns whose input column falls inside the image form one contiguous range, computed
//! once, so the inner loop has no bounds checks (and vectorizes when the stride is 1). Padded
//! cells never take part in a max; an average divides by the whole window
//! (`count_include_pad`) or by the number of cells inside the image. A global pool (the
//! window is the whole unpadded image) sums each plane directly.

use crate::Execute;
use crate::strided::View;
use crate::{DeviceMemory, KernelError, Workspace};
use nrt_hal::tuning::KERNEL_POOL_VECTOR_MAX_KW;
use nrt_isa::op;
use nrt_isa::{AccessPattern, PoolOp, Window};

/// The range of output positions `o ∈ [0, out)` whose input position
/// `o·stride + tap − pad` lies in `[0, len)`.
#[inline]
pub(crate) fn valid_range(
    out: usize,
    len: usize,
    stride: usize,
    tap: usize,
    pad: usize,
) -> (usize, usize) {
    // o·stride ≥ pad − tap  and  o·stride ≤ len − 1 + pad − tap.
    let lo = if pad > tap {
        (pad - tap).div_ceil(stride)
    } else {
        0
    };
    let hi = if len + pad > tap {
        ((len - 1 + pad - tap) / stride + 1).min(out)
    } else {
        0
    };
    (lo.min(hi), hi)
}

#[inline(always)]
fn nan_max(a: f32, x: f32) -> f32 {
    #[allow(clippy::eq_op)]
    if x > a || x != x { x } else { a }
}

/// Executes `Op::Pool`.
///
/// # Safety
/// Operands inside `mem`, aligned to 4 bytes.
pub unsafe fn pool(
    input: &AccessPattern,
    output: &AccessPattern,
    w: &Window,
    op: PoolOp,
    count_include_pad: bool,
    mem: DeviceMemory,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    let vi = View::<f32>::new(input, mem);
    let vo = View::<f32>::new(output, mem);
    if vo.elements() == 0 {
        return Ok(());
    }
    let [_, _, h, wd] = vi.shape;
    let [nn, cc, oh, ow] = vo.shape;
    let [kh, kw] = w.kernel.map(|v| v as usize);
    let [sh, sw] = w.stride.map(|v| v as usize);
    let [dh, dw] = w.dilation.map(|v| v as usize);
    let [pt, pl, pb, pr] = w.pad.map(|v| v as usize);
    let global = oh == 1 && ow == 1 && kh == h && kw == wd && pt + pl + pb + pr == 0;
    let fast_2x2 = [kh, kw, sh, sw] == [2, 2, 2, 2]
        && [dh, dw] == [1, 1]
        && pt + pl + pb + pr == 0
        && 2 * oh <= h
        && 2 * ow <= wd
        && vi.stride[3] == 1
        && vo.stride[3] == 1;
    #[cfg(target_arch = "x86_64")]
    if fast_2x2 && ow >= 16 && crate::cpu::avx512f() {
        // SAFETY: AVX-512F detected just above; the `fast_2x2` conditions hold.
        unsafe { pool_2x2_avx512(&vi, &vo, op) };
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if !global
        && !fast_2x2
        && matches!(sw, 1 | 2)
        && dw == 1
        && kw <= KERNEL_POOL_VECTOR_MAX_KW
        && vi.stride[3] == 1
        && vo.stride[3] == 1
        && crate::has_avx512()
    {
        // The output columns each horizontal tap reaches (they do not depend on the row).
        let mut ranges = [0u64; KERNEL_POOL_VECTOR_MAX_KW];
        for (kx, r) in ranges.iter_mut().enumerate().take(kw) {
            let (lo, hi) = valid_range(ow, wd, sw, kx, pl);
            *r = lo as u64 | (hi as u64) << 32;
        }
        // Past the row, 32 floats of slack: a masked load's masked-off lanes may reach them,
        // and they must lie in mapped memory (on this CPU a masked load whose masked-off
        // lanes cross into an unmapped page takes a microcode assist: 3×3 stride-2 over
        // 64×111×111 ran 1.4–3.3 ms with the slice ending at the row's end, 0.23–0.27 ms
        // with the slack).
        let buf = ws.f32(0, wd + 32)?;
        // SAFETY: AVX-512F detected; unit-stride rows, stride 1 or 2, no horizontal
        // dilation (checked just above); `ranges` holds each tap's valid output columns;
        // `buf` holds the input's width.
        unsafe { pool_strips_avx512(&vi, &vo, w, op, count_include_pad, &ranges[..kw], buf) };
        return Ok(());
    }
    let (acc, cnt) = ws.f32x2(ow, ow)?;
    let win = (kh * kw) as f32;
    for n in 0..nn {
        for c in 0..cc {
            if global {
                let (s, m) = if vi.stride[3] == 1 && vi.stride[2] == wd as isize {
                    // A contiguous plane: one slice, summed in lanes (vectorized).
                    // SAFETY: the plane's h·w elements are contiguous inside the input.
                    let xs = unsafe { core::slice::from_raw_parts(vi.at([n, c, 0, 0]), h * wd) };
                    plane_sum_max(xs)
                } else {
                    let (mut s, mut m) = (0.0f32, f32::NEG_INFINITY);
                    for iy in 0..h {
                        for ix in 0..wd {
                            // SAFETY: inside the input plane.
                            let x = unsafe { *vi.at([n, c, iy, ix]) };
                            s += x;
                            m = nan_max(m, x);
                        }
                    }
                    (s, m)
                };
                let v = match op {
                    PoolOp::Max => m,
                    PoolOp::Avg => s / win,
                };
                // SAFETY: the output element exists.
                unsafe { vo.at([n, c, 0, 0]).write(v) };
                continue;
            }
            if fast_2x2 {
                // 2×2 windows, stride 2, entirely inside the image (the usual downsampling
                // pool): each output is a function of four inputs, written once, so the row
                // vectorizes without the tap-by-tap accumulators.
                for oy in 0..oh {
                    // SAFETY: rows 2·oy and 2·oy + 1 exist (2·oh ≤ h) and hold columns
                    // 0..2·ow (2·ow ≤ w, unit stride); the output row holds ow columns.
                    let (r0, r1, out) = unsafe {
                        (
                            core::slice::from_raw_parts(vi.at([n, c, 2 * oy, 0]), 2 * ow),
                            core::slice::from_raw_parts(vi.at([n, c, 2 * oy + 1, 0]), 2 * ow),
                            core::slice::from_raw_parts_mut(vo.at([n, c, oy, 0]), ow),
                        )
                    };
                    pool_2x2_row(r0, r1, out, op);
                }
                continue;
            }
            for oy in 0..oh {
                let init = match op {
                    PoolOp::Max => f32::NEG_INFINITY,
                    PoolOp::Avg => 0.0,
                };
                acc.fill(init);
                cnt.fill(0.0);
                for ky in 0..kh {
                    let iy = (oy * sh + ky * dh) as isize - pt as isize;
                    if iy < 0 || iy >= h as isize {
                        continue;
                    }
                    let row = vi.at([n, c, iy as usize, 0]);
                    let rs = vi.stride[3];
                    for kx in 0..kw {
                        let (lo, hi) = valid_range(ow, wd, sw, kx * dw, pl);
                        if lo >= hi {
                            continue;
                        }
                        // Input column of output column `lo`.
                        let ix0 = (lo * sw + kx * dw - pl) as isize;
                        let (a, k) = (&mut acc[lo..hi], &mut cnt[lo..hi]);
                        if sw == 1 && rs == 1 {
                            // SAFETY: columns ix0..ix0+len lie inside the row.
                            let xs =
                                unsafe { core::slice::from_raw_parts(row.offset(ix0), hi - lo) };
                            match op {
                                PoolOp::Max => {
                                    for (a, x) in a.iter_mut().zip(xs) {
                                        *a = nan_max(*a, *x);
                                    }
                                }
                                PoolOp::Avg => {
                                    for ((a, k), x) in a.iter_mut().zip(k.iter_mut()).zip(xs) {
                                        *a += *x;
                                        *k += 1.0;
                                    }
                                }
                            }
                        } else if sw == 2 && rs == 1 {
                            // Stride 2 (the usual downsampling window): the taps are the even
                            // elements of one contiguous run, read as pairs so the loop
                            // vectorizes; the last tap is read alone (its pair partner may lie
                            // past the row).
                            let len = hi - lo;
                            // SAFETY: columns ix0..ix0+2(len−1) lie inside the row.
                            let xs = unsafe {
                                core::slice::from_raw_parts(row.offset(ix0), 2 * len - 1)
                            };
                            let (pairs, last) = xs.split_at(2 * (len - 1));
                            let (a_body, a_last) = a.split_at_mut(len - 1);
                            let (k_body, k_last) = k.split_at_mut(len - 1);
                            match op {
                                PoolOp::Max => {
                                    for (a, p) in a_body.iter_mut().zip(pairs.chunks_exact(2)) {
                                        *a = nan_max(*a, p[0]);
                                    }
                                    a_last[0] = nan_max(a_last[0], last[0]);
                                }
                                PoolOp::Avg => {
                                    for ((a, k), p) in a_body
                                        .iter_mut()
                                        .zip(k_body.iter_mut())
                                        .zip(pairs.chunks_exact(2))
                                    {
                                        *a += p[0];
                                        *k += 1.0;
                                    }
                                    a_last[0] += last[0];
                                    k_last[0] += 1.0;
                                }
                            }
                        } else {
                            let step = sw as isize * rs;
                            for (j, (a, k)) in a.iter_mut().zip(k.iter_mut()).enumerate() {
                                // SAFETY: column ix0 + j·sw lies inside the row.
                                let x = unsafe { *row.offset(ix0 * rs + j as isize * step) };
                                match op {
                                    PoolOp::Max => *a = nan_max(*a, x),
                                    PoolOp::Avg => {
                                        *a += x;
                                        *k += 1.0;
                                    }
                                }
                            }
                        }
                    }
                }
                for ox in 0..ow {
                    let v = match op {
                        PoolOp::Max => acc[ox],
                        PoolOp::Avg if count_include_pad => acc[ox] / win,
                        PoolOp::Avg => acc[ox] / cnt[ox],
                    };
                    // SAFETY: the output element exists.
                    unsafe { vo.at([n, c, oy, ox]).write(v) };
                }
            }
        }
    }
    Ok(())
}

/// Every output of a pool with horizontal stride 1 or 2 and no horizontal dilation over
/// unit-stride rows, separably: per output row, first the valid input rows combined column
/// by column into `buf` (16 columns a vector), then each output's horizontal taps from
/// `buf`, 16 outputs at a time in registers — one load per tap (two and a permute of the
/// even elements at stride 2), plain in the interior, masked at the edges (lanes whose
/// input column lies outside the image masked off, and not counted). A 3×3 window costs
/// 3 + 3 loads per 16 outputs instead of 9 (the tap-by-tap portable loop, accumulators in
/// memory, took ~0.5 ms for SqueezeNet's 3×3 stride-2 pool over 64×111×111).
///
/// A max is `vmaxps` (a short dependency chain) with NaNs set aside: a lane that met one
/// gives a NaN (the last it met; the portable `nan_max` keeps the first — the same unless a
/// window holds NaNs of different payloads). An average sums rows first, then columns (the
/// portable path sums tap by tap: the last bits may differ) and divides by the window or by
/// the valid rows × valid columns.
///
/// # Safety
/// AVX-512F present; `vi`, `vo` inside device memory with unit column strides; `w`'s
/// horizontal stride 1 or 2 and dilation 1; `ranges[kx]` the valid output columns of tap
/// `kx` (`valid_range`: `lo | hi << 32`) for every `kx < kernel[1]`; `buf` holds at least
/// the input's width.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pool_strips_avx512(
    vi: &View<f32>,
    vo: &View<f32>,
    w: &Window,
    op: PoolOp,
    count_include_pad: bool,
    ranges: &[u64],
    buf: &mut [f32],
) {
    use core::arch::x86_64::*;
    let [_, _, h, wd] = vi.shape;
    let [nn, cc, oh, ow] = vo.shape;
    let [kh, kw] = w.kernel.map(|v| v as usize);
    let [sh, sw] = w.stride.map(|v| v as usize);
    let dh = w.dilation[0] as usize;
    let [pt, pl, _, _] = w.pad.map(|v| v as usize);
    assert!(ranges.len() >= kw && matches!(sw, 1 | 2) && buf.len() >= wd);
    let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let init = _mm512_set1_ps(match op {
        PoolOp::Max => f32::NEG_INFINITY,
        PoolOp::Avg => 0.0,
    });
    let (one, win) = (_mm512_set1_ps(1.0), _mm512_set1_ps((kh * kw) as f32));
    // The strips whose every tap is inside the row: from the first column every tap reaches
    // (tap 0's, the latest to start) to the last the widest tap reaches (tap kw − 1's, the
    // first to end) — and at stride 2 the 32nd element loaded must exist too.
    let interior = match (ranges.first(), ranges.last()) {
        (Some(&first), Some(&last)) => {
            let lo = (first & 0xffff_ffff) as usize;
            let mut hi = (last >> 32) as usize;
            if sw == 2 {
                // The last tap loads elements 2·x0 + kw − 1 − pl ..= that + 31, all below
                // wd: x0 ≤ (wd + pl − kw − 31) / 2.
                hi = hi.min((wd + pl).checked_sub(kw + 31).map_or(0, |d| d / 2 + 16));
            }
            (lo, hi)
        }
        _ => (1, 0),
    };
    use crate::lanes_below;
    // `max` with NaNs set aside: `max_ps(x, acc)` is `x > acc ? x : acc` (acc for a NaN).
    let combine = |acc: &mut __m512, nans: &mut __m512, nan_lanes: &mut __mmask16, m, x| match op {
        PoolOp::Max => {
            *acc = _mm512_mask_max_ps(*acc, m, x, *acc);
            let isnan = _mm512_mask_cmp_ps_mask::<_CMP_UNORD_Q>(m, x, x);
            *nans = _mm512_mask_mov_ps(*nans, isnan, x);
            *nan_lanes |= isnan;
        }
        PoolOp::Avg => *acc = _mm512_mask_add_ps(*acc, m, *acc, x),
    };
    let bp = buf.as_mut_ptr();
    for n in 0..nn {
        for c in 0..cc {
            for oy in 0..oh {
                // 1. The valid rows of the window, combined column by column into `buf`.
                let mut rows = 0usize;
                for x in (0..wd).step_by(16) {
                    // Whole vectors only where the row has 16 columns: the last one ends at
                    // the row's end (overlapping the one before; it writes the same values),
                    // so the pass has no masked loads and stores.
                    let (x0, m) = if wd < 16 {
                        (0, lanes_below(wd))
                    } else {
                        (x.min(wd - 16), !0)
                    };
                    let (mut acc, mut nans, mut nan_lanes) = (init, init, 0 as __mmask16);
                    rows = 0;
                    for ky in 0..kh {
                        let iy = (oy * sh + ky * dh) as isize - pt as isize;
                        if iy < 0 || iy >= h as isize {
                            continue;
                        }
                        rows += 1;
                        // SAFETY: columns x0.. under the mask lie inside row iy.
                        let x = unsafe {
                            let p = vi.at([n, c, iy as usize, x0]);
                            if m == !0 {
                                _mm512_loadu_ps(p)
                            } else {
                                _mm512_maskz_loadu_ps(m, p)
                            }
                        };
                        combine(&mut acc, &mut nans, &mut nan_lanes, m, x);
                    }
                    let v = _mm512_mask_mov_ps(acc, nan_lanes, nans);
                    // SAFETY: `buf` holds wd ≥ x0 + lanes floats.
                    unsafe {
                        if m == !0 {
                            _mm512_storeu_ps(bp.add(x0), v)
                        } else {
                            _mm512_mask_storeu_ps(bp.add(x0), m, v)
                        }
                    };
                }
                // 2. Each output's horizontal taps over `buf`.
                let o = vo.at([n, c, oy, 0]);
                let nrows = _mm512_set1_ps(rows as f32);
                for x0 in (0..ow).step_by(16) {
                    let (mut acc, mut cnt) = (init, _mm512_setzero_ps());
                    let (mut nans, mut nan_lanes) = (init, 0 as __mmask16);
                    if x0 >= interior.0 && x0 + 16 <= interior.1 {
                        // Every tap's 16 lanes (and at stride 2 all 32 elements loaded)
                        // lie inside the row: plain loads, no lane masks.
                        let p0 = bp.wrapping_add(x0 * sw - pl);
                        for kx in 0..kw {
                            let p = p0.wrapping_add(kx);
                            // SAFETY: the interior's bounds put the 16·sw floats from `p`
                            // inside `buf`'s first wd.
                            let x = unsafe {
                                if sw == 1 {
                                    _mm512_loadu_ps(p)
                                } else {
                                    let (lo16, hi16) =
                                        (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
                                    _mm512_permutex2var_ps(lo16, evens, hi16)
                                }
                            };
                            combine(&mut acc, &mut nans, &mut nan_lanes, !0, x);
                        }
                        cnt = _mm512_set1_ps(kw as f32);
                    } else {
                        for (kx, &r) in ranges.iter().enumerate().take(kw) {
                            // The lanes (output columns x0 + l) whose input column lies
                            // inside the row: a contiguous run [la, lb).
                            let (lo, hi) = ((r & 0xffff_ffff) as usize, (r >> 32) as usize);
                            let (la, lb) = (lo.max(x0), hi.min(x0 + 16));
                            if la >= lb {
                                continue;
                            }
                            let (la, lb) = (la - x0, lb - x0);
                            let lanes = lanes_below(lb) & !lanes_below(la);
                            // Input column of lane 0 (negative when it lies in the padding).
                            let base = (x0 * sw + kx) as isize - pl as isize;
                            let p = bp.wrapping_offset(base);
                            // SAFETY: only elements of valid lanes are read (masked loads),
                            // and those lie inside `buf`'s first wd (`valid_range`).
                            let x = unsafe {
                                if sw == 1 {
                                    _mm512_maskz_loadu_ps(lanes, p)
                                } else {
                                    // Elements 2·la ..= 2·(lb − 1) of the 32 from `p`: one
                                    // contiguous mask (the odd ones between lie inside the
                                    // row too), the evens kept by the permute.
                                    let span = (((1u64 << (2 * lb - 1)) - 1)
                                        & !((1u64 << (2 * la)) - 1))
                                        as u32;
                                    let lo16 = _mm512_maskz_loadu_ps(span as __mmask16, p);
                                    let hi16 = if span >> 16 == 0 {
                                        _mm512_setzero_ps()
                                    } else {
                                        _mm512_maskz_loadu_ps(
                                            (span >> 16) as __mmask16,
                                            p.wrapping_add(16),
                                        )
                                    };
                                    _mm512_permutex2var_ps(lo16, evens, hi16)
                                }
                            };
                            combine(&mut acc, &mut nans, &mut nan_lanes, lanes, x);
                            cnt = _mm512_mask_add_ps(cnt, lanes, cnt, one);
                        }
                    }
                    let v = match op {
                        PoolOp::Max => _mm512_mask_mov_ps(acc, nan_lanes, nans),
                        PoolOp::Avg if count_include_pad => _mm512_div_ps(acc, win),
                        PoolOp::Avg => _mm512_div_ps(acc, _mm512_mul_ps(cnt, nrows)),
                    };
                    // SAFETY: columns x0 .. x0 + 16 (or fewer) of the output row exist.
                    unsafe { _mm512_mask_storeu_ps(o.add(x0), lanes_below(ow - x0), v) };
                }
            }
        }
    }
}

/// Every output of a 2×2 stride-2 pool (`fast_2x2` in [`pool`]) with AVX-512F: 16 outputs
/// per step (the two input rows combined, then the even and odd columns picked by two
/// permutes and combined), the rest of each row by [`pool_2x2_row`]; one call for the
/// whole tensor (the `cnn` sample's 16×32×32 max pool has 256 rows of 16 outputs: per-row
/// dispatch cost as much as the pooling).
///
/// # Safety
/// AVX-512F present; `vi`, `vo` inside device memory, with the shapes and unit column
/// strides of `fast_2x2`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pool_2x2_avx512(vi: &View<f32>, vo: &View<f32>, op: PoolOp) {
    use core::arch::x86_64::*;
    let [nn, cc, oh, ow] = vo.shape;
    let body = ow / 16 * 16;
    let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odds = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    // `nan_max` lane-wise: `max_ps` returns its second operand when either is NaN, so a NaN
    // in `b` comes out; a NaN in `a` is put back with one compare and blend.
    let max = |a: __m512, b: __m512| {
        let m = _mm512_max_ps(a, b);
        _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a), a)
    };
    for n in 0..nn {
        for c in 0..cc {
            for oy in 0..oh {
                let (a0, a1) = (vi.at([n, c, 2 * oy, 0]), vi.at([n, c, 2 * oy + 1, 0]));
                let o = vo.at([n, c, oy, 0]);
                for i in (0..body).step_by(16) {
                    // SAFETY: rows 2·oy and 2·oy + 1 hold columns 0..2·ow (unit stride,
                    // 2·ow ≤ w), the output row ow columns (`fast_2x2`); i + 16 ≤ ow.
                    unsafe {
                        let (p0, p1) = (a0.add(2 * i), a1.add(2 * i));
                        let (lo0, hi0) = (_mm512_loadu_ps(p0), _mm512_loadu_ps(p0.add(16)));
                        let (lo1, hi1) = (_mm512_loadu_ps(p1), _mm512_loadu_ps(p1.add(16)));
                        let v = match op {
                            PoolOp::Max => {
                                let (lo, hi) = (max(lo0, lo1), max(hi0, hi1));
                                max(
                                    _mm512_permutex2var_ps(lo, evens, hi),
                                    _mm512_permutex2var_ps(lo, odds, hi),
                                )
                            }
                            PoolOp::Avg => {
                                // ((a0 + a1) + (b0 + b1))·0.25, the portable path's order.
                                let pairs = |lo, hi| {
                                    _mm512_add_ps(
                                        _mm512_permutex2var_ps(lo, evens, hi),
                                        _mm512_permutex2var_ps(lo, odds, hi),
                                    )
                                };
                                let s = _mm512_add_ps(pairs(lo0, hi0), pairs(lo1, hi1));
                                _mm512_mul_ps(s, _mm512_set1_ps(0.25))
                            }
                        };
                        _mm512_storeu_ps(o.add(i), v);
                    }
                }
                if body < ow {
                    // SAFETY: as above, the columns past the body.
                    let (r0, r1, out) = unsafe {
                        (
                            core::slice::from_raw_parts(a0.add(2 * body), 2 * (ow - body)),
                            core::slice::from_raw_parts(a1.add(2 * body), 2 * (ow - body)),
                            core::slice::from_raw_parts_mut(o.add(body), ow - body),
                        )
                    };
                    pool_2x2_row(r0, r1, out, op);
                }
            }
        }
    }
}

/// One output row of a 2×2 stride-2 pool from input rows `r0`, `r1` (`2·out.len()` columns
/// each): eight outputs per step from fixed-size arrays, which the compiler turns into
/// vector shuffles and blends; the remainder one by one.
#[inline]
fn pool_2x2_row(r0: &[f32], r1: &[f32], out: &mut [f32], op: PoolOp) {
    #[inline(always)]
    fn one(op: PoolOp, a0: f32, a1: f32, b0: f32, b1: f32) -> f32 {
        match op {
            PoolOp::Max => nan_max(nan_max(a0, a1), nan_max(b0, b1)),
            PoolOp::Avg => ((a0 + a1) + (b0 + b1)) * 0.25,
        }
    }
    let body = out.len() / 8 * 8;
    let (o_body, o_rest) = out.split_at_mut(body);
    for ((o, a), b) in o_body
        .chunks_exact_mut(8)
        .zip(r0.chunks_exact(16))
        .zip(r1.chunks_exact(16))
    {
        let (o, a, b): (&mut [f32; 8], &[f32; 16], &[f32; 16]) = (
            o.try_into().expect("chunk of 8"),
            a.try_into().expect("chunk of 16"),
            b.try_into().expect("chunk of 16"),
        );
        let mut v = [0.0f32; 8];
        for i in 0..8 {
            v[i] = one(op, a[2 * i], a[2 * i + 1], b[2 * i], b[2 * i + 1]);
        }
        *o = v;
    }
    for (j, o) in o_rest.iter_mut().enumerate() {
        let x = 2 * (body + j);
        *o = one(op, r0[x], r0[x + 1], r1[x], r1[x + 1]);
    }
}

/// Sum and NaN-propagating max of a contiguous plane, in 16 independent lanes (so the loop
/// vectorizes; the sum's rounding is that of a 16-way tree, like other vectorized runtimes').
fn plane_sum_max(xs: &[f32]) -> (f32, f32) {
    const L: usize = 16;
    let mut s = [0.0f32; L];
    let mut m = [f32::NEG_INFINITY; L];
    let chunks = xs.chunks_exact(L);
    let rest = chunks.remainder();
    for ch in chunks {
        for i in 0..L {
            s[i] += ch[i];
            m[i] = nan_max(m[i], ch[i]);
        }
    }
    let (mut sum, mut max) = (0.0f32, f32::NEG_INFINITY);
    for i in 0..L {
        sum += s[i];
        max = nan_max(max, m[i]);
    }
    for &x in rest {
        sum += x;
        max = nan_max(max, x);
    }
    (sum, max)
}

impl Execute for op::Pool {
    unsafe fn execute(&self, mem: DeviceMemory, ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::Pool {
            input,
            output,
            window,
            op,
            count_include_pad,
        } = self;

        // SAFETY: see above.
        unsafe { pool(input, output, window, *op, *count_include_pad, mem, ws) }
    }
}

#[cfg(test)]
mod tests {
    use super::valid_range;

    #[test]
    fn valid_ranges() {
        // Brute force against the definition.
        for out in 0..6 {
            for len in 1..6 {
                for stride in 1..4 {
                    for tap in 0..5 {
                        for pad in 0..4 {
                            let want: Vec<usize> = (0..out)
                                .filter(|&o| {
                                    let i = (o * stride + tap) as isize - pad as isize;
                                    i >= 0 && i < len as isize
                                })
                                .collect();
                            let (lo, hi) = valid_range(out, len, stride, tap, pad);
                            let got: Vec<usize> = (lo..hi).collect();
                            assert_eq!(got, want, "{out} {len} {stride} {tap} {pad}");
                        }
                    }
                }
            }
        }
    }
}
