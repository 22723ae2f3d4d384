//! `Conv`: 2-D convolution over `[N, C, H, W]` with groups (depthwise included), stride,
//! padding (top, left, bottom, right), dilation and an optional bias. 1-D convolutions
//! arrive with `H = 1`.
//!
//! Three strategies:
//! - **pointwise** (1×1 kernel, stride 1, no padding, input planes contiguous): the input
//!   already is the im2col matrix, so each group is one GEMM `out[Og × HW] = W[Og × Cg] ·
//!   in[Cg × HW]`, no scratch;
//! - **direct, eight channels × two strips at a time** (AVX-512F, a short patch
//!   `Cg·KH·KW ≤ 64` such as an RGB input layer, rows of 16 or more outputs, stride 1 or
//!   2): each input row load feeds eight FMAs, each broadcast weight two (the `direct512`
//!   module);
//! - **panels + packed GEMM** (AVX-512F, dense weights) where im2col + GEMM would run: a
//!   few 32-pixel panels of the patch matrix at a time, unrolled with masked loads into
//!   L1-sized host scratch in the packed-B layout and multiplied by the packed GEMM's register
//!   tiles, bias and Relu in registers (see the `panel` module);
//! - **im2col + GEMM** otherwise when the instruction supplies a `workspace` (the compiler sized it
//!   `(C/groups)·KH·KW·OH·OW` floats) and each group has more than one output channel: the
//!   patches of one image and group are unrolled into the workspace (zeros for padding) a band
//!   of output rows at a time (sized by
//!   [`KERNEL_IM2COL_BAND_BYTES`] so the band is
//!   still in cache when the GEMM reads it), then one GEMM per band through
//!   [`crate::gemm::gemm_auto`]. A bias is written into the
//!   output first and the GEMM accumulates onto it;
//! - **depthwise** (AVX-512F, one channel per group, kernels 3, 5 or 7 wide, horizontal
//!   stride 1 or 2): strips of 16 output columns, one masked row load and one FMA a tap
//!   (the `depthwise` module);
//! - **direct** otherwise (and for other depthwise shapes, where a GEMM would have one row). With a
//!   horizontal stride of 1 and unit-stride rows, a register-blocked AVX2 kernel computes
//!   strips of 16 or 8 output columns for up to 4 output channels at once, the sums over
//!   `(c, ky, kx)` held in registers (one input load feeds 4 FMAs); the columns whose window
//!   crosses the padding are summed one by one. Any other geometry: for each output channel,
//!   every tap adds `w · input` to an output-plane accumulator in the host workspace over the
//!   contiguous range of output columns whose input column is inside the image (see
//!   `pool::valid_range`).

mod depthwise;
mod direct512;
mod panel;

use crate::Execute;
use crate::gemm::{Mat, gemm_auto};
use crate::pool::valid_range;
use crate::strided::{View, copy_elems};
use crate::{DeviceMemory, KernelError, Workspace};
use nrt_hal::tuning::KERNEL_IM2COL_BAND_BYTES;
use nrt_isa::op;
use nrt_isa::{AccessPattern, ActFunc, Window};

/// The operands of a convolution.
#[derive(Clone, Copy, Debug)]
pub struct ConvArgs<'a> {
    /// `[N, C, H, W]`.
    pub input: &'a AccessPattern,
    /// `[O, C/groups, KH, KW]`.
    pub weight: &'a AccessPattern,
    /// `[N, O, OH, OW]`.
    pub output: &'a AccessPattern,
    /// `[1, 1, 1, O]`, if any.
    pub bias: Option<&'a AccessPattern>,
    /// im2col scratch, if any.
    pub workspace: Option<&'a AccessPattern>,
    /// Stride, padding, dilation.
    pub window: &'a Window,
    /// Groups.
    pub groups: u32,
    /// The activation applied to every output element last (`Identity`: none).
    pub act: (ActFunc, f32, f32),
}

/// `⌈a / b⌉` for `a ≥ 0`, `b ≥ 1`, without a division for the strides 1 and 2 (a division is
/// ~25 cycles, and this runs twice per tap and segment).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn ceil_div(a: isize, b: isize) -> isize {
    match b {
        1 => a,
        2 => (a + 1) >> 1,
        _ => (a + b - 1) / b,
    }
}

/// Spreads the 8 bits of `m` to the even bits of a 16-bit mask (bit `i` → bit `2i`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn even_bits(m: u16) -> u16 {
    let mut x = m & 0xFF;
    x = (x | (x << 4)) & 0x0F0F;
    x = (x | (x << 2)) & 0x3333;
    (x | (x << 1)) & 0x5555
}

/// The load masks of 16 lanes at stride 2 (lane `j` reads element `2j` of 32): for the lanes
/// of `m` (a contiguous run, lanes `a..=b`), the contiguous elements `2a..=2b` — the odd
/// elements between two lanes read lie inside the row too, and the permute drops them — as
/// 32 bits (the low 16 for the first load, the high 16 for the second).
///
/// Not [`even_bits`]' sparse masks (every other element): on the AMD EPYC (Zen 5) these
/// benches run on, masked loads with masks like `0x5555` fell into a mode ~5× slower for
/// hundreds of ms at a time (the 3×3 stride-2 depthwise layer of 96 channels on 112×112:
/// 0.4 ms or 1.7–2.5 ms, switching within one process), which contiguous masks never showed
/// in 28 timings. A mask that is not one run (no caller makes one) keeps the sparse form.
#[cfg(target_arch = "x86_64")]
#[inline]
fn even_span(m: u16) -> u32 {
    if m == 0 {
        return 0;
    }
    let (a, b) = (m.trailing_zeros(), 15 - m.leading_zeros());
    if (m >> a).wrapping_add(1) & (m >> a) != 0 {
        return even_bits(m) as u32 | (even_bits(m >> 8) as u32) << 16;
    }
    ((2u64 << (2 * b)) - 1) as u32 & !((1u32 << (2 * a)) - 1)
}

/// Fills `table` (entry `s·kw + kx`) for the direct AVX-512 kernels: per strip `s` of 16
/// output columns and tap column `kx`, the input column of lane 0 and the load mask
/// ([`load_strip`]) of the lanes whose input column lies inside the row and whose output
/// column inside the output row: the lanes themselves at stride 1, their [`even_span`] at
/// stride 2. The same for every row, channel and image, so the kernels' inner loops do a
/// masked load (two at stride 2) and an FMA per tap, nothing else; masked-off lanes —
/// padding, columns past the row — are never read.
#[cfg(target_arch = "x86_64")]
fn strip_table(g: &Geo, sw: usize, kw: usize, table: &mut [(isize, u32)]) {
    let (w, swi) = (g.w as isize, sw as isize);
    for s in 0..g.ow.div_ceil(16) {
        let x0 = 16 * s;
        let live = ((1u32 << (g.ow - x0).min(16)) - 1) as u16;
        for kx in 0..kw {
            // Lane j reads input column ix + j·sw.
            let ix = (x0 * sw + kx * g.dw) as isize - g.pl as isize;
            let first = if ix >= 0 { 0 } else { ceil_div(-ix, swi) };
            let end = if ix >= w { 0 } else { ceil_div(w - ix, swi) };
            let (first, end) = (first.clamp(0, 16), end.clamp(0, 16));
            let mask = if first < end {
                (((1u32 << end) - 1) & !((1u32 << first) - 1)) as u16 & live
            } else {
                0
            };
            table[s * kw + kx] = (
                ix,
                if sw == 2 {
                    even_span(mask)
                } else {
                    mask as u32
                },
            );
        }
    }
}

/// The 16 input columns of a strip: lane `j` is `p[j·SW]` (`SW` 1 or 2), the lanes outside
/// `mask` zero. At stride 1 `mask` is the lanes, one masked load; at stride 2 it holds the
/// masks of two loads of 16 elements ([`even_span`]), and a permute picks the even elements.
///
/// # Safety
/// The elements `mask` selects readable; AVX-512F present (inlined into its kernels).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load_strip<const SW: usize>(p: *const f32, mask: u32) -> core::arch::x86_64::__m512 {
    use core::arch::x86_64::*;
    // SAFETY: per the contract.
    unsafe {
        if SW == 1 {
            _mm512_maskz_loadu_ps(mask as u16, p)
        } else {
            let evens =
                _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
            let lo = _mm512_maskz_loadu_ps(mask as u16, p);
            let hi = _mm512_maskz_loadu_ps((mask >> 16) as u16, p.wrapping_add(16));
            _mm512_permutex2var_ps(lo, evens, hi)
        }
    }
}

struct Geo {
    n: usize,
    cg: usize,
    og: usize,
    groups: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    sh: usize,
    sw: usize,
    dh: usize,
    dw: usize,
    pt: usize,
    pl: usize,
}

/// Executes `Op::Conv`.
///
/// # Safety
/// Operands inside `mem`, aligned to 4 bytes; the output overlaps no other operand.
pub unsafe fn conv(
    args: &ConvArgs<'_>,
    mem: DeviceMemory,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    let vi = View::<f32>::new(args.input, mem);
    let vw = View::<f32>::new(args.weight, mem);
    let vo = View::<f32>::new(args.output, mem);
    if vo.elements() == 0 {
        return Ok(());
    }
    let g = args.groups as usize;
    let win = args.window;
    let geo = Geo {
        n: vi.shape[0],
        cg: vi.shape[1] / g,
        og: vw.shape[0] / g,
        groups: g,
        h: vi.shape[2],
        w: vi.shape[3],
        kh: vw.shape[2],
        kw: vw.shape[3],
        oh: vo.shape[2],
        ow: vo.shape[3],
        sh: win.stride[0] as usize,
        sw: win.stride[1] as usize,
        dh: win.dilation[0] as usize,
        dw: win.dilation[1] as usize,
        pt: win.pad[0] as usize,
        pl: win.pad[1] as usize,
    };
    let bias = args.bias.map(|b| View::<f32>::new(b, mem));
    // (H, W) flatten to one index of stride `stride[3]`.
    let plane = |v: &View<f32>| v.shape[2] <= 1 || v.stride[2] == v.shape[3] as isize * v.stride[3];
    let out_flat = plane(&vo);
    // Weight rows as matrices [O, Cg·KH·KW] need dims 1..3 to merge.
    let w_flat = plane(&vw)
        && (vw.shape[1] <= 1
            || vw.stride[1] == (vw.shape[2] * vw.shape[3]) as isize * vw.stride[3]);
    let pointwise =
        geo.kh == 1 && geo.kw == 1 && geo.sh == 1 && geo.sw == 1 && win.pad == [0; 4] && plane(&vi);
    // SAFETY: (every arm) the caller's contract covers every element addressed.
    unsafe {
        if geo.cg == 0 {
            // No input channels: the output is the bias (or 0).
            fill_bias(&vo, bias.as_ref());
        } else if pointwise && out_flat && w_flat && geo.og > 1 {
            pointwise_gemm(&geo, &vi, &vw, &vo, bias.as_ref(), ws)?;
        } else if args.workspace.is_some() && direct512::applies(&geo, &vi, &vo) {
            // A short patch (an RGB input layer): eight channels × two strips of FMAs per
            // tap, straight from the input rows.
            let relu = matches!(args.act.0, ActFunc::Relu);
            direct512::conv(&geo, &vi, &vw, &vo, bias.as_ref(), relu, ws)?;
            if !relu {
                activate(&vo, 0..vo.shape[1], 0..vo.shape[2], args.act);
            }
            return Ok(());
        } else if args.workspace.is_some()
            && out_flat
            && w_flat
            && geo.og > 1
            && vw.stride[3] == 1
            && panel::available()
        {
            // im2col a few panels at a time into the packed-B GEMM, bias and Relu in registers.
            let relu = matches!(args.act.0, ActFunc::Relu);
            panel::conv(&geo, &vi, &vw, &vo, bias.as_ref(), relu, ws)?;
            if !relu {
                activate(&vo, 0..vo.shape[1], 0..vo.shape[2], args.act);
            }
            return Ok(());
        } else if let (Some(col), true, true, true) = (args.workspace, out_flat, w_flat, geo.og > 1)
        {
            let col = mem.ptr(col.addr) as *mut f32;
            // The activation goes band by band, while each band's output is in cache.
            im2col_gemm(&geo, &vi, &vw, &vo, bias.as_ref(), col, args.act, ws)?;
            return Ok(());
        } else if depthwise::applies(&geo, &vi, &vo) {
            // One channel per group: broadcast weights times masked row loads, four strips of
            // 16 columns at a time, bias and Relu in registers.
            let relu = matches!(args.act.0, ActFunc::Relu);
            depthwise::conv(&geo, &vi, &vw, &vo, bias.as_ref(), relu, ws)?;
            if !relu {
                activate(&vo, 0..vo.shape[1], 0..vo.shape[2], args.act);
            }
            return Ok(());
        } else {
            #[cfg(all(
                target_arch = "x86_64",
                target_feature = "avx2",
                target_feature = "fma"
            ))]
            if geo.sw == 1 && vi.stride[3] == 1 && vo.stride[3] == 1 {
                direct_avx::direct(&geo, &vi, &vw, &vo, bias.as_ref());
                activate(&vo, 0..vo.shape[1], 0..vo.shape[2], args.act);
                return Ok(());
            }
            direct(&geo, &vi, &vw, &vo, bias.as_ref(), ws)?;
        }
        activate(&vo, 0..vo.shape[1], 0..vo.shape[2], args.act);
    }
    Ok(())
}

/// Applies `act` to output channels `os` and rows `ys` of every image (nothing for
/// `Identity`): row slices where the rows are unit-stride, element by element otherwise.
///
/// # Safety
/// The output view inside device memory.
unsafe fn activate(
    vo: &View<f32>,
    os: core::ops::Range<usize>,
    ys: core::ops::Range<usize>,
    act: (ActFunc, f32, f32),
) {
    let (func, alpha, beta) = act;
    if matches!(func, ActFunc::Identity) {
        return;
    }
    let [_, _, h, w] = vo.shape;
    let flat = vo.stride[3] == 1 && (h <= 1 || vo.stride[2] == w as isize);
    for n in 0..vo.shape[0] {
        if flat && ys == (0..h) && (os.len() <= 1 || vo.stride[1] == (h * w) as isize) {
            // The channels' planes are one contiguous run: one call.
            if !os.is_empty() {
                // SAFETY: channels `os` of image n, contiguous (checked above).
                let run = unsafe {
                    core::slice::from_raw_parts_mut(vo.at([n, os.start, 0, 0]), os.len() * h * w)
                };
                crate::act::apply_in_place(func, alpha, beta, run);
            }
            continue;
        }
        for o in os.clone() {
            if flat {
                // Rows `ys` of one plane are contiguous: one call per channel.
                // SAFETY: rows ys of channel o, contiguous (flat).
                let run = unsafe {
                    core::slice::from_raw_parts_mut(vo.at([n, o, ys.start, 0]), ys.len() * w)
                };
                crate::act::apply_in_place(func, alpha, beta, run);
                continue;
            }
            for y in ys.clone() {
                if vo.stride[3] == 1 {
                    // SAFETY: a unit-stride output row of shape[3] elements.
                    let row = unsafe {
                        core::slice::from_raw_parts_mut(vo.at([n, o, y, 0]), vo.shape[3])
                    };
                    crate::act::apply_in_place(func, alpha, beta, row);
                } else {
                    for x in 0..vo.shape[3] {
                        // SAFETY: inside the output.
                        let e = unsafe { &mut *vo.at([n, o, y, x]) };
                        crate::act::apply_in_place(func, alpha, beta, core::slice::from_mut(e));
                    }
                }
            }
        }
    }
}

/// Writes the bias (or zeros) to every output element.
///
/// # Safety
/// Views inside device memory.
unsafe fn fill_bias(vo: &View<f32>, bias: Option<&View<f32>>) {
    for n in 0..vo.shape[0] {
        for o in 0..vo.shape[1] {
            // SAFETY: bias has O elements.
            let b = bias.map_or(0.0, |b| unsafe { *b.at([0, 0, 0, o]) });
            if vo.stride[3] == 1 {
                for y in 0..vo.shape[2] {
                    // SAFETY: a unit-stride output row of shape[3] elements.
                    unsafe {
                        core::slice::from_raw_parts_mut(vo.at([n, o, y, 0]), vo.shape[3]).fill(b)
                    };
                }
                continue;
            }
            for y in 0..vo.shape[2] {
                for x in 0..vo.shape[3] {
                    // SAFETY: inside the output.
                    unsafe { vo.at([n, o, y, x]).write(b) };
                }
            }
        }
    }
}

/// # Safety
/// As [`conv`]; the pointwise conditions hold.
unsafe fn pointwise_gemm(
    g: &Geo,
    vi: &View<f32>,
    vw: &View<f32>,
    vo: &View<f32>,
    bias: Option<&View<f32>>,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    let hw = g.oh * g.ow;
    let acc = bias.is_some();
    if bias.is_some() {
        // SAFETY: forwarded.
        unsafe { fill_bias(vo, bias) };
    }
    for n in 0..g.n {
        for grp in 0..g.groups {
            let a = Mat {
                ptr: vw.at([grp * g.og, 0, 0, 0]),
                rs: vw.stride[0],
                cs: vw.stride[1],
            };
            let b = Mat {
                ptr: vi.at([n, grp * g.cg, 0, 0]),
                rs: vi.stride[1],
                cs: vi.stride[3],
            };
            let c = Mat {
                ptr: vo.at([n, grp * g.og, 0, 0]),
                rs: vo.stride[1],
                cs: vo.stride[3],
            };
            // SAFETY: the three matrices address exactly the operands' elements.
            unsafe { gemm_auto(g.og, hw, g.cg, a, b, c, 1.0, acc, ws)? };
        }
    }
    Ok(())
}

/// # Safety
/// As [`conv`]; `col` holds `Cg·KH·KW·OH·OW` floats and overlaps no operand.
#[allow(clippy::too_many_arguments)]
unsafe fn im2col_gemm(
    g: &Geo,
    vi: &View<f32>,
    vw: &View<f32>,
    vo: &View<f32>,
    bias: Option<&View<f32>>,
    col: *mut f32,
    act: (ActFunc, f32, f32),
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    let hw = g.oh * g.ow;
    let kk = g.cg * g.kh * g.kw;
    let acc = bias.is_some();
    if bias.is_some() {
        // SAFETY: forwarded.
        unsafe { fill_bias(vo, bias) };
    }
    // Bands of output rows whose patch matrix stays cache-resident between im2col and GEMM.
    let row_bytes = kk * g.ow * size_of::<f32>();
    let band = (KERNEL_IM2COL_BAND_BYTES / row_bytes.max(1)).clamp(1, g.oh.max(1));
    // SAFETY: `col` is the workspace operand (≥ kk·hw floats), exclusively ours for this
    // instruction.
    let colm = unsafe { core::slice::from_raw_parts_mut(col, kk * hw) };
    for n in 0..g.n {
        for grp in 0..g.groups {
            for oy0 in (0..g.oh).step_by(band) {
                let rows = band.min(g.oh - oy0);
                let nb = rows * g.ow;
                // SAFETY: forwarded.
                unsafe { im2col(g, vi, n, grp * g.cg, oy0, rows, &mut colm[..kk * nb]) };
                let a = Mat {
                    ptr: vw.at([grp * g.og, 0, 0, 0]),
                    rs: vw.stride[0],
                    cs: vw.stride[3],
                };
                let b = Mat {
                    ptr: col,
                    rs: nb as isize,
                    cs: 1,
                };
                let c = Mat {
                    ptr: vo.at([n, grp * g.og, oy0, 0]),
                    rs: vo.stride[1],
                    cs: vo.stride[3],
                };
                // SAFETY: the matrices address the operands' elements (output rows
                // oy0..oy0+rows flatten with the columns) and the filled workspace.
                unsafe { gemm_auto(g.og, nb, kk, a, b, c, 1.0, acc, ws)? };
                // SAFETY: the band's output rows of this group's channels.
                unsafe {
                    activate_image(vo, n, grp * g.og..(grp + 1) * g.og, oy0..oy0 + rows, act)
                };
            }
        }
    }
    Ok(())
}

/// [`activate`] for image `n` only.
///
/// # Safety
/// As [`activate`].
unsafe fn activate_image(
    vo: &View<f32>,
    n: usize,
    os: core::ops::Range<usize>,
    ys: core::ops::Range<usize>,
    act: (ActFunc, f32, f32),
) {
    let mut one = *vo;
    one.shape[0] = 1;
    one.ptr = vo.at([n, 0, 0, 0]);
    // SAFETY: forwarded; `one` is image `n` of the output.
    unsafe { activate(&one, os, ys, act) };
}

/// Unrolls the patches of image `n`, channels `c0..c0+Cg`, output rows `oy0..oy0+rows`, into
/// `col` (`[Cg·KH·KW, rows·OW]`).
///
/// # Safety
/// The input view inside device memory.
#[allow(clippy::too_many_arguments)]
unsafe fn im2col(
    g: &Geo,
    vi: &View<f32>,
    n: usize,
    c0: usize,
    oy0: usize,
    rows: usize,
    col: &mut [f32],
) {
    let hw = rows * g.ow;
    let rs = vi.stride[3];
    // Stride 1 with rows as wide as the output's ("same" padding) and contiguous: output row
    // j's patch row is input row j + const shifted by a constant column offset, so a band's
    // valid rows are one copy of a contiguous run — the pad columns, which that copy fills
    // with the neighbouring rows' edge elements, are zeroed after.
    let flat = g.sh == 1 && g.sw == 1 && rs == 1 && g.w == g.ow && vi.stride[2] == g.w as isize;
    let mut r = 0;
    for c in 0..g.cg {
        for ky in 0..g.kh {
            for kx in 0..g.kw {
                let dst = &mut col[r * hw..(r + 1) * hw];
                r += 1;
                let (lo, hi) = valid_range(g.ow, g.w, g.sw, kx * g.dw, g.pl);
                if flat && lo < hi {
                    // SAFETY: forwarded (the input view covers image n, channel c0 + c).
                    unsafe { im2col_flat(g, vi, n, c0 + c, oy0 + ky * g.dh, (lo, hi), kx, dst) };
                    continue;
                }
                for (j, oy) in (oy0..oy0 + rows).enumerate() {
                    let drow = &mut dst[j * g.ow..(j + 1) * g.ow];
                    let iy = (oy * g.sh + ky * g.dh) as isize - g.pt as isize;
                    if iy < 0 || iy >= g.h as isize || lo >= hi {
                        drow.fill(0.0);
                        continue;
                    }
                    // (Guarded: most rows have no padded columns, and an empty fill is still
                    // a call to memset.)
                    if lo > 0 {
                        drow[..lo].fill(0.0);
                    }
                    if hi < g.ow {
                        drow[hi..].fill(0.0);
                    }
                    let ix0 = (lo * g.sw + kx * g.dw - g.pl) as isize;
                    let src = vi.at([n, c0 + c, iy as usize, 0]).wrapping_offset(ix0 * rs);
                    let d = &mut drow[lo..hi];
                    if g.sw == 1 && rs == 1 {
                        // SAFETY: hi − lo input columns from ix0 lie inside the row.
                        unsafe { copy_elems(src, d.as_mut_ptr(), d.len()) };
                    } else if g.sw == 2 && rs == 1 {
                        // Stride 2: the even elements of one contiguous run, read as pairs so
                        // the loop vectorizes; the last alone (its partner may lie past the row).
                        let len = d.len();
                        // SAFETY: columns ix0..ix0 + 2(len − 1) lie inside the row.
                        let xs = unsafe { core::slice::from_raw_parts(src, 2 * len - 1) };
                        let (body, last) = d.split_at_mut(len - 1);
                        for (v, p) in body.iter_mut().zip(xs.chunks_exact(2)) {
                            *v = p[0];
                        }
                        last[0] = xs[2 * (len - 1)];
                    } else {
                        let step = g.sw as isize * rs;
                        for (j, v) in d.iter_mut().enumerate() {
                            // SAFETY: as above.
                            *v = unsafe { *src.offset(j as isize * step) };
                        }
                    }
                }
            }
        }
    }
}

/// One patch row (`c`, `ky`, `kx`) of [`im2col`] on its flat path: `dst` is `rows · OW`
/// floats for output rows from the one whose input row is `top - pt` (`top` = the band's first
/// output row + `ky · dh`); `(lo, hi)` are the output columns whose input column is inside
/// the row.
///
/// # Safety
/// The input view inside device memory, its rows `W` (= `OW`) floats apart, unit-stride.
#[allow(clippy::too_many_arguments)]
unsafe fn im2col_flat(
    g: &Geo,
    vi: &View<f32>,
    n: usize,
    c: usize,
    top: usize,
    (lo, hi): (usize, usize),
    kx: usize,
    dst: &mut [f32],
) {
    let ow = g.ow;
    let rows = dst.len() / ow;
    // Input row of output row j: base + j. Rows outside the image are zero.
    let base = top as isize - g.pt as isize;
    let jlo = (-base).clamp(0, rows as isize) as usize;
    let jhi = (g.h as isize - base).clamp(jlo as isize, rows as isize) as usize;
    dst[..jlo * ow].fill(0.0);
    dst[jhi * ow..].fill(0.0);
    if jlo == jhi {
        return;
    }
    // dst[j·OW + x] = in[base + j][x + shift]; with rows OW apart that is one run from
    // in[base + jlo][0] + (t − jlo·OW) + shift for every t whose read stays inside rows
    // jlo..jhi: t0..t1 below (lo < hi bounds |shift| below OW).
    let shift = (kx * g.dw) as isize - g.pl as isize;
    let t0 = jlo * ow + (-shift).max(0) as usize;
    let t1 = jhi * ow - shift.max(0) as usize;
    let row0 = vi.at([n, c, (base + jlo as isize) as usize, 0]);
    let d = &mut dst[t0..t1];
    // SAFETY: reads in[base + jlo][max(shift, 0)] .. in[base + jhi − 1][OW + min(shift, 0)],
    // all inside rows jlo..jhi of the plane (t0 − jlo·OW + shift ≥ 0, t1 − jlo·OW + shift ≤
    // (jhi − jlo)·OW).
    unsafe {
        copy_elems(
            row0.wrapping_offset((t0 - jlo * ow) as isize + shift),
            d.as_mut_ptr(),
            d.len(),
        )
    };
    if lo > 0 || hi < ow {
        for row in dst[jlo * ow..jhi * ow].chunks_exact_mut(ow) {
            row[..lo].fill(0.0);
            row[hi..].fill(0.0);
        }
    }
}

/// # Safety
/// As [`conv`].
unsafe fn direct(
    g: &Geo,
    vi: &View<f32>,
    vw: &View<f32>,
    vo: &View<f32>,
    bias: Option<&View<f32>>,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    let hw = g.oh * g.ow;
    let acc = ws.f32(0, hw)?;
    let rs = vi.stride[3];
    for n in 0..g.n {
        for o in 0..g.og * g.groups {
            let grp = o / g.og;
            // SAFETY: bias has O elements.
            acc.fill(bias.map_or(0.0, |b| unsafe { *b.at([0, 0, 0, o]) }));
            for c in 0..g.cg {
                for ky in 0..g.kh {
                    for kx in 0..g.kw {
                        // SAFETY: inside the weight.
                        let wv = unsafe { *vw.at([o, c, ky, kx]) };
                        let (lo, hi) = valid_range(g.ow, g.w, g.sw, kx * g.dw, g.pl);
                        if lo >= hi {
                            continue;
                        }
                        let ix0 = (lo * g.sw + kx * g.dw - g.pl) as isize;
                        for oy in 0..g.oh {
                            let iy = (oy * g.sh + ky * g.dh) as isize - g.pt as isize;
                            if iy < 0 || iy >= g.h as isize {
                                continue;
                            }
                            let src = vi
                                .at([n, grp * g.cg + c, iy as usize, 0])
                                .wrapping_offset(ix0 * rs);
                            let a = &mut acc[oy * g.ow + lo..oy * g.ow + hi];
                            if g.sw == 1 && rs == 1 {
                                // SAFETY: the input columns lie inside the row.
                                let xs = unsafe { core::slice::from_raw_parts(src, a.len()) };
                                for (a, x) in a.iter_mut().zip(xs) {
                                    *a = wv.mul_add(*x, *a);
                                }
                            } else {
                                let step = g.sw as isize * rs;
                                for (j, a) in a.iter_mut().enumerate() {
                                    // SAFETY: as above.
                                    *a = wv.mul_add(unsafe { *src.offset(j as isize * step) }, *a);
                                }
                            }
                        }
                    }
                }
            }
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    // SAFETY: inside the output.
                    unsafe { vo.at([n, o, oy, ox]).write(acc[oy * g.ow + ox]) };
                }
            }
        }
    }
    Ok(())
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod direct_avx {
    use super::Geo;
    use crate::strided::View;
    use core::arch::x86_64::*;

    /// `OB` output channels × `8·V` output columns starting at `ox`. With `MASKED`, input
    /// columns outside the row read as 0 (padding) through masked loads — only `V = 1` —
    /// otherwise every tap's columns must lie inside the row.
    ///
    /// # Safety
    /// As [`direct`]; unmasked strips lie inside the input rows.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn strip<const OB: usize, const V: usize, const MASKED: bool>(
        g: &Geo,
        vi: &View<f32>,
        vw: &View<f32>,
        n: usize,
        o0: usize,
        c0: usize,
        oy: usize,
        ox: usize,
    ) -> [[__m256; V]; OB] {
        // SAFETY: unmasked loads are inside the input row (the caller's interior condition);
        // masked loads only touch lanes whose column is inside the row; weights in range.
        unsafe {
            let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let width = _mm256_set1_epi32(g.w as i32);
            let (ws2, ws3) = (vw.stride[2], vw.stride[3]);
            let mut acc = [[_mm256_setzero_ps(); V]; OB];
            for c in 0..g.cg {
                let wp: [*const f32; OB] =
                    core::array::from_fn(|b| vw.at([o0 + b, c, 0, 0]) as *const f32);
                for ky in 0..g.kh {
                    let iy = (oy * g.sh + ky * g.dh) as isize - g.pt as isize;
                    if iy < 0 || iy >= g.h as isize {
                        continue;
                    }
                    let row = vi.at([n, c0 + c, iy as usize, 0]);
                    for kx in 0..g.kw {
                        let base = (ox + kx * g.dw) as isize - g.pl as isize;
                        let p = row.wrapping_offset(base);
                        let x: [__m256; V] = if MASKED {
                            let idx = _mm256_add_epi32(_mm256_set1_epi32(base as i32), lanes);
                            let inside = _mm256_and_si256(
                                _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(-1)),
                                _mm256_cmpgt_epi32(width, idx),
                            );
                            core::array::from_fn(|_| _mm256_maskload_ps(p, inside))
                        } else {
                            core::array::from_fn(|v| _mm256_loadu_ps(p.add(8 * v)))
                        };
                        let woff = ky as isize * ws2 + kx as isize * ws3;
                        for (b, acc_b) in acc.iter_mut().enumerate() {
                            let w = _mm256_broadcast_ss(&*wp[b].offset(woff));
                            for v in 0..V {
                                acc_b[v] = _mm256_fmadd_ps(w, x[v], acc_b[v]);
                            }
                        }
                    }
                }
            }
            acc
        }
    }

    /// Stores a strip plus the bias; only the first `nout` columns when `nout < 8·V`.
    ///
    /// # Safety
    /// The first `nout` output columns from `ox` exist (unit stride).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn store<const OB: usize, const V: usize>(
        vo: &View<f32>,
        acc: [[__m256; V]; OB],
        bias: &[f32; 4],
        n: usize,
        o0: usize,
        oy: usize,
        ox: usize,
        nout: usize,
    ) {
        // SAFETY: stores cover columns < ox + nout only (masked for a partial strip).
        unsafe {
            let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(nout as i32), lanes);
            for (b, acc_b) in acc.iter().enumerate() {
                let p = vo.at([n, o0 + b, oy, ox]);
                for (v, a) in acc_b.iter().enumerate() {
                    let val = _mm256_add_ps(*a, _mm256_set1_ps(bias[b]));
                    if nout >= 8 * (v + 1) {
                        _mm256_storeu_ps(p.add(8 * v), val);
                    } else {
                        _mm256_maskstore_ps(p.add(8 * v), keep, val);
                    }
                }
            }
        }
    }

    /// Direct convolution, horizontal stride 1, unit-stride input and output rows.
    ///
    /// # Safety
    /// Views inside device memory (the caller's contract of `conv`).
    pub(super) unsafe fn direct(
        g: &Geo,
        vi: &View<f32>,
        vw: &View<f32>,
        vo: &View<f32>,
        bias: Option<&View<f32>>,
    ) {
        // Interior strips: ox ≥ pl and ox + 8V − 1 + (kw − 1)·dw − pl < w.
        let span = (g.kw - 1) * g.dw;
        let end = |v: usize| -> usize {
            // One past the last strip start whose every input column is inside the row.
            (g.w + g.pl).checked_sub(span + 8 * v).map_or(0, |e| e + 1)
        };
        let (end2, end1) = (end(2), end(1));
        for n in 0..g.n {
            for grp in 0..g.groups {
                let c0 = grp * g.cg;
                let mut o0 = grp * g.og;
                let o_end = o0 + g.og;
                while o0 < o_end {
                    let ob = (o_end - o0).min(4);
                    let mut bv = [0.0f32; 4];
                    for (b, v) in bv.iter_mut().enumerate().take(ob) {
                        // SAFETY: bias has O elements.
                        *v = bias.map_or(0.0, |bb| unsafe { *bb.at([0, 0, 0, o0 + b]) });
                    }
                    for oy in 0..g.oh {
                        let mut ox = 0;
                        while ox < g.ow {
                            macro_rules! run {
                                ($v:literal, $masked:literal, $nout:expr) => {
                                    // SAFETY: interior strips are checked below; masked
                                    // strips read only columns inside the rows.
                                    unsafe {
                                        match ob {
                                            4 => store::<4, $v>(
                                                vo,
                                                strip::<4, $v, $masked>(
                                                    g, vi, vw, n, o0, c0, oy, ox,
                                                ),
                                                &bv,
                                                n,
                                                o0,
                                                oy,
                                                ox,
                                                $nout,
                                            ),
                                            3 => store::<3, $v>(
                                                vo,
                                                strip::<3, $v, $masked>(
                                                    g, vi, vw, n, o0, c0, oy, ox,
                                                ),
                                                &bv,
                                                n,
                                                o0,
                                                oy,
                                                ox,
                                                $nout,
                                            ),
                                            2 => store::<2, $v>(
                                                vo,
                                                strip::<2, $v, $masked>(
                                                    g, vi, vw, n, o0, c0, oy, ox,
                                                ),
                                                &bv,
                                                n,
                                                o0,
                                                oy,
                                                ox,
                                                $nout,
                                            ),
                                            _ => store::<1, $v>(
                                                vo,
                                                strip::<1, $v, $masked>(
                                                    g, vi, vw, n, o0, c0, oy, ox,
                                                ),
                                                &bv,
                                                n,
                                                o0,
                                                oy,
                                                ox,
                                                $nout,
                                            ),
                                        }
                                    }
                                };
                            }
                            if ox >= g.pl && ox < end2 && ox + 16 <= g.ow {
                                run!(2, false, 16);
                                ox += 16;
                            } else if ox >= g.pl && ox < end1 && ox + 8 <= g.ow {
                                run!(1, false, 8);
                                ox += 8;
                            } else {
                                let nout = (g.ow - ox).min(8);
                                run!(1, true, nout);
                                ox += 8;
                            }
                        }
                    }
                    o0 += ob;
                }
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::{even_bits, even_span};

    /// A run of lanes `a..=b` loads elements `2a..=2b` of 32, as one contiguous mask split
    /// over the two loads; no lanes, nothing; lanes that are not one run, the sparse masks.
    #[test]
    fn even_span_is_contiguous_over_the_lanes_read() {
        assert_eq!(even_span(0), 0);
        assert_eq!(even_span(0xFFFF), 0x7FFF_FFFF);
        assert_eq!(even_span(0x0001), 0b1);
        assert_eq!(even_span(0x8000), 1 << 30);
        // Lanes 1..=3: elements 2..=6.
        assert_eq!(even_span(0b1110), 0b111_1100);
        // Lanes 7..=8 straddle the two loads: elements 14..=16.
        assert_eq!(even_span(0x0180), 0b1_1100_0000_0000_0000);
        for a in 0..16u32 {
            for b in a..16 {
                let m = ((2u32 << b) - 1) as u16 & !((1u16 << a) - 1);
                let span = even_span(m);
                for e in 0..32u32 {
                    let want = e >= 2 * a && e <= 2 * b;
                    assert_eq!(span >> e & 1 == 1, want, "lanes {a}..={b}, element {e}");
                }
            }
        }
        let sparse = 0b1010u16;
        assert_eq!(
            even_span(sparse),
            even_bits(sparse) as u32 | (even_bits(sparse >> 8) as u32) << 16
        );
    }
}

impl Execute for op::Conv {
    unsafe fn execute(&self, mem: DeviceMemory, ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::Conv {
            input,
            weight,
            output,
            bias,
            workspace,
            window,
            groups,
            act,
        } = self;

        let args = ConvArgs {
            input,
            weight,
            output,
            bias: bias.as_ref(),
            workspace: workspace.as_ref(),
            window,
            groups: *groups,
            act: *act,
        };
        // SAFETY: see above.
        unsafe { conv(&args, mem, ws) }
    }
}
