//! `Conv` as im2col + the packed-B GEMM, a few panels of output pixels at a time (AVX-512F).
//!
//! For each image and group the output is the product `out[Og × OH·OW] = W[Og × K] ·
//! patches[K × OH·OW]` (`K = Cg·KH·KW`). The patch matrix is never built whole: a chunk of
//! 32-pixel panels of it (`K` rows of 32 floats each: the packed-B layout of
//! [`crate::gemm::packed`]) is unrolled into host scratch small enough to stay in L1
//! ([`KERNEL_CONV_PANEL_BYTES`]), then the packed GEMM's 14×32 register tiles multiply the
//! weight rows (read in place: an output channel's `K` weights are contiguous) into the output,
//! with the bias (per output channel: a per-row bias) and Relu applied in registers. The
//! earlier im2col path unrolled a cache-sized band of the patch matrix and handed it to the
//! general GEMM, which packed it again: 74 and 53 GFLOP/s on the `cnn` sample's two
//! convolutions (`cargo bench -p nrt-kernels --bench kernels -- conv`).
//!
//! Unrolling a panel: its 32 pixels are cut into segments by output row (a panel spans
//! several rows when OW < 32 or starts mid-row). For a segment and a tap (ky, kx), the lanes
//! whose input pixel lies inside the image form one mask; each input channel then costs, per
//! 16-lane half the segment touches, one masked load (column stride 1) or two masked loads
//! and a permute (stride 2: the even elements of 32), and one masked store of the segment's
//! lanes. Masked-off lanes are never read (AVX-512 suppresses their faults), so padding costs
//! nothing. Other
//! strides, or input rows that are not unit-stride, read lane by lane.

use crate::gemm::Mat;
use crate::gemm::packed::{
    Isa, Packed, TileEpilogue, copied_row_stride, gemm_packed_on, rows_alias,
};
use crate::strided::View;
use crate::{KernelError, Workspace};
use nrt_hal::tuning::{GEMM_PACK_NR, KERNEL_CONV_PANEL_BYTES};

use super::{Geo, ceil_div, even_span};

/// Whether this CPU runs the panel path.
pub(super) fn available() -> bool {
    Isa::Avx512.available()
}

/// The convolution of every image and group through panels; `relu` fused, any other
/// activation left to the caller.
///
/// # Safety
/// As [`super::conv`]; [`available`]; the weight's last three dimensions merge into one
/// unit-stride run of `K` (`vw.stride[3] == 1`); the output's planes flatten (`OH·OW` pixels
/// at stride `vo.stride[3]`); `g.og ≥ 1`, `g.cg ≥ 1`.
pub(super) unsafe fn conv(
    g: &Geo,
    vi: &View<f32>,
    vw: &View<f32>,
    vo: &View<f32>,
    bias: Option<&View<f32>>,
    relu: bool,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    let nr = GEMM_PACK_NR;
    let kk = g.cg * g.kh * g.kw;
    let hw = g.oh * g.ow;
    let panel = kk * nr;
    let per_chunk = (KERNEL_CONV_PANEL_BYTES / (panel * size_of::<f32>()).max(1)).max(1);
    // Panels start on a cache line: a 64-byte row store or load that straddles two lines
    // costs two (a masked one more), and the tiles load every panel row.
    // Weight rows a multiple of 4 KiB apart (K = 1024, 2048…: a DCGAN discriminator's 4×4
    // convolutions over 64, 128… channels) fall in one L1 set, and the tile's 14 rows evict
    // each other on every step of K (`gemm::packed::rows_alias`): they are copied once per
    // call, `K + 16` floats apart (4×4 64→128 on 32×32, stride 2: 96 → 150 GFLOP/s, as
    // fast as K = 960).
    let w_stride = vw.stride[0];
    let copy_weights = rows_alias(w_stride.unsigned_abs());
    let w_ld = if copy_weights {
        copied_row_stride(kk)
    } else {
        0
    };
    let (scratch, rb, wcopy) = ws.f32x3(
        per_chunk.saturating_mul(panel).saturating_add(15),
        g.og * g.groups,
        (g.og * g.groups).saturating_mul(w_ld),
    )?;
    if copy_weights {
        for (o, row) in wcopy.chunks_exact_mut(w_ld).enumerate() {
            // SAFETY: output channel `o`'s K weights are contiguous and readable (the
            // contract: the last three dimensions merge into one unit-stride run of K).
            let src = unsafe { core::slice::from_raw_parts(vw.at([o, 0, 0, 0]), kk) };
            row[..kk].copy_from_slice(src);
        }
    }
    let skew = scratch.as_ptr().align_offset(64).min(15);
    let scratch = &mut scratch[skew..skew + per_chunk * panel];
    if let Some(b) = bias {
        for (o, v) in rb.iter_mut().enumerate() {
            // SAFETY: the bias has O elements.
            *v = unsafe { *b.at([0, 0, 0, o]) };
        }
    }
    for n in 0..g.n {
        for grp in 0..g.groups {
            let a = if copy_weights {
                Mat {
                    ptr: wcopy[grp * g.og * w_ld..].as_ptr() as *mut f32,
                    rs: w_ld as isize,
                    cs: 1,
                }
            } else {
                Mat {
                    ptr: vw.at([grp * g.og, 0, 0, 0]),
                    rs: w_stride,
                    cs: 1,
                }
            };
            let epi = TileEpilogue {
                bias: core::ptr::null(),
                row_bias: if bias.is_some() {
                    rb[grp * g.og..].as_ptr()
                } else {
                    core::ptr::null()
                },
                relu,
            };
            let plane = vo.at([n, grp * g.og, 0, 0]);
            let mut q0 = 0;
            while q0 < hw {
                let cols = (per_chunk * nr).min(hw - q0);
                for (p, dst) in scratch
                    .chunks_exact_mut(panel)
                    .take(cols.div_ceil(nr))
                    .enumerate()
                {
                    let q = q0 + p * nr;
                    // SAFETY: forwarded contract; `dst` holds K rows of 32 floats; AVX-512F.
                    unsafe { fill_panel(g, vi, n, grp * g.cg, q, (hw - q).min(nr), dst) };
                }
                let c = Mat {
                    ptr: plane.wrapping_offset(q0 as isize * vo.stride[3]),
                    rs: vo.stride[1],
                    cs: vo.stride[3],
                };
                // SAFETY: A is this group's Og weight rows of K contiguous floats; the panels
                // hold `cols` columns (the last zero-padded to 32); C is the group's Og output
                // channels at pixels q0..q0 + cols; the row bias has Og floats from the
                // group's first channel; AVX-512F present (`available`).
                unsafe {
                    gemm_packed_on(
                        Isa::Avx512,
                        g.og,
                        cols,
                        kk,
                        a,
                        Packed {
                            ptr: scratch.as_ptr(),
                            nr,
                            panel_stride: panel as isize,
                        },
                        c,
                        1.0,
                        false,
                        epi,
                    )
                };
                q0 += cols;
            }
        }
    }
    Ok(())
}

/// Lanes `lo..hi` (`lo ≤ hi ≤ 32`) of a panel row as a mask.
#[inline(always)]
fn lanes32(lo: usize, hi: usize) -> u32 {
    ((((1u64 << hi) - 1) & !((1u64 << lo) - 1)) & 0xFFFF_FFFF) as u32
}

/// Unrolls the patches of output pixels `q0..q0 + cols` (`cols ≤ 32`) of image `n`, input
/// channels `c0..c0 + Cg`, into one panel: row `(c·KH + ky)·KW + kx` holds, for each pixel, the
/// input element its tap reads (0 in the padding); columns past `cols` are 0.
///
/// # Safety
/// The input view inside device memory; `dst` holds `K·32` floats; AVX-512F present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fill_panel(
    g: &Geo,
    vi: &View<f32>,
    n: usize,
    c0: usize,
    q0: usize,
    cols: usize,
    dst: &mut [f32],
) {
    use core::arch::x86_64::*;
    let taps = g.kh * g.kw;
    debug_assert!(dst.len() >= g.cg * taps * 32 && cols <= 32);
    let (s1, s3) = (vi.stride[1], vi.stride[3]);
    let (sw, w) = (g.sw as isize, g.w as isize);
    let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let zero = _mm512_setzero_ps();
    let out = dst.as_mut_ptr();
    let step = taps * 32;
    let mut l = 0;
    while l < cols {
        // One segment: panel lanes l..l + seg, output row oy, columns ox.. (a panel spans
        // several rows when OW < 32 or it starts mid-row).
        let q = q0 + l;
        let (oy, ox) = (q / g.ow, q % g.ow);
        let seg = (g.ow - ox).min(cols - l);
        let seg_mask = lanes32(l, l + seg);
        let (s0, s1m) = (seg_mask as u16, (seg_mask >> 16) as u16);
        // Columns outer, rows inner: a tap column's lane mask is the same for every row.
        for kx in 0..g.kw {
            // Lane j reads input column ix_l + (j − l)·sw.
            let ix_l = (ox * g.sw + kx * g.dw) as isize - g.pl as isize;
            let first = if ix_l >= 0 { 0 } else { ceil_div(-ix_l, sw) };
            let end = if ix_l >= w { 0 } else { ceil_div(w - ix_l, sw) };
            let (first, end) = (first.min(seg as isize), end.min(seg as isize));
            let cols_valid = if first < end {
                lanes32(l + first as usize, l + end as usize)
            } else {
                0
            };
            for ky in 0..g.kh {
                let iy = (oy * g.sh + ky * g.dh) as isize - g.pt as isize;
                let row_ok = iy >= 0 && iy < g.h as isize;
                let valid = if row_ok { cols_valid } else { 0 };
                let (v0, v1) = (valid as u16, (valid >> 16) as u16);
                let d = out.wrapping_add((ky * g.kw + kx) * 32);
                let row = if row_ok {
                    vi.at([n, c0, iy as usize, 0])
                } else {
                    vi.ptr
                };
                // SAFETY: loads touch only `valid` lanes, whose input pixels lie inside row
                // iy of channels c0.. of the image (checked above); the stores write the
                // segment's lanes of this tap's panel rows, inside `dst`.
                unsafe {
                    if valid == 0 {
                        for c in 0..g.cg {
                            _mm512_mask_storeu_ps(d.add(c * step), s0, zero);
                            _mm512_mask_storeu_ps(d.add(c * step + 16), s1m, zero);
                        }
                    } else if s3 == 1 && sw == 1 {
                        // Lane j reads src + j.
                        let src = row.wrapping_offset(ix_l - l as isize);
                        for c in 0..g.cg {
                            let p = src.wrapping_offset(c as isize * s1);
                            let dc = d.add(c * step);
                            if s0 != 0 {
                                _mm512_mask_storeu_ps(dc, s0, _mm512_maskz_loadu_ps(v0, p));
                            }
                            if s1m != 0 {
                                let v = _mm512_maskz_loadu_ps(v1, p.wrapping_add(16));
                                _mm512_mask_storeu_ps(dc.add(16), s1m, v);
                            }
                        }
                    } else if s3 == 1 && sw == 2 {
                        // Lane j reads src + 2j: the even elements of 32 per half.
                        let src = row.wrapping_offset(ix_l - 2 * l as isize);
                        // Contiguous load masks (`even_span`: sparse ones hit a slow mode).
                        let (m0, m1) = (even_span(v0), even_span(v1));
                        let m = [m0 as u16, (m0 >> 16) as u16, m1 as u16, (m1 >> 16) as u16];
                        for c in 0..g.cg {
                            let p = src.wrapping_offset(c as isize * s1);
                            let dc = d.add(c * step);
                            if s0 != 0 {
                                let lo = _mm512_maskz_loadu_ps(m[0], p);
                                let hi = _mm512_maskz_loadu_ps(m[1], p.wrapping_add(16));
                                let v = _mm512_permutex2var_ps(lo, evens, hi);
                                _mm512_mask_storeu_ps(dc, s0, v);
                            }
                            if s1m != 0 {
                                let lo = _mm512_maskz_loadu_ps(m[2], p.wrapping_add(32));
                                let hi = _mm512_maskz_loadu_ps(m[3], p.wrapping_add(48));
                                let v = _mm512_permutex2var_ps(lo, evens, hi);
                                _mm512_mask_storeu_ps(dc.add(16), s1m, v);
                            }
                        }
                    } else {
                        for c in 0..g.cg {
                            let src = row.wrapping_offset(c as isize * s1);
                            let mut t = [0f32; 32];
                            for (j, e) in t.iter_mut().enumerate() {
                                if valid & (1 << j) != 0 {
                                    let ix = ix_l + (j as isize - l as isize) * sw;
                                    *e = *src.wrapping_offset(ix * s3);
                                }
                            }
                            let dc = d.add(c * step);
                            _mm512_mask_storeu_ps(dc, s0, _mm512_loadu_ps(t.as_ptr()));
                            _mm512_mask_storeu_ps(
                                dc.add(16),
                                s1m,
                                _mm512_loadu_ps(t[16..].as_ptr()),
                            );
                        }
                    }
                }
            }
        }
        l += seg;
    }
    if cols < 32 {
        // Columns past the product: zeros (never stored, but they must not be NaN or
        // subnormal garbage that slows the tiles).
        let pad = !lanes32(0, cols);
        let (p0, p1) = (pad as u16, (pad >> 16) as u16);
        for r in 0..g.cg * taps {
            // SAFETY: row r of the panel, inside `dst`.
            unsafe {
                _mm512_mask_storeu_ps(out.add(r * 32), p0, zero);
                _mm512_mask_storeu_ps(out.add(r * 32 + 16), p1, zero);
            }
        }
    }
}

/// Never called: [`available`] is false off x86-64.
///
/// # Safety
/// Unreachable.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn fill_panel(
    _: &Geo,
    _: &View<f32>,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    _: &mut [f32],
) {
    unreachable!("the panel path needs AVX-512F")
}
