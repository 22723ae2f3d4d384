//! `Resize`: nearest-neighbour and (multi-)linear resampling of all four dimensions, with the
//! semantics of ONNX `Resize` (opsets 11–19, as `onnx/reference/ops/op_resize.py` computes
//! them).
//!
//! Per dimension, each output index gets its source coordinate (in f64, like the reference):
//!
//! | coord mode | `x_original` |
//! |---|---|
//! | half_pixel | `(x + 0.5)/scale − 0.5` |
//! | asymmetric | `x/scale` |
//! | align_corners | `x·(in − 1)/(out_f − 1)`, 0 when `out_f = 1` |
//! | pytorch_half_pixel | half_pixel, 0 when `out_f = 1` |
//! | tf_half_pixel_for_nearest | `(x + 0.5)/scale` |
//! | half_pixel_symmetric | `in/2·(1 − out/out_f) + (x + 0.5)/scale − 0.5` |
//!
//! where `scale` is `scales[d]` (or `out/in` when it is 0) and `out_f = scale·in`. Nearest
//! rounds per [`NearestMode`] (an integral coordinate is taken as is; otherwise
//! round_prefer_floor picks the upper neighbour only above .5, round_prefer_ceil from .5 on);
//! linear weights the two neighbours `floor(x)`, `floor(x) + 1` by `1 − r`, `r` (reproducing
//! the reference's window placement bit for bit, quirk at `x` an ulp above an integer
//! included: see [`taps`]). Source
//! indices clamp to `[0, in − 1]` (the reference's edge padding), so linear interpolation
//! clamps coordinates to the input. A dimension whose size is unchanged and whose scale is
//! not given is the identity.
//!
//! The four per-dimension tables (two indices and two weights per output index) live in the
//! workspace; the output is then computed row by row from at most 8 weighted source rows
//! (dimensions 0–2) and the dimension-3 table.

use crate::Execute;
use crate::strided::View;
use crate::{DeviceMemory, KernelError, Workspace};
use nrt_isa::op;
use nrt_isa::{AccessPattern, CoordMode, NearestMode, ResizeMode};

/// The parameters of a resize.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Interpolation.
    pub mode: ResizeMode,
    /// Coordinate transformation.
    pub coord: CoordMode,
    /// Rounding for nearest.
    pub nearest: NearestMode,
    /// Per-dimension output/input scale; 0 = the size ratio.
    pub scales: [f32; 4],
}

/// Source coordinate of output index `x` along one dimension.
pub fn source_coord(coord: CoordMode, x: usize, scale: f64, inp: usize, out: usize) -> f64 {
    let x = x as f64;
    let out_f = scale * inp as f64;
    match coord {
        CoordMode::HalfPixel => (x + 0.5) / scale - 0.5,
        CoordMode::Asymmetric => x / scale,
        CoordMode::AlignCorners => {
            if out_f == 1.0 {
                0.0
            } else {
                x * (inp as f64 - 1.0) / (out_f - 1.0)
            }
        }
        CoordMode::PytorchHalfPixel => {
            if out_f == 1.0 {
                0.0
            } else {
                (x + 0.5) / scale - 0.5
            }
        }
        CoordMode::TfHalfPixelForNearest => (x + 0.5) / scale,
        CoordMode::HalfPixelSymmetric => {
            let adjustment = out as f64 / out_f;
            let center = inp as f64 / 2.0;
            center * (1.0 - adjustment) + (x + 0.5) / scale - 0.5
        }
    }
}

/// The two source indices and weights of output index `x` along one dimension.
pub fn taps(p: &Params, d: usize, x: usize, inp: usize, out: usize) -> (usize, usize, f32, f32) {
    let given = p.scales[d];
    if given == 0.0 && inp == out {
        return (x, x, 1.0, 0.0);
    }
    let scale = if given > 0.0 {
        given as f64
    } else {
        out as f64 / inp as f64
    };
    let xo = source_coord(p.coord, x, scale, inp, out);
    let last = inp as i64 - 1;
    let clamp = |i: i64| i.clamp(0, last) as usize;
    // The reference's two-tap window: the ratio comes from floor(x) (1 when x is integral,
    // so the window is [x − 1, x] with weights [0, 1]), while the window itself is located
    // from x + 1 (its edge padding). The two agree except when x + 1 rounds to an integer
    // that x is not (x within an ulp above an integer): we reproduce the reference there too.
    let fl = xo.floor();
    let ratio = if xo == fl { 1.0 } else { xo - fl };
    let xp = xo + 1.0;
    let pp = xp.floor();
    let start = if xp == pp { pp as i64 - 1 } else { pp as i64 };
    let (i0, i1) = (clamp(start - 1), clamp(start));
    let (w0, w1) = match p.mode {
        ResizeMode::Linear => (1.0 - ratio, ratio),
        ResizeMode::Nearest => {
            let up = ratio == 1.0
                || match p.nearest {
                    NearestMode::RoundPreferFloor => ratio > 0.5,
                    NearestMode::RoundPreferCeil => ratio >= 0.5,
                    NearestMode::Floor => false,
                    NearestMode::Ceil => true,
                };
            if up { (0.0, 1.0) } else { (1.0, 0.0) }
        }
    };
    if w0 == 0.0 {
        (i1, i1, 1.0, 0.0)
    } else if w1 == 0.0 || i0 == i1 {
        (i0, i0, if i0 == i1 { 1.0 } else { w0 as f32 }, 0.0)
    } else {
        (i0, i1, w0 as f32, w1 as f32)
    }
}

/// Executes `Op::Resize`.
///
/// # Safety
/// Operands inside `mem`, aligned to 4 bytes.
pub unsafe fn resize(
    input: &AccessPattern,
    output: &AccessPattern,
    p: &Params,
    mem: DeviceMemory,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    let vi = View::<f32>::new(input, mem);
    let vo = View::<f32>::new(output, mem);
    if vo.elements() == 0 || vi.elements() == 0 {
        return Ok(());
    }
    let total: usize = vo.shape.iter().sum();
    let (wts, idx) = ws.f32_and_words(2 * total, 2 * total)?;
    let mut base = [0usize; 4];
    let mut at = 0;
    for (d, b) in base.iter_mut().enumerate() {
        *b = at;
        for x in 0..vo.shape[d] {
            let (i0, i1, w0, w1) = taps(p, d, x, vi.shape[d], vo.shape[d]);
            let k = 2 * (at + x);
            idx[k] = i0 as u64;
            idx[k + 1] = i1 as u64;
            wts[k] = w0;
            wts[k + 1] = w1;
        }
        at += vo.shape[d];
    }
    let tap = |d: usize, x: usize| {
        let k = 2 * (base[d] + x);
        (idx[k] as usize, idx[k + 1] as usize, wts[k], wts[k + 1])
    };
    let dim3_single = (0..vo.shape[3]).all(|x| tap(3, x).3 == 0.0);
    let (s3, n3) = (vi.stride[3], vo.shape[3]);
    for a in 0..vo.shape[0] {
        for b in 0..vo.shape[1] {
            for c in 0..vo.shape[2] {
                // Up to 8 weighted source rows from dimensions 0–2.
                let mut rows = [(core::ptr::null::<f32>(), 0.0f32); 8];
                let mut nr = 0;
                let (a0, a1, aw0, aw1) = tap(0, a);
                let (b0, b1, bw0, bw1) = tap(1, b);
                let (c0, c1, cw0, cw1) = tap(2, c);
                for (ia, wa) in [(a0, aw0), (a1, aw1)] {
                    for (ib, wb) in [(b0, bw0), (b1, bw1)] {
                        for (ic, wc) in [(c0, cw0), (c1, cw1)] {
                            let w = wa * wb * wc;
                            if w != 0.0 {
                                rows[nr] = (vi.at([ia, ib, ic, 0]), w);
                                nr += 1;
                            }
                        }
                    }
                }
                let rows = &rows[..nr];
                let out = vo.at([a, b, c, 0]);
                for x in 0..n3 {
                    let (i0, i1, w0, w1) = tap(3, x);
                    let mut v = 0.0f32;
                    for &(row, w) in rows {
                        // SAFETY: i0, i1 < in.shape[3] and the row lies inside the input.
                        let s = unsafe {
                            if dim3_single {
                                *row.offset(i0 as isize * s3)
                            } else if w1 == 0.0 {
                                w0 * *row.offset(i0 as isize * s3)
                            } else {
                                w0 * *row.offset(i0 as isize * s3)
                                    + w1 * *row.offset(i1 as isize * s3)
                            }
                        };
                        v += w * s;
                    }
                    // SAFETY: the output element exists; the input is never referenced.
                    unsafe { out.offset(x as isize * vo.stride[3]).write(v) };
                }
            }
        }
    }
    Ok(())
}

impl Execute for op::Resize {
    unsafe fn execute(&self, mem: DeviceMemory, ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::Resize {
            input,
            output,
            mode,
            coord,
            nearest,
            scales,
        } = self;

        let p = Params {
            mode: *mode,
            coord: *coord,
            nearest: *nearest,
            scales: *scales,
        };
        // SAFETY: see above.
        unsafe { resize(input, output, &p, mem, ws) }
    }
}
