//! `MatMul`: `C (+)= alpha · op(A) · op(B)`, batched over dimensions 0 and 1 (batch stride 0
//! broadcasts an operand).
//!
//! The products themselves are in [`crate::gemm`]: the f32 GEMM ([`crate::gemm::sgemm`]),
//! the GEMV kernels ([`crate::gemm::gemv`]), the packed microkernels
//! ([`crate::gemm::packed`]) and the bf16/f16 products ([`crate::gemm::half`]).

use crate::Execute;
use crate::gemm::packed::{Bf16Kernel, gemm_packed, gemm_packed_bf16};
use crate::gemm::{Half, HalfMat, Packed, PackedBf16, TileEpilogue, gemm_auto, gemm_half};
pub use crate::gemm::{Mat, prepare_thread};
use crate::strided::View;
use crate::{DeviceMemory, KernelError, Workspace};
use nrt_hal::DType;
use nrt_hal::tuning::{EPILOGUE_MIN_ROWS, EPILOGUE_TILE_BYTES};
use nrt_isa::op;
use nrt_isa::{AccessPattern, ActFunc, Epilogue, matmul_flags};

/// A strided f32 operand of the epilogue, in one batch: element `[i, j]` at
/// `ptr + i·rs + j·cs`.
#[derive(Clone, Copy, Debug)]
struct Addend {
    ptr: *const f32,
    rs: isize,
    cs: isize,
}

/// `row[j] += p[j·cs]`.
///
/// # Safety
/// `p` readable for the row's elements, not overlapping `row`.
#[inline(always)]
unsafe fn add_row(row: &mut [f32], p: *const f32, cs: isize) {
    match cs {
        1 => {
            // SAFETY: readable per the contract, distinct from `row`.
            let src = unsafe { core::slice::from_raw_parts(p, row.len()) };
            for (o, v) in row.iter_mut().zip(src) {
                *o += *v;
            }
        }
        0 => {
            // SAFETY: readable per the contract.
            let v = unsafe { *p };
            for o in row.iter_mut() {
                *o += v;
            }
        }
        _ => {
            for (j, o) in row.iter_mut().enumerate() {
                // SAFETY: readable per the contract.
                *o += unsafe { *p.offset(j as isize * cs) };
            }
        }
    }
}

/// Applies the epilogue to rows `r0..r1` of one batch of C (`n` columns), just computed.
/// `staged`: work on a copy of each row (C strided, or an addend overlapping C — which a
/// compiler never emits but a hostile model may: then no reference to C is ever formed
/// while an addend is read).
///
/// # Safety
/// C's rows writable, the addends readable for them.
#[allow(clippy::too_many_arguments)]
unsafe fn epilogue_rows(
    c: Mat,
    n: usize,
    rows: core::ops::Range<usize>,
    addends: &[Option<Addend>; 2],
    epi: &Epilogue,
    staged: bool,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    let staged = staged || c.cs != 1;
    let scratch = if staged { ws.f32(2, n)? } else { &mut [][..] };
    for i in rows {
        let cp = c.ptr.wrapping_offset(i as isize * c.rs);
        let row: &mut [f32] = if !staged {
            // SAFETY: the row is writable and nothing else refers to it during the call.
            unsafe { core::slice::from_raw_parts_mut(cp, n) }
        } else {
            // SAFETY: readable per the contract; `scratch` is distinct.
            unsafe { crate::strided::gather_into(cp, c.cs, scratch) };
            &mut scratch[..]
        };
        for x in addends.iter().flatten() {
            // SAFETY: readable per the contract, not overlapping C.
            unsafe { add_row(row, x.ptr.wrapping_offset(i as isize * x.rs), x.cs) };
        }
        crate::act::apply_in_place(epi.func, epi.act_alpha, epi.act_beta, row);
        if staged {
            for (j, v) in scratch.iter().enumerate() {
                // SAFETY: writable per the contract.
                unsafe { *cp.offset(j as isize * c.cs) = *v };
            }
        }
    }
    Ok(())
}

/// Rows of C per block of a MatMul with an epilogue (see
/// [`nrt_hal::tuning::EPILOGUE_TILE_BYTES`]).
pub fn epilogue_block_rows(n: usize) -> usize {
    (EPILOGUE_TILE_BYTES / (4 * n.max(1))).max(EPILOGUE_MIN_ROWS)
}

/// Executes `Op::MatMul` — the one entry point for every element type of B: f32, or bf16 /
/// f16 weights ([`crate::gemm::half`], AVX-512 BF16 / F16C chosen at run time): the product,
/// then the epilogue (if any) on each block of rows of C
/// right after the block is computed, while it is still in cache.
///
/// # Safety
/// The operands must lie inside `mem`, aligned; C must not overlap A or B (the epilogue's
/// operands may overlap C: those rows are staged through the workspace).
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul(
    a: &AccessPattern,
    b: &AccessPattern,
    c: &AccessPattern,
    alpha: f32,
    flags: u32,
    epilogue: &Epilogue,
    mem: DeviceMemory,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    let (va, vb, vc) = (
        View::<f32>::new(a, mem),
        View::<f32>::new(b, mem),
        View::<f32>::new(c, mem),
    );
    // Half-precision weights (`--auto-cast`): the same element strides, 16-bit elements.
    let half = match b.dtype {
        DType::Bf16 => Some(Half::Bf16),
        DType::F16 => Some(Half::F16),
        _ => None,
    };
    let vh = View::<u16>::new(b, mem);
    let ve = [
        epilogue.bias.as_ref().map(|x| View::<f32>::new(x, mem)),
        epilogue.residual.as_ref().map(|x| View::<f32>::new(x, mem)),
    ];
    let ta = flags & matmul_flags::TRANSPOSE_A != 0;
    let tb = flags & matmul_flags::TRANSPOSE_B != 0;
    let acc = flags & matmul_flags::ACCUMULATE != 0;
    // B packed in panels at compile time (constant weights, shared by every batch; the
    // decoder checked the layout: f32 `[1, panels, K, NR]`, strides `[_, K·NR, NR, 1]`, or
    // bf16 `[1, panels, ceil(K/2), 2·NR]` — pairs of K side by side).
    let bf16_packed = half == Some(Half::Bf16);
    let packed = (flags & matmul_flags::PACKED_B != 0).then(|| Packed {
        ptr: vb.at([0, 0, 0, 0]),
        nr: if bf16_packed {
            vb.shape[3] / 2
        } else {
            vb.shape[3]
        },
        panel_stride: vb.stride[1],
    });
    let (m, n) = (vc.shape[2], vc.shape[3]);
    if m == 0 || n == 0 || vc.shape[0] == 0 || vc.shape[1] == 0 {
        return Ok(());
    }
    let k = if ta { va.shape[2] } else { va.shape[3] };
    let rows_k = if bf16_packed { k.div_ceil(2) } else { k };
    if let Some(p) = packed
        && ((half.is_some() && !bf16_packed)
            || !matmul_flags::PANEL_WIDTHS.contains(&(p.nr as u32))
            || vb.shape[2] != rows_k
            || vb.shape[1] * p.nr < n
            || vb.stride[2] != vb.shape[3] as isize
            || vb.shape[3] != p.nr * if bf16_packed { 2 } else { 1 }
            || vb.stride[3] != 1)
    {
        // Not a layout the decoder lets through (an `Op` built by hand): compute nothing
        // rather than read past the operand.
        debug_assert!(false, "packed B of an unchecked layout");
        return Ok(());
    }
    let (ars, acs) = if ta {
        (va.stride[3], va.stride[2])
    } else {
        (va.stride[2], va.stride[3])
    };
    let (brs, bcs) = if tb {
        (vb.stride[3], vb.stride[2])
    } else {
        (vb.stride[2], vb.stride[3])
    };
    // Batches that share one B (stride 0) and lie evenly spaced along M in A and C (and the
    // epilogue's operands) are one taller product (a Linear layer over [batch, seq, K] is one
    // GEMM, not batch·seq GEMVs).
    let (mut m, mut nb) = (m, [vc.shape[0], vc.shape[1]]);
    for d in [1, 0] {
        let mergeable = nb[d] == 1
            || ((packed.is_some() || vb.stride[d] == 0)
                && va.stride[d] == m as isize * ars
                && vc.stride[d] == m as isize * vc.stride[2]
                && ve
                    .iter()
                    .flatten()
                    .all(|e| e.stride[d] == m as isize * e.stride[2]));
        if !mergeable {
            break;
        }
        m *= nb[d];
        nb[d] = 1;
    }
    let fused = !epilogue.is_none();
    // An addend overlapping C (never compiled; possible in a hostile model): stage rows.
    let overlap = |x: &AccessPattern| {
        let (cl, ch) = c.byte_extent();
        let (xl, xh) = x.byte_extent();
        let (c0, x0) = (c.addr as i128, x.addr as i128);
        c0 + cl < x0 + xh + 4 && x0 + xl < c0 + ch + 4
    };
    let staged = [&epilogue.bias, &epilogue.residual]
        .into_iter()
        .flatten()
        .any(overlap);
    // The packed GEMM applies a per-column bias and Relu to each tile in registers: then the
    // epilogue needs no pass of its own.
    let in_tile = packed.is_some()
        && fused
        && !staged
        && epilogue.residual.is_none()
        && matches!(epilogue.func, ActFunc::Identity | ActFunc::Relu)
        && ve[0].is_none_or(|b| b.stride[2] == 0 && b.stride[3] == 1);
    let fused = fused && !in_tile;
    let block = if fused {
        epilogue_block_rows(n).min(m)
    } else {
        m
    };
    for i0 in 0..nb[0] {
        for i1 in 0..nb[1] {
            let ma = Mat {
                ptr: va.at([i0, i1, 0, 0]),
                rs: ars,
                cs: acs,
            };
            let mb = Mat {
                ptr: if packed.is_some() {
                    vb.at([0, 0, 0, 0])
                } else {
                    vb.at([i0, i1, 0, 0])
                },
                rs: brs,
                cs: bcs,
            };
            let mc = Mat {
                ptr: vc.at([i0, i1, 0, 0]),
                rs: vc.stride[2],
                cs: vc.stride[3],
            };
            let addends = ve.map(|e| {
                e.map(|e| Addend {
                    ptr: e.at([i0, i1, 0, 0]),
                    rs: e.stride[2],
                    cs: e.stride[3],
                })
            });
            let mut r0 = 0;
            while r0 < m {
                let rb = block.min(m - r0);
                let off = |x: Mat| Mat {
                    ptr: x.ptr.wrapping_offset(r0 as isize * x.rs),
                    ..x
                };
                let epi = if in_tile {
                    TileEpilogue {
                        bias: addends[0].map_or(core::ptr::null(), |b| b.ptr),
                        row_bias: core::ptr::null(),
                        relu: epilogue.func == ActFunc::Relu,
                    }
                } else {
                    TileEpilogue::NONE
                };
                // SAFETY: the caller's contract covers every element of every batch; the
                // block's rows are a subset; the bias (in-tile epilogue) is a row of N.
                unsafe {
                    match (half, packed) {
                        (None, Some(pb)) => {
                            gemm_packed(rb, n, k, off(ma), pb, off(mc), alpha, acc, epi, ws)
                        }
                        (Some(_), Some(pb)) => {
                            let hb = PackedBf16 {
                                ptr: vh.at([0, 0, 0, 0]),
                                nr: pb.nr,
                                panel_stride: vh.stride[1],
                            };
                            let kernel = Bf16Kernel::best();
                            let (a, c) = (off(ma), off(mc));
                            gemm_packed_bf16(rb, n, k, a, hb, c, alpha, acc, epi, kernel, ws)
                        }
                        (None, None) => gemm_auto(rb, n, k, off(ma), mb, off(mc), alpha, acc, ws),
                        (Some(kind), _) => {
                            let hb = HalfMat {
                                ptr: vh.at([i0, i1, 0, 0]),
                                rs: brs,
                                cs: bcs,
                                kind,
                            };
                            if k == 0 {
                                gemm_auto(rb, n, k, off(ma), mb, off(mc), alpha, acc, ws)
                            } else {
                                let round_a = flags & matmul_flags::F32_A == 0;
                                gemm_half(rb, n, k, off(ma), hb, off(mc), alpha, acc, round_a, ws)
                            }
                        }
                    }
                }?;
                if fused {
                    // SAFETY: as above; the addends do not overlap C per the contract.
                    unsafe { epilogue_rows(mc, n, r0..r0 + rb, &addends, epilogue, staged, ws)? };
                }
                r0 += rb;
            }
        }
    }
    Ok(())
}

impl Execute for op::MatMul {
    unsafe fn execute(&self, mem: DeviceMemory, ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::MatMul {
            a,
            b,
            c,
            alpha,
            flags,
            epilogue,
        } = self;

        // SAFETY: see above.
        unsafe { matmul(a, b, c, *alpha, *flags, epilogue, mem, ws) }
    }
}
