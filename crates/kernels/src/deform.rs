//! `DeformIm2col` (NCM 1.4): the columns of a deformable convolution, each a bilinear sample
//! (zero outside the image, as GridSample with zero padding and aligned corners, which the
//! ONNX reference uses) at the kernel tap moved by its learned offset, times the mask. The
//! compiler follows it with MatMuls by the weights. Sample positions and weights are
//! computed once per (image, offset group, tap, output position) and applied to every
//! channel of the group; nothing is allocated.

use crate::DeviceMemory;
use crate::strided::View;
use crate::{Execute, KernelError, Workspace};
use nrt_isa::op;
use nrt_isa::{AccessPattern, Window};

/// The operands of `Op::DeformIm2col`.
#[derive(Debug)]
pub struct DeformArgs<'a> {
    pub input: &'a AccessPattern,
    pub offset: &'a AccessPattern,
    pub mask: Option<&'a AccessPattern>,
    pub cols: &'a AccessPattern,
    pub window: &'a Window,
    pub offset_groups: u32,
}

/// The four corners `(y, x)` of a bilinear sample at `(y, x)` and their weights; a corner
/// outside `[0, h) × [0, w)` gets weight 0 (and a harmless in-range position).
fn corners(y: f32, x: f32, h: usize, w: usize) -> ([(usize, usize); 4], [f32; 4]) {
    let (y0, x0) = (y.floor(), x.floor());
    let (ly, lx) = (y - y0, x - x0);
    let mut pos = [(0usize, 0usize); 4];
    let mut wt = [0f32; 4];
    for (k, (dy, dx)) in [(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0)]
        .into_iter()
        .enumerate()
    {
        let (cy, cx) = (y0 + dy, x0 + dx);
        // (NaN fails both tests: weight 0)
        if cy >= 0.0 && cy < h as f32 && cx >= 0.0 && cx < w as f32 {
            pos[k] = (cy as usize, cx as usize);
            let fy = if dy == 0.0 { 1.0 - ly } else { ly };
            let fx = if dx == 0.0 { 1.0 - lx } else { lx };
            wt[k] = fy * fx;
        }
    }
    (pos, wt)
}

/// Executes `Op::DeformIm2col`.
///
/// # Safety
/// Operands inside `mem`, aligned to their element size, shapes and types as the decoder
/// checks.
pub unsafe fn deform_im2col(a: &DeformArgs<'_>, mem: DeviceMemory) {
    let vx = View::<f32>::new(a.input, mem);
    let vo = View::<f32>::new(a.offset, mem);
    let vm = a.mask.map(|m| View::<f32>::new(m, mem));
    let vc = View::<f32>::new(a.cols, mem);
    let [n, c, h, w] = vx.shape;
    let [_, _, oh, ow] = vc.shape;
    let win = a.window;
    let (kh, kw) = (win.kernel[0] as usize, win.kernel[1] as usize);
    let groups = a.offset_groups as usize;
    let per_group = c / groups;
    for b in 0..n {
        for g in 0..groups {
            for i in 0..kh {
                for j in 0..kw {
                    let tap = (g * kh + i) * kw + j;
                    for y in 0..oh {
                        for x in 0..ow {
                            // SAFETY: b < N, 2·tap + 1 < G·kH·kW·2, y < oH, x < oW, and
                            // likewise for the mask: inside the operands.
                            let (dy, dx, m) = unsafe {
                                (
                                    vo.at([b, 2 * tap, y, x]).read(),
                                    vo.at([b, 2 * tap + 1, y, x]).read(),
                                    vm.map_or(1.0, |vm| vm.at([b, tap, y, x]).read()),
                                )
                            };
                            let sy = y as f32 * win.stride[0] as f32 - win.pad[0] as f32
                                + i as f32 * win.dilation[0] as f32
                                + dy;
                            let sx = x as f32 * win.stride[1] as f32 - win.pad[1] as f32
                                + j as f32 * win.dilation[1] as f32
                                + dx;
                            let (pos, wt) = corners(sy, sx, h, w);
                            for ch in g * per_group..(g + 1) * per_group {
                                let mut v = 0f32;
                                for k in 0..4 {
                                    if wt[k] != 0.0 {
                                        // SAFETY: pos[k] inside [0, H) × [0, W), ch < C.
                                        v += wt[k]
                                            * unsafe { vx.at([b, ch, pos[k].0, pos[k].1]).read() };
                                    }
                                }
                                // SAFETY: (ch·kH + i)·kW + j < C·kH·kW: inside the columns.
                                unsafe { vc.at([b, (ch * kh + i) * kw + j, y, x]).write(m * v) };
                            }
                        }
                    }
                }
            }
        }
    }
}

impl Execute for op::DeformIm2col {
    unsafe fn execute(&self, mem: DeviceMemory, _ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::DeformIm2col {
            input,
            offset,
            mask,
            cols,
            window,
            offset_groups,
        } = self;

        let args = DeformArgs {
            input,
            offset,
            mask: mask.as_ref(),
            cols,
            window,
            offset_groups: *offset_groups,
        };
        // SAFETY: see above.
        unsafe { deform_im2col(&args, mem) };
        Ok(())
    }
}
