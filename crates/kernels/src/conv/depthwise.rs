//! Depthwise `Conv` (one input and one output channel per group) on AVX-512F: each output
//! row in strips of 16 columns, every tap a broadcast weight times one masked load of the
//! input row (column stride 1), or two masked loads and a permute picking the even elements
//! (stride 2); strips carry nothing from one to the next, so out-of-order execution overlaps
//! their FMA chains. Masked-off lanes — padding,
//! columns past the row — are never read, so the edges need no scalar pass. The bias starts
//! the sums and Relu is applied in registers; any other activation is the caller's.
//!
//! A square kernel (3×3, 5×5, 7×7: MobileNet's and EfficientNet's) takes [`square`]: every
//! output row reads exactly `K` input rows — rows above or below the image read a row of
//! zeros, as the columns left and right of it read masked-off (zero) lanes — so its taps
//! unroll completely and the channel's weights are broadcast once per channel. Other
//! heights take [`strips`], which loops over the rows inside the image.
//!
//! The generic direct path it replaces ran the 3×3 depthwise layer of 128 channels on 56×56
//! at 17 GFLOP/s (`cargo bench -p nrt-kernels --bench kernels -- conv`): it swept each tap
//! over a plane-sized accumulator in memory; [`strips`] at 26 GFLOP/s, [`square`] at 56–67
//! (output rows in pairs; 41–52 one at a time).

use crate::strided::View;
use crate::{KernelError, Workspace};

use super::Geo;
#[cfg(target_arch = "x86_64")]
use super::{load_strip, strip_table};

/// Whether this CPU runs the depthwise kernel, and the geometry suits it: one channel per
/// group in and out, unit-stride rows in and out, a horizontal stride of 1 or 2.
pub(super) fn applies(g: &Geo, vi: &View<f32>, vo: &View<f32>) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        g.cg == 1
            && g.og == 1
            && (g.sw == 1 || g.sw == 2)
            && matches!(g.kw, 3 | 5 | 7)
            && g.ow.div_ceil(16) * g.kw <= TABLE
            && g.kh <= ROWS
            && vi.stride[3] == 1
            && vo.stride[3] == 1
            && crate::cpu::avx512f()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (g, vi, vo);
        false
    }
}

/// The convolution of every image and channel; `relu` fused. `ws` holds a row of zeros for
/// a square kernel's taps above and below the image.
///
/// # Safety
/// As [`super::conv`]; [`applies`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn conv(
    g: &Geo,
    vi: &View<f32>,
    vw: &View<f32>,
    vo: &View<f32>,
    bias: Option<&View<f32>>,
    relu: bool,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    if g.kh == g.kw {
        let zeros = ws.f32(0, g.w)?;
        zeros.fill(0.0);
        let zeros = zeros.as_ptr();
        // SAFETY: forwarded; a square kernel 3, 5 or 7 wide, the stride 1 or 2 (`applies`);
        // `zeros` holds a row of W zeros.
        unsafe {
            match (g.sw, g.kw) {
                (1, 3) => square::<1, 3>(g, vi, vw, vo, bias, relu, zeros),
                (1, 5) => square::<1, 5>(g, vi, vw, vo, bias, relu, zeros),
                (1, _) => square::<1, 7>(g, vi, vw, vo, bias, relu, zeros),
                (_, 3) => square::<2, 3>(g, vi, vw, vo, bias, relu, zeros),
                (_, 5) => square::<2, 5>(g, vi, vw, vo, bias, relu, zeros),
                (_, _) => square::<2, 7>(g, vi, vw, vo, bias, relu, zeros),
            }
        }
        return Ok(());
    }
    // SAFETY: forwarded; the stride is 1 or 2 and the kernel 3, 5 or 7 wide (`applies`).
    unsafe {
        match (g.sw, g.kw) {
            (1, 3) => strips::<1, 3>(g, vi, vw, vo, bias, relu),
            (1, 5) => strips::<1, 5>(g, vi, vw, vo, bias, relu),
            (1, _) => strips::<1, 7>(g, vi, vw, vo, bias, relu),
            (_, 3) => strips::<2, 3>(g, vi, vw, vo, bias, relu),
            (_, 5) => strips::<2, 5>(g, vi, vw, vo, bias, relu),
            (_, _) => strips::<2, 7>(g, vi, vw, vo, bias, relu),
        }
    }
    Ok(())
}

/// Largest strips × tap columns of the per-call table of lane masks and offsets (a stack
/// array; wider rows or kernels take the generic path).
const TABLE: usize = 256;
/// Largest kernel height (rows of input per output row).
const ROWS: usize = 32;

/// [`conv`] for the horizontal stride `SW` and a kernel `KW` wide: the tap columns unroll
/// into `KW` independent accumulator chains (a loop over a run-time width with one chain
/// spent ~25 instructions a tap and ran at 14–17 GFLOP/s).
///
/// # Safety
/// As [`conv`]; `g.kw == KW`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn strips<const SW: usize, const KW: usize>(
    g: &Geo,
    vi: &View<f32>,
    vw: &View<f32>,
    vo: &View<f32>,
    bias: Option<&View<f32>>,
    relu: bool,
) {
    use core::arch::x86_64::*;
    let zero = _mm512_setzero_ps();
    let nstrips = g.ow.div_ceil(16);
    // Per strip and tap column, once for the whole call (the same for every row and
    // channel): the input column of lane 0 and the lanes whose column is inside the row (and
    // the output's). The loop below then does a load and an FMA per tap, nothing else.
    let mut table = [(0isize, 0u32); TABLE];
    strip_table(g, SW, KW, &mut table);
    let mut rows = [(core::ptr::null::<f32>(), 0usize); ROWS];
    for n in 0..g.n {
        for c in 0..g.groups {
            // SAFETY: the bias has O = groups elements.
            let vb = _mm512_set1_ps(bias.map_or(0.0, |b| unsafe { *b.at([0, 0, 0, c]) }));
            let wc = vw.at([c, 0, 0, 0]);
            let (ws2, ws3) = (vw.stride[2], vw.stride[3]);
            for oy in 0..g.oh {
                // The input rows this output row reads (those inside the image) and their
                // kernel rows.
                let mut nr = 0;
                for ky in 0..g.kh {
                    let iy = (oy * g.sh + ky * g.dh) as isize - g.pt as isize;
                    if iy >= 0 && iy < g.h as isize {
                        rows[nr] = (vi.at([n, c, iy as usize, 0]) as *const f32, ky);
                        nr += 1;
                    }
                }
                let out = vo.at([n, c, oy, 0]);
                // Each strip is its own chain of FMAs (nothing carries from one to the next),
                // so out-of-order execution overlaps consecutive strips.
                for s in 0..nstrips {
                    let taps: &[(isize, u32); KW] = table[s * KW..(s + 1) * KW]
                        .try_into()
                        .expect("KW taps a strip");
                    let mut accs = [zero; KW];
                    accs[0] = vb;
                    for &(row, ky) in &rows[..nr] {
                        let wr = wc.wrapping_offset(ky as isize * ws2);
                        for kx in 0..KW {
                            let (ix, mask) = taps[kx];
                            let p = row.wrapping_offset(ix);
                            // SAFETY: only `mask` lanes are read, whose input columns lie
                            // inside the row (the table); the weight has [O, 1, KH, KW].
                            unsafe {
                                let v = load_strip::<SW>(p, mask);
                                let wv = _mm512_set1_ps(*wr.wrapping_offset(kx as isize * ws3));
                                accs[kx] = _mm512_fmadd_ps(wv, v, accs[kx]);
                            }
                        }
                    }
                    let mut acc = accs[0];
                    for a in &accs[1..] {
                        acc = _mm512_add_ps(acc, *a);
                    }
                    let live = ((1u32 << (g.ow - 16 * s).min(16)) - 1) as u16;
                    // The second operand when either is NaN: NaN stays, as elsewhere.
                    let v = if relu { _mm512_max_ps(zero, acc) } else { acc };
                    // SAFETY: the `live` lanes are output columns of row oy.
                    unsafe { _mm512_mask_storeu_ps(out.add(16 * s), live, v) };
                }
            }
        }
    }
}

/// [`strips`] for a square `K×K` kernel (MobileNet's and EfficientNet's depthwise layers):
/// every output row reads exactly `K` input rows — a row above or below the image reads
/// `zeros` — so the taps unroll completely, and the channel's `K·K` weights are broadcast
/// once per channel instead of once per tap and strip (for `K = 3` they stay in registers).
/// At vertical dilation 1 two output rows go together ([`strip_rows`]): their `K + stride`
/// input rows are loaded once, a shared row's load feeding both rows' FMAs (3×3 over
/// 128×56×56: 170 → 99–114 µs; 5×5 over 240×28×28: 186 → 118–129 µs; 3×3 stride 2 over
/// 96×112×112: 230–244 → 176–202 µs).
/// The generic loop over the rows inside the image, with its run-time trip count, spent most
/// of its instructions on loop and address bookkeeping: 3×3 over 128 channels of 56×56 ran
/// at 24 GFLOP/s.
///
/// # Safety
/// As [`conv`]; `g.kh == g.kw == K`; `zeros` readable for `g.w` floats, all zero.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn square<const SW: usize, const K: usize>(
    g: &Geo,
    vi: &View<f32>,
    vw: &View<f32>,
    vo: &View<f32>,
    bias: Option<&View<f32>>,
    relu: bool,
    zeros: *const f32,
) {
    use core::arch::x86_64::*;
    let nstrips = g.ow.div_ceil(16);
    let mut table = [(0isize, 0u32); TABLE];
    strip_table(g, SW, K, &mut table);
    let (ws2, ws3) = (vw.stride[2], vw.stride[3]);
    for n in 0..g.n {
        for c in 0..g.groups {
            // SAFETY: the bias has O = groups elements.
            let vb = _mm512_set1_ps(bias.map_or(0.0, |b| unsafe { *b.at([0, 0, 0, c]) }));
            let wc = vw.at([c, 0, 0, 0]);
            let wv: [[__m512; K]; K] = core::array::from_fn(|ky| {
                core::array::from_fn(|kx| {
                    let at = wc.wrapping_offset(ky as isize * ws2 + kx as isize * ws3);
                    // SAFETY: tap (ky, kx) of channel c's weights: the weight has [O, 1, K, K].
                    _mm512_set1_ps(unsafe { *at })
                })
            });
            // Two output rows at a time where they share input rows (vertical dilation 1,
            // stride 1 or 2): K + stride rows feed both, the shared ones loaded once.
            let pairs = g.dh == 1 && (g.sh == 1 || g.sh == 2);
            let mut oy = 0;
            while oy < g.oh {
                let r = if pairs && oy + 1 < g.oh { 2 } else { 1 };
                // Input row of tap row `t` of output row oy (the pair's second output row
                // reads rows sh..sh + K of these).
                let mut rows = [zeros; MAX_K + 2];
                for (t, row) in rows.iter_mut().enumerate().take(K + (r - 1) * g.sh) {
                    let iy = (oy * g.sh + t * g.dh) as isize - g.pt as isize;
                    if iy >= 0 && iy < g.h as isize {
                        *row = vi.at([n, c, iy as usize, 0]) as *const f32;
                    }
                }
                let out = vo.at([n, c, oy, 0]);
                let next = out.wrapping_offset(vo.stride[2]);
                for s in 0..nstrips {
                    let taps: &[(isize, u32); K] = table[s * K..(s + 1) * K]
                        .try_into()
                        .expect("K taps a strip");
                    let live = ((1u32 << (g.ow - 16 * s).min(16)) - 1) as u16;
                    // SAFETY: the rows are input rows of the image or `zeros`; the outputs
                    // are rows oy (and oy + 1 when r = 2) of the output, `live` lanes at
                    // column 16·s.
                    unsafe {
                        if r == 2 && g.sh == 2 {
                            strip_rows::<SW, 2, K, 2>(
                                &rows,
                                taps,
                                &wv,
                                vb,
                                relu,
                                [out.add(16 * s), next.add(16 * s)],
                                live,
                            );
                        } else if r == 2 {
                            strip_rows::<SW, 1, K, 2>(
                                &rows,
                                taps,
                                &wv,
                                vb,
                                relu,
                                [out.add(16 * s), next.add(16 * s)],
                                live,
                            );
                        } else {
                            strip_rows::<SW, 1, K, 1>(
                                &rows,
                                taps,
                                &wv,
                                vb,
                                relu,
                                [out.add(16 * s)],
                                live,
                            );
                        }
                    }
                }
                oy += r;
            }
        }
    }
}

/// Largest square kernel of [`square`].
#[cfg(target_arch = "x86_64")]
const MAX_K: usize = 7;

/// One strip of 16 columns of `R` consecutive output rows at vertical stride `SH` (dilation
/// 1 when `R = 2`): input row `t` (`rows[t]`, `t < K + (R − 1)·SH`) is loaded once per tap
/// column and feeds kernel row `t − o·SH` of every output row `o` it falls under.
///
/// # Safety
/// `rows[..K + (R − 1)·SH]` readable where the taps' masks select; `outs` writable for the
/// `live` lanes; AVX-512F present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn strip_rows<const SW: usize, const SH: usize, const K: usize, const R: usize>(
    rows: &[*const f32; MAX_K + 2],
    taps: &[(isize, u32); K],
    wv: &[[core::arch::x86_64::__m512; K]; K],
    vb: core::arch::x86_64::__m512,
    relu: bool,
    outs: [*mut f32; R],
    live: u16,
) {
    use core::arch::x86_64::*;
    let zero = _mm512_setzero_ps();
    let mut accs = [[zero; K]; R];
    for a in &mut accs {
        a[0] = vb;
    }
    for (t, &row) in rows.iter().enumerate().take(K + (R - 1) * SH) {
        for (kx, &(ix, mask)) in taps.iter().enumerate() {
            // SAFETY: only `mask` lanes are read, whose input columns lie inside the row
            // (the table), of the image or of `zeros`.
            let v = unsafe { load_strip::<SW>(row.wrapping_offset(ix), mask) };
            for (o, a) in accs.iter_mut().enumerate() {
                if t >= o * SH && t - o * SH < K {
                    a[kx] = _mm512_fmadd_ps(wv[t - o * SH][kx], v, a[kx]);
                }
            }
        }
    }
    for (a, out) in accs.iter().zip(outs) {
        let mut acc = a[0];
        for x in &a[1..] {
            acc = _mm512_add_ps(acc, *x);
        }
        let v = if relu { _mm512_max_ps(zero, acc) } else { acc };
        // SAFETY: per the contract.
        unsafe { _mm512_mask_storeu_ps(out, live, v) };
    }
}

/// Never called: [`applies`] is false off x86-64.
///
/// # Safety
/// Unreachable.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn conv(
    _: &Geo,
    _: &View<f32>,
    _: &View<f32>,
    _: &View<f32>,
    _: Option<&View<f32>>,
    _: bool,
    _: &mut Workspace,
) -> Result<(), KernelError> {
    unreachable!("the depthwise kernel needs AVX-512F")
}
