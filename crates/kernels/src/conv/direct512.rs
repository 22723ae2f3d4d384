//! `Conv` with a short patch (`K = Cg·KH·KW` small, as for an RGB input layer) on AVX-512F,
//! directly from the input rows: eight output channels and two strips of 16 output pixels
//! of one row at a time (sixteen accumulators); every tap is one masked load of the input
//! row per strip (stride 2: two loads and a permute), and each broadcast weight feeds the
//! two strips' FMAs. The panel path unrolled the patches into scratch and ran the GEMM's
//! tiles, whose fixed costs a K of 27 does not amortize: the `cnn` sample's first layer
//! (3→16, 3×3 on 32×32) took 10.4 µs of its 18.5 in place. (Sixteen channels of one strip
//! — a broadcast load per FMA — ran it in 6.5–8.2 µs, the pairs in 5.3–5.6, alternating.)
//!
//! The weights of a block of eight channels are copied once per group into `[K][8]`
//! (zeros for channels past the group's), so a tap's broadcasts read half a line; a
//! per-call table gives each strip's tap columns their input offset and lane mask (as in
//! the depthwise kernel).

use crate::strided::View;
use crate::{KernelError, Workspace};

use super::Geo;
#[cfg(target_arch = "x86_64")]
use super::{load_strip, strip_table};

/// Output channels per block (one accumulator each per strip; two strips at a time).
const OB: usize = 8;
/// Largest patch (`Cg·KH·KW`) taken here: beyond it the panel path's GEMM reuses each
/// unrolled patch row across more channels than the eight here.
const MAX_K: usize = 64;
/// Largest strips × tap columns of the table.
const TABLE: usize = 256;
/// Largest `Cg·KH` (input rows one output row reads).
const ROWS: usize = 64;

/// Whether this CPU runs the kernel and the geometry suits it: a short patch, rows at least
/// 16 wide (the strips' lanes), unit-stride rows, horizontal stride 1 or 2, several output
/// channels per group.
pub(super) fn applies(g: &Geo, vi: &View<f32>, vo: &View<f32>) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        g.cg * g.kh * g.kw <= MAX_K
            && g.cg * g.kh <= ROWS
            && g.og >= 2
            && g.ow >= 16
            && (g.sw == 1 || g.sw == 2)
            && g.ow.div_ceil(16) * g.kw <= TABLE
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

/// The convolution of every image and group; `relu` fused.
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
    // SAFETY: forwarded; the stride is 1 or 2 (`applies`).
    unsafe {
        if g.sw == 1 {
            blocks::<1>(g, vi, vw, vo, bias, relu, ws)
        } else {
            blocks::<2>(g, vi, vw, vo, bias, relu, ws)
        }
    }
}

/// [`conv`] for the horizontal stride `SW`.
///
/// # Safety
/// As [`conv`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn blocks<const SW: usize>(
    g: &Geo,
    vi: &View<f32>,
    vw: &View<f32>,
    vo: &View<f32>,
    bias: Option<&View<f32>>,
    relu: bool,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    use core::arch::x86_64::*;
    let zero = _mm512_setzero_ps();
    let taps = g.kh * g.kw;
    let k = g.cg * taps;
    let nstrips = g.ow.div_ceil(16);
    // Per strip and tap column (the same for every row, channel and image): the input column
    // of lane 0 and the lanes inside the input row and the output row.
    let mut table = [(0isize, 0u32); TABLE];
    strip_table(g, SW, g.kw, &mut table);
    let wbuf = ws.f32(0, k.saturating_mul(OB))?;
    let mut rows = [(core::ptr::null::<f32>(), 0usize); ROWS];
    for grp in 0..g.groups {
        for ob in (0..g.og).step_by(OB) {
            let nb = OB.min(g.og - ob);
            let o0 = grp * g.og + ob;
            // The block's weights as [K][16] (tap t of channel o at t·16 + o).
            for o in 0..OB {
                for c in 0..g.cg {
                    for ky in 0..g.kh {
                        for kx in 0..g.kw {
                            let t = (c * g.kh + ky) * g.kw + kx;
                            wbuf[t * OB + o] = if o < nb {
                                // SAFETY: the weight has [O, Cg, KH, KW] elements.
                                unsafe { *vw.at([o0 + o, c, ky, kx]) }
                            } else {
                                0.0
                            };
                        }
                    }
                }
            }
            let bvals: [f32; OB] = core::array::from_fn(|o| match bias {
                // SAFETY: the bias has O elements.
                Some(b) if o < nb => unsafe { *b.at([0, 0, 0, o0 + o]) },
                _ => 0.0,
            });
            for n in 0..g.n {
                for oy in 0..g.oh {
                    // The input rows this output row reads: (channel, kernel row) pairs inside
                    // the image, with their index into the taps.
                    let mut nr = 0;
                    for c in 0..g.cg {
                        for ky in 0..g.kh {
                            let iy = (oy * g.sh + ky * g.dh) as isize - g.pt as isize;
                            if iy >= 0 && iy < g.h as isize {
                                let row = vi.at([n, grp * g.cg + c, iy as usize, 0]);
                                rows[nr] = (row as *const f32, (c * g.kh + ky) * g.kw);
                                nr += 1;
                            }
                        }
                    }
                    // Two strips at a time: each broadcast weight feeds two FMAs (one
                    // broadcast load for two products, not one: the single-strip loop was
                    // bound by its loads).
                    for s0 in (0..nstrips).step_by(2) {
                        let pair = s0 + 1 < nstrips;
                        let mut acc: [[__m512; OB]; 2] =
                            [core::array::from_fn(|o| _mm512_set1_ps(bvals[o])); 2];
                        for &(row, t0) in &rows[..nr] {
                            for kx in 0..g.kw {
                                let (ix0, m0) = table[s0 * g.kw + kx];
                                // SAFETY: only the masks' lanes are read, whose input columns
                                // lie inside the row (the table); the block's weights hold K
                                // taps of OB.
                                unsafe {
                                    let v0 = load_strip::<SW>(row.wrapping_offset(ix0), m0);
                                    let wt = wbuf.as_ptr().add((t0 + kx) * OB);
                                    if pair {
                                        let (ix1, m1) = table[(s0 + 1) * g.kw + kx];
                                        let v1 = load_strip::<SW>(row.wrapping_offset(ix1), m1);
                                        let [a0, a1] = &mut acc;
                                        for (o, (x0, x1)) in a0.iter_mut().zip(a1).enumerate() {
                                            let w = _mm512_set1_ps(*wt.add(o));
                                            *x0 = _mm512_fmadd_ps(w, v0, *x0);
                                            *x1 = _mm512_fmadd_ps(w, v1, *x1);
                                        }
                                    } else {
                                        for (o, x0) in acc[0].iter_mut().enumerate() {
                                            let w = _mm512_set1_ps(*wt.add(o));
                                            *x0 = _mm512_fmadd_ps(w, v0, *x0);
                                        }
                                    }
                                }
                            }
                        }
                        for (h, accs) in acc.iter().enumerate().take(1 + pair as usize) {
                            let s = s0 + h;
                            let live = ((1u32 << (g.ow - 16 * s).min(16)) - 1) as u16;
                            for (o, a) in accs.iter().enumerate().take(nb) {
                                // The second operand when either is NaN: NaN stays, as
                                // elsewhere.
                                let v = if relu { _mm512_max_ps(zero, *a) } else { *a };
                                // SAFETY: the `live` lanes are output columns of row oy of
                                // channel o0 + o.
                                unsafe {
                                    _mm512_mask_storeu_ps(vo.at([n, o0 + o, oy, 16 * s]), live, v)
                                };
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(())
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
    unreachable!("the direct AVX-512 kernel needs AVX-512F")
}
