//! `RoiAlign` (NCM 1.4): bilinear samples of each region's output cells, averaged or their
//! maximum, following ONNX Runtime's CPU kernel (and onnx's reference): coordinates in f32,
//! a sample outside `[-1, size]` counts as zero, a sample's corner weights computed once and
//! applied to every channel. Nothing is allocated: the output accumulates in place.

use crate::strided::View;
use crate::{DeviceMemory, KernelError};
use crate::{Execute, Workspace};
use nrt_isa::op;
use nrt_isa::{AccessPattern, ROI_MAX_GRID, roi_flags};

/// The operands of `Op::RoiAlign`.
#[derive(Debug)]
pub struct RoiArgs<'a> {
    pub input: &'a AccessPattern,
    pub rois: &'a AccessPattern,
    pub batch_indices: &'a AccessPattern,
    pub output: &'a AccessPattern,
    pub spatial_scale: f32,
    pub sampling_ratio: u32,
    pub flags: u32,
}

/// Samples per cell along one dimension: the ratio, or `ceil(cell)` (at least 1, at most
/// [`ROI_MAX_GRID`]; NaN gives 1).
fn grid(ratio: u32, cell: f32) -> usize {
    let g = if ratio > 0 { ratio as f32 } else { cell.ceil() };
    // (`as` saturates, NaN → 0)
    (g as usize).clamp(1, ROI_MAX_GRID as usize)
}

/// A sample's four corner offsets (`y·W + x`) and weights; all-zero outside the image.
fn corners(y: f32, x: f32, h: usize, w: usize) -> ([usize; 4], [f32; 4]) {
    if y < -1.0 || y > h as f32 || x < -1.0 || x > w as f32 || h == 0 || w == 0 {
        return ([0; 4], [0.0; 4]);
    }
    let (mut y, mut x) = (y.max(0.0), x.max(0.0));
    let (mut y0, mut x0) = (y as usize, x as usize);
    let y1 = if y0 >= h - 1 {
        y0 = h - 1;
        y = y0 as f32;
        y0
    } else {
        y0 + 1
    };
    let x1 = if x0 >= w - 1 {
        x0 = w - 1;
        x = x0 as f32;
        x0
    } else {
        x0 + 1
    };
    let (ly, lx) = (y - y0 as f32, x - x0 as f32);
    let (hy, hx) = (1.0 - ly, 1.0 - lx);
    (
        [y0 * w + x0, y0 * w + x1, y1 * w + x0, y1 * w + x1],
        [hy * hx, hy * lx, ly * hx, ly * lx],
    )
}

/// Executes `Op::RoiAlign`.
///
/// # Safety
/// Operands inside `mem`, aligned to their element size, shapes and types as the decoder
/// checks.
pub unsafe fn roi_align(a: &RoiArgs<'_>, mem: DeviceMemory) -> Result<(), KernelError> {
    let vx = View::<f32>::new(a.input, mem);
    let vr = View::<f32>::new(a.rois, mem);
    let vb = View::<i64>::new(a.batch_indices, mem);
    let vy = View::<f32>::new(a.output, mem);
    let [n, channels, h, w] = vx.shape;
    let [nr, _, oh, ow] = vy.shape;
    // Every batch index is checked before anything is written.
    for r in 0..nr {
        // SAFETY: r < R, inside the batch indices.
        let b = unsafe { vb.at([0, 0, 0, r]).read() };
        if b < 0 || b as u64 >= n as u64 {
            return Err(KernelError::IndexOutOfRange {
                position: r as u64,
                index: b,
                limit: n as u32,
            });
        }
    }
    let half = a.flags & roi_flags::HALF_PIXEL != 0;
    let max = a.flags & roi_flags::MAX != 0;
    let offset = if half { 0.5 } else { 0.0 };
    for r in 0..nr {
        // SAFETY: r < R, k < 4: inside the regions and batch indices.
        let roi = |k: usize| unsafe { vr.at([0, 0, r, k]).read() } * a.spatial_scale - offset;
        // SAFETY: as above (checked in range).
        let b = unsafe { vb.at([0, 0, 0, r]).read() } as usize;
        let (x0, y0) = (roi(0), roi(1));
        let (mut rw, mut rh) = (roi(2) - x0, roi(3) - y0);
        if !half {
            rw = rw.max(1.0);
            rh = rh.max(1.0);
        }
        let (bh, bw) = (rh / oh as f32, rw / ow as f32);
        let (gh, gw) = (grid(a.sampling_ratio, bh), grid(a.sampling_ratio, bw));
        let count = (gh * gw) as f32;
        for ph in 0..oh {
            for pw in 0..ow {
                let out = |c: usize| vy.at([r, c, ph, pw]);
                let px = |c: usize, p: usize| {
                    // SAFETY: b < N (checked above), c < C, p < H·W: inside the input.
                    unsafe { vx.at([b, c, p / w.max(1), p % w.max(1)]).read() }
                };
                for c in 0..channels {
                    // SAFETY: inside the output.
                    unsafe { out(c).write(if max { f32::NEG_INFINITY } else { 0.0 }) };
                }
                let mut first = true;
                for iy in 0..gh {
                    let y = y0 + ph as f32 * bh + (iy as f32 + 0.5) * bh / gh as f32;
                    for ix in 0..gw {
                        let x = x0 + pw as f32 * bw + (ix as f32 + 0.5) * bw / gw as f32;
                        let (pos, wt) = corners(y, x, h, w);
                        for c in 0..channels {
                            let o = out(c);
                            // SAFETY: inside the output.
                            let acc = unsafe { o.read() };
                            let v = if max {
                                let m = (wt[0] * px(c, pos[0]))
                                    .max(wt[1] * px(c, pos[1]))
                                    .max(wt[2] * px(c, pos[2]))
                                    .max(wt[3] * px(c, pos[3]));
                                if first { m } else { acc.max(m) }
                            } else {
                                acc + wt[0] * px(c, pos[0])
                                    + wt[1] * px(c, pos[1])
                                    + wt[2] * px(c, pos[2])
                                    + wt[3] * px(c, pos[3])
                            };
                            // SAFETY: inside the output.
                            unsafe { o.write(v) };
                        }
                        first = false;
                    }
                }
                if !max {
                    for c in 0..channels {
                        // SAFETY: inside the output.
                        unsafe { out(c).write(out(c).read() / count) };
                    }
                }
            }
        }
    }
    Ok(())
}

impl Execute for op::RoiAlign {
    unsafe fn execute(&self, mem: DeviceMemory, _ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::RoiAlign {
            input,
            rois,
            batch_indices,
            output,
            spatial_scale,
            sampling_ratio,
            flags,
        } = self;

        let args = RoiArgs {
            input,
            rois,
            batch_indices,
            output,
            spatial_scale: *spatial_scale,
            sampling_ratio: *sampling_ratio,
            flags: *flags,
        };
        // SAFETY: see above.
        unsafe { roi_align(&args, mem) }
    }
}
