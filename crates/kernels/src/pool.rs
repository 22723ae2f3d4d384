//! `Pool`: max and average pooling windows over `[N, C, H, W]`, with padding, stride and
//! dilation.
//!
//! For each output row the window is swept tap by tap: for a tap `(ky, kx)` the output
//! columns whose input column falls inside the image form one contiguous range, computed
//! once, so the inner loop has no bounds checks (and vectorizes when the stride is 1). Padded
//! cells never take part in a max; an average divides by the whole window
//! (`count_include_pad`) or by the number of cells inside the image. A global pool (the
//! window is the whole unpadded image) sums each plane directly.

use crate::strided::View;
use crate::{DeviceMemory, Workspace};
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
) {
    let vi = View::<f32>::new(input, mem);
    let vo = View::<f32>::new(output, mem);
    if vo.elements() == 0 {
        return;
    }
    let [_, _, h, wd] = vi.shape;
    let [nn, cc, oh, ow] = vo.shape;
    let [kh, kw] = w.kernel.map(|v| v as usize);
    let [sh, sw] = w.stride.map(|v| v as usize);
    let [dh, dw] = w.dilation.map(|v| v as usize);
    let [pt, pl, pb, pr] = w.pad.map(|v| v as usize);
    let global = oh == 1 && ow == 1 && kh == h && kw == wd && pt + pl + pb + pr == 0;
    let (acc, cnt) = ws.f32x2(ow, ow);
    let win = (kh * kw) as f32;
    for n in 0..nn {
        for c in 0..cc {
            if global {
                let (mut s, mut m) = (0.0f32, f32::NEG_INFINITY);
                for iy in 0..h {
                    for ix in 0..wd {
                        // SAFETY: inside the input plane.
                        let x = unsafe { *vi.at([n, c, iy, ix]) };
                        s += x;
                        m = nan_max(m, x);
                    }
                }
                let v = match op {
                    PoolOp::Max => m,
                    PoolOp::Avg => s / win,
                };
                // SAFETY: the output element exists.
                unsafe { vo.at([n, c, 0, 0]).write(v) };
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
